/* Rollout scheduler core (SPEC §4: quota-based asynchronous partial rollout; §3
 * Determinism).  Independent of networking: the rollout daemon feeds it prompt groups,
 * calls qrl_scheduler_step() from its engine thread, calls qrl_scheduler_swap_weights()
 * at a sync boundary and turns each finished group into a GroupResult.
 *
 * Model of work:
 *   - a prompt group asks for G responses to one prompt; each response is one sequence;
 *   - D decode slots hold running sequences; a response is admitted into a free slot
 *     only when the KV pool has the blocks for its worst case
 *     (prompt + min(max_new_tokens, context - prompt) - 1 positions), reserved up front,
 *     so a running sequence never waits for memory;
 *   - one step = admit, prefill (chunked: at most prefill_chunk prompt tokens per step),
 *     one batched decode of every sequence whose next token is due, sample, end
 *     responses, emit finished groups through the callback.
 * Overlap vs alternate mode (SPEC §4.6) is not a concern here: the daemon decides when
 * step() runs (while the learner trains, or not); the core behaves the same either way.
 *
 * Determinism: draws are keyed by (seed, group id, response index, absolute position)
 * and the CPU forward is batch-invariant, so without weight swaps every response is
 * bit-identical whatever D, the prefill chunk and the submission order (tested).  The
 * CUDA engine (config.device) keeps the keyed draws but not batch invariance (its GEMMs'
 * summation order may change with the batch shape).
 *
 * Threading: single-threaded.  Every function must be called from one thread (the
 * engine thread); the group callback runs on that thread inside qrl_scheduler_step. */
#ifndef QRL_ROLLOUT_SCHEDULER_H
#define QRL_ROLLOUT_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/trace_rec.h"
#include "tokenizer/tokenizer.h"
#include "verify/verify.h"

/* Why a response ended; the values equal proto FinishReason's. */
typedef enum qrl_finish_reason {
    QRL_FINISH_NONE = 0,            /* still running */
    QRL_FINISH_EOS = 1,             /* the configured EOS id was sampled */
    QRL_FINISH_STOP = 2,            /* a stop token id or stop string */
    QRL_FINISH_LENGTH = 3,          /* max_new_tokens or the context limit */
    QRL_FINISH_PROMPT_TOO_LONG = 4, /* prompt + 1 token does not fit the context */
    QRL_FINISH_ABORTED = 5,         /* sampling failed (NaN logits); logged */
} qrl_finish_reason;

/* "eos", "stop", "length", "prompt_too_long", "aborted", "none"; static. */
const char *qrl_finish_reason_name(qrl_finish_reason r);

typedef struct qrl_scheduler_config {
    int max_slots;          /* D: concurrent sequences, >= 1 (default 16) */
    int kv_block_size;      /* positions per KV block (default 16) */
    int kv_blocks;          /* pool size; 0 = max_slots full contexts (default 0) */
    qrl_kv_format kv_format;/* any implemented format (default F32; kv_cache.h) */
    int kv_sink, kv_recent; /* int4-protected side-cache widths (default 16 and 128) */
    int max_ctx;            /* prompt + response limit; 0 = the model's max_seq_len */
    int prefill_chunk;      /* prompt tokens prefilled per step over all sequences; 0 = no
                               limit (default 256) */
    int max_staleness;      /* SPEC §4.5; < 0 = no bound (default 1) */
    int32_t eos_token_id;   /* ends a response with EOS; -1 = none (default -1) */
    uint64_t version;       /* policy version of the initial weights (default 0) */
    int device;             /* engine: -1 = the CPU forward (default); >= 0 = the CUDA
                               forward (model/forward_cuda.h) on that device ordinal: the
                               model's precision (f32/bf16 as BF16, W8A8, W4A16), its own KV cache (f32 runs as bf16);
                               decode rows are sampled on the device (the CPU sampler's
                               draws: qrl_cuda_forward_decode_sample), a prompt's first
                               token on the CPU from its prefill logits */
    bool host_sampling;     /* CUDA engine: copy every decode step's logits to the host and
                               sample there instead (default false; tests compare the two) */
    bool eager;             /* CUDA engine: launch each decode step's kernels one by one
                               instead of replaying CUDA graphs (vLLM's enforce_eager;
                               default false) */
    bool trace_record;      /* TRACE (SPEC §6, model/trace_rec.h): record every response
                               token's FP4 quantization at the captured sites; precision
                               w4a4-nvfp4 and/or kv fp4; on the CUDA engine the device
                               recorder, model/trace_rec_cuda.h (default false) */
    qrl_trace_sites trace_sites; /* which sites; n_clauses 0 = the default (deeper-half K/V,
                                    every linear input) */
} qrl_scheduler_config;

/* Fill *c with the defaults above. */
void qrl_scheduler_config_default(qrl_scheduler_config *c);

