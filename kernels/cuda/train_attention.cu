/* Causal GQA attention over packed sequences for training (train_attention.cuh).
 *
 * head_dim 64 / 128: tensor cores (mma.sync m16n8k16, BF16 in, F32 accumulate), FA2 style.
 *   forward:  one 256-thread block per (128-query tile, q head); each of the 8 warps owns
 *             16 query rows, K/V tiles of 64 keys double-buffered through cp.async (shared
 *             by twice the queries of a 64-query block); online softmax in the log2
 *             domain; P rounded to BF16 for P V (as FlashAttention).  A warp skips the
 *             key tiles wholly after its rows (the diagonal tiles).
 *   backward: one 256-thread block per (128-key tile, q head); each of the 8 warps owns
 *             16 keys and keeps their
 *             dK/dV in registers while it walks the query tiles that can see the keys
 *             (S^T = K Q^T, P^T = exp2(S^T - lse), dV += P^T dO, dP^T = V dO^T,
 *             dS^T = P^T (dP^T - D), dK += dS^T Q); dQ = dS K goes through shared memory
 *             and F32 atomics, and so do dK/dV at the end (the q heads of a GQA group
 *             share them).  One q head per block, not the whole group: Hkv = 2 would
 *             otherwise leave most of the chip idle on the long key tiles.  128 keys per
 *             block halve the dQ atomics and the Q/dO tile loads per key (H200, T = 8192:
 *             178 -> 221 TFLOPS at hd 128).
 * Both grids are (heads, tiles), heads fastest, longest tiles first: the causal tail is
 * short, and a head-fastest backward measured faster than a tile-fastest one.
 * other even head_dim <= 256: CUDA cores, one warp per row, correctness over speed.
 * Tiles wholly outside the block-diagonal causal mask are skipped: seg_start is
 * non-decreasing, so a query tile's first key is seg_start of its first query, and a key
 * tile's last query is found by binary search. */
#include "cuda/train_attention.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include "base/tuning.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define BN 64 /* keys per tile (both passes) */

