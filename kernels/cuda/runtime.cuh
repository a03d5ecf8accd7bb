/* CUDA runtime helpers for the CUDA backend, callable from C.
 * Errors from the CUDA runtime map to QRL_STATUS_CUDA with the runtime's message. */
#ifndef QRL_CUDA_RUNTIME_CUH
#define QRL_CUDA_RUNTIME_CUH

#include <stddef.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible CUDA devices in *count (0 when there is no driver or no GPU: that is
 * not an error, so CPU-only machines can probe). */
qrl_status qrl_cuda_device_count(int *count, qrl_error *err);
/* One line describing device `index` (name, SMs, memory GiB, compute capability). */
qrl_status qrl_cuda_device_describe(int index, char *buf, size_t buf_size, qrl_error *err);
/* Device memory: *ptr owned by the caller, released with qrl_cuda_free (NULL is a no-op).
 * Errors: CUDA (out of memory, no device). */
qrl_status qrl_cuda_malloc(void **ptr, size_t bytes, qrl_error *err);
void qrl_cuda_free(void *ptr);
/* Blocking copies (host<->device). */
qrl_status qrl_cuda_copy_to_device(void *dst, const void *src, size_t bytes, qrl_error *err);
qrl_status qrl_cuda_copy_to_host(void *dst, const void *src, size_t bytes, qrl_error *err);
/* Wait for all work on the current device; reports an asynchronous kernel error. */
qrl_status qrl_cuda_synchronize(qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
