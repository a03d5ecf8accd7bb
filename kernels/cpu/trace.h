/* TRACE compact quantization records and guided FP4 rounding (SPEC §6).
 *
 * At each captured site the rollout quantizes one token's input vector to NVFP4 with a
 * per-token global scale (quant.h); the record keeps, per (token, site), the global
 * encode scale S_enc (F32), the E4M3 block scales and the lowest mantissa bit of every
 * E2M1 code (for E2M1 that is the code's LSB).  The learner re-normalizes its own value
 * with the recorded scales and, of the two E2M1 codewords around it, takes the one whose
 * LSB matches the record (qrl_trace_guided_round).
 *
 * Cost per token per captured site of n elements: 4 + ceil(n/16) + ceil(n/8) bytes
 * (hidden size H: H/16 + H/8 + 4; H = 4096 -> 772 bytes).
 *
 * Binary record, version 1, little-endian (docs/formats.md has the table):
 *   0   char[4] magic "QTRC"      4  u8 version (1)    5  u8 block (16)
 *   6   u16 flags (0)             8  u32 n_tokens      12 u32 n_sites
 *   16  u32 site_len[n_sites]     elements per token at each site, 1..2^24
 *   f32 global_enc[n_tokens][n_sites]          in [2688 / FLT_MAX, FLT_MAX]
 *   u8  scales[n_tokens][sum_s ceil(len_s/16)] E4M3 0x00..0x7E (sign clear, not NaN)
 *   u8  bits[n_tokens][sum_s ceil(len_s/8)]    element j at bit j%8 of byte j/8 of its
 *                                              (token, site) run; padding bits are 0
 *   u32 crc32 (IEEE, as zlib) of every byte before it
 * The field ranges are what qrl_trace_capture writes for a vector whose elements are all
 * finite.  For a non-finite element the quantizer writes block scale 0x7F (NaN), which
 * would make every guided value of the block NaN: the encoder refuses such an entry (the
 * rollout sends no records for that response) and the decoder refuses a record holding
 * one (the learner trains that response unguided), so a record that decodes never yields
 * a non-finite dequantization factor under its own or the learner's S_enc. */
#ifndef QRL_CPU_TRACE_H
#define QRL_CPU_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QRL_TRACE_VERSION 1
#define QRL_TRACE_MAX_SITES 65536u
#define QRL_TRACE_MAX_SITE_LEN (1u << 24)
#define QRL_TRACE_MAX_TOKENS (1u << 24)

/* One (token, site) entry; pointers are borrowed (into a record or the caller's arrays). */
typedef struct qrl_trace_entry {
    uint32_t len;          /* elements */
    float global_enc;      /* NVFP4 S_enc of this token's vector */
    const uint8_t *scales; /* ceil(len/16) E4M3 block scales */
    const uint8_t *bits;   /* ceil(len/8) bytes, code LSBs, element j at bit j%8 of byte j/8 */
} qrl_trace_entry;

/* Rollout side: quantize x [n] to NVFP4 (qrl_nvfp4_quantize_row) and keep what the
 * record needs: scales [ceil(n/16)], bits [ceil(n/8)], *global_enc.  codes
 * [ceil(n/2)] receives the packed E2M1 codes used by the rollout's own forward. */
void qrl_trace_capture(const float *x, uint32_t n, uint8_t *codes, uint8_t *scales,
                       uint8_t *bits, float *global_enc);
/* bits [ceil(n/8)] = LSBs of packed E2M1 codes [ceil(n/2)]; padding bits cleared. */
void qrl_trace_bits_from_codes(const uint8_t *codes, uint32_t n, uint8_t *bits);

/* Guided rounding of a normalized value x (x times the recorded block's element
 * multiplier qrl_nvfp4_block_rcp): x exactly on a codeword -> that code; |x| strictly
 * between two adjacent magnitudes (they always have different LSBs) -> the one whose LSB
 * is `bit`, with the sign of x; |x| > 6, NaN -> round to nearest (qrl_e2m1_encode).
 * Returns the 4-bit E2M1 code. */
