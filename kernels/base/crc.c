/* CRC-32 (IEEE) and CRC-32C (Castagnoli), byte-at-a-time tables, CRC-32C also with SSE4.2
 * (crc.h). */
#include "base/crc.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        table[i] = c;
    }
}

uint32_t qrl_crc32(uint32_t crc, const void *data, size_t len) {
    pthread_once(&table_once, table_init);
    const uint8_t *p = data;
    uint32_t c = ~crc; /* zlib's pre- and post-inversion, so that calls chain */
    for (size_t i = 0; i < len; i++) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    return ~c;
}

/* ---- CRC-32C ------------------------------------------------------------------------ */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* reflected */
        crc_table[i] = c;
    }
}

uint32_t qrl_crc32c_sw(uint32_t crc, const void *data, size_t len) {
    pthread_once(&crc_once, crc_table_init);
    const uint8_t *p = data;
    uint32_t c = ~crc;
    while (len--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *data,
                                                             size_t len) {
    const uint8_t *p = data;
    uint64_t c = (uint32_t)~crc;
    for (; len && ((uintptr_t)p & 7); len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    for (; len; len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t qrl_crc32c(uint32_t crc, const void *data, size_t len) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return crc32c_hw(crc, data, len);
#endif
    return qrl_crc32c_sw(crc, data, len);
}
