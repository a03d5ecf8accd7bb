/* Idempotent producer, manual-commit consumer and dead letters over librdkafka.
 * See kafka.h for the contract; admin calls live in admin.c. */
#include "kafka/kafka.h"

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "kafka/internal.h"

/* ---- errors ---------------------------------------------------------------------------- */

qrl_status qrl_kafka_status_from_code(int code) {
    switch ((rd_kafka_resp_err_t)code) {
    case RD_KAFKA_RESP_ERR_NO_ERROR:
        return QRL_OK;
    /* try again shortly: local queue full, broker or group busy */
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
    case RD_KAFKA_RESP_ERR__PREV_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR__STATE:
    case RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST:
    case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID:
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
        return QRL_STATUS_BUSY;
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
        return QRL_STATUS_TIMEOUT;
    /* the cluster is unreachable or its leadership is moving */
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__FAIL:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
    case RD_KAFKA_RESP_ERR__NODE_UPDATE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_NOT_CONTROLLER:
    case RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
        return QRL_STATUS_NETWORK;
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__UNKNOWN_GROUP:
    case RD_KAFKA_RESP_ERR__NOENT:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND:
        return QRL_STATUS_NOT_FOUND;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE:
    case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
    case RD_KAFKA_RESP_ERR_INVALID_REPLICATION_FACTOR:
    case RD_KAFKA_RESP_ERR__PARTITION_EOF:
        return QRL_STATUS_OUT_OF_RANGE;
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__INVALID_TYPE:
    case RD_KAFKA_RESP_ERR__CONFLICT:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
    case RD_KAFKA_RESP_ERR_INVALID_REQUEST:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_INVALID_GROUP_ID:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
        return QRL_STATUS_INVALID_ARGUMENT;
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
        return QRL_STATUS_PERMISSION;
    case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
    case RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_COMPRESSION_TYPE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
        return QRL_STATUS_UNSUPPORTED;
    case RD_KAFKA_RESP_ERR__BAD_MSG:
    case RD_KAFKA_RESP_ERR__BAD_COMPRESSION:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
        return QRL_STATUS_CORRUPT;
    case RD_KAFKA_RESP_ERR__DESTROY:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
        return QRL_STATUS_CANCELLED;
    default:
        /* __FATAL, idempotence sequence/epoch errors and whatever is new: recreating the
         * handle, not retrying the call, is the way out. */
        return QRL_STATUS_INTERNAL;
    }
}

qrl_status qrl_kafka_status_from_error_(const rd_kafka_error_t *e) {
    if (!e) return QRL_OK;
    if (rd_kafka_error_is_fatal(e)) return QRL_STATUS_INTERNAL;
    qrl_status st = qrl_kafka_status_from_code(rd_kafka_error_code(e));
    if (rd_kafka_error_is_retriable(e) && !qrl_status_retriable(st)) return QRL_STATUS_NETWORK;
    return st;
}

/* ---- shared helpers ------------------------------------------------------------------- */

int64_t qrl_kafka_now_ms_(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

qrl_status qrl_kafka_conf_set_(rd_kafka_conf_t *conf, const char *key, const char *value,
                               qrl_error *err) {
    char why[256];
    if (rd_kafka_conf_set(conf, key, value, why, sizeof why) != RD_KAFKA_CONF_OK)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka property %s=%s: %s", key,
                             value ? value : "(null)", why);
    return QRL_OK;
}

qrl_status qrl_kafka_conf_extra_(rd_kafka_conf_t *conf, const char *const *extra, qrl_error *err) {
    for (size_t i = 0; extra && extra[i]; i += 2) {
        if (!extra[i + 1])
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "kafka property %s has no value (extra list must be key, value pairs)",
                                 extra[i]);
        QRL_TRY(qrl_kafka_conf_set_(conf, extra[i], extra[i + 1], err));
    }
    return QRL_OK;
}

