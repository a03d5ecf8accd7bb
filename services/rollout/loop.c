/* qrl-rollout loop thread (STYLE 14): Kafka consumer and producer polled from a uv_timer
 * with zero timeouts, the gRPC Rollout service, signals, offset commits.  Nothing here
 * waits: commits are asynchronous, sends return at once (BUSY is retried on the next
 * tick), the engine is reached through its queues.  docs/rollout-daemon.md has the
 * whole picture; the rule that matters: a prompt's offset is committed only after its
 * GroupResult (or dead letter) has been acknowledged by the broker, and only up to the
 * first record of the partition that is not yet acknowledged. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "rollout/gpu_memory.h"
#ifdef QRL_HAVE_CUDA
#include "cuda/runtime.cuh"
#endif
#include "metrics.h"
#include "rollout.h"
#include "rpc/rpc.h"
#include "verify/verify.h"

struct rd_daemon {
    uv_loop_t loop;
    uv_timer_t tick;
    uv_signal_t sigterm, sigint;
    uv_async_t done_async;
    uv_async_t drain_async;     /* control thread: the learner announced SHUTDOWN */
    rd_control control;
    char control_addr[300], host[128];
    qrl_config_t *cfg;
    const qrl_model *model;
    rd_engine engine;
    qrl_kafka_consumer_t *consumer;
    qrl_kafka_producer_t *producer;
    qrl_rpc_server_t *rpc;
    const char *prompts_topic, *results_topic, *dlq_topic, *replica_id;
    qrl_kafka_offsets *offsets; /* commit-after-use tracking of consumed records */
    rd_group *resend;       /* groups whose records must be sent (again) */
    uint64_t *live;         /* group ids in flight, n_live of them */
    int n_live, cap_live;
    int inflight;           /* consumed, not yet acknowledged */
    bool paused, draining, closing;
    uint64_t drain_deadline_ms; /* uv_now() after which a drain aborts what is left; 0 = none */
    int step_delay_ms;
    int signals;
    int assigned;           /* partitions held, as last logged */
    uint64_t assigned_checked_ms, consumer_warned_ms;
    uint64_t groups_produced, dead_letters, duplicates, consumed;
    FILE *metrics;
    char kv_format[16], precision[16];
    char device[16], device_name[160]; /* ReplicaInfo: "cpu" / "cuda:N" and its description */
    rd_metrics *prom;       /* metrics.listen; NULL when off */
    uint64_t prom_ms;
};

static uint64_t now_us(void) { return uv_hrtime() / 1000; }
static uint64_t unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* ---- partitions and commits ---------------------------------------------------------- */

/* Record a consumed message for commit-after-use (kafka/offsets.h). */
static qrl_kafka_offset *part_push(rd_daemon *d, int32_t p, int64_t offset) {
    return qrl_kafka_offsets_push(d->offsets, p, offset);
}

/* The record is used up: commit its partition up to the first record still in use. */
static void part_done(rd_daemon *d, int32_t p, qrl_kafka_offset *o) {
    int64_t upto = qrl_kafka_offsets_done(d->offsets, o, &p);
    if (upto < 0) return;
    qrl_error err;
    if (qrl_kafka_consumer_commit_offset_async(d->consumer, d->prompts_topic, p, upto, &err) != QRL_OK) {
        QRL_LOG_WARN("rollout", "commit failed (the records will be delivered again): %s", err.msg);
        return;
    }
    qrl_kafka_offsets_committed(d->offsets, p, upto);
    QRL_LOG_DEBUG("rollout", "commit partition=%d next_offset=%" PRId64, (int)p, upto);
}

static int live_find(const rd_daemon *d, uint64_t id) {
    for (int i = 0; i < d->n_live; i++)
        if (d->live[i] == id) return i;
    return -1;
}

static void live_add(rd_daemon *d, uint64_t id) {
    if (d->n_live == d->cap_live) {
        d->cap_live = d->cap_live ? 2 * d->cap_live : 16;
        d->live = realloc(d->live, (size_t)d->cap_live * sizeof *d->live);
        QRL_CHECK(d->live != NULL);
    }
    d->live[d->n_live++] = id;
}

