/* The weight path on the device over CUDA IPC (wipc.h; docs/weight-sync.md). */
#include "weights/wipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wire/wire.h"

static void read_boot_id(char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    if (!fgets(out, (int)cap, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
}

#ifdef QRL_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <time.h>

#include "cuda/convert.cuh"
#include "cuda/crc32c.cuh"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static qrl_status cu(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "cuda ipc weights: %s: %s", what, cudaGetErrorString(e));
}

void qrl_wipc_node_id(char out[QRL_WIPC_NODE_ID_MAX]) {
    out[0] = 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError();
        return;
    }
    char host[64] = "", boot[64];
    gethostname(host, sizeof host - 1);
    read_boot_id(boot, sizeof boot);
    snprintf(out, QRL_WIPC_NODE_ID_MAX, "%s/%s", host, boot);
}

/* ---- sender --------------------------------------------------------------------------- */

typedef struct slot {
    uint8_t *d;
    size_t cap;
    cudaIpcMemHandle_t h;
    uint64_t version, total; /* version 0: empty */
    pthread_rwlock_t lk;     /* write: publish; read: qrl_wipc_read_host */
} slot;

struct qrl_wipc_sender {
    int device;
    cudaStream_t stream;
    slot slots[2];
};

qrl_status qrl_wipc_sender_new(int device, qrl_wipc_sender **out, qrl_error *err) {
    *out = NULL;
    qrl_wipc_sender *s = calloc(1, sizeof *s);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc sender");
    s->device = device;
    qrl_status st = cu(cudaSetDevice(device), "cudaSetDevice", err);
    if (st == QRL_OK) st = cu(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream", err);
    if (st != QRL_OK) {
        free(s);
        return st;
    }
    for (int i = 0; i < 2; i++) pthread_rwlock_init(&s->slots[i].lk, NULL);
    *out = s;
    return QRL_OK;
}

void qrl_wipc_sender_free(qrl_wipc_sender *s) {
    if (!s) return;
    cudaSetDevice(s->device);
    for (int i = 0; i < 2; i++) {
        cudaFree(s->slots[i].d);
        pthread_rwlock_destroy(&s->slots[i].lk);
    }
    cudaStreamDestroy(s->stream);
    free(s);
}

static qrl_status slot_reserve(slot *sl, size_t cap, qrl_error *err) {
    if (sl->cap >= cap) return QRL_OK;
    cudaFree(sl->d);
    sl->d = NULL;
    sl->cap = 0;
    QRL_TRY(cu(cudaMalloc((void **)&sl->d, cap), "slot allocation", err));
    QRL_TRY(cu(cudaIpcGetMemHandle(&sl->h, sl->d), "cudaIpcGetMemHandle", err));
    sl->cap = cap;
    return QRL_OK;
}

/* Bucket ranges then tensor ranges of a stream, for one qrl_cuda_crc32c_ranges call. */
static qrl_status ranges_alloc(uint64_t total, uint64_t bucket_bytes, size_t nt, uint64_t **off, uint64_t **len,
                               uint32_t **crc, uint32_t *nb, qrl_error *err) {
    *nb = qrl_wsync_bucket_count(total, bucket_bytes);
    size_t n = (size_t)*nb + nt;
    *off = malloc((n ? n : 1) * sizeof **off);
    *len = malloc((n ? n : 1) * sizeof **len);
    *crc = malloc((n ? n : 1) * sizeof **crc);
    if (!*off || !*len || !*crc) {
        free(*off), free(*len), free(*crc);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc: %zu checksum ranges", n);
    }
    for (uint32_t i = 0; i < *nb; i++) qrl_wsync_bucket_range(total, bucket_bytes, i, &(*off)[i], &(*len)[i]);
    return QRL_OK;
}

qrl_status qrl_wipc_publish(qrl_wipc_sender *s, const qrl_wsync_tensor *t, const float *const *src, size_t n,
                            uint64_t version, uint64_t bucket_bytes, qrl_wipc_published *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    if (bucket_bytes == 0) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "cuda ipc: bucket_bytes 0");
    uint64_t total = 0;
    size_t mf_bound = 4096;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].dtype, "BF16") != 0 || t[i].ndim < 1 || t[i].ndim > 2)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "cuda ipc: tensor '%s' dtype %s ndim %d "
                                 "(BF16, 1-2 dims)", t[i].name, t[i].dtype, t[i].ndim);
        total += t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1) * 2;
        mf_bound += strlen(t[i].name) + strlen(t[i].dtype) + 80;
    }
    QRL_TRY(cu(cudaSetDevice(s->device), "cudaSetDevice", err));
    slot *sl = &s->slots[version % 2];
    uint32_t nb;
    uint64_t *off, *len;
    uint32_t *crc;
    QRL_TRY(ranges_alloc(total, bucket_bytes, n, &off, &len, &crc, &nb, err));
    uint8_t *pre = NULL, *manifest = NULL;
    size_t pre_len = 0, manifest_len = 0;
    pthread_rwlock_wrlock(&sl->lk);
    sl->version = 0; /* being rewritten: qrl_wipc_read_host finds nothing here */
    uint64_t pre_off = qrl_wipc_preamble_offset(total);
    qrl_status st = slot_reserve(sl, pre_off + mf_bound + 4 * (size_t)nb, err);
    double t0 = now_s();
    uint8_t *d_stream = sl->d + QRL_WIPC_STREAM_OFFSET;
    uint64_t o = 0;
    for (size_t i = 0; i < n && st == QRL_OK; i++) {
        uint64_t numel = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1);
        st = qrl_cuda_f32_to_bf16(src[i], (uint16_t *)(d_stream + o), numel, s->stream, err);
        off[nb + i] = o;
        len[nb + i] = numel * 2;
        o += numel * 2;
    }
    if (st == QRL_OK) st = cu(cudaStreamSynchronize(s->stream), "cast", err);
    out->cast_s = now_s() - t0;
    t0 = now_s();
    if (st == QRL_OK)
        st = qrl_cuda_crc32c_ranges(d_stream, off, len, (int)(nb + n), crc, qrl_crc32c_fold_tables(), s->stream,
                                    err);
    out->crc_s = now_s() - t0;
    if (st == QRL_OK)
        st = qrl_wsync_manifest_encode_crcs(t, n, NULL, crc + nb, qrl_wsync_whole_crc(total, bucket_bytes, crc),
                                            total, version, 0, bucket_bytes, &manifest, &manifest_len, err);
    qrl_wsync_header h = {.sync_epoch = 0, .version = version, .total_bytes = total,
                          .bucket_bytes = bucket_bytes, .bucket_count = nb};
    if (st == QRL_OK) st = qrl_wsync_preamble_build(&h, manifest, manifest_len, crc, &pre, &pre_len, err);
    if (st == QRL_OK && pre_off + pre_len > sl->cap)
        st = qrl_error_set(err, QRL_STATUS_INTERNAL, "cuda ipc: preamble of %zu bytes past the slot", pre_len);
    uint8_t hb[QRL_WSYNC_HEADER_BYTES];
    qrl_wsync_header_encode(&h, hb);
    if (st == QRL_OK)
        st = cu(cudaMemcpyAsync(sl->d + pre_off, pre, pre_len, cudaMemcpyHostToDevice, s->stream), "preamble", err);
    if (st == QRL_OK) /* last: a reader that sees this header sees the rest */
        st = cu(cudaMemcpyAsync(sl->d, hb, sizeof hb, cudaMemcpyHostToDevice, s->stream), "header", err);
    if (st == QRL_OK) st = cu(cudaStreamSynchronize(s->stream), "publish", err);
    if (st == QRL_OK) {
        sl->version = version;
        sl->total = total;
        memcpy(out->handle, &sl->h, QRL_WIPC_HANDLE_BYTES);
        out->manifest = manifest;
        out->manifest_len = manifest_len;
        out->total = total;
        out->bucket_crc = crc;
        manifest = NULL;
        crc = NULL;
    }
    pthread_rwlock_unlock(&sl->lk);
    free(manifest), free(pre), free(off), free(len), free(crc);
    return st;
}

