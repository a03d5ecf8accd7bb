/* W4A16 NVFP4 / MXFP4 on the GPU (kernels/cuda/gemm_fp4.cuh, the w4a16 CUDA forward)
 * against the CPU reference (kernels/cpu/quant.h, model/linear.h, model/forward.h).
 *
 * Kernels, on fresh random inputs (weights with a per-block spread so the block scales
 * differ; odd K and N; K multiples of 64 for the vector loads; T in {1, 3, 16, 17, 64, 65,
 * 130}; one block scale NaN), guard regions around every output:
 *   - qrl_cuda_fp4_dequantize == the CPU's e2m1 * decode(block scale): memcmp of the BF16
 *     values (exact: at most 5 significant bits);
 *   - GEMM (skinny with either decoder, dequant + cuBLAS, auto; row scale 1 / S_enc, F32
 *     bias) vs the CPU weights
 *     (qrl_nvfp4_dequantize / qrl_mxfp4_dequantize) times the BF16 x, summed in double:
 *       |gpu - ref| <= b * sum_k |x w| + 1e-30 per output (b = 1e-5 skinny, 1e-4
 *       dequant + cuBLAS),
 *     NaN exactly where the reference is NaN.  The GPU's products are exact and its sums
 *     F32 (the mma's accumulator), the CPU folds 1 / S_enc into each weight (one F32
 *     rounding): the worst ratio is printed (H200: 1.3e-7 NVFP4, 8.0e-8 MXFP4, every
 *     kernel).  Forward worst logit ratios measured 0.018 (stories260K) and 0.007
 *     (random hd128).
 * Forward: the model rounded to BF16 and quantized to w4a16-nvfp4 / -mxfp4 (the same codes
 * on both sides); CPU forward vs CUDA forward, teacher-forced (chunked prefill, then
 * batched decode of three sequences), the rules of test_cuda_w8a8.c with tol 0.05: the
 * GPU's GEMM inputs are BF16 (the CPU's F32), so logits differ by BF16 rounding. */
#include <cuda_runtime.h>

#include "cpu/quant.h"
#include "cuda/gemm_fp4.cuh"
#include "cuda_cpu_ref.h"
#include "cuda_test_util.h"
#include "quant_forward_check.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "support/test_files.h"

#define LOGIT_TOL 0.05

/* ---- kernels ------------------------------------------------------------------------ */

typedef struct fp4w {
    int N, K, cb, nb;
    bool mx;
    uint8_t *codes, *scales;
    float enc;   /* NVFP4 S_enc (per tensor) */
    float *wf;   /* [N, K] the CPU's dequantized weights */
} fp4w;

static fp4w make_weights(int N, int K, bool mx, uint64_t *s) {
    fp4w w = {.N = N, .K = K, .mx = mx, .cb = qrl_cuda_fp4_code_bytes(K),
              .nb = qrl_cuda_fp4_scale_bytes(K, mx)};
    float *src = calloc((size_t)N * K, 4);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) /* spread per 16-block: scales from 2^-3 to 1 */
            src[(size_t)n * K + k] = 0.05f * ldexpf(1.0f, -(int)((n + k / 16) % 4)) * rng_unif(s);
    w.codes = malloc((size_t)N * w.cb);
    w.scales = malloc((size_t)N * w.nb);
    w.wf = malloc((size_t)N * K * 4);
    if (mx) {
        qrl_mxfp4_quantize(src, N, K, w.codes, w.scales);
        if (N > 1) w.scales[(size_t)1 * w.nb] = 0xFF; /* NaN block: row 1 NaN */
        qrl_mxfp4_dequantize(w.codes, w.scales, N, K, w.wf);
    } else {
        qrl_nvfp4 q = {.rows = N, .cols = K, .codes = w.codes, .scales = w.scales,
                       .global_enc = &w.enc, .per_row = false};
        qrl_error err;
        cr_assert_eq(qrl_nvfp4_quantize(src, &q, &err), QRL_OK, "%s", err.msg);
        if (N > 1) w.scales[(size_t)1 * w.nb] = 0x7F;
        qrl_nvfp4_dequantize(&q, w.wf);
    }
    free(src);
    return w;
}

static void free_weights(fp4w *w) { free(w->codes); free(w->scales); free(w->wf); }