static void live_remove(rd_daemon *d, uint64_t id) {
    int i = live_find(d, id);
    if (i >= 0) d->live[i] = d->live[--d->n_live];
}

/* ---- producing ----------------------------------------------------------------------- */

static void resend_push(rd_daemon *d, rd_group *g) {
    g->next = d->resend;
    d->resend = g;
}

/* Queue every record of g; what cannot be queued now (BUSY) is sent again from the tick. */
static void send_group(rd_daemon *d, rd_group *g) {
    const char *topic = g->to_dlq ? d->dlq_topic : d->results_topic;
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = qrl_wire_group_key(g->group_id, key);
    g->delivery_failed = false;
    g->chunks_left = 0;
    for (size_t i = 0; i < g->chunks.count; i++) {
        qrl_error err;
        qrl_status st = qrl_kafka_producer_send(d->producer, topic, g->to_dlq ? NULL : key,
                                                g->to_dlq ? 0 : klen, g->chunks.data[i],
                                                g->chunks.len[i], g, &err);
        if (st != QRL_OK) {
            if (st != QRL_STATUS_BUSY) QRL_LOG_WARN("rollout", "send: %s (retrying)", err.msg);
            g->delivery_failed = true;
            break;
        }
        g->chunks_left++;
    }
    if (g->chunks_left == 0) resend_push(d, g);
}

static void write_metrics(rd_daemon *d, const rd_group *g) {
    if (!d->metrics || !g->result) return;
    uint64_t tokens = 0;
    for (size_t i = 0; i < g->result->n_responses; i++) tokens += g->result->responses[i]->n_token_ids;
    fprintf(d->metrics,
            "{\"unix_ms\":%" PRIu64 ",\"replica\":\"%s\",\"group_id\":%" PRIu64
            ",\"partition\":%d,\"offset\":%" PRId64 ",\"responses\":%zu,\"tokens\":%" PRIu64
            ",\"total_us\":%" PRIu64 ",\"consumed_to_acked_us\":%" PRIu64 "}\n",
            unix_ms(), d->replica_id, g->group_id, (int)g->partition, qrl_kafka_offset_value(g->off),
            g->result->n_responses, tokens, g->result->timings ? g->result->timings->total_us : 0,
            now_us() - g->consumed_us);
    fflush(d->metrics);
}

/* Every record of g is acknowledged: commit, forget. */
static void group_acked(rd_daemon *d, rd_group *g) {
    if (g->to_dlq) {
        d->dead_letters++;
        QRL_LOG_INFO("rollout", "dead letter acked partition=%d offset=%" PRId64, (int)g->partition,
                     qrl_kafka_offset_value(g->off));
    } else {
        d->groups_produced++;
        QRL_LOG_INFO("rollout", "produced group=%" PRIu64 " partition=%d offset=%" PRId64
                     " chunks=%zu latency_ms=%.1f", g->group_id, (int)g->partition,
                     qrl_kafka_offset_value(g->off), g->chunks.count, (double)(now_us() - g->consumed_us) / 1e3);
        write_metrics(d, g);
        live_remove(d, g->group_id);
    }
    part_done(d, g->partition, g->off);
    d->inflight--;
    rd_group_free(g);
}

static void on_delivery(void *user, void *opaque, const qrl_kafka_delivery *dv) {
    rd_daemon *d = user;
    rd_group *g = opaque;
    if (!g) return;
    if (dv->status != QRL_OK) {
        QRL_LOG_WARN("rollout", "delivery to %s failed: %s (sending again)", dv->topic,
                     dv->error ? dv->error : "?");
        g->delivery_failed = true;
    }
    if (--g->chunks_left > 0) return;
    if (g->delivery_failed) resend_push(d, g);
    else group_acked(d, g);
}

/* A dead-letter record for g's source record (the source bytes are re-encoded from the
 * decoded PromptGroup when we no longer hold the Kafka message). */
