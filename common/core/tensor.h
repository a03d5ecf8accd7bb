/* Tensor descriptor shared by the CPU and CUDA backends, and the dtype table.
 *
 * A qrl_tensor does not own its data: `data` points into a mapping, an arena or
 * device memory owned by someone else (named in the API that hands it out). */
#ifndef QRL_CORE_TENSOR_H
#define QRL_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h" /* the dtype table (qrl_dtype, QRL_DTYPE_TABLE) */
#include "core/status.h"

typedef enum qrl_device { QRL_DEVICE_CPU = 0, QRL_DEVICE_CUDA = 1 } qrl_device;

#define QRL_TENSOR_MAX_DIMS 8

typedef struct qrl_tensor {
    qrl_dtype dtype;
    qrl_device device;
    int device_index;
    int ndim;
    int64_t shape[QRL_TENSOR_MAX_DIMS];
    int64_t strides[QRL_TENSOR_MAX_DIMS]; /* in elements; row-major contiguous by default */
    void *data;                           /* borrowed, see the owning API */
} qrl_tensor;

/* Fill shape/ndim and row-major contiguous strides.  ndim in [0, QRL_TENSOR_MAX_DIMS]. */
void qrl_tensor_init(qrl_tensor *t, qrl_dtype dt, int ndim, const int64_t *shape, void *data);
/* Number of elements (product of shape; 1 for a scalar). */
int64_t qrl_tensor_numel(const qrl_tensor *t);
/* numel * dtype size. */
size_t qrl_tensor_nbytes(const qrl_tensor *t);
/* True when strides are row-major contiguous. */
int qrl_tensor_is_contiguous(const qrl_tensor *t);

/* BF16/F16 <-> F32 conversions (round-to-nearest-even on the way down; NaN stays NaN). */
float qrl_bf16_to_f32(uint16_t h);
uint16_t qrl_f32_to_bf16(float f);
float qrl_f16_to_f32(uint16_t h);
uint16_t qrl_f32_to_f16(float f);
/* Convert n elements of `src` (F32/F16/BF16) to F32. Returns UNSUPPORTED for other dtypes. */
qrl_status qrl_convert_to_f32(qrl_dtype src_dtype, const void *src, float *dst, size_t n);

#endif
