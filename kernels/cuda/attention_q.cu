/* Attention over the quantized paged KV cache (kv_quant.cuh).  Flash-decoding as the BF16
 * kernel (attention.cu): the main-store positions of each row are split into chunks, one
 * thread block per (chunk, kv head, row) serving the GQA group's q heads; int4-protected
 * adds one split per row over its protected positions read from the INT8 side cache; a
 * merge kernel combines all splits by their maxima and sums of exponentials (the same
 * statistic qrl_attention_merge merges the CPU's two partials by).
 *
 * head_dim 64/128: each warp streams the raw records (codes + F32 fields) of its
 * 16-position tiles into shared-memory stages with cp.async, dequantizes a tile into a BF16
 * K and V tile (swizzled as attention.cu's) and runs attention.cu's mma.sync score and P·V
 * steps on it.  Other head dims: CUDA cores, 8 elements per lane dequantized in registers. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "cuda/kv_quant_dev.cuh"
#include "cuda/launch.cuh"

#define WARPS 4
#define TILE_MIN 64
#define TQ 16 /* positions per tensor-core tile */

enum { F_INT8 = 0, F_FP8 = 1, F_INT4 = 2 };

typedef struct qargs {
    qrl_cuda_kvq_layer c;
    uint16_t *out;
    const float *q;
    const int32_t *row_seq, *row_pos;
    int n, n_heads;
    float *work;
} qargs;

/* Dequantize 8 consecutive elements [d0, d0 + 8) of one record. */
template <int FMT, int HD>
static __device__ __forceinline__ void deq8(const uint8_t *codes, const float *sc, float fs, int d0,
                                            float f[8]) {
    if (FMT == F_INT4) {
        uint32_t u = *(const uint32_t *)(codes + d0 / 2);
        int g = d0 / 32;
        float s = sc[g], z = sc[(HD + 31) / 32 + g];
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = fmaf(kvq_u4f(u, i), s, z);
    } else {
        uint2 u = *(const uint2 *)(codes + d0);
        float s = FMT == F_INT8 ? sc[0] : fs;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[i] = (FMT == F_INT8 ? kvq_i8f(u.x, i) : kvq_e4m3f(u.x, i)) * s;
            f[4 + i] = (FMT == F_INT8 ? kvq_i8f(u.y, i) : kvq_e4m3f(u.y, i)) * s;
        }
    }
}

/* Per block: the row's region (0 main, 1 protected), its length, and the position of its
 * i-th element. */
struct region_map {
    int a, b, len, region;
    __device__ int pos(int i) const { return region ? (i < a ? i : b + (i - a)) : a + i; }
};

static __device__ __forceinline__ region_map make_map(const qrl_cuda_kvq_layer &c, int n, int region) {
    region_map m;
    kvq_regions(c, n, &m.a, &m.b);
    m.region = region;
    m.len = region ? m.a + (n - m.b) : m.b - m.a;
    return m;
}

/* Record pointers of logical element i (K or V plane w). */
template <int FMT, int HD>
static __device__ __forceinline__ void rec_ptr(const qargs &a, const region_map &m, const int32_t *table,
                                               int seq, int kvh, int bs_shift, int i, int w,
                                               const uint8_t **codes, const float **sc) {
    int p = m.pos(i);
    if (m.region) {
        size_t s = kvq_side_rec(a.c, seq, kvq_side_slot(a.c, p), kvh);
        *codes = (const uint8_t *)a.c.side_codes[w] + s * HD;
        *sc = a.c.side_scales[w] + s;
    } else {
        constexpr int CB = FMT == F_INT4 ? HD / 2 : HD, SF = FMT == F_INT8 ? 1 : FMT == F_INT4 ? 2 * ((HD + 31) / 32) : 0;
        size_t r = kvq_rec(a.c, table, p, kvh, bs_shift);
        *codes = a.c.codes[w] + r * CB;
        *sc = SF ? a.c.scales[w] + r * SF : nullptr;
    }
}

/* Block result (already merged over its warps) into the split scratch. */
static __device__ __forceinline__ void put_split(const qargs &a, int r, int h, int split, int n_splits,
                                                 int hd, int d, float A, float M, float L) {
    size_t base = ((size_t)r * a.n_heads + h) * n_splits + split;
    a.work[base * hd + d] = A;
    if (d == 0) {
        float *ml = a.work + (size_t)a.n * a.n_heads * n_splits * hd;
        ml[2 * base] = M;
        ml[2 * base + 1] = L;
    }
}

