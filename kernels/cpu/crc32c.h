/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) in pieces: the plain C reference of
 * the device checksum (kernels/cuda/crc32c.cuh) and the tables it uses.
 *
 * The device cuts a byte range into pieces of QRL_CRC32C_PIECE bytes, computes each
 * piece's CRC register from 0 independently ("raw": no initial or final inversion), and
 * folds them in order: for a register c and data D, processing D from c gives
 * shift_|D|(c) xor raw(D), where shift_L is the linear map "process L zero bytes"
 * (zlib's crc32_combine idea).  shift_L is applied with four 256-entry tables, one per
 * byte of c.  The standard CRC-32C of D is then ~(fold starting from 0xFFFFFFFF). */
#ifndef QRL_CPU_CRC32C_H
#define QRL_CPU_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#define QRL_CRC32C_PIECE 1024u        /* bytes per independently computed piece */
#define QRL_CRC32C_GROUP 256u         /* pieces folded into one group value first */

#ifdef __cplusplus
extern "C" {
#endif

/* Slice-by-8 tables: t[0] the byte-at-a-time table, t[k][i] = (t[k-1][i] >> 8) ^
 * t[0][t[k-1][i] & 0xff].  Filled once (thread-safe), static storage. */
const uint32_t (*qrl_crc32c_slice8_tables(void))[256];
/* Register after processing `len` bytes from register `crc` (no inversions). */
uint32_t qrl_crc32c_raw(uint32_t crc, const uint8_t *p, size_t len);
/* Tables of shift_len: out[k][b] = shift_len(b << 8k), so that
 * shift_len(c) = out[0][c & 255] ^ out[1][c >> 8 & 255] ^ out[2][c >> 16 & 255] ^ out[3][c >> 24]. */
void qrl_crc32c_shift_tables(uint64_t len, uint32_t out[4][256]);
static inline uint32_t qrl_crc32c_shift_apply(const uint32_t t[4][256], uint32_t c) {
    return t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24];
}
/* Every table the device fold needs, in one block (kernels/cuda/crc32c.cuh takes it from
 * the caller, so the CUDA library does not link against this one). */
typedef struct qrl_crc32c_tables {
    uint32_t s8[8][256];  /* qrl_crc32c_slice8_tables */
    uint32_t tp[4][256];  /* shift by one piece */
    uint32_t tg[4][256];  /* shift by one group */
} qrl_crc32c_tables;
/* Filled once (thread-safe), static storage. */
const qrl_crc32c_tables *qrl_crc32c_fold_tables(void);

/* The reference of the device algorithm: CRC-32C of p[0, len) (equal to
 * qrl_wire_crc32c(0, p, len)) computed as pieces, groups and a fold. */
uint32_t qrl_crc32c_pieces(const uint8_t *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif
