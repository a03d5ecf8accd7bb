/* Scalar codecs: E2M1, E4M3, E8M0, BF16, INT8, INT4 packing (quant.h). */
#include "cpu/quant.h"

#include <math.h>
#include <string.h>

float qrl_quant_round_half_even(float x) {
    float a = fabsf(x);
    if (!(a < 8388608.0f)) return x; /* >= 2^23 is integral already; NaN, Inf pass */
    float f = floorf(a);
    float d = a - f; /* exact: a and f share the binade or f is 0 */
    if (d > 0.5f || (d == 0.5f && fmodf(f, 2.0f) != 0.0f)) f += 1.0f;
    return copysignf(f, x);
}

/* Magnitude code of a >= 0 (not NaN) on a minifloat grid with `mbits` mantissa bits,
 * minimum normal exponent `emin`, largest finite magnitude `maxval` (code `maxcode`).
 * Within a binade [2^e, 2^(e+1)) the grid step is 2^(e - mbits); subnormals share the
 * step of the lowest binade.  The integer q = a / step (exact: power-of-two scaling) is
 * rounded half to even, and because q = 2^mbits + mantissa its parity is the mantissa
 * LSB: ties go to the even code, and q = 2^(mbits+1) carries into the next binade. */
static unsigned minifloat_mag_code(float a, int emin, int mbits, unsigned maxcode,
                                   float maxval) {
    if (!(a < maxval)) return maxcode; /* saturate (also +Inf) */
    int e = a >= ldexpf(1.0f, emin) ? ilogbf(a) : emin;
    unsigned q = (unsigned)qrl_quant_round_half_even(ldexpf(a, mbits - e));
    unsigned code = ((unsigned)(e - emin + 1) << mbits) + q - (1u << mbits);
    return code > maxcode ? maxcode : code;
}

uint8_t qrl_e2m1_encode(float x) {
    if (isnan(x)) return 0x7;
    unsigned sign = signbit(x) ? 0x8u : 0u;
    return (uint8_t)(sign | minifloat_mag_code(fabsf(x), 0, 1, 0x7, QRL_E2M1_MAX));
}

float qrl_e2m1_decode(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 0x7];
    return (code & 0x8) ? -v : v;
}

uint8_t qrl_e4m3_encode(float x) {
    if (isnan(x)) return QRL_E4M3_NAN;
    unsigned sign = signbit(x) ? 0x80u : 0u;
    return (uint8_t)(sign | minifloat_mag_code(fabsf(x), -6, 3, 0x7E, QRL_E4M3_MAX));
}

float qrl_e4m3_decode(uint8_t code) {
    unsigned e = (code >> 3) & 0xF, m = code & 0x7;
    if (e == 0xF && m == 0x7) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), (int)e - 10);
    return (code & 0x80) ? -v : v;
}

float qrl_e8m0_decode(uint8_t code) {
    return code == QRL_E8M0_NAN ? NAN : ldexpf(1.0f, (int)code - 127);
}

uint8_t qrl_e8m0_from_exponent(int exponent) {
    if (exponent < -127) exponent = -127;
    if (exponent > 127) exponent = 127;
    return (uint8_t)(exponent + 127);
}

uint16_t qrl_bf16_encode(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float qrl_bf16_decode(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int8_t qrl_int8_encode(float x, float scale) {
    if (isnan(x) || scale == 0.0f) return 0;
    float q = qrl_quant_round_half_even(x / scale);
    if (q > 127.0f) q = 127.0f;
    if (q < -127.0f) q = -127.0f;
    return (int8_t)q;
}

void qrl_nibble_pack(const uint8_t *codes, int64_t n, uint8_t *packed) {
    for (int64_t i = 0; i < n; i += 2) {
        uint8_t lo = codes[i] & 0xF, hi = i + 1 < n ? codes[i + 1] & 0xF : 0;
        packed[i >> 1] = (uint8_t)(lo | (hi << 4));
    }
}

void qrl_nibble_unpack(const uint8_t *packed, int64_t n, uint8_t *codes) {
    for (int64_t i = 0; i < n; i++) codes[i] = qrl_nibble_get(packed, i);
}

void qrl_int4_pack(const int8_t *vals, int64_t n, uint8_t *packed) {
    for (int64_t i = 0; i < n; i += 2) {
        QRL_CHECK(vals[i] >= -8 && vals[i] <= 7);
        uint8_t lo = (uint8_t)vals[i] & 0xF, hi = 0;
        if (i + 1 < n) {
            QRL_CHECK(vals[i + 1] >= -8 && vals[i + 1] <= 7);
            hi = (uint8_t)vals[i + 1] & 0xF;
        }
        packed[i >> 1] = (uint8_t)(lo | (hi << 4));
    }
}

void qrl_int4_unpack(const uint8_t *packed, int64_t n, int8_t *vals) {
    for (int64_t i = 0; i < n; i++) {
        int v = qrl_nibble_get(packed, i);
        vals[i] = (int8_t)(v >= 8 ? v - 16 : v);
    }
}

float qrl_quant_absmax(const float *x, int64_t n, bool *nonfinite) {
    float m = 0.0f;
    bool bad = false;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!isfinite(a)) { bad = true; continue; }
        if (a > m) m = a;
    }
    if (nonfinite) *nonfinite = bad;
    return m;
}
