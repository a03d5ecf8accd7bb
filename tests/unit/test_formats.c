/* Scalar codecs, per-row INT8/FP8, NVFP4, MXFP4 and the reference GEMMs (quant.h).
 * Expected values are written by hand from the format definitions (docs/formats.md) or
 * come from an independent brute-force nearest-codeword search, never from the code
 * under test. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "quant_testdata.h"

/* ---- E2M1 ---------------------------------------------------------------------------- */

static const float e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

Test(e2m1, all_16_codes_decode_and_round_trip) {
    for (int c = 0; c < 16; c++) {
        float v = qrl_e2m1_decode((uint8_t)c);
        cr_assert_eq(v, e2m1_table[c], "code %d -> %g", c, v);
        cr_assert_eq(!!signbit(v), c >= 8, "sign of code %d", c);
        cr_assert_eq(qrl_e2m1_encode(v), c, "encode(decode(%d))", c);
    }
}

Test(e2m1, ties_go_to_even_code_and_saturation) {
    /* midpoints between adjacent magnitudes -> the code with mantissa bit 0 */
    const struct { float x; uint8_t code; } v[] = {
        {0.25f, 0x0}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {3.5f, 0x6},
        {5.0f, 0x6}, {-0.25f, 0x8}, {-1.75f, 0xC}, {-5.0f, 0xE},
        /* just off the midpoints */
        {0.2500001f, 0x1}, {0.7499999f, 0x1}, {5.0000005f, 0x7}, {2.4999998f, 0x4},
        /* saturation, non-finite, signed zero */
        {6.0f, 0x7}, {7.0f, 0x7}, {1e30f, 0x7}, {INFINITY, 0x7}, {-INFINITY, 0xF},
        {-1e30f, 0xF}, {NAN, 0x7}, {-0.1f, 0x8}, {-0.0f, 0x8}, {0.0f, 0x0}, {1e-40f, 0x0},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        cr_assert_eq(qrl_e2m1_encode(v[i].x), v[i].code, "encode(%.9g) = 0x%x, want 0x%x",
                     v[i].x, qrl_e2m1_encode(v[i].x), v[i].code);
}

/* Brute force: the nearest code by |x - v| (ties: even code), saturating. */
static unsigned nearest_code(float x, const float *mags, unsigned n_mags) {
    double a = fabs((double)x), best = INFINITY;
    unsigned bc = 0;
    for (unsigned c = 0; c < n_mags; c++) {
        double d = fabs(a - mags[c]);
        if (d < best || (d == best && (c & 1) == 0)) { best = d; bc = c; }
    }
    return bc;
}

Test(e2m1, random_values_match_brute_force_nearest) {
    float mags[8];
    for (int c = 0; c < 8; c++) mags[c] = e2m1_table[c];
    td_rng r = {11};
    for (int i = 0; i < 200000; i++) {
        float x = (float)((td_uniform(&r) * 2.0 - 1.0) * 7.0);
        unsigned want = nearest_code(x, mags, 8) | (signbit(x) ? 8u : 0u);
        cr_assert_eq(qrl_e2m1_encode(x), want, "x=%.9g", x);
    }
}

/* ---- E4M3 ---------------------------------------------------------------------------- */

Test(e4m3, edge_values_hand_checked) {
    cr_assert_eq(qrl_e4m3_decode(0x7E), 448.0f);
    cr_assert_eq(qrl_e4m3_decode(0xFE), -448.0f);
    cr_assert_eq(qrl_e4m3_decode(0x01), 0x1p-9f);           /* min subnormal */
    cr_assert_eq(qrl_e4m3_decode(0x07), 7 * 0x1p-9f);       /* max subnormal */
    cr_assert_eq(qrl_e4m3_decode(0x08), 0x1p-6f);           /* min normal */
    cr_assert_eq(qrl_e4m3_decode(0x38), 1.0f);
    cr_assert_eq(qrl_e4m3_decode(0x39), 1.125f);
    cr_assert_eq(qrl_e4m3_decode(0x77), 240.0f);            /* 2^7 * 1.875 */
    cr_assert_eq(qrl_e4m3_decode(0x78), 256.0f);
    cr_assert(isnan(qrl_e4m3_decode(0x7F)));
    cr_assert(isnan(qrl_e4m3_decode(0xFF)));
    cr_assert(signbit(qrl_e4m3_decode(0x80)) && qrl_e4m3_decode(0x80) == 0.0f);
    /* encode: saturation, NaN, infinities */
    cr_assert_eq(qrl_e4m3_encode(1000.0f), 0x7E);
    cr_assert_eq(qrl_e4m3_encode(-1000.0f), 0xFE);
    cr_assert_eq(qrl_e4m3_encode(INFINITY), 0x7E);
    cr_assert_eq(qrl_e4m3_encode(-INFINITY), 0xFE);
    cr_assert_eq(qrl_e4m3_encode(NAN), 0x7F);
    cr_assert_eq(qrl_e4m3_encode(-NAN), 0x7F);
    cr_assert_eq(qrl_e4m3_encode(448.0f), 0x7E);
    cr_assert_eq(qrl_e4m3_encode(464.0f), 0x7E); /* tie between 448 and (absent) 480 */
    cr_assert_eq(qrl_e4m3_encode(0x1p-9f), 0x01);
    cr_assert_eq(qrl_e4m3_encode(0x1p-6f), 0x08);
    /* RNE ties: 0.5*(a+b) of adjacent codes goes to the even code */
    cr_assert_eq(qrl_e4m3_encode(0x1p-10f), 0x00);          /* 0 | 2^-9 */
    cr_assert_eq(qrl_e4m3_encode(3 * 0x1p-10f), 0x02);      /* 2^-9 | 2*2^-9 */
    cr_assert_eq(qrl_e4m3_encode(1.0625f), 0x38);           /* 1 | 1.125 */
    cr_assert_eq(qrl_e4m3_encode(1.1875f), 0x3A);           /* 1.125 | 1.25 */
    cr_assert_eq(qrl_e4m3_encode(15 * 0x1p-10f), 0x08);    /* 7*2^-9 | 2^-6 */
    cr_assert_eq(qrl_e4m3_encode(1.0625001f), 0x39);
    cr_assert_eq(qrl_e4m3_encode(-0x1p-11f), 0x80);         /* underflow keeps the sign */
    cr_assert_eq(qrl_e4m3_encode(1e-30f), 0x00);
}

Test(e4m3, all_codes_round_trip_and_midpoints_are_even) {
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue;
        cr_assert_eq(qrl_e4m3_encode(qrl_e4m3_decode((uint8_t)c)), c, "code 0x%02x", c);
    }
    for (int c = 0; c < 0x7E; c++) { /* adjacent positive codes c, c+1 */
        float a = qrl_e4m3_decode((uint8_t)c), b = qrl_e4m3_decode((uint8_t)(c + 1));
        float mid = 0.5f * (a + b); /* exact: few mantissa bits */
        int even = (c & 1) == 0 ? c : c + 1;
        cr_assert_eq(qrl_e4m3_encode(mid), even, "midpoint of 0x%02x", c);
        cr_assert_eq(qrl_e4m3_encode(nextafterf(mid, 0.0f)), c);
        cr_assert_eq(qrl_e4m3_encode(nextafterf(mid, 1e9f)), c + 1);
        cr_assert_eq(qrl_e4m3_encode(-mid), even | 0x80);
    }
}

