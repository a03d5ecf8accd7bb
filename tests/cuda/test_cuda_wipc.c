/* The device weight path (issue 18): CRC-32C on the device against the CPU, and CUDA IPC
 * between two processes on one GPU (common/weights/wipc.h).  A "learner" process holds a
 * random model's F32 parameters on the device and publishes versions into IPC slots; a
 * "replica" process maps them and checks that
 *   - the stream it received equals the learner's BF16 cast (qrl_f32_to_bf16 of every
 *     parameter, the host snapshot's bytes) bit for bit;
 *   - engines filled from the device stream (qrl_cuda_forward_upload_stream: BF16 copies,
 *     W8A8 INT8 / FP8 quantized on the device) decode memcmp-equal logits to engines
 *     filled from a host model of the same values (qrl_cuda_forward_upload after
 *     qrl_model_quantize): the weights are the same;
 *   - a corrupted byte in a bucket is refused (CORRUPT), and a slot reused by a newer
 *     version is reported BUSY, never used.
 * The test process itself never touches CUDA: both sides are forked children. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/tensor.h"
#include "cuda/crc32c.cuh"
#include "model/forward_cuda.h"
#include "model/model.h"
#include "weights/wipc.h"
#include "wire/wire.h"

#include <cuda_runtime_api.h>

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int gpus(void) {
    /* in a child: the parent must stay CUDA-free */
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void run_child(int (*fn)(void *), void *arg, pid_t *pid) {
    *pid = fork();
    if (*pid == 0) {
        fflush(stdout);
        _exit(fn(arg));
    }
}

static int wait_child(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* ---- CRC-32C on the device ---------------------------------------------------------- */

static int crc_child(void *arg) {
    (void)arg;
    uint64_t s = 7;
    size_t n = (size_t)9 << 20;
    uint8_t *h = malloc(n), *d = NULL;
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)rng(&s);
    if (cudaMalloc((void **)&d, n) != cudaSuccess || cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess)
        return 2;
    enum { R = 300 };
    uint64_t off[R], len[R];
    uint32_t got[R];
    for (int i = 0; i < R; i++) {
        off[i] = rng(&s) % n;
        uint64_t maxl = n - off[i];
        /* lengths spread over 0 .. several groups (256 KiB each), any alignment */
        uint64_t l = i % 5 == 0 ? rng(&s) % 64 : i % 5 == 1 ? rng(&s) % 4096 : rng(&s) % ((uint64_t)3 << 20);
        len[i] = l < maxl ? l : maxl;
    }
    off[0] = 0, len[0] = n;             /* the whole buffer */
    off[1] = 3, len[1] = 1024 * 256 * 2; /* exactly two groups, misaligned */
    off[2] = 0, len[2] = 0;
    qrl_error err;
    if (qrl_cuda_crc32c_ranges(d, off, len, R, got, qrl_crc32c_fold_tables(), NULL, &err) != QRL_OK) {
        fprintf(stderr, "crc32c: %s\n", err.msg);
        return 3;
    }
    int bad = 0;
    for (int i = 0; i < R; i++) {
        uint32_t want = qrl_wire_crc32c(0, h + off[i], len[i]);
        if (got[i] != want && bad++ < 5)
            fprintf(stderr, "range %d [%llu, +%llu): device %08x, cpu %08x\n", i, (unsigned long long)off[i],
                    (unsigned long long)len[i], got[i], want);
    }
    cudaFree(d);
    free(h);
    return bad ? 4 : 0;
}

Test(cuda_wipc, crc32c_ranges_equal_cpu, .timeout = 60) {
    if (!gpus()) cr_skip_test("no CUDA device");
    pid_t p;
    run_child(crc_child, NULL, &p);
    cr_assert_eq(wait_child(p), 0, "device CRC-32C differs from qrl_wire_crc32c (see stderr)");
}

/* ---- CUDA IPC between two processes --------------------------------------------------- */

static qrl_model_config test_cfg(void) {
    qrl_model_config c = {.dim = 256, .hidden_dim = 512, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .head_dim = 64, .vocab_size = 1000, .max_seq_len = 64, .norm_eps = 1e-6f,
                          .rope = {.theta = 1000000}, .qk_norm = true, .qkv_bias = true};
    return c;
}

static qrl_model *test_model(uint64_t seed) {
    qrl_model_config c = test_cfg();
    qrl_model *m;
    qrl_error err;
    if (qrl_model_new(&c, &m, &err) != QRL_OK) {
        fprintf(stderr, "model: %s\n", err.msg);
        return NULL;
    }
    qrl_model_init_random(m, seed);
    return m;
}

/* The learner's versions: v1 = the model, v2 = v1 with every weight * 0.5, v3 = * 0.25. */
typedef struct pipes {
    int to_rx[2], to_tx[2];
} pipes;

