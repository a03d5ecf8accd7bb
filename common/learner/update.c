/* The learner's update step (SPEC §5): validation, dynamic sampling, advantages, the
 * proximal and reference forwards, then ppo_epochs x minibatches of forward -> loss ->
 * backward -> AdamW.  docs/learner-update.md is the prose version. */
#include "learner/update.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "learner/engine.h"
#include "train/model_train.h"

struct qrl_learner {
    qrl_model *m;
    qrl_learner_config cfg;
    qrl_learner_engine e;        /* policy, reference policy, AdamW: CPU or CUDA */
    /* packed-batch buffers, max_tokens each (STYLE 6: sized once) */
    int32_t *tok, *tgt, *pos, *seg, *offs;
    float *lp, *ent, *dlp;
    uint64_t updates;
};

/* One trained sequence: response r of kept group g (only responses with tokens). */
typedef struct seq_info {
    uint32_t g, r;
    int P, R;       /* prompt and response lengths */
    size_t rt_off;  /* offset of its tokens in the per-update response-token arrays */
    float adv;
} seq_info;

/* Loss statistics summed over sequences (token-weighted) and minibatches. */
typedef struct loss_acc {
    double n, seqs;
    double loss, pg, kl;                 /* aggregated values (already scaled) */
    double klbp, tis, acr, clo, chi, dual, k3, ratio; /* sums of mean * n */
    double mis, mis_seq, seq_tis;        /* dropped tokens; dropped / truncated sequences */
    double max_w;
    bool has_bp, has_ref;
} loss_acc;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: the shuffle's RNG, keyed by (seed, update, epoch). */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The k-th smallest (0-based) of a[0..n), n >= 1: quickselect, reorders a. */
static double kth_smallest(double *a, ptrdiff_t n, ptrdiff_t k) {
    ptrdiff_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double p = a[lo + (hi - lo) / 2];
        ptrdiff_t i = lo, j = hi;
        while (i <= j) { /* Hoare partition: a[lo..j] <= p <= a[i..hi] */
            while (a[i] < p) i++;
            while (a[j] > p) j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j], a[j] = t;
                i++, j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return a[k]; /* between the parts: equal to p */
    }
    return a[k];
}

void qrl_learner_config_default(qrl_learner_config *c) {
    memset(c, 0, sizeof *c);
    qrl_rl_loss_config_default(&c->loss);
    c->adv = QRL_RL_ADV_GRPO;
    c->dynamic_sampling = true;
    c->ppo_epochs = 1;
    c->minibatch_seqs = 0;
    c->max_tokens = 4096;
    c->activation_recompute = false;
    c->device = -1;
    c->adamw = qrl_adamw_config_default();
    c->lr = (qrl_lr_schedule){.decay = QRL_LR_DECAY_CONSTANT, .lr = 1e-6, .min_lr = 0,
                              .warmup_steps = 0, .total_steps = 1};
    c->accuracy_threshold = 1.0f;
    c->uaq_scale = 1.0f;
    c->seed = 0;
}

/* ---- create / destroy ----------------------------------------------------------------- */

