#include "cuda/attention.cuh"

#include <cuda_bf16.h>
#include <math.h>

#include "cuda/launch.cuh"

#define WARPS 4
#define TILE_MIN 64 /* chunk granularity in positions */

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
static __global__ void __launch_bounds__(WARPS * 32, GT <= 4 ? 4 : 2)
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

static int sm_count(void) {
    static int n = 0;
    if (n == 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) n = 132;
    }
    return n;
}

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
    /* Enough blocks for ~8 per multiprocessor, chunks of whole tiles. */
    long want = (8L * sm_count() + (long)a->n * a->n_kv_heads - 1) / ((long)a->n * a->n_kv_heads);
    long max_splits = (a->max_len + TILE_MIN - 1) / TILE_MIN;
    int ns = (int)(want < 1 ? 1 : want > max_splits ? max_splits : want);
    int chunk = (a->max_len + ns - 1) / ns;
    chunk = (chunk + TILE_MIN - 1) / TILE_MIN * TILE_MIN;
    ns = (a->max_len + chunk - 1) / chunk;
    size_t need = (size_t)a->n * a->n_heads * ns * (hd + 2);
    if (need > a->work_floats)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention: scratch of %zu floats, need %zu", a->work_floats, need);
    float sl2 = a->scale * 1.4426950408889634f;
    dim3 grid(ns, a->n_kv_heads, a->n);
    cudaStream_t st = (cudaStream_t)stream;
    switch (hd) {
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
