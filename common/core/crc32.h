/* CRC-32 (zlib's) and CRC-32C (Castagnoli) for common/: defined by the kernels' base,
 * kernels/base/crc.h (where kernels/cpu/trace.c can use them too); see there. */
#ifndef QRL_CORE_CRC32_H
#define QRL_CORE_CRC32_H

#include "base/crc.h"

#endif
