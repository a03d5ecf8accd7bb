/* Element types of the kernels' base: the dtype table and its functions (common/core/tensor.h
 * includes it and adds the tensor descriptor). */
#ifndef QRL_BASE_DTYPE_H
#define QRL_BASE_DTYPE_H

#include <stddef.h>

#include "base/status.h"

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

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes per element of `dt` (0 for unknown). */
size_t qrl_dtype_size(qrl_dtype dt);
/* Canonical safetensors name ("BF16"); "?" for unknown. */
const char *qrl_dtype_name(qrl_dtype dt);
/* Parse a safetensors dtype name; QRL_STATUS_UNSUPPORTED for unknown names. */
qrl_status qrl_dtype_parse(const char *name, qrl_dtype *out);

#ifdef __cplusplus
}
#endif

#endif
