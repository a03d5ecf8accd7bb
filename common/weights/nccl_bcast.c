/* NCCL weight broadcast (nccl_bcast.h; docs/weight-sync.md).  The CUDA/NCCL half is compiled
 * only with QRL_HAVE_CUDA (the Makefile defines it and links -lnccl -lcudart when nvcc is
 * found); without it every entry point answers UNSUPPORTED. */
#include "weights/nccl_bcast.h"

#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"
#include "weights/wsync.h"

#if QRL_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "cuda/crc32c.cuh"

#define INIT_STAGING ((size_t)64 << 10)

struct qrl_nccl_comm {
    ncclComm_t comm;
    bool dead;
    int rank, world, device;
    uint64_t epoch;
    cudaStream_t ns, cs;          /* broadcasts; host<->device copies */
    cudaEvent_t copied[2], bcast[2];
    void *dev[2];                 /* staging slots */
    void *bounce[2];              /* page-locked bounce slots (pageable sources/targets) */
    size_t slot_bytes;
    uint8_t *spare;               /* a recycled receive stream (page-locked), spare_bytes long */
    size_t spare_bytes;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_after(int timeout_ms) { return now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000ull; }

static qrl_status cuda_fail(cudaError_t e, const char *what, qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_CUDA, "nccl weight sync: %s: %s", what, cudaGetErrorString(e));
}
#define CU(call, what)                                                    \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) return cuda_fail(e_, what, err);           \
    } while (0)

static void comm_kill(qrl_nccl_comm_t *c) {
    if (c->comm && !c->dead) ncclCommAbort(c->comm);
    c->dead = true;
}

static qrl_status nccl_fail(qrl_nccl_comm_t *c, ncclResult_t r, const char *what, qrl_error *err) {
    const char *last = c->comm ? ncclGetLastError(c->comm) : "";
    qrl_error_set(err, QRL_STATUS_NETWORK, "nccl weight sync (epoch %llu, rank %d/%d): %s: %s%s%s",
                  (unsigned long long)c->epoch, c->rank, c->world, what, ncclGetErrorString(r),
                  last && *last ? ": " : "", last ? last : "");
    comm_kill(c);
    return QRL_STATUS_NETWORK;
}

static qrl_status timed_out(qrl_nccl_comm_t *c, const char *what, qrl_error *err) {
    comm_kill(c);
    return qrl_error_set(err, QRL_STATUS_TIMEOUT, "nccl weight sync (epoch %llu, rank %d/%d): %s timed out; "
                         "communicator aborted", (unsigned long long)c->epoch, c->rank, c->world, what);
}

/* After a non-blocking NCCL call: wait until it is enqueued (ncclInProgress -> Success). */
static qrl_status nccl_settle(qrl_nccl_comm_t *c, ncclResult_t r, uint64_t deadline, const char *what,
                              qrl_error *err) {
    while (r == ncclInProgress) {
        if (now_ns() > deadline) return timed_out(c, what, err);
        usleep(100);
        if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) return nccl_fail(c, r, what, err);
    return QRL_OK;
}

/* Poll an event until done, watching the communicator's async error and the deadline. */
static qrl_status wait_event(qrl_nccl_comm_t *c, cudaEvent_t ev, uint64_t deadline, const char *what,
                             qrl_error *err) {
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return QRL_OK;
        if (e != cudaErrorNotReady) {
            comm_kill(c);
            return cuda_fail(e, what, err);
        }
        ncclResult_t a = ncclSuccess;
        ncclCommGetAsyncError(c->comm, &a);
        if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(c, a, what, err);
        if (now_ns() > deadline) return timed_out(c, what, err);
        if (spin > 64) usleep(20);
    }
}

static void staging_free(qrl_nccl_comm_t *c) {
    for (int s = 0; s < 2; s++) {
        if (c->dev[s]) cudaFree(c->dev[s]);
        if (c->bounce[s]) cudaFreeHost(c->bounce[s]);
        c->dev[s] = c->bounce[s] = NULL;
    }
    c->slot_bytes = 0;
}