/* ---- PTX helpers beyond cuda/ptx.cuh ------------------------------------------------------- */

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ void atomic_add2(float *p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd((float2 *)p, make_float2(x, y)); /* one vector reduction (p is 8-byte aligned) */
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

/* Fragment addressing (ldmatrix x4, lane l):
 *   A 16x16 from [m][k] storage:      row m0 + l%16,                  col k0 + (l/16)*8
 *   A 16x16 from [k][m] storage (.t): row k0 + l%8 + (l/16)*8,        col m0 + ((l/8)%2)*8
 *   B two 16x8 from [n][k] storage:   row n0 + l%8 + (l/16)*8,        col k0 + ((l/8)%2)*8
 *   B two 16x8 from [k][n] (.trans):  row k0 + l%8 + ((l/8)%2)*8,     col n0 + (l/16)*8
 * B results: r[0], r[1] for n0..n0+7 and r[2], r[3] for n0+8..n0+15.  Shared rows are
 * padded by 8 elements (16 bytes): 8 consecutive rows hit distinct banks. */

/* Rows [r0, r0 + n) of a [T, heads, HD] BF16 tensor (one head) into a padded tile. */
template <int HD>
static __device__ __forceinline__ void load_tile(uint16_t *dst, const uint16_t *src, size_t stride,
                                                 int r0, int n, int T) {
    constexpr int CPR = HD / 8, LD = HD + 8;
    for (int i = threadIdx.x; i < n * CPR; i += blockDim.x) {
        int row = i / CPR, ch = i % CPR, r = r0 + row;
        bool ok = r < T;
        qrl_cp_async16(qrl_smem_u32(dst + row * LD + ch * 8), src + (size_t)(ok ? r : 0) * stride + ch * 8, ok);
    }
}

/* ---- tensor-core forward ------------------------------------------------------------------ */

/* NW warps, each owning WM 16-row query slices: BQ = NW * 16 * WM queries per block.  With
 * WM = 2 every K/V fragment read from shared memory feeds two mma, at the price of the Q
 * fragments being re-read per key tile; measured no faster than WM = 1, NW = 8 (and slower
 * at T = 2048: fewer blocks), so the launcher uses the latter. */
template <int HD, int WM, int NW>
static __global__ void __launch_bounds__(NW * 32, HD == 128 && NW == 8 ? 1 : 2)
fwd_tc_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
              const int32_t *seg_start, int T, int H, int Hkv, float scale_log2) {
    constexpr int LD = HD + 8, KS = HD / 16, BQ = NW * 16 * WM;
    extern __shared__ __align__(16) uint16_t fsm[];
    uint16_t *sQ = fsm, *sK = sQ + BQ * LD, *sV = sK + 2 * BN * LD;
    /* blocks are issued x-fastest: every head's longest query tiles first (causal tail) */
    const int qt = gridDim.y - 1 - blockIdx.y;
    const int h = blockIdx.x, kh = h / (H / Hkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int q0 = qt * BQ, q_last = min(q0 + BQ - 1, T - 1);
    const int kt0 = max(seg_start[q0], 0) / BN, /* clamp: never read before row 0 */
              kt1 = q_last / BN, ss_last = seg_start[q_last];
    const size_t qs = (size_t)H * HD, kvs = (size_t)Hkv * HD;
    const uint16_t *kb = k + (size_t)kh * HD, *vb = v + (size_t)kh * HD;
    load_tile<HD>(sQ, q + (size_t)h * HD, qs, q0, BQ, T);
    load_tile<HD>(sK, kb, kvs, kt0 * BN, BN, T);
    load_tile<HD>(sV, vb, kvs, kt0 * BN, BN, T);
    qrl_cp_async_commit();
    /* padding rows (>= T) take row T-1's mask: finite statistics, never written */
    int r_lo[WM], t_lo[WM], t_hi[WM], ss_lo[WM], ss_hi[WM];
#pragma unroll
    for (int w = 0; w < WM; w++) {
        r_lo[w] = q0 + (warp * WM + w) * 16 + g;
        t_lo[w] = min(r_lo[w], T - 1), t_hi[w] = min(r_lo[w] + 8, T - 1);
        ss_lo[w] = seg_start[t_lo[w]], ss_hi[w] = seg_start[t_hi[w]];
    }
    /* the last key any row of this warp sees: tiles past it are skipped by the warp */
    const int warp_last = min(q0 + (warp + 1) * WM * 16 - 1, T - 1);
    float o[WM][HD / 8][4], m[WM][2], l[WM][2];
#pragma unroll
    for (int w = 0; w < WM; w++) {
        m[w][0] = m[w][1] = -INFINITY, l[w][0] = l[w][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) o[w][n][0] = o[w][n][1] = o[w][n][2] = o[w][n][3] = 0.0f;
    }
    uint32_t qa[WM == 1 ? KS : 1][4]; /* WM == 1: the warp's Q fragments stay in registers */
    for (int kt = kt0; kt <= kt1; kt++) {
        const int buf = (kt - kt0) & 1;
        qrl_cp_async_wait<0>();
        __syncthreads();
        if constexpr (WM == 1)
            if (kt == kt0)
#pragma unroll
                for (int ks = 0; ks < KS; ks++)
                    qrl_ldsm_x4(qrl_smem_u32(sQ + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8), qa[ks]);
        if (kt < kt1) {
            load_tile<HD>(sK + (buf ^ 1) * BN * LD, kb, kvs, (kt + 1) * BN, BN, T);
            load_tile<HD>(sV + (buf ^ 1) * BN * LD, vb, kvs, (kt + 1) * BN, BN, T);
        }
        qrl_cp_async_commit();
        const int k0 = kt * BN;
        if (k0 > warp_last) continue; /* warp-uniform: every key of the tile is in the future */
        const uint16_t *K_ = sK + buf * BN * LD, *V_ = sV + buf * BN * LD;
        float s[WM][BN / 8][4];
#pragma unroll
        for (int w = 0; w < WM; w++)
#pragma unroll
            for (int n = 0; n < BN / 8; n++) s[w][n][0] = s[w][n][1] = s[w][n][2] = s[w][n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[WM][4];
            if constexpr (WM > 1)
#pragma unroll
                for (int w = 0; w < WM; w++)
                    qrl_ldsm_x4(qrl_smem_u32(sQ + ((warp * WM + w) * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8), a[w]);
#pragma unroll
            for (int n = 0; n < BN / 8; n += 2) {
                uint32_t b[4];
                qrl_ldsm_x4(qrl_smem_u32(K_ + (n * 8 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8), b);
#pragma unroll
                for (int w = 0; w < WM; w++) {
                    const uint32_t *aw = WM == 1 ? qa[WM == 1 ? ks : 0] : a[w];
                    qrl_mma_bf16(s[w][n], aw, b[0], b[1]);
                    qrl_mma_bf16(s[w][n + 1], aw, b[2], b[3]);
                }
            }
        }
        const bool full = k0 + BN - 1 <= q0 && k0 >= ss_last;
#pragma unroll
        for (int w = 0; w < WM; w++) {
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float x = s[w][n][i] * scale_log2;
                    if (!full) {
                        int key = k0 + n * 8 + 2 * c + (i & 1);
                        int t = i < 2 ? t_lo[w] : t_hi[w], ss = i < 2 ? ss_lo[w] : ss_hi[w];
                        if (key > t || key < ss) x = -INFINITY;
                    }
                    s[w][n][i] = x;
                    mx[i >> 1] = fmaxf(mx[i >> 1], x);
                }
            float alpha[2], mu[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                float mn = fmaxf(m[w][r], mx[r]);
                mu[r] = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet stays at zero */
                alpha[r] = exp2f(m[w][r] - mu[r]);
                m[w][r] = mn;
                l[w][r] *= alpha[r];
            }
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float p = exp2f(s[w][n][i] - mu[i >> 1]);
                    s[w][n][i] = p;
                    l[w][i >> 1] += p;
                }
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                o[w][n][0] *= alpha[0], o[w][n][1] *= alpha[0];
                o[w][n][2] *= alpha[1], o[w][n][3] *= alpha[1];
            }
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[WM][4];
#pragma unroll
            for (int w = 0; w < WM; w++) {
                pa[w][0] = pack_bf16(s[w][2 * kk][0], s[w][2 * kk][1]);
                pa[w][1] = pack_bf16(s[w][2 * kk][2], s[w][2 * kk][3]);
                pa[w][2] = pack_bf16(s[w][2 * kk + 1][0], s[w][2 * kk + 1][1]);
                pa[w][3] = pack_bf16(s[w][2 * kk + 1][2], s[w][2 * kk + 1][3]);
            }
#pragma unroll
            for (int n = 0; n < HD / 8; n += 2) {
                uint32_t b[4];
                qrl_ldsm_x4_t(qrl_smem_u32(V_ + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 + (lane >> 4) * 8), b);
#pragma unroll
                for (int w = 0; w < WM; w++) {
                    qrl_mma_bf16(o[w][n], pa[w], b[0], b[1]);
                    qrl_mma_bf16(o[w][n + 1], pa[w], b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int w = 0; w < WM; w++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[w][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            int row = r_lo[w] + 8 * r;
            if (row >= T) continue;
            float inv = 1.0f / lr; /* l >= 1: the row's max contributes exp2(0) */
            uint16_t *op = out + ((size_t)row * H + h) * HD + 2 * c;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                *(uint32_t *)(op + n * 8) = pack_bf16(o[w][n][2 * r] * inv, o[w][n][2 * r + 1] * inv);
            if (c == 0) lse[(size_t)h * T + row] = (m[w][r] + log2f(lr)) * LN2;
        }
}
/* ---- tensor-core backward ------------------------------------------------------------------ */

template <int HD, int BM, int NW>
struct bwd_smem {
    static constexpr int LD = HD + 8, LDS = BM + 8, BK = NW * 16;
    static constexpr size_t BYTES = (size_t)(2 * BK * LD + 4 * BM * LD + BK * LDS) * 2 + 6 * BM * 4;
};

template <int HD, int BM, int NW>
static __global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1)
bwd_tc_kernel(float *dq, float *dk, float *dv, const uint16_t *dout, const uint16_t *q,
              const uint16_t *k, const uint16_t *v, const float *lse, const float *Dr,
              const int32_t *seg_start, int T, int H, int Hkv, float scale, float scale_log2) {
    constexpr int LD = HD + 8, LDS = BM + 8, KS = HD / 16, BK = NW * 16, QG = BM / 16, DG = NW / QG,
                  DW = HD / DG;
    static_assert(QG * DG == NW && DW % 16 == 0, "warp split of dQ");
    extern __shared__ __align__(16) uint16_t bsm[];
    uint16_t *sK = bsm, *sV = sK + BK * LD, *sQ = sV + BK * LD, *sO = sQ + 2 * BM * LD;
    uint16_t *sdS = sO + 2 * BM * LD;
    float *sL = (float *)(sdS + BK * LDS), *sD = sL + 2 * BM;
    int32_t *sS = (int32_t *)(sD + 2 * BM);
    /* blocks are issued x-fastest: every head's longest key tiles (the first) go first */
    const int kt = blockIdx.y, h = blockIdx.x, kh = h / (H / Hkv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int k0 = kt * BK, k_last = min(k0 + BK - 1, T - 1);
    /* queries that see a key of the tile: [k0, first t > k_last with seg_start[t] > k_last) */
    int lo = k_last + 1, hi = T;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (seg_start[mid] > k_last) hi = mid;
        else lo = mid + 1;
    }
    const int qt0 = k0 / BM, qt1 = (lo - 1) / BM;
    const size_t qs = (size_t)H * HD, kvs = (size_t)Hkv * HD;
    const uint16_t *qb = q + (size_t)h * HD, *ob = dout + (size_t)h * HD;
    const float *lb = lse + (size_t)h * T, *db = Dr + (size_t)h * T;
    load_tile<HD>(sK, k + (size_t)kh * HD, kvs, k0, BK, T);
    load_tile<HD>(sV, v + (size_t)kh * HD, kvs, k0, BK, T);
    auto prefetch = [&](int qt, int buf) {
        int t0 = qt * BM;
        load_tile<HD>(sQ + buf * BM * LD, qb, qs, t0, BM, T);
        load_tile<HD>(sO + buf * BM * LD, ob, qs, t0, BM, T);
        for (int i = threadIdx.x; i < 3 * BM; i += blockDim.x) {
            int j = i % BM, t = t0 + j, a = i / BM;
            bool ok = t < T;
            const void *src = a == 0 ? (const void *)(lb + (ok ? t : 0))
                            : a == 1 ? (const void *)(db + (ok ? t : 0)) : (const void *)(seg_start + (ok ? t : 0));
            void *dst = a == 0 ? (void *)(sL + buf * BM + j) : a == 1 ? (void *)(sD + buf * BM + j)
                                                                    : (void *)(sS + buf * BM + j);
            qrl_cp_async4(qrl_smem_u32(dst), src, ok);
        }
        qrl_cp_async_commit();
    };
    prefetch(qt0, 0);
    const int key_lo = k0 + warp * 16 + g;
    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) dka[n][i] = dva[n][i] = 0.0f;
    const int qg = warp % QG, dg = warp / QG;
    for (int qt = qt0; qt <= qt1; qt++) {
        const int buf = (qt - qt0) & 1, t0 = qt * BM;
        qrl_cp_async_wait<0>();
        __syncthreads();
        if (qt < qt1) prefetch(qt + 1, buf ^ 1);
        const uint16_t *Q_ = sQ + buf * BM * LD, *O_ = sO + buf * BM * LD;
        const float *L_ = sL + buf * BM, *D_ = sD + buf * BM;
        const int32_t *S_ = sS + buf * BM;
        float st[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int n = 0; n < BM / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) st[n][i] = dp[n][i] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t ka[4], va[4];
            qrl_ldsm_x4(qrl_smem_u32(sK + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8), ka);
            qrl_ldsm_x4(qrl_smem_u32(sV + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8), va);
#pragma unroll
            for (int n = 0; n < BM / 8; n += 2) {
                uint32_t b[4];
                const int off = (n * 8 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8;
                qrl_ldsm_x4(qrl_smem_u32(Q_ + off), b);
                qrl_mma_bf16(st[n], ka, b[0], b[1]);
                qrl_mma_bf16(st[n + 1], ka, b[2], b[3]);
                qrl_ldsm_x4(qrl_smem_u32(O_ + off), b);
                qrl_mma_bf16(dp[n], va, b[0], b[1]);
                qrl_mma_bf16(dp[n + 1], va, b[2], b[3]);
            }
        }
        /* every key of the tile <= every query, every query's segment starts <= k0 */
        const bool full = k0 + BK - 1 <= t0 && t0 + BM <= T && S_[BM - 1] <= k0;
#pragma unroll
        for (int n = 0; n < BM / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int j = n * 8 + 2 * c + (i & 1), t = t0 + j, key = key_lo + (i >> 1) * 8;
                bool ok = full || (t < T && S_[j] <= key && key <= t);
                float p = ok ? exp2f(fmaf(st[n][i], scale_log2, -L_[j] * LOG2E)) : 0.0f;
                st[n][i] = p;
                dp[n][i] = p * (dp[n][i] - D_[j]);
            }
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            const uint32_t pa[4] = {pack_bf16(st[2 * kk][0], st[2 * kk][1]), pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                                    pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                    pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
            const uint32_t da[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]), pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                                    pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                    pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < HD / 8; n += 2) {
                uint32_t b[4];
                const int off = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 8 + (lane >> 4) * 8;
                qrl_ldsm_x4_t(qrl_smem_u32(O_ + off), b);
                qrl_mma_bf16(dva[n], pa, b[0], b[1]);
                qrl_mma_bf16(dva[n + 1], pa, b[2], b[3]);
                qrl_ldsm_x4_t(qrl_smem_u32(Q_ + off), b);
                qrl_mma_bf16(dka[n], da, b[0], b[1]);
                qrl_mma_bf16(dka[n + 1], da, b[2], b[3]);
            }
            /* dS^T rows of this warp, BF16, for the block's dQ product */
            uint16_t *r0 = sdS + (warp * 16 + g) * LDS + kk * 16 + 2 * c;
            *(uint32_t *)r0 = da[0];
            *(uint32_t *)(r0 + 8 * LDS) = da[1];
            *(uint32_t *)(r0 + 8) = da[2];
            *(uint32_t *)(r0 + 8 * LDS + 8) = da[3];
        }
        __syncthreads();
        /* dQ[qg*16.., dg*DW..] = dS K: A = dS from the [key][query] tile (transposed) */
        float acc[DW / 8][4];
#pragma unroll
        for (int n = 0; n < DW / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[4];
            qrl_ldsm_x4_t(qrl_smem_u32(sdS + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + qg * 16 + ((lane >> 3) & 1) * 8), a);
#pragma unroll
            for (int n = 0; n < DW / 8; n += 2) {
                uint32_t b[4];
                qrl_ldsm_x4_t(qrl_smem_u32(sK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dg * DW + n * 8 + (lane >> 4) * 8), b);
                qrl_mma_bf16(acc[n], a, b[0], b[1]);
                qrl_mma_bf16(acc[n + 1], a, b[2], b[3]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int t = t0 + qg * 16 + g + 8 * r;
            if (t >= T) continue;
            float *p = dq + ((size_t)t * H + h) * HD + dg * DW + 2 * c;
#pragma unroll
            for (int n = 0; n < DW / 8; n++) atomic_add2(p + n * 8, scale * acc[n][2 * r], scale * acc[n][2 * r + 1]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key_lo + 8 * r;
        if (key >= T) continue;
        size_t off = ((size_t)key * Hkv + kh) * HD + 2 * c;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            atomic_add2(dk + off + n * 8, scale * dka[n][2 * r], scale * dka[n][2 * r + 1]);
            atomic_add2(dv + off + n * 8, dva[n][2 * r], dva[n][2 * r + 1]);
        }
    }
}

/* ---- CUDA-core path (any even head_dim <= 256): one warp per row -------------------------- */

#define MAXD 8 /* dims per lane: hd <= 256 */

/* x[i] = row[lane + 32 i] (0 beyond hd) */
static __device__ __forceinline__ void load_row(float x[MAXD], const uint16_t *row, int hd, int lane) {
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        x[i] = d < hd ? qrl_bf16_ld_(row[d]) : 0.0f;
    }
}
static __device__ __forceinline__ float dot_row(const float x[MAXD], const uint16_t *row, int hd, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        if (d < hd) s = fmaf(x[i], qrl_bf16_ld_(row[d]), s);
    }
    return qrl_warp_sum_(s);
}

static __global__ void fwd_simple_kernel(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                         const uint16_t *v, const int32_t *seg_start, int T, int H,
                                         int Hkv, int hd, float scale) {
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (long)T * H) return;
    int t = (int)(row / H), h = (int)(row % H), kh = h / (H / Hkv);
    float qv[MAXD], o[MAXD] = {0}, m = -INFINITY, l = 0.0f;
    load_row(qv, q + (size_t)row * hd, hd, lane);
    for (int s = max(seg_start[t], 0); s <= t; s++) {
        size_t kv = ((size_t)s * Hkv + kh) * hd;
        float sc = scale * dot_row(qv, k + kv, hd, lane);
        float mn = fmaxf(m, sc), a = expf(m - mn), p = expf(sc - mn);
        m = mn;
        l = l * a + p;
#pragma unroll
        for (int i = 0; i < MAXD; i++) {
            int d = lane + 32 * i;
            o[i] = o[i] * a + (d < hd ? p * qrl_bf16_ld_(v[kv + d]) : 0.0f);
        }
    }
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        if (d < hd) out[(size_t)row * hd + d] = qrl_bf16_st_(o[i] / l);
    }
    if (lane == 0) lse[(size_t)h * T + t] = m + logf(l);
}