static qrl_status check_config(const qrl_learner_config *c, qrl_error *err) {
    QRL_TRY(qrl_rl_loss_config_validate(&c->loss, err));
    QRL_TRY(qrl_lr_schedule_check(&c->lr, err));
    if (c->adv != QRL_RL_ADV_GRPO && c->adv != QRL_RL_ADV_DRGRPO && c->adv != QRL_RL_ADV_RLOO)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "learner.adv: unknown value %d",
                             (int)c->adv);
    if (c->ppo_epochs < 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner.ppo_epochs: %d, expected >= 1", c->ppo_epochs);
    if (c->minibatch_seqs < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner.minibatch_seqs: %d, expected >= 0", c->minibatch_seqs);
    if (c->max_tokens < 2)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner.max_tokens: %d, expected >= 2", c->max_tokens);
    if (!isfinite(c->accuracy_threshold))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner.accuracy_threshold: not finite");
    if (!isfinite(c->uaq_scale) || c->uaq_scale <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner.uaq_scale: %g, expected finite > 0", c->uaq_scale);
    return QRL_OK;
}

qrl_status qrl_learner_new(qrl_model *m, const qrl_learner_config *cfg, qrl_learner_t **out,
                           qrl_error *err) {
    *out = NULL;
    QRL_TRY(check_config(cfg, err));
    /* UAQ (SPEC §3): train the scaled parameterization.  A model already scaled by s
     * (a resumed checkpoint: its parameters are stored scaled) is taken as it is. */
    if (cfg->uaq_scale != m->uaq_scale) {
        if (m->uaq_scale != 1.0f)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "learner.uaq_scale: %g, but the model is already scaled by %g",
                                 (double)cfg->uaq_scale, (double)m->uaq_scale);
        QRL_TRY(qrl_model_apply_uaq(m, cfg->uaq_scale, err));
    }
    qrl_status st = QRL_OK;
    qrl_learner_t *l = calloc(1, sizeof *l);
    if (!l) return qrl_error_set(err, QRL_STATUS_NOMEM, "learner: struct");
    l->m = m;
    l->cfg = *cfg;
    QRL_TRY_GOTO(qrl_learner_engine_init(&l->e, m, cfg, err), fail);
    size_t T = (size_t)cfg->max_tokens;
    l->tok = malloc(T * sizeof *l->tok);
    l->tgt = malloc(T * sizeof *l->tgt);
    l->pos = malloc(T * sizeof *l->pos);
    l->seg = malloc(T * sizeof *l->seg);
    l->offs = malloc(T * sizeof *l->offs);
    l->lp = malloc(T * sizeof *l->lp);
    l->ent = malloc(T * sizeof *l->ent);
    l->dlp = malloc(T * sizeof *l->dlp);
    if (!l->tok || !l->tgt || !l->pos || !l->seg || !l->offs || !l->lp || !l->ent || !l->dlp) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "learner: batch buffers (%zu tokens)", T);
        goto fail;
    }
    *out = l;
    return QRL_OK;
fail:
    qrl_learner_destroy(l);
    return st;
}

void qrl_learner_destroy(qrl_learner_t *l) {
    if (!l) return;
    qrl_learner_engine_free(&l->e);
    free(l->tok), free(l->tgt), free(l->pos), free(l->seg), free(l->offs);
    free(l->lp), free(l->ent), free(l->dlp);
    free(l);
}

qrl_adamw_t *qrl_learner_optimizer(qrl_learner_t *l) { return l->e.opt; }

qrl_status qrl_learner_sync_host(qrl_learner_t *l, qrl_error *err) {
    return qrl_learner_engine_sync_host(&l->e, err);
}

qrl_status qrl_learner_flush(qrl_learner_t *l, qrl_error *err) {
    return qrl_learner_engine_flush(&l->e, err);
}

const float *qrl_learner_device_params(qrl_learner_t *l, int *device) {
    return qrl_learner_engine_device_params(&l->e, device);
}

qrl_status qrl_learner_sync_device(qrl_learner_t *l, qrl_error *err) {
    return qrl_learner_engine_sync_device(&l->e, err);
}

qrl_status qrl_learner_set_lr(qrl_learner_t *l, double lr, qrl_error *err) {
    if (!(lr > 0) || !isfinite(lr))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "learner: lr = %g must be finite and > 0", lr);
    l->cfg.lr.lr = lr;
    if (l->cfg.lr.min_lr > lr) l->cfg.lr.min_lr = lr;
    return QRL_OK;
}

uint64_t qrl_learner_updates(const qrl_learner_t *l) { return l->updates; }
void qrl_learner_set_updates(qrl_learner_t *l, uint64_t updates) { l->updates = updates; }

/* ---- packing -------------------------------------------------------------------------- */

/* Packed length of a sequence: prompt + response minus the last token (it predicts
 * nothing). */
static int seq_tokens(int P, int R) { return P + R - 1; }

/* Pack sequences idx[0..n) into the batch buffers.  Sequence k's response token j is
 * predicted at packed position offs[k] + j.  Returns T. */
static int pack(qrl_learner_t *l, const qrl_learner_group *groups, const seq_info *seqs,
                const uint32_t *idx, size_t n) {
    int T = 0;
    for (size_t k = 0; k < n; k++) {
        const seq_info *s = &seqs[idx[k]];
        const qrl_learner_group *g = &groups[s->g];
        const int32_t *resp = g->responses[s->r].tokens;
        int L = seq_tokens(s->P, s->R);
        for (int p = 0; p < L; p++) {
            l->tok[T + p] = p < s->P ? g->prompt[p] : resp[p - s->P];
            l->tgt[T + p] = p >= s->P - 1 ? resp[p - s->P + 1] : -1;
            l->seg[T + p] = (int32_t)k;
        }
        l->offs[k] = T + s->P - 1;
        T += L;
    }
    qrl_model_train_positions(l->pos, l->seg, T);
    return T;
}