static qrl_status staging_ensure(qrl_nccl_comm_t *c, size_t bytes, qrl_error *err) {
    if (c->slot_bytes >= bytes) return QRL_OK;
    staging_free(c);
    for (int s = 0; s < 2; s++) {
        CU(cudaMalloc(&c->dev[s], bytes), "staging cudaMalloc");
        CU(cudaMallocHost(&c->bounce[s], bytes), "bounce cudaMallocHost");
    }
    c->slot_bytes = bytes;
    return QRL_OK;
}

static bool is_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

/* Move `len` bytes from rank 0's buf to every receiver's buf (NULL on a receiver: drain,
 * keeping the collective matched) in chunks of `chunk` bytes through the two staging slots.
 * Root: the H2D of chunk i+1 (stream cs; with pageable memory also the bounce memcpy on the
 * CPU) overlaps the broadcast of chunk i (stream ns).  Receivers: the broadcast of chunk
 * i+1 overlaps the D2H of chunk i (and the bounce memcpy of chunk i-1). */
static qrl_status pipe_bytes_(qrl_nccl_comm_t *c, uint8_t *buf, uint64_t len, uint64_t chunk, uint64_t deadline,
                              qrl_error *err) {
    QRL_TRY(staging_ensure(c, chunk, err));
    bool root = c->rank == 0, pinned = buf && is_pinned(buf);
    uint32_t n = qrl_wsync_bucket_count(len, chunk);
    for (uint32_t i = 0; i <= n; i++) {
        if (i < n) {
            int s = (int)(i & 1);
            uint64_t off, size;
            qrl_wsync_bucket_range(len, chunk, i, &off, &size);
            if (root) {
                const void *src = buf + off;
                if (!pinned) { /* the bounce slot is free once chunk i-2's H2D finished */
                    if (i >= 2) QRL_TRY(wait_event(c, c->copied[s], deadline, "bounce slot", err));
                    memcpy(c->bounce[s], src, size);
                    src = c->bounce[s];
                }
                if (i >= 2) CU(cudaStreamWaitEvent(c->cs, c->bcast[s], 0), "wait broadcast");
                CU(cudaMemcpyAsync(c->dev[s], src, size, cudaMemcpyHostToDevice, c->cs), "H2D");
                CU(cudaEventRecord(c->copied[s], c->cs), "event");
                CU(cudaStreamWaitEvent(c->ns, c->copied[s], 0), "wait H2D");
            } else if (i >= 2) {
                CU(cudaStreamWaitEvent(c->ns, c->copied[s], 0), "wait D2H");
            }
            QRL_TRY(nccl_settle(c, ncclBroadcast(c->dev[s], c->dev[s], size, ncclUint8, 0, c->comm, c->ns),
                                deadline, "ncclBroadcast", err));
            CU(cudaEventRecord(c->bcast[s], c->ns), "event");
            if (!root && buf) {
                CU(cudaStreamWaitEvent(c->cs, c->bcast[s], 0), "wait broadcast");
                CU(cudaMemcpyAsync(pinned ? buf + off : c->bounce[s], c->dev[s], size, cudaMemcpyDeviceToHost,
                                   c->cs), "D2H");
                CU(cudaEventRecord(c->copied[s], c->cs), "event");
            }
        }
        if (!root && buf && i >= 1) { /* chunk i-1 has landed (or is landing): finish it on the CPU */
            int s = (int)((i - 1) & 1);
            uint64_t off, size;
            qrl_wsync_bucket_range(len, chunk, i - 1, &off, &size);
            QRL_TRY(wait_event(c, c->copied[s], deadline, "D2H", err));
            if (!pinned) memcpy(buf + off, c->bounce[s], size);
        }
    }
    if (n) QRL_TRY(wait_event(c, c->bcast[(n - 1) & 1], deadline, "last broadcast", err));
    return QRL_OK;
}

