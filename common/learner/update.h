/* The learner's update step (SPEC §5) as a library: T finished prompt groups in, one
 * decoupled-PPO update of a qrl_model's F32 weights out, with the logged statistics.
 * The learner daemon (Kafka, gRPC, checkpoints) calls it; docs/learner-update.md has the
 * algorithm step by step and the definition of every statistic.
 *
 * One update (qrl_learner_update):
 *   1. validate every group (token ids, finite rewards and behavior log-probs); a bad
 *      group refuses the WHOLE update with an error naming it, and nothing changes;
 *   2. dynamic sampling (on by default): drop groups whose rewards are all equal;
 *   3. group advantages (GRPO / Dr.GRPO / RLOO), one per response, broadcast to its tokens;
 *   4. lp_prox: one forward pass with the pre-update parameters over every sequence
 *      (prompt + response packed; only response tokens scored), also giving the entropy;
 *   5. lp_ref from a frozen copy of the initial model when loss.beta > 0 (skipped else);
 *   6. ppo_epochs x minibatches (sequences shuffled by a seeded RNG; minibatch_seqs
 *      sequences each): zero grad; per micro-batch (at most max_tokens packed tokens)
 *      forward -> qrl_rl_loss_compute -> backward (gradients accumulate); clip + AdamW
 *      step at the LR schedule.  A non-finite loss or gradient skips that optimizer step
 *      (counted, logged), leaving the parameters untouched.
 *
 * Threading: single-threaded object (the engine inside uses OpenMP).  On the CPU engine
 * results are bit-reproducible given the seed, the inputs and the update count, whatever
 * the OpenMP thread count (the training engine and AdamW are).  On the CUDA engine
 * (device >= 0) gradients are summed with atomics: reproducible to ~1e-8, not bit for bit. */
#ifndef QRL_LEARNER_UPDATE_H
#define QRL_LEARNER_UPDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "rl/rl.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"
#include "train/model_train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- input ------------------------------------------------------------------------- */

/* One response of a group.  Arrays have n_tokens entries, borrowed for the call. */
typedef struct qrl_learner_response {
    const int32_t *tokens;     /* generated ids, EOS included when sampled */
    const float *logprobs;     /* behavior log-prob of each token (SPEC §4.2), natural log */
    const uint64_t *versions;  /* policy version of each token; may be NULL (statistics) */
    int n_tokens;              /* >= 0; an empty response trains nothing but its reward
                                  still counts in the group's advantages */
    float reward;              /* verifier reward, finite */
    const qrl_trace_response *trace; /* QAT (cfg.qat): the rollout's TRACE records of this
                                  response (model/trace_rec.h; borrowed for the call), or
                                  NULL: trained with nearest rounding and counted in
                                  trace_rows_unguided.  Ignored without QAT. */
} qrl_learner_response;

/* One finished prompt group: G responses to one prompt.  Borrowed for the call. */
typedef struct qrl_learner_group {
    uint64_t group_id;                      /* named in error messages */
    const int32_t *prompt;                  /* [n_prompt] token ids, n_prompt >= 1 */
    int n_prompt;
    const qrl_learner_response *responses;  /* [n_responses], n_responses >= 1 */
    uint32_t n_responses;
} qrl_learner_group;

/* ---- configuration ----------------------------------------------------------------- */

typedef struct qrl_learner_config {
    qrl_rl_loss_config loss;       /* qrl_rl_loss_config_default (SPEC §5 defaults) */
    qrl_rl_adv_estimator adv;      /* GRPO */
    bool dynamic_sampling;         /* drop zero-variance groups; default true */
    int ppo_epochs;                /* >= 1; default 1 */
    int minibatch_seqs;            /* sequences per optimizer step; 0 = all (default 0) */
    int max_tokens;                /* packed tokens per forward (micro-batch budget and
                                      engine capacity); >= 2; default 4096 */
    bool activation_recompute;     /* training engine keeps only each layer's input and
                                      recomputes the layer in the backward (less memory,
                                      ~1 more forward per backward, same results);
                                      default false */
    int device;                    /* -1: CPU engine (default); >= 0: the CUDA training
                                      engine (model_train_cuda.h) on that GPU, BF16 compute:
                                      the F32 parameters are copied back into the model after
                                      every optimizer step */
    bool device_weights;           /* CUDA engine: leave the new parameters on the device
                                      after an update (qrl_learner_device_params reads them
                                      there); the model's arena is refreshed only by
                                      qrl_learner_flush / qrl_learner_sync_host.  Default
                                      false: copied back after every update */
    qrl_adamw_config adamw;        /* qrl_adamw_config_default (clip 1.0) */
    qrl_lr_schedule lr;            /* constant 1e-6, no warmup */
    float accuracy_threshold;      /* a response is correct when reward >= this; 1.0 */
    float uaq_scale;               /* SPEC §3 UAQ s; 1 = off (default) */
    qrl_qat_mode qat;              /* learner.qat (train/model_train.h): the policy's forward
                                      fake-quantizes to NVFP4 (CPU and CUDA engines; the proximal
                                      forward is the same QAT policy, the reference stays
                                      F32); default QRL_QAT_OFF */
    bool qat_kv;                   /* QAT: K and V too (the rollout ran the fp4 KV cache) */
    bool trace_guidance;           /* QAT: use the responses' TRACE records (default false) */
    uint64_t seed;                 /* minibatch shuffle; default 0 */
} qrl_learner_config;

