/* W4A4 NVFP4 on the GPU (the w4a4-nvfp4 CUDA forward: kernels/cuda/nvfp4_quant.cuh's
 * per-token activation quantization, fused into qrl_cuda_rmsnorm_nvfp4 and
 * qrl_cuda_swiglu_nvfp4, and gemm_fp4.cuh's x_scale) against the CPU reference
 * (kernels/cpu/quant.h, model/linear.h's w4a4-nvfp4, model/forward.h).
 *
 * Kernels, on fresh random inputs, guard regions around every output:
 *   - fused norm / SwiGLU: their BF16 outputs bitwise those of qrl_cuda_rmsnorm /
 *     qrl_cuda_swiglu (and the norm's updated residual), x_out rounds to exactly those BF16
 *     values, and codes, block scales, S_enc are bitwise qrl_nvfp4_quantize_row's on x_out
 *     (xq = e2m1 * decode(scale) exactly, s_dec = 1 / S_enc); widths for each launch shape
 *     (registers / two passes);
 *   - the w4a4 linear: qrl_cuda_nvfp4_quantize_rows on the F32 x, then the FP4 GEMM with
 *     x_scale (skinny, splitk, dequant + cuBLAS, auto) vs qrl_linear_forward(w4a4-nvfp4) on
 *     the same x: |gpu - cpu| <= b * sum_k |x_hat w_hat| + 1e-30 per output (b = 1e-5, 1e-4
 *     for cuBLAS: test_cuda_fp4.c's bounds; the operands are exact on both sides, the GPU
 *     sums in F32 and applies 1 / S_enc of x and w in the epilogue where the CPU folds them
 *     into each element), NaN exactly where the CPU has NaN (a token with a NaN input).
 * Forward: the model rounded to BF16 and quantized to w4a4-nvfp4; CPU forward vs CUDA
 * forward (quant_forward_check.h: chunked prefill, prefill chunks above 64 rows on the
 * dequant path, ragged decode) within LOGIT_TOL of max |cpu logit|.  The GPU quantizes the
 * norms' and SwiGLU's F32 outputs as the CPU does, so their codes differ only where the
 * last bits of a sum moved a value across a rounding boundary; the attention output is
 * BF16 on the GPU (F32 on the CPU), so about 1% of the o-projection's input codes sit one
 * E2M1 step away.  Decode vs prefill re-scoring on the GPU: the log-prob of 47 greedy
 * tokens under decode and under one prefill, bounds as test_cuda_forward_kv.c. */
#include <cuda_runtime.h>
#include <float.h>

#include "cpu/quant.h"
#include "cuda/gemm_fp4.cuh"
#include "cuda/norm.cuh"
#include "cuda/nvfp4_quant.cuh"
#include "cuda/pointwise.cuh"
#include "cuda_cpu_ref.h"
#include "cuda_test_util.h"
#include "model/linear.h"
#include "quant_forward_check.h"

/* FP4 activations: 0.5 of max |logit|.  Every linear input is re-quantized to E2M1, and
 * the GPU's inputs differ from the CPU's by BF16 rounding (2^-8), so an element near a
 * rounding midpoint lands one code away (up to a third of its value) and the difference
 * grows layer by layer.  bench/fp4_sensitivity measures that on the CPU engine alone: a
 * 2^-8 perturbation of the token embedding moves stories260K's w4a4-nvfp4 logits by 0.47
 * (w4a16-nvfp4: 0.004).  Measured GPU vs CPU on an H100: stories260K 0.354, random-hd128
 * 0.245.  The strict checks of this path are the bit-exact quantizers, the linear layer
 * (1e-5 of sum |x w|) and the decode-vs-prefill re-score. */
#define LOGIT_TOL 0.5
#define STEPS 48
#define RESCORE_MAX 0.25
#define RESCORE_MEAN 0.02

/* ---- fused producers ---------------------------------------------------------------- */

/* Outputs of a fused producer over rows of n. */
typedef struct act_bufs {
    int rows, n, cb, nb;
    uint8_t *dc, *ds;
    guarded ge, gd, gq, gx;
    qrl_cuda_nvfp4_act a;
} act_bufs;