/* QAT: the TRACE records of the sequences pack() just placed (offs) go with the next
 * policy forward (NULL records: nearest rounding, counted by the engine), and the forward
 * rounds the weights to BF16 as the replicas received them when every token of these
 * sequences came from a broadcast version (>= 1; version 0 is the F32 checkpoint the
 * replicas loaded; a batch mixing both, or without versions, is taken as version 0). */
static qrl_status attach_traces(qrl_learner_t *l, const qrl_learner_group *groups, const seq_info *seqs,
                                const uint32_t *idx, size_t n, qrl_error *err) {
    if (!l->e.qat) return QRL_OK;
    qrl_learner_engine_qat_clear(&l->e);
    bool bf16 = n > 0;
    for (size_t k = 0; k < n && bf16; k++) {
        const qrl_learner_response *rs = &groups[seqs[idx[k]].g].responses[seqs[idx[k]].r];
        bf16 = rs->versions != NULL;
        for (int t = 0; bf16 && t < rs->n_tokens; t++) bf16 = rs->versions[t] >= 1;
    }
    qrl_learner_engine_qat_set_bf16(&l->e, bf16);
    for (size_t k = 0; k < n; k++) {
        const seq_info *s = &seqs[idx[k]];
        QRL_TRY(qrl_learner_engine_qat_attach(&l->e, l->offs[k] - (s->P - 1), s->P, s->R,
                                              groups[s->g].responses[s->r].trace, err));
    }
    return QRL_OK;
}

/* How many of idx[0..n) fit one forward of max_tokens (at least 1: every sequence was
 * checked to fit alone). */
static size_t chunk_len(const qrl_learner_t *l, const seq_info *seqs, const uint32_t *idx,
                        size_t n) {
    int T = 0;
    size_t k = 0;
    for (; k < n; k++) {
        int L = seq_tokens(seqs[idx[k]].P, seqs[idx[k]].R);
        if (T + L > l->cfg.max_tokens) break;
        T += L;
    }
    return k;
}

/* Forward of every sequence through engine `tr`, storing the response tokens' log-probs
 * into out[rt_off..] and (ent_sum non-NULL) summing their entropies. */
static qrl_status forward_all(qrl_learner_t *l, bool ref,
                              const qrl_learner_group *groups, const seq_info *seqs,
                              const uint32_t *all, size_t n_seq, float *out, double *ent_sum,
                              const char *what, qrl_error *err) {
    for (size_t i = 0; i < n_seq;) {
        size_t c = chunk_len(l, seqs, all + i, n_seq - i);
        int T = pack(l, groups, seqs, all + i, c);
        if (!ref) QRL_TRY(attach_traces(l, groups, seqs, all + i, c, err));
        QRL_TRY(qrl_learner_engine_forward(&l->e, ref, l->tok, l->tgt, l->pos, l->seg, T, l->lp,
                                           ent_sum ? l->ent : NULL, err));
        for (size_t k = 0; k < c; k++) {
            const seq_info *s = &seqs[all[i + k]];
            for (int j = 0; j < s->R; j++) {
                float v = l->lp[l->offs[k] + j];
                if (!isfinite(v))
                    return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                         "learner: %s log-prob of group %u (id %llu) "
                                         "response %u token %d is %g",
                                         what, s->g, (unsigned long long)groups[s->g].group_id,
                                         s->r, j, (double)v);
                out[s->rt_off + (size_t)j] = v;
                if (ent_sum) *ent_sum += l->ent[l->offs[k] + j];
            }
        }
        i += c;
    }
    return QRL_OK;
}

/* ---- validation ----------------------------------------------------------------------- */

