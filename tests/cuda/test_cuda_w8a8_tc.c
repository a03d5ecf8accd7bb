/* The W8A8 GEMM kernels of kernels/cuda/gemm_w8a8.cuh, every kernel choice, against the CPU
 * reference (kernels/cpu/quant.h), on fresh random inputs: odd K (1, 17, 63, 1001, 4099, 7001),
 * odd N and N a multiple of 16 (cuBLASLt's FP8 kernels refuse some odd N: the CUBLAS kernel
 * then runs mma-tiled; each line of the log names what ran), T from 1 to 257 (below and above the AUTO thresholds; tiled with and without
 * its split-K workspace; AUTO with and without a cuBLAS handle), rows with NaN, +-Inf and
 * all zeros, guard regions around every output.
 *   - INT8: each kernel's outputs memcmp-equal to qrl_gemm_int8 (+ bias after the
 *     epilogue, as model/linear.c): INT32 sums are exact in any order.
 *   - FP8 quantization (F32 and BF16 inputs): codes (padding 0x00) and scales memcmp-equal
 *     to qrl_fp8_quantize_rows.
 *   - FP8 GEMM vs qrl_gemm_fp8 (+ bias): the products are exact; the CPU sums in double.
 *     Bound per element: |gpu - cpu| <= tol * (sx[t] * sw[n] * sum_k |x_k w_k| + |bias[n]|)
 *     (decoded codes).  The mma kernels sum each 64-product chunk on the tensor cores and
 *     the chunks in F32: tol = 2^-16 (K / 64 <= 256 F32 additions of 2^-24 each, with
 *     room); measured worst 5e-8.  cuBLASLt (wgmma) keeps fewer accumulator bits: tol =
 *     2^-11, measured worst 1.4e-4 (K = 96); the same bound for its per-token x
 *     per-channel scales and bias in cuBLASLt's epilogue (CUBLAS, OUTER_VEC_32F), whose
 *     products round differently from the CPU's (acc * sx) * sw + b.  A layout or indexing bug gives errors of
 *     order 1.  NaN rows must stay NaN.  The worst ratios |gpu - cpu| / (sx sw sum|xw| +
 *     |b|) are printed per class. */
#include <cuda_runtime.h>

#include "cpu/quant.h"
#include "cuda/gemm_w8a8.cuh"
#include "cuda_test_util.h"
#include "w8a8_test_util.h"

#define FP8_TOL_MMA (1.0 / 65536)
#define FP8_TOL_BLAS (1.0 / 2048)

typedef struct gemm_case {
    int T, N, K, ld;
    float *b, *sx, *sw, *want, *mag; /* mag: FP8 bound scale per output */
    void *dxq, *dwq, *dsx, *dsw, *db;
} gemm_case;

