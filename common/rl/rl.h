/* RL algorithm core of the learner (SPEC §5): group advantages, dynamic sampling,
 * and the per-token decoupled-PPO loss with TIS and ACR, its gradient with respect to
 * the current log-probs, and the per-update statistics.
 *
 * CPU, no model dependence: everything works on per-token arrays, so the learner
 * daemon and the training engine (which back-propagates d loss / d lp) both call it.
 * Arithmetic is done in double; inputs are float (fp32) as the engine produces them.
 * Nothing here allocates.  docs/loss.md has the formulas as implemented.
 *
 * Token layout: a minibatch is n_seq sequences padded to seq_len, row-major
 * [n_seq, seq_len]; token (s, t) has flat index s * seq_len + t.  mask[i] != 0 marks a
 * response token; the values of masked-out tokens (mask 0) are never read, so padding
 * may hold anything (NaN included) and gets gradient 0. */
#ifndef QRL_RL_RL_H
#define QRL_RL_RL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- advantages (SPEC §5, line `A = (r - mean(r_group)) / (std(r_group) + 1e-6)`) ---- */

typedef enum qrl_rl_adv_estimator {
    /* A_i = (r_i - mean) / (std + 1e-6), std the SAMPLE standard deviation
     * sqrt(sum (r_j - mean)^2 / (G - 1)), as verl (torch.std, unbiased) computes it. */
    QRL_RL_ADV_GRPO = 0,
    /* Dr.GRPO (Liu et al. 2025): A_i = r_i - mean, no std normalisation. */
    QRL_RL_ADV_DRGRPO,
    /* RLOO (Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j
     *      = G / (G - 1) * (r_i - mean). */
    QRL_RL_ADV_RLOO,
} qrl_rl_adv_estimator;

#define QRL_RL_ADV_EPS 1e-6 /* the "+ 1e-6" of the GRPO line */

/* Advantages of one prompt group of n responses.  rewards: float[n]; adv: float[n],
 * caller-owned (may alias rewards).  A singleton group (n = 1) has no baseline to
 * compare against and gets advantage 0 (verl instead passes the raw reward through
 * for GRPO; a lone sample carries no group-relative signal, so 0 is used here).
 * Errors: INVALID_ARGUMENT for n = 0, a NULL pointer, an unknown estimator, or a
 * non-finite reward (the message names its index). */
qrl_status qrl_rl_advantage_group(qrl_rl_adv_estimator est, const float *rewards, size_t n,
                                  float *adv, qrl_error *err);

/* Advantages of n_groups groups stored back to back: group g is
 * rewards[offsets[g] .. offsets[g+1]), offsets: size_t[n_groups + 1], offsets[0] = 0,
 * non-decreasing.  adv: float[offsets[n_groups]].  Errors as qrl_rl_advantage_group,
 * plus INVALID_ARGUMENT for bad offsets or an empty group (messages name the group). */
qrl_status qrl_rl_advantage_groups(qrl_rl_adv_estimator est, const float *rewards,
                                   const size_t *offsets, size_t n_groups, float *adv,
                                   qrl_error *err);

/* Write each sequence's advantage to its response tokens: adv_tok[s * seq_len + t] =
 * adv_seq[s] where mask is non-zero, 0 elsewhere.  adv_seq: float[n_seq]; mask:
 * uint8[n_seq * seq_len]; adv_tok: float[n_seq * seq_len], caller-owned. */
void qrl_rl_advantage_broadcast(const float *adv_seq, size_t n_seq, size_t seq_len,
                                const uint8_t *mask, float *adv_tok);

/* ---- dynamic sampling (DAPO; SPEC §5 "drops groups whose rewards are all equal") ---- */

/* True when all n rewards are exactly equal (zero variance: every GRPO advantage is 0,
 * the group gives no gradient).  A singleton group is zero-variance.  n = 0: true. */
bool qrl_rl_group_zero_variance(const float *rewards, size_t n);

/* Bounded over-sampling bookkeeping for one update: the learner offers finished groups
 * one at a time until `target` groups are kept or `max_offered` groups were consumed
 * (the over-sampling bound, DAPO's max_num_gen_batches in group units).  Plain value
 * type, caller-owned; no allocation. */
