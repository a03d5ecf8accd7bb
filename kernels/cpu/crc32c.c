/* CRC-32C in pieces (crc32c.h): tables and the plain C reference of the device fold. */
#include "cpu/crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t slice8[8][256];
static pthread_once_t slice8_once = PTHREAD_ONCE_INIT;

static void slice8_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        slice8[0][i] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            slice8[k][i] = (slice8[k - 1][i] >> 8) ^ slice8[0][slice8[k - 1][i] & 0xff];
}

const uint32_t (*qrl_crc32c_slice8_tables(void))[256] {
    pthread_once(&slice8_once, slice8_init);
    return (const uint32_t (*)[256])slice8;
}

uint32_t qrl_crc32c_raw(uint32_t crc, const uint8_t *p, size_t len) {
    const uint32_t (*t)[256] = qrl_crc32c_slice8_tables();
    for (size_t i = 0; i < len; i++) crc = (crc >> 8) ^ t[0][(crc ^ p[i]) & 0xff];
    return crc;
}

/* Apply the 32x32 GF(2) matrix m (column j = image of bit j) to v. */
static uint32_t mat_apply(const uint32_t m[32], uint32_t v) {
    uint32_t r = 0;
    for (int j = 0; v; j++, v >>= 1)
        if (v & 1) r ^= m[j];
    return r;
}

void qrl_crc32c_shift_tables(uint64_t len, uint32_t out[4][256]) {
    /* matrix of shift_len by square-and-multiply over the one-zero-byte map */
    uint32_t acc[32], sq[32], tmp[32];
    const uint32_t (*t)[256] = qrl_crc32c_slice8_tables();
    for (int j = 0; j < 32; j++) {
        uint32_t c = 1u << j;
        sq[j] = (c >> 8) ^ t[0][c & 0xff]; /* one zero byte */
        acc[j] = 1u << j;                  /* identity */
    }
    while (len) {
        if (len & 1) {
            for (int j = 0; j < 32; j++) tmp[j] = mat_apply(sq, acc[j]);
            for (int j = 0; j < 32; j++) acc[j] = tmp[j];
        }
        len >>= 1;
        if (len) {
            for (int j = 0; j < 32; j++) tmp[j] = mat_apply(sq, sq[j]);
            for (int j = 0; j < 32; j++) sq[j] = tmp[j];
        }
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) out[k][b] = mat_apply(acc, b << (8 * k));
}

static qrl_crc32c_tables fold;
static pthread_once_t fold_once = PTHREAD_ONCE_INIT;

static void fold_init(void) {
    memcpy(fold.s8, qrl_crc32c_slice8_tables(), sizeof fold.s8);
    qrl_crc32c_shift_tables(QRL_CRC32C_PIECE, fold.tp);
    qrl_crc32c_shift_tables((uint64_t)QRL_CRC32C_PIECE * QRL_CRC32C_GROUP, fold.tg);
}

const qrl_crc32c_tables *qrl_crc32c_fold_tables(void) {
    pthread_once(&fold_once, fold_init);
    return &fold;
}

uint32_t qrl_crc32c_pieces(const uint8_t *p, size_t len) {
    const qrl_crc32c_tables *ft = qrl_crc32c_fold_tables();
    const uint32_t (*tp)[256] = ft->tp, (*tg)[256] = ft->tg;
    size_t np = len / QRL_CRC32C_PIECE, ng = np / QRL_CRC32C_GROUP;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t g = 0; g < ng; g++) {
        uint32_t gv = 0;
        for (size_t k = 0; k < QRL_CRC32C_GROUP; k++) {
            const uint8_t *piece = p + (g * QRL_CRC32C_GROUP + k) * QRL_CRC32C_PIECE;
            gv = qrl_crc32c_shift_apply(tp, gv) ^
                 qrl_crc32c_raw(0, piece, QRL_CRC32C_PIECE);
        }
        c = qrl_crc32c_shift_apply(tg, c) ^ gv;
    }
    for (size_t k = ng * QRL_CRC32C_GROUP; k < np; k++)
        c = qrl_crc32c_shift_apply(tp, c) ^
            qrl_crc32c_raw(0, p + k * QRL_CRC32C_PIECE, QRL_CRC32C_PIECE);
    c = qrl_crc32c_raw(c, p + np * QRL_CRC32C_PIECE, len - np * QRL_CRC32C_PIECE);
    return ~c;
}
