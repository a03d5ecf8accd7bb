/* Tensor-core attention over the quantized paged KV cache (head_dim 64 / 128), one split of
 * flash-decoding: a block of 4 warps per (chunk, kv head, row) serves the GQA group's q
 * heads; each warp streams 16-position tiles of raw records (codes + F32 fields) into
 * shared-memory stages with cp.async and reads them straight into mma.sync F16 fragments,
 * with no dequantized tile written back to shared memory and no ldmatrix.  Two
 * permutations make that possible (a dot product does not care in which order its k terms
 * come, as long as both operands use the same order):
 *   scores S = Q K^T (A = Q, B = K): the 16 k slots of step j held by lane (g, t) are the
 *     head dims [KB t + 4j, KB t + 4j + 4), KB = head_dim / 4, so a lane's K operand is a
 *     contiguous run of its position's record;  n slot g of the two 8-position n-tiles is
 *     tile position pi(nt, g) = 4 (g / 2) + 2 nt + g % 2, which gives lane (g, t) the
 *     scores of positions 4t .. 4t + 3;
 *   output O^T = V^T P^T (A = V^T, B = P^T): P's B fragment is the score fragment as it
 *     stands (k slots 2t, 2t + 1, 2t + 8, 2t + 9 = positions 4t .. 4t + 3); m slot g (g + 8)
 *     of m-tile mt is head dim VB g + 2 mt (+ 1), VB = head_dim / 8, so lane (g, t) reads
 *     VB contiguous dims of positions 4t .. 4t + 3 and interleaves them in registers.
 * Formats: int8 K enters as exact codes biased by 1152 (f16 0x64uu trick, no subtraction:
 * the bias times sum(q) is taken off the score) with the token-head scale on the score;
 * int8 V as exact codes times its scale in F16; fp8 K/V as exact E4M3 values, the head
 * scales applied to the score and the output; int4 K/V dequantized to F16 (n s + z; a
 * lane's dims lie in one 32-dim group).  Q is F16 hi + lo (rows g and g + 8 of A). */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "cuda/attention_q_dev.cuh"
#include "base/tuning.h"
#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

template <int HD, int FMT>
struct tc_geom {
    static constexpr int CB = kvq_geom<HD, FMT>::CB;      /* code bytes per record */
    static constexpr int NG = (HD + 31) / 32;             /* int4 groups */
    static constexpr int SF = kvq_geom<HD, FMT>::SF;      /* F32 fields per record */
    static constexpr int NCH = CB / 16;                   /* 16-byte chunks per record */
    static constexpr int RAW = 2 * TQ * CB + 2 * TQ * SF * 4; /* one stage: K, V codes, fields */
    static constexpr int NBK = CB == HD / 2 ? HD / 8 : HD / 4;  /* K bytes per lane */
    static constexpr int NBV = CB == HD / 2 ? HD / 16 : HD / 8; /* V bytes per lane */
};

/* 16-byte chunk swizzle of a stage row: makes the K reads (rows pi(nt, 2i), pi(nt, 2i + 1),
 * chunks by t) and the V reads (rows 4t + p, chunk by g) conflict-free for 8-chunk rows. */
template <int NCH>
static __device__ __forceinline__ int swz(int row) {
    return NCH >= 8 ? ((((row >> 2) & 3) << 1) | (row & 1)) : NCH == 4 ? ((row >> 2) & 3) : 0;
}

/* NB bytes at byte offset boff of stage row `row` (never crossing a 16-byte chunk when
 * NB < 16) as NB / 4 words. */