/* D[h, t] = sum_d dout * out (both passes' preprocess) */
static __global__ void rowdot_kernel(float *D, const uint16_t *dout, const uint16_t *out, int T, int H, int hd) {
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (long)T * H) return;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32)
        s = fmaf(qrl_bf16_ld_(dout[(size_t)row * hd + d]), qrl_bf16_ld_(out[(size_t)row * hd + d]), s);
    s = qrl_warp_sum_(s);
    if (lane == 0) D[(size_t)(row % H) * T + row / H] = s;
}

static __global__ void dq_simple_kernel(float *dq, const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                                        const uint16_t *v, const float *lse, const float *D,
                                        const int32_t *seg_start, int T, int H, int Hkv, int hd, float scale) {
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (long)T * H) return;
    int t = (int)(row / H), h = (int)(row % H), kh = h / (H / Hkv);
    float qv[MAXD], ov[MAXD], acc[MAXD] = {0};
    load_row(qv, q + (size_t)row * hd, hd, lane);
    load_row(ov, dout + (size_t)row * hd, hd, lane);
    float L = lse[(size_t)h * T + t], Dt = D[(size_t)h * T + t];
    for (int s = max(seg_start[t], 0); s <= t; s++) {
        size_t kv = ((size_t)s * Hkv + kh) * hd;
        float p = expf(scale * dot_row(qv, k + kv, hd, lane) - L);
        float ds = p * (dot_row(ov, v + kv, hd, lane) - Dt);
#pragma unroll
        for (int i = 0; i < MAXD; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = fmaf(ds, qrl_bf16_ld_(k[kv + d]), acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        if (d < hd) dq[(size_t)row * hd + d] += scale * acc[i];
    }
}

/* one warp per (key s, kv head): the queries of s are [s, end of its sequence) */
static __global__ void dkdv_simple_kernel(float *dk, float *dv, const uint16_t *dout, const uint16_t *q,
                                          const uint16_t *k, const uint16_t *v, const float *lse,
                                          const float *D, const int32_t *seg_start, int T, int H,
                                          int Hkv, int hd, float scale) {
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= (long)T * Hkv) return;
    int s = (int)(row / Hkv), kh = (int)(row % Hkv), rep = H / Hkv;
    float kv_[MAXD], vv[MAXD], ak[MAXD] = {0}, av[MAXD] = {0};
    load_row(kv_, k + (size_t)row * hd, hd, lane);
    load_row(vv, v + (size_t)row * hd, hd, lane);
    for (int h = kh * rep; h < (kh + 1) * rep; h++)
        for (int t = s; t < T && seg_start[t] <= s; t++) {
            size_t th = ((size_t)t * H + h) * hd;
            float p = expf(scale * dot_row(kv_, q + th, hd, lane) - lse[(size_t)h * T + t]);
            float ds = p * (dot_row(vv, dout + th, hd, lane) - D[(size_t)h * T + t]);
#pragma unroll
            for (int i = 0; i < MAXD; i++) {
                int d = lane + 32 * i;
                if (d < hd) {
                    av[i] = fmaf(p, qrl_bf16_ld_(dout[th + d]), av[i]);
                    ak[i] = fmaf(ds, qrl_bf16_ld_(q[th + d]), ak[i]);
                }
            }
        }
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        if (d < hd) {
            dk[(size_t)row * hd + d] += scale * ak[i];
            dv[(size_t)row * hd + d] += av[i];
        }
    }
}

