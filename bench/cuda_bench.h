/* Shared by the CUDA benchmarks (bench/w8a8.c, bench/fp4.c, bench/decode.c, bench/graphs.c,
 * bench/gemm_bf16.c): error exits, the float comparator for medians, the copy bandwidth, the
 * Qwen2.5-1.5B and Qwen3-4B shapes, and timed decode steps of the CUDA forward.  Include
 * only under QRL_HAVE_CUDA. */
#ifndef QRL_BENCH_CUDA_BENCH_H
#define QRL_BENCH_CUDA_BENCH_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "model/forward_cuda.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define QK(x) do { if ((x) != QRL_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg); exit(1); } } while (0)

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Device-to-device copy bandwidth, bytes read + written per second (median of 10). */
static inline double copy_bandwidth(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 0x5a, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, 10, sizeof *ms, cmp_f);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * bytes / (ms[5] * 1e-3);
}

/* Qwen2.5-1.5B: hidden 1536, 28 layers, 12 q / 2 kv heads, head_dim 128, QKV bias, tied
 * LM head. */
static inline qrl_model_config qwen25_1_5b(void) {
    return (qrl_model_config){.arch = QRL_MODEL_ARCH_QWEN2, .dim = 1536, .hidden_dim = 8960,
                              .n_layers = 28, .n_heads = 12, .n_kv_heads = 2, .head_dim = 128,
                              .vocab_size = 151936, .max_seq_len = 4096, .norm_eps = 1e-6f,
                              .qkv_bias = true, .tie_embeddings = true,
                              .rope = {.theta = 1000000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
}

/* Qwen3-4B: hidden 2560, 36 layers, 32 q / 8 kv heads, head_dim 128, intermediate 9728,
 * QK-norm, tied LM head. */
static inline qrl_model_config qwen3_4b(void) {
    return (qrl_model_config){.arch = QRL_MODEL_ARCH_QWEN3, .dim = 2560, .hidden_dim = 9728,
                              .n_layers = 36, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                              .vocab_size = 151936, .max_seq_len = 40960, .norm_eps = 1e-6f,
                              .rope = {.theta = 1000000, .layout = QRL_ROPE_LAYOUT_HALF},
                              .qk_norm = true, .tie_embeddings = true};
}

/* Qwen3-8B: hidden 4096, 36 layers, 32 q / 8 kv heads, head_dim 128, intermediate 12288,
 * QK-norm, separate LM head. */
static inline qrl_model_config qwen3_8b(void) {
    qrl_model_config c = qwen3_4b();
    c.dim = 4096, c.hidden_dim = 12288, c.tie_embeddings = false;
    return c;
}

/* The "rows" list and the "weight_gb" object of a decode section of a benchmark's JSON,
 * closing the section and the file's object: one row per batch[b] with "<name>_ms" and
 * "<name>_speedup_vs_bf16" (variant 0 is the BF16 reference) per variant p, from
 * ms[p * n_b + b]; weight_gb[p] per variant. */
static inline void json_decode_rows(FILE *f, int n_p, const char *const *names, int n_b,
                                    const int *batch, const double *ms, const double *weight_gb) {
    for (int bi = 0; bi < n_b; bi++) {
        fprintf(f, "%s\n    {\"batch\": %d", bi ? "," : "", batch[bi]);
        for (int pi = 0; pi < n_p; pi++)
            fprintf(f, ", \"%s_ms\": %.4f, \"%s_speedup_vs_bf16\": %.3f", names[pi],
                    ms[pi * n_b + bi], names[pi], ms[bi] / ms[pi * n_b + bi]);
        fprintf(f, "}");
    }
    fprintf(f, "\n  ],\n  \"weight_gb\": {");
    for (int pi = 0; pi < n_p; pi++) fprintf(f, "%s\"%s\": %.3f", pi ? ", " : "", names[pi], weight_gb[pi]);
    fprintf(f, "}}\n}\n");
}

/* Decode step of a random-weight model of shape c at weight precision prec, batch B, every
 * row at context ctx (paged KV of format kv (random valid records), block 16), CUDA graphs
 * unless eager: `warmup` untimed
 * steps, then `reps` steps timed with CUDA events on the engine's stream (greedy tokens back
 * on the host, checked inside the vocabulary).  ms[reps] gets the sorted step times (ms);
 * *weight_gb the weight bytes a step reads; *first_ms (may be NULL) the first warm-up
 * step's wall time (ms, host clock: with graphs, the capture).  Exits on any error. */
static inline void decode_step_times_kv(const qrl_model_config *c, qrl_precision prec,
                                        qrl_kv_format kv, int B, int ctx, bool eager, int warmup,
                                        int reps, float *ms, double *weight_gb, double *first_ms) {
    qrl_cuda_forward_desc d = {.max_rows = B, .max_ctx = ctx + 64, .block_size = 16,
                               .n_blocks = B * ((ctx + 64) / 16 + 1), .max_seqs = B, .precision = prec,
                               .eager = eager, .kv_format = kv};
    qrl_cuda_forward *f;
    qrl_error err;
    QK(qrl_cuda_forward_new(c, &d, &f, &err));
    QK(qrl_cuda_forward_init_random(f, 3, &err));
    *weight_gb = qrl_cuda_forward_weight_bytes(f) / 1e9;
    cudaStream_t st = (cudaStream_t)qrl_cuda_forward_stream(f);
    int *seqs = malloc(B * sizeof(int));
    int32_t *tok = malloc(B * 4), *gt = malloc(B * 4);
    for (int b = 0; b < B; b++) {
        QK(qrl_cuda_forward_seq_new(f, &seqs[b], &err));
        QK(qrl_cuda_forward_seq_set_len_unwritten(f, seqs[b], ctx, &err));
        tok[b] = (7 + 7919 * b) % c->vocab_size;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int it = -warmup; it < reps; it++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CK(cudaEventRecord(e0, st));
        QK(qrl_cuda_forward_decode(f, seqs, tok, B, NULL, gt, NULL, &err));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (it == -warmup && first_ms)
            *first_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
        if (it >= 0) CK(cudaEventElapsedTime(&ms[it], e0, e1));
        for (int b = 0; b < B; b++)
            if (gt[b] < 0 || gt[b] >= c->vocab_size) {
                fprintf(stderr, "decode: token %d out of the vocabulary\n", gt[b]);
                exit(1);
            }
    }
    qsort(ms, reps, sizeof *ms, cmp_f);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qrl_cuda_forward_free(f);
    free(seqs); free(tok); free(gt);
}

/* decode_step_times_kv with BF16 KV. */
static inline void decode_step_times_mode(const qrl_model_config *c, qrl_precision prec, int B,
                                          int ctx, bool eager, int warmup, int reps, float *ms,
                                          double *weight_gb, double *first_ms) {
    decode_step_times_kv(c, prec, QRL_KV_FORMAT_BF16, B, ctx, eager, warmup, reps, ms, weight_gb,
                         first_ms);
}

/* decode_step_times_mode with CUDA graphs (the engine's default). */
static inline void decode_step_times(const qrl_model_config *c, qrl_precision prec, int B, int ctx,
                                     int warmup, int reps, float *ms, double *weight_gb) {
    decode_step_times_mode(c, prec, B, ctx, false, warmup, reps, ms, weight_gb, NULL);
}

#endif
