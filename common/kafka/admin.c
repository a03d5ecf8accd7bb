/* Admin calls for the deploy scripts and daemons: wait for a broker, create and
 * describe topics.  Each call makes its own short-lived librdkafka handle. */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "kafka/internal.h"
#include "kafka/kafka.h"

/* A handle for admin requests.  Reconnects fast (a broker that is still starting
 * refuses the first connections) and logs those refusals at DEBUG only. */
static qrl_status admin_new(const char *bootstrap, rd_kafka_t **out, qrl_error *err) {
    *out = NULL;
    if (!bootstrap || !*bootstrap)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka admin: bootstrap is empty");
    char why[512];
    qrl_status st = QRL_OK;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "bootstrap.servers", bootstrap, err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "client.id", "qrl-admin", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "reconnect.backoff.ms", "50", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "reconnect.backoff.max.ms", "250", err), fail);
    QRL_TRY_GOTO(qrl_kafka_conf_set_(conf, "log.connection.close", "false", err), fail);
    rd_kafka_conf_set_log_cb(conf, qrl_kafka_log_quiet_cb_);
    *out = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
    if (!*out) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka admin for %s: %s", bootstrap, why);
        goto fail;
    }
    return QRL_OK;
fail:
    rd_kafka_conf_destroy(conf);
    return st;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int remaining_ms(int64_t deadline) {
    int64_t left = deadline - qrl_kafka_now_ms_();
    return left > 0 ? (int)left : 0;
}

static qrl_status wait_on(rd_kafka_t *rk, const char *bootstrap, int timeout_ms, int *n_brokers,
                          qrl_error *err) {
    int64_t deadline = qrl_kafka_now_ms_() + timeout_ms;
    rd_kafka_resp_err_t last = RD_KAFKA_RESP_ERR__TIMED_OUT;
    for (;;) {
        const struct rd_kafka_metadata *md = NULL;
        int left = remaining_ms(deadline);
        int slice = left < 1000 ? (left > 0 ? left : 1) : 1000;
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, NULL, &md, slice);
        if (!e) {
            int n = md->broker_cnt;
            rd_kafka_metadata_destroy(md);
            if (n > 0) {
                if (n_brokers) *n_brokers = n;
                return QRL_OK;
            }
            last = RD_KAFKA_RESP_ERR__TRANSPORT;
        } else {
            last = e;
        }
        if (remaining_ms(deadline) == 0) break;
        sleep_ms(50);
    }
    return qrl_error_set(err, QRL_STATUS_TIMEOUT,
                         "no Kafka broker answered at %s within %d ms (last attempt: %s)", bootstrap,
                         timeout_ms, rd_kafka_err2str(last));
}

qrl_status qrl_kafka_wait_ready(const char *bootstrap, int timeout_ms, int *n_brokers, qrl_error *err) {
    rd_kafka_t *rk;
    QRL_TRY(admin_new(bootstrap, &rk, err));
    qrl_status st = wait_on(rk, bootstrap, timeout_ms, n_brokers, err);
    rd_kafka_destroy(rk);
    return st;
}

/* Partition count of `topic` and whether all of them have a leader; *n = -1 when the
 * cluster does not know the topic. */
static qrl_status topic_state(rd_kafka_t *rk, const char *bootstrap, const char *topic, int timeout_ms,
                              int *n, bool *all_led, qrl_error *err) {
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    if (!rkt)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka topic name '%s': %s", topic,
                             rd_kafka_err2str(rd_kafka_last_error()));
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms > 0 ? timeout_ms : 1);
    rd_kafka_topic_destroy(rkt);
    if (e)
        return qrl_error_set(err, qrl_kafka_status_from_code(e), "metadata of topic %s from %s: %s",
                             topic, bootstrap, rd_kafka_err2str(e));
    *n = -1;
    *all_led = false;
    for (int i = 0; i < md->topic_cnt; i++) {
        const struct rd_kafka_metadata_topic *t = &md->topics[i];
        if (strcmp(t->topic, topic) != 0) continue;
        if (t->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) break;
        *n = t->partition_cnt;
        *all_led = t->err == RD_KAFKA_RESP_ERR_NO_ERROR && t->partition_cnt > 0;
        for (int p = 0; p < t->partition_cnt; p++)
            if (t->partitions[p].err || t->partitions[p].leader < 0) *all_led = false;
    }
    rd_kafka_metadata_destroy(md);
    return QRL_OK;
}

