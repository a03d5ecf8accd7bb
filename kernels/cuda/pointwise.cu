#include "cuda/pointwise.cuh"

#include <cuda_bf16.h>
#include <math.h>

#include "cuda/launch.cuh"
#include "cuda/nvfp4_dev.cuh"
#include "cuda/w8a8_dev.cuh"

static __global__ void embed_kernel(float *x, const uint16_t *table, const int32_t *tokens,
                                    int d) {
    size_t r = blockIdx.x;
    const uint16_t *row = table + (size_t)tokens[r] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[r * d + i] = qrl_bf16_ld_(row[i]);
}

qrl_status qrl_cuda_embed(float *x, const uint16_t *table, const int32_t *tokens, int n, int d,
                          void *stream, qrl_error *err) {
    if (n <= 0 || d <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "embed: n=%d d=%d", n, d);
    embed_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(x, table, tokens, d);
    return qrl_cuda_launch_status_("embed", err);
}

static __device__ __forceinline__ float silu_mul_f32(float g, float u) {
    return g / (1.0f + expf(-g)) * u; /* the expression qrl_cuda_swiglu has always rounded */
}
static __device__ __forceinline__ uint16_t silu_mul(float g, float u) {
    return qrl_bf16_st_(silu_mul_f32(g, u));
}

static __global__ void swiglu_kernel(uint16_t *out, const float *gu, int f) {
    size_t r = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < f; j += gridDim.x * blockDim.x)
        out[r * f + j] = silu_mul(gu[r * 2 * f + j], gu[r * 2 * f + f + j]);
}

qrl_status qrl_cuda_swiglu(uint16_t *out, const float *gu, int n, int f, void *stream,
                           qrl_error *err) {
    if (n <= 0 || f <= 0 || n > 65535)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "swiglu: n=%d f=%d", n, f);
    dim3 grid((f + 255) / 256 < 64 ? (f + 255) / 256 : 64, n);
    swiglu_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(out, gu, f);
    return qrl_cuda_launch_status_("swiglu", err);
}

/* Output j of a SwiGLU row as qrl_w8a8_quantize_row_'s source; stores it in outr (when
 * given) on the first call. */
struct swiglu_src {
    const float *gur;
    uint16_t *outr;
    int f;
    __device__ __forceinline__ float operator()(int j, bool first) const {
        uint16_t h = silu_mul(gur[j], gur[f + j]);
        if (first && outr) outr[j] = h;
        return qrl_bf16_ld_(h);
    }
};

/* One block of QB threads per row: the SwiGLU outputs stay in registers (J per thread)
 * between the absmax and the codes; J = 0 (rows longer than 12288) computes them twice. */
template <bool FP8, int J, int QB>
static __global__ void __launch_bounds__(QB)
swiglu_q_kernel(uint16_t *out, const float *gu, int f, uint8_t *q, float *scales, int ld) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    swiglu_src src = {gu + r * 2 * f, out ? out + r * f : NULL, f};
    qrl_w8a8_quantize_row_<FP8, J>(src, f, ld, QB, q + r * ld, scales + r, sh);
}

template <bool FP8>
static void launch_swiglu_q(uint16_t *out, const float *gu, int n, int f, uint8_t *q,
                            float *scales, int ld, cudaStream_t s) {
    /* the (J, threads) table of gemm_w8a8.cu's launch_quantize */
    if (ld <= 256 * 2) swiglu_q_kernel<FP8, 2, 256><<<n, 256, 0, s>>>(out, gu, f, q, scales, ld);
    else if (ld <= 256 * 8) swiglu_q_kernel<FP8, 8, 256><<<n, 256, 0, s>>>(out, gu, f, q, scales, ld);
    else if (ld <= 1024 * 12) swiglu_q_kernel<FP8, 12, 1024><<<n, 1024, 0, s>>>(out, gu, f, q, scales, ld);
    else swiglu_q_kernel<FP8, 0, 1024><<<n, 1024, 0, s>>>(out, gu, f, q, scales, ld);
}

