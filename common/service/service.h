/* The daemon shell (STYLE 14; the redis `ae` + libuv handle idea): what qrl-rollout and
 * qrl-learner have in common, written once.  A service owns
 *   - one libuv loop, its tick timer (period poll_ms), SIGTERM/SIGINT and the close chain;
 *   - the gRPC control server: bearer token, TLS, and the Status/Pause/Resume/Set handlers
 *     every daemon has (the daemon adds its own methods with qrl_service_handle);
 *   - a Kafka consumer of one topic (plus optional extra topics, e.g. the learner's
 *     qrl.trace) with commit-after-use offsets (kafka/offsets.h): a record's offset is
 *     committed only once the daemon says it is used up, and only up to the first record
 *     of its (topic, partition) still in use;
 *   - an idempotent producer with resend: a set of records is sent again (all of it) until
 *     the broker has acknowledged every record of it, then the daemon is told once;
 *   - the dead-letter path (kafka/kafka.h's JSON record, unkeyed, on dlq_topic);
 *   - the metrics outputs: metrics.jsonl (a FILE the daemon writes lines to) and the
 *     Prometheus endpoint (a registry the daemon registers its series on).
 * A daemon plugs in through qrl_service_callbacks and the calls below.  Everything runs on
 * the loop thread: callbacks are called there and every qrl_service_* call is made there
 * (qrl_service_new .. qrl_service_start also before the loop runs).  Nothing here blocks
 * except qrl_service_leave, which runs after the loop has ended.
 *
 * Life of a daemon:
 *   qrl_service_new -> [qrl_service_loop: own handles] -> [qrl_service_handle: own RPCs]
 *   -> [qrl_service_prom: own series] -> qrl_service_start -> qrl_service_run (returns
 *   once qrl_service_close's chain is done) -> [join own threads] -> qrl_service_leave ->
 *   qrl_service_destroy. */
#ifndef QRL_SERVICE_SERVICE_H
#define QRL_SERVICE_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "core/config.h"
#include "core/status.h"
#include "kafka/kafka.h"
#include "kafka/offsets.h"
#include "metrics/prom.h"
#include "qrl.pb-c.h"
#include "rpc/rpc.h"

typedef struct qrl_service qrl_service_t; /* opaque; one per daemon process */

/* How a daemon plugs in.  `user` (qrl_service_new) is passed to each.  Required: record,
 * state, pause, stop, status.  Optional (NULL): the others. */
typedef struct qrl_service_callbacks {
    /* One consumed record (of opts->topic or one of opts->extra_topics: msg->topic says
     * which).  `msg` is valid only during the call; `rec` is the record's
     * entry in the commit tracker: pass it to qrl_service_record_done exactly once, now or
     * later, when the record is used up (its result acknowledged, trained, dead-lettered,
     * skipped). */
    void (*record)(void *user, const qrl_kafka_message *msg, qrl_kafka_offset *rec);
    /* Asked before each poll of the consumer (up to 64 per tick): whether one more record
     * may be taken now.  NULL: always.  A full daemon leaves records in Kafka. */
    bool (*may_consume)(void *user);
    /* Every record of a set given to qrl_service_produce / _dead_letter is acknowledged by
     * the broker (acks=all); `tag` is the one given there.  Called once per set. */
    void (*acknowledged)(void *user, void *tag);
    /* A set given to qrl_service_produce / _dead_letter failed (again): `st`/`why` are the
     * last failure (not qrl_status_retriable: the broker refuses it and will go on refusing,
     * e.g. OUT_OF_RANGE for a record over the topic's max.message.bytes, NOT_FOUND for a
     * topic that does not exist, INVALID_ARGUMENT for an invalid topic name), `fails` how
     * many attempts of the set failed, `failing_ms` since the first.  Return true to give the
     * set up: it is forgotten (owned payloads freed, `acknowledged` never runs for it);
     * false to send it again after a backoff (50 ms doubling to 2 s).  Called from the tick,
     * never from inside qrl_service_produce; it may produce.  NULL: always again. */
    bool (*undeliverable)(void *user, void *tag, const char *topic, qrl_status st, const char *why, int fails,
                          uint64_t failing_ms);
    /* Once per tick, after the producer was polled, sets waiting were sent again and the
     * consumer was polled. */
    void (*tick)(void *user);
    /* The daemon's state (ControlResponse.state of Pause/Resume/qrl_service_reply_control). */
    Qrl__ServiceState (*state)(void *user);
    /* Pause (pause true) or Resume RPC with the request's reason (never NULL): act, and
     * return the ControlResponse message (static or owned by the daemon, read at once). */
    const char *(*pause)(void *user, bool pause, const char *reason);
    /* SIGTERM/SIGINT (`sig`): begin an orderly stop.  Return false when a stop was under
     * way already and this signal should end the process now (as a second signal does). */
    bool (*stop)(void *user, int sig);
    /* The Status RPC: build the daemon's own status message and qrl_rpc_call_reply it. */
    void (*status)(void *user, qrl_rpc_call_t *call);
    /* The RPC server has closed (qrl_service_close): close the daemon's own loop handles so
     * that qrl_service_run returns. */
    void (*closed)(void *user);
    /* NULL: committable offsets are committed to Kafka at once (asynchronously).  Else the
     * shell hands them here instead (e.g. the learner commits them with its checkpoint
     * through qrl_service_commit): `upto` is the next offset to read of `partition`.
     * Only records of opts->topic come here: extra topics are committed at once. */
    void (*committable)(void *user, int32_t partition, int64_t upto);
} qrl_service_callbacks;

