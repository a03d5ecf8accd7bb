/* Learning-rate schedule of the learner (SPEC §5): linear warmup, then constant or cosine
 * decay to a floor.
 *
 * `step` counts optimizer steps from 0 (the value of qrl_adamw_steps before the step):
 *   step < warmup:            lr * (step + 1) / warmup     (llm.c: the first step is not
 *                                                           wasted at lr 0)
 *   CONSTANT, after warmup:   lr
 *   COSINE, after warmup:     min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
 *                             p = (step - warmup) / (total - warmup), clamped to [0, 1],
 *                             so min_lr from step `total` on. */
#ifndef QRL_TRAIN_LR_SCHEDULE_H
#define QRL_TRAIN_LR_SCHEDULE_H

#include <stdint.h>

#include "core/status.h"

typedef enum qrl_lr_decay {
    QRL_LR_DECAY_CONSTANT = 0,
    QRL_LR_DECAY_COSINE = 1,
} qrl_lr_decay;

typedef struct qrl_lr_schedule {
    qrl_lr_decay decay;
    double lr;             /* peak learning rate, > 0 */
    double min_lr;         /* COSINE floor, in [0, lr] */
    int64_t warmup_steps;  /* >= 0; 0 = no warmup */
    int64_t total_steps;   /* COSINE: step where the floor is reached, > warmup_steps */
} qrl_lr_schedule;

/* "constant" or "cosine" -> the enum value; -1 when unknown. */
int qrl_lr_decay_parse(const char *name);
/* The name of a decay ("constant", "cosine"); "unknown" for other values. */
const char *qrl_lr_decay_name(qrl_lr_decay d);

/* Errors: INVALID_ARGUMENT naming the field (lr not finite or <= 0, min_lr outside
 * [0, lr], warmup_steps < 0, total_steps <= warmup_steps for COSINE, unknown decay). */
qrl_status qrl_lr_schedule_check(const qrl_lr_schedule *s, qrl_error *err);

/* Learning rate for optimizer step `step` (>= 0; negative steps count as 0).  The
 * schedule must have passed qrl_lr_schedule_check. */
double qrl_lr_schedule_at(const qrl_lr_schedule *s, int64_t step);

#endif