static void dead_letter(rd_daemon *d, rd_group *g, const void *payload, size_t len,
                        const char *error) {
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    qrl_error err;
    if (!payload && g->pg && qrl_wire_encode_alloc(&g->pg->base, &enc, &enc_len, &err) == QRL_OK) {
        payload = enc;
        len = enc_len;
    }
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = g->group_id ? qrl_wire_group_key(g->group_id, key) : 0;
    char *rec = NULL;
    size_t rec_len = 0;
    qrl_status st = qrl_kafka_dlq_encode(d->prompts_topic, g->partition, qrl_kafka_offset_value(g->off),
                                         klen ? key : NULL, klen, payload, len, error, &rec,
                                         &rec_len, &err);
    free(enc);
    QRL_CHECK(st == QRL_OK); /* only NOMEM can fail here */
    QRL_LOG_WARN("rollout", "dead letter partition=%d offset=%" PRId64 ": %s", (int)g->partition,
                 qrl_kafka_offset_value(g->off), error);
    qrl_wire_chunks_free(&g->chunks);
    g->chunks.count = 1;
    g->chunks.data = malloc(sizeof *g->chunks.data);
    g->chunks.len = malloc(sizeof *g->chunks.len);
    QRL_CHECK(g->chunks.data && g->chunks.len);
    g->chunks.data[0] = (uint8_t *)rec;
    g->chunks.len[0] = rec_len;
    g->to_dlq = true;
    live_remove(d, g->group_id);
    send_group(d, g);
}

/* Finished groups from the engine: encode and produce. */
static void on_done(uv_async_t *h) {
    rd_daemon *d = h->data;
    rd_group *g = rd_engine_take_done(&d->engine);
    while (g) {
        rd_group *next = g->next;
        g->next = NULL;
        if (g->rejected) {
            dead_letter(d, g, NULL, 0, g->error);
        } else {
            qrl_error err;
            size_t maxb = (size_t)qrl_config_get_int(d->cfg, "kafka.max_result_bytes");
            if (qrl_wire_result_encode_chunked(g->result, maxb, &g->chunks, &err) != QRL_OK)
                dead_letter(d, g, NULL, 0, err.msg);
            else {
                if (g->chunks.count > 1)
                    QRL_LOG_INFO("rollout", "group=%" PRIu64 " result chunked into %zu messages",
                                 g->result->group_id, g->chunks.count);
                send_group(d, g);
            }
        }
        g = next;
    }
}

/* ---- consuming ----------------------------------------------------------------------- */

/* Sampling params for a PromptGroup that has none: the runtime-mutable defaults. */
static void apply_defaults(rd_daemon *d, Qrl__PromptGroup *pg) {
    if (pg->sampling) return;
    Qrl__SamplingParams *s = malloc(sizeof *s); /* freed with pg (system allocator) */
    QRL_CHECK(s != NULL);
    qrl__sampling_params__init(s);
    s->temperature = (float)qrl_config_get_double(d->cfg, "rollout.temperature");
    s->top_p = (float)qrl_config_get_double(d->cfg, "rollout.top_p");
    s->top_k = (uint32_t)qrl_config_get_int(d->cfg, "rollout.top_k");
    s->max_new_tokens = (uint32_t)qrl_config_get_int(d->cfg, "rollout.max_new_tokens");
    pg->sampling = s;
}

