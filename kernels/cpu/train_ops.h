/* CPU reference of the learner's layers: forward passes that keep what the backward
 * needs, and the backward passes (llm.c's train_gpt2.c, for the Llama family of SPEC §2).
 *
 * Conventions for the whole header:
 *  - dtype F32 for activations, parameters and gradients; token ids, position ids and
 *    segment ids are int32.  Matrices are row-major; linear weights are [out, in] as
 *    nn.Linear.  T = tokens in the (packed) batch, D = model width, H = query heads,
 *    Hkv = key/value heads, hd = head_dim, F = MLP width, V = vocabulary.
 *  - Backward functions ACCUMULATE (+=) into every gradient they produce (inputs and
 *    parameters), as llm.c does: the caller zeroes gradient buffers once per step, and
 *    fan-out (the residual stream, a tied embedding, q and k sharing a RoPE table)
 *    needs no extra adds.  The one exception is qrl_train_logprob_backward, which
 *    writes (=) dlogits and may work in place over the logits.
 *  - Buffers are caller-owned and allocated up front (STYLE 6); nothing here allocates
 *    or keeps a pointer.  Outputs do not alias inputs unless a comment says so.
 *  - Loops are OpenMP-parallel over independent outputs, and every output element is
 *    summed by one thread in a fixed order, so results do not depend on the thread
 *    count.
 *  - Shape arguments are positive (checked with QRL_CHECK: a violated shape is a caller
 *    bug).  Data that can come from outside (token ids, target ids) is validated and
 *    reported through qrl_error. */
#ifndef QRL_CPU_TRAIN_OPS_H
#define QRL_CPU_TRAIN_OPS_H

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embedding ------------------------------------------------------------------------ */

/* out[T, D] = table[tokens[t], :], table [V, D].
 * Errors: INVALID_ARGUMENT when a token id is outside [0, V) (names its position t);
 * nothing is written then. */
qrl_status qrl_train_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                       int T, int V, int D, qrl_error *err);
/* dtable[tokens[t], :] += dout[t, :] (rows hit by several tokens accumulate each).
 * tokens must have passed qrl_train_embedding_forward (checked). */
void qrl_train_embedding_backward(float *dtable, const float *dout, const int32_t *tokens,
                                  int T, int V, int D);

/* ---- linear layer -------------------------------------------------------------------- */

/* y[T, N] = x[T, K] W[N, K]^T + b[N]  (nn.Linear); b may be NULL (no bias).
 * Saves nothing: the backward reads x. */
void qrl_train_matmul_forward(float *y, const float *x, const float *W, const float *b, int T,
                              int K, int N);
/* dx[T, K] += dy[T, N] W[N, K];  dW[N, K] += dy^T x;  db[N] += sum_t dy[t, :].
 * Any of dx, dW, db may be NULL (not wanted: frozen weights, no bias, an input that is
 * a leaf). */
void qrl_train_matmul_backward(float *dx, float *dW, float *db, const float *dy, const float *x,
                               const float *W, int T, int K, int N);

/* ---- RMSNorm --------------------------------------------------------------------------- */

/* HF LlamaRMSNorm over rows of x[n, d] with gain g[d]:
 *   rstd[i] = 1 / sqrt(mean_j x[i, j]^2 + eps),  y[i, j] = x[i, j] * rstd[i] * g[j].
 * Saves rstd[n] for the backward.  y may alias x. */
void qrl_train_rmsnorm_forward(float *y, float *rstd, const float *x, const float *g, int n,
                               int d, float eps);
/* With xh = x * rstd and dxh = dy * g:
 *   dx[i, :] += rstd[i] * (dxh - xh * mean_j(dxh * xh)),  dg[j] += sum_i dy[i, j] xh[i, j].
 * dx or dg may be NULL. */
void qrl_train_rmsnorm_backward(float *dx, float *dg, const float *dy, const float *x,
                                const float *g, const float *rstd, int n, int d);

