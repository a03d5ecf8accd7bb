/* Helpers for the multi-process NCCL weight-sync test and bench (tests/cuda/test_nccl_bcast.c,
 * bench/weight_sync.c): a Qwen-shaped tensor table, a seeded random BF16 stream, and a
 * launcher that forks one process per rank (rank r on GPU r), hands rank 0's ncclUniqueId to
 * the others through pipes, and never waits past a deadline.  The parent never touches CUDA
 * (a CUDA context does not survive fork). */
#ifndef QRL_TESTS_CUDA_WSYNC_RANKS_H
#define QRL_TESTS_CUDA_WSYNC_RANKS_H

#if QRL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "weights/nccl_bcast.h"
#include "weights/wsync.h"

#define WR_MAX_RANKS 8
#define WR_MAX_TENSORS 512

static inline double wr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The tensor table of a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 q / 2 kv heads
 * of 64, MLP 4864, vocab 151936, tied embeddings), BF16: 494 M parameters, 988 MB.
 * `layers` < 24 gives a smaller model of the same shapes.  Names live in a static pool. */
static inline size_t wr_qwen_tensors(int layers, qrl_wsync_tensor *t, uint64_t *total) {
    static char names[WR_MAX_TENSORS][96];
    size_t n = 0;
    const uint64_t H = 896, KV = 128, F = 4864, V = 151936;
#define WR_ADD(nm, a, b, nd)                                                                     \
    do {                                                                                         \
        snprintf(names[n], sizeof names[n], "%s", nm);                                           \
        t[n] = (qrl_wsync_tensor){names[n], "BF16", {a, b}, nd};                                 \
        n++;                                                                                     \
    } while (0)
    WR_ADD("model.embed_tokens.weight", V, H, 2);
    char nm[96];
    for (int l = 0; l < layers; l++) {
#define WR_L(suffix, a, b, nd)                                                                   \
    do {                                                                                         \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                                \
        WR_ADD(nm, a, b, nd);                                                                    \
    } while (0)
        WR_L("input_layernorm.weight", H, 0, 1);
        WR_L("self_attn.q_proj.weight", H, H, 2);
        WR_L("self_attn.q_proj.bias", H, 0, 1);
        WR_L("self_attn.k_proj.weight", KV, H, 2);
        WR_L("self_attn.k_proj.bias", KV, 0, 1);
        WR_L("self_attn.v_proj.weight", KV, H, 2);
        WR_L("self_attn.v_proj.bias", KV, 0, 1);
        WR_L("self_attn.o_proj.weight", H, H, 2);
        WR_L("post_attention_layernorm.weight", H, 0, 1);
        WR_L("mlp.gate_proj.weight", F, H, 2);
        WR_L("mlp.up_proj.weight", F, H, 2);
        WR_L("mlp.down_proj.weight", H, F, 2);
#undef WR_L
    }
    WR_ADD("model.norm.weight", H, 0, 1);
#undef WR_ADD
    *total = 0;
    for (size_t i = 0; i < n; i++) *total += t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1) * 2;
    return n;
}

/* Seeded random bytes (splitmix64 per 8 bytes, blocks in parallel): the same (seed, len)
 * always gives the same stream, so a receiver can rebuild what the sender sent. */
static inline void wr_fill(uint8_t *p, uint64_t len, uint64_t seed) {
    const uint64_t blk = 1 << 20;
    int64_t nb = (int64_t)((len + blk - 1) / blk);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)b;
        uint64_t end = (uint64_t)(b + 1) * blk < len ? (uint64_t)(b + 1) * blk : len;
        for (uint64_t o = (uint64_t)b * blk; o < end; o += 8) {
            uint64_t z = (s += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
            memcpy(p + o, &z, end - o < 8 ? end - o : 8);
        }
    }
}

/* GPUs visible, counted in a child so the caller stays CUDA-free. */
static inline int wr_gpu_count(void) {
#if QRL_HAVE_CUDA
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
#else /* built without CUDA (bench in a CPU build): no GPUs */
    pid_t p = -1;
#endif
    int status = 0;
    if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
}

typedef struct wr_ctx {
    int rank, world;
    int id_rd;                 /* ranks > 0: where rank 0's id arrives */
    int id_wr[WR_MAX_RANKS];   /* rank 0: one pipe per other rank */
    int res_wr;                /* a pipe back to the parent for results (any bytes) */
    void *arg;
} wr_ctx;