static int put(int fd, const void *p, size_t n) { return write(fd, p, n) == (ssize_t)n ? 0 : -1; }
static int get(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static int learner_child(void *arg) {
    pipes *pp = arg;
    qrl_model *m = test_model(11);
    if (!m) return 2;
    size_t nparams = (size_t)(m->rope_inv_freq - m->arena);
    float *d = NULL;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc((void **)&d, nparams * 4) != cudaSuccess) return 3;
    qrl_wipc_sender *s;
    qrl_error err;
    if (qrl_wipc_sender_new(0, &s, &err) != QRL_OK) return 4;
    size_t n = (size_t)m->n_tensors;
    qrl_wsync_tensor *t;
    const float **src;
    if (qrl_wipc_model_table(m, d, &t, &src, &err) != QRL_OK) return 4;
    for (uint64_t v = 1; v <= 3; v++) {
        if (v > 1)
            for (size_t i = 0; i < nparams; i++) m->arena[i] *= 0.5f;
        if (cudaMemcpy(d, m->arena, nparams * 4, cudaMemcpyHostToDevice) != cudaSuccess) return 5;
        qrl_wipc_published pub;
        /* 64 KiB buckets: many buckets, the last one short */
        if (qrl_wipc_publish(s, t, src, n, v, 65536, &pub, &err) != QRL_OK) {
            fprintf(stderr, "publish v%llu: %s\n", (unsigned long long)v, err.msg);
            return 6;
        }
        if (v == 2 && qrl_wipc_sender_corrupt(s, 2, pub.total / 2 + 1, 0x10, &err) != QRL_OK) return 7;
        free(pub.manifest);
        free(pub.bucket_crc);
        if (put(pp->to_rx[1], pub.handle, sizeof pub.handle) != 0) return 8;
        char ack;
        if (get(pp->to_tx[0], &ack, 1) != 0) return 9; /* the replica is done with v */
    }
    qrl_wipc_sender_free(s);
    return 0;
}

/* Logits of one prefill through an engine filled either way. */
static int engine_logits(const qrl_model *host, const qrl_model *names, const qrl_cuda_stream_tensor *t, size_t n,
                         qrl_precision p, float *out) {
    qrl_cuda_forward_desc d = {.max_rows = 16, .max_ctx = 64, .block_size = 16, .n_blocks = 8, .max_seqs = 2,
                               .precision = p, .eager = true};
    qrl_cuda_forward *f;
    qrl_error err;
    if (qrl_cuda_forward_new(&names->cfg, &d, &f, &err) != QRL_OK) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return -1;
    }
    /* the rope tables come with the first host upload; the stream path keeps them */
    qrl_status st = qrl_cuda_forward_upload(f, host, &err);
    if (st == QRL_OK && t) st = qrl_cuda_forward_upload_stream(f, names, t, n, &err);
    int seq;
    int32_t ids[12] = {1, 5, 9, 200, 999, 3, 17, 64, 128, 511, 7, 2};
    if (st == QRL_OK) st = qrl_cuda_forward_seq_new(f, &seq, &err);
    if (st == QRL_OK) st = qrl_cuda_forward_prefill(f, seq, ids, 12, out, true, &err);
    if (st != QRL_OK) fprintf(stderr, "engine run (%s): %s\n", qrl_precision_name(p), err.msg);
    qrl_cuda_forward_free(f);
    return st == QRL_OK ? 0 : -1;
}

