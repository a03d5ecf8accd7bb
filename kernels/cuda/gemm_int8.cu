/* W8A8 INT8: per-token activation quantization and INT8 x INT8 -> INT32 GEMM with the F32
 * epilogue (gemm_int8.cuh). */
#include "cuda/gemm_int8.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cpu/quant.h"
#include "cuda/launch.cuh"

/* ---- activation quantization ------------------------------------------------------- */

template <typename T> static __device__ __forceinline__ float load_f(const T *x, size_t i);
template <> __device__ __forceinline__ float load_f<float>(const float *x, size_t i) { return x[i]; }
template <> __device__ __forceinline__ float load_f<uint16_t>(const uint16_t *x, size_t i) {
    return qrl_bf16_ld_(x[i]);
}

/* One block per row.  The maximum is order-independent, so the block reduction equals the
 * CPU's sequential qrl_quant_absmax exactly. */
template <typename T>
static __global__ void quantize_rows_kernel(int8_t *q, float *scales, const T *x, int K, int ld) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    float m = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float a = fabsf(load_f(x, r * K + i));
        if (isfinite(a) && a > m) m = a;
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = m;
    __syncthreads();
    m = l < nw ? sh[l] : 0.0f;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float scale = __fdiv_rn(m, 127.0f);
    if (threadIdx.x == 0) scales[r] = scale;
    for (int i = threadIdx.x; i < ld; i += blockDim.x) {
        int8_t c = 0;
        if (i < K) {
            float v = load_f(x, r * K + i);
            if (!isnan(v) && scale != 0.0f) {
                float qf = rintf(__fdiv_rn(v, scale)); /* RNE, as qrl_quant_round_half_even */
                c = (int8_t)fminf(fmaxf(qf, -127.0f), 127.0f);
            }
        }
        q[r * ld + i] = c;
    }
}

