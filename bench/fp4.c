/* W4A16 NVFP4 / MXFP4 on the GPU (kernels/cuda/gemm_fp4.cuh): the GEMMs of a layer, then
 * the decode step per weight precision, on Qwen2.5-1.5B shapes (hidden 1536, 28 layers,
 * 12 q / 2 kv heads, head_dim 128, intermediate 8960, vocab 151936, tied LM head, QKV bias).
 *
 * GEMMs: the four projections (qkv 2048x1536, o 1536x1536, gate+up 17920x1536, down
 * 1536x8960) at T = 1, 8, 16, 32, 64, 128: cuBLAS BF16 (the bf16 engine's GEMM) vs the NVFP4
 * splitk (AUTO's kernel up to 64 tokens, its own plan), the MXFP4 splitk, the NVFP4 skinny
 * (AUTO's kernel before splitk), skinny-f32 (reference decoder) and dequant kernels.  Mean
 * of REPS calls between two CUDA events, each call on the next of the weight copies that
 * together exceed 160 MB, cycled across calls, beyond the 50 MB L2 (a decode step reads every
 * layer from HBM).
 *
 * --sweep FILE: also every splitk block shape (2/4/8 warps x 1..16 splits) per projection
 * and T (NVFP4), the plan's choice against the fastest, the full grid written to FILE.
 *
 * Decode: qrl_cuda_forward_decode (CUDA graphs) at batch 1, 8, 32, 64, context 512, random
 * weights and KV (qrl_cuda_forward_init_random), weights bf16, w8a8-int8, w4a16-nvfp4 and
 * -mxfp4 with AUTO's GEMMs and again with QRL_FP4_NO_SPLITK=1 (the skinny kernel, "before"),
 * KV bf16: WARMUP steps, then REPS steps timed one by one with events; the median and the
 * ratio to bf16 at the same batch in the same run.
 *
 *   build/bench/fp4 [--out FILE] [--sweep FILE]   (GPU only; default bench/results/fp4-h200.json) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "fp4: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/gemm.cuh"
#include "cuda/gemm_fp4.cuh"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/pointwise.cuh"
#include "model/forward_cuda.h"

#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3
#define MAX_COPIES 128  /* weight copies cycled through: together over 160 MB, beyond L2 */
#define CTX 512



/* ---- GEMMs -------------------------------------------------------------------------- */

typedef struct proj { const char *name; int N, K; } proj;
static const proj PROJ[] = {{"qkv", 2048, 1536}, {"o", 1536, 1536}, {"gate_up", 17920, 1536},
                            {"down", 1536, 8960}};
#define N_PROJ 4
static const int TS[] = {1, 8, 16, 32, 64, 128};
#define N_TS 6
#define MAX_T 128
enum { V_BF16, V_SPLITK, V_MX_SPLITK, V_SKINNY, V_SKINNY_F32, V_DEQUANT, N_V };
static const char *const VNAME[N_V] = {"bf16", "nvfp4-splitk", "mxfp4-splitk", "nvfp4-skinny",
                                       "nvfp4-skinny-f32", "nvfp4-dequant"};
static const qrl_cuda_fp4_kernel VKER[N_V] = {QRL_CUDA_FP4_AUTO, QRL_CUDA_FP4_SPLITK,
                                              QRL_CUDA_FP4_SPLITK, QRL_CUDA_FP4_SKINNY,
                                              QRL_CUDA_FP4_SKINNY_F32, QRL_CUDA_FP4_DEQUANT};
static double gemm_us[N_PROJ][N_TS][N_V];
static int plan_w[N_PROJ][N_TS], plan_s[N_PROJ][N_TS];

/* One projection's buffers: weight copies beyond L2, activations, outputs. */
typedef struct pbufs {
    int copies, bcopies, next; /* next: the copy the next call reads (cycles over all) */
    uint8_t *codes[MAX_COPIES], *scales[MAX_COPIES], *mscales[MAX_COPIES];
    uint16_t *wb[MAX_COPIES], *xb, *work;
    float *y, *rs;
    size_t cb, sb;
} pbufs;

