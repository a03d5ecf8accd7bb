/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), bit-identical to zlib's crc32():
 * the checksum of the AdamW state file and of TRACE records.
 *
 * Not the CRC-32C (Castagnoli, 0x82F63B78) that guards wire chunks: that one is
 * qrl_wire_crc32c in wire/wire.h (SSE4.2 accelerated); the two are different functions
 * and are not interchangeable. */
#ifndef QRL_CORE_CRC32_H
#define QRL_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC-32 over len bytes of data (data may be NULL when len is 0).  Start with
 * crc = 0; feeding the result back in over the next piece equals one call over the
 * concatenation, as zlib's crc32(crc, buf, len).  qrl_crc32(0, "123456789", 9) ==
 * 0xCBF43926.  Thread-safe. */
uint32_t qrl_crc32(uint32_t crc, const void *data, size_t len);

#endif
