#include "cuda/rope_kv.cuh"

#include <cuda_bf16.h>

#include "cuda/kv_store_dev.cuh"
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
    /* the cache block of this row's position (k and v heads writing to a cache) */
    const int32_t *bt = a.kvq_store ? a.kvq.block_tables : a.block_tables;
    int mbs = a.kvq_store ? a.kvq.max_blocks_per_seq : a.max_blocks_per_seq;
    int bsz = a.kvq_store ? a.kvq.block_size : a.block_size;
    int blk = h < H || (a.kv_out && !a.kvq_store) ? 0 : bt[(size_t)a.row_seq[r] * mbs + pos / bsz];
    size_t slot = ((size_t)blk * bsz + pos % bsz) * KV;
    /* quantized store: the record of kv head h - H (k) or h - H - KVH (v) */
    int kvh = h < H + KVH ? h - H : h - H - KVH;
    size_t rec = ((size_t)blk * KVH + kvh) * bsz + pos % bsz;
    const float *cs = a.cos_tab + (size_t)pos * half, *sn = a.sin_tab + (size_t)pos * half;
    float *b = buf[warp];
    int off = h * hd; /* column offset inside the qkv row */
    for (int j = lane; j < hd; j += 32) {
        float v = a.qkv[(size_t)r * W + off + j];
        if (a.bias) v += qrl_bf16_ld_(a.bias[off + j]);
        b[j] = v;
    }
    __syncwarp();
    if (h >= H + KVH && a.kvq_store) {
        float x[8];
#pragma unroll
        for (int c = 0; c < 8; c++) x[c] = lane + 32 * c < hd ? b[lane + 32 * c] : 0.0f;
        qrl_kvq_store_vec_(a.kvq, x, lane, a.row_seq[r], pos, rec, kvh, 1);
        return;
    }
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
    float y[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}; /* hd <= 256: at most 8
                                                                    * per lane, unrolled */
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
    if (h >= H && a.kvq_store) {
        qrl_kvq_store_vec_(a.kvq, y, lane, a.row_seq[r], pos, rec, kvh, 0);
        return;
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
    if (a->kvq_store && (a->kvq.format == QRL_CUDA_KVQ_FP4 || qrl_cuda_kvq_code_bytes(a->kvq.format, a->head_dim) == 0 ||
                         a->kvq.head_dim != a->head_dim || a->kvq.n_kv_heads != a->n_kv_heads))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rope_kv: kvq_store into kv format %d with head_dim %d / %d kv heads "
                             "(int8, fp8, int4, int4-protected; the call's head_dim %d, %d kv heads)",
                             a->kvq.format, a->kvq.head_dim, a->kvq.n_kv_heads, a->head_dim, a->n_kv_heads);
    const qrl_cuda_kvq_layer *c = &a->kvq; /* the store kernel's layer checks (kv_quant.cu) */
    if (a->kvq_store && (c->block_size <= 0 ||
                         (c->format == QRL_CUDA_KVQ_INT4_PROTECTED &&
                          (c->sink < 0 || c->recent < 0 || (c->recent > 0 && c->ring < c->recent)))))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rope_kv: kvq_store layer block_size=%d sink=%d recent=%d ring=%d",
                             c->block_size, c->sink, c->recent, c->ring);
    long items = (long)a->n * (a->n_heads + 2 * a->n_kv_heads);
    rope_kv_kernel<<<(unsigned)((items + WARPS - 1) / WARPS), WARPS * 32, 0, (cudaStream_t)stream>>>(*a);
    return qrl_cuda_launch_status_("rope_kv", err);
}
