/* TRACE records: capture, binary layout, decoder checks, guided rounding (trace.h). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "cpu/trace.h"
#include "quant_testdata.h"

static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* ---- guided rounding ----------------------------------------------------------------- */

Test(trace_guided, picks_the_neighbour_with_the_recorded_bit) {
    for (unsigned k = 0; k < 7; k++) {
        const float fr[5] = {0.01f, 0.25f, 0.5f, 0.75f, 0.99f};
        for (int i = 0; i < 5; i++) {
            float x = mag[k] + fr[i] * (mag[k + 1] - mag[k]);
            cr_assert_eq(qrl_trace_guided_round(x, k & 1), k, "x=%g bit=%u", x, k & 1);
            cr_assert_eq(qrl_trace_guided_round(x, (k + 1) & 1), k + 1, "x=%g", x);
            cr_assert_eq(qrl_trace_guided_round(-x, k & 1), 0x8 | k, "x=%g", -x);
            cr_assert_eq(qrl_trace_guided_round(-x, (k + 1) & 1), 0x8 | (k + 1), "x=%g", -x);
        }
    }
    /* exactly on a codeword: that code, whatever the bit */
    for (unsigned k = 0; k < 8; k++)
        for (unsigned b = 0; b < 2; b++) {
            cr_assert_eq(qrl_trace_guided_round(mag[k], b), k);
            cr_assert_eq(qrl_trace_guided_round(-mag[k], b), 0x8 | k);
        }
    /* outside the grid, NaN: round to nearest (saturate) */
    cr_assert_eq(qrl_trace_guided_round(6.5f, 0), 0x7);
    cr_assert_eq(qrl_trace_guided_round(-100.0f, 0), 0xF);
    cr_assert_eq(qrl_trace_guided_round(INFINITY, 0), 0x7);
    cr_assert_eq(qrl_trace_guided_round(NAN, 0), qrl_e2m1_encode(NAN));
    /* TRACE's example: rollout 2.51 -> 3 (code 5, LSB 1); training 2.49 would round to 2 */
    cr_assert_eq(qrl_e2m1_encode(2.49f), 0x4);
    cr_assert_eq(qrl_trace_guided_round(2.49f, qrl_e2m1_encode(2.51f) & 1), 0x5);
}

/* ---- capture -> record -> decode -> guided: equal inputs reproduce codes ---------------- */

enum { NT = 5, NS = 3 };
static const uint32_t site_len[NS] = {64, 20, 37};

typedef struct {
    float x[NT][NS][64];
    uint8_t codes[NT][NS][32], scales[NT][NS][4], bits[NT][NS][8];
    float g[NT][NS];
    qrl_trace_entry e[NT * NS];
    uint8_t *buf;
    size_t len;
} rollout;

static void rollout_run(rollout *r, uint64_t seed) {
    td_rng g = {seed};
    for (int t = 0; t < NT; t++)
        for (int s = 0; s < NS; s++) {
            td_fill_gauss(&g, r->x[t][s], site_len[s], 1.0 + s);
            qrl_trace_capture(r->x[t][s], site_len[s], r->codes[t][s], r->scales[t][s],
                              r->bits[t][s], &r->g[t][s]);
            r->e[t * NS + s] = (qrl_trace_entry){site_len[s], r->g[t][s], r->scales[t][s], r->bits[t][s]};
        }
    cr_assert_eq(qrl_trace_record_size(NT, NS, site_len, &r->len, NULL), QRL_OK);
    r->buf = malloc(r->len);
    size_t written = 0;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, r->e, r->buf, r->len, &written, NULL), QRL_OK);
    cr_assert_eq(written, r->len);
}

static rollout RO;