/* Quantize fresh random x, w (fp8 or int8) on the CPU, the reference outputs, device copies. */
static gemm_case make_case(int T, int N, int K, bool fp8, uint64_t seed) {
    gemm_case c = {.T = T, .N = N, .K = K, .ld = qrl_cuda_w8a8_ld(K)};
    uint64_t s = seed;
    float *x = malloc((size_t)T * K * 4), *w = malloc((size_t)N * K * 4);
    c.b = malloc((size_t)N * 4);
    rand_acts(x, T, K, 3.0f, &s);
    rand_f32(w, (size_t)N * K, 0.05f, &s);
    rand_f32(c.b, N, 0.5f, &s);
    if (fp8) {
        check_quantize(x, T, K, 0, 1);
        check_quantize(x, T, K, 1, 1);
    }
    uint8_t *xq = malloc((size_t)T * K), *wq = malloc((size_t)N * K);
    c.sx = malloc((size_t)T * 4), c.sw = malloc((size_t)N * 4);
    c.want = malloc((size_t)T * N * 4), c.mag = malloc((size_t)T * N * 4);
    qrl_error err;
    if (fp8) {
        qrl_fp8_quantize_rows(x, T, K, xq, c.sx);
        qrl_fp8_quantize_rows(w, N, K, wq, c.sw);
        qrl_gemm_fp8(xq, c.sx, wq, c.sw, T, N, K, c.want);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double a = 0;
                for (int k = 0; k < K; k++)
                    a += fabs((double)qrl_e4m3_decode(xq[(size_t)t * K + k]) *
                              qrl_e4m3_decode(wq[(size_t)n * K + k]));
                c.mag[(size_t)t * N + n] = (float)(a * c.sx[t] * c.sw[n]);
            }
    } else {
        qrl_int8_quantize_rows(x, T, K, (int8_t *)xq, c.sx);
        qrl_int8_quantize_rows(w, N, K, (int8_t *)wq, c.sw);
        cr_assert_eq(qrl_gemm_int8((int8_t *)xq, c.sx, (int8_t *)wq, c.sw, T, N, K, c.want, &err),
                     QRL_OK, "%s", err.msg);
    }
    uint8_t *xp = pad_codes(xq, T, K, c.ld), *wp = pad_codes(wq, N, K, c.ld);
    c.dxq = dev_from(xp, (size_t)T * c.ld);
    c.dwq = dev_from(wp, (size_t)N * c.ld);
    c.dsx = dev_from(c.sx, (size_t)T * 4);
    c.dsw = dev_from(c.sw, (size_t)N * 4);
    c.db = dev_from(c.b, (size_t)N * 4);
    free(x); free(w); free(xq); free(wq); free(xp); free(wp);
    return c;
}

static void free_case(gemm_case *c) {
    void *dev[] = {c->dxq, c->dwq, c->dsx, c->dsw, c->db};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) qrl_cuda_free(dev[i]);
    free(c->b); free(c->sx); free(c->sw); free(c->want); free(c->mag);
}

/* The kernel choices tried on every shape: (kernel, split-K workspace, cuBLAS handle). */
typedef struct variant { qrl_cuda_w8a8_kernel k; bool split, blas; } variant;
static const variant VARIANTS[] = {
    {QRL_CUDA_W8A8_AUTO, false, false},      {QRL_CUDA_W8A8_AUTO, true, true},
    {QRL_CUDA_W8A8_DP4A, false, false},      {QRL_CUDA_W8A8_MMA_SKINNY, false, false},
    {QRL_CUDA_W8A8_MMA_TILED, false, false}, {QRL_CUDA_W8A8_MMA_TILED, true, false},
    {QRL_CUDA_W8A8_CUBLAS, false, true},     {QRL_CUDA_W8A8_CUBLAS_UNFUSED, false, true}};
#define N_VARIANTS (int)(sizeof VARIANTS / sizeof *VARIANTS)
static qrl_cuda_gemm *g_blas;

/* Run variant v into a guarded output; *ran = the kernel that ran. */
static float *run_gemm(const gemm_case *c, bool fp8, const variant *v, bool bias,
                       qrl_cuda_w8a8_kernel *ran) {
    qrl_cuda_w8a8_kernel k = v->k;
    bool split = v->split;
    size_t wf = split ? qrl_cuda_w8a8_work_floats(c->T, c->N, c->ld) : 0;
    void *work = NULL;
    if (wf) cr_assert_eq(qrl_cuda_malloc(&work, wf * 4, NULL), QRL_OK);
    guarded gy = guarded_new((size_t)c->T * c->N, 4);
    qrl_cuda_w8a8_gemm_args a = {.y = guarded_ptr(gy), .xq = c->dxq, .sx = c->dsx, .wq = c->dwq,
                                 .sw = c->dsw, .bias = bias ? c->db : NULL, .T = c->T, .N = c->N,
                                 .ld = c->ld, .fp8 = fp8, .kernel = k, .work = work,
                                 .work_floats = wf, .blas = v->blas ? g_blas : NULL, .ran = ran};
    qrl_error err;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_OK, "%s", err.msg);
    float *got = malloc((size_t)c->T * c->N * 4);
    guarded_fetch(gy, got, qrl_cuda_w8a8_kernel_name(k));
    if (work) qrl_cuda_free(work);
    return got;
}

