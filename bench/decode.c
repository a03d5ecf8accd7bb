/* BF16 CUDA decode step against the HBM floor (SPEC §10): a random-weight
 * Qwen3-4B-shaped model (hidden 2560, 36 layers, 32 q / 8 kv heads, head_dim 128,
 * intermediate 9728, vocab 151936, tied LM head, QK-norm), BF16 weights and BF16 paged
 * KV (block 16) with random contents, at batch x context shapes.
 *
 * Per shape: 3 warm-up steps, then REPEATS steps, each timed with CUDA events around
 * qrl_cuda_forward_decode (greedy tokens back to the host); the median is reported.
 * Bytes per step = weight bytes (all layers + norms + LM head) + KV bytes read
 * (sum over rows of (len + 1) * 2 * layers * kv_heads * head_dim * 2).  The floor is
 * bytes / the device-to-device copy bandwidth measured in the same run (cudaMemcpy of a
 * 2 GiB buffer, read + write counted).  Layers are reduced when device memory cannot hold
 * the largest shape's KV cache (printed).
 *
 *   build/bench/decode [--out FILE] [--layers N]          (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "decode: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/attention.cuh"
#include "cuda/gemm.cuh"
#include "cuda/pointwise.cuh"
#include "model/forward_cuda.h"

#define REPEATS 10
#define WARMUP 3
#define BS 16

typedef struct shape { int batch, ctx; } shape;
static const shape SHAPES[] = {{1, 1024}, {8, 1024}, {64, 1024}, {64, 4096}, {304, 1384}, {176, 4767}};
#define N_SHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define QK(x) do { if ((x) != QRL_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg); exit(1); } } while (0)

/* Device-to-device copy bandwidth, bytes read + written per second (median of 10). */
static double copy_bandwidth(void) {
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

/* Where the step time goes: the step's GEMMs alone (same shapes, back to back) and the
 * attention launcher alone (one layer's K/V of `batch` x `ctx` positions, run n_layers
 * times), each timed with events, median of 5. */
static void breakdown(int layers, int B, int ctx, double *gemm_ms, double *attn_ms) {
    qrl_error err;
    const int D = 2560, F = 9728, Q = 4096, KV = 1024, V = 151936, H = 32, KVH = 8, HD = 128;
    size_t wmax = (size_t)V * D;
    uint16_t *w, *x, *kc;
    float *y, *q, *work;
    int32_t *tab, *rseq, *rpos;
    int mb = (ctx + BS) / BS;
    size_t kvn = (size_t)B * mb * BS * KV;
    size_t wf = qrl_cuda_attention_work_floats(B, H, HD, ctx + 1);
    CK(cudaMalloc((void **)&w, wmax * 2));
    CK(cudaMalloc((void **)&x, (size_t)B * F * 2));
    CK(cudaMalloc((void **)&y, (size_t)B * V * 4));
    CK(cudaMalloc((void **)&kc, 2 * kvn * 2));
    CK(cudaMalloc((void **)&q, (size_t)B * Q * 4));
    CK(cudaMalloc((void **)&work, wf * 4));
    CK(cudaMalloc((void **)&tab, (size_t)B * mb * 4 + 2 * (size_t)B * 4));
    rseq = tab + (size_t)B * mb;
    rpos = rseq + B;
    int32_t *h = malloc(((size_t)B * mb + 2 * (size_t)B) * 4);
    for (size_t i = 0; i < (size_t)B * mb; i++) h[i] = (int32_t)i;
    for (int i = 0; i < B; i++) h[(size_t)B * mb + i] = i, h[(size_t)B * mb + B + i] = ctx;
    CK(cudaMemcpy(tab, h, ((size_t)B * mb + 2 * (size_t)B) * 4, cudaMemcpyHostToDevice));
    free(h);
    QK(qrl_cuda_fill_random_bf16(w, wmax, 5, 0, 0.02f, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(x, (size_t)B * F, 6, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(kc, 2 * kvn, 7, 0, 1, NULL, &err));
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    float tg[5], ta[5];
    qrl_cuda_attention_args a = {.out = x, .q = q, .k_cache = kc, .v_cache = kc + kvn,
                                 .block_tables = tab, .max_blocks_per_seq = mb, .block_size = BS,
                                 .row_seq = rseq, .row_pos = rpos, .n = B, .n_heads = H,
                                 .n_kv_heads = KVH, .head_dim = HD, .scale = 0.088f,
                                 .max_len = ctx + 1, .work = work, .work_floats = wf};
    const size_t M = (size_t)1 << 20;
    for (int it = -1; it < 5; it++) {
        /* one 200 MB weight region reused per layer: 36 x 200 MB >> L2, no cache reuse */
        CK(cudaEventRecord(e0, 0));
        for (int l = 0; l < layers; l++) {
            QK(qrl_cuda_gemm_bf16(g, y, x, w, B, D, Q + 2 * KV, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 16 * M, B, Q, D, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 40 * M, B, D, 2 * F, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 100 * M, B, F, D, NULL, &err));
        }
        QK(qrl_cuda_gemm_bf16(g, y, x, w, B, D, V, NULL, &err));
        CK(cudaEventRecord(e1, 0));
        for (int l = 0; l < layers; l++) QK(qrl_cuda_attention(&a, NULL, &err));
        CK(cudaEventRecord(e2, 0));
        CK(cudaEventSynchronize(e2));
        if (it >= 0) {
            CK(cudaEventElapsedTime(&tg[it], e0, e1));
            CK(cudaEventElapsedTime(&ta[it], e1, e2));
        }
    }
    qsort(tg, 5, sizeof *tg, cmp_f);
    qsort(ta, 5, sizeof *ta, cmp_f);
    *gemm_ms = tg[2];
    *attn_ms = ta[2];
    qrl_cuda_gemm_free(g);
    cudaFree(w); cudaFree(x); cudaFree(y); cudaFree(kc); cudaFree(q); cudaFree(work); cudaFree(tab);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/decode-h200.json";
    int layers = 36;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
    }
    qrl_error err;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth();
    printf("device: %s, %d SMs, %.1f GiB; copy bandwidth (read+write) %.0f GB/s\n", prop.name,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, bw / 1e9);

    qrl_model_config cfg = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 2560, .hidden_dim = 9728,
                            .n_layers = layers, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                            .vocab_size = 151936, .max_seq_len = 40960, .norm_eps = 1e-6f,
                            .rope = {.theta = 1000000, .layout = QRL_ROPE_LAYOUT_HALF},
                            .qk_norm = true, .tie_embeddings = true};
    int max_rows = 0, max_ctx = 0;
    long blocks = 0;
    for (int s = 0; s < N_SHAPES; s++) {
        int ctx = SHAPES[s].ctx + WARMUP + REPEATS + 1;
        long b = (long)SHAPES[s].batch * ((ctx + BS - 1) / BS);
        if (b > blocks) blocks = b;
        if (SHAPES[s].batch > max_rows) max_rows = SHAPES[s].batch;
        if (ctx > max_ctx) max_ctx = ctx;
    }
    /* Fit the KV pool: weights ~8 GB + activations ~1 GB + the pool, with 3 GiB spare. */
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    for (;;) {
        double kv = (double)blocks * BS * cfg.n_layers * 2 * 8 * 128 * 2;
        double w = 2.0 * ((double)cfg.n_layers * 100.9e6 + 389e6);
        if (kv + w + 1.5e9 + 3.0 * (1 << 30) < (double)free_b) break;
        cfg.n_layers--;
    }
    if (cfg.n_layers != layers)
        printf("NOTE: %d layers instead of %d so the largest KV cache fits (%.1f GiB free)\n",
               cfg.n_layers, layers, free_b / 1073741824.0);
    qrl_cuda_forward_desc d = {.max_rows = max_rows, .max_ctx = max_ctx, .block_size = BS,
                               .n_blocks = (int)blocks, .max_seqs = max_rows};
    qrl_cuda_forward *f;
    QK(qrl_cuda_forward_new(&cfg, &d, &f, &err));
    QK(qrl_cuda_forward_init_random(f, 1234, &err));
    cudaStream_t st = (cudaStream_t)qrl_cuda_forward_stream(f);
    size_t wbytes = qrl_cuda_forward_weight_bytes(f), kvpos = qrl_cuda_forward_kv_bytes_per_pos(f);
    printf("model: %d layers, weights read per step %.2f GB, KV %zu bytes/position\n",
           cfg.n_layers, wbytes / 1e9, kvpos);

    int *seqs = malloc(max_rows * sizeof(int));
    int32_t *tok = malloc(max_rows * 4), *gt = malloc(max_rows * 4);
    float *lp = malloc(max_rows * 4);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double res[N_SHAPES][7]; /* ms, GB moved, GB/s, floor ms, floor/ms, gemm ms, attn ms */
    for (int s = 0; s < N_SHAPES; s++) {
        int B = SHAPES[s].batch, ctx = SHAPES[s].ctx;
        for (int i = 0; i < B; i++) {
            QK(qrl_cuda_forward_seq_new(f, &seqs[i], &err));
            QK(qrl_cuda_forward_seq_set_len_unwritten(f, seqs[i], ctx, &err));
            tok[i] = (int32_t)((i * 7919 + 13) % cfg.vocab_size);
        }
        float ms[REPEATS];
        double bytes[REPEATS];
        for (int it = -WARMUP; it < REPEATS; it++) {
            double b = (double)wbytes;
            for (int i = 0; i < B; i++) b += (double)(qrl_cuda_forward_seq_len(f, seqs[i]) + 1) * kvpos;
            CK(cudaEventRecord(e0, st));
            QK(qrl_cuda_forward_decode(f, seqs, tok, B, NULL, gt, lp, &err));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (it >= 0) {
                CK(cudaEventElapsedTime(&ms[it], e0, e1));
                bytes[it] = b;
            }
            memcpy(tok, gt, B * 4);
        }
        qsort(ms, REPEATS, sizeof *ms, cmp_f);
        double m = ms[REPEATS / 2], gb = bytes[REPEATS / 2] / 1e9;
        res[s][0] = m;
        res[s][1] = gb;
        res[s][2] = gb / (m * 1e-3);
        res[s][3] = bytes[REPEATS / 2] / bw * 1e3;
        res[s][4] = res[s][3] / m;
        fprintf(stderr, "shape %dx%d: min %.3f median %.3f max %.3f ms\n", B, ctx, ms[0], m,
                ms[REPEATS - 1]);
        for (int i = 0; i < B; i++) qrl_cuda_forward_seq_free(f, seqs[i]);
    }
    qrl_cuda_forward_free(f);
    /* Breakdown (device memory free again): the GEMMs alone and the attention alone. */
    for (int s = 0; s < N_SHAPES; s++)
        breakdown(cfg.n_layers, SHAPES[s].batch, SHAPES[s].ctx, &res[s][5], &res[s][6]);
    FILE *jf = fopen(out, "w");
    if (jf) {
        fprintf(jf, "{\n  \"device\": \"%s\",\n  \"copy_bandwidth_gbps\": %.1f,\n  \"layers\": %d,\n"
                "  \"weight_bytes\": %zu,\n  \"kv_bytes_per_position\": %zu,\n  \"repeats\": %d,\n"
                "  \"shapes\": [\n", prop.name, bw / 1e9, cfg.n_layers, wbytes, kvpos, REPEATS);
        for (int s = 0; s < N_SHAPES; s++)
            fprintf(jf, "    {\"batch\": %d, \"context\": %d, \"ms_per_step\": %.4f, \"gb_per_step\": %.3f, "
                    "\"achieved_gbps\": %.1f, \"floor_ms\": %.4f, \"fraction_of_floor_speed\": %.3f, "
                    "\"gemm_only_ms\": %.4f, \"attention_only_ms\": %.4f}%s\n",
                    SHAPES[s].batch, SHAPES[s].ctx, res[s][0], res[s][1], res[s][2], res[s][3],
                    res[s][4], res[s][5], res[s][6], s + 1 < N_SHAPES ? "," : "");
        fprintf(jf, "  ]\n}\n");
        fclose(jf);
    } else {
        fprintf(stderr, "cannot write %s\n", out);
    }
    printf("%-10s %9s %8s %7s %9s %8s %9s %8s %9s %8s\n", "batch×ctx", "ms/step", "GB/step",
           "GB/s", "floor ms", "floor/t", "gemm ms", "GB/s", "attn ms", "GB/s");
    for (int s = 0; s < N_SHAPES; s++) {
        char name[32];
        snprintf(name, sizeof name, "%dx%d", SHAPES[s].batch, SHAPES[s].ctx);
        double kvgb = res[s][1] - wbytes / 1e9;
        printf("%-10s %9.3f %8.2f %7.0f %9.3f %7.1f%% %9.3f %8.0f %9.3f %8.0f\n", name, res[s][0],
               res[s][1], res[s][2], res[s][3], 100 * res[s][4], res[s][5],
               wbytes / 1e9 / (res[s][5] * 1e-3), res[s][6], kvgb / (res[s][6] * 1e-3));
    }
    free(seqs); free(tok); free(gt); free(lp);
    return 0;
}
#endif
