/* TensorBoard event-file writer (metrics/tfevents.h).  The Event protobuf is encoded by
 * hand: five fields of one message are not worth a generated descriptor. */
#include "metrics/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/crc32.h"

#define TFEVENTS_MAX_EVENT (16u << 20)

struct qrl_tfevents {
    int fd;
    char *path;
};

uint32_t qrl_tfrecord_masked_crc(const void *data, size_t len) {
    uint32_t c = qrl_crc32c(0, data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding -------------------------------------------------------------- */

typedef qrl_buf pbuf;

static void pb_bytes(pbuf *b, const void *s, size_t n) { qrl_buf_append(b, s, n); }

static void pb_varint(pbuf *b, uint64_t v) {
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, n);
}

static void pb_le(pbuf *b, uint64_t v, size_t n) {
    uint8_t t[8];
    for (size_t i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(b, t, n);
}

/* key = field << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
static void pb_key(pbuf *b, unsigned field, unsigned wt) { pb_varint(b, (uint64_t)field << 3 | wt); }

static void pb_string(pbuf *b, unsigned field, const void *s, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v > 0x7f) {
        v >>= 7;
        n++;
    }
    return n;
}

static void encode_event(pbuf *b, double wall_time, int64_t step, const char *file_version,
                         const qrl_tfevents_scalar *v, size_t n) {
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    pb_key(b, 1, 1);
    pb_le(b, bits, 8);
    if (step != 0) { /* proto3: a zero scalar is left out */
        pb_key(b, 2, 0);
        pb_varint(b, (uint64_t)step); /* int64: negatives take ten bytes, as protobuf does */
    }
    if (file_version) pb_string(b, 3, file_version, strlen(file_version));
    if (n == 0) return;
    size_t summary = 0; /* Summary length: each Value is key + len + (tag field + float field) */
    for (size_t i = 0; i < n; i++) {
        size_t tl = strlen(v[i].tag), value = 1 + varint_len(tl) + tl + 1 + 4;
        summary += 1 + varint_len(value) + value;
    }
    pb_key(b, 5, 2);
    pb_varint(b, summary);
    for (size_t i = 0; i < n; i++) {
        size_t tl = strlen(v[i].tag);
        pb_key(b, 1, 2);
        pb_varint(b, 1 + varint_len(tl) + tl + 1 + 4);
        pb_string(b, 1, v[i].tag, tl);
        uint32_t fb;
        memcpy(&fb, &v[i].value, sizeof fb);
        pb_key(b, 2, 5);
        pb_le(b, fb, 4);
    }
}

/* ---- file --------------------------------------------------------------------------- */

static double now_s(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static qrl_status write_all(qrl_tfevents_t *w, const uint8_t *p, size_t n, qrl_error *err) {
    while (n) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return qrl_error_set(err, QRL_STATUS_IO, "%s: write: %s", w->path, strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return QRL_OK;
}

/* One record (header, data, footer) in one write, so a reader never sees half a header. */
static qrl_status write_record(qrl_tfevents_t *w, const pbuf *data, qrl_error *err) {
    size_t n = 8 + 4 + data->len + 4;
    uint8_t *rec = malloc(n);
    if (!rec) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", w->path);
    uint64_t len = data->len;
    for (int i = 0; i < 8; i++) rec[i] = (uint8_t)(len >> (8 * i));
    uint32_t hc = qrl_tfrecord_masked_crc(rec, 8), dc = qrl_tfrecord_masked_crc(data->p, data->len);
    for (int i = 0; i < 4; i++) rec[8 + i] = (uint8_t)(hc >> (8 * i));
    memcpy(rec + 12, data->p, data->len);
    for (int i = 0; i < 4; i++) rec[12 + data->len + i] = (uint8_t)(dc >> (8 * i));
    qrl_status st = write_all(w, rec, n, err);
    free(rec);
    return st;
}

static qrl_status mkdir_p(const char *dir, qrl_error *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        bool last = *p == 0;
        if (*p != '/' && !last) continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return qrl_error_set(err, QRL_STATUS_IO, "%s: mkdir: %s", path, strerror(errno));
        if (last) break;
        *p = '/';
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return qrl_error_set(err, QRL_STATUS_IO, "%s: not a directory", dir);
    return QRL_OK;
}

qrl_status qrl_tfevents_open(const char *dir, qrl_tfevents_t **out, qrl_error *err) {
    *out = NULL;
    if (!dir || !*dir) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tensorboard dir: empty path");
    QRL_TRY(mkdir_p(dir, err));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if (*p == '/') *p = '_';
    qrl_tfevents_t *w = calloc(1, sizeof *w);
    size_t plen = strlen(dir) + strlen(host) + 80;
    if (!w || !(w->path = malloc(plen))) {
        free(w);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", dir);
    }
    double t = now_s();
    /* TensorFlow's name; a second writer in the same second gets a ".<pid>.<n>" suffix
     * (TensorBoard reads every file whose name contains "tfevents"). */
    for (int attempt = 0;; attempt++) {
        int k = snprintf(w->path, plen, "%s/events.out.tfevents.%010lld.%s", dir, (long long)t, host);
        if (attempt) snprintf(w->path + k, plen - (size_t)k, ".%d.%d", (int)getpid(), attempt);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd >= 0 || errno != EEXIST || attempt == 100) break;
    }
    if (w->fd < 0) {
        qrl_status st = qrl_error_set(err, QRL_STATUS_IO, "%s: open: %s", w->path, strerror(errno));
        free(w->path);
        free(w);
        return st;
    }
    pbuf b = {0};
    encode_event(&b, t, 0, "brain.Event:2", NULL, 0);
    qrl_status st = b.oom ? qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", w->path)
                          : write_record(w, &b, err);
    free(b.p);
    if (st != QRL_OK) {
        qrl_tfevents_close(w);
        return st;
    }
    *out = w;
    return QRL_OK;
}

qrl_status qrl_tfevents_write_scalars(qrl_tfevents_t *w, int64_t step, double wall_time,
                                      const qrl_tfevents_scalar *v, size_t n, qrl_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v[i].tag || !*v[i].tag)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: scalar %zu: empty tag", w->path, i);
        total += strlen(v[i].tag) + 16;
    }
    if (total > TFEVENTS_MAX_EVENT)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: event of %zu scalars is over 16 MiB",
                             w->path, n);
    pbuf b = {0};
    encode_event(&b, wall_time > 0 ? wall_time : now_s(), step, NULL, v, n);
    qrl_status st = b.oom ? qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", w->path)
                          : write_record(w, &b, err);
    free(b.p);
    return st;
}

const char *qrl_tfevents_path(const qrl_tfevents_t *w) { return w->path; }

void qrl_tfevents_close(qrl_tfevents_t *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w->path);
    free(w);
}