static void log_line(int level, const rd_kafka_t *rk, const char *fac, const char *buf) {
    const char *name = rk ? rd_kafka_name(rk) : "-";
    if (level <= 3) QRL_LOG_ERROR("kafka", "%s client=%s fac=%s", buf, name, fac);
    else if (level == 4) QRL_LOG_WARN("kafka", "%s client=%s fac=%s", buf, name, fac);
    else if (level <= 6) QRL_LOG_INFO("kafka", "%s client=%s fac=%s", buf, name, fac);
    else QRL_LOG_DEBUG("kafka", "%s client=%s fac=%s", buf, name, fac);
}

void qrl_kafka_log_cb_(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    /* a failed connection is retried by librdkafka: a warning until something gives up */
    if (level < 4 && strcmp(fac, "FAIL") == 0) level = 4;
    log_line(level, rk, fac, buf);
}

void qrl_kafka_log_quiet_cb_(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    /* "FAIL" and "ERROR": connection refused while the broker is still starting */
    if (strcmp(fac, "FAIL") == 0 || strcmp(fac, "ERROR") == 0) level = 7;
    log_line(level, rk, fac, buf);
}

static void error_cb(rd_kafka_t *rk, int code, const char *reason, void *opaque) {
    (void)opaque;
    if (code == RD_KAFKA_RESP_ERR__FATAL) {
        char why[512];
        rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, why, sizeof why);
        QRL_LOG_ERROR("kafka", "fatal error client=%s code=%s reason=\"%s\"", rd_kafka_name(rk),
                      rd_kafka_err2name(orig), why);
        return;
    }
    if (code == RD_KAFKA_RESP_ERR__TRANSPORT) return; /* logged already (facility FAIL) */
    QRL_LOG_WARN("kafka", "client error client=%s code=%s reason=\"%s\"", rd_kafka_name(rk),
                 rd_kafka_err2name((rd_kafka_resp_err_t)code), reason);
}

/* Common properties of both handle kinds. */
static qrl_status conf_base(rd_kafka_conf_t *conf, const char *bootstrap, const char *client_id,
                            qrl_error *err) {
    QRL_TRY(qrl_kafka_conf_set_(conf, "bootstrap.servers", bootstrap, err));
    QRL_TRY(qrl_kafka_conf_set_(conf, "client.id", client_id ? client_id : "qrl", err));
    rd_kafka_conf_set_log_cb(conf, qrl_kafka_log_cb_);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    return QRL_OK;
}

/* ---- producer -------------------------------------------------------------------------- */

struct qrl_kafka_producer {
    rd_kafka_t *rk;
    char bootstrap[256];
    int max_bytes;
    qrl_kafka_delivery_fn on_delivery;
    void *user;
    int outstanding;               /* sent, not yet reported */
    long n_failed;                 /* failed deliveries since the last flush */
    qrl_status first_fail;
    char first_fail_msg[QRL_ERROR_MSG_MAX];
};

static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    qrl_kafka_producer_t *p = opaque;
    qrl_kafka_delivery d = {
        .status = qrl_kafka_status_from_code(m->err),
        .topic = m->rkt ? rd_kafka_topic_name(m->rkt) : "-",
        .partition = m->partition,
        .offset = m->err ? -1 : m->offset,
        .error = m->err ? rd_kafka_err2str(m->err) : NULL,
    };
    p->outstanding--;
    if (m->err) {
        if (p->n_failed++ == 0) {
            p->first_fail = d.status;
            snprintf(p->first_fail_msg, sizeof p->first_fail_msg,
                     "delivery to topic %s [%d] on %s failed: %s (%s)", d.topic, (int)d.partition,
                     p->bootstrap, d.error, rd_kafka_err2name(m->err));
        }
    }
    if (p->on_delivery) p->on_delivery(p->user, m->_private, &d);
}

