/* Per-token decoupled-PPO loss with TIS and ACR (SPEC §5) and the rollout corrections
 * beside them (sequence-level TIS, token- and sequence-level masked IS), its gradient
 * with respect to the current log-probs, aggregation over a minibatch, and the logged
 * statistics.  docs/loss.md is the prose version of what is computed here. */
#include <math.h>
#include <string.h>

#include "rl/rl.h"

void qrl_rl_loss_config_default(qrl_rl_loss_config *cfg) {
    *cfg = (qrl_rl_loss_config){
        .mode = QRL_RL_LOSS_DECOUPLED,
        .eps_low = 0.2,
        .eps_high = 0.28, /* DAPO clip-higher */
        .tis_cap = 2.0,
        .acr = true,
        .dual_clip = false,
        .clip_c = 3.0, /* Ye et al. 2020 */
        .beta = 1e-3,
        .agg = QRL_RL_AGG_TOKEN_MEAN,
        .is_level = QRL_RL_IS_TOKEN,
        .mis = QRL_RL_MIS_NONE,
        .mis_low = 0.5, /* IcePop's [alpha, beta] */
        .mis_high = 5.0,
    };
}

qrl_status qrl_rl_loss_config_validate(const qrl_rl_loss_config *cfg, qrl_error *err) {
    if (!cfg) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "loss config: NULL");
    if (cfg->mode != QRL_RL_LOSS_NAIVE && cfg->mode != QRL_RL_LOSS_PROX &&
        cfg->mode != QRL_RL_LOSS_DECOUPLED)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.mode: unknown value %d", (int)cfg->mode);
    if (cfg->agg != QRL_RL_AGG_TOKEN_MEAN && cfg->agg != QRL_RL_AGG_SEQ_MEAN)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.agg: unknown value %d", (int)cfg->agg);
    if (!isfinite(cfg->eps_low) || cfg->eps_low < 0 || cfg->eps_low >= 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.eps_low: %g, expected in [0, 1)", cfg->eps_low);
    if (!isfinite(cfg->eps_high) || cfg->eps_high < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.eps_high: %g, expected finite >= 0", cfg->eps_high);
    if (isnan(cfg->tis_cap) || cfg->tis_cap <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.tis_cap: %g, expected > 0", cfg->tis_cap);
    if (cfg->dual_clip && (!isfinite(cfg->clip_c) || cfg->clip_c <= 1))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.clip_c: %g, expected finite > 1", cfg->clip_c);
    if (!isfinite(cfg->beta) || cfg->beta < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.beta: %g, expected finite >= 0", cfg->beta);
    if (cfg->is_level != QRL_RL_IS_TOKEN && cfg->is_level != QRL_RL_IS_SEQ)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss.is_level: unknown value %d", (int)cfg->is_level);
    if (cfg->mis != QRL_RL_MIS_NONE && cfg->mis != QRL_RL_MIS_TOKEN &&
        cfg->mis != QRL_RL_MIS_SEQ)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "loss.mis: unknown value %d",
                             (int)cfg->mis);
    if (cfg->mis != QRL_RL_MIS_NONE) {
        if (!isfinite(cfg->mis_low) || cfg->mis_low < 0)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "loss.mis_low: %g, expected finite >= 0", cfg->mis_low);
        if (isnan(cfg->mis_high) || cfg->mis_high <= cfg->mis_low)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "loss.mis_high: %g, expected > loss.mis_low %g",
                                 cfg->mis_high, cfg->mis_low);
    }
    return QRL_OK;
}

/* Inside the masked-IS band [mis_low, mis_high] (bounds included, as IcePop's)? */
static bool in_band(const qrl_rl_loss_config *cfg, double w) {
    return w >= cfg->mis_low && w <= cfg->mis_high;
}

/* One token, split in its parts so that statistics can use them. */
typedef struct tok_eval {
    double pg, dpg; /* -w_bar * surr and its derivative in lp */
    double R;       /* ratio of the mode */
    unsigned flags; /* QRL_RL_TOK_* */
} tok_eval;

