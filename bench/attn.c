/* Decode attention alone against the HBM floor: the paged BF16 attention launcher
 * (kernels/cuda/attention.cu) on Qwen3-4B heads (32 q / 8 kv, head_dim 128, block 16),
 * tensor-core path vs the CUDA-core one (QRL_ATTN_LEGACY=1), same inputs.
 *
 * Per shape: enough layers of random K/V (distinct buffers, rotated per launch) that one
 * pass exceeds 2 GB, so L2 holds none of it; 3 warm-up passes, then 15 timed launches
 * each, median.  GB/s = K/V bytes read / time (q, out, tables are < 0.1%).  The two
 * paths' outputs are compared (relative L2 difference) on the first layer.
 *
 *   build/bench/attn [--tc-only]     (GPU only; --tc-only skips the CUDA-core timing) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "attn: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/attention.cuh"
#include "cuda/pointwise.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define QK(x) do { if ((x) != QRL_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg); exit(1); } } while (0)
#define REPS 15
#define BS 16

typedef struct shape { int batch, ctx, mixed; } shape;
/* mixed: row lengths spread over [1, ctx] (ragged batch) */
static const shape SHAPES[] = {{1, 1024, 0},  {8, 1024, 0},   {64, 1024, 0}, {64, 4096, 0},
                               {304, 1384, 0}, {176, 4767, 0}, {1, 8192, 0},  {32, 8192, 0},
                               {128, 4096, 1}};
#define N_SHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float bf16f(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static float run(qrl_cuda_attention_args *a, uint16_t *kc, size_t kvn, int L, int legacy) {
    qrl_error err;
    setenv("QRL_ATTN_LEGACY", legacy ? "1" : "0", 1);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    for (int it = -3; it < REPS; it++) {
        int l = (it + 3) % L;
        a->k_cache = kc + 2 * kvn * l;
        a->v_cache = a->k_cache + kvn;
        CK(cudaEventRecord(e0, 0));
        QK(qrl_cuda_attention(a, NULL, &err));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        if (it >= 0) CK(cudaEventElapsedTime(&ms[it], e0, e1));
    }
    CK(cudaGetLastError());
    qsort(ms, REPS, sizeof *ms, cmp_f);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms[REPS / 2];
}

int main(int argc, char **argv) {
    int tc_only = argc > 1 && !strcmp(argv[1], "--tc-only");
    qrl_error err;
    const int H = 32, KVH = 8, HD = 128, Q = H * HD, KV = KVH * HD;
    printf("%-12s %6s %9s %9s %8s %9s %8s %8s %9s\n", "shape", "layers", "KV MB", "legacy ms",
           "GB/s", "tc ms", "GB/s", "speedup", "rel diff");
    for (int s = 0; s < N_SHAPES; s++) {
        int B = SHAPES[s].batch, ctx = SHAPES[s].ctx, mb = (ctx + BS) / BS;
        int32_t *h = malloc(((size_t)B * mb + 2 * (size_t)B) * 4);
        double kvbytes = 0;
        for (size_t i = 0; i < (size_t)B * mb; i++) h[i] = (int32_t)i;
        for (int i = 0; i < B; i++) {
            int pos = SHAPES[s].mixed ? (int)(((long)i * 2654435761u) % ctx) : ctx;
            h[(size_t)B * mb + i] = i, h[(size_t)B * mb + B + i] = pos;
            kvbytes += (double)(pos + 1) * KV * 2 * 2;
        }
        size_t kvn = (size_t)B * mb * BS * KV;
        int L = (int)ceil(2.2e9 / (2.0 * kvn * 2));
        if (L > 36) L = 36;
        uint16_t *kc, *o1, *o2;
        float *q, *work;
        int32_t *tab;
        size_t wf = qrl_cuda_attention_work_floats(B, H, HD, ctx + 1);
        CK(cudaMalloc((void **)&kc, 2 * kvn * 2 * L));
        CK(cudaMalloc((void **)&o1, (size_t)B * Q * 2));
        CK(cudaMalloc((void **)&o2, (size_t)B * Q * 2));
        CK(cudaMalloc((void **)&q, (size_t)B * Q * 4));
        CK(cudaMalloc((void **)&work, wf * 4));
        CK(cudaMalloc((void **)&tab, ((size_t)B * mb + 2 * (size_t)B) * 4));
        CK(cudaMemcpy(tab, h, ((size_t)B * mb + 2 * (size_t)B) * 4, cudaMemcpyHostToDevice));
        QK(qrl_cuda_fill_random_bf16(kc, 2 * kvn * L, 7 + s, 0, 1, NULL, &err));
        /* q: BF16 random widened on the host (values of a QK-normed, rotated q) */
        uint16_t *q16 = malloc((size_t)B * Q * 2);
        float *qh = malloc((size_t)B * Q * 4);
        QK(qrl_cuda_fill_random_bf16(o1, (size_t)B * Q, 99 + s, 0, 1.5f, NULL, &err));
        CK(cudaMemcpy(q16, o1, (size_t)B * Q * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < (size_t)B * Q; i++) qh[i] = bf16f(q16[i]);
        CK(cudaMemcpy(q, qh, (size_t)B * Q * 4, cudaMemcpyHostToDevice));
        qrl_cuda_attention_args a = {.q = q, .block_tables = tab, .max_blocks_per_seq = mb,
                                     .block_size = BS, .row_seq = tab + (size_t)B * mb,
                                     .row_pos = tab + (size_t)B * mb + B, .n = B, .n_heads = H,
                                     .n_kv_heads = KVH, .head_dim = HD, .scale = 0.0883883f,
                                     .max_len = ctx + 1, .work = work, .work_floats = wf};
        CK(cudaMemset(o1, 0xff, (size_t)B * Q * 2));
        CK(cudaMemset(o2, 0xff, (size_t)B * Q * 2));
        a.out = o1;
        float t_old = run(&a, kc, kvn, 1, 1);
        a.out = o2;
        float t_new = run(&a, kc, kvn, 1, 0);
        uint16_t *h1 = malloc((size_t)B * Q * 2), *h2 = malloc((size_t)B * Q * 2);
        CK(cudaMemcpy(h1, o1, (size_t)B * Q * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2, o2, (size_t)B * Q * 2, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)B * Q; i++) {
            double x = bf16f(h1[i]), y = bf16f(h2[i]);
            num += (x - y) * (x - y);
            den += x * x;
        }
        double rel = den > 0 ? sqrt(num / den) : INFINITY;
        if (!(rel == rel)) rel = INFINITY;
        t_old = tc_only ? NAN : run(&a, kc, kvn, L, 1);
        t_new = run(&a, kc, kvn, L, 0);
        char name[32];
        snprintf(name, sizeof name, "%dx%d%s", B, ctx, SHAPES[s].mixed ? "r" : "");
        printf("%-12s %6d %9.1f %9.4f %8.0f %9.4f %8.0f %7.2fx %9.2e\n", name, L, kvbytes / 1e6,
               t_old, kvbytes / (t_old * 1e-3) / 1e9, t_new, kvbytes / (t_new * 1e-3) / 1e9,
               t_old / t_new, rel);
        fflush(stdout);
        free(h); free(q16); free(qh); free(h1); free(h2);
        cudaFree(kc); cudaFree(o1); cudaFree(o2); cudaFree(q); cudaFree(work); cudaFree(tab);
    }
    return 0;
}
#endif