qrl_status qrl_kafka_producer_new(const qrl_kafka_producer_opts *opts, qrl_kafka_producer_t **out,
                                  qrl_error *err) {
    *out = NULL;
    if (!opts || !opts->bootstrap || !*opts->bootstrap)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka producer: bootstrap is empty");
    const char *comp = opts->compression ? opts->compression : "lz4";
    if (strcmp(comp, "lz4") != 0 && strcmp(comp, "zstd") != 0 && strcmp(comp, "none") != 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "kafka producer: compression '%s' is not one of lz4, zstd, none", comp);
    int max_bytes = opts->message_max_bytes ? opts->message_max_bytes : QRL_KAFKA_MAX_MESSAGE_BYTES;
    if (max_bytes < 1000)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kafka producer: message_max_bytes %d is below 1000", max_bytes);

    qrl_kafka_producer_t *p = calloc(1, sizeof *p);
    if (!p) return qrl_error_set(err, QRL_STATUS_NOMEM, "kafka producer: out of memory");
    snprintf(p->bootstrap, sizeof p->bootstrap, "%s", opts->bootstrap);
    p->max_bytes = max_bytes;
    p->on_delivery = opts->on_delivery;
    p->user = opts->user;

    qrl_status st = QRL_OK;
    char num[32], why[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    QRL_TRY_GOTO(conf_base(conf, opts->bootstrap, opts->client_id, err), fail);
    /* idempotence implies acks=all and bounded in-flight requests; it is what keeps a
     * retried send from writing a result twice (SPEC 8) */
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "enable.idempotence", "true", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "acks", "all", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "compression.type", comp, err), fail);
    /* same key -> same partition as Java producers */
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "partitioner", "murmur2_random", err), fail);
    snprintf(num, sizeof num, "%d", opts->linger_ms < 0 ? 5 : opts->linger_ms);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "linger.ms", num, err), fail);
    snprintf(num, sizeof num, "%d", opts->message_timeout_ms ? opts->message_timeout_ms : 120000);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "message.timeout.ms", num, err), fail);
    /* librdkafka's limit covers the protocol overhead around the record too */
    snprintf(num, sizeof num, "%d", max_bytes + 65536);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "message.max.bytes", num, err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_extra_(conf, opts->extra, err), fail);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
    rd_kafka_conf_set_opaque(conf, p);

    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
    if (!p->rk) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka producer for %s: %s",
                           opts->bootstrap, why);
        goto fail;
    }
    *out = p;
    return QRL_OK;
fail:
    rd_kafka_conf_destroy(conf);
    free(p);
    return st;
}

qrl_status qrl_kafka_producer_send(qrl_kafka_producer_t *p, const char *topic, const void *key,
                                   size_t key_len, const void *payload, size_t len,
                                   void *msg_opaque, qrl_error *err) {
    char why[256];
    rd_kafka_resp_err_t fatal = rd_kafka_fatal_error(p->rk, why, sizeof why);
    if (fatal)
        return qrl_error_set(err, QRL_STATUS_INTERNAL,
                             "kafka producer on %s is unusable after a fatal error (%s: %s); recreate it",
                             p->bootstrap, rd_kafka_err2name(fatal), why);
    if (len + key_len > (size_t)p->max_bytes)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "record of %zu bytes (key %zu) for topic %s exceeds message_max_bytes %d",
                             len + key_len, key_len, topic, p->max_bytes);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY((void *)key, key_len),
        RD_KAFKA_V_VALUE((void *)payload, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_OPAQUE(msg_opaque), RD_KAFKA_V_END);
    if (e)
        return qrl_error_set(err, qrl_kafka_status_from_code(e),
                             "producing %zu bytes to topic %s on %s: %s (%s)", len, topic,
                             p->bootstrap, rd_kafka_err2str(e), rd_kafka_err2name(e));
    p->outstanding++;
    return QRL_OK;
}

int qrl_kafka_producer_poll(qrl_kafka_producer_t *p, int timeout_ms) {
    return rd_kafka_poll(p->rk, timeout_ms);
}

int qrl_kafka_producer_outstanding(const qrl_kafka_producer_t *p) { return p->outstanding; }