qrl_status qrl_cuda_swiglu_w8a8(uint16_t *out, const float *gu, int n, int f,
                                const qrl_cuda_w8a8_act *q, void *stream, qrl_error *err) {
    if (!q) {
        if (!out)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "swiglu w8a8: neither a BF16 output nor codes");
        return qrl_cuda_swiglu(out, gu, n, f, stream, err);
    }
    if (n <= 0 || f <= 0 || q->ld < f || q->ld % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swiglu w8a8: n=%d f=%d ld=%d (need n, f > 0, ld >= f, ld %% 16 == 0)",
                             n, f, q->ld);
    cudaStream_t s = (cudaStream_t)stream;
    if (q->fp8) launch_swiglu_q<true>(out, gu, n, f, (uint8_t *)q->q, q->scales, q->ld, s);
    else launch_swiglu_q<false>(out, gu, n, f, (uint8_t *)q->q, q->scales, q->ld, s);
    return qrl_cuda_launch_status_("swiglu w8a8", err);
}

/* Output j of a SwiGLU row in F32 (before the BF16 rounding) as qrl_nvfp4_quantize_row_'s
 * source; stores its BF16 rounding in outr (when given) on the first call. */
struct swiglu_src_f32 {
    const float *gur;
    uint16_t *outr;
    int f;
    __device__ __forceinline__ float operator()(int j, bool first) const {
        float v = silu_mul_f32(gur[j], gur[f + j]);
        if (first && outr) outr[j] = qrl_bf16_st_(v);
        return v;
    }
};

template <int JB, int QB>
static __global__ void __launch_bounds__(QB)
swiglu_nvfp4_kernel(uint16_t *out, const float *gu, int f, qrl_cuda_nvfp4_act q) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    swiglu_src_f32 src = {gu + r * 2 * f, out ? out + r * f : NULL, f};
    qrl_nvfp4_quantize_row_<JB>(src, f, QB, qrl_nvfp4_row_out_of_(q, r, f), sh);
}

qrl_status qrl_cuda_swiglu_nvfp4(uint16_t *out, const float *gu, int n, int f,
                                 const qrl_cuda_nvfp4_act *q, void *stream, qrl_error *err) {
    if (n <= 0 || f <= 0 || !q)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swiglu nvfp4: n=%d f=%d q=%p (need n, f > 0 and q)", n, f,
                             (const void *)q);
    if (q->trace_ctl && !q->trace_dst)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swiglu nvfp4: a TRACE sink without its row map");
    cudaStream_t s = (cudaStream_t)stream;
    /* nvfp4_quant.cu's (JB, threads) table */
    if (f <= 128 * 16) swiglu_nvfp4_kernel<1, 128><<<n, 128, 0, s>>>(out, gu, f, *q);
    else if (f <= 256 * 16 * 2) swiglu_nvfp4_kernel<2, 256><<<n, 256, 0, s>>>(out, gu, f, *q);
    else if (f <= 1024 * 16 * 2) swiglu_nvfp4_kernel<2, 1024><<<n, 1024, 0, s>>>(out, gu, f, *q);
    else swiglu_nvfp4_kernel<0, 1024><<<n, 1024, 0, s>>>(out, gu, f, *q);
    return qrl_cuda_launch_status_("swiglu nvfp4", err);
}

/* (value, index) with the CPU's order: larger value wins, equal values the lower index,
 * NaN never (a NaN candidate loses to anything). */
