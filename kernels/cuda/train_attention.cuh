/* Causal grouped-query attention over packed sequences for training: forward that keeps
 * the row log-sum-exp, and the FlashAttention-2 backward that recomputes the
 * probabilities from it (host launchers only, STYLE 7).
 * Reference: qrl_train_attention_forward / qrl_train_attention_backward
 * (kernels/cpu/train_ops.h); same mask, same meaning of every buffer.
 *
 * Layouts (row-major, device pointers): q, out, dout [T, H, hd]; k, v [T, Hkv, hd];
 * lse [H, T]; query head h reads kv head h / (H / Hkv).  seg_start[T] (int32, device) is
 * the index of the first token of t's sequence: token t attends to s iff
 * seg_start[t] <= s <= t (block-diagonal causal mask of a packed row).
 * Scale 1/sqrt(hd).  BF16 inputs, F32 softmax statistics and accumulation.
 * hd 64 and 128 run on tensor cores and need q, k, v, out, dout, dq, dk, dv 16-byte
 * aligned (INVALID_ARGUMENT otherwise); dq/dk/dv are summed with F32 atomics (the order,
 * hence the last bits, may vary between runs). */
#ifndef QRL_CUDA_TRAIN_ATTENTION_CUH
#define QRL_CUDA_TRAIN_ATTENTION_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[T, H, hd] (BF16) and lse[H, T] (F32, natural log of the sum of exp of the scaled
 * scores of each query row).  Errors: INVALID_ARGUMENT (non-positive sizes, H not a
 * multiple of Hkv), UNSUPPORTED (hd odd or > 256), CUDA (launch). */
qrl_status qrl_cuda_train_attention_forward(uint16_t *out, float *lse, const uint16_t *q,
                                            const uint16_t *k, const uint16_t *v,
                                            const int32_t *seg_start, int T, int H, int Hkv,
                                            int hd, void *stream, qrl_error *err);

/* Floats of scratch the backward needs for T tokens and H heads (the row sums
 * D = rowsum(dout * out), [H, T]). */
size_t qrl_cuda_train_attention_work_floats(int T, int H);

/* Gradients of the forward above, ACCUMULATED (+=) into dq [T, H, hd], dk and dv
 * [T, Hkv, hd] (F32; the caller zeroes them once), given dout (BF16) and the forward's
 * out (BF16) and lse.  work: qrl_cuda_train_attention_work_floats(T, H) floats.
 * Errors: as the forward. */
qrl_status qrl_cuda_train_attention_backward(float *dq, float *dk, float *dv,
                                             const uint16_t *dout, const uint16_t *q,
                                             const uint16_t *k, const uint16_t *v,
                                             const uint16_t *out, const float *lse,
                                             const int32_t *seg_start, int T, int H, int Hkv,
                                             int hd, float *work, void *stream,
                                             qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