qrl_status qrl_kafka_producer_flush(qrl_kafka_producer_t *p, int timeout_ms, qrl_error *err) {
    rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, timeout_ms);
    if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
        return qrl_error_set(err, QRL_STATUS_TIMEOUT,
                             "flush to %s: %d messages still undelivered after %d ms",
                             p->bootstrap, p->outstanding, timeout_ms);
    if (p->n_failed) {
        long n = p->n_failed;
        p->n_failed = 0;
        return qrl_error_set(err, p->first_fail, "%s (%ld failed since the last flush)",
                             p->first_fail_msg, n);
    }
    return QRL_OK;
}

void qrl_kafka_producer_destroy(qrl_kafka_producer_t *p) {
    if (!p) return;
    p->on_delivery = NULL; /* purged messages are reported to nobody */
    rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_destroy(p->rk);
    free(p);
}

/* ---- consumer -------------------------------------------------------------------------- */

struct qrl_kafka_consumer {
    rd_kafka_t *rk;
    char bootstrap[256];
    char group[256];
};

qrl_status qrl_kafka_consumer_new(const qrl_kafka_consumer_opts *opts, const char *const *topics,
                                  size_t n_topics, qrl_kafka_consumer_t **out, qrl_error *err) {
    *out = NULL;
    if (!opts || !opts->bootstrap || !*opts->bootstrap)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka consumer: bootstrap is empty");
    if (!opts->group_id || !*opts->group_id)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka consumer: group_id is empty");
    if (n_topics == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "kafka consumer in group %s: no topics to subscribe to", opts->group_id);

    qrl_kafka_consumer_t *c = calloc(1, sizeof *c);
    if (!c) return qrl_error_set(err, QRL_STATUS_NOMEM, "kafka consumer: out of memory");
    snprintf(c->bootstrap, sizeof c->bootstrap, "%s", opts->bootstrap);
    snprintf(c->group, sizeof c->group, "%s", opts->group_id);

    qrl_status st = QRL_OK;
    char num[32], why[512];
    rd_kafka_topic_partition_list_t *subs = NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    QRL_TRY_GOTO(conf_base(conf, opts->bootstrap, opts->client_id, err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "group.id", opts->group_id, err), fail);
    /* offsets move only when the data is safely used (SPEC 8) */
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "enable.auto.commit", "false", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "enable.auto.offset.store", "false", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "auto.offset.reset", "earliest", err), fail);
    snprintf(num, sizeof num, "%d", opts->session_timeout_ms ? opts->session_timeout_ms : 10000);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "session.timeout.ms", num, err), fail);
    snprintf(num, sizeof num, "%d", opts->max_poll_interval_ms ? opts->max_poll_interval_ms : 300000);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "max.poll.interval.ms", num, err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_extra_(conf, opts->extra, err), fail);

    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof why);
    if (!c->rk) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka consumer for %s group %s: %s",
                           opts->bootstrap, opts->group_id, why);
        goto fail;
    }
    conf = NULL; /* owned by the handle now */
    rd_kafka_poll_set_consumer(c->rk); /* errors and logs served by consumer_poll */

    subs = rd_kafka_topic_partition_list_new((int)n_topics);
    for (size_t i = 0; i < n_topics; i++)
        rd_kafka_topic_partition_list_add(subs, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, subs);
    if (e) {
        st = qrl_error_set(err, qrl_kafka_status_from_code(e), "subscribing group %s on %s to %s%s: %s",
                           opts->group_id, opts->bootstrap, topics[0], n_topics > 1 ? ",..." : "",
                           rd_kafka_err2str(e));
        goto fail;
    }
    rd_kafka_topic_partition_list_destroy(subs);
    *out = c;
    return QRL_OK;
fail:
    if (subs) rd_kafka_topic_partition_list_destroy(subs);
    if (conf) rd_kafka_conf_destroy(conf);
    if (c->rk) rd_kafka_destroy(c->rk);
    free(c);
    return st;
}

