/* W4A16 NVFP4 / MXFP4 on the GPU (kernels/cuda/gemm_fp4.cuh, the w4a16 CUDA forward)
 * against the CPU reference (kernels/cpu/quant.h, model/linear.h, model/forward.h).
 *
 * Kernels, on fresh random inputs (weights with a per-block spread so the block scales
 * differ; odd K and N; K multiples of 64 for the vector loads and SPLITK; T in {1, 3, 5, 9,
 * 16, 17, 32, 33, 40, 64, 65, 100, 130}; one block scale NaN), guard regions around every
 * output:
 *   - qrl_cuda_fp4_dequantize == the CPU's e2m1 * decode(block scale): memcmp of the BF16
 *     values (exact: at most 5 significant bits);
 *   - GEMM (skinny with either decoder, splitk with its plan and forced shapes of 2/4/8
 *     warps x 1..16 splits, dequant + cuBLAS, auto; row scale 1 / S_enc, F32 bias) vs the
 *     CPU weights (qrl_nvfp4_dequantize / qrl_mxfp4_dequantize) times the BF16 x, summed in
 *     double:
 *       |gpu - ref| <= b * sum_k |x w| + 1e-30 per output (b = 1e-5 skinny / splitk, 1e-4
 *       dequant + cuBLAS),
 *     NaN exactly where the reference is NaN.  The GPU's products are exact and its sums
 *     F32 (the mma's accumulator; splitk adds its clusters' partials in rank order), the
 *     CPU folds 1 / S_enc into each weight (one F32 rounding): the worst ratio is printed
 *     (H200: 1.3e-7 NVFP4, 8.0e-8 MXFP4 over the original shapes; splitk on K = 8960 up to
 *     6.2e-7, one split of 35 steps).  Splitk runs twice per case: bitwise equal, and its
 *     cluster size as planned (16-block clusters are placed).  The plan's automatic shapes
 *     on the H200 are pinned (splitk_plan).  Forward worst logit ratios measured 0.018
 *     (stories260K) and 0.007 (random hd128).
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
static int g_split_diff; /* SPLITK runs whose cluster size differed from the plan's */

/* Relative bound of a kernel: the skinny kernel's F32 mma sums; cuBLAS may block its sums
 * differently (wgmma), so the dequant path gets more room. */
static double bound(qrl_cuda_fp4_kernel k) { return k == QRL_CUDA_FP4_DEQUANT ? 1e-4 : 1e-5; }

/* A kernel choice: SPLITK's warps / splits (0 = its plan). */
typedef struct kcfg { qrl_cuda_fp4_kernel k; int warps, splits; } kcfg;

static const kcfg ALL_KINDS[] = {{QRL_CUDA_FP4_SKINNY, 0, 0}, {QRL_CUDA_FP4_SKINNY_F32, 0, 0},
                                 {QRL_CUDA_FP4_DEQUANT, 0, 0}, {QRL_CUDA_FP4_AUTO, 0, 0},
                                 {QRL_CUDA_FP4_SPLITK, 0, 0}};

/* What AUTO / SPLITK run: SPLITK needs K % 64 == 0 (cudaMalloc'd pointers are aligned). */
static qrl_cuda_fp4_kernel expect_ran(qrl_cuda_fp4_kernel k, int T, int K) {
    bool splitk = K % 64 == 0;
    if (k == QRL_CUDA_FP4_AUTO) return T > 64 ? QRL_CUDA_FP4_DEQUANT : splitk ? QRL_CUDA_FP4_SPLITK : QRL_CUDA_FP4_SKINNY;
    if (k == QRL_CUDA_FP4_SPLITK && !splitk) return QRL_CUDA_FP4_SKINNY;
    return k;
}

/* Every kernel of cfgs on one fresh problem vs the CPU; a SPLITK result is also computed
 * twice and must be bitwise the same (the cluster reduction's fixed order). */