static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    if (isnan(v)) return false;
    if (isnan(bv) || bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

/* One block per row.  The row is read twice (argmax, then the sum of exponentials) with
 * GU independent loads in flight per thread (float4 when the row is 16-byte aligned): a
 * one-load-per-iteration loop waited a memory latency per element, ~140 us per step at
 * vocab 151936 whatever the batch.  The argmax is order-independent (better() is a total
 * order), the sum's order is fixed by the block shape. */
#define GU 4
static __global__ void greedy_kernel(const float *logits, int vocab, int32_t *tokens,
                                     float *logprob) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float sh[32];
    const float *row = logits + (size_t)blockIdx.x * vocab;
    bool vec = vocab % 4 == 0 && ((uintptr_t)row & 15) == 0;
    int nv = vec ? vocab / 4 : vocab, bd = blockDim.x;
    float bv = NAN;
    int bi = -1;
    for (int i0 = threadIdx.x; i0 < nv; i0 += GU * bd) {
        float4 x[GU];
#pragma unroll
        for (int u = 0; u < GU; u++) {
            int i = i0 + u * bd;
            float4 nan4 = make_float4(NAN, NAN, NAN, NAN);
            x[u] = i >= nv ? nan4 : vec ? ((const float4 *)row)[i] : make_float4(row[i], NAN, NAN, NAN);
        }
#pragma unroll
        for (int u = 0; u < GU; u++) {
            int i = (i0 + u * bd) * (vec ? 4 : 1);
            if (better(x[u].x, i, bv, bi)) bv = x[u].x, bi = i;
            if (better(x[u].y, i + 1, bv, bi)) bv = x[u].y, bi = i + 1;
            if (better(x[u].z, i + 2, bv, bi)) bv = x[u].z, bi = i + 2;
            if (better(x[u].w, i + 3, bv, bi)) bv = x[u].w, bi = i + 3;
        }
    }
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (w == 0) {
        bv = l < nw ? sv[l] : NAN;
        bi = l < nw ? si[l] : -1;
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (l == 0) sv[0] = bv, si[0] = bi;
    }
    __syncthreads();
    float mx = sv[0];
    int tok = si[0];
    float su[GU];
#pragma unroll
    for (int u = 0; u < GU; u++) su[u] = 0.0f;
    for (int i0 = threadIdx.x; i0 < nv; i0 += GU * bd) {
#pragma unroll
        for (int u = 0; u < GU; u++) {
            int i = i0 + u * bd;
            if (i >= nv) continue;
            if (vec) {
                float4 x = ((const float4 *)row)[i];
                su[u] += (expf(x.x - mx) + expf(x.y - mx)) + (expf(x.z - mx) + expf(x.w - mx));
            } else {
                su[u] += expf(row[i] - mx);
            }
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < GU; u++) s += su[u];
    s = qrl_block_sum_(s, sh);
    if (threadIdx.x == 0) {
        tokens[blockIdx.x] = tok;
        logprob[blockIdx.x] = tok >= 0 ? -logf(s) : NAN;
    }
}

qrl_status qrl_cuda_greedy(const float *logits, int n, int vocab, int32_t *tokens,
                           float *logprob, void *stream, qrl_error *err) {
    if (n <= 0 || vocab <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "greedy: n=%d vocab=%d", n, vocab);
    greedy_kernel<<<n, 1024, 0, (cudaStream_t)stream>>>(logits, vocab, tokens, logprob);
    return qrl_cuda_launch_status_("greedy", err);
}

static __device__ __forceinline__ uint64_t mix64(uint64_t z) { /* splitmix64 finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static __global__ void fill_random_kernel(uint16_t *p, size_t n, uint64_t seed, float mean,
                                          float std) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = (float)(mix64(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * (1.0f / 16777216.0f);
        p[i] = qrl_bf16_st_(mean + std * 1.7320508f * (2.0f * u - 1.0f));
    }
}

qrl_status qrl_cuda_fill_random_bf16(uint16_t *p, size_t n, uint64_t seed, float mean, float std,
                                     void *stream, qrl_error *err) {
    if (n == 0) return QRL_OK;
    size_t blocks = (n + 255) / 256;
    fill_random_kernel<<<blocks > 8192 ? 8192 : (unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(
        p, n, seed, mean, std);
    return qrl_cuda_launch_status_("fill_random", err);
}
