/* Checksums of the kernels' base, used downward by common/ (core/crc32.h includes this):
 *
 * CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), bit-identical to zlib's crc32():
 * the checksum of the AdamW state file and of TRACE records.
 *
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of wire chunks and
 * of TensorBoard event records (SSE4.2 accelerated).  kernels/cpu/crc32c.h is the piecewise
 * reference of the device CRC-32C; all three give the same CRC-32C.
 *
 * The two polynomials are different functions and are not interchangeable. */
#ifndef QRL_BASE_CRC_H
#define QRL_BASE_CRC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Continue a CRC-32 over len bytes of data (data may be NULL when len is 0).  Start with
 * crc = 0; feeding the result back in over the next piece equals one call over the
 * concatenation, as zlib's crc32(crc, buf, len).  qrl_crc32(0, "123456789", 9) ==
 * 0xCBF43926.  Thread-safe. */
uint32_t qrl_crc32(uint32_t crc, const void *data, size_t len);

/* CRC-32C, continuing from `crc` (start with 0; chains like qrl_crc32).  Uses the SSE4.2
 * instruction where the CPU has it.  Thread-safe. */
uint32_t qrl_crc32c(uint32_t crc, const void *data, size_t len);
/* Portable table-driven reference of the same function (the tests compare the two). */
uint32_t qrl_crc32c_sw(uint32_t crc, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
