/* qrl-rollout: what is done with a record set the broker does not take (rollout.h
 * rd_delivery_policy; docs/rollout-daemon.md "When the broker refuses"), and the start-up
 * check of the topics it produces to.  A refusal that will not go away by retrying (a
 * record over the topic's max.message.bytes, a topic that does not exist or an invalid
 * name) must not be retried forever: the replica would spin, never commit, never drain. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "rollout.h"

/* TraceChunks are an optional companion of the result: transient failures are retried
 * this often / this long, then the records are given up and the result goes alone. */
#define RD_TRACE_MAX_FAILS 8
#define RD_TRACE_MAX_FAILING_MS 10000
/* Bounded wait for the broker's metadata at start. */
#define RD_TOPIC_CHECK_MS 5000

/* Log a give-up once per (set kind, status): a refused topic refuses every set. */
static bool first_of_cause(rd_daemon *d, int kind, qrl_status st) {
    uint64_t bit = 1ull << ((unsigned)kind * 20u + (unsigned)st % 20u);
    if (d->fail_logged & bit) return false;
    d->fail_logged |= bit;
    return true;
}

rd_delivery_act rd_delivery_policy(rd_daemon *d, rd_group *g, const char *topic, qrl_status st, const char *why,
                                   int fails, uint64_t failing_ms, char *why_out, size_t why_size) {
    bool refused = !qrl_status_retriable(st);
    size_t responses = g->result ? g->result->n_responses : 0;
    if (topic == d->trace_topic) {
        if (!refused && !d->draining && fails < RD_TRACE_MAX_FAILS && failing_ms < RD_TRACE_MAX_FAILING_MS)
            return RD_DELIVERY_RETRY;
        g->trace_failed = true;
        d->tr.failed += responses;
        if (first_of_cause(d, 0, st))
            QRL_LOG_WARN("rollout", "kafka.trace_topic %s: TraceChunks of group=%" PRIu64 " given up after %d "
                         "attempt(s) (%s: %s); its result goes without TRACE records (the learner trains such "
                         "responses unguided); trace_failed counts them; logged once per cause",
                         topic, g->group_id, fails, qrl_status_name(st), why);
        return RD_DELIVERY_SKIP;
    }
    if (topic == d->results_topic && refused && !g->to_dlq) {
        d->results_undeliverable++;
        QRL_LOG_ERROR("rollout", "kafka.results_topic %s refused the result of group=%" PRIu64 " (%s: %s): "
                      "dead-lettering its prompt on kafka.dlq_topic %s", topic, g->group_id, qrl_status_name(st),
                      why, d->dlq_topic);
        snprintf(why_out, why_size, "result undeliverable to kafka.results_topic %s: %s: %s", topic,
                 qrl_status_name(st), why);
        return RD_DELIVERY_DLQ;
    }
    if (!refused && !d->draining) return RD_DELIVERY_RETRY; /* a result or dead letter: keep trying */
    /* a dead letter refused, or anything failing during a drain: the prompt stays
     * uncommitted and comes back (to another replica, or to this one after a restart) */
    if (refused || first_of_cause(d, topic == d->dlq_topic ? 1 : 2, st))
        QRL_LOG_ERROR("rollout", "%s %s: %s of group=%" PRIu64 " partition=%d offset=%" PRId64 " not delivered "
                      "(%s: %s)%s: its prompt stays uncommitted", topic == d->dlq_topic ? "kafka.dlq_topic"
                      : "kafka.results_topic", topic, topic == d->dlq_topic ? "dead letter" : "result",
                      g->group_id, (int)g->partition, qrl_kafka_offset_value(g->off), qrl_status_name(st), why,
                      d->draining ? " while draining" : "");
    return RD_DELIVERY_ABORT;
}

qrl_status rd_check_topics(const rd_settings *s, qrl_error *err) {
    const char *keys[3] = {"kafka.results_topic", "kafka.dlq_topic", "kafka.trace_topic"};
    const char *topics[3] = {s->kafka.results_topic, s->kafka.dlq_topic, s->kafka.trace_topic};
    size_t n = s->trace ? 3 : 2;
    for (size_t i = 0; i < n; i++) QRL_TRY(qrl_kafka_topic_name_check(keys[i], topics[i], err));
    if (s->trace) {
        const char *other[3][2] = {{"kafka.results_topic", s->kafka.results_topic},
                                   {"kafka.prompts_topic", s->kafka.prompts_topic},
                                   {"kafka.dlq_topic", s->kafka.dlq_topic}};
        for (int i = 0; i < 3; i++)
            if (strcmp(s->kafka.trace_topic, other[i][1]) == 0)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "kafka.trace_topic: '%s' is also %s (TraceChunks need a topic of their own)",
                                     s->kafka.trace_topic, other[i][0]);
    }
    int64_t max_bytes[3] = {-1, -1, -1};
    qrl_status st = qrl_kafka_topics_check(s->kafka.bootstrap, keys, topics, n, RD_TOPIC_CHECK_MS, max_bytes, err);
    if (st == QRL_STATUS_NOT_FOUND || st == QRL_STATUS_INVALID_ARGUMENT) return st;
    if (st != QRL_OK) {
        QRL_LOG_WARN("rollout", "topics not checked (%s); producing anyway", err->msg);
        return QRL_OK;
    }
    if (s->trace && max_bytes[2] > 0 && max_bytes[2] < (int64_t)s->kafka.max_trace_bytes + 1024)
        QRL_LOG_WARN("rollout", "kafka.trace_topic %s: max.message.bytes %" PRId64 " is below kafka.max_trace_bytes "
                     "%d (+ overhead): larger TraceChunks will be refused and their responses go without records",
                     s->kafka.trace_topic, max_bytes[2], s->kafka.max_trace_bytes);
    return QRL_OK;
}
