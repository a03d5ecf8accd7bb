/* The weight path on the device (issue 18; docs/weight-sync.md "CUDA IPC").
 *
 * Learner and replica on one node: the learner casts its F32 master parameters to BF16
 * straight into a device slot, computes every checksum there (kernels/cuda/crc32c.cuh),
 * and hands the slot to replicas as a CUDA IPC handle in the VersionEvent.  A replica maps
 * the slot, copies the stream device-to-device into its own staging buffer, checks it on
 * its device and swaps it into its engine at the next step boundary (the quantization to
 * its rollout format also runs on its GPU).  No byte crosses PCIe.
 *
 * A slot is one cudaMalloc'd buffer (exported once; a larger model makes a new one):
 *   [0, 64)                         qrl_wsync_header (wsync.h layout; sync_epoch 0)
 *   [256, 256 + total)              the stream: every tensor BF16, manifest order
 *   [256 + up256(total), + pre)     preamble: encoded WeightManifest, then the bucket CRCs
 * The header is written last.  The learner keeps two slots and alternates (version v in
 * slot v % 2): a replica copies version v while v + 1 is written into the other slot.  A
 * replica still copying when v + 2 overwrites its slot sees a different header version
 * after the copy (BUSY: take the newer announcement) or checksums that do not match
 * (CORRUPT); a version is used only when complete and verified, as with TCP and NCCL.
 *
 * Built without CUDA every call returns UNSUPPORTED. */
#ifndef QRL_WEIGHTS_WIPC_H
#define QRL_WEIGHTS_WIPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"
#include "weights/wsync.h"

struct qrl_model;

#define QRL_WIPC_HANDLE_BYTES 64  /* sizeof(cudaIpcMemHandle_t) */
#define QRL_WIPC_STREAM_OFFSET 256
#define QRL_WIPC_NODE_ID_MAX 160

/* Byte offset of the preamble in a slot holding a stream of `total` bytes. */
static inline uint64_t qrl_wipc_preamble_offset(uint64_t total) {
    return QRL_WIPC_STREAM_OFFSET + ((total + 255) & ~(uint64_t)255);
}

/* This node's identity for "same node" decisions: "<hostname>/<boot id>" (the boot id from
 * /proc/sys/kernel/random/boot_id, so two containers with one hostname on different
 * machines differ).  Writes a NUL-terminated string of at most QRL_WIPC_NODE_ID_MAX - 1
 * bytes; "" when this build has no CUDA or no device is visible (no CUDA IPC then). */
void qrl_wipc_node_id(char out[QRL_WIPC_NODE_ID_MAX]);

/* ---- learner side ---------------------------------------------------------------------- */

typedef struct qrl_wipc_sender qrl_wipc_sender; /* opaque; one thread publishes */

/* A sender on CUDA device `device` (slots are allocated at the first publish).  *out freed
 * with qrl_wipc_sender_free.  Errors: UNSUPPORTED (no CUDA), CUDA, NOMEM. */
qrl_status qrl_wipc_sender_new(int device, qrl_wipc_sender **out, qrl_error *err);
void qrl_wipc_sender_free(qrl_wipc_sender *s);

typedef struct qrl_wipc_published {
    uint8_t handle[QRL_WIPC_HANDLE_BYTES]; /* the slot's cudaIpcMemHandle_t */
    uint8_t *manifest;      /* encoded WeightManifest (malloc'd; the caller frees) */
    size_t manifest_len;
    uint32_t *bucket_crc;   /* the manifest's bucket_count CRC-32C (malloc'd; the caller frees) */
    uint64_t total;         /* stream bytes */
    double cast_s, crc_s;   /* F32 -> BF16 into the slot; checksums on the device */
} qrl_wipc_published;

/* Publish `version`: tensor i (t[i], dtype "BF16", numel shape[0] * shape[1]) is cast from
 * the device F32 array src[i] (round to nearest even, as the host snapshot) into the next
 * slot; bucket and tensor CRC-32C are computed on the device; manifest, CRC table and
 * header are written.  Returns once the slot is complete (the device synchronized).
 * Errors: INVALID_ARGUMENT (dtype, bucket_bytes 0), CUDA, NOMEM. */
