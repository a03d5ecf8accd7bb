#include "cuda/gemm.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_bf16_skinny.cuh"
#include "base/tuning.h"
#include "cuda/launch.cuh"

/* cuBLASLt descriptors and the heuristic's algorithm for one FP8 shape, made on first use
 * (a decode step runs the same few shapes over and over). */
#define LT_PLANS 16
typedef struct lt_plan {
    int n, k, m, ok; /* ok: an algorithm was found */
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

/* Column-major view as the BF16 GEMM: y^T[m, n] = w^T-as-stored(op T)[m, k] . x^T[k, n]. */
static lt_plan *lt_plan_get(qrl_cuda_gemm *g, int n, int k, int m) {
    int have = g->n_plans < LT_PLANS ? g->n_plans : LT_PLANS;
    for (int i = 0; i < have; i++) {
        lt_plan *p = &g->plans[i];
        if (p->n == n && p->k == k && p->m == m) return p;
    }
    lt_plan *p = &g->plans[g->n_plans++ % LT_PLANS];
    lt_plan_clear(p);
    p->n = n, p->k = k, p->m = m;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = 0;
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
    if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k, m, k) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k, n, k) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res,
                                       &cnt) == CUBLAS_STATUS_SUCCESS &&
        cnt > 0) {
        p->algo = res.algo;
        p->ok = 1;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

qrl_status qrl_cuda_gemm_e4m3(qrl_cuda_gemm *g, float *y, const uint8_t *x, const uint8_t *w,
                              int n, int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0 || k % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm e4m3: n=%d k=%d m=%d", n, k, m);
    lt_plan *p = lt_plan_get(g, n, k, m);
    if (!p->ok)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "gemm e4m3 n=%d k=%d m=%d: cuBLASLt has no algorithm", n, k, m);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasLtMatmul(g->lt, p->op, &one, w, p->a, x, p->b, &zero, y, p->c, y,
                                      p->c, &p->algo, NULL, 0, (cudaStream_t)stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm e4m3 n=%d k=%d m=%d: %s", n, k, m,
                             cublasGetStatusString(s));
    return QRL_OK;
}