uint8_t qrl_trace_guided_round(float x, unsigned bit);

/* Learner side: fake-quantize x [e->len] at a captured site with the recorded scales and
 * bits.  codes [ceil(len/2)] (may be NULL) gets the packed guided codes, y [len] (may be
 * NULL, may alias x) the dequantized values; *n_guided (may be NULL) counts elements
 * whose guided code differs from round-to-nearest under the same scales. */
void qrl_trace_guided_quantize(const float *x, const qrl_trace_entry *e, uint8_t *codes,
                               float *y, uint64_t *n_guided);

/* Encoded size of a record.  Errors: INVALID_ARGUMENT (counts or a site length out of
 * range, size overflow). */
qrl_status qrl_trace_record_size(uint32_t n_tokens, uint32_t n_sites, const uint32_t *site_len,
                                 size_t *size, qrl_error *err);
/* Smallest S_enc a record may hold: qrl_nvfp4_global_enc(FLT_MAX) = 2688 / FLT_MAX (the
 * quantizer's smallest for finite input; below it 1 / S_enc overflows). */
float qrl_trace_min_global_enc(void);

/* Encode entries [n_tokens * n_sites] (token-major: entry t*n_sites + s; entries[i].len
 * must equal site_len[s]) into buf [cap]; *written = bytes used.  Errors:
 * INVALID_ARGUMENT (bad entry, naming token, site and field: length, global scale outside
 * the format's range, block scale negative or NaN), OUT_OF_RANGE (cap too small). */
qrl_status qrl_trace_record_encode(uint32_t n_tokens, uint32_t n_sites, const uint32_t *site_len,
                                   const qrl_trace_entry *entries, uint8_t *buf, size_t cap,
                                   size_t *written, qrl_error *err);

/* A validated record: borrows the buffer passed to qrl_trace_record_decode, which must
 * outlive it. */
typedef struct qrl_trace_record qrl_trace_record_t;

/* Validate buf [len] completely (header, sizes, CRC, every global scale and block scale
 * against the ranges above, every padding bit) and return a record handle (free with
 * qrl_trace_record_free).  Never reads outside buf.  Errors: CORRUPT (bad magic,
 * truncated or trailing bytes, CRC mismatch, invalid field; the message names the field,
 * its token and site and its byte offset), UNSUPPORTED (other version or block size),
 * NOMEM. */
qrl_status qrl_trace_record_decode(const uint8_t *buf, size_t len, qrl_trace_record_t **out,
                                   qrl_error *err);
/* How error messages name a record's tokens and sites (one chunk of a response): token t
 * of the record is called token_base + t, site s gets " (id 0x...)" from site_ids
 * [n_site_ids] when s < n_site_ids (site_ids may be NULL). */
typedef struct qrl_trace_names {
    uint32_t token_base;
    const uint32_t *site_ids;
    size_t n_site_ids;
} qrl_trace_names;
/* qrl_trace_record_decode with messages numbered by names (NULL: as the record). */
qrl_status qrl_trace_record_decode_named(const uint8_t *buf, size_t len,
                                         const qrl_trace_names *names, qrl_trace_record_t **out,
                                         qrl_error *err);
void qrl_trace_record_free(qrl_trace_record_t *rec);
uint32_t qrl_trace_record_n_tokens(const qrl_trace_record_t *rec);
uint32_t qrl_trace_record_n_sites(const qrl_trace_record_t *rec);
/* Elements per token at `site` (0 when site >= n_sites). */
uint32_t qrl_trace_record_site_len(const qrl_trace_record_t *rec, uint32_t site);
/* Entry of (token, site); pointers into the record's buffer.  Errors: OUT_OF_RANGE. */
qrl_status qrl_trace_record_entry(const qrl_trace_record_t *rec, uint32_t token, uint32_t site,
                                  qrl_trace_entry *out, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
