/* Attention over the quantized paged KV cache (kv_quant.cuh).  Flash-decoding as the BF16
 * kernel (attention.cu): the main-store positions of each row are split into chunks, one
 * thread block per (chunk, kv head, row) serving the GQA group's q heads; int4-protected
 * adds one split per row over its protected positions read from the INT8 side cache; a
 * merge kernel combines all splits by their maxima and sums of exponentials (the same
 * statistic qrl_attention_merge merges the CPU's two partials by).
 *
 * head_dim 64/128: the tensor-core kernel of attention_q_tc.cu (codes straight into mma.sync
 * fragments; the protected split in the same launch).  Other head dims (and
 * QRL_ATTN_LEGACY=1): CUDA cores, 8 elements per lane dequantized in registers. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

#include <atomic>

#include "cuda/attention_q_dev.cuh"
#include "cuda/nvfp4_dev.cuh"
#include "cuda/splits.cuh"
#include "base/tuning.h"
#include "cuda/launch.cuh"

/* Dequantize 8 consecutive elements [d0, d0 + 8) of one record. */
template <int FMT, int HD>
static __device__ __forceinline__ void deq8(const uint8_t *codes, const float *sc, float fs, int d0,
                                            float f[8]) {
    if (FMT == F_FP4) { /* qrl_nvfp4_dequantize_row: e2m1 * (decode(s_b) * (1 / S_enc)) */
        uint32_t u = *(const uint32_t *)(codes + d0 / 2);
        float ds = __fmul_rn(qrl_e4m3_dec_(((const uint8_t *)(sc + 2))[d0 / 16]), sc[1]);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = __fmul_rn(qrl_e2m1_dec_(u >> (4 * i)), ds);
    } else if (FMT == F_INT4) {
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





size_t qrl_cuda_attention_q_work_floats(int n, int n_heads, int head_dim, int max_len) {
    size_t splits = ((size_t)max_len + TILE_MIN - 1) / TILE_MIN + 1;
    return (size_t)n * n_heads * splits * (head_dim + 2);
}

/* CUDA-core path: one launch per region. */
template <int FMT>
static void launch_cc(const qargs &a, int hd, dim3 grid, int region, float sl2, int chunk, int ns,
                      int off, int sh, cudaStream_t st) {
    switch (hd) {
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
    bool tc = (hd == 64 || hd == 128) && !qrl_tuning_bool(QRL_TUNING_ATTN_LEGACY);
    int sh = -1;
    for (int k = 0; k < 31; k++) if (c->block_size == 1 << k) sh = k;
    int chunk, ns = tc_splits(max_len, (long)n * c->n_kv_heads, &chunk);
    int total = ns + (prot ? 1 : 0);
    size_t need = (size_t)n * n_heads * total * (hd + 2);
    if (need > work_floats)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention (quantized kv): scratch of %zu floats, need %zu", work_floats, need);
    qargs a = {*c, out, q, row_seq, row_pos, n, n_heads, work};
    float sl2 = scale * 1.4426950408889634f;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(ns, c->n_kv_heads, n);
    if (tc) { /* one launch, the protected split included */
        int f = fmt == QRL_CUDA_KVQ_INT8 ? F_INT8 : fmt == QRL_CUDA_KVQ_FP8 ? F_FP8
              : fmt == QRL_CUDA_KVQ_FP4 ? F_FP4 : F_INT4;
        qrl_attnq_tc_launch(a, f, hd, dim3(total, c->n_kv_heads, n), sl2, chunk, total, sh, ns,
                            prot ? c->sink + c->recent : 0, st);
        QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) split", err));
    } else {
        if (fmt == QRL_CUDA_KVQ_INT8) launch_cc<F_INT8>(a, hd, grid, 0, sl2, chunk, total, 0, sh, st);
        else if (fmt == QRL_CUDA_KVQ_FP8) launch_cc<F_FP8>(a, hd, grid, 0, sl2, chunk, total, 0, sh, st);
        else if (fmt == QRL_CUDA_KVQ_FP4) launch_cc<F_FP4>(a, hd, grid, 0, sl2, chunk, total, 0, sh, st);
        else launch_cc<F_INT4>(a, hd, grid, 0, sl2, chunk, total, 0, sh, st);
        QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) split", err));
        if (prot) { /* the protected positions (<= sink + recent): one split at INT8 */
            launch_cc<F_INT8>(a, hd, dim3(1, c->n_kv_heads, n), 1, sl2, c->sink + c->recent, total, ns, sh, st);
            QRL_TRY(qrl_cuda_launch_status_("attention (quantized kv) protected split", err));
        }
    }
    attnq_merge_kernel<<<dim3(n_heads, n), hd < 32 ? 32 : hd, 0, st>>>(a, hd, total);
    return qrl_cuda_launch_status_("attention (quantized kv) merge", err);
}
