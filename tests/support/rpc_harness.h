/* Test harness of the rpc layer: one rpc server on a libuv loop thread with test handlers,
 * driven from the test thread with the blocking client.  Header-only, for the rpc test
 * binaries (tests/unit/test_rpc*.c); each binary has its own harness state `H`.
 *
 * Handlers (loop thread): Learner.Status counts calls (step = count); Learner.Set goes
 * through qrl_rpc_call_config_set on a table with one runtime-mutable key
 * (rollout.max_staleness, 0..16, default 4) and one fixed key (rollout.kv_cache);
 * Learner.Pause with reason "hang" never answers; WatchVersions keeps "replica-*" streams;
 * Learner.Shutdown with reason "now" replies and closes the server; every other method
 * answers an empty response.  All waits are bounded. */
#ifndef QRL_TESTS_SUPPORT_RPC_HARNESS_H
#define QRL_TESTS_SUPPORT_RPC_HARNESS_H

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/log.h"
#include "rpc/rpc.h"
#include "wire/wire.h"

#define TOKEN "s3cret-token-0123456789"

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- harness: one server on a loop thread --------------------------------------------- */

static const qrl_config_entry test_table[] = {
    {"rollout.max_staleness", QRL_CONFIG_TYPE_INT, "4", 0, 16, NULL, true, "mutable"},
    {"rollout.kv_cache", QRL_CONFIG_TYPE_ENUM, "bf16", 0, 0, "bf16|int8|int4", false, "immutable"},
};

#define MAX_HELD 16
typedef struct harness {
    uv_loop_t loop;
    uv_async_t run_async;
    uv_thread_t thread;
    uv_mutex_t mu;
    uv_cond_t cv;
    void (*fn)(void *);
    void *arg;
    bool fn_done;
    qrl_rpc_server_t *server;
    char target[64];
    /* loop-thread state of the handlers */
    qrl_config_t *cfg;
    int status_count;
    qrl_rpc_call_t *hung[MAX_HELD];
    qrl_rpc_call_t *streams[MAX_HELD];
    int nhung, nstreams;
    atomic_int closed; /* on_close notices seen */
    atomic_bool server_gone;
} harness;

static harness H;

static inline void remove_from(qrl_rpc_call_t **list, int *n, qrl_rpc_call_t *c) {
    for (int i = 0; i < *n; i++)
        if (list[i] == c) {
            list[i] = list[--*n];
            return;
        }
}

static inline void on_client_gone(qrl_rpc_call_t *call, void *user) {
    atomic_fetch_add(&H.closed, 1);
    remove_from(H.hung, &H.nhung, call);
    remove_from(H.streams, &H.nstreams, call);
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client left");
}

static inline void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    Qrl__LearnerStatus r = QRL__LEARNER_STATUS__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
    r.version = 7;
    r.step = (uint64_t)++H.status_count;
    r.mode = "overlap";
    qrl_rpc_call_reply(call, &r.base);
}

static inline void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_rpc_call_config_set(call, H.cfg, (const Qrl__SetRequest *)req);
}

/* Pause with reason "hang" never answers (the deadline test); others answer at once. */
static inline void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__PauseRequest *p = (const Qrl__PauseRequest *)req;
    if (p->reason && strcmp(p->reason, "hang") == 0 && H.nhung < MAX_HELD) {
        H.hung[H.nhung++] = call;
        qrl_rpc_call_on_close(call, on_client_gone, NULL);
        return;
    }
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    qrl_rpc_call_reply(call, &r.base);
}

/* WatchVersions: replica ids "replica-*" get a stream; anything else is refused. */
static inline void h_watch(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__WatchVersionsRequest *w = (const Qrl__WatchVersionsRequest *)req;
    if (!w->replica_id || strncmp(w->replica_id, "replica-", 8) != 0 || H.nstreams >= MAX_HELD) {
        qrl_rpc_call_finish(call, QRL_STATUS_INVALID_ARGUMENT, "replica_id required");
        return;
    }
    H.streams[H.nstreams++] = call;
    qrl_rpc_call_on_close(call, on_client_gone, NULL);
}

/* Every other method: an empty response of its type. */
static inline void h_default(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const ProtobufCMessageDescriptor *d = qrl_rpc_call_method(call)->response;
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    cr_assert(m);
    d->message_init(m);
    qrl_rpc_call_reply(call, m);
    free(m);
}

/* Shutdown with reason "now" answers, then closes the server at once: the reply must
 * still arrive.  Other reasons (garbage) only answer. */
