/* The deferred W8A8 GEMM epilogue (issue 22 item 3): where the unit-scale cuBLAS GEMM would
 * finish with a separate epilogue pass, qrl_cuda_w8a8_gemm_args.defer skips it and the norm
 * that reads y (qrl_cuda_rmsnorm_w8a8 with epi) applies acc * sx[t] * sw[n] + bias[n] on
 * read.  Everything must be bit-identical to the pass followed by the same norm.
 *   - Kernels, fresh random codes, scales, biases, residual rows and norm weights: the GEMM
 *     with the pass then the norm vs the GEMM deferred then the norm with epi; memcmp of
 *     the residual stream, the BF16 rows, the codes (padding included) and the scales.  The
 *     shapes are the forward's o and down (Qwen3-4B, Qwen2.5-1.5B) at rows where AUTO runs
 *     the unit-scale cuBLAS GEMM (defer on: asserted) and where it does not (skinny, FP8
 *     with the scales in cuBLASLt's epilogue: defer off, asserted), odd N (the pass's
 *     scalar path), the norm's scales array being the GEMM's sx (as in the forward), codes
 *     or BF16 rows only, with and without the F32 GEMM bias and the BF16 norm bias.
 *   - Forward: w8a8-int8 and w8a8-fp8 engines on one random CPU model (o bias, per-channel
 *     weight scales), chunked prefill (64-row chunks: o and down on cuBLAS) and batched
 *     decode, with QRL_W8A8_SKINNY_MAX_T unset and = 0 (cuBLAS at every row count): all
 *     logits memcmp-equal with the deferred epilogue, with QRL_W8A8_EPILOGUE_PASS=1 (the
 *     pass, A/B) and with QRL_W8A8_UNFUSED=1 (the deferred epilogue in the norm without
 *     the fused quantization). */
#include <cuda_runtime.h>

#include "cuda_test_util.h"

#include "cuda/gemm.cuh"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/norm.cuh"
#include "model/forward_cuda.h"
#include "forward_run.h"
#include "model/model.h"

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

static void expect_same(const char *what, const void *da, const void *db, size_t bytes,
                        size_t es, const char *label) {
    unsigned char *a = host_from(da, bytes), *b = host_from(db, bytes);
    for (size_t i = 0; i < bytes; i += es)
        cr_assert(memcmp(a + i, b + i, es) == 0, "%s: %s element %zu differs (pass vs deferred)",
                  label, what, i / es);
    free(a); free(b);
}

typedef struct epi_case {
    int T, N, K;
    bool fp8, gemm_bias, norm_bias, codes, out, alias;
    int want_on; /* 1: AUTO must defer; 0: must not; -1: either (cuBLAS may refuse the shape) */
} epi_case;

