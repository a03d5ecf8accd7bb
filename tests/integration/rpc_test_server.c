/* A stand-in learner for tests/integration/qrlctl_cli.sh: the rpc server on a libuv loop
 * with fixed answers, so qrlctl can be driven end to end before the daemons exist.
 *
 *   rpc_test_server --port-file F [--token-file F] [--lifetime S]
 *
 * Listens on 127.0.0.1 (a free port), writes "127.0.0.1:PORT" to F once serving, and runs
 * until Learner.Shutdown, SIGTERM/SIGINT, or --lifetime seconds (default 60) have passed.
 * Learner.Status and ListReplicas answer fixed values (rollout-0 and rollout-1 running,
 * rollout-2 drained and gone: STOPPED, with its last status); the replicas' control address
 * is this server, which also serves the Rollout methods.  Set goes through a config table
 * with runtime-mutable keys (rollout.max_staleness, 0..16; and, as the real learner's,
 * learner.lr, sampling.temperature and, as a replica's, rollout.max_concurrency) and fixed
 * ones (rollout.kv_cache, learner.quota):
 * docs/qrlctl.md's examples run against it (tests/integration/docs_commands.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/log.h"
#include "rpc/rpc.h"

static const qrl_config_entry table[] = {
    {"rollout.max_staleness", QRL_CONFIG_TYPE_INT, "4", 0, 16, NULL, true, "mutable"},
    {"rollout.kv_cache", QRL_CONFIG_TYPE_ENUM, "bf16", 0, 0, "bf16|int8|int4", false, "fixed"},
    {"learner.lr", QRL_CONFIG_TYPE_DOUBLE, "1e-6", 1e-12, 1, NULL, true, "as qrl-learner's"},
    {"learner.quota", QRL_CONFIG_TYPE_INT, "128", 1, 1 << 20, NULL, false, "as qrl-learner's"},
    {"sampling.temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 1e4, NULL, true, "as qrl-learner's"},
    {"rollout.max_concurrency", QRL_CONFIG_TYPE_INT, "8", 1, 1 << 20, NULL, true, "as qrl-rollout's"},
};

static uv_loop_t loop;
static uv_timer_t lifetime;
static uv_signal_t sigterm, sigint;
static qrl_rpc_server_t *server;
static qrl_config_t *cfg;
static char self_addr[64];
static Qrl__ServiceState learner_state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;

static void on_closed(qrl_rpc_server_t *s, void *user) {
    uv_close((uv_handle_t *)&lifetime, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
}

static void stop(void) {
    if (!server) return;
    qrl_rpc_server_close(server, on_closed, NULL);
    server = NULL;
}

static void on_lifetime(uv_timer_t *t) {
    QRL_LOG_WARN("test-server", "lifetime over: stopping");
    stop();
}
static void on_signal(uv_signal_t *h, int sig) { stop(); }

static void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = 1;
    pos.index = 123;
    pos.source = "gsm8k";
    Qrl__LearnerStatus r = QRL__LEARNER_STATUS__INIT;
    r.state = learner_state;
    r.version = 7;
    r.step = 42;
    r.run_id = 99;
    r.mode = "overlap";
    r.replicas = 2;
    r.replicas_synced = 1;
    r.groups_in_flight = 5;
    r.quota = 8;
    r.position = &pos;
    r.last_checkpoint_step = 40;
    r.last_checkpoint_path = "/tmp/qrl-ckpt/step-40";
    r.train_tokens_per_s = 1234.5;
    r.reward_mean = 0.25f;
    r.accuracy = 0.5f;
    r.uptime_s = 60;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_list(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    Qrl__ReplicaInfo info[3];
    Qrl__RolloutStatus st[3];
    Qrl__ReplicaEntry e[3];
    Qrl__ReplicaEntry *ptrs[3];
    static const char *ids[3] = {"rollout-0", "rollout-1", "rollout-2"};
    for (int i = 0; i < 3; i++) {
        qrl__replica_info__init(&info[i]);
        info[i].id = (char *)ids[i];
        info[i].host = "node-a";
        info[i].device = i ? "cpu" : "cuda:0";
        info[i].precision = i ? "bf16" : "w8a8-int8";
        info[i].kv_format = "int4-protected";
        info[i].slots = 64;
        info[i].control_addr = self_addr;
        qrl__rollout_status__init(&st[i]);
        st[i].replica_id = (char *)ids[i];
        /* rollout-2: drained and exited; the learner keeps its last status */
        st[i].state = i == 2 ? QRL__SERVICE_STATE__SERVICE_STATE_STOPPED : QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
        st[i].version = 7 - (uint64_t)i;
        st[i].slots_total = 64;
        st[i].slots_in_use = 10 + (uint32_t)i;
        st[i].tokens_per_s = 1000.0 * (i + 1);
        st[i].kv_used = 0.5f;
        qrl__replica_entry__init(&e[i]);
        e[i].info = &info[i];
        e[i].status = &st[i];
        e[i].registered_unix_ms = (uint64_t)uv_now(&loop);
        e[i].last_heartbeat_unix_ms = 0;
        ptrs[i] = &e[i];
    }
    Qrl__ListReplicasResponse r = QRL__LIST_REPLICAS_RESPONSE__INIT;
    r.n_replicas = 3;
    r.replicas = ptrs;
    qrl_rpc_call_reply(call, &r.base);
}