/* Qwen3 q_norm / k_norm: RMSNorm of every head vector of x[T, H, hd] with one gain
 * g[hd] shared by all heads; rstd [T * H].  The same functions as above with n = T * H
 * rows of width hd (a head is a contiguous row), named for readability at call sites. */
static inline void qrl_train_head_rmsnorm_forward(float *y, float *rstd, const float *x,
                                                  const float *g, int T, int H, int hd,
                                                  float eps) {
    qrl_train_rmsnorm_forward(y, rstd, x, g, T * H, hd, eps);
}
static inline void qrl_train_head_rmsnorm_backward(float *dx, float *dg, const float *dy,
                                                   const float *x, const float *g,
                                                   const float *rstd, int T, int H, int hd) {
    qrl_train_rmsnorm_backward(dx, dg, dy, x, g, rstd, T * H, hd);
}

/* ---- rotary position embedding (HF rotate_half layout) ----------------------------------- */

/* Frequency scaling as HF config.rope_scaling.rope_type: NONE = "default", LINEAR =
 * "linear" (inv_freq / factor), LLAMA3 = "llama3" (Llama 3.1: low frequencies divided by
 * factor, high ones kept, a smooth interpolation in between). */
typedef enum qrl_train_rope_scaling {
    QRL_TRAIN_ROPE_SCALING_NONE = 0,
    QRL_TRAIN_ROPE_SCALING_LINEAR = 1,
    QRL_TRAIN_ROPE_SCALING_LLAMA3 = 2,
} qrl_train_rope_scaling;

typedef struct qrl_train_rope_config {
    double theta;              /* rope_theta, e.g. 10000, 500000, 1000000 */
    qrl_train_rope_scaling scaling;
    double factor;             /* LINEAR, LLAMA3 */
    double low_freq_factor;    /* LLAMA3 */
    double high_freq_factor;   /* LLAMA3 */
    int original_max_position; /* LLAMA3: original_max_position_embeddings */
} qrl_train_rope_config;

/* inv_freq[hd / 2]: 1 / theta^(2j / hd) in F32 (HF builds it as a float32 tensor), then
 * scaled as transformers' _compute_llama3_parameters / linear scaling.  hd even.  Computed
 * by the inference model's qrl_cpu_rope_inv_freq (cpu/ops.h), so both sides agree bit for
 * bit; this adds checks of the scaling parameters. */
void qrl_train_rope_inv_freq(float *inv_freq, int hd, const qrl_train_rope_config *cfg);
/* cos/sin[T, hd / 2] of angle = (float)pos[t] * inv_freq[j] (the product in F32, as HF's
 * float32 matmul of inv_freq and position_ids).  Explicit position ids let packed
 * sequences restart at 0 in each segment.  Computed once per batch and shared by q, k,
 * forward and backward. */
void qrl_train_rope_cos_sin(float *cos_t, float *sin_t, const int32_t *pos,
                            const float *inv_freq, int T, int hd);
/* HF apply_rotary_pos_emb on x[T, nh, hd] (nh = H for q, Hkv for k), pairs (j, j + hd/2):
 *   y[j] = x[j] cos - x[j + hd/2] sin,   y[j + hd/2] = x[j + hd/2] cos + x[j] sin.
 * Saves nothing (a rotation).  y may alias x. */
void qrl_train_rope_forward(float *y, const float *x, const float *cos_t, const float *sin_t,
                            int T, int nh, int hd);
/* dx += R(-angle) dy: the transpose of a rotation is the inverse rotation. */
void qrl_train_rope_backward(float *dx, const float *dy, const float *cos_t, const float *sin_t,
                             int T, int nh, int hd);

/* ---- causal grouped-query attention over packed sequences -------------------------------- */

