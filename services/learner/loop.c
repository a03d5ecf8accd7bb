/* qrl-learner loop thread (STYLE 14; docs/learner-daemon.md): setup, the tick, signals,
 * Shutdown and the close chain; the sections (daemon.h) do the work.  Nothing here waits:
 * Kafka is polled with zero timeouts from a uv_timer, commits are asynchronous, the
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
#include "produce.h"
#include "rpc/rpc.h"
#include "update.h"
#include "weights/wipc.h"
#include "wire/wire.h"

static struct {
    ld_core core;
    uv_loop_t loop;
    uv_timer_t tick, exit_timer;
    uv_signal_t sigterm, sigint;
    uv_async_t train_async;
    qrl_rpc_server_t *rpc;
    bool close_after_ckpt; /* a close was asked while a checkpoint was being written */
} L; /* one per process; handles outlive every callback */

/* ---- closing -------------------------------------------------------------------------- */

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_rpc_closed(qrl_rpc_server_t *s, void *user) {
    close_handle((uv_handle_t *)&L.tick);
    close_handle((uv_handle_t *)&L.exit_timer);
    close_handle((uv_handle_t *)&L.sigterm);
    close_handle((uv_handle_t *)&L.sigint);
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
    uv_timer_stop(&L.tick);
    ld_control_closing();
    qrl_rpc_server_close(L.rpc, on_rpc_closed, c);
}

/* The end of the run (max_updates, Shutdown, a resumed finished run): the final state is
 * checkpointed first when nothing has checkpointed it yet (max_updates started one already). */
static void on_exit_timer(uv_timer_t *t) {
    ld_core *c = &L.core;
    if (ld_ckpt_on() && !ld_ckpt_busy() && !c->training && !ld_ckpt_current(c)) ld_ckpt_start(c);
    begin_close();
}

