/* qrl-rollout loop thread (STYLE 14) on the daemon shell (service/service.h): what is the
 * rollout's own.  Prompts come in through the shell's consumer, go to the engine, their
 * GroupResults (or dead letters) go out through the shell's producer, with rollout.trace
 * their TraceChunks first on kafka.trace_topic; a prompt's offset is committed (by the
 * shell) only after its result and its trace chunks have been acknowledged by the broker.
 * docs/rollout-daemon.md has the whole picture. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "metrics.h"
#include "rollout.h"
#include "service/service.h"
#include "verify/verify.h"

static uint64_t now_us(void) { return uv_hrtime() / 1000; }
static uint64_t unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}
static uint64_t loop_ms(rd_daemon *d) { return uv_now(qrl_service_loop(d->svc)); }

/* ---- groups in flight ---------------------------------------------------------------- */

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

static void write_metrics(rd_daemon *d, const rd_group *g) {
    FILE *f = qrl_service_metrics_jsonl(d->svc);
    if (!f || !g->result) return;
    uint64_t tokens = 0;
    for (size_t i = 0; i < g->result->n_responses; i++) tokens += g->result->responses[i]->n_token_ids;
    fprintf(f,
            "{\"unix_ms\":%" PRIu64 ",\"replica\":\"%s\",\"group_id\":%" PRIu64
            ",\"partition\":%d,\"offset\":%" PRId64 ",\"responses\":%zu,\"tokens\":%" PRIu64
            ",\"total_us\":%" PRIu64 ",\"consumed_to_acked_us\":%" PRIu64,
            unix_ms(), d->replica_id, g->group_id, (int)g->partition, qrl_kafka_offset_value(g->off),
            g->result->n_responses, tokens, g->result->timings ? g->result->timings->total_us : 0,
            now_us() - g->consumed_us);
    rd_trace_jsonl(f, g, &d->tr, &d->engine, now_us()); /* and ends the line */
    fflush(f);
}

/* A set of g's (trace chunks, result, or dead letter) is acknowledged; after the last: commit, forget. */
static void on_acked(void *user, void *tag) {
    rd_daemon *d = user;
    rd_group *g = tag;
    if (--g->sets_unacked > 0) return;
    if (g->aborted) { /* a set given up (deliver.c): no commit, the prompt comes back */
        live_remove(d, g->group_id);
    } else if (g->to_dlq) {
        d->dead_letters++;
        QRL_LOG_INFO("rollout", "dead letter acked partition=%d offset=%" PRId64, (int)g->partition,
                     qrl_kafka_offset_value(g->off));
    } else {
        d->groups_produced++;
        QRL_LOG_INFO("rollout", "produced group=%" PRIu64 " partition=%d offset=%" PRId64
                     " chunks=%zu latency_ms=%.1f", g->group_id, (int)g->partition,
                     qrl_kafka_offset_value(g->off), g->chunks.count, (double)(now_us() - g->consumed_us) / 1e3);
        rd_trace_count(&d->tr, g);
        write_metrics(d, g);
        live_remove(d, g->group_id);
    }
    if (!g->aborted) qrl_service_record_done(d->svc, g->off);
    d->inflight--;
    rd_group_free(g);
}

/* A dead-letter record for g's source record (the source bytes are re-encoded from the
 * decoded PromptGroup when we no longer hold the Kafka message). */
static void dead_letter(rd_daemon *d, rd_group *g, const void *payload, size_t len, const char *error) {
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    qrl_error err;
    if (!payload && g->pg && qrl_wire_encode_alloc(&g->pg->base, &enc, &enc_len, &err) == QRL_OK) {
        payload = enc;
        len = enc_len;
    }
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = g->group_id ? qrl_wire_group_key(g->group_id, key) : 0;
    g->to_dlq = true;
    g->sets_unacked++;
    live_remove(d, g->group_id);
    qrl_service_dead_letter(d->svc, g->partition, qrl_kafka_offset_value(g->off), klen ? key : NULL, klen,
                            payload, len, error, g);
    free(enc);
}

