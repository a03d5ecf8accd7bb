/* NCCL weight broadcast across processes, one GPU each (common/weights/nccl_bcast.h):
 * a Qwen2.5-0.5B-shaped BF16 stream (random data) from rank 0 arrives byte-exact and
 * verified; a corrupted bucket is refused and the next attempt on the same communicator
 * succeeds; a rank that dies leaves the others with an error within their timeout (no
 * hang); a rank that never joins makes the init time out.  Skipped below 2 GPUs (the
 * init-timeout case needs one). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"
#include "wsync_ranks.h"

#define MiB ((uint64_t)1 << 20)

static int need_gpus(int n) {
    int g = wr_gpu_count();
    if (g < n) cr_skip_test("%d GPU(s) visible, this case needs %d", g, n);
    return g;
}

/* A model, its stream and manifest, as every rank builds it from the seed. */
typedef struct model {
    qrl_wsync_tensor t[WR_MAX_TENSORS];
    size_t n;
    uint64_t total, bucket;
    uint8_t *stream, *manifest;
    size_t manifest_len;
    uint32_t *crc;
} model;

static int model_build(model *m, int layers, uint64_t bucket, uint64_t version, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->n = wr_qwen_tensors(layers, m->t, &m->total);
    m->bucket = bucket;
    m->stream = malloc(m->total);
    m->crc = malloc(sizeof *m->crc * (qrl_wsync_bucket_count(m->total, bucket) + 1));
    if (!m->stream || !m->crc) return -1;
    wr_fill(m->stream, m->total, seed);
    qrl_error err;
    if (qrl_wsync_manifest_encode(m->t, m->n, m->stream, m->total, version, 1, bucket, &m->manifest,
                                  &m->manifest_len, &err) != QRL_OK) {
        fprintf(stderr, "manifest: %s\n", err.msg);
        return -1;
    }
    qrl_wsync_bucket_crcs(m->stream, m->total, bucket, m->crc);
    return 0;
}

static void model_free(model *m) {
    free(m->stream);
    free(m->manifest);
    free(m->crc);
}

static int join(wr_ctx *x, int timeout_ms, qrl_nccl_comm_t **c) {
    uint8_t id[QRL_NCCL_ID_BYTES];
    if (wr_exchange_id(x, id, 30000) != 0) {
        fprintf(stderr, "rank %d: no unique id\n", x->rank);
        return -1;
    }
    qrl_error err;
    if (qrl_nccl_comm_init(id, 1, x->rank, x->world, x->rank, timeout_ms, c, &err) != QRL_OK) {
        fprintf(stderr, "rank %d: init: %s\n", x->rank, err.msg);
        return -1;
    }
    return 0;
}

#define FAILF(...)                                                                                \
    do {                                                                                          \
        fprintf(stderr, __VA_ARGS__);                                                             \
        fprintf(stderr, "\n");                                                                    \
        rc = 1;                                                                                   \
        goto out;                                                                                 \
    } while (0)

/* ---- the whole model, every rank checks bytes and CRCs ------------------------------------- */

static int rank_qwen(wr_ctx *x) {
    model m;
    qrl_nccl_comm_t *c = NULL;
    qrl_nccl_version v = {0};
    qrl_error err;
    int rc = 0;
    if (model_build(&m, 24, 16 * MiB, 5, 1234) != 0) FAILF("rank %d: model", x->rank);
    if (join(x, 60000, &c) != 0) FAILF("rank %d: join", x->rank);
    for (int rep = 0; rep < 2; rep++) { /* the second one is the warm number */
        if (x->rank == 0) {
            double t0 = wr_now();
            if (qrl_nccl_bcast_send(c, m.manifest, m.manifest_len, m.stream, m.total, m.crc, 60000, &err) != QRL_OK)
                FAILF("rank 0: send %d: %s", rep, err.msg);
            double s = wr_now() - t0;
            printf("nccl_bcast qwen0.5b world=%d rep=%d bytes=%llu bucket_mib=16 send_s=%.4f send_GBps=%.2f\n",
                   x->world, rep, (unsigned long long)m.total, s, (double)m.total / s / 1e9);
        } else {
            if (qrl_nccl_bcast_recv(c, 5, (uint64_t)4 << 30, 60000, &v, &err) != QRL_OK)
                FAILF("rank %d: recv %d: %s", x->rank, rep, err.msg);
            if (v.total != m.total || memcmp(v.stream, m.stream, m.total) != 0)
                FAILF("rank %d: bytes differ", x->rank);
            if (v.manifest->n_tensors != m.n || strcmp(v.manifest->tensors[m.n - 1]->name, "model.norm.weight") ||
                (uint32_t)v.manifest->checksum != qrl_wire_crc32c(0, m.stream, m.total) || v.version != 5)
                FAILF("rank %d: manifest differs", x->rank);
            printf("nccl_bcast qwen0.5b rank=%d rep=%d xfer_s=%.4f recv_GBps=%.2f verify_s=%.4f\n", x->rank, rep,
                   v.xfer_s, (double)v.total / v.xfer_s / 1e9, v.verify_s);
            qrl_nccl_version_recycle(c, &v); /* the second receive reuses the page-locked buffer */
        }
    }
out:
    qrl_nccl_version_free(&v);
    qrl_nccl_comm_destroy(c);
    model_free(&m);
    return rc;
}