qrl_status qrl_kafka_consumer_poll(qrl_kafka_consumer_t *c, int timeout_ms, qrl_kafka_message *msg,
                                   bool *got, qrl_error *err) {
    memset(msg, 0, sizeof *msg);
    *got = false;
    rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, timeout_ms);
    if (!m) return QRL_OK;
    if (m->err) {
        qrl_status st = qrl_kafka_status_from_code(m->err);
        qrl_error_set(err, st, "consumer group %s on %s: topic %s [%d] offset %lld: %s (%s)", c->group,
                      c->bootstrap, m->rkt ? rd_kafka_topic_name(m->rkt) : "-", (int)m->partition,
                      (long long)m->offset, rd_kafka_message_errstr(m), rd_kafka_err2name(m->err));
        rd_kafka_message_destroy(m);
        return st;
    }
    rd_kafka_timestamp_type_t tstype;
    msg->topic = rd_kafka_topic_name(m->rkt);
    msg->partition = m->partition;
    msg->offset = m->offset;
    msg->key = m->key;
    msg->key_len = m->key_len;
    msg->payload = m->payload;
    msg->len = m->len;
    msg->timestamp_ms = rd_kafka_message_timestamp(m, &tstype);
    msg->impl_ = m;
    *got = true;
    return QRL_OK;
}

void qrl_kafka_message_release(qrl_kafka_message *msg) {
    if (!msg) return;
    if (msg->impl_) rd_kafka_message_destroy(msg->impl_);
    memset(msg, 0, sizeof *msg);
}

qrl_status qrl_kafka_consumer_commit_offset(qrl_kafka_consumer_t *c, const char *topic,
                                            int32_t partition, int64_t next_offset, qrl_error *err) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition)->offset = next_offset;
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, l, 0 /* synchronous */);
    if (!e) e = l->elems[0].err;
    rd_kafka_topic_partition_list_destroy(l);
    if (e)
        return qrl_error_set(err, qrl_kafka_status_from_code(e),
                             "commit of topic %s [%d] offset %lld for group %s on %s: %s (%s)", topic,
                             (int)partition, (long long)next_offset, c->group, c->bootstrap,
                             rd_kafka_err2str(e), rd_kafka_err2name(e));
    return QRL_OK;
}

qrl_status qrl_kafka_consumer_commit_offset_async(qrl_kafka_consumer_t *c, const char *topic,
                                                  int32_t partition, int64_t next_offset,
                                                  qrl_error *err) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition)->offset = next_offset;
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, l, 1 /* asynchronous */);
    rd_kafka_topic_partition_list_destroy(l);
    if (e)
        return qrl_error_set(err, qrl_kafka_status_from_code(e),
                             "async commit of topic %s [%d] offset %lld for group %s on %s: %s",
                             topic, (int)partition, (long long)next_offset, c->group, c->bootstrap,
                             rd_kafka_err2str(e));
    return QRL_OK;
}

qrl_status qrl_kafka_consumer_commit(qrl_kafka_consumer_t *c, const qrl_kafka_message *msg,
                                     qrl_error *err) {
    return qrl_kafka_consumer_commit_offset(c, msg->topic, msg->partition, msg->offset + 1, err);
}

qrl_status qrl_kafka_consumer_committed(qrl_kafka_consumer_t *c, const char *topic, int32_t partition,
                                        int timeout_ms, int64_t *next_offset, qrl_error *err) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition);
    rd_kafka_resp_err_t e = rd_kafka_committed(c->rk, l, timeout_ms);
    if (!e) e = l->elems[0].err;
    int64_t off = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    if (e)
        return qrl_error_set(err, qrl_kafka_status_from_code(e),
                             "committed offset of topic %s [%d] for group %s on %s: %s", topic,
                             (int)partition, c->group, c->bootstrap, rd_kafka_err2str(e));
    *next_offset = off < 0 ? -1 : off; /* RD_KAFKA_OFFSET_INVALID when none */
    return QRL_OK;
}

int qrl_kafka_consumer_assigned(qrl_kafka_consumer_t *c) {
    rd_kafka_topic_partition_list_t *l = NULL;
    if (rd_kafka_assignment(c->rk, &l) != RD_KAFKA_RESP_ERR_NO_ERROR || !l) return 0;
    int n = l->cnt;
    rd_kafka_topic_partition_list_destroy(l);
    return n;
}

