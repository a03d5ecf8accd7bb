/* W8A8: per-token INT8 / FP8 E4M3 activation quantization and the INT8 / FP8 GEMMs with
 * the F32 epilogue (gemm_w8a8.cuh). */
#include "cuda/gemm_w8a8.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "cuda/launch.cuh"
#include "cuda/w8a8_dev.cuh"

/* ---- activation quantization ------------------------------------------------------- */

template <typename T> static __device__ __forceinline__ float load_f(const T *x, size_t i);
template <> __device__ __forceinline__ float load_f<float>(const float *x, size_t i) { return x[i]; }
template <> __device__ __forceinline__ float load_f<uint16_t>(const uint16_t *x, size_t i) {
    return qrl_bf16_ld_(x[i]);
}

/* A row of x as quantize_row_'s source: the F32 value, or a BF16 value's exact F32. */
template <typename T> struct row_src {
    const T *xr;
    __device__ __forceinline__ float operator()(int i, bool) const { return load_f(xr, i); }
};

/* One block of QB threads per row (qrl_w8a8_quantize_row_): J values per thread in
 * registers, one pass over x (all loads in flight at once); J = 0: rows too long for
 * registers read x twice.  Long rows get 1024 threads: with one row (decode batch 1) a
 * block is alone on its SM. */
template <typename T, bool FP8, int J, int QB>
static __global__ void __launch_bounds__(QB)
quantize_rows_kernel(uint8_t *q, float *scales, const T *x, int K, int ld) {
    __shared__ float sh[32];
    row_src<T> src = {x + (size_t)blockIdx.x * K};
    qrl_w8a8_quantize_row_<FP8, J>(src, K, ld, QB, q + (size_t)blockIdx.x * ld,
                                   scales + blockIdx.x, sh);
}

template <typename T, bool FP8>
static void launch_quantize(uint8_t *q, float *scales, const T *x, int T_, int K, int ld,
                            cudaStream_t s) {
    if (ld <= 256 * 2) quantize_rows_kernel<T, FP8, 2, 256><<<T_, 256, 0, s>>>(q, scales, x, K, ld);
    else if (ld <= 256 * 8) quantize_rows_kernel<T, FP8, 8, 256><<<T_, 256, 0, s>>>(q, scales, x, K, ld);
    else if (ld <= 1024 * 12) quantize_rows_kernel<T, FP8, 12, 1024><<<T_, 1024, 0, s>>>(q, scales, x, K, ld);
    else quantize_rows_kernel<T, FP8, 0, 1024><<<T_, 1024, 0, s>>>(q, scales, x, K, ld);
}

template <bool FP8>
static qrl_status quantize_rows(uint8_t *q, float *scales, const void *x, int x_bf16, int T,
                                int K, int ld, void *stream, qrl_error *err) {
    const char *what = FP8 ? "fp8 quantize" : "int8 quantize";
    if (T <= 0 || K <= 0 || ld < K || ld % 16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: T=%d K=%d ld=%d (need T, K > 0, ld >= K, ld %% 16 == 0)", what,
                             T, K, ld);
    cudaStream_t s = (cudaStream_t)stream;
    if (x_bf16) launch_quantize<uint16_t, FP8>(q, scales, (const uint16_t *)x, T, K, ld, s);
    else launch_quantize<float, FP8>(q, scales, (const float *)x, T, K, ld, s);
    return qrl_cuda_launch_status_(what, err);
}

qrl_status qrl_cuda_int8_quantize_rows(int8_t *q, float *scales, const void *x, int x_bf16,
                                       int T, int K, int ld, void *stream, qrl_error *err) {
    return quantize_rows<false>((uint8_t *)q, scales, x, x_bf16, T, K, ld, stream, err);
}

qrl_status qrl_cuda_fp8_quantize_rows(uint8_t *q, float *scales, const void *x, int x_bf16,
                                      int T, int K, int ld, void *stream, qrl_error *err) {
    return quantize_rows<true>(q, scales, x, x_bf16, T, K, ld, stream, err);
}

/* ---- epilogue ------------------------------------------------------------------------ */

/* (float)acc * sx * sw left to right, then + bias: the CPU's operations, no contraction
 * (w8a8_dev.cuh: the deferred epilogue of norm.cu runs the same body). */
template <typename A>
static __device__ __forceinline__ float epilogue(A acc, float sx, float sw, const float *bias,
                                                 int n) {
    return qrl_w8a8_epilogue_(acc, sx, sw, bias, n);
}

