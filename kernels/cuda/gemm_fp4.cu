/* W4A16 NVFP4 / MXFP4 GEMMs: codes decoded in registers into mma.sync BF16 (gemm_fp4.cuh). */
#include "cuda/gemm_fp4.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#include "base/tuning.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

namespace cg = cooperative_groups;

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
    const float *xs; /* per-token factor (w4a4: the activations' 1 / S_enc) or NULL */
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
                if (p.xs) v = __fmul_rn(v, p.xs[t]);
                if (p.bias) v = __fadd_rn(v, p.bias[r]);
                p.y[(size_t)t * p.N + r] = v;
            }
}

/* ---- splitk: weight rows over warps, K over a cluster of blocks --------------------------
 * Warp w of a block owns 16 weight rows (row0 + 16w ..) and every token of the block's
 * 8 * NF token tile; all warps walk the same super-chunks (SC = 256 elements: 128 code
 * bytes of a row) of the block's K split.  Thread (g = lane / 4, c = lane % 4) holds, per
 * row g and g + 8, the 16-byte pieces [64h + 16c, +16) (h = 0, 1) of the row's 128 bytes,
 * so each load instruction reads 64 contiguous bytes per row; the next super-chunk's
 * codes and scales are loaded into registers while this one is decoded.  Decoded once per
 * (row tile, k16 step), each weight fragment feeds the NF token fragments, whose
 * activations the block stages in shared memory (cp.async, two stages, XOR-swizzled
 * 16-byte units: a quarter-warp's reads hit 8 distinct bank groups).  K order inside a
 * 16-element group is permuted as in fp4_skinny_kernel (fp4_pair), the same for both
 * operands.  gridDim.z = S blocks split K and form one thread block cluster: each writes its
 * F32 sums to its shared memory, and after a cluster barrier every block adds the S
 * partials of its 1/S share of the outputs in rank order (deterministic, no workspace,
 * no second launch). */
#define SC 256       /* K elements per super-chunk */
#define SC_BYTES 512 /* BF16 activations of one token and super-chunk in shared memory */

typedef struct fp4_wbuf {
    uint4 w[2][2];     /* [row g / g + 8][piece h] 32 codes each */
    uint32_t s[2][2];  /* raw scales: NVFP4 2 bytes (blocks 8h + 2c, +1), MXFP4 1 (4h + c) */
} fp4_wbuf;

template <bool MX>
static __device__ __forceinline__ void fp4_load_sc(fp4_wbuf &b, const uint8_t *const cr[2],
                                                   const uint8_t *const sr[2], const bool rok[2],
                                                   int sc, int c, int K) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bool kin = sc * SC + 128 * h + 32 * c < K; /* K % 64 == 0: whole pieces */
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            bool ok = kin && rok[rr];
            b.w[rr][h] = ok ? __ldg((const uint4 *)(cr[rr] + (size_t)sc * 128 + 64 * h + 16 * c))
                            : make_uint4(0, 0, 0, 0);
            if (MX) b.s[rr][h] = ok ? __ldg(sr[rr] + (size_t)sc * 8 + 4 * h + c) : 0u;
            else b.s[rr][h] = ok ? __ldg((const unsigned short *)(sr[rr] + (size_t)sc * 16 + 8 * h + 2 * c)) : 0u;
        }
    }
}

/* Swizzled 16-byte unit of token row t's unit u (0..31) in a stage. */
static __device__ __forceinline__ int fp4_xunit(int t, int u) {
    return u ^ (((u >> 3) & 1) | ((t & 1) << 1));
}

/* Stage the activations of super-chunk sc (8 * NF tokens from tok0; zero past T or K). */
template <int NF>
static __device__ __forceinline__ void fp4_fill_x(uint8_t *xs, const uint16_t *x, int tok0, int T,
                                                  int K, int sc, int nthreads) {
    for (int i = threadIdx.x; i < 8 * NF * 32; i += nthreads) {
        int t = i >> 5, u = i & 31, k = sc * SC + 8 * u;
        bool ok = tok0 + t < T && k < K;
        const uint16_t *src = ok ? x + (size_t)(tok0 + t) * K + k : x;
        qrl_cp_async16(qrl_smem_u32(xs + t * SC_BYTES + fp4_xunit(t, u) * 16), src, ok);
    }
}

