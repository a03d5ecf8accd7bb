/* The decode step's BF16 GEMM (qrl_cuda_gemm_bf16): cuBLAS against the skinny kernel
 * (kernels/cuda/gemm_bf16_skinny.cuh) on Qwen3-4B projections, then the decode step with
 * each.
 *
 * GEMMs: qkv 6144x2560, o 2560x4096, gate_up 19456x2560, down 2560x9728, lm_head
 * 151936x2560 (tied) at n = 1 .. 128 rows, through handles forced to CUBLAS / SKINNY and
 * AUTO.  Each time is the mean of REPS calls between two CUDA events after one untimed
 * round, the calls cycling through weight copies that together exceed the 50 MB L2 (a
 * decode step reads every layer's weights once, from HBM).  GB/s = weight bytes / time;
 * "copy" = that over the device-to-device copy bandwidth measured in the same run
 * (cudaMemcpy of 2 GiB, read + write counted).  "step" = the step's 36 x (qkv + o +
 * gate_up + down) + lm_head GEMM times.  A sweep of the skinny kernel's tuning (blocks
 * aimed at, shortest split, the L2 evict-first hint) follows; these tables set AUTO's
 * threshold and the defaults.
 *
 * Decode: qrl_cuda_forward_decode (CUDA graphs) of a random-weight Qwen3-4B at batch 1 ..
 * 256, context 1024, with QRL_GEMM_BF16_CUBLAS=1, with AUTO's default rule and with other
 * rules (QRL_GEMM_BF16_SKINNY_MAX_N / _MAX_MB), all read when the engine makes its handle:
 * WARMUP steps, then REPS steps timed one by one; the median.
 *
 *   build/bench/gemm_bf16 [--out FILE] [--decode 0|1] [--sweep 0|1]     (GPU only)
 *   build/bench/gemm_bf16 --profile NAME:N   (REPS skinny calls of one shape, for a profiler) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "gemm_bf16: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/gemm.cuh"
#include "cuda/gemm_bf16_skinny.cuh"
#include "cuda/pointwise.cuh"

#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3
#define CTX 1024
#define LAYERS 36

typedef struct proj { const char *name; int m, k, per_step; } proj;
static const proj PROJ[] = {{"qkv", 6144, 2560, LAYERS},     {"o", 2560, 4096, LAYERS},
                            {"gate_up", 19456, 2560, LAYERS}, {"down", 2560, 9728, LAYERS},
                            {"lm_head", 151936, 2560, 1}};
#define N_PROJ 5
static const int NS[] = {1, 8, 16, 32, 64, 96, 128};
#define N_NS 7
#define MAX_N 128
enum { V_CUBLAS, V_SKINNY, V_AUTO, N_V };
static const char *const VNAME[N_V] = {"cublas", "skinny", "auto"};
/* tuning sweep of the skinny kernel (direct launcher): target blocks, min split K, hint */
typedef struct tune { const char *name; int target, min_k, no_hint; } tune;
static const tune TUNE[] = {{"default", 0, 0, 0},      {"target132", 132, 0, 0},
                            {"target528", 528, 0, 0},   {"target1056", 1056, 0, 0},
                            {"minK256", 0, 256, 0},     {"minK1024", 0, 1024, 0},
                            {"nosplit", 1, 0, 0},       {"no-l2-hint", 0, 0, 1}};
#define N_TUNE (int)(sizeof TUNE / sizeof *TUNE)
static double us[N_PROJ][N_NS][N_V], tune_us[N_PROJ][N_NS][N_TUNE];

typedef struct bufs {
    uint16_t *w[REPS], *x;
    float *y, *work;
    unsigned *counters;
    int copies;
} bufs;

