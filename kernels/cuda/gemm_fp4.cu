/* W4A16 NVFP4 / MXFP4 GEMMs: codes decoded in registers into mma.sync BF16 (gemm_fp4.cuh). */
#include "cuda/gemm_fp4.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

#define SK_WARPS 8   /* warps per skinny block, each on its own 64-element K chunks */
#define CHUNK 64     /* K elements per warp step: 4 mma k16 steps, 8 code bytes per thread */

/* Twice the E2M1 magnitude, 4 bits per code 0..7: {0, 1, 2, 3, 4, 6, 8, 12}. */
#define E2M1_X2 0xC8643210u

/* E2M1 code (4 bits) times 2, signed: exact small integer values in F32. */
static __device__ __forceinline__ float e2m1_x2(uint32_t c) {
    float m = (float)((E2M1_X2 >> ((c & 7u) << 2)) & 15u);
    return (c & 8u) ? -m : m;
}

/* Block scale decode, halved (the codes are decoded as twice their value): E4M3 through
 * the exact FP8 -> half conversion, E8M0 as the power of two (0xFF NaN, 0 = 2^-127). */
template <bool MX> static __device__ __forceinline__ float half_scale(uint8_t s) {
    if (MX) {
        if (s == 0xFF) return __uint_as_float(0x7fc00000u);
        float v = s ? __uint_as_float((uint32_t)s << 23) : __uint_as_float(0x00400000u);
        return 0.5f * v;
    }
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)s, __NV_E4M3);
    return 0.5f * __half2float(__half(h));
}

/* Two codes of byte b (low nibble first) times hs, as a BF16 pair (exact: <= 5 bits). */
static __device__ __forceinline__ uint32_t dq2(uint32_t b, float hs) {
    __nv_bfloat162 v = __floats2bfloat162_rn(e2m1_x2(b) * hs, e2m1_x2(b >> 4) * hs);
    return *(uint32_t *)&v;
}

/* The FAST decoder (3 integer ops and one or two BF16x2 multiplies per pair of codes):
 * codes n_j and n_{j+4} of the 8 in word q become the BF16 pair whose sign is the code's
 * and whose exponent low bits and mantissa top bit are the code's 3 magnitude bits:
 * e2m1 * 2^-126 exactly (0.5 lands on a BF16 subnormal, which the BF16 multiply keeps).
 * The per-block multiplier s2 then scales it back: NVFP4 s2 = E4M3 scale * 2^119 (fits
 * BF16 up to 448 * 2^119), giving e2m1 * scale * 2^-7 (the epilogue multiplies by 2^7);
 * MXFP4 first * 2^126, then s2 = the E8M0 power of two.  Every product is exact. */
template <bool MX>
static __device__ __forceinline__ uint32_t fp4_pair(uint32_t q, int j, uint32_t s2) {
    uint32_t t = q << (4 * (3 - j)); /* n_j to bits 12..15, n_{j+4} to 28..31 */
    uint32_t raw = (t & 0x80008000u) | ((t >> 6) & 0x01C001C0u);
    __nv_bfloat162 r = *(__nv_bfloat162 *)&raw;
    if (MX) {
        uint32_t c = 0x7E807E80u; /* 2^126, twice */
        r = __hmul2(r, *(__nv_bfloat162 *)&c);
    }
    r = __hmul2(r, *(__nv_bfloat162 *)&s2);
    return *(uint32_t *)&r;
}

/* Per-block multiplier word: FAST as fp4_pair's s2 (BF16 twice), else half_scale's F32. */
template <bool MX, bool FAST> static __device__ __forceinline__ uint32_t scale_word(uint8_t s) {
    if (!FAST) return __float_as_uint(half_scale<MX>(s));
    uint32_t b;
    if (MX) {
        b = s == 0xFF ? 0x7FC0u : s == 0 ? 0x0040u : (uint32_t)s << 7;
    } else { /* 2 * half scale = the E4M3 value; * 2^119 exact (power of two) */
        float v = 2.0f * half_scale<false>(s) * __uint_as_float((119u + 127u) << 23);
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        b = *(uint16_t *)&h;
    }
    return b | b << 16;
}

typedef struct fp4_params {
    float *y;
    const uint16_t *x;
    const uint8_t *codes, *scales;
    const float *rs, *bias;
    int T, N, K, cb, nb;
} fp4_params;

/* Thread (g = lane / 4, c = lane % 4) of a warp owns, in each 64-element chunk, the 16
 * elements [16c, 16c + 16) of weight rows g and g + 8 of each 16-row tile (8 code bytes,
 * one NVFP4 block, half an MXFP4 block) and of tokens g + 8f.  The mma's k order is
 * permuted (a dot product does not care): in k16 step j the fragment's logical columns
 * {2c, 2c+1, 2c+8, 2c+9} are the chunk's elements 16c + 4j + {0, 1, 2, 3}, the same for
 * A (weights) and B (activations). */
