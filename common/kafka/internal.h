/* Helpers shared by common/kafka/kafka.c and admin.c; not part of the public API. */
#ifndef QRL_KAFKA_INTERNAL_H
#define QRL_KAFKA_INTERNAL_H

#include <librdkafka/rdkafka.h>

#include "core/status.h"

/* Set one librdkafka property; INVALID_ARGUMENT naming key, value and librdkafka's reason. */
qrl_status qrl_kafka_conf_set_(rd_kafka_conf_t *conf, const char *key, const char *value,
                               qrl_error *err);

/* Apply a NULL-terminated {key, value, ...} list (may be NULL). */
qrl_status qrl_kafka_conf_extra_(rd_kafka_conf_t *conf, const char *const *extra, qrl_error *err);

/* librdkafka log lines into core/log.h (tag "kafka").  When quiet, connection failures
 * are logged at DEBUG: used while waiting for a broker that is still starting. */
void qrl_kafka_log_cb_(const rd_kafka_t *rk, int level, const char *fac, const char *buf);
void qrl_kafka_log_quiet_cb_(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

/* qrl_kafka_status_from_code, adjusted by the error object's own retriable/fatal flags. */
qrl_status qrl_kafka_status_from_error_(const rd_kafka_error_t *e);

/* Milliseconds on a monotonic clock. */
int64_t qrl_kafka_now_ms_(void);

#endif