template <int NF, bool MX>
static __device__ __forceinline__ void fp4_mma_sc(float (&acc)[NF][4], const fp4_wbuf &b,
                                                  const uint8_t *xs, int g, int c) {
    int key = (c >> 1) | ((g & 1) << 1); /* fp4_xunit's XOR for this thread's units */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int q = 0; q < 2; q++) { /* 16-element group 128h + 32c + 16q */
            uint32_t s0 = scale_word<MX, true>((uint8_t)(MX ? b.s[0][h] : b.s[0][h] >> (8 * q))),
                     s1 = scale_word<MX, true>((uint8_t)(MX ? b.s[1][h] : b.s[1][h] >> (8 * q)));
            uint32_t w0a = q ? b.w[0][h].z : b.w[0][h].x, w0b = q ? b.w[0][h].w : b.w[0][h].y,
                     w1a = q ? b.w[1][h].z : b.w[1][h].x, w1b = q ? b.w[1][h].w : b.w[1][h].y;
            uint32_t A[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                A[j][0] = fp4_pair<MX>(w0a, j, s0);
                A[j][1] = fp4_pair<MX>(w1a, j, s1);
                A[j][2] = fp4_pair<MX>(w0b, j, s0);
                A[j][3] = fp4_pair<MX>(w1b, j, s1);
            }
            int u = 16 * h + 4 * c + 2 * q;
#pragma unroll
            for (int f = 0; f < NF; f++) {
                const uint8_t *row = xs + (8 * f + g) * SC_BYTES;
                uint4 v0 = *(const uint4 *)(row + (u ^ key) * 16),
                      v1 = *(const uint4 *)(row + ((u + 1) ^ key) * 16);
                uint32_t X[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t sel = j & 1 ? 0x7632u : 0x5410u;
                    qrl_mma_bf16(acc[f], A[j], __byte_perm(X[j >> 1], X[(j >> 1) + 2], sel),
                                 __byte_perm(X[4 + (j >> 1)], X[6 + (j >> 1)], sel));
                }
            }
        }
}

/* Output value: the sums times 2^7 (NVFP4, fp4_pair), the row scale, the token factor,
 * the bias. */
template <bool MX>
static __device__ __forceinline__ float fp4_out(float v, const fp4_params &p, int r, int t) {
    if (!MX) v = __fmul_rn(v, 128.0f);
    if (p.rs) v = __fmul_rn(v, p.rs[r]);
    if (p.xs) v = __fmul_rn(v, p.xs[t]);
    if (p.bias) v = __fadd_rn(v, p.bias[r]);
    return v;
}

template <int NF, int RW, bool MX>
static __global__ void __launch_bounds__(RW * 32, (NF >= 8 ? 12 : 16) / RW)
fp4_splitk_kernel(fp4_params p, int scs) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int STAGE = 8 * NF * SC_BYTES;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int row0 = (blockIdx.x * RW + warp) * 16, tok0 = blockIdx.y * 8 * NF;
    int nsc = (p.K + SC - 1) / SC, sc0 = blockIdx.z * scs, sc1 = min(nsc, sc0 + scs);
    const uint8_t *cr[2], *sr[2];
    bool rok[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int r = row0 + 8 * rr + g;
        rok[rr] = r < p.N;
        cr[rr] = p.codes + (size_t)(rok[rr] ? r : 0) * p.cb;
        sr[rr] = p.scales + (size_t)(rok[rr] ? r : 0) * p.nb;
    }
    float acc[NF][4];
#pragma unroll
    for (int f = 0; f < NF; f++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[f][i] = 0.0f;
    fp4_wbuf cur = {}, nxt = {};
    if (sc0 < sc1) {
        fp4_load_sc<MX>(cur, cr, sr, rok, sc0, c, p.K);
        fp4_fill_x<NF>(sm, p.x, tok0, p.T, p.K, sc0, RW * 32);
    }
    qrl_cp_async_commit();
    for (int sc = sc0; sc < sc1; sc++) {
        int st = (sc - sc0) & 1;
        if (sc + 1 < sc1) { /* next super-chunk in flight during this one's math */
            fp4_load_sc<MX>(nxt, cr, sr, rok, sc + 1, c, p.K);
            fp4_fill_x<NF>(sm + (st ^ 1) * STAGE, p.x, tok0, p.T, p.K, sc + 1, RW * 32);
        }
        qrl_cp_async_commit();
        qrl_cp_async_wait<1>();
        __syncthreads(); /* stage st landed for every thread */
        fp4_mma_sc<NF, MX>(acc, cur, sm + st * STAGE, g, c);
        __syncthreads(); /* stage st read before it is refilled */
        cur = nxt;
    }
    if (gridDim.z == 1) {
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = row0 + g + 8 * (i >> 1), t = tok0 + 8 * f + 2 * c + (i & 1);
                if (r < p.N && t < p.T) p.y[(size_t)t * p.N + r] = fp4_out<MX>(acc[f][i], p, r, t);
            }
        return;
    }
    qrl_cp_async_wait<0>();
    float *part = (float *)sm; /* [RW][NF][4][32]: fits in the two stages */
