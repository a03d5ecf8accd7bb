/* CUDA graphs for the decode step (model/forward_cuda.h): the same decode step launched
 * eagerly (desc.eager, one launch per kernel) and replayed from a captured graph, on
 * random-weight Qwen2.5-1.5B and Qwen3-4B shapes, weights bf16 and w8a8-int8 (4 more
 * launches per layer), BF16 paged KV, every row at context CTX.
 *
 * Per case: WARMUP untimed steps (the first one captures the graph: its host wall time is
 * reported as "capture ms"), then REPS steps timed one by one with CUDA events; the median.
 * Speedup = eager ms / graph ms in the same run.  Prints a table, writes JSON.
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
        fprintf(jf, "\n  ]\n}\n");
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
    return 0;
}
#endif
