/* W8A8 on the GPU (kernels/cuda/gemm_w8a8.cuh): the GEMM kernels one by one, then the
 * decode step per weight precision, on Qwen2.5-1.5B shapes (hidden 1536, 28 layers, 12 q /
 * 2 kv heads, head_dim 128, intermediate 8960, vocab 151936, tied LM head, QKV bias).
 *
 * GEMMs: the four projections of a layer (qkv 2048x1536, o 1536x1536, gate+up 17920x1536,
 * down 1536x8960) at T = 1 .. 256 rows: cuBLAS BF16 (qrl_cuda_gemm_bf16, the bf16 engine's
 * GEMM), INT8 dp4a / mma-skinny / mma-tiled / cublas / auto, FP8 mma-skinny / mma-tiled /
 * cublas / auto (with the split-K workspace and the cuBLAS handle, as the engine), and the
 * per-token quantization of T rows (BF16 input, as the engine).  Each time is the mean of REPS calls between two CUDA events, the
 * calls cycling through copies of the weights that together exceed the 50 MB L2 (a decode
 * step reads every layer's weights once, from HBM).  These tables set AUTO's thresholds.
 *
 * Decode: qrl_cuda_forward_decode at batch 1, 32, 128, 256, context 512, random weights and
 * KV (qrl_cuda_forward_init_random), weights bf16, w8a8-int8, w8a8-fp8 (KV bf16), the w8a8
 * engines as they run (quantization fused into the norms and SwiGLU) and with
 * QRL_W8A8_UNFUSED=1 (a separate quantization launch before every projection): WARMUP
 * steps, then REPS steps timed one by one with events; the median and the ratio to bf16 at
 * the same batch in the same run.
 *
 * --model qwen3-4b: Qwen3-4B's projections (qkv 6144x2560, o 2560x4096, gate+up 19456x2560,
 * down 2560x9728) and model instead.  i8-cublasu / f8-cublasu: the CUBLAS path before issue
 * 22 (QRL_CUDA_W8A8_CUBLAS_UNFUSED).
 *
 *   build/bench/w8a8 [--out FILE] [--gemm 0|1] [--decode 0|1] [--model qwen2.5-1.5b|qwen3-4b]
 *   (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "w8a8: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/gemm.cuh"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/pointwise.cuh"
#include "model/forward_cuda.h"

#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3
#define CTX 512

/* ---- GEMM kernels ------------------------------------------------------------------ */

typedef struct proj { const char *name; int N, K; } proj;
static const proj PROJ_15B[] = {{"qkv", 2048, 1536}, {"o", 1536, 1536}, {"gate_up", 17920, 1536},
                                {"down", 1536, 8960}};
static const proj PROJ_4B[] = {{"qkv", 6144, 2560}, {"o", 2560, 4096}, {"gate_up", 19456, 2560},
                               {"down", 2560, 9728}};
static const proj *PROJ = PROJ_15B; /* --model */
static bool QWEN3_4B = false;
#define N_PROJ 4
static const int TS[] = {1, 8, 16, 32, 48, 64, 96, 128, 192, 256};
#define N_TS (int)(sizeof TS / sizeof *TS)
#define MAX_T 256
enum { V_BF16, V_I8_DP4A, V_I8_SKINNY, V_I8_TILED, V_I8_BLAS, V_I8_BLASU, V_I8_AUTO, V_F8_SKINNY,
       V_F8_TILED, V_F8_BLAS, V_F8_BLASU, V_F8_AUTO, V_Q_I8, V_Q_F8, N_V };
static const char *const VNAME[N_V] = {"bf16",      "i8-dp4a",    "i8-skinny", "i8-tiled",
                                       "i8-cublas", "i8-cublasu", "i8-auto",   "f8-skinny",
                                       "f8-tiled",  "f8-cublas",  "f8-cublasu", "f8-auto",
                                       "quant-i8",  "quant-f8"};
