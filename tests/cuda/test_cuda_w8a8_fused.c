/* The W8A8 activation quantization fused into its producers (qrl_cuda_rmsnorm_w8a8 in
 * kernels/cuda/norm.cuh, qrl_cuda_swiglu_w8a8 in pointwise.cuh) against the two launches it
 * replaces: the producer (qrl_cuda_rmsnorm / qrl_cuda_swiglu) then
 * qrl_cuda_{int8,fp8}_quantize_rows on its BF16 output.  The fused launch must write the
 * same bytes: codes (padding [d, ld) included), scales, the BF16 rows when asked for, and
 * (norm) the residual stream after the add.  Fresh random inputs, d and f from 1 to 12289
 * (every register/recompute path of both kernels), rows 1..257, guard regions around every
 * fused output; rows with NaN, +-Inf, all zeros (FP8 keeps the sign of zero) and huge
 * weights (an infinite normed value).  The CPU reference of the quantization itself is
 * tests/cuda/test_cuda_w8a8.c's check.
 * Forward: a w8a8-int8 and a w8a8-fp8 engine give bit-identical logits (chunked prefill,
 * batched decode) with the fused kernels and with QRL_W8A8_UNFUSED=1. */
#include <cuda_runtime.h>

#include "cuda_test_util.h"

#include "cuda/gemm_w8a8.cuh"
#include "cuda/norm.cuh"
#include "cuda/pointwise.cuh"
#include "model/forward_cuda.h"
#include "forward_run.h"

#define EPS 1e-6f

static void *dev_alloc(size_t bytes) {
    void *d;
    cr_assert_eq(qrl_cuda_malloc(&d, bytes, NULL), QRL_OK);
    return d;
}

static void *host_from(const void *d, size_t bytes) {
    void *h = malloc(bytes);
    cr_assert_eq(qrl_cuda_copy_to_host(h, d, bytes, NULL), QRL_OK);
    return h;
}

/* Reference codes: qrl_cuda_{int8,fp8}_quantize_rows of BF16 rows [rows, d]. */
static void quantize_ref(void *q, float *s, const uint16_t *x, int rows, int d, int ld, int fp8) {
    qrl_error err;
    qrl_status st = fp8 ? qrl_cuda_fp8_quantize_rows(q, s, x, 1, rows, d, ld, NULL, &err)
                        : qrl_cuda_int8_quantize_rows(q, s, x, 1, rows, d, ld, NULL, &err);
    cr_assert_eq(st, QRL_OK, "%s", err.msg);
}

/* Fused outputs (guarded: codes gq, scales gs, BF16 rows go when with_out) equal to the
 * reference's device buffers rq, rs, ro byte for byte; the guards are freed. */