template <int NCH, int NB>
static __device__ __forceinline__ void lds_row(const unsigned char *rowp, int row, int boff,
                                               uint32_t *w) {
    if (NB >= 16) {
#pragma unroll
        for (int c = 0; c < NB / 16; c++) {
            uint4 v = *(const uint4 *)(rowp + ((((boff >> 4) + c) ^ swz<NCH>(row)) << 4));
            w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
    } else {
        const unsigned char *p = rowp + (((boff >> 4) ^ swz<NCH>(row)) << 4) + (boff & 15);
        if (NB == 8) {
            uint2 v = *(const uint2 *)p;
            w[0] = v.x, w[1] = v.y;
        } else {
            w[0] = *(const uint32_t *)p;
        }
    }
}

static __device__ __forceinline__ uint32_t e4m3x2_h2(uint32_t x16) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x16 & 0xFFFFu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* Byte b of an int4 word as half2 (low nibble, high nibble), exact. */
static __device__ __forceinline__ uint32_t u4_pair(uint32_t w, int b) {
    const uint32_t mul = 0x2C003C00u, sub = 0xD400E400u; /* (1, 1/16), (-1024, -64) */
    return qrl_hfma2((__byte_perm(w, 0, 0x1111u * (uint32_t)b) & 0x00F0000Fu) | 0x64006400u, mul, sub);
}

static __device__ __forceinline__ uint32_t h2_bits(float lo, float hi) { return qrl_pack_h2(lo, hi); }

/* Two E2M1 codes as an exact half2: sel holds the low code's magnitude bits (3) at bits
 * [4, 7) and the high code's at [12, 15), sign their sign bits at 15 and 31.  The f16 of an
 * E2M1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6} has a zero low byte and the high byte
 * {00, 38, 3C, 3E, 40, 42, 44, 46}: one byte permute from that table (selector nibbles 0
 * and 2 pick table byte 0 = the zero low bytes). */
static __device__ __forceinline__ uint32_t e2m1x2_h2(uint32_t sel, uint32_t sign) {
    return __byte_perm(0x3E3C3800u, 0x46444240u, sel) | sign;
}
/* E2M1 codes at nibbles 0, 1 (n = 0) or 2, 3 (n = 1) of u, element order kept. */
static __device__ __forceinline__ uint32_t e2m1_pair(uint32_t u, int n) {
    return n == 0 ? e2m1x2_h2(((u & 0x7u) << 4) | ((u & 0x70u) << 8), ((u & 0x8u) << 12) | ((u & 0x80u) << 24))
                  : e2m1x2_h2(((u & 0x700u) >> 4) | (u & 0x7000u), ((u & 0x800u) << 4) | ((u & 0x8000u) << 16));
}
/* E4M3 bytes a (low half) and b as an exact half2. */
static __device__ __forceinline__ uint32_t e4m3_pair(uint32_t a, uint32_t b) {
    return qrl_e4m3x2_lo(a | (b << 8));
}

/* 2^x on the SFU alone (2 ulp; -inf -> 0): exp2f adds a denormal-range fix-up per call. */
static __device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* One split: chunk s of the row's `region` positions into scratch split s + split_off. */
template <int HD, int FMT, int STG, int DQ>
static __device__ __forceinline__ void tc_split(const qargs &a, int region, float sl2, int chunk,
                                                int n_splits, int s, int split_off, int bs_shift) {
    typedef tc_geom<HD, FMT> GM;
    constexpr int CB = GM::CB, SF = GM::SF, NG = GM::NG, NCH = GM::NCH, RAW = GM::RAW;
    constexpr int NBK = GM::NBK, NBV = GM::NBV, KS = HD / 16, KB = HD / 4, VB = HD / 8;
    const uint32_t M64 = 0x64646464u, B1152 = 0x64806480u; /* f16 1152 twice */
    extern __shared__ __align__(16) unsigned char tq_sm[];
    int kvh = blockIdx.y, r = blockIdx.z;
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
    unsigned char *stg = tq_sm + (size_t)warp * STG * RAW;
    const int32_t *table = a.c.block_tables + (size_t)seq * a.c.max_blocks_per_seq;
    float fsk = 1.0f, fsv = 1.0f;
    if (FMT == F_FP8) {
        fsk = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2];
        fsv = a.c.fp8_scale[((size_t)seq * KVH + kvh) * 2 + 1];
    }
    int n_tiles = (end - start + TQ - 1) / TQ;
    int my_tiles = n_tiles > warp ? (n_tiles - warp + WARPS - 1) / WARPS : 0;

    /* Q (log2 domain) as A fragments in the permuted k order: hi in row g, lo in row g + 8 */
    uint32_t qa[KS][4];
    float qsum = 0.0f; /* int8: sum of the F16 hi + lo values (the 1152 bias's weight) */
    {
        const float *qp = a.q + (size_t)r * H * HD + (size_t)(kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
        for (int j = 0; j < KS; j++) {
            /* k slots (2t, 2t + 1 | 2t + 8, 2t + 9) of step j: dims d + (0, 1 | 2, 3); int4
             * with the nibble decoder (DQ): d + (o, o + 4 | o + 1, o + 5), d = KB t + 8 (j / 2),
             * o = 2 (j % 2), the order in which a word's nibbles come out (K loop below) */
            int d = KB * t + 4 * j;
            int dd[4] = {d, d + 1, d + 2, d + 3};
            if (FMT == F_INT4 && DQ) {
                int b = KB * t + 8 * (j >> 1) + 2 * (j & 1);
                dd[0] = b, dd[1] = b + 4, dd[2] = b + 1, dd[3] = b + 5;
            }
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; e++) x[e] = g < G ? qp[dd[e]] * sl2 : 0.0f;
            __half2 h01 = __floats2half2_rn(x[0], x[1]), h23 = __floats2half2_rn(x[2], x[3]);
            __half2 l01 = __floats2half2_rn(x[0] - __low2float(h01), x[1] - __high2float(h01));
            __half2 l23 = __floats2half2_rn(x[2] - __low2float(h23), x[3] - __high2float(h23));
            qa[j][0] = *(uint32_t *)&h01, qa[j][1] = *(uint32_t *)&l01;
            qa[j][2] = *(uint32_t *)&h23, qa[j][3] = *(uint32_t *)&l23;
            if (FMT == F_INT8)
                qsum += (__low2float(h01) + __high2float(h01)) + (__low2float(h23) + __high2float(h23)) +
                        (__low2float(l01) + __high2float(l01)) + (__low2float(l23) + __high2float(l23));
        }
        if (FMT == F_INT8) {
            qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
            qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
        }
    }

    /* Tile copies are coalesced: each cp.async instruction moves 32 / NCH whole records
     * (consecutive lanes, consecutive 16-byte chunks).  Lane l looks up the block-table
     * entry of tile row l % 16 one tile ahead; the others get it by shuffle. */
    int crow = lane & 15;
    auto tab = [&](int j) -> int {
        if (region || j >= my_tiles) return 0;
        int i = start + (warp + j * WARPS) * TQ + crow;
        int p = m.pos(i < end ? i : start);
        return table[bs_shift >= 0 ? p >> bs_shift : p / a.c.block_size];
    };
    /* record index of tile row `row` (main store or side cache); ok: the row is in range */
    auto rec_of = [&](int i0, int row, int tbr, bool *ok) -> size_t {
        int i = i0 + row;
        *ok = i < end;
        int p = m.pos(*ok ? i : start);
        if (region) return kvq_side_rec(a.c, seq, kvq_side_slot(a.c, p), kvh);
        int bo = bs_shift >= 0 ? p & (a.c.block_size - 1) : p % a.c.block_size;
        return ((size_t)tbr * KVH + kvh) * a.c.block_size + bo;
    };
    constexpr int RPI = 32 / NCH; /* records per instruction */
    constexpr int SP = SF > 1 ? SF / 4 : 1; /* int4: pieces of 16 bytes of F32 fields per record */
    int ch = lane % NCH;
    /* a tile's 16 positions in one block (block size a multiple of 16, aligned start): the
     * records are base + row (a block holds each kv head's positions contiguously), one
     * table entry for all */
    bool blk16 = region == 0 && bs_shift >= 4 && (m.a & 15) == 0;
    auto issue = [&](int j, int tb) {
        if (j < my_tiles) {
            int i0 = start + (warp + j * WARPS) * TQ;
            unsigned char *st = stg + (j % STG) * RAW;
            float *sst = (float *)(st + 2 * TQ * CB);
            /* the tile's records are rec0 + row * rs: a main-store tile inside one block, or
             * side-cache slots without a sink/ring boundary or a ring wrap inside the tile */
            bool fast = blk16;
            size_t rec0 = 0;
            if (blk16) {
                int p0 = m.a + i0;
                rec0 = ((size_t)__shfl_sync(0xffffffffu, tb, 0) * KVH + kvh) * a.c.block_size +
                       (p0 & (a.c.block_size - 1));
            } else if (region) {
                int slot0 = -1;
                if (i0 + TQ <= m.a) slot0 = i0; /* sink positions: slot = position */
                else if (i0 >= m.a) {
                    int off = (m.b + i0 - m.a - a.c.sink) % a.c.ring;
                    if (off + TQ <= a.c.ring) slot0 = a.c.sink + off;
                }
                fast = slot0 >= 0;
                if (fast) rec0 = kvq_side_rec(a.c, seq, slot0, kvh);
            }
            if (fast) { /* 32-bit offsets from the tile's first record, K and V alike; rows
                         * are rs records apart (main store: consecutive; side cache: KVH) */
                const int rs = region ? KVH : 1;
                const uint8_t *kb = region ? (const uint8_t *)a.c.side_codes[0] + rec0 * HD : a.c.codes[0] + rec0 * CB;
                const uint8_t *vb = region ? (const uint8_t *)a.c.side_codes[1] + rec0 * HD : a.c.codes[1] + rec0 * CB;
                uint32_t sb = qrl_smem_u32(st);
                if (DQ) { /* the lane's first row's address, then a constant stride (main
                           * store): the copies take immediate offsets, no 64-bit adds */
                    const int r0 = lane / NCH, go = r0 * rs * CB + ch * 16;
                    const uint8_t *kp = kb + go, *vp = vb + go;
                    const size_t step = (size_t)RPI * rs * CB;
#pragma unroll
                    for (int it = 0; it < TQ / RPI; it++) {
                        int row = r0 + RPI * it;
                        uint32_t so = sb + row * CB + ((ch ^ swz<NCH>(row)) << 4);
                        bool ok = i0 + row < end;
                        qrl_cp_async16(so, kp + it * step, ok);
                        qrl_cp_async16(so + TQ * CB, vp + it * step, ok);
                    }
                } else {
#pragma unroll
                    for (int it = 0; it < TQ / RPI; it++) {
                        int row = lane / NCH + RPI * it, go = row * rs * CB + ch * 16;
                        uint32_t so = sb + row * CB + ((ch ^ swz<NCH>(row)) << 4);
                        bool ok = i0 + row < end;
                        qrl_cp_async16(so, kb + go, ok);
                        qrl_cp_async16(so + TQ * CB, vb + go, ok);
                    }
                }
                if (SF == 1)
                    qrl_cp_async4(qrl_smem_u32(sst + lane),
                                  (region ? a.c.side_scales[lane >> 4] : a.c.scales[lane >> 4]) + rec0 + crow * rs,
                                  i0 + crow < end);
#pragma unroll
                for (int it = 0; SF > 1 && it < SP; it++) {
                    int c = lane + 32 * it, rall = c / SP, pc = c % SP, row = rall % TQ;
                    qrl_cp_async16(qrl_smem_u32(sst + rall * SF + 4 * pc),
                                   a.c.scales[rall / TQ] + rec0 * SF + row * rs * SF + 4 * pc, i0 + row < end);
                }
            } else {
#pragma unroll
                for (int it = 0; it < 2 * TQ / RPI; it++) {
                    int rall = lane / NCH + RPI * it, kv = rall / TQ, row = rall % TQ;
                    bool ok;
                    size_t rec = rec_of(i0, row, __shfl_sync(0xffffffffu, tb, row), &ok);
                    const uint8_t *cp = region ? (const uint8_t *)a.c.side_codes[kv] + rec * HD : a.c.codes[kv] + rec * CB;
                    qrl_cp_async16(qrl_smem_u32(st + rall * CB + ((ch ^ swz<NCH>(row)) << 4)), cp + ch * 16, ok);
                }
                if (SF == 1) { /* lane: (K if lane < 16 else V, row lane % 16) */
                    bool ok;
                    size_t rec = rec_of(i0, crow, tb, &ok);
                    const float *sp = region ? a.c.side_scales[lane >> 4] + rec : a.c.scales[lane >> 4] + rec;
                    qrl_cp_async4(qrl_smem_u32(sst + lane), sp, ok);
                }
#pragma unroll
                for (int it = 0; SF > 1 && it < SP; it++) {
                    int c = lane + 32 * it, rall = c / SP, pc = c % SP, kv = rall / TQ, row = rall % TQ;
                    bool ok;
                    size_t rec = rec_of(i0, row, __shfl_sync(0xffffffffu, tb, row), &ok);
                    qrl_cp_async16(qrl_smem_u32(sst + rall * SF + 4 * pc), a.c.scales[kv] + rec * SF + 4 * pc, ok);
                }
            }
        }
        qrl_cp_async_commit();
    };

    float o[KS][4], mrun = -INFINITY, l = 0.0f;
    int kc = 0; /* fp4: the V scale exponent o is kept in (see the tile loop) */
#pragma unroll
    for (int mt = 0; mt < KS; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < STG - 1; j++) issue(j, tab(j));
    int tb_next = tab(STG - 1);
    for (int j = 0; j < my_tiles; j++) {
        issue(j + STG - 1, tb_next);
        tb_next = tab(j + STG); /* in flight during this tile */
        qrl_cp_async_wait<STG - 1>();
        __syncwarp();
        const unsigned char *st = stg + (j % STG) * RAW;
        const float *sst = (const float *)(st + 2 * TQ * CB);

        /* scores: n-tile nt holds positions pi(nt, .); lane's K bytes [NBK t, NBK t + NBK) */
        float c[2][4], c2[2][4]; /* DQ 2: odd k steps into c2, two MMA chains of KS / 2 per n-tile */
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
            c2[nt][0] = c2[nt][1] = c2[nt][2] = c2[nt][3] = 0.0f;
            int prow = (g >> 1) * 4 + nt * 2 + (g & 1);
            uint32_t kw[NBK / 4];
            lds_row<NCH, NBK>(st + prow * CB, prow, NBK * t, kw);
            uint32_t s2 = 0, z2 = 0, fs2[(KB + 15) / 16];
            if (FMT == F_FP4) { /* the block scales of the lane's dims [KB t, KB t + KB) */
                const uint8_t *sb = (const uint8_t *)(sst + prow * SF + 2);
#pragma unroll
                for (int i = 0; i < (KB + 15) / 16; i++) {
                    uint32_t b = sb[(KB * t) / 16 + i];
                    fs2[i] = e4m3_pair(b, b);
                }
            }
            if (FMT == F_INT4) {
                int grp = (KB * t) / 32;
                __half2 hs = __float2half2_rn(sst[prow * SF + grp]), hz = __float2half2_rn(sst[prow * SF + NG + grp]);
                s2 = *(uint32_t *)&hs, z2 = *(uint32_t *)&hz;
            }
#pragma unroll
            for (int jj = 0; jj < KS; jj++) {
                uint32_t b0, b1;
                if (FMT == F_INT8) {
                    uint32_t x = kw[jj] ^ 0x80808080u;
                    b0 = __byte_perm(x, M64, 0x4140), b1 = __byte_perm(x, M64, 0x4342);
                } else if (FMT == F_FP4) {
                    /* dims KB t + 4 jj + (0, 1 | 2, 3): nibbles of half jj % 2 of word jj / 2,
                     * times their block scale (exact in f16: <= 6 significant bits) */
                    uint32_t u = kw[jj >> 1] >> (16 * (jj & 1));
                    uint32_t sc2 = fs2[(4 * jj) / 16];
                    b0 = qrl_hmul2(e2m1_pair(u, 0), sc2), b1 = qrl_hmul2(e2m1_pair(u, 1), sc2);
                } else if (FMT == F_FP8) {
                    if (DQ) b0 = qrl_e4m3x2_lo(kw[jj]), b1 = qrl_e4m3x2_hi(kw[jj]);
                    else b0 = e4m3x2_h2(kw[jj]), b1 = e4m3x2_h2(kw[jj] >> 16);
                } else if (DQ) {
                    /* word jj / 2 = dims 8 (jj / 2) + i at nibble i; odd steps take the word
                     * shifted by 8.  (w & 0x000F000F) | 1024 = 1024 + (n_o, n_o+4) and
                     * (w & 0x00F000F0) | 1024 = 1024 + 16 (n_o+1, n_o+5) as f16, exact; one
                     * subtraction (or fma by 1/16) each, then s n + z rounded once */
                    uint32_t w = kw[jj >> 1] >> (8 * (jj & 1));
                    uint32_t lo = qrl_hsub2((w & 0x000F000Fu) | 0x64006400u, 0x64006400u);
                    uint32_t hi = qrl_hfma2((w & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, 0xD400D400u);
                    b0 = qrl_hfma2(lo, s2, z2), b1 = qrl_hfma2(hi, s2, z2);
                } else {
                    uint32_t w = kw[jj >> 1];
                    int b = (jj & 1) * 2;
                    b0 = qrl_hfma2(u4_pair(w, b), s2, z2), b1 = qrl_hfma2(u4_pair(w, b + 1), s2, z2);
                }
                if (DQ == 2 && (jj & 1)) qrl_mma_f16(c2[nt], qa[jj], b0, b1);
                else qrl_mma_f16(c[nt], qa[jj], b0, b1);
            }
            if (DQ == 2)
#pragma unroll
                for (int e = 0; e < 4; e++) c[nt][e] += c2[nt][e];
        }
        int p0 = start + (warp + j * WARPS) * TQ;
        float sc[4] = {c[0][0] + c[0][2], c[0][1] + c[0][3], c[1][0] + c[1][2], c[1][1] + c[1][3]};
        if (FMT == F_INT8) {
            float4 ks = *(const float4 *)(sst + 4 * t);
            sc[0] = (sc[0] - 1152.0f * qsum) * ks.x, sc[1] = (sc[1] - 1152.0f * qsum) * ks.y;
            sc[2] = (sc[2] - 1152.0f * qsum) * ks.z, sc[3] = (sc[3] - 1152.0f * qsum) * ks.w;
        } else if (FMT == F_FP8) {
#pragma unroll
            for (int i = 0; i < 4; i++) sc[i] *= fsk;
        } else if (FMT == F_FP4) { /* 1 / S_enc of each K vector */
#pragma unroll
            for (int i = 0; i < 4; i++) sc[i] *= sst[(4 * t + i) * SF + 1];
        }
        if (p0 + TQ > end)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (p0 + 4 * t + i >= end) sc[i] = -INFINITY;
        float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* fp4 V: 1 / S_enc per position goes into P before P.V, as p * (sdec * 2^(127 - kc)),
         * kc = the largest sdec exponent met so far (warp-uniform), so P stays in (0, 2)
         * in f16 whatever the vectors' magnitudes; o holds the output times 2^(127 - kc) */
        float vsd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int kt = 0;
        if (FMT == F_FP4) {
            float m4 = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) vsd[i] = sst[(TQ + 4 * t + i) * SF + 1], m4 = fmaxf(m4, vsd[i]);
            m4 = fmaxf(m4, __shfl_xor_sync(0xffffffffu, m4, 1));
            m4 = fmaxf(m4, __shfl_xor_sync(0xffffffffu, m4, 2));
            kt = (int)((__float_as_uint(m4) >> 23) & 0xFFu);
        }
        bool kgrow = FMT == F_FP4 && kt > kc;
        if (__any_sync(0xffffffffu, mx > mrun) || kgrow) { /* rescale only when a maximum grew */
            float mn = fmaxf(mrun, mx), cf = ex2(mrun - mn);
            mrun = mn;
            l *= cf;
            float ca = __shfl_sync(0xffffffffu, cf, 8 * t), cb = __shfl_sync(0xffffffffu, cf, 8 * t + 4);
            if (kgrow) {
                float fk = ldexpf(1.0f, kc - kt);
                ca *= fk, cb *= fk, kc = kt;
            }
#pragma unroll
            for (int mt = 0; mt < KS; mt++) o[mt][0] *= ca, o[mt][1] *= cb, o[mt][2] *= ca, o[mt][3] *= cb;
        }
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = g < G ? ex2(sc[i] - mrun) : 0.0f;
        l += (p[0] + p[1]) + (p[2] + p[3]);
        if (FMT == F_FP4) {
            float fd = __uint_as_float((uint32_t)(254 - kc) << 23); /* 2^(127 - kc) */
#pragma unroll
            for (int i = 0; i < 4; i++) p[i] *= vsd[i] * fd;
        }
        uint32_t pb0 = h2_bits(p[0], p[1]), pb1 = h2_bits(p[2], p[3]);

        /* V^T fragments: lane's dims [VB g, VB g + VB) of positions 4t .. 4t + 3 */
        uint32_t vw[4][NBV / 4];
#pragma unroll
        for (int q = 0; q < 4; q++) lds_row<NCH, NBV>(st + (TQ + 4 * t + q) * CB, 4 * t + q, NBV * g, vw[q]);
        uint32_t vs[2], vz[2] = {0, 0};
        if (FMT == F_INT8) {
            float4 v4 = *(const float4 *)(sst + TQ + 4 * t);
            vs[0] = h2_bits(v4.x, v4.y), vs[1] = h2_bits(v4.z, v4.w);
        } else if (FMT == F_FP4) { /* block scale of dims [VB g, VB g + VB) per position pair */
            const uint8_t *b0 = (const uint8_t *)(sst + (TQ + 4 * t) * SF + 2) + (VB * g) / 16;
            vs[0] = e4m3_pair(b0[0], b0[SF * 4]), vs[1] = e4m3_pair(b0[2 * SF * 4], b0[3 * SF * 4]);
        } else if (FMT == F_INT4) {
            int grp = (VB * g) / 32;
            const float *f0 = sst + (TQ + 4 * t) * SF;
            vs[0] = h2_bits(f0[grp], f0[SF + grp]), vs[1] = h2_bits(f0[2 * SF + grp], f0[3 * SF + grp]);
            vz[0] = h2_bits(f0[NG + grp], f0[SF + NG + grp]);
            vz[1] = h2_bits(f0[2 * SF + NG + grp], f0[3 * SF + NG + grp]);
        }
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            uint32_t av[4];
#pragma unroll
            for (int pr = 0; pr < 2; pr++) { /* positions 4t + 2pr, 4t + 2pr + 1 -> a[2pr], a[2pr + 1] */
                const uint32_t *w0 = vw[2 * pr], *w1 = vw[2 * pr + 1];
                uint32_t lo, hi;
                if (FMT == F_FP4) { /* byte mt of both positions: x = (A, B) in bytes 0, 1 */
                    int b = mt & 3, wi = mt >> 2;
                    uint32_t x = __byte_perm(w0[wi], w1[wi], (uint32_t)(b | (4 + b) << 4));
                    lo = qrl_hmul2(e2m1x2_h2((x & 0x707u) << 4, ((x & 0x8u) << 12) | ((x & 0x800u) << 20)), vs[pr]);
                    hi = qrl_hmul2(e2m1x2_h2(x & 0x7070u, ((x & 0x80u) << 8) | ((x & 0x8000u) << 16)), vs[pr]);
                } else if (FMT == F_INT4) {
                    int b = mt & 3, wi = mt >> 2;
                    uint32_t x = __byte_perm(w0[wi], w1[wi], (uint32_t)(b | b << 4 | (4 + b) << 8 | (4 + b) << 12));
                    lo = qrl_hsub2((x & 0x000F000Fu) | 0x64006400u, 0x64006400u);
                    hi = qrl_hfma2((x & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, 0xD400D400u);
                    lo = qrl_hfma2(lo, vs[pr], vz[pr]), hi = qrl_hfma2(hi, vs[pr], vz[pr]);
                } else {
                    int wi = mt >> 1;
                    uint32_t x = __byte_perm(w0[wi], w1[wi], (mt & 1) ? 0x7362u : 0x5140u);
                    if (FMT == F_INT8) {
                        x ^= 0x80808080u;
                        lo = qrl_hmul2(qrl_hsub2(__byte_perm(x, M64, 0x4140), B1152), vs[pr]);
                        hi = qrl_hmul2(qrl_hsub2(__byte_perm(x, M64, 0x4342), B1152), vs[pr]);
                    } else if (DQ) {
                        lo = qrl_e4m3x2_lo(x), hi = qrl_e4m3x2_hi(x);
                    } else {
                        lo = e4m3x2_h2(x), hi = e4m3x2_h2(x >> 16);
                    }
                }
                av[2 * pr] = lo, av[2 * pr + 1] = hi;
            }
            /* a0 = (slot g, pos 4t, 4t+1), a1 = (slot g+8, ..), a2 = (slot g, 4t+2, 4t+3), a3 */
            const uint32_t afr[4] = {av[0], av[1], av[2], av[3]};
            qrl_mma_f16(o[mt], afr, pb0, pb1);
        }
        __syncwarp();
    }
    qrl_cp_async_wait<0>();
    if (FMT == F_FP4) fsv = ldexpf(1.0f, kc - 127);
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads(); /* the stages become the merge area */
    float *sm_o = (float *)tq_sm;             /* [WARPS][8][HD] */
    float *sm_ml = sm_o + WARPS * 8 * HD;     /* [WARPS][8][2] */
    {
        int h0 = 2 * t, h1 = 2 * t + 1;
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            int d = VB * g + 2 * mt;
            if (h0 < G) sm_o[(warp * 8 + h0) * HD + d] = o[mt][0] * fsv, sm_o[(warp * 8 + h0) * HD + d + 1] = o[mt][2] * fsv;
            if (h1 < G) sm_o[(warp * 8 + h1) * HD + d] = o[mt][1] * fsv, sm_o[(warp * 8 + h1) * HD + d + 1] = o[mt][3] * fsv;
        }
        if (t == 0 && g < G) sm_ml[(warp * 8 + g) * 2] = mrun, sm_ml[(warp * 8 + g) * 2 + 1] = l;
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