typedef struct qrl_rl_dynsample {
    size_t target;      /* T, groups wanted per update */
    size_t max_offered; /* bound on groups consumed for this update (>= target) */
    size_t offered;     /* groups seen so far */
    size_t kept;        /* groups with non-equal rewards, kept */
    size_t dropped;     /* zero-variance groups dropped */
    uint64_t total_kept, total_dropped; /* over the object's lifetime (not reset) */
} qrl_rl_dynsample;

typedef enum qrl_rl_dynsample_state {
    QRL_RL_DYNSAMPLE_NEED_MORE = 0, /* keep offering groups */
    QRL_RL_DYNSAMPLE_FULL,          /* target groups kept: run the update */
    QRL_RL_DYNSAMPLE_EXHAUSTED,     /* bound reached with kept < target: the caller
                                       decides (update with `kept` groups, or fail) */
} qrl_rl_dynsample_state;

/* Start bookkeeping: target T >= 1, max_oversample >= 1 (max_offered =
 * ceil(target * max_oversample)).  Errors: INVALID_ARGUMENT for target 0 or
 * max_oversample < 1 or not finite. */
qrl_status qrl_rl_dynsample_init(qrl_rl_dynsample *ds, size_t target, double max_oversample,
                                 qrl_error *err);
/* Reset the per-update counters (offered, kept, dropped) for the next update. */
void qrl_rl_dynsample_reset(qrl_rl_dynsample *ds);
/* Offer one group's rewards (float[n]).  *keep (may be NULL) is set to whether the
 * group should enter the batch; the state after counting it is returned.  Offering
 * after FULL or EXHAUSTED is a caller bug: the group is not counted, *keep = false,
 * and the state is returned unchanged. */
qrl_rl_dynsample_state qrl_rl_dynsample_offer(qrl_rl_dynsample *ds, const float *rewards,
                                              size_t n, bool *keep);
/* State without offering anything. */
qrl_rl_dynsample_state qrl_rl_dynsample_state_of(const qrl_rl_dynsample *ds);

/* Flag the zero-variance groups of a batch (layout as qrl_rl_advantage_groups):
 * keep[g] = 1 for groups to keep, 0 for groups to drop; *n_kept (may be NULL) counts
 * the kept ones.  Errors: INVALID_ARGUMENT for bad offsets (naming the group). */
qrl_status qrl_rl_groups_filter(const float *rewards, const size_t *offsets, size_t n_groups,
                                uint8_t *keep, size_t *n_kept, qrl_error *err);

/* ---- loss (SPEC §5, the block `R = ... loss_t = ...`) ---- */

/* What the per-token surrogate compares the current policy to.  In every mode
 *   surr = min(R * A, clip(R, L, U) * A),  L = 1 - eps_low,
 *   loss_t = - w_bar * surr + beta * k3    (w_bar a constant: sg(w_bar)).
 * The modes differ in R, w_bar and U: */
typedef enum qrl_rl_loss_mode {
    /* Baseline "naive quantized rollout": ratio to the behavior (quantized sampler)
     * policy, no proximal policy, no behavior correction:
     *   R = exp(lp - lp_behav), w_bar = 1, U = 1 + eps_high.  lp_prox unused. */
    QRL_RL_LOSS_NAIVE = 0,
    /* Baseline "ratio to the proximal policy, no behavior correction":
     *   R = exp(lp - lp_prox), w_bar = 1, U = 1 + eps_high.  lp_behav unused by the
     *   loss (read for statistics when given). */
    QRL_RL_LOSS_PROX,
    /* The full SPEC §5 objective (decoupled PPO + TIS + optional ACR):
     *   R = exp(lp - lp_prox), w = exp(lp_prox - lp_behav), w_bar = min(w, C),
     *   r = w_bar / w, U = (1 + eps_high) / r if acr else 1 + eps_high.
     *   Rollout corrections (is_level, mis below): w is the sequence's geometric-mean
     *   weight w_seq with IS_SEQ; a token the masked IS drops has w_bar = 0. */
    QRL_RL_LOSS_DECOUPLED,
} qrl_rl_loss_mode;