/* A failure half-way leaves the ranks' broadcasts unmatched: the communicator cannot be
 * trusted any more, so it is aborted whatever failed. */
static qrl_status pipe_bytes(qrl_nccl_comm_t *c, uint8_t *buf, uint64_t len, uint64_t chunk, uint64_t deadline,
                             qrl_error *err) {
    qrl_status st = pipe_bytes_(c, buf, len, chunk, deadline, err);
    if (st != QRL_OK) comm_kill(c);
    return st;
}

bool qrl_nccl_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return n > 0;
}

static qrl_status need_gpu(qrl_error *err) {
    if (!qrl_nccl_available())
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "nccl weight sync: no CUDA device visible");
    return QRL_OK;
}

qrl_status qrl_nccl_unique_id(uint8_t id[QRL_NCCL_ID_BYTES], qrl_error *err) {
    _Static_assert(sizeof(ncclUniqueId) == QRL_NCCL_ID_BYTES, "ncclUniqueId size");
    QRL_TRY(need_gpu(err));
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return qrl_error_set(err, QRL_STATUS_NETWORK, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, u.internal, QRL_NCCL_ID_BYTES);
    return QRL_OK;
}

qrl_status qrl_nccl_comm_init(const uint8_t id[QRL_NCCL_ID_BYTES], uint64_t epoch, int rank, int world,
                              int device, int timeout_ms, qrl_nccl_comm_t **out, qrl_error *err) {
    *out = NULL;
    if (world < 2 || rank < 0 || rank >= world || device < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: rank %d of world %d on "
                             "device %d", rank, world, device);
    QRL_TRY(need_gpu(err));
    CU(cudaSetDevice(device), "cudaSetDevice");
    qrl_nccl_comm_t *c = calloc(1, sizeof *c);
    if (!c) return qrl_error_set(err, QRL_STATUS_NOMEM, "nccl communicator");
    *c = (qrl_nccl_comm_t){.rank = rank, .world = world, .device = device, .epoch = epoch};
    qrl_status st = QRL_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&c->ns, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->cs, cudaStreamNonBlocking);
    for (int s = 0; s < 2 && e == cudaSuccess; s++) {
        e = cudaEventCreateWithFlags(&c->copied[s], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->bcast[s], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        st = cuda_fail(e, "streams/events", err);
        goto fail;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, QRL_NCCL_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    uint64_t deadline = deadline_after(timeout_ms);
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        st = nccl_fail(c, r, "ncclCommInitRankConfig", err);
        goto fail;
    }
    st = nccl_settle(c, r, deadline, "joining the communicator", err);
    if (st != QRL_OK) goto fail;
    st = staging_ensure(c, INIT_STAGING, err);
    if (st != QRL_OK) goto fail;
    QRL_LOG_INFO("weights", "nccl communicator joined epoch=%llu rank=%d world=%d device=%d",
                 (unsigned long long)epoch, rank, world, device);
    *out = c;
    return QRL_OK;
fail:
    qrl_nccl_comm_destroy(c);
    return st;
}

void qrl_nccl_comm_destroy(qrl_nccl_comm_t *c) {
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->comm && !c->dead) {
        uint64_t deadline = deadline_after(5000);
        ncclResult_t r = ncclCommFinalize(c->comm);
        while (r == ncclInProgress && now_ns() < deadline) {
            usleep(200);
            ncclCommGetAsyncError(c->comm, &r);
        }
        if (r == ncclSuccess) ncclCommDestroy(c->comm);
        else ncclCommAbort(c->comm);
    } else if (c->comm && c->dead) {
        /* aborted already */
    }
    if (!c->dead) { /* buffers may still be read by an aborted kernel otherwise: sync first */
        if (c->ns) cudaStreamSynchronize(c->ns);
        if (c->cs) cudaStreamSynchronize(c->cs);
    }
    staging_free(c);
    qrl_nccl_host_free(c->spare);
    for (int s = 0; s < 2; s++) {
        if (c->copied[s]) cudaEventDestroy(c->copied[s]);
        if (c->bcast[s]) cudaEventDestroy(c->bcast[s]);
    }
    if (c->ns) cudaStreamDestroy(c->ns);
    if (c->cs) cudaStreamDestroy(c->cs);
    free(c);
}