static qrl_status check_groups(const qrl_learner_t *l, const qrl_learner_group *groups,
                               size_t n_groups, qrl_error *err) {
    const int V = l->m->cfg.vocab_size, max_len = l->m->cfg.max_seq_len;
    if (!groups || n_groups == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "learner update: no groups");
    for (size_t gi = 0; gi < n_groups; gi++) {
        const qrl_learner_group *g = &groups[gi];
        unsigned long long id = (unsigned long long)g->group_id;
        if (!g->prompt || g->n_prompt < 1 || !g->responses || g->n_responses < 1)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "learner update: group %zu (id %llu): empty prompt or no "
                                 "responses",
                                 gi, id);
        for (int p = 0; p < g->n_prompt; p++)
            if (g->prompt[p] < 0 || g->prompt[p] >= V)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "learner update: group %zu (id %llu) prompt token %d: "
                                     "id %d outside [0, %d)",
                                     gi, id, p, g->prompt[p], V);
        for (uint32_t r = 0; r < g->n_responses; r++) {
            const qrl_learner_response *rs = &g->responses[r];
            if (!isfinite(rs->reward))
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "learner update: group %zu (id %llu) response %u: "
                                     "non-finite reward %g",
                                     gi, id, r, (double)rs->reward);
            if (rs->n_tokens < 0 || (rs->n_tokens > 0 && (!rs->tokens || !rs->logprobs)))
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "learner update: group %zu (id %llu) response %u: "
                                     "n_tokens %d with NULL arrays",
                                     gi, id, r, rs->n_tokens);
            for (int t = 0; t < rs->n_tokens; t++) {
                if (rs->tokens[t] < 0 || rs->tokens[t] >= V)
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "learner update: group %zu (id %llu) response %u "
                                         "token %d: id %d outside [0, %d)",
                                         gi, id, r, t, rs->tokens[t], V);
                if (!isfinite(rs->logprobs[t]))
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "learner update: group %zu (id %llu) response %u "
                                         "token %d: non-finite behavior log-prob %g",
                                         gi, id, r, t, (double)rs->logprobs[t]);
            }
            int L = g->n_prompt + rs->n_tokens - 1;
            if (rs->n_tokens > 0 && (L > l->cfg.max_tokens || L > max_len))
                return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                     "learner update: group %zu (id %llu) response %u: "
                                     "%d packed tokens exceed max_tokens %d or the model's "
                                     "max_seq_len %d",
                                     gi, id, r, L, l->cfg.max_tokens, max_len);
        }
    }
    return QRL_OK;
}

/* ---- loss statistics ------------------------------------------------------------------ */

static void acc_add_seq(loss_acc *a, const qrl_rl_loss_stats *s, double scale) {
    double n = (double)s->n_tokens;
    a->n += n;
    a->seqs += 1;
    a->loss += s->loss * scale, a->pg += s->pg_loss * scale, a->kl += s->kl_loss * scale;
    a->tis += s->tis_frac * n, a->acr += s->acr_frac * n;
    a->clo += s->clip_frac_low * n, a->chi += s->clip_frac_high * n;
    a->dual += s->dual_clip_frac * n, a->ratio += s->ratio_mean * n;
    a->mis += s->mis_frac * n;
    a->mis_seq += s->mis_seq_frac * (double)s->n_seqs;
    a->seq_tis += s->seq_tis_frac * (double)s->n_seqs;
    if (s->has_behav_prox) {
        a->has_bp = true;
        a->klbp += s->kl_behav_prox * n;
        if (s->max_w > a->max_w) a->max_w = s->max_w;
    }
    if (s->has_ref) a->has_ref = true, a->k3 += s->k3_mean * n;
}

static qrl_rl_loss_stats acc_to_stats(const loss_acc *a) {
    qrl_rl_loss_stats s = {0};
    if (a->n <= 0) return s;
    s.n_tokens = (size_t)a->n, s.n_seqs = (size_t)a->seqs;
    s.loss = a->loss, s.pg_loss = a->pg, s.kl_loss = a->kl;
    s.has_behav_prox = a->has_bp, s.kl_behav_prox = a->klbp / a->n, s.max_w = a->max_w;
    s.tis_frac = a->tis / a->n, s.acr_frac = a->acr / a->n;
    s.clip_frac_low = a->clo / a->n, s.clip_frac_high = a->chi / a->n;
    s.dual_clip_frac = a->dual / a->n, s.ratio_mean = a->ratio / a->n;
    s.mis_frac = a->mis / a->n;
    s.mis_seq_frac = a->seqs > 0 ? a->mis_seq / a->seqs : 0;
    s.seq_tis_frac = a->seqs > 0 ? a->seq_tis / a->seqs : 0;
    s.has_ref = a->has_ref, s.k3_mean = a->has_ref ? a->k3 / a->n : 0;
    return s;
}

/* ---- one minibatch -------------------------------------------------------------------- */

/* Per-update arrays shared by the minibatches. */
typedef struct upd_ctx {
    const qrl_learner_group *groups;
    const seq_info *seqs;
    const float *lp_prox, *lp_ref;
    float *adv_tok;          /* [max R] scratch */
    const uint8_t *ones;     /* [max R] mask of ones */
    double max_dlp;          /* max |lp - lp_prox| seen (first minibatch) */
    size_t packed_tokens;    /* forwarded + backwarded in training */
    int micro_batches;
} upd_ctx;

/* Forward/loss/backward of minibatch mb[0..n) (gradients accumulate over its micro-
 * batches).  Returns OK, or the loss error (a non-finite value: the caller skips the
 * step).  *acc gets the statistics of the minibatch. */