/* Fill *c with the defaults listed above. */
void qrl_learner_config_default(qrl_learner_config *c);

/* ---- the learner ------------------------------------------------------------------- */

typedef struct qrl_learner qrl_learner_t; /* opaque */

/* Create a learner that trains `m` in place (borrowed: must outlive the learner; its F32
 * weights are the parameters).  Allocates the training engine (max_tokens,
 * activation_recompute), AdamW state and, when loss.beta > 0, a frozen copy of m's current
 * weights as the reference policy (plus its own forward-only engine, which always uses
 * recomputation: it never runs a backward, so one layer's buffers serve every layer).
 * *out owned by the caller (qrl_learner_destroy).
 * UAQ: with uaq_scale s != 1 the model is rescaled in place (qrl_model_apply_uaq) before
 * the reference copy, unless m->uaq_scale is s already (a resumed checkpoint).
 * Errors: INVALID_ARGUMENT naming the config field (ppo_epochs, minibatch_seqs,
 * max_tokens, accuracy_threshold, loss.*, adamw.*, lr.*; uaq_scale differing from a scale
 * already applied to m), UNSUPPORTED (device >= 0 in a build without CUDA), CUDA (no such
 * device, out of device memory), NOMEM. */
qrl_status qrl_learner_new(qrl_model *m, const qrl_learner_config *cfg, qrl_learner_t **out,
                           qrl_error *err);
/* Free the learner (not the model); NULL is a no-op. */
void qrl_learner_destroy(qrl_learner_t *l);

/* The optimizer (borrowed; for checkpoints: qrl_adamw_save / load).  With a CUDA engine
 * the state lives on the GPU: call qrl_learner_sync_host before saving it and
 * qrl_learner_sync_device after loading it (or after loading weights into the model). */
qrl_adamw_t *qrl_learner_optimizer(qrl_learner_t *l);
/* CUDA engine: copy the AdamW state (moments, step count) to the host optimizer.  No-op on
 * the CPU engine.  Errors: CUDA. */
qrl_status qrl_learner_sync_host(qrl_learner_t *l, qrl_error *err);
/* CUDA engine: upload the model's weights and the host optimizer state to the GPU.  No-op
 * on the CPU engine.  Errors: CUDA. */
qrl_status qrl_learner_sync_device(qrl_learner_t *l, qrl_error *err);
/* CUDA engine: the F32 parameters on the device (layout of the model's arena) and their
 * device ordinal; NULL on the CPU engine.  Borrowed; valid until the learner is freed. */
const float *qrl_learner_device_params(qrl_learner_t *l, int *device);
/* CUDA engine: copy the parameters into the model's arena if an update changed them since
 * the last copy (needed with device_weights before reading the model).  Errors: CUDA. */
qrl_status qrl_learner_flush(qrl_learner_t *l, qrl_error *err);
/* Updates run so far (each call of qrl_learner_update that returned OK, even one whose
 * optimizer steps were all skipped); keys the shuffle RNG together with the seed. */
uint64_t qrl_learner_updates(const qrl_learner_t *l);
/* Restore the update count from a checkpoint (the shuffle RNG continues as it would). */
void qrl_learner_set_updates(qrl_learner_t *l, uint64_t updates);
/* Change the peak learning rate from the next optimizer step on (the daemon's runtime-
 * mutable learner.lr).  lr must be finite and > 0; the cosine floor is clamped to it.
 * Errors: INVALID_ARGUMENT (nothing changed). */
qrl_status qrl_learner_set_lr(qrl_learner_t *l, double lr, qrl_error *err);

/* Per-update statistics (SPEC §5 "Logged every update"; docs/learner-update.md).
 * Token means are over the response tokens of the kept groups unless said otherwise. */