static inline void on_server_closed(qrl_rpc_server_t *s, void *user);
static inline void h_shutdown(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__ShutdownRequest *q = (const Qrl__ShutdownRequest *)req;
    bool now = q->reason && strcmp(q->reason, "now") == 0;
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_STOPPED;
    r.message = "bye";
    qrl_rpc_call_reply(call, &r.base);
    if (!now) return;
    qrl_rpc_server_close(H.server, on_server_closed, NULL);
    H.server = NULL;
}

static inline void on_run_async(uv_async_t *a) {
    uv_mutex_lock(&H.mu);
    void (*fn)(void *) = H.fn;
    void *arg = H.arg;
    uv_mutex_unlock(&H.mu);
    if (fn) fn(arg);
    uv_mutex_lock(&H.mu);
    H.fn = NULL;
    H.fn_done = true;
    uv_cond_signal(&H.cv);
    uv_mutex_unlock(&H.mu);
}

/* Run fn(arg) on the loop thread and wait (at most 10 s) until it has run. */
static inline void on_loop(void (*fn)(void *), void *arg) {
    uv_mutex_lock(&H.mu);
    H.fn = fn;
    H.arg = arg;
    H.fn_done = false;
    uv_async_send(&H.run_async);
    double until = now_s() + 10;
    while (!H.fn_done && now_s() < until) uv_cond_timedwait(&H.cv, &H.mu, 100 * 1000000ull);
    bool done = H.fn_done;
    uv_mutex_unlock(&H.mu);
    cr_assert(done, "the loop did not run a task within 10 s");
}

static inline void loop_main(void *arg) { uv_run(&H.loop, UV_RUN_DEFAULT); }

static inline void start_server(const qrl_rpc_server_opts *o) {
    qrl_log_set_level(QRL_LOG_LEVEL_WARN);
    memset(&H, 0, sizeof H);
    cr_assert_eq(uv_loop_init(&H.loop), 0);
    cr_assert_eq(uv_mutex_init(&H.mu), 0);
    cr_assert_eq(uv_cond_init(&H.cv), 0);
    cr_assert_eq(uv_async_init(&H.loop, &H.run_async, on_run_async), 0);
    qrl_error err;
    cr_assert_eq(qrl_config_new(test_table, 2, &H.cfg, &err), QRL_OK);
    qrl_rpc_server_opts def = {.token = TOKEN};
    cr_assert_eq(qrl_rpc_server_new(&H.loop, o ? o : &def, &H.server, &err), QRL_OK, "%s", err.msg);
    for (int id = 0; id < QRL_RPC_COUNT_; id++) qrl_rpc_server_handle(H.server, id, h_default, NULL);
    qrl_rpc_server_handle(H.server, QRL_RPC_LEARNER_STATUS, h_status, NULL);
    qrl_rpc_server_handle(H.server, QRL_RPC_LEARNER_SET, h_set, NULL);
    qrl_rpc_server_handle(H.server, QRL_RPC_LEARNER_PAUSE, h_pause, NULL);
    qrl_rpc_server_handle(H.server, QRL_RPC_LEARNER_WATCH_VERSIONS, h_watch, NULL);
    qrl_rpc_server_handle(H.server, QRL_RPC_LEARNER_SHUTDOWN, h_shutdown, NULL);
    cr_assert_eq(qrl_rpc_server_start(H.server, &err), QRL_OK, "%s", err.msg);
    snprintf(H.target, sizeof H.target, "127.0.0.1:%d", qrl_rpc_server_port(H.server));
    cr_assert_eq(uv_thread_create(&H.thread, loop_main, NULL), 0);
}

static inline void on_server_closed(qrl_rpc_server_t *s, void *user) {
    atomic_store(&H.server_gone, true);
    uv_close((uv_handle_t *)&H.run_async, NULL);
}

static inline void close_task(void *arg) {
    if (!H.server) return; /* a handler closed it */
    qrl_rpc_server_close(H.server, on_server_closed, NULL);
    H.server = NULL;
}

/* Close the server and end the loop thread (the test's timeout bounds the join). */
static inline void stop_server(void) {
    if (!atomic_load(&H.server_gone)) on_loop(close_task, NULL);
    uv_thread_join(&H.thread);
    cr_assert_eq(uv_loop_close(&H.loop), 0, "a handle was left open");
    qrl_config_destroy(H.cfg);
    uv_cond_destroy(&H.cv);
    uv_mutex_destroy(&H.mu);
}

static inline qrl_rpc_client_t *client(const char *token) {
    qrl_rpc_client_opts o = {.target = H.target, .token = token};
    qrl_rpc_client_t *c;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_new(&o, &c, &err), QRL_OK, "%s", err.msg);
    return c;
}

