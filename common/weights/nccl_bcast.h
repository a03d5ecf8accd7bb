/* NCCL weight broadcast (SPEC §8 "Weight sync"; docs/weight-sync.md).
 *
 * The learner is rank 0 of a sync group; replicas are ranks 1..world-1, one GPU each.  A
 * communicator lives for one membership epoch: when membership changes the learner makes a
 * fresh unique id (qrl_nccl_unique_id), hands it out in VersionEvents (nccl_unique_id,
 * rank, world_size, sync_epoch) and every member destroys its old communicator and joins
 * the new one.  One version moves as header, preamble (manifest + bucket CRCs) and the
 * BF16 stream in buckets of bucket_bytes (wsync.h), each through a double-buffered device
 * staging area: the copy of bucket i+1 (H2D on the root, D2H on receivers) overlaps the
 * broadcast of bucket i.  Receivers then check every bucket against the sender's CRC table,
 * the whole stream and every tensor (qrl_wsync_verify_stream, in parallel on the CPU).
 *
 * Nothing here can hang: the communicator is non-blocking (ncclConfig_t.blocking = 0) and
 * every wait polls ncclCommGetAsyncError with a deadline; on a timeout or a NCCL error the
 * communicator is aborted (ncclCommAbort), the call returns TIMEOUT or NETWORK, and the
 * communicator is dead (qrl_nccl_comm_ok false): destroy it and join the next epoch.
 * A receiver that finds a corrupt bucket or preamble keeps taking part in the remaining
 * broadcasts (the collective stays matched), then refuses the version (CORRUPT); the
 * communicator stays usable for the next attempt.
 *
 * Built without CUDA (QRL_HAVE_CUDA unset) or run without a GPU, every call that needs the
 * GPU returns UNSUPPORTED.  A communicator is used by one thread at a time. */
#ifndef QRL_WEIGHTS_NCCL_BCAST_H
#define QRL_WEIGHTS_NCCL_BCAST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"

#define QRL_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

typedef struct qrl_nccl_comm qrl_nccl_comm_t;

/* True when this build has CUDA and NCCL and at least one CUDA device is visible: what a
 * replica advertises as its NCCL capability (ReplicaInfo.nccl). */
bool qrl_nccl_available(void);

/* A fresh ncclUniqueId for a new epoch, made by rank 0 (it starts NCCL's bootstrap listener
 * in this process, which must stay up until every rank has joined).  Errors: UNSUPPORTED
 * (no CUDA/NCCL), NETWORK (ncclGetUniqueId failed). */
qrl_status qrl_nccl_unique_id(uint8_t id[QRL_NCCL_ID_BYTES], qrl_error *err);

/* Join the communicator of `id` as `rank` of `world` (2 <= world, rank < world) on CUDA
 * device `device`, for membership epoch `epoch`.  Waits at most timeout_ms for every rank
 * to join; on timeout the half-made communicator is aborted and TIMEOUT returned (a rank
 * that never comes never hangs the others).  Errors: INVALID_ARGUMENT, UNSUPPORTED, CUDA
 * (device, allocation), NETWORK (NCCL error), TIMEOUT.  *out is freed with
 * qrl_nccl_comm_destroy. */
qrl_status qrl_nccl_comm_init(const uint8_t id[QRL_NCCL_ID_BYTES], uint64_t epoch, int rank, int world,
                              int device, int timeout_ms, qrl_nccl_comm_t **out, qrl_error *err);
/* Finalize (bounded by 5 s, then abort) or abort a dead one, and free everything.  NULL ok. */
void qrl_nccl_comm_destroy(qrl_nccl_comm_t *c);
/* False once a call timed out or NCCL failed: the communicator was aborted. */
bool qrl_nccl_comm_ok(const qrl_nccl_comm_t *c);
int qrl_nccl_comm_rank(const qrl_nccl_comm_t *c);
int qrl_nccl_comm_world(const qrl_nccl_comm_t *c);
uint64_t qrl_nccl_comm_epoch(const qrl_nccl_comm_t *c);

/* Rank 0: broadcast one version.  `manifest` is the encoded WeightManifest of `stream`
 * (`total` bytes, cut into the manifest's bucket_bytes buckets); bucket_crc[bucket_count]
 * the CRC-32C of each bucket (qrl_wsync_bucket_crcs; the caller keeps it with the snapshot;
 * NULL: computed here).
 * `stream` may be pageable or page-locked (qrl_nccl_host_alloc): pageable memory goes through
 * two page-locked bounce buffers.  Returns when every bucket has left this GPU; at most
 * timeout_ms.  Errors: INVALID_ARGUMENT (not rank 0, manifest does not decode), UNSUPPORTED,
 * NOMEM, CUDA, NETWORK, TIMEOUT (the last three leave the communicator dead). */
