/* The daemon shell (service.h): loop, tick, signals, close chain, control server, the
 * commit-after-use consumer, the producer with resend, dead letters, metrics outputs. */
#include "service/service.h"

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"

#define SVC_MAX_HANDLERS 32
#define SVC_KEY_MAX 64
#define SVC_POLL_BATCH 64 /* records taken per tick at most: the tick stays short */
#define SVC_MAX_TOPICS 8   /* opts->topic and up to 7 extra topics */
/* One offset tracker serves every topic consumed: its partition key is topic index << 24 |
 * partition (Kafka partitions stay far below 2^24; index 0 is opts->topic). */
#define SVC_TOPIC_SHIFT 24

/* One set of records given to qrl_service_produce, kept until all of it is acknowledged. */
typedef struct svc_out {
    struct svc_out *next;             /* the resend list */
    struct svc_out *aprev, *anext;    /* every live set (freed at destroy) */
    const char *topic;
    char key[SVC_KEY_MAX];
    size_t key_len;
    uint8_t **payloads;
    size_t *lens;
    size_t n;
    size_t left;                      /* records queued and not yet reported */
    bool failed;                      /* one of them failed: send the whole set again */
    bool judge;                       /* a failure the `undeliverable` callback has not seen */
    int fails;                        /* attempts that failed (BUSY not counted) */
    uint64_t first_fail_ms, retry_at_ms; /* loop clock: first failure, earliest next attempt */
    qrl_status st;                    /* the last failure */
    char why[256];
    bool owned;
    void *tag;
} svc_out;

struct qrl_service {
    uv_loop_t loop;
    uv_timer_t tick;
    uv_signal_t sigterm, sigint;
    bool started, closing;
    int signals;
    qrl_service_opts o;
    qrl_service_callbacks cb;
    void *user;
    qrl_kafka_consumer_t *consumer;
    qrl_kafka_producer_t *producer;
    qrl_kafka_offsets *offsets;       /* commit-after-use tracking of consumed records */
    const char *topics[SVC_MAX_TOPICS]; /* opts->topic, then opts->extra_topics */
    size_t n_topics;
    qrl_rpc_server_t *rpc;
    struct { qrl_rpc_id id; qrl_rpc_handler_fn fn; void *user; } handlers[SVC_MAX_HANDLERS];
    int n_handlers;
    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have_token;
    svc_out *resend;                  /* sets to send (again) from the tick */
    svc_out *all;
    size_t unacked;
    uint64_t fail_warned_ms;          /* last "delivery ... failed" line (one a second) */
    size_t fail_quiet;                /* failures not logged since */
    bool leaving;                     /* qrl_service_leave's flush: failures counted here */
    size_t leave_fails;
    char leave_why[300];
    int assigned;                     /* partitions held, as last logged */
    uint64_t assigned_checked_ms, consumer_warned_ms;
    FILE *metrics;
    qrl_prom_registry_t *prom;
    qrl_prom_server_t *prom_server;
};

/* ---- producing ------------------------------------------------------------------------ */

static void out_free(qrl_service_t *s, svc_out *o) {
    if (o->aprev) o->aprev->anext = o->anext;
    else s->all = o->anext;
    if (o->anext) o->anext->aprev = o->aprev;
    if (o->owned)
        for (size_t i = 0; i < o->n; i++) free(o->payloads[i]);
    free(o->payloads);
    free(o->lens);
    free(o);
}

/* A failed send or delivery of o: kept for the `undeliverable` callback; logged at most
 * once a second (a refused topic fails every attempt at once: no line per attempt). */
static void out_failed(qrl_service_t *s, svc_out *o, qrl_status st, const char *what, const char *why) {
    o->failed = o->judge = true;
    o->st = st;
    snprintf(o->why, sizeof o->why, "%s", why);
    if (s->leaving && s->leave_fails++ == 0) snprintf(s->leave_why, sizeof s->leave_why, "%s: %s", o->topic, why);
    uint64_t now = uv_now(&s->loop);
    if (s->fail_warned_ms && now - s->fail_warned_ms < 1000) {
        s->fail_quiet++;
        return;
    }
    if (s->fail_quiet)
        QRL_LOG_WARN(s->o.tag, "%s %s failed: %s (and %zu other failures since the last such line)", what, o->topic,
                     why, s->fail_quiet);
    else
        QRL_LOG_WARN(s->o.tag, "%s %s failed: %s", what, o->topic, why);
    s->fail_warned_ms = now;
    s->fail_quiet = 0;
}