static slot *find_slot(qrl_wipc_sender *s, uint64_t version) {
    slot *sl = &s->slots[version % 2];
    pthread_rwlock_rdlock(&sl->lk);
    if (sl->version == version && version) return sl;
    pthread_rwlock_unlock(&sl->lk);
    return NULL;
}

const uint8_t *qrl_wipc_slot_acquire(qrl_wipc_sender *s, uint64_t version, uint64_t *total, int *device) {
    slot *sl = find_slot(s, version);
    if (!sl) return NULL;
    *total = sl->total;
    *device = s->device;
    return sl->d + QRL_WIPC_STREAM_OFFSET; /* read-locked until qrl_wipc_slot_release */
}

void qrl_wipc_slot_release(qrl_wipc_sender *s, uint64_t version) {
    pthread_rwlock_unlock(&s->slots[version % 2].lk);
}

qrl_status qrl_wipc_read_host(qrl_wipc_sender *s, uint64_t version, uint8_t *host, uint64_t total,
                              qrl_error *err) {
    slot *sl = find_slot(s, version);
    if (!sl) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "cuda ipc: version %llu is no longer held",
                                  (unsigned long long)version);
    qrl_status st = total == sl->total ? QRL_OK
                  : qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "cuda ipc: version %llu has %llu bytes, not %llu",
                                  (unsigned long long)version, (unsigned long long)sl->total,
                                  (unsigned long long)total);
    if (st == QRL_OK) st = cu(cudaSetDevice(s->device), "cudaSetDevice", err);
    if (st == QRL_OK)
        st = cu(cudaMemcpy(host, sl->d + QRL_WIPC_STREAM_OFFSET, total, cudaMemcpyDeviceToHost), "download", err);
    pthread_rwlock_unlock(&sl->lk);
    return st;
}