static void check_case(qrl_cuda_gemm *blas, const epi_case *c, uint64_t seed) {
    int T = c->T, N = c->N, ld = qrl_cuda_w8a8_ld(c->K), ldn = qrl_cuda_w8a8_ld(N);
    size_t tn = (size_t)T * N;
    char label[160];
    snprintf(label, sizeof label, "%s T=%d N=%d K=%d bias=%d/%d codes=%d out=%d alias=%d",
             c->fp8 ? "fp8" : "int8", T, N, c->K, c->gemm_bias, c->norm_bias, c->codes, c->out,
             c->alias);
    qrl_error err;
    void *dxq = dev_alloc((size_t)T * ld), *dwq = dev_alloc((size_t)N * ld);
    cr_assert_eq(c->fp8 ? qrl_cuda_fill_random_fp8(dxq, (size_t)T * ld, seed, NULL, &err)
                        : qrl_cuda_fill_random_int8(dxq, (size_t)T * ld, seed, NULL, &err), QRL_OK);
    cr_assert_eq(c->fp8 ? qrl_cuda_fill_random_fp8(dwq, (size_t)N * ld, seed + 1, NULL, &err)
                        : qrl_cuda_fill_random_int8(dwq, (size_t)N * ld, seed + 1, NULL, &err), QRL_OK);
    uint64_t s = seed;
    float *sx = malloc((size_t)T * 4), *sw = malloc((size_t)N * 4), *bias = malloc((size_t)N * 4);
    float *x = malloc(tn * 4), *wf = malloc((size_t)N * 4), *bf = malloc((size_t)N * 4);
    uint16_t *w16 = malloc((size_t)N * 2), *b16 = malloc((size_t)N * 2);
    /* activation scales as a per-token quantizer gives them (absmax / 127 or / 448), weight
     * scales per channel, sums of order 1 after the epilogue */
    float unit = c->fp8 ? 1.0f / (448.0f * 448.0f) : 1.0f / (127.0f * 127.0f);
    for (int t = 0; t < T; t++) sx[t] = (0.2f + fabsf(rng_unif(&s))) / sqrtf((float)c->K);
    for (int n = 0; n < N; n++) sw[n] = (0.2f + fabsf(rng_unif(&s))) * unit * 4.0f;
    rand_f32(bias, N, 0.5f, &s);
    rand_f32(x, tn, 2.0f, &s);
    rand_bf16(w16, wf, N, 1.0f, 0.2f, &s);
    rand_bf16(b16, bf, N, 0.0f, 0.3f, &s);
    float *dsx = dev_from(sx, (size_t)T * 4), *dsx2 = dev_from(sx, (size_t)T * 4);
    float *dsw = dev_from(sw, (size_t)N * 4), *dbias = dev_from(bias, (size_t)N * 4);
    float *dx_ref = dev_from(x, tn * 4), *dx = dev_from(x, tn * 4);
    uint16_t *dw = dev_from(w16, (size_t)N * 2), *db = dev_from(b16, (size_t)N * 2);
    float *y_ref = dev_alloc(tn * 4), *y = dev_alloc(tn * 4);
    uint16_t *o_ref = dev_alloc(tn * 2), *o = dev_alloc(tn * 2);
    void *q_ref = dev_alloc((size_t)T * ldn), *q = dev_alloc((size_t)T * ldn);
    float *s_ref = dev_alloc((size_t)T * 4), *s_own = dev_alloc((size_t)T * 4);
    /* the pass, then the norm */
    qrl_cuda_w8a8_kernel ran_ref = QRL_CUDA_W8A8_AUTO, ran = QRL_CUDA_W8A8_AUTO;
    qrl_cuda_w8a8_gemm_args a = {.y = y_ref, .xq = dxq, .sx = dsx, .wq = dwq, .sw = dsw,
                                 .bias = c->gemm_bias ? dbias : NULL, .T = T, .N = N, .ld = ld,
                                 .fp8 = c->fp8, .kernel = QRL_CUDA_W8A8_AUTO, .blas = blas,
                                 .ran = &ran_ref};
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_OK, "%s: %s", label, err.msg);
    qrl_cuda_w8a8_act aq_ref = {.q = q_ref, .scales = s_ref, .ld = ldn, .fp8 = c->fp8};
    const uint16_t *nb = c->norm_bias ? db : NULL;
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(c->out ? o_ref : NULL, dx_ref, y_ref, nb, dw, T, N, EPS,
                                       c->codes ? &aq_ref : NULL, NULL, NULL, &err), QRL_OK,
                 "%s: %s", label, err.msg);
    /* deferred: the GEMM leaves raw sums, the norm finishes them; alias: the norm's scales
     * overwrite the GEMM's sx (the forward's one scales array) */
    qrl_cuda_w8a8_epi epi = {.on = true}; /* the GEMM must reset it */
    float *gsx = c->alias ? dsx2 : dsx;
    a.y = y, a.sx = gsx, a.ran = &ran, a.defer = &epi;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_OK, "%s: %s", label, err.msg);
    cr_assert_eq(ran, ran_ref, "%s: the kernel choice moved with defer", label);
    if (c->want_on >= 0)
        cr_assert_eq(epi.on, c->want_on == 1, "%s (%s): defer %d, expected %d", label,
                     qrl_cuda_w8a8_kernel_name(ran), epi.on, c->want_on);
    if (ran != QRL_CUDA_W8A8_CUBLAS) cr_assert(!epi.on, "%s: %s deferred", label,
                                               qrl_cuda_w8a8_kernel_name(ran));
    if (epi.on)
        cr_assert(epi.sx == gsx && epi.sw == dsw && epi.bias == a.bias && epi.N == N &&
                  epi.fp8 == c->fp8, "%s: deferred epilogue fields", label);
    qrl_cuda_w8a8_act aq = {.q = q, .scales = c->alias ? dsx2 : s_own, .ld = ldn, .fp8 = c->fp8};
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8(c->out ? o : NULL, dx, y, nb, dw, T, N, EPS,
                                       c->codes ? &aq : NULL, &epi, NULL, &err), QRL_OK,
                 "%s: %s", label, err.msg);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    expect_same("residual", dx_ref, dx, tn * 4, 4, label);
    if (c->out) expect_same("bf16 row", o_ref, o, tn * 2, 2, label);
    if (c->codes) {
        expect_same("code", q_ref, q, (size_t)T * ldn, 1, label);
        expect_same("scale", s_ref, aq.scales, (size_t)T * 4, 4, label);
    }
    /* not vacuous: the residual moved by the GEMM's output */
    float *xr = host_from(dx, tn * 4);
    size_t moved = 0;
    for (size_t i = 0; i < tn; i++) moved += xr[i] != x[i];
    cr_assert_gt(moved, tn / 2, "%s: the residual barely moved (%zu of %zu)", label, moved, tn);
    fprintf(stderr, "%s: %s defer=%d: bit-identical\n", label, qrl_cuda_w8a8_kernel_name(ran),
            epi.on);
    void *dev[] = {dxq, dwq, dsx, dsx2, dsw, dbias, dx_ref, dx, dw, db, y_ref, y, o_ref, o,
                   q_ref, q, s_ref, s_own};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free(sx); free(sw); free(bias); free(x); free(wf); free(bf); free(w16); free(b16); free(xr);
}