static void check_gemm_cfgs(int T, int N, int K, bool mx, uint64_t seed, const kcfg *cfgs, size_t ncfg) {
    uint64_t s = seed;
    fp4w w = make_weights(N, K, mx, &s);
    uint16_t *xb = malloc((size_t)T * K * 2);
    float *xf = malloc((size_t)T * K * 4), *b = malloc((size_t)N * 4), *rs = malloc((size_t)N * 4);
    rand_bf16(xb, xf, (size_t)T * K, 0.0f, 2.0f, &s);
    rand_f32(b, N, 0.5f, &s);
    for (int n = 0; n < N; n++) rs[n] = mx ? 1.0f : 1.0f / w.enc;
    double *ref = malloc((size_t)T * N * 8), *mag = malloc((size_t)T * N * 8);
#pragma omp parallel for collapse(2) schedule(static)
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
    if ((size_t)N * K <= (1u << 22)) check_dequant(&w, dc, ds);
    qrl_cuda_gemm *blas;
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_new(&blas, &err), QRL_OK, "%s", err.msg);
    float *got = malloc((size_t)T * N * 4), *again = malloc((size_t)T * N * 4);
    for (size_t ki = 0; ki < ncfg; ki++) {
        const kcfg *kc = &cfgs[ki];
        qrl_cuda_fp4_kernel ran = QRL_CUDA_FP4_KERNEL_COUNT_;
        int ran_splits = -1;
        qrl_cuda_fp4_gemm_args a = {.ran_splits = &ran_splits, .x = dx, .codes = dc, .scales = ds, .row_scale = drs,
                                    .bias = db, .T = T, .N = N, .K = K, .mx = mx,
                                    .kernel = kc->k, .work = dwork, .work_elems = (size_t)N * K,
                                    .blas = blas, .ran = &ran, .warps = kc->warps,
                                    .splits = kc->splits};
        int reps = expect_ran(kc->k, T, K) == QRL_CUDA_FP4_SPLITK ? 2 : 1;
        for (int rep = 0; rep < reps; rep++) {
            guarded gy = guarded_new((size_t)T * N, 4);
            a.y = guarded_ptr(gy);
            cr_assert_eq(qrl_cuda_fp4_gemm(&a, NULL, &err), QRL_OK, "%s", err.msg);
            guarded_fetch(gy, rep ? again : got, "fp4 gemm");
        }
        cr_assert_eq(ran, expect_ran(kc->k, T, K), "%s T=%d K=%d ran %s",
                     qrl_cuda_fp4_kernel_name(kc->k), T, K, qrl_cuda_fp4_kernel_name(ran));
        if (reps == 2)
            cr_assert(memcmp(got, again, (size_t)T * N * 4) == 0, "splitk T=%d N=%d K=%d "
                      "(%d warps, %d splits): two runs differ", T, N, K, kc->warps, kc->splits);
        int pw = kc->warps, ps = kc->splits;
        qrl_cuda_fp4_splitk_plan(T, N, K, &pw, &ps);
        double worst = 0;
        for (size_t i = 0; i < (size_t)T * N; i++) {
            if (isnan(ref[i])) {
                cr_assert(isnan(got[i]), "%s T=%d N=%d K=%d: y[%zu] = %g, want NaN",
                          qrl_cuda_fp4_kernel_name(kc->k), T, N, K, i, got[i]);
                continue;
            }
            double d = fabs((double)got[i] - ref[i]);
            cr_assert(d <= bound(ran) * mag[i] + 1e-30, "%s %s (%d warps, %d splits) T=%d N=%d "
                      "K=%d: y[%zu] (t %zu n %zu) gpu %.9g ref %.9g (sum|xw| %g)",
                      mx ? "mxfp4" : "nvfp4", qrl_cuda_fp4_kernel_name(kc->k), pw, ps, T, N, K, i,
                      i / N, i % N, got[i], ref[i], mag[i]);
            if (mag[i] > 0) worst = fmax(worst, d / mag[i]);
        }
        g_worst = fmax(g_worst, worst);
        if (ran == QRL_CUDA_FP4_SPLITK && ran_splits != ps) {
            fprintf(stderr, "splitk T=%d N=%d K=%d: %d splits planned, %d ran\n", T, N, K, ps, ran_splits);
            g_split_diff++;
        }
        if (ran == QRL_CUDA_FP4_SPLITK)
            fprintf(stderr, "%s %-7s T=%d N=%d K=%d (%d warps, %d splits): max |gpu-ref|/sum|xw| = %.2e\n",
                    mx ? "mxfp4" : "nvfp4", qrl_cuda_fp4_kernel_name(kc->k), T, N, K, pw, ps, worst);
        else
            fprintf(stderr, "%s %-7s T=%d N=%d K=%d: max |gpu-ref|/sum|xw| = %.2e\n",
                    mx ? "mxfp4" : "nvfp4", qrl_cuda_fp4_kernel_name(kc->k), T, N, K, worst);
    }
    qrl_cuda_gemm_free(blas);
    void *dev[] = {dx, dc, ds, drs, db, dwork};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free_weights(&w);
    free(xb); free(xf); free(b); free(rs); free(ref); free(mag); free(got); free(again);
}