static double gemm_us[N_PROJ][N_TS][N_V];

/* Mean µs of one call of variant v at T rows, cycling through `copies` weight copies. */
static double time_variant(int v, int T, const proj *p, int copies, uint8_t **wq, uint16_t **wb,
                           void *xq, float *sx, float *sw, uint16_t *xb, float *y, float *work,
                           size_t work_floats, qrl_cuda_gemm *g) {
    qrl_error err;
    int ld = qrl_cuda_w8a8_ld(p->K);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int it = -1; it < 1; it++) { /* one untimed round, then the timed one */
        CK(cudaEventRecord(e0, 0));
        for (int r = 0; r < REPS; r++) {
            int c = r % copies;
            if (v == V_BF16) {
                QK(qrl_cuda_gemm_bf16(g, y, xb, wb[c], T, p->K, p->N, NULL, &err));
            } else if (v == V_Q_I8) {
                QK(qrl_cuda_int8_quantize_rows(xq, sx, xb, 1, T, p->K, ld, NULL, &err));
            } else if (v == V_Q_F8) {
                QK(qrl_cuda_fp8_quantize_rows(xq, sx, xb, 1, T, p->K, ld, NULL, &err));
            } else {
                static const qrl_cuda_w8a8_kernel K[N_V] = {
                    [V_I8_DP4A] = QRL_CUDA_W8A8_DP4A, [V_I8_SKINNY] = QRL_CUDA_W8A8_MMA_SKINNY,
                    [V_I8_TILED] = QRL_CUDA_W8A8_MMA_TILED, [V_I8_BLAS] = QRL_CUDA_W8A8_CUBLAS,
                    [V_I8_BLASU] = QRL_CUDA_W8A8_CUBLAS_UNFUSED, [V_I8_AUTO] = QRL_CUDA_W8A8_AUTO,
                    [V_F8_SKINNY] = QRL_CUDA_W8A8_MMA_SKINNY, [V_F8_TILED] = QRL_CUDA_W8A8_MMA_TILED,
                    [V_F8_BLAS] = QRL_CUDA_W8A8_CUBLAS, [V_F8_BLASU] = QRL_CUDA_W8A8_CUBLAS_UNFUSED,
                    [V_F8_AUTO] = QRL_CUDA_W8A8_AUTO};
                qrl_cuda_w8a8_kernel ran;
                qrl_cuda_w8a8_gemm_args a = {.y = y, .xq = xq, .sx = sx, .wq = wq[c], .sw = sw,
                                             .T = T, .N = p->N, .ld = ld, .fp8 = v >= V_F8_SKINNY,
                                             .kernel = K[v], .work = work,
                                             .work_floats = work_floats, .blas = g, .ran = &ran};
                QK(qrl_cuda_w8a8_gemm(&a, NULL, &err));
                if ((K[v] == QRL_CUDA_W8A8_CUBLAS || K[v] == QRL_CUDA_W8A8_CUBLAS_UNFUSED) &&
                    ran != K[v] && r == 0 && it == 0)
                    printf("NOTE: %s T=%d %s fell back to %s\n", p->name, T, VNAME[v],
                           qrl_cuda_w8a8_kernel_name(ran));
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

static void bench_gemm(void) {
    qrl_error err;
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    for (int pi = 0; pi < N_PROJ; pi++) {
        const proj *p = &PROJ[pi];
        int ld = qrl_cuda_w8a8_ld(p->K);
        size_t wbytes = (size_t)p->N * ld;
        int copies = (int)((160u << 20) / wbytes) + 1; /* int8 copies > 160 MB, bf16 > 320 MB */
        if (copies > REPS) copies = REPS;
        uint8_t *wq[REPS];
        uint16_t *wb[REPS];
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc((void **)&wq[c], wbytes));
            CK(cudaMalloc((void **)&wb[c], (size_t)p->N * p->K * 2));
            /* E4M3 codes (no NaN) serve the INT8 runs as well: speed does not depend on values */
            QK(qrl_cuda_fill_random_fp8(wq[c], wbytes, 10 + c, NULL, &err));
            QK(qrl_cuda_fill_random_bf16(wb[c], (size_t)p->N * p->K, 20 + c, 0, 0.02f, NULL, &err));
        }
        void *xq;
        float *sx, *sw, *y, *work = NULL;
        uint16_t *xb;
        size_t wf = 0;
        for (int ti = 0; ti < N_TS; ti++) {
            size_t w = qrl_cuda_w8a8_work_floats(TS[ti], p->N, ld);
            if (w > wf) wf = w;
        }
        CK(cudaMalloc(&xq, (size_t)MAX_T * ld));
        CK(cudaMalloc((void **)&sx, MAX_T * 4));
        CK(cudaMalloc((void **)&sw, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&y, (size_t)MAX_T * p->N * 4));
        CK(cudaMalloc((void **)&xb, (size_t)MAX_T * p->K * 2));
        if (wf) CK(cudaMalloc((void **)&work, wf * 4));
        QK(qrl_cuda_fill_random_bf16(xb, (size_t)MAX_T * p->K, 7, 0, 1, NULL, &err));
        CK(cudaMemset(sw, 0, (size_t)p->N * 4)); /* values do not change the speed */
        QK(qrl_cuda_fp8_quantize_rows(xq, sx, xb, 1, MAX_T, p->K, ld, NULL, &err));
        for (int ti = 0; ti < N_TS; ti++)
            for (int v = 0; v < N_V; v++)
                gemm_us[pi][ti][v] = time_variant(v, TS[ti], p, copies, wq, wb, xq, sx, sw, xb, y,
                                                  work, wf, g);
        CK(cudaDeviceSynchronize());
        for (int c = 0; c < copies; c++) cudaFree(wq[c]), cudaFree(wb[c]);
        cudaFree(xq); cudaFree(sx); cudaFree(sw); cudaFree(y); cudaFree(xb); cudaFree(work);
        printf("\n%s N=%d K=%d (int8 %.1f MB, %d copies), µs per call; GB/s = int8 weight bytes / "
               "i8-auto time\n%5s", p->name, p->N, p->K, wbytes / 1e6, copies, "T");
        for (int v = 0; v < N_V; v++) printf(" %10s", VNAME[v]);
        printf(" %8s\n", "GB/s");
        for (int ti = 0; ti < N_TS; ti++) {
            printf("%5d", TS[ti]);
            for (int v = 0; v < N_V; v++) printf(" %10.2f", gemm_us[pi][ti][v]);
            printf(" %8.0f\n", wbytes / (gemm_us[pi][ti][V_I8_AUTO] * 1e3));
        }
    }
    qrl_cuda_gemm_free(g);
}

/* ---- decode step ------------------------------------------------------------------- */

static const int BATCH[] = {1, 32, 128, 256};
#define N_B 4
typedef struct dvar { const char *name; qrl_precision prec; int unfused; } dvar;
static const dvar DV[] = {{"bf16", QRL_PRECISION_BF16, 0},
                          {"w8a8-int8", QRL_PRECISION_W8A8_INT8, 0},
                          {"w8a8-fp8", QRL_PRECISION_W8A8_FP8, 0},
                          {"w8a8-int8-unfused", QRL_PRECISION_W8A8_INT8, 1},
                          {"w8a8-fp8-unfused", QRL_PRECISION_W8A8_FP8, 1}};
#define N_P (int)(sizeof DV / sizeof *DV)
static double step_ms[N_P][N_B], weight_gb[N_P];

static void bench_decode(void) {
    qrl_model_config c = QWEN3_4B ? qwen3_4b() : qwen25_1_5b();
    for (int pi = 0; pi < N_P; pi++)
        for (int bi = 0; bi < N_B; bi++) {
            int B = BATCH[bi];
            float ms[REPS];
            if (DV[pi].unfused) setenv("QRL_W8A8_UNFUSED", "1", 1); /* read by forward_new */
            else unsetenv("QRL_W8A8_UNFUSED");
            decode_step_times(&c, DV[pi].prec, B, CTX, WARMUP, REPS, ms, &weight_gb[pi]);
            step_ms[pi][bi] = ms[REPS / 2];
            fprintf(stderr, "decode %s batch %d ctx %d: min %.3f median %.3f max %.3f ms\n",
                    DV[pi].name, B, CTX, ms[0], ms[REPS / 2], ms[REPS - 1]);
        }
    unsetenv("QRL_W8A8_UNFUSED");
    printf("\ndecode step, %s shapes, context %d, KV bf16: median ms (speedup over bf16)\n%5s",
           QWEN3_4B ? "Qwen3-4B" : "Qwen2.5-1.5B", CTX, "batch");
    for (int pi = 0; pi < N_P; pi++) printf(" %19s", DV[pi].name);
    printf("\n");
    for (int bi = 0; bi < N_B; bi++) {
        printf("%5d", BATCH[bi]);
        for (int pi = 0; pi < N_P; pi++)
            printf("     %6.3f (%5.2fx)", step_ms[pi][bi], step_ms[0][bi] / step_ms[pi][bi]);
        printf("\n");
    }
    printf("weights (GB):");
    for (int pi = 0; pi < N_P; pi++) printf(" %s %.2f", DV[pi].name, weight_gb[pi]);
    printf("\n");
}

static void write_json(const char *out, const char *dev, bool gemm, bool dec) {
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", out);
        return;
    }
    fprintf(f, "{\n  \"device\": \"%s\",\n  \"model_shapes\": \"%s\",\n  \"reps\": %d,\n",
            dev, QWEN3_4B ? "qwen3-4b" : "qwen2.5-1.5B", REPS);
    fprintf(f, "  \"gemm_us\": [");
    for (int pi = 0; gemm && pi < N_PROJ; pi++)
        for (int ti = 0; ti < N_TS; ti++) {
            fprintf(f, "%s\n    {\"proj\": \"%s\", \"N\": %d, \"K\": %d, \"T\": %d", pi || ti ? "," : "",
                    PROJ[pi].name, PROJ[pi].N, PROJ[pi].K, TS[ti]);
            for (int v = 0; v < N_V; v++) fprintf(f, ", \"%s\": %.3f", VNAME[v], gemm_us[pi][ti][v]);
            fprintf(f, "}");
        }
    fprintf(f, "\n  ],\n  \"decode\": {\"context\": %d, \"kv\": \"bf16\", \"rows\": [", CTX);
    const char *names[N_P];
    for (int pi = 0; pi < N_P; pi++) names[pi] = DV[pi].name;
    json_decode_rows(f, N_P, names, dec ? N_B : 0, BATCH, &step_ms[0][0], weight_gb);
    fclose(f);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/w8a8-h200.json";
    int gemm = 1, dec = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--gemm") && i + 1 < argc) gemm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) dec = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "qwen3-4b")) QWEN3_4B = true, PROJ = PROJ_4B;
            else if (strcmp(m, "qwen2.5-1.5b")) {
                fprintf(stderr, "w8a8: --model: '%s' is not qwen2.5-1.5b or qwen3-4b\n", m);
                return 2;
            }
        } else {
            fprintf(stderr, "w8a8: unknown or incomplete argument '%s'\nusage: w8a8 [--out FILE] "
                    "[--gemm 0|1] [--decode 0|1] [--model qwen2.5-1.5b|qwen3-4b]\n", argv[i]);
            return 2;
        }
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    if (gemm) bench_gemm();
    if (dec) bench_decode();
    write_json(out, prop.name, gemm, dec);
    return 0;
}
#endif