static qrl_cuda_gemm *blas_or_skip(void) {
    require_gpu();
    qrl_cuda_gemm *g;
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_new(&g, &err), QRL_OK, "%s", err.msg);
    return g;
}

Test(cuda_w8a8_epi, int8_kernels_bit_identical) {
    qrl_cuda_gemm *g = blas_or_skip();
    const epi_case cs[] = {
        /* Qwen3-4B o at 64 rows (mid weight: skinny up to 32) and down at 100 */
        {64, 2560, 4096, false, true, false, true, false, true, 1},
        {100, 2560, 9728, false, false, false, true, true, true, 1},
        /* Qwen2.5-1.5B down at 200 rows as the final norm reads it (BF16 rows only) */
        {200, 1536, 8960, false, false, false, false, true, false, 1},
        {65, 2048, 4096, false, true, true, true, true, false, 1},
        {37, 2050, 4096, false, true, false, true, false, true, -1}, /* odd N */
        {8, 2560, 4096, false, true, false, true, false, true, 0},   /* skinny */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) check_case(g, &cs[i], 100 + 7 * i);
    qrl_cuda_gemm_free(g);
}

Test(cuda_w8a8_epi, fp8_kernels_bit_identical) {
    qrl_cuda_gemm *g = blas_or_skip();
    const epi_case cs[] = {
        /* o (K = 4096: never the scales in cuBLASLt's epilogue) and down of Qwen3-4B */
        {128, 2560, 4096, true, true, false, true, false, true, 1},
        {100, 2560, 9728, true, false, false, true, true, true, 1},
        {17, 2560, 9728, true, false, true, false, true, false, -1}, /* large: cuBLAS from 1 */
        {64, 2048, 4096, true, true, true, true, true, false, 1},
        {40, 2050, 4096, true, true, false, true, false, true, -1}, /* odd N */
        {128, 2560, 2560, true, true, false, true, false, true, -1}, /* scaled in cuBLASLt */
        {3, 2560, 4096, true, false, false, true, false, true, 0},   /* skinny */
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) check_case(g, &cs[i], 300 + 7 * i);
    qrl_cuda_gemm_free(g);
}

Test(cuda_w8a8_epi, errors) {
    require_gpu();
    qrl_error err;
    float *d = dev_alloc(4096);
    qrl_cuda_w8a8_epi on = {.sx = d, .sw = d, .N = 16, .on = true}, off = {.N = 3};
    /* no add */
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8((uint16_t *)d, d, NULL, NULL, (uint16_t *)d, 1, 16, EPS,
                                       NULL, &on, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "deferred"), "%s", err.msg);
    /* N != d */
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8((uint16_t *)d, d, d, NULL, (uint16_t *)d, 1, 32, EPS, NULL,
                                       &on, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "N=16, d=32"), "%s", err.msg);
    on.sw = NULL;
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8((uint16_t *)d, d, d, NULL, (uint16_t *)d, 1, 16, EPS, NULL,
                                       &on, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    /* off: ignored */
    cr_assert_eq(qrl_cuda_rmsnorm_w8a8((uint16_t *)d + 256, d, d + 64, NULL, (uint16_t *)d, 1, 16,
                                       EPS, NULL, &off, NULL, &err), QRL_OK, "%s", err.msg);
    /* a GEMM that fails its checks leaves defer off */
    qrl_cuda_w8a8_epi e = {.on = true};
    qrl_cuda_w8a8_gemm_args a = {.y = d, .xq = d, .sx = d, .wq = d, .sw = d, .T = 1, .N = 1,
                                 .ld = 17, .defer = &e};
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(!e.on);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    qrl_cuda_free(d);
}

/* ---- forward ---------------------------------------------------------------------------- */