/* ---- INT8 on __dp4a ------------------------------------------------------------------ */

/* T > GEMV_MAX_T.  Block tile BT tokens x BN outputs, K in steps of BK bytes through shared
 * memory; 256 threads, each 2 tokens x 4 outputs with __dp4a (exact INT32).  Shared rows
 * are padded to 20 words to spread banks while keeping 16-byte stores aligned. */
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
            if (n < N) y[(size_t)t * N + n] = epilogue(acc[i][j], sx[t], sw[n], bias, n);
        }
    }
}

/* T <= GEMV_MAX_T: one warp per output row streams the weight row once in 16-byte lanes
 * for up to GEMV_T tokens (their codes are small and stay in cache); the INT32 partial sums
 * are combined by shuffles (integer: exact in any order). */
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
        if (lane == t) y[(size_t)(t0 + t) * N + n] = epilogue(a, sx[t0 + t], sw[n], bias, n);
    }
}

/* ---- tensor cores: mma.sync m16n8k32 (INT8 -> INT32, E4M3 -> F32) ------------------- *
 *
 * Fragment layout with a permuted K.  The m16n8k32 operands hold, per lane (g = lane / 4,
 * c = lane % 4), A words a0/a2 of row g and a1/a3 of row g + 8, B words b0/b1 of column g;
 * a0, a1, b0 cover the k slots 4c..4c+3 and a2, a3, b1 the slots 16+4c..16+4c+3.  A dot
 * product does not care which physical k sits in which slot as long as A and B agree, so
 * each lane loads the 16 bytes [16c, 16c + 16) of a 64-byte K chunk of its rows (one
 * coalesced 16-byte load per row) and feeds words 0, 1 to one mma and words 2, 3 to a
 * second: both operands see the same permutation, every k of the chunk is summed once.
 * FP8 sums each chunk (two mmas, 64 products) from zero and adds it to the F32 accumulator,
 * so the tensor cores' own accumulation never runs over more than 64 products. */