typedef struct qrl_service_opts {
    const char *tag;              /* log subsystem tag, e.g. "rollout" */
    const char *client_id;        /* Kafka client id of producer and consumer */
    /* Kafka */
    const char *bootstrap;        /* kafka.bootstrap */
    const char *group;            /* kafka.group: consumer group */
    const char *topic;            /* the topic consumed (also the dead letters' source topic) */
    /* more topics consumed by the same consumer (NULL/0: none; at most 7), borrowed */
    const char *const *extra_topics;
    size_t n_extra_topics;
    const char *dlq_topic;        /* kafka.dlq_topic */
    int session_timeout_ms;       /* kafka.session_timeout_ms */
    int poll_ms;                  /* kafka.poll_ms: tick period */
    /* control server: addr, TLS, token_for_reads as the daemon's config says (token and
     * allow_no_token are set by the shell from token_file) */
    qrl_rpc_server_opts rpc;
    const char *token_file;       /* rpc.token_file; "" or NULL: $QRL_RPC_TOKEN_FILE / $QRL_RPC_TOKEN */
    const char *no_token_note;    /* warned when no token is found, e.g. "mutating calls are refused" */
    qrl_rpc_id rpc_status, rpc_pause, rpc_resume, rpc_set; /* the service's method ids */
    qrl_config_t *cfg;            /* what the Set RPC changes (qrl_rpc_call_config_set) */
    /* metrics outputs */
    const char *metrics_jsonl;    /* metrics.jsonl: opened for appending; "" or NULL: off */
    const char *metrics_listen;   /* metrics.listen: Prometheus host:port; "" or NULL: off */
    /* the rest of the "second signal N" line before _exit(1); NULL: ": exiting now" */
    const char *second_signal_note;
} qrl_service_opts;

/* A new service: the loop is initialised, nothing is connected yet.  opts' strings are
 * borrowed and must outlive the service (they are the daemon's config).  Errors: NOMEM;
 * with metrics_listen set, those of qrl_prom_registry_new.  *out is owned by the caller:
 * qrl_service_destroy. */
qrl_status qrl_service_new(const qrl_service_opts *opts, const qrl_service_callbacks *cb, void *user,
                           qrl_service_t **out, qrl_error *err);

/* The service's loop, for the daemon's own handles (timers, async handles); valid until
 * qrl_service_destroy.  The daemon closes them in its `closed` callback. */
uv_loop_t *qrl_service_loop(qrl_service_t *s);

/* Route RPC method `id` of the daemon's own to `fn` (with `user`).  Before
 * qrl_service_start only (at most 32). */
void qrl_service_handle(qrl_service_t *s, qrl_rpc_id id, qrl_rpc_handler_fn fn, void *user);

/* The Prometheus registry served at metrics_listen, for the daemon's series (register
 * before qrl_service_start; update from any thread), or NULL when metrics_listen is off.
 * Owned by the service. */
qrl_prom_registry_t *qrl_service_prom(qrl_service_t *s);

/* Connect: producer, consumer (subscribed to opts->topic and opts->extra_topics), the control server (token,
 * TLS, the four shared handlers plus the daemon's; logs "rpc listening port=N"),
 * metrics.jsonl, the Prometheus server (logs "metrics listening addr=..."); then start
 * the tick and the signal handlers.  Errors: those of qrl_kafka_producer_new /
 * _consumer_new, qrl_rpc_token_resolve, qrl_rpc_server_new / _start, IO ("metrics.jsonl:
 * cannot open PATH"), qrl_prom_server_start's prefixed with "metrics.listen: ".  After an
 * error the service is half made: the caller exits (_exit, nothing is in flight yet). */
qrl_status qrl_service_start(qrl_service_t *s, qrl_error *err);