static inline qrl_status call_status(qrl_rpc_client_t *c, uint64_t *step, qrl_error *err) {
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp;
    qrl_status st = qrl_rpc_client_call(c, QRL_RPC_LEARNER_STATUS, &rq.base, 3000, &resp, err);
    if (st != QRL_OK) return st;
    *step = ((Qrl__LearnerStatus *)resp)->step;
    qrl_wire_free(resp);
    return QRL_OK;
}

static inline qrl_status call_set(qrl_rpc_client_t *c, const char *key, const char *value,
                           Qrl__SetResponse **out, qrl_error *err) {
    Qrl__SetRequest rq = QRL__SET_REQUEST__INIT;
    rq.key = (char *)key;
    rq.value = (char *)value;
    ProtobufCMessage *resp = NULL;
    qrl_status st = qrl_rpc_client_call(c, QRL_RPC_LEARNER_SET, &rq.base, 3000, &resp, err);
    if (out) *out = (Qrl__SetResponse *)resp;
    else qrl_wire_free(resp);
    return st;
}

static char staleness_text[64];
static inline void read_staleness(void *arg) {
    qrl_config_value_text(H.cfg, "rollout.max_staleness", staleness_text, sizeof staleness_text);
}
static inline const char *staleness(void) {
    on_loop(read_staleness, NULL);
    return staleness_text;
}

/* ---- streams -------------------------------------------------------------------------- */

typedef struct push_args {
    int n;            /* events per stream */
    uint64_t first;   /* version of the first */
    size_t pad;       /* bytes of weight_addr, to make events big */
    int ok, failed;
    double max_task_s;
} push_args;

static inline void push_task(void *arg) {
    push_args *a = arg;
    double t0 = now_s();
    char *pad = NULL;
    if (a->pad) {
        pad = malloc(a->pad + 1);
        cr_assert(pad);
        memset(pad, 'p', a->pad);
        pad[a->pad] = '\0';
    }
    for (int i = 0; i < a->n; i++) {
        Qrl__VersionEvent ev = QRL__VERSION_EVENT__INIT;
        ev.kind = QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION;
        ev.version = a->first + (uint64_t)i;
        ev.weight_addr = pad ? pad : "";
        for (int k = H.nstreams - 1; k >= 0; k--) { /* swap-removal keeps this walk valid */
            qrl_rpc_call_t *c = H.streams[k];
            qrl_error e;
            if (qrl_rpc_call_push(c, &ev.base, &e) == QRL_OK) {
                a->ok++;
                continue;
            }
            cr_assert(strstr(e.msg, "/qrl.Learner/WatchVersions"), "%s", e.msg);
            a->failed++;
            remove_from(H.streams, &H.nstreams, c);
            qrl_rpc_call_finish(c, QRL_STATUS_CANCELLED, "dropped");
        }
    }
    free(pad);
    double dt = now_s() - t0;
    if (dt > a->max_task_s) a->max_task_s = dt;
}

static inline void end_streams_task(void *arg) {
    while (H.nstreams > 0) qrl_rpc_call_finish(H.streams[--H.nstreams], QRL_OK, "done");
}

static int nstreams_v;
static inline void read_nstreams(void *arg) { nstreams_v = H.nstreams; }
static inline void wait_streams(int want) {
    for (int i = 0; i < 300; i++) {
        on_loop(read_nstreams, NULL);
        if (nstreams_v == want) return;
        usleep(10000);
    }
    cr_assert_fail("the loop holds %d streams, want %d", nstreams_v, want);
}

static inline qrl_rpc_client_stream_t *open_watch(qrl_rpc_client_t *c, const char *replica) {
    Qrl__WatchVersionsRequest w = QRL__WATCH_VERSIONS_REQUEST__INIT;
    w.replica_id = (char *)replica;
    qrl_rpc_client_stream_t *s;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_stream_open(c, QRL_RPC_LEARNER_WATCH_VERSIONS, &w.base, 0, &s, &err),
                 QRL_OK, "%s", err.msg);
    return s;
}

static inline void expect_event(qrl_rpc_client_stream_t *s, uint64_t version) {
    ProtobufCMessage *m;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_stream_next(s, 3000, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_not_null(m, "stream ended early");
    Qrl__VersionEvent *ev = (Qrl__VersionEvent *)m;
    cr_assert_eq(ev->version, version);
    cr_assert_eq(ev->kind, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    qrl_wire_free(m);
}

#endif
