/* qrl-learner control (control.h). */
#include "control.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint.h"
#include "core/log.h"
#include "dispatch.h"
#include "intake.h"
#include "learner/members.h"

static const char *const MODE_NAMES[] = {"overlap", "alternate"}; /* learner.mode, by ld_learner_mode */

static struct {
    qrl_members members;
    char node_id[160];          /* qrl_wipc_node_id: replicas with the same one take CUDA IPC */
    uint64_t ipc_version;       /* the version whose slot ipc_handle names (0: none) */
    uint8_t ipc_handle[64];
} C;

void ld_control_set_node(const char *node_id) { snprintf(C.node_id, sizeof C.node_id, "%s", node_id); }

void ld_control_free(void) { qrl_members_free(&C.members); }

void ld_control_closing(void) {
    for (int i = 0; i < C.members.n; i++) C.members.r[i].watch = NULL; /* the server cancels them */
}

Qrl__ServiceState ld_service_state(const ld_core *c) {
    if (c->closing || c->finished) return QRL__SERVICE_STATE__SERVICE_STATE_STOPPED;
    if (c->stopping) return QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    if (c->paused) return QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    return QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
}

/* ---- version events ----------------------------------------------------------------- */

/* Whether r takes versions by CUDA IPC: the learner publishes on the device and r runs a
 * CUDA engine on this node (ReplicaInfo.node_id equal to ours). */
static bool replica_ipc(const ld_core *c, const qrl_replica *r) {
    return c->ipc && C.node_id[0] && r->info && r->info->node_id && !strcmp(r->info->node_id, C.node_id);
}

static void push_event(ld_core *c, qrl_replica *r, Qrl__VersionEventKind kind) {
    if (!r->watch) return;
    Qrl__VersionEvent ev = QRL__VERSION_EVENT__INIT;
    ev.kind = kind;
    ev.version = c->version;
    ev.step = c->step;
    ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP;
    ev.weight_addr = c->ws.addr;
    ld_nccl_fill_event(&c->nccl, r->id, &ev); /* NCCL fields inside an NCCL announcement */
    if (kind == QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION && C.ipc_version == c->version &&
        replica_ipc(c, r)) { /* same node: the device slot (the TCP address stays as fallback) */
        ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_CUDA_IPC;
        ev.ipc_handle.data = C.ipc_handle;
        ev.ipc_handle.len = sizeof C.ipc_handle;
    }
    ev.sent_unix_ms = ld_unix_ms();
    qrl_error err;
    if (qrl_rpc_call_push(r->watch, &ev.base, &err) != QRL_OK) {
        QRL_LOG_WARN("learner", "VersionEvent to %s: %s", r->id, err.msg);
        qrl_rpc_call_finish(r->watch, QRL_STATUS_CANCELLED, "stream over");
        r->watch = NULL;
    }
}

void ld_control_announce(ld_core *c, Qrl__VersionEventKind kind) {
    for (int i = 0; i < C.members.n; i++) push_event(c, &C.members.r[i], kind);
}