/* ---- launchers -------------------------------------------------------------------------- */

static qrl_status check_args(const char *what, int T, int H, int Hkv, int hd, qrl_error *err) {
    if (T <= 0 || H <= 0 || Hkv <= 0 || hd <= 0 || H % Hkv)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: T=%d H=%d Hkv=%d hd=%d (sizes > 0, H a multiple of Hkv)", what, T,
                             H, Hkv, hd);
    if (hd % 2 || hd > 256)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: head_dim %d (even, <= 256)", what, hd);
    if ((long)T * H > 0x7fffffffL / 32)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: T*H=%ld rows", what, (long)T * H);
    return QRL_OK;
}

/* The tensor-core path moves 16-byte chunks (cp.async) and pairs of outputs. */
static qrl_status check_align(const char *what, const void *const *p, int n, qrl_error *err) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] & 15)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s: buffer %d at %p is not 16-byte aligned", what, i, p[i]);
    return QRL_OK;
}

/* The train_attn_simple tuning knob (QRL_TRAIN_ATTN_SIMPLE=1) forces the CUDA-core path
 * for every head_dim (A/B checks). */
static bool use_tc(int hd) {
    return (hd == 64 || hd == 128) && !qrl_tuning_bool(QRL_TUNING_TRAIN_ATTN_SIMPLE);
}

