/* The learner daemon's metrics besides metrics.jsonl (docs/metrics.md):
 *   metrics.listen            Prometheus /metrics: the last update's scalars, the loop's
 *                             gauges and totals;
 *   metrics.tensorboard_dir   one TensorBoard event per update carrying the scalars of the
 *                             metrics.jsonl line (tags = its keys, event step = step).
 * Called from the loop thread only; the HTTP thread only reads. */
#ifndef QRL_LEARNER_METRICS_H
#define QRL_LEARNER_METRICS_H

#include <stdint.h>

#include "core/status.h"
#include "learner/update.h"
#include "metrics/prom.h"

typedef struct qrl_learner_metrics qrl_learner_metrics_t;

/* The loop's state, published every tick. */
typedef struct qrl_learner_metrics_state {
    uint64_t groups_dispatched;    /* PromptGroups dispatched so far */
    uint64_t groups_in_flight;     /* dispatched, no result yet */
    uint64_t groups_buffered;      /* results waiting for a quota */
    uint64_t results, duplicates, dead_letters;
    int replicas;                  /* registered rollout replicas */
    int replicas_synced;           /* of them, at the current version */
    int state;                     /* Qrl__ServiceState */
} qrl_learner_metrics_state;

/* One finished update: its statistics (borrowed for the call) and the two timings. */
typedef struct qrl_learner_metrics_record {
    const qrl_learner_stats *stats;
    double update_s;   /* wall time of the update */
    double snapshot_s; /* building the BF16 weight snapshot */
} qrl_learner_metrics_record;

/* Register the series on `reg` (a registry the caller serves, e.g. the service shell's
 * qrl_service_prom; borrowed, it must outlive *out; NULL: no Prometheus series) and open
 * `tb_dir` (metrics.tensorboard_dir, "" = no events); *out NULL and QRL_OK when neither.
 * *out is freed with qrl_learner_metrics_stop.  Errors: those of qrl_prom_register, and
 * qrl_tfevents_open's prefixed with the key. */
qrl_status qrl_learner_metrics_new(qrl_prom_registry_t *reg, const char *tb_dir, qrl_learner_metrics_t **out,
                                   qrl_error *err);
/* The same with a registry and /metrics server of its own: start what is asked for: `listen` (metrics.listen, host:port, "" = no endpoint) and
 * `tb_dir` (metrics.tensorboard_dir, "" = no events); *out NULL and QRL_OK when both are
 * "".  *out is freed with qrl_learner_metrics_stop.  Errors: those of
 * qrl_prom_server_start / qrl_tfevents_open, prefixed with the key. */
qrl_status qrl_learner_metrics_start(const char *listen, const char *tb_dir, qrl_learner_metrics_t **out,
                                     qrl_error *err);
/* One finished update `u` that made `version` at `step`.  A failed TensorBoard write is
 * logged (once) and the file given up; training goes on.  m may be NULL. */
void qrl_learner_metrics_update(qrl_learner_metrics_t *m, uint64_t step, uint64_t version,
                                const qrl_learner_metrics_record *u);
/* The loop's gauges and totals now (each tick); m may be NULL. */
void qrl_learner_metrics_tick(qrl_learner_metrics_t *m, const qrl_learner_metrics_state *s);
/* The port /metrics listens on (metrics.listen port 0 picks one), or -1 without one. */
int qrl_learner_metrics_port(const qrl_learner_metrics_t *m);
/* The TensorBoard event file written (valid until qrl_learner_metrics_stop), or NULL. */
const char *qrl_learner_metrics_events_path(const qrl_learner_metrics_t *m);
/* Stop serving, close the event file, free; NULL is a no-op. */
void qrl_learner_metrics_stop(qrl_learner_metrics_t *m);

#endif