static void on_message(rd_daemon *d, const qrl_kafka_message *msg) {
    rd_group *g = calloc(1, sizeof *g);
    QRL_CHECK(g != NULL);
    g->partition = msg->partition;
    g->off = part_push(d, msg->partition, msg->offset);
    g->consumed_us = now_us();
    d->inflight++;
    d->consumed++;
    qrl_error err;
    ProtobufCMessage *m = NULL;
    qrl_status st = QRL_OK;
    if (!msg->payload || msg->len == 0)
        st = qrl_error_set(&err, QRL_STATUS_PARSE, "empty record");
    else
        st = qrl_wire_decode(&qrl__prompt_group__descriptor, msg->payload, msg->len,
                             QRL_KAFKA_MAX_MESSAGE_BYTES, &m, &err);
    if (st == QRL_OK) {
        g->pg = (Qrl__PromptGroup *)m;
        g->group_id = g->pg->group_id;
        apply_defaults(d, g->pg);
        st = qrl_wire_prompt_group_validate(g->pg, (uint32_t)d->model->cfg.vocab_size, &err);
    }
    if (st == QRL_OK && g->pg->task && *g->pg->task && !qrl_verifier_find(g->pg->task))
        st = qrl_error_set(&err, QRL_STATUS_NOT_FOUND, "PromptGroup %" PRIu64 ": unknown task '%s'",
                           g->group_id, g->pg->task);
    if (st != QRL_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s: %s", qrl_status_name(st), err.msg);
        dead_letter(d, g, msg->payload, msg->len, why);
        return;
    }
    if (live_find(d, g->group_id) >= 0) {
        /* Seen again while still in flight here (a partition came back after a
         * rebalance): the live copy answers; this record needs no result of its own. */
        d->duplicates++;
        QRL_LOG_WARN("rollout", "group=%" PRIu64 " delivered again while in flight (offset %" PRId64
                     "): skipped", g->group_id, msg->offset);
        part_done(d, g->partition, g->off);
        d->inflight--;
        rd_group_free(g);
        return;
    }
    live_add(d, g->group_id);
    QRL_LOG_INFO("rollout", "consumed group=%" PRIu64 " partition=%d offset=%" PRId64 " G=%u prompt=%zu",
                 g->group_id, (int)msg->partition, msg->offset, g->pg->group_size,
                 g->pg->n_prompt_token_ids);
    rd_engine_submit(&d->engine, g);
}

/* ---- state ---------------------------------------------------------------------------- */

static Qrl__ServiceState state_of(const rd_daemon *d) {
    if (d->closing) return QRL__SERVICE_STATE__SERVICE_STATE_STOPPED;
    if (d->draining) return QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    if (d->paused) return QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    return QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
}

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_rpc_closed(qrl_rpc_server_t *s, void *user) {
    rd_daemon *d = user;
    close_handle((uv_handle_t *)&d->tick);
    close_handle((uv_handle_t *)&d->sigterm);
    close_handle((uv_handle_t *)&d->sigint);
    close_handle((uv_handle_t *)&d->done_async);
    close_handle((uv_handle_t *)&d->drain_async);
}

static void begin_close(rd_daemon *d) {
    if (d->closing) return;
    d->closing = true;
    QRL_LOG_INFO("rollout", "drained: produced=%" PRIu64 " dead_letters=%" PRIu64 "; stopping",
                 d->groups_produced, d->dead_letters);
    uv_timer_stop(&d->tick);
    qrl_rpc_server_close(d->rpc, on_rpc_closed, d);
}

/* Finish in-flight groups, commit, leave the group, exit 0.  timeout_ms > 0: after that
 * long, abort what is left (its prompts stay uncommitted, so another replica answers
 * them) and exit anyway. */
static void start_drain(rd_daemon *d, const char *why, uint64_t timeout_ms) {
    if (timeout_ms && (!d->drain_deadline_ms || uv_now(&d->loop) + timeout_ms < d->drain_deadline_ms))
        d->drain_deadline_ms = uv_now(&d->loop) + timeout_ms;
    if (d->draining) return;
    d->draining = true;
    d->paused = false; /* finish what is in flight */
    rd_engine_set_paused(&d->engine, false);
    rd_engine_hold_until(&d->engine, 0);
    QRL_LOG_INFO("rollout", "draining (%s): in_flight=%d timeout_ms=%" PRIu64, why, d->inflight, timeout_ms);
}

static void on_signal(uv_signal_t *h, int sig) {
    rd_daemon *d = h->data;
    if (++d->signals > 1) {
        QRL_LOG_ERROR("rollout", "second signal %d while draining: exiting now (in-flight prompts "
                      "will be delivered again)", sig);
        _exit(1);
    }
    start_drain(d, sig == SIGTERM ? "SIGTERM" : "SIGINT",
                (uint64_t)qrl_config_get_int(d->cfg, "rollout.drain_timeout_ms"));
}

