#include "cuda/gemm.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_bf16_skinny.cuh"
#include "base/tuning.h"
#include "cuda/launch.cuh"

/* cuBLASLt descriptors and the heuristic's algorithm for one W8A8 shape and kind, made on
 * first use (a decode step runs the same few shapes over and over). */
#define LT_PLANS 32
enum {
    LT_E4M3,        /* E4M3 x E4M3 -> F32, unit scales (the epilogue runs after it) */
    LT_E4M3_SCALED, /* ... per-row x per-column scales (OUTER_VEC_32F) in cuBLASLt's epilogue */
    LT_E4M3_BIAS,   /* ... and the F32 bias (CUBLASLT_EPILOGUE_BIAS) */
    LT_S8,          /* INT8 x INT8 -> INT32 */
};
typedef struct lt_plan {
    int n, k, m, kind, ok; /* ok: an algorithm was found */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

struct qrl_cuda_gemm {
    cublasHandle_t h;
    cublasLtHandle_t lt;
    lt_plan plans[LT_PLANS];
    int n_plans; /* made so far (slot n_plans % LT_PLANS is the next) */
    void *ws;    /* cuBLAS workspace of WS_BYTES, ours so a CUDA graph capture allocates nothing;
                  * also the skinny GEMM's split-K partials (same stream, never both at once) */
    unsigned *counters; /* SK_COUNTERS tile counters of the skinny GEMM, zero between launches */
    qrl_cuda_gemm_bf16_kernel bf16_kernel;
    int skinny_max_n;          /* AUTO's rule: skinny for n <= this ... */
    double skinny_max_bytes;   /* ... weights of at most this many bytes ... */
    int sms;                   /* ... and at least a block per SM */
};

#define WS_BYTES (32u << 20) /* what cuBLAS documents for Hopper */
#define SK_COUNTERS 4096
/* AUTO takes the skinny kernel up to gemm_bf16_skinny_max_n rows (default 8), for weights of
 * at most gemm_bf16_skinny_max_mb MB (default 24; the tuning knobs, base/tuning.h) whose grid has a block for every SM, and cuBLAS otherwise.  From
 * bench/gemm_bf16.c on an H200 (bench/results/gemm-bf16-h200.json, docs/performance.md):
 * the skinny kernel beats cuBLAS only on Qwen3-4B's o projection (2560 x 4096, 140 blocks)
 * at <= 16 rows (1.2-1.6x), loses elsewhere, and a grid smaller than the GPU (Qwen2.5-1.5B's
 * qkv and o: 36-48 blocks) made the decode step 2-5% slower.  1, 2, 4 or a multiple of 8:
 * a decode batch and the one the CUDA graph pads it to (1, 2, 4, 8k rows) take the same
 * kernel.  QRL_GEMM_BF16_SKINNY_MAX_N / _MAX_MB override the limits when a handle is made
 * (bench). */

/* cublasSetStream resets the workspace to cuBLAS's pool: set ours again after it. */
static void set_stream(qrl_cuda_gemm *g, void *stream) {
    cublasSetStream(g->h, (cudaStream_t)stream);
    cublasSetWorkspace(g->h, g->ws, WS_BYTES);
}

qrl_status qrl_cuda_gemm_new(qrl_cuda_gemm **out, qrl_error *err) {
    *out = NULL;
    qrl_cuda_gemm *g = (qrl_cuda_gemm *)calloc(1, sizeof *g);
    if (!g) return qrl_error_set(err, QRL_STATUS_NOMEM, "gemm: out of memory");
    cublasStatus_t s = cublasCreate(&g->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm: cublasCreate: %s", cublasGetStatusString(s));
    }
    s = cublasLtCreate(&g->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(g->h);
        free(g);
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm: cublasLtCreate: %s", cublasGetStatusString(s));
    }
    cudaError_t e = cudaMalloc(&g->ws, WS_BYTES);
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->counters, SK_COUNTERS * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(g->counters, 0, SK_COUNTERS * sizeof(unsigned));
    /* the memset runs on the legacy stream; the kernels on non-blocking ones: finish it */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        qrl_cuda_gemm_free(g);
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm: cannot allocate the %u MiB cuBLAS "
                             "workspace: %s", WS_BYTES >> 20, cudaGetErrorString(e));
    }
    qrl_status st = qrl_cuda_gemm_bf16_skinny_prepare(err);
    if (st != QRL_OK) {
        qrl_cuda_gemm_free(g);
        return st;
    }
    g->bf16_kernel = qrl_tuning_bool(QRL_TUNING_GEMM_BF16_CUBLAS) ? QRL_CUDA_GEMM_BF16_CUBLAS
                                                                  : QRL_CUDA_GEMM_BF16_AUTO;
    g->skinny_max_n = qrl_tuning_int(QRL_TUNING_GEMM_BF16_SKINNY_MAX_N);
    g->skinny_max_bytes = qrl_tuning_real(QRL_TUNING_GEMM_BF16_SKINNY_MAX_MB) * 1e6;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        g->sms = 132;
    *out = g;
    return QRL_OK;
}

