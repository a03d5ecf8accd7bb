#include "cuda/attention.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "base/tuning.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"
#include "cuda/splits.cuh"

#define WARPS 4

static __device__ __forceinline__ void unpack8(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* LPR lanes share one position (8 dims = 16 bytes each), so a warp covers PPW positions
 * per step, and U steps are loaded before any is used (bytes in flight).  Scores are in
 * the log2 domain (scale * log2 e folded into q). */
template <int HD, int GT>
static __global__ void __launch_bounds__(WARPS * 32, GT > 4 ? 2 : HD <= 8 ? 4 : 3) /* no spills */
attn_split_kernel(qrl_cuda_attention_args a, float scale_log2, int chunk, int n_splits,
                  int bs_shift) {
    constexpr int LPR = HD / 8, PPW = 32 / LPR, U = 4, SLOTS = WARPS * PPW;
    __shared__ float sm_m[SLOTS][GT], sm_l[SLOTS][GT];
    __shared__ float sm_acc[SLOTS][GT][HD + 1];
    int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    int H = a.n_heads, KVH = a.n_kv_heads, G = H / KVH;
    int len = a.row_pos[r] + 1;
    int start = s * chunk;
    if (start >= len) return;
    int end = min(start + chunk, len);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane / LPR, part = lane % LPR;
    const int32_t *table = a.block_tables + (size_t)a.row_seq[r] * a.max_blocks_per_seq;
    size_t row_stride = (size_t)KVH * HD;
    float qv[GT][8], m[GT], l[GT], acc[GT][8];
#pragma unroll
    for (int g = 0; g < GT; g++) {
        const float *qh = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            qv[g][i] = g < G ? qh[part * 8 + i] * scale_log2 : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (int p0 = start + warp * PPW * U; p0 < end; p0 += WARPS * PPW * U) {
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + u * PPW + sub;
            if (p < end) {
                /* power-of-two block sizes (the usual 16) avoid an integer division */
                int bi = bs_shift >= 0 ? p >> bs_shift : p / a.block_size;
                int bo = bs_shift >= 0 ? p & (a.block_size - 1) : p % a.block_size;
                size_t off = ((size_t)table[bi] * a.block_size + bo) * row_stride +
                             (size_t)kvh * HD + part * 8;
                kr[u] = *(const uint4 *)(a.k_cache + off);
                vr[u] = *(const uint4 *)(a.v_cache + off);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            bool ok = p0 + u * PPW + sub < end;
            float kf[8], vf[8], sc[GT];
            unpack8(kr[u], kf);
#pragma unroll
            for (int g = 0; g < GT; g++) {
                float t = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) t = fmaf(qv[g][i], kf[i], t);
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                sc[g] = t;
            }
            if (ok) {
                unpack8(vr[u], vf);
#pragma unroll
                for (int g = 0; g < GT; g++) {
                    /* rescale only when the running max grows (rare after the first
                     * positions): one exponential per position instead of two */
                    float pr = 1.0f;
                    if (sc[g] > m[g]) {
                        float c = exp2f(m[g] - sc[g]);
                        l[g] *= c;
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[g][i] *= c;
                        m[g] = sc[g];
                    } else {
                        pr = exp2f(sc[g] - m[g]);
                    }
                    l[g] += pr;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[g][i] = fmaf(pr, vf[i], acc[g][i]);
                }
            }
        }
    }
    int slot = warp * PPW + sub;
#pragma unroll
    for (int g = 0; g < GT; g++) {
        if (part == 0) sm_m[slot][g] = m[g], sm_l[slot][g] = l[g];
#pragma unroll
        for (int i = 0; i < 8; i++) sm_acc[slot][g][part * 8 + i] = acc[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int g = idx / HD, d = idx % HD;
        float M = -INFINITY;
        for (int k = 0; k < SLOTS; k++) M = fmaxf(M, sm_m[k][g]);
        float A = 0.0f, L = 0.0f;
        for (int k = 0; k < SLOTS; k++) {
            float w = sm_l[k][g] > 0.0f ? exp2f(sm_m[k][g] - M) : 0.0f;
            A += sm_acc[k][g][d] * w;
            L += sm_l[k][g] * w;
        }
        size_t base = ((size_t)r * H + kvh * G + g) * n_splits + s;
        a.work[base * HD + d] = A;
        if (d == 0) {
            float *ml = a.work + (size_t)a.n * H * n_splits * HD;
            ml[2 * base] = M;
            ml[2 * base + 1] = L;
        }
    }
}

/* ---- tensor-core path (head_dim 64 or 128): K/V tiles through shared memory ------------
 * Each warp owns tiles of TC_T = 16 positions (interleaved over the block's chunk) and
 * runs its own cp.async pipeline TC_STAGES deep, so K/V bytes stay in flight while it
 * computes.  Scores S[g][p] = Q·K^T and O += P·V use mma.sync m16n8k16 (BF16 in, F32
 * accumulate) with the GQA group's heads on the M rows (G <= 8 of 16; rows 8..15 are
 * zero): one max/rescale per tile and one exp2 per score.  Q is split into BF16 hi + lo
 * parts (two MMAs) so the scores keep ~F32 accuracy; P is rounded to BF16 as in
 * FlashAttention.  Shared rows are 16-byte-chunk swizzled (chunk ^ row%8) so the
 * ldmatrix reads are conflict-free. */
#define TC_T 16

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* V (variant, A/B timing): 0 = Q lo in separate MMAs; 1 = Q lo in rows 8..15 of the same
 * MMA (scores = rows g + rows g+8: half the score MMAs); 2 = 1 with 3 blocks/SM forced (4
 * spilled). */
template <int HD, int TC_STAGES, int V>
static __global__ void __launch_bounds__(WARPS * 32, V == 2 ? 3 : 1)
attn_tc_kernel(qrl_cuda_attention_args a, float scale_log2, int chunk, int n_splits,
               int bs_shift) {
    constexpr int CPR = HD / 8, KS = HD / 16, TILE_ELEMS = TC_T * HD;
    extern __shared__ __align__(16) uint16_t tc_sm[];
    int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    int H = a.n_heads, KVH = a.n_kv_heads, G = H / KVH;
    int len = a.row_pos[r] + 1;
    int start = s * chunk;
    if (start >= len) return;
    int end = min(start + chunk, len);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint16_t *kbuf = tc_sm + (size_t)warp * TC_STAGES * 2 * TILE_ELEMS;
    uint16_t *vbuf = kbuf + TC_STAGES * TILE_ELEMS;
    const int32_t *table = a.block_tables + (size_t)a.row_seq[r] * a.max_blocks_per_seq;
    size_t row_stride = (size_t)KVH * HD;
    int n_tiles = (end - start + TC_T - 1) / TC_T;
    int my_tiles = n_tiles > warp ? (n_tiles - warp + WARPS - 1) / WARPS : 0;

    /* Q fragments (A operand, row g = head of the group, zero beyond G): hi + lo parts */
    uint32_t qh[KS][2], ql[KS][2];
    {
        const float *qp = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int d = ks * 16 + h * 8 + 2 * t;
                float x0 = g < G ? qp[d] * scale_log2 : 0.0f, x1 = g < G ? qp[d + 1] * scale_log2 : 0.0f;
                __nv_bfloat162 hi = __floats2bfloat162_rn(x0, x1);
                qh[ks][h] = *(uint32_t *)&hi;
                ql[ks][h] = pack_bf16(x0 - __low2float(hi), x1 - __high2float(hi));
            }
    }

    auto issue = [&](int j) { /* j-th tile of this warp into stage j % TC_STAGES */
        if (j < my_tiles) {
            int p0 = start + (warp + j * WARPS) * TC_T;
            uint32_t kd = qrl_smem_u32(kbuf + (j % TC_STAGES) * TILE_ELEMS);
            uint32_t vd = qrl_smem_u32(vbuf + (j % TC_STAGES) * TILE_ELEMS);
#pragma unroll
            for (int i = 0; i < TC_T * CPR / 32; i++) {
                int c = lane + 32 * i, row = c / CPR, ch = c % CPR, p = p0 + row;
                bool ok = p < end;
                int pp = ok ? p : start;
                int bi = bs_shift >= 0 ? pp >> bs_shift : pp / a.block_size;
                int bo = bs_shift >= 0 ? pp & (a.block_size - 1) : pp % a.block_size;
                size_t off = ((size_t)table[bi] * a.block_size + bo) * row_stride +
                             (size_t)kvh * HD + ch * 8;
                uint32_t so = (uint32_t)(row * HD + ((ch ^ (row & 7)) * 8)) * 2;
                qrl_cp_async16(kd + so, a.k_cache + off, ok);
                qrl_cp_async16(vd + so, a.v_cache + off, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    float o[HD / 8][4], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < TC_STAGES - 1; j++) issue(j);
    for (int j = 0; j < my_tiles; j++) {
        issue(j + TC_STAGES - 1);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(TC_STAGES - 1));
        __syncwarp();
        const uint16_t *ks_ = kbuf + (j % TC_STAGES) * TILE_ELEMS;
        const uint16_t *vs_ = vbuf + (j % TC_STAGES) * TILE_ELEMS;
        float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
        {
            int jj = lane >> 3, pos = (jj >> 1) * 8 + (lane & 7);
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                int ch = 2 * ks + (jj & 1);
                uint32_t b[4];
                qrl_ldsm_x4(qrl_smem_u32(ks_ + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
                if (V == 0) {
                    qrl_mma_bf16_top(s0, qh[ks][0], qh[ks][1], b[0], b[1]);
                    qrl_mma_bf16_top(s1, qh[ks][0], qh[ks][1], b[2], b[3]);
                    qrl_mma_bf16_top(s0, ql[ks][0], ql[ks][1], b[0], b[1]);
                    qrl_mma_bf16_top(s1, ql[ks][0], ql[ks][1], b[2], b[3]);
                } else {
                    const uint32_t qa[4] = {qh[ks][0], ql[ks][0], qh[ks][1], ql[ks][1]};
                    qrl_mma_bf16(s0, qa, b[0], b[1]);
                    qrl_mma_bf16(s1, qa, b[2], b[3]);
                }
            }
        }
        int p0 = start + (warp + j * WARPS) * TC_T;
        float sc[4] = {s0[0], s0[1], s1[0], s1[1]};
        if (V != 0) sc[0] += s0[2], sc[1] += s0[3], sc[2] += s1[2], sc[3] += s1[3];
        if (p0 + TC_T > end) {
            if (p0 + 2 * t >= end) sc[0] = -INFINITY;
            if (p0 + 2 * t + 1 >= end) sc[1] = -INFINITY;
            if (p0 + 8 + 2 * t >= end) sc[2] = -INFINITY;
            if (p0 + 9 + 2 * t >= end) sc[3] = -INFINITY;
        }
        float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(m, mx); /* finite: every tile holds a valid position */
        float c = exp2f(m - mn);
        m = mn;
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = exp2f(sc[i] - mn);
        l = l * c + (p[0] + p[1]) + (p[2] + p[3]);
        uint32_t pa0 = pack_bf16(p[0], p[1]), pa2 = pack_bf16(p[2], p[3]);
        int jj = lane >> 3, pos = (jj & 1) * 8 + (lane & 7);
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
            int ch = n + (jj >> 1);
            uint32_t b[4];
            qrl_ldsm_x4_t(qrl_smem_u32(vs_ + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
#pragma unroll
            for (int i = 0; i < 4; i++) o[n][i] *= c, o[n + 1][i] *= c;
            qrl_mma_bf16_top(o[n], pa0, pa2, b[0], b[1]);
            qrl_mma_bf16_top(o[n + 1], pa0, pa2, b[2], b[3]);
        }
        __syncwarp();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads(); /* the stage buffers become the merge area */
    float *sm_o = (float *)tc_sm;                 /* [WARPS][8][HD] */
    float *sm_ml = sm_o + WARPS * 8 * HD;         /* [WARPS][8][2] */
    if (g < G) {
        float *row = sm_o + (warp * 8 + g) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) row[n * 8 + 2 * t] = o[n][0], row[n * 8 + 2 * t + 1] = o[n][1];
        if (t == 0) sm_ml[(warp * 8 + g) * 2] = m, sm_ml[(warp * 8 + g) * 2 + 1] = l;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int gg = idx / HD, d = idx % HD;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm_ml[(w * 8 + gg) * 2]);
        float A = 0.0f, L = 0.0f;
        for (int w = 0; w < WARPS; w++) {
            float lw = sm_ml[(w * 8 + gg) * 2 + 1];
            float wt = lw > 0.0f ? exp2f(sm_ml[(w * 8 + gg) * 2] - M) : 0.0f;
            A += sm_o[(w * 8 + gg) * HD + d] * wt;
            L += lw * wt;
        }
        size_t base = ((size_t)r * H + kvh * G + gg) * n_splits + s;
        a.work[base * HD + d] = A;
        if (d == 0) {
            float *ml = a.work + (size_t)a.n * H * n_splits * HD;
            ml[2 * base] = M;
            ml[2 * base + 1] = L;
        }
    }
}

template <int HD, int STG, int V>
static void launch_tc_st(const qrl_cuda_attention_args *a, dim3 grid, float sl2, int chunk,
                         int ns, int sh, cudaStream_t st) {
    size_t kv = (size_t)WARPS * STG * 2 * TC_T * HD * 2;
    size_t mg = (size_t)WARPS * 8 * (HD + 2) * 4;
    size_t bytes = kv > mg ? kv : mg;
    /* > 48 KB of dynamic shared memory needs the attribute, once per device */
    static std::atomic<unsigned> done{0};
    int dev = 0;
    cudaGetDevice(&dev);
    unsigned bit = 1u << (dev & 31);
    if (!(done.load() & bit)) {
        if (cudaFuncSetAttribute(attn_tc_kernel<HD, STG, V>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess)
            done.fetch_or(bit);
    }
    attn_tc_kernel<HD, STG, V><<<grid, WARPS * 32, bytes, st>>>(*a, sl2, chunk, ns, sh);
}


/* Defaults from bench/attn.c on the H200; QRL_ATTN_STAGES (2|3) and QRL_ATTN_VARIANT (0|1|2)
 * select the others for A/B timing. */
template <int HD>
static void launch_tc(const qrl_cuda_attention_args *a, dim3 grid, float sl2, int chunk, int ns,
                      int sh, cudaStream_t st) {
    int stages = qrl_tuning_int(QRL_TUNING_ATTN_STAGES), v = qrl_tuning_int(QRL_TUNING_ATTN_VARIANT);
    if (stages == 3) {
        if (v == 0) launch_tc_st<HD, 3, 0>(a, grid, sl2, chunk, ns, sh, st);
        else if (v == 2) launch_tc_st<HD, 3, 2>(a, grid, sl2, chunk, ns, sh, st);
        else launch_tc_st<HD, 3, 1>(a, grid, sl2, chunk, ns, sh, st);
    } else {
        if (v == 0) launch_tc_st<HD, 2, 0>(a, grid, sl2, chunk, ns, sh, st);
        else if (v == 2) launch_tc_st<HD, 2, 2>(a, grid, sl2, chunk, ns, sh, st);
        else launch_tc_st<HD, 2, 1>(a, grid, sl2, chunk, ns, sh, st);
    }
}

static __global__ void attn_merge_kernel(qrl_cuda_attention_args a, int chunk, int n_splits) {
    int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x, HD = a.head_dim, H = a.n_heads;
    int ns = (a.row_pos[r] + chunk) / chunk; /* chunks holding positions [0, row_pos] */
    size_t base = ((size_t)r * H + h) * n_splits;
    const float *ml = a.work + (size_t)a.n * H * n_splits * HD;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, ml[2 * (base + s)]);
    float A = 0.0f, L = 0.0f;
    for (int s = 0; s < ns; s++) {
        float w = exp2f(ml[2 * (base + s)] - M);
        A += a.work[(base + s) * HD + d] * w;
        L += ml[2 * (base + s) + 1] * w;
    }
    a.out[(size_t)r * H * HD + (size_t)h * HD + d] = qrl_bf16_st_(A / L);
}

size_t qrl_cuda_attention_work_floats(int n, int n_heads, int head_dim, int max_len) {
    size_t splits = ((size_t)max_len + TILE_MIN - 1) / TILE_MIN;
    return (size_t)n * n_heads * splits * (head_dim + 2);
}

template <int HD>
static void launch_hd(const qrl_cuda_attention_args *a, int gt, dim3 grid, float sl2, int chunk,
                      int ns, cudaStream_t st) {
    int sh = -1;
    for (int k = 0; k < 31; k++) if (a->block_size == 1 << k) sh = k;
    switch (gt) {
    case 1: attn_split_kernel<HD, 1><<<grid, WARPS * 32, 0, st>>>(*a, sl2, chunk, ns, sh); break;
    case 2: attn_split_kernel<HD, 2><<<grid, WARPS * 32, 0, st>>>(*a, sl2, chunk, ns, sh); break;
    case 4: attn_split_kernel<HD, 4><<<grid, WARPS * 32, 0, st>>>(*a, sl2, chunk, ns, sh); break;
    default: attn_split_kernel<HD, 8><<<grid, WARPS * 32, 0, st>>>(*a, sl2, chunk, ns, sh); break;
    }
}

/* The attn_legacy tuning knob (QRL_ATTN_LEGACY=1) selects the CUDA-core kernel for every
 * head_dim (A/B timing; read on each call so one benchmark process can time both). */
static bool legacy_path(void) { return qrl_tuning_bool(QRL_TUNING_ATTN_LEGACY); }


qrl_status qrl_cuda_attention(const qrl_cuda_attention_args *a, void *stream, qrl_error *err) {
    int hd = a->head_dim;
    if (hd != 8 && hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "attention: head_dim %d (supported: 8, 16, 32, 64, 128, 256)", hd);
    if (a->n <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->max_len <= 0 ||
        a->n > 65535)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention: n=%d heads=%d kv_heads=%d max_len=%d", a->n, a->n_heads,
                             a->n_kv_heads, a->max_len);
    int G = a->n_heads / a->n_kv_heads;
    if (G > 8)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "attention: %d q heads per kv head (max 8)", G);
    int gt = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
    bool tc = (hd == 64 || hd == 128) && !legacy_path();
    int sh = -1;
    for (int k = 0; k < 31; k++) if (a->block_size == 1 << k) sh = k;
    long rows = (long)a->n * a->n_kv_heads;
    int chunk, ns = tc ? tc_splits(a->max_len, rows, &chunk) : 0;
    if (!tc) { /* enough blocks for ~8 per multiprocessor, chunks of whole tiles */
        long want = (8L * sm_count() + rows - 1) / rows;
        long max_splits = (a->max_len + TILE_MIN - 1) / TILE_MIN;
        ns = (int)(want < 1 ? 1 : want > max_splits ? max_splits : want);
        chunk = round_tile((a->max_len + ns - 1) / ns);
        ns = (a->max_len + chunk - 1) / chunk;
    }
    size_t need = (size_t)a->n * a->n_heads * ns * (hd + 2);
    if (need > a->work_floats)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention: scratch of %zu floats, need %zu", a->work_floats, need);
    float sl2 = a->scale * 1.4426950408889634f;
    dim3 grid(ns, a->n_kv_heads, a->n);
    cudaStream_t st = (cudaStream_t)stream;
    if (tc && hd == 64) launch_tc<64>(a, grid, sl2, chunk, ns, sh, st);
    else if (tc) launch_tc<128>(a, grid, sl2, chunk, ns, sh, st);
    else switch (hd) {
    case 8: launch_hd<8>(a, gt, grid, sl2, chunk, ns, st); break;
    case 16: launch_hd<16>(a, gt, grid, sl2, chunk, ns, st); break;
    case 32: launch_hd<32>(a, gt, grid, sl2, chunk, ns, st); break;
    case 64: launch_hd<64>(a, gt, grid, sl2, chunk, ns, st); break;
    case 128: launch_hd<128>(a, gt, grid, sl2, chunk, ns, st); break;
    default: launch_hd<256>(a, gt, grid, sl2, chunk, ns, st); break;
    }
    QRL_TRY(qrl_cuda_launch_status_("attention split", err));
    attn_merge_kernel<<<dim3(a->n_heads, a->n), hd, 0, st>>>(*a, chunk, ns);
    return qrl_cuda_launch_status_("attention merge", err);
}
