/* Tensor descriptor shared by the CPU and CUDA backends, and the dtype table.
 *
 * A qrl_tensor does not own its data: `data` points into a mapping, an arena or
 * device memory owned by someone else (named in the API that hands it out). */
#ifndef QRL_CORE_TENSOR_H
#define QRL_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* X(NAME, safetensors name, element size in bytes (0 = sub-byte packed)) */
#define QRL_DTYPE_TABLE(X)          \
    X(F32,  "F32",  4)              \
    X(F16,  "F16",  2)              \
    X(BF16, "BF16", 2)              \
    X(F64,  "F64",  8)              \
    X(I64,  "I64",  8)              \
    X(I32,  "I32",  4)              \
    X(I16,  "I16",  2)              \
    X(I8,   "I8",   1)              \
    X(U8,   "U8",   1)              \
    X(BOOL, "BOOL", 1)              \
    X(F8_E4M3, "F8_E4M3", 1)        \
    X(F8_E5M2, "F8_E5M2", 1)

typedef enum qrl_dtype {
#define QRL_X_(name, st, size) QRL_DTYPE_##name,
    QRL_DTYPE_TABLE(QRL_X_)
#undef QRL_X_
    QRL_DTYPE_COUNT_
} qrl_dtype;

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

/* Bytes per element of `dt` (0 for unknown). */
size_t qrl_dtype_size(qrl_dtype dt);
/* Canonical safetensors name ("BF16"); "?" for unknown. */
const char *qrl_dtype_name(qrl_dtype dt);
/* Parse a safetensors dtype name; QRL_STATUS_UNSUPPORTED for unknown names. */
qrl_status qrl_dtype_parse(const char *name, qrl_dtype *out);

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
