/* qrl-learner TCP weight stream server (SPEC §8 "Weight sync"; the receiver is
 * services/rollout/weights.c, which documents the framing):
 *   frame   = u32 little-endian length, then that many bytes of one protobuf message
 *   stream  = frame(WeightManifest), then per bucket i: frame(WeightBucketHeader{version,
 *             index i, count, offset i*bucket_bytes, byte_size, CRC-32C of the bucket})
 *             followed by byte_size raw bytes.
 * Every connection gets the newest snapshot in full, then the connection is closed. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/tensor.h"
#include "learner.h"
#include "weights/wipc.h"
#include "wire/wire.h"

qrl_status ld_snapshot_build(const qrl_model *m, uint64_t version, size_t bucket_bytes,
                             ld_snapshot **out, qrl_error *err) {
    *out = NULL;
    size_t nt = (size_t)m->n_tensors, total = 0;
    ld_snapshot *s = calloc(1, sizeof *s);
    Qrl__TensorMeta *metas = calloc(nt, sizeof *metas);
    Qrl__TensorMeta **ptrs = calloc(nt, sizeof *ptrs);
    uint64_t *shapes = calloc(nt * 2, sizeof *shapes);
    for (size_t i = 0; i < nt; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        total += (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1) * 2;
    }
    if (s) s->stream = malloc(total ? total : 1);
    qrl_status st = QRL_OK;
    if (!s || !metas || !ptrs || !shapes || !s->stream) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "weight snapshot: %zu bytes", total);
        goto done;
    }
    size_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        uint8_t *dst = s->stream + off;
        for (size_t k = 0; k < numel; k++) {
            uint16_t b = qrl_f32_to_bf16(t->data[k]);
            dst[2 * k] = (uint8_t)b;
            dst[2 * k + 1] = (uint8_t)(b >> 8);
        }
        qrl__tensor_meta__init(&metas[i]);
        metas[i].name = (char *)t->name;
        metas[i].dtype = "BF16";
        shapes[2 * i] = (uint64_t)t->shape[0];
        shapes[2 * i + 1] = (uint64_t)(t->ndim == 2 ? t->shape[1] : 0);
        metas[i].shape = &shapes[2 * i];
        metas[i].n_shape = (size_t)t->ndim;
        metas[i].byte_offset = off;
        metas[i].byte_size = numel * 2;
        metas[i].checksum = qrl_wire_crc32c(0, dst, numel * 2);
        ptrs[i] = &metas[i];
        off += numel * 2;
    }
    Qrl__WeightManifest mf = QRL__WEIGHT_MANIFEST__INIT;
    mf.version = version;
    mf.step = version;
    mf.tensors = ptrs;
    mf.n_tensors = nt;
    mf.bucket_bytes = bucket_bytes;
    mf.total_bytes = total;
    mf.bucket_count = (uint32_t)((total + bucket_bytes - 1) / bucket_bytes);
    mf.checksum_algorithm = QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C;
    mf.checksum = qrl_wire_crc32c(0, s->stream, total);
    mf.uaq_scale = 1.0f;
    qrl_error e2;
    if (qrl_wire_weight_manifest_validate(&mf, &e2) != QRL_OK ||
        qrl_wire_encode_alloc(&mf.base, &s->manifest, &s->manifest_len, &e2) != QRL_OK) {
        st = qrl_error_set(err, e2.status == QRL_STATUS_NOMEM ? QRL_STATUS_NOMEM : QRL_STATUS_INTERNAL,
                           "weight manifest of version %llu: %s", (unsigned long long)version, e2.msg);
        goto done;
    }
    s->version = version;
    s->total = total;
    s->bucket_bytes = bucket_bytes;
    s->refs = 1;
    pthread_mutex_init(&s->fill_mu, NULL);
    *out = s;
    s = NULL;
done:
    if (s) {
        free(s->stream);
        free(s);
    }
    free(metas);
    free(ptrs);
    free(shapes);
    return st;
}

qrl_status ld_snapshot_device(struct qrl_wipc_sender *ipc, uint64_t version, size_t bucket_bytes,
                              uint8_t *manifest, size_t manifest_len, size_t total, ld_snapshot **out,
                              qrl_error *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        free(manifest);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "weight snapshot");
    }
    **out = (ld_snapshot){.version = version, .manifest = manifest, .manifest_len = manifest_len,
                          .total = total, .bucket_bytes = bucket_bytes, .refs = 1, .ipc = ipc};
    pthread_mutex_init(&(*out)->fill_mu, NULL);
    return QRL_OK;
}

qrl_status ld_snapshot_fill(ld_snapshot *s, qrl_error *err) {
    pthread_mutex_lock(&s->fill_mu);
    qrl_status st = QRL_OK;
    if (!s->stream) {
        uint8_t *p = malloc(s->total ? s->total : 1);
        st = p ? qrl_wipc_read_host(s->ipc, s->version, p, s->total, err)
               : qrl_error_set(err, QRL_STATUS_NOMEM, "weight snapshot: %zu bytes", s->total);
        if (st == QRL_OK) s->stream = p;
        else free(p);
    }
    pthread_mutex_unlock(&s->fill_mu);
    return st;
}

ld_snapshot *ld_wserver_current(ld_wserver *w) {
    pthread_mutex_lock(&w->mu);
    ld_snapshot *s = w->cur;
    if (s) s->refs++;
    pthread_mutex_unlock(&w->mu);
    return s;
}

void ld_snapshot_unref(ld_wserver *w, ld_snapshot *s) {
    pthread_mutex_lock(&w->mu);
    bool last = --s->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (!last) return;
    free(s->manifest);
    free(s->stream);
    free(s->bucket_crc);
    pthread_mutex_destroy(&s->fill_mu);
    free(s);
}

static bool put_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static bool put_frame(int fd, const uint8_t *buf, size_t len) {
    uint8_t l[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    return put_all(fd, l, 4) && put_all(fd, buf, len);
}

static _Atomic int throttle_ms; /* weights.tcp_throttle_ms: fault injection, 0 = off */

