/* Dynamic sampling (DAPO, SPEC §5 "drops groups whose rewards are all equal when
 * dynamic sampling is on"): zero-variance test, batch filter, and the bookkeeping of
 * bounded over-sampling. */
#include <math.h>

#include "rl/rl.h"

bool qrl_rl_group_zero_variance(const float *rewards, size_t n) {
    /* exact equality: rewards are verifier scores (0/1 or a few levels), and any
     * difference at all gives a non-zero GRPO advantage */
    for (size_t i = 1; i < n; i++)
        if (rewards[i] != rewards[0]) return false;
    return true;
}

qrl_status qrl_rl_groups_filter(const float *rewards, const size_t *offsets, size_t n_groups,
                                uint8_t *keep, size_t *n_kept, qrl_error *err) {
    if (!offsets || (n_groups > 0 && (!rewards || !keep)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rewards/offsets/keep: NULL pointer");
    if (offsets[0] != 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "offsets[0]: %zu, expected 0", offsets[0]);
    for (size_t g = 0; g < n_groups; g++)
        if (offsets[g + 1] <= offsets[g])
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "group %zu: empty or decreasing offsets [%zu, %zu)", g,
                                 offsets[g], offsets[g + 1]);
    size_t kept = 0;
    for (size_t g = 0; g < n_groups; g++) {
        bool k = !qrl_rl_group_zero_variance(rewards + offsets[g], offsets[g + 1] - offsets[g]);
        keep[g] = k;
        kept += k;
    }
    if (n_kept) *n_kept = kept;
    return QRL_OK;
}

qrl_status qrl_rl_dynsample_init(qrl_rl_dynsample *ds, size_t target, double max_oversample,
                                 qrl_error *err) {
    if (!ds) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "dynsample: NULL");
    if (target == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "dynsample.target: 0, expected >= 1");
    if (!isfinite(max_oversample) || max_oversample < 1.0 || max_oversample > 1e6)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "dynsample.max_oversample: %g, expected in [1, 1e6]",
                             max_oversample);
    *ds = (qrl_rl_dynsample){.target = target,
                             .max_offered = (size_t)ceil((double)target * max_oversample)};
    if (ds->max_offered < target) ds->max_offered = target;
    return QRL_OK;
}

void qrl_rl_dynsample_reset(qrl_rl_dynsample *ds) {
    ds->offered = ds->kept = ds->dropped = 0;
}

qrl_rl_dynsample_state qrl_rl_dynsample_state_of(const qrl_rl_dynsample *ds) {
    if (ds->kept >= ds->target) return QRL_RL_DYNSAMPLE_FULL;
    if (ds->offered >= ds->max_offered) return QRL_RL_DYNSAMPLE_EXHAUSTED;
    return QRL_RL_DYNSAMPLE_NEED_MORE;
}

qrl_rl_dynsample_state qrl_rl_dynsample_offer(qrl_rl_dynsample *ds, const float *rewards,
                                              size_t n, bool *keep) {
    qrl_rl_dynsample_state s = qrl_rl_dynsample_state_of(ds);
    if (s != QRL_RL_DYNSAMPLE_NEED_MORE) {
        if (keep) *keep = false;
        return s;
    }
    bool k = !qrl_rl_group_zero_variance(rewards, n);
    ds->offered++;
    if (k) {
        ds->kept++;
        ds->total_kept++;
    } else {
        ds->dropped++;
        ds->total_dropped++;
    }
    if (keep) *keep = k;
    return qrl_rl_dynsample_state_of(ds);
}
