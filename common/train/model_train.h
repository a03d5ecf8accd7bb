/* Whole-model training engine on CPU (SPEC §2 model, §5 learner): forward over a packed
 * batch that returns per-token log-probs and entropies, and the backward to gradients of
 * every parameter of a qrl_model (llm.c's train_gpt2.c, for the Llama family).
 *
 * Parameters are the model's own F32 weights: the arena of qrl_model, in place.  The
 * gradients live in a second arena with the same layout (same offsets), so the flat pair
 * (qrl_model_train_params, qrl_model_train_grads) feeds qrl_adamw_step directly and the
 * gradient of tensor m->tensors[i] is at the same offset from the gradient arena as its
 * weights are from m->arena.  A tied LM head has no tensor of its own: its gradient is
 * added into the embedding's (PyTorch reports the tied weight once, as the embedding).
 *
 * Batch (sequence packing): T tokens in one row; seg[T] marks sequences (a maximal run of
 * equal consecutive ids, attention never crosses one), pos[T] the position ids (RoPE;
 * restart at 0 in each sequence, qrl_model_train_positions), targets[T] the token each
 * position should predict (the next token; QRL_TRAIN_TARGET_IGNORE = -1 for none: prompt,
 * last token, padding).
 *
 * Use: zero_grad; for each micro-batch { forward; backward }; optimizer step.  backward
 * ADDS into the gradients (gradient accumulation = calling forward/backward several times
 * before the step).  Everything is allocated in qrl_model_train_new (STYLE 6): a forward
 * or backward never allocates.
 *
 * Activation recomputation (qrl_model_train_opts.recompute_activations; "activation
 * checkpointing" per layer): by default every activation of every layer is kept for the
 * backward.  With recomputation the forward keeps only each layer's input residual stream
 * (plus the head's buffers) and writes the layers into one shared set of buffers; the
 * backward re-runs layer l's forward from its input just before layer l's backward.
 * Memory per token drops from L x (4D + 3F + 3Q + 3KV + H + 2 [+ Q + KV + H + Hkv with
 * q/k norm]) floats to L x D + one layer's set (the formula without its input D); the
 * price is a second forward of L - 1 layers (the last one is still in the shared set; the
 * MLP's down projection is not needed) per backward.  Results are bit-identical either
 * way (the same code computes the same values; the kernels are deterministic).
 *
 * RoPE: both layouts the model may record (HALF for HF checkpoints, INTERLEAVED for
 * llama2.c's .bin), as the inference engine applies them.  Sliding windows are ignored as
 * in the inference engine (exact while a sequence is within the window).
 *
 * Numerics: F32 throughout (log-sum-exp and norms in double inside the layers), results
 * independent of the OpenMP thread count (kernels/cpu/train_ops.h). */
#ifndef QRL_TRAIN_MODEL_TRAIN_H
#define QRL_TRAIN_MODEL_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_model_train qrl_model_train_t; /* opaque: activations and gradients */

/* Engine options (memory is sized from them at creation). */
typedef struct qrl_model_train_opts {
    int max_tokens;             /* packed tokens per forward (activation capacity), >= 1 */
    bool recompute_activations; /* keep only each layer's input; recompute the layer in
                                   the backward (see the file comment); default false */
} qrl_model_train_opts;

/* Create the engine for model m (borrowed; must outlive the engine; its weights are the
 * parameters and are updated in place by the optimizer) with activation buffers for
 * packed batches of up to o->max_tokens tokens.  Gradients start at zero.  *out owned by
 * the caller (qrl_model_train_destroy); o is read during the call only.
 * Errors: OUT_OF_RANGE (max_tokens <= 0), NOMEM. */
qrl_status qrl_model_train_new_opts(qrl_model *m, const qrl_model_train_opts *o,
                                    qrl_model_train_t **out, qrl_error *err);
/* Shorthand: qrl_model_train_new_opts with max_tokens and no recomputation. */
qrl_status qrl_model_train_new(qrl_model *m, int max_tokens, qrl_model_train_t **out,
                               qrl_error *err);
/* Free the engine (not the model); NULL is a no-op. */
void qrl_model_train_destroy(qrl_model_train_t *tr);

/* Bytes of the engine's activation block (saved activations, backward scratch and the
 * copies of the batch's ids), excluding the gradient arena: for logs and tests. */
size_t qrl_model_train_activation_bytes(const qrl_model_train_t *tr);

/* The flat parameter block (m->arena; *n = its trainable length: every tensor, including
 * the zero padding between tensors, excluding the RoPE table after them) and the gradient
 * block of the same length and layout.  Pointers valid while the engine lives. */
float *qrl_model_train_params(qrl_model_train_t *tr, size_t *n);
float *qrl_model_train_grads(qrl_model_train_t *tr, size_t *n);
/* Gradient of tensor `t` (one of the model's m->tensors): same shape as t->data. */
float *qrl_model_train_grad_of(qrl_model_train_t *tr, const qrl_model_tensor *t);

/* Set every gradient to zero (call once per optimizer step, before the micro-batches). */
void qrl_model_train_zero_grad(qrl_model_train_t *tr);

/* Position ids that restart at 0 in every sequence of seg[T] (a new sequence begins where
 * the id changes), into pos[T]. */
void qrl_model_train_positions(int32_t *pos, const int32_t *seg, int T);

/* Forward over a packed batch of T tokens (int32 arrays [T], see the file comment),
 * keeping every activation the backward needs (with recomputation: each layer's input).
 * Writes logp[T] (log p of targets[t] at position t, natural log; 0 where the target is
 * -1) and, when ent is not NULL, ent[T] (entropy of the next-token distribution at t,
 * nats).  Either output may be NULL.
 * Errors: OUT_OF_RANGE (T outside [1, max_tokens]; a position id negative or >=
 * cfg.max_seq_len: names t), INVALID_ARGUMENT (token id outside [0, vocab) or target
 * outside [0, vocab) other than -1: names t).  On error the engine holds no forward. */
qrl_status qrl_model_train_forward(qrl_model_train_t *tr, const int32_t *tokens,
                                   const int32_t *targets, const int32_t *pos,
                                   const int32_t *seg, int T, float *logp, float *ent,
                                   qrl_error *err);

/* Backward of the last forward: given dlogp[T] = d loss / d logp[t] and optionally
 * dent[T] = d loss / d ent[t] (NULL = the loss does not use the entropy), ADD d loss /
 * d parameter into the gradient block.  Consumes the forward (the logits buffer is
 * reused for their gradient): a second backward needs a new forward.
 * With recomputation layer l's forward is re-run just before layer l's backward.
 * Errors: INVALID_ARGUMENT (no forward since the last backward). */
qrl_status qrl_model_train_backward(qrl_model_train_t *tr, const float *dlogp,
                                    const float *dent, qrl_error *err);

/* Logits [T, vocab] of the last forward (valid until its backward or the next forward):
 * for tests and greedy accuracy without a second pass.  NULL when there is none. */
const float *qrl_model_train_logits(const qrl_model_train_t *tr);

#ifdef __cplusplus
}
#endif
#endif