/* Queue every record of o; what cannot be queued now (BUSY) is sent again from the tick. */
static void out_send(qrl_service_t *s, svc_out *o) {
    o->failed = false;
    o->left = 0;
    for (size_t i = 0; i < o->n; i++) {
        qrl_error err;
        qrl_status st = qrl_kafka_producer_send(s->producer, o->topic, o->key_len ? o->key : NULL, o->key_len,
                                                o->payloads[i], o->lens[i], o, &err);
        if (st != QRL_OK) {
            if (st != QRL_STATUS_BUSY) out_failed(s, o, st, "send to", err.msg);
            o->failed = true;
            break;
        }
        o->left++;
    }
    if (o->left == 0) {
        o->next = s->resend;
        s->resend = o;
    }
}

static void on_delivery(void *user, void *opaque, const qrl_kafka_delivery *dv) {
    qrl_service_t *s = user;
    svc_out *o = opaque;
    if (!o) return;
    if (dv->status != QRL_OK) out_failed(s, o, dv->status, "delivery to", dv->error ? dv->error : "?");
    if (--o->left > 0) return;
    if (o->failed) {
        o->next = s->resend;
        s->resend = o;
        return;
    }
    void *tag = o->tag;
    s->unacked--;
    out_free(s, o);
    if (s->cb.acknowledged) s->cb.acknowledged(s->user, tag);
}

void qrl_service_produce(qrl_service_t *s, const char *topic, const void *key, size_t key_len,
                         uint8_t *const *payloads, const size_t *lens, size_t n, bool owned, void *tag) {
    QRL_CHECK(n >= 1 && key_len <= SVC_KEY_MAX);
    svc_out *o = calloc(1, sizeof *o);
    QRL_CHECK(o != NULL);
    o->payloads = malloc(n * sizeof *o->payloads);
    o->lens = malloc(n * sizeof *o->lens);
    QRL_CHECK(o->payloads && o->lens);
    memcpy(o->payloads, payloads, n * sizeof *o->payloads);
    memcpy(o->lens, lens, n * sizeof *o->lens);
    if (key_len) memcpy(o->key, key, key_len);
    o->key_len = key_len;
    o->topic = topic;
    o->n = n;
    o->owned = owned;
    o->tag = tag;
    o->anext = s->all;
    if (s->all) s->all->aprev = o;
    s->all = o;
    s->unacked++;
    out_send(s, o);
}

void qrl_service_dead_letter(qrl_service_t *s, int32_t partition, int64_t offset, const void *key,
                             size_t key_len, const void *payload, size_t len, const char *why, void *tag) {
    qrl_service_dead_letter_from(s, s->o.topic, partition, offset, key, key_len, payload, len, why, tag);
}

void qrl_service_dead_letter_from(qrl_service_t *s, const char *source_topic, int32_t partition, int64_t offset,
                                  const void *key, size_t key_len, const void *payload, size_t len,
                                  const char *why, void *tag) {
    char *rec = NULL;
    size_t rec_len = 0;
    qrl_error err;
    qrl_status st = qrl_kafka_dlq_encode(source_topic, partition, offset, key, key_len, payload, len, why, &rec,
                                         &rec_len, &err);
    QRL_CHECK(st == QRL_OK); /* only NOMEM can fail here */
    QRL_LOG_WARN(s->o.tag, "dead letter partition=%d offset=%" PRId64 ": %s", (int)partition, offset, why);
    uint8_t *p = (uint8_t *)rec;
    qrl_service_produce(s, s->o.dlq_topic, NULL, 0, &p, &rec_len, 1, true, tag);
}

size_t qrl_service_unacked(const qrl_service_t *s) { return s->unacked; }

/* ---- consuming and commits ----------------------------------------------------------- */

void qrl_service_record_done(qrl_service_t *s, qrl_kafka_offset *rec) {
    int32_t key;
    int64_t upto = qrl_kafka_offsets_done(s->offsets, rec, &key);
    if (upto < 0) return;
    size_t ti = (size_t)key >> SVC_TOPIC_SHIFT;
    int32_t p = key & ((1 << SVC_TOPIC_SHIFT) - 1);
    if (s->cb.committable && ti == 0) {
        s->cb.committable(s->user, p, upto);
        qrl_kafka_offsets_committed(s->offsets, key, upto);
        return;
    }
    if (!s->consumer) return; /* left the group (qrl_service_leave): the records go elsewhere */
    qrl_error err;
    if (qrl_kafka_consumer_commit_offset_async(s->consumer, s->topics[ti], p, upto, &err) != QRL_OK) {
        QRL_LOG_WARN(s->o.tag, "commit failed (the records will be delivered again): %s", err.msg);
        return;
    }
    qrl_kafka_offsets_committed(s->offsets, key, upto);
    QRL_LOG_DEBUG(s->o.tag, "commit topic=%s partition=%d next_offset=%" PRId64, s->topics[ti], (int)p, upto);
}