/* One prompt group to answer (borrowed by qrl_scheduler_submit, which copies it). */
typedef struct qrl_scheduler_group_desc {
    uint64_t group_id;             /* RNG key part; unique among live groups */
    uint32_t group_size;           /* G >= 1 */
    const int32_t *prompt;         /* [n_prompt] token ids, n_prompt >= 1 */
    int n_prompt;
    qrl_sampling_params sampling;  /* temperature, top_k, top_p, seed */
    int max_new_tokens;            /* >= 1 */
    const int32_t *stop_token_ids; /* [n_stop_token_ids], may be NULL */
    int n_stop_token_ids;
    const char *const *stop_strings; /* [n_stop_strings], non-empty strings; needs a tokenizer */
    int n_stop_strings;
    const char *task;              /* verifier name (qrl_verifier_find); NULL/"" = no reward */
    const char *reference;         /* reference answer for the verifier */
    void *user;                    /* passed back in the result (e.g. the Kafka offset) */
} qrl_scheduler_group_desc;

/* One finished response.  Arrays have n_tokens entries; all pointers borrowed from the
 * scheduler, valid only during the callback. */
typedef struct qrl_scheduler_response {
    const int32_t *tokens;        /* generated ids (EOS / stop token included) */
    const float *logprobs;        /* behavior log-prob (SPEC §4.2): of the distribution
                                     sampled from (after temperature and top-k/top-p
                                     masking; qrl_sample.logprob_truncated when masked) */
    const float *logprobs_full;   /* log softmax(logits / T)[token] over the full vocab */
    const uint64_t *versions;     /* policy version that produced each token */
    int n_tokens;
    qrl_finish_reason finish;
    const char *text;             /* decoded response ("" without a tokenizer); cut after
                                     the stop string that ended it */
    double reward;                /* verifier reward; 0 without a task */
    bool correct;
    const char *extracted;        /* verifier's extracted answer ("" if none) */
    qrl_status verify_status;     /* OK, or why the verifier failed (reward 0, logged) */
    bool sampling_truncated;      /* top-k/top-p masking was configured */
    uint32_t truncated_tokens;    /* tokens at which the mask removed mass */
    uint32_t reprefills;          /* sync-boundary re-prefills of the final attempt */
    uint32_t restarts;            /* staleness restarts before the final attempt */
    uint64_t queue_us;            /* submit -> first admitted */
    uint64_t prefill_us;          /* prompt prefill and re-prefills */
    uint64_t decode_us;           /* decode steps this response took part in */
    uint64_t verify_us;
    uint64_t started_unix_ms, finished_unix_ms;
    const qrl_trace_buf *trace;   /* TRACE records [0, n_tokens) (trace_rec.h's alignment:
                                     record k beside token k), NULL when not recording;
                                     pack them with qrl_trace_buf_pack */
} qrl_scheduler_response;

/* A finished group: responses in response-index order.  Borrowed, valid only during the
 * callback; copy what you keep. */
typedef struct qrl_scheduler_group_result {
    uint64_t group_id;
    uint32_t group_size;
    const int32_t *prompt;
    int n_prompt;
    const char *task;       /* "" when none */
    void *user;
    const qrl_scheduler_response *responses; /* [group_size] */
    uint64_t total_us;      /* submit -> emitted */
} qrl_scheduler_group_result;

/* Called once per finished group, from inside qrl_scheduler_step after the step's work
 * is done.  It may call qrl_scheduler_submit, never step or swap_weights. */
typedef void (*qrl_scheduler_group_fn)(const qrl_scheduler_group_result *res, void *ctx);

typedef struct qrl_scheduler_stats {
    uint64_t steps;
    uint64_t tokens_generated;   /* sampled tokens, discarded attempts included */
    uint64_t prefill_tokens;     /* positions prefilled (prompts and re-prefills) */
    uint64_t decode_rows;        /* rows over all batched decodes */
    uint64_t reprefills;         /* sequences re-prefilled at sync boundaries */
    uint64_t restarts;           /* staleness restarts (SPEC §4.5) */
    uint64_t groups_submitted, groups_emitted;
    uint64_t version;            /* current policy version */
    int running;                 /* sequences in slots */
    int queued_responses;        /* responses submitted but not yet admitted */
    int kv_free_blocks, kv_total_blocks;
    size_t trace_buf_bytes;      /* TRACE record buffers of live groups (0 when off) */
    uint64_t forward_us;         /* in the engine's prefill and decode calls, since creation */
    uint64_t trace_capture_us;   /* of forward_us, in the TRACE recorder (0 when off; CUDA
                                    engine: its host time only, the kernels are in the step) */
} qrl_scheduler_stats;

typedef struct qrl_scheduler qrl_scheduler; /* opaque */

/* Make a scheduler over `model` (borrowed: must stay alive until it is swapped out or
 * the scheduler is freed).  `tok` (borrowed, may be NULL) decodes response text for stop
 * strings and verifiers.  Allocates the KV pool, the forward workspace and the sampler.
 * With cfg.device >= 0 the CUDA engine holds the weights (F32 master weights rounded to
 * BF16, or the model's W8A8 / W4A16 codes and scales) and the KV pool on that device; the scheduler's calls select the device
 * on the calling thread and restore the previous one before returning.
 * *out owned by the caller (qrl_scheduler_free).  Errors: OUT_OF_RANGE (bad config, a
 * pool smaller than one full context; trace sites past the model's layers),
 * INVALID_ARGUMENT (trace_record with no FP4 site: neither w4a4-nvfp4 nor kv fp4),
 * UNSUPPORTED (KV format; device >= 0 in a build without CUDA), CUDA (no such
 * device, out of device memory), NOMEM. */