/* ---- CUDA-core path (any head dim): LPR lanes per position, 8 dims each ------------- */
template <int HD, int FMT>
static __global__ void __launch_bounds__(WARPS * 32)
attnq_cc_kernel(qargs a, int region, float sl2, int chunk, int n_splits, int split_off, int bs_shift) {
    constexpr int LPR = HD / 8, PPW = 32 / LPR, SLOTS = WARPS * PPW, GT = 8;
    __shared__ float sm_m[SLOTS][GT], sm_l[SLOTS][GT];
    __shared__ float sm_acc[SLOTS][GT][HD + 1];
    int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    int H = a.n_heads, KVH = a.c.n_kv_heads, G = H / KVH;
    int seq = a.row_seq[r];
    region_map m = make_map(a.c, a.row_pos[r] + 1, region);
    int start = s * chunk, end = min(start + chunk, m.len);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane / LPR, part = lane % LPR;
    const int32_t *table = a.c.block_tables + (size_t)seq * a.c.max_blocks_per_seq;
    float fsk = 1.0f, fsv = 1.0f;
    if (FMT == F_FP8) {
        fsk = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2];
        fsv = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2 + 1];
    }
    float qv[GT][8], mx[GT], l[GT], acc[GT][8];
#pragma unroll
    for (int g = 0; g < GT; g++) {
        const float *qh = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            qv[g][i] = g < G ? qh[part * 8 + i] * sl2 : 0.0f;
            acc[g][i] = 0.0f;
        }
        mx[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (int base = start + warp * PPW; base < end; base += WARPS * PPW) {
        int i = base + sub;
        bool ok = i < end;
        float kf[8], vf[8], sc[GT];
        if (ok) {
            const uint8_t *kc, *vc;
            const float *ks, *vs;
            rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, i, 0, &kc, &ks);
            rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, i, 1, &vc, &vs);
            deq8<FMT, HD>(kc, ks, fsk, part * 8, kf);
            deq8<FMT, HD>(vc, vs, fsv, part * 8, vf);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) kf[e] = vf[e] = 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GT; g++) {
            float t = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) t = fmaf(qv[g][e], kf[e], t);
#pragma unroll
            for (int o = LPR / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            sc[g] = t;
        }
        if (ok) {
#pragma unroll
            for (int g = 0; g < GT; g++) {
                float pr = 1.0f;
                if (sc[g] > mx[g]) {
                    float cc = exp2f(mx[g] - sc[g]);
                    l[g] *= cc;
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[g][e] *= cc;
                    mx[g] = sc[g];
                } else {
                    pr = exp2f(sc[g] - mx[g]);
                }
                l[g] += pr;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] = fmaf(pr, vf[e], acc[g][e]);
            }
        }
    }
    int slot = warp * PPW + sub;
#pragma unroll
    for (int g = 0; g < GT; g++) {
        if (part == 0) sm_m[slot][g] = mx[g], sm_l[slot][g] = l[g];
#pragma unroll
        for (int e = 0; e < 8; e++) sm_acc[slot][g][part * 8 + e] = acc[g][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int g = idx / HD, d = idx % HD;
        float M = -INFINITY;
        for (int k = 0; k < SLOTS; k++) if (sm_l[k][g] > 0.0f) M = fmaxf(M, sm_m[k][g]);
        float A = 0.0f, L = 0.0f;
        for (int k = 0; k < SLOTS; k++) {
            float w = sm_l[k][g] > 0.0f ? exp2f(sm_m[k][g] - M) : 0.0f;
            A += sm_acc[k][g][d] * w;
            L += sm_l[k][g] * w;
        }
        put_split(a, r, kvh * G + g, s + split_off, n_splits, HD, d, A, M, L);
    }
}

