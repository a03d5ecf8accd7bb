#include "core/tensor.h"

#include <string.h>

void qrl_tensor_init(qrl_tensor *t, qrl_dtype dt, int ndim, const int64_t *shape, void *data) {
    QRL_CHECK(ndim >= 0 && ndim <= QRL_TENSOR_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->device = QRL_DEVICE_CPU;
    t->ndim = ndim;
    t->data = data;
    /* unsigned: with a zero dimension the other extents may multiply past INT64_MAX */
    uint64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = (int64_t)stride;
        stride *= (uint64_t)shape[i];
    }
}

int64_t qrl_tensor_numel(const qrl_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return (int64_t)n;
}

size_t qrl_tensor_nbytes(const qrl_tensor *t) {
    return (size_t)qrl_tensor_numel(t) * qrl_dtype_size(t->dtype);
}

int qrl_tensor_is_contiguous(const qrl_tensor *t) {
    uint64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        /* a dimension of extent 1 can carry any stride without changing the layout */
        if (t->shape[i] != 1 && t->strides[i] != (int64_t)stride) return 0;
        stride *= (uint64_t)t->shape[i];
    }
    return 1;
}

/* ---- BF16 / F16 ---------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float qrl_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t qrl_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    /* truncating a NaN could leave an all-zero mantissa (= infinity): force the quiet bit */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* round to nearest even; a carry into the exponent (and up to infinity) is correct */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float qrl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t qrl_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu); /* quiet NaN */
    if (x >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to infinity */
    uint32_t e = x >> 23;
    if (x < 0x38800000u) {
        /* below 2^-14: F16 subnormal (or zero), value = h * 2^-24 */
        if (e < 102) return sign; /* < 2^-25: rounds to zero */
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((e - 112u) << 10) | ((x >> 13) & 0x3ffu);
    uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carries into the exponent */
    return sign | (uint16_t)h;
}

qrl_status qrl_convert_to_f32(qrl_dtype src_dtype, const void *src, float *dst, size_t n) {
    /* src may be unaligned (safetensors does not align tensor data): load through memcpy */
    const uint8_t *s = src;
    switch (src_dtype) {
    case QRL_DTYPE_F32:
        if (n) memmove(dst, src, n * sizeof(float));
        return QRL_OK;
    case QRL_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = qrl_bf16_to_f32(h);
        }
        return QRL_OK;
    case QRL_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = qrl_f16_to_f32(h);
        }
        return QRL_OK;
    default:
        return QRL_STATUS_UNSUPPORTED;
    }
}