template <int NF, int MT, int U, bool VEC, bool MX, bool FAST>
static __global__ void __launch_bounds__(SK_WARPS * 32)
fp4_skinny_kernel(fp4_params p) {
    /* cross-warp reduction: warps 4..7, then 2..3, then 1 hand their sums down */
    __shared__ float red[4][MT * NF * 4][32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int row0 = blockIdx.x * 16 * MT, tok0 = blockIdx.y * 8 * NF;
    int nch = (p.K + CHUNK - 1) / CHUNK;
    float acc[MT][NF][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][f][i] = 0.0f;
    const uint16_t *xr[NF];
    bool tok_ok[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) {
        int t = tok0 + 8 * f + g;
        tok_ok[f] = t < p.T;
        xr[f] = p.x + (size_t)(tok_ok[f] ? t : 0) * p.K;
    }
    for (int ch0 = warp; ch0 < nch; ch0 += SK_WARPS * U) {
        uint2 wv[U][MT][2];
        uint32_t hs[U][MT][2]; /* scale_word */
        /* all of this step's code bytes in flight before any math */
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ch = ch0 + SK_WARPS * u;
            int kb = ch * (CHUNK / 2) + 8 * c; /* first code byte of the thread's 16 */
            int sb = MX ? ch * 2 + (c >> 1) : ch * 4 + c;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int r = row0 + 16 * m + 8 * h + g;
                    wv[u][m][h] = make_uint2(0, 0);
                    hs[u][m][h] = 0u; /* +0 in either form */
                    if (r >= p.N || ch >= nch) continue;
                    const uint8_t *cr = p.codes + (size_t)r * p.cb;
                    if (VEC) {
                        wv[u][m][h] = __ldg((const uint2 *)(cr + kb));
                    } else {
                        uint32_t lo = 0, hi = 0;
                        for (int b = 0; b < 8; b++) {
                            uint32_t v = kb + b < p.cb ? cr[kb + b] : 0u;
                            if (b < 4) lo |= v << (8 * b);
                            else hi |= v << (8 * (b - 4));
                        }
                        wv[u][m][h] = make_uint2(lo, hi);
                    }
                    if (sb < p.nb)
                        hs[u][m][h] = scale_word<MX, FAST>(__ldg(p.scales + (size_t)r * p.nb + sb));
                }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ch = ch0 + SK_WARPS * u;
            if (ch >= nch) break;
            int k0 = ch * CHUNK + 16 * c;
            if constexpr (FAST) {
                /* the thread's 16 activations of each token as 8 BF16 pairs; step j uses
                 * elements (j, j+4) and (8+j, 12+j), as fp4_pair */
                uint32_t X[NF][8];
#pragma unroll
                for (int f = 0; f < NF; f++) {
#pragma unroll
                    for (int i = 0; i < 8; i++) X[f][i] = 0u;
                    if (!tok_ok[f]) continue;
                    if (VEC) {
                        uint4 v0 = __ldg((const uint4 *)(xr[f] + k0)),
                              v1 = __ldg((const uint4 *)(xr[f] + k0 + 8));
                        X[f][0] = v0.x, X[f][1] = v0.y, X[f][2] = v0.z, X[f][3] = v0.w;
                        X[f][4] = v1.x, X[f][5] = v1.y, X[f][6] = v1.z, X[f][7] = v1.w;
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; i++) {
                            uint32_t e0 = k0 + 2 * i < p.K ? xr[f][k0 + 2 * i] : 0u,
                                     e1 = k0 + 2 * i + 1 < p.K ? xr[f][k0 + 2 * i + 1] : 0u;
                            X[f][i] = e0 | e1 << 16;
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t sel = j & 1 ? 0x7632u : 0x5410u;
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        uint32_t a[4] = {fp4_pair<MX>(wv[u][m][0].x, j, hs[u][m][0]),
                                         fp4_pair<MX>(wv[u][m][1].x, j, hs[u][m][1]),
                                         fp4_pair<MX>(wv[u][m][0].y, j, hs[u][m][0]),
                                         fp4_pair<MX>(wv[u][m][1].y, j, hs[u][m][1])};
#pragma unroll
                        for (int f = 0; f < NF; f++)
                            qrl_mma_bf16(acc[m][f], a,
                                         __byte_perm(X[f][j >> 1], X[f][(j >> 1) + 2], sel),
                                         __byte_perm(X[f][4 + (j >> 1)], X[f][6 + (j >> 1)], sel));
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t b[NF][2];
#pragma unroll
                    for (int f = 0; f < NF; f++) {
                        b[f][0] = b[f][1] = 0u;
                        if (!tok_ok[f]) continue;
                        int k = k0 + 4 * j;
                        if (VEC) {
                            uint2 v = __ldg((const uint2 *)(xr[f] + k));
                            b[f][0] = v.x, b[f][1] = v.y;
                        } else {
                            uint32_t e[4];
                            for (int q = 0; q < 4; q++) e[q] = k + q < p.K ? xr[f][k + q] : 0u;
                            b[f][0] = e[0] | e[1] << 16, b[f][1] = e[2] | e[3] << 16;
                        }
                    }
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        /* bytes 2j, 2j+1 of the thread's 8: elements 4j..4j+3 */
                        uint32_t w0 = j < 2 ? wv[u][m][0].x : wv[u][m][0].y,
                                 w1 = j < 2 ? wv[u][m][1].x : wv[u][m][1].y;
                        int sh = (j & 1) * 16;
                        float h0 = __uint_as_float(hs[u][m][0]), h1 = __uint_as_float(hs[u][m][1]);
                        uint32_t a[4] = {dq2(w0 >> sh, h0), dq2(w1 >> sh, h1), dq2(w0 >> (sh + 8), h0),
                                         dq2(w1 >> (sh + 8), h1)};
#pragma unroll
                        for (int f = 0; f < NF; f++) qrl_mma_bf16(acc[m][f], a, b[f][0], b[f][1]);
                    }
                }
            }
        }
    }
    /* deterministic tree over the warps' partial sums */
