/* RMSNorm with an optional fused residual add (host launchers only, STYLE 7).
 * Reference: qrl_cpu_rmsnorm + qrl_cpu_add (kernels/cpu/ops.h). */
#ifndef QRL_CUDA_NORM_CUH
#define QRL_CUDA_NORM_CUH

#include <stdint.h>

#include "core/status.h"

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

#ifdef __cplusplus
}
#endif
#endif
