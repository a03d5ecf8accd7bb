/* TRACE records: capture, guided rounding, binary encoder/decoder (trace.h, SPEC §6). */
#include "cpu/trace.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc.h"
#include "cpu/quant.h"

#define HEADER_BYTES 16u

/* ---- capture and guided rounding ---------------------------------------------------- */

void qrl_trace_bits_from_codes(const uint8_t *codes, uint32_t n, uint8_t *bits) {
    memset(bits, 0, (n + 7) / 8);
    for (uint32_t j = 0; j < n; j++)
        bits[j / 8] |= (uint8_t)((qrl_nibble_get(codes, j) & 1u) << (j % 8));
}

void qrl_trace_capture(const float *x, uint32_t n, uint8_t *codes, uint8_t *scales,
                       uint8_t *bits, float *global_enc) {
    qrl_nvfp4_quantize_row(x, n, codes, scales, global_enc);
    qrl_trace_bits_from_codes(codes, n, bits);
}

uint8_t qrl_trace_guided_round(float x, unsigned bit) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float a = fabsf(x);
    if (!(a <= QRL_E2M1_MAX)) return qrl_e2m1_encode(x); /* outside the grid or NaN */
    unsigned sign = signbit(x) ? 0x8u : 0u;
    unsigned k = 0;
    while (k < 7 && mag[k + 1] <= a) k++; /* mag[k] <= a < mag[k+1] (or k = 7, a = 6) */
    if (a == mag[k]) return (uint8_t)(sign | k);
    /* neighbours k and k+1 differ in their LSB, so exactly one matches the record */
    return (uint8_t)(sign | ((k & 1u) == (bit & 1u) ? k : k + 1));
}

void qrl_trace_guided_quantize(const float *x, const qrl_trace_entry *e, uint8_t *codes,
                               float *y, uint64_t *n_guided) {
    uint64_t guided = 0;
    for (uint32_t j0 = 0; j0 < e->len; j0 += QRL_NVFP4_BLOCK) {
        uint32_t len = e->len - j0 < QRL_NVFP4_BLOCK ? e->len - j0 : QRL_NVFP4_BLOCK;
        uint8_t s = e->scales[j0 / QRL_NVFP4_BLOCK];
        float r = qrl_nvfp4_block_rcp(s, e->global_enc);
        float ds = qrl_nvfp4_block_dequant_scale(s, e->global_enc);
        uint8_t c[QRL_NVFP4_BLOCK];
        for (uint32_t j = 0; j < len; j++) {
            if (r == 0.0f) { c[j] = 0; continue; } /* as the encoder: zero or NaN scale */
            float v = x[j0 + j] * r;
            unsigned bit = (e->bits[(j0 + j) / 8] >> ((j0 + j) % 8)) & 1u;
            c[j] = qrl_trace_guided_round(v, bit);
            guided += c[j] != qrl_e2m1_encode(v);
        }
        for (uint32_t j = 0; j < len; j++) {
            if (y) y[j0 + j] = qrl_e2m1_decode(c[j]) * ds;
        }
        if (codes) qrl_nibble_pack(c, len, codes + j0 / 2);
    }
    if (n_guided) *n_guided = guided;
}

/* ---- binary record ------------------------------------------------------------------ */

struct qrl_trace_record {
    const uint8_t *buf;
    uint32_t n_tokens, n_sites;
    uint64_t off_global, off_scales, off_bits;     /* section offsets */
    uint64_t scales_per_token, bits_per_token;     /* bytes per token in each section */
    uint32_t *site_len;
    uint64_t *scale_prefix, *bit_prefix;           /* byte offset of site s in a token */
};

static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void st32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