#pragma unroll
    for (int half = SK_WARPS / 2; half >= 1; half >>= 1) {
        if (warp >= half && warp < 2 * half) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int i = 0; i < 4; i++) red[warp - half][(m * NF + f) * 4 + i][lane] = acc[m][f][i];
        }
        __syncthreads();
        if (warp < half) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int f = 0; f < NF; f++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[m][f][i] += red[warp][(m * NF + f) * 4 + i][lane];
        }
        __syncthreads();
    }
    if (warp != 0) return;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = row0 + 16 * m + g + 8 * (i >> 1), t = tok0 + 8 * f + 2 * c + (i & 1);
                if (r >= p.N || t >= p.T) continue;
                float v = acc[m][f][i];
                if (FAST && !MX) v = __fmul_rn(v, 128.0f); /* fp4_pair's 2^-7 */
                if (p.rs) v = __fmul_rn(v, p.rs[r]);
                if (p.bias) v = __fadd_rn(v, p.bias[r]);
                p.y[(size_t)t * p.N + r] = v;
            }
}

/* w [N, K] BF16 = decoded codes times block scales: one thread per code byte. */
template <bool MX>
static __global__ void fp4_dequant_kernel(uint16_t *w, const uint8_t *codes, const uint8_t *scales,
                                          int N, int K, int cb, int nb) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * cb) return;
    int r = (int)(i / cb), kb = (int)(i % cb), k = 2 * kb;
    float hs = half_scale<MX>(scales[(size_t)r * nb + k / (MX ? 32 : 16)]);
    uint32_t v = dq2(codes[i], hs);
    uint16_t *wr = w + (size_t)r * K;
    wr[k] = (uint16_t)v;
    if (k + 1 < K) wr[k + 1] = (uint16_t)(v >> 16);
}

/* y[t, n] = y[t, n] * rs[n] (+ bias[n]), as the skinny kernel's epilogue. */
static __global__ void fp4_epilogue_kernel(float *y, const float *rs, const float *bias, int T, int N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * N) return;
    int n = (int)(i % N);
    float v = y[i];
    if (rs) v = __fmul_rn(v, rs[n]);
    if (bias) v = __fadd_rn(v, bias[n]);
    y[i] = v;
}

extern "C" const char *qrl_cuda_fp4_kernel_name(qrl_cuda_fp4_kernel k) {
    static const char *names[] = {"auto", "skinny", "dequant", "skinny-f32", "auto-f32"};
    return (unsigned)k < QRL_CUDA_FP4_KERNEL_COUNT_ ? names[k] : "?";
}

template <int NF, int MT, int U, bool VEC, bool FAST>
static void launch_skinny(const fp4_params &p, bool mx, cudaStream_t s) {
    dim3 grid((p.N + 16 * MT - 1) / (16 * MT), (p.T + 8 * NF - 1) / (8 * NF));
    if (mx) fp4_skinny_kernel<NF, MT, U, VEC, true, FAST><<<grid, SK_WARPS * 32, 0, s>>>(p);
    else fp4_skinny_kernel<NF, MT, U, VEC, false, FAST><<<grid, SK_WARPS * 32, 0, s>>>(p);
}