/* ---- tensor-core path (head_dim 64 / 128) ------------------------------------------- */
static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 4 : 0));
}
static __device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void mma_top(float c[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void mma_full(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <int HD, int FMT>
struct tcq_geom {
    static constexpr int CB = FMT == F_INT4 ? HD / 2 : HD;                     /* code bytes */
    static constexpr int SF = FMT == F_INT8 ? 1 : FMT == F_INT4 ? HD / 16 : 0; /* F32 fields */
    static constexpr int RAW = 2 * TQ * CB + 2 * TQ * SF * 4;                  /* one stage */
    static constexpr int TILE = TQ * HD;                                       /* BF16 elems */
};

template <int HD, int FMT, int STG>
static size_t tcq_smem(void) {
    typedef tcq_geom<HD, FMT> G;
    size_t kv = (size_t)WARPS * (STG * G::RAW + 2 * G::TILE * 2);
    size_t mg = (size_t)WARPS * 8 * (HD + 2) * 4;
    return kv > mg ? kv : mg;
}

template <int HD, int FMT, int STG>
static __global__ void __launch_bounds__(WARPS * 32, 1)
attnq_tc_kernel(qargs a, int region, float sl2, int chunk, int n_splits, int split_off, int bs_shift) {
    typedef tcq_geom<HD, FMT> GM;
    constexpr int CB = GM::CB, SF = GM::SF, RAW = GM::RAW, TILE = GM::TILE, KS = HD / 16;
    extern __shared__ __align__(16) unsigned char tq_sm[];
    int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    int H = a.n_heads, KVH = a.c.n_kv_heads, G = H / KVH;
    int seq = a.row_seq[r];
    region_map m = make_map(a.c, a.row_pos[r] + 1, region);
    int start = s * chunk, end = min(start + chunk, m.len);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (start >= end) { /* an empty split: sum 0 */
        for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x)
            put_split(a, r, kvh * G + idx / HD, s + split_off, n_splits, HD, idx % HD, 0.0f,
                      -INFINITY, 0.0f);
        return;
    }
    unsigned char *raw = tq_sm + (size_t)warp * (STG * RAW + 2 * TILE * 2);
    uint16_t *kt = (uint16_t *)(raw + STG * RAW), *vt = kt + TILE;
    const int32_t *table = a.c.block_tables + (size_t)seq * a.c.max_blocks_per_seq;
    float fsk = 1.0f, fsv = 1.0f;
    if (FMT == F_FP8) {
        fsk = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2];
        fsv = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2 + 1];
    }
    int n_tiles = (end - start + TQ - 1) / TQ;
    int my_tiles = n_tiles > warp ? (n_tiles - warp + WARPS - 1) / WARPS : 0;

    uint32_t qh[KS][2], ql[KS][2];
    {
        const float *qp = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int d = ks * 16 + h * 8 + 2 * t;
                float x0 = g < G ? qp[d] * sl2 : 0.0f, x1 = g < G ? qp[d + 1] * sl2 : 0.0f;
                __nv_bfloat162 hi = __floats2bfloat162_rn(x0, x1);
                qh[ks][h] = *(uint32_t *)&hi;
                ql[ks][h] = pack_bf16(x0 - __low2float(hi), x1 - __high2float(hi));
            }
    }

    auto issue = [&](int j) { /* raw records of this warp's j-th tile into stage j % STG */
        if (j < my_tiles) {
            int i0 = start + (warp + j * WARPS) * TQ;
            unsigned char *st = raw + (j % STG) * RAW;
            constexpr int CPR = CB / 16; /* 16-byte chunks per record */
#pragma unroll
            for (int k = 0; k < TQ * CPR * 2 / 32; k++) {
                int c = lane + 32 * k, w = c / (TQ * CPR), rem = c % (TQ * CPR);
                int row = rem / CPR, ch = rem % CPR, i = i0 + row;
                bool ok = i < end;
                const uint8_t *cp;
                const float *sp;
                rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, ok ? i : start, w, &cp, &sp);
                cp_async16(smem_u32(st + (w * TQ + row) * CB + ch * 16), cp + ch * 16, ok);
            }
            float *sst = (float *)(st + 2 * TQ * CB);
            if (SF == 1) { /* int8: one scale per record, lanes 0-15 K, 16-31 V */
                int w = lane >> 4, row = lane & 15, i = i0 + row;
                bool ok = i < end;
                const uint8_t *cp;
                const float *sp;
                rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, ok ? i : start, w, &cp, &sp);
                cp_async4(smem_u32(sst + w * TQ + row), sp, ok);
            } else if (SF > 1) { /* int4: SF floats = SF/4 chunks per record */
                constexpr int SPR = SF > 4 ? SF / 4 : 1;
#pragma unroll
                for (int k = 0; k < TQ * SPR * 2 / 32; k++) {
                    int c = lane + 32 * k, w = c / (TQ * SPR), rem = c % (TQ * SPR);
                    int row = rem / SPR, ch = rem % SPR, i = i0 + row;
                    bool ok = i < end;
                    const uint8_t *cp;
                    const float *sp;
                    rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, ok ? i : start, w, &cp, &sp);
                    cp_async16(smem_u32(sst + (w * TQ + row) * SF + ch * 4), sp + ch * 4, ok);
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    float o[HD / 8][4], mrun = -INFINITY, l = 0.0f;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < STG - 1; j++) issue(j);
    for (int j = 0; j < my_tiles; j++) {
        issue(j + STG - 1);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STG - 1));
        __syncwarp();
        { /* dequantize the stage into the BF16 tiles (16-byte chunk ^ row % 8 swizzle) */
            const unsigned char *st = raw + (j % STG) * RAW;
            const float *sst = (const float *)(st + 2 * TQ * CB);
#pragma unroll
            for (int k = 0; k < TQ * HD / 8 * 2 / 32; k++) {
                int c = lane + 32 * k, w = c / (TQ * HD / 8), rem = c % (TQ * HD / 8);
                int row = rem / (HD / 8), ch = rem % (HD / 8);
                float f[8];
                deq8<FMT, HD>(st + (w * TQ + row) * CB, sst + (w * TQ + row) * SF,
                              w ? fsv : fsk, ch * 8, f);
                uint4 u = {pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]),
                           pack_bf16(f[6], f[7])};
                *(uint4 *)((w ? vt : kt) + row * HD + ((ch ^ (row & 7)) * 8)) = u;
            }
        }
        __syncwarp();
        float s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
        {
            int jj = lane >> 3, pos = (jj >> 1) * 8 + (lane & 7);
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                int ch = 2 * ks + (jj & 1);
                uint32_t b[4];
                ldsm_x4(smem_u32(kt + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
                const uint32_t qa[4] = {qh[ks][0], ql[ks][0], qh[ks][1], ql[ks][1]};
                mma_full(s0, qa, b[0], b[1]);
                mma_full(s1, qa, b[2], b[3]);
            }
        }
        int p0 = start + (warp + j * WARPS) * TQ;
        float sc[4] = {s0[0] + s0[2], s0[1] + s0[3], s1[0] + s1[2], s1[1] + s1[3]};
        if (p0 + TQ > end) {
            if (p0 + 2 * t >= end) sc[0] = -INFINITY;
            if (p0 + 2 * t + 1 >= end) sc[1] = -INFINITY;
            if (p0 + 8 + 2 * t >= end) sc[2] = -INFINITY;
            if (p0 + 9 + 2 * t >= end) sc[3] = -INFINITY;
        }
        float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(mrun, mx);
        float cfac = exp2f(mrun - mn);
        mrun = mn;
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = exp2f(sc[i] - mn);
        l = l * cfac + (p[0] + p[1]) + (p[2] + p[3]);
        uint32_t pa0 = pack_bf16(p[0], p[1]), pa2 = pack_bf16(p[2], p[3]);
        int jj = lane >> 3, pos = (jj & 1) * 8 + (lane & 7);
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
            int ch = n + (jj >> 1);
            uint32_t b[4];
            ldsm_x4_t(smem_u32(vt + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
#pragma unroll
            for (int i = 0; i < 4; i++) o[n][i] *= cfac, o[n + 1][i] *= cfac;
            mma_top(o[n], pa0, pa2, b[0], b[1]);
            mma_top(o[n + 1], pa0, pa2, b[2], b[3]);
        }
        __syncwarp();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads();
    float *sm_o = (float *)tq_sm;
    float *sm_ml = sm_o + WARPS * 8 * HD;
    if (g < G) {
        float *row = sm_o + (warp * 8 + g) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) row[n * 8 + 2 * t] = o[n][0], row[n * 8 + 2 * t + 1] = o[n][1];
        if (t == 0) sm_ml[(warp * 8 + g) * 2] = mrun, sm_ml[(warp * 8 + g) * 2 + 1] = l;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int gg = idx / HD, d = idx % HD;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; w++)
            if (sm_ml[(w * 8 + gg) * 2 + 1] > 0.0f) M = fmaxf(M, sm_ml[(w * 8 + gg) * 2]);
        float A = 0.0f, L = 0.0f;
        for (int w = 0; w < WARPS; w++) {
            float lw = sm_ml[(w * 8 + gg) * 2 + 1];
            float wt = lw > 0.0f ? exp2f(sm_ml[(w * 8 + gg) * 2] - M) : 0.0f;
            A += sm_o[(w * 8 + gg) * HD + d] * wt;
            L += lw * wt;
        }
        put_split(a, r, kvh * G + gg, s + split_off, n_splits, HD, d, A, M, L);
    }
}