static act_bufs act_new(int rows, int n) {
    act_bufs b = {.rows = rows, .n = n, .cb = qrl_cuda_nvfp4_code_bytes(n), .nb = qrl_cuda_nvfp4_blocks(n)};
    /* codes and scales: sizes not multiples of 2 or 4 bytes, so plain buffers, checked for
     * completeness through the CPU comparison */
    cr_assert_eq(qrl_cuda_malloc((void **)&b.dc, (size_t)rows * b.cb, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_malloc((void **)&b.ds, (size_t)rows * b.nb, NULL), QRL_OK);
    b.ge = guarded_new(rows, 4), b.gd = guarded_new(rows, 4);
    b.gq = guarded_new((size_t)rows * n, 2), b.gx = guarded_new((size_t)rows * n, 4);
    b.a = (qrl_cuda_nvfp4_act){.codes = b.dc, .scales = b.ds, .s_enc = guarded_ptr(b.ge),
                               .s_dec = guarded_ptr(b.gd), .xq = guarded_ptr(b.gq),
                               .x_out = guarded_ptr(b.gx)};
    return b;
}

/* Fetch b's outputs and compare them with qrl_nvfp4_quantize_row on x_out; x_out's BF16
 * rounding must be bf16_out (the producer's BF16 output) when given. */
static void act_check(act_bufs *b, const uint16_t *bf16_out, const char *what) {
    int rows = b->rows, n = b->n, cb = b->cb, nb = b->nb;
    size_t tot = (size_t)rows * n;
    uint8_t *gc = malloc((size_t)rows * cb), *gs = malloc((size_t)rows * nb);
    uint8_t *wc = malloc(cb), *ws = malloc(nb);
    float *genc = malloc(rows * 4), *gdec = malloc(rows * 4), *xo = malloc(tot * 4);
    uint16_t *gxq = malloc(tot * 2);
    cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(gc, b->dc, (size_t)rows * cb, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(gs, b->ds, (size_t)rows * nb, NULL), QRL_OK);
    guarded_fetch(b->ge, genc, "s_enc");
    guarded_fetch(b->gd, gdec, "s_dec");
    guarded_fetch(b->gq, gxq, "xq");
    guarded_fetch(b->gx, xo, "x_out");
    for (int r = 0; r < rows; r++) {
        const float *x = xo + (size_t)r * n;
        if (bf16_out)
            for (int j = 0; j < n; j++)
                cr_assert_eq(qrl_cpu_bf16_store(x[j]), bf16_out[(size_t)r * n + j],
                             "%s n=%d row %d [%d]: x_out %.9g does not round to the BF16 output",
                             what, n, r, j, x[j]);
        float we;
        qrl_nvfp4_quantize_row(x, n, wc, ws, &we);
        cr_assert(memcmp(&genc[r], &we, 4) == 0, "%s n=%d row %d: S_enc gpu %.9g cpu %.9g", what, n, r,
                  genc[r], we);
        float dec = 1.0f / we;
        cr_assert(memcmp(&gdec[r], &dec, 4) == 0, "%s row %d: s_dec", what, r);
        cr_assert(memcmp(gs + (size_t)r * nb, ws, nb) == 0, "%s n=%d row %d: block scales differ",
                  what, n, r);
        for (int i = 0; i < cb; i++)
            cr_assert_eq(gc[(size_t)r * cb + i], wc[i], "%s n=%d row %d byte %d: gpu 0x%02x cpu 0x%02x",
                         what, n, r, i, gc[(size_t)r * cb + i], wc[i]);
        for (int j = 0; j < n; j++) {
            float want = qrl_e2m1_decode(qrl_nibble_get(wc, j)) * qrl_e4m3_decode(ws[j / 16]);
            float got = qrl_cpu_bf16_load(gxq[(size_t)r * n + j]);
            cr_assert(isnan(want) ? isnan(got) : got == want, "%s row %d xq[%d] %g want %g", what,
                      r, j, got, want);
        }
    }
    qrl_cuda_free(b->dc);
    qrl_cuda_free(b->ds);
    free(gc); free(gs); free(wc); free(ws); free(genc); free(gdec); free(xo); free(gxq);
}

static void check_norm(int rows, int d, bool with_add, uint64_t seed) {
    uint64_t s = seed;
    size_t tot = (size_t)rows * d;
    float *x = malloc(tot * 4), *add = malloc(tot * 4);
    uint16_t *w = malloc((size_t)d * 2), *bias = malloc((size_t)d * 2);
    rand_f32(x, tot, 3.0f, &s);
    rand_f32(add, tot, 1.0f, &s);
    rand_bf16(w, NULL, d, 1.0f, 0.5f, &s);
    rand_bf16(bias, NULL, d, 0.0f, 0.1f, &s);
    for (size_t i = 0; i < tot; i += 97) x[i] *= 50.0f; /* outliers: blocks of different scales */
    float *dx = dev_from(x, tot * 4), *dx2 = dev_from(x, tot * 4), *dadd = dev_from(add, tot * 4);
    uint16_t *dw = dev_from(w, (size_t)d * 2), *db = dev_from(bias, (size_t)d * 2);
    guarded go = guarded_new(tot, 2), gr = guarded_new(tot, 2);
    act_bufs b = act_new(rows, d);
    qrl_error err;
    cr_assert_eq(qrl_cuda_rmsnorm_nvfp4(guarded_ptr(go), dx, with_add ? dadd : NULL, with_add ? db : NULL,
                                        dw, rows, d, 1e-5f, &b.a, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_rmsnorm(guarded_ptr(gr), dx2, with_add ? dadd : NULL, with_add ? db : NULL,
                                  dw, rows, d, 1e-5f, NULL, &err), QRL_OK, "%s", err.msg);
    uint16_t *o = malloc(tot * 2), *ro = malloc(tot * 2);
    float *x1 = malloc(tot * 4), *x2 = malloc(tot * 4);
    guarded_fetch(go, o, "norm nvfp4 out");
    guarded_fetch(gr, ro, "norm out");
    cr_assert(memcmp(o, ro, tot * 2) == 0, "rmsnorm_nvfp4 d=%d: BF16 output differs from qrl_cuda_rmsnorm", d);
    cr_assert_eq(qrl_cuda_copy_to_host(x1, dx, tot * 4, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(x2, dx2, tot * 4, NULL), QRL_OK);
    cr_assert(memcmp(x1, x2, tot * 4) == 0, "rmsnorm_nvfp4 d=%d: residual differs", d);
    act_check(&b, o, "rmsnorm_nvfp4");
    fprintf(stderr, "rmsnorm_nvfp4 rows=%d d=%d add=%d: codes, scales, S_enc bit-identical to the CPU\n",
            rows, d, with_add);
    void *dev[] = {dx, dx2, dadd, dw, db};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free(x); free(add); free(w); free(bias); free(o); free(ro); free(x1); free(x2);
}

Test(cuda_w4a4, rmsnorm_nvfp4_vs_cpu_quantizer) {
    require_gpu();
    static const int ds[] = {64, 100, 1000, 2048, 4096, 17000};
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) {
        check_norm(3, ds[i], false, 10 + i);
        check_norm(5, ds[i], true, 20 + i);
    }
}

static void check_swiglu(int rows, int f, uint64_t seed) {
    uint64_t s = seed;
    size_t tot = (size_t)rows * f;
    float *gu = malloc(2 * tot * 4);
    rand_f32(gu, 2 * tot, 4.0f, &s);
    for (size_t i = 0; i < 2 * tot; i += 131) gu[i] *= 30.0f;
    float *dgu = dev_from(gu, 2 * tot * 4);
    guarded go = guarded_new(tot, 2), gr = guarded_new(tot, 2);
    act_bufs b = act_new(rows, f);
    qrl_error err;
    cr_assert_eq(qrl_cuda_swiglu_nvfp4(guarded_ptr(go), dgu, rows, f, &b.a, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_swiglu(guarded_ptr(gr), dgu, rows, f, NULL, &err), QRL_OK, "%s", err.msg);
    uint16_t *o = malloc(tot * 2), *ro = malloc(tot * 2);
    guarded_fetch(go, o, "swiglu nvfp4 out");
    guarded_fetch(gr, ro, "swiglu out");
    cr_assert(memcmp(o, ro, tot * 2) == 0, "swiglu_nvfp4 f=%d: BF16 output differs from qrl_cuda_swiglu", f);
    act_check(&b, o, "swiglu_nvfp4");
    fprintf(stderr, "swiglu_nvfp4 rows=%d f=%d: codes, scales, S_enc bit-identical to the CPU\n", rows, f);
    qrl_cuda_free(dgu);
    free(gu); free(o); free(ro);
}

Test(cuda_w4a4, swiglu_nvfp4_vs_cpu_quantizer) {
    require_gpu();
    static const int fs[] = {16, 100, 2048, 2049, 6144, 9000, 40000};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) check_swiglu(i < 5 ? 4 : 2, fs[i], 30 + i);
}

Test(cuda_w4a4, producer_errors) {
    require_gpu();
    qrl_error err;
    float *d = dev_from((float[4]){1, 2, 3, 4}, 16);
    qrl_cuda_nvfp4_act a = {.s_enc = d};
    cr_assert_eq(qrl_cuda_rmsnorm_nvfp4(NULL, d, NULL, NULL, (uint16_t *)d, 1, 4, 1e-5f, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_rmsnorm_nvfp4(NULL, d, NULL, NULL, (uint16_t *)d, 0, 4, 1e-5f, &a, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_swiglu_nvfp4(NULL, d, 1, 0, &a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_swiglu_nvfp4(NULL, d, 1, 2, NULL, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_free(d);
}

/* ---- the w4a4 linear ---------------------------------------------------------------- */

static void check_linear(int T, int N, int K, uint64_t seed) {
    uint64_t s = seed;
    float *w = malloc((size_t)N * K * 4), *x = malloc((size_t)T * K * 4);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            w[(size_t)n * K + k] = 0.05f * ldexpf(1.0f, -(int)((n + k / 16) % 4)) * rng_unif(&s);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            x[(size_t)t * K + k] = ldexpf(rng_unif(&s), (t % 5) - 2 - (k / 16) % 3);
    if (T > 2) x[(size_t)2 * K + K / 2] = NAN; /* token 2: NaN outputs on both sides */
    qrl_linear l;
    qrl_error err;
    void *st = malloc(qrl_linear_storage_bytes(QRL_PRECISION_W4A4_NVFP4, N, K));
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_W4A4_NVFP4, w, NULL, N, K, st, &err), QRL_OK, "%s", err.msg);
    qrl_linear_scratch *sc;
    cr_assert_eq(qrl_linear_scratch_new(T, K, &sc, &err), QRL_OK, "%s", err.msg);
    float *want = malloc((size_t)T * N * 4);
    qrl_linear_forward(&l, x, T, want, sc);
    /* sum_k |x_hat w_hat| for the bound */
    float *xf = malloc((size_t)T * K * 4), *wf = malloc((size_t)N * K * 4);
    for (int t = 0; t < T; t++) qrl_nvfp4_fake_quantize_row(x + (size_t)t * K, K, xf + (size_t)t * K);
    int cb = qrl_cuda_fp4_code_bytes(K), nb = qrl_cuda_fp4_scale_bytes(K, false);
    for (int n = 0; n < N; n++)
        qrl_nvfp4_dequantize_row((uint8_t *)l.codes + (size_t)n * cb, l.block_scales + (size_t)n * nb,
                                 l.global_enc[0], K, wf + (size_t)n * K);
    double *mag = malloc((size_t)T * N * 8);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double m = 0;
            for (int k = 0; k < K; k++) m += fabs((double)xf[(size_t)t * K + k] * wf[(size_t)n * K + k]);
            mag[(size_t)t * N + n] = m;
        }
    float *rs = malloc((size_t)N * 4);
    for (int n = 0; n < N; n++) rs[n] = 1.0f / l.global_enc[0];
    void *dx = dev_from(x, (size_t)T * K * 4), *dc = dev_from(l.codes, (size_t)N * cb),
         *ds = dev_from(l.block_scales, (size_t)N * nb), *drs = dev_from(rs, (size_t)N * 4), *dxq, *dsd,
         *dwork;
    cr_assert_eq(qrl_cuda_malloc(&dxq, (size_t)T * K * 2, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_malloc(&dsd, (size_t)T * 4, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_malloc(&dwork, (size_t)N * K * 2, NULL), QRL_OK);
    qrl_cuda_nvfp4_act a = {.xq = dxq, .s_dec = dsd};
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, dx, false, T, K, NULL, &err), QRL_OK, "%s", err.msg);
    qrl_cuda_gemm *blas;
    cr_assert_eq(qrl_cuda_gemm_new(&blas, &err), QRL_OK, "%s", err.msg);
    static const qrl_cuda_fp4_kernel ks[] = {QRL_CUDA_FP4_SKINNY, QRL_CUDA_FP4_SKINNY_F32,
                                             QRL_CUDA_FP4_SPLITK, QRL_CUDA_FP4_DEQUANT, QRL_CUDA_FP4_AUTO};
    float *got = malloc((size_t)T * N * 4);
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        qrl_cuda_fp4_kernel ran;
        guarded gy = guarded_new((size_t)T * N, 4);
        qrl_cuda_fp4_gemm_args g = {.y = guarded_ptr(gy), .x = dxq, .codes = dc, .scales = ds,
                                    .row_scale = drs, .x_scale = dsd, .T = T, .N = N, .K = K,
                                    .kernel = ks[ki], .work = dwork, .work_elems = (size_t)N * K,
                                    .blas = blas, .ran = &ran};
        cr_assert_eq(qrl_cuda_fp4_gemm(&g, NULL, &err), QRL_OK, "%s", err.msg);
        guarded_fetch(gy, got, "w4a4 gemm");
        double b = ran == QRL_CUDA_FP4_DEQUANT ? 1e-4 : 1e-5, worst = 0;
        for (size_t i = 0; i < (size_t)T * N; i++) {
            cr_assert_eq(isnan(got[i]), isnan(want[i]), "%s T=%d N=%d K=%d y[%zu]: gpu %g cpu %g",
                         qrl_cuda_fp4_kernel_name(ran), T, N, K, i, got[i], want[i]);
            if (isnan(want[i])) continue;
            double d = fabs((double)got[i] - want[i]);
            cr_assert(d <= b * mag[i] + 1e-30, "%s T=%d N=%d K=%d y[%zu] (t %zu n %zu): gpu %.9g cpu %.9g "
                      "(sum|xw| %g)", qrl_cuda_fp4_kernel_name(ran), T, N, K, i, i / N, i % N, got[i],
                      want[i], mag[i]);
            if (mag[i] > 0) worst = fmax(worst, d / mag[i]);
        }
        fprintf(stderr, "w4a4 linear %-10s T=%d N=%d K=%d: max |gpu-cpu|/sum|x w| = %.2e\n",
                qrl_cuda_fp4_kernel_name(ran), T, N, K, worst);
    }
    qrl_cuda_gemm_free(blas);
    void *dev[] = {dx, dc, ds, drs, dxq, dsd, dwork};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    qrl_linear_scratch_free(sc);
    free(w); free(x); free(st); free(want); free(xf); free(wf); free(mag); free(rs); free(got);
}

Test(cuda_w4a4, linear_vs_cpu, .timeout = 120) {
    require_gpu();
    static const int shapes[][3] = {{1, 37, 33},  {3, 129, 1536}, {8, 2048, 2048}, {17, 33, 1001},
                                    {64, 200, 128}, {80, 96, 6144}, {5, 300, 8960}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_linear(shapes[i][0], shapes[i][1], shapes[i][2], 40 + i);
}

/* ---- forward ------------------------------------------------------------------------ */

static const qrl_precision OTHERS[] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8,
                                       QRL_PRECISION_W4A16_NVFP4};
static const qf_case FWD = {80, 10, LOGIT_TOL, OTHERS, 3};

Test(cuda_w4a4, forward_stories260k) {
    require_gpu();
    qf_stories260k(QRL_PRECISION_W4A4_NVFP4, &FWD);
}

Test(cuda_w4a4, forward_random_hd128) {
    require_gpu();
    qf_random_hd128(QRL_PRECISION_W4A4_NVFP4, 90, &FWD);
}

/* w4a4-nvfp4 with the fp4 KV cache on both sides (the all-FP4 rollout): bound 0.8 of max
 * |logit| (bench/fp4_sensitivity: the CPU engine alone moves by 0.62 under a 2^-8
 * embedding perturbation; measured GPU vs CPU on an H100: stories260K 0.570, random-hd128
 * 0.211; stories260K's head_dim 8 makes each flipped K/V code count). */
static const qf_case FWD_KV4 = {80, 10, 0.8, OTHERS, 3, QRL_KV_FORMAT_FP4};

Test(cuda_w4a4, forward_fp4_kv) {
    require_gpu();
    qf_random_hd128(QRL_PRECISION_W4A4_NVFP4, 90, &FWD_KV4);
    qf_stories260k(QRL_PRECISION_W4A4_NVFP4, &FWD_KV4);
}

static double log_softmax_at(const float *x, int n, int t) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return x[t] - mx - log(s);
}

/* Decode STEPS greedy tokens after the prompt (engine kv format kvf), then re-score prompt
 * + tokens by one prefill; |decode - prefill| log-prob bounded as test_cuda_forward_kv.c.
 */
static void rescore(qrl_model *m, const char *name, const int32_t *prompt, int np, qrl_kv_format kvf) {
    int V = m->cfg.vocab_size, n = np + STEPS;
    qrl_cuda_forward_desc d = {.max_rows = 16, .max_ctx = n + 1, .block_size = 16,
                               .n_blocks = 3 * ((n + 1) / 16 + 2), .max_seqs = 4, .kv_format = kvf,
                               .precision = m->precision};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    int a, b;
    float *lg = malloc((size_t)V * 4), *all = malloc((size_t)n * V * 4), lp[STEPS];
    int32_t *ids = malloc((size_t)n * 4);
    memcpy(ids, prompt, (size_t)np * 4);
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &a, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, a, prompt, np, lg, false, &err), QRL_OK, "%s", err.msg);
    ids[np] = qrl_cpu_argmax(lg, V);
    for (int t = 0; t + 1 < STEPS; t++)
        cr_assert_eq(qrl_cuda_forward_decode(f, &a, &ids[np + t], 1, NULL, &ids[np + t + 1], &lp[t + 1], &err),
                     QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &b, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, b, ids, n, all, true, &err), QRL_OK, "%s", err.msg);
    double mx = 0, sum = 0;
    for (int t = 1; t < STEPS; t++) {
        double dd = fabs(lp[t] - log_softmax_at(all + (size_t)(np + t - 1) * V, V, ids[np + t]));
        cr_assert(!isnan(dd), "%s: NaN log-prob at step %d", name, t);
        mx = fmax(mx, dd);
        sum += dd;
    }
    double mean = sum / (STEPS - 1);
    fprintf(stderr, "rescore %s %s kv=%s: |decode - prefill| log-prob max %.3e mean %.3e (bound max "
            "%.2f mean %.2f)\n", name, qrl_precision_name(m->precision), qrl_kv_format_name(kvf), mx,
            mean, RESCORE_MAX, RESCORE_MEAN);
    cr_assert(mx <= RESCORE_MAX && mean <= RESCORE_MEAN, "%s: rescore max %g mean %g", name, mx, mean);
    qrl_cuda_forward_free(f);
    free(lg); free(all); free(ids);
}

Test(cuda_w4a4, decode_vs_prefill_rescore) {
    require_gpu();
    qrl_error err;
    qrl_model *m = ref_model_hd128(77, 512);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &err), QRL_OK, "%s", err.msg);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    rescore(m, "random-hd128", prompt, 40, QRL_KV_FORMAT_BF16);
    rescore(m, "random-hd128", prompt, 40, QRL_KV_FORMAT_FP4);
    qrl_model_free(m);
    char bin[1024];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin)) return;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &err), QRL_OK, "%s", err.msg);
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)(1 + (i * 37 + 11) % (m->cfg.vocab_size - 1));
    rescore(m, "stories260K", prompt, 40, QRL_KV_FORMAT_BF16);
    rescore(m, "stories260K", prompt, 40, QRL_KV_FORMAT_FP4);
    qrl_model_free(m);
}