template <typename K>
static qrl_status set_smem(K kernel, size_t bytes, const char *what, qrl_error *err) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "%s: shared memory %zu: %s", what, bytes, cudaGetErrorString(e));
    return QRL_OK;
}

template <int HD, int WM, int NW>
static qrl_status launch_fwd_tc(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                const uint16_t *v, const int32_t *ss, int T, int H, int Hkv,
                                float sl2, cudaStream_t st, qrl_error *err) {
    constexpr int BQ = NW * 16 * WM;
    const size_t bytes = (size_t)(BQ + 4 * BN) * (HD + 8) * 2;
    QRL_TRY(set_smem(fwd_tc_kernel<HD, WM, NW>, bytes, "train attention forward", err));
    fwd_tc_kernel<HD, WM, NW><<<dim3(H, (T + BQ - 1) / BQ), NW * 32, bytes, st>>>(out, lse, q, k, v, ss, T, H, Hkv, sl2);
    return qrl_cuda_launch_status_("train attention forward", err);
}

template <int HD, int BM, int NW>
static qrl_status launch_bwd_tc(float *dq, float *dk, float *dv, const uint16_t *dout, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const float *lse, const float *D,
                                const int32_t *ss, int T, int H, int Hkv, float scale,
                                cudaStream_t st, qrl_error *err) {
    const size_t bytes = bwd_smem<HD, BM, NW>::BYTES;
    constexpr int BK = NW * 16;
    QRL_TRY(set_smem(bwd_tc_kernel<HD, BM, NW>, bytes, "train attention backward", err));
    bwd_tc_kernel<HD, BM, NW><<<dim3(H, (T + BK - 1) / BK), NW * 32, bytes, st>>>(
        dq, dk, dv, dout, q, k, v, lse, D, ss, T, H, Hkv, scale, scale * LOG2E);
    return qrl_cuda_launch_status_("train attention backward", err);
}