static qrl_status create_on(rd_kafka_t *rk, const char *bootstrap, const char *const *topics,
                            size_t n_topics, const qrl_kafka_topic_spec *spec, int64_t deadline,
                            qrl_error *err) {
    qrl_status st = QRL_OK;
    char why[512], maxb[32];
    snprintf(maxb, sizeof maxb, "%lld",
             (long long)(spec->max_message_bytes ? spec->max_message_bytes : QRL_KAFKA_MAX_MESSAGE_BYTES));
    rd_kafka_NewTopic_t **nt = calloc(n_topics, sizeof *nt);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_event_t *ev = NULL;
    if (!nt) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "creating topics: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_topics; i++) {
        nt[i] = rd_kafka_NewTopic_new(topics[i], spec->partitions, spec->replication_factor, why,
                                      sizeof why);
        if (!nt[i]) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "topic %s: %s", topics[i], why);
            goto done;
        }
        rd_kafka_resp_err_t e = rd_kafka_NewTopic_set_config(nt[i], "max.message.bytes", maxb);
        if (e) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "topic %s max.message.bytes=%s: %s",
                               topics[i], maxb, rd_kafka_err2str(e));
            goto done;
        }
    }
    int left = remaining_ms(deadline);
    rd_kafka_AdminOptions_set_request_timeout(ao, left > 0 ? left : 1, why, sizeof why);
    rd_kafka_AdminOptions_set_operation_timeout(ao, left > 0 ? left : 1, why, sizeof why);
    rd_kafka_CreateTopics(rk, nt, n_topics, ao, q);
    ev = rd_kafka_queue_poll(q, left + 1000);
    if (!ev) {
        st = qrl_error_set(err, QRL_STATUS_TIMEOUT, "creating topics on %s: no answer", bootstrap);
        goto done;
    }
    if (rd_kafka_event_error(ev)) {
        rd_kafka_resp_err_t e = rd_kafka_event_error(ev);
        st = qrl_error_set(err, qrl_kafka_status_from_code(e), "creating topics on %s: %s", bootstrap,
                           rd_kafka_event_error_string(ev));
        goto done;
    }
    size_t n_res = 0;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n_res);
    for (size_t i = 0; i < n_res; i++) {
        const char *name = rd_kafka_topic_result_name(res[i]);
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(res[i]);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
            QRL_LOG_INFO("kafka", "created topic topic=%s partitions=%d replication=%d "
                         "max.message.bytes=%s bootstrap=%s", name, spec->partitions,
                         spec->replication_factor, maxb, bootstrap);
            continue;
        }
        if (e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
            int n = 0;
            bool led = false;
            QRL_TRY_GOTO(topic_state(rk, bootstrap, name, remaining_ms(deadline), &n, &led, err), done);
            if (n >= 0 && n < spec->partitions) {
                st = qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                   "topic %s on %s exists with %d partitions, fewer than the %d asked "
                                   "for (add partitions or use a fresh topic)",
                                   name, bootstrap, n, spec->partitions);
                goto done;
            }
            QRL_LOG_INFO("kafka", "topic exists topic=%s partitions=%d bootstrap=%s", name, n, bootstrap);
            continue;
        }
        const char *msg = rd_kafka_topic_result_error_string(res[i]);
        st = qrl_error_set(err, qrl_kafka_status_from_code(e),
                           "creating topic %s (%d partitions, replication %d) on %s: %s (%s)", name,
                           spec->partitions, spec->replication_factor, bootstrap,
                           msg ? msg : rd_kafka_err2str(e), rd_kafka_err2name(e));
        goto done;
    }
done:
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(ao);
    rd_kafka_queue_destroy(q);
    if (nt) {
        for (size_t i = 0; i < n_topics; i++)
            if (nt[i]) rd_kafka_NewTopic_destroy(nt[i]);
        free(nt);
    }
    return st;
}

qrl_status qrl_kafka_topics_create(const char *bootstrap, const char *const *topics, size_t n_topics,
                                   const qrl_kafka_topic_spec *spec, int timeout_ms, qrl_error *err) {
    if (n_topics == 0) return QRL_OK;
    if (spec->partitions < 1 || spec->replication_factor < 1 || spec->max_message_bytes < 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "topic spec: partitions %d and replication %d must be >= 1, "
                             "max_message_bytes %lld >= 0",
                             spec->partitions, spec->replication_factor,
                             (long long)spec->max_message_bytes);
    rd_kafka_t *rk;
    QRL_TRY(admin_new(bootstrap, &rk, err));
    int64_t deadline = qrl_kafka_now_ms_() + timeout_ms;
    qrl_status st = QRL_OK;
    QRL_TRY_GOTO(wait_on(rk, bootstrap, timeout_ms, NULL, err), done);
    QRL_TRY_GOTO(create_on(rk, bootstrap, topics, n_topics, spec, deadline, err), done);
    /* Creation returns when the controller has the topic; producers want leaders. */
    for (size_t i = 0; i < n_topics; i++) {
        for (;;) {
            int n = 0;
            bool led = false;
            QRL_TRY_GOTO(topic_state(rk, bootstrap, topics[i], remaining_ms(deadline), &n, &led, err),
                         done);
            if (led) break;
            if (remaining_ms(deadline) == 0) {
                st = qrl_error_set(err, QRL_STATUS_TIMEOUT,
                                   "topic %s on %s: partitions still without a leader after %d ms",
                                   topics[i], bootstrap, timeout_ms);
                goto done;
            }
            sleep_ms(50);
        }
    }
done:
    rd_kafka_destroy(rk);
    return st;
}