Test(e4m3, random_values_match_brute_force_nearest) {
    float mags[127];
    for (int c = 0; c < 127; c++) mags[c] = c == 0x7F ? 0 : qrl_e4m3_decode((uint8_t)c);
    td_rng r = {12};
    for (int i = 0; i < 20000; i++) {
        /* log-uniform magnitudes over the whole range, beyond it and below it */
        float x = (float)(exp2(td_uniform(&r) * 24.0 - 14.0) * (td_uniform(&r) < 0.5 ? -1 : 1));
        unsigned want = nearest_code(x, mags, 127) | (signbit(x) ? 0x80u : 0u);
        cr_assert_eq(qrl_e4m3_encode(x), want, "x=%.9g", x);
    }
}

/* ---- E8M0, BF16, INT8, INT4 ---------------------------------------------------------- */

Test(e8m0, range_and_nan) {
    cr_assert_eq(qrl_e8m0_decode(0), 0x1p-127f);
    cr_assert_eq(qrl_e8m0_decode(127), 1.0f);
    cr_assert_eq(qrl_e8m0_decode(128), 2.0f);
    cr_assert_eq(qrl_e8m0_decode(254), 0x1p127f);
    cr_assert(isnan(qrl_e8m0_decode(0xFF)));
    cr_assert_eq(qrl_e8m0_from_exponent(0), 127);
    cr_assert_eq(qrl_e8m0_from_exponent(-127), 0);
    cr_assert_eq(qrl_e8m0_from_exponent(-500), 0);
    cr_assert_eq(qrl_e8m0_from_exponent(127), 254);
    cr_assert_eq(qrl_e8m0_from_exponent(500), 254);
}