static void on_drain_async(uv_async_t *h) {
    rd_daemon *d = h->data;
    start_drain(d, "learner shutdown", (uint64_t)qrl_config_get_int(d->cfg, "rollout.drain_timeout_ms"));
}

static void fill_status(rd_daemon *d, Qrl__RolloutStatus *r);

static void on_tick(uv_timer_t *t) {
    rd_daemon *d = t->data;
    qrl_kafka_producer_poll(d->producer, 0);
    rd_group *r = d->resend;
    d->resend = NULL;
    while (r) {
        rd_group *next = r->next;
        r->next = NULL;
        send_group(d, r);
        r = next;
    }
    d->control.state = (int)state_of(d); /* heartbeats report it (control thread) */
    d->control.max_concurrency = (uint32_t)qrl_config_get_int(d->cfg, "rollout.max_concurrency");
    int delay = (int)qrl_config_get_int(d->cfg, "rollout.step_delay_ms");
    if (delay != d->step_delay_ms) {
        d->step_delay_ms = delay;
        rd_engine_set_step_delay(&d->engine, delay);
    }
    if (!d->draining && !d->paused) {
        int maxc = (int)qrl_config_get_int(d->cfg, "rollout.max_concurrency");
        /* Only poll with room: a full replica leaves records in Kafka (bounded memory). */
        for (int n = 0; n < 64 && d->inflight < maxc; n++) {
            qrl_kafka_message msg = {0};
            bool got = false;
            qrl_error err;
            qrl_status st = qrl_kafka_consumer_poll(d->consumer, 0, &msg, &got, &err);
            if (st != QRL_OK) { /* retriable ones repeat every tick: log once a second */
                if (uv_now(&d->loop) - d->consumer_warned_ms >= 1000) {
                    d->consumer_warned_ms = uv_now(&d->loop);
                    QRL_LOG_WARN("rollout", "consumer: %s", err.msg);
                }
                break;
            }
            if (!got) break;
            on_message(d, &msg);
            qrl_kafka_message_release(&msg);
        }
    }
    /* Log assignment changes (rebalances); an in-process query, so only now and then. */
    if (uv_now(&d->loop) - d->assigned_checked_ms >= 250) {
        d->assigned_checked_ms = uv_now(&d->loop);
        int a = qrl_kafka_consumer_assigned(d->consumer);
        if (a != d->assigned) {
            QRL_LOG_INFO("rollout", "partitions assigned=%d (was %d)", a, d->assigned);
            d->assigned = a;
        }
    }
    if (d->prom && uv_now(&d->loop) - d->prom_ms >= 200) { /* the stats take the engine's lock */
        d->prom_ms = uv_now(&d->loop);
        Qrl__RolloutStatus s = QRL__ROLLOUT_STATUS__INIT;
        fill_status(d, &s);
        rd_metrics_update(d->prom, &s, d->dead_letters, d->consumed, d->duplicates);
    }
    if (d->draining && d->inflight == 0 && qrl_kafka_producer_outstanding(d->producer) == 0)
        begin_close(d);
    else if (d->draining && d->drain_deadline_ms && uv_now(&d->loop) >= d->drain_deadline_ms &&
             !d->closing) {
        QRL_LOG_WARN("rollout", "drain timeout: aborting in_flight=%d (their prompts stay uncommitted: "
                     "another replica answers them)", d->inflight);
        begin_close(d);
    }
}

/* ---- rpc ------------------------------------------------------------------------------ */

static void reply_control(rd_daemon *d, qrl_rpc_call_t *call, const char *msg) {
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = state_of(d);
    r.message = (char *)msg;
    qrl_rpc_call_reply(call, &r.base);
}

