/* Weight sync, the transport-independent part (SPEC §8 "Weight sync"; docs/weight-sync.md):
 * the bucket plan, the NCCL transfer header, the bucket-CRC table, the checks a receiver
 * runs before it uses a version (shared by the TCP receiver and the NCCL receiver), and
 * the choice of transport.  No CUDA here: everything is testable on a CPU machine.
 *
 * A version's stream is the concatenation of its tensors (BF16 or F32) at the byte offsets
 * of its WeightManifest, cut into buckets of manifest.bucket_bytes (the last may be shorter).
 * On NCCL a transfer is, all broadcast from rank 0:
 *   header   QRL_WSYNC_HEADER_BYTES, fixed layout (qrl_wsync_header_encode)
 *   preamble manifest bytes (encoded WeightManifest) then one u32 LE CRC-32C per bucket
 *   stream   bucket_count buckets of bucket_bytes (the last shorter)
 * The TCP transport carries the same manifest and per-bucket CRCs in its own frames. */
#ifndef QRL_WEIGHTS_WSYNC_H
#define QRL_WEIGHTS_WSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"

#define QRL_WSYNC_HEADER_BYTES 64
#define QRL_WSYNC_MAGIC 0x574c5251u          /* "QRLW" little-endian */
#define QRL_WSYNC_FORMAT 1u
#define QRL_WSYNC_MAX_MANIFEST ((size_t)16 << 20)

/* The fixed header that opens an NCCL transfer.  Layout (little-endian):
 *   0 magic u32 | 4 format u32 | 8 sync_epoch u64 | 16 version u64 | 24 total_bytes u64 |
 *   32 bucket_bytes u64 | 40 bucket_count u32 | 44 manifest_len u32 | 48 preamble_crc u32 |
 *   52 flags u32 (0) | 56 reserved u32 (0) | 60 CRC-32C of bytes 0..59 */
typedef struct qrl_wsync_header {
    uint64_t sync_epoch;
    uint64_t version;
    uint64_t total_bytes;
    uint64_t bucket_bytes;
    uint32_t bucket_count;
    uint32_t manifest_len;
    uint32_t preamble_crc;   /* CRC-32C of manifest bytes followed by the CRC table */
} qrl_wsync_header;

/* Number of buckets of a stream: ceil(total / bucket_bytes) (0 for an empty stream).
 * bucket_bytes must be >= 1 (QRL_CHECK). */
uint32_t qrl_wsync_bucket_count(uint64_t total, uint64_t bucket_bytes);
/* Bucket i's byte range [*off, *off + *size) in the stream; i < bucket_count (QRL_CHECK). */
void qrl_wsync_bucket_range(uint64_t total, uint64_t bucket_bytes, uint32_t i, uint64_t *off,
                            uint64_t *size);
/* CRC-32C of each bucket into crc[bucket_count] (caller-owned). */
void qrl_wsync_bucket_crcs(const uint8_t *stream, uint64_t total, uint64_t bucket_bytes, uint32_t *crc);

void qrl_wsync_header_encode(const qrl_wsync_header *h, uint8_t out[QRL_WSYNC_HEADER_BYTES]);
/* Decode and check a header: magic and header CRC (CORRUPT), format (UNSUPPORTED),
 * bucket_bytes >= 1 and bucket_count == ceil(total/bucket_bytes) (CORRUPT), manifest_len in
 * 1..QRL_WSYNC_MAX_MANIFEST, total_bytes <= max_total (OUT_OF_RANGE).  Errors name the field. */
qrl_status qrl_wsync_header_decode(const uint8_t in[QRL_WSYNC_HEADER_BYTES], uint64_t max_total,
                                   qrl_wsync_header *h, qrl_error *err);
/* Bytes of the preamble: manifest_len + 4 * bucket_count. */
size_t qrl_wsync_preamble_len(const qrl_wsync_header *h);
/* Build a transfer's preamble: manifest bytes then crc[] (u32 LE each) into a malloc'd
 * buffer *out (caller frees) and fill the header's manifest_len and preamble_crc.  The
 * header's other fields must be set.  Errors: NOMEM, OUT_OF_RANGE (manifest too large). */
qrl_status qrl_wsync_preamble_build(qrl_wsync_header *h, const uint8_t *manifest, size_t manifest_len,
                                    const uint32_t *crc, uint8_t **out, size_t *out_len, qrl_error *err);
/* Check a received preamble against its header: preamble CRC (CORRUPT); the manifest decodes
 * (qrl_wire_decode) and validates (qrl_wire_weight_manifest_validate); its version,
 * total_bytes, bucket_bytes and bucket_count equal the header's (CORRUPT naming the field).
 * On success *mf is the decoded manifest (qrl_wire_free) and crc[bucket_count] (caller's,
 * sized from the header) holds the bucket CRCs. */
