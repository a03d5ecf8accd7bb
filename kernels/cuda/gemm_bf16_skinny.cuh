/* BF16 GEMM for decode batches (few rows): the weight stream at HBM bandwidth (host
 * launcher only, STYLE 7).  qrl_cuda_gemm_bf16 (gemm.cuh) routes small batches here;
 * reference: qrl_cpu_matmul. */
#ifndef QRL_CUDA_GEMM_BF16_SKINNY_CUH
#define QRL_CUDA_GEMM_BF16_SKINNY_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[n, m] = x[n, k] . w[m, k]^T, x and w BF16 (w in nn.Linear [out, in] layout), y F32
 * row-major, F32 accumulation on the tensor cores (mma.sync m16n8k16).
 *
 * A block owns 128 weight rows x up to 96 tokens (more tokens: more blocks, each reading
 * the weights again) and a range of K; weights and tokens go through shared memory in a
 * cp.async pipeline (weights tagged evict-first in L2).  When the weight has few 128-row
 * tiles, K is split over up to 16 blocks (`target_blocks` blocks in all, each split at
 * least `min_split_k` elements); the splits write F32 partials to `work` and the last block
 * of a tile to arrive adds them in split order.  The split depends on (m, k) only, so a
 * row's outputs do not depend on n (the same bits at any batch) unless `work` or
 * `counters` is too small for S * n * m floats / one counter per tile, when K is not split.
 *
 * Device pointers; runs on `stream`.  work: S * n * m floats or NULL (no split);
 * counters: zeroed once by the caller, left zero by every launch (one per output tile:
 * ceil(m / 128) * ceil(n / tokens per block)); both used by one launch at a time.
 * Errors: INVALID_ARGUMENT (non-positive sizes), UNSUPPORTED (k not a multiple of 8, x or w
 * not 16-byte aligned: use cuBLAS), CUDA (launch). */
typedef struct qrl_cuda_bf16_skinny_args {
    float *y;
    const uint16_t *x, *w;
    int n, k, m;
    float *work;
    size_t work_floats;
    unsigned *counters;
    int n_counters;
    int target_blocks; /* 0: 132 (the SMs of an H200) */
    int min_split_k;   /* 0: 512 */
    int no_l2_hint;    /* 1: weights without the evict-first hint (A/B) */
} qrl_cuda_bf16_skinny_args;

qrl_status qrl_cuda_gemm_bf16_skinny(const qrl_cuda_bf16_skinny_args *a, void *stream,
                                     qrl_error *err);

/* Opts the kernels in to their shared memory on the current device (otherwise done by the
 * first launch): call it before capturing a CUDA graph that launches them (qrl_cuda_gemm_new
 * does).  Errors: CUDA. */
qrl_status qrl_cuda_gemm_bf16_skinny_prepare(qrl_error *err);

/* Whether qrl_cuda_gemm_bf16_skinny takes these operands (k % 8 == 0, 16-byte alignment). */
int qrl_cuda_gemm_bf16_skinny_ok(const uint16_t *x, const uint16_t *w, int k);

/* The K split the launcher picks for an m x k weight (1: none), and the blocks it launches
 * for n rows, with default tuning and room for the split (0 for non-positive sizes). */
int qrl_cuda_gemm_bf16_skinny_splits(int k, int m);
int qrl_cuda_gemm_bf16_skinny_blocks(int n, int k, int m);

#ifdef __cplusplus
}
#endif
#endif
