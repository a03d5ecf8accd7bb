/* CPU reference forward pass of the Llama family over the paged KV cache (SPEC §2):
 *   x = embed(token)
 *   per layer: h = rmsnorm(x); q,k,v = h·Wq/Wk/Wv (+bias); [Qwen3: rmsnorm per head on
 *   q,k]; rope(q,k); write k,v at the position; a = attention over positions [0, pos];
 *   x += a·Wo (+bias); h = rmsnorm(x); x += (silu(h·Wg) * (h·Wu))·Wd
 *   logits = rmsnorm(x)·lm_head
 * All arithmetic in F32 (sums of squares and softmax denominators in double), except
 * what the formats define (SPEC §3):
 *  - the projections (·W above) run through the model's precision-tagged linear layers
 *    (qrl_model_quantize, model/linear.h); the LM head stays high precision;
 *  - attention reads K/V back from the cache in its format, in prefill too (a chunk's
 *    own positions are read quantized, never the fresh F32 values), so decode and
 *    prefill re-scoring agree bit for bit for every KV format (fp8: while both calibrate
 *    on rows with the same power-of-two scales).  f32/bf16 caches use the two-pass
 *    reference kernel; quantized caches gather dequantized rows and merge two partial
 *    softmax-attentions (int4-protected: INT4 region and INT8 side cache; SPEC §3
 *    KV4-RL), each row attending right after its own write.
 *
 * Rows are independent except through the KV cache, so one sequence's logits from a
 * batched decode equal the same position's logits from a prefill bit for bit. */
#ifndef QRL_MODEL_FORWARD_H
#define QRL_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "model/kv_cache.h"
#include "model/model.h"

typedef struct qrl_forward qrl_forward; /* opaque: activations and scratch */

/* Workspace for `m` (borrowed; must outlive the workspace): activation buffers for up to
 * `max_rows` token rows per pass (prefill chunk length = decode batch size) and
 * attention scratch for contexts up to `max_ctx` positions.  Everything is allocated
 * here, none during a pass.  *out owned by the caller (qrl_forward_free).
 * Errors: OUT_OF_RANGE (max_rows or max_ctx <= 0), NOMEM. */
qrl_status qrl_forward_new(const qrl_model *m, int max_rows, int max_ctx, qrl_forward **out,
                           qrl_error *err);
void qrl_forward_free(qrl_forward *f);

/* Prefill: append tokens[0..n) to sequence `seq` at positions [len, len + n) (len =
 * qrl_kv_cache_seq_len), in chunks of max_rows.  logits (caller-owned F32): [n, vocab]
 * when all_logits, else [vocab] for the last position only; may be NULL for none.
 * On success the sequence length grows by n.
 * Errors: INVALID_ARGUMENT (token id outside [0, vocab): names the index; n <= 0),
 * OUT_OF_RANGE (len + n beyond the model context, the cache's max_seq_len or max_ctx),
 * NOMEM (KV pool exhausted).  On error the committed length is unchanged. */
qrl_status qrl_forward_prefill(qrl_forward *f, qrl_kv_cache *kv, int seq, const int32_t *tokens,
                               int n, float *logits, bool all_logits, qrl_error *err);

/* Batched decode: one token per sequence, tokens[i] appended to seqs[i] at its current
 * length; sequences may have different lengths but must be distinct.  logits:
 * [batch, vocab] (caller-owned F32).  batch <= max_rows.
 * Errors: INVALID_ARGUMENT (bad token id, repeated sequence, batch out of range),
 * OUT_OF_RANGE (a sequence at its context limit: names it), NOMEM (KV pool exhausted). */
qrl_status qrl_forward_decode(qrl_forward *f, qrl_kv_cache *kv, const int *seqs,
                              const int32_t *tokens, int batch, float *logits, qrl_error *err);

/* TRACE (model/trace_rec.h): attach a recorder (borrowed; NULL detaches; must outlive
 * its attachment).  The rows the recorder was given as targets before a prefill or decode
 * call have the input of every captured site written to their buffers, quantized by
 * qrl_trace_capture exactly as the linear (w4a4-nvfp4) or the fp4 KV write quantizes it;
 * a successful call clears the targets.  The caller attaches it only where the captured
 * sites are FP4 (the layout says which).  Not recording costs one test per site. */
struct qrl_trace_recorder;
void qrl_forward_set_recorder(qrl_forward *f, struct qrl_trace_recorder *rec);

/* Largest context the workspace and model allow: min(max_ctx, cfg.max_seq_len). */
int qrl_forward_max_ctx(const qrl_forward *f);

#endif