static unsigned warp_blocks(long rows) { return (unsigned)((rows + 3) / 4); }

extern "C" qrl_status qrl_cuda_train_attention_forward(uint16_t *out, float *lse, const uint16_t *q,
                                                       const uint16_t *k, const uint16_t *v,
                                                       const int32_t *seg_start, int T, int H,
                                                       int Hkv, int hd, void *stream, qrl_error *err) {
    QRL_TRY(check_args("train attention forward", T, H, Hkv, hd, err));
    cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)hd));
    if (use_tc(hd)) {
        const void *p[] = {out, q, k, v};
        QRL_TRY(check_align("train attention forward", p, 4, err));
    }
    if (use_tc(hd) && hd == 64) return launch_fwd_tc<64, 1, 8>(out, lse, q, k, v, seg_start, T, H, Hkv, scale * LOG2E, st, err);
    if (use_tc(hd)) return launch_fwd_tc<128, 1, 8>(out, lse, q, k, v, seg_start, T, H, Hkv, scale * LOG2E, st, err);
    fwd_simple_kernel<<<warp_blocks((long)T * H), 128, 0, st>>>(out, lse, q, k, v, seg_start, T, H, Hkv, hd, scale);
    return qrl_cuda_launch_status_("train attention forward", err);
}

extern "C" size_t qrl_cuda_train_attention_work_floats(int T, int H) {
    return T > 0 && H > 0 ? (size_t)T * H : 0;
}

