/* CUDA layers of the training engine (host launchers only, STYLE 7): the pointwise and
 * row-wise parts of common/train/model_train_cuda.c.  The GEMMs are cuBLAS
 * (cuda/gemm.cuh), attention is cuda/train_attention.cuh.
 *
 * Reference: the CPU layers of kernels/cpu/train_ops.h, whose formulas and gradient
 * conventions these follow one for one.  Dtypes: the residual stream, every gradient
 * and every saved statistic (rstd, lse) are F32; activations that feed a GEMM are BF16
 * (round to nearest even); norm gains and biases are read from the F32 master weights.
 * Gradients of parameters are ACCUMULATED (+=; atomics, so the summation order is not
 * fixed), as the CPU ops do.  All pointers are device pointers; `stream` is a
 * cudaStream_t (NULL = default).  Errors: INVALID_ARGUMENT for non-positive sizes,
 * CUDA for a failed launch. */
#ifndef QRL_CUDA_TRAIN_OPS_CUH
#define QRL_CUDA_TRAIN_OPS_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[T, D] = table[tokens[t], :] (F32 master table [V, D]).  Token ids checked by the
 * caller. */
qrl_status qrl_cuda_train_embedding_forward(float *x, const int32_t *tokens, const float *table,
                                            int T, int D, void *stream, qrl_error *err);
/* dtable[tokens[t], :] += dx[t, :]. */
qrl_status qrl_cuda_train_embedding_backward(float *dtable, const float *dx,
                                             const int32_t *tokens, int T, int D, void *stream,
                                             qrl_error *err);

/* Residual add + RMSNorm (HF LlamaRMSNorm):
 *   x_out = x_in + add (+ bias)  when add != NULL (x_out may be x_in), else x_out = x_in
 *   rstd[i] = 1 / sqrt(mean_j x_out[i, j]^2 + eps),  y = bf16(x_out * rstd * g)
 * x_in, add, x_out [n, d] F32; bias, g [d] F32; y [n, d] BF16; rstd [n] F32 (saved). */
qrl_status qrl_cuda_train_rmsnorm_forward(uint16_t *y, float *rstd, float *x_out,
                                          const float *x_in, const float *add, const float *bias,
                                          const float *g, int n, int d, float eps, void *stream,
                                          qrl_error *err);
/* With xh = x * rstd, dxh = dy * g:  dx += rstd * (dxh - xh * mean(dxh * xh)),
 * dg += sum_i dy * xh.  dy [n, d] F32.  When dx_bf16 != NULL it receives bf16 of the
 * updated dx (the residual gradient as the next GEMM's input). */
qrl_status qrl_cuda_train_rmsnorm_backward(float *dx, uint16_t *dx_bf16, float *dg,
                                           const float *dy, const float *x, const float *g,
                                           const float *rstd, int n, int d, void *stream,
                                           qrl_error *err);

/* q or k after its projection, per (token, head) row of x [T, nh, hd] (BF16, in place):
 *   x += bias (F32 [nh * hd], may be NULL)            -> x keeps the biased projection
 *   xn = RMSNorm(x) * g  when g != NULL (Qwen3 q_norm / k_norm, g [hd]; rstd [T * nh])
 *   y = bf16(rope(xn)) with cos/sin [T, hd / 2] F32; interleaved != 0: pairs (2j, 2j+1)
 *       (llama2.c), else (j, j + hd/2) (HF rotate_half).
 * rstd may be NULL when g is NULL.  y may not alias x. */
qrl_status qrl_cuda_train_qk_forward(uint16_t *y, uint16_t *x, float *rstd, const float *bias,
                                     const float *g, const float *cos_t, const float *sin_t,
                                     int T, int nh, int hd, int interleaved, float eps,
                                     void *stream, qrl_error *err);
/* Backward of the above: dy [T, nh, hd] F32 (gradient at the rope output) ->
 * dx = bf16(d loss / d x) (WRITTEN, not accumulated: the input of the dW / dX GEMMs),
 * dg += (when g != NULL), dbias += sum over tokens (when dbias != NULL). */
qrl_status qrl_cuda_train_qk_backward(uint16_t *dx, float *dg, float *dbias, const float *dy,
                                      const uint16_t *x, const float *g, const float *rstd,
                                      const float *cos_t, const float *sin_t, int T, int nh,
                                      int hd, int interleaved, void *stream, qrl_error *err);

/* x[T, N] (BF16) += bias[N] (F32), rounded back to BF16 (v_proj bias). */
qrl_status qrl_cuda_train_bias_add(uint16_t *x, const float *bias, int T, int N, void *stream,
                                   qrl_error *err);
/* db[N] += sum_t dy[t, :]; dy F32 (f32 != 0) or BF16. */
qrl_status qrl_cuda_train_colsum(float *db, const void *dy, int f32, int T, int N, void *stream,
                                 qrl_error *err);

/* h = bf16(silu(gate) * up) over n elements (gate, up BF16). */
qrl_status qrl_cuda_train_swiglu_forward(uint16_t *h, const uint16_t *gate, const uint16_t *up,
                                         int64_t n, void *stream, qrl_error *err);
/* dgate = bf16(dh * up * s * (1 + gate * (1 - s))), dup = bf16(dh * silu(gate)),
 * s = sigmoid(gate); dh F32.  WRITTEN (GEMM inputs). */
qrl_status qrl_cuda_train_swiglu_backward(uint16_t *dgate, uint16_t *dup, const float *dh,
                                          const uint16_t *gate, const uint16_t *up, int64_t n,
                                          void *stream, qrl_error *err);

/* Per row of logits [T, V] (F32), one online pass: lse, logp = z[target] - lse (0 for
 * target -1), ent = lse - sum_j p_j z_j.  Targets checked by the caller. */
qrl_status qrl_cuda_train_logprob_forward(float *logp, float *ent, float *lse,
                                          const float *logits, const int32_t *targets, int T,
                                          int V, void *stream, qrl_error *err);
/* dlogits [T, V] BF16 for rows given (a chunk of rows: pass the chunk's pointers):
 *   dz_j = dlogp (1[j == target] - p_j) - dent p_j (log p_j + ent),  p_j = exp(z_j - lse).
 * dent may be NULL (then ent is not read). */
qrl_status qrl_cuda_train_logprob_backward(uint16_t *dlogits, const float *logits,
                                           const int32_t *targets, const float *lse,
                                           const float *ent, const float *dlogp,
                                           const float *dent, int T, int V, void *stream,
                                           qrl_error *err);

/* AdamW (common/train/adamw.h formulas).  Sum of squares of g[n] into part[blocks]
 * (per-block partials, F64) and the first non-finite index into *bad (int64, device,
 * set to n by the caller first: it takes the minimum).  blocks = qrl_cuda_train_norm_parts. */
int qrl_cuda_train_norm_parts(void);
qrl_status qrl_cuda_train_sumsq(double *part, int64_t *bad, const float *g, size_t n,
                                void *stream, qrl_error *err);
/* One AdamW step per element with the host-computed scalars of qrl_adamw_step:
 *   g = grads * scale;  p = p * decay;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps);  p_bf16 = bf16(p). */
typedef struct qrl_cuda_adamw_scalars {
    float scale, decay, b1, b2, omb1, omb2, step_size, bc2_sqrt, eps;
} qrl_cuda_adamw_scalars;
qrl_status qrl_cuda_train_adamw(float *p, uint16_t *p_bf16, float *m, float *v, const float *g,
                                size_t n, const qrl_cuda_adamw_scalars *s, void *stream,
                                qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