static void pbufs_new(pbufs *b, const proj *p) {
    qrl_error err;
    b->cb = (size_t)p->N * qrl_cuda_fp4_code_bytes(p->K);
    b->sb = (size_t)p->N * qrl_cuda_fp4_scale_bytes(p->K, false);
    size_t msb = (size_t)p->N * qrl_cuda_fp4_scale_bytes(p->K, true);
    b->next = 0;
    b->copies = (int)((160u << 20) / (b->cb + b->sb)) + 1;
    if (b->copies > MAX_COPIES) b->copies = MAX_COPIES;
    b->bcopies = (int)((160u << 20) / ((size_t)p->N * p->K * 2)) + 1;
    if (b->bcopies > MAX_COPIES) b->bcopies = MAX_COPIES;
    for (int c = 0; c < b->copies; c++) {
        CK(cudaMalloc((void **)&b->codes[c], b->cb));
        CK(cudaMalloc((void **)&b->scales[c], b->sb));
        CK(cudaMalloc((void **)&b->mscales[c], msb));
        QK(qrl_cuda_fill_random_int8((int8_t *)b->codes[c], b->cb, 10 + c, NULL, &err));
        CK(cudaMemset(b->scales[c], 0x38, b->sb));  /* E4M3 1.0 */
        CK(cudaMemset(b->mscales[c], 0x7F, msb));   /* E8M0 1.0 */
    }
    for (int c = 0; c < b->bcopies; c++) {
        CK(cudaMalloc((void **)&b->wb[c], (size_t)p->N * p->K * 2));
        QK(qrl_cuda_fill_random_bf16(b->wb[c], (size_t)p->N * p->K, 20 + c, 0, 0.02f, NULL, &err));
    }
    CK(cudaMalloc((void **)&b->y, (size_t)MAX_T * p->N * 4));
    CK(cudaMalloc((void **)&b->rs, (size_t)p->N * 4));
    CK(cudaMalloc((void **)&b->xb, (size_t)MAX_T * p->K * 2));
    CK(cudaMalloc((void **)&b->work, (size_t)p->N * p->K * 2));
    CK(cudaMemset(b->rs, 0, (size_t)p->N * 4));
    QK(qrl_cuda_fill_random_bf16(b->xb, (size_t)MAX_T * p->K, 7, 0, 1, NULL, &err));
}

static void pbufs_free(pbufs *b) {
    for (int c = 0; c < b->copies; c++) cudaFree(b->codes[c]), cudaFree(b->scales[c]), cudaFree(b->mscales[c]);
    for (int c = 0; c < b->bcopies; c++) cudaFree(b->wb[c]);
    cudaFree(b->y); cudaFree(b->rs); cudaFree(b->xb); cudaFree(b->work);
}

/* Mean µs of REPS calls of variant v (warps / splits for splitk, 0 = plan) after one
 * untimed round. */