static void check_gemm(int T, int N, int K, bool mx, uint64_t seed) {
    check_gemm_cfgs(T, N, K, mx, seed, ALL_KINDS, sizeof ALL_KINDS / sizeof *ALL_KINDS);
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

/* SPLITK's paths: the down projection's shape (long K: several splits, the cluster
 * reduction) at T = 1, 8, 17, 32, 33, 64 with its plan and forced block shapes (2/4/8 warps,
 * 1..16 splits, a split count that leaves the last split short), odd N (partial row tiles),
 * K not a multiple of 256 (a half super-chunk), T > 64 (two token tiles). */
static const kcfg SPLITK_CFGS[] = {{QRL_CUDA_FP4_SPLITK, 0, 0}, {QRL_CUDA_FP4_SPLITK, 2, 8},
                                   {QRL_CUDA_FP4_SPLITK, 4, 3}, {QRL_CUDA_FP4_SPLITK, 8, 1},
                                   {QRL_CUDA_FP4_SPLITK, 8, 6}, {QRL_CUDA_FP4_SPLITK, 4, 16},
                                   {QRL_CUDA_FP4_AUTO, 0, 0}};
static const int SPLITK_SHAPES[][3] = {{1, 1536, 8960}, {8, 1536, 8960}, {17, 1536, 8960},
                                       {32, 1536, 8960}, {33, 1536, 8960}, {64, 1536, 8960},
                                       {3, 1001, 640},   {40, 77, 1088},   {9, 2049, 1536},
                                       {1, 5, 64},       {100, 45, 320},   {16, 24, 8960}};

static void splitk_cases(bool mx, uint64_t seed) {
    for (size_t i = 0; i < sizeof SPLITK_SHAPES / sizeof *SPLITK_SHAPES; i++)
        check_gemm_cfgs(SPLITK_SHAPES[i][0], SPLITK_SHAPES[i][1], SPLITK_SHAPES[i][2], mx,
                        seed + i, SPLITK_CFGS, sizeof SPLITK_CFGS / sizeof *SPLITK_CFGS);
    fprintf(stderr, "%s splitk worst |gpu-ref|/sum|xw| = %.2e\n", mx ? "mxfp4" : "nvfp4", g_worst);
    cr_assert_eq(g_split_diff, 0, "clusters of more than 8 blocks fell back to 8");
}

Test(cuda_fp4, nvfp4_splitk_vs_cpu, .timeout = 300) {
    require_gpu();
    splitk_cases(false, 400);
}

Test(cuda_fp4, mxfp4_splitk_vs_cpu, .timeout = 300) {
    require_gpu();
    splitk_cases(true, 500);
}

/* The plan: 2..8 warps (2 only up to 16 tokens), 1..16 non-empty splits. */
Test(cuda_fp4, splitk_plan) {
    int w = 0, s = 0;
    qrl_cuda_fp4_splitk_plan(1, 1536, 8960, &w, &s);
    cr_assert(w == 2 || w == 4 || w == 8, "warps %d", w);
    cr_assert(s >= 1 && s <= 16, "splits %d", s);
    w = 2, s = 100;
    qrl_cuda_fp4_splitk_plan(64, 1536, 8960, &w, &s);
    cr_assert_eq(w, 4);
    cr_assert_eq(s, 12); /* 35 super-chunks, at most 16 splits: 3 per split, 12 splits */
    w = 8, s = 8;
    qrl_cuda_fp4_splitk_plan(1, 64, 640, &w, &s); /* 3 super-chunks */
    cr_assert_eq(w, 8);
    cr_assert_eq(s, 3);
    w = 8, s = 2;
    qrl_cuda_fp4_splitk_plan(1, 64, 1280, &w, &s); /* 5 super-chunks: 3 + 2 */
    cr_assert_eq(s, 2);
    w = 0, s = 4;
    qrl_cuda_fp4_splitk_plan(1, 64, 1536, &w, &s); /* 6 super-chunks: 2 each, 3 splits */
    cr_assert_eq(s, 3);
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || sms != 132)
        return; /* the automatic choices below are the H200's */
    static const int want[][5] = {/* T, N, K, warps, splits (bench/results/fp4-h200-sweep.txt) */
                                  {1, 2048, 1536, 4, 6},   {64, 1536, 1536, 4, 6},
                                  {8, 17920, 1536, 4, 2},  {32, 17920, 1536, 4, 1},
                                  {1, 1536, 8960, 4, 12},  {64, 1536, 8960, 4, 12}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        w = 0, s = 0;
        qrl_cuda_fp4_splitk_plan(want[i][0], want[i][1], want[i][2], &w, &s);
        cr_assert(w == want[i][3] && s == want[i][4], "plan T=%d N=%d K=%d: %dx%d, want %dx%d",
                  want[i][0], want[i][1], want[i][2], w, s, want[i][3], want[i][4]);
    }
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
                                       QRL_PRECISION_W4A16_NVFP4, QRL_PRECISION_W4A16_MXFP4,
                                       QRL_PRECISION_W4A4_NVFP4};
static const qf_case FWD = {80, 10, LOGIT_TOL, OTHERS, 5};

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