static qrl_status run_minibatch(qrl_learner_t *l, upd_ctx *c, const uint32_t *mb, size_t n,
                                loss_acc *acc, qrl_error *err) {
    size_t N = 0;
    for (size_t k = 0; k < n; k++) N += (size_t)c->seqs[mb[k]].R;
    const qrl_rl_loss_config *lc = &l->cfg.loss;
    for (size_t i = 0; i < n;) {
        size_t cn = chunk_len(l, c->seqs, mb + i, n - i);
        int T = pack(l, c->groups, c->seqs, mb + i, cn);
        QRL_TRY(attach_traces(l, c->groups, c->seqs, mb + i, cn, err));
        QRL_TRY(qrl_learner_engine_forward(&l->e, false, l->tok, l->tgt, l->pos, l->seg, T, l->lp,
                                           NULL, err));
        memset(l->dlp, 0, (size_t)T * sizeof *l->dlp);
        for (size_t k = 0; k < cn; k++) {
            const seq_info *s = &c->seqs[mb[i + k]];
            const float *lp = l->lp + l->offs[k];
            const float *prox = c->lp_prox + s->rt_off;
            for (int j = 0; j < s->R; j++) {
                c->adv_tok[j] = s->adv;
                double d = fabs((double)lp[j] - (double)prox[j]);
                if (d > c->max_dlp || d != d) c->max_dlp = d;
            }
            qrl_rl_loss_input in = {
                .n_seq = 1, .seq_len = (size_t)s->R, .lp = lp, .lp_prox = prox,
                .lp_behav = c->groups[s->g].responses[s->r].logprobs,
                .lp_ref = c->lp_ref ? c->lp_ref + s->rt_off : NULL,
                .adv = c->adv_tok, .mask = c->ones};
            double loss;
            qrl_rl_loss_stats st;
            float *g = l->dlp + l->offs[k];
            QRL_TRY(qrl_rl_loss_compute(lc, &in, &loss, g, &st, err));
            /* one sequence's loss is a mean over its tokens: re-weight it to the
             * minibatch's aggregation (token-mean: R / N; sequence-mean: 1 / n) */
            double scale = lc->agg == QRL_RL_AGG_TOKEN_MEAN ? (double)s->R / (double)N
                                                            : 1.0 / (double)n;
            for (int j = 0; j < s->R; j++) {
                g[j] = (float)(g[j] * scale);
                if (!isfinite(g[j])) /* finite in double, beyond float: e.g. naive R = e^90 */
                    return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                         "learner: d loss / d lp overflows float at group %u "
                                         "(id %llu) response %u token %d",
                                         s->g, (unsigned long long)c->groups[s->g].group_id,
                                         s->r, j);
            }
            acc_add_seq(acc, &st, scale);
        }
        QRL_TRY(qrl_learner_engine_backward(&l->e, l->dlp, err));
        c->packed_tokens += (size_t)T;
        c->micro_batches++;
        i += cn;
    }
    if (!isfinite(acc->loss))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "learner: minibatch loss %g",
                             acc->loss);
    return QRL_OK;
}

/* ---- the update ----------------------------------------------------------------------- */