qrl_status qrl_service_commit(qrl_service_t *s, int32_t partition, int64_t upto, qrl_error *err) {
    if (!s->consumer) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "commit: no consumer");
    return qrl_kafka_consumer_commit_offset_async(s->consumer, s->o.topic, partition, upto, err);
}

qrl_kafka_consumer_t *qrl_service_consumer(qrl_service_t *s) { return s->consumer; }

static void consume(qrl_service_t *s) {
    for (int n = 0; n < SVC_POLL_BATCH && (!s->cb.may_consume || s->cb.may_consume(s->user)); n++) {
        qrl_kafka_message msg = {0};
        bool got = false;
        qrl_error err;
        if (qrl_kafka_consumer_poll(s->consumer, 0, &msg, &got, &err) != QRL_OK) {
            /* retriable ones repeat every tick: log once a second */
            if (uv_now(&s->loop) - s->consumer_warned_ms >= 1000) {
                s->consumer_warned_ms = uv_now(&s->loop);
                QRL_LOG_WARN(s->o.tag, "consumer: %s", err.msg);
            }
            break;
        }
        if (!got) break;
        size_t ti = 0;
        while (ti + 1 < s->n_topics && !(msg.topic && strcmp(msg.topic, s->topics[ti]) == 0)) ti++;
        if (msg.topic && strcmp(msg.topic, s->topics[ti]) != 0) ti = 0; /* not ours: cannot happen */
        QRL_CHECK(msg.partition >= 0 && msg.partition < (1 << SVC_TOPIC_SHIFT));
        qrl_kafka_offset *rec =
            qrl_kafka_offsets_push(s->offsets, (int32_t)(ti << SVC_TOPIC_SHIFT) | msg.partition, msg.offset);
        s->cb.record(s->user, &msg, rec);
        qrl_kafka_message_release(&msg);
        if (s->closing) break;
    }
}

/* ---- tick, signals, close ------------------------------------------------------------ */

/* A failure of o the daemon has not seen: give o up (true: o is freed) or set its backoff. */
static bool out_give_up(qrl_service_t *s, svc_out *o, uint64_t now) {
    o->judge = false;
    if (o->fails++ == 0) o->first_fail_ms = now;
    if (s->cb.undeliverable &&
        s->cb.undeliverable(s->user, o->tag, o->topic, o->st, o->why, o->fails, now - o->first_fail_ms)) {
        s->unacked--;
        out_free(s, o);
        return true;
    }
    int k = o->fails < 6 ? o->fails - 1 : 5;
    o->retry_at_ms = now + (uint64_t)(k < 5 ? 50 << k : 2000);
    return false;
}

static void on_tick(uv_timer_t *t) {
    qrl_service_t *s = t->data;
    qrl_kafka_producer_poll(s->producer, 0);
    uint64_t now = uv_now(&s->loop);
    svc_out *r = s->resend, *wait = NULL;
    s->resend = NULL;
    while (r) {
        svc_out *next = r->next;
        r->next = NULL;
        if (r->judge && out_give_up(s, r, now)) {
            r = next;
            continue;
        }
        if (now < r->retry_at_ms) {
            r->next = wait; /* backing off */
            wait = r;
        } else {
            out_send(s, r);
        }
        r = next;
    }
    while (wait) {
        svc_out *next = wait->next;
        wait->next = s->resend;
        s->resend = wait;
        wait = next;
    }
    if (!s->closing) consume(s);
    /* Log assignment changes (rebalances); an in-process query, so only now and then. */
    if (uv_now(&s->loop) - s->assigned_checked_ms >= 250) {
        s->assigned_checked_ms = uv_now(&s->loop);
        int a = qrl_kafka_consumer_assigned(s->consumer);
        if (a != s->assigned) {
            QRL_LOG_INFO(s->o.tag, "partitions assigned=%d (was %d)", a, s->assigned);
            s->assigned = a;
        }
    }
    if (s->cb.tick && !s->closing) s->cb.tick(s->user);
}

