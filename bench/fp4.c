/* W4A16 NVFP4 / MXFP4 on the GPU (kernels/cuda/gemm_fp4.cuh): the GEMMs of a layer, then
 * the decode step per weight precision, on Qwen2.5-1.5B shapes (hidden 1536, 28 layers,
 * 12 q / 2 kv heads, head_dim 128, intermediate 8960, vocab 151936, tied LM head, QKV bias).
 *
 * GEMMs: the four projections (qkv 2048x1536, o 1536x1536, gate+up 17920x1536, down
 * 1536x8960) at T = 1, 8, 16, 32, 64, 128: cuBLAS BF16 (the bf16 engine's GEMM) vs the NVFP4
 * skinny (bit-trick decoder), skinny-f32 (reference decoder) and dequant kernels.  Mean of REPS calls between two CUDA events, cycling through
 * weight copies that together exceed the 50 MB L2 (a decode step reads every layer from HBM).
 *
 * Decode: qrl_cuda_forward_decode at batch 1 and 32, context 512, random weights and KV
 * (qrl_cuda_forward_init_random), weights bf16, w8a8-int8, w4a16-nvfp4, w4a16-mxfp4 (KV
 * bf16): WARMUP steps, then REPS steps timed one by one with events; the median and the
 * ratio to bf16 at the same batch in the same run.
 *
 *   build/bench/fp4 [--out FILE]     (GPU only; default bench/results/fp4-h200.json) */
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
#define CTX 512



/* ---- GEMMs -------------------------------------------------------------------------- */

typedef struct proj { const char *name; int N, K; } proj;
static const proj PROJ[] = {{"qkv", 2048, 1536}, {"o", 1536, 1536}, {"gate_up", 17920, 1536},
                            {"down", 1536, 8960}};
#define N_PROJ 4
static const int TS[] = {1, 8, 16, 32, 64, 128};
#define N_TS 6
#define MAX_T 128
enum { V_BF16, V_SKINNY, V_SKINNY_F32, V_DEQUANT, N_V };
static const char *const VNAME[N_V] = {"bf16", "nvfp4-skinny", "nvfp4-skinny-f32", "nvfp4-dequant"};
static const qrl_cuda_fp4_kernel VKER[N_V] = {QRL_CUDA_FP4_AUTO, QRL_CUDA_FP4_SKINNY,
                                              QRL_CUDA_FP4_SKINNY_F32, QRL_CUDA_FP4_DEQUANT};
static double gemm_us[N_PROJ][N_TS][N_V];

static void bench_gemm(void) {
    qrl_error err;
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    for (int pi = 0; pi < N_PROJ; pi++) {
        const proj *p = &PROJ[pi];
        size_t cb = (size_t)p->N * qrl_cuda_fp4_code_bytes(p->K),
               sb = (size_t)p->N * qrl_cuda_fp4_scale_bytes(p->K, false);
        int copies = (int)((160u << 20) / (cb + sb)) + 1;
        if (copies > REPS) copies = REPS;
        int bcopies = (int)((160u << 20) / ((size_t)p->N * p->K * 2)) + 1;
        uint8_t *codes[REPS], *scales[REPS];
        uint16_t *wb[REPS];
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc((void **)&codes[c], cb));
            CK(cudaMalloc((void **)&scales[c], sb));
            QK(qrl_cuda_fill_random_int8((int8_t *)codes[c], cb, 10 + c, NULL, &err));
            CK(cudaMemset(scales[c], 0x38, sb)); /* E4M3 1.0 */
        }
        for (int c = 0; c < bcopies; c++) {
            CK(cudaMalloc((void **)&wb[c], (size_t)p->N * p->K * 2));
            QK(qrl_cuda_fill_random_bf16(wb[c], (size_t)p->N * p->K, 20 + c, 0, 0.02f, NULL, &err));
        }
        float *y, *rs;
        uint16_t *xb, *work;
        CK(cudaMalloc((void **)&y, (size_t)MAX_T * p->N * 4));
        CK(cudaMalloc((void **)&rs, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&xb, (size_t)MAX_T * p->K * 2));
        CK(cudaMalloc((void **)&work, (size_t)p->N * p->K * 2));
        CK(cudaMemset(rs, 0, (size_t)p->N * 4));
        QK(qrl_cuda_fill_random_bf16(xb, (size_t)MAX_T * p->K, 7, 0, 1, NULL, &err));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int ti = 0; ti < N_TS; ti++)
            for (int v = 0; v < N_V; v++) {
                float ms = 0;
                for (int it = -1; it < 1; it++) { /* one untimed round */
                    CK(cudaEventRecord(e0, 0));
                    for (int r = 0; r < REPS; r++) {
                        if (v == V_BF16) {
                            QK(qrl_cuda_gemm_bf16(g, y, xb, wb[r % bcopies], TS[ti], p->K, p->N,
                                                  NULL, &err));
                            continue;
                        }
                        qrl_cuda_fp4_gemm_args a = {
                            .y = y, .x = xb, .codes = codes[r % copies],
                            .scales = scales[r % copies], .row_scale = rs, .T = TS[ti],
                            .N = p->N, .K = p->K,
                            .kernel = VKER[v],
                            .work = work, .work_elems = (size_t)p->N * p->K, .blas = g};
                        QK(qrl_cuda_fp4_gemm(&a, NULL, &err));
                    }
                    CK(cudaEventRecord(e1, 0));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                }
                gemm_us[pi][ti][v] = ms * 1e3 / REPS;
            }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        for (int c = 0; c < copies; c++) cudaFree(codes[c]), cudaFree(scales[c]);
        for (int c = 0; c < bcopies; c++) cudaFree(wb[c]);
        cudaFree(y); cudaFree(rs); cudaFree(xb); cudaFree(work);
        printf("\n%s N=%d K=%d (nvfp4 %.1f MB), µs per call; GB/s = nvfp4 bytes / skinny time\n%5s",
               p->name, p->N, p->K, (cb + sb) / 1e6, "T");
        for (int v = 0; v < N_V; v++) printf(" %16s", VNAME[v]);
        printf(" %8s\n", "GB/s");
        for (int ti = 0; ti < N_TS; ti++) {
            printf("%5d", TS[ti]);
            for (int v = 0; v < N_V; v++) printf(" %16.2f", gemm_us[pi][ti][v]);
            printf(" %8.0f\n", (cb + sb) / (gemm_us[pi][ti][V_SKINNY] * 1e3));
        }
    }
    qrl_cuda_gemm_free(g);
}

