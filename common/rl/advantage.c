/* Group-relative advantages (SPEC §5, the `A = ...` line): GRPO, Dr.GRPO, RLOO. */
#include <math.h>

#include "rl/rl.h"

static qrl_status check_rewards(const float *rewards, size_t n, size_t base, qrl_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(rewards[i]))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "rewards[%zu]: non-finite reward %g", base + i,
                                 (double)rewards[i]);
    return QRL_OK;
}

/* Core of one group; rewards already checked finite.  Sums in double so that groups
 * of a few thousand responses lose nothing to rounding. */
static void group_advantage(qrl_rl_adv_estimator est, const float *rewards, size_t n,
                            float *adv) {
    if (n == 1) { /* no baseline: documented in rl.h */
        adv[0] = 0.0f;
        return;
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += rewards[i];
    double mean = sum / (double)n;
    double scale = 1.0;
    if (est == QRL_RL_ADV_GRPO) {
        double ss = 0;
        for (size_t i = 0; i < n; i++) {
            double d = rewards[i] - mean;
            ss += d * d;
        }
        /* sample (Bessel-corrected) std, as torch.std in verl's GRPO estimator */
        scale = 1.0 / (sqrt(ss / (double)(n - 1)) + QRL_RL_ADV_EPS);
    } else if (est == QRL_RL_ADV_RLOO) {
        /* r_i - (sum - r_i) / (n - 1) = n / (n - 1) * (r_i - mean) */
        scale = (double)n / (double)(n - 1);
    }
    for (size_t i = 0; i < n; i++) adv[i] = (float)((rewards[i] - mean) * scale);
}

static qrl_status check_est(qrl_rl_adv_estimator est, qrl_error *err) {
    if (est != QRL_RL_ADV_GRPO && est != QRL_RL_ADV_DRGRPO && est != QRL_RL_ADV_RLOO)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "advantage estimator: unknown value %d", (int)est);
    return QRL_OK;
}

qrl_status qrl_rl_advantage_group(qrl_rl_adv_estimator est, const float *rewards, size_t n,
                                  float *adv, qrl_error *err) {
    QRL_TRY(check_est(est, err));
    if (!rewards || !adv)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rewards/adv: NULL pointer");
    if (n == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rewards: empty group");
    QRL_TRY(check_rewards(rewards, n, 0, err));
    group_advantage(est, rewards, n, adv);
    return QRL_OK;
}

qrl_status qrl_rl_advantage_groups(qrl_rl_adv_estimator est, const float *rewards,
                                   const size_t *offsets, size_t n_groups, float *adv,
                                   qrl_error *err) {
    QRL_TRY(check_est(est, err));
    if (!offsets || (n_groups > 0 && (!rewards || !adv)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rewards/offsets/adv: NULL pointer");
    if (offsets[0] != 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "offsets[0]: %zu, expected 0", offsets[0]);
    /* validate everything before writing anything */
    for (size_t g = 0; g < n_groups; g++) {
        if (offsets[g + 1] <= offsets[g])
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "group %zu: empty or decreasing offsets [%zu, %zu)", g,
                                 offsets[g], offsets[g + 1]);
        qrl_status st = check_rewards(rewards + offsets[g], offsets[g + 1] - offsets[g],
                                      offsets[g], err);
        if (st != QRL_OK) {
            qrl_error_trace(err, __FILE__, __LINE__);
            return st;
        }
    }
    for (size_t g = 0; g < n_groups; g++)
        group_advantage(est, rewards + offsets[g], offsets[g + 1] - offsets[g],
                        adv + offsets[g]);
    return QRL_OK;
}

void qrl_rl_advantage_broadcast(const float *adv_seq, size_t n_seq, size_t seq_len,
                                const uint8_t *mask, float *adv_tok) {
    for (size_t s = 0; s < n_seq; s++)
        for (size_t t = 0; t < seq_len; t++) {
            size_t i = s * seq_len + t;
            adv_tok[i] = mask[i] ? adv_seq[s] : 0.0f;
        }
}