qrl_status qrl_nccl_bcast_send(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                               const uint8_t *stream, uint64_t total, const uint32_t *bucket_crc,
                               int timeout_ms, qrl_error *err);

/* Rank 0, the device path (issue 18): as qrl_nccl_bcast_send with the stream already in
 * device memory on the communicator's device (d_stream, e.g. the learner's CUDA IPC slot,
 * weights/wipc.h) and its bucket CRCs given: each bucket is broadcast straight from
 * d_stream, no staging and no host copy.  Errors as qrl_nccl_bcast_send. */
qrl_status qrl_nccl_bcast_send_device(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                                      const uint8_t *d_stream, uint64_t total, const uint32_t *bucket_crc,
                                      int timeout_ms, qrl_error *err);
/* Rank > 0, the device path: receive the next version straight into device memory d_dst
 * (cap bytes on the communicator's device) and verify it there (every bucket against the
 * sender's table, the whole stream and every tensor: kernels/cuda/crc32c.cuh and
 * qrl_wsync_check_crcs).  *mf: the decoded manifest (qrl_wire_free) on success.  Errors as
 * qrl_nccl_bcast_recv, plus OUT_OF_RANGE for a stream larger than cap (the transfer is
 * still followed, so the communicator stays usable). */
qrl_status qrl_nccl_bcast_recv_device(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                                      uint8_t *d_dst, uint64_t cap, int timeout_ms, Qrl__WeightManifest **mf,
                                      qrl_error *err);

/* A version received and verified. */
typedef struct qrl_nccl_version {
    Qrl__WeightManifest *manifest; /* decoded (qrl_wire_free via qrl_nccl_version_free) */
    uint8_t *stream;               /* total bytes, page-locked */
    uint64_t total;
    uint64_t version, sync_epoch;
    double wait_s;                 /* from the call until the header arrived */
    double xfer_s;                 /* header to last bucket on the host, bucket CRCs checked */
    double verify_s;               /* whole-stream and per-tensor checks */
    size_t stream_cap;             /* bytes allocated at stream (>= total) */
} qrl_nccl_version;

/* Rank > 0: receive the next version.  expect_version: the version announced in the
 * VersionEvent (0 accepts any).  max_total bounds the stream's size.  Verification is the
 * TCP receiver's (qrl_wsync_verify_stream): each bucket's CRC-32C against the preamble's
 * table, the whole stream's and every tensor's; a version is returned only when complete
 * and verified.  Errors: CORRUPT (a bucket, the preamble, a tensor or the whole
 * stream; the communicator stays usable), OUT_OF_RANGE / UNSUPPORTED / CORRUPT in the header
 * (the header cannot be skipped: the communicator is aborted), NOMEM, CUDA, NETWORK,
 * TIMEOUT.  *out is filled on success only; free with qrl_nccl_version_free. */
qrl_status qrl_nccl_bcast_recv(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                               int timeout_ms, qrl_nccl_version *out, qrl_error *err);
void qrl_nccl_version_free(qrl_nccl_version *v);
/* Free v but keep its page-locked stream in c for the next receive (page-locking a model's
 * worth of memory per version costs more than the transfer); c may be NULL (= free). */
void qrl_nccl_version_recycle(qrl_nccl_comm_t *c, qrl_nccl_version *v);

/* Page-locked host memory (malloc without CUDA or when pinning fails); free with
 * qrl_nccl_host_free.  A snapshot built there skips the bounce copy. */
void *qrl_nccl_host_alloc(size_t bytes);
void qrl_nccl_host_free(void *p);

/* A device buffer of `bytes` on CUDA device `device` for qrl_nccl_bcast_recv_device (the
 * calling thread's device is set to it).  *out freed with qrl_nccl_device_free (NULL is a
 * no-op).  Errors: CUDA (no such device, out of memory), UNSUPPORTED (a build without CUDA). */
qrl_status qrl_nccl_device_alloc(int device, uint64_t bytes, uint8_t **out, qrl_error *err);
void qrl_nccl_device_free(uint8_t *p);

#endif