qrl_status qrl_learner_update(qrl_learner_t *l, const qrl_learner_group *groups,
                              size_t n_groups, qrl_learner_stats *stats, qrl_error *err) {
    const qrl_learner_config *cfg = &l->cfg;
    qrl_learner_stats S = {0};
    double t0 = now_s();
    QRL_TRY(check_groups(l, groups, n_groups, err));
    qrl_status st = QRL_OK;
    seq_info *seqs = NULL;
    uint32_t *order = NULL;
    float *rew = NULL, *adv = NULL, *lp_prox = NULL, *lp_ref = NULL, *adv_tok = NULL;
    uint8_t *ones = NULL;
    double *dabs = NULL; /* |lp_prox - lp_behav| per trained token (its p99) */

    /* rollout statistics over every input response; sizes for the buffers */
    size_t n_resp = 0, max_G = 0, n_tok_all = 0;
    double rsum = 0, rsq = 0, n_correct = 0;
    bool have_ver = false;
    S.version_min = UINT64_MAX;
    for (size_t gi = 0; gi < n_groups; gi++) {
        const qrl_learner_group *g = &groups[gi];
        if (g->n_responses > max_G) max_G = g->n_responses;
        for (uint32_t r = 0; r < g->n_responses; r++) {
            const qrl_learner_response *rs = &g->responses[r];
            n_resp++;
            rsum += rs->reward, rsq += (double)rs->reward * rs->reward;
            n_correct += rs->reward >= cfg->accuracy_threshold;
            n_tok_all += (size_t)rs->n_tokens;
            for (int t = 0; rs->versions && t < rs->n_tokens; t++) {
                have_ver = true;
                if (rs->versions[t] < S.version_min) S.version_min = rs->versions[t];
                if (rs->versions[t] > S.version_max) S.version_max = rs->versions[t];
            }
        }
    }
    if (!have_ver) S.version_min = 0;
    S.groups_in = n_groups, S.responses_in = n_resp;
    S.reward_mean = rsum / (double)n_resp;
    S.reward_std = sqrt(fmax(0.0, rsq / (double)n_resp - S.reward_mean * S.reward_mean));
    S.accuracy = n_correct / (double)n_resp;
    S.response_len_mean = (double)n_tok_all / (double)n_resp;

    seqs = malloc((n_resp ? n_resp : 1) * sizeof *seqs);
    order = malloc((n_resp ? n_resp : 1) * sizeof *order);
    rew = malloc(max_G * sizeof *rew);
    adv = malloc(max_G * sizeof *adv);
    lp_prox = malloc((n_tok_all ? n_tok_all : 1) * sizeof *lp_prox);
    if (!seqs || !order || !rew || !adv || !lp_prox) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "learner update: %zu responses", n_resp);
        goto done;
    }

    /* dynamic sampling, advantages, the trained sequences */
    size_t n_seq = 0, n_tok = 0;
    int max_R = 0;
    for (size_t gi = 0; gi < n_groups; gi++) {
        const qrl_learner_group *g = &groups[gi];
        for (uint32_t r = 0; r < g->n_responses; r++) rew[r] = g->responses[r].reward;
        if (cfg->dynamic_sampling && qrl_rl_group_zero_variance(rew, g->n_responses)) {
            S.groups_dropped++;
            continue;
        }
        S.groups_used++;
        QRL_TRY_GOTO(qrl_rl_advantage_group(cfg->adv, rew, g->n_responses, adv, err), done);
        for (uint32_t r = 0; r < g->n_responses; r++) {
            int R = g->responses[r].n_tokens;
            if (R == 0) continue;
            seqs[n_seq] = (seq_info){.g = (uint32_t)gi, .r = r, .P = g->n_prompt, .R = R,
                                     .rt_off = n_tok, .adv = adv[r]};
            order[n_seq] = (uint32_t)n_seq;
            n_seq++, n_tok += (size_t)R;
            if (R > max_R) max_R = R;
        }
    }
    S.seqs_trained = n_seq, S.tokens_trained = n_tok;
    S.lr = qrl_lr_schedule_at(&cfg->lr, qrl_adamw_steps(l->e.opt));
    if (n_seq == 0) goto finish;

    /* proximal log-probs: the pre-update parameters, one pass, plus the entropy (with QAT
     * the same fake-quantized, guided policy the epochs train: docs/learner-daemon.md) */
    double t1 = now_s(), ent_sum = 0;
    qrl_qat_stats qs;
    qrl_learner_engine_qat_stats(&l->e, &qs, true);
    QRL_TRY_GOTO(forward_all(l, false, groups, seqs, order, n_seq, lp_prox, &ent_sum,
                             "proximal", err),
                 done);
    qrl_learner_engine_qat_stats(&l->e, &qs, false); /* each sequence once */
    S.trace_rows_guided = qs.rows_guided, S.trace_rows_unguided = qs.rows_unguided;
    dabs = malloc(n_tok * sizeof *dabs);
    if (!dabs) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "learner update: %zu-token discrepancy", n_tok);
        goto done;
    }
    double kl = 0, max_w = 0, dsum = 0, dmax = 0;
    for (size_t i = 0; i < n_seq; i++) {
        const float *b = groups[seqs[i].g].responses[seqs[i].r].logprobs;
        for (int j = 0; j < seqs[i].R; j++) {
            double d = (double)lp_prox[seqs[i].rt_off + (size_t)j] - (double)b[j];
            kl -= d; /* lp_behav - lp_prox */
            if (exp(d) > max_w) max_w = exp(d);
            double ad = fabs(d);
            dabs[seqs[i].rt_off + (size_t)j] = ad, dsum += ad;
            if (ad > dmax) dmax = ad;
        }
    }
    S.kl_behav_prox = kl / (double)n_tok, S.max_w = max_w;
    S.discrepancy_mean = dsum / (double)n_tok, S.discrepancy_max = dmax;
    size_t rank99 = (99 * n_tok + 99) / 100; /* nearest rank: ceil(0.99 n) */
    S.discrepancy_p99 = kth_smallest(dabs, (ptrdiff_t)n_tok, (ptrdiff_t)rank99 - 1);
    S.entropy_mean = ent_sum / (double)n_tok;
    double t2 = now_s();
    S.time_prox_s = t2 - t1;

    /* reference log-probs from the frozen initial weights (beta > 0 only) */
    if (l->e.reference) {
        lp_ref = malloc(n_tok * sizeof *lp_ref);
        if (!lp_ref) {
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "learner update: lp_ref");
            goto done;
        }
        QRL_TRY_GOTO(forward_all(l, true, groups, seqs, order, n_seq, lp_ref, NULL,
                                 "reference", err),
                     done);
    }
    double t3 = now_s();
    S.time_ref_s = t3 - t2;

    adv_tok = malloc((size_t)max_R * sizeof *adv_tok);
    ones = malloc((size_t)max_R);
    if (!adv_tok || !ones) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "learner update: %d-token scratch", max_R);
        goto done;
    }
    memset(ones, 1, (size_t)max_R);
    upd_ctx c = {.groups = groups, .seqs = seqs, .lp_prox = lp_prox, .lp_ref = lp_ref,
                 .adv_tok = adv_tok, .ones = ones};
    size_t mbs = cfg->minibatch_seqs > 0 ? (size_t)cfg->minibatch_seqs : n_seq;
    loss_acc tot = {0};
    double gsum = 0;
    int loss_passes = 0; /* minibatches whose loss was computed */
    for (int ep = 0; ep < cfg->ppo_epochs; ep++) {
        /* Fisher-Yates with a stream keyed by (seed, update, epoch) */
        uint64_t rs = cfg->seed ^ (l->updates * 0xd1342543de82ef95ull) ^
                      ((uint64_t)ep * 0x2545f4914f6cdd1dull);
        for (size_t i = n_seq - 1; i > 0; i--) {
            size_t j = (size_t)(splitmix64(&rs) % (uint64_t)(i + 1));
            uint32_t tmp = order[i];
            order[i] = order[j], order[j] = tmp;
        }
        for (size_t b = 0; b < n_seq; b += mbs) {
            size_t n = n_seq - b < mbs ? n_seq - b : mbs;
            loss_acc a = {0};
            qrl_error lerr;
            qrl_learner_engine_zero_grad(&l->e);
            c.max_dlp = 0;
            qrl_status ls = run_minibatch(l, &c, order + b, n, &a, &lerr);
            if (S.minibatches == 0) {
                S.first_mb = acc_to_stats(&a);
                S.first_mb_max_dlp = c.max_dlp;
            }
            S.minibatches++;
            if (ls != QRL_OK) {
                /* a non-finite loss skips the step; an engine failure (memory, the GPU)
                 * ends the update */
                if (ls == QRL_STATUS_NOMEM || ls == QRL_STATUS_CUDA ||
                    ls == QRL_STATUS_INTERNAL) {
                    st = qrl_error_set(err, ls, "%s", lerr.msg);
                    goto done;
                }
                S.steps_skipped++;
                QRL_LOG_WARN("learner", "event=step_skipped update=%llu epoch=%d reason=\"%s\"",
                             (unsigned long long)l->updates, ep, lerr.msg);
                continue;
            }
            loss_passes++;
            tot.n += a.n, tot.seqs += a.seqs;
            tot.loss += a.loss, tot.pg += a.pg, tot.kl += a.kl;
            tot.klbp += a.klbp, tot.tis += a.tis, tot.acr += a.acr, tot.clo += a.clo;
            tot.chi += a.chi, tot.dual += a.dual, tot.k3 += a.k3, tot.ratio += a.ratio;
            tot.mis += a.mis, tot.mis_seq += a.mis_seq, tot.seq_tis += a.seq_tis;
            tot.has_ref |= a.has_ref;
            if (ep == 0) {
                S.tis_tokens += (size_t)llround(a.tis);
                S.acr_tokens += (size_t)llround(a.acr);
                S.mis_tokens += (size_t)llround(a.mis);
                S.mis_seqs += (size_t)llround(a.mis_seq);
            }
            double lr = qrl_lr_schedule_at(&cfg->lr, qrl_adamw_steps(l->e.opt));
            qrl_adamw_step_info info;
            qrl_status as = qrl_learner_engine_step(&l->e, &cfg->adamw, lr, &info, &lerr);
            if (as == QRL_STATUS_OUT_OF_RANGE) { /* non-finite gradient: params untouched */
                S.steps_skipped++;
                QRL_LOG_WARN("learner", "event=step_skipped update=%llu epoch=%d reason=\"%s\"",
                             (unsigned long long)l->updates, ep, lerr.msg);
                continue;
            }
            if (as != QRL_OK) {
                st = qrl_error_set(err, as, "%s", lerr.msg);
                goto done;
            }
            S.steps_taken++;
            S.lr = lr;
            gsum += info.grad_norm;
            if (info.grad_norm > S.grad_norm_max) S.grad_norm_max = info.grad_norm;
        }
    }
    qrl_rl_loss_stats ts = acc_to_stats(&tot);
    S.tis_frac = ts.tis_frac, S.acr_frac = ts.acr_frac;
    S.clip_frac_low = ts.clip_frac_low, S.clip_frac_high = ts.clip_frac_high;
    S.dual_clip_frac = ts.dual_clip_frac, S.ratio_mean = ts.ratio_mean;
    S.seq_tis_frac = ts.seq_tis_frac, S.mis_frac = ts.mis_frac, S.mis_seq_frac = ts.mis_seq_frac;
    S.has_ref = ts.has_ref, S.k3_mean = ts.k3_mean;
    if (loss_passes > 0) {
        S.loss_mean = tot.loss / loss_passes, S.pg_loss_mean = tot.pg / loss_passes;
        S.kl_loss_mean = tot.kl / loss_passes;
    }
    S.micro_batches = c.micro_batches;
    qrl_learner_engine_qat_stats(&l->e, &qs, true); /* every QAT forward of the update */
    S.trace_elements_guided = qs.elements_guided, S.trace_disagree = qs.disagree;
    S.grad_norm_mean = S.steps_taken ? gsum / S.steps_taken : 0;
    S.time_train_s = now_s() - t3;
    S.train_tokens_per_s =
        S.time_train_s > 0 ? (double)c.packed_tokens / S.time_train_s : 0;