static void on_signal(uv_signal_t *h, int sig) {
    qrl_service_t *s = h->data;
    if (++s->signals > 1 || !s->cb.stop(s->user, sig)) {
        QRL_LOG_ERROR(s->o.tag, "second signal %d%s", sig,
                      s->o.second_signal_note ? s->o.second_signal_note : ": exiting now");
        _exit(1);
    }
}

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_rpc_closed(qrl_rpc_server_t *srv, void *user) {
    qrl_service_t *s = user;
    if (s->started) {
        close_handle((uv_handle_t *)&s->tick);
        close_handle((uv_handle_t *)&s->sigterm);
        close_handle((uv_handle_t *)&s->sigint);
    }
    if (s->cb.closed) s->cb.closed(s->user);
}

void qrl_service_close(qrl_service_t *s) {
    if (s->closing) return;
    s->closing = true;
    if (s->started) uv_timer_stop(&s->tick);
    if (s->rpc) qrl_rpc_server_close(s->rpc, on_rpc_closed, s);
    else on_rpc_closed(NULL, s);
    s->rpc = NULL; /* the server frees itself at the end of its close */
}

bool qrl_service_closing(const qrl_service_t *s) { return s->closing; }

/* ---- control server ------------------------------------------------------------------ */

void qrl_service_reply_control(qrl_service_t *s, qrl_rpc_call_t *call, const char *msg) {
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = s->cb.state(s->user);
    r.message = (char *)msg;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_service_t *s = user;
    s->cb.status(s->user, call);
}

static void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_service_t *s = user;
    const char *why = ((const Qrl__PauseRequest *)req)->reason;
    qrl_service_reply_control(s, call, s->cb.pause(s->user, true, why ? why : ""));
}

static void h_resume(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_service_t *s = user;
    const char *why = ((const Qrl__ResumeRequest *)req)->reason;
    qrl_service_reply_control(s, call, s->cb.pause(s->user, false, why ? why : ""));
}

static void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_service_t *s = user;
    qrl_rpc_call_config_set(call, s->o.cfg, (const Qrl__SetRequest *)req);
}

void qrl_service_handle(qrl_service_t *s, qrl_rpc_id id, qrl_rpc_handler_fn fn, void *user) {
    QRL_CHECK(!s->started && s->n_handlers < SVC_MAX_HANDLERS);
    s->handlers[s->n_handlers].id = id;
    s->handlers[s->n_handlers].fn = fn;
    s->handlers[s->n_handlers].user = user;
    s->n_handlers++;
}

static qrl_status rpc_start(qrl_service_t *s, qrl_error *err) {
    const char *tf = s->o.token_file;
    QRL_TRY(qrl_rpc_token_resolve(tf && *tf ? tf : NULL, s->token, &s->have_token, err));
    if (!s->have_token)
        QRL_LOG_WARN(s->o.tag, "no rpc token (rpc.token_file): %s",
                     s->o.no_token_note ? s->o.no_token_note : "mutating calls are refused");
    qrl_rpc_server_opts ro = s->o.rpc;
    ro.token = s->have_token ? s->token : NULL;
    ro.allow_no_token = !s->have_token;
    QRL_TRY(qrl_rpc_server_new(&s->loop, &ro, &s->rpc, err));
    qrl_rpc_server_handle(s->rpc, s->o.rpc_status, h_status, s);
    qrl_rpc_server_handle(s->rpc, s->o.rpc_pause, h_pause, s);
    qrl_rpc_server_handle(s->rpc, s->o.rpc_resume, h_resume, s);
    qrl_rpc_server_handle(s->rpc, s->o.rpc_set, h_set, s);
    for (int i = 0; i < s->n_handlers; i++)
        qrl_rpc_server_handle(s->rpc, s->handlers[i].id, s->handlers[i].fn, s->handlers[i].user);
    QRL_TRY(qrl_rpc_server_start(s->rpc, err));
    QRL_LOG_INFO(s->o.tag, "rpc listening port=%d", qrl_rpc_server_port(s->rpc));
    return QRL_OK;
}

int qrl_service_rpc_port(const qrl_service_t *s) { return s->rpc ? qrl_rpc_server_port(s->rpc) : -1; }
const char *qrl_service_token(const qrl_service_t *s) { return s->have_token ? s->token : NULL; }

/* ---- life ---------------------------------------------------------------------------- */