/* Grid (n_main [+ 1], kv heads, rows).  int4-protected (prot_len > 0): block x = n_main is
 * the row's protected positions (sink + recent window) from the INT8 side cache, in the
 * same launch as the INT4 main-store splits. */
template <int HD, int FMT, int STG, int DQ>
/* DQ 0 / 1: <= 168 registers, 3 blocks/SM (at 128 for 4 blocks/SM they spilled); DQ 2: 4
 * blocks/SM at 119-128 registers, no spills (ptxas -v, sm_90) */
static __global__ void __launch_bounds__(WARPS * 32, DQ == 2 ? 4 : 3)
attnq_tc_kernel(qargs a, float sl2, int chunk, int n_splits, int bs_shift, int n_main, int prot_len) {
    if (FMT == F_INT4 && (int)blockIdx.x >= n_main)
        tc_split<HD, F_INT8, STG, DQ>(a, 1, sl2, prot_len, n_splits, 0, n_main, bs_shift);
    else
        tc_split<HD, FMT, STG, DQ>(a, 0, sl2, chunk, n_splits, blockIdx.x, 0, bs_shift);
}

template <int HD, int FMT, int STG, int DQ>
static void launch_st(const qargs &a, dim3 grid, float sl2, int chunk, int ns, int sh, int n_main,
                      int prot_len, cudaStream_t st) {
    size_t raw = tc_geom<HD, FMT>::RAW > tc_geom<HD, F_INT8>::RAW ? tc_geom<HD, FMT>::RAW : tc_geom<HD, F_INT8>::RAW;
    size_t kv = (size_t)WARPS * STG * raw, mg = (size_t)WARPS * 8 * (HD + 2) * 4;
    size_t bytes = kv > mg ? kv : mg;
    static std::atomic<unsigned> done{0}; /* > 48 KB needs the attribute, once per device */
    int dev = 0;
    cudaGetDevice(&dev);
    unsigned bit = 1u << (dev & 31);
    if (!(done.load() & bit) &&
        cudaFuncSetAttribute(attnq_tc_kernel<HD, FMT, STG, DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes) == cudaSuccess)
        done.fetch_or(bit);
    attnq_tc_kernel<HD, FMT, STG, DQ><<<grid, WARPS * 32, bytes, st>>>(a, sl2, chunk, ns, sh, n_main, prot_len);
}