qrl_status qrl_wipc_publish(qrl_wipc_sender *s, const qrl_wsync_tensor *t, const float *const *src, size_t n,
                            uint64_t version, uint64_t bucket_bytes, qrl_wipc_published *out, qrl_error *err);
/* The publish table of model `m` whose F32 parameters sit on the device at `params` in the
 * layout of m's host arena (the training engine's device copy): (*t)[i] = {name, "BF16",
 * shape, ndim} and (*src)[i] = params + (tensor i's offset in the arena), for i <
 * m->n_tensors, in the model's tensor order (the order every receiver expects).  Both arrays
 * are malloc'd for the caller to free; names are borrowed from m.  Errors: NOMEM. */
qrl_status qrl_wipc_model_table(const struct qrl_model *m, const float *params, qrl_wsync_tensor **t,
                                const float ***src, qrl_error *err);
/* Copy version `version`'s stream (total bytes) from its slot into host memory (the TCP
 * fallback for replicas on other nodes; any thread, excluded from the slot's rewrite).
 * Errors: NOT_FOUND (neither slot holds that version any more), CUDA. */
qrl_status qrl_wipc_read_host(qrl_wipc_sender *s, uint64_t version, uint8_t *host, uint64_t total,
                              qrl_error *err);

/* The device and stream of version `version`'s slot, held against rewriting until
 * qrl_wipc_slot_release (the NCCL broadcast reads it in place).  NULL when neither slot
 * holds that version any more.  *device: the sender's CUDA device. */
const uint8_t *qrl_wipc_slot_acquire(qrl_wipc_sender *s, uint64_t version, uint64_t *total, int *device);
void qrl_wipc_slot_release(qrl_wipc_sender *s, uint64_t version);

/* ---- replica side ---------------------------------------------------------------------- */

typedef struct qrl_wipc_receiver qrl_wipc_receiver; /* opaque; one thread at a time */

/* A receiver on CUDA device `device`.  Errors: UNSUPPORTED, CUDA, NOMEM. */
qrl_status qrl_wipc_receiver_new(int device, qrl_wipc_receiver **out, qrl_error *err);
/* Close every mapped handle and free the staging buffer; NULL is a no-op. */
void qrl_wipc_receiver_free(qrl_wipc_receiver *r);

typedef struct qrl_wipc_received {
    Qrl__WeightManifest *mf;  /* decoded and validated (qrl_wire_free) */
    const uint8_t *stream;    /* device: the verified stream in the receiver's staging
                                 buffer, valid until the next receive */
    uint64_t total;
    double map_s, copy_s, verify_s;
} qrl_wipc_received;

/* Receive `version` from the slot of `handle`: map it (cached), read and check header and
 * preamble (wsync.h checks; total <= max_total), copy the stream device-to-device into the
 * staging buffer, check the header again, then every bucket, the whole stream and every
 * tensor on the device (qrl_wsync_check_crcs).  Errors: INVALID_ARGUMENT (handle length),
 * BUSY (the slot holds another version: overwritten by a newer one), CORRUPT (checks),
 * OUT_OF_RANGE, CUDA (mapping: e.g. another node's handle), NOMEM. */
qrl_status qrl_wipc_receive(qrl_wipc_receiver *r, const uint8_t *handle, size_t handle_len, uint64_t version,
                            uint64_t max_total, qrl_wipc_received *out, qrl_error *err);

/* Copy the stream of the last successful receive (out->total bytes) to host memory: the
 * host path for engines that quantize on the CPU (w4a16).  Errors: CUDA. */
qrl_status qrl_wipc_receiver_download(qrl_wipc_receiver *r, uint8_t *host, uint64_t total, qrl_error *err);

/* Tests and fault injection: XOR `mask` into byte `offset` of the stream held in the slot of
 * `version` (the learner side, after publish).  Errors: NOT_FOUND, OUT_OF_RANGE, CUDA. */
qrl_status qrl_wipc_sender_corrupt(qrl_wipc_sender *s, uint64_t version, uint64_t offset, uint8_t mask,
                                   qrl_error *err);

#endif