qrl_status qrl_service_new(const qrl_service_opts *opts, const qrl_service_callbacks *cb, void *user,
                           qrl_service_t **out, qrl_error *err) {
    QRL_CHECK(cb->record && cb->state && cb->pause && cb->stop && cb->status);
    *out = NULL;
    qrl_service_t *s = calloc(1, sizeof *s);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "service: out of memory");
    s->o = *opts;
    s->cb = *cb;
    QRL_CHECK(opts->n_extra_topics < SVC_MAX_TOPICS);
    s->topics[s->n_topics++] = opts->topic;
    for (size_t i = 0; i < opts->n_extra_topics; i++) s->topics[s->n_topics++] = opts->extra_topics[i];
    s->user = user;
    s->offsets = qrl_kafka_offsets_new();
    if (!s->offsets) {
        free(s);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "service: out of memory");
    }
    if (opts->metrics_listen && *opts->metrics_listen) {
        qrl_status st = qrl_prom_registry_new(&s->prom, err);
        if (st != QRL_OK) {
            qrl_kafka_offsets_free(s->offsets);
            free(s);
            return st;
        }
    }
    QRL_CHECK(uv_loop_init(&s->loop) == 0);
    *out = s;
    return QRL_OK;
}

uv_loop_t *qrl_service_loop(qrl_service_t *s) { return &s->loop; }
qrl_prom_registry_t *qrl_service_prom(qrl_service_t *s) { return s->prom; }
FILE *qrl_service_metrics_jsonl(qrl_service_t *s) { return s->metrics; }

qrl_status qrl_service_start(qrl_service_t *s, qrl_error *err) {
    qrl_kafka_producer_opts po = {.bootstrap = s->o.bootstrap, .client_id = s->o.client_id,
                                  .linger_ms = 2, .on_delivery = on_delivery, .user = s};
    QRL_TRY(qrl_kafka_producer_new(&po, &s->producer, err));
    qrl_kafka_consumer_opts co = {.bootstrap = s->o.bootstrap, .group_id = s->o.group,
                                  .client_id = s->o.client_id, .session_timeout_ms = s->o.session_timeout_ms};
    QRL_TRY(qrl_kafka_consumer_new(&co, s->topics, s->n_topics, &s->consumer, err));
    QRL_TRY(rpc_start(s, err));
    const char *mp = s->o.metrics_jsonl;
    if (mp && *mp && !(s->metrics = fopen(mp, "a")))
        return qrl_error_set(err, QRL_STATUS_IO, "metrics.jsonl: cannot open %s", mp);
    if (s->prom) {
        qrl_status st = qrl_prom_server_start(s->prom, s->o.metrics_listen, &s->prom_server, err);
        if (st != QRL_OK) {
            qrl_error inner = *err;
            return qrl_error_set(err, st, "metrics.listen: %s", inner.msg);
        }
    }
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, (uint64_t)s->o.poll_ms, (uint64_t)s->o.poll_ms);
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    s->started = true;
    return QRL_OK;
}

void qrl_service_run(qrl_service_t *s) { uv_run(&s->loop, UV_RUN_DEFAULT); }

qrl_status qrl_service_leave(qrl_service_t *s, int timeout_ms, qrl_error *err) {
    /* outstanding async commits are finished first by librdkafka */
    qrl_kafka_consumer_close(s->consumer);
    s->consumer = NULL;
    /* failures before this flush were the tick's to judge (given up or resent) */
    s->leaving = true;
    qrl_status st = qrl_kafka_producer_flush(s->producer, timeout_ms, err);
    qrl_kafka_producer_destroy(s->producer);
    s->producer = NULL;
    if (st == QRL_STATUS_TIMEOUT) return st;
    if (s->leave_fails)
        return qrl_error_set(err, QRL_STATUS_NETWORK, "%zu deliveries failed while leaving (first: %s)",
                             s->leave_fails, s->leave_why);
    return QRL_OK;
}

void qrl_service_destroy(qrl_service_t *s) {
    if (!s) return;
    qrl_kafka_consumer_close(s->consumer);
    qrl_kafka_producer_destroy(s->producer);
    uv_loop_close(&s->loop);
    while (s->all) out_free(s, s->all);
    qrl_kafka_offsets_free(s->offsets);
    if (s->metrics) fclose(s->metrics);
    qrl_prom_server_stop(s->prom_server);
    qrl_prom_registry_destroy(s->prom);
    free(s);
}