typedef struct qrl_learner_stats {
    /* counts */
    size_t groups_in, groups_used, groups_dropped; /* dropped: zero variance */
    size_t responses_in;           /* responses of all input groups */
    size_t seqs_trained;           /* responses of kept groups with >= 1 token */
    size_t tokens_trained;         /* their response tokens */
    int steps_taken, steps_skipped;/* optimizer steps done / skipped (non-finite) */
    int minibatches;               /* minibatch passes (epochs x minibatches) */
    int micro_batches;             /* forward/backward passes in training (>= minibatches
                                      when a minibatch exceeds max_tokens) */
    /* rollout quality: over ALL input responses (before dropping) */
    double reward_mean, reward_std;/* population std */
    double accuracy;               /* fraction with reward >= accuracy_threshold */
    double response_len_mean;      /* tokens per response */
    uint64_t version_min, version_max; /* of tokens with versions; 0, 0 when none */
    /* behavior vs proximal policy: each trained token once (from step 4) */
    double kl_behav_prox;          /* mean(lp_behav - lp_prox): KL(behav || prox) estimate */
    double max_w;                  /* max exp(lp_prox - lp_behav) */
    /* train-rollout log-prob discrepancy |lp_prox - lp_behav| over the trained tokens
     * (each once, from step 4): mean, 99th percentile (nearest rank: the
     * ceil(0.99 n)-th smallest), max */
    double discrepancy_mean, discrepancy_p99, discrepancy_max;
    double entropy_mean;           /* mean entropy (nats) of the pre-update policy */
    /* loss: token-weighted over every minibatch pass of every epoch */
    double loss_mean, pg_loss_mean, kl_loss_mean; /* mean over the minibatch passes */
    double tis_frac, acr_frac;     /* TIS-truncated / ACR-widened token fraction */
    size_t tis_tokens, acr_tokens; /* same, counted over the first epoch (= per token) */
    double seq_tis_frac;           /* fraction of sequence evaluations whose w_seq was
                                      truncated (loss.is_level seq) */
    double mis_frac, mis_seq_frac; /* masked IS (loss.mis): fraction of token evaluations
                                      dropped / of sequence evaluations dropped whole */
    size_t mis_tokens, mis_seqs;   /* same, counted over the first epoch */
    double clip_frac_low, clip_frac_high, dual_clip_frac;
    double ratio_mean;             /* mean R */
    bool has_ref;                  /* beta > 0: k3_mean valid */
    double k3_mean;                /* mean k3 KL to the reference policy */
    qrl_rl_loss_stats first_mb;    /* the first minibatch of epoch 0, before any step */
    double first_mb_max_dlp;       /* max |lp - lp_prox| over it (0: every R exactly 1) */
    /* QAT (cfg.qat; all 0 without): trained sequences with TRACE records attached and
     * without (each counted once, at the proximal pass), and over every QAT forward of the
     * update the activation elements quantized with a record and those whose guided code
     * differs from nearest rounding (qrl_trace_metric_disagree_share) */
    uint64_t trace_rows_guided, trace_rows_unguided;
    uint64_t trace_elements_guided, trace_disagree;
    /* optimizer */
    double grad_norm_mean, grad_norm_max; /* pre-clip norms of the steps taken */
    double lr;                     /* learning rate of the last step taken (or due) */
    /* throughput and time (seconds, monotonic clock) */
    double time_prox_s;            /* proximal forward (step 4) */
    double time_ref_s;             /* reference forward (step 5) */
    double time_train_s;           /* step 6 */
    double time_total_s;
    double train_tokens_per_s;     /* packed tokens forwarded+backwarded / time_train_s */
} qrl_learner_stats;

/* Run one update (see the file comment) on groups[n_groups] (borrowed for the call).
 * stats (may be NULL) is filled on success.  When every group is dropped (or no response
 * has a token) no optimizer step runs and OK is returned with steps_taken = 0.
 * Errors (nothing changed: parameters, optimizer and update count as before; except CUDA /
 * INTERNAL from the GPU engine after some optimizer steps of this update were taken: the
 * device state is then unknown and the caller should stop):
 *   INVALID_ARGUMENT: n_groups = 0 or groups NULL; a group with an empty prompt or no
 *     responses; a prompt or response token id outside the vocabulary; a non-finite
 *     reward; a non-finite behavior log-prob (the message names the group index and id,
 *     the response and the token index); NULL arrays;
 *   OUT_OF_RANGE: a sequence longer than max_tokens or the model's max_seq_len (names
 *     the group and response); a non-finite proximal / reference log-prob (the model
 *     itself is broken);
 *   NOMEM; CUDA, INTERNAL (device >= 0).
 * Skipped optimizer steps are not errors: they are counted in stats->steps_skipped. */
qrl_status qrl_learner_update(qrl_learner_t *l, const qrl_learner_group *groups,
                              size_t n_groups, qrl_learner_stats *stats, qrl_error *err);

/* Log-probs of one response's tokens under the CURRENT parameters: out[n_tokens] (caller-
 * owned), e.g. to build behavior log-probs equal to the proximal ones, or to watch a
 * response's probability move.  The group is validated as by qrl_learner_update (so its
 * behavior log-probs must be finite: fill them with any finite placeholder first).
 * Errors: INVALID_ARGUMENT (bad index, a group failing validation), OUT_OF_RANGE (sequence
 * longer than max_tokens). */
qrl_status qrl_learner_response_logprobs(qrl_learner_t *l, const qrl_learner_group *g,
                                         uint32_t response, float *out, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
