/* Linear warmup then constant / cosine learning rate (see lr_schedule.h). */
#include "train/lr_schedule.h"

#include <math.h>
#include <string.h>

int qrl_lr_decay_parse(const char *name) {
    if (strcmp(name, "constant") == 0) return QRL_LR_DECAY_CONSTANT;
    if (strcmp(name, "cosine") == 0) return QRL_LR_DECAY_COSINE;
    return -1;
}

const char *qrl_lr_decay_name(qrl_lr_decay d) {
    switch (d) {
    case QRL_LR_DECAY_CONSTANT: return "constant";
    case QRL_LR_DECAY_COSINE: return "cosine";
    }
    return "unknown";
}

qrl_status qrl_lr_schedule_check(const qrl_lr_schedule *s, qrl_error *err) {
    if (s->decay != QRL_LR_DECAY_CONSTANT && s->decay != QRL_LR_DECAY_COSINE)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "lr schedule: unknown decay %d",
                             (int)s->decay);
    if (!(isfinite(s->lr) && s->lr > 0.0))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "lr schedule: lr %g must be finite and > 0", s->lr);
    if (!(s->min_lr >= 0.0 && s->min_lr <= s->lr))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "lr schedule: min_lr %g must be in [0, lr=%g]", s->min_lr, s->lr);
    if (s->warmup_steps < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "lr schedule: warmup_steps %lld must be >= 0",
                             (long long)s->warmup_steps);
    if (s->decay == QRL_LR_DECAY_COSINE && s->total_steps <= s->warmup_steps)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "lr schedule: total_steps %lld must exceed warmup_steps %lld for "
                             "cosine decay", (long long)s->total_steps,
                             (long long)s->warmup_steps);
    return QRL_OK;
}

double qrl_lr_schedule_at(const qrl_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup_steps) return s->lr * (double)(step + 1) / (double)s->warmup_steps;
    if (s->decay == QRL_LR_DECAY_CONSTANT) return s->lr;
    double p = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (p > 1.0) p = 1.0;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}