/* GPU decode of the codes vs e2m1 * decode(scale) on the host. */
static void check_dequant(const fp4w *w, const void *dc, const void *ds) {
    guarded gw = guarded_new((size_t)w->N * w->K, 2);
    qrl_error err;
    cr_assert_eq(qrl_cuda_fp4_dequantize(guarded_ptr(gw), dc, ds, w->N, w->K, w->mx, NULL, &err),
                 QRL_OK, "%s", err.msg);
    uint16_t *got = malloc((size_t)w->N * w->K * 2);
    guarded_fetch(gw, got, "fp4 dequantize");
    for (int n = 0; n < w->N; n++)
        for (int k = 0; k < w->K; k++) {
            uint8_t c = w->codes[(size_t)n * w->cb + k / 2];
            c = k & 1 ? c >> 4 : c & 15;
            uint8_t sc = w->scales[(size_t)n * w->nb + k / (w->mx ? 32 : 16)];
            float want = qrl_e2m1_decode(c) * (w->mx ? qrl_e8m0_decode(sc) : qrl_e4m3_decode(sc));
            float g = qrl_cpu_bf16_load(got[(size_t)n * w->K + k]);
            if (isnan(want)) cr_assert(isnan(g), "dequant [%d, %d]: gpu %g, want NaN", n, k, g);
            else cr_assert(memcmp(&g, &want, 4) == 0 || (g == 0 && want == 0),
                           "%s dequant N=%d K=%d [%d, %d]: gpu %.9g cpu %.9g", w->mx ? "mx" : "nv",
                           w->N, w->K, n, k, g, want);
        }
    free(got);
}

static double g_worst; /* max |gpu - ref| / sum|x w| over the kernel checks */

/* Relative bound of a kernel: the skinny kernel's F32 mma sums; cuBLAS may block its sums
 * differently (wgmma), so the dequant path gets more room. */
static double bound(qrl_cuda_fp4_kernel k) { return k == QRL_CUDA_FP4_DEQUANT ? 1e-4 : 1e-5; }

static void check_gemm(int T, int N, int K, bool mx, uint64_t seed) {
    uint64_t s = seed;
    fp4w w = make_weights(N, K, mx, &s);
    uint16_t *xb = malloc((size_t)T * K * 2);
    float *xf = malloc((size_t)T * K * 4), *b = malloc((size_t)N * 4), *rs = malloc((size_t)N * 4);
    rand_bf16(xb, xf, (size_t)T * K, 0.0f, 2.0f, &s);
    rand_f32(b, N, 0.5f, &s);
    for (int n = 0; n < N; n++) rs[n] = mx ? 1.0f : 1.0f / w.enc;
    double *ref = malloc((size_t)T * N * 8), *mag = malloc((size_t)T * N * 8);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)xf[(size_t)t * K + k] * w.wf[(size_t)n * K + k];
                acc += p, m += fabs(p);
            }
            ref[(size_t)t * N + n] = acc + b[n], mag[(size_t)t * N + n] = m;
        }
    void *dx = dev_from(xb, (size_t)T * K * 2), *dc = dev_from(w.codes, (size_t)N * w.cb),
         *ds = dev_from(w.scales, (size_t)N * w.nb), *drs = dev_from(rs, (size_t)N * 4),
         *db = dev_from(b, (size_t)N * 4), *dwork;
    cr_assert_eq(qrl_cuda_malloc(&dwork, (size_t)N * K * 2, NULL), QRL_OK);
    check_dequant(&w, dc, ds);
    qrl_cuda_gemm *blas;
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_new(&blas, &err), QRL_OK, "%s", err.msg);
    static const qrl_cuda_fp4_kernel kinds[] = {QRL_CUDA_FP4_SKINNY, QRL_CUDA_FP4_SKINNY_F32,
                                                QRL_CUDA_FP4_DEQUANT, QRL_CUDA_FP4_AUTO};
    float *got = malloc((size_t)T * N * 4);
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
        guarded gy = guarded_new((size_t)T * N, 4);
        qrl_cuda_fp4_kernel ran = QRL_CUDA_FP4_KERNEL_COUNT_;
        qrl_cuda_fp4_gemm_args a = {.y = guarded_ptr(gy), .x = dx, .codes = dc, .scales = ds,
                                    .row_scale = drs, .bias = db, .T = T, .N = N, .K = K,
                                    .mx = mx, .kernel = kinds[ki], .work = dwork,
                                    .work_elems = (size_t)N * K, .blas = blas, .ran = &ran};
        cr_assert_eq(qrl_cuda_fp4_gemm(&a, NULL, &err), QRL_OK, "%s", err.msg);
        guarded_fetch(gy, got, "fp4 gemm");
        if (kinds[ki] == QRL_CUDA_FP4_AUTO)
            cr_assert_eq(ran, T > 64 ? QRL_CUDA_FP4_DEQUANT : QRL_CUDA_FP4_SKINNY);
        double worst = 0;
        for (size_t i = 0; i < (size_t)T * N; i++) {
            if (isnan(ref[i])) {
                cr_assert(isnan(got[i]), "%s T=%d N=%d K=%d: y[%zu] = %g, want NaN",
                          qrl_cuda_fp4_kernel_name(kinds[ki]), T, N, K, i, got[i]);
                continue;
            }
            double d = fabs((double)got[i] - ref[i]);
            cr_assert(d <= bound(ran) * mag[i] + 1e-30, "%s %s T=%d N=%d K=%d: y[%zu] (t %zu n %zu) "
                      "gpu %.9g ref %.9g (sum|xw| %g)", mx ? "mxfp4" : "nvfp4",
                      qrl_cuda_fp4_kernel_name(kinds[ki]), T, N, K, i, i / N, i % N, got[i],
                      ref[i], mag[i]);
            if (mag[i] > 0) worst = fmax(worst, d / mag[i]);
        }
        g_worst = fmax(g_worst, worst);
        fprintf(stderr, "%s %-7s T=%d N=%d K=%d: max |gpu-ref|/sum|xw| = %.2e\n",
                mx ? "mxfp4" : "nvfp4", qrl_cuda_fp4_kernel_name(kinds[ki]), T, N, K, worst);
    }
    qrl_cuda_gemm_free(blas);
    void *dev[] = {dx, dc, ds, drs, db, dwork};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free_weights(&w);
    free(xb); free(xf); free(b); free(rs); free(ref); free(mag); free(got);
}