template <int HD, int FMT>
static void launch_hd(const qargs &a, int stages, int dq, dim3 grid, float sl2, int chunk, int ns,
                      int sh, int n_main, int prot_len, cudaStream_t st) {
    if (dq == 0) launch_st<HD, FMT, 3, 0>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    else if (dq == 2 && stages >= 4) launch_st<HD, FMT, 4, 2>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    else if (dq == 2) launch_st<HD, FMT, 3, 2>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    else if (stages <= 2) launch_st<HD, FMT, 2, 1>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    else if (stages == 3) launch_st<HD, FMT, 3, 1>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    else launch_st<HD, FMT, 4, 1>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
}

/* Decoders: QRL_ATTNQ_DEQ for A/B timing (bench/run-kvdeq-gpu.sh; H200, late-stage decode
 * step means, same call, int8 / fp8 / int4 / int4-protected ms): 0 = the previous ones
 * (17.23 / 16.69 / 16.85 / 17.79), 1 = int4 K nibbles by mask into f16 mantissas in the
 * order they come out (Q fragment permuted to match), E4M3 high pairs by the conversion's
 * operand selector instead of a shift, tile copies at immediate offsets from one pointer
 * per plane (17.56 / 16.58 / 16.56 / 17.59), 2 (default) = 1 with the score MMAs in two
 * chains per n-tile, which ptxas fits in 128 registers without spills: 4 blocks per SM
 * (17.09 / 16.62 / 16.54 / 17.61).
 * cp.async depth: QRL_ATTNQ_STAGES (2..4) for A/B timing; default 3 (H200, late-stage decode
 * step, measured before the one-block fast path: int8 1.11x bf16 at 2 stages, 1.17x at 3,
 * 0.91x at 4 (shared memory then allows 3 blocks per SM instead of 4); int4-protected
 * 1.18x / 1.17x / 1.13x; 3 blocks per SM at 150-160 registers: no faster). */
void qrl_attnq_tc_launch(const qargs &a, int fmt, int hd, dim3 grid, float sl2, int chunk, int ns,
                         int sh, int n_main, int prot_len, cudaStream_t st) {
    int stg = qrl_tuning_int(QRL_TUNING_ATTNQ_STAGES), dq = qrl_tuning_int(QRL_TUNING_ATTNQ_DEQ);
    if (fmt == F_FP4) { /* one variant (the DQ decoders are int4's / fp8's) */
        if (hd == 64) launch_st<64, F_FP4, 3, 1>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        else launch_st<128, F_FP4, 3, 1>(a, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        return;
    }
    if (hd == 64) {
        if (fmt == F_INT8) launch_hd<64, F_INT8>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        else if (fmt == F_FP8) launch_hd<64, F_FP8>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        else launch_hd<64, F_INT4>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    } else {
        if (fmt == F_INT8) launch_hd<128, F_INT8>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        else if (fmt == F_FP8) launch_hd<128, F_FP8>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
        else launch_hd<128, F_INT4>(a, stg, dq, grid, sl2, chunk, ns, sh, n_main, prot_len, st);
    }
}