static double time_gemm(const proj *p, pbufs *b, qrl_cuda_gemm *g, int v, int T, int warps,
                        int splits, int *ran_splits) {
    qrl_error err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int it = -1; it < 1; it++) {
        CK(cudaEventRecord(e0, 0));
        for (int r = 0; r < REPS; r++) {
            int c = b->next++;
            if (v == V_BF16) {
                QK(qrl_cuda_gemm_bf16(g, b->y, b->xb, b->wb[c % b->bcopies], T, p->K, p->N, NULL, &err));
                continue;
            }
            bool mx = v == V_MX_SPLITK;
            qrl_cuda_fp4_gemm_args a = {
                .y = b->y, .x = b->xb, .codes = b->codes[c % b->copies],
                .scales = mx ? b->mscales[c % b->copies] : b->scales[c % b->copies],
                .row_scale = b->rs, .T = T, .N = p->N, .K = p->K, .mx = mx, .kernel = VKER[v],
                .work = b->work, .work_elems = (size_t)p->N * p->K, .blas = g,
                .warps = warps, .splits = splits, .ran_splits = ran_splits};
            QK(qrl_cuda_fp4_gemm(&a, NULL, &err));
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1e3 / REPS;
}

static void bench_gemm(FILE *sweep) {
    qrl_error err;
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    for (int pi = 0; pi < N_PROJ; pi++) {
        const proj *p = &PROJ[pi];
        pbufs b;
        pbufs_new(&b, p);
        for (int ti = 0; ti < N_TS; ti++) {
            for (int v = 0; v < N_V; v++) gemm_us[pi][ti][v] = time_gemm(p, &b, g, v, TS[ti], 0, 0, NULL);
            plan_w[pi][ti] = 0, plan_s[pi][ti] = 0;
            qrl_cuda_fp4_splitk_plan(TS[ti], p->N, p->K, &plan_w[pi][ti], &plan_s[pi][ti]);
        }
        printf("\n%s N=%d K=%d (nvfp4 %.1f MB), µs per call; GB/s = nvfp4 bytes / splitk time; "
               "plan = splitk warps x splits\n%5s", p->name, p->N, p->K, (b.cb + b.sb) / 1e6, "T");
        for (int v = 0; v < N_V; v++) printf(" %16s", VNAME[v]);
        printf(" %8s %6s\n", "GB/s", "plan");
        for (int ti = 0; ti < N_TS; ti++) {
            printf("%5d", TS[ti]);
            for (int v = 0; v < N_V; v++) printf(" %16.2f", gemm_us[pi][ti][v]);
            printf(" %8.0f %3dx%d\n", (b.cb + b.sb) / (gemm_us[pi][ti][V_SPLITK] * 1e3),
                   plan_w[pi][ti], plan_s[pi][ti]);
        }
        if (sweep) {
            for (int ti = 0; ti < N_TS; ti++) {
                double best = 1e30;
                int bw = 0, bs = 0;
                for (int w = 2; w <= 8; w *= 2)
                    for (int s = 1; s <= 16; s++) {
                        int pw = w, ps = s;
                        qrl_cuda_fp4_splitk_plan(TS[ti], p->N, p->K, &pw, &ps);
                        if (pw != w || ps != s) continue; /* normalized to another shape */
                        int ran = 0;
                        double us = time_gemm(p, &b, g, V_SPLITK, TS[ti], w, s, &ran);
                        fprintf(sweep, "%s T=%d warps=%d splits=%d ran_splits=%d us=%.3f\n", p->name,
                                TS[ti], w, s, ran, us);
                        if (ran != s) continue; /* a cluster the device could not place */
                        if (us < best) best = us, bw = w, bs = s;
                    }
                printf("sweep %-7s T=%3d: plan %dx%d %7.2f µs, best %dx%d %7.2f µs\n", p->name,
                       TS[ti], plan_w[pi][ti], plan_s[pi][ti], gemm_us[pi][ti][V_SPLITK], bw, bs, best);
            }
        }
        pbufs_free(&b);
    }
    qrl_cuda_gemm_free(g);
}

/* ---- decode step -------------------------------------------------------------------- */

static const int BATCH[] = {1, 8, 32, 64};
#define N_B 4
typedef struct dvar { qrl_precision prec; bool no_splitk; const char *name; } dvar;
static const dvar DV[] = {{QRL_PRECISION_BF16, false, "bf16"},
                          {QRL_PRECISION_W8A8_INT8, false, "w8a8-int8"},
                          {QRL_PRECISION_W4A16_NVFP4, true, "w4a16-nvfp4-skinny"},
                          {QRL_PRECISION_W4A16_NVFP4, false, "w4a16-nvfp4"},
                          {QRL_PRECISION_W4A16_MXFP4, true, "w4a16-mxfp4-skinny"},
                          {QRL_PRECISION_W4A16_MXFP4, false, "w4a16-mxfp4"}};
#define N_P 6
static double step_ms[N_P][N_B], weight_gb[N_P];

static void bench_decode(void) {
    qrl_model_config c = qwen25_1_5b();
    for (int pi = 0; pi < N_P; pi++)
        for (int bi = 0; bi < N_B; bi++) {
            int B = BATCH[bi];
            float ms[REPS];
            if (DV[pi].no_splitk) setenv("QRL_FP4_NO_SPLITK", "1", 1);
            decode_step_times(&c, DV[pi].prec, B, CTX, WARMUP, REPS, ms, &weight_gb[pi]);
            unsetenv("QRL_FP4_NO_SPLITK");
            step_ms[pi][bi] = ms[REPS / 2];
        }
    printf("\ndecode step, Qwen2.5-1.5B shapes, context %d, KV bf16, CUDA graphs: median ms "
           "(speedup over bf16); *-skinny = QRL_FP4_NO_SPLITK=1 (before)\n%5s", CTX, "batch");
    for (int pi = 0; pi < N_P; pi++) printf(" %19s", DV[pi].name);
    printf("\n%5s", "GB");
    for (int pi = 0; pi < N_P; pi++) printf(" %19.2f", weight_gb[pi]);
    printf("\n");
    for (int bi = 0; bi < N_B; bi++) {
        printf("%5d", BATCH[bi]);
        for (int pi = 0; pi < N_P; pi++)
            printf("     %6.3f (%5.2fx)", step_ms[pi][bi], step_ms[0][bi] / step_ms[pi][bi]);
        printf("\n");
    }
}

static void write_json(const char *out, const char *dev) {
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", out);
        return;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"model_shapes\": \"qwen2.5-1.5B\",\n  \"reps\": %d,\n",
            dev, REPS);
    fprintf(f, "  \"gemm_us\": [");
    for (int pi = 0; pi < N_PROJ; pi++)
        for (int ti = 0; ti < N_TS; ti++) {
            fprintf(f, "%s\n    {\"proj\": \"%s\", \"N\": %d, \"K\": %d, \"T\": %d", pi || ti ? "," : "",
                    PROJ[pi].name, PROJ[pi].N, PROJ[pi].K, TS[ti]);
            for (int v = 0; v < N_V; v++) fprintf(f, ", \"%s\": %.3f", VNAME[v], gemm_us[pi][ti][v]);
            fprintf(f, ", \"splitk_warps\": %d, \"splitk_splits\": %d}", plan_w[pi][ti], plan_s[pi][ti]);
        }
    fprintf(f, "\n  ],\n  \"decode\": {\"context\": %d, \"kv\": \"bf16\", \"graphs\": true, \"rows\": [", CTX);
    const char *names[N_P];
    for (int pi = 0; pi < N_P; pi++) names[pi] = DV[pi].name;
    json_decode_rows(f, N_P, names, N_B, BATCH, &step_ms[0][0], weight_gb);
    fclose(f);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/fp4-h200.json", *sweep_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--sweep") && i + 1 < argc) sweep_path = argv[++i];
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    FILE *sweep = sweep_path ? fopen(sweep_path, "w") : NULL;
    if (sweep_path && !sweep) fprintf(stderr, "cannot write %s\n", sweep_path);
    bench_gemm(sweep);
    if (sweep) fclose(sweep);
    bench_decode();
    write_json(out, prop.name);
    return 0;
}
#endif
