/* Internal state of the rollout scheduler, shared by scheduler.c (loop) and group.c
 * (groups, scoring, emission).  Not a public header. */
#ifndef QRL_ROLLOUT_SCHED_INTERNAL_H
#define QRL_ROLLOUT_SCHED_INTERNAL_H

#include <stddef.h>

#include "model/forward.h"
#include "rollout/scheduler.h"

/* One response (one sequence).  ids = prompt followed by the generated tokens, so any
 * range [fed, total) can be prefilled in one call. */
typedef struct qrl_sched_resp {
    int32_t *ids;        /* [n_prompt + cap] */
    float *lp, *lp_full; /* [cap] */
    uint64_t *ver;       /* [cap] */
    int n_gen;
    qrl_finish_reason finish;
    size_t text_checked; /* decoded bytes already searched for stop strings */
    long stop_end;       /* bytes of text to keep after a stop-string hit; -1 = none */
    char *text;          /* decoded at emission (malloc'd) */
    qrl_verify_result vr;
    qrl_status verify_status;
    uint32_t truncated_tokens, reprefills, restarts;
    uint64_t admitted_us, prefill_us, decode_us, verify_us;
    uint64_t started_unix_ms, finished_unix_ms;
    qrl_trace_buf *trace; /* TRACE records [cap], NULL when not recording */
} qrl_sched_resp;

typedef struct qrl_sched_group {
    struct qrl_sched_group *next; /* FIFO of live groups, submission order */
    uint64_t group_id;
    uint32_t G, next_admit, n_done;
    int n_prompt;
    bool too_long; /* every response finished PROMPT_TOO_LONG at submit */
    int max_new;
    qrl_sampling_params sampling;
    int32_t *stop_ids;
    int n_stop_ids;
    char **stop_strings;
    int n_stop_strings;
    char *task, *reference;
    const qrl_verifier *verifier;
    void *user;
    uint64_t submit_us;
    qrl_sched_resp *resp;              /* [G] */
    qrl_scheduler_response *out;       /* [G], filled at emission */
} qrl_sched_group;

/* A decode slot: empty when g == NULL.  fed = positions of ids[] in the KV sequence;
 * ready = logits of position fed - 1 when the next token is due (row of s->logits or
 * s->dec_logits); drawn = 1 + the decode row whose token the device sampled instead
 * (s->dec_samples, s->dec_errs), 0 when none. */
typedef struct qrl_sched_slot {
    qrl_sched_group *g;
    int r;
    int seq;
    int fed;
    const float *ready;
    int drawn;
} qrl_sched_slot;

struct qrl_scheduler {
    qrl_scheduler_config cfg;
    const qrl_model *model;
    const qrl_tokenizer *tok;
    qrl_scheduler_group_fn on_group;
    void *ctx;
    int ctx_len, vocab, n_slots, max_rows;
    uint64_t version;
    /* the engine (scheduler.c's backend functions): CPU forward + paged KV cache, or the
     * CUDA engine (cfg.device >= 0), which owns its KV cache */
    qrl_kv_cache *kv;
    qrl_forward *fwd;
    struct qrl_cuda_forward *gpu;
    int gpu_rows;              /* the CUDA engine's rows per pass */
    const struct qrl_sched_backend *be; /* set once the engine is made */
    int kv_total_blocks;
    qrl_sampler *sampler;
    qrl_sched_slot *slots;     /* [n_slots] */
    float *logits;             /* [n_slots, vocab] prefill results, by slot */
    float *dec_logits;         /* [n_slots, vocab] decode results, by batch row */
    int *dec_seqs, *dec_slots; /* [n_slots] */
    int32_t *dec_tokens;       /* [n_slots] */
    /* [n_slots] device-sampled decode rows (CUDA engine): the draws' params and keys,
     * their samples and per-row refusals */
    qrl_sample_draw *dec_draws;
    qrl_sample *dec_samples;
    qrl_error *dec_errs;
    qrl_sched_group *head, *tail;
    qrl_scheduler_stats stats;
    /* TRACE recording (cfg.trace_record): the sites and the engine's recorder (the CPU
     * forward's, or the CUDA engine's device recorder) */
    qrl_trace_layout *trace_layout;
    qrl_trace_recorder *trace_rec;
    struct qrl_cuda_trace_recorder *gpu_trace;
};

/* ---- engine backend ----------------------------------------------------------------
 * Chosen once by qrl_scheduler_new: the CPU one (scheduler.c) or the CUDA one
 * (rollout_cuda.c, the only file of common/rollout that knows whether this build has
 * CUDA).  The CPU forward over a qrl_kv_cache, or the CUDA engine (cfg.device >= 0), which owns
 * its KV cache.  Both hand back host F32 logits, or the CUDA engine samples its decode
 * rows itself with the CPU sampler's keyed procedure (decode_sample), so admission,
 * log-probs, end checks and the sync boundary are one code path.  The CPU functions are
 * the calls the scheduler made before the seam existed, in the same order (bit-identical
 * results). */
