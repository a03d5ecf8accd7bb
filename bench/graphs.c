/* CUDA graphs for the decode step (model/forward_cuda.h): the same decode step launched
 * eagerly (desc.eager, one launch per kernel) and replayed from a captured graph, on
 * random-weight Qwen2.5-1.5B and Qwen3-4B shapes, weights bf16 and w8a8-int8 (4 more
 * launches per layer), BF16 paged KV, every row at context CTX.
 *
 * Per case: WARMUP untimed steps (the first one captures the graph: its host wall time is
 * reported as "capture ms"), then REPS steps timed one by one with CUDA events; the median.
 * Speedup = eager ms / graph ms in the same run.
 *
 * Churn (does lazy capture pay for itself?): Qwen3-4B bf16, 64 sequences at contexts
 * 512 + 8 i, all decoded every step, sequence i leaving after 32 + 3 i steps (the batch
 * shrinks from 64 to 1, crossing row counts and context buckets as a rollout does): the
 * host wall time of all steps, captures included, eager against graphs.
 * Prints tables, writes JSON.
 *
 *   build/bench/graphs [--out FILE]     (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "graphs: built without CUDA\n");
    return 77;
}
#else
#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3
#define CTX 1024

typedef struct model_shape { const char *name; qrl_model_config (*cfg)(void); } model_shape;
static const model_shape MODELS[] = {{"qwen2.5-1.5b", qwen25_1_5b}, {"qwen3-4b", qwen3_4b}};
static const qrl_precision PREC[] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8};
static const int BATCH[] = {1, 8, 64, 256};
#define N_M 2
#define N_P 2
#define N_B 4

typedef struct row { double eager_ms, graph_ms, capture_ms, eager_first_ms; } row;

/* The churn scenario above: total wall ms; *steps, *captures, *replays. */
static double churn(bool eager, int *steps, long *captures, long *replays) {
    enum { NS = 64 };
    qrl_model_config c = qwen3_4b();
    qrl_cuda_forward_desc d = {.max_rows = NS, .max_ctx = 2048, .block_size = 16,
                               .n_blocks = NS * (2048 / 16), .max_seqs = NS, .eager = eager};
    qrl_cuda_forward *f;
    qrl_error err;
    QK(qrl_cuda_forward_new(&c, &d, &f, &err));
    QK(qrl_cuda_forward_init_random(f, 3, &err));
    int seq[NS], left[NS], bs[NS];
    int32_t tok[NS], gt[NS];
    for (int i = 0; i < NS; i++) {
        QK(qrl_cuda_forward_seq_new(f, &seq[i], &err));
        QK(qrl_cuda_forward_seq_set_len_unwritten(f, seq[i], 512 + 8 * i, &err));
        left[i] = 32 + 3 * i;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *steps = 0;
    for (;;) {
        int B = 0;
        for (int i = 0; i < NS; i++)
            if (left[i] > 0) bs[B] = seq[i], tok[B++] = (int32_t)((7 + 7919 * i) % c.vocab_size);
        if (B == 0) break;
        QK(qrl_cuda_forward_decode(f, bs, tok, B, NULL, gt, NULL, &err));
        for (int i = 0; i < NS; i++) left[i]--;
        (*steps)++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    qrl_cuda_forward_graph_stats(f, captures, replays);
    qrl_cuda_forward_free(f);
    return (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
}

int main(int argc, char **argv) {
    const char *out = "bench/results/graphs-h200.json";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else {
            fprintf(stderr, "graphs: unknown or incomplete argument '%s'\nusage: graphs [--out FILE]\n",
                    argv[i]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "graphs: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    static row res[N_M][N_P][N_B];
    for (int mi = 0; mi < N_M; mi++)
        for (int pi = 0; pi < N_P; pi++)
            for (int bi = 0; bi < N_B; bi++) {
                qrl_model_config c = MODELS[mi].cfg();
                float ms[REPS];
                double gb, first;
                row *r = &res[mi][pi][bi];
                decode_step_times_mode(&c, PREC[pi], BATCH[bi], CTX, true, WARMUP, REPS, ms, &gb, &first);
                r->eager_ms = ms[REPS / 2];
                r->eager_first_ms = first;
                decode_step_times_mode(&c, PREC[pi], BATCH[bi], CTX, false, WARMUP, REPS, ms, &gb, &first);
                r->graph_ms = ms[REPS / 2];
                r->capture_ms = first;
                fprintf(stderr, "%s %s batch %d: eager %.3f graph %.3f ms (first steps %.1f / %.1f ms)\n",
                        MODELS[mi].name, qrl_precision_name(PREC[pi]), BATCH[bi], r->eager_ms,
                        r->graph_ms, r->eager_first_ms, r->capture_ms);
            }
    int ch_steps;
    long ch_cap, ch_rep, e_cap, e_rep;
    double ch_eager = churn(true, &ch_steps, &e_cap, &e_rep);
    double ch_graph = churn(false, &ch_steps, &ch_cap, &ch_rep);
    FILE *jf = fopen(out, "w");
    if (jf) {
        fprintf(jf, "{\n  \"device\": \"%s\",\n  \"context\": %d,\n  \"reps\": %d,\n  \"kv\": \"bf16\",\n"
                "  \"cases\": [", prop.name, CTX, REPS);
        bool first = true;
        for (int mi = 0; mi < N_M; mi++)
            for (int pi = 0; pi < N_P; pi++)
                for (int bi = 0; bi < N_B; bi++) {
                    const row *r = &res[mi][pi][bi];
                    fprintf(jf, "%s\n    {\"model\": \"%s\", \"weights\": \"%s\", \"batch\": %d, "
                            "\"eager_ms\": %.4f, \"graph_ms\": %.4f, \"speedup\": %.3f, "
                            "\"eager_first_step_ms\": %.2f, \"graph_first_step_ms\": %.2f}",
                            first ? "" : ",", MODELS[mi].name, qrl_precision_name(PREC[pi]),
                            BATCH[bi], r->eager_ms, r->graph_ms, r->eager_ms / r->graph_ms,
                            r->eager_first_ms, r->capture_ms);
                    first = false;
                }
        fprintf(jf, "\n  ],\n  \"churn\": {\"model\": \"qwen3-4b\", \"weights\": \"bf16\", \"steps\": %d, "
                "\"eager_total_ms\": %.1f, \"graph_total_ms\": %.1f, \"captures\": %ld, \"replays\": %ld}\n}\n",
                ch_steps, ch_eager, ch_graph, ch_cap, ch_rep);
        fclose(jf);
    } else {
        fprintf(stderr, "cannot write %s\n", out);
    }
    printf("decode step, context %d, KV bf16, %s: median ms, eager vs CUDA graph (same run)\n"
           "%-13s %-10s %5s %9s %9s %8s %13s %13s\n", CTX, prop.name, "model", "weights", "batch",
           "eager", "graph", "speedup", "eager 1st ms", "capture ms");
    for (int mi = 0; mi < N_M; mi++)
        for (int pi = 0; pi < N_P; pi++)
            for (int bi = 0; bi < N_B; bi++) {
                const row *r = &res[mi][pi][bi];
                printf("%-13s %-10s %5d %9.3f %9.3f %7.2fx %13.1f %13.1f\n", MODELS[mi].name,
                       qrl_precision_name(PREC[pi]), BATCH[bi], r->eager_ms, r->graph_ms,
                       r->eager_ms / r->graph_ms, r->eager_first_ms, r->capture_ms);
            }
    printf("\nchurn (Qwen3-4B bf16, batch 64 -> 1 over %d steps, contexts 512-1300): eager %.1f ms, "
           "graphs %.1f ms (%.2fx) with %ld captures and %ld replays\n", ch_steps, ch_eager, ch_graph,
           ch_eager / ch_graph, ch_cap, ch_rep);
    return 0;
}
#endif
