/* qrl-learner loop thread (STYLE 14; docs/learner-daemon.md): the daemon on the service
 * shell (common/service/service.h), which owns the loop, the tick, signals, the close chain,
 * Kafka in and out and the shared RPCs; here are setup, the shell's callbacks, Shutdown and
 * the end of the run.  The sections (daemon.h) do the work.  Nothing here waits: the
 * trainer is reached through its job slot and answers through an async handle. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "control.h"
#include "core/log.h"
#include "daemon.h"
#include "dispatch.h"
#include "intake.h"
#include "trace.h"
#include "rpc/rpc.h"
#include "update.h"
#include "weights/wipc.h"
#include "wire/wire.h"

static struct {
    ld_core core;
    uv_timer_t exit_timer;
    uv_async_t train_async;
    bool close_after_ckpt; /* a close was asked while a checkpoint was being written */
} L; /* one per process; handles outlive every callback */

/* ---- closing -------------------------------------------------------------------------- */

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* The shell's closed callback: its RPC server and handles are closed; close ours. */
static void shell_closed(void *user) {
    close_handle((uv_handle_t *)&L.exit_timer);
    close_handle((uv_handle_t *)&L.train_async);
}

static void begin_close(void) {
    ld_core *c = &L.core;
    if (ld_ckpt_busy()) { /* the trainer is writing a checkpoint: close when it is done */
        L.close_after_ckpt = true;
        return;
    }
    if (c->closing) return;
    c->closing = true;
    ld_dispatch_counts dc = ld_dispatch_counts_now();
    ld_intake_counts ic = ld_intake_counts_now();
    QRL_LOG_INFO("learner", "stopping: step=%" PRIu64 " version=%" PRIu64 " dispatched=%" PRIu64
                 " results=%" PRIu64 " duplicates=%" PRIu64 " dead_letters=%" PRIu64
                 " redispatched=%" PRIu64, c->step, c->version, dc.next_id - 1, ic.results,
                 ic.duplicates, ic.dead_letters, dc.redispatched);
    if (ld_trace_consumed(c)) {
        ld_trace_counts tk = ld_trace_counts_now();
        QRL_LOG_INFO("learner", "trace: chunks=%" PRIu64 " bytes=%" PRIu64 " duplicates=%" PRIu64 " late=%" PRIu64
                     " other_run=%" PRIu64 " undispatched=%" PRIu64 " dead_letters=%" PRIu64 " evicted=%" PRIu64
                     " expired=%" PRIu64 " joined=%" PRIu64 " missing=%" PRIu64 " corrupt=%" PRIu64
                     " sites_none=%" PRIu64, tk.chunks, tk.bytes, tk.duplicates, tk.late, tk.other_run,
                     tk.undispatched, tk.dead_letters, tk.evicted, tk.expired, tk.joined, tk.missing, tk.corrupt,
                     tk.sites_none);
    }
    ld_control_closing();
    qrl_service_close(c->svc);
}

/* The end of the run (max_updates, Shutdown, a resumed finished run): the final state is
 * checkpointed first when nothing has checkpointed it yet (max_updates started one already). */
static void on_exit_timer(uv_timer_t *t) {
    ld_core *c = &L.core;
    if (ld_ckpt_on() && !ld_ckpt_busy() && !c->training && !ld_ckpt_current(c)) ld_ckpt_start(c);
    begin_close();
}