typedef struct qrl_sched_backend {
    qrl_status (*seq_new)(qrl_scheduler *s, int *seq, qrl_error *err);
    void (*seq_free)(qrl_scheduler *s, int seq);
    /* blocks for positions [0, n) taken now */
    qrl_status (*reserve)(qrl_scheduler *s, int seq, int n, qrl_error *err);
    void (*clear)(qrl_scheduler *s, int seq); /* length 0, blocks back to the pool */
    int (*free_blocks)(const qrl_scheduler *s);
    /* append ids[0..n); logits [vocab] of the last position when non-NULL */
    qrl_status (*prefill)(qrl_scheduler *s, int seq, const int32_t *ids, int n, float *logits,
                          qrl_error *err);
    /* one token per row: s->dec_seqs / s->dec_tokens [b] -> s->dec_logits [b, vocab] */
    qrl_status (*decode)(qrl_scheduler *s, int b, qrl_error *err);
    /* the same step sampling on the engine: draws s->dec_draws [b] -> s->dec_samples,
     * s->dec_errs [b]; NULL when the engine cannot (the CPU one) */
    qrl_status (*decode_sample)(qrl_scheduler *s, int b, qrl_error *err);
    /* weights: the workspace / device copy for `model` (new, or a sync-boundary swap) */
    qrl_status (*load)(qrl_scheduler *s, const qrl_model *model, qrl_error *err);
    /* weights from a device BF16 stream (NULL: this engine cannot) */
    qrl_status (*load_stream)(qrl_scheduler *s, const struct qrl_cuda_stream_tensor *t, size_t n,
                              qrl_error *err);
    void (*close)(qrl_scheduler *s);
    /* TRACE (called only while s->trace_layout is set, model/trace_rec.h): make the engine's
     * recorder for s->trace_layout and attach it; the targets of the next prefill / decode
     * call (clear, then one target per recorded row); bring the records of the sequences
     * released this step into their buffers (once per step, before emission: the CUDA
     * recorder keeps them on the device until then; NULL where a pass writes them on the
     * host); the tap; the recorder's time; free it. */
    qrl_status (*trace_open)(qrl_scheduler *s, qrl_error *err);
    void (*trace_clear)(qrl_scheduler *s);
    void (*trace_target)(qrl_scheduler *s, int row, qrl_trace_buf *buf, uint32_t token);
    qrl_status (*trace_sync)(qrl_scheduler *s, qrl_error *err);
    qrl_status (*trace_set_tap)(qrl_scheduler *s, qrl_trace_tap_fn fn, void *ctx, qrl_error *err);
    uint64_t (*trace_capture_ns)(const qrl_scheduler *s);
    void (*trace_close)(qrl_scheduler *s);
} qrl_sched_backend;

/* The CUDA engine for s (rollout_cuda.c): checks (qrl_scheduler_check_device), makes the
 * device forward with n_blocks KV blocks, uploads model and sets s->gpu and s->be.
 * Errors: UNSUPPORTED (no CUDA in this build, model precision, kv format), CUDA. */
qrl_status qrl_sched_gpu_open(qrl_scheduler *s, const qrl_model *model, int n_blocks,
                              qrl_error *err);
/* cudaSetDevice is per thread, and the daemon makes the scheduler on one thread and steps
 * it on another: every entry point selects the device and restores the caller's.
 * Returns the device to restore (-1: none; always -1 on the CPU engine). */
int qrl_sched_dev_enter(const qrl_scheduler *s);
void qrl_sched_dev_leave(const qrl_scheduler *s, int prev);

/* The recorded sites of s's trace layout for the engines' start line, "mlp_in layers 0,
 * k layers 2-4" (truncated to cap). */
void qrl_sched_trace_sites_text(const qrl_scheduler *s, char *out, size_t cap);

uint64_t qrl_sched_now_us(void);
uint64_t qrl_sched_unix_ms(void);
/* Most tokens a response of g can generate: min(max_new_tokens, context - prompt). */
int qrl_sched_response_cap(const qrl_scheduler *s, const qrl_sched_group *g);
/* Does the response's decoded text now contain a stop string that touches the newest
 * token's text?  Records where to cut (rp->stop_end). */
bool qrl_sched_stop_string_hit(qrl_scheduler *s, qrl_sched_group *g, qrl_sched_resp *rp);
/* Discard a response's tokens (staleness restart). */
void qrl_sched_resp_restart(qrl_sched_resp *rp);
/* Score, emit and free every group whose G responses have ended; returns how many. */
int qrl_sched_emit_finished(qrl_scheduler *s);
void qrl_sched_group_free(qrl_sched_group *g);

#endif