Test(trace_record, round_trip_and_equal_inputs_reproduce_rollout_codes) {
    rollout_run(&RO, 101);
    /* layout: 16 + 4*3 + 5 * (4*3 + (4+2+3) + (8+3+5)) + 4 */
    cr_assert_eq(RO.len, 16u + 12 + 5 * (12 + 9 + 16) + 4);
    qrl_trace_record_t *rec;
    qrl_error err;
    cr_assert_eq(qrl_trace_record_decode(RO.buf, RO.len, &rec, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_trace_record_n_tokens(rec), NT);
    cr_assert_eq(qrl_trace_record_n_sites(rec), NS);
    for (int s = 0; s < NS; s++) cr_assert_eq(qrl_trace_record_site_len(rec, s), site_len[s]);
    cr_assert_eq(qrl_trace_record_site_len(rec, NS), 0);
    for (int t = 0; t < NT; t++)
        for (int s = 0; s < NS; s++) {
            qrl_trace_entry e;
            cr_assert_eq(qrl_trace_record_entry(rec, t, s, &e, NULL), QRL_OK);
            uint32_t n = site_len[s];
            cr_assert_eq(e.len, n);
            cr_assert_eq(e.global_enc, RO.g[t][s]);
            cr_assert_arr_eq(e.scales, RO.scales[t][s], (n + 15) / 16);
            cr_assert_arr_eq(e.bits, RO.bits[t][s], (n + 7) / 8);
            for (uint32_t j = 0; j < n; j++)
                cr_assert_eq((e.bits[j / 8] >> (j % 8)) & 1, qrl_nibble_get(RO.codes[t][s], j) & 1);
            uint8_t codes[32];
            float y[64], yr[64];
            uint64_t n_guided = 99;
            qrl_trace_guided_quantize(RO.x[t][s], &e, codes, y, &n_guided);
            cr_assert_arr_eq(codes, RO.codes[t][s], (n + 1) / 2, "token %d site %d", t, s);
            cr_assert_eq(n_guided, 0);
            qrl_nvfp4_dequantize_row(RO.codes[t][s], RO.scales[t][s], RO.g[t][s], n, yr);
            cr_assert_arr_eq(y, yr, sizeof(float) * n);
        }
    qrl_trace_entry e;
    cr_assert_eq(qrl_trace_record_entry(rec, NT, 0, &e, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_trace_record_entry(rec, 0, NS, &e, &err), QRL_STATUS_OUT_OF_RANGE);
    qrl_trace_record_free(rec);
    free(RO.buf);
}

/* Training values inside the open interval around each rollout codeword: the rollout
 * code is always one of the two neighbours, so guidance must reproduce it exactly,
 * while plain round-to-nearest disagrees for many elements. */
Test(trace_record, perturbed_inputs_follow_the_recorded_neighbour) {
    rollout_run(&RO, 102);
    td_rng g = {103};
    uint64_t total_guided = 0, n_elems = 0;
    for (int t = 0; t < NT; t++)
        for (int s = 0; s < NS; s++) {
            const qrl_trace_entry *e = &RO.e[t * NS + s];
            float xt[64];
            for (uint32_t j = 0; j < e->len; j++) {
                float r = qrl_nvfp4_block_rcp(e->scales[j / 16], e->global_enc);
                uint8_t c = qrl_nibble_get(RO.codes[t][s], j);
                unsigned k = c & 7;
                float lo = k ? mag[k - 1] : 0.0f, hi = k < 7 ? mag[k + 1] : 8.0f;
                float u = (float)(0.05 + 0.9 * td_uniform(&g));
                float n = k == 0 ? u * 0.5f : lo + u * (hi - lo);
                xt[j] = (c & 8 ? -n : n) / r;
            }
            uint8_t codes[32];
            uint64_t n_guided;
            qrl_trace_guided_quantize(xt, e, codes, NULL, &n_guided);
            cr_assert_arr_eq(codes, RO.codes[t][s], (e->len + 1) / 2, "token %d site %d", t, s);
            total_guided += n_guided;
            n_elems += e->len;
        }
    /* about half the elements sit on the far side of a midpoint */
    cr_assert_gt(total_guided, n_elems / 4, "guided %llu of %llu",
                 (unsigned long long)total_guided, (unsigned long long)n_elems);
    free(RO.buf);
}

Test(trace_record, crafted_boundary_values) {
    /* amax 6 -> S_enc 448, block scale 448 (0x7E), multiplier exactly 1: normalized
     * values are the inputs.  Rollout sits just above each midpoint, training just below
     * (and the reverse); guidance must give the rollout's codeword every time. */
    float xr[16] = {6.0f}, xt[16] = {6.0f};
    const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; i++) {
        float d = 0.01f * (i + 1) / 7.0f + 0.005f;
        xr[1 + i] = mids[i] + d;  xt[1 + i] = mids[i] - d;
        xr[8 + i] = -(mids[i] - d); xt[8 + i] = -(mids[i] + d);
    }
    xr[15] = 2.51f; xt[15] = 2.49f;
    uint8_t codes[8], scales[1], bits[2], out[8];
    float g;
    qrl_trace_capture(xr, 16, codes, scales, bits, &g);
    cr_assert_eq(g, 448.0f);
    cr_assert_eq(scales[0], 0x7E);
    cr_assert_eq(qrl_nvfp4_block_rcp(scales[0], g), 1.0f);
    qrl_trace_entry e = {16, g, scales, bits};
    uint64_t n_guided;
    qrl_trace_guided_quantize(xt, &e, out, NULL, &n_guided);
    cr_assert_arr_eq(out, codes, 8);
    cr_assert_eq(n_guided, 15, "every crafted element needs guidance (%llu)", (unsigned long long)n_guided);
    cr_assert_eq(qrl_nibble_get(out, 15), 0x5); /* 2.49 -> 3, as the rollout's 2.51 */
}

/* ---- binary layout and the decoder's checks ------------------------------------------ */

/* independent CRC-32 (IEEE) for patching fields after a deliberate corruption */
static uint32_t crc32_ref(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

static void fix_crc(uint8_t *b, size_t len) {
    uint32_t c = crc32_ref(b, len - 4);
    for (int i = 0; i < 4; i++) b[len - 4 + i] = (uint8_t)(c >> (8 * i));
}

static void expect_refused(const uint8_t *b, size_t len, qrl_status want, const char *needle) {
    qrl_trace_record_t *rec = (qrl_trace_record_t *)1;
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status st = qrl_trace_record_decode(b, len, &rec, &err);
    cr_assert_eq(st, want, "status %s (%s), want %s", qrl_status_name(st), err.msg, qrl_status_name(want));
    cr_assert_null(rec);
    cr_assert(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
}

Test(trace_record, layout_sizes_and_crc) {
    cr_assert_eq(crc32_ref((const uint8_t *)"123456789", 9), 0xCBF43926u);
    size_t sz;
    const uint32_t h = 4096;
    cr_assert_eq(qrl_trace_record_size(10, 1, &h, &sz, NULL), QRL_OK);
    cr_assert_eq(sz, 16u + 4 + 10 * (4 + 4096 / 16 + 4096 / 8) + 4); /* 772 B/token/site */
    rollout_run(&RO, 104);
    cr_assert_arr_eq(RO.buf, "QTRC\x01\x10\x00\x00\x05\x00\x00\x00\x03\x00\x00\x00", 16);
    uint32_t crc = crc32_ref(RO.buf, RO.len - 4);
    cr_assert_eq(memcmp(&RO.buf[RO.len - 4], (uint8_t[]){crc, crc >> 8, crc >> 16, crc >> 24}, 4), 0);
    /* site 0 of token 0: global scale right after the site table, little-endian F32 */
    float g0;
    memcpy(&g0, RO.buf + 28, 4);
    cr_assert_eq(g0, RO.g[0][0]);
    free(RO.buf);
}

Test(trace_record, corrupt_records_are_refused) {
    rollout_run(&RO, 105);
    uint8_t *b = malloc(RO.len + 1);
    const size_t n = RO.len;
    /* every truncation */
    for (size_t l = 0; l < n; l++) {
        memcpy(b, RO.buf, l);
        qrl_trace_record_t *rec;
        cr_assert_eq(qrl_trace_record_decode(b, l, &rec, NULL), QRL_STATUS_CORRUPT, "len %zu", l);
    }
    expect_refused(RO.buf, 10, QRL_STATUS_CORRUPT, "truncated header");
    expect_refused(RO.buf, n - 1, QRL_STATUS_CORRUPT, "truncated");
    /* every single-byte flip is caught (CRC or a field check) */
    for (size_t i = 0; i < n; i++) {
        memcpy(b, RO.buf, n);
        b[i] ^= 0x01;
        qrl_trace_record_t *rec;
        cr_assert_neq(qrl_trace_record_decode(b, n, &rec, NULL), QRL_OK, "flip at %zu", i);
    }
    memcpy(b, RO.buf, n);
    b[n] = 0;
    expect_refused(b, n + 1, QRL_STATUS_CORRUPT, "trailing");
#define MUTATE(off, val, st, needle)                 \
    do {                                             \
        memcpy(b, RO.buf, n);                        \
        b[off] = (val);                              \
        fix_crc(b, n);                               \
        expect_refused(b, n, st, needle);            \
    } while (0)
    MUTATE(0, 'X', QRL_STATUS_CORRUPT, "magic");
    MUTATE(4, 2, QRL_STATUS_UNSUPPORTED, "version 2");
    MUTATE(5, 32, QRL_STATUS_UNSUPPORTED, "block size");
    MUTATE(6, 1, QRL_STATUS_CORRUPT, "flags");
    MUTATE(12, 0, QRL_STATUS_CORRUPT, "n_sites");             /* n_sites 3 -> 0 */
    MUTATE(11, 0x80, QRL_STATUS_CORRUPT, "n_tokens");         /* 2^31 tokens */
    MUTATE(20, 0, QRL_STATUS_CORRUPT, "site_len[1] at offset 20");  /* 20 -> 0 */
    MUTATE(16, 65, QRL_STATUS_CORRUPT, "truncated");          /* 64 -> 65: one more bit byte */
    MUTATE(31, 0xC4, QRL_STATUS_CORRUPT, "global_enc[token 0][site 0] at offset 28"); /* < 0 */
    memcpy(b, RO.buf, n);
    memcpy(b + 28 + 4 * 7, &(float){NAN}, 4);                 /* token 2, site 1 */
    fix_crc(b, n);
    expect_refused(b, n, QRL_STATUS_CORRUPT, "global_enc[token 2][site 1] at offset 56");
    const size_t off_scales = 16 + 12 + 4 * NT * NS;
    MUTATE(off_scales + 1, 0x90, QRL_STATUS_CORRUPT,
           "block scale 1 of [token 0][site 0] at offset 89 = 0x90 is negative");
    /* bits of (token 0, site 1): 20 elements, last byte has 4 padding bits */
    const size_t off_bits = off_scales + NT * 9, pad = off_bits + 8 + 2;
    MUTATE(pad, (uint8_t)(RO.buf[pad] | 0x80), QRL_STATUS_CORRUPT, "padding bits at offset");
    /* E4M3 NaN (0x7F, sign clear): the quantizer's mark of a non-finite input, a NaN
     * dequantization factor if it guided; token 1, site 2 is scale byte 9 + 4 + 2 + 1 */
    MUTATE(off_scales + 9 + 7, 0x7F, QRL_STATUS_CORRUPT,
           "block scale 1 of [token 1][site 2] at offset 104 = 0x7f is NaN");
    MUTATE(off_scales + 9 + 7, 0xFF, QRL_STATUS_CORRUPT, "= 0xff is negative");
    /* 0x7E (448) is the largest the quantizer writes and is accepted */
    memcpy(b, RO.buf, n);
    b[off_scales + 9 + 7] = 0x7E;
    fix_crc(b, n);
    {
        qrl_trace_record_t *rec;
        qrl_error err;
        cr_assert_eq(qrl_trace_record_decode(b, n, &rec, &err), QRL_OK, "%s", err.msg);
        qrl_trace_record_free(rec);
    }
    /* S_enc: infinite, zero, negative, and so small that 1 / S_enc overflows (every
     * dequantized value Inf or NaN); token 3, site 0 is at 28 + 4 * 9 */
    const float bad_g[] = {INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e-40f, 1e-37f};
    for (size_t i = 0; i < sizeof bad_g / sizeof *bad_g; i++) {
        memcpy(b, RO.buf, n);
        memcpy(b + 28 + 4 * 9, &bad_g[i], 4);
        fix_crc(b, n);
        expect_refused(b, n, QRL_STATUS_CORRUPT, "global_enc[token 3][site 0] at offset 64");
    }
    /* the bounds themselves are the quantizer's: 2688 / FLT_MAX and FLT_MAX decode */
    const float ok_g[] = {qrl_trace_min_global_enc(), FLT_MAX, 1.0f};
    cr_assert_eq(qrl_trace_min_global_enc(), qrl_nvfp4_global_enc(FLT_MAX));
    cr_assert(isnormal(1.0f / qrl_trace_min_global_enc()));
    for (size_t i = 0; i < 3; i++) {
        memcpy(b, RO.buf, n);
        memcpy(b + 28 + 4 * 9, &ok_g[i], 4);
        fix_crc(b, n);
        qrl_trace_record_t *rec;
        qrl_error err;
        cr_assert_eq(qrl_trace_record_decode(b, n, &rec, &err), QRL_OK, "%g: %s", ok_g[i], err.msg);
        qrl_trace_record_free(rec);
    }
    /* named decoding (a response's chunk): tokens from the chunk's first, sites by id */
    {
        memcpy(b, RO.buf, n);
        b[off_scales + 9 + 7] = 0x7F;
        fix_crc(b, n);
        const uint32_t ids[NS] = {0x10000, 0x13000, 0x15000};
        qrl_trace_names nm = {100, ids, NS};
        qrl_trace_record_t *rec = (qrl_trace_record_t *)1;
        qrl_error err;
        cr_assert_eq(qrl_trace_record_decode_named(b, n, &nm, &rec, &err), QRL_STATUS_CORRUPT);
        cr_assert_null(rec);
        cr_assert(strstr(err.msg, "block scale 1 of [token 101][site 2 (id 0x15000)] at offset "
                                  "104 = 0x7f is NaN") != NULL, "%s", err.msg);
    }
#undef MUTATE
    /* a site length of zero with a consistent size is still refused by name */
    {
        uint8_t hdr[16 + 4 + 4] = {'Q', 'T', 'R', 'C', 1, 16, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
        fix_crc(hdr, sizeof hdr);
        expect_refused(hdr, sizeof hdr, QRL_STATUS_CORRUPT, "site_len[0] at offset 16");
    }
    free(b);
    free(RO.buf);
}

Test(trace_record, encoder_refuses_bad_entries) {
    rollout_run(&RO, 106);
    uint8_t *b = malloc(RO.len);
    size_t w;
    qrl_error err;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len - 1, &w, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    qrl_trace_entry saved = RO.e[4];
    RO.e[4].len = 19;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "token 1, site 1") != NULL, "%s", err.msg);
    RO.e[4] = saved;
    RO.e[4].global_enc = NAN;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    RO.e[4] = saved;
    RO.e[4].global_enc = 1e-40f; /* 1 / S_enc overflows */
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "token 1, site 1): global_enc 9.99995e-41 is not finite and in [7.89932e-36, FLT_MAX]") != NULL, "%s", err.msg);
    RO.e[4] = saved;
    uint8_t neg[2] = {0x38, 0xB8};
    RO.e[4].scales = neg;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    RO.e[4] = saved;
    /* what the quantizer writes for a non-finite input: a NaN block scale, refused (the
     * rollout sends no records for that response rather than ones the learner refuses) */
    float xnan[20];
    uint8_t ncodes[10], nscales[2], nbits[3];
    float ng;
    for (int i = 0; i < 20; i++) xnan[i] = (float)i;
    xnan[17] = NAN;
    qrl_trace_capture(xnan, 20, ncodes, nscales, nbits, &ng);
    cr_assert_eq(nscales[1], 0x7F);
    cr_assert(isfinite(ng) && ng > 0.0f);
    RO.e[4] = (qrl_trace_entry){20, ng, nscales, nbits};
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "token 1, site 1): block scale 1 = 0x7f is NaN") != NULL, "%s",
              err.msg);
    /* and why: guided by it, the block's values come out NaN */
    float y[20];
    qrl_trace_guided_quantize(RO.x[1][1], &RO.e[4], NULL, y, NULL);
    cr_assert(isnan(y[16]) && isfinite(y[0]));
    RO.e[4] = saved;
    /* garbage in padding bits is cleared by the encoder */
    uint8_t bits[3] = {RO.bits[1][1][0], RO.bits[1][1][1], (uint8_t)(RO.bits[1][1][2] | 0xF0)};
    RO.e[4].bits = bits;
    cr_assert_eq(qrl_trace_record_encode(NT, NS, site_len, RO.e, b, RO.len, &w, &err), QRL_OK);
    qrl_trace_record_t *rec;
    cr_assert_eq(qrl_trace_record_decode(b, w, &rec, &err), QRL_OK, "%s", err.msg);
    qrl_trace_record_free(rec);
    uint32_t zero = 0, huge = QRL_TRACE_MAX_SITE_LEN + 1;
    size_t sz;
    cr_assert_eq(qrl_trace_record_size(1, 0, &zero, &sz, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_trace_record_size(1, 1, &zero, &sz, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_trace_record_size(1, 1, &huge, &sz, &err), QRL_STATUS_INVALID_ARGUMENT);
    free(b);
    free(RO.buf);
}
