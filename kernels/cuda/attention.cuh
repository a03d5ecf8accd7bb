/* Attention over the paged BF16 KV cache (host launchers only, STYLE 7).
 * Reference: qrl_cpu_attention_head (kernels/cpu/ops.h).
 *
 * Flash-decoding: the context of each row is split into chunks of whole tiles; one thread
 * block per (chunk, kv head, row) reads that chunk's K and V once for all the q heads of
 * its GQA group, keeping a running max and sum of exponentials per head; a second kernel
 * merges the chunks by their maxima and sums.  head_dim 64 and 128 take a tensor-core
 * path (K/V tiles staged through shared memory by cp.async, scores and P·V by mma.sync);
 * other head dims a CUDA-core one.  The same launcher serves a prefill chunk:
 * each row attends causally to positions [0, row_pos[r]], reading K/V rows written by
 * qrl_cuda_rope_kv before (a simple, correct prefill: K/V are re-read per query row). */
#ifndef QRL_CUDA_ATTENTION_CUH
#define QRL_CUDA_ATTENTION_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_cuda_attention_args {
    uint16_t *out;           /* [n, n_heads * head_dim] BF16 */
    const float *q;          /* [n, n_heads * head_dim] F32 (rotated) */
    const uint16_t *k_cache; /* this layer: [n_blocks, block_size, n_kv_heads, head_dim] BF16 */
    const uint16_t *v_cache;
    const int32_t *block_tables; /* [max_seqs, max_blocks_per_seq] */
    int max_blocks_per_seq;
    int block_size;
    const int32_t *row_seq;  /* [n] */
    const int32_t *row_pos;  /* [n]: row r attends to positions [0, row_pos[r]] */
    int n, n_heads, n_kv_heads, head_dim;
    float scale;             /* usually 1/sqrt(head_dim) */
    int max_len;             /* host-known bound on row_pos[r] + 1 over the rows */
    float *work;             /* scratch, qrl_cuda_attention_work_floats(...) floats */
    size_t work_floats;
} qrl_cuda_attention_args;

/* Scratch floats for up to n rows, contexts up to max_len. */
size_t qrl_cuda_attention_work_floats(int n, int n_heads, int head_dim, int max_len);

/* Errors: UNSUPPORTED (head_dim not in {8,16,32,64,128,256}, or more than 8 q heads per kv
 * head), INVALID_ARGUMENT (sizes, scratch too small), CUDA (launch). */
qrl_status qrl_cuda_attention(const qrl_cuda_attention_args *a, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