/* out[T, H, hd] = softmax(q k^T / sqrt(hd) + mask) v per query head, q [T, H, hd],
 * k and v [T, Hkv, hd], H a multiple of Hkv; query head h reads kv head
 * h / (H / Hkv) (HF repeat_kv).  Packed sequences: a segment is a maximal run of
 * equal consecutive ids in seg[T] (an id that comes back after another starts a new
 * segment); token t attends to token s iff s <= t and no segment boundary lies between
 * them: a block-diagonal causal mask.  Every token sees at least itself.  Cost is
 * O(T * segment length), not O(T^2).
 * Saves lse[H, T] (the log-sum-exp of each query row's scaled scores), NOT the
 * probabilities: the backward recomputes them as exp(score - lse), FlashAttention-2
 * style, so memory stays O(T) per head at the cost of recomputing q k^T twice. */
void qrl_train_attention_forward(float *out, float *lse, const float *q, const float *k,
                                 const float *v, const int32_t *seg, int T, int H, int Hkv,
                                 int hd);
/* Gradients of the forward above, given dout [T, H, hd] and the forward's `out` and
 * `lse`: with P recomputed, dP = dout v^T, Dt = rowsum(dout * out), dS = P (dP - Dt):
 *   dq += dS k / sqrt(hd),  dk += dS^T q / sqrt(hd),  dv += P^T dout  (summed over the
 * query heads that share a kv head).  dq, dk, dv may each be NULL. */
void qrl_train_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const int32_t *seg,
                                  int T, int H, int Hkv, int hd);

/* ---- SwiGLU and residual ----------------------------------------------------------------- */

/* h[n] = silu(gate[n]) * up[n], silu(x) = x / (1 + exp(-x)).  Saves nothing. */
void qrl_train_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
/* dgate += dh * up * s * (1 + gate * (1 - s)),  dup += dh * silu(gate),  s = sigmoid(gate).
 * dgate or dup may be NULL. */
void qrl_train_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                               const float *up, int64_t n);

/* y[n] = a[n] + b[n]; y may alias a or b. */
void qrl_train_residual_forward(float *y, const float *a, const float *b, int64_t n);
/* da += dy, db += dy (either may be NULL; they may be the same buffer). */
void qrl_train_residual_backward(float *da, float *db, const float *dy, int64_t n);

/* ---- log-probabilities and entropy of the LM head ----------------------------------------- */

/* Target id meaning "no target here" (prompt tokens, padding): logp is 0 and carries
 * no gradient; the entropy is still computed. */
#define QRL_TRAIN_TARGET_IGNORE (-1)

/* One fused pass per row of logits[T, V] (online max / sum-exp, no probability buffer):
 *   lse[t]  = log sum_j exp(z[t, j]),
 *   logp[t] = z[t, targets[t]] - lse[t]                  (0 for QRL_TRAIN_TARGET_IGNORE),
 *   ent[t]  = -sum_j p_j log p_j = lse[t] - sum_j p_j z[t, j],   p = softmax(z[t, :]).
 * Sums in double.  lse is saved for the backward; ent may be NULL when not wanted.
 * Errors: INVALID_ARGUMENT when a target is >= V or negative other than IGNORE (names
 * t); nothing is written then. */
qrl_status qrl_train_logprob_forward(float *logp, float *ent, float *lse, const float *logits,
                                     const int32_t *targets, int T, int V, qrl_error *err);
/* Writes dlogits[T, V] for upstream gradients dlogp[T] (on logp) and dent[T] (on ent;
 * NULL = none), recomputing p_j = exp(z_j - lse) in the same pass:
 *   dz_j = dlogp * (1[j == target] - p_j) - dent * p_j * (log p_j + ent).
 * So dlogp = -1 gives the cross-entropy gradient softmax - onehot.  `ent` is needed only
 * when dent is given.  dlogits may be the logits buffer itself (in place). */
void qrl_train_logprob_backward(float *dlogits, const float *logits, const int32_t *targets,
                                const float *lse, const float *ent, const float *dlogp,
                                const float *dent, int T, int V);

#ifdef __cplusplus
}
#endif
#endif