#define FW_PREFILL 100 /* chunks of 64 and 36 rows */
#define FW_STEPS 3
#define FW_V 512
#define FW_ROWS (FW_PREFILL + 1 + 2 * FW_STEPS)

/* A random model whose o (D x Q = 2048 x 4096) and down (2048 x 4096) are mid-size weights
 * (AUTO: cuBLAS above 16 / 32 rows, and from one row with QRL_W8A8_SKINNY_MAX_T=0) with
 * K = 4096 (FP8: never the scales in cuBLASLt's epilogue), an o bias; quantized on the CPU
 * (per-channel weight scales). */
static qrl_model *epi_model(qrl_precision prec) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN2, .dim = 2048, .hidden_dim = 4096,
                          .n_layers = 2, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128,
                          .vocab_size = FW_V, .max_seq_len = 256, .norm_eps = 1e-6f,
                          .qkv_bias = true, .o_bias = true, .tie_embeddings = true,
                          .rope = {.theta = 1000000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 31);
    qrl_model_round_bf16(m);
    cr_assert_eq(qrl_model_quantize(m, prec, &err), QRL_OK, "%s", err.msg);
    return m;
}

/* Every logit of a chunked prefill (all rows), a short prefill and FW_STEPS batched decode
 * steps, with the environment variable env set to "1" (NULL: none of the switches). */
static float *forward_logits(const qrl_model *m, const char *env) {
    unsetenv("QRL_W8A8_EPILOGUE_PASS");
    unsetenv("QRL_W8A8_UNFUSED");
    if (env) setenv(env, "1", 1); /* read by qrl_cuda_forward_new */
    qrl_cuda_forward_desc d = {.max_rows = 64, .max_ctx = 128, .block_size = 16,
                               .n_blocks = 20, .max_seqs = 2, .precision = m->precision};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    int32_t ids[FW_PREFILL];
    uint64_t s = 21;
    for (int i = 0; i < FW_PREFILL; i++) ids[i] = (int32_t)(rng_next(&s) % FW_V);
    float *lg = prefill_decode_logits(f, FW_V, ids, FW_PREFILL, 3, 9, 10, FW_STEPS);
    qrl_cuda_forward_free(f);
    if (env) unsetenv(env);
    return lg;
}

static void forward_equal(qrl_precision prec, bool skinny0) {
    require_gpu();
    if (skinny0) setenv("QRL_W8A8_SKINNY_MAX_T", "0", 1); /* read once, at the first GEMM */
    else unsetenv("QRL_W8A8_SKINNY_MAX_T");
    qrl_model *m = epi_model(prec);
    size_t n = (size_t)FW_ROWS * FW_V;
    float *def = forward_logits(m, NULL);
    const char *ab[] = {"QRL_W8A8_EPILOGUE_PASS", "QRL_W8A8_UNFUSED"};
    size_t distinct = 0, finite = 0;
    for (size_t i = 0; i < n; i++) distinct += def[i] != def[0], finite += isfinite(def[i]);
    cr_assert_eq(finite, n, "%s: non-finite logits", qrl_precision_name(prec));
    cr_assert_gt(distinct, n / 2, "%s: logits nearly constant", qrl_precision_name(prec));
    for (int v = 0; v < 2; v++) {
        float *other = forward_logits(m, ab[v]);
        size_t diff = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&def[i], &other[i], 4) && !diff++) first = i;
        cr_assert_eq(diff, 0, "%s skinny0=%d: %zu of %zu logits differ with %s=1 (first %zu "
                     "(row %zu): deferred %.9g vs %.9g)", qrl_precision_name(prec), skinny0, diff,
                     n, ab[v], first, first / FW_V, def[first], other[first]);
        fprintf(stderr, "forward %s skinny0=%d: %zu logits bit-identical deferred vs %s=1\n",
                qrl_precision_name(prec), skinny0, n, ab[v]);
        free(other);
    }
    free(def);
    qrl_model_free(m);
    unsetenv("QRL_W8A8_SKINNY_MAX_T");
}

Test(cuda_w8a8_epi, forward_int8_deferred_equals_pass) { forward_equal(QRL_PRECISION_W8A8_INT8, false); }
Test(cuda_w8a8_epi, forward_fp8_deferred_equals_pass) { forward_equal(QRL_PRECISION_W8A8_FP8, false); }
Test(cuda_w8a8_epi, forward_int8_cublas_every_row) { forward_equal(QRL_PRECISION_W8A8_INT8, true); }
Test(cuda_w8a8_epi, forward_fp8_cublas_every_row) { forward_equal(QRL_PRECISION_W8A8_FP8, true); }
