/* Dtype conversion kernels (host launchers only, STYLE 7). */
#ifndef QRL_CUDA_CONVERT_CUH
#define QRL_CUDA_CONVERT_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = float(src[i]) for n BF16 values (device pointers), exact.  `stream` is a
 * cudaStream_t (NULL = default stream).  Errors: CUDA (launch failure). */
qrl_status qrl_cuda_bf16_to_f32(const uint16_t *src, float *dst, size_t n, void *stream,
                                qrl_error *err);
/* dst[i] = bf16(src[i]) with round-to-nearest-even; NaN stays NaN (device pointers). */
qrl_status qrl_cuda_f32_to_bf16(const float *src, uint16_t *dst, size_t n, void *stream,
                                qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
