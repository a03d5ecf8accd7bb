#include "cuda/gemm.cuh"

#include <cublas_v2.h>
#include <stdlib.h>

#include "cuda/launch.cuh"

struct qrl_cuda_gemm {
    cublasHandle_t h;
};

qrl_status qrl_cuda_gemm_new(qrl_cuda_gemm **out, qrl_error *err) {
    *out = NULL;
    qrl_cuda_gemm *g = (qrl_cuda_gemm *)calloc(1, sizeof *g);
    if (!g) return qrl_error_set(err, QRL_STATUS_NOMEM, "gemm: out of memory");
    cublasStatus_t s = cublasCreate(&g->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm: cublasCreate: %s", cublasGetStatusString(s));
    }
    *out = g;
    return QRL_OK;
}

void qrl_cuda_gemm_free(qrl_cuda_gemm *g) {
    if (!g) return;
    cublasDestroy(g->h);
    free(g);
}

qrl_status qrl_cuda_gemm_bf16(qrl_cuda_gemm *g, float *y, const uint16_t *x, const uint16_t *w,
                              int n, int k, int m, void *stream, qrl_error *err) {
    if (n <= 0 || k <= 0 || m <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "gemm: n=%d k=%d m=%d", n, k, m);
    cublasSetStream(g->h, (cudaStream_t)stream);
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
    cublasSetStream(g->h, (cudaStream_t)stream);
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