extern "C" qrl_status qrl_cuda_train_attention_backward(float *dq, float *dk, float *dv,
                                                        const uint16_t *dout, const uint16_t *q,
                                                        const uint16_t *k, const uint16_t *v,
                                                        const uint16_t *out, const float *lse,
                                                        const int32_t *seg_start, int T, int H,
                                                        int Hkv, int hd, float *work, void *stream,
                                                        qrl_error *err) {
    QRL_TRY(check_args("train attention backward", T, H, Hkv, hd, err));
    cudaStream_t st = (cudaStream_t)stream;
    const float scale = (float)(1.0 / sqrt((double)hd));
    if (use_tc(hd)) {
        const void *p[] = {dout, q, k, v, dq, dk, dv};
        QRL_TRY(check_align("train attention backward", p, 7, err));
    }
    rowdot_kernel<<<warp_blocks((long)T * H), 128, 0, st>>>(work, dout, out, T, H, hd);
    QRL_TRY(qrl_cuda_launch_status_("train attention backward (row sums)", err));
    if (use_tc(hd) && hd == 64)
        return launch_bwd_tc<64, 64, 8>(dq, dk, dv, dout, q, k, v, lse, work, seg_start, T, H, Hkv, scale, st, err);
    if (use_tc(hd))
        return launch_bwd_tc<128, 32, 8>(dq, dk, dv, dout, q, k, v, lse, work, seg_start, T, H, Hkv, scale, st, err);
    dq_simple_kernel<<<warp_blocks((long)T * H), 128, 0, st>>>(dq, dout, q, k, v, lse, work, seg_start, T,
                                                               H, Hkv, hd, scale);
    QRL_TRY(qrl_cuda_launch_status_("train attention backward (dq)", err));
    dkdv_simple_kernel<<<warp_blocks((long)T * Hkv), 128, 0, st>>>(dk, dv, dout, q, k, v, lse, work,
                                                                   seg_start, T, H, Hkv, hd, scale);
    return qrl_cuda_launch_status_("train attention backward (dk, dv)", err);
}