static const int SHAPES[][3] = {
    {1, 1, 1},     {1, 37, 5},      {5, 129, 4099}, {16, 64, 130},  {17, 33, 17},
    {33, 65, 1001}, {64, 200, 96},  {65, 257, 63},  {100, 131, 1001}, {130, 300, 2048},
    {257, 67, 4099}, {1, 1536, 1536}, {200, 40, 8960}, {130, 256, 1001}, {257, 512, 2048},
    {9, 48, 6150},  {30, 33, 7001}}; /* the last two: skinny's 16-warp blocks (ld >= 6144) */
#define N_SHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

static void blas_up(void) {
    qrl_error err;
    if (qrl_cuda_gemm_new(&g_blas, &err) != QRL_OK) g_blas = NULL;
}
static void blas_down(void) { qrl_cuda_gemm_free(g_blas); }

/* "auto->mma-skinny" etc.: what each variant ran, for the log */
static void note_ran(char *buf, size_t cap, const variant *v, qrl_cuda_w8a8_kernel ran) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s%s%s->%s", n ? ", " : "", qrl_cuda_w8a8_kernel_name(v->k),
             v->split ? "+split" : "", v->blas ? "+blas" : "", qrl_cuda_w8a8_kernel_name(ran));
}

Test(cuda_w8a8_tc, int8_every_kernel_bit_identical_to_cpu, .timeout = 240, .init = blas_up,
     .fini = blas_down) {
    require_gpu();
    cr_assert_not_null(g_blas);
    for (int si = 0; si < N_SHAPES; si++) {
        int T = SHAPES[si][0], N = SHAPES[si][1], K = SHAPES[si][2];
        gemm_case c = make_case(T, N, K, false, 300 + si);
        bool bias = si & 1;
        float *want = malloc((size_t)T * N * 4);
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++)
                want[(size_t)t * N + n] = c.want[(size_t)t * N + n] + (bias ? c.b[n] : 0.0f);
        char ran_s[512] = "";
        for (int vi = 0; vi < N_VARIANTS; vi++) {
            qrl_cuda_w8a8_kernel ran;
            float *got = run_gemm(&c, false, &VARIANTS[vi], bias, &ran);
            for (size_t i = 0; i < (size_t)T * N; i++)
                cr_assert(memcmp(&got[i], &want[i], 4) == 0,
                          "variant %d (%s) T=%d N=%d K=%d bias=%d: y[%zu] gpu %.9g cpu %.9g", vi,
                          qrl_cuda_w8a8_kernel_name(ran), T, N, K, bias, i, got[i], want[i]);
            free(got);
            note_ran(ran_s, sizeof ran_s, &VARIANTS[vi], ran);
        }
        fprintf(stderr, "int8 T=%d N=%d K=%d bias=%d: bit-identical to the CPU: %s (split %zu "
                "floats)\n", T, N, K, bias, ran_s, qrl_cuda_w8a8_work_floats(T, N, c.ld));
        free(want);
        free_case(&c);
    }
}