static void fill_status(rd_daemon *d, Qrl__RolloutStatus *rp) {
    rd_engine_stats es;
    rd_engine_get_stats(&d->engine, &es);
    Qrl__RolloutStatus r = QRL__ROLLOUT_STATUS__INIT;
    r.replica_id = (char *)d->replica_id;
    r.state = state_of(d);
    r.version = es.sched.version;
    r.slots_total = (uint32_t)qrl_config_get_int(d->cfg, "rollout.slots");
    r.slots_in_use = (uint32_t)es.sched.running;
    r.active_groups = (uint32_t)es.groups_in_engine;
    r.queued_groups = (uint32_t)(d->inflight > es.groups_in_engine ? d->inflight - es.groups_in_engine : 0);
    r.tokens_per_s = es.tokens_per_s;
    r.kv_used = es.sched.kv_total_blocks
                    ? 1.0f - (float)es.sched.kv_free_blocks / (float)es.sched.kv_total_blocks
                    : 0.0f;
    r.staleness_restarts = es.sched.restarts;
    r.groups_produced = d->groups_produced;
    r.tokens_generated = es.sched.tokens_generated;
    r.precision = d->precision;
    r.kv_format = d->kv_format;
    r.max_concurrency = (uint32_t)qrl_config_get_int(d->cfg, "rollout.max_concurrency");
    *rp = r;
}

static void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    Qrl__RolloutStatus r;
    fill_status(user, &r);
    qrl_rpc_call_reply(call, &r.base);
}

static void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    rd_daemon *d = user;
    if (d->draining) return reply_control(d, call, "draining: pause ignored");
    d->paused = true;
    rd_engine_set_paused(&d->engine, true);
    QRL_LOG_INFO("rollout", "paused (%s)", ((const Qrl__PauseRequest *)req)->reason);
    reply_control(d, call, "replica paused");
}

static void h_resume(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    rd_daemon *d = user;
    if (d->draining) return reply_control(d, call, "draining: resume ignored");
    d->paused = false;
    rd_engine_set_paused(&d->engine, false);
    QRL_LOG_INFO("rollout", "resumed (%s)", ((const Qrl__ResumeRequest *)req)->reason);
    reply_control(d, call, "replica resumed");
}

static void h_drain(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    rd_daemon *d = user;
    start_drain(d, "rpc Drain", ((const Qrl__DrainRequest *)req)->timeout_ms);
    reply_control(d, call, "draining");
}

static void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    rd_daemon *d = user;
    qrl_rpc_call_config_set(call, d->cfg, (const Qrl__SetRequest *)req);
}

/* ---- run ------------------------------------------------------------------------------ */

