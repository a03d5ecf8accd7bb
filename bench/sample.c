/* Device sampler (kernels/cuda/sample.cuh) vs the host path it replaces in the CUDA decode
 * step: copy the [batch, vocab] F32 logits to the host and sample each row with
 * qrl_sampler_sample (what the scheduler did: one thread, a malloc'd buffer).
 *
 * vocab 151936 (Qwen3), batch 64 and 256, logits 2.5 x a standard normal (an LM head's
 * spread) with fresh keys per row; configs: greedy, T = 1 (nothing cut: the RL default),
 * T = 1 top-p 0.9, T = 0.8 top-k 50 top-p 0.95.
 *   device: CUDA events around qrl_cuda_sample + the copy of the batch's results, median
 *           of REPEATS after WARMUP;
 *   host:   the logits copy (cudaMemcpy into pageable memory, median of 5; pinned memory
 *           also reported) + the CPU sampler over the rows: measured on CPU_ROWS rows and
 *           scaled to the batch (rows cost the same; the top-k/top-p configs sort the
 *           vocabulary per row).
 *   build/bench/sample [--out FILE]   (GPU only) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "sample: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/sample.cuh"
#include "model/sampler.h"

#define V 151936
#define REPEATS 20
#define WARMUP 3
#define CPU_ROWS 16

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define QK(x) do { if ((x) != QRL_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg); exit(1); } } while (0)

typedef struct cfg { const char *name; float T; int k; float p; } cfg;
static const cfg CFGS[] = {{"greedy", 0.0f, 0, 1.0f}, {"T=1", 1.0f, 0, 1.0f},
                           {"T=1 p=0.9", 1.0f, 0, 0.9f}, {"T=0.8 k=50 p=0.95", 0.8f, 50, 0.95f}};
#define N_CFGS (int)(sizeof CFGS / sizeof *CFGS)

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_f);
    return v[n / 2];
}
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Median ms of a device-to-host copy of `bytes` into dst. */
static float copy_ms(void *dst, const void *src, size_t bytes, cudaEvent_t e0, cudaEvent_t e1) {
    float ms[5];
    for (int i = -1; i < 5; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        if (i >= 0) CK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    return median(ms, 5);
}

int main(int argc, char **argv) {
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    const int batches[2] = {64, 256}, BMAX = 256;
    qrl_error err;
    float *x = malloc((size_t)BMAX * V * 4), *hx = malloc((size_t)BMAX * V * 4), *pinned;
    uint64_t s = 1;
    for (size_t i = 0; i < (size_t)BMAX * V; i += 2) { /* Box-Muller pairs */
        double u1, u2;
        s = s * 6364136223846793005ull + 1442695040888963407ull, u1 = ((s >> 11) + 1) * 0x1p-53;
        s = s * 6364136223846793005ull + 1442695040888963407ull, u2 = (s >> 11) * 0x1p-53;
        double r = sqrt(-2 * log(u1));
        x[i] = (float)(2.5 * r * cos(2 * M_PI * u2));
        x[i + 1] = (float)(2.5 * r * sin(2 * M_PI * u2));
    }
    float *dx;
    qrl_cuda_sample_req *dreq, req[256];
    qrl_cuda_sample_out *dout, hout[256];
    CK(cudaMalloc((void **)&dx, (size_t)BMAX * V * 4));
    CK(cudaMalloc((void **)&dreq, sizeof req));
    CK(cudaMalloc((void **)&dout, sizeof hout));
    CK(cudaMallocHost((void **)&pinned, (size_t)BMAX * V * 4));
    CK(cudaMemcpy(dx, x, (size_t)BMAX * V * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    qrl_sampler *smp;
    QK(qrl_sampler_new(V, &smp, &err));
    char dev[256] = "?";
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(dev, sizeof dev, "%s", prop.name);
    FILE *js = out_path ? fopen(out_path, "w") : NULL;
    if (out_path && !js) { perror(out_path); return 1; }
    if (js) fprintf(js, "{\n  \"bench\": \"sample\",\n  \"device\": \"%s\",\n  \"vocab\": %d,\n"
                    "  \"cpu_rows_measured\": %d,\n  \"results\": [\n", dev, V, CPU_ROWS);
    printf("%-20s %5s %10s %10s %10s %10s %12s %9s\n", "config", "batch", "device_ms", "d2h_ms",
           "d2h_pin_ms", "cpu_ms", "host_path_ms", "speedup");
    int first = 1;
    for (int bi = 0; bi < 2; bi++) {
        int B = batches[bi];
        size_t bytes = (size_t)B * V * 4;
        float d2h = copy_ms(hx, dx, bytes, e0, e1), d2h_pin = copy_ms(pinned, dx, bytes, e0, e1);
        for (int c = 0; c < N_CFGS; c++) {
            const cfg *k = &CFGS[c];
            for (int r = 0; r < B; r++)
                req[r] = (qrl_cuda_sample_req){.seed = 7, .group = 1000 + c, .response = (uint32_t)r,
                                               .position = 50, .temperature = k->T, .top_k = k->k,
                                               .top_p = k->p};
            CK(cudaMemcpy(dreq, req, (size_t)B * sizeof *req, cudaMemcpyHostToDevice));
            float ms[REPEATS];
            for (int i = -WARMUP; i < REPEATS; i++) {
                CK(cudaEventRecord(e0, 0));
                QK(qrl_cuda_sample(dx, B, V, dreq, dout, NULL, &err));
                CK(cudaMemcpyAsync(hout, dout, (size_t)B * sizeof *hout, cudaMemcpyDeviceToHost, 0));
                CK(cudaEventRecord(e1, 0));
                CK(cudaEventSynchronize(e1));
                if (i >= 0) CK(cudaEventElapsedTime(&ms[i], e0, e1));
            }
            float dev_ms = median(ms, REPEATS);
            /* the host path on the first CPU_ROWS rows (the copied logits), checking that the
             * device drew the same tokens */
            qrl_sampling_params sp = {k->T, k->k, k->p, 7};
            int same = 0;
            double t0 = now_ms();
            for (int r = 0; r < CPU_ROWS; r++) {
                qrl_sample o;
                QK(qrl_sampler_sample(smp, hx + (size_t)r * V, &sp, 1000 + c, (uint32_t)r, 50, &o, &err));
                same += o.token == hout[r].token;
            }
            double cpu_ms = (now_ms() - t0) / CPU_ROWS * B, host_ms = d2h + cpu_ms;
            printf("%-20s %5d %10.3f %10.3f %10.3f %10.2f %12.2f %8.0fx  (%d/%d tokens equal)\n",
                   k->name, B, dev_ms, d2h, d2h_pin, cpu_ms, host_ms, host_ms / dev_ms, same,
                   CPU_ROWS);
            if (js)
                fprintf(js, "%s    {\"config\": \"%s\", \"batch\": %d, \"temperature\": %g, "
                        "\"top_k\": %d, \"top_p\": %g, \"device_ms\": %.4f, \"d2h_ms\": %.4f, "
                        "\"d2h_pinned_ms\": %.4f, \"cpu_sample_ms\": %.3f, \"host_path_ms\": %.3f, "
                        "\"speedup\": %.1f, \"tokens_equal\": %d, \"tokens_checked\": %d}",
                        first ? "" : ",\n", k->name, B, k->T, k->k, k->p, dev_ms, d2h, d2h_pin,
                        cpu_ms, host_ms, host_ms / dev_ms, same, CPU_ROWS);
            first = 0;
        }
    }
    if (js) {
        fprintf(js, "\n  ]\n}\n");
        fclose(js);
    }
    qrl_sampler_free(smp);
    cudaFreeHost(pinned);
    cudaFree(dx), cudaFree(dreq), cudaFree(dout);
    free(x), free(hx);
    return 0;
}
#endif