/* w: the behavior weight of the token (decoupled mode: exp(lp_prox - lp_behav), or its
 * sequence's w_seq with IS_SEQ); drop: the masked IS drops the token (decoupled mode). */
static tok_eval token_eval(const qrl_rl_loss_config *cfg, double lp, double lp_prox,
                           double lp_behav, double w, bool drop, double A) {
    tok_eval e = {0};
    double L = 1.0 - cfg->eps_low;
    double U = 1.0 + cfg->eps_high;
    double w_bar = 1.0;
    if (cfg->mode == QRL_RL_LOSS_NAIVE) {
        e.R = exp(lp - lp_behav);
    } else {
        e.R = exp(lp - lp_prox); /* R = exp(lp - lp_prox) */
        if (cfg->mode == QRL_RL_LOSS_DECOUPLED) {
            if (drop) { /* masked IS: w_bar = 0, no policy term, no gradient from it */
                e.flags = QRL_RL_TOK_MIS;
                return e;
            }
            w_bar = w; /* w = exp(lp_prox - lp_behav) (or w_seq) */
            if (w > cfg->tis_cap) { /* w_bar = min(w, C) */
                w_bar = cfg->tis_cap;
                e.flags |= QRL_RL_TOK_TIS;
                if (cfg->acr) {
                    double r = w_bar / w; /* r = w_bar / w < 1 (0 when w = inf) */
                    U = U / r;            /* U = (1 + eps_high) / r */
                    e.flags |= QRL_RL_TOK_ACR;
                }
            }
        }
    }
    /* surr = min(R * A, clip(R, L, U) * A); the clipped branch has zero gradient in R
     * and is taken only when strictly smaller (on a tie both branches agree, R inside
     * [L, U], and the gradient A * R is right either way) */
    double Rc = e.R < L ? L : (e.R > U ? U : e.R);
    double a = e.R * A, b = Rc * A;
    double surr, dsurr;
    if (b < a) {
        surr = b;
        dsurr = 0;
        e.flags |= A < 0 ? QRL_RL_TOK_CLIP_LOW : QRL_RL_TOK_CLIP_HIGH;
    } else {
        surr = a;
        dsurr = a; /* d(R A)/d lp = A R since dR/dlp = R */
    }
    /* dual clip (Ye et al. 2020): for A < 0 the surrogate is bounded below by c * A */
    if (cfg->dual_clip && A < 0 && cfg->clip_c * A > surr) {
        surr = cfg->clip_c * A;
        dsurr = 0;
        e.flags |= QRL_RL_TOK_DUAL_CLIP;
    }
    e.pg = -w_bar * surr; /* - sg(w_bar) * surr */
    e.dpg = -w_bar * dsurr;
    return e;
}

double qrl_rl_loss_token(const qrl_rl_loss_config *cfg, double lp, double lp_prox,
                         double lp_behav, double lp_ref, double adv, double *dloss_dlp,
                         double *ratio, unsigned *flags) {
    double w = NAN;
    bool drop = false;
    if (cfg->mode == QRL_RL_LOSS_DECOUPLED) { /* a one-token sequence: w_seq = w */
        w = exp(lp_prox - lp_behav);
        drop = cfg->mis != QRL_RL_MIS_NONE && !in_band(cfg, w);
    }
    tok_eval e = token_eval(cfg, lp, lp_prox, lp_behav, w, drop, adv);
    double loss = e.pg, d = e.dpg;
    if (cfg->beta > 0 && !isnan(lp_ref)) {
        double x = lp_ref - lp; /* k3 = exp(x) - x - 1, dk3/dlp = 1 - exp(x) */
        loss += cfg->beta * (exp(x) - x - 1.0);
        d += cfg->beta * (1.0 - exp(x));
    }
    if (dloss_dlp) *dloss_dlp = d;
    if (ratio) *ratio = e.R;
    if (flags) *flags = e.flags;
    return loss;
}