typedef enum qrl_rl_loss_agg {
    /* sum over response tokens of loss_t / number of response tokens in the minibatch */
    QRL_RL_AGG_TOKEN_MEAN = 0,
    /* mean over non-empty sequences of (sum of the sequence's loss_t / its length) */
    QRL_RL_AGG_SEQ_MEAN,
} qrl_rl_loss_agg;

/* Rollout correction of the behavior weight (DECOUPLED mode only; docs/loss.md has the
 * formulas and their sources).  Which weight is truncated at C: */
typedef enum qrl_rl_is_level {
    /* w = exp(lp_prox - lp_behav) per token (FlashRL / Yao et al. token-level TIS) */
    QRL_RL_IS_TOKEN = 0,
    /* w_seq = exp(mean over the sequence's response tokens of (lp_prox - lp_behav)), the
     * geometric mean of the token weights, the same on every token of the sequence
     * ("seq-TIS" with a length-normalised ratio) */
    QRL_RL_IS_SEQ,
} qrl_rl_is_level;

/* Masked importance sampling: drop (weight 0, no policy gradient) instead of truncate. */
typedef enum qrl_rl_mis {
    QRL_RL_MIS_NONE = 0, /* nothing dropped */
    /* drop each token whose w is outside [mis_low, mis_high] (IcePop, Ling team) */
    QRL_RL_MIS_TOKEN,
    /* drop every token of a sequence whose w_seq (geometric mean) is outside the band
     * (Seq-MIS / verl's geometric rejection) */
    QRL_RL_MIS_SEQ,
} qrl_rl_mis;

typedef struct qrl_rl_loss_config {
    qrl_rl_loss_mode mode; /* default DECOUPLED */
    double eps_low;        /* L = 1 - eps_low; default 0.2, range [0, 1) */
    double eps_high;       /* U = 1 + eps_high (before ACR); default 0.28, >= 0 */
    double tis_cap;        /* C; default 2, > 0 (INFINITY: no truncation) */
    bool acr;              /* default true (decoupled mode only) */
    bool dual_clip;        /* default false */
    double clip_c;         /* dual-clip constant c > 1; default 3 */
    double beta;           /* k3 KL coefficient; default 1e-3, >= 0 */
    qrl_rl_loss_agg agg;   /* default TOKEN_MEAN */
    qrl_rl_is_level is_level; /* weight truncated at C: default TOKEN (decoupled only) */
    qrl_rl_mis mis;        /* masked IS: default NONE (decoupled only) */
    double mis_low, mis_high; /* kept band [mis_low, mis_high] of the masked weight;
                                 default 0.5, 5 (IcePop); 0 <= low < high (high may be
                                 INFINITY); checked only when mis != NONE */
} qrl_rl_loss_config;

/* Fill *cfg with the SPEC §5 defaults listed above. */
void qrl_rl_loss_config_default(qrl_rl_loss_config *cfg);
/* Errors: INVALID_ARGUMENT naming the first field out of range (or non-finite). */
qrl_status qrl_rl_loss_config_validate(const qrl_rl_loss_config *cfg, qrl_error *err);

/* Per-token inputs of one minibatch; all arrays [n_seq, seq_len] row-major, borrowed.
 * Which log-prob arrays may be NULL: lp_prox in NAIVE mode; lp_behav in PROX mode;
 * lp_ref always (then the k3 term is skipped).  lp and adv and mask are required. */
typedef struct qrl_rl_loss_input {
    size_t n_seq, seq_len;
    const float *lp;       /* log pi_theta(token), current parameters */
    const float *lp_prox;  /* log pi_prox: full-precision old policy */
    const float *lp_behav; /* recorded behavior log-prob of the quantized sampler */
    const float *lp_ref;   /* frozen initial (reference) policy; optional */
    const float *adv;      /* advantage per token (qrl_rl_advantage_broadcast) */
    const uint8_t *mask;   /* != 0: response token */
} qrl_rl_loss_input;

/* Per-update statistics (SPEC §5 "Logged every update", the ones computable from
 * per-token arrays).  All means are token means over response tokens (mask != 0),
 * whatever the loss aggregation. */