/* Token tile by T: 8 tokens (one n8 fragment) up to T = 8, then 16, 32, 64 (and 64-token
 * tiles above); two 16-row tiles per block once the activations are reused enough. */
template <bool VEC, bool FAST> static void run_skinny(const fp4_params &p, bool mx, cudaStream_t s) {
    if (p.T <= 8) launch_skinny<1, 1, 4, VEC, FAST>(p, mx, s);
    else if (p.T <= 16) launch_skinny<2, 1, 4, VEC, FAST>(p, mx, s);
    else if (p.T <= 32) launch_skinny<4, 2, 2, VEC, FAST>(p, mx, s);
    else launch_skinny<8, 2, 2, VEC, FAST>(p, mx, s);
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" qrl_status qrl_cuda_fp4_dequantize(uint16_t *w, const uint8_t *codes,
                                              const uint8_t *scales, int N, int K, bool mx,
                                              void *stream, qrl_error *err) {
    if (N <= 0 || K <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "fp4 dequantize: N=%d K=%d", N, K);
    int cb = qrl_cuda_fp4_code_bytes(K), nb = qrl_cuda_fp4_scale_bytes(K, mx);
    size_t n = (size_t)N * cb;
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (mx) fp4_dequant_kernel<true><<<blocks, 256, 0, (cudaStream_t)stream>>>(w, codes, scales, N, K, cb, nb);
    else fp4_dequant_kernel<false><<<blocks, 256, 0, (cudaStream_t)stream>>>(w, codes, scales, N, K, cb, nb);
    return qrl_cuda_launch_status_("fp4 dequantize", err);
}

extern "C" qrl_status qrl_cuda_fp4_gemm(const qrl_cuda_fp4_gemm_args *a, void *stream,
                                        qrl_error *err) {
    if (a->T <= 0 || a->N <= 0 || a->K <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "fp4 gemm: T=%d N=%d K=%d", a->T,
                             a->N, a->K);
    qrl_cuda_fp4_kernel k = a->kernel;
    bool have_work = a->work && a->blas && a->work_elems >= (size_t)a->N * a->K;
    if (k == QRL_CUDA_FP4_AUTO) k = a->T > 64 && have_work ? QRL_CUDA_FP4_DEQUANT : QRL_CUDA_FP4_SKINNY;
    if (k == QRL_CUDA_FP4_AUTO_F32) k = QRL_CUDA_FP4_SKINNY_F32;
    if (k == QRL_CUDA_FP4_DEQUANT && !have_work)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "fp4 gemm: dequant kernel needs a cuBLAS handle and %zu workspace "
                             "elements (have %zu)", (size_t)a->N * a->K, a->work ? a->work_elems : 0);
    if (k != QRL_CUDA_FP4_SKINNY && k != QRL_CUDA_FP4_SKINNY_F32 && k != QRL_CUDA_FP4_DEQUANT)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "fp4 gemm: bad kernel %d", (int)k);
    if (a->ran) *a->ran = k;
    cudaStream_t s = (cudaStream_t)stream;
    fp4_params p = {a->y, a->x, a->codes, a->scales, a->row_scale, a->bias, a->T, a->N, a->K,
                    qrl_cuda_fp4_code_bytes(a->K), qrl_cuda_fp4_scale_bytes(a->K, a->mx)};
    if (k != QRL_CUDA_FP4_DEQUANT) {
        bool vec = a->K % CHUNK == 0 && al16(a->x) && al16(a->codes), fast = k == QRL_CUDA_FP4_SKINNY;
        if (vec && fast) run_skinny<true, true>(p, a->mx, s);
        else if (fast) run_skinny<false, true>(p, a->mx, s);
        else if (vec) run_skinny<true, false>(p, a->mx, s);
        else run_skinny<false, false>(p, a->mx, s);
        return qrl_cuda_launch_status_("fp4 gemm", err);
    }
    QRL_TRY(qrl_cuda_fp4_dequantize(a->work, a->codes, a->scales, a->N, a->K, a->mx, stream, err));
    QRL_TRY(qrl_cuda_gemm_bf16(a->blas, a->y, a->x, a->work, a->T, a->K, a->N, stream, err));
    if (!a->row_scale && !a->bias) return QRL_OK;
    size_t n = (size_t)a->T * a->N;
    fp4_epilogue_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(a->y, a->row_scale, a->bias,
                                                                   a->T, a->N);
    return qrl_cuda_launch_status_("fp4 epilogue", err);
}