static int replica_child(void *arg) {
    pipes *pp = arg;
    qrl_model *m = test_model(11); /* the same weights: the expected BF16 cast */
    if (!m) return 2;
    size_t nparams = (size_t)(m->rope_inv_freq - m->arena);
    if (cudaSetDevice(0) != cudaSuccess) return 3;
    qrl_wipc_receiver *r;
    qrl_error err;
    if (qrl_wipc_receiver_new(0, &r, &err) != QRL_OK) return 4;
    uint8_t h1[QRL_WIPC_HANDLE_BYTES], h[QRL_WIPC_HANDLE_BYTES];
    /* v1: bit for bit, and the same engine weights both ways */
    if (get(pp->to_rx[0], h1, sizeof h1) != 0) return 5;
    qrl_wipc_received rx;
    if (qrl_wipc_receive(r, h1, sizeof h1, 1, (uint64_t)nparams * 4, &rx, &err) != QRL_OK) {
        fprintf(stderr, "receive v1: %s\n", err.msg);
        return 6;
    }
    uint8_t *got = malloc(rx.total), *want = malloc(rx.total);
    if (qrl_wipc_receiver_download(r, got, rx.total, &err) != QRL_OK) return 7;
    uint64_t o = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *mt = &m->tensors[i];
        size_t numel = (size_t)mt->shape[0] * (size_t)(mt->ndim == 2 ? mt->shape[1] : 1);
        if (strcmp(rx.mf->tensors[i]->name, mt->name) != 0 || rx.mf->tensors[i]->byte_offset != o) return 8;
        for (size_t k = 0; k < numel; k++) {
            uint16_t b = qrl_f32_to_bf16(mt->data[k]);
            want[o + 2 * k] = (uint8_t)b, want[o + 2 * k + 1] = (uint8_t)(b >> 8);
        }
        o += numel * 2;
    }
    if (o != rx.total || memcmp(got, want, o) != 0) {
        fprintf(stderr, "received stream differs from the BF16 cast\n");
        return 9;
    }
    size_t n = rx.mf->n_tensors;
    qrl_cuda_stream_tensor *t = calloc(n, sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (qrl_cuda_stream_tensor){rx.mf->tensors[i]->name,
                                        (const uint16_t *)(rx.stream + rx.mf->tensors[i]->byte_offset),
                                        rx.mf->tensors[i]->byte_size / 2};
    /* the host reference: a model holding the stream's values, quantized on the CPU */
    qrl_precision ps[3] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8, QRL_PRECISION_W8A8_FP8};
    size_t V = (size_t)m->cfg.vocab_size;
    float *la = malloc(12 * V * 4), *lb = malloc(12 * V * 4);
    for (int k = 0; k < 3; k++) {
        qrl_model *ref = test_model(99), *names = test_model(98); /* different weights: overwritten */
        for (int i = 0; i < ref->n_tensors; i++) {
            qrl_model_tensor *mt = &ref->tensors[i];
            size_t numel = (size_t)mt->shape[0] * (size_t)(mt->ndim == 2 ? mt->shape[1] : 1);
            const uint8_t *b = want + rx.mf->tensors[i]->byte_offset;
            for (size_t e = 0; e < numel; e++) mt->data[e] = qrl_bf16_to_f32((uint16_t)(b[2 * e] | b[2 * e + 1] << 8));
        }
        if (qrl_model_quantize(ref, ps[k], &err) != QRL_OK || qrl_model_quantize(names, ps[k], &err) != QRL_OK)
            return 10;
        /* stream path: a host upload of other weights first, then the stream replaces them */
        if (engine_logits(names, names, t, n, ps[k], la) != 0 || engine_logits(ref, ref, NULL, 0, ps[k], lb) != 0)
            return 11;
        if (memcmp(la, lb, 12 * V * 4) != 0) {
            fprintf(stderr, "%s: logits differ between the device-stream and host uploads\n",
                    qrl_precision_name(ps[k]));
            return 12;
        }
        qrl_model_free(ref);
        qrl_model_free(names);
    }
    qrl_wire_free(&rx.mf->base);
    if (put(pp->to_tx[1], "k", 1) != 0) return 13;
    /* v2: one byte corrupted after publishing */
    if (get(pp->to_rx[0], h, sizeof h) != 0) return 14;
    qrl_status st = qrl_wipc_receive(r, h, sizeof h, 2, (uint64_t)nparams * 4, &rx, &err);
    if (st != QRL_STATUS_CORRUPT || !strstr(err.msg, "bucket")) {
        fprintf(stderr, "corrupt v2: status %d (%s)\n", (int)st, st ? err.msg : "ok");
        return 15;
    }
    if (put(pp->to_tx[1], "k", 1) != 0) return 16;
    /* v3 reused v1's slot: asking for v1 there is BUSY; v3 itself arrives */
    if (get(pp->to_rx[0], h, sizeof h) != 0) return 17;
    st = qrl_wipc_receive(r, h1, sizeof h1, 1, (uint64_t)nparams * 4, &rx, &err);
    if (st != QRL_STATUS_BUSY) {
        fprintf(stderr, "stale v1: status %d\n", (int)st);
        return 18;
    }
    if (qrl_wipc_receive(r, h, sizeof h, 3, (uint64_t)nparams * 4, &rx, &err) != QRL_OK) {
        fprintf(stderr, "receive v3: %s\n", err.msg);
        return 19;
    }
    qrl_wire_free(&rx.mf->base);
    if (put(pp->to_tx[1], "k", 1) != 0) return 20;
    qrl_wipc_receiver_free(r);
    free(got), free(want), free(t), free(la), free(lb);
    qrl_model_free(m);
    return 0;
}

Test(cuda_wipc, ipc_weights_bit_exact_corrupt_refused, .timeout = 120) {
    if (!gpus()) cr_skip_test("no CUDA device");
    pipes pp;
    cr_assert(pipe(pp.to_rx) == 0 && pipe(pp.to_tx) == 0);
    pid_t tx, rx;
    run_child(learner_child, &pp, &tx);
    run_child(replica_child, &pp, &rx);
    close(pp.to_rx[0]), close(pp.to_rx[1]), close(pp.to_tx[0]), close(pp.to_tx[1]);
    int rrx = wait_child(rx), rtx = wait_child(tx);
    cr_assert_eq(rrx, 0, "replica process failed at step %d (see stderr)", rrx);
    cr_assert_eq(rtx, 0, "learner process failed at step %d (see stderr)", rtx);
}
