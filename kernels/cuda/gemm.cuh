/* Linear layers through cuBLAS (host launchers only, STYLE 7).  Reference: qrl_cpu_matmul. */
#ifndef QRL_CUDA_GEMM_CUH
#define QRL_CUDA_GEMM_CUH

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_cuda_gemm qrl_cuda_gemm; /* opaque: the cuBLAS handle */

/* *out owned by the caller (qrl_cuda_gemm_free).  Errors: CUDA (no device, cuBLAS init). */
qrl_status qrl_cuda_gemm_new(qrl_cuda_gemm **out, qrl_error *err);
void qrl_cuda_gemm_free(qrl_cuda_gemm *g);

/* y[n, m] = x[n, k] · w[m, k]^T: x and w BF16 (w in nn.Linear [out, in] layout), y F32,
 * F32 accumulation.  Device pointers; runs on `stream`.  The kernel is g's bf16 kernel
 * (qrl_cuda_gemm_set_bf16_kernel): AUTO takes the skinny kernel (gemm_bf16_skinny.cuh,
 * with g's workspace and counters) where qrl_cuda_gemm_bf16_picks_skinny says so, else
 * cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F).  Errors: INVALID_ARGUMENT (non-positive
 * sizes), UNSUPPORTED (SKINNY forced on operands it does not take), CUDA (cuBLAS status,
 * launch). */
qrl_status qrl_cuda_gemm_bf16(qrl_cuda_gemm *g, float *y, const uint16_t *x, const uint16_t *w,
                              int n, int k, int m, void *stream, qrl_error *err);

/* Which kernel qrl_cuda_gemm_bf16 runs.  qrl_cuda_gemm_new sets AUTO, or CUBLAS when the
 * environment has QRL_GEMM_BF16_CUBLAS set (not "0"): the A/B switch of the benchmarks. */
typedef enum {
    QRL_CUDA_GEMM_BF16_AUTO = 0,
    QRL_CUDA_GEMM_BF16_CUBLAS = 1,
    QRL_CUDA_GEMM_BF16_SKINNY = 2,
} qrl_cuda_gemm_bf16_kernel;
void qrl_cuda_gemm_set_bf16_kernel(qrl_cuda_gemm *g, qrl_cuda_gemm_bf16_kernel k);

/* Whether qrl_cuda_gemm_bf16 on g runs the skinny kernel for these operands: SKINNY forced,
 * or AUTO with n <= 8 rows, weights of <= 24 MB (m k 2 bytes), a grid of at least one
 * block per SM (qrl_cuda_gemm_bf16_skinny_blocks) and operands it takes (k % 8 == 0,
 * 16-byte aligned x and w).  The limits come from gemm.cu (measured on an H200) or, when
 * the handle was made, QRL_GEMM_BF16_SKINNY_MAX_N / QRL_GEMM_BF16_SKINNY_MAX_MB. */
int qrl_cuda_gemm_bf16_picks_skinny(const qrl_cuda_gemm *g, const uint16_t *x, const uint16_t *w,
                                    int n, int k, int m);

/* Row-major GEMMs of the training engine's linear layers (y = x W^T + b with W [N, K] as
 * nn.Linear), BF16 inputs, F32 accumulation (CUBLAS_COMPUTE_32F), C = A op B + beta C:
 *   QRL_GEMM_FWD: C[T, N] = A[T, K] B[N, K]^T   (y = x W^T;   A = x,  B = W)
 *   QRL_GEMM_DX:  C[T, K] = A[T, N] B[N, K]     (dx = dy W;   A = dy, B = W)
 *   QRL_GEMM_DW:  C[N, K] = A[T, N]^T B[T, K]   (dW = dy^T x; A = dy, B = x)
 * C is F32 when c_f32 != 0, else BF16.  beta 1 accumulates (gradients), 0 overwrites.
 * Errors: INVALID_ARGUMENT (non-positive sizes, unknown kind), CUDA (cuBLAS status). */
enum { QRL_GEMM_FWD = 0, QRL_GEMM_DX = 1, QRL_GEMM_DW = 2 };
qrl_status qrl_cuda_gemm_rm(qrl_cuda_gemm *g, int kind, void *C, int c_f32, const uint16_t *A,
                            const uint16_t *B, int T, int K, int N, float beta, void *stream,
                            qrl_error *err);

/* The W8A8 GEMMs of gemm_w8a8.cuh's CUBLAS kernels: y[n, m] = x[n, k] . w[m, k]^T with x, w
 * rows of k bytes (k a multiple of 16: the codes' padded row length).
 *   s8:    INT8 codes, exact INT32 sums written as int32_t (cublasGemmEx, CUBLAS_COMPUTE_32I);
 *   s8_lt: the same sums through cuBLASLt (its heuristic's kernel, with the workspace);
 *   e4m3:  FP8 E4M3 codes, F32 output and accumulation (cuBLASLt, no fast accumulation,
 *          unit scales);
 *   e4m3_scaled: y[t, o] = sx[t] * sw[o] * (x . w)[t, o] (+ bias[o]) in cuBLASLt's epilogue
 *          (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, sm_90 only; CUBLASLT_EPILOGUE_BIAS
 *          with an F32 bias when bias != NULL); sx [n], sw [m], bias [m] device pointers.
 * cuBLASLt descriptors and algorithms are cached per shape and kind in g (32 plans).
 * Errors: UNSUPPORTED (cuBLAS has no kernel for this shape or mode: callers fall back to
 * their own), INVALID_ARGUMENT (sizes), CUDA (cuBLAS status). */
qrl_status qrl_cuda_gemm_s8(qrl_cuda_gemm *g, int32_t *y, const int8_t *x, const int8_t *w, int n,
                            int k, int m, void *stream, qrl_error *err);
qrl_status qrl_cuda_gemm_s8_lt(qrl_cuda_gemm *g, int32_t *y, const int8_t *x, const int8_t *w,
                               int n, int k, int m, void *stream, qrl_error *err);
qrl_status qrl_cuda_gemm_e4m3(qrl_cuda_gemm *g, float *y, const uint8_t *x, const uint8_t *w,
                              int n, int k, int m, void *stream, qrl_error *err);
qrl_status qrl_cuda_gemm_e4m3_scaled(qrl_cuda_gemm *g, float *y, const uint8_t *x, const float *sx,
                                     const uint8_t *w, const float *sw, const float *bias, int n,
                                     int k, int m, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
