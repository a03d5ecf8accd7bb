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
#include "model/trace_rec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_model_train qrl_model_train_t; /* opaque: activations and gradients */

/* Quantization-aware training (SPEC §6, TRACE): the forward fake-quantizes what a
 * w4a4-nvfp4 rollout quantizes, the backward passes gradients straight through (STE):
 *   weights   every projection (not the embedding, norms or LM head) to NVFP4 per tensor,
 *             bit-identical to qrl_model_quantize's (linear.h, qrl_nvfp4_quantize with
 *             one global scale), re-quantized from the master weights at every forward;
 *   inputs    each projection's input row per token (the TRACE sites attn_in, attn_out,
 *             mlp_in, mlp_down) and, with qat_kv (an fp4 KV rollout), K after RoPE and V
 *             per KV head: NVFP4 with a per-row global scale, guided by the rollout's
 *             record where one is attached (qrl_trace_guided_quantize: the recorded
 *             scales and the code whose LSB matches), nearest rounding elsewhere.
 * Backward: d/dW of a projection is d/dW_q (dY^T X_q), d/dX is d/dX_q = dY W_q, and a
 * fake-quantized activation's gradient passes to its input unchanged. */
typedef enum qrl_qat_mode {
    QRL_QAT_OFF = 0,   /* plain F32 training (default) */
    QRL_QAT_NVFP4 = 1, /* as above */
} qrl_qat_mode;

/* Engine options (memory is sized from them at creation). */
typedef struct qrl_model_train_opts {
    int max_tokens;             /* packed tokens per forward (activation capacity), >= 1 */
    bool recompute_activations; /* keep only each layer's input; recompute the layer in
                                   the backward (see the file comment); default false */
    qrl_qat_mode qat;           /* learner.qat (default off) */
    bool qat_kv;                /* QAT: fake-quantize K and V too (the rollout's fp4 KV) */
    bool qat_weights_only;      /* QAT: weights only, activations stay F32 (tests, ablation) */
    bool trace_guidance;        /* learner.trace_guidance: use attached records (QAT only) */
} qrl_model_train_opts;

/* QAT counters since creation or the last reset: rows attached with complete records
 * (guided) and without (missing or incomplete records: nearest rounding), activation
 * elements quantized with a record and without, and guided elements whose code differs
 * from nearest rounding (qrl_trace_metric_disagree_share(disagree, elements_guided)). */
typedef struct qrl_qat_stats {
    uint64_t rows_guided, rows_unguided;
    uint64_t elements_guided, elements_nearest, disagree;
} qrl_qat_stats;

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

/* ---- QAT with TRACE guidance ---------------------------------------------------------- */

/* Which weights the replicas decoded the attached sequences with (from the next forward
 * on): off (the default) = the master values, as a replica that loaded the same F32
 * checkpoint (version 0); on = every parameter rounded to BF16 first, as a replica that
 * received a version over the BF16 weight stream (services/learner/weights.c).  Every
 * QAT forward computes with these values (projections fake-quantized from them, the
 * embedding, norms, biases and head as they are); gradients still go to the F32 masters
 * (straight through).  No effect without QAT. */
void qrl_model_train_qat_set_bf16(qrl_model_train_t *tr, bool on);
/* Forget every attached record: the next forward rounds to nearest everywhere until
 * records are attached again (call once per packed batch, before attaching). */
void qrl_model_train_qat_clear(qrl_model_train_t *tr);
/* Attach one sequence's records to the next forward's packed row: the sequence occupies
 * tokens [seq_begin, seq_begin + n_prompt + n_response) of the row (prompt, then
 * response); response record k guides position seq_begin + n_prompt - 1 + k (the one
 * whose logits give response token k; trace_rec.h's alignment).  rec (borrowed: must
 * outlive the next forward) NULL, or holding other than n_response tokens, leaves the
 * sequence on nearest rounding and counts it in rows_unguided (never an error), as does
 * an engine without trace_guidance.  Errors: OUT_OF_RANGE (positions outside
 * [0, max_tokens), n_prompt < 1, n_response < 0). */
qrl_status qrl_model_train_qat_attach(qrl_model_train_t *tr, int seq_begin, int n_prompt,
                                      int n_response, const qrl_trace_response *rec,
                                      qrl_error *err);
void qrl_model_train_qat_stats(const qrl_model_train_t *tr, qrl_qat_stats *out);
void qrl_model_train_qat_stats_reset(qrl_model_train_t *tr);

/* The QAT forward's quantizer of one site vector x [n] (F32) into y [n] (may alias x):
 * guided by rec's entry (token, layer, kind, head) when it exists with n elements
 * (returns true; codes [ceil(n/2)], may be NULL, gets the packed E2M1 codes; *disagree,
 * may be NULL, += elements whose code differs from nearest), else
 * qrl_nvfp4_fake_quantize_row (returns false; codes and *disagree untouched).  Guided: the
 * record's E4M3 block scales and code LSBs with the tensor scale of x's own amax (x may be
 * a multiple of the recorded vector: UAQ), which is the recorded one for identical x. */
bool qrl_model_train_qat_quantize_row(const qrl_trace_response *rec, uint32_t token, int layer,
                                      qrl_trace_site_kind kind, int head, const float *x,
                                      uint32_t n, float *y, uint8_t *codes, uint64_t *disagree);
/* The QAT forward's weight quantizer: w [rows, cols] -> y [rows, cols] fake-quantized to
 * NVFP4 with one global scale, as qrl_model_quantize (codes [rows * ceil(cols/2)] and
 * scales [rows * ceil(cols/16)] are caller scratch). */
void qrl_model_train_qat_weight(const float *w, int rows, int cols, uint8_t *codes,
                                uint8_t *scales, float *y);

/* Logits [T, vocab] of the last forward (valid until its backward or the next forward):
 * for tests and greedy accuracy without a second pass.  NULL when there is none. */
const float *qrl_model_train_logits(const qrl_model_train_t *tr);

#ifdef __cplusplus
}
#endif
#endif