template <bool FP8> struct mma_op;
template <> struct mma_op<false> {
    typedef int acc;
    static __device__ __forceinline__ void run(int (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};
template <> struct mma_op<true> {
    typedef float acc;
    static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};

/* One 64-byte K chunk of a 16x8 tile: lo, hi = the lane's 16 bytes of rows g and g + 8 of
 * A, b = of row g of B (see above). */
template <bool FP8>
static __device__ __forceinline__ void mma_chunk(typename mma_op<FP8>::acc (&acc)[4], int4 lo,
                                                 int4 hi, int4 b) {
    typedef mma_op<FP8> M;
    if constexpr (FP8) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        M::run(t, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        M::run(t, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] = __fadd_rn(acc[i], t[i]);
    } else {
        M::run(acc, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        M::run(acc, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
    }
}

/* Split-K partials travel through F32 storage; INT32 ones keep their bits. */
static __device__ __forceinline__ float acc_bits(int a) { return __int_as_float(a); }
static __device__ __forceinline__ float acc_bits(float a) { return a; }
template <typename A> static __device__ __forceinline__ A acc_from_bits(float f);
template <> __device__ __forceinline__ int acc_from_bits<int>(float f) { return __float_as_int(f); }
template <> __device__ __forceinline__ float acc_from_bits<float>(float f) { return f; }

/* Output (t, n) of accumulator register r of a lane in a 16x8 tile at (t0, n0). */
static __device__ __forceinline__ int frag_t(int t0, int lane, int r) { return t0 + (lane >> 2) + (r >= 2 ? 8 : 0); }
static __device__ __forceinline__ int frag_n(int n0, int lane, int r) { return n0 + (lane & 3) * 2 + (r & 1); }

/* -- skinny: decode batches ------------------------------------------------------------
 * A block owns 16 outputs (two n8 tiles) x 16*MT tokens; its W warps take interleaved
 * 64-byte K chunks (warp w: chunks w, w + W, ...: the block reads 64 W bytes of every
 * weight row per round), loading the weight rows of U = 4 chunks straight into registers
 * first (the HBM latency: 4 KiB in flight per warp), then the activation rows (small, from
 * L1/L2) one m16 tile at a time.  The warps' partial sums meet in shared memory, 8
 * registers at a time, and are added in warp order (INT32: exact; F32: a fixed order).
 * W = 8 for short rows (several blocks per SM), 16 for long ones (K >= SK_LONG_K: N = 1536
 * gives only 96 blocks, each needs more bytes in flight). */
#define SK_U 4
#define SK_RV 8
#define SK_LONG_K 6144

template <bool FP8, int MT, int W>
static __global__ void __launch_bounds__(W * 32)
mma_skinny_kernel(float *y, const uint8_t *xq, const float *sx, const uint8_t *wq,
                  const float *sw, const float *bias, int T, int N, int ld) {
    typedef typename mma_op<FP8>::acc acc_t;
    constexpr int SK_WARPS = W, NV = MT * 2 * 4; /* accumulators per lane */
    /* MT = 4 holds 32 accumulators (FP8 a chunk sum per tile too): fewer chunks ahead where
     * registers run out (W = 16 caps them at 128) */
    constexpr int U = MT < 4 ? SK_U : W > 8 ? (FP8 ? 1 : 2) : (FP8 ? 2 : SK_U);
    __shared__ acc_t red[SK_WARPS][SK_RV][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = (lane & 3) * 16;
    int n0 = blockIdx.x * 16, t0 = blockIdx.y * (16 * MT);
    int chunks = (ld + 63) >> 6;
    bool w0ok = n0 + g < N, w1ok = n0 + 8 + g < N;
    const uint8_t *w0 = wq + (size_t)(w0ok ? n0 + g : 0) * ld + c4;
    const uint8_t *w1 = wq + (size_t)(w1ok ? n0 + 8 + g : 0) * ld + c4;
    const uint8_t *xb = xq + (size_t)t0 * ld + c4;
    unsigned xok = 0; /* bit r: row t0 + 8r + g exists */
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) xok |= (unsigned)(t0 + 8 * r + g < T) << r;
    acc_t acc[MT][2][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0;
    const int4 z = make_int4(0, 0, 0, 0);
    for (int c0 = warp; c0 < chunks; c0 += SK_WARPS * U) {
        int4 wv[U][2];
        bool kok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * SK_WARPS;
            kok[u] = c < chunks && c * 64 + c4 < ld;
            size_t k = (size_t)c * 64;
            wv[u][0] = kok[u] && w0ok ? __ldg((const int4 *)(w0 + k)) : z;
            wv[u][1] = kok[u] && w1ok ? __ldg((const int4 *)(w1 + k)) : z;
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                size_t k = (size_t)(c0 + u * SK_WARPS) * 64;
                const uint8_t *xl = xb + (size_t)(16 * m + g) * ld + k;
                int4 lo = kok[u] && (xok >> (2 * m) & 1) ? __ldg((const int4 *)xl) : z;
                int4 hi = kok[u] && (xok >> (2 * m + 1) & 1) ? __ldg((const int4 *)(xl + 8 * (size_t)ld)) : z;
                mma_chunk<FP8>(acc[m][0], lo, hi, wv[u][0]);
                mma_chunk<FP8>(acc[m][1], lo, hi, wv[u][1]);
            }
    }
#pragma unroll
    for (int v0 = 0; v0 < NV; v0 += SK_RV) {
        if (v0) __syncthreads(); /* the previous round's sums are read */
#pragma unroll
        for (int i = 0; i < SK_RV; i++) {
            int v = v0 + i;
            red[warp][i][lane] = acc[v / 8][(v / 4) & 1][v & 3];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < SK_RV * 32; e += SK_WARPS * 32) {
            int i = e >> 5, l = e & 31, v = v0 + i, r = v & 3;
            acc_t s = red[0][i][l];
#pragma unroll
            for (int w = 1; w < SK_WARPS; w++) s += red[w][i][l];
            int t = frag_t(t0 + 16 * (v / 8), l, r), n = frag_n(n0 + 8 * ((v / 4) & 1), l, r);
            if (t < T && n < N) y[(size_t)t * N + n] = epilogue(s, sx[t], sw[n], bias, n);
        }
    }
}

/* -- tiled: prefill and large batches ---------------------------------------------------
 * Block tile 64 tokens x 128 outputs, 8 warps as 2 x 4 of 32 x 32, K in 64-byte chunks
 * through a 3-stage cp.async pipeline (rows of 64 bytes: a warp's 16-byte fragment loads
 * read 128 contiguous bytes per quarter-warp, free of bank conflicts; out-of-range rows and
 * K pieces are zero-filled).  gridDim.z > 1 splits the chunks: each split writes its raw
 * sums to work[z] and splitk_kernel adds them in split order and runs the epilogue. */
#define TL_BM 64
#define TL_BN 128
#define TL_STAGES 3

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool ok) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <bool FP8>
static __global__ void __launch_bounds__(256)
mma_tiled_kernel(float *y, float *work, const uint8_t *xq, const float *sx, const uint8_t *wq,
                 const float *sw, const float *bias, int T, int N, int ld, int cps) {
    typedef typename mma_op<FP8>::acc acc_t;
    __shared__ __align__(128) uint8_t sa[TL_STAGES][TL_BM * 64];
    __shared__ __align__(128) uint8_t sb[TL_STAGES][TL_BN * 64];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = (lane & 3) * 16;
    int wm = warp >> 2, wn = warp & 3;
    int t0 = blockIdx.y * TL_BM, n0 = blockIdx.x * TL_BN;
    int chunks = (ld + 63) >> 6, cb = blockIdx.z * cps;
    int nc = chunks - cb < cps ? chunks - cb : cps;
    /* loader: 16-byte piece p of row `row`; A 64 rows (1 piece per thread), B 128 rows (2) */
    auto load = [&](int stage, int c) {
        int k = c * 64;
        {
            int row = tid >> 2, p = (tid & 3) * 16, t = t0 + row;
            bool ok = t < T && k + p < ld;
            cp_async16(&sa[stage][row * 64 + p], xq + (ok ? (size_t)t * ld + k + p : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int idx = tid + 256 * i, row = idx >> 2, p = (idx & 3) * 16, n = n0 + row;
            bool ok = n < N && k + p < ld;
            cp_async16(&sb[stage][row * 64 + p], wq + (ok ? (size_t)n * ld + k + p : 0), ok);
        }
    };
    acc_t acc[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0;
#pragma unroll
    for (int s = 0; s < TL_STAGES - 1; s++) {
        if (s < nc) load(s, cb + s);
        cp_async_commit();
    }
    for (int i = 0; i < nc; i++) {
        cp_async_wait<TL_STAGES - 2>();
        __syncthreads(); /* chunk i landed; every warp is done with chunk i - 1's stage */
        int nx = i + TL_STAGES - 1;
        if (nx < nc) load(nx % TL_STAGES, cb + nx);
        cp_async_commit();
        const uint8_t *A = sa[i % TL_STAGES], *B = sb[i % TL_STAGES];
        int4 av[2][2], bv[4];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                av[m][h] = *(const int4 *)(A + (wm * 32 + m * 16 + h * 8 + g) * 64 + c4);
#pragma unroll
        for (int j = 0; j < 4; j++) bv[j] = *(const int4 *)(B + (wn * 32 + j * 8 + g) * 64 + c4);
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int j = 0; j < 4; j++) mma_chunk<FP8>(acc[m][j], av[m][0], av[m][1], bv[j]);
    }
    cp_async_wait<0>();
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int t = frag_t(t0 + wm * 32 + m * 16, lane, r), n = frag_n(n0 + wn * 32 + j * 8, lane, r);
                if (t >= T || n >= N) continue;
                if (gridDim.z == 1) y[(size_t)t * N + n] = epilogue(acc[m][j][r], sx[t], sw[n], bias, n);
                else work[((size_t)blockIdx.z * T + t) * N + n] = acc_bits(acc[m][j][r]);
            }
}

template <bool FP8>
static __global__ void splitk_kernel(float *y, const float *work, const float *sx,
                                     const float *sw, const float *bias, int T, int N, int S) {
    typedef typename mma_op<FP8>::acc acc_t;
    size_t TN = (size_t)T * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < TN;
         i += (size_t)gridDim.x * blockDim.x) {
        acc_t s = acc_from_bits<acc_t>(work[i]);
        for (int z = 1; z < S; z++) s += acc_from_bits<acc_t>(work[z * TN + i]);
        int t = (int)(i / N), n = (int)(i % N);
        y[i] = epilogue(s, sx[t], sw[n], bias, n);
    }
}

/* The epilogue over raw sums already in y (INT32 bits or F32), in place: thread (t, 4j)
 * owns y[t, 4j .. 4j + 3] (one 16-byte access where vec: N % 4 == 0 and y, sw 16-byte
 * aligned), rows over gridDim.y. */
#define EPI_THREADS 256
template <bool FP8>
static __global__ void __launch_bounds__(EPI_THREADS)
epilogue_kernel(float *y, const float *sx, const float *sw, const float *bias, int T, int N,
                bool vec) {
    typedef typename mma_op<FP8>::acc acc_t;
    int n = (blockIdx.x * EPI_THREADS + threadIdx.x) * 4;
    if (n >= N) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        float s = sx[t], *yr = y + (size_t)t * N;
        if (vec) {
            float4 v = *(float4 *)(yr + n), w = *(const float4 *)(sw + n);
            v.x = epilogue(acc_from_bits<acc_t>(v.x), s, w.x, bias, n);
            v.y = epilogue(acc_from_bits<acc_t>(v.y), s, w.y, bias, n + 1);
            v.z = epilogue(acc_from_bits<acc_t>(v.z), s, w.z, bias, n + 2);
            v.w = epilogue(acc_from_bits<acc_t>(v.w), s, w.w, bias, n + 3);
            *(float4 *)(yr + n) = v;
        } else {
            for (int i = n; i < n + 4 && i < N; i++)
                yr[i] = epilogue(acc_from_bits<acc_t>(yr[i]), s, sw[i], bias, i);
        }
    }
}

static void launch_epilogue(const qrl_cuda_w8a8_gemm_args *a, cudaStream_t s) {
    dim3 grid((unsigned)((a->N + 4 * EPI_THREADS - 1) / (4 * EPI_THREADS)),
              (unsigned)(a->T < 65535 ? a->T : 65535));
    bool vec = a->N % 4 == 0 && !(((uintptr_t)a->y | (uintptr_t)a->sw) & 15);
    if (a->fp8) epilogue_kernel<true><<<grid, EPI_THREADS, 0, s>>>(a->y, a->sx, a->sw, a->bias, a->T, a->N, vec);
    else epilogue_kernel<false><<<grid, EPI_THREADS, 0, s>>>(a->y, a->sx, a->sw, a->bias, a->T, a->N, vec);
}

/* ---- dispatch ------------------------------------------------------------------------ */

/* AUTO, from the kernel tables of bench/w8a8.c on an H200 (Qwen2.5-1.5B projections,
 * bench/results/w8a8-h200.json; Qwen3-4B's, bench/results/w8a8-gemm-qwen3-4b-h200.json):
 *  - MMA_SKINNY up to 64 rows for small weights (N * ld < SMALL_NK: a short weight stream
 *    makes cuBLAS's fixed costs dominate); for mid-size ones (< MID_NK: Qwen3-4B's qkv and
 *    o, Qwen2.5-1.5B's down) up to 16 rows (FP8) / 32 (INT8); for large ones up to 16 rows
 *    (INT8) and never (FP8: cuBLASLt's unit-scale GEMM streams gate+up and down at 1 row
 *    1.2-1.7x faster than the skinny FP8 kernel);
 *  - above: CUBLAS when a handle is given, else MMA_TILED.  FP8 takes the scales in
 *    cuBLASLt's epilogue (OUTER_VEC_32F) from FUSED_MIN_T rows for K < FUSED_MAX_LD (qkv
 *    and gate+up of Qwen3-4B: 1.0-1.3x the unit-scale GEMM + epilogue pass there), and the
 *    unit-scale GEMM + epilogue pass otherwise (the OUTER_VEC kernels took 27-28 µs for
 *    Qwen3-4B's down at any row count against 13-21 µs, 15 µs for o against 10-14).
 * DP4A is never faster than MMA_SKINNY by more than 0.3 µs (T = 1, small weights). */
#define MID_NK (16 << 20)
#define FUSED_MIN_T 64
#define FUSED_MAX_LD 4096
#define SMALL_NK (8 << 20)
/* MMA_TILED splits K until the grid has about two waves of 132 SMs, at most 8 ways and
 * with at least 8 chunks (512 bytes of K) per split. */
#define TILED_TARGET_BLOCKS 264
#define TILED_MAX_SPLIT 8

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static int tiled_splits(int T, int N, int ld) {
    int blocks = cdiv(N, TL_BN) * cdiv(T, TL_BM), chunks = cdiv(ld, 64);
    int s = cdiv(TILED_TARGET_BLOCKS, blocks);
    if (s > TILED_MAX_SPLIT) s = TILED_MAX_SPLIT;
    if (s > chunks / 8) s = chunks / 8;
    if (s < 1) s = 1;
    return cdiv(chunks, cdiv(chunks, s)); /* no empty split */
}

size_t qrl_cuda_w8a8_work_floats(int T, int N, int ld) {
    if (T <= 0 || N <= 0 || ld <= 0) return 0;
    int s = tiled_splits(T, N, ld);
    return s > 1 ? (size_t)s * T * N : 0;
}

const char *qrl_cuda_w8a8_kernel_name(qrl_cuda_w8a8_kernel k) {
    static const char *const names[] = {"auto",   "dp4a",   "mma-skinny", "mma-tiled",
                                        "cublas", "cublas-unfused"};
    return (unsigned)k < QRL_CUDA_W8A8_KERNEL_COUNT_ ? names[k] : "?";
}

template <bool FP8>
static void launch_skinny(const qrl_cuda_w8a8_gemm_args *a, cudaStream_t s) {
    const uint8_t *x = (const uint8_t *)a->xq, *w = (const uint8_t *)a->wq;
    int mt = a->T <= 16 ? 1 : a->T <= 32 ? 2 : 4;
    dim3 grid(cdiv(a->N, 16), cdiv(a->T, 16 * mt));
#define SK_ARGS a->y, x, a->sx, w, a->sw, a->bias, a->T, a->N, a->ld
    if (a->ld >= SK_LONG_K) {
        if (mt == 1) mma_skinny_kernel<FP8, 1, 16><<<grid, 512, 0, s>>>(SK_ARGS);
        else if (mt == 2) mma_skinny_kernel<FP8, 2, 16><<<grid, 512, 0, s>>>(SK_ARGS);
        else mma_skinny_kernel<FP8, 4, 16><<<grid, 512, 0, s>>>(SK_ARGS);
    } else {
        if (mt == 1) mma_skinny_kernel<FP8, 1, 8><<<grid, 256, 0, s>>>(SK_ARGS);
        else if (mt == 2) mma_skinny_kernel<FP8, 2, 8><<<grid, 256, 0, s>>>(SK_ARGS);
        else mma_skinny_kernel<FP8, 4, 8><<<grid, 256, 0, s>>>(SK_ARGS);
    }
#undef SK_ARGS
}

template <bool FP8>
static void launch_tiled(const qrl_cuda_w8a8_gemm_args *a, cudaStream_t s) {
    int S = tiled_splits(a->T, a->N, a->ld), chunks = cdiv(a->ld, 64);
    if (!a->work || (size_t)S * a->T * a->N > a->work_floats) S = 1;
    int cps = cdiv(chunks, S);
    dim3 grid(cdiv(a->N, TL_BN), cdiv(a->T, TL_BM), S);
    mma_tiled_kernel<FP8><<<grid, 256, 0, s>>>(a->y, a->work, (const uint8_t *)a->xq, a->sx,
                                               (const uint8_t *)a->wq, a->sw, a->bias, a->T,
                                               a->N, a->ld, cps);
    if (S > 1) {
        size_t tn = (size_t)a->T * a->N;
        unsigned blocks = (unsigned)(tn / 256 + 1 < 4096 ? tn / 256 + 1 : 4096);
        splitk_kernel<FP8><<<blocks, 256, 0, s>>>(a->y, a->work, a->sx, a->sw, a->bias, a->T,
                                                  a->N, S);
    }
}

/* The A/B switches of bench/decode, read at the first GEMM: QRL_W8A8_CUBLAS_UNFUSED=1 (the
 * CUBLAS path before issue 22), QRL_W8A8_SKINNY_MAX_T=N (AUTO's MMA_SKINNY limit for large
 * weights, INT8 and FP8 alike; 0 = cuBLAS from one row on). */
static bool cublas_unfused_env(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("QRL_W8A8_CUBLAS_UNFUSED");
        v = e && !strcmp(e, "1");
    }
    return v == 1;
}

static int skinny_max_t_env(void) {
    static int v = -2; /* -1: not set */
    if (v == -2) {
        const char *e = getenv("QRL_W8A8_SKINNY_MAX_T");
        v = e && *e ? atoi(e) : -1;
    }
    return v;
}

qrl_status qrl_cuda_w8a8_gemm(const qrl_cuda_w8a8_gemm_args *a, void *stream, qrl_error *err) {
    const char *what = a->fp8 ? "gemm_fp8" : "gemm_int8";
    if (a->defer) a->defer->on = false;
    int max_ld = a->fp8 ? (1 << 30) : QRL_INT8_GEMM_MAX_K / 16 * 16;
    if (a->T <= 0 || a->N <= 0 || a->ld <= 0 || a->ld % 16 || a->ld > max_ld)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: T=%d N=%d ld=%d (need > 0, ld %% 16 == 0, ld <= %d)", what,
                             a->T, a->N, a->ld, max_ld);
    if (((uintptr_t)a->xq | (uintptr_t)a->wq) & 15)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: codes must be 16-byte aligned", what);
    qrl_cuda_w8a8_kernel k = a->kernel;
    if ((unsigned)k >= QRL_CUDA_W8A8_KERNEL_COUNT_ || (k == QRL_CUDA_W8A8_DP4A && a->fp8) ||
        ((k == QRL_CUDA_W8A8_CUBLAS || k == QRL_CUDA_W8A8_CUBLAS_UNFUSED) && !a->blas))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: kernel %d (%s) not available",
                             what, (int)k, qrl_cuda_w8a8_kernel_name(k));
    bool scaled = a->fp8; /* FP8 CUBLAS: the scales in cuBLASLt's epilogue */
    if (k == QRL_CUDA_W8A8_AUTO) {
        double nk = (double)a->N * a->ld;
        int skinny_t = nk < SMALL_NK ? 64
                       : !a->blas    ? (a->fp8 ? 16 : 32) /* MMA_TILED next: as before */
                       : nk < MID_NK ? (a->fp8 ? 16 : 32)
                                     : (a->fp8 ? 0 : 16);
        if (nk >= SMALL_NK && skinny_max_t_env() >= 0) skinny_t = skinny_max_t_env();
        k = a->T <= skinny_t ? QRL_CUDA_W8A8_MMA_SKINNY
            : a->blas        ? QRL_CUDA_W8A8_CUBLAS
                             : QRL_CUDA_W8A8_MMA_TILED;
        scaled = a->fp8 && a->T >= FUSED_MIN_T && a->ld < FUSED_MAX_LD;
    }
    if (k == QRL_CUDA_W8A8_CUBLAS && cublas_unfused_env()) k = QRL_CUDA_W8A8_CUBLAS_UNFUSED;
    cudaStream_t s = (cudaStream_t)stream;
    if (k == QRL_CUDA_W8A8_CUBLAS || k == QRL_CUDA_W8A8_CUBLAS_UNFUSED) {
        const uint8_t *x = (const uint8_t *)a->xq, *w = (const uint8_t *)a->wq;
        bool fused = k == QRL_CUDA_W8A8_CUBLAS;
        qrl_status st = QRL_STATUS_UNSUPPORTED;
        if (a->fp8 && fused && scaled) { /* scales and bias in cuBLASLt's epilogue */
            st = qrl_cuda_gemm_e4m3_scaled(a->blas, a->y, x, a->sx, w, a->sw, a->bias, a->T,
                                           a->ld, a->N, stream, err);
            if (st == QRL_OK) {
                if (a->ran) *a->ran = k;
                return QRL_OK;
            }
            if (st != QRL_STATUS_UNSUPPORTED) return st;
            /* this mode or shape: the unit-scale GEMM and the epilogue pass */
        }
        if (a->fp8)
            st = qrl_cuda_gemm_e4m3(a->blas, a->y, x, w, a->T, a->ld, a->N, stream, err);
        else if (fused)
            st = qrl_cuda_gemm_s8_lt(a->blas, (int32_t *)a->y, (const int8_t *)x, (const int8_t *)w,
                                     a->T, a->ld, a->N, stream, err);
        if (!a->fp8 && (!fused || st == QRL_STATUS_UNSUPPORTED))
            st = qrl_cuda_gemm_s8(a->blas, (int32_t *)a->y, (const int8_t *)x, (const int8_t *)w,
                                  a->T, a->ld, a->N, stream, err);
        if (st == QRL_OK) { /* raw sums in y: the epilogue in place, or by y's reader */
            if (fused && a->defer) {
                qrl_cuda_w8a8_epi *e = a->defer;
                e->sx = a->sx, e->sw = a->sw, e->bias = a->bias, e->N = a->N, e->fp8 = a->fp8;
                e->on = true;
            } else if (fused) {
                launch_epilogue(a, s);
            } else {
                size_t tn = (size_t)a->T * a->N;
                unsigned blocks = (unsigned)(tn / 256 + 1 < 4096 ? tn / 256 + 1 : 4096);
                if (a->fp8)
                    splitk_kernel<true><<<blocks, 256, 0, s>>>(a->y, a->y, a->sx, a->sw, a->bias, a->T, a->N, 1);
                else
                    splitk_kernel<false><<<blocks, 256, 0, s>>>(a->y, a->y, a->sx, a->sw, a->bias, a->T, a->N, 1);
            }
        } else if (st == QRL_STATUS_UNSUPPORTED) {
            k = QRL_CUDA_W8A8_MMA_TILED; /* a shape cuBLAS has no kernel for */
        } else {
            return st;
        }
    }
    if (a->ran) *a->ran = k;
    if (k == QRL_CUDA_W8A8_DP4A) {
        const int8_t *x = (const int8_t *)a->xq, *w = (const int8_t *)a->wq;
        if (a->T <= GEMV_MAX_T) {
            dim3 grid(cdiv(a->N, GEMV_WARPS), cdiv(a->T, GEMV_T));
            gemv_int8_kernel<<<grid, GEMV_WARPS * 32, 0, s>>>(a->y, x, a->sx, w, a->sw, a->bias,
                                                              a->T, a->N, a->ld);
        } else {
            dim3 grid(cdiv(a->N, BN), cdiv(a->T, BT));
            gemm_int8_kernel<<<grid, 256, 0, s>>>(a->y, x, a->sx, w, a->sw, a->bias, a->T, a->N,
                                                  a->ld);
        }
    } else if (k == QRL_CUDA_W8A8_MMA_SKINNY) {
        if (a->fp8) launch_skinny<true>(a, s);
        else launch_skinny<false>(a, s);
    } else if (k == QRL_CUDA_W8A8_MMA_TILED) {
        if (a->fp8) launch_tiled<true>(a, s);
        else launch_tiled<false>(a, s);
    }
    return qrl_cuda_launch_status_(what, err);
}

