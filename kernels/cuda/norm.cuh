/* RMSNorm with an optional fused residual add, and optionally the per-token W8A8
 * quantization of its output (host launchers only, STYLE 7).
 * Reference: qrl_cpu_rmsnorm + qrl_cpu_add (kernels/cpu/ops.h), then
 * qrl_cuda_{int8,fp8}_quantize_rows (gemm_w8a8.cuh). */
#ifndef QRL_CUDA_NORM_CUH
#define QRL_CUDA_NORM_CUH

#include <stdint.h>

#include "base/status.h"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/nvfp4_quant.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* For each row r in [0, rows) of length d (device pointers):
 *   when add != NULL:  x[r, :] += add[r, :] (+ bias[:] when bias != NULL)   (in place)
 *   out[r, :] = bf16(x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:])
 * x is the F32 residual stream, add an F32 projection output, bias and weight BF16.
 * The mean is accumulated in F32 (tree order).  out may not alias x.
 * Errors: INVALID_ARGUMENT (rows or d <= 0), CUDA (launch). */
qrl_status qrl_cuda_rmsnorm(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                            const uint16_t *weight, int rows, int d, float eps, void *stream,
                            qrl_error *err);

/* qrl_cuda_rmsnorm, and when q != NULL the per-token codes of its BF16 output (INT8 or
 * E4M3 as q->fp8) into q->q [rows, q->ld] and q->scales [rows], byte for byte what
 * qrl_cuda_{int8,fp8}_quantize_rows(x_bf16 = 1) writes on `out` (issue 5: the W8A8
 * activation quantization fused into the norm before the projection: one launch, no BF16
 * round trip).  x and out are bit-identical to qrl_cuda_rmsnorm's.  out may be NULL when
 * q != NULL (codes only); q == NULL is qrl_cuda_rmsnorm.
 * epi (optional; used when epi->on): add [rows, d] holds the raw sums of a W8A8 GEMM whose
 * epilogue was deferred (qrl_cuda_w8a8_gemm_args.defer, epi->N == d); each add[r, i] is
 * finished as the epilogue pass would have (gemm_w8a8.cuh) before the residual add, so x,
 * out and the codes are bit-identical to the pass followed by this norm (issue 22: no pass
 * over the o and down outputs).  epi->sx may be q->scales: the row's scale is read before
 * the codes' scale is written.  Errors: INVALID_ARGUMENT (rows or d <= 0, q->ld < d or not
 * a multiple of 16, both out and q NULL, a deferred epilogue without add, sx or sw or with
 * N != d), CUDA (launch). */
qrl_status qrl_cuda_rmsnorm_w8a8(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                                 const uint16_t *weight, int rows, int d, float eps,
                                 const qrl_cuda_w8a8_act *q, const qrl_cuda_w8a8_epi *epi,
                                 void *stream, qrl_error *err);

/* qrl_cuda_rmsnorm (out may be NULL), and the per-token NVFP4 quantization of its F32
 * outputs, before their BF16 rounding, into *q (w4a4-nvfp4): byte for byte what
 * qrl_cuda_nvfp4_quantize_rows writes for those F32 values (q->x_out, when given; out is
 * their BF16 rounding).  Fused for the reason of qrl_cuda_rmsnorm_w8a8 (one launch, no BF16
 * round trip; the row is already in one block, so its absmax is one more block reduction);
 * quantizing the F32 values as the CPU's linear does keeps the codes those of the CPU
 * engine's (up to the last-bit differences of the norm's sums) where BF16 rounding would
 * move about 1% of them one E2M1 step.  Errors: INVALID_ARGUMENT (rows or d <= 0, q NULL), CUDA (launch). */
qrl_status qrl_cuda_rmsnorm_nvfp4(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                                  const uint16_t *weight, int rows, int d, float eps,
                                  const qrl_cuda_nvfp4_act *q, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