Test(nccl_bcast, qwen_shaped_model_arrives_verified, .timeout = 120) {
    int g = need_gpus(2), world = g < 3 ? g : 3, rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(world, world, rank_qwen, NULL, 100, rc, res, sizeof res);
    for (int r = 0; r < world; r++) cr_expect_eq(rc[r], 0, "rank %d exit %d after %.1f s", r, rc[r], s);
}

/* ---- the device path: from rank 0's device memory into the receivers', checked there ---- */

static int rank_device(wr_ctx *x) {
    model m;
    qrl_nccl_comm_t *c = NULL;
    Qrl__WeightManifest *mf = NULL;
    uint8_t *d = NULL, *back = NULL;
    qrl_error err;
    int rc = 0;
    if (model_build(&m, 4, 16 * MiB, 6, 77) != 0) FAILF("rank %d: model", x->rank);
    if (join(x, 60000, &c) != 0) FAILF("rank %d: join", x->rank);
    if (cudaMalloc((void **)&d, m.total) != cudaSuccess) FAILF("rank %d: cudaMalloc", x->rank);
    uint64_t hit = 16 * MiB + 777; /* inside bucket 1 */
    if (x->rank == 0) {
        m.stream[hit] ^= 0x08; /* the first send is corrupt after its CRCs were taken */
        for (int rep = 0; rep < 2; rep++) {
            if (cudaMemcpy(d, m.stream, m.total, cudaMemcpyHostToDevice) != cudaSuccess) FAILF("rank 0: upload");
            double t0 = wr_now();
            if (qrl_nccl_bcast_send_device(c, m.manifest, m.manifest_len, d, m.total, m.crc, 60000, &err) != QRL_OK)
                FAILF("rank 0: send_device %d: %s", rep, err.msg);
            printf("nccl_bcast device rep=%d bytes=%llu send_s=%.4f\n", rep, (unsigned long long)m.total,
                   wr_now() - t0);
            m.stream[hit] ^= 0x08;
        }
    } else {
        qrl_status st = qrl_nccl_bcast_recv_device(c, 6, (uint64_t)4 << 30, d, m.total, 60000, &mf, &err);
        if (st != QRL_STATUS_CORRUPT || !strstr(err.msg, "bucket 1") || mf)
            FAILF("rank %d: corrupt device bucket gave %s: %s", x->rank, qrl_status_name(st), err.msg);
        if (qrl_nccl_bcast_recv_device(c, 6, (uint64_t)4 << 30, d, m.total, 60000, &mf, &err) != QRL_OK)
            FAILF("rank %d: recv_device: %s", x->rank, err.msg);
        back = malloc(m.total);
        if (!back || cudaMemcpy(back, d, m.total, cudaMemcpyDeviceToHost) != cudaSuccess ||
            memcmp(back, m.stream, m.total) != 0)
            FAILF("rank %d: device bytes differ", x->rank);
        if (mf->n_tensors != m.n || mf->version != 6) FAILF("rank %d: manifest differs", x->rank);
    }
out:
    qrl_wire_free(mf ? &mf->base : NULL);
    free(back);
    if (d) cudaFree(d);
    qrl_nccl_comm_destroy(c);
    model_free(&m);
    return rc;
}

Test(nccl_bcast, device_path_arrives_verified_corrupt_refused, .timeout = 90) {
    int g = need_gpus(2), world = g < 3 ? g : 3, rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(world, world, rank_device, NULL, 60, rc, res, sizeof res);
    for (int r = 0; r < world; r++) cr_expect_eq(rc[r], 0, "rank %d exit %d after %.1f s", r, rc[r], s);
}

/* ---- a corrupt bucket is refused; the next attempt on the same communicator works ------- */