/* The control server's bound port (after start). */
int qrl_service_rpc_port(const qrl_service_t *s);
/* The resolved bearer token (NUL-terminated, owned by the service), or NULL without one. */
const char *qrl_service_token(const qrl_service_t *s);
/* The open metrics.jsonl file (append one line per event and fflush), or NULL when off.
 * Owned by the service (closed by qrl_service_destroy). */
FILE *qrl_service_metrics_jsonl(qrl_service_t *s);

/* Run the loop until qrl_service_close's chain has closed every handle (the daemon's
 * included).  Returns when the loop has nothing left. */
void qrl_service_run(qrl_service_t *s);

/* Begin the close chain (idempotent): stop the tick and the consumer polls, close the
 * control server (held calls are cancelled), then the shell's handles, then `closed`. */
void qrl_service_close(qrl_service_t *s);
/* Whether qrl_service_close was called. */
bool qrl_service_closing(const qrl_service_t *s);

/* Produce a set of n records (n >= 1) on `topic` (borrowed; e.g. the daemon's config
 * string), all keyed by key[key_len] (copied; NULL/0: unkeyed).  The payloads are
 * borrowed until `acknowledged(tag)` runs, or owned by the service when `owned` (then
 * free()d after the acknowledgement or at destroy).  Never fails: what cannot be queued
 * now (a full local queue, a failed delivery) is sent again from the tick, the whole set
 * after a failed delivery ("delivery to T failed: ...", at most one such line a second),
 * with a backoff, unless the `undeliverable` callback gives it up. */
void qrl_service_produce(qrl_service_t *s, const char *topic, const void *key, size_t key_len,
                         uint8_t *const *payloads, const size_t *lens, size_t n, bool owned, void *tag);

/* Produce the dead-letter record (qrl_kafka_dlq_encode: source opts->topic, `partition`,
 * `offset`, key and payload copied in, reason `why`) on opts->dlq_topic, unkeyed, and log
 * "dead letter partition=P offset=O: why".  `acknowledged(tag)` runs once it is
 * acknowledged.  The caller still calls qrl_service_record_done for the source record
 * (typically from that acknowledgement). */
void qrl_service_dead_letter(qrl_service_t *s, int32_t partition, int64_t offset, const void *key,
                             size_t key_len, const void *payload, size_t len, const char *why, void *tag);

/* qrl_service_dead_letter for a record of `source_topic` (one of opts->extra_topics, or
 * opts->topic): the dead-letter record names it as its source. */
void qrl_service_dead_letter_from(qrl_service_t *s, const char *source_topic, int32_t partition, int64_t offset,
                                  const void *key, size_t key_len, const void *payload, size_t len,
                                  const char *why, void *tag);

/* The consumed record `rec` (from the record callback) is used up: commit its partition up
 * to the first record still in use (or hand that to `committable`).  `rec` is gone after
 * this.  A failed commit is logged; the records are then delivered again later. */
void qrl_service_record_done(qrl_service_t *s, qrl_kafka_offset *rec);

/* Commit next offset `upto` of `partition` of opts->topic now (asynchronously): for a
 * daemon with `committable`.  Errors: those of qrl_kafka_consumer_commit_offset_async. */
qrl_status qrl_service_commit(qrl_service_t *s, int32_t partition, int64_t upto, qrl_error *err);

/* The consumer, for calls the shell does not wrap (e.g. qrl_kafka_consumer_committed at a
 * learner's resume).  Owned by the service; NULL before start. */
qrl_kafka_consumer_t *qrl_service_consumer(qrl_service_t *s);

/* Sets produced and not yet acknowledged (queued, in flight, or waiting to be sent again). */
size_t qrl_service_unacked(const qrl_service_t *s);

/* Reply to a unary control call with a ControlResponse {state: the `state` callback's,
 * message: msg} (for the daemon's own Drain/Shutdown-like handlers). */
void qrl_service_reply_control(qrl_service_t *s, qrl_rpc_call_t *call, const char *msg);

/* After qrl_service_run returned and the daemon's threads are joined: leave the consumer
 * group (uncommitted records move to the other members), then wait up to timeout_ms for
 * every queued record to be delivered.  Errors (the caller reports them and exits 1):
 * TIMEOUT (records still queued), NETWORK (a delivery failed during this wait; failures
 * before it were the tick's to resend or give up). */
qrl_status qrl_service_leave(qrl_service_t *s, int timeout_ms, qrl_error *err);

/* Free everything the service owns (the loop is closed; owned payloads still unsent are
 * freed; metrics.jsonl closed; the Prometheus server stopped).  NULL is a no-op. */
void qrl_service_destroy(qrl_service_t *s);

#endif