void ld_wserver_set_throttle(int ms) { throttle_ms = ms; }

typedef struct conn {
    ld_wserver *w;
    ld_snapshot *s;
    int fd;
} conn;

static void *serve_conn(void *arg) {
    conn *c = arg;
    const ld_snapshot *s = c->s;
    qrl_error ferr;
    bool ok = ld_snapshot_fill(c->s, &ferr) == QRL_OK; /* a device version: its host copy */
    if (!ok) QRL_LOG_WARN("weights", "version %llu for TCP: %s", (unsigned long long)s->version, ferr.msg);
    ok = ok && put_frame(c->fd, s->manifest, s->manifest_len);
    uint32_t count = (uint32_t)((s->total + s->bucket_bytes - 1) / s->bucket_bytes);
    for (uint32_t i = 0; ok && i < count; i++) {
        size_t off = (size_t)i * s->bucket_bytes;
        size_t size = s->total - off < s->bucket_bytes ? s->total - off : s->bucket_bytes;
        int nap = throttle_ms; /* a slow link on purpose (tests) */
        if (nap > 0) nanosleep(&(struct timespec){nap / 1000, (long)(nap % 1000) * 1000000L}, NULL);
        Qrl__WeightBucketHeader h = QRL__WEIGHT_BUCKET_HEADER__INIT;
        h.version = s->version;
        h.bucket_index = i;
        h.bucket_count = count;
        h.byte_offset = off;
        h.byte_size = size;
        h.checksum = qrl_wire_crc32c(0, s->stream + off, size);
        uint8_t hb[256];
        size_t hl;
        qrl_error err;
        ok = qrl_wire_encode(&h.base, hb, sizeof hb, &hl, &err) == QRL_OK && put_frame(c->fd, hb, hl) &&
             put_all(c->fd, s->stream + off, size);
    }
    if (ok) c->w->sends++;
    else QRL_LOG_WARN("weights", "stream of version %llu cut short: %s", (unsigned long long)s->version,
                      strerror(errno));
    close(c->fd);
    ld_snapshot_unref(c->w, c->s);
    free(c);
    return NULL;
}

static void *accept_main(void *arg) {
    ld_wserver *w = arg;
    while (!w->stop) {
        struct pollfd p = {.fd = w->lfd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        int fd = accept(w->lfd, NULL, NULL);
        if (fd < 0) continue;
        pthread_mutex_lock(&w->mu);
        ld_snapshot *s = w->cur;
        if (s) s->refs++;
        pthread_mutex_unlock(&w->mu);
        if (!s) { /* nothing trained yet: replicas hold version 0 already */
            close(fd);
            continue;
        }
        struct timeval tv = {30, 0}; /* a stuck reader gives up its thread eventually */
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        conn *c = malloc(sizeof *c);
        pthread_t th;
        if (!c) {
            close(fd);
            ld_snapshot_unref(w, s);
            continue;
        }
        *c = (conn){w, s, fd};
        if (pthread_create(&th, NULL, serve_conn, c) != 0) {
            close(fd);
            ld_snapshot_unref(w, s);
            free(c);
            continue;
        }
        pthread_detach(th);
    }
    return NULL;
}

qrl_status ld_wserver_start(ld_wserver *w, const char *listen_addr, qrl_error *err) {
    char host[256];
    const char *colon = strrchr(listen_addr, ':');
    if (!colon || colon == listen_addr || (size_t)(colon - listen_addr) >= sizeof host)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights.listen '%s' is not host:port",
                             listen_addr);
    memcpy(host, listen_addr, (size_t)(colon - listen_addr));
    host[colon - listen_addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights.listen %s: %s", listen_addr,
                                 gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
        int e = errno;
        freeaddrinfo(ai);
        if (fd >= 0) close(fd);
        return qrl_error_set(err, QRL_STATUS_NETWORK, "weights.listen %s: %s", listen_addr, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    /* a wildcard bind is advertised as loopback: replicas on other hosts need weights.listen
     * set to the host's address */
    bool wild = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0;
    snprintf(w->addr, sizeof w->addr, "%s:%d", wild ? "127.0.0.1" : host, port);
    w->lfd = fd;
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->thread, NULL, accept_main, w) != 0) {
        close(fd);
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "weights: cannot create the thread");
    }
    w->started = true;
    QRL_LOG_INFO("weights", "weight stream listening addr=%s", w->addr);
    return QRL_OK;
}

void ld_wserver_publish(ld_wserver *w, ld_snapshot *s) {
    pthread_mutex_lock(&w->mu);
    ld_snapshot *old = w->cur;
    w->cur = s;
    pthread_mutex_unlock(&w->mu);
    if (old) ld_snapshot_unref(w, old);
}

void ld_wserver_stop(ld_wserver *w) {
    if (!w->started) return;
    w->stop = 1;
    pthread_join(w->thread, NULL);
    close(w->lfd);
    w->started = false;
    ld_snapshot *s = w->cur;
    w->cur = NULL;
    if (s) ld_snapshot_unref(w, s);
}