void qrl_kafka_consumer_close(qrl_kafka_consumer_t *c) {
    if (!c) return;
    rd_kafka_resp_err_t e = rd_kafka_consumer_close(c->rk);
    if (e)
        QRL_LOG_WARN("kafka", "leaving group failed group=%s bootstrap=%s err=%s", c->group,
                     c->bootstrap, rd_kafka_err2name(e));
    rd_kafka_destroy(c->rk);
    free(c);
}

/* ---- dead letters ---------------------------------------------------------------------- */

static char *base64(const unsigned char *in, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = tab[(v >> 6) & 63];
        *o++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

/* A json string of base64(data), or json null for NULL data; NULL on allocation failure. */
static json_t *b64_or_null(const void *data, size_t n) {
    if (!data) return json_null();
    char *s = base64(data, n);
    if (!s) return NULL;
    json_t *j = json_string(s);
    free(s);
    return j;
}

/* Error texts often quote the bad input: keep them even when they are not UTF-8. */
static json_t *string_lossy(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    char *c = strdup(s);
    if (!c) return NULL;
    for (char *q = c; *q; q++)
        if ((unsigned char)*q >= 0x80) *q = '?';
    j = json_string(c);
    free(c);
    return j;
}

qrl_status qrl_kafka_dlq_encode(const char *source_topic, int32_t partition, int64_t offset,
                                const void *key, size_t key_len, const void *payload, size_t len,
                                const char *error, char **out, size_t *out_len, qrl_error *err) {
    *out = NULL;
    if (!source_topic || !error)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "dead letter: source_topic and error are required");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    bool omit = payload && len > QRL_KAFKA_DLQ_MAX_PAYLOAD;
    json_t *root = json_object();
    /* json_object_set_new takes (and on failure drops) each value: one check at the end */
    int bad = !root;
    if (root) {
        bad |= json_object_set_new(root, "version", json_integer(QRL_KAFKA_DLQ_VERSION));
        bad |= json_object_set_new(root, "source_topic", string_lossy(source_topic));
        bad |= json_object_set_new(root, "partition", json_integer(partition));
        bad |= json_object_set_new(root, "offset", json_integer(offset));
        bad |= json_object_set_new(root, "error", string_lossy(error));
        bad |= json_object_set_new(root, "key_b64", b64_or_null(key, key_len));
        bad |= json_object_set_new(root, "payload_bytes", json_integer((json_int_t)len));
        bad |= json_object_set_new(root, "payload_b64",
                                   omit ? json_null() : b64_or_null(payload, len));
        bad |= json_object_set_new(root, "payload_omitted", json_boolean(omit));
        bad |= json_object_set_new(root, "time_ms",
                                   json_integer((json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000));
    }
    if (!bad) *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!*out)
        return qrl_error_set(err, QRL_STATUS_NOMEM,
                             "dead letter for topic %s [%d] offset %lld: out of memory",
                             source_topic, (int)partition, (long long)offset);
    if (out_len) *out_len = strlen(*out);
    return QRL_OK;
}

qrl_status qrl_kafka_dlq_send(qrl_kafka_producer_t *p, const char *dlq_topic,
                              const qrl_kafka_message *src, const char *error, qrl_error *err) {
    char *json = NULL;
    size_t n = 0;
    QRL_TRY(qrl_kafka_dlq_encode(src->topic, src->partition, src->offset, src->key, src->key_len,
                                 src->payload, src->len, error, &json, &n, err));
    const char *topic = dlq_topic ? dlq_topic : QRL_KAFKA_TOPIC_DLQ;
    qrl_status st = qrl_kafka_producer_send(p, topic, NULL, 0, json, n, NULL, err);
    free(json);
    if (st == QRL_OK)
        QRL_LOG_WARN("kafka", "dead-lettered topic=%s partition=%d offset=%lld dlq=%s error=\"%s\"",
                     src->topic, (int)src->partition, (long long)src->offset, topic, error);
    return st;
}
