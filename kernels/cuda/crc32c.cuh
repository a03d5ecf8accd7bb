/* CRC-32C of byte ranges of a device buffer (host launcher only, STYLE 7), for the weight
 * path's checksums (common/weights/wipc.h, docs/weight-sync.md).  Algorithm and tables:
 * kernels/cpu/crc32c.h (pieces of 1 KiB computed in parallel, folded in groups of 256,
 * then per range); the result equals qrl_wire_crc32c(0, buf + off[i], len[i]). */
#ifndef QRL_CUDA_CRC32C_CUH
#define QRL_CUDA_CRC32C_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cpu/crc32c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* crc[i] = CRC-32C of device bytes [buf + off[i], buf + off[i] + len[i]) for i < n (off,
 * len, crc host arrays; any alignment and length, 0 included); `tables` is
 * qrl_crc32c_fold_tables() (passed in: this library does not link the CPU one).  Runs on `stream` (a
 * cudaStream_t; scratch of ~4 bytes per KiB of the ranges comes from the stream-ordered
 * allocator) and returns once crc[] is filled.  Errors: INVALID_ARGUMENT (n < 0), CUDA. */
qrl_status qrl_cuda_crc32c_ranges(const uint8_t *buf, const uint64_t *off, const uint64_t *len, int n,
                                  uint32_t *crc, const qrl_crc32c_tables *tables, void *stream,
                                  qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
