/* Linear layers through cuBLAS (host launchers only, STYLE 7).  Reference: qrl_cpu_matmul. */
#ifndef QRL_CUDA_GEMM_CUH
#define QRL_CUDA_GEMM_CUH

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_cuda_gemm qrl_cuda_gemm; /* opaque: the cuBLAS handle */

/* *out owned by the caller (qrl_cuda_gemm_free).  Errors: CUDA (no device, cuBLAS init). */
qrl_status qrl_cuda_gemm_new(qrl_cuda_gemm **out, qrl_error *err);
void qrl_cuda_gemm_free(qrl_cuda_gemm *g);

/* y[n, m] = x[n, k] · w[m, k]^T: x and w BF16 (w in nn.Linear [out, in] layout), y F32,
 * F32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).  Device pointers; runs on
 * `stream`.  Errors: INVALID_ARGUMENT (non-positive sizes), CUDA (cuBLAS status). */
qrl_status qrl_cuda_gemm_bf16(qrl_cuda_gemm *g, float *y, const uint16_t *x, const uint16_t *w,
                              int n, int k, int m, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