qrl_status qrl_wipc_sender_corrupt(qrl_wipc_sender *s, uint64_t version, uint64_t offset, uint8_t mask,
                                   qrl_error *err) {
    slot *sl = find_slot(s, version);
    if (!sl) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "cuda ipc: version %llu not held",
                                  (unsigned long long)version);
    qrl_status st = offset < sl->total ? QRL_OK : qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "offset");
    uint8_t b;
    uint8_t *p = sl->d + QRL_WIPC_STREAM_OFFSET + offset;
    if (st == QRL_OK) st = cu(cudaSetDevice(s->device), "cudaSetDevice", err);
    if (st == QRL_OK) st = cu(cudaMemcpy(&b, p, 1, cudaMemcpyDeviceToHost), "read", err);
    b ^= mask;
    if (st == QRL_OK) st = cu(cudaMemcpy(p, &b, 1, cudaMemcpyHostToDevice), "write", err);
    pthread_rwlock_unlock(&sl->lk);
    return st;
}

/* ---- receiver ------------------------------------------------------------------------- */

/* one mapping per learner slot: after a learner restart its two new slots evict the old
 * mappings, which would otherwise keep the dead process's memory allocated */
#define MAPS 2

struct qrl_wipc_receiver {
    int device;
    cudaStream_t stream;
    struct {
        cudaIpcMemHandle_t h;
        uint8_t *p;
        unsigned long long used;
    } map[MAPS];
    unsigned long long clock;
    uint8_t *staging;
    size_t cap;
};

qrl_status qrl_wipc_receiver_new(int device, qrl_wipc_receiver **out, qrl_error *err) {
    *out = NULL;
    qrl_wipc_receiver *r = calloc(1, sizeof *r);
    if (!r) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc receiver");
    r->device = device;
    qrl_status st = cu(cudaSetDevice(device), "cudaSetDevice", err);
    if (st == QRL_OK) st = cu(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking), "stream", err);
    if (st != QRL_OK) {
        free(r);
        return st;
    }
    *out = r;
    return QRL_OK;
}

void qrl_wipc_receiver_free(qrl_wipc_receiver *r) {
    if (!r) return;
    cudaSetDevice(r->device);
    for (int i = 0; i < MAPS; i++)
        if (r->map[i].p) cudaIpcCloseMemHandle(r->map[i].p);
    cudaFree(r->staging);
    cudaStreamDestroy(r->stream);
    free(r);
}