static void compare_fused(const char *what, guarded gq, guarded gs, guarded go, int with_out,
                          const void *rq, const float *rs, const uint16_t *ro, int rows, int d,
                          int ld, int fp8) {
    size_t nq = (size_t)rows * ld;
    uint8_t *got_q = malloc(nq), *want_q = host_from(rq, nq);
    float *got_s = malloc((size_t)rows * 4), *want_s = host_from(rs, (size_t)rows * 4);
    guarded_fetch(gq, got_q, "codes");
    guarded_fetch(gs, got_s, "scales");
    for (int r = 0; r < rows; r++)
        cr_assert(memcmp(&got_s[r], &want_s[r], 4) == 0,
                  "%s rows=%d d=%d fp8=%d: scale %d fused %.9g unfused %.9g", what, rows, d, fp8,
                  r, got_s[r], want_s[r]);
    for (size_t i = 0; i < nq; i++)
        cr_assert_eq(got_q[i], want_q[i],
                     "%s rows=%d d=%d fp8=%d: code row %zu col %zu: fused 0x%02x unfused 0x%02x",
                     what, rows, d, fp8, i / ld, i % ld, got_q[i], want_q[i]);
    if (with_out) {
        size_t n = (size_t)rows * d;
        uint16_t *got_o = malloc(n * 2), *want_o = host_from(ro, n * 2);
        guarded_fetch(go, got_o, "bf16 rows");
        cr_assert(memcmp(got_o, want_o, n * 2) == 0, "%s rows=%d d=%d: BF16 rows differ", what,
                  rows, d);
        free(got_o); free(want_o);
    }
    free(got_q); free(want_q); free(got_s); free(want_s);
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

/* add_mode: 0 no residual add, 1 add, 2 add + bias.  Row 1 gets a NaN, row 2 +Inf, row 3
 * (x and add) zeros; with huge_w one weight is the largest BF16 (normed values overflow). */
static void norm_case(int rows, int d, int add_mode, int fp8, int with_out, int huge_w,
                      uint64_t seed) {
    size_t n = (size_t)rows * d;
    int ld = qrl_cuda_w8a8_ld(d);
    float *x = malloc(n * 4), *add = malloc(n * 4);
    uint16_t *b16 = malloc((size_t)d * 2), *w16 = malloc((size_t)d * 2);
    rand_f32(x, n, 3.0f, &seed);
    rand_f32(add, n, 1.0f, &seed);
    rand_bf16(b16, NULL, d, 0.0f, 0.5f, &seed);
    rand_bf16(w16, NULL, d, 0.2f, 1.0f, &seed); /* both signs: -0 outputs on zero rows */
    if (rows > 1) x[(size_t)d + d / 2] = NAN;
    if (rows > 2) x[2 * (size_t)d + d - 1] = INFINITY;
    if (rows > 3) {
        memset(x + 3 * (size_t)d, 0, (size_t)d * 4);
        memset(add + 3 * (size_t)d, 0, (size_t)d * 4);
    }
    if (huge_w) w16[d / 3] = 0x7f7f;
    float *dx_ref = dev_from(x, n * 4), *dx = dev_from(x, n * 4), *dadd = dev_from(add, n * 4);
    uint16_t *db = dev_from(b16, (size_t)d * 2), *dw = dev_from(w16, (size_t)d * 2);
    const float *a = add_mode ? dadd : NULL;
    const uint16_t *b = add_mode == 2 ? db : NULL;
    uint16_t *ro = dev_alloc(n * 2);
    void *rq = dev_alloc((size_t)rows * ld);
    float *rs = dev_alloc((size_t)rows * 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_rmsnorm(ro, dx_ref, a, b, dw, rows, d, EPS, NULL, &err), QRL_OK, "%s",
                 err.msg);
    quantize_ref(rq, rs, ro, rows, d, ld, fp8);
    guarded gq = guarded_new((size_t)rows * ld / 4, 4), gs = guarded_new(rows, 4),
            go = guarded_new(with_out ? n : 1, 2);
    qrl_cuda_w8a8_act aq = {.q = guarded_ptr(gq), .scales = guarded_ptr(gs), .ld = ld, .fp8 = fp8};
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(with_out ? guarded_ptr(go) : NULL, dx, a, b, dw, rows, d,
                                       EPS, &aq, NULL, NULL, &err), QRL_OK, "%s", err.msg);
    compare_fused("rmsnorm", gq, gs, go, with_out, rq, rs, ro, rows, d, ld, fp8);
    if (!with_out) qrl_cuda_free(go.base);
    float *x_ref = host_from(dx_ref, n * 4), *x_got = host_from(dx, n * 4);
    cr_assert(memcmp(x_ref, x_got, n * 4) == 0, "rmsnorm rows=%d d=%d: residual differs", rows, d);
    fprintf(stderr, "rmsnorm w8a8 rows=%d d=%d add=%d fp8=%d out=%d huge_w=%d: equal\n", rows, d,
            add_mode, fp8, with_out, huge_w);
    void *dev[] = {dx_ref, dx, dadd, db, dw, ro, rq, rs};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free(x); free(add); free(b16); free(w16); free(x_ref); free(x_got);
}