static void lt_plan_clear(lt_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

void qrl_cuda_gemm_free(qrl_cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < LT_PLANS; i++) lt_plan_clear(&g->plans[i]);
    cublasLtDestroy(g->lt);
    cublasDestroy(g->h);
    cudaFree(g->ws);
    cudaFree(g->counters);
    free(g);
}

void qrl_cuda_gemm_set_bf16_kernel(qrl_cuda_gemm *g, qrl_cuda_gemm_bf16_kernel k) {
    g->bf16_kernel = k;
}

int qrl_cuda_gemm_bf16_picks_skinny(const qrl_cuda_gemm *g, const uint16_t *x, const uint16_t *w,
                                    int n, int k, int m) {
    if (g->bf16_kernel != QRL_CUDA_GEMM_BF16_AUTO) return g->bf16_kernel == QRL_CUDA_GEMM_BF16_SKINNY;
    return n <= g->skinny_max_n && 2.0 * m * k <= g->skinny_max_bytes &&
           qrl_cuda_gemm_bf16_skinny_blocks(n, k, m) >= g->sms && qrl_cuda_gemm_bf16_skinny_ok(x, w, k);
}

qrl_status qrl_cuda_gemm_bf16(qrl_cuda_gemm *g, float *y, const uint16_t *x, const uint16_t *w,
                              int n, int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm: n=%d k=%d m=%d", n, k, m);
    if (qrl_cuda_gemm_bf16_picks_skinny(g, x, w, n, k, m)) {
        qrl_cuda_bf16_skinny_args a = {.y = y, .x = x, .w = w, .n = n, .k = k, .m = m,
                                       .work = (float *)g->ws, .work_floats = WS_BYTES / 4,
                                       .counters = g->counters, .n_counters = SK_COUNTERS};
        return qrl_cuda_gemm_bf16_skinny(&a, stream, err);
    }
    set_stream(g, stream);
    /* Column-major view: y^T[m, n] = (w^T)^T[m, k] · x^T[k, n]. */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF,
                                    k, x, CUDA_R_16BF, k, &zero, y, CUDA_R_32F, m,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm n=%d k=%d m=%d: %s", n, k, m,
                             cublasGetStatusString(s));
    return QRL_OK;
}

qrl_status qrl_cuda_gemm_rm(qrl_cuda_gemm *g, int kind, void *C, int c_f32, const uint16_t *A,
                            const uint16_t *B, int T, int K, int N, float beta, void *stream,
                            qrl_error *err) {
    if (T <= 0 || K <= 0 || N <= 0 || kind < QRL_GEMM_FWD || kind > QRL_GEMM_DW)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm kind %d T=%d K=%d N=%d",
                             kind, T, K, N);
    set_stream(g, stream);
    const float one = 1.0f;
    cudaDataType ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t s;
    /* cuBLAS is column-major: a row-major [r, c] matrix is a column-major [c, r] one, so
     * each row-major product is computed as its transpose. */
    if (kind == QRL_GEMM_FWD) /* C^T[N, T] = B^T-as-stored(op T) . A^T */
        s = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, B, CUDA_R_16BF, K, A,
                         CUDA_R_16BF, K, &beta, C, ct, N, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    else if (kind == QRL_GEMM_DX) /* C^T[K, T] = W^T[K, N] . dy^T[N, T] */
        s = cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, &one, B, CUDA_R_16BF, K, A,
                         CUDA_R_16BF, N, &beta, C, ct, K, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    else /* C^T[K, N] = x^T[K, T] . dy[T, N] */
        s = cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, &one, B, CUDA_R_16BF, K, A,
                         CUDA_R_16BF, N, &beta, C, ct, K, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm kind %d T=%d K=%d N=%d: %s", kind, T,
                             K, N, cublasGetStatusString(s));
    return QRL_OK;
}

/* ---- W8A8 ---------------------------------------------------------------------------- */

qrl_status qrl_cuda_gemm_s8(qrl_cuda_gemm *g, int32_t *y, const int8_t *x, const int8_t *w, int n,
                            int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || k % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm s8: n=%d k=%d m=%d", n, k, m);
    set_stream(g, stream);
    const int32_t one = 1, zero = 0;
    cublasStatus_t s = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_8I,
                                    k, x, CUDA_R_8I, k, &zero, y, CUDA_R_32I, m,
                                    CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "gemm s8 n=%d k=%d m=%d: %s", n, k, m,
                             cublasGetStatusString(s));
    if (s != CUBLAS_STATUS_SUCCESS)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm s8 n=%d k=%d m=%d: %s", n, k, m,
                             cublasGetStatusString(s));
    return QRL_OK;
}

/* Column-major view as the BF16 GEMM: y^T[m, n] = w^T-as-stored(op T)[m, k] . x^T[k, n]:
 * cuBLASLt's A is the weights (m rows), B the tokens (n columns).  The heuristic may use
 * the handle's workspace (split-K for the skinny decode shapes; its reduction schemes are
 * deterministic), except the unit-scale E4M3 plan (none, as before issue 22: the A/B). */
