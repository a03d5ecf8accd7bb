/* qrl-learner's metrics besides metrics.jsonl (docs/metrics.md):
 *   metrics.listen            Prometheus /metrics: the last update's scalars, the loop's
 *                             gauges and totals;
 *   metrics.tensorboard_dir   one TensorBoard event per update carrying the scalars of the
 *                             metrics.jsonl line (tags = its keys, event step = step).
 * Called from the loop thread only; the HTTP thread only reads. */
#ifndef QRL_LEARNER_METRICS_H
#define QRL_LEARNER_METRICS_H

#include <stdint.h>

#include "core/config.h"
#include "core/status.h"
#include "learner.h"

typedef struct ld_metrics ld_metrics;

/* The loop's state, published every tick. */
typedef struct ld_metrics_state {
    uint64_t groups_dispatched;    /* PromptGroups dispatched so far */
    uint64_t groups_in_flight;     /* dispatched, no result yet */
    uint64_t groups_buffered;      /* results waiting for a quota */
    uint64_t results, duplicates, dead_letters;
    int replicas;                  /* registered rollout replicas */
    int replicas_synced;           /* of them, at the current version */
    int state;                     /* Qrl__ServiceState */
} ld_metrics_state;

/* Start what the config asks for (*out NULL and QRL_OK when both keys are "").  Errors:
 * those of qrl_prom_server_start / qrl_tfevents_open, prefixed with the key. */
qrl_status ld_metrics_start(const qrl_config_t *cfg, ld_metrics **out, qrl_error *err);
/* One finished update `j` that made `version` at `step`.  A failed TensorBoard write is
 * logged (once) and the file given up; training goes on.  m may be NULL. */
void ld_metrics_update(ld_metrics *m, uint64_t step, uint64_t version, const ld_job *j);
void ld_metrics_tick(ld_metrics *m, const ld_metrics_state *s);
/* Stop serving, close the event file, free; NULL is a no-op. */
void ld_metrics_stop(ld_metrics *m);

#endif