#pragma unroll
    for (int f = 0; f < NF; f++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[((warp * NF + f) * 4 + i) * 32 + lane] = acc[f][i];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    constexpr int TOTAL = RW * NF * 4 * 32;
    int S = (int)gridDim.z, z = (int)cl.block_rank(), per = (TOTAL + S - 1) / S;
    int e1 = min(TOTAL, (z + 1) * per);
    for (int e = z * per + (int)threadIdx.x; e < e1; e += RW * 32) {
        int l = e & 31, i = (e >> 5) & 3, f = (e >> 7) % NF, w = (e >> 7) / NF;
        int r = (blockIdx.x * RW + w) * 16 + (l >> 2) + 8 * (i >> 1),
            t = tok0 + 8 * f + 2 * (l & 3) + (i & 1);
        if (r >= p.N || t >= p.T) continue;
        float s = *cl.map_shared_rank(part + e, 0);
        for (int q = 1; q < S; q++) s = __fadd_rn(s, *cl.map_shared_rank(part + e, q));
        p.y[(size_t)t * p.N + r] = fp4_out<MX>(s, p, r, t);
    }
    cl.sync(); /* the other blocks' reads of this block's sums are done */
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

/* y[t, n] = y[t, n] * rs[n] * xs[t] (+ bias[n]), as the skinny kernel's epilogue. */
static __global__ void fp4_epilogue_kernel(float *y, const float *rs, const float *xs,
                                           const float *bias, int T, int N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * N) return;
    int n = (int)(i % N);
    float v = y[i];
    if (rs) v = __fmul_rn(v, rs[n]);
    if (xs) v = __fmul_rn(v, xs[i / N]);
    if (bias) v = __fadd_rn(v, bias[n]);
    y[i] = v;
}

extern "C" const char *qrl_cuda_fp4_kernel_name(qrl_cuda_fp4_kernel k) {
    static const char *names[] = {"auto", "skinny", "dequant", "skinny-f32", "auto-f32", "splitk"};
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

static int cdiv(int a, int b) { return (a + b - 1) / b; }

#define SPLITK_MAX 16  /* blocks per cluster (above 8, the non-portable sizes Hopper allows) */

/* Token fragments of 8 per block: one tile of up to 64 tokens (grid y beyond). */
static int splitk_nf(int T) { return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8; }

static int device_sms(void) {
    static int sms[16];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return 132;
    if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms[dev] = 132;
    return sms[dev];
}

/* AUTO's shape, from bench/fp4.c's sweep on an H200 (bench/results/fp4-h200-sweep.txt):
 *  - 4 warps: 2 are within 5% up to 16 tokens (slower for gate_up), 8 slower everywhere
 *    (fewer blocks; at 64 tokens one 162-register block per SM);
 *  - splits until the grid holds about 16 warps per SM at 8 tokens, 8 from 9 tokens: the
 *    next super-chunk's loads are in flight only one step ahead, so short chains stream
 *    best (qkv, o: one super-chunk per warp, 6 splits; down: 12), while splitting gate_up,
 *    whose rows alone fill the GPU, pays at 8 tokens (2 splits) and costs from 16 (1);
 *  - the split count rounds up to the next that leaves no split empty (down: 11 -> 12). */
static int splitk_target_warps(int nf) { return (nf == 1 ? 16 : 8) * device_sms(); }

extern "C" void qrl_cuda_fp4_splitk_plan(int T, int N, int K, int *warps, int *splits) {
    int nf = splitk_nf(T), nsc = cdiv(K, SC), rw = *warps, s = *splits, max = SPLITK_MAX;
    if (rw != 2 && rw != 4 && rw != 8) rw = 4;
    if (rw == 2 && nf >= 4) rw = 4;
    if (max > nsc) max = nsc;
    if (s <= 0) { /* auto: round up */
        s = cdiv(splitk_target_warps(nf), cdiv(N, 16) * cdiv(T, 8 * nf));
        if (s > max) s = max;
        int scs = nsc / s;
        while (cdiv(nsc, scs) > max) scs++;
        s = cdiv(nsc, scs);
    } else { /* a request: at most that many */
        if (s > max) s = max;
        s = cdiv(nsc, cdiv(nsc, s)); /* no empty split */
    }
    *warps = rw, *splits = s;
}

template <int NF, int RW>
static cudaError_t launch_splitk(const fp4_params &p, bool mx, int S, cudaStream_t s) {
    static bool raised[2][16]; /* the attributes below, per kernel and device */
    void (*kern)(fp4_params, int) = mx ? fp4_splitk_kernel<NF, RW, true> : fp4_splitk_kernel<NF, RW, false>;
    int smem = 2 * 8 * NF * SC_BYTES, dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) dev = 0;
    if (!raised[mx][dev]) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e == cudaSuccess && smem > 48 * 1024)
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        raised[mx][dev] = true;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cdiv(p.N, 16 * RW), cdiv(p.T, 8 * NF), S);
    cfg.blockDim = dim3(RW * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = S;
    cfg.attrs = at;
    cfg.numAttrs = S > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, p, cdiv(cdiv(p.K, SC), S));
}