static void control(qrl_rpc_call_t *call, Qrl__ServiceState state, const char *msg) {
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = state;
    r.message = (char *)msg;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    bool learner = qrl_rpc_call_method(call)->id == QRL_RPC_LEARNER_PAUSE;
    if (learner) learner_state = QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    control(call, QRL__SERVICE_STATE__SERVICE_STATE_PAUSED, learner ? "dispatch paused" : "replica paused");
}

static void h_resume(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    bool learner = qrl_rpc_call_method(call)->id == QRL_RPC_LEARNER_RESUME;
    if (learner) learner_state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
    control(call, QRL__SERVICE_STATE__SERVICE_STATE_RUNNING, learner ? "dispatch resumed" : "replica resumed");
}

static void h_drain(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__DrainRequest *d = (const Qrl__DrainRequest *)req;
    if (d->replica_id && *d->replica_id && strcmp(d->replica_id, "rollout-0") != 0 &&
        strcmp(d->replica_id, "rollout-1") != 0) {
        qrl_rpc_call_finish(call, QRL_STATUS_NOT_FOUND, "no replica '%s'", d->replica_id);
        return;
    }
    control(call, QRL__SERVICE_STATE__SERVICE_STATE_DRAINING, "draining");
}

static void h_checkpoint(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__CheckpointRequest *c = (const Qrl__CheckpointRequest *)req;
    char path[256];
    snprintf(path, sizeof path, "/tmp/qrl-ckpt/step-42%s%s", c->tag && *c->tag ? "-" : "",
             c->tag ? c->tag : "");
    Qrl__CheckpointResponse r = QRL__CHECKPOINT_RESPONSE__INIT;
    r.path = path;
    r.step = 42;
    r.version = 7;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_rpc_call_config_set(call, cfg, (const Qrl__SetRequest *)req);
}

static void h_shutdown(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    control(call, QRL__SERVICE_STATE__SERVICE_STATE_STOPPED, "stopping");
    stop(); /* the reply queued above still goes out */
}

int main(int argc, char **argv) {
    const char *port_file = NULL, *token_file = NULL;
    double life_s = 60;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port-file") == 0) port_file = argv[i + 1];
        else if (strcmp(argv[i], "--token-file") == 0) token_file = argv[i + 1];
        else if (strcmp(argv[i], "--lifetime") == 0) life_s = atof(argv[i + 1]);
        else { fprintf(stderr, "rpc_test_server: unknown option %s\n", argv[i]); return 2; }
    }
    if (!port_file || life_s <= 0) {
        fprintf(stderr, "usage: rpc_test_server --port-file F [--token-file F] [--lifetime S]\n");
        return 2;
    }
    qrl_error err;
    char token[QRL_RPC_TOKEN_MAX + 1];
    if (token_file && qrl_rpc_token_read(token_file, token, &err) != QRL_OK) {
        fprintf(stderr, "rpc_test_server: %s\n", err.msg);
        return 1;
    }
    if (qrl_config_new(table, sizeof table / sizeof table[0], &cfg, &err) != QRL_OK) return 1;
    uv_loop_init(&loop);
    qrl_rpc_server_opts o = {.token = token_file ? token : NULL, .allow_no_token = !token_file};
    if (qrl_rpc_server_new(&loop, &o, &server, &err) != QRL_OK) {
        fprintf(stderr, "rpc_test_server: %s\n", err.msg);
        return 1;
    }
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_STATUS, h_status, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_LIST_REPLICAS, h_list, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_PAUSE, h_pause, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_RESUME, h_resume, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_DRAIN, h_drain, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_CHECKPOINT, h_checkpoint, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_SET, h_set, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_SHUTDOWN, h_shutdown, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_ROLLOUT_PAUSE, h_pause, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_ROLLOUT_RESUME, h_resume, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_ROLLOUT_SET, h_set, NULL);
    if (qrl_rpc_server_start(server, &err) != QRL_OK) {
        fprintf(stderr, "rpc_test_server: %s\n", err.msg);
        return 1;
    }
    snprintf(self_addr, sizeof self_addr, "127.0.0.1:%d", qrl_rpc_server_port(server));
    uv_timer_init(&loop, &lifetime);
    uv_timer_start(&lifetime, on_lifetime, (uint64_t)(life_s * 1000), 0);
    uv_signal_init(&loop, &sigterm);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_init(&loop, &sigint);
    uv_signal_start(&sigint, on_signal, SIGINT);
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file); /* rename: readers never see half a line */
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n", self_addr) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
        fprintf(stderr, "rpc_test_server: cannot write %s\n", port_file);
        stop();
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    qrl_config_destroy(cfg);
    return 0;
}