bool qrl_nccl_comm_ok(const qrl_nccl_comm_t *c) { return c && c->comm && !c->dead; }
int qrl_nccl_comm_rank(const qrl_nccl_comm_t *c) { return c->rank; }
int qrl_nccl_comm_world(const qrl_nccl_comm_t *c) { return c->world; }
uint64_t qrl_nccl_comm_epoch(const qrl_nccl_comm_t *c) { return c->epoch; }

static qrl_status check_live(qrl_nccl_comm_t *c, qrl_error *err) {
    if (!qrl_nccl_comm_ok(c))
        return qrl_error_set(err, QRL_STATUS_NETWORK, "nccl weight sync: communicator of epoch %llu was "
                             "aborted; join a new epoch", c ? (unsigned long long)c->epoch : 0ull);
    CU(cudaSetDevice(c->device), "cudaSetDevice");
    return QRL_OK;
}

/* Rank 0: the transfer header of a send, from the manifest it carries (which must describe
 * a stream of `total` bytes). */
static qrl_status send_header(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len, uint64_t total,
                              qrl_wsync_header *h, qrl_error *err) {
    Qrl__WeightManifest *mf = NULL;
    QRL_TRY(qrl_wire_decode(&qrl__weight_manifest__descriptor, manifest, manifest_len, QRL_WSYNC_MAX_MANIFEST,
                            (ProtobufCMessage **)&mf, err));
    *h = (qrl_wsync_header){.sync_epoch = c->epoch, .version = mf->version, .total_bytes = mf->total_bytes,
                            .bucket_bytes = mf->bucket_bytes, .bucket_count = mf->bucket_count};
    bool fits = mf->total_bytes == total && mf->bucket_bytes >= 1 &&
                mf->bucket_count == qrl_wsync_bucket_count(total, mf->bucket_bytes);
    qrl_wire_free(&mf->base);
    if (!fits)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: manifest does not describe "
                             "a %llu-byte stream", (unsigned long long)total);
    return QRL_OK;
}

/* Receivers: the transfer header, checked; without a trusted header the rest cannot be
 * followed, so a bad one aborts the communicator. */
static qrl_status recv_header(qrl_nccl_comm_t *c, uint64_t max_total, uint64_t deadline, qrl_wsync_header *h,
                              qrl_error *err) {
    uint8_t hb[QRL_WSYNC_HEADER_BYTES];
    QRL_TRY(pipe_bytes(c, hb, sizeof hb, sizeof hb, deadline, err));
    qrl_status st = qrl_wsync_header_decode(hb, max_total, h, err);
    if (st == QRL_OK && h->sync_epoch != c->epoch)
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync header: epoch %llu on a communicator of "
                           "epoch %llu", (unsigned long long)h->sync_epoch, (unsigned long long)c->epoch);
    if (st != QRL_OK) comm_kill(c);
    return st;
}