static qrl_status describe_config(rd_kafka_t *rk, const char *bootstrap, const char *topic,
                                  int timeout_ms, int64_t *max_message_bytes, qrl_error *err) {
    qrl_status st = QRL_OK;
    char why[256];
    rd_kafka_ConfigResource_t *cr = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
    rd_kafka_AdminOptions_set_request_timeout(ao, timeout_ms > 0 ? timeout_ms : 1, why, sizeof why);
    rd_kafka_DescribeConfigs(rk, &cr, 1, ao, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, timeout_ms + 1000);
    *max_message_bytes = -1;
    if (!ev || rd_kafka_event_error(ev)) {
        rd_kafka_resp_err_t e = ev ? rd_kafka_event_error(ev) : RD_KAFKA_RESP_ERR__TIMED_OUT;
        st = qrl_error_set(err, qrl_kafka_status_from_code(e), "configs of topic %s from %s: %s", topic,
                           bootstrap, ev ? rd_kafka_event_error_string(ev) : "no answer");
        goto done;
    }
    size_t n_res = 0;
    const rd_kafka_ConfigResource_t **res =
        rd_kafka_DescribeConfigs_result_resources(rd_kafka_event_DescribeConfigs_result(ev), &n_res);
    for (size_t i = 0; i < n_res; i++) {
        rd_kafka_resp_err_t e = rd_kafka_ConfigResource_error(res[i]);
        if (e) {
            st = qrl_error_set(err, qrl_kafka_status_from_code(e), "configs of topic %s from %s: %s",
                               topic, bootstrap, rd_kafka_ConfigResource_error_string(res[i]));
            goto done;
        }
        size_t n_cfg = 0;
        const rd_kafka_ConfigEntry_t **cfg = rd_kafka_ConfigResource_configs(res[i], &n_cfg);
        for (size_t k = 0; k < n_cfg; k++)
            if (strcmp(rd_kafka_ConfigEntry_name(cfg[k]), "max.message.bytes") == 0 &&
                rd_kafka_ConfigEntry_value(cfg[k]))
                *max_message_bytes = strtoll(rd_kafka_ConfigEntry_value(cfg[k]), NULL, 10);
    }
done:
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(ao);
    rd_kafka_queue_destroy(q);
    rd_kafka_ConfigResource_destroy(cr);
    return st;
}

qrl_status qrl_kafka_topic_describe(const char *bootstrap, const char *topic, int timeout_ms,
                                    int *partitions, int64_t *max_message_bytes, qrl_error *err) {
    rd_kafka_t *rk;
    QRL_TRY(admin_new(bootstrap, &rk, err));
    qrl_status st = QRL_OK;
    int n = -1;
    bool led = false;
    QRL_TRY_GOTO(wait_on(rk, bootstrap, timeout_ms, NULL, err), done);
    QRL_TRY_GOTO(topic_state(rk, bootstrap, topic, timeout_ms, &n, &led, err), done);
    if (n < 0) {
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "topic %s does not exist on %s", topic, bootstrap);
        goto done;
    }
    *partitions = n;
    QRL_TRY_GOTO(describe_config(rk, bootstrap, topic, timeout_ms, max_message_bytes, err), done);
done:
    rd_kafka_destroy(rk);
    return st;
}

qrl_status qrl_kafka_topic_name_check(const char *key, const char *topic, qrl_error *err) {
    size_t n = topic ? strlen(topic) : 0;
    if (n == 0) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: the topic name is empty", key);
    if (n > 249 || strcmp(topic, ".") == 0 || strcmp(topic, "..") == 0 ||
        strspn(topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: '%.64s' is not a Kafka topic name (1-249 characters of A-Z a-z 0-9 . _ -)", key,
                             topic);
    return QRL_OK;
}

qrl_status qrl_kafka_topics_check(const char *bootstrap, const char *const *keys, const char *const *topics,
                                  size_t n, int timeout_ms, int64_t *max_bytes, qrl_error *err) {
    for (size_t i = 0; i < n; i++) QRL_TRY(qrl_kafka_topic_name_check(keys[i], topics[i], err));
    rd_kafka_t *rk;
    QRL_TRY(admin_new(bootstrap, &rk, err));
    int64_t deadline = qrl_kafka_now_ms_() + timeout_ms;
    qrl_status st = wait_on(rk, bootstrap, timeout_ms, NULL, err);
    for (size_t i = 0; st == QRL_OK && i < n; i++) {
        int parts = -1;
        bool led = false;
        st = topic_state(rk, bootstrap, topics[i], remaining_ms(deadline) + 1000, &parts, &led, err);
        if (st == QRL_OK && parts < 0)
            st = qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                               "%s: topic %s does not exist on %s (deploy/kafka/kafka.sh create-topics --topics %s)",
                               keys[i], topics[i], bootstrap, topics[i]);
        if (st == QRL_OK && max_bytes) {
            qrl_error ignored;
            if (describe_config(rk, bootstrap, topics[i], remaining_ms(deadline) + 1000, &max_bytes[i], &ignored) !=
                QRL_OK)
                max_bytes[i] = -1;
        }
    }
    rd_kafka_destroy(rk);
    return st;
}
