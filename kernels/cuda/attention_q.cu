/* Attention over the quantized paged KV cache (kv_quant.cuh).  Flash-decoding as the BF16
 * kernel (attention.cu): the main-store positions of each row are split into chunks, one
 * thread block per (chunk, kv head, row) serving the GQA group's q heads; int4-protected
 * adds one split per row over its protected positions read from the INT8 side cache; a
 * merge kernel combines all splits by their maxima and sums of exponentials (the same
 * statistic qrl_attention_merge merges the CPU's two partials by).
 *
 * head_dim 64/128: each warp streams the raw records (codes + F32 fields) of its
 * 16-position tiles into shared-memory stages with cp.async (one record per lane), turns
 * the codes into F16 K and V tiles (swizzled as attention.cu's) and runs attention.cu's
 * mma.sync score and P·V steps on them, with the scales applied outside the MMA (below).
 * Other head dims: CUDA cores, 8 elements per lane dequantized in registers. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "cuda/attention_q_dev.cuh"
#include "cuda/launch.cuh"

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

/* Exact-code tiles: the raw codes become F16 values that equal the codes (int8 c, int4
 * n in 0..15, E4M3 values), the products run on mma.sync F16 with F32 accumulation, and
 * every F32 field is applied outside the MMA: K scales multiply the scores (int4: one
 * accumulator per 32-dim group, score = sum_g s_g (q_g . n_g) + z_g sum(q_g)); V scales
 * multiply P (int4: one P per group, plus the zero term sum_p P z_g in F32).  P * scale
 * is normalized by a running per-warp maximum of the scale (a power of the F16 range is
 * lost otherwise); the output is rescaled when that maximum grows, like the softmax max. */
static __device__ __forceinline__ void mma_top_h(float c[4], uint32_t a0, uint32_t a2, uint32_t b0,
                                                 uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void mma_full_h(float c[4], const uint32_t a[4], uint32_t b0,
                                                  uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t pack_h(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
    __half2 r = __hsub2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&r;
}
static __device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c) {
    __half2 r = __hfma2(*(__half2 *)&a, *(__half2 *)&b, *(__half2 *)&c);
    return *(uint32_t *)&r;
}

/* 8 codes (elements 8ch .. 8ch + 7 of a record) as 8 F16 values. */
template <int FMT>
static __device__ __forceinline__ uint4 codes_f16(const unsigned char *rec, int ch) {
    uint4 o;
    if (FMT == F_INT8) { /* f16 0x64uu = 1024 + u, u = c + 128 */
        uint2 u = *(const uint2 *)(rec + ch * 8);
        uint32_t x0 = u.x ^ 0x80808080u, x1 = u.y ^ 0x80808080u, m = 0x64806480u; /* 1152 */
        o.x = hsub2_u(__byte_perm(x0, 0x64646464u, 0x4140), m);
        o.y = hsub2_u(__byte_perm(x0, 0x64646464u, 0x4342), m);
        o.z = hsub2_u(__byte_perm(x1, 0x64646464u, 0x4140), m);
        o.w = hsub2_u(__byte_perm(x1, 0x64646464u, 0x4342), m);
    } else if (FMT == F_FP8) {
        uint2 u = *(const uint2 *)(rec + ch * 8);
        __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u.x & 0xFFFFu), __NV_E4M3);
        __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u.x >> 16), __NV_E4M3);
        __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u.y & 0xFFFFu), __NV_E4M3);
        __half2_raw h3 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u.y >> 16), __NV_E4M3);
        o.x = (uint32_t)h0.x | ((uint32_t)h0.y << 16);
        o.y = (uint32_t)h1.x | ((uint32_t)h1.y << 16);
        o.z = (uint32_t)h2.x | ((uint32_t)h2.y << 16);
        o.w = (uint32_t)h3.x | ((uint32_t)h3.y << 16);
    } else { /* byte b -> (1024 + lo, 1024 + 16 hi) -> (lo, hi) */
        uint32_t w = *(const uint32_t *)(rec + ch * 4);
        const uint32_t mul = 0x2C003C00u, sub = 0xD400E400u; /* (1, 1/16), (-1024, -64) */
        o.x = hfma2_u((__byte_perm(w, 0, 0x0000) & 0x00F0000Fu) | 0x64006400u, mul, sub);
        o.y = hfma2_u((__byte_perm(w, 0, 0x1111) & 0x00F0000Fu) | 0x64006400u, mul, sub);
        o.z = hfma2_u((__byte_perm(w, 0, 0x2222) & 0x00F0000Fu) | 0x64006400u, mul, sub);
        o.w = hfma2_u((__byte_perm(w, 0, 0x3333) & 0x00F0000Fu) | 0x64006400u, mul, sub);
    }
    return o;
}

