#include "cuda/rope_kv.cuh"

#include <cuda_bf16.h>

#include "cuda/launch.cuh"

#define WARPS 8

/* One warp per (row, head) of the row's q heads, then k heads, then v heads (a decode
 * batch of 100-300 rows has 5-15 K such heads: each warp's load -> norm -> store chain
 * runs once, where one block per row ran 12 heads per warp back to back, ~16 us per
 * layer on an H100 at 100 rows); the head is staged in shared memory so the rotation can
 * read both members of a pair.  Every element's arithmetic is unchanged. */
static __global__ void __launch_bounds__(WARPS * 32) rope_kv_kernel(qrl_cuda_rope_kv_args a) {
    __shared__ float buf[WARPS][256];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hd = a.head_dim, half = hd / 2, H = a.n_heads, KVH = a.n_kv_heads;
    int Q = H * hd, KV = KVH * hd, W = Q + 2 * KV, NH = H + 2 * KVH;
    long item = (long)blockIdx.x * WARPS + warp;
    if (item >= (long)a.n * NH) return; /* whole warps only: no block barrier below */
    int r = (int)(item / NH), h = (int)(item % NH);
    int pos = a.row_pos[r];
    int blk = a.kv_out ? 0 : a.block_tables[(size_t)a.row_seq[r] * a.max_blocks_per_seq + pos / a.block_size];
    size_t slot = ((size_t)blk * a.block_size + pos % a.block_size) * KV;
    const float *cs = a.cos_tab + (size_t)pos * half, *sn = a.sin_tab + (size_t)pos * half;
    float *b = buf[warp];
    int off = h * hd; /* column offset inside the qkv row */
    for (int j = lane; j < hd; j += 32) {
        float v = a.qkv[(size_t)r * W + off + j];
        if (a.bias) v += qrl_bf16_ld_(a.bias[off + j]);
        b[j] = v;
    }
    __syncwarp();
    if (h >= H + KVH) { /* v head: store as is */
        for (int j = lane; j < hd; j += 32) {
            if (a.kv_out) a.kv_out[(size_t)r * 2 * KV + KV + (h - H - KVH) * hd + j] = b[j];
            else a.v_cache[slot + (h - H - KVH) * hd + j] = qrl_bf16_st_(b[j]);
        }
        return;
    }
    const uint16_t *nw = h < H ? a.q_norm : a.k_norm;
    float inv = 1.0f;
    if (nw) {
        float ss = 0.0f;
        for (int j = lane; j < hd; j += 32) ss += b[j] * b[j];
        ss = qrl_warp_sum_(ss);
        inv = rsqrtf(ss / (float)hd + a.eps);
    }
    float y[8]; /* hd <= 256: at most 8 elements per lane, unrolled (no local memory) */
#pragma unroll
    for (int c = 0; c < 8; c++) {
        int j = lane + 32 * c;
        if (j >= hd) break;
        int i, p, sign; /* partner index p and the sin sign for element j */
        if (!a.interleaved) {
            i = j < half ? j : j - half;
            p = j < half ? j + half : j - half;
            sign = j < half ? -1 : 1;
        } else {
            i = j >> 1;
            p = j ^ 1;
            sign = (j & 1) ? 1 : -1;
        }
        float xj = b[j], xp = b[p];
        if (nw) {
            xj = xj * inv * qrl_bf16_ld_(nw[j]);
            xp = xp * inv * qrl_bf16_ld_(nw[p]);
        }
        y[c] = xj * cs[i] + (float)sign * xp * sn[i];
    }
#pragma unroll
    for (int c = 0; c < 8; c++) {
        int j = lane + 32 * c;
        if (j >= hd) break;
        if (h < H) a.q_out[(size_t)r * Q + off + j] = y[c];
        else if (a.kv_out) a.kv_out[(size_t)r * 2 * KV + (h - H) * hd + j] = y[c];
        else a.k_cache[slot + (h - H) * hd + j] = qrl_bf16_st_(y[c]);
    }
}

qrl_status qrl_cuda_rope_kv(const qrl_cuda_rope_kv_args *a, void *stream, qrl_error *err) {
    if (a->n <= 0 || a->head_dim <= 0 || a->head_dim % 2 || a->head_dim > 256)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rope_kv: n=%d head_dim=%d", a->n,
                             a->head_dim);
    long items = (long)a->n * (a->n_heads + 2 * a->n_kv_heads);
    rope_kv_kernel<<<(unsigned)((items + WARPS - 1) / WARPS), WARPS * 32, 0, (cudaStream_t)stream>>>(*a);
    return qrl_cuda_launch_status_("rope_kv", err);
}