qrl_status qrl_nccl_bcast_send(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                               const uint8_t *stream, uint64_t total, const uint32_t *bucket_crc,
                               int timeout_ms, qrl_error *err) {
    QRL_TRY(check_live(c, err));
    if (c->rank != 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: rank %d cannot send", c->rank);
    qrl_wsync_header h;
    QRL_TRY(send_header(c, manifest, manifest_len, total, &h, err));
    uint8_t *pre = NULL, hb[QRL_WSYNC_HEADER_BYTES];
    size_t pre_len;
    uint32_t *own_crc = NULL;
    if (!bucket_crc) { /* the caller did not keep them: one pass here */
        own_crc = malloc(((size_t)h.bucket_count + 1) * sizeof *own_crc);
        if (!own_crc) return qrl_error_set(err, QRL_STATUS_NOMEM, "nccl weight sync: bucket CRCs");
        qrl_wsync_bucket_crcs(stream, total, h.bucket_bytes, own_crc);
        bucket_crc = own_crc;
    }
    qrl_status st = qrl_wsync_preamble_build(&h, manifest, manifest_len, bucket_crc, &pre, &pre_len, err);
    free(own_crc);
    if (st != QRL_OK) return st;
    qrl_wsync_header_encode(&h, hb);
    uint64_t deadline = deadline_after(timeout_ms);
    QRL_TRY_GOTO(pipe_bytes(c, hb, sizeof hb, sizeof hb, deadline, err), done);
    QRL_TRY_GOTO(pipe_bytes(c, pre, pre_len, h.bucket_bytes, deadline, err), done);
    QRL_TRY_GOTO(pipe_bytes(c, (uint8_t *)stream, total, h.bucket_bytes, deadline, err), done);
    st = QRL_OK;
done:
    free(pre);
    return st;
}

/* The device path's stream: every bucket broadcast in place from / into device memory d
 * (NULL on a receiver: drained through staging slot 0, keeping the collective matched). */
static qrl_status bcast_device_(qrl_nccl_comm_t *c, uint8_t *d, uint64_t len, uint64_t chunk, uint64_t deadline,
                                qrl_error *err) {
    if (!d) QRL_TRY(staging_ensure(c, chunk, err));
    uint32_t n = qrl_wsync_bucket_count(len, chunk);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off, size;
        qrl_wsync_bucket_range(len, chunk, i, &off, &size);
        void *buf = d ? (void *)(d + off) : c->dev[0];
        QRL_TRY(nccl_settle(c, ncclBroadcast(buf, buf, size, ncclUint8, 0, c->comm, c->ns), deadline,
                            "ncclBroadcast", err));
    }
    CU(cudaEventRecord(c->bcast[0], c->ns), "event");
    return wait_event(c, c->bcast[0], deadline, "last broadcast", err);
}

static qrl_status bcast_device(qrl_nccl_comm_t *c, uint8_t *d, uint64_t len, uint64_t chunk, uint64_t deadline,
                               qrl_error *err) {
    qrl_status st = bcast_device_(c, d, len, chunk, deadline, err);
    if (st != QRL_OK) comm_kill(c);
    return st;
}

qrl_status qrl_nccl_bcast_send_device(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                                      const uint8_t *d_stream, uint64_t total, const uint32_t *bucket_crc,
                                      int timeout_ms, qrl_error *err) {
    QRL_TRY(check_live(c, err));
    if (c->rank != 0 || !bucket_crc)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: rank %d cannot send (or no "
                             "bucket CRCs)", c->rank);
    qrl_wsync_header h;
    QRL_TRY(send_header(c, manifest, manifest_len, total, &h, err));
    uint8_t *pre = NULL, hb[QRL_WSYNC_HEADER_BYTES];
    size_t pre_len;
    QRL_TRY(qrl_wsync_preamble_build(&h, manifest, manifest_len, bucket_crc, &pre, &pre_len, err));
    qrl_wsync_header_encode(&h, hb);
    uint64_t deadline = deadline_after(timeout_ms);
    qrl_status st;
    QRL_TRY_GOTO(pipe_bytes(c, hb, sizeof hb, sizeof hb, deadline, err), done);
    QRL_TRY_GOTO(pipe_bytes(c, pre, pre_len, h.bucket_bytes, deadline, err), done);
    st = bcast_device(c, (uint8_t *)d_stream, total, h.bucket_bytes, deadline, err);
done:
    free(pre);
    return st;
}

