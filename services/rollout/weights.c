/* TCP weight stream receiver (SPEC §8 "Weight sync", docs/wire.md "Weight sync headers",
 * docs/rollout-daemon.md "Weight sync").  Runs on the control thread, never the loop.
 *
 * Framing on TCP (protobuf has no end marker, so every message carries its length):
 *   frame   = u32 little-endian length, then that many bytes of one protobuf message
 *   stream  = frame(WeightManifest), then per bucket i in order:
 *             frame(WeightBucketHeader{index i, offset i*bucket_bytes, byte_size}) and
 *             byte_size raw bytes (the last bucket may be shorter).
 * The bytes are the tensors of the manifest at their byte offsets (BF16 or F32). */
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/tensor.h"
#include "rollout.h"
#include "weights/wsync.h"

#define MAX_MANIFEST_BYTES ((size_t)16 << 20)
#define MAX_HEADER_BYTES ((size_t)4096)

static qrl_status read_full(int fd, void *buf, size_t n, const char *addr, const char *what,
                            qrl_error *err) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r == 0)
            return qrl_error_set(err, QRL_STATUS_NETWORK, "weights from %s: connection closed in %s",
                                 addr, what);
        if (r < 0) {
            if (errno == EINTR) continue;
            return qrl_error_set(err, errno == EAGAIN || errno == EWOULDBLOCK ? QRL_STATUS_TIMEOUT
                                                                              : QRL_STATUS_NETWORK,
                                 "weights from %s: reading %s: %s", addr, what, strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return QRL_OK;
}

static qrl_status read_frame(int fd, const ProtobufCMessageDescriptor *desc, size_t max,
                             const char *addr, ProtobufCMessage **out, qrl_error *err) {
    uint8_t lenb[4];
    QRL_TRY(read_full(fd, lenb, 4, addr, desc->short_name, err));
    size_t len = (size_t)lenb[0] | (size_t)lenb[1] << 8 | (size_t)lenb[2] << 16 | (size_t)lenb[3] << 24;
    if (len == 0 || len > max)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "weights from %s: %s frame of %zu bytes "
                             "(limit %zu)", addr, desc->short_name, len, max);
    uint8_t *buf = malloc(len);
    if (!buf) return qrl_error_set(err, QRL_STATUS_NOMEM, "weights: %zu bytes", len);
    qrl_status st = read_full(fd, buf, len, addr, desc->short_name, err);
    if (st == QRL_OK) st = qrl_wire_decode(desc, buf, len, max, out, err);
    free(buf);
    return st;
}

static qrl_status dial(const char *addr, int timeout_ms, int *fd_out, qrl_error *err) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weight_addr '%s' is not host:port", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc) return qrl_error_set(err, QRL_STATUS_NETWORK, "weight_addr %s: %s", addr, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) return qrl_error_set(err, QRL_STATUS_NETWORK, "weight_addr %s: cannot connect: %s",
                                     addr, strerror(errno));
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    *fd_out = fd;
    return QRL_OK;
}

/* The tensors must be exactly the model's (names, element counts), each BF16 or F32. */
static qrl_status check_manifest(const Qrl__WeightManifest *mf, const qrl_model *like,
                                 uint64_t version, const char *addr, qrl_error *err) {
    QRL_TRY(qrl_wire_weight_manifest_validate(mf, err));
    if (mf->version != version)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights from %s: manifest version "
                             "%llu, announced %llu", addr, (unsigned long long)mf->version,
                             (unsigned long long)version);
    if (mf->n_tensors != (size_t)like->n_tensors)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights from %s: %zu tensors, the "
                             "model has %d", addr, mf->n_tensors, like->n_tensors);
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const Qrl__TensorMeta *t = mf->tensors[i];
        const qrl_model_tensor *mt = qrl_model_find_tensor(like, t->name);
        if (!mt)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights from %s: tensor '%s' "
                                 "is not in the model", addr, t->name);
        uint64_t numel = 1;
        for (size_t k = 0; k < t->n_shape; k++) numel *= t->shape[k];
        uint64_t want = (uint64_t)mt->shape[0] * (uint64_t)(mt->ndim == 2 ? mt->shape[1] : 1);
        bool bf16 = strcmp(t->dtype, "BF16") == 0, f32 = strcmp(t->dtype, "F32") == 0;
        if (numel != want || (!bf16 && !f32))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights from %s: tensor '%s' "
                                 "has %llu %s elements, the model %llu F32/BF16", addr, t->name,
                                 (unsigned long long)numel, t->dtype, (unsigned long long)want);
    }
    return QRL_OK;
}

static uint32_t crc(const void *p, size_t n) { return qrl_wire_crc32c(0, p, n); }