template <int HD, int FMT, int STG>
static __global__ void __launch_bounds__(WARPS * 32, 2)
attnq_tc_kernel(qargs a, int region, float sl2, int chunk, int n_splits, int split_off, int bs_shift) {
    typedef tcq_geom<HD, FMT> GM;
    constexpr int CB = GM::CB, SF = GM::SF, RAW = GM::RAW, TILE = GM::TILE, KS = HD / 16;
    constexpr int NG = FMT == F_INT4 ? HD / 32 : 1; /* score accumulators / V scale groups */
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

    /* Q (scaled to the log2 domain) as F16 hi + lo in rows g and g + 8; per-group sums */
    uint32_t qa[KS][4];
    float qsum[NG];
    {
        const float *qp = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int k = 0; k < NG; k++) qsum[k] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int d = ks * 16 + h * 8 + 2 * t;
                float x0 = g < G ? qp[d] * sl2 : 0.0f, x1 = g < G ? qp[d + 1] * sl2 : 0.0f;
                __half2 hi = __floats2half2_rn(x0, x1);
                qa[ks][2 * h] = *(uint32_t *)&hi;
                qa[ks][2 * h + 1] = pack_h(x0 - __low2float(hi), x1 - __high2float(hi));
                if (FMT == F_INT4) qsum[(ks * 16) / 32] += x0 + x1;
            }
        if (FMT == F_INT4) /* the other dims of the group live in lanes t' != t */