qrl_status qrl_nccl_bcast_recv_device(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                                      uint8_t *d_dst, uint64_t cap, int timeout_ms, Qrl__WeightManifest **mf_out,
                                      qrl_error *err) {
    *mf_out = NULL;
    QRL_TRY(check_live(c, err));
    if (c->rank == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: rank 0 cannot receive");
    uint64_t deadline = deadline_after(timeout_ms);
    qrl_wsync_header h;
    qrl_status st;
    QRL_TRY(recv_header(c, max_total, deadline, &h, err));
    size_t pre_len = qrl_wsync_preamble_len(&h);
    uint8_t *pre = malloc(pre_len);
    uint32_t nb = h.bucket_count, *crc = malloc(((size_t)nb + 1) * sizeof *crc);
    Qrl__WeightManifest *mf = NULL;
    uint64_t *off = NULL, *len = NULL;
    uint32_t *got = NULL;
    qrl_status refuse = QRL_OK; /* found while the transfer must still be followed */
    qrl_error rerr;
    QRL_TRY_GOTO(pipe_bytes(c, pre, pre_len, h.bucket_bytes, deadline, err), done);
    if (!pre || !crc)
        refuse = qrl_error_set(&rerr, QRL_STATUS_NOMEM, "weight sync of version %llu: preamble",
                               (unsigned long long)h.version);
    else if (expect_version && h.version != expect_version)
        refuse = qrl_error_set(&rerr, QRL_STATUS_CORRUPT, "weight sync: version %llu arrived, %llu announced",
                               (unsigned long long)h.version, (unsigned long long)expect_version);
    else if (h.total_bytes > cap)
        refuse = qrl_error_set(&rerr, QRL_STATUS_OUT_OF_RANGE, "weight sync: %llu bytes for a %llu-byte device "
                               "buffer", (unsigned long long)h.total_bytes, (unsigned long long)cap);
    else
        refuse = qrl_wsync_preamble_parse(&h, pre, &mf, crc, &rerr);
    QRL_TRY_GOTO(bcast_device(c, refuse == QRL_OK ? d_dst : NULL, h.total_bytes, h.bucket_bytes, deadline, err),
                 done);
    if (refuse != QRL_OK) {
        if (err) *err = rerr;
        st = refuse;
        goto done;
    }
    size_t n = (size_t)nb + mf->n_tensors;
    off = malloc((n + 1) * sizeof *off), len = malloc((n + 1) * sizeof *len), got = malloc((n + 1) * sizeof *got);
    if (!off || !len || !got) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "weight sync: %zu checksum ranges", n);
        goto done;
    }
    for (uint32_t i = 0; i < nb; i++) qrl_wsync_bucket_range(h.total_bytes, h.bucket_bytes, i, &off[i], &len[i]);
    for (size_t i = 0; i < mf->n_tensors; i++) { /* out-of-range tensors: named by the check */
        const Qrl__TensorMeta *t = mf->tensors[i];
        bool inside = t->byte_offset <= h.total_bytes && t->byte_size <= h.total_bytes - t->byte_offset;
        off[nb + i] = inside ? t->byte_offset : 0;
        len[nb + i] = inside ? t->byte_size : 0;
    }
    QRL_TRY_GOTO(qrl_cuda_crc32c_ranges(d_dst, off, len, (int)n, got, qrl_crc32c_fold_tables(), c->cs, err), done);
    QRL_TRY_GOTO(qrl_wsync_check_crcs(mf, h.total_bytes, crc, got, got + nb, err), done);
    *mf_out = mf;
    mf = NULL;
    st = QRL_OK;
done:
    free(pre), free(crc), free(off), free(len), free(got);
    qrl_wire_free(mf ? &mf->base : NULL);
    return st;
}