typedef struct qrl_rl_loss_stats {
    size_t n_tokens;       /* response tokens */
    size_t n_seqs;         /* sequences with at least one response token */
    double loss;           /* the aggregated loss (same as the returned value) */
    double pg_loss;        /* aggregated - w_bar * surr part alone */
    double kl_loss;        /* aggregated beta * k3 part alone (0 when skipped) */
    bool has_behav_prox;   /* lp_prox and lp_behav both given: next 2 fields valid */
    double kl_behav_prox;  /* mean(lp_behav - lp_prox): estimate of KL(behav || prox) */
    double max_w;          /* max over tokens of w = exp(lp_prox - lp_behav) */
    double tis_frac;       /* fraction with w > C (weight truncated); DECOUPLED only */
    double acr_frac;       /* fraction whose U was widened (acr and r < 1) */
    double seq_tis_frac;   /* fraction of the n_seqs sequences with w_seq > C (IS_SEQ) */
    double mis_frac;       /* fraction of tokens dropped by the masked IS (either level) */
    double mis_seq_frac;   /* fraction of the n_seqs sequences dropped whole (MIS_SEQ) */
    double clip_frac_low;  /* fraction with A < 0 and R < L: lower clip active */
    double clip_frac_high; /* fraction with A > 0 and R > U: upper clip active */
    double dual_clip_frac; /* fraction with A < 0 and R*A < c*A: dual clip active */
    bool has_ref;          /* lp_ref given: k3_mean valid */
    double k3_mean;        /* mean k3 (computed when lp_ref is given, even if beta = 0) */
    double ratio_mean;     /* mean R */
} qrl_rl_loss_stats;

/* Loss of one minibatch, its gradient and statistics.
 *   *loss: the aggregated loss (double).
 *   grad: float[n_seq * seq_len] or NULL: d loss / d lp per token, including the
 *     1/N of the aggregation; 0 on masked tokens and where the clipped (or dual-clip)
 *     branch is active; w_bar is a constant.  Caller-owned.
 *   stats: or NULL.
 * A minibatch without response tokens gives loss 0, grad 0, zeroed stats.
 * Errors (nothing is written to loss/grad/stats on error):
 *   INVALID_ARGUMENT: bad config, NULL required array, n_seq * seq_len overflow, or a
 *     non-finite lp / lp_prox / lp_behav / lp_ref / adv on a response token (the
 *     message names the array, the flat token index and (seq, pos));
 *   OUT_OF_RANGE: a token's loss or gradient is not finite (overflowing ratio),
 *     naming the token. */
qrl_status qrl_rl_loss_compute(const qrl_rl_loss_config *cfg, const qrl_rl_loss_input *in,
                               double *loss, float *grad, qrl_rl_loss_stats *stats,
                               qrl_error *err);

/* One token of the objective in double, for kernels' CPU oracle and tests: returns
 * loss_t (unaggregated) and sets *dloss_dlp (d loss_t / d lp).  lp_prox is ignored in
 * NAIVE mode, lp_behav in PROX mode; lp_ref NaN skips k3.  flags (may be NULL) gets the
 * QRL_RL_TOK_* bits.  No validation: the config must be valid, inputs finite.
 * The sequence-level corrections (IS_SEQ, MIS_SEQ) see the token as a one-token
 * sequence (w_seq = w); qrl_rl_loss_compute applies them to whole sequences. */
enum {
    QRL_RL_TOK_TIS = 1,        /* w > C, weight truncated */
    QRL_RL_TOK_ACR = 2,        /* upper bound widened (acr, r < 1) */
    QRL_RL_TOK_CLIP_LOW = 4,   /* A < 0, R < L */
    QRL_RL_TOK_CLIP_HIGH = 8,  /* A > 0, R > U */
    QRL_RL_TOK_DUAL_CLIP = 16, /* dual-clip branch active */
    QRL_RL_TOK_MIS = 32,       /* dropped by the masked IS: w_bar = 0, no other flag */
};
double qrl_rl_loss_token(const qrl_rl_loss_config *cfg, double lp, double lp_prox,
                         double lp_behav, double lp_ref, double adv, double *dloss_dlp,
                         double *ratio, unsigned *flags);

#ifdef __cplusplus
}
#endif
#endif
