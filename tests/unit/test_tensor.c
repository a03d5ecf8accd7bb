#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/tensor.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

Test(dtype, table_sizes_names_parse) {
    static const struct { const char *name; size_t size; } want[] = {
        {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}, {"I32", 4},
        {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    cr_assert_eq(QRL_DTYPE_COUNT_, (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        qrl_dtype dt;
        cr_assert_eq(qrl_dtype_parse(want[i].name, &dt), QRL_OK, "%s", want[i].name);
        cr_assert_eq(qrl_dtype_size(dt), want[i].size, "%s", want[i].name);
        cr_assert_str_eq(qrl_dtype_name(dt), want[i].name);
    }
    qrl_dtype dt = QRL_DTYPE_F32;
    cr_assert_eq(qrl_dtype_parse("bf16", &dt), QRL_STATUS_UNSUPPORTED); /* names are exact */
    cr_assert_eq(qrl_dtype_parse("F4", &dt), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(qrl_dtype_parse("", &dt), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(dt, QRL_DTYPE_F32, "failed parse must not touch *out");
    cr_assert_str_eq(qrl_dtype_name((qrl_dtype)99), "?");
    cr_assert_eq(qrl_dtype_size((qrl_dtype)99), 0);
    cr_assert_eq(qrl_dtype_size(QRL_DTYPE_BF16), 2);
}

Test(tensor, init_strides_numel_nbytes) {
    int64_t shape[3] = {2, 3, 4};
    char buf[48];
    qrl_tensor t;
    qrl_tensor_init(&t, QRL_DTYPE_BF16, 3, shape, buf);
    cr_assert_eq(t.ndim, 3);
    cr_assert_eq(t.strides[0], 12);
    cr_assert_eq(t.strides[1], 4);
    cr_assert_eq(t.strides[2], 1);
    cr_assert_eq(qrl_tensor_numel(&t), 24);
    cr_assert_eq(qrl_tensor_nbytes(&t), 48);
    cr_assert_eq(t.data, buf);
    cr_assert_eq(t.device, QRL_DEVICE_CPU);
    cr_assert(qrl_tensor_is_contiguous(&t));

    t.strides[0] = 13; /* padded rows */
    cr_assert_not(qrl_tensor_is_contiguous(&t));

    qrl_tensor s; /* scalar */
    qrl_tensor_init(&s, QRL_DTYPE_F64, 0, NULL, NULL);
    cr_assert_eq(qrl_tensor_numel(&s), 1);
    cr_assert_eq(qrl_tensor_nbytes(&s), 8);
    cr_assert(qrl_tensor_is_contiguous(&s));

    int64_t e[2] = {0, 5};
    qrl_tensor z;
    qrl_tensor_init(&z, QRL_DTYPE_F32, 2, e, NULL);
    cr_assert_eq(qrl_tensor_numel(&z), 0);
    cr_assert_eq(qrl_tensor_nbytes(&z), 0);

    int64_t one[2] = {1, 7};
    qrl_tensor o;
    qrl_tensor_init(&o, QRL_DTYPE_F32, 2, one, NULL);
    o.strides[0] = 1000; /* extent 1: any stride is still contiguous */
    cr_assert(qrl_tensor_is_contiguous(&o));
}

Test(bf16, known_values_and_ties) {
    cr_assert_eq(qrl_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(qrl_f32_to_bf16(-2.0f), 0xc000);
    cr_assert_eq(qrl_f32_to_bf16(0.0f), 0x0000);
    cr_assert_eq(qrl_f32_to_bf16(-0.0f), 0x8000);
    /* 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7: stays at 1 */
    cr_assert_eq(qrl_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even): goes up */
    cr_assert_eq(qrl_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* just above half rounds up */
    cr_assert_eq(qrl_f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
    cr_assert_eq(qrl_f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);
    cr_assert_eq(qrl_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(qrl_f32_to_bf16(-INFINITY), 0xff80);
    cr_assert_eq(qrl_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80, "FLT_MAX rounds to inf");
    /* a NaN whose payload lives only in the low bits must not become infinity */
    uint16_t n = qrl_f32_to_bf16(from_bits(0x7f800001));
    cr_assert((n & 0x7f80) == 0x7f80 && (n & 0x7f) != 0, "got 0x%04x", n);
    cr_assert(isnan(qrl_bf16_to_f32(n)));
    cr_assert(isnan(qrl_bf16_to_f32(qrl_f32_to_bf16(NAN))));
    cr_assert_eq(qrl_bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(qrl_bf16_to_f32(0x4049), 3.140625f);
    cr_assert_eq(qrl_bf16_to_f32(0x0001), 0x1p-133f); /* smallest subnormal */
}

Test(bf16, exhaustive_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qrl_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(qrl_f32_to_bf16(f), h, "0x%04x", h);
    }
}

/* Reference rounding by distance, in double: independent of the bit trick under test. */
static uint16_t bf16_ref(float f) {
    uint32_t u = bits(f);
    uint32_t lo = u & 0xffff0000u;
    double vf = fabs((double)f), vlo = fabs((double)from_bits(lo));
    /* the next bf16 magnitude up; past the largest finite one it is 2^128 (inf) */
    double vhi = (lo & 0x7fffffffu) == 0x7f7f0000u ? 0x1p128
                                                   : fabs((double)from_bits(lo + 0x10000u));
    double dlo = vf - vlo, dhi = vhi - vf;
    if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1u) == 0)) return (uint16_t)(lo >> 16);
    return (uint16_t)((lo + 0x10000u) >> 16);
}

Test(bf16, matches_distance_reference_on_random_floats) {
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rng32();
        if ((u & 0x7f800000u) == 0x7f800000u) continue; /* inf/NaN covered above */
        float f = from_bits(u);
        cr_assert_eq(qrl_f32_to_bf16(f), bf16_ref(f), "bits 0x%08x", u);
    }
    /* every exact tie in a band of values */
    for (uint32_t m = 0; m < 65536; m++) {
        uint32_t u = 0x40000000u | (m << 16) | 0x8000u;
        if (u >= 0x7f800000u) break;
        cr_assert_eq(qrl_f32_to_bf16(from_bits(u)), bf16_ref(from_bits(u)), "tie 0x%08x", u);
    }
}

Test(f16, known_values) {
    cr_assert_eq(qrl_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(qrl_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(qrl_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(qrl_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(qrl_f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(qrl_f32_to_f16(65520.0f), 0x7c00, "the tie above the max goes to inf");
    cr_assert_eq(qrl_f32_to_f16(1e9f), 0x7c00);
    cr_assert_eq(qrl_f32_to_f16(0x1p-14f), 0x0400);   /* smallest normal */
    cr_assert_eq(qrl_f32_to_f16(0x1p-24f), 0x0001);   /* smallest subnormal */
    cr_assert_eq(qrl_f32_to_f16(0x1p-25f), 0x0000);   /* tie, to even (zero) */
    cr_assert_eq(qrl_f32_to_f16(0x1.8p-25f), 0x0001); /* above the tie */
    cr_assert_eq(qrl_f32_to_f16(0x1.8p-24f), 0x0002); /* tie between 1 and 2: even */
    cr_assert_eq(qrl_f32_to_f16(0x1p-26f), 0x0000);
    cr_assert_eq(qrl_f32_to_f16(1.0f / 3.0f), 0x3555);
    cr_assert_eq(qrl_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie, to even */
    cr_assert_eq(qrl_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert_eq(qrl_f32_to_f16(0x1.ffcp-15f), 0x0400, "subnormal rounding up into the normals");
    cr_assert_eq(qrl_f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(qrl_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = qrl_f32_to_f16(from_bits(0x7f800001));
    cr_assert((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0, "NaN stays NaN: 0x%04x", n);
    cr_assert_eq(qrl_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(qrl_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(qrl_f16_to_f32(0x03ff), 0x3ffp-24f);
    cr_assert_eq(qrl_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(qrl_f16_to_f32(0xfc00), -INFINITY);
    cr_assert(isnan(qrl_f16_to_f32(0x7e00)));
    cr_assert(signbit(qrl_f16_to_f32(0x8000)) && qrl_f16_to_f32(0x8000) == 0.0f);
}

Test(f16, exhaustive_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qrl_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(qrl_f32_to_f16(f), h, "0x%04x", h);
    }
}

#ifdef __FLT16_MAX__
/* gcc's _Float16 conversion (libgcc / F16C) is an outside reference for RNE. */
Test(f16, matches_compiler_float16) {
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rng32();
        /* bias toward F16's range so subnormals, normals and overflow are all hit */
        if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 24) % 50u) << 23);
        float f = from_bits(u);
        if (isnan(f)) continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, 2);
        cr_assert_eq(qrl_f32_to_f16(f), want, "bits 0x%08x", u);
        cr_assert_eq(bits(qrl_f16_to_f32(want)), bits((float)h), "f16 0x%04x", want);
    }
}
#endif

Test(convert, to_f32_from_unaligned_sources) {
    unsigned char raw[1 + 3 * 4];
    uint16_t bf[3] = {0x3f80, 0xc040, 0x0000}; /* 1, -3, 0 */
    memcpy(raw + 1, bf, sizeof bf);
    float out[3];
    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_BF16, raw + 1, out, 3), QRL_OK);
    cr_assert_eq(out[0], 1.0f);
    cr_assert_eq(out[1], -3.0f);
    cr_assert_eq(out[2], 0.0f);

    uint16_t hf[3] = {0x3c00, 0xc200, 0x3555}; /* 1, -3, 0.333251953125 */
    memcpy(raw + 1, hf, sizeof hf);
    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_F16, raw + 1, out, 3), QRL_OK);
    cr_assert_eq(out[0], 1.0f);
    cr_assert_eq(out[1], -3.0f);
    cr_assert_eq(out[2], 0.333251953125f);

    float ff[3] = {1.5f, -0.25f, 1e30f};
    memcpy(raw + 1, ff, sizeof ff);
    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_F32, raw + 1, out, 3), QRL_OK);
    cr_assert_eq(memcmp(out, ff, sizeof ff), 0);

    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_I32, raw, out, 3), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_F8_E4M3, raw, out, 3), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(qrl_convert_to_f32(QRL_DTYPE_BF16, raw, out, 0), QRL_OK);
}
