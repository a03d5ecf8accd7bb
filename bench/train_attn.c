/* Training attention (kernels/cuda/train_attention.cu) forward and backward time and
 * TFLOPS on the tensor-core path: Qwen-like heads (12 q / 2 kv, head_dim 128; 14 q / 2 kv,
 * head_dim 64), one causal sequence of T = 2048 and 8192 tokens, and T = 8192 packed as
 * 8 sequences of 1024.
 *
 * FLOPs count the unmasked (query, key) pairs only (causal: ~T^2/2 per sequence):
 * forward 4 * pairs * H * hd (two matrix products), backward 2.5x the forward (five
 * products).  The backward time includes its D = rowsum(dout * out) preprocess.  2 warm-up
 * launches, then 10 timed ones each, median.  Random BF16 inputs (N(0,1)).
 *
 *   build/bench/train_attn [--out bench/results/train_attn-h200.json]   (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "train_attn: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/pointwise.cuh"
#include "cuda/train_attention.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define QK(x) do { if ((x) != QRL_OK) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, err.msg); exit(1); } } while (0)
#define REPS 10
#define WARM 2

typedef struct shape { int T, H, Hkv, hd, nseg; } shape;
static const shape SHAPES[] = {{2048, 12, 2, 128, 1}, {8192, 12, 2, 128, 1}, {8192, 12, 2, 128, 8},
                               {2048, 14, 2, 64, 1},  {8192, 14, 2, 64, 1},  {8192, 14, 2, 64, 8}};
#define N_SHAPES (int)(sizeof SHAPES / sizeof *SHAPES)

typedef struct result { double fwd_ms, bwd_ms, fwd_tflops, bwd_tflops, gflop_fwd; } result;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct bufs {
    uint16_t *q, *k, *v, *out, *dout;
    float *lse, *dq, *dk, *dv, *work;
    int32_t *ss;
} bufs;

static float time_pass(const shape *s, bufs *b, int backward) {
    qrl_error err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    for (int it = -WARM; it < REPS; it++) {
        CK(cudaEventRecord(e0, 0));
        if (backward)
            QK(qrl_cuda_train_attention_backward(b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v, b->out,
                                                 b->lse, b->ss, s->T, s->H, s->Hkv, s->hd, b->work, NULL, &err));
        else
            QK(qrl_cuda_train_attention_forward(b->out, b->lse, b->q, b->k, b->v, b->ss, s->T, s->H,
                                                s->Hkv, s->hd, NULL, &err));
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

static void run_shape(const shape *s, result *r) {
    qrl_error err;
    size_t nq = (size_t)s->T * s->H * s->hd, nk = (size_t)s->T * s->Hkv * s->hd;
    bufs b;
    CK(cudaMalloc((void **)&b.q, nq * 2));
    CK(cudaMalloc((void **)&b.out, nq * 2));
    CK(cudaMalloc((void **)&b.dout, nq * 2));
    CK(cudaMalloc((void **)&b.k, nk * 2));
    CK(cudaMalloc((void **)&b.v, nk * 2));
    CK(cudaMalloc((void **)&b.lse, (size_t)s->T * s->H * 4));
    CK(cudaMalloc((void **)&b.dq, nq * 4));
    CK(cudaMalloc((void **)&b.dk, nk * 4));
    CK(cudaMalloc((void **)&b.dv, nk * 4));
    CK(cudaMalloc((void **)&b.work, qrl_cuda_train_attention_work_floats(s->T, s->H) * 4));
    CK(cudaMalloc((void **)&b.ss, (size_t)s->T * 4));
    QK(qrl_cuda_fill_random_bf16(b.q, nq, 1, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(b.k, nk, 2, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(b.v, nk, 3, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(b.dout, nq, 4, 0, 1, NULL, &err));
    CK(cudaMemset(b.dq, 0, nq * 4));
    CK(cudaMemset(b.dk, 0, nk * 4));
    CK(cudaMemset(b.dv, 0, nk * 4));
    int32_t *ss = malloc((size_t)s->T * 4);
    int len = s->T / s->nseg;
    double pairs = 0;
    for (int t = 0; t < s->T; t++) {
        ss[t] = t / len * len;
        pairs += t - ss[t] + 1;
    }
    CK(cudaMemcpy(b.ss, ss, (size_t)s->T * 4, cudaMemcpyHostToDevice));
    free(ss);
    double flop = 4.0 * pairs * s->H * s->hd;
    r->gflop_fwd = flop / 1e9;
    r->fwd_ms = time_pass(s, &b, 0);
    r->bwd_ms = time_pass(s, &b, 1);
    r->fwd_tflops = flop / (r->fwd_ms * 1e-3) / 1e12;
    r->bwd_tflops = 2.5 * flop / (r->bwd_ms * 1e-3) / 1e12;
    cudaFree(b.q); cudaFree(b.out); cudaFree(b.dout); cudaFree(b.k); cudaFree(b.v);
    cudaFree(b.lse); cudaFree(b.dq); cudaFree(b.dk); cudaFree(b.dv); cudaFree(b.work); cudaFree(b.ss);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/train_attn-h200.json";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "train_attn: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    printf("%6s %4s %4s %4s %5s %9s %9s %9s %9s %9s\n", "T", "H", "Hkv", "hd", "segs", "GFLOP fwd",
           "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
    result res[N_SHAPES];
    for (int i = 0; i < N_SHAPES; i++) {
        const shape *s = &SHAPES[i];
        run_shape(s, &res[i]);
        printf("%6d %4d %4d %4d %5d %9.1f %9.3f %9.1f %9.3f %9.1f\n", s->T, s->H, s->Hkv, s->hd, s->nseg,
               res[i].gflop_fwd, res[i].fwd_ms, res[i].fwd_tflops, res[i].bwd_ms, res[i].bwd_tflops);
        fflush(stdout);
    }
    FILE *jf = fopen(out, "w");
    if (!jf) {
        fprintf(stderr, "train_attn: cannot write %s\n", out);
        return 0;
    }
    fprintf(jf, "{\n  \"device\": \"%s\",\n  \"repeats\": %d,\n  \"flops\": \"fwd 4*pairs*H*hd, bwd 2.5x\",\n"
            "  \"shapes\": [\n", prop.name, REPS);
    for (int i = 0; i < N_SHAPES; i++) {
        const shape *s = &SHAPES[i];
        fprintf(jf, "    {\"T\": %d, \"H\": %d, \"Hkv\": %d, \"hd\": %d, \"segments\": %d, \"fwd_ms\": %.4f, "
                "\"fwd_tflops\": %.1f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.1f}%s\n", s->T, s->H, s->Hkv,
                s->hd, s->nseg, res[i].fwd_ms, res[i].fwd_tflops, res[i].bwd_ms, res[i].bwd_tflops,
                i + 1 < N_SHAPES ? "," : "");
    }
    fprintf(jf, "  ]\n}\n");
    fclose(jf);
    printf("wrote %s\n", out);
    return 0;
}
#endif
