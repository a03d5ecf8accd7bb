/* Prometheus metrics: a registry of counters and gauges rendered in the text exposition
 * format (version 0.0.4), and an HTTP `/metrics` endpoint served by libmicrohttpd
 * (docs/metrics.md lists the daemons' metrics).
 *
 * Threading: registering and rendering take the registry's mutex; updating a series
 * (qrl_prom_set / qrl_prom_add) is one atomic operation on its value, so the engine,
 * trainer and loop threads may update while the HTTP thread renders.  A series handle
 * stays valid until the registry is destroyed. */
#ifndef QRL_METRICS_PROM_H
#define QRL_METRICS_PROM_H

#include <stddef.h>

#include "core/status.h"

typedef enum qrl_prom_type {
    QRL_PROM_COUNTER, /* only goes up (qrl_prom_add with v >= 0, or qrl_prom_set of a total) */
    QRL_PROM_GAUGE,   /* any value */
} qrl_prom_type;

typedef struct qrl_prom_registry qrl_prom_registry_t;
typedef struct qrl_prom_series qrl_prom_series_t;
typedef struct qrl_prom_server qrl_prom_server_t;

/* A new, empty registry.  Errors: NOMEM.  Free with qrl_prom_registry_destroy (after the
 * server that serves it is stopped). */
qrl_status qrl_prom_registry_new(qrl_prom_registry_t **out, qrl_error *err);
void qrl_prom_registry_destroy(qrl_prom_registry_t *r);

/* Register one series of metric family `name` (value 0).  `labels` holds n_labels
 * name/value pairs: labels[2i] is a label name, labels[2i+1] its value (any UTF-8;
 * escaped when rendered); n_labels may be 0 (labels NULL).  All strings are copied.
 * Several series of one family (different label values) share `help` and `type`.
 * Errors: INVALID_ARGUMENT for a bad metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), a bad or
 * reserved ("__" prefix) label name, a label named twice, a family registered before
 * with another type or help, a series registered twice (same label values); NOMEM.
 * *out is owned by the registry. */
qrl_status qrl_prom_register(qrl_prom_registry_t *r, qrl_prom_type type, const char *name,
                             const char *help, const char *const *labels, size_t n_labels,
                             qrl_prom_series_t **out, qrl_error *err);

/* Set / add to a series' value (any thread; lock-free).  Adding a negative value to a
 * counter is a programming error (QRL_CHECK). */
void qrl_prom_set(qrl_prom_series_t *s, double v);
void qrl_prom_add(qrl_prom_series_t *s, double v);
double qrl_prom_get(const qrl_prom_series_t *s);

/* The exposition text of every family, in registration order:
 *   # HELP name help-text        (help with '\' and newline escaped)
 *   # TYPE name counter|gauge
 *   name{label="value",...} 42    (value escaped: '\' '"' newline; NaN, +Inf, -Inf)
 * *out is malloc'd and NUL-terminated (*len excludes the NUL); the caller frees it.
 * Errors: NOMEM. */
qrl_status qrl_prom_render(qrl_prom_registry_t *r, char **out, size_t *len, qrl_error *err);

/* Serve `r` over HTTP on `listen` ("host:port", numeric host or a name; "[v6]:port";
 * port 0 = any free port) from libmicrohttpd's own thread:
 *   GET/HEAD /metrics   200, text/plain; version=0.0.4
 *   other paths         404
 *   other methods       405 with Allow: GET, HEAD
 * Logs "metrics listening addr=HOST:PORT".  The registry is borrowed: it must outlive
 * the server.  Errors: INVALID_ARGUMENT (address), NETWORK (resolve/bind/listen),
 * INTERNAL (the daemon would not start), NOMEM.  Stop with qrl_prom_server_stop. */
qrl_status qrl_prom_server_start(qrl_prom_registry_t *r, const char *listen,
                                 qrl_prom_server_t **out, qrl_error *err);
/* The bound port (the picked one when 0 was asked). */
int qrl_prom_server_port(const qrl_prom_server_t *s);
/* Stop serving, wait for the HTTP thread, free the server; NULL is a no-op. */
void qrl_prom_server_stop(qrl_prom_server_t *s);

#endif
