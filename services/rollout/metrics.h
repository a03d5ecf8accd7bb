/* qrl-rollout's Prometheus metrics (metrics.listen; docs/metrics.md): the numbers of the
 * Rollout.Status reply and the loop's counters, served at /metrics.  Updated from the loop
 * thread; the HTTP thread only reads. */
#ifndef QRL_ROLLOUT_METRICS_H
#define QRL_ROLLOUT_METRICS_H

#include <stdint.h>

#include "core/status.h"
#include "metrics/prom.h"
#include "qrl.pb-c.h"

typedef struct rd_metrics rd_metrics;

/* Register the series on `reg` (the service's registry, served at metrics.listen; *out
 * NULL and QRL_OK when reg is NULL: metrics.listen is off); labels the info series with
 * the replica id, precision and KV format (copied).  Errors: those of qrl_prom_register. */
qrl_status rd_metrics_start(qrl_prom_registry_t *reg, const char *replica_id, const char *precision,
                            const char *kv_format, rd_metrics **out, qrl_error *err);
/* The loop's TRACE totals (acknowledged): chunk messages and their bytes, record bytes and
 * the response tokens they cover (bytes per token = record_bytes / tokens). */
typedef struct rd_metrics_trace {
    uint64_t chunks, bytes, record_bytes, tokens;
    uint64_t failed;          /* responses whose TraceChunks were given up (deliver.c): no records */
    uint64_t start_us;        /* when the replica began serving (uv_hrtime µs): bytes/s */
    double capture_share;     /* the recorder's share of the engine's forward time */
} rd_metrics_trace;

/* Publish a status snapshot (as Rollout.Status fills it) and the loop's totals.  m may be
 * NULL (no-op). */
void rd_metrics_update(rd_metrics *m, const Qrl__RolloutStatus *s, uint64_t dead_letters,
                       uint64_t consumed, uint64_t duplicates, const rd_metrics_trace *tr);
/* Free the handles (the series stay with the registry); NULL is a no-op. */
void rd_metrics_stop(rd_metrics *m);

#endif
