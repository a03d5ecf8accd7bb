/* Weight-sync throughput: the NCCL broadcast (common/weights/nccl_bcast.h, 2 processes on
 * GPUs 0 and 1) against the TCP stream over loopback (the daemons' framing: u32-length
 * frames of WeightManifest and WeightBucketHeader, raw bucket bytes; the receiver checks
 * each bucket's CRC-32C and then qrl_wsync_verify_stream, as services/rollout/weights.c
 * does).  The payload is a Qwen2.5-0.5B-shaped BF16 model of random data (988 MB).
 *
 *   build/bench/weight_sync [--out FILE] [--iters N]     (default 3 timed + 1 warm-up)
 *
 * NCCL numbers: send_GBps = bytes / rank 0's qrl_nccl_bcast_send time (the receiver is
 * already waiting); recv_GBps = bytes / the receiver's header-to-last-bucket time (D2H and
 * per-bucket CRCs included); verify_s = the receiver's whole-stream + per-tensor checks.
 * TCP: GBps = bytes / (connect to last bucket read, per-bucket CRCs included); verify_s
 * likewise.  JSON to --out (default bench/results/weight_sync-h200x2.json). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../tests/cuda/wsync_ranks.h"
#include "wire/wire.h"

#define MiB ((uint64_t)1 << 20)
#define MAX_ITERS 16

static const uint64_t BUCKETS_MIB[] = {1, 4, 16, 64};
#define N_BUCKETS (sizeof BUCKETS_MIB / sizeof *BUCKETS_MIB)
static int iters = 3;

typedef struct payload {
    qrl_wsync_tensor t[WR_MAX_TENSORS];
    size_t n;
    uint64_t total;
    uint8_t *stream;
} payload;

static void payload_make(payload *p) {
    p->n = wr_qwen_tensors(24, p->t, &p->total);
    p->stream = malloc(p->total);
    if (!p->stream) exit(2);
    wr_fill(p->stream, p->total, 2026);
}

static void die(const char *what, const qrl_error *e) {
    fprintf(stderr, "weight_sync: %s: %s\n", what, e ? e->msg : strerror(errno));
    exit(1);
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
            double t = v[k];
            v[k] = v[k - 1];
            v[k - 1] = t;
        }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

/* ---- NCCL ------------------------------------------------------------------------------- */

/* config k: bucket BUCKETS_MIB[k / 2], source pageable (k even) or page-locked (k odd) */
static int rank_bench(wr_ctx *x) {
    payload p;
    payload_make(&p);
    uint8_t id[QRL_NCCL_ID_BYTES];
    qrl_error err;
    qrl_nccl_comm_t *c;
    if (wr_exchange_id(x, id, 30000) != 0) return 3;
    if (qrl_nccl_comm_init(id, 1, x->rank, x->world, x->rank, 60000, &c, &err) != QRL_OK) die("init", &err);
    uint8_t *pinned = x->rank == 0 ? qrl_nccl_host_alloc(p.total) : NULL;
    if (pinned) memcpy(pinned, p.stream, p.total);
    for (size_t k = 0; k < 2 * N_BUCKETS; k++) {
        uint64_t bucket = BUCKETS_MIB[k / 2] * MiB;
        uint8_t *mb = NULL;
        size_t ml = 0;
        uint32_t *crc = NULL;
        if (x->rank == 0) {
            crc = malloc(sizeof *crc * qrl_wsync_bucket_count(p.total, bucket));
            qrl_wsync_bucket_crcs(p.stream, p.total, bucket, crc);
            if (qrl_wsync_manifest_encode(p.t, p.n, p.stream, p.total, k + 1, 1, bucket, &mb, &ml, &err) != QRL_OK)
                die("manifest", &err);
        }
        for (int it = -1; it < iters; it++) {
            char line[256];
            int len;
            if (x->rank == 0) {
                usleep(400 * 1000); /* the receiver is waiting in recv by now */
                double t0 = wr_now();
                if (qrl_nccl_bcast_send(c, mb, ml, (k & 1) ? pinned : p.stream, p.total, crc, 60000, &err) != QRL_OK)
                    die("send", &err);
                len = snprintf(line, sizeof line, "S %zu %d %.6f\n", k, it, wr_now() - t0);
            } else {
                qrl_nccl_version v;
                if (qrl_nccl_bcast_recv(c, k + 1, (uint64_t)4 << 30, 60000, &v, &err) != QRL_OK) die("recv", &err);
                if (it == -1 && memcmp(v.stream, p.stream, p.total) != 0) {
                    fprintf(stderr, "weight_sync: received bytes differ\n");
                    return 4;
                }
                len = snprintf(line, sizeof line, "R %zu %d %.6f %.6f\n", k, it, v.xfer_s, v.verify_s);
                qrl_nccl_version_recycle(c, &v);
            }
            if (it >= 0 && write(x->res_wr, line, (size_t)len) != len) return 5;
        }
        free(mb);
        free(crc);
    }
    qrl_nccl_host_free(pinned);
    qrl_nccl_comm_destroy(c);
    free(p.stream);
    return 0;
}