static void on_signal(uv_signal_t *h, int sig) {
    ld_core *c = &L.core;
    if (c->stopping) {
        QRL_LOG_ERROR("learner", "second signal %d: exiting now", sig);
        _exit(1);
    }
    c->stopping = true;
    QRL_LOG_INFO("learner", "%s: no more dispatch; stopping after the running update%s",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", ld_ckpt_on() ? " and a checkpoint" : "");
    if (c->training) return; /* on_trained checkpoints and closes */
    if (ld_ckpt_on() && !ld_ckpt_busy() && !ld_ckpt_current(c)) ld_ckpt_start(c);
    begin_close();
}

static void h_shutdown(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const Qrl__ShutdownRequest *rq = (const Qrl__ShutdownRequest *)req;
    /* an operator's normal early end (deploy/local/launch.sh reads this line): as SIGTERM,
     * the running update finishes and the final state is checkpointed */
    QRL_LOG_INFO("learner", "Shutdown requested reason='%s' at step=%" PRIu64 ": telling replicas to shut down; "
                 "stopping after the running update%s", rq->reason ? rq->reason : "", c->step,
                 ld_ckpt_on() ? " and a checkpoint" : "");
    ld_control_reply(c, call, "shutting down");
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

static void on_tick(uv_timer_t *t) {
    ld_core *c = &L.core;
    ld_intake_expire_chunks(c);
    qrl_kafka_producer_poll(c->producer, 0);
    ld_control_nccl_fallback(c);
    ld_produce_resend(c);
    ld_dispatch_fill(c);
    ld_dispatch_redispatch_stale(c);
    ld_intake_poll(c);
    ld_update_try(c);
    ld_control_tick(c);
}

/* ---- run ------------------------------------------------------------------------------ */

static qrl_status setup(ld_core *c, const qrl_learner_config *lc, qrl_error *err) {
    qrl_config_t *cfg = c->cfg;
    QRL_TRY(ld_wserver_start(&c->ws, c->s->weights.listen, err));
    QRL_TRY(ld_nccl_start(&c->nccl, c->s->weights.transport, c->s->weights.nccl_device, c->s->weights.nccl_timeout_ms,
                          &c->ws, err));
    QRL_TRY(ld_trainer_start(&c->trainer, c->model, lc, &c->ws, NULL,
                             (size_t)c->s->weights.bucket_bytes, &L.train_async, err));
    if (lc->device_weights) { /* after the engine: its errors name the device first */
        char node_id[160];
        QRL_TRY(qrl_wipc_sender_new(lc->device, &c->ipc, err));
        qrl_wipc_node_id(node_id);
        ld_control_set_node(node_id);
        c->trainer.ipc = c->ipc; /* before the first job: ld_trainer_submit's mutex orders it */
        QRL_LOG_INFO("weights", "versions are published on cuda:%d; replicas on node %s take them by CUDA IPC",
                     lc->device, node_id);
    }
    const char *bootstrap = c->s->kafka.bootstrap;
    qrl_kafka_producer_opts po = {.bootstrap = bootstrap, .client_id = "qrl-learner", .linger_ms = 2,
                                  .on_delivery = ld_produce_on_delivery, .user = c};
    QRL_TRY(qrl_kafka_producer_new(&po, &c->producer, err));
    qrl_kafka_consumer_opts co = {.bootstrap = bootstrap, .group_id = c->s->kafka.group,
                                  .client_id = "qrl-learner",
                                  .session_timeout_ms = c->s->kafka.session_timeout_ms};
    QRL_TRY(qrl_kafka_consumer_new(&co, &c->results_topic, 1, &c->consumer, err));
    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have = false;
    const char *tf = c->s->rpc.token_file;
    QRL_TRY(qrl_rpc_token_resolve(*tf ? tf : NULL, token, &have, err));
    if (!have) QRL_LOG_WARN("learner", "no rpc token (rpc.token_file): mutating calls are refused");
    qrl_rpc_server_opts ro = {.addr = c->s->rpc.listen, .token = have ? token : NULL,
                              .allow_no_token = !have};
    qrl_rpc_server_opts_tls(&ro, cfg);
    QRL_TRY(qrl_rpc_server_new(&L.loop, &ro, &L.rpc, err));
    ld_control_handle(c, L.rpc);
    qrl_rpc_server_handle(L.rpc, QRL_RPC_LEARNER_SHUTDOWN, h_shutdown, c);
    qrl_rpc_server_handle(L.rpc, QRL_RPC_LEARNER_CHECKPOINT, ld_ckpt_h_checkpoint, c);
    QRL_TRY(qrl_rpc_server_start(L.rpc, err));
    QRL_LOG_INFO("learner", "rpc listening port=%d", qrl_rpc_server_port(L.rpc));
    QRL_TRY(ld_update_init(c->s->metrics.jsonl, err));
    return qrl_learner_metrics_start(c->s->metrics.listen, c->s->metrics.tensorboard_dir, &c->lm, err);
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
    ld_produce_init(ld_dispatch_acked);
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
    ld_intake_init(ld_ckpt_on());
    uv_loop_init(&L.loop);
    uv_async_init(&L.loop, &L.train_async, on_trained);
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
    uv_timer_init(&L.loop, &L.tick);
    uv_timer_init(&L.loop, &L.exit_timer);
    int period = c->s->kafka.poll_ms;
    uv_timer_start(&L.tick, on_tick, (uint64_t)period, (uint64_t)period);
    uv_signal_init(&L.loop, &L.sigterm);
    uv_signal_init(&L.loop, &L.sigint);
    uv_signal_start(&L.sigterm, on_signal, SIGTERM);
    uv_signal_start(&L.sigint, on_signal, SIGINT);
    if (c->finished) uv_timer_start(&L.exit_timer, on_exit_timer, 1500, 0);
    QRL_LOG_INFO("learner", "serving run_id=%" PRIu64 " prompts=%s results=%s G=%u T=%u window=%" PRIu64
                 " dataset=%zu prompts", c->run_id, c->prompts_topic, c->results_topic, c->G, c->T,
                 ld_dispatch_window(c), ds->n);

    uv_run(&L.loop, UV_RUN_DEFAULT);

    ld_trainer_join(&c->trainer);
    ld_nccl_stop(&c->nccl);
    ld_wserver_stop(&c->ws);
    qrl_wipc_sender_free(c->ipc); /* after the servers: their snapshots read its slots */
    qrl_kafka_consumer_close(c->consumer);
    int rc = qrl_kafka_producer_flush(c->producer, 10000, &err) == QRL_OK ? 0 : 1;
    if (rc) fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
    qrl_kafka_producer_destroy(c->producer);
    uv_loop_close(&L.loop);
    ld_intake_free();
    ld_control_free();
    ld_produce_free();
    ld_update_free();
    ld_dispatch_free();
    ld_ckpt_free();
    qrl_learner_metrics_stop(c->lm);
    QRL_LOG_INFO("learner", "stopped rc=%d step=%" PRIu64 " version=%" PRIu64, rc, c->step, c->version);
    return rc;
}