Test(cuda_w8a8_fused, rmsnorm_equals_norm_then_quantize) {
    require_gpu();
    /* d <= 1024: one element per thread (threads = d rounded to 32); above, 1024 threads */
    static const int shapes[][2] = {{1, 1},    {5, 7},    {37, 16},   {4, 129},  {257, 896},
                                    {3, 1000}, {64, 1536}, {33, 2560}, {2, 4099}, {130, 8960},
                                    {1, 12289}};
    int k = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int fp8 = 0; fp8 < 2; fp8++, k++)
            norm_case(shapes[i][0], shapes[i][1], k % 3, fp8, (k / 3) % 2, k % 4 == 1, 100 + k);
}

/* ---- SwiGLU ------------------------------------------------------------------------- */

/* Row 1: a NaN gate; row 2: an infinite up; row 3: zero gates (outputs +-0 by the up's
 * sign); row 4: gates -Inf (NaN output) and +Inf. */
static void swiglu_case(int rows, int f, int fp8, int with_out, uint64_t seed) {
    size_t n = (size_t)rows * f;
    int ld = qrl_cuda_w8a8_ld(f);
    float *gu = malloc(2 * n * 4);
    rand_f32(gu, 2 * n, 6.0f, &seed);
    if (rows > 1) gu[2 * (size_t)f + f / 2] = NAN;
    if (rows > 2) gu[4 * (size_t)f + f + f - 1] = -INFINITY;
    if (rows > 3) memset(gu + 6 * (size_t)f, 0, (size_t)f * 4);
    if (rows > 4) {
        gu[8 * (size_t)f] = -INFINITY;
        if (f > 1) gu[8 * (size_t)f + 1] = INFINITY;
    }
    float *dgu = dev_from(gu, 2 * n * 4);
    uint16_t *ro = dev_alloc(n * 2);
    void *rq = dev_alloc((size_t)rows * ld);
    float *rs = dev_alloc((size_t)rows * 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_swiglu(ro, dgu, rows, f, NULL, &err), QRL_OK, "%s", err.msg);
    quantize_ref(rq, rs, ro, rows, f, ld, fp8);
    guarded gq = guarded_new((size_t)rows * ld / 4, 4), gs = guarded_new(rows, 4),
            go = guarded_new(with_out ? n : 1, 2);
    qrl_cuda_w8a8_act aq = {.q = guarded_ptr(gq), .scales = guarded_ptr(gs), .ld = ld, .fp8 = fp8};
    cr_assert_eq(qrl_cuda_swiglu_w8a8(with_out ? guarded_ptr(go) : NULL, dgu, rows, f, &aq, NULL,
                                      &err), QRL_OK, "%s", err.msg);
    compare_fused("swiglu", gq, gs, go, with_out, rq, rs, ro, rows, f, ld, fp8);
    if (!with_out) qrl_cuda_free(go.base);
    fprintf(stderr, "swiglu w8a8 rows=%d f=%d fp8=%d out=%d: equal\n", rows, f, fp8, with_out);
    qrl_cuda_free(dgu); qrl_cuda_free(ro); qrl_cuda_free(rq); qrl_cuda_free(rs);
    free(gu);
}

Test(cuda_w8a8_fused, swiglu_equals_swiglu_then_quantize) {
    require_gpu();
    /* ld <= 512: 256 threads x 2; <= 2048: 256 x 8; <= 12288: 1024 x 12; above: recomputed */
    static const int shapes[][2] = {{1, 1},    {6, 7},    {3, 129},    {37, 512},  {5, 513},
                                    {257, 896}, {2, 2048}, {9, 2049},  {1, 4864}, {64, 8960},
                                    {3, 12288}, {5, 12289}};
    int k = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int fp8 = 0; fp8 < 2; fp8++, k++)
            swiglu_case(shapes[i][0], shapes[i][1], fp8, k % 3 != 0, 300 + k);
}