static qrl_status setup(rd_daemon *d, qrl_error *err) {
    qrl_config_t *cfg = d->cfg;
    const char *bootstrap = qrl_config_get_string(cfg, "kafka.bootstrap");
    qrl_kafka_producer_opts po = {.bootstrap = bootstrap, .client_id = d->replica_id,
                                  .linger_ms = 2, .on_delivery = on_delivery, .user = d};
    QRL_TRY(qrl_kafka_producer_new(&po, &d->producer, err));
    qrl_kafka_consumer_opts co = {
        .bootstrap = bootstrap,
        .group_id = qrl_config_get_string(cfg, "kafka.group"),
        .client_id = d->replica_id,
        .session_timeout_ms = (int)qrl_config_get_int(cfg, "kafka.session_timeout_ms"),
    };
    QRL_TRY(qrl_kafka_consumer_new(&co, &d->prompts_topic, 1, &d->consumer, err));

    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have_token = false;
    const char *tf = qrl_config_get_string(cfg, "rpc.token_file");
    QRL_TRY(qrl_rpc_token_resolve(*tf ? tf : NULL, token, &have_token, err));
    if (!have_token)
        QRL_LOG_WARN("rollout", "no rpc token (rpc.token_file): Pause/Resume/Drain/Set are refused");
    qrl_rpc_server_opts ro = {.addr = qrl_config_get_string(cfg, "rpc.listen"),
                              .token = have_token ? token : NULL, .allow_no_token = !have_token};
    qrl_rpc_server_opts_tls(&ro, cfg);
    QRL_TRY(qrl_rpc_server_new(&d->loop, &ro, &d->rpc, err));
    qrl_rpc_server_handle(d->rpc, QRL_RPC_ROLLOUT_STATUS, h_status, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_ROLLOUT_PAUSE, h_pause, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_ROLLOUT_RESUME, h_resume, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_ROLLOUT_DRAIN, h_drain, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_ROLLOUT_SET, h_set, d);
    QRL_TRY(qrl_rpc_server_start(d->rpc, err));
    QRL_LOG_INFO("rollout", "rpc listening port=%d", qrl_rpc_server_port(d->rpc));

    const char *learner = qrl_config_get_string(cfg, "learner.addr");
    if (*learner) {
        rd_control *c = &d->control;
        const char *listen = qrl_config_get_string(cfg, "rpc.listen");
        const char *colon = strrchr(listen, ':');
        snprintf(d->control_addr, sizeof d->control_addr, "%.*s:%d",
                 colon ? (int)(colon - listen) : 9, colon ? listen : "127.0.0.1",
                 qrl_rpc_server_port(d->rpc));
        gethostname(d->host, sizeof d->host - 1);
        snprintf(c->learner, sizeof c->learner, "%s", learner);
        if (have_token) snprintf(c->token, sizeof c->token, "%s", token);
        c->have_token = have_token;
        qrl__replica_info__init(&c->info);
        c->info.id = (char *)d->replica_id;
        c->info.host = d->host;
        c->info.device = d->device;
        c->info.device_name = d->device_name;
        c->info.precision = d->precision;
        c->info.kv_format = d->kv_format;
        c->info.slots = (uint32_t)qrl_config_get_int(cfg, "rollout.slots");
        c->info.control_addr = d->control_addr;
        c->info.pid = (uint32_t)getpid();
        c->info.build = "qrl-rollout";
        rd_nccl_configure(c, cfg); /* ReplicaInfo.nccl and the NCCL transport's settings */
        rd_ipc_configure(c, cfg);  /* ReplicaInfo.node_id: CUDA IPC from a learner on this node */
        c->engine = &d->engine;
        c->model = d->model;
        c->drain_async = &d->drain_async;
        c->state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
        c->max_concurrency = (uint32_t)qrl_config_get_int(cfg, "rollout.max_concurrency");
        const char *ca = qrl_config_get_string(cfg, "learner.tls_ca_file");
        const char *cert = qrl_config_get_string(cfg, "learner.tls_cert_file");
        const char *key = qrl_config_get_string(cfg, "learner.tls_key_file");
        c->tls_ca = *ca ? ca : NULL;
        c->tls_cert = *cert ? cert : NULL;
        c->tls_key = *key ? key : NULL;
        QRL_TRY(rd_control_start(c, err));
    }

    const char *mp = qrl_config_get_string(cfg, "metrics.jsonl");
    if (*mp && !(d->metrics = fopen(mp, "a")))
        return qrl_error_set(err, QRL_STATUS_IO, "metrics.jsonl: cannot open %s", mp);
    return rd_metrics_start(cfg, d->replica_id, d->precision, d->kv_format, &d->prom, err);
}