qrl_status qrl_nccl_bcast_recv(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                               int timeout_ms, qrl_nccl_version *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    QRL_TRY(check_live(c, err));
    if (c->rank == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nccl weight sync: rank 0 cannot receive");
    uint64_t t0 = now_ns(), deadline = deadline_after(timeout_ms);
    qrl_wsync_header h;
    qrl_status st;
    QRL_TRY(recv_header(c, max_total, deadline, &h, err));
    uint64_t t1 = now_ns(); /* (the header decode is in the transfer time now, ~1 us) */
    size_t pre_len = qrl_wsync_preamble_len(&h);
    uint8_t *pre = malloc(pre_len);
    uint32_t *crc = malloc(((size_t)h.bucket_count + 1) * sizeof *crc);
    uint8_t *stream = NULL;
    size_t cap = 0;
    if (c->spare && c->spare_bytes >= h.total_bytes) {
        stream = c->spare;
        cap = c->spare_bytes;
        c->spare = NULL;
    } else if (h.total_bytes) {
        stream = qrl_nccl_host_alloc(h.total_bytes);
        cap = h.total_bytes;
    }
    Qrl__WeightManifest *mf = NULL;
    qrl_status refuse = QRL_OK; /* a refusal found while the transfer must still be followed */
    qrl_error rerr;
    QRL_TRY_GOTO(pipe_bytes(c, pre, pre_len, h.bucket_bytes, deadline, err), done);
    if (!pre || !crc || (h.total_bytes && !stream))
        refuse = qrl_error_set(&rerr, QRL_STATUS_NOMEM, "weight sync of version %llu: %llu bytes",
                               (unsigned long long)h.version, (unsigned long long)h.total_bytes);
    else if (expect_version && h.version != expect_version)
        refuse = qrl_error_set(&rerr, QRL_STATUS_CORRUPT, "weight sync: version %llu arrived, %llu announced",
                               (unsigned long long)h.version, (unsigned long long)expect_version);
    else
        refuse = qrl_wsync_preamble_parse(&h, pre, &mf, crc, &rerr);
    QRL_TRY_GOTO(pipe_bytes(c, refuse == QRL_OK ? stream : NULL, h.total_bytes, h.bucket_bytes, deadline, err),
                 done);
    if (refuse != QRL_OK) {
        if (err) *err = rerr;
        st = refuse;
        goto done;
    }
    uint64_t t2 = now_ns();
    /* every bucket against the sender's table, the whole stream, every tensor */
    QRL_TRY_GOTO(qrl_wsync_verify_stream(mf, stream, h.total_bytes, crc, err), done);
    *out = (qrl_nccl_version){mf, stream, h.total_bytes, h.version, h.sync_epoch, (double)(t1 - t0) * 1e-9,
                              (double)(t2 - t1) * 1e-9, (double)(now_ns() - t2) * 1e-9, cap};
    mf = NULL;
    stream = NULL;
    st = QRL_OK;
done:
    free(pre);
    free(crc);
    if (stream && !c->spare) { /* keep the buffer for the retry */
        c->spare = stream;
        c->spare_bytes = cap;
    } else {
        qrl_nccl_host_free(stream);
    }
    qrl_wire_free(mf ? &mf->base : NULL);
    return st;
}

void *qrl_nccl_host_alloc(size_t bytes) {
    void *p = NULL;
    if (qrl_nccl_available() && cudaMallocHost(&p, bytes ? bytes : 1) == cudaSuccess) return p;
    cudaGetLastError();
    return malloc(bytes ? bytes : 1);
}

void qrl_nccl_host_free(void *p) {
    if (!p) return;
    if (is_pinned(p)) cudaFreeHost(p);
    else free(p);
}

qrl_status qrl_nccl_device_alloc(int device, uint64_t bytes, uint8_t **out, qrl_error *err) {
    *out = NULL;
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc((void **)out, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear it: the next call on this thread must not see it */
        *out = NULL;
        return qrl_error_set(err, QRL_STATUS_CUDA, "nccl weights: %llu-byte device buffer on cuda:%d",
                             (unsigned long long)bytes, device);
    }
    return QRL_OK;
}
void qrl_nccl_device_free(uint8_t *p) {
    if (p) cudaFree(p);
}

#else /* !QRL_HAVE_CUDA */

struct qrl_nccl_comm {
    int unused;
};

static qrl_status unsupported(qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                         "nccl weight sync: this build has no CUDA/NCCL (built without nvcc or with QRL_CUDA=0); "
                         "use weights.transport=tcp");
}

