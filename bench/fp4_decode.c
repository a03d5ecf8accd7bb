/* FP4 decode speed on the CUDA engine (issue 19): a random-weight Qwen3-1.7B-shaped model
 * (hidden 2048, 28 layers, 16 q / 8 kv heads, head_dim 128, intermediate 6144, vocab
 * 151936, tied LM head, QK-norm), one decode step at batch 1 / 64 / 128, every row at
 * context CTX, CUDA graphs, for each variant in the same run:
 *   bf16         BF16 weights, BF16 KV (the anchor: speedups are bf16 ms / variant ms)
 *   w4a16-nvfp4  NVFP4 weights, BF16 activations, BF16 KV
 *   w4a4-nvfp4   NVFP4 weights, activations NVFP4-quantized per token (fused into the norms
 *                and SwiGLU), BF16 KV
 *   bf16+kv4     BF16 weights, fp4 (NVFP4) KV cache: 80 bytes per token-head vector
 *                (64 code bytes + S_enc, 1/S_enc, 8 block scales) instead of 256
 *   w4a4+kv4     w4a4-nvfp4 with the fp4 KV cache (the all-FP4 rollout)
 * Per variant and batch: WARMUP untimed steps (the first captures the graph), then REPS
 * steps timed with CUDA events (cuda_bench.h decode_step_times), median reported; the
 * floor is (weight bytes + the KV bytes the attention reads) / the device-to-device copy
 * bandwidth of the same run.  Table on stdout, JSON to --out.
 *
 *   build/bench/fp4_decode [--out FILE] [--ctx N]   (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "fp4_decode: built without CUDA\n");
    return 77;
}
#else
#include "cuda_bench.h"

#define WARMUP 3
#define REPS 15

static const int BATCH[] = {1, 64, 128};
#define N_B (int)(sizeof BATCH / sizeof *BATCH)

static const struct { const char *name; qrl_precision prec; qrl_kv_format kv; } DV[] = {
    {"bf16", QRL_PRECISION_BF16, QRL_KV_FORMAT_BF16},
    {"w4a16-nvfp4", QRL_PRECISION_W4A16_NVFP4, QRL_KV_FORMAT_BF16},
    {"w4a4-nvfp4", QRL_PRECISION_W4A4_NVFP4, QRL_KV_FORMAT_BF16},
    {"bf16+kv4", QRL_PRECISION_BF16, QRL_KV_FORMAT_FP4},
    {"w4a4+kv4", QRL_PRECISION_W4A4_NVFP4, QRL_KV_FORMAT_FP4},
};
#define N_P (int)(sizeof DV / sizeof *DV)

/* Qwen3-1.7B: hidden 2048, 28 layers, 16 q / 8 kv heads, head_dim 128, intermediate 6144,
 * QK-norm, tied LM head. */
static qrl_model_config qwen3_1_7b(void) {
    qrl_model_config c = qwen3_4b();
    c.dim = 2048, c.hidden_dim = 6144, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8;
    return c;
}

int main(int argc, char **argv) {
    const char *out = "bench/results/fp4-decode-h200.json";
    int ctx = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else {
            fprintf(stderr, "fp4_decode: unknown or incomplete argument '%s'\nusage: fp4_decode "
                    "[--out FILE] [--ctx N]\n", argv[i]);
            return 2;
        }
    }
    if (ctx < 1 || ctx > 32768) {
        fprintf(stderr, "fp4_decode: --ctx %d outside [1, 32768]\n", ctx);
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth();
    qrl_model_config c = qwen3_1_7b();
    /* KV read per row and step: every layer's K and V of ctx + 1 positions, a record of
     * 2 hd bytes (BF16) or hd / 2 + 16 (fp4: codes, then S_enc, 1/S_enc, block scales) */
    double kv_pos = (double)c.n_layers * 2 * c.n_kv_heads * (ctx + 1);
    double ms[N_P][N_B], wgb[N_P];
    float t[REPS];
    for (int p = 0; p < N_P; p++)
        for (int b = 0; b < N_B; b++) {
            decode_step_times_kv(&c, DV[p].prec, DV[p].kv, BATCH[b], ctx, false, WARMUP, REPS, t,
                                 &wgb[p], NULL);
            ms[p][b] = t[REPS / 2];
            fprintf(stderr, "%s batch %d: min %.3f median %.3f max %.3f ms\n", DV[p].name, BATCH[b],
                    t[0], t[REPS / 2], t[REPS - 1]);
        }
    printf("fp4 decode, %s, Qwen3-1.7B shapes (random weights), context %d, KV bf16 unless +kv4, CUDA graphs, "
           "median of %d steps; copy bandwidth %.0f GB/s\n", prop.name, ctx, REPS, bw / 1e9);
    printf("%-12s %8s %6s %9s %9s %10s %8s %10s\n", "variant", "weights", "batch", "step ms",
           "floor ms", "tok/s", "vs bf16", "of floor");
    for (int p = 0; p < N_P; p++)
        for (int b = 0; b < N_B; b++) {
            double rec = DV[p].kv == QRL_KV_FORMAT_FP4 ? c.head_dim / 2 + 16 : 2 * c.head_dim;
            double floor_ms = (wgb[p] * 1e9 + kv_pos * rec * BATCH[b]) / bw * 1e3;
            printf("%-12s %6.2fGB %6d %9.3f %9.3f %10.0f %7.2fx %9.0f%%\n", DV[p].name, wgb[p],
                   BATCH[b], ms[p][b], floor_ms, BATCH[b] / (ms[p][b] * 1e-3), ms[0][b] / ms[p][b],
                   100.0 * floor_ms / ms[p][b]);
        }
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "fp4_decode: cannot write %s\n", out);
        return 1;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"model_shapes\": \"qwen3-1.7b\",\n  \"reps\": %d,\n"
            "  \"copy_bandwidth_gbs\": %.1f,\n", prop.name, REPS, bw / 1e9);
    fprintf(f, "  \"decode\": {\"context\": %d, \"kv\": \"bf16 (+kv4: fp4)\", \"graphs\": true, \"rows\": [", ctx);
    const char *names[N_P];
    for (int p = 0; p < N_P; p++) names[p] = DV[p].name;
    json_decode_rows(f, N_P, names, N_B, BATCH, &ms[0][0], wgb);
    fclose(f);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}
#endif