qrl_status qrl_scheduler_new(const qrl_model *model, const qrl_tokenizer *tok,
                             const qrl_scheduler_config *cfg, qrl_scheduler_group_fn on_group,
                             void *ctx, qrl_scheduler **out, qrl_error *err);
/* The engine precondition qrl_scheduler_new checks first, callable before loading a model
 * (a daemon refuses its settings at once): cfg->device < 0 is always OK; device >= 0 needs
 * a build with CUDA (every kv format and precision runs on the CUDA engine).
 * Errors: UNSUPPORTED, naming which.  Whether the device exists is not checked here
 * (qrl_rollout_gpu_check, gpu_memory.h). */
qrl_status qrl_scheduler_check_device(const qrl_scheduler_config *cfg, qrl_precision precision,
                                      qrl_error *err);
/* Free everything; unfinished groups are dropped without a callback. */
void qrl_scheduler_free(qrl_scheduler *s);

/* Queue a prompt group (copied).  A prompt with no room for one generated token
 * finishes all G responses with PROMPT_TOO_LONG (emitted at the next step).
 * Errors (nothing queued): INVALID_ARGUMENT (G = 0, empty prompt, a token id outside
 * the vocabulary: names the index, max_new_tokens < 1, bad sampling params, empty stop
 * string, stop strings without a tokenizer, group id already live), NOT_FOUND (unknown
 * task), NOMEM. */
qrl_status qrl_scheduler_submit(qrl_scheduler *s, const qrl_scheduler_group_desc *g,
                                qrl_error *err);

/* One scheduling step (see the file comment); *emitted (may be NULL) = groups emitted.
 * A sampling failure ends that response with ABORTED and is logged, not returned.
 * Errors: those of the forward pass, not expected once submit has validated the group
 * and admission has reserved the KV (a caller-visible failure means a bug). */
qrl_status qrl_scheduler_step(qrl_scheduler *s, int *emitted, qrl_error *err);

/* True when nothing is queued or running (every submitted group was emitted). */
bool qrl_scheduler_idle(const qrl_scheduler *s);

/* Sync boundary (SPEC §4.4-4.5), between steps: switch to `model` (borrowed; same
 * architecture) at policy `version` (> current).  Every unfinished response whose oldest
 * token is more than max_staleness versions behind `version` is restarted from its
 * prompt (tokens discarded, restarts += 1); every other one keeps its tokens, log-probs
 * and versions and is re-prefilled (prompt + tokens so far) with the new weights into
 * fresh KV during the following steps.  The previous model may be freed on return.
 * CUDA engine: the new weights are uploaded into the same device buffers.
 * Errors: INVALID_ARGUMENT (architecture differs, version not increasing), UNSUPPORTED
 * (CUDA engine: a precision it does not run, or not the engine's), NOMEM (forward workspace; the old
 * weights stay in use), CUDA (upload failed: the engine is unusable). */
qrl_status qrl_scheduler_swap_weights(qrl_scheduler *s, const qrl_model *model,
                                      uint64_t version, qrl_error *err);

/* Whether qrl_scheduler_swap_weights_stream works here: the CUDA engine with BF16/F32 or
 * w8a8 weights (w4a16 projections are quantized on the host: use swap_weights). */
bool qrl_scheduler_takes_stream(const qrl_scheduler *s);
/* The sync boundary of qrl_scheduler_swap_weights with the weights taken from a BF16
 * stream on the engine's device (model/forward_cuda.h qrl_cuda_forward_upload_stream;
 * t[n] borrowed for the call): the device copy / quantization, then the same restarts and
 * re-prefills.  The scheduler's model keeps naming the weights.  Errors: UNSUPPORTED
 * (qrl_scheduler_takes_stream false), INVALID_ARGUMENT (version not increasing, a tensor
 * missing or of another size), CUDA (the engine is unusable). */
struct qrl_cuda_stream_tensor;
qrl_status qrl_scheduler_swap_weights_stream(qrl_scheduler *s, const struct qrl_cuda_stream_tensor *t,
                                             size_t n, uint64_t version, qrl_error *err);

void qrl_scheduler_get_stats(const qrl_scheduler *s, qrl_scheduler_stats *out);

/* TRACE: the captured sites (site ids and lengths for TraceChunk), NULL when not
 * recording.  Valid while the scheduler lives. */
const qrl_trace_layout *qrl_scheduler_trace_layout(const qrl_scheduler *s);
/* TRACE: observe every captured input (tests, metrics; trace_rec.h); no-op when not
 * recording. */
void qrl_scheduler_trace_set_tap(qrl_scheduler *s, qrl_trace_tap_fn fn, void *ctx);

#endif