/* Merge all splits of (row, head), skipping empty ones (sum 0). */
static __global__ void attnq_merge_kernel(qargs a, int hd, int n_splits) {
    int h = blockIdx.x, r = blockIdx.y, H = a.n_heads;
    size_t base = ((size_t)r * H + h) * n_splits;
    const float *ml = a.work + (size_t)a.n * H * n_splits * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++)
            if (ml[2 * (base + s) + 1] > 0.0f) M = fmaxf(M, ml[2 * (base + s)]);
        float A = 0.0f, L = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            float l = ml[2 * (base + s) + 1];
            if (!(l > 0.0f)) continue;
            float w = exp2f(ml[2 * (base + s)] - M);
            A += a.work[(base + s) * hd + d] * w;
            L += l * w;
        }
        a.out[(size_t)r * H * hd + (size_t)h * hd + d] = qrl_bf16_st_(L > 0.0f ? A / L : 0.0f);
    }
}

static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

static int sm_count(void) {
    static int n = 0;
    if (n == 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) n = 132;
    }
    return n;
}

static int round_tile(long c) { return (int)((c + TILE_MIN - 1) / TILE_MIN * TILE_MIN); }

/* As attention.cu's tc_splits: ~16 blocks per SM, >= 512-position chunks once the rows
 * alone fill the chip. */