static cudaError_t run_splitk(const fp4_params &p, bool mx, int rw, int S, cudaStream_t s) {
    switch (splitk_nf(p.T) * 16 + rw) {
    case 1 * 16 + 2: return launch_splitk<1, 2>(p, mx, S, s);
    case 1 * 16 + 4: return launch_splitk<1, 4>(p, mx, S, s);
    case 1 * 16 + 8: return launch_splitk<1, 8>(p, mx, S, s);
    case 2 * 16 + 2: return launch_splitk<2, 2>(p, mx, S, s);
    case 2 * 16 + 4: return launch_splitk<2, 4>(p, mx, S, s);
    case 2 * 16 + 8: return launch_splitk<2, 8>(p, mx, S, s);
    case 4 * 16 + 4: return launch_splitk<4, 4>(p, mx, S, s);
    case 4 * 16 + 8: return launch_splitk<4, 8>(p, mx, S, s);
    case 8 * 16 + 4: return launch_splitk<8, 4>(p, mx, S, s);
    default: return launch_splitk<8, 8>(p, mx, S, s);
    }
}

/* The fp4_no_splitk tuning knob (QRL_FP4_NO_SPLITK=1): AUTO keeps the SKINNY kernel (A/B
 * in bench/fp4.c); read on every call so one process can measure both. */
static bool no_splitk(void) { return qrl_tuning_bool(QRL_TUNING_FP4_NO_SPLITK); }

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
    bool splitk_ok = a->K % 64 == 0 && al16(a->x) && al16(a->codes) && ((uintptr_t)a->scales & 1) == 0;
    if (k == QRL_CUDA_FP4_AUTO)
        k = a->T > 64 && have_work        ? QRL_CUDA_FP4_DEQUANT
            : splitk_ok && !no_splitk()   ? QRL_CUDA_FP4_SPLITK
                                          : QRL_CUDA_FP4_SKINNY;
    if (k == QRL_CUDA_FP4_AUTO_F32) k = QRL_CUDA_FP4_SKINNY_F32;
    if (k == QRL_CUDA_FP4_SPLITK && !splitk_ok) k = QRL_CUDA_FP4_SKINNY;
    if (k == QRL_CUDA_FP4_DEQUANT && !have_work)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "fp4 gemm: dequant kernel needs a cuBLAS handle and %zu workspace "
                             "elements (have %zu)", (size_t)a->N * a->K, a->work ? a->work_elems : 0);
    if (k != QRL_CUDA_FP4_SKINNY && k != QRL_CUDA_FP4_SKINNY_F32 && k != QRL_CUDA_FP4_DEQUANT &&
        k != QRL_CUDA_FP4_SPLITK)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "fp4 gemm: bad kernel %d", (int)k);
    if (a->ran) *a->ran = k;
    cudaStream_t s = (cudaStream_t)stream;
    fp4_params p = {a->y, a->x, a->codes, a->scales, a->row_scale, a->bias, a->T, a->N, a->K,
                    qrl_cuda_fp4_code_bytes(a->K), qrl_cuda_fp4_scale_bytes(a->K, a->mx),
                    a->x_scale};
    if (k == QRL_CUDA_FP4_SPLITK) {
        int rw = a->warps, S = a->splits;
        qrl_cuda_fp4_splitk_plan(a->T, a->N, a->K, &rw, &S);
        cudaError_t e = run_splitk(p, a->mx, rw, S, s);
        if (e != cudaSuccess && S > 8) { /* no room for a non-portable cluster: 8 blocks */
            (void)cudaGetLastError();
            S = 8;
            qrl_cuda_fp4_splitk_plan(a->T, a->N, a->K, &rw, &S);
            e = run_splitk(p, a->mx, rw, S, s);
        }
        if (a->ran_splits) *a->ran_splits = S;
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return qrl_error_set(err, QRL_STATUS_CUDA, "fp4 gemm splitk (T=%d N=%d K=%d, %d warps, "
                                 "%d splits) launch: %s", a->T, a->N, a->K, rw, S, cudaGetErrorString(e));
        }
        return qrl_cuda_launch_status_("fp4 gemm splitk", err);
    }
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
    if (!a->row_scale && !a->x_scale && !a->bias) return QRL_OK;
    size_t n = (size_t)a->T * a->N;
    fp4_epilogue_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(a->y, a->row_scale, a->x_scale,
                                                                   a->bias, a->T, a->N);
    return qrl_cuda_launch_status_("fp4 epilogue", err);
}