Test(cuda_w8a8_tc, fp8_quantize_equal_and_gemm_within_bound, .timeout = 240, .init = blas_up,
     .fini = blas_down) {
    require_gpu();
    cr_assert_not_null(g_blas);
    double worst_all[2] = {0, 0}; /* mma kernels, cuBLAS */
    for (int si = 0; si < N_SHAPES; si++) {
        int T = SHAPES[si][0], N = SHAPES[si][1], K = SHAPES[si][2];
        gemm_case c = make_case(T, N, K, true, 500 + si);
        bool bias = si & 1;
        double worst[2] = {0, 0};
        char ran_s[512] = "";
        for (int vi = 0; vi < N_VARIANTS; vi++) {
            if (VARIANTS[vi].k == QRL_CUDA_W8A8_DP4A) continue; /* INT8 only */
            qrl_cuda_w8a8_kernel ran;
            float *got = run_gemm(&c, true, &VARIANTS[vi], bias, &ran);
            note_ran(ran_s, sizeof ran_s, &VARIANTS[vi], ran);
            int blas = ran == QRL_CUDA_W8A8_CUBLAS || ran == QRL_CUDA_W8A8_CUBLAS_UNFUSED;
            double tol = blas ? FP8_TOL_BLAS : FP8_TOL_MMA;
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    size_t i = (size_t)t * N + n;
                    float want = c.want[i] + (bias ? c.b[n] : 0.0f);
                    if (isnan(want)) {
                        cr_assert(isnan(got[i]), "%s T=%d N=%d K=%d: y[%d,%d] gpu %g, cpu NaN",
                                  qrl_cuda_w8a8_kernel_name(ran), T, N, K, t, n, got[i]);
                        continue;
                    }
                    double scale = c.mag[i] + (bias ? fabs(c.b[n]) : 0.0);
                    double d = fabs((double)got[i] - want);
                    cr_assert(d <= tol * scale, "variant %d (%s) T=%d N=%d K=%d: y[%d,%d] gpu "
                              "%.9g cpu %.9g (|d| %.3g > %.3g)", vi, qrl_cuda_w8a8_kernel_name(ran),
                              T, N, K, t, n, got[i], want, d, tol * scale);
                    if (scale > 0) worst[blas] = fmax(worst[blas], d / scale);
                }
            free(got);
        }
        fprintf(stderr, "fp8 T=%d N=%d K=%d bias=%d: codes and scales equal to the CPU; gemm worst "
                "|gpu-cpu|/(sx sw sum|xw| + |b|) mma %.3e (bound %.3e), cublas %.3e (bound "
                "%.3e): %s\n", T, N, K, bias, worst[0], FP8_TOL_MMA, worst[1], FP8_TOL_BLAS, ran_s);
        for (int b = 0; b < 2; b++) worst_all[b] = fmax(worst_all[b], worst[b]);
        free_case(&c);
    }
    fprintf(stderr, "fp8 gemm worst ratio over all shapes: mma kernels %.3e, cublas %.3e\n",
            worst_all[0], worst_all[1]);
}

Test(cuda_w8a8_tc, errors) {
    require_gpu();
    qrl_error err;
    void *d = dev_from("0123456789abcdef0123456789abcdef", 32);
    cr_assert_eq(qrl_cuda_fp8_quantize_rows(d, d, d, 0, 1, 17, 17, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "fp8 quantize") && strstr(err.msg, "ld=17"), "%s", err.msg);
    qrl_cuda_w8a8_gemm_args a = {.y = d, .xq = d, .sx = d, .wq = d, .sw = d, .T = 1, .N = 1,
                                 .ld = 16, .fp8 = true, .kernel = QRL_CUDA_W8A8_DP4A};
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "gemm_fp8") && strstr(err.msg, "dp4a"), "%s", err.msg);
    a.kernel = QRL_CUDA_W8A8_KERNEL_COUNT_;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    a.kernel = QRL_CUDA_W8A8_CUBLAS; /* without a handle */
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "cublas"), "%s", err.msg);
    a.kernel = QRL_CUDA_W8A8_MMA_TILED;
    a.ld = 24;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "ld=24"), "%s", err.msg);
    a.ld = 16;
    a.wq = (uint8_t *)d + 8;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "aligned"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_gemm_fp8(d, d, d, d, d, NULL, 1, 0, 16, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    /* split-K only where the tiled grid is small, never empty splits */
    cr_assert_eq(qrl_cuda_w8a8_work_floats(1024, 17920, 1536), 0);
    cr_assert_eq(qrl_cuda_w8a8_work_floats(128, 1536, 8960), (size_t)8 * 128 * 1536);
    cr_assert_eq(qrl_cuda_w8a8_work_floats(200, 40, 16), 0);
    cr_assert_str_eq(qrl_cuda_w8a8_kernel_name(QRL_CUDA_W8A8_MMA_SKINNY), "mma-skinny");
    cr_assert_str_eq(qrl_cuda_w8a8_kernel_name(QRL_CUDA_W8A8_CUBLAS_UNFUSED), "cublas-unfused");
    a.kernel = QRL_CUDA_W8A8_CUBLAS_UNFUSED; /* without a handle */
    a.wq = d;
    cr_assert_eq(qrl_cuda_w8a8_gemm(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_free(d);
}