int rd_daemon_run(qrl_config_t *cfg, const qrl_model *model, const qrl_tokenizer *tok) {
    static rd_daemon dd; /* one per process; static so handles outlive every callback */
    rd_daemon *d = &dd;
    d->cfg = cfg;
    d->offsets = qrl_kafka_offsets_new();
    QRL_CHECK(d->offsets != NULL);
    d->model = model;
    d->prompts_topic = qrl_config_get_string(cfg, "kafka.prompts_topic");
    d->results_topic = qrl_config_get_string(cfg, "kafka.results_topic");
    d->dlq_topic = qrl_config_get_string(cfg, "kafka.dlq_topic");
    d->replica_id = qrl_config_get_string(cfg, "rollout.replica_id");
    snprintf(d->precision, sizeof d->precision, "%s", qrl_config_get_string(cfg, "rollout.precision"));
    snprintf(d->kv_format, sizeof d->kv_format, "%s", qrl_config_get_string(cfg, "rollout.kv_cache"));
    uv_loop_init(&d->loop);
    uv_async_init(&d->loop, &d->done_async, on_done);
    d->done_async.data = d;
    uv_async_init(&d->loop, &d->drain_async, on_drain_async);
    d->drain_async.data = d;

    qrl_error err;
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.max_slots = (int)qrl_config_get_int(cfg, "rollout.slots");
    sc.prefill_chunk = (int)qrl_config_get_int(cfg, "rollout.prefill_chunk");
    sc.max_staleness = (int)qrl_config_get_int(cfg, "rollout.max_staleness");
    QRL_CHECK(qrl_kv_format_parse(d->kv_format, &sc.kv_format, &err) == QRL_OK);
    sc.kv_sink = (int)qrl_config_get_int(cfg, "rollout.kv_sink");
    sc.kv_recent = (int)qrl_config_get_int(cfg, "rollout.kv_recent");
    sc.eos_token_id = model->cfg.n_eos > 0 ? model->cfg.eos_ids[0] : qrl_tokenizer_eos(tok);
    snprintf(d->device, sizeof d->device, "cpu");
    snprintf(d->device_name, sizeof d->device_name, "cpu");
    if (strcmp(qrl_config_get_string(cfg, "rollout.device"), "cuda") == 0) {
        sc.device = (int)qrl_config_get_int(cfg, "rollout.cuda_device");
        sc.eager = qrl_config_get_bool(cfg, "rollout.enforce_eager");
        double gmu = qrl_config_get_double(cfg, "rollout.gpu_memory_utilization");
        if (gmu > 0 && qrl_scheduler_config_fit_gpu(&sc, model, gmu, &err) != QRL_OK) {
            fprintf(stderr, "qrl-rollout: error: rollout.%s\n", err.msg);
            return 1;
        }
        snprintf(d->device, sizeof d->device, "cuda:%d", sc.device);
#ifdef QRL_HAVE_CUDA
        if (qrl_cuda_device_describe(sc.device, d->device_name, sizeof d->device_name, &err) != QRL_OK)
            snprintf(d->device_name, sizeof d->device_name, "cuda:%d", sc.device);
#endif
    }
    int rc = 1;
    if (rd_engine_start(&d->engine, model, tok, &sc, d->replica_id,
                        qrl_config_get_bool(cfg, "rollout.emit_text"), &d->done_async, &err) != QRL_OK) {
        fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
        return 1;
    }
    if (setup(d, &err) != QRL_OK) {
        fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
        _exit(1); /* handles half made; nothing in flight yet */
    }
    uv_timer_init(&d->loop, &d->tick);
    d->tick.data = d;
    int period = (int)qrl_config_get_int(cfg, "kafka.poll_ms");
    uv_timer_start(&d->tick, on_tick, (uint64_t)period, (uint64_t)period);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d->sigint.data = d;
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    QRL_LOG_INFO("rollout", "serving replica=%s prompts=%s results=%s dlq=%s group=%s",
                 d->replica_id, d->prompts_topic, d->results_topic, d->dlq_topic,
                 qrl_config_get_string(cfg, "kafka.group"));

    uv_run(&d->loop, UV_RUN_DEFAULT);

    rd_control_stop(&d->control);
    rd_engine_join(&d->engine);
    /* Leave the group (outstanding async commits are finished first by librdkafka), then
     * deliver anything still queued. */
    qrl_kafka_consumer_close(d->consumer);
    rc = qrl_kafka_producer_flush(d->producer, 10000, &err) == QRL_OK ? 0 : 1;
    if (rc) fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
    qrl_kafka_producer_destroy(d->producer);
    uv_loop_close(&d->loop);
    qrl_kafka_offsets_free(d->offsets);
    free(d->live);
    if (d->metrics) fclose(d->metrics);
    rd_metrics_stop(d->prom);
    QRL_LOG_INFO("rollout", "stopped rc=%d consumed=%" PRIu64 " produced=%" PRIu64
                 " dead_letters=%" PRIu64 " duplicates_skipped=%" PRIu64,
                 rc, d->consumed, d->groups_produced, d->dead_letters, d->duplicates);
    return rc;
}
