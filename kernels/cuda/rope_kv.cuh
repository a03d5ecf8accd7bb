/* Post-QKV stage of a decoder layer, fused (host launchers only, STYLE 7): bias add,
 * optional Qwen3 per-head RMSNorm on q and k (QK-norm), RoPE, and the write of K and V
 * into the paged BF16 KV cache, or for a quantized cache either their codes straight into
 * it (kvq_store) or F32 rows for qrl_cuda_kv_store.  References: qrl_cpu_rmsnorm per head,
 * qrl_cpu_rope_apply, qrl_kv_cache_write (kernels/cpu/ops.h, model/kv_cache.h). */
#ifndef QRL_CUDA_ROPE_KV_CUH
#define QRL_CUDA_ROPE_KV_CUH

#include <stdint.h>

#include "base/status.h"
#include "cuda/kv_quant.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* Shapes of one call (all pointers device memory). */
typedef struct qrl_cuda_rope_kv_args {
    const float *qkv;        /* [n, Q + 2 KV] F32: q heads, k heads, v heads per row */
    const uint16_t *bias;    /* [Q + 2 KV] BF16 or NULL */
    const uint16_t *q_norm;  /* [head_dim] BF16 or NULL (no QK-norm) */
    const uint16_t *k_norm;  /* [head_dim] BF16, set when q_norm is */
    float eps;
    const float *cos_tab;    /* [max_pos, head_dim / 2] F32: cos(pos * inv_freq[j]) */
    const float *sin_tab;
    int interleaved;         /* 0: HF rotate_half pairs (j, j + hd/2); 1: (2j, 2j + 1) */
    const int32_t *row_seq;  /* [n] sequence slot of each row */
    const int32_t *row_pos;  /* [n] position of each row (< max_pos) */
    const int32_t *block_tables; /* [max_seqs, max_blocks_per_seq] block ids */
    int max_blocks_per_seq;
    int block_size;
    uint16_t *k_cache;       /* this layer: [n_blocks, block_size, n_kv_heads, head_dim] BF16 */
    uint16_t *v_cache;
    float *q_out;            /* [n, Q] F32: normed, rotated q */
    float *kv_out;           /* NULL, or [n, 2 KV] F32: rotated k heads then v heads, written
                              * here instead of the BF16 cache for qrl_cuda_kv_store (or set
                              * kvq_store; k_cache / v_cache are then unused) */
    int kvq_store;           /* 1: quantize k and v straight into kvq (int8, int4,
                              * int4-protected, or fp8 with every row's sequence calibrated;
                              * not fp4), the bytes qrl_cuda_kv_store writes from kv_out;
                              * kv_out, k_cache and v_cache are then unused */
    qrl_cuda_kvq_layer kvq;
    int n, n_heads, n_kv_heads, head_dim;
} qrl_cuda_rope_kv_args;

/* Errors: INVALID_ARGUMENT (head_dim odd or > 256, n <= 0; kvq_store with the fp4 format,
 * a head_dim / kv head count other than the call's, block_size <= 0, or an int4-protected
 * layer with sink / recent < 0 or ring < recent), CUDA (launch). */
qrl_status qrl_cuda_rope_kv(const qrl_cuda_rope_kv_args *a, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