/* The broker does not take a set of g's (deliver.c decides): give it up, or not yet. */
static bool on_undeliverable(void *user, void *tag, const char *topic, qrl_status st, const char *why, int fails,
                             uint64_t failing_ms) {
    rd_daemon *d = user;
    rd_group *g = tag;
    char reason[600];
    rd_delivery_act act = rd_delivery_policy(d, g, topic, st, why, fails, failing_ms, reason, sizeof reason);
    if (act == RD_DELIVERY_RETRY) return false;
    if (act == RD_DELIVERY_DLQ) dead_letter(d, g, NULL, 0, reason); /* before the count drops */
    g->aborted |= act == RD_DELIVERY_ABORT;
    on_acked(d, g); /* the set given up is settled */
    return true;
}

/* Finished groups from the engine: encode and produce. */
static void on_done(uv_async_t *h) {
    rd_daemon *d = h->data;
    rd_group *g = rd_engine_take_done(&d->engine);
    while (g) {
        rd_group *next = g->next;
        g->next = NULL;
        qrl_error err;
        size_t maxb = (size_t)d->s->kafka.max_result_bytes;
        if (g->rejected) {
            dead_letter(d, g, NULL, 0, g->error);
        } else if (qrl_wire_result_encode_chunked(g->result, maxb, &g->chunks, &err) != QRL_OK) {
            dead_letter(d, g, NULL, 0, err.msg);
        } else {
            if (g->chunks.count > 1)
                QRL_LOG_INFO("rollout", "group=%" PRIu64 " result chunked into %zu messages",
                             g->result->group_id, g->chunks.count);
            char key[QRL_WIRE_KEY_MAX];
            size_t klen = qrl_wire_group_key(g->group_id, key);
            /* before the result: the learner sees them first */
            rd_trace_produce(d->svc, d->trace_topic, d->s->trace_fault, g, key, klen);
            g->sets_unacked++;
            qrl_service_produce(d->svc, d->results_topic, key, klen, g->chunks.data, g->chunks.len,
                                g->chunks.count, false, g);
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
    s->temperature = (float)d->s->temperature;
    s->top_p = (float)d->s->top_p;
    s->top_k = (uint32_t)d->s->top_k;
    s->max_new_tokens = (uint32_t)d->s->max_new_tokens;
    pg->sampling = s;
}

/* Only poll with room: a full replica leaves records in Kafka (bounded memory). */
static bool may_consume(void *user) {
    rd_daemon *d = user;
    return !d->draining && !d->paused && d->inflight < d->s->max_concurrency;
}

static void on_record(void *user, const qrl_kafka_message *msg, qrl_kafka_offset *off) {
    rd_daemon *d = user;
    rd_group *g = calloc(1, sizeof *g);
    QRL_CHECK(g != NULL);
    g->partition = msg->partition;
    g->off = off;
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
        qrl_service_record_done(d->svc, g->off);
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

/* ---- state, drain, close --------------------------------------------------------------- */

static Qrl__ServiceState state_of(void *user) {
    const rd_daemon *d = user;
    if (d->closing) return QRL__SERVICE_STATE__SERVICE_STATE_STOPPED;
    if (d->draining) return QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    if (d->paused) return QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    return QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
}

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_closed(void *user) {
    rd_daemon *d = user;
    close_handle((uv_handle_t *)&d->done_async);
    close_handle((uv_handle_t *)&d->drain_async);
}

static void begin_close(rd_daemon *d) {
    if (d->closing) return;
    d->closing = true;
    QRL_LOG_INFO("rollout", "drained: produced=%" PRIu64 " dead_letters=%" PRIu64 "; stopping",
                 d->groups_produced, d->dead_letters);
    qrl_service_close(d->svc);
}

/* Finish in-flight groups, commit, leave the group, exit 0.  timeout_ms > 0: after that
 * long, abort what is left (its prompts stay uncommitted, so another replica answers
 * them) and exit anyway. */
static void start_drain(rd_daemon *d, const char *why, uint64_t timeout_ms) {
    if (timeout_ms && (!d->drain_deadline_ms || loop_ms(d) + timeout_ms < d->drain_deadline_ms))
        d->drain_deadline_ms = loop_ms(d) + timeout_ms;
    if (d->draining) return;
    d->draining = true;
    d->paused = false; /* finish what is in flight */
    rd_engine_set_paused(&d->engine, false);
    rd_engine_hold_until(&d->engine, 0);
    QRL_LOG_INFO("rollout", "draining (%s): in_flight=%d timeout_ms=%" PRIu64, why, d->inflight, timeout_ms);
}

static bool on_stop(void *user, int sig) {
    rd_daemon *d = user;
    start_drain(d, sig == SIGTERM ? "SIGTERM" : "SIGINT",
                (uint64_t)d->s->drain_timeout_ms);
    return true;
}

static void on_drain_async(uv_async_t *h) {
    rd_daemon *d = h->data;
    start_drain(d, "learner shutdown", (uint64_t)d->s->drain_timeout_ms);
}

static void fill_status(rd_daemon *d, Qrl__RolloutStatus *r);

static void on_tick(void *user) {
    rd_daemon *d = user;
    d->control.state = (int)state_of(d); /* heartbeats report it (control thread) */
    d->control.max_concurrency = (uint32_t)d->s->max_concurrency;
    int delay = d->s->step_delay_ms;
    if (delay != d->step_delay_ms) {
        d->step_delay_ms = delay;
        rd_engine_set_step_delay(&d->engine, delay);
    }
    if (d->prom && loop_ms(d) - d->prom_ms >= 200) { /* the stats take the engine's lock */
        d->prom_ms = loop_ms(d);
        Qrl__RolloutStatus s = QRL__ROLLOUT_STATUS__INIT;
        fill_status(d, &s);
        rd_metrics_update(d->prom, &s, d->dead_letters, d->consumed, d->duplicates, &d->tr);
    }
    if (d->draining && d->inflight == 0 && qrl_service_unacked(d->svc) == 0)
        begin_close(d);
    else if (d->draining && d->drain_deadline_ms && loop_ms(d) >= d->drain_deadline_ms && !d->closing) {
        QRL_LOG_WARN("rollout", "drain timeout: aborting in_flight=%d (their prompts stay uncommitted: "
                     "another replica answers them)", d->inflight);
        begin_close(d);
    }
}

/* ---- rpc ------------------------------------------------------------------------------ */

static void fill_status(rd_daemon *d, Qrl__RolloutStatus *rp) {
    rd_engine_stats es;
    rd_engine_get_stats(&d->engine, &es);
    Qrl__RolloutStatus r = QRL__ROLLOUT_STATUS__INIT;
    r.replica_id = (char *)d->replica_id;
    r.state = state_of(d);
    r.version = es.sched.version;
    r.slots_total = (uint32_t)d->s->slots;
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
    r.max_concurrency = (uint32_t)d->s->max_concurrency;
    *rp = r;
}

static void on_status(void *user, qrl_rpc_call_t *call) {
    Qrl__RolloutStatus r;
    fill_status(user, &r);
    qrl_rpc_call_reply(call, &r.base);
}

static const char *on_pause(void *user, bool pause, const char *reason) {
    rd_daemon *d = user;
    if (d->draining) return pause ? "draining: pause ignored" : "draining: resume ignored";
    d->paused = pause;
    rd_engine_set_paused(&d->engine, pause);
    QRL_LOG_INFO("rollout", "%s (%s)", pause ? "paused" : "resumed", reason);
    return pause ? "replica paused" : "replica resumed";
}

static void h_drain(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    rd_daemon *d = user;
    start_drain(d, "rpc Drain", ((const Qrl__DrainRequest *)req)->timeout_ms);
    qrl_service_reply_control(d->svc, call, "draining");
}

/* ---- run ------------------------------------------------------------------------------ */

/* Registration with the learner (learner.addr): the control and weights threads. */
static qrl_status control_start(rd_daemon *d, qrl_error *err) {
    const char *learner = d->s->learner_addr;
    if (!*learner) return QRL_OK;
    rd_control *c = &d->control;
    const char *listen = d->s->rpc_listen;
    const char *colon = strrchr(listen, ':');
    snprintf(d->control_addr, sizeof d->control_addr, "%.*s:%d", colon ? (int)(colon - listen) : 9,
             colon ? listen : "127.0.0.1", qrl_service_rpc_port(d->svc));
    gethostname(d->host, sizeof d->host - 1);
    snprintf(c->learner, sizeof c->learner, "%s", learner);
    const char *token = qrl_service_token(d->svc);
    if (token) snprintf(c->token, sizeof c->token, "%s", token);
    c->have_token = token != NULL;
    qrl__replica_info__init(&c->info);
    c->info.id = (char *)d->replica_id;
    c->info.host = d->host;
    c->info.device = d->device;
    c->info.device_name = d->device_name;
    c->info.precision = d->precision;
    c->info.kv_format = d->kv_format;
    c->info.slots = (uint32_t)d->s->slots;
    c->info.control_addr = d->control_addr;
    c->info.pid = (uint32_t)getpid();
    c->info.build = "qrl-rollout";
    rd_nccl_configure(c, d->s); /* ReplicaInfo.nccl and the NCCL transport's settings */
    rd_ipc_configure(c, d->s);  /* ReplicaInfo.node_id: CUDA IPC from a learner on this node */
    c->engine = &d->engine;
    c->model = d->model;
    c->drain_async = &d->drain_async;
    c->state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
    c->max_concurrency = (uint32_t)d->s->max_concurrency;
    const char *ca = d->s->learner_tls_ca;
    const char *cert = d->s->learner_tls_cert;
    const char *key = d->s->learner_tls_key;
    c->tls_ca = *ca ? ca : NULL;
    c->tls_cert = *cert ? cert : NULL;
    c->tls_key = *key ? key : NULL;
    return rd_control_start(c, err);
}

/* The shell and the loop handles the engine wakes (before the engine starts). */
static qrl_status service_new(rd_daemon *d, qrl_error *err) {
    qrl_service_opts so = {
        .tag = "rollout",
        .client_id = d->replica_id,
        .bootstrap = d->s->kafka.bootstrap,
        .group = d->s->kafka.group,
        .topic = d->prompts_topic,
        .dlq_topic = d->dlq_topic,
        .session_timeout_ms = d->s->kafka.session_timeout_ms,
        .poll_ms = d->s->kafka.poll_ms,
        .rpc = {.addr = d->s->rpc_listen},
        .token_file = d->s->rpc_token_file,
        .no_token_note = "Pause/Resume/Drain/Set are refused",
        .rpc_status = QRL_RPC_ROLLOUT_STATUS,
        .rpc_pause = QRL_RPC_ROLLOUT_PAUSE,
        .rpc_resume = QRL_RPC_ROLLOUT_RESUME,
        .rpc_set = QRL_RPC_ROLLOUT_SET,
        .cfg = d->cfg,
        .metrics_jsonl = d->s->metrics_jsonl,
        .metrics_listen = d->s->metrics_listen,
        .second_signal_note = " while draining: exiting now (in-flight prompts will be delivered again)",
    };
    qrl_rpc_server_opts_tls(&so.rpc, d->cfg);
    qrl_service_callbacks cb = {.record = on_record, .may_consume = may_consume, .acknowledged = on_acked,
                                .undeliverable = on_undeliverable, .tick = on_tick, .state = state_of,
                                .pause = on_pause, .stop = on_stop, .status = on_status, .closed = on_closed};
    QRL_TRY(qrl_service_new(&so, &cb, d, &d->svc, err));
    uv_loop_t *loop = qrl_service_loop(d->svc);
    uv_async_init(loop, &d->done_async, on_done);
    d->done_async.data = d;
    uv_async_init(loop, &d->drain_async, on_drain_async);
    d->drain_async.data = d;
    return QRL_OK;
}

/* Connect (Kafka, control server, metrics), then register with the learner. */
static qrl_status setup(rd_daemon *d, qrl_error *err) {
    qrl_service_handle(d->svc, QRL_RPC_ROLLOUT_DRAIN, h_drain, d);
    QRL_TRY(rd_metrics_start(qrl_service_prom(d->svc), d->replica_id, d->precision, d->kv_format, &d->prom, err));
    QRL_TRY(qrl_service_start(d->svc, err));
    return control_start(d, err);
}

int rd_daemon_run(const rd_settings *s, qrl_config_t *cfg, const qrl_model *model, const qrl_tokenizer *tok) {
    static rd_daemon dd; /* one per process; static so handles outlive every callback */
    rd_daemon *d = &dd;
    d->s = s;
    d->cfg = cfg;
    d->model = model;
    d->prompts_topic = d->s->kafka.prompts_topic;
    d->results_topic = d->s->kafka.results_topic;
    d->dlq_topic = d->s->kafka.dlq_topic;
    d->trace_topic = d->s->kafka.trace_topic;
    d->engine.trace_max_bytes = s->trace ? (size_t)s->kafka.max_trace_bytes : 0;
    d->tr.start_us = now_us();
    d->replica_id = d->s->replica_id;
    snprintf(d->precision, sizeof d->precision, "%s", d->s->precision);
    snprintf(d->kv_format, sizeof d->kv_format, "%s", d->s->kv_cache);

    qrl_error err;
    qrl_scheduler_config sc;
    if (service_new(d, &err) != QRL_OK ||
        rd_engine_config(s, model, tok, &sc, d->device, sizeof d->device, d->device_name, sizeof d->device_name,
                         &err) != QRL_OK ||
        rd_engine_start(&d->engine, model, tok, &sc, d->replica_id, s->emit_text, &d->done_async, &err) != QRL_OK) {
        fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
        return 1;
    }
    if (rd_check_topics(s, &err) != QRL_OK || setup(d, &err) != QRL_OK) {
        fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
        _exit(1); /* handles half made; nothing in flight yet */
    }
    QRL_LOG_INFO("rollout", "serving replica=%s prompts=%s results=%s dlq=%s group=%s trace=%s",
                 d->replica_id, d->prompts_topic, d->results_topic, d->dlq_topic,
                 d->s->kafka.group, s->trace ? d->trace_topic : "off");

    qrl_service_run(d->svc);

    rd_control_stop(&d->control);
    rd_engine_join(&d->engine);
    /* Leave the group, then deliver anything still queued (an aborted drain: briefly). */
    int rc = qrl_service_leave(d->svc, d->inflight ? 1000 : 10000, &err) == QRL_OK ? 0 : 1;
    if (rc) fprintf(stderr, "qrl-rollout: error: %s\n", err.msg);
    qrl_service_destroy(d->svc);
    free(d->live);
    rd_metrics_stop(d->prom);
    QRL_LOG_INFO("rollout", "stopped rc=%d consumed=%" PRIu64 " produced=%" PRIu64
                 " dead_letters=%" PRIu64 " duplicates_skipped=%" PRIu64 " trace_chunks=%" PRIu64
                 " trace_bytes=%" PRIu64 " trace_bytes_per_token=%.1f trace_failed=%" PRIu64,
                 rc, d->consumed, d->groups_produced, d->dead_letters, d->duplicates, d->tr.chunks,
                 d->tr.bytes, qrl_trace_metric_bytes_per_token(d->tr.record_bytes, d->tr.tokens), d->tr.failed);
    return rc;
}