/* Rank 0 makes the epoch's id and hands it out; the others wait at most timeout_ms for it. */
static inline int wr_exchange_id(wr_ctx *x, uint8_t id[QRL_NCCL_ID_BYTES], int timeout_ms) {
    if (x->rank == 0) {
        qrl_error err;
        if (qrl_nccl_unique_id(id, &err) != QRL_OK) {
            fprintf(stderr, "rank 0: %s\n", err.msg);
            return -1;
        }
        for (int r = 1; r < x->world; r++)
            if (x->id_wr[r] >= 0 && write(x->id_wr[r], id, QRL_NCCL_ID_BYTES) != QRL_NCCL_ID_BYTES) return -1;
        return 0;
    }
    size_t got = 0;
    while (got < QRL_NCCL_ID_BYTES) {
        struct pollfd pf = {.fd = x->id_rd, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) <= 0) return -1;
        ssize_t r = read(x->id_rd, id + got, QRL_NCCL_ID_BYTES - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

typedef int (*wr_rank_fn)(wr_ctx *x);

/* Fork `nprocs` processes as ranks 0..nprocs-1 of `world`, each running fn on GPU rank
 * (cudaSetDevice is the callee's).  Waits at most timeout_s, then kills what is left.
 * rc[r] = exit status (-SIGNAL if killed by a signal, -1000 if killed for the timeout).
 * The results pipe's bytes (the children's writes to x->res_wr) go to res[res_cap].
 * Returns the seconds waited. */
static inline double wr_run(int nprocs, int world, wr_rank_fn fn, void *arg, double timeout_s, int *rc,
                            char *res, size_t res_cap) {
    int idp[WR_MAX_RANKS][2], resp[2];
    for (int r = 0; r < nprocs; r++) idp[r][0] = idp[r][1] = -1;
    for (int r = 1; r < nprocs; r++)
        if (pipe(idp[r]) != 0) abort();
    if (pipe(resp) != 0) abort();
    pid_t pid[WR_MAX_RANKS];
    double t0 = wr_now();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nprocs; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            wr_ctx x = {.rank = r, .world = world, .id_rd = idp[r][0], .res_wr = resp[1], .arg = arg};
            for (int k = 0; k < WR_MAX_RANKS; k++) x.id_wr[k] = k < nprocs ? idp[k][1] : -1;
            close(resp[0]);
            setenv("NCCL_NVLS_ENABLE", "0", 1); /* NVLink multicast stays off on shared hosts */
            fflush(stdout);
            int code = fn(&x);
            fflush(stdout);
            fflush(stderr);
            _exit(code);
        }
    }
    for (int r = 1; r < nprocs; r++) {
        close(idp[r][0]);
        close(idp[r][1]);
    }
    close(resp[1]);
    int left = nprocs;
    size_t got = 0;
    for (int r = 0; r < nprocs; r++) rc[r] = -2000;
    while (left > 0) {
        struct pollfd pf = {.fd = resp[0], .events = POLLIN};
        if (poll(&pf, 1, 20) > 0) {
            char tmp[4096];
            ssize_t n = read(resp[0], tmp, sizeof tmp);
            for (ssize_t i = 0; i < n && got + 1 < res_cap; i++) res[got++] = tmp[i];
        }
        for (int r = 0; r < nprocs; r++) {
            int status;
            if (rc[r] != -2000) continue;
            if (waitpid(pid[r], &status, WNOHANG) == pid[r]) {
                rc[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
                left--;
            }
        }
        if (wr_now() - t0 > timeout_s) {
            for (int r = 0; r < nprocs; r++)
                if (rc[r] == -2000) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    rc[r] = -1000;
                }
            break;
        }
    }
    for (;;) { /* what is left in the pipe */
        char tmp[4096];
        struct pollfd pf = {.fd = resp[0], .events = POLLIN};
        if (poll(&pf, 1, 0) <= 0) break;
        ssize_t n = read(resp[0], tmp, sizeof tmp);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n && got + 1 < res_cap; i++) res[got++] = tmp[i];
    }
    if (res_cap) res[got] = 0;
    close(resp[0]);
    return wr_now() - t0;
}

#endif