/* ---- TCP over loopback ---------------------------------------------------------------- */

typedef struct tcp_srv {
    int lfd;
    const payload *p;
    const uint8_t *manifest;
    size_t manifest_len;
    uint64_t bucket;
    int conns;
} tcp_srv;

static int put_all(int fd, const void *buf, size_t n) {
    const uint8_t *b = buf;
    while (n) {
        ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int put_frame(int fd, const uint8_t *b, size_t len) {
    uint8_t l[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    return put_all(fd, l, 4) || put_all(fd, b, len);
}

static void *tcp_serve(void *arg) { /* services/learner/weights.c serve_conn, per connection */
    tcp_srv *s = arg;
    uint32_t count = qrl_wsync_bucket_count(s->p->total, s->bucket);
    for (int k = 0; k < s->conns; k++) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) break;
        int bad = put_frame(fd, s->manifest, s->manifest_len);
        for (uint32_t i = 0; !bad && i < count; i++) {
            uint64_t off, size;
            qrl_wsync_bucket_range(s->p->total, s->bucket, i, &off, &size);
            Qrl__WeightBucketHeader h = QRL__WEIGHT_BUCKET_HEADER__INIT;
            h.version = 1;
            h.bucket_index = i;
            h.bucket_count = count;
            h.byte_offset = off;
            h.byte_size = size;
            h.checksum = qrl_wire_crc32c(0, s->p->stream + off, size);
            uint8_t hb[256];
            size_t hl;
            qrl_error err;
            bad = qrl_wire_encode(&h.base, hb, sizeof hb, &hl, &err) != QRL_OK || put_frame(fd, hb, hl) ||
                  put_all(fd, s->p->stream + off, size);
        }
        close(fd);
    }
    return NULL;
}

static int read_full(int fd, void *buf, size_t n) {
    uint8_t *b = buf;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static ProtobufCMessage *read_frame(int fd, const ProtobufCMessageDescriptor *d) {
    uint8_t l[4];
    if (read_full(fd, l, 4)) return NULL;
    size_t len = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
    uint8_t *b = malloc(len);
    ProtobufCMessage *m = NULL;
    qrl_error err;
    if (b && !read_full(fd, b, len) && qrl_wire_decode(d, b, len, 16 << 20, &m, &err) != QRL_OK) m = NULL;
    free(b);
    return m;
}

/* One receive as services/rollout/weights.c does it; returns the xfer seconds, *verify_s. */
static double tcp_receive(int port, uint8_t *dst, const payload *p, double *verify_s) {
    double t0 = wr_now();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect", NULL);
    Qrl__WeightManifest *mf = (Qrl__WeightManifest *)read_frame(fd, &qrl__weight_manifest__descriptor);
    if (!mf || mf->total_bytes != p->total) die("manifest frame", NULL);
    for (uint32_t i = 0; i < mf->bucket_count; i++) {
        Qrl__WeightBucketHeader *h = (Qrl__WeightBucketHeader *)read_frame(fd, &qrl__weight_bucket_header__descriptor);
        if (!h || h->bucket_index != i || read_full(fd, dst + h->byte_offset, h->byte_size)) die("bucket", NULL);
        if (qrl_wire_crc32c(0, dst + h->byte_offset, h->byte_size) != (uint32_t)h->checksum) die("bucket crc", NULL);
        qrl_wire_free(&h->base);
    }
    double t1 = wr_now();
    qrl_error err;
    if (qrl_wsync_verify_stream(mf, dst, p->total, NULL, &err) != QRL_OK) die("verify", &err);
    *verify_s = wr_now() - t1;
    qrl_wire_free(&mf->base);
    close(fd);
    return t1 - t0;
}

static void tcp_bench(const payload *p, uint64_t bucket, double *gbps, double *verify) {
    tcp_srv s = {.p = p, .bucket = bucket, .conns = iters + 1};
    qrl_error err;
    if (qrl_wsync_manifest_encode(p->t, p->n, p->stream, p->total, 1, 0, bucket, (uint8_t **)&s.manifest,
                                  &s.manifest_len, &err) != QRL_OK)
        die("manifest", &err);
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(s.lfd, (struct sockaddr *)&a, sizeof a) || listen(s.lfd, 4) ||
        getsockname(s.lfd, (struct sockaddr *)&a, &al))
        die("listen", NULL);
    pthread_t th;
    pthread_create(&th, NULL, tcp_serve, &s);
    uint8_t *dst = malloc(p->total);
    double x[MAX_ITERS], v[MAX_ITERS];
    for (int it = -1; it < iters; it++) {
        double vs, xs = tcp_receive(ntohs(a.sin_port), dst, p, &vs);
        if (it == -1 && memcmp(dst, p->stream, p->total)) die("tcp bytes differ", NULL);
        if (it >= 0) {
            x[it] = (double)p->total / xs / 1e9;
            v[it] = vs;
        }
    }
    pthread_join(th, NULL);
    close(s.lfd);
    free(dst);
    free((void *)s.manifest);
    *gbps = median(x, iters);
    *verify = median(v, iters);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/weight_sync-h200x2.json";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--out FILE] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || iters > MAX_ITERS) iters = 3;
    int gpus = wr_gpu_count();
    /* NCCL first (children), then TCP in this process */
    static char res[1 << 16];
    double send[2 * N_BUCKETS][MAX_ITERS], xfer[2 * N_BUCKETS][MAX_ITERS], ver[2 * N_BUCKETS][MAX_ITERS];
    bool nccl = gpus >= 2;
    if (nccl) {
        int rc[WR_MAX_RANKS];
        wr_run(2, 2, rank_bench, NULL, 400, rc, res, sizeof res);
        if (rc[0] || rc[1]) {
            fprintf(stderr, "weight_sync: nccl ranks exited %d %d\n", rc[0], rc[1]);
            nccl = false;
        }
        for (char *l = strtok(res, "\n"); l; l = strtok(NULL, "\n")) {
            size_t k;
            int it;
            double a, b;
            if (sscanf(l, "S %zu %d %lf", &k, &it, &a) == 3 && k < 2 * N_BUCKETS && it >= 0 && it < iters)
                send[k][it] = a;
            else if (sscanf(l, "R %zu %d %lf %lf", &k, &it, &a, &b) == 4 && k < 2 * N_BUCKETS && it >= 0 && it < iters) {
                xfer[k][it] = a;
                ver[k][it] = b;
            }
        }
    } else {
        fprintf(stderr, "weight_sync: %d GPU(s): NCCL part skipped\n", gpus);
    }
    payload p;
    payload_make(&p);
    double tcp_gbps[2], tcp_ver[2];
    const uint64_t tcp_buckets[2] = {1, 16};
    for (int b = 0; b < 2; b++) tcp_bench(&p, tcp_buckets[b] * MiB, &tcp_gbps[b], &tcp_ver[b]);

    FILE *f = fopen(out, "w");
    if (!f) die(out, NULL);
    fprintf(f, "{\n  \"bench\": \"weight_sync\",\n  \"payload\": \"Qwen2.5-0.5B-shaped BF16, random data, %zu tensors\",\n"
               "  \"bytes\": %llu,\n  \"gpus\": %d,\n  \"iters\": %d,\n  \"nccl\": [",
            p.n, (unsigned long long)p.total, gpus, iters);
    printf("%-28s %10s %10s %10s\n", "transport", "send GB/s", "recv GB/s", "verify s");
    for (size_t k = 0; nccl && k < 2 * N_BUCKETS; k++) {
        double s[MAX_ITERS], r[MAX_ITERS], v[MAX_ITERS], best = 0;
        for (int i = 0; i < iters; i++) {
            s[i] = (double)p.total / send[k][i] / 1e9;
            r[i] = (double)p.total / xfer[k][i] / 1e9;
            v[i] = ver[k][i];
            if (s[i] > best) best = s[i];
        }
        double sm = median(s, iters), rm = median(r, iters), vm = median(v, iters);
        fprintf(f, "%s\n    {\"bucket_mib\": %llu, \"source\": \"%s\", \"send_GBps_median\": %.3f, \"send_GBps_best\": %.3f, "
                   "\"recv_GBps_median\": %.3f, \"recv_verify_s_median\": %.4f}",
                k ? "," : "", (unsigned long long)BUCKETS_MIB[k / 2], (k & 1) ? "pinned" : "pageable", sm, best, rm, vm);
        char name[64];
        snprintf(name, sizeof name, "nccl %2llu MiB %s", (unsigned long long)BUCKETS_MIB[k / 2],
                 (k & 1) ? "pinned" : "pageable");
        printf("%-28s %10.2f %10.2f %10.3f\n", name, sm, rm, vm);
    }
    fprintf(f, "\n  ],\n  \"tcp_loopback\": [");
    for (int b = 0; b < 2; b++) {
        fprintf(f, "%s\n    {\"bucket_mib\": %llu, \"GBps_median\": %.3f, \"verify_s_median\": %.4f}", b ? "," : "",
                (unsigned long long)tcp_buckets[b], tcp_gbps[b], tcp_ver[b]);
        char name[64];
        snprintf(name, sizeof name, "tcp loopback %2llu MiB", (unsigned long long)tcp_buckets[b]);
        printf("%-28s %10.2f %10.2f %10.3f\n", name, tcp_gbps[b], tcp_gbps[b], tcp_ver[b]);
    }
    fprintf(f, "\n  ]\n}\n");
    fclose(f);
    free(p.stream);
    printf("wrote %s\n", out);
    return nccl || gpus < 2 ? 0 : 1;
}