static int splits_for(int max_len, long rows, int *chunk_out) {
    if (max_len < 1) max_len = 1;
    long want = (16L * sm_count() + rows - 1) / rows;
    long max_splits = (max_len + TILE_MIN - 1) / TILE_MIN;
    int ns = (int)(want < 1 ? 1 : want > max_splits ? max_splits : want);
    int chunk = round_tile((max_len + ns - 1) / ns);
    int cmin = env_int("QRL_ATTN_CHUNK_MIN", 512);
    if (rows >= sm_count() && chunk < cmin) {
        ns = max_len / cmin > 1 ? max_len / cmin : 1;
        chunk = round_tile((max_len + ns - 1) / ns);
    }
    *chunk_out = chunk;
    return (max_len + chunk - 1) / chunk;
}

size_t qrl_cuda_attention_q_work_floats(int n, int n_heads, int head_dim, int max_len) {
    size_t splits = ((size_t)max_len + TILE_MIN - 1) / TILE_MIN + 1;
    return (size_t)n * n_heads * splits * (head_dim + 2);
}

template <int HD, int FMT, int STG>
static void launch_tcq_st(const qargs &a, dim3 grid, int region, float sl2, int chunk, int ns,
                          int off, int sh, cudaStream_t st) {
    size_t bytes = tcq_smem<HD, FMT, STG>();
    static std::atomic<unsigned> done{0};
    int dev = 0;
    cudaGetDevice(&dev);
    unsigned bit = 1u << (dev & 31);
    if (!(done.load() & bit) &&
        cudaFuncSetAttribute(attnq_tc_kernel<HD, FMT, STG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes) == cudaSuccess)
        done.fetch_or(bit);
    attnq_tc_kernel<HD, FMT, STG><<<grid, WARPS * 32, bytes, st>>>(a, region, sl2, chunk, ns, off, sh);
}