Test(cuda_w8a8_fused, errors) {
    require_gpu();
    qrl_error err;
    void *d = dev_alloc(4096);
    qrl_cuda_w8a8_act bad_ld = {.q = d, .scales = d, .ld = 24, .fp8 = false},
                      short_ld = {.q = d, .scales = d, .ld = 16, .fp8 = true};
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(NULL, d, NULL, NULL, d, 1, 17, EPS, &bad_ld, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "ld=24"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(NULL, d, NULL, NULL, d, 1, 17, EPS, &short_ld, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "d=17 ld=16"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(NULL, d, NULL, NULL, d, 1, 16, EPS, NULL, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "neither"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(NULL, d, NULL, NULL, d, 0, 16, EPS, &short_ld, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_swiglu_w8a8(NULL, d, 1, 17, &short_ld, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "f=17 ld=16"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_swiglu_w8a8(NULL, d, 1, 16, &bad_ld, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_swiglu_w8a8(NULL, d, 1, 16, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "neither"), "%s", err.msg);
    qrl_cuda_free(d);
}

/* ---- forward: fused == unfused ------------------------------------------------------ */

#define FW_PREFILL 45 /* two chunks of max_rows 32 */
#define FW_STEPS 3
#define FW_V 1000

/* All logits of a chunked prefill (sequence 0), a short prefill (sequence 1) and FW_STEPS
 * batched decode steps of both, on a random Qwen2-shaped model (QKV bias, F = 4864: the
 * SwiGLU's 1024 x 12 path).  Returns a malloc'ed [(FW_PREFILL + 1 + 2 FW_STEPS), V]. */
static float *forward_logits(qrl_precision prec, int unfused) {
    if (unfused) setenv("QRL_W8A8_UNFUSED", "1", 1); /* read by qrl_cuda_forward_new */
    else unsetenv("QRL_W8A8_UNFUSED");
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN2, .dim = 896, .hidden_dim = 4864,
                          .n_layers = 2, .n_heads = 14, .n_kv_heads = 2, .head_dim = 64,
                          .vocab_size = FW_V, .max_seq_len = 256, .norm_eps = 1e-6f,
                          .qkv_bias = true, .tie_embeddings = true,
                          .rope = {.theta = 1000000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_cuda_forward_desc d = {.max_rows = 32, .max_ctx = 128, .block_size = 16, .n_blocks = 32,
                               .max_seqs = 2, .precision = prec};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&c, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_init_random(f, 5, &err), QRL_OK, "%s", err.msg);
    int32_t ids[FW_PREFILL];
    uint64_t s = 21;
    for (int i = 0; i < FW_PREFILL; i++) ids[i] = (int32_t)(rng_next(&s) % FW_V);
    float *lg = prefill_decode_logits(f, FW_V, ids, FW_PREFILL, 3, 7, 10, FW_STEPS);
    qrl_cuda_forward_free(f);
    unsetenv("QRL_W8A8_UNFUSED");
    return lg;
}

static void forward_fused_equals_unfused(qrl_precision prec) {
    size_t n = (FW_PREFILL + 1 + 2 * FW_STEPS) * (size_t)FW_V;
    float *fused = forward_logits(prec, 0), *unfused = forward_logits(prec, 1);
    size_t diff = 0, first = 0, distinct = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&fused[i], &unfused[i], 4) && !diff++) first = i;
        if (fused[i] != fused[0]) distinct++;
    }
    cr_assert_eq(diff, 0, "%s: %zu of %zu logits differ (first %zu: fused %.9g unfused %.9g)",
                 qrl_precision_name(prec), diff, n, first, fused[first], unfused[first]);
    cr_assert_gt(distinct, n / 2, "%s: logits nearly constant", qrl_precision_name(prec));
    fprintf(stderr, "forward %s: %zu logits bit-identical fused vs QRL_W8A8_UNFUSED=1\n",
            qrl_precision_name(prec), n);
    free(fused); free(unfused);
}

Test(cuda_w8a8_fused, forward_int8_fused_equals_unfused) {
    require_gpu();
    forward_fused_equals_unfused(QRL_PRECISION_W8A8_INT8);
}

Test(cuda_w8a8_fused, forward_fp8_fused_equals_unfused) {
    require_gpu();
    forward_fused_equals_unfused(QRL_PRECISION_W8A8_FP8);
}