qrl_status qrl_wsync_preamble_parse(const qrl_wsync_header *h, const uint8_t *pre,
                                    Qrl__WeightManifest **mf, uint32_t *crc, qrl_error *err);

/* The checks a receiver runs on a complete stream before using it (TCP and NCCL alike):
 * every tensor inside the stream (CORRUPT), and when the manifest's algorithm is CRC-32C,
 * with bucket_crc (the sender's per-bucket CRCs, manifest.bucket_count of them; NULL when
 * the transport checked buckets already) each bucket's ("bucket I CRC-32C mismatch"), the
 * whole stream's ("whole-stream CRC-32C mismatch"; folded from the bucket CRCs when given,
 * so no second pass) and each tensor's ("tensor 'NAME' CRC-32C mismatch").  Buckets and
 * tensors are checked in parallel (OpenMP).  `total` is the stream's length. */
qrl_status qrl_wsync_verify_stream(const Qrl__WeightManifest *mf, const uint8_t *stream, uint64_t total,
                                   const uint32_t *bucket_crc, qrl_error *err);
/* CRC-32C of A||B from crc(A), crc(B) and |B| (zlib's crc32_combine for the Castagnoli
 * polynomial). */
uint32_t qrl_wsync_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* One tensor for qrl_wsync_manifest_encode. */
typedef struct qrl_wsync_tensor {
    const char *name;
    const char *dtype;       /* "BF16" or "F32" */
    uint64_t shape[2];
    int ndim;                /* 1 or 2 */
} qrl_wsync_tensor;

/* Encode the manifest of `stream` (tensors laid out back to back in table order, each
 * numel * dtype size bytes, `total` bytes in all): per-tensor and whole CRC-32C, the bucket
 * plan, the version (also `step`) and sync epoch.  *out is malloc'd (caller frees).
 * Errors: INVALID_ARGUMENT (sizes do not add up to total, dtype), NOMEM. */
qrl_status qrl_wsync_manifest_encode(const qrl_wsync_tensor *t, size_t n, const uint8_t *stream,
                                     uint64_t total, uint64_t version, uint64_t sync_epoch,
                                     uint64_t bucket_bytes, uint8_t **out, size_t *out_len,
                                     qrl_error *err);

/* As qrl_wsync_manifest_encode, with the checksums computed elsewhere (on the device):
 * stream NULL, tensor_crc[n] and whole_crc (CRC-32C of the whole stream) given instead.
 * With stream non-NULL the CRCs are computed from it and tensor_crc/whole_crc ignored. */
qrl_status qrl_wsync_manifest_encode_crcs(const qrl_wsync_tensor *t, size_t n, const uint8_t *stream,
                                          const uint32_t *tensor_crc, uint32_t whole_crc, uint64_t total,
                                          uint64_t version, uint64_t sync_epoch, uint64_t bucket_bytes,
                                          uint8_t **out, size_t *out_len, qrl_error *err);
/* CRC-32C of the whole stream folded from its bucket CRCs (crc32c_combine; no data pass). */
uint32_t qrl_wsync_whole_crc(uint64_t total, uint64_t bucket_bytes, const uint32_t *bucket_crc);
/* qrl_wsync_verify_stream's checks on checksums a receiver computed elsewhere (the device):
 * bucket_got[i] against the sender's bucket_sent[i] (manifest.bucket_count of each), the
 * whole stream (folded from bucket_got) and tensor_got[i] against each TensorMeta.checksum;
 * tensors inside `total`.  CORRUPT naming the first bucket / tensor that differs. */
qrl_status qrl_wsync_check_crcs(const Qrl__WeightManifest *mf, uint64_t total, const uint32_t *bucket_sent,
                                const uint32_t *bucket_got, const uint32_t *tensor_got, qrl_error *err);

/* ---- transport choice (learner `weights.transport`) ----------------------------------- */

typedef enum qrl_wsync_mode {
    QRL_WSYNC_MODE_TCP = 0,
    QRL_WSYNC_MODE_NCCL,
    QRL_WSYNC_MODE_AUTO,
} qrl_wsync_mode;

/* "tcp" | "nccl" | "auto"; INVALID_ARGUMENT naming weights.transport otherwise. */
qrl_status qrl_wsync_mode_parse(const char *s, qrl_wsync_mode *out, qrl_error *err);
/* Whether a sync group uses NCCL: tcp never; nccl always (the learner refuses replicas that
 * cannot, and refuses to start without a GPU); auto when the learner has a GPU with NCCL
 * and there is at least one replica and every one of the n replicas advertised NCCL. */
bool qrl_wsync_use_nccl(qrl_wsync_mode mode, bool learner_nccl, const bool *replica_nccl, size_t n);

#endif