/* ---- decode step -------------------------------------------------------------------- */

static const int BATCH[] = {1, 32};
#define N_B 2
static const qrl_precision PREC[] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8,
                                     QRL_PRECISION_W4A16_NVFP4, QRL_PRECISION_W4A16_MXFP4};
#define N_P 4
static double step_ms[N_P][N_B], weight_gb[N_P];

static void bench_decode(void) {
    qrl_model_config c = qwen25_1_5b();
    for (int pi = 0; pi < N_P; pi++)
        for (int bi = 0; bi < N_B; bi++) {
            int B = BATCH[bi];
            float ms[REPS];
            decode_step_times(&c, PREC[pi], B, CTX, WARMUP, REPS, ms, &weight_gb[pi]);
            step_ms[pi][bi] = ms[REPS / 2];
        }
    printf("\ndecode step, Qwen2.5-1.5B shapes, context %d, KV bf16: median ms (speedup over bf16)\n%5s",
           CTX, "batch");
    for (int pi = 0; pi < N_P; pi++) printf(" %12s (%.2f GB)", qrl_precision_name(PREC[pi]), weight_gb[pi]);
    printf("\n");
    for (int bi = 0; bi < N_B; bi++) {
        printf("%5d", BATCH[bi]);
        for (int pi = 0; pi < N_P; pi++)
            printf(" %10.3f (%5.2fx)    ", step_ms[pi][bi], step_ms[0][bi] / step_ms[pi][bi]);
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
            fprintf(f, "}");
        }
    fprintf(f, "\n  ],\n  \"decode\": {\"context\": %d, \"kv\": \"bf16\", \"rows\": [", CTX);
    for (int bi = 0; bi < N_B; bi++) {
        fprintf(f, "%s\n    {\"batch\": %d", bi ? "," : "", BATCH[bi]);
        for (int pi = 0; pi < N_P; pi++)
            fprintf(f, ", \"%s_ms\": %.4f, \"%s_speedup_vs_bf16\": %.3f", qrl_precision_name(PREC[pi]),
                    step_ms[pi][bi], qrl_precision_name(PREC[pi]), step_ms[0][bi] / step_ms[pi][bi]);
        fprintf(f, "}");
    }
    fprintf(f, "\n  ],\n  \"weight_gb\": {");
    for (int pi = 0; pi < N_P; pi++)
        fprintf(f, "%s\"%s\": %.3f", pi ? ", " : "", qrl_precision_name(PREC[pi]), weight_gb[pi]);
    fprintf(f, "}}\n}\n");
    fclose(f);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/fp4-h200.json";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    bench_gemm();
    bench_decode();
    write_json(out, prop.name);
    return 0;
}
#endif