/* The shell's stop callback (SIGTERM/SIGINT); false: a second signal, the shell exits. */
static bool stop_asked(void *user, int sig) {
    ld_core *c = &L.core;
    if (c->stopping) return false;
    c->stopping = true;
    QRL_LOG_INFO("learner", "%s: no more dispatch; stopping after the running update%s",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", ld_ckpt_on() ? " and a checkpoint" : "");
    if (c->training) return true; /* on_trained checkpoints and closes */
    if (ld_ckpt_on() && !ld_ckpt_busy() && !ld_ckpt_current(c)) ld_ckpt_start(c);
    begin_close();
    return true;
}

static void h_shutdown(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const Qrl__ShutdownRequest *rq = (const Qrl__ShutdownRequest *)req;
    /* an operator's normal early end (deploy/local/launch.sh reads this line): as SIGTERM,
     * the running update finishes and the final state is checkpointed */
    QRL_LOG_INFO("learner", "Shutdown requested reason='%s' at step=%" PRIu64 ": telling replicas to shut down; "
                 "stopping after the running update%s", rq->reason ? rq->reason : "", c->step,
                 ld_ckpt_on() ? " and a checkpoint" : "");
    qrl_service_reply_control(c->svc, call, "shutting down");
    ld_control_announce(c, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
    c->stopping = true;
    if (!c->training) uv_timer_start(&L.exit_timer, on_exit_timer, 500, 0);
}

/* ---- the trainer's answers and the tick ---------------------------------------------- */

static void on_trained(uv_async_t *h) {
    ld_core *c = &L.core;
    ld_job *j = ld_trainer_take_done(&c->trainer);
    if (!j) return;
    if (j->ckpt) {
        ld_ckpt_done(c, j);
        if (L.close_after_ckpt) {
            L.close_after_ckpt = false;
            begin_close();
            return;
        }
        ld_update_try(c);
        return;
    }
    switch (ld_update_finish(c, j)) {
    case LD_UPDATE_NEXT_FAIL:
        begin_close();
        return;
    case LD_UPDATE_NEXT_LAST: /* give the events (and the last weight streams) a moment to leave */
        uv_timer_start(&L.exit_timer, on_exit_timer, 1500, 0);
        return;
    case LD_UPDATE_NEXT_TRAIN:
        break;
    }
    ld_update_try(c);
    if (c->stopping) begin_close();
}

/* The shell's tick (after it polled the producer, sent again what failed and consumed). */
static void tick(void *user) {
    ld_core *c = &L.core;
    ld_intake_expire_chunks(c);
    ld_trace_expire(c);
    ld_control_nccl_fallback(c);
    ld_dispatch_fill(c);
    ld_dispatch_redispatch_stale(c);
    ld_update_try(c);
    ld_control_tick(c);
}

/* ---- the shell's other callbacks ------------------------------------------------------ */

static void record_in(void *user, const qrl_kafka_message *m, qrl_kafka_offset *rec) {
    ld_core *c = &L.core;
    if (ld_trace_consumed(c) && m->topic && strcmp(m->topic, c->s->kafka.trace_topic) == 0)
        ld_trace_record(c, m, rec);
    else
        ld_intake_record(c, m, rec);
}

static bool consume_more(void *user) { return !L.core.finished; }

static void acked(void *user, void *tag) {
    if (tag) ld_dispatch_acked(&L.core, (uint64_t)(uintptr_t)tag); /* a PromptGroup (dead letters: NULL) */
}

static Qrl__ServiceState state_now(void *user) { return ld_service_state(&L.core); }

static const char *pause_resume(void *user, bool pause, const char *reason) { return ld_control_pause(&L.core, pause); }

static void status_reply(void *user, qrl_rpc_call_t *call) { ld_control_status(&L.core, call); }

static void committable(void *user, int32_t partition, int64_t upto) { ld_intake_committable(partition, upto); }

/* ---- run ------------------------------------------------------------------------------ */

/* The shell and the handles of our own (before anything connects). */
static qrl_status service_new(ld_core *c, qrl_error *err) {
    qrl_service_opts so = {
        .tag = "learner",
        .client_id = "qrl-learner",
        .bootstrap = c->s->kafka.bootstrap,
        .group = c->s->kafka.group,
        .topic = c->results_topic,
        .dlq_topic = c->dlq_topic,
        .session_timeout_ms = c->s->kafka.session_timeout_ms,
        .poll_ms = c->s->kafka.poll_ms,
        .rpc = {.addr = c->s->rpc.listen},
        .token_file = c->s->rpc.token_file,
        .no_token_note = "mutating calls are refused",
        .rpc_status = QRL_RPC_LEARNER_STATUS,
        .rpc_pause = QRL_RPC_LEARNER_PAUSE,
        .rpc_resume = QRL_RPC_LEARNER_RESUME,
        .rpc_set = QRL_RPC_LEARNER_SET,
        .cfg = c->cfg,
        .metrics_jsonl = c->s->metrics.jsonl,
        .metrics_listen = c->s->metrics.listen,
    };
    if (ld_trace_consumed(c)) { /* TRACE records come on their own topic (trace.h) */
        QRL_TRY(qrl_kafka_topic_name_check("kafka.trace_topic", c->s->kafka.trace_topic, err));
        if (strcmp(c->s->kafka.trace_topic, c->results_topic) == 0)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kafka.trace_topic: '%s' is also "
                                 "kafka.results_topic (TraceChunks need a topic of their own)", c->results_topic);
        so.extra_topics = &c->s->kafka.trace_topic;
        so.n_extra_topics = 1;
    }
    qrl_rpc_server_opts_tls(&so.rpc, c->cfg);
    /* with checkpoints on, used records are committed with the checkpoint that covers them */
    qrl_service_callbacks cb = {.record = record_in, .may_consume = consume_more, .acknowledged = acked,
                                .tick = tick, .state = state_now, .pause = pause_resume, .stop = stop_asked,
                                .status = status_reply, .closed = shell_closed,
                                .committable = ld_ckpt_on() ? committable : NULL};
    QRL_TRY(qrl_service_new(&so, &cb, c, &c->svc, err));
    uv_loop_t *loop = qrl_service_loop(c->svc);
    uv_async_init(loop, &L.train_async, on_trained);
    uv_timer_init(loop, &L.exit_timer);
    return QRL_OK;
}

static qrl_status setup(ld_core *c, const qrl_learner_config *lc, qrl_error *err) {
    QRL_TRY(ld_wserver_start(&c->ws, c->s->weights.listen, err));
    QRL_TRY(ld_nccl_start(&c->nccl, c->s->weights.transport, c->s->weights.nccl_device, c->s->weights.nccl_timeout_ms,
                          &c->ws, err));
    QRL_TRY(ld_trainer_start(&c->trainer, c->model, lc, &c->ws, NULL, (size_t)c->s->weights.bucket_bytes,
                             &L.train_async, err));
    if (lc->device_weights) { /* after the engine: its errors name the device first */
        char node_id[160];
        QRL_TRY(qrl_wipc_sender_new(lc->device, &c->ipc, err));
        qrl_wipc_node_id(node_id);
        ld_control_set_node(node_id);
        c->trainer.ipc = c->ipc; /* before the first job: ld_trainer_submit's mutex orders it */
        QRL_LOG_INFO("weights", "versions are published on cuda:%d; replicas on node %s take them by CUDA IPC",
                     lc->device, node_id);
    }
    ld_control_handle(c, c->svc);
    qrl_service_handle(c->svc, QRL_RPC_LEARNER_SHUTDOWN, h_shutdown, c);
    qrl_service_handle(c->svc, QRL_RPC_LEARNER_CHECKPOINT, ld_ckpt_h_checkpoint, c);
    QRL_TRY(qrl_learner_metrics_new(qrl_service_prom(c->svc), c->s->metrics.tensorboard_dir, &c->lm, err));
    return qrl_service_start(c->svc, err); /* Kafka, the control server, metrics.jsonl, /metrics */
}

int ld_daemon_run(qrl_config_t *cfg, const ld_settings *s, qrl_model *model, const ld_dataset *ds,
                  const qrl_learner_config *lc) {
    ld_core *c = &L.core;
    c->cfg = cfg;
    c->s = s;
    c->model = model;
    c->started_ms = ld_unix_ms();
    c->ds = ds;
    c->prompts_topic = c->s->kafka.prompts_topic;
    c->results_topic = c->s->kafka.results_topic;
    c->dlq_topic = c->s->kafka.dlq_topic;
    c->task = c->s->dataset.task;
    c->dataset_path = c->s->dataset.path;
    c->G = (uint32_t)c->s->learner.group_size;
    c->T = (uint32_t)c->s->learner.quota;
    c->max_updates = (uint64_t)c->s->learner.max_updates;
    c->seed = (uint64_t)c->s->learner.seed;
    c->run_id = (uint64_t)c->s->learner.run_id;
    if (!c->run_id) c->run_id = (ld_unix_ms() << 16) ^ (uint64_t)getpid();
    ld_dispatch_init(c);
    qrl_error err;
    qrl_learner_config lcr = *lc;
    qrl_ckpt_state rs;
    char rdir[QRL_CKPT_PATH_MAX];
    bool resumed = false;
    if (ld_ckpt_configure(c, &lcr, &resumed, rdir, &rs, &err) != QRL_OK) {
        fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
        return 1;
    }
    if (service_new(c, &err) != QRL_OK) {
        fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
        return 1;
    }
    if (setup(c, &lcr, &err) != QRL_OK || (resumed && ld_ckpt_restore(c, rdir, &rs, &err) != QRL_OK)) {
        fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
        _exit(1); /* handles half made; nothing in flight yet */
    }
    qrl_ckpt_state_free(&rs);
    if (c->max_updates && c->step >= c->max_updates) { /* resumed a finished run */
        QRL_LOG_INFO("learner", "max_updates=%" PRIu64 " reached already (step %" PRIu64 "): stopping",
                     c->max_updates, c->step);
        c->finished = true;
    }
    if (c->finished) uv_timer_start(&L.exit_timer, on_exit_timer, 1500, 0);
    QRL_LOG_INFO("learner", "serving run_id=%" PRIu64 " prompts=%s results=%s G=%u T=%u window=%" PRIu64
                 " dataset=%zu prompts", c->run_id, c->prompts_topic, c->results_topic, c->G, c->T,
                 ld_dispatch_window(c), ds->n);

    qrl_service_run(c->svc);

    ld_trainer_join(&c->trainer);
    ld_nccl_stop(&c->nccl);
    ld_wserver_stop(&c->ws);
    qrl_wipc_sender_free(c->ipc); /* after the servers: their snapshots read its slots */
    /* leave the group, then deliver anything still queued */
    int rc = qrl_service_leave(c->svc, 10000, &err) == QRL_OK ? 0 : 1;
    if (rc) fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
    qrl_learner_metrics_stop(c->lm); /* before the shell frees the registry it serves */
    c->lm = NULL;
    qrl_service_destroy(c->svc);
    ld_intake_free();
    ld_trace_free();
    ld_control_free();
    ld_update_free();
    ld_dispatch_free();
    ld_ckpt_free();
    QRL_LOG_INFO("learner", "stopped rc=%d step=%" PRIu64 " version=%" PRIu64, rc, c->step, c->version);
    return rc;
}