/* QRL_ATTNQ_STAGES (2|3) selects the cp.async depth (A/B timing; default 3). */
template <int HD, int FMT>
static void launch_tcq(const qargs &a, dim3 grid, int region, float sl2, int chunk, int ns, int off,
                       int sh, cudaStream_t st) {
    if (env_int("QRL_ATTNQ_STAGES", 3) == 2)
        launch_tcq_st<HD, FMT, 2>(a, grid, region, sl2, chunk, ns, off, sh, st);
    else
        launch_tcq_st<HD, FMT, 3>(a, grid, region, sl2, chunk, ns, off, sh, st);
}

template <int FMT>
static void launch_fmt(const qargs &a, int hd, bool tc, dim3 grid, int region, float sl2, int chunk,
                       int ns, int off, int sh, cudaStream_t st) {
    if (tc && hd == 64) launch_tcq<64, FMT>(a, grid, region, sl2, chunk, ns, off, sh, st);
    else if (tc) launch_tcq<128, FMT>(a, grid, region, sl2, chunk, ns, off, sh, st);
    else switch (hd) {
    case 8: attnq_cc_kernel<8, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    case 16: attnq_cc_kernel<16, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    case 32: attnq_cc_kernel<32, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    case 64: attnq_cc_kernel<64, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    case 128: attnq_cc_kernel<128, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    default: attnq_cc_kernel<256, FMT><<<grid, WARPS * 32, 0, st>>>(a, region, sl2, chunk, ns, off, sh); break;
    }
}

qrl_status qrl_cuda_attention_q(const qrl_cuda_kvq_layer *c, uint16_t *out, const float *q,
                                const int32_t *row_seq, const int32_t *row_pos, int n,
                                int n_heads, float scale, int max_len, float *work,
                                size_t work_floats, void *stream, qrl_error *err) {
    int hd = c->head_dim, fmt = c->format;
    if (hd != 8 && hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "attention (quantized kv): head_dim %d (supported: 8, 16, 32, 64, 128, 256)", hd);
    if (qrl_cuda_kvq_code_bytes(fmt, hd) == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "attention: kv format %d", fmt);
    if (n <= 0 || n > 65535 || c->n_kv_heads <= 0 || n_heads % c->n_kv_heads || max_len <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention (quantized kv): n=%d heads=%d kv_heads=%d max_len=%d", n,
                             n_heads, c->n_kv_heads, max_len);
    if (n_heads / c->n_kv_heads > 8)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "attention: %d q heads per kv head (max 8)",
                             n_heads / c->n_kv_heads);
    bool prot = fmt == QRL_CUDA_KVQ_INT4_PROTECTED && c->sink + c->recent > 0;
    bool tc = (hd == 64 || hd == 128) && !env_int("QRL_ATTN_LEGACY", 0);
    int sh = -1;
    for (int k = 0; k < 31; k++) if (c->block_size == 1 << k) sh = k;
    int chunk, ns = splits_for(max_len, (long)n * c->n_kv_heads, &chunk);
    int total = ns + (prot ? 1 : 0);
    size_t need = (size_t)n * n_heads * total * (hd + 2);
    if (need > work_floats)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention (quantized kv): scratch of %zu floats, need %zu", work_floats, need);
    qargs a = {*c, out, q, row_seq, row_pos, n, n_heads, work};
    float sl2 = scale * 1.4426950408889634f;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(ns, c->n_kv_heads, n);
    if (fmt == QRL_CUDA_KVQ_INT8) launch_fmt<F_INT8>(a, hd, tc, grid, 0, sl2, chunk, total, 0, sh, st);
    else if (fmt == QRL_CUDA_KVQ_FP8) launch_fmt<F_FP8>(a, hd, tc, grid, 0, sl2, chunk, total, 0, sh, st);
    else launch_fmt<F_INT4>(a, hd, tc, grid, 0, sl2, chunk, total, 0, sh, st);
    QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) split", err));
    if (prot) { /* the protected positions (<= sink + recent): one split at INT8 */
        launch_fmt<F_INT8>(a, hd, tc, dim3(1, c->n_kv_heads, n), 1, sl2, c->sink + c->recent, total,
                           ns, sh, st);
        QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) protected split", err));
    }
    attnq_merge_kernel<<<dim3(n_heads, n), hd < 32 ? 32 : hd, 0, st>>>(a, hd, total);
    return qrl_cuda_launch_status_("attention (quantized kv) merge", err);
}