static float ldf32(const uint8_t *p) {
    uint32_t u = ld32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Per-token byte counts of the scale and bit sections (no overflow: sites and lengths
 * are bounded, see the limits in trace.h). */
static void per_token_bytes(uint32_t n_sites, const uint32_t *site_len, uint64_t *sc,
                            uint64_t *bt) {
    *sc = *bt = 0;
    for (uint32_t s = 0; s < n_sites; s++) {
        *sc += (site_len[s] + QRL_NVFP4_BLOCK - 1) / QRL_NVFP4_BLOCK;
        *bt += (site_len[s] + 7) / 8;
    }
}

static uint64_t total_bytes(uint32_t n_tokens, uint32_t n_sites, uint64_t sc, uint64_t bt) {
    return HEADER_BYTES + 4ull * n_sites + (uint64_t)n_tokens * (4ull * n_sites + sc + bt) + 4;
}

static qrl_status check_counts(uint32_t n_tokens, uint32_t n_sites, qrl_status st,
                               qrl_error *err) {
    if (n_sites == 0 || n_sites > QRL_TRACE_MAX_SITES)
        return qrl_error_set(err, st, "trace record: n_sites=%u at offset 12 not in [1, %u]",
                             n_sites, QRL_TRACE_MAX_SITES);
    if (n_tokens > QRL_TRACE_MAX_TOKENS)
        return qrl_error_set(err, st, "trace record: n_tokens=%u at offset 8 exceeds %u",
                             n_tokens, QRL_TRACE_MAX_TOKENS);
    return QRL_OK;
}

static bool site_len_ok(uint32_t len) { return len >= 1 && len <= QRL_TRACE_MAX_SITE_LEN; }

/* Field ranges: what qrl_trace_capture writes for a vector it can guide (trace.h).  S_enc
 * = 2688 / amax is at least 2688 / FLT_MAX for finite amax (1 for amax 0 or Inf, FLT_MAX
 * when the quotient overflows); below that 1 / S_enc overflows and every dequantized
 * value of the vector is Inf or NaN. */
float qrl_trace_min_global_enc(void) { return qrl_nvfp4_global_enc(FLT_MAX); }

static bool global_enc_ok(float g) { return g >= qrl_trace_min_global_enc() && g <= FLT_MAX; }

/* Why block scale code s cannot guide (NULL: it can).  0x7F is the quantizer's mark of a
 * block with a NaN/Inf input: its dequantization factor is NaN, so guided values are NaN. */
static const char *scale_problem(uint8_t s) {
    if (s & 0x80) return "negative (sign bit set)";
    if (s == QRL_E4M3_NAN) return "NaN (E4M3 0x7F: the rollout's quantizer writes it for a "
                                  "block whose input was not finite)";
    return NULL;
}

qrl_status qrl_trace_record_size(uint32_t n_tokens, uint32_t n_sites, const uint32_t *site_len,
                                 size_t *size, qrl_error *err) {
    QRL_TRY(check_counts(n_tokens, n_sites, QRL_STATUS_INVALID_ARGUMENT, err));
    for (uint32_t s = 0; s < n_sites; s++)
        if (!site_len_ok(site_len[s]))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace record: site_len[%u]=%u not in [1, %u]", s, site_len[s],
                                 QRL_TRACE_MAX_SITE_LEN);
    uint64_t sc, bt;
    per_token_bytes(n_sites, site_len, &sc, &bt);
    uint64_t total = total_bytes(n_tokens, n_sites, sc, bt);
    if (total > SIZE_MAX)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "trace record: size overflow");
    *size = (size_t)total;
    return QRL_OK;
}

qrl_status qrl_trace_record_encode(uint32_t n_tokens, uint32_t n_sites, const uint32_t *site_len,
                                   const qrl_trace_entry *entries, uint8_t *buf, size_t cap,
                                   size_t *written, qrl_error *err) {
    size_t size;
    QRL_TRY(qrl_trace_record_size(n_tokens, n_sites, site_len, &size, err));
    if (cap < size)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace record: buffer of %zu bytes, need %zu", cap, size);
    uint64_t sc, bt;
    per_token_bytes(n_sites, site_len, &sc, &bt);
    memcpy(buf, "QTRC", 4);
    buf[4] = QRL_TRACE_VERSION;
    buf[5] = QRL_NVFP4_BLOCK;
    buf[6] = buf[7] = 0;
    st32(buf + 8, n_tokens);
    st32(buf + 12, n_sites);
    for (uint32_t s = 0; s < n_sites; s++) st32(buf + HEADER_BYTES + 4 * s, site_len[s]);
    uint8_t *g = buf + HEADER_BYTES + 4ull * n_sites;
    uint8_t *sp = g + 4ull * n_tokens * n_sites, *bp = sp + (uint64_t)n_tokens * sc;
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t s = 0; s < n_sites; s++) {
            const qrl_trace_entry *e = &entries[(uint64_t)t * n_sites + s];
            uint32_t ns = (e->len + QRL_NVFP4_BLOCK - 1) / QRL_NVFP4_BLOCK, nb = (e->len + 7) / 8;
            if (e->len != site_len[s])
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "trace entry (token %u, site %u): len %u != site_len %u",
                                     t, s, e->len, site_len[s]);
            if (!global_enc_ok(e->global_enc))
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "trace entry (token %u, site %u): global_enc %g is not "
                                     "finite and in [%g, FLT_MAX]", t, s, (double)e->global_enc,
                                     (double)qrl_trace_min_global_enc());
            for (uint32_t b = 0; b < ns; b++)
                if (scale_problem(e->scales[b]))
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "trace entry (token %u, site %u): block scale %u "
                                         "= 0x%02x is %s", t, s, b, e->scales[b],
                                         scale_problem(e->scales[b]));
            uint32_t gbits;
            memcpy(&gbits, &e->global_enc, 4);
            st32(g, gbits);
            g += 4;
            memcpy(sp, e->scales, ns);
            sp += ns;
            memcpy(bp, e->bits, nb);
            if (e->len % 8) bp[nb - 1] &= (uint8_t)((1u << (e->len % 8)) - 1); /* padding */
            bp += nb;
        }
    st32(bp, qrl_crc32(0, buf, size - 4));
    *written = size;
    return QRL_OK;
}