static qrl_status check_array(const char *name, const float *a, const qrl_rl_loss_input *in,
                              qrl_error *err) {
    if (!a) return QRL_OK;
    size_t n = in->n_seq * in->seq_len;
    for (size_t i = 0; i < n; i++)
        if (in->mask[i] && !isfinite(a[i]))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s[%zu] (seq %zu, pos %zu): non-finite value %g on a "
                                 "response token",
                                 name, i, i / in->seq_len, i % in->seq_len, (double)a[i]);
    return QRL_OK;
}

static qrl_status check_input(const qrl_rl_loss_config *cfg, const qrl_rl_loss_input *in,
                              qrl_error *err) {
    if (!in) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "loss input: NULL");
    if (in->seq_len && in->n_seq > SIZE_MAX / in->seq_len)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss input: n_seq %zu * seq_len %zu overflows", in->n_seq,
                             in->seq_len);
    if (in->n_seq * in->seq_len == 0) return QRL_OK;
    const char *missing = !in->lp ? "lp" : !in->adv ? "adv" : !in->mask ? "mask" : NULL;
    if (!missing && cfg->mode != QRL_RL_LOSS_NAIVE && !in->lp_prox) missing = "lp_prox";
    if (!missing && cfg->mode != QRL_RL_LOSS_PROX && !in->lp_behav) missing = "lp_behav";
    if (missing)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "loss input: %s is NULL, required in loss.mode %d", missing,
                             (int)cfg->mode);
    QRL_TRY(check_array("lp", in->lp, in, err));
    QRL_TRY(check_array("lp_prox", in->lp_prox, in, err));
    QRL_TRY(check_array("lp_behav", in->lp_behav, in, err));
    QRL_TRY(check_array("lp_ref", in->lp_ref, in, err));
    QRL_TRY(check_array("adv", in->adv, in, err));
    return QRL_OK;
}