static lt_plan *lt_plan_get(qrl_cuda_gemm *g, int n, int k, int m, int kind) {
    int have = g->n_plans < LT_PLANS ? g->n_plans : LT_PLANS;
    for (int i = 0; i < have; i++) {
        lt_plan *p = &g->plans[i];
        if (p->n == n && p->k == k && p->m == m && p->kind == kind) return p;
    }
    lt_plan *p = &g->plans[g->n_plans++ % LT_PLANS];
    lt_plan_clear(p);
    p->n = n, p->k = k, p->m = m, p->kind = kind;
    bool s8 = kind == LT_S8;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType in = s8 ? CUDA_R_8I : CUDA_R_8F_E4M3, out = s8 ? CUDA_R_32I : CUDA_R_32F;
    cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType bias_t = CUDA_R_32F;
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = kind == LT_E4M3 ? 0 : WS_BYTES; /* the unit-scale plan as before issue 22 */
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
#define LT_OK(x) ((x) == CUBLAS_STATUS_SUCCESS)
    bool ok = LT_OK(cublasLtMatmulDescCreate(&p->op, s8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                             s8 ? CUDA_R_32I : CUDA_R_32F)) &&
              LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
              LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (ok && (kind == LT_E4M3_SCALED || kind == LT_E4M3_BIAS)) {
        /* the scale and bias pointers are set per call (lt_run); placeholders for the query */
        const void *dummy = g->ws;
        ok = LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy)) &&
             LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
        if (ok && kind == LT_E4M3_BIAS)
            ok = LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) &&
                 LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t)) &&
                 LT_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dummy, sizeof dummy));
    }
    ok = ok && LT_OK(cublasLtMatrixLayoutCreate(&p->a, in, k, m, k)) &&
         LT_OK(cublasLtMatrixLayoutCreate(&p->b, in, k, n, k)) &&
         LT_OK(cublasLtMatrixLayoutCreate(&p->c, out, m, n, m)) &&
         LT_OK(cublasLtMatmulPreferenceCreate(&pref)) &&
         LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
         LT_OK(cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &cnt)) &&
         cnt > 0;
#undef LT_OK
    if (ok) {
        p->algo = res.algo;
        p->ok = 1;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

/* Run plan p: D = A . B (scales and bias, where p's kind has them, set on its descriptor
 * first: cuBLASLt reads the pointers at launch). */
static qrl_status lt_run(qrl_cuda_gemm *g, lt_plan *p, void *y, const void *x, const void *w,
                         const float *sx, const float *sw, const float *bias, void *stream,
                         const char *what, qrl_error *err) {
    if (!p->ok)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s n=%d k=%d m=%d: cuBLASLt has no "
                             "algorithm", what, p->n, p->k, p->m);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (p->kind == LT_E4M3_SCALED || p->kind == LT_E4M3_BIAS) {
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
        if (s == CUBLAS_STATUS_SUCCESS && p->kind == LT_E4M3_BIAS)
            s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    const float onef = 1.0f, zerof = 0.0f;
    const int32_t onei = 1, zeroi = 0;
    bool s8 = p->kind == LT_S8;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(g->lt, p->op, s8 ? (const void *)&onei : &onef, w, p->a, x, p->b,
                           s8 ? (const void *)&zeroi : &zerof, y, p->c, y, p->c, &p->algo, g->ws,
                           WS_BYTES, (cudaStream_t)stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        /* found by the heuristic, refused at launch: the caller's fallback from now on */
        p->ok = 0;
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s n=%d k=%d m=%d: %s", what, p->n,
                             p->k, p->m, cublasGetStatusString(s));
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return qrl_error_set(err, QRL_STATUS_CUDA, "%s n=%d k=%d m=%d: %s", what, p->n, p->k, p->m,
                             cublasGetStatusString(s));
    return QRL_OK;
}

qrl_status qrl_cuda_gemm_s8_lt(qrl_cuda_gemm *g, int32_t *y, const int8_t *x, const int8_t *w,
                               int n, int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || k % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm s8 lt: n=%d k=%d m=%d", n, k, m);
    return lt_run(g, lt_plan_get(g, n, k, m, LT_S8), y, x, w, NULL, NULL, NULL, stream,
                  "gemm s8 lt", err);
}

qrl_status qrl_cuda_gemm_e4m3(qrl_cuda_gemm *g, float *y, const uint8_t *x, const uint8_t *w,
                              int n, int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || k % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm e4m3: n=%d k=%d m=%d", n, k, m);
    return lt_run(g, lt_plan_get(g, n, k, m, LT_E4M3), y, x, w, NULL, NULL, NULL, stream,
                  "gemm e4m3", err);
}

qrl_status qrl_cuda_gemm_e4m3_scaled(qrl_cuda_gemm *g, float *y, const uint8_t *x, const float *sx,
                                     const uint8_t *w, const float *sw, const float *bias, int n,
                                     int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || k % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm e4m3 scaled: n=%d k=%d m=%d",
                             n, k, m);
    return lt_run(g, lt_plan_get(g, n, k, m, bias ? LT_E4M3_BIAS : LT_E4M3_SCALED), y, x, w, sx,
                  sw, bias, stream, "gemm e4m3 scaled", err);
}