void qrl_trace_record_free(qrl_trace_record_t *rec) { free(rec); }

/* " (id 0x...)" for site s when names carry its id, "" otherwise; into b [24]. */
static const char *site_id_str(const qrl_trace_names *nm, uint32_t s, char *b) {
    b[0] = 0;
    if (nm && nm->site_ids && s < nm->n_site_ids)
        snprintf(b, 24, " (id 0x%x)", (unsigned)nm->site_ids[s]);
    return b;
}

qrl_status qrl_trace_record_decode(const uint8_t *buf, size_t len, qrl_trace_record_t **out,
                                   qrl_error *err) {
    return qrl_trace_record_decode_named(buf, len, NULL, out, err);
}

qrl_status qrl_trace_record_decode_named(const uint8_t *buf, size_t len,
                                         const qrl_trace_names *nm, qrl_trace_record_t **out,
                                         qrl_error *err) {
    const uint64_t tb = nm ? nm->token_base : 0;
    char sid[24];
    const qrl_status C = QRL_STATUS_CORRUPT;
    *out = NULL;
    if (!buf || len < HEADER_BYTES)
        return qrl_error_set(err, C, "trace record: truncated header (%zu bytes, need %u)",
                             len, HEADER_BYTES);
    if (memcmp(buf, "QTRC", 4) != 0)
        return qrl_error_set(err, C, "trace record: bad magic at offset 0 "
                             "(%02x %02x %02x %02x, expected 'QTRC')", buf[0], buf[1], buf[2], buf[3]);
    if (buf[4] != QRL_TRACE_VERSION)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "trace record: version %u at offset 4, "
                             "this build reads version %u", buf[4], QRL_TRACE_VERSION);
    if (buf[5] != QRL_NVFP4_BLOCK)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "trace record: block size %u at "
                             "offset 5, expected %u", buf[5], QRL_NVFP4_BLOCK);
    if (buf[6] || buf[7])
        return qrl_error_set(err, C, "trace record: flags at offset 6 = 0x%02x%02x, must be 0",
                             buf[7], buf[6]);
    uint32_t n_tokens = ld32(buf + 8), n_sites = ld32(buf + 12);
    QRL_TRY(check_counts(n_tokens, n_sites, C, err));
    if (len < HEADER_BYTES + 4ull * n_sites)
        return qrl_error_set(err, C, "trace record: truncated site table (%zu bytes, need %llu)",
                             len, (unsigned long long)(HEADER_BYTES + 4ull * n_sites));
    qrl_trace_record_t *rec = malloc(sizeof *rec + (size_t)n_sites * (4 + 8 + 8));
    if (!rec) return qrl_error_set(err, QRL_STATUS_NOMEM, "trace record: %u sites", n_sites);
    rec->scale_prefix = (uint64_t *)(rec + 1);
    rec->bit_prefix = rec->scale_prefix + n_sites;
    rec->site_len = (uint32_t *)(rec->bit_prefix + n_sites);
    qrl_status st = QRL_OK;
    uint64_t sc = 0, bt = 0;
    for (uint32_t s = 0; s < n_sites; s++) {
        uint32_t l = ld32(buf + HEADER_BYTES + 4 * s);
        if (!site_len_ok(l)) {
            st = qrl_error_set(err, C, "trace record: site_len[%u] at offset %u = %u not in "
                               "[1, %u]", s, HEADER_BYTES + 4 * s, l, QRL_TRACE_MAX_SITE_LEN);
            goto fail;
        }
        rec->site_len[s] = l;
        rec->scale_prefix[s] = sc;
        rec->bit_prefix[s] = bt;
        sc += (l + QRL_NVFP4_BLOCK - 1) / QRL_NVFP4_BLOCK;
        bt += (l + 7) / 8;
    }
    uint64_t total = total_bytes(n_tokens, n_sites, sc, bt);
    if (len != total) {
        st = qrl_error_set(err, C, "trace record: %s: %zu bytes, header says %llu",
                           len < total ? "truncated" : "trailing bytes", len,
                           (unsigned long long)total);
        goto fail;
    }
    uint32_t crc = qrl_crc32(0, buf, len - 4), want = ld32(buf + len - 4);
    if (crc != want) {
        st = qrl_error_set(err, C, "trace record: crc32 mismatch at offset %zu (stored "
                           "0x%08x, computed 0x%08x)", len - 4, want, crc);
        goto fail;
    }
    rec->buf = buf;
    rec->n_tokens = n_tokens;
    rec->n_sites = n_sites;
    rec->scales_per_token = sc;
    rec->bits_per_token = bt;
    rec->off_global = HEADER_BYTES + 4ull * n_sites;
    rec->off_scales = rec->off_global + 4ull * n_tokens * n_sites;
    rec->off_bits = rec->off_scales + (uint64_t)n_tokens * sc;
    /* field checks: the CRC guards against accidents, these against a wrong writer (or a
     * right one whose values cannot guide: trace.h) */
    for (uint64_t i = 0; i < (uint64_t)n_tokens * n_sites; i++) {
        uint64_t off = rec->off_global + 4 * i;
        float g = ldf32(buf + off);
        uint32_t s = (uint32_t)(i % n_sites);
        if (!global_enc_ok(g)) {
            st = qrl_error_set(err, C, "trace record: global_enc[token %llu][site %u%s] at "
                               "offset %llu = %g, must be finite and in [%g, FLT_MAX]",
                               (unsigned long long)(tb + i / n_sites), s, site_id_str(nm, s, sid),
                               (unsigned long long)off, (double)g,
                               (double)qrl_trace_min_global_enc());
            goto fail;
        }
    }
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t s = 0; s < n_sites; s++) {
            uint64_t off = rec->off_scales + t * sc + rec->scale_prefix[s];
            uint32_t nb = (rec->site_len[s] + QRL_NVFP4_BLOCK - 1) / QRL_NVFP4_BLOCK;
            for (uint32_t b = 0; b < nb; b++) {
                const char *why = scale_problem(buf[off + b]);
                if (!why) continue;
                st = qrl_error_set(err, C, "trace record: block scale %u of [token %llu][site "
                                   "%u%s] at offset %llu = 0x%02x is %s", b,
                                   (unsigned long long)(tb + t), s, site_id_str(nm, s, sid),
                                   (unsigned long long)(off + b), buf[off + b], why);
                goto fail;
            }
        }
    for (uint32_t t = 0; t < n_tokens; t++)
        for (uint32_t s = 0; s < n_sites; s++) {
            uint32_t l = rec->site_len[s];
            if (l % 8 == 0) continue;
            uint64_t off = rec->off_bits + t * bt + rec->bit_prefix[s] + (l + 7) / 8 - 1;
            if (buf[off] >> (l % 8)) {
                st = qrl_error_set(err, C, "trace record: nonzero padding bits at offset %llu "
                                   "([token %llu][site %u%s])", (unsigned long long)off,
                                   (unsigned long long)(tb + t), s, site_id_str(nm, s, sid));
                goto fail;
            }
        }
    *out = rec;
    return QRL_OK;
fail:
    free(rec);
    return st;
}

uint32_t qrl_trace_record_n_tokens(const qrl_trace_record_t *rec) { return rec->n_tokens; }
uint32_t qrl_trace_record_n_sites(const qrl_trace_record_t *rec) { return rec->n_sites; }

uint32_t qrl_trace_record_site_len(const qrl_trace_record_t *rec, uint32_t site) {
    return site < rec->n_sites ? rec->site_len[site] : 0;
}

qrl_status qrl_trace_record_entry(const qrl_trace_record_t *rec, uint32_t token, uint32_t site,
                                  qrl_trace_entry *out, qrl_error *err) {
    if (token >= rec->n_tokens || site >= rec->n_sites)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace record: (token %u, site %u) outside %u tokens x %u sites",
                             token, site, rec->n_tokens, rec->n_sites);
    uint64_t i = (uint64_t)token * rec->n_sites + site;
    out->len = rec->site_len[site];
    out->global_enc = ldf32(rec->buf + rec->off_global + 4 * i);
    out->scales = rec->buf + rec->off_scales + token * rec->scales_per_token + rec->scale_prefix[site];
    out->bits = rec->buf + rec->off_bits + token * rec->bits_per_token + rec->bit_prefix[site];
    return QRL_OK;
}