finish:
    /* GPU: the model's arena gets the new parameters once per update (weight broadcast,
     * checkpoints), not once per optimizer step */
    if (!l->cfg.device_weights) QRL_TRY_GOTO(qrl_learner_engine_flush(&l->e, err), done);
    l->updates++;
    S.time_total_s = now_s() - t0;
    QRL_LOG_INFO("learner",
                 "event=update update=%llu groups=%zu used=%zu dropped=%zu tokens=%zu "
                 "reward_mean=%.4f acc=%.4f kl_behav_prox=%.4g max_w=%.4g disc_mean=%.4g "
                 "disc_p99=%.4g disc_max=%.4g tis_frac=%.4g mis_frac=%.4g "
                 "clip_low=%.4g clip_high=%.4g entropy=%.4f grad_norm=%.4g lr=%.3g steps=%d "
                 "skipped=%d prox_s=%.3f train_s=%.3f tok_per_s=%.1f",
                 (unsigned long long)l->updates, S.groups_in, S.groups_used, S.groups_dropped,
                 S.tokens_trained, S.reward_mean, S.accuracy, S.kl_behav_prox, S.max_w,
                 S.discrepancy_mean, S.discrepancy_p99, S.discrepancy_max,
                 S.tis_frac, S.mis_frac, S.clip_frac_low, S.clip_frac_high, S.entropy_mean,
                 S.grad_norm_mean, S.lr, S.steps_taken, S.steps_skipped, S.time_prox_s,
                 S.time_train_s, S.train_tokens_per_s);
    if (stats) *stats = S;
done:
    free(seqs), free(order), free(rew), free(adv);
    free(lp_prox), free(lp_ref), free(adv_tok), free(ones), free(dabs);
    return st;
}

/* ---- log-probs of one response ------------------------------------------------------- */

qrl_status qrl_learner_response_logprobs(qrl_learner_t *l, const qrl_learner_group *g,
                                         uint32_t response, float *out, qrl_error *err) {
    if (!g || response >= g->n_responses)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "learner logprobs: response %u of a group of %u", response,
                             g ? g->n_responses : 0);
    QRL_TRY(check_groups(l, g, 1, err));
    const qrl_learner_response *rs = &g->responses[response];
    if (rs->n_tokens == 0) return QRL_OK;
    seq_info s = {.g = 0, .r = response, .P = g->n_prompt, .R = rs->n_tokens, .rt_off = 0};
    uint32_t idx = 0;
    return forward_all(l, false, g, &s, &idx, 1, out, NULL, "current", err);
}