static const int SHAPES[][3] = {{1, 1, 1},    {1, 37, 33},     {3, 129, 1536}, {16, 64, 100},
                                {17, 33, 1001}, {64, 200, 128}, {1, 1536, 1536}, {65, 70, 192},
                                {130, 37, 97},  {5, 17, 4096},  {33, 48, 640},  {3, 31, 64}};

Test(cuda_fp4, nvfp4_kernels_vs_cpu, .timeout = 120) {
    require_gpu();
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
        check_gemm(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], false, 200 + i);
    fprintf(stderr, "nvfp4 worst |gpu-ref|/sum|xw| = %.2e\n", g_worst);
}

Test(cuda_fp4, mxfp4_kernels_vs_cpu, .timeout = 120) {
    require_gpu();
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++)
        check_gemm(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], true, 300 + i);
    fprintf(stderr, "mxfp4 worst |gpu-ref|/sum|xw| = %.2e\n", g_worst);
}

Test(cuda_fp4, kernel_errors) {
    require_gpu();
    qrl_error err;
    void *d = dev_from("0123456789abcdef0123456789abcdef", 32);
    qrl_cuda_fp4_gemm_args a = {.y = d, .x = d, .codes = d, .scales = d, .T = 0, .N = 1, .K = 16,
                                .kernel = QRL_CUDA_FP4_SKINNY};
    cr_assert_eq(qrl_cuda_fp4_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "T=0"), "%s", err.msg);
    a.T = 1, a.kernel = QRL_CUDA_FP4_DEQUANT;
    cr_assert_eq(qrl_cuda_fp4_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "workspace"), "%s", err.msg);
    a.kernel = QRL_CUDA_FP4_KERNEL_COUNT_;
    cr_assert_eq(qrl_cuda_fp4_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_fp4_dequantize(d, d, d, 1, 0, false, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_free(d);
}

/* ---- forward ------------------------------------------------------------------------ */

/* max_rows 80: prefill chunks above 64 rows take the dequant + cuBLAS GEMMs */
static const qrl_precision OTHERS[] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8,
                                       QRL_PRECISION_W4A16_NVFP4, QRL_PRECISION_W4A16_MXFP4};
static const qf_case FWD = {80, 10, LOGIT_TOL, OTHERS, 4};

static void forward_stories260k(qrl_precision prec) { qf_stories260k(prec, &FWD); }
static void forward_random_hd128(qrl_precision prec) { qf_random_hd128(prec, 90, &FWD); }

Test(cuda_fp4, forward_nvfp4_stories260k) {
    require_gpu();
    forward_stories260k(QRL_PRECISION_W4A16_NVFP4);
}
Test(cuda_fp4, forward_nvfp4_random_hd128) {
    require_gpu();
    forward_random_hd128(QRL_PRECISION_W4A16_NVFP4);
}
Test(cuda_fp4, forward_mxfp4_stories260k) {
    require_gpu();
    forward_stories260k(QRL_PRECISION_W4A16_MXFP4);
}
Test(cuda_fp4, forward_mxfp4_random_hd128) {
    require_gpu();
    forward_random_hd128(QRL_PRECISION_W4A16_MXFP4);
}

Test(cuda_fp4, engine_refuses_w4a4) {
    require_gpu();
    qrl_model_config c = {.dim = 64, .hidden_dim = 96, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2,
                          .head_dim = 32, .vocab_size = 50, .max_seq_len = 32, .norm_eps = 1e-5f};
    qrl_cuda_forward_desc d = {.max_rows = 4, .max_ctx = 32, .block_size = 8, .n_blocks = 8,
                               .max_seqs = 2, .precision = QRL_PRECISION_W4A4_NVFP4};
    qrl_cuda_forward *f = NULL;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&c, &d, &f, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "w4a4-nvfp4"), "%s", err.msg);
    cr_assert_null(f);
}