static int rank_corrupt(wr_ctx *x) {
    model m;
    qrl_nccl_comm_t *c = NULL;
    qrl_nccl_version v = {0};
    qrl_error err;
    int rc = 0;
    if (model_build(&m, 2, 4 * MiB, 8, 99) != 0) FAILF("rank %d: model", x->rank);
    if (join(x, 60000, &c) != 0) FAILF("rank %d: join", x->rank);
    uint64_t hit = 3 * 4 * MiB + 12345; /* inside bucket 3 */
    if (x->rank == 0) {
        m.stream[hit] ^= 0x40; /* after the CRCs were taken: the wire "flipped" a bit */
        if (qrl_nccl_bcast_send(c, m.manifest, m.manifest_len, m.stream, m.total, m.crc, 30000, &err) != QRL_OK)
            FAILF("rank 0: send (corrupt): %s", err.msg);
        m.stream[hit] ^= 0x40;
        if (qrl_nccl_bcast_send(c, m.manifest, m.manifest_len, m.stream, m.total, m.crc, 30000, &err) != QRL_OK)
            FAILF("rank 0: send (retry): %s", err.msg);
    } else {
        qrl_status st = qrl_nccl_bcast_recv(c, 8, (uint64_t)1 << 30, 30000, &v, &err);
        if (st != QRL_STATUS_CORRUPT || !strstr(err.msg, "bucket 3 CRC-32C mismatch") || v.stream)
            FAILF("rank %d: corrupt bucket gave %s: %s", x->rank, qrl_status_name(st), err.msg);
        printf("rank %d refused: %s\n", x->rank, err.msg);
        if (!qrl_nccl_comm_ok(c)) FAILF("rank %d: communicator lost after a refusal", x->rank);
        if (qrl_nccl_bcast_recv(c, 8, (uint64_t)1 << 30, 30000, &v, &err) != QRL_OK)
            FAILF("rank %d: retry: %s", x->rank, err.msg);
        if (memcmp(v.stream, m.stream, m.total) != 0) FAILF("rank %d: retry bytes differ", x->rank);
    }
out:
    qrl_nccl_version_free(&v);
    qrl_nccl_comm_destroy(c);
    model_free(&m);
    return rc;
}

Test(nccl_bcast, corrupt_bucket_refused_then_retried, .timeout = 90) {
    need_gpus(2);
    int rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(2, 2, rank_corrupt, NULL, 60, rc, res, sizeof res);
    cr_expect_eq(rc[0], 0, "rank 0 exit %d after %.1f s", rc[0], s);
    cr_expect_eq(rc[1], 0, "rank 1 exit %d after %.1f s", rc[1], s);
}

/* ---- membership change: the communicator is destroyed and a new epoch joined ------------- */

static int rank_epochs(wr_ctx *x) {
    model m;
    qrl_nccl_comm_t *c = NULL;
    qrl_nccl_version v = {0};
    qrl_error err;
    int rc = 0;
    if (model_build(&m, 1, 1 * MiB, 4, 5) != 0) FAILF("rank %d: model", x->rank);
    for (uint64_t epoch = 1; epoch <= 3; epoch++) { /* what a membership change does at both ends */
        uint8_t id[QRL_NCCL_ID_BYTES];
        qrl_nccl_comm_destroy(c);
        c = NULL;
        if (wr_exchange_id(x, id, 30000) != 0) FAILF("rank %d: no id for epoch %llu", x->rank, (unsigned long long)epoch);
        if (qrl_nccl_comm_init(id, epoch, x->rank, x->world, x->rank, 30000, &c, &err) != QRL_OK)
            FAILF("rank %d: epoch %llu: %s", x->rank, (unsigned long long)epoch, err.msg);
        if (x->rank == 0) {
            if (qrl_nccl_bcast_send(c, m.manifest, m.manifest_len, m.stream, m.total, m.crc, 30000, &err) != QRL_OK)
                FAILF("rank 0: epoch %llu: %s", (unsigned long long)epoch, err.msg);
        } else {
            if (qrl_nccl_bcast_recv(c, 4, (uint64_t)1 << 30, 30000, &v, &err) != QRL_OK)
                FAILF("rank %d: epoch %llu: %s", x->rank, (unsigned long long)epoch, err.msg);
            if (v.sync_epoch != epoch || memcmp(v.stream, m.stream, m.total) != 0)
                FAILF("rank %d: epoch %llu: got epoch %llu or other bytes", x->rank, (unsigned long long)epoch,
                      (unsigned long long)v.sync_epoch);
            qrl_nccl_version_free(&v);
        }
    }
    printf("rank %d: three epochs joined and used\n", x->rank);
out:
    qrl_nccl_version_free(&v);
    qrl_nccl_comm_destroy(c);
    model_free(&m);
    return rc;
}