#pragma unroll
            for (int k = 0; k < NG; k++) {
                qsum[k] += __shfl_xor_sync(0xffffffffu, qsum[k], 1);
                qsum[k] += __shfl_xor_sync(0xffffffffu, qsum[k], 2);
            }
    }

    auto issue = [&](int j) { /* lane: record (row lane % 16, K if lane < 16 else V) */
        if (j < my_tiles) {
            int i0 = start + (warp + j * WARPS) * TQ;
            unsigned char *st = raw + (j % STG) * RAW;
            int w = lane >> 4, row = lane & 15, i = i0 + row;
            bool ok = i < end;
            const uint8_t *cp;
            const float *sp;
            rec_ptr<FMT, HD>(a, m, table, seq, kvh, bs_shift, ok ? i : start, w, &cp, &sp);
            uint32_t dst = smem_u32(st + (w * TQ + row) * CB);
#pragma unroll
            for (int k = 0; k < CB / 16; k++) cp_async16(dst + k * 16, cp + k * 16, ok);
            float *sst = (float *)(st + 2 * TQ * CB);
            if (SF == 1) cp_async4(smem_u32(sst + w * TQ + row), sp, ok);
#pragma unroll
            for (int k = 0; SF > 1 && k < SF / 4; k++)
                cp_async16(smem_u32(sst + (w * TQ + row) * SF + 4 * k), sp + 4 * k, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    float o[HD / 8][4], mrun = -INFINITY, l = 0.0f, rv[NG], zacc[NG];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < NG; k++) rv[k] = 0.0f, zacc[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < STG - 1; j++) issue(j);
    for (int j = 0; j < my_tiles; j++) {
        issue(j + STG - 1);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STG - 1));
        __syncwarp();
        const unsigned char *st = raw + (j % STG) * RAW;
        const float *sst = (const float *)(st + 2 * TQ * CB);
#pragma unroll
        for (int k = 0; k < TQ * HD / 8 * 2 / 32; k++) { /* codes -> F16 tiles (swizzled) */
            int c = lane + 32 * k, w = c / (TQ * HD / 8), rem = c % (TQ * HD / 8);
            int row = rem / (HD / 8), ch = rem % (HD / 8);
            *(uint4 *)((w ? vt : kt) + row * HD + ((ch ^ (row & 7)) * 8)) =
                codes_f16<FMT>(st + (w * TQ + row) * CB, ch);
        }
        __syncwarp();
        float acc[NG][2][4];
#pragma unroll
        for (int k = 0; k < NG; k++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[k][0][i] = acc[k][1][i] = 0.0f;
        {
            int jj = lane >> 3, pos = (jj >> 1) * 8 + (lane & 7);
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                int ch = 2 * ks + (jj & 1), gq = FMT == F_INT4 ? ks / 2 : 0;
                uint32_t b[4];
                ldsm_x4(smem_u32(kt + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
                mma_full_h(acc[gq][0], qa[ks], b[0], b[1]);
                mma_full_h(acc[gq][1], qa[ks], b[2], b[3]);
            }
        }
        int p0 = start + (warp + j * WARPS) * TQ;
        const int pr[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t}; /* tile rows of sc[0..3] */
        float sc[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int nt = i >> 1, e = i & 1;
            if (FMT == F_INT4) {
                const float *ks_ = sst + pr[i] * SF;
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < NG; k++)
                    v += (acc[k][nt][e] + acc[k][nt][e + 2]) * ks_[k] + ks_[NG + k] * qsum[k];
                sc[i] = v;
            } else {
                float raw_s = acc[0][nt][e] + acc[0][nt][e + 2];
                sc[i] = raw_s * (FMT == F_INT8 ? sst[pr[i]] : fsk);
            }
            if (p0 + pr[i] >= end) sc[i] = -INFINITY;
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
        /* P times the V scale of its position, over the running maximum of that scale */
        uint32_t pa0[NG], pa2[NG];
        float fac[NG];
#pragma unroll
        for (int k = 0; k < NG; k++) {
            float vsc[4];
            if (FMT == F_FP8) {
                vsc[0] = vsc[1] = vsc[2] = vsc[3] = 1.0f;
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) vsc[i] = FMT == F_INT8 ? sst[TQ + pr[i]] : sst[(TQ + pr[i]) * SF + k];
            }
            float rn = rv[k];
            if (FMT != F_FP8) {
                float tm = fmaxf(fmaxf(vsc[0], vsc[1]), fmaxf(vsc[2], vsc[3]));
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
                tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
                rn = fmaxf(rn, tm);
            } else {
                rn = 1.0f;
            }
            fac[k] = cfac * (rn > 0.0f ? rv[k] / rn : 0.0f);
            if (FMT == F_FP8) fac[k] = cfac;
            float inv = rn > 0.0f ? 1.0f / rn : 0.0f;
            rv[k] = rn;
            pa0[k] = pack_h(p[0] * vsc[0] * inv, p[1] * vsc[1] * inv);
            pa2[k] = pack_h(p[2] * vsc[2] * inv, p[3] * vsc[3] * inv);
            if (FMT == F_INT4) {
                const float *zs = sst + NG;
                zacc[k] = zacc[k] * cfac + p[0] * zs[(TQ + pr[0]) * SF + k] + p[1] * zs[(TQ + pr[1]) * SF + k] +
                          p[2] * zs[(TQ + pr[2]) * SF + k] + p[3] * zs[(TQ + pr[3]) * SF + k];
            }
        }
        int jj = lane >> 3, pos = (jj & 1) * 8 + (lane & 7);
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
            int ch = n + (jj >> 1), k = FMT == F_INT4 ? (n * 8) / 32 : 0;
            uint32_t b[4];
            ldsm_x4_t(smem_u32(vt + pos * HD + ((ch ^ (pos & 7)) * 8)), b);
#pragma unroll
            for (int i = 0; i < 4; i++) o[n][i] *= fac[k], o[n + 1][i] *= fac[k];
            mma_top_h(o[n], pa0[k], pa2[k], b[0], b[1]);
            mma_top_h(o[n + 1], pa0[k], pa2[k], b[2], b[3]);
        }
        __syncwarp();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
#pragma unroll
    for (int k = 0; k < NG; k++) {
        zacc[k] += __shfl_xor_sync(0xffffffffu, zacc[k], 1);
        zacc[k] += __shfl_xor_sync(0xffffffffu, zacc[k], 2);
    }
    __syncthreads();
    float *sm_o = (float *)tq_sm;
    float *sm_ml = sm_o + WARPS * 8 * HD;
    if (g < G) {
        float *row = sm_o + (warp * 8 + g) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            int k = FMT == F_INT4 ? (n * 8) / 32 : 0;
            float f = FMT == F_FP8 ? fsv : rv[k], z = FMT == F_INT4 ? zacc[k] : 0.0f;
            row[n * 8 + 2 * t] = o[n][0] * f + z;
            row[n * 8 + 2 * t + 1] = o[n][1] * f + z;
        }
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

/* cp.async depth, QRL_ATTNQ_STAGES (2..5, A/B timing).  Default 2: measured on the H200
 * (docs/performance.md), 3-5 stages were slower at every replay shape (int8 late-stage
 * mean 0.89x bf16 at 2 stages, 0.82x at 3, 0.71-0.82x at 4; int4-protected 0.71x at 2,
 * 0.61x at 5): more shared memory per block costs resident warps, and bytes in flight
 * are not what bounds this kernel. */
template <int HD, int FMT>
static void launch_tcq(const qargs &a, dim3 grid, int region, float sl2, int chunk, int ns, int off,
                       int sh, cudaStream_t st) {
    switch (env_int("QRL_ATTNQ_STAGES", 2)) {
    case 4: launch_tcq_st<HD, FMT, 4>(a, grid, region, sl2, chunk, ns, off, sh, st); break;
    case 3: launch_tcq_st<HD, FMT, 3>(a, grid, region, sl2, chunk, ns, off, sh, st); break;
    case 5: launch_tcq_st<HD, FMT, 5>(a, grid, region, sl2, chunk, ns, off, sh, st); break;
    default: launch_tcq_st<HD, FMT, 2>(a, grid, region, sl2, chunk, ns, off, sh, st); break;
    }
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
    if (tc && env_int("QRL_ATTNQ_KERNEL", 2) == 2) { /* one launch, protected split included */
        int f = fmt == QRL_CUDA_KVQ_INT8 ? F_INT8 : fmt == QRL_CUDA_KVQ_FP8 ? F_FP8 : F_INT4;
        qrl_attnq_tc_launch(a, f, hd, dim3(total, c->n_kv_heads, n), sl2, chunk, total, sh, ns,
                            prot ? c->sink + c->recent : 0, st);
        QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) split", err));
        attnq_merge_kernel<<<dim3(n_heads, n), hd < 32 ? 32 : hd, 0, st>>>(a, hd, total);
        return qrl_cuda_launch_status_("attention (quantized kv) merge", err);
    }
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