qrl_status qrl_cuda_gemm_int8(float *y, const int8_t *xq, const float *sx, const int8_t *wq,
                              const float *sw, const float *bias, int T, int N, int ld,
                              void *stream, qrl_error *err) {
    qrl_cuda_w8a8_gemm_args a = {.y = y, .xq = xq, .sx = sx, .wq = wq, .sw = sw, .bias = bias,
                                 .T = T, .N = N, .ld = ld, .fp8 = false};
    return qrl_cuda_w8a8_gemm(&a, stream, err);
}

qrl_status qrl_cuda_gemm_fp8(float *y, const uint8_t *xq, const float *sx, const uint8_t *wq,
                             const float *sw, const float *bias, int T, int N, int ld,
                             void *stream, qrl_error *err) {
    qrl_cuda_w8a8_gemm_args a = {.y = y, .xq = xq, .sx = sx, .wq = wq, .sw = sw, .bias = bias,
                                 .T = T, .N = N, .ld = ld, .fp8 = true};
    return qrl_cuda_w8a8_gemm(&a, stream, err);
}

/* ---- benchmarks -------------------------------------------------------------------- */

template <bool FP8>
static __global__ void fill_kernel(uint8_t *q, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull; /* splitmix64 */
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        if (FP8) {
            float u = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
            q[i] = (uint8_t)__nv_cvt_float_to_fp8(u * QRL_E4M3_MAX, __NV_SATFINITE, __NV_E4M3);
        } else {
            q[i] = (uint8_t)(int8_t)((int)(z % 255) - 127);
        }
    }
}

template <bool FP8>
static qrl_status fill(uint8_t *q, size_t n, uint64_t seed, void *stream, qrl_error *err) {
    if (n == 0) return QRL_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    fill_kernel<FP8><<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(q, n, seed);
    return qrl_cuda_launch_status_(FP8 ? "fill fp8" : "fill int8", err);
}

qrl_status qrl_cuda_fill_random_int8(int8_t *q, size_t n, uint64_t seed, void *stream,
                                     qrl_error *err) {
    return fill<false>((uint8_t *)q, n, seed, stream, err);
}

qrl_status qrl_cuda_fill_random_fp8(uint8_t *q, size_t n, uint64_t seed, void *stream,
                                    qrl_error *err) {
    return fill<true>(q, n, seed, stream, err);
}