qrl_status qrl_cuda_int8_quantize_rows(int8_t *q, float *scales, const void *x, int x_bf16,
                                       int T, int K, int ld, void *stream, qrl_error *err) {
    if (T <= 0 || K <= 0 || ld < K || ld % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "int8 quantize: T=%d K=%d ld=%d (need T, K > 0, ld >= K, ld %% 16 == 0)",
                             T, K, ld);
    int threads = ld >= 256 ? 256 : ((ld + 31) / 32) * 32;
    cudaStream_t s = (cudaStream_t)stream;
    if (x_bf16)
        quantize_rows_kernel<<<T, threads, 0, s>>>(q, scales, (const uint16_t *)x, K, ld);
    else
        quantize_rows_kernel<<<T, threads, 0, s>>>(q, scales, (const float *)x, K, ld);
    return qrl_cuda_launch_status_("int8 quantize", err);
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/* Prefill shapes (T > GEMV_MAX_T).  Block tile BT tokens x BN outputs, K in steps of BK bytes through shared memory; 256
 * threads, each 2 tokens x 4 outputs with __dp4a (exact INT32).  Shared rows are padded
 * to 20 words to spread banks while keeping 16-byte stores aligned. */
#define BT 32
#define BN 64
#define BK 64
#define SW (BK / 4 + 4)

static __global__ void __launch_bounds__(256)
gemm_int8_kernel(float *y, const int8_t *xq, const float *sx, const int8_t *wq,
                 const float *sw, const float *bias, int T, int N, int ld) {
    __shared__ __align__(16) int xs[BT][SW];
    __shared__ __align__(16) int ws[BN][SW];
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int t0 = blockIdx.y * BT, n0 = blockIdx.x * BN;
    int acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    int lr = tid >> 2, lc = (tid & 3) * 16; /* loader: row, byte column */
    for (int k0 = 0; k0 < ld; k0 += BK) {
        int4 z = make_int4(0, 0, 0, 0);
        if (tid < BT * 4) {
            int4 v = z;
            if (t0 + lr < T && k0 + lc < ld)
                v = *(const int4 *)(xq + (size_t)(t0 + lr) * ld + k0 + lc);
            *(int4 *)&xs[lr][lc / 4] = v;
        }
        {
            int4 v = z;
            if (n0 + lr < N && k0 + lc < ld)
                v = *(const int4 *)(wq + (size_t)(n0 + lr) * ld + k0 + lc);
            *(int4 *)&ws[lr][lc / 4] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kw = 0; kw < BK / 4; kw++) {
            int a0 = xs[ty][kw], a1 = xs[ty + 16][kw];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int b = ws[tx + 16 * j][kw];
                acc[0][j] = __dp4a(a0, b, acc[0][j]);
                acc[1][j] = __dp4a(a1, b, acc[1][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int t = t0 + ty + 16 * i;
        if (t >= T) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int n = n0 + tx + 16 * j;
            if (n >= N) continue;
            /* (float)acc * sx[t] * sw[n] left to right, then + bias: no contraction */
            float v = __fmul_rn(__fmul_rn(__int2float_rn(acc[i][j]), sx[t]), sw[n]);
            if (bias) v = __fadd_rn(v, bias[n]);
            y[(size_t)t * N + n] = v;
        }
    }
}

/* Decode shapes (T <= GEMV_MAX_T): one warp per output row streams the weight row once in
 * 16-byte lanes for up to GEMV_T tokens (their codes are small and stay in cache); the
 * INT32 partial sums are combined by shuffles (integer: exact in any order). */
#define GEMV_T 16
#define GEMV_WARPS 8
#define GEMV_MAX_T 64

static __device__ __forceinline__ int dot16(int4 a, int4 b, int acc) {
    acc = __dp4a(a.x, b.x, acc);
    acc = __dp4a(a.y, b.y, acc);
    acc = __dp4a(a.z, b.z, acc);
    return __dp4a(a.w, b.w, acc);
}

static __global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_int8_kernel(float *y, const int8_t *xq, const float *sx, const int8_t *wq, const float *sw,
                 const float *bias, int T, int N, int ld) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * GEMV_WARPS + warp, t0 = blockIdx.y * GEMV_T;
    if (n >= N) return; /* whole warp */
    int nt = T - t0 < GEMV_T ? T - t0 : GEMV_T;
    int acc[GEMV_T];
#pragma unroll
    for (int t = 0; t < GEMV_T; t++) acc[t] = 0;
    const int8_t *wr = wq + (size_t)n * ld, *xr = xq + (size_t)t0 * ld;
    for (int k = lane * 16; k < ld; k += 32 * 16) {
        int4 w = __ldg((const int4 *)(wr + k));
#pragma unroll
        for (int t = 0; t < GEMV_T; t++)
            if (t < nt) acc[t] = dot16(w, __ldg((const int4 *)(xr + (size_t)t * ld + k)), acc[t]);
    }
#pragma unroll
    for (int t = 0; t < GEMV_T; t++) {
        if (t >= nt) break;
        int a = acc[t];
        for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == t) {
            int tt = t0 + t;
            float v = __fmul_rn(__fmul_rn(__int2float_rn(a), sx[tt]), sw[n]);
            if (bias) v = __fadd_rn(v, bias[n]);
            y[(size_t)tt * N + n] = v;
        }
    }
}

qrl_status qrl_cuda_gemm_int8(float *y, const int8_t *xq, const float *sx, const int8_t *wq,
                              const float *sw, const float *bias, int T, int N, int ld,
                              void *stream, qrl_error *err) {
    if (T <= 0 || N <= 0 || ld <= 0 || ld % 16 || ld > QRL_INT8_GEMM_MAX_K / 16 * 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "gemm_int8: T=%d N=%d ld=%d (need > 0, ld %% 16 == 0, ld <= %d)", T,
                             N, ld, QRL_INT8_GEMM_MAX_K);
    if (((uintptr_t)xq | (uintptr_t)wq) & 15)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "gemm_int8: codes must be 16-byte aligned");
    if (T <= GEMV_MAX_T) {
        dim3 grid((N + GEMV_WARPS - 1) / GEMV_WARPS, (T + GEMV_T - 1) / GEMV_T);
        gemv_int8_kernel<<<grid, GEMV_WARPS * 32, 0, (cudaStream_t)stream>>>(y, xq, sx, wq, sw,
                                                                            bias, T, N, ld);
        return qrl_cuda_launch_status_("gemm_int8 (gemv)", err);
    }
    dim3 grid((N + BN - 1) / BN, (T + BT - 1) / BT);
    gemm_int8_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(y, xq, sx, wq, sw, bias, T, N, ld);
    return qrl_cuda_launch_status_("gemm_int8", err);
}

/* ---- benchmarks -------------------------------------------------------------------- */

static __global__ void fill_int8_kernel(int8_t *q, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull; /* splitmix64 */
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        q[i] = (int8_t)((int)(z % 255) - 127);
    }
}

qrl_status qrl_cuda_fill_random_int8(int8_t *q, size_t n, uint64_t seed, void *stream,
                                     qrl_error *err) {
    if (n == 0) return QRL_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    fill_int8_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(q, n, seed);
    return qrl_cuda_launch_status_("fill int8", err);
}