void ld_control_publish_version(ld_core *c, const uint8_t ipc_handle[64]) {
    if (ipc_handle) {
        C.ipc_version = c->version;
        memcpy(C.ipc_handle, ipc_handle, sizeof C.ipc_handle);
    }
    /* the replicas watching versions form the sync group (ld_nccl.c); CUDA IPC replicas are
     * not in it */
    const char *ids[QRL_MAX_REPLICAS];
    size_t n = 0;
    for (int i = 0; i < C.members.n; i++)
        if (C.members.r[i].watch && !C.members.r[i].lost && !replica_ipc(c, &C.members.r[i]))
            ids[n++] = C.members.r[i].id;
    ld_nccl_plan(&c->nccl, ids, n, c->version);
    ld_control_announce(c, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    ld_nccl_send(&c->nccl, c->version);
}

static int replicas_synced(const ld_core *c) {
    int n = 0;
    for (int i = 0; i < C.members.n; i++) n += !C.members.r[i].lost && C.members.r[i].version == c->version;
    return n;
}

void ld_control_nccl_fallback(ld_core *c) {
    uint64_t failed;
    if (ld_nccl_take_failed(&c->nccl, &failed) && failed == c->version) /* NCCL failed: TCP instead */
        ld_control_announce(c, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
}

void ld_control_tick(ld_core *c) {
    qrl_members_expire(&C.members, ld_unix_ms(),
                       (uint64_t)c->s->learner.heartbeat_timeout_ms);
    if (!c->lm) return;
    ld_dispatch_counts dc = ld_dispatch_counts_now();
    ld_intake_counts ic = ld_intake_counts_now();
    qrl_learner_metrics_state s = {.groups_dispatched = dc.next_id - 1, .groups_in_flight = dc.in_flight - ic.buffered,
                                   .groups_buffered = ic.buffered, .results = ic.results,
                                   .duplicates = ic.duplicates, .dead_letters = ic.dead_letters,
                                   .replicas = qrl_members_live(&C.members), .state = ld_service_state(c),
                                   .replicas_synced = replicas_synced(c)};
    qrl_learner_metrics_tick(c->lm, &s);
}

/* ---- handlers ----------------------------------------------------------------------- */

/* A registered replica that is not lost, or NULL. */
static qrl_replica *replica_find(const char *id) {
    qrl_replica *r = qrl_members_find(&C.members, id);
    return r && !r->lost ? r : NULL;
}

static void h_register(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const Qrl__RegisterRequest *rq = (const Qrl__RegisterRequest *)req;
    qrl_replica *r;
    qrl_error err;
    if (qrl_members_register(&C.members, rq->replica, rq->have_version, ld_unix_ms(), &r, &err) != QRL_OK)
        return qrl_rpc_call_finish(call, err.status, "%s", err.msg);
    QRL_LOG_INFO("learner", "replica registered id=%s have_version=%" PRIu64 " control=%s replicas=%d", r->id,
                 rq->have_version, r->info->control_addr, qrl_members_live(&C.members));
    ld_nccl_note(&c->nccl, r->id, rq->replica->nccl);
    Qrl__RegisterResponse resp = QRL__REGISTER_RESPONSE__INIT;
    resp.replica_id = r->id;
    resp.run_id = c->run_id;
    resp.current_version = c->version;
    resp.heartbeat_interval_ms = (uint32_t)c->s->learner.heartbeat_interval_ms;
    resp.heartbeat_timeout_ms = (uint32_t)c->s->learner.heartbeat_timeout_ms;
    resp.kafka_brokers = (char *)c->s->kafka.bootstrap;
    resp.prompts_topic = (char *)c->prompts_topic;
    resp.results_topic = (char *)c->results_topic;
    resp.dlq_topic = (char *)c->dlq_topic;
    resp.max_staleness = (uint32_t)c->s->learner.max_staleness;
    resp.mode = (char *)MODE_NAMES[c->s->learner.mode];
    qrl_rpc_call_reply(call, &resp.base);
}

static void h_heartbeat(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const Qrl__HeartbeatRequest *rq = (const Qrl__HeartbeatRequest *)req;
    qrl_replica *r = replica_find(rq->replica_id ? rq->replica_id : "");
    if (r) qrl_members_heartbeat(r, rq->status, ld_unix_ms());
    Qrl__HeartbeatResponse resp = QRL__HEARTBEAT_RESPONSE__INIT;
    resp.known = r != NULL;
    resp.current_version = c->version;
    qrl_rpc_call_reply(call, &resp.base);
}

static void on_watch_close(qrl_rpc_call_t *call, void *user) {
    for (int i = 0; i < C.members.n; i++)
        if (C.members.r[i].watch == call) C.members.r[i].watch = NULL;
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client went away");
}

static void h_watch(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const Qrl__WatchVersionsRequest *rq = (const Qrl__WatchVersionsRequest *)req;
    qrl_replica *r = replica_find(rq->replica_id ? rq->replica_id : "");
    if (!r) return qrl_rpc_call_finish(call, QRL_STATUS_NOT_FOUND, "replica '%s' is not registered",
                                       rq->replica_id ? rq->replica_id : "");
    if (r->watch) qrl_rpc_call_finish(r->watch, QRL_STATUS_CANCELLED, "replaced by a newer stream");
    r->watch = call;
    qrl_rpc_call_on_close(call, on_watch_close, c);
    /* a replica behind the current version (a late joiner) gets it at once */
    if (rq->have_version < c->version)
        push_event(c, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    if (c->finished && r->watch) push_event(c, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
}

void ld_control_status(ld_core *c, qrl_rpc_call_t *call) {
    ld_dispatch_counts dc = ld_dispatch_counts_now();
    ld_intake_counts ic = ld_intake_counts_now();
    Qrl__LearnerStatus s = QRL__LEARNER_STATUS__INIT;
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = dc.epoch;
    pos.index = dc.cursor;
    pos.source = (char *)c->dataset_path;
    s.state = ld_service_state(c);
    s.version = c->version;
    s.step = c->step;
    s.run_id = c->run_id;
    s.mode = (char *)MODE_NAMES[c->s->learner.mode];
    s.replicas = (uint32_t)qrl_members_live(&C.members);
    s.replicas_synced = (uint32_t)replicas_synced(c);
    s.lr = c->s->learner.lr;
    s.groups_in_flight = dc.in_flight - ic.buffered;
    s.groups_buffered = ic.buffered;
    s.quota = c->T;
    s.position = &pos;
    s.train_tokens_per_s = c->last_train_tps;
    s.reward_mean = (float)c->last_reward;
    s.accuracy = (float)c->last_accuracy;
    s.uptime_s = (ld_unix_ms() - c->started_ms) / 1000;
    for (int i = 0; i < C.members.n; i++) /* the live replicas' decode rates, from heartbeats */
        if (!C.members.r[i].lost && C.members.r[i].status)
            s.rollout_tokens_per_s += C.members.r[i].status->tokens_per_s;
    uint64_t ck_step;
    const char *ck_dir;
    if (ld_ckpt_last(&ck_step, &ck_dir)) {
        s.last_checkpoint_step = ck_step;
        s.last_checkpoint_path = (char *)ck_dir;
    }
    qrl_rpc_call_reply(call, &s.base);
}

const char *ld_control_pause(ld_core *c, bool pause) {
    c->paused = pause;
    if (pause) QRL_LOG_INFO("learner", "paused: no more dispatch (in-flight groups are still trained)");
    else QRL_LOG_INFO("learner", "resumed");
    return pause ? "dispatch paused" : "dispatch resumed";
}

static void h_list_replicas(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_members_reply_list(call, &C.members);
}

/* Drain one replica ("" = every one): its SHUTDOWN event makes it finish the groups it
 * holds, deliver their results and exit (docs/rollout-daemon.md "Drain"). */
static void h_drain(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *c = user;
    const char *id = ((const Qrl__DrainRequest *)req)->replica_id;
    id = id ? id : "";
    int told = 0;
    for (int i = 0; i < C.members.n; i++) {
        qrl_replica *r = &C.members.r[i];
        if (r->lost || (*id && strcmp(r->id, id) != 0)) continue;
        if (!r->watch)
            return qrl_rpc_call_finish(call, QRL_STATUS_BUSY, "replica '%s' has no open WatchVersions "
                                       "stream yet; try again", r->id);
        push_event(c, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
        r->draining = true;
        told++;
    }
    if (*id && !told)
        return qrl_rpc_call_finish(call, QRL_STATUS_NOT_FOUND, "replica '%s' is not registered (or lost)", id);
    QRL_LOG_INFO("learner", "drain %s: %d replica(s) told to finish their groups and stop", *id ? id : "all", told);
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    char msg[200];
    snprintf(msg, sizeof msg, "%d replica(s) draining", told);
    r.message = msg;
    qrl_rpc_call_reply(call, &r.base);
}

void ld_control_handle(ld_core *c, qrl_service_t *svc) {
    qrl_service_handle(svc, QRL_RPC_LEARNER_REGISTER, h_register, c);
    qrl_service_handle(svc, QRL_RPC_LEARNER_HEARTBEAT, h_heartbeat, c);
    qrl_service_handle(svc, QRL_RPC_LEARNER_WATCH_VERSIONS, h_watch, c);
    qrl_service_handle(svc, QRL_RPC_LEARNER_LIST_REPLICAS, h_list_replicas, c);
    qrl_service_handle(svc, QRL_RPC_LEARNER_DRAIN, h_drain, c);
}