/* The mapping of handle h (opened once, least recently used closed when full). */
static qrl_status map_handle(qrl_wipc_receiver *r, const cudaIpcMemHandle_t *h, uint8_t **p, qrl_error *err) {
    int lru = 0;
    for (int i = 0; i < MAPS; i++) {
        if (r->map[i].p && !memcmp(&r->map[i].h, h, sizeof *h)) {
            r->map[i].used = ++r->clock;
            *p = r->map[i].p;
            return QRL_OK;
        }
        if (!r->map[i].p || r->map[i].used < r->map[lru].used) lru = i;
        if (!r->map[i].p) break;
    }
    if (r->map[lru].p) cudaIpcCloseMemHandle(r->map[lru].p);
    r->map[lru].p = NULL;
    void *q = NULL;
    QRL_TRY(cu(cudaIpcOpenMemHandle(&q, *h, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle (is the learner on this node?)", err));
    r->map[lru].h = *h;
    r->map[lru].p = q;
    r->map[lru].used = ++r->clock;
    *p = q;
    return QRL_OK;
}

static qrl_status read_header(qrl_wipc_receiver *r, const uint8_t *p, uint64_t max_total, qrl_wsync_header *h,
                              qrl_error *err) {
    uint8_t hb[QRL_WSYNC_HEADER_BYTES];
    QRL_TRY(cu(cudaMemcpy(hb, p, sizeof hb, cudaMemcpyDeviceToHost), "header", err));
    (void)r;
    return qrl_wsync_header_decode(hb, max_total, h, err);
}

qrl_status qrl_wipc_receive(qrl_wipc_receiver *r, const uint8_t *handle, size_t handle_len, uint64_t version,
                            uint64_t max_total, qrl_wipc_received *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    if (handle_len != QRL_WIPC_HANDLE_BYTES)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "cuda ipc: handle of %zu bytes (want %d)",
                             handle_len, QRL_WIPC_HANDLE_BYTES);
    QRL_TRY(cu(cudaSetDevice(r->device), "cudaSetDevice", err));
    double t0 = now_s();
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    uint8_t *p;
    QRL_TRY(map_handle(r, &h, &p, err));
    out->map_s = now_s() - t0;
    t0 = now_s();
    qrl_wsync_header hd, again;
    QRL_TRY(read_header(r, p, max_total, &hd, err));
    if (hd.version != version)
        return qrl_error_set(err, QRL_STATUS_BUSY, "cuda ipc: the slot holds version %llu, not %llu",
                             (unsigned long long)hd.version, (unsigned long long)version);
    size_t pre_len = qrl_wsync_preamble_len(&hd);
    uint8_t *pre = malloc(pre_len);
    uint32_t *bcrc = malloc(((size_t)hd.bucket_count + 1) * 4);
    uint32_t *got = NULL;
    uint64_t *off = NULL, *len = NULL;
    Qrl__WeightManifest *mf = NULL;
    qrl_status st = pre && bcrc ? QRL_OK : qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc: preamble");
    if (st == QRL_OK)
        st = cu(cudaMemcpy(pre, p + qrl_wipc_preamble_offset(hd.total_bytes), pre_len, cudaMemcpyDeviceToHost),
                "preamble", err);
    if (st == QRL_OK) st = qrl_wsync_preamble_parse(&hd, pre, &mf, bcrc, err);
    if (st == QRL_OK && r->cap < hd.total_bytes) {
        cudaFree(r->staging);
        r->staging = NULL;
        r->cap = 0;
        st = cu(cudaMalloc((void **)&r->staging, hd.total_bytes ? hd.total_bytes : 1), "staging buffer", err);
        if (st == QRL_OK) r->cap = hd.total_bytes;
    }
    if (st == QRL_OK)
        st = cu(cudaMemcpyAsync(r->staging, p + QRL_WIPC_STREAM_OFFSET, hd.total_bytes, cudaMemcpyDeviceToDevice,
                                r->stream), "copy", err);
    if (st == QRL_OK) st = cu(cudaStreamSynchronize(r->stream), "copy", err);
    out->copy_s = now_s() - t0;
    t0 = now_s();
    if (st == QRL_OK) st = read_header(r, p, max_total, &again, err);
    if (st == QRL_OK && again.version != version)
        st = qrl_error_set(err, QRL_STATUS_BUSY, "cuda ipc: version %llu was overwritten by %llu during the copy",
                           (unsigned long long)version, (unsigned long long)again.version);
    uint32_t nb = 0;
    if (st == QRL_OK) st = ranges_alloc(hd.total_bytes, hd.bucket_bytes, mf->n_tensors, &off, &len, &got, &nb, err);
    if (st == QRL_OK) {
        for (size_t i = 0; i < mf->n_tensors; i++) {
            const Qrl__TensorMeta *t = mf->tensors[i];
            bool inside = t->byte_offset <= hd.total_bytes && t->byte_size <= hd.total_bytes - t->byte_offset;
            off[nb + i] = inside ? t->byte_offset : 0; /* qrl_wsync_check_crcs names it */
            len[nb + i] = inside ? t->byte_size : 0;
        }
        st = qrl_cuda_crc32c_ranges(r->staging, off, len, (int)(nb + mf->n_tensors), got, qrl_crc32c_fold_tables(),
                                    r->stream, err);
    }
    if (st == QRL_OK) st = qrl_wsync_check_crcs(mf, hd.total_bytes, bcrc, got, got + nb, err);
    out->verify_s = now_s() - t0;
    if (st == QRL_OK) {
        out->mf = mf;
        out->stream = r->staging;
        out->total = hd.total_bytes;
        mf = NULL;
    }
    qrl_wire_free(mf ? &mf->base : NULL);
    free(pre), free(bcrc), free(got), free(off), free(len);
    return st;
}

qrl_status qrl_wipc_receiver_download(qrl_wipc_receiver *r, uint8_t *host, uint64_t total, qrl_error *err) {
    if (total > r->cap) return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "cuda ipc: %llu bytes, staging %zu",
                                             (unsigned long long)total, r->cap);
    QRL_TRY(cu(cudaSetDevice(r->device), "cudaSetDevice", err));
    return cu(cudaMemcpy(host, r->staging, total, cudaMemcpyDeviceToHost), "download", err);
}

#else /* !QRL_HAVE_CUDA */

static qrl_status unsupported(qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda ipc weights: this build has no CUDA (built without "
                         "nvcc or with QRL_CUDA=0)");
}

void qrl_wipc_node_id(char out[QRL_WIPC_NODE_ID_MAX]) {
    char boot[64];
    read_boot_id(boot, sizeof boot); /* keeps the helper used in both builds */
    out[0] = 0;
}
qrl_status qrl_wipc_sender_new(int device, qrl_wipc_sender **out, qrl_error *err) {
    (void)device;
    *out = NULL;
    return unsupported(err);
}
void qrl_wipc_sender_free(qrl_wipc_sender *s) { (void)s; }
qrl_status qrl_wipc_publish(qrl_wipc_sender *s, const qrl_wsync_tensor *t, const float *const *src, size_t n,
                            uint64_t version, uint64_t bucket_bytes, qrl_wipc_published *out, qrl_error *err) {
    (void)s, (void)t, (void)src, (void)n, (void)version, (void)bucket_bytes;
    memset(out, 0, sizeof *out);
    return unsupported(err);
}
qrl_status qrl_wipc_read_host(qrl_wipc_sender *s, uint64_t version, uint8_t *host, uint64_t total,
                              qrl_error *err) {
    (void)s, (void)version, (void)host, (void)total;
    return unsupported(err);
}
const uint8_t *qrl_wipc_slot_acquire(qrl_wipc_sender *s, uint64_t version, uint64_t *total, int *device) {
    (void)s, (void)version, (void)total, (void)device;
    return NULL;
}
void qrl_wipc_slot_release(qrl_wipc_sender *s, uint64_t version) { (void)s, (void)version; }
qrl_status qrl_wipc_sender_corrupt(qrl_wipc_sender *s, uint64_t version, uint64_t offset, uint8_t mask,
                                   qrl_error *err) {
    (void)s, (void)version, (void)offset, (void)mask;
    return unsupported(err);
}
qrl_status qrl_wipc_receiver_new(int device, qrl_wipc_receiver **out, qrl_error *err) {
    (void)device;
    *out = NULL;
    return unsupported(err);
}
void qrl_wipc_receiver_free(qrl_wipc_receiver *r) { (void)r; }
qrl_status qrl_wipc_receiver_download(qrl_wipc_receiver *r, uint8_t *host, uint64_t total, qrl_error *err) {
    (void)r, (void)host, (void)total;
    return unsupported(err);
}
qrl_status qrl_wipc_receive(qrl_wipc_receiver *r, const uint8_t *handle, size_t handle_len, uint64_t version,
                            uint64_t max_total, qrl_wipc_received *out, qrl_error *err) {
    (void)r, (void)handle, (void)handle_len, (void)version, (void)max_total;
    memset(out, 0, sizeof *out);
    return unsupported(err);
}
#endif