/* Mean µs of one call at n rows: handle g, or the skinny launcher with tuning t. */
static double time_gemm(qrl_cuda_gemm *g, const tune *t, const proj *p, int n, const bufs *b) {
    qrl_error err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int it = 0; it < 2; it++) { /* one untimed round, then the timed one */
        CK(cudaEventRecord(e0, 0));
        for (int r = 0; r < REPS; r++) {
            const uint16_t *w = b->w[r % b->copies];
            if (g) {
                QK(qrl_cuda_gemm_bf16(g, b->y, b->x, w, n, p->k, p->m, NULL, &err));
            } else {
                qrl_cuda_bf16_skinny_args a = {.y = b->y, .x = b->x, .w = w, .n = n, .k = p->k,
                                               .m = p->m, .work = b->work,
                                               .work_floats = (size_t)16 * MAX_N * 19456,
                                               .counters = b->counters, .n_counters = 4096,
                                               .target_blocks = t->target, .min_split_k = t->min_k,
                                               .no_l2_hint = t->no_hint};
                QK(qrl_cuda_gemm_bf16_skinny(&a, NULL, &err));
            }
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1e3 / REPS;
}

static void bench_gemm(bool sweep) {
    qrl_error err;
    qrl_cuda_gemm *g[N_V];
    for (int v = 0; v < N_V; v++) {
        QK(qrl_cuda_gemm_new(&g[v], &err));
        qrl_cuda_gemm_set_bf16_kernel(g[v], v == V_CUBLAS ? QRL_CUDA_GEMM_BF16_CUBLAS
                                            : v == V_SKINNY ? QRL_CUDA_GEMM_BF16_SKINNY
                                                            : QRL_CUDA_GEMM_BF16_AUTO);
    }
    bufs b;
    CK(cudaMalloc((void **)&b.x, (size_t)MAX_N * 9728 * 2));
    CK(cudaMalloc((void **)&b.y, (size_t)MAX_N * 151936 * 4));
    CK(cudaMalloc((void **)&b.work, (size_t)16 * MAX_N * 19456 * 4));
    CK(cudaMalloc((void **)&b.counters, 4096 * 4));
    CK(cudaMemset(b.counters, 0, 4096 * 4));
    QK(qrl_cuda_fill_random_bf16(b.x, (size_t)MAX_N * 9728, 7, 0, 1, NULL, &err));
    for (int pi = 0; pi < N_PROJ; pi++) {
        const proj *p = &PROJ[pi];
        size_t wn = (size_t)p->m * p->k;
        b.copies = (int)((320u << 20) / (wn * 2)) + 1;
        if (b.copies > REPS) b.copies = REPS;
        for (int c = 0; c < b.copies; c++) {
            CK(cudaMalloc((void **)&b.w[c], wn * 2));
            QK(qrl_cuda_fill_random_bf16(b.w[c], wn, 20 + c, 0, 0.02f, NULL, &err));
        }
        for (int ni = 0; ni < N_NS; ni++) {
            for (int v = 0; v < N_V; v++) us[pi][ni][v] = time_gemm(g[v], NULL, p, NS[ni], &b);
            for (int t = 0; sweep && t < N_TUNE; t++)
                tune_us[pi][ni][t] = time_gemm(NULL, &TUNE[t], p, NS[ni], &b);
        }
        CK(cudaDeviceSynchronize());
        for (int c = 0; c < b.copies; c++) cudaFree(b.w[c]);
    }
    cudaFree(b.x); cudaFree(b.y); cudaFree(b.work); cudaFree(b.counters);
    for (int v = 0; v < N_V; v++) qrl_cuda_gemm_free(g[v]);
}

/* ---- decode step --------------------------------------------------------------------- */

/* AUTO's rule as the environment sets it when the engine makes its handle */
typedef struct rule { const char *name, *cublas, *max_n, *max_mb; } rule;
static const rule RULE[] = {{"cublas", "1", NULL, NULL},     {"auto", NULL, NULL, NULL},
                            {"all<=16", NULL, "16", "1e9"},  {"all<=64", NULL, "64", "1e9"},
                            {"o<=64", NULL, "64", "24"}};
#define N_RULE (int)(sizeof RULE / sizeof *RULE)
static const int BATCH[] = {1, 8, 16, 32, 64, 256};
#define N_B (int)(sizeof BATCH / sizeof *BATCH)
static double step_ms[N_RULE][N_B], weight_gb;

static void set_env(const char *k, const char *v) {
    if (v) setenv(k, v, 1);
    else unsetenv(k);
}

static void bench_decode(void) {
    qrl_model_config c = qwen3_4b();
    for (int bi = 0; bi < N_B; bi++)
        for (int v = 0; v < N_RULE; v++) {
            step_ms[v][bi] = 0;
            if (BATCH[bi] > 64 && v > 1) continue; /* every rule is cuBLAS there */
            float ms[REPS];
            set_env("QRL_GEMM_BF16_CUBLAS", RULE[v].cublas);
            set_env("QRL_GEMM_BF16_SKINNY_MAX_N", RULE[v].max_n);
            set_env("QRL_GEMM_BF16_SKINNY_MAX_MB", RULE[v].max_mb);
            decode_step_times(&c, QRL_PRECISION_BF16, BATCH[bi], CTX, WARMUP, REPS, ms, &weight_gb);
            step_ms[v][bi] = ms[REPS / 2];
            fprintf(stderr, "decode %s batch %d: min %.3f median %.3f max %.3f ms\n", RULE[v].name,
                    BATCH[bi], ms[0], ms[REPS / 2], ms[REPS - 1]);
        }
    set_env("QRL_GEMM_BF16_CUBLAS", NULL);
    set_env("QRL_GEMM_BF16_SKINNY_MAX_N", NULL);
    set_env("QRL_GEMM_BF16_SKINNY_MAX_MB", NULL);
}

/* --profile NAME:N: REPS skinny calls of one projection (for a profiler), nothing else. */
static int profile(const char *spec) {
    char name[16];
    int n = 0, pi = -1;
    if (sscanf(spec, "%15[^:]:%d", name, &n) != 2 || n < 1 || n > MAX_N) return 2;
    for (int i = 0; i < N_PROJ; i++)
        if (!strcmp(name, PROJ[i].name)) pi = i;
    if (pi < 0) return 2;
    qrl_error err;
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    qrl_cuda_gemm_set_bf16_kernel(g, QRL_CUDA_GEMM_BF16_SKINNY);
    bufs b = {.copies = 1};
    size_t wn = (size_t)PROJ[pi].m * PROJ[pi].k;
    CK(cudaMalloc((void **)&b.x, (size_t)MAX_N * 9728 * 2));
    CK(cudaMalloc((void **)&b.y, (size_t)MAX_N * 151936 * 4));
    CK(cudaMalloc((void **)&b.w[0], wn * 2));
    QK(qrl_cuda_fill_random_bf16(b.x, (size_t)MAX_N * 9728, 7, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(b.w[0], wn, 20, 0, 0.02f, NULL, &err));
    printf("profile %s n=%d: %.2f µs per call\n", name, n, time_gemm(g, NULL, &PROJ[pi], n, &b));
    qrl_cuda_gemm_free(g);
    return 0;
}

/* ---- report ---------------------------------------------------------------------------- */

static double gbps(const proj *p, double t_us) { return (double)p->m * p->k * 2 / (t_us * 1e3); }

static double step_us(int ni, int v, int t) {
    double s = 0;
    for (int pi = 0; pi < N_PROJ; pi++)
        s += PROJ[pi].per_step * (t >= 0 ? tune_us[pi][ni][t] : us[pi][ni][v]);
    return s;
}

static double step_bytes(void) {
    double s = 0;
    for (int pi = 0; pi < N_PROJ; pi++) s += (double)PROJ[pi].per_step * PROJ[pi].m * PROJ[pi].k * 2;
    return s;
}

int main(int argc, char **argv) {
    const char *out = "bench/results/gemm-bf16-h200.json";
    const char *prof = NULL;
    int dec = 1, sweep = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) dec = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sweep") && i + 1 < argc) sweep = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) prof = argv[++i];
        else {
            fprintf(stderr, "gemm_bf16: unknown or incomplete argument '%s'\nusage: gemm_bf16 "
                    "[--out FILE] [--decode 0|1] [--sweep 0|1] [--profile NAME:N]\n", argv[i]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "gemm_bf16: no CUDA device\n");
        return 77;
    }
    if (prof) {
        int rc = profile(prof);
        if (rc) fprintf(stderr, "gemm_bf16: --profile wants NAME:N (qkv, o, gate_up, down, lm_head; N 1..%d)\n", MAX_N);
        return rc;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth() / 1e9;
    printf("device: %s, %d SMs; copy bandwidth (read+write) %.0f GB/s\n", prop.name,
           prop.multiProcessorCount, bw);
    bench_gemm(sweep);
    if (dec) bench_decode();
    double sb = step_bytes();

    FILE *jf = fopen(out, "w");
    if (!jf) fprintf(stderr, "cannot write %s\n", out);
    if (jf) {
        fprintf(jf, "{\n  \"device\": \"%s\",\n  \"copy_bandwidth_gbps\": %.1f,\n  \"reps\": %d,\n"
                "  \"gemm\": [", prop.name, bw, REPS);
        for (int pi = 0; pi < N_PROJ; pi++)
            for (int ni = 0; ni < N_NS; ni++) {
                const proj *p = &PROJ[pi];
                const double *u = us[pi][ni];
                fprintf(jf, "%s\n    {\"proj\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"splits\": %d, "
                        "\"cublas_us\": %.2f, \"skinny_us\": %.2f, \"auto_us\": %.2f, "
                        "\"cublas_gbps\": %.0f, \"skinny_gbps\": %.0f, \"skinny_of_copy\": %.3f}",
                        pi || ni ? "," : "", p->name, p->m, p->k, NS[ni],
                        qrl_cuda_gemm_bf16_skinny_splits(p->k, p->m), u[V_CUBLAS], u[V_SKINNY],
                        u[V_AUTO], gbps(p, u[V_CUBLAS]), gbps(p, u[V_SKINNY]),
                        gbps(p, u[V_SKINNY]) / bw);
            }
        fprintf(jf, "\n  ],\n  \"step_gemms\": [");
        for (int ni = 0; ni < N_NS; ni++)
            fprintf(jf, "%s\n    {\"n\": %d, \"cublas_ms\": %.4f, \"skinny_ms\": %.4f, \"auto_ms\": %.4f}",
                    ni ? "," : "", NS[ni], step_us(ni, V_CUBLAS, -1) / 1e3,
                    step_us(ni, V_SKINNY, -1) / 1e3, step_us(ni, V_AUTO, -1) / 1e3);
        fprintf(jf, "\n  ]");
        if (sweep) {
            fprintf(jf, ",\n  \"skinny_tuning_us\": [");
            for (int pi = 0; pi < N_PROJ; pi++)
                for (int ni = 0; ni < N_NS; ni++) {
                    fprintf(jf, "%s\n    {\"proj\": \"%s\", \"n\": %d", pi || ni ? "," : "",
                            PROJ[pi].name, NS[ni]);
                    for (int t = 0; t < N_TUNE; t++)
                        fprintf(jf, ", \"%s\": %.2f", TUNE[t].name, tune_us[pi][ni][t]);
                    fprintf(jf, "}");
                }
            fprintf(jf, "\n  ]");
        }
        if (dec) {
            fprintf(jf, ",\n  \"decode\": {\"model\": \"qwen3-4b\", \"context\": %d, \"graphs\": true, "
                    "\"weight_gb\": %.3f, \"steps_ms\": [", CTX, weight_gb);
            for (int bi = 0; bi < N_B; bi++) {
                fprintf(jf, "%s\n    {\"batch\": %d", bi ? "," : "", BATCH[bi]);
                for (int v = 0; v < N_RULE; v++)
                    if (step_ms[v][bi] > 0) fprintf(jf, ", \"%s\": %.4f", RULE[v].name, step_ms[v][bi]);
                fprintf(jf, "}");
            }
            fprintf(jf, "\n  ]}");
        }
        fprintf(jf, "\n}\n");
        fclose(jf);
    }

    if (sweep) {
        printf("\nskinny tuning, step GEMM ms (36 layers + lm_head) per n:\n%-11s", "variant");
        for (int ni = 0; ni < N_NS; ni++) printf(" %7d", NS[ni]);
        printf("\n");
        for (int t = 0; t < N_TUNE; t++) {
            printf("%-11s", TUNE[t].name);
            for (int ni = 0; ni < N_NS; ni++) printf(" %7.3f", step_us(ni, 0, t) / 1e3);
            printf("\n");
        }
        for (int pi = 0; pi < N_PROJ; pi++) {
            printf("%s µs:", PROJ[pi].name);
            for (int ni = 0; ni < N_NS; ni++) {
                int best = 0;
                for (int t = 1; t < N_TUNE; t++)
                    if (tune_us[pi][ni][t] < tune_us[pi][ni][best]) best = t;
                printf("  n%d %s %.1f (def %.1f)", NS[ni], TUNE[best].name, tune_us[pi][ni][best],
                       tune_us[pi][ni][0]);
            }
            printf("\n");
        }
    }
    for (int pi = 0; pi < N_PROJ; pi++) {
        const proj *p = &PROJ[pi];
        printf("\n%s m=%d k=%d (%.1f MB, %d splits): µs (GB/s, of copy bw)\n%5s %22s %22s %9s %8s\n",
               p->name, p->m, p->k, p->m * (double)p->k * 2 / 1e6,
               qrl_cuda_gemm_bf16_skinny_splits(p->k, p->m), "n", "cublas", "skinny", "auto", "speedup");
        for (int ni = 0; ni < N_NS; ni++) {
            const double *u = us[pi][ni];
            printf("%5d %8.2f (%5.0f, %3.0f%%) %8.2f (%5.0f, %3.0f%%) %9.2f %7.2fx\n", NS[ni],
                   u[V_CUBLAS], gbps(p, u[V_CUBLAS]), 100 * gbps(p, u[V_CUBLAS]) / bw, u[V_SKINNY],
                   gbps(p, u[V_SKINNY]), 100 * gbps(p, u[V_SKINNY]) / bw, u[V_AUTO],
                   u[V_CUBLAS] / u[V_SKINNY]);
        }
    }
    printf("\nstep GEMMs (36 x 4 + lm_head, %.2f GB): ms (GB/s, of copy bw)\n%5s %22s %22s %22s\n",
           sb / 1e9, "n", VNAME[V_CUBLAS], VNAME[V_SKINNY], VNAME[V_AUTO]);
    for (int ni = 0; ni < N_NS; ni++) {
        printf("%5d", NS[ni]);
        for (int v = 0; v < N_V; v++) {
            double t = step_us(ni, v, -1);
            printf(" %8.3f (%5.0f, %3.0f%%)", t / 1e3, sb / (t * 1e3), 100 * sb / (t * 1e3) / bw);
        }
        printf("\n");
    }
    if (dec) {
        printf("\ndecode step, Qwen3-4B bf16, context %d, CUDA graphs: median ms per AUTO rule "
               "(auto = the default; all<=N: skinny up to N rows; o<=64: weights <= 24 MB)\n%5s",
               CTX, "batch");
        for (int v = 0; v < N_RULE; v++) printf(" %9s", RULE[v].name);
        printf(" %14s\n", "cublas/auto");
        for (int bi = 0; bi < N_B; bi++) {
            printf("%5d", BATCH[bi]);
            for (int v = 0; v < N_RULE; v++)
                if (step_ms[v][bi] > 0) printf(" %9.3f", step_ms[v][bi]);
                else printf(" %9s", "-");
            printf(" %13.3fx\n", step_ms[0][bi] / step_ms[1][bi]);
        }
    }
    return 0;
}
#endif