Test(bf16, rne_nan_and_round_trip) {
    cr_assert_eq(qrl_bf16_encode(1.0f), 0x3F80);
    cr_assert_eq(qrl_bf16_encode(1.0f + 0x1p-8f), 0x3F80);     /* tie -> even */
    cr_assert_eq(qrl_bf16_encode(1.0f + 3 * 0x1p-8f), 0x3F82); /* tie -> even (up) */
    cr_assert_eq(qrl_bf16_encode(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    cr_assert_eq(qrl_bf16_encode(INFINITY), 0x7F80);
    cr_assert_eq(qrl_bf16_encode(FLT_MAX), 0x7F80); /* rounds up to Inf, as IEEE RNE */
    cr_assert(isnan(qrl_bf16_decode(qrl_bf16_encode(NAN))));
    cr_assert(signbit(qrl_bf16_decode(qrl_bf16_encode(-NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = qrl_bf16_decode((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(qrl_bf16_encode(f), h, "0x%04x", h);
    }
}

Test(int8, encode_rounding_saturation_nonfinite) {
    cr_assert_eq(qrl_int8_encode(2.5f, 1.0f), 2);
    cr_assert_eq(qrl_int8_encode(3.5f, 1.0f), 4);
    cr_assert_eq(qrl_int8_encode(-2.5f, 1.0f), -2);
    cr_assert_eq(qrl_int8_encode(-2.51f, 1.0f), -3);
    cr_assert_eq(qrl_int8_encode(200.0f, 1.0f), 127);
    cr_assert_eq(qrl_int8_encode(-200.0f, 1.0f), -127); /* never -128 */
    cr_assert_eq(qrl_int8_encode(NAN, 1.0f), 0);
    cr_assert_eq(qrl_int8_encode(INFINITY, 1.0f), 127);
    cr_assert_eq(qrl_int8_encode(-INFINITY, 1.0f), -127);
    cr_assert_eq(qrl_int8_encode(5.0f, 0.0f), 0);
    cr_assert_eq(qrl_int8_encode(1.0f, 0.5f), 2);
}

Test(int4, packing_order_low_nibble_is_even_element) {
    const int8_t v[5] = {1, -2, 7, -8, 3};
    uint8_t p[3] = {0xAA, 0xAA, 0xAA};
    qrl_int4_pack(v, 5, p);
    cr_assert_eq(p[0], 0xE1); /* -2 = 0xE high, 1 low */
    cr_assert_eq(p[1], 0x87);
    cr_assert_eq(p[2], 0x03); /* odd count: high nibble 0 */
    int8_t back[5];
    qrl_int4_unpack(p, 5, back);
    cr_assert_arr_eq(back, v, 5);
    const uint8_t c[3] = {0x1, 0x2, 0xF};
    uint8_t q[2];
    qrl_nibble_pack(c, 3, q);
    cr_assert_eq(q[0], 0x21);
    cr_assert_eq(q[1], 0x0F);
    cr_assert_eq(qrl_nibble_get(q, 1), 0x2);
}

/* ---- per-row INT8 / FP8 -------------------------------------------------------------- */

#define R 64
#define C 1024

Test(rows, int8_scales_round_trip_and_error_bound) {
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C), s[R];
    int8_t *q = malloc(R * C);
    td_rng r = {21};
    td_fill_gauss(&r, x, R * C, 1.0);
    qrl_int8_quantize_rows(x, R, C, q, s);
    qrl_int8_dequantize_rows(q, s, R, C, y);
    for (int i = 0; i < R; i++) {
        cr_assert_eq(s[i], qrl_quant_absmax(x + i * C, C, NULL) / 127.0f);
        for (int j = 0; j < C; j++)
            cr_assert_leq(fabsf(x[i * C + j] - y[i * C + j]), 0.5f * s[i] * 1.0001f);
    }
    double e = td_rel_err(x, y, R * C); /* measured 0.0077 */
    cr_assert_lt(e, 0.012, "int8 rel err %g", e);
    cr_assert_gt(e, 0.004, "int8 rel err %g suspiciously small", e);
    free(x); free(y); free(q);
}

Test(rows, fp8_error_bound_and_zero_row) {
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C), s[R];
    uint8_t *q = malloc(R * C);
    td_rng r = {22};
    td_fill_gauss(&r, x, R * C, 3.0);
    memset(x, 0, sizeof(float) * C); /* row 0 all zero: scale 0, no NaN */
    qrl_fp8_quantize_rows(x, R, C, q, s);
    qrl_fp8_dequantize_rows(q, s, R, C, y);
    cr_assert_eq(s[0], 0.0f);
    for (int j = 0; j < C; j++) cr_assert_eq(y[j], 0.0f);
    for (int i = 1; i < R; i++) cr_assert_eq(s[i], qrl_quant_absmax(x + i * C, C, NULL) / 448.0f);
    double e = td_rel_err(x + C, y + C, (R - 1) * C); /* measured 0.0264 */
    cr_assert_lt(e, 0.04, "fp8 rel err %g", e);
    cr_assert_gt(e, 0.015);
    free(x); free(y); free(q);
}

Test(rows, nonfinite_and_denormal_inputs) {
    float x[8] = {1.0f, NAN, INFINITY, -INFINITY, -2.0f, 0.5f, 0.0f, 1e-40f}, s, y[8];
    int8_t q[8];
    uint8_t f[8];
    qrl_int8_quantize_rows(x, 1, 8, q, &s);
    cr_assert_eq(s, 2.0f / 127.0f); /* amax over finite elements */
    cr_assert_eq(q[1], 0);
    cr_assert_eq(q[2], 127);
    cr_assert_eq(q[3], -127);
    cr_assert_eq(q[4], -127);
    qrl_fp8_quantize_rows(x, 1, 8, f, &s);
    cr_assert_eq(f[1], 0x7F);
    cr_assert_eq(f[2], 0x7E);
    cr_assert_eq(f[3], 0xFE);
    cr_assert_eq(f[4], 0xFE);
    /* a row of denormals: finite results, no NaN */
    float d[4] = {1e-40f, -3e-41f, 1e-45f, 0.0f};
    qrl_int8_quantize_rows(d, 1, 4, q, &s);
    qrl_int8_dequantize_rows(q, &s, 1, 4, y);
    for (int i = 0; i < 4; i++) cr_assert(fabsf(y[i] - d[i]) <= 1e-40f, "int8 %d", i);
    qrl_fp8_quantize_rows(d, 1, 4, f, &s);
    qrl_fp8_dequantize_rows(f, &s, 1, 4, y);
    for (int i = 0; i < 4; i++) cr_assert(isfinite(y[i]) && fabsf(y[i] - d[i]) <= 1e-40f);
}

/* ---- NVFP4 --------------------------------------------------------------------------- */

static qrl_nvfp4 nvfp4_alloc(int64_t rows, int64_t cols, bool per_row) {
    qrl_nvfp4 q = {rows, cols, calloc((size_t)(rows * qrl_nibble_row_bytes(cols)), 1),
                   calloc((size_t)(rows * qrl_nvfp4_blocks(cols)), 1),
                   calloc((size_t)rows, sizeof(float)), per_row};
    return q;
}

static void nvfp4_free(qrl_nvfp4 *q) { free(q->codes); free(q->scales); free(q->global_enc); }

Test(nvfp4, hand_checked_scales_and_codes) {
    /* Tensor amax 2688 = 448*6 -> S_enc = 1.  Block 0 amax 6 -> scale E4M3(6 * (1/6)) =
     * 1.0 (0x38) -> multiplier 1: the codes are the E2M1 codes of the values themselves.
     * Block 1 holds the amax: scale 448 (0x7E).  Block 2 amax 1536 -> scale 256 (0x78)
     * -> multiplier 1/256 (exact): 1536 -> 6, -256 -> -1, 384 -> 1.5, 640 -> 2.5 (tie ->
     * 2, code 4), 704 -> 2.75 -> 3. */
    float x[48] = {0};
    for (int j = 0; j < 16; j++) x[j] = e2m1_table[j];
    x[16] = 2688.0f;
    x[32] = 1536.0f; x[33] = -256.0f; x[34] = 384.0f; x[35] = 640.0f; x[36] = 704.0f;
    qrl_nvfp4 q = nvfp4_alloc(1, 48, false);
    cr_assert_eq(qrl_nvfp4_quantize(x, &q, NULL), QRL_OK);
    cr_assert_eq(q.global_enc[0], 1.0f);
    cr_assert_eq(q.scales[0], 0x38);
    cr_assert_eq(q.scales[1], 0x7E);
    cr_assert_eq(q.scales[2], 0x78);
    for (int j = 0; j < 16; j++) cr_assert_eq(qrl_nibble_get(q.codes, j), j, "elem %d", j);
    cr_assert_eq(qrl_nibble_get(q.codes, 16), 0x7);
    const uint8_t want[5] = {0x7, 0xA, 0x3, 0x4, 0x5};
    for (int j = 0; j < 5; j++) cr_assert_eq(qrl_nibble_get(q.codes, 32 + j), want[j], "elem %d", 32 + j);
    for (int j = 37; j < 48; j++) cr_assert_eq(qrl_nibble_get(q.codes, j), 0);
    float y[48];
    qrl_nvfp4_dequantize(&q, y);
    for (int j = 0; j < 35; j++) cr_assert_eq(y[j], x[j], "elem %d", j);
    cr_assert_eq(y[35], 512.0f);
    cr_assert_eq(y[36], 768.0f);
    /* S_enc of an ordinary amax: 2688 / amax; block scale E4M3-rounded */
    cr_assert_eq(qrl_nvfp4_global_enc(5376.0f), 0.5f);
    cr_assert_eq(qrl_nvfp4_global_enc(0.0f), 1.0f);
    cr_assert_eq(qrl_nvfp4_global_enc(1e-42f), FLT_MAX);
    cr_assert_eq(qrl_nvfp4_block_scale(6.0f * 1.1f, 1.0f), 0x39); /* 1.1 -> 1.125 */
    cr_assert_eq(qrl_nvfp4_block_rcp(0x00, 1.0f), 0.0f);
    cr_assert_eq(qrl_nvfp4_block_rcp(0x7F, 1.0f), 0.0f);
    nvfp4_free(&q);
}

/* The documented sequence (docs/formats.md, TransformerEngine core_nvfp4.cuh) restated
 * operation by operation: the quantizer must match it bit for bit, since the CUDA port
 * and the TRACE learner reproduce exactly this sequence. */
Test(nvfp4, follows_the_documented_recipe_bit_for_bit) {
    const float inv6 = 1.0f / 6.0f;
    const float globals[] = {1.0f, 448.0f, 0.37f, 2688.0f / 3.3f, 1e-20f, 7.7e25f, FLT_MAX};
    for (size_t gi = 0; gi < sizeof globals / sizeof globals[0]; gi++) {
        float g = globals[gi];
        for (int s = 1; s < 0x7F; s++) {
            float want = fminf(1.0f / (qrl_e4m3_decode((uint8_t)s) * (1.0f / g)), FLT_MAX);
            float got = qrl_nvfp4_block_rcp((uint8_t)s, g);
            cr_assert_eq(memcmp(&got, &want, 4), 0, "rcp(0x%02x, %g) = %a, want %a", s, g, got, want);
            float dq = qrl_e4m3_decode((uint8_t)s) * (1.0f / g);
            float dg = qrl_nvfp4_block_dequant_scale((uint8_t)s, g);
            cr_assert_eq(memcmp(&dq, &dg, 4), 0);
        }
    }
    td_rng r = {33};
    enum { ROWS = 8, COLS = 512 };
    float x[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) x[i] = (float)(td_gauss(&r) * exp(3.0 * td_gauss(&r)));
    float gq;
    uint8_t codes[ROWS * COLS / 2], scales[ROWS * COLS / 16];
    qrl_nvfp4 q = {ROWS, COLS, codes, scales, &gq, false};
    qrl_nvfp4_quantize(x, &q, NULL);
    float amax = 0;
    for (int i = 0; i < ROWS * COLS; i++) amax = fmaxf(amax, fabsf(x[i]));
    float S_enc = fminf(2688.0f / amax, FLT_MAX);
    cr_assert_eq(gq, S_enc);
    for (int b = 0; b < ROWS * COLS / 16; b++) {
        float bamax = 0;
        for (int j = 0; j < 16; j++) bamax = fmaxf(bamax, fabsf(x[b * 16 + j]));
        uint8_t s = qrl_e4m3_encode(bamax * (S_enc * inv6));
        cr_assert_eq(scales[b], s, "block %d", b);
        float rcp = fminf(1.0f / (qrl_e4m3_decode(s) * (1.0f / S_enc)), FLT_MAX);
        for (int j = 0; j < 16; j++) {
            uint8_t want = s == 0 ? 0 : qrl_e2m1_encode(x[b * 16 + j] * rcp);
            cr_assert_eq(qrl_nibble_get(codes, b * 16 + j), want, "elem %d", b * 16 + j);
        }
    }
}

Test(nvfp4, gaussian_error_bound_per_tensor_and_per_row) {
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    td_rng r = {31};
    td_fill_gauss(&r, x, R * C, 0.02);
    for (int per_row = 0; per_row < 2; per_row++) {
        qrl_nvfp4 q = nvfp4_alloc(R, C, per_row);
        cr_assert_eq(qrl_nvfp4_quantize(x, &q, NULL), QRL_OK);
        qrl_nvfp4_dequantize(&q, y);
        double e = td_rel_err(x, y, R * C); /* measured 0.095 */
        cr_assert_lt(e, 0.14, "nvfp4 per_row=%d rel err %g", per_row, e);
        cr_assert_gt(e, 0.05);
        nvfp4_free(&q);
    }
    /* fake quantization == quantize + dequantize, bit for bit (per-row global) */
    float *z = malloc(sizeof(float) * C);
    qrl_nvfp4 q = nvfp4_alloc(R, C, true);
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    for (int i = 0; i < R; i++) {
        qrl_nvfp4_fake_quantize_row(x + i * C, C, z);
        cr_assert_arr_eq(z, y + i * C, sizeof(float) * C, "row %d", i);
    }
    nvfp4_free(&q);
    free(x); free(y); free(z);
}

Test(nvfp4, adversarial_zero_outlier_nonfinite_denormal_ragged) {
    float x[48], y[48];
    qrl_nvfp4 q = nvfp4_alloc(1, 48, false);
    /* all zero: S_enc 1, scales 0, codes 0, output 0 */
    memset(x, 0, sizeof x);
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    cr_assert_eq(q.global_enc[0], 1.0f);
    for (int j = 0; j < 48; j++) cr_assert_eq(y[j], 0.0f);
    /* one huge outlier: its block keeps it to E2M1 precision, other blocks fall to the
     * E4M3 scale floor relative to the tensor amax but stay finite */
    td_rng r = {41};
    td_fill_gauss(&r, x, 48, 1.0);
    x[20] = 1e30f;
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    cr_assert_lt(fabs((double)y[20] - 1e30) / 1e30, 1e-6, "outlier %g", y[20]);
    for (int j = 0; j < 48; j++) cr_assert(isfinite(y[j]));
    /* NaN in block 1: that block decodes to NaN, the others are untouched */
    td_fill_gauss(&r, x, 48, 1.0);
    x[17] = NAN;
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    cr_assert_eq(q.scales[1], 0x7F);
    for (int j = 0; j < 48; j++) cr_assert_eq(!!isnan(y[j]), j >= 16 && j < 32, "elem %d", j);
    x[17] = INFINITY;
    qrl_nvfp4_quantize(x, &q, NULL);
    cr_assert_eq(q.scales[1], 0x7F);
    /* denormal tensor: finite, error below the tensor amax */
    for (int j = 0; j < 48; j++) x[j] = (float)((j % 7) - 3) * 1e-41f;
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    for (int j = 0; j < 48; j++) cr_assert(isfinite(y[j]) && fabsf(y[j] - x[j]) <= 3.01e-41f);
    nvfp4_free(&q);
    /* ragged last block (cols 20) equals the zero-padded 32-column quantization */
    float a[32] = {0}, b[32];
    td_fill_gauss(&r, a, 20, 1.0);
    qrl_nvfp4 q20 = nvfp4_alloc(1, 20, false), q32 = nvfp4_alloc(1, 32, false);
    qrl_nvfp4_quantize(a, &q20, NULL);
    qrl_nvfp4_quantize(a, &q32, NULL);
    qrl_nvfp4_dequantize(&q20, b);
    qrl_nvfp4_dequantize(&q32, y);
    cr_assert_arr_eq(b, y, sizeof(float) * 20);
    cr_assert_arr_eq(q20.scales, q32.scales, 2);
    nvfp4_free(&q20); nvfp4_free(&q32);
    /* bad arguments */
    qrl_error err;
    qrl_nvfp4 bad = {-1, 4, NULL, NULL, NULL, false};
    cr_assert_eq(qrl_nvfp4_quantize(x, &bad, &err), QRL_STATUS_INVALID_ARGUMENT);
}

/* ---- MXFP4 --------------------------------------------------------------------------- */

Test(mxfp4, shared_exponent_rule_hand_checked) {
    float x[128] = {0}, y[128];
    uint8_t codes[64], scales[4];
    for (int j = 0; j < 16; j++) x[j] = e2m1_table[j]; /* block 0: amax 6 -> e = 2-2 = 0 */
    x[32] = 7.0f; x[33] = 3.0f;                        /* block 1: amax 7 -> e 0, 7 -> 6 */
    x[64] = 8.0f; x[65] = -1.0f; x[66] = 0.5f;         /* block 2: amax 8 -> e = 1 */
    /* block 3 all zero -> e = -127 */
    qrl_mxfp4_quantize(x, 1, 128, codes, scales);
    cr_assert_eq(scales[0], 127);
    cr_assert_eq(scales[1], 127);
    cr_assert_eq(scales[2], 128);
    cr_assert_eq(scales[3], 0);
    for (int j = 0; j < 16; j++) cr_assert_eq(qrl_nibble_get(codes, j), j);
    cr_assert_eq(qrl_nibble_get(codes, 32), 0x7); /* saturated */
    cr_assert_eq(qrl_nibble_get(codes, 64), 0x6); /* 8/2 = 4 */
    cr_assert_eq(qrl_nibble_get(codes, 65), 0x9); /* -0.5 */
    cr_assert_eq(qrl_nibble_get(codes, 66), 0x0); /* 0.5/2 = 0.25: tie -> 0 */
    qrl_mxfp4_dequantize(codes, scales, 1, 128, y);
    for (int j = 0; j < 16; j++) cr_assert_eq(y[j], x[j]);
    cr_assert_eq(y[32], 6.0f);
    cr_assert_eq(y[64], 8.0f);
    cr_assert_eq(y[66], 0.0f);
    for (int j = 96; j < 128; j++) cr_assert_eq(y[j], 0.0f);
}

Test(mxfp4, error_bound_nonfinite_denormal) {
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    uint8_t *codes = malloc(R * C / 2), *scales = malloc(R * C / 32);
    td_rng r = {51};
    td_fill_gauss(&r, x, R * C, 1.0);
    qrl_mxfp4_quantize(x, R, C, codes, scales);
    qrl_mxfp4_dequantize(codes, scales, R, C, y);
    double e = td_rel_err(x, y, R * C); /* measured 0.115 */
    cr_assert_lt(e, 0.17, "mxfp4 rel err %g", e);
    cr_assert_gt(e, 0.06);
    x[40] = NAN;
    x[100] = -INFINITY;
    x[200] = 1e-44f; /* a denormal among normals */
    for (int j = 224; j < 256; j++) x[j] = 1e-42f * (float)(j - 240); /* denormal block */
    qrl_mxfp4_quantize(x, 1, 256, codes, scales);
    qrl_mxfp4_dequantize(codes, scales, 1, 256, y);
    cr_assert_eq(scales[1], 0xFF);
    cr_assert_eq(scales[3], 0xFF);
    cr_assert_eq(scales[7], 0); /* amax 1.6e-41 -> floor(log2) - 2 < -127 -> clamp */
    for (int j = 0; j < 256; j++) {
        bool nan_block = (j >= 32 && j < 64) || (j >= 96 && j < 128);
        cr_assert_eq(!!isnan(y[j]), nan_block, "elem %d", j);
        if (j >= 224) cr_assert(fabsf(y[j] - x[j]) <= 1.7e-41f, "elem %d", j);
    }
    free(x); free(y); free(codes); free(scales);
}

/* ---- GEMMs --------------------------------------------------------------------------- */

Test(gemm, int8_exact_accumulation_and_quantized_bounds) {
    enum { T = 16, K = 256, N = 48 };
    float x[T * K], w[N * K], ref[T * N], y[T * N], sx[T], sw[N], wf[N * K], xf[T * K];
    int8_t xq[T * K], wq[N * K];
    td_rng r = {61};
    td_fill_gauss(&r, x, T * K, 1.0);
    td_fill_gauss(&r, w, N * K, 0.05);
    qrl_gemm_f32(x, w, T, N, K, ref);
    qrl_int8_quantize_rows(w, N, K, wq, sw);
    cr_assert_eq(qrl_linear_w8a8_int8(x, T, K, wq, sw, N, xq, sx, y, NULL), QRL_OK);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            int64_t acc = 0;
            for (int k = 0; k < K; k++) acc += (int64_t)xq[t * K + k] * wq[n * K + k];
            cr_assert_eq(y[t * N + n], (float)acc * sx[t] * sw[n]);
        }
    double e = td_rel_err(ref, y, T * N); /* measured 0.0096 */
    cr_assert_lt(e, 0.0145, "w8a8-int8 gemm rel err %g", e);
    uint8_t xq8[T * K], wq8[N * K];
    qrl_fp8_quantize_rows(w, N, K, wq8, sw);
    qrl_linear_w8a8_fp8(x, T, K, wq8, sw, N, xq8, sx, y);
    e = td_rel_err(ref, y, T * N); /* measured 0.037 */
    cr_assert_lt(e, 0.056, "w8a8-fp8 gemm rel err %g", e);
    float g;
    uint8_t wc[N * K / 2], ws[N * K / 16];
    qrl_nvfp4 q = {N, K, wc, ws, &g, false};
    qrl_nvfp4_quantize(w, &q, NULL);
    cr_assert_eq(qrl_linear_w4a16_nvfp4(x, T, &q, wf, y, NULL), QRL_OK);
    e = td_rel_err(ref, y, T * N); /* measured 0.098 */
    cr_assert_lt(e, 0.145, "w4a16-nvfp4 gemm rel err %g", e);
    cr_assert_eq(qrl_linear_w4a4_nvfp4(x, T, &q, wf, xf, y, NULL), QRL_OK);
    e = td_rel_err(ref, y, T * N); /* measured 0.135 */
    cr_assert_lt(e, 0.2, "w4a4-nvfp4 gemm rel err %g", e);
    uint8_t mc[N * K / 2], ms[N * K / 32];
    qrl_mxfp4_quantize(w, N, K, mc, ms);
    qrl_linear_w4a16_mxfp4(x, T, mc, ms, N, K, wf, y);
    e = td_rel_err(ref, y, T * N); /* measured 0.122 */
    cr_assert_lt(e, 0.18, "w4a16-mxfp4 gemm rel err %g", e);
}

Test(gemm, int8_refuses_k_that_could_overflow) {
    qrl_error err;
    int8_t a = 0;
    float s = 1, y;
    cr_assert_eq(qrl_gemm_int8(&a, &s, &a, &s, 0, 0, QRL_INT8_GEMM_MAX_K + 1, &y, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "overflow") != NULL, "%s", err.msg);
    cr_assert_eq(qrl_gemm_int8(&a, &s, &a, &s, -1, 1, 1, &y, &err), QRL_STATUS_INVALID_ARGUMENT);
}