qrl_status qrl_rl_loss_compute(const qrl_rl_loss_config *cfg, const qrl_rl_loss_input *in,
                               double *loss, float *grad, qrl_rl_loss_stats *stats,
                               qrl_error *err) {
    QRL_TRY(qrl_rl_loss_config_validate(cfg, err));
    QRL_TRY(check_input(cfg, in, err));
    const size_t T = in->seq_len, n = in->n_seq * T;

    qrl_rl_loss_stats s = {0};
    for (size_t seq = 0; seq < in->n_seq; seq++) {
        size_t ns = 0;
        for (size_t t = 0; t < T; t++) ns += in->mask[seq * T + t] != 0;
        s.n_tokens += ns;
        s.n_seqs += ns > 0;
    }
    s.has_behav_prox = in->lp_prox && in->lp_behav;
    s.has_ref = in->lp_ref != NULL;
    bool use_k3 = in->lp_ref && cfg->beta > 0;
    if (grad)
        for (size_t i = 0; i < n; i++) grad[i] = 0.0f;
    if (s.n_tokens == 0) {
        *loss = 0;
        if (stats) *stats = s;
        return QRL_OK;
    }

    size_t n_tis = 0, n_acr = 0, n_low = 0, n_high = 0, n_dual = 0;
    size_t n_mis = 0, n_mis_seq = 0, n_seq_tis = 0;
    const bool dec = cfg->mode == QRL_RL_LOSS_DECOUPLED;
    const bool need_seq = dec && (cfg->is_level == QRL_RL_IS_SEQ || cfg->mis == QRL_RL_MIS_SEQ);
    double sum_kl_bp = 0, sum_k3 = 0, sum_R = 0;
    for (size_t seq = 0; seq < in->n_seq; seq++) {
        size_t ns = 0;
        for (size_t t = 0; t < T; t++) ns += in->mask[seq * T + t] != 0;
        if (ns == 0) continue;
        /* aggregation weight of each token of this sequence */
        double wt = cfg->agg == QRL_RL_AGG_TOKEN_MEAN ? 1.0 / (double)s.n_tokens
                                                      : 1.0 / ((double)ns * (double)s.n_seqs);
        /* sequence-level weight: w_seq = exp(mean_t (lp_prox - lp_behav)), the geometric
         * mean of the token weights; a sequence outside the MIS_SEQ band is dropped whole */
        double w_seq = NAN;
        bool seq_drop = false;
        if (need_seq) {
            double sum = 0;
            for (size_t t = 0; t < T; t++)
                if (in->mask[seq * T + t])
                    sum += (double)in->lp_prox[seq * T + t] - (double)in->lp_behav[seq * T + t];
            w_seq = exp(sum / (double)ns);
            if (cfg->mis == QRL_RL_MIS_SEQ && !in_band(cfg, w_seq))
                seq_drop = true, n_mis_seq++;
            else if (cfg->is_level == QRL_RL_IS_SEQ && w_seq > cfg->tis_cap)
                n_seq_tis++;
        }
        for (size_t t = 0; t < T; t++) {
            size_t i = seq * T + t;
            if (!in->mask[i]) continue;
            double lp = in->lp[i];
            double lpp = in->lp_prox ? in->lp_prox[i] : NAN;
            double lpb = in->lp_behav ? in->lp_behav[i] : NAN;
            double w = NAN;
            bool drop = false;
            if (dec) {
                double w_tok = exp(lpp - lpb);
                w = cfg->is_level == QRL_RL_IS_SEQ ? w_seq : w_tok;
                drop = seq_drop || (cfg->mis == QRL_RL_MIS_TOKEN && !in_band(cfg, w_tok));
            }
            tok_eval e = token_eval(cfg, lp, lpp, lpb, w, drop, in->adv[i]);
            double kl = 0, dkl = 0;
            if (in->lp_ref) {
                double x = (double)in->lp_ref[i] - lp;
                double k3 = exp(x) - x - 1.0;
                sum_k3 += k3;
                if (use_k3) {
                    kl = cfg->beta * k3;
                    dkl = cfg->beta * (1.0 - exp(x));
                }
            }
            double d = (e.dpg + dkl) * wt;
            if (!isfinite(e.pg + kl) || !isfinite(d)) {
                if (grad) memset(grad, 0, n * sizeof *grad);
                return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                     "token %zu (seq %zu, pos %zu): non-finite loss %g or "
                                     "gradient %g (ratio %g)",
                                     i, seq, t, e.pg + kl, d, e.R);
            }
            s.pg_loss += e.pg * wt;
            s.kl_loss += kl * wt;
            if (grad) grad[i] = (float)d;
            sum_R += e.R;
            if (s.has_behav_prox) {
                sum_kl_bp += (double)lpb - lpp;
                double w = exp(lpp - lpb);
                if (w > s.max_w) s.max_w = w;
            }
            n_tis += (e.flags & QRL_RL_TOK_TIS) != 0;
            n_acr += (e.flags & QRL_RL_TOK_ACR) != 0;
            n_low += (e.flags & QRL_RL_TOK_CLIP_LOW) != 0;
            n_high += (e.flags & QRL_RL_TOK_CLIP_HIGH) != 0;
            n_dual += (e.flags & QRL_RL_TOK_DUAL_CLIP) != 0;
            n_mis += (e.flags & QRL_RL_TOK_MIS) != 0;
        }
    }
    double N = (double)s.n_tokens;
    s.loss = s.pg_loss + s.kl_loss;
    if (s.has_behav_prox) s.kl_behav_prox = sum_kl_bp / N;
    s.tis_frac = (double)n_tis / N;
    s.acr_frac = (double)n_acr / N;
    s.clip_frac_low = (double)n_low / N;
    s.clip_frac_high = (double)n_high / N;
    s.dual_clip_frac = (double)n_dual / N;
    s.seq_tis_frac = (double)n_seq_tis / (double)s.n_seqs;
    s.mis_frac = (double)n_mis / N;
    s.mis_seq_frac = (double)n_mis_seq / (double)s.n_seqs;
    if (s.has_ref) s.k3_mean = sum_k3 / N;
    s.ratio_mean = sum_R / N;
    *loss = s.loss;
    if (stats) *stats = s;
    return QRL_OK;
}