bool qrl_nccl_available(void) { return false; }
qrl_status qrl_nccl_unique_id(uint8_t id[QRL_NCCL_ID_BYTES], qrl_error *err) {
    memset(id, 0, QRL_NCCL_ID_BYTES);
    return unsupported(err);
}
qrl_status qrl_nccl_comm_init(const uint8_t id[QRL_NCCL_ID_BYTES], uint64_t epoch, int rank, int world,
                              int device, int timeout_ms, qrl_nccl_comm_t **out, qrl_error *err) {
    *out = NULL;
    return unsupported(err);
}
void qrl_nccl_comm_destroy(qrl_nccl_comm_t *c) { free(c); }
bool qrl_nccl_comm_ok(const qrl_nccl_comm_t *c) { return false; }
int qrl_nccl_comm_rank(const qrl_nccl_comm_t *c) { return -1; }
int qrl_nccl_comm_world(const qrl_nccl_comm_t *c) { return 0; }
uint64_t qrl_nccl_comm_epoch(const qrl_nccl_comm_t *c) { return 0; }
qrl_status qrl_nccl_bcast_send(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                               const uint8_t *stream, uint64_t total, const uint32_t *bucket_crc,
                               int timeout_ms, qrl_error *err) {
    return unsupported(err);
}
qrl_status qrl_nccl_bcast_recv(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                               int timeout_ms, qrl_nccl_version *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    return unsupported(err);
}
qrl_status qrl_nccl_bcast_send_device(qrl_nccl_comm_t *c, const uint8_t *manifest, size_t manifest_len,
                                      const uint8_t *d_stream, uint64_t total, const uint32_t *bucket_crc,
                                      int timeout_ms, qrl_error *err) {
    (void)c, (void)manifest, (void)manifest_len, (void)d_stream, (void)total, (void)bucket_crc, (void)timeout_ms;
    return unsupported(err);
}
qrl_status qrl_nccl_bcast_recv_device(qrl_nccl_comm_t *c, uint64_t expect_version, uint64_t max_total,
                                      uint8_t *d_dst, uint64_t cap, int timeout_ms, Qrl__WeightManifest **mf,
                                      qrl_error *err) {
    (void)c, (void)expect_version, (void)max_total, (void)d_dst, (void)cap, (void)timeout_ms;
    *mf = NULL;
    return unsupported(err);
}
void *qrl_nccl_host_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
void qrl_nccl_host_free(void *p) { free(p); }
qrl_status qrl_nccl_device_alloc(int device, uint64_t bytes, uint8_t **out, qrl_error *err) {
    (void)device, (void)bytes;
    *out = NULL;
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "nccl weights: this build has no CUDA");
}
void qrl_nccl_device_free(uint8_t *p) { (void)p; }

#endif

void qrl_nccl_version_recycle(qrl_nccl_comm_t *c, qrl_nccl_version *v) {
    if (!v) return;
#if QRL_HAVE_CUDA
    if (c && v->stream && (!c->spare || c->spare_bytes < v->stream_cap)) {
        qrl_nccl_host_free(c->spare);
        c->spare = v->stream;
        c->spare_bytes = v->stream_cap;
        v->stream = NULL;
    }
#endif
    qrl_nccl_version_free(v);
}

void qrl_nccl_version_free(qrl_nccl_version *v) {
    if (!v) return;
    qrl_wire_free(v->manifest ? &v->manifest->base : NULL);
    qrl_nccl_host_free(v->stream);
    memset(v, 0, sizeof *v);
}
