/* Element types of the kernels' base: the dtype table (common/core/tensor.h includes it and
 * adds the tensor descriptor and the table's functions). */
#ifndef QRL_BASE_DTYPE_H
#define QRL_BASE_DTYPE_H

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

#endif