Test(nccl_bcast, new_epoch_after_membership_change, .timeout = 90) {
    need_gpus(2);
    int rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(2, 2, rank_epochs, NULL, 60, rc, res, sizeof res);
    cr_expect_eq(rc[0], 0, "rank 0 exit %d after %.1f s", rc[0], s);
    cr_expect_eq(rc[1], 0, "rank 1 exit %d after %.1f s", rc[1], s);
}

/* ---- a rank dies: the other one errors out within its timeout ---------------------------- */

typedef struct dies_arg {
    int victim;          /* the rank that exits right after joining */
} dies_arg;

static int rank_dies(wr_ctx *x) {
    const dies_arg *a = x->arg;
    model m;
    qrl_nccl_comm_t *c = NULL;
    qrl_nccl_version v = {0};
    qrl_error err;
    int rc = 0;
    if (model_build(&m, 4, 4 * MiB, 3, 7) != 0) FAILF("rank %d: model", x->rank);
    if (join(x, 60000, &c) != 0) FAILF("rank %d: join", x->rank);
    if (x->rank == a->victim) _exit(42); /* no destroy, no goodbye */
    usleep(500 * 1000);                  /* let it be gone */
    double t0 = wr_now();
    qrl_status st = x->rank == 0
                        ? qrl_nccl_bcast_send(c, m.manifest, m.manifest_len, m.stream, m.total, m.crc, 4000, &err)
                        : qrl_nccl_bcast_recv(c, 3, (uint64_t)1 << 30, 4000, &v, &err);
    double s = wr_now() - t0;
    printf("rank %d with rank %d dead: %s after %.2f s: %s\n", x->rank, a->victim, qrl_status_name(st), s, err.msg);
    if (st == QRL_OK) FAILF("rank %d: transfer to/from a dead rank succeeded", x->rank);
    if (st != QRL_STATUS_TIMEOUT && st != QRL_STATUS_NETWORK) FAILF("rank %d: status %s", x->rank, qrl_status_name(st));
    if (s > 12) FAILF("rank %d: %.1f s for a 4 s timeout", x->rank, s);
    if (qrl_nccl_comm_ok(c)) FAILF("rank %d: communicator still marked usable", x->rank);
    /* a dead communicator answers at once */
    if (qrl_nccl_bcast_recv(c, 3, 1, 4000, &v, &err) != QRL_STATUS_NETWORK) FAILF("rank %d: dead comm reused", x->rank);
out:
    t0 = wr_now();
    qrl_nccl_comm_destroy(c);
    if (wr_now() - t0 > 10) {
        fprintf(stderr, "rank %d: destroy took %.1f s\n", x->rank, wr_now() - t0);
        rc = 1;
    }
    qrl_nccl_version_free(&v);
    model_free(&m);
    return rc;
}

Test(nccl_bcast, dead_receiver_sender_times_out, .timeout = 60) {
    need_gpus(2);
    dies_arg a = {.victim = 1};
    int rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(2, 2, rank_dies, &a, 45, rc, res, sizeof res);
    cr_expect_eq(rc[1], 42, "victim exit %d", rc[1]);
    cr_expect_eq(rc[0], 0, "rank 0 exit %d after %.1f s (-1000: hung and killed)", rc[0], s);
}

Test(nccl_bcast, dead_sender_receiver_times_out, .timeout = 60) {
    need_gpus(2);
    dies_arg a = {.victim = 0};
    int rc[WR_MAX_RANKS];
    char res[16];
    double s = wr_run(2, 2, rank_dies, &a, 45, rc, res, sizeof res);
    cr_expect_eq(rc[0], 42, "victim exit %d", rc[0]);
    cr_expect_eq(rc[1], 0, "rank 1 exit %d after %.1f s (-1000: hung and killed)", rc[1], s);
}

/* ---- a rank that never joins: init times out and aborts ---------------------------------- */

static int rank_alone(wr_ctx *x) {
    uint8_t id[QRL_NCCL_ID_BYTES];
    qrl_error err;
    if (qrl_nccl_unique_id(id, &err) != QRL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    qrl_nccl_comm_t *c = (qrl_nccl_comm_t *)1;
    double t0 = wr_now();
    qrl_status st = qrl_nccl_comm_init(id, 1, 0, 2, 0, 3000, &c, &err);
    double s = wr_now() - t0;
    printf("init alone: %s after %.2f s: %s\n", qrl_status_name(st), s, err.msg);
    return st == QRL_STATUS_TIMEOUT && c == NULL && s < 10 ? 0 : 1;
}

Test(nccl_bcast, init_without_peers_times_out, .timeout = 45) {
    need_gpus(1);
    int rc[WR_MAX_RANKS];
    char res[16];
    wr_run(1, 2, rank_alone, NULL, 30, rc, res, sizeof res);
    cr_expect_eq(rc[0], 0, "exit %d", rc[0]);
}