/* A verified stream (manifest checked by check_manifest) into a new model shaped like `like`. */
static qrl_status stream_to_model(const Qrl__WeightManifest *mf, const uint8_t *stream, const qrl_model *like,
                                  qrl_model **out, qrl_error *err) {
    qrl_model *m;
    QRL_TRY(qrl_model_new(&like->cfg, &m, err));
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const Qrl__TensorMeta *t = mf->tensors[i];
        const uint8_t *src = stream + t->byte_offset;
        float *dst = ((qrl_model_tensor *)qrl_model_find_tensor(m, t->name))->data;
        if (strcmp(t->dtype, "F32") == 0) {
            memcpy(dst, src, t->byte_size);
        } else {
            for (uint64_t k = 0; k < t->byte_size / 2; k++)
                dst[k] = qrl_bf16_to_f32((uint16_t)(src[2 * k] | src[2 * k + 1] << 8));
        }
    }
    *out = m;
    return QRL_OK;
}

qrl_status rd_weights_from_stream(const Qrl__WeightManifest *mf, const uint8_t *stream, const qrl_model *like,
                                  uint64_t version, const char *from, qrl_model **out, qrl_error *err) {
    *out = NULL;
    QRL_TRY(check_manifest(mf, like, version, from, err));
    return stream_to_model(mf, stream, like, out, err);
}

qrl_status rd_weights_receive(const char *addr, const qrl_model *like, uint64_t version,
                              qrl_model **out, qrl_error *err) {
    *out = NULL;
    int fd = -1;
    QRL_TRY(dial(addr, 30000, &fd, err));
    Qrl__WeightManifest *mf = NULL;
    Qrl__WeightBucketHeader *h = NULL;
    uint8_t *stream = NULL;
    qrl_model *m = NULL;
    qrl_status st;
    QRL_TRY_GOTO(read_frame(fd, &qrl__weight_manifest__descriptor, MAX_MANIFEST_BYTES, addr,
                            (ProtobufCMessage **)&mf, err), done);
    QRL_TRY_GOTO(check_manifest(mf, like, version, addr, err), done);
    bool crc32c = mf->checksum_algorithm == QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C;
    if (mf->total_bytes > (uint64_t)like->arena_floats * 4 + 4096) {
        st = qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "weights from %s: %llu bytes for a model "
                           "of %zu floats", addr, (unsigned long long)mf->total_bytes, like->arena_floats);
        goto done;
    }
    stream = malloc(mf->total_bytes ? mf->total_bytes : 1);
    if (!stream) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "weights: %llu bytes", (unsigned long long)mf->total_bytes);
        goto done;
    }
    for (uint32_t i = 0; i < mf->bucket_count; i++) {
        QRL_TRY_GOTO(read_frame(fd, &qrl__weight_bucket_header__descriptor, MAX_HEADER_BYTES, addr,
                                (ProtobufCMessage **)&h, err), done);
        uint64_t off = (uint64_t)i * mf->bucket_bytes;
        uint64_t size = mf->total_bytes - off < mf->bucket_bytes ? mf->total_bytes - off : mf->bucket_bytes;
        if (h->bucket_index != i || h->byte_offset != off || h->byte_size != size ||
            h->version != mf->version) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "weights from %s: bucket %u header says "
                               "index %u offset %llu size %llu version %llu, expected offset %llu "
                               "size %llu", addr, i, h->bucket_index, (unsigned long long)h->byte_offset,
                               (unsigned long long)h->byte_size, (unsigned long long)h->version,
                               (unsigned long long)off, (unsigned long long)size);
            goto done;
        }
        QRL_TRY_GOTO(read_full(fd, stream + off, size, addr, "bucket bytes", err), done);
        if (crc32c && crc(stream + off, size) != (uint32_t)h->checksum) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "weights from %s: bucket %u of version %llu: "
                               "CRC-32C mismatch", addr, i, (unsigned long long)mf->version);
            goto done;
        }
        qrl_wire_free(&h->base);
        h = NULL;
    }
    { /* whole stream and every tensor: the checks the NCCL receiver runs too (weights/wsync.h) */
        qrl_error ve;
        if (qrl_wsync_verify_stream(mf, stream, mf->total_bytes, NULL, &ve) != QRL_OK) {
            st = qrl_error_set(err, ve.status, "weights from %s: %s", addr, ve.msg);
            goto done;
        }
    }
    QRL_TRY_GOTO(stream_to_model(mf, stream, like, &m, err), done);
    *out = m;
    m = NULL;
    st = QRL_OK;
done:
    close(fd);
    qrl_wire_free(mf ? &mf->base : NULL);
    qrl_wire_free(h ? &h->base : NULL);
    free(stream);
    qrl_model_free(m);
    return st;
}
