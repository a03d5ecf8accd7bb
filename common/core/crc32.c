/* CRC-32 (IEEE), byte-at-a-time table (crc32.h). */
#include "core/crc32.h"

#include <pthread.h>

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
