/* The rpc layer (common/rpc/rpc.h): a real gRPC server on 127.0.0.1 (a free port) whose
 * handlers run on a libuv loop thread, driven by the blocking client from the test thread.
 * Checks round trips, deadlines, auth, Set, size limits, garbage payloads, streams (pushes,
 * disconnects, overflow), TLS and mutual TLS, tokens and status mapping.
 * Every wait is bounded; every server and thread started is stopped. */
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
#include "support/test_files.h"
#include "wire/wire.h"

#define TOKEN "s3cret-token-0123456789"

static double now_s(void) {
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
} harness;

static harness H;

static void remove_from(qrl_rpc_call_t **list, int *n, qrl_rpc_call_t *c) {
    for (int i = 0; i < *n; i++)
        if (list[i] == c) {
            list[i] = list[--*n];
            return;
        }
}

static void on_client_gone(qrl_rpc_call_t *call, void *user) {
    atomic_fetch_add(&H.closed, 1);
    remove_from(H.hung, &H.nhung, call);
    remove_from(H.streams, &H.nstreams, call);
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client left");
}

static void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    Qrl__LearnerStatus r = QRL__LEARNER_STATUS__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
    r.version = 7;
    r.step = (uint64_t)++H.status_count;
    r.mode = "overlap";
    qrl_rpc_call_reply(call, &r.base);
}

static void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_rpc_call_config_set(call, H.cfg, (const Qrl__SetRequest *)req);
}

/* Pause with reason "hang" never answers (the deadline test); others answer at once. */
static void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
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
static void h_watch(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__WatchVersionsRequest *w = (const Qrl__WatchVersionsRequest *)req;
    if (!w->replica_id || strncmp(w->replica_id, "replica-", 8) != 0 || H.nstreams >= MAX_HELD) {
        qrl_rpc_call_finish(call, QRL_STATUS_INVALID_ARGUMENT, "replica_id required");
        return;
    }
    H.streams[H.nstreams++] = call;
    qrl_rpc_call_on_close(call, on_client_gone, NULL);
}

/* Every other method: an empty response of its type. */
static void h_default(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const ProtobufCMessageDescriptor *d = qrl_rpc_call_method(call)->response;
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    cr_assert(m);
    d->message_init(m);
    qrl_rpc_call_reply(call, m);
    free(m);
}

static void on_run_async(uv_async_t *a) {
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
static void on_loop(void (*fn)(void *), void *arg) {
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

static void loop_main(void *arg) { uv_run(&H.loop, UV_RUN_DEFAULT); }

static void start_server(const qrl_rpc_server_opts *o) {
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
    cr_assert_eq(qrl_rpc_server_start(H.server, &err), QRL_OK, "%s", err.msg);
    snprintf(H.target, sizeof H.target, "127.0.0.1:%d", qrl_rpc_server_port(H.server));
    cr_assert_eq(uv_thread_create(&H.thread, loop_main, NULL), 0);
}

static void on_server_closed(qrl_rpc_server_t *s, void *user) {
    uv_close((uv_handle_t *)&H.run_async, NULL);
}

static void close_task(void *arg) {
    qrl_rpc_server_close(H.server, on_server_closed, NULL);
    H.server = NULL;
}

/* Close the server and end the loop thread (the test's timeout bounds the join). */
static void stop_server(void) {
    on_loop(close_task, NULL);
    uv_thread_join(&H.thread);
    cr_assert_eq(uv_loop_close(&H.loop), 0, "a handle was left open");
    qrl_config_destroy(H.cfg);
    uv_cond_destroy(&H.cv);
    uv_mutex_destroy(&H.mu);
}

static qrl_rpc_client_t *client(const char *token) {
    qrl_rpc_client_opts o = {.target = H.target, .token = token};
    qrl_rpc_client_t *c;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_new(&o, &c, &err), QRL_OK, "%s", err.msg);
    return c;
}

static qrl_status call_status(qrl_rpc_client_t *c, uint64_t *step, qrl_error *err) {
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp;
    qrl_status st = qrl_rpc_client_call(c, QRL_RPC_LEARNER_STATUS, &rq.base, 3000, &resp, err);
    if (st != QRL_OK) return st;
    *step = ((Qrl__LearnerStatus *)resp)->step;
    qrl_wire_free(resp);
    return QRL_OK;
}

static qrl_status call_set(qrl_rpc_client_t *c, const char *key, const char *value,
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
static void read_staleness(void *arg) {
    qrl_config_value_text(H.cfg, "rollout.max_staleness", staleness_text, sizeof staleness_text);
}
static const char *staleness(void) {
    on_loop(read_staleness, NULL);
    return staleness_text;
}

/* ---- unary, auth, Set ----------------------------------------------------------------- */

Test(rpc, unary_round_trip_and_open_reads, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(NULL); /* no token: Status is read-only */
    qrl_error err;
    uint64_t step = 0;
    for (uint64_t i = 1; i <= 3; i++) {
        cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(step, i, "the handler's counter travels back");
    }
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp;
    cr_assert_eq(qrl_rpc_client_call(c, QRL_RPC_LEARNER_STATUS, &rq.base, 3000, &resp, &err), QRL_OK);
    Qrl__LearnerStatus *ls = (Qrl__LearnerStatus *)resp;
    cr_assert_eq(ls->version, 7);
    cr_assert_eq(ls->state, QRL__SERVICE_STATE__SERVICE_STATE_RUNNING);
    cr_assert_str_eq(ls->mode, "overlap");
    cr_assert_eq(ls->schema_version, QRL_WIRE_SCHEMA_VERSION);
    qrl_wire_free(resp);
    qrl_rpc_server_stats stats;
    qrl_rpc_server_get_stats(H.server, &stats);
    cr_assert_eq(stats.handled, 4);
    cr_assert_eq(stats.unauthenticated + stats.denied + stats.malformed, 0);
    qrl_rpc_client_destroy(c);
    stop_server();
}

Test(rpc, mutating_calls_need_the_right_token, .timeout = 30) {
    start_server(NULL);
    qrl_error err;
    qrl_rpc_client_t *none = client(NULL), *wrong = client("s3cret-token-0123456780"),
                     *shorter = client("s3cret"), *right = client(TOKEN);
    cr_assert_eq(call_set(none, "rollout.max_staleness", "9", NULL, &err), QRL_STATUS_PERMISSION);
    cr_assert(strstr(err.msg, "UNAUTHENTICATED") && strstr(err.msg, "/qrl.Learner/Set") &&
                  strstr(err.msg, H.target) && strstr(err.msg, "Bearer"),
              "%s", err.msg);
    cr_assert_eq(call_set(wrong, "rollout.max_staleness", "9", NULL, &err), QRL_STATUS_PERMISSION);
    cr_assert(strstr(err.msg, "PERMISSION_DENIED"), "%s", err.msg);
    cr_assert_eq(call_set(shorter, "rollout.max_staleness", "9", NULL, &err), QRL_STATUS_PERMISSION);
    cr_assert(strstr(err.msg, "PERMISSION_DENIED"), "%s", err.msg);
    cr_assert_str_eq(staleness(), "4", "a refused call changes nothing");
    qrl_rpc_server_stats stats;
    qrl_rpc_server_get_stats(H.server, &stats);
    cr_assert_eq(stats.unauthenticated, 1);
    cr_assert_eq(stats.denied, 2);
    cr_assert_eq(stats.handled, 0, "no handler ran");

    Qrl__SetResponse *r;
    cr_assert_eq(call_set(right, "rollout.max_staleness", "9", &r, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(r->key, "rollout.max_staleness");
    cr_assert_str_eq(r->old_value, "4");
    cr_assert_str_eq(r->new_value, "9");
    qrl_wire_free(&r->base);
    cr_assert_str_eq(staleness(), "9");
    qrl_rpc_client_destroy(none);
    qrl_rpc_client_destroy(wrong);
    qrl_rpc_client_destroy(shorter);
    qrl_rpc_client_destroy(right);
    stop_server();
}

Test(rpc, other_schemes_and_token_for_reads, .timeout = 30) {
    qrl_rpc_server_opts o = {.token = TOKEN, .token_for_reads = true};
    start_server(&o);
    qrl_error err;
    uint64_t step;
    qrl_rpc_client_t *none = client(NULL), *right = client(TOKEN);
    cr_assert_eq(call_status(none, &step, &err), QRL_STATUS_PERMISSION);
    cr_assert(strstr(err.msg, "UNAUTHENTICATED"), "%s", err.msg);
    cr_assert_eq(call_status(right, &step, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(step, 1);
    qrl_rpc_client_destroy(none);
    qrl_rpc_client_destroy(right);
    stop_server();
}

Test(rpc, set_errors_leave_the_value, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    cr_assert_eq(call_set(c, "rollout.max_stalenes", "5", NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "INVALID_ARGUMENT") && strstr(err.msg, "unknown key") &&
                  strstr(err.msg, "rollout.max_staleness"),
              "suggestion expected: %s", err.msg);
    cr_assert_eq(call_set(c, "rollout.kv_cache", "int8", NULL, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "FAILED_PRECONDITION") && strstr(err.msg, "cannot be changed at run time"),
              "%s", err.msg);
    cr_assert_eq(call_set(c, "rollout.max_staleness", "17", NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "is outside [0, 16]"), "%s", err.msg);
    cr_assert_eq(call_set(c, "rollout.max_staleness", "abc", NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(call_set(c, "", "1", NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(staleness(), "4");
    qrl_rpc_client_destroy(c);
    stop_server();
}

/* ---- deadlines, limits, garbage ------------------------------------------------------- */

static void nop_task(void *arg) {}

static int hung_count_v;
static void hung_count(void *arg) { hung_count_v = H.nhung; }

Test(rpc, deadline_against_a_silent_handler, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    Qrl__PauseRequest rq = QRL__PAUSE_REQUEST__INIT;
    rq.reason = "hang";
    ProtobufCMessage *resp;
    double t0 = now_s();
    cr_assert_eq(qrl_rpc_client_call(c, QRL_RPC_LEARNER_PAUSE, &rq.base, 200, &resp, &err),
                 QRL_STATUS_TIMEOUT);
    double dt = now_s() - t0;
    cr_assert(dt >= 0.15 && dt < 1.5, "TIMEOUT after %.3f s, want ~0.2 s", dt);
    cr_assert(qrl_status_retriable(QRL_STATUS_TIMEOUT));
    cr_assert(strstr(err.msg, "DEADLINE_EXCEEDED") && strstr(err.msg, "/qrl.Learner/Pause"), "%s",
              err.msg);
    /* the loop still answers, at once */
    t0 = now_s();
    on_loop(nop_task, NULL);
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(step, 1);
    cr_assert(now_s() - t0 < 1.0, "loop round trip and a call took %.3f s", now_s() - t0);
    /* the server saw the client go and the handler let go of the call */
    for (int i = 0; i < 300 && atomic_load(&H.closed) < 1; i++) usleep(10000);
    cr_assert_eq(atomic_load(&H.closed), 1, "on_close did not run");
    on_loop(hung_count, NULL);
    cr_assert_eq(hung_count_v, 0);
    qrl_rpc_client_destroy(c);
    stop_server();
}

Test(rpc, busy_server_refuses_with_unavailable, .timeout = 30) {
    qrl_rpc_server_opts o = {.token = TOKEN, .max_calls = 1};
    start_server(&o);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    Qrl__PauseRequest rq = QRL__PAUSE_REQUEST__INIT;
    rq.reason = "hang";
    ProtobufCMessage *resp;
    qrl_rpc_client_stream_t *s; /* hold one call open through a stream, then overflow */
    Qrl__WatchVersionsRequest w = QRL__WATCH_VERSIONS_REQUEST__INIT;
    w.replica_id = "replica-0";
    cr_assert_eq(qrl_rpc_client_stream_open(c, QRL_RPC_LEARNER_WATCH_VERSIONS, &w.base, 0, &s, &err),
                 QRL_OK, "%s", err.msg);
    for (int i = 0; i < 300; i++) { /* until the loop holds it */
        qrl_rpc_server_stats st;
        qrl_rpc_server_get_stats(H.server, &st);
        if (st.handled == 1) break;
        usleep(10000);
    }
    cr_assert_eq(qrl_rpc_client_call(c, QRL_RPC_LEARNER_PAUSE, &rq.base, 2000, &resp, &err),
                 QRL_STATUS_NETWORK);
    cr_assert(strstr(err.msg, "UNAVAILABLE") && strstr(err.msg, "busy"), "%s", err.msg);
    qrl_rpc_client_stream_close(s);
    qrl_rpc_client_destroy(c);
    stop_server();
}

Test(rpc, oversized_request_is_refused, .timeout = 30) {
    qrl_rpc_server_opts o = {.token = TOKEN, .max_request_bytes = 64 << 10};
    start_server(&o);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    char *big = malloc(100 << 10);
    cr_assert(big);
    memset(big, 'x', (100 << 10) - 1);
    big[(100 << 10) - 1] = '\0';
    cr_assert_eq(call_set(c, "rollout.max_staleness", big, NULL, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "RESOURCE_EXHAUSTED"), "%s", err.msg);
    free(big);
    cr_assert_str_eq(staleness(), "4");
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
    qrl_rpc_client_destroy(c);
    stop_server();
}

Test(rpc, unknown_method_is_unimplemented, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    uint8_t req[2] = {0x08, 0x01}, *resp;
    size_t n;
    cr_assert_eq(qrl_rpc_client_call_raw(c, "/qrl.Learner/Nope", req, 2, 2000, &resp, &n, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "UNIMPLEMENTED") && strstr(err.msg, "/qrl.Learner/Nope"), "%s", err.msg);
    qrl_rpc_client_destroy(c);
    stop_server();
}

/* xorshift64*: reproducible garbage */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* One garbage payload: random bytes, a valid encoding mutated, or a valid prefix with a
 * random tail (valid: schema_version 1, then field 2 as a string when the type has one). */
static size_t garbage(uint8_t *buf, size_t cap) {
    static const uint8_t valid[] = {0x08, 0x01, 0x12, 0x03, 'a', 'b', 'c'};
    size_t n;
    switch (rnd() % 4) {
    case 0:
        n = rnd() % 48;
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
        return n;
    case 1:
        n = sizeof valid;
        memcpy(buf, valid, n);
        for (int k = 1 + rnd() % 3; k > 0; k--) buf[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
        return rnd() % 2 ? n : rnd() % (n + 1);
    case 2:
        n = 2 + rnd() % 32;
        memcpy(buf, valid, 2);
        for (size_t i = 2; i < n; i++) buf[i] = (uint8_t)rnd();
        return n;
    default: /* wire-type-valid soup of small fields */
        n = 0;
        while (n + 3 <= cap && n < 40) {
            buf[n++] = (uint8_t)((1 + rnd() % 20) << 3 | (rnd() % 3));
            buf[n++] = (uint8_t)(rnd() % 4);
        }
        return n;
    }
}

static int status_count_v;
static void read_status_count(void *arg) { status_count_v = H.status_count; }

Test(rpc, garbage_payloads_leave_the_server_correct, .timeout = 120) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    enum { PER_METHOD = 1000 };
    uint8_t buf[128], *resp;
    size_t n;
    int ok = 0, invalid = 0, status_ok = 0;
    double t0 = now_s();
    for (int id = 0; id < QRL_RPC_COUNT_; id++) {
        const qrl_rpc_method *m = qrl_rpc_method_get(id);
        for (int i = 0; i < PER_METHOD; i++) {
            size_t len = garbage(buf, sizeof buf);
            qrl_status st = qrl_rpc_client_call_raw(c, m->path, buf, len, 5000, &resp, &n, &err);
            if (st == QRL_OK) {
                ok++;
                free(resp);
                if (id == QRL_RPC_LEARNER_STATUS) status_ok++;
            } else {
                cr_assert_eq(st, QRL_STATUS_INVALID_ARGUMENT, "%s payload %d: %s", m->path, i, err.msg);
                invalid++;
            }
        }
        cr_assert(now_s() - t0 < 100, "garbage run too slow");
    }
    double dt = now_s() - t0;
    fprintf(stderr, "garbage: %d calls in %.2f s (%.0f us/call): %d ok, %d invalid\n",
            ok + invalid, dt, dt * 1e6 / (ok + invalid), ok, invalid);
    cr_assert(invalid > QRL_RPC_COUNT_ * PER_METHOD / 4, "most garbage must be refused (%d)", invalid);
    cr_assert(ok > 0, "some garbage decodes as a valid request");
    qrl_rpc_server_stats stats;
    qrl_rpc_server_get_stats(H.server, &stats);
    cr_assert_eq(stats.calls, (uint64_t)(ok + invalid));
    cr_assert_eq(stats.malformed + stats.handled, stats.calls, "every call decoded or refused");
    cr_assert(stats.malformed > 0 && stats.handled >= (uint64_t)ok);
    /* still correct: the Status counter counts exactly the Status calls that got through */
    on_loop(read_status_count, NULL);
    cr_assert_eq(status_count_v, status_ok);
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(step, (uint64_t)status_ok + 1);
    qrl_rpc_client_destroy(c);
    stop_server();
}

/* ---- streams -------------------------------------------------------------------------- */

typedef struct push_args {
    int n;            /* events per stream */
    uint64_t first;   /* version of the first */
    size_t pad;       /* bytes of weight_addr, to make events big */
    int ok, failed;
    double max_task_s;
} push_args;

static void push_task(void *arg) {
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

static void end_streams_task(void *arg) {
    while (H.nstreams > 0) qrl_rpc_call_finish(H.streams[--H.nstreams], QRL_OK, "done");
}

static int nstreams_v;
static void read_nstreams(void *arg) { nstreams_v = H.nstreams; }
static void wait_streams(int want) {
    for (int i = 0; i < 300; i++) {
        on_loop(read_nstreams, NULL);
        if (nstreams_v == want) return;
        usleep(10000);
    }
    cr_assert_fail("the loop holds %d streams, want %d", nstreams_v, want);
}

static qrl_rpc_client_stream_t *open_watch(qrl_rpc_client_t *c, const char *replica) {
    Qrl__WatchVersionsRequest w = QRL__WATCH_VERSIONS_REQUEST__INIT;
    w.replica_id = (char *)replica;
    qrl_rpc_client_stream_t *s;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_stream_open(c, QRL_RPC_LEARNER_WATCH_VERSIONS, &w.base, 0, &s, &err),
                 QRL_OK, "%s", err.msg);
    return s;
}

static void expect_event(qrl_rpc_client_stream_t *s, uint64_t version) {
    ProtobufCMessage *m;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_stream_next(s, 3000, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_not_null(m, "stream ended early");
    Qrl__VersionEvent *ev = (Qrl__VersionEvent *)m;
    cr_assert_eq(ev->version, version);
    cr_assert_eq(ev->kind, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    qrl_wire_free(m);
}

Test(rpc, stream_receives_pushed_events, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_rpc_client_stream_t *s = open_watch(c, "replica-0");
    wait_streams(1);
    push_args a = {.n = 50, .first = 1};
    on_loop(push_task, &a);
    cr_assert_eq(a.ok, 50);
    for (uint64_t v = 1; v <= 50; v++) expect_event(s, v);
    /* nothing more yet: a short wait times out and leaves the stream open */
    ProtobufCMessage *m;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_stream_next(s, 50, &m, &err), QRL_STATUS_TIMEOUT);
    cr_assert(!qrl_rpc_client_stream_ended(s));
    on_loop(end_streams_task, NULL);
    cr_assert_eq(qrl_rpc_client_stream_next(s, 3000, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_null(m, "OK end of stream");
    cr_assert(qrl_rpc_client_stream_ended(s));
    qrl_rpc_client_stream_close(s);
    /* a stream without the token is refused like any mutating call */
    qrl_rpc_client_t *anon = client(NULL);
    s = open_watch(anon, "replica-1");
    cr_assert_eq(qrl_rpc_client_stream_next(s, 3000, &m, &err), QRL_STATUS_PERMISSION);
    cr_assert(strstr(err.msg, "UNAUTHENTICATED"), "%s", err.msg);
    qrl_rpc_client_stream_close(s);
    qrl_rpc_client_destroy(anon);
    qrl_rpc_client_destroy(c);
    stop_server();
}

Test(rpc, client_leaving_mid_stream, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *ca = client(TOKEN), *cb = client(TOKEN);
    qrl_rpc_client_stream_t *sa = open_watch(ca, "replica-a"), *sb = open_watch(cb, "replica-b");
    wait_streams(2);
    push_args a = {.n = 3, .first = 1};
    on_loop(push_task, &a);
    expect_event(sa, 1);
    qrl_rpc_client_stream_close(sa); /* cancels mid-stream */
    qrl_rpc_client_destroy(ca);      /* and the connection goes */
    for (uint64_t v = 1; v <= 3; v++) expect_event(sb, v);
    for (int i = 0; i < 300 && atomic_load(&H.closed) < 1; i++) usleep(10000);
    cr_assert_eq(atomic_load(&H.closed), 1, "the server did not notice the client leave");
    wait_streams(1);
    push_args b = {.n = 3, .first = 4};
    on_loop(push_task, &b);
    cr_assert_eq(b.ok, 3);
    cr_assert_eq(b.failed, 0);
    for (uint64_t v = 4; v <= 6; v++) expect_event(sb, v);
    uint64_t step;
    qrl_error err;
    cr_assert_eq(call_status(cb, &step, &err), QRL_OK, "%s", err.msg);
    qrl_rpc_client_stream_close(sb); /* cancelled while the server holds it: on_close again */
    for (int i = 0; i < 300 && atomic_load(&H.closed) < 2; i++) usleep(10000);
    cr_assert_eq(atomic_load(&H.closed), 2);
    qrl_rpc_client_destroy(cb);
    stop_server();
}

/* Reads a stream to its end on its own thread (the fast replica). */
typedef struct reader {
    qrl_rpc_client_stream_t *s;
    int got;
    bool in_order;
    qrl_status end;
} reader;

static void reader_main(void *arg) {
    reader *r = arg;
    r->in_order = true;
    for (int i = 0; i < 5000; i++) {
        ProtobufCMessage *m;
        qrl_error err;
        r->end = qrl_rpc_client_stream_next(r->s, 5000, &m, &err);
        if (r->end != QRL_OK || !m) return;
        if (((Qrl__VersionEvent *)m)->version != (uint64_t)r->got + 1) r->in_order = false;
        r->got++;
        qrl_wire_free(m);
    }
}

Test(rpc, slow_stream_is_dropped_not_waited_for, .timeout = 60) {
    qrl_rpc_server_opts o = {.token = TOKEN, .max_stream_queue = 4};
    start_server(&o);
    qrl_rpc_client_t *c = client(TOKEN), *cf = client(TOKEN);
    qrl_rpc_client_stream_t *s = open_watch(c, "replica-slow"); /* never reads until dropped */
    reader fast = {.s = open_watch(cf, "replica-fast")};
    wait_streams(2);
    uv_thread_t th;
    cr_assert_eq(uv_thread_create(&th, reader_main, &fast), 0);
    push_args a = {.n = 1, .pad = 256 << 10};
    int rounds = 0;
    double t0 = now_s();
    for (; rounds < 2000 && a.failed == 0; rounds++) {
        a.first = (uint64_t)rounds + 1;
        on_loop(push_task, &a);
        usleep(2000); /* paced: a reading client keeps up */
    }
    double dt = now_s() - t0;
    on_loop(end_streams_task, NULL); /* the fast stream ends with OK */
    uv_thread_join(&th);
    fprintf(stderr, "slow stream: dropped after %d pushes of 256 KiB in %.2f s, longest push "
            "task %.2f ms; fast reader got %d\n", rounds, dt, a.max_task_s * 1e3, fast.got);
    cr_assert_eq(a.failed, 1, "the slow stream was never dropped in %d pushes", rounds);
    cr_assert(rounds > 4, "dropped after %d pushes: before the transport took any", rounds);
    cr_assert(a.max_task_s < 0.5, "a push held the loop %.3f s", a.max_task_s);
    cr_assert_eq(fast.got, rounds, "the reading client got every event");
    cr_assert(fast.in_order);
    cr_assert_eq(fast.end, QRL_OK, "the fast stream ended cleanly");
    qrl_rpc_server_stats stats;
    qrl_rpc_server_get_stats(H.server, &stats);
    cr_assert_eq(stats.streams_dropped, 1);
    /* the slow client gets what was sent, then UNAVAILABLE naming the drop */
    ProtobufCMessage *m;
    qrl_error err;
    qrl_status st = QRL_OK;
    int got = 0;
    for (int i = 0; i <= rounds && st == QRL_OK; i++) {
        st = qrl_rpc_client_stream_next(s, 3000, &m, &err);
        if (st == QRL_OK && m) {
            cr_assert_eq(((Qrl__VersionEvent *)m)->version, (uint64_t)got + 1, "in order");
            got++;
            qrl_wire_free(m);
        } else if (st == QRL_OK) {
            cr_assert_fail("a dropped stream must not end with OK");
        }
    }
    cr_assert_eq(st, QRL_STATUS_NETWORK, "%s", err.msg);
    cr_assert(strstr(err.msg, "stream dropped"), "%s", err.msg);
    cr_assert(got < rounds, "got %d of %d", got, rounds);
    qrl_rpc_client_stream_close(s);
    qrl_rpc_client_stream_close(fast.s);
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
    qrl_rpc_client_destroy(c);
    qrl_rpc_client_destroy(cf);
    stop_server();
}

/* ---- TLS ------------------------------------------------------------------------------ */

/* Self-signed EC certificate for localhost / 127.0.0.1 as dir/name.{crt,key}. */
static void make_cert(const char *dir, const char *name) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout %s/%s.key -out %s/%s.crt -days 2 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1",
             dir, name, dir, name);
    cr_assert_eq(system(cmd), 0, "openssl could not make a certificate: %s", cmd);
}

static char tls_dir[64];
static void tls_setup(void) {
    if (system("command -v openssl >/dev/null 2>&1") != 0) cr_skip_test("no openssl CLI");
    qrl_test_mkdtemp(tls_dir);
    make_cert(tls_dir, "server");
    make_cert(tls_dir, "other");
    make_cert(tls_dir, "client");
}
static void tls_teardown(void) { qrl_test_rmtree(tls_dir); }

static qrl_status tls_status(const char *ca, const char *cert, const char *key, qrl_error *err) {
    char ca_p[128], cert_p[128], key_p[128];
    snprintf(ca_p, sizeof ca_p, "%s/%s.crt", tls_dir, ca ? ca : "");
    snprintf(cert_p, sizeof cert_p, "%s/%s.crt", tls_dir, cert ? cert : "");
    snprintf(key_p, sizeof key_p, "%s/%s.key", tls_dir, key ? key : "");
    qrl_rpc_client_opts o = {.target = H.target, .token = TOKEN, .tls_ca_file = ca ? ca_p : NULL,
                             .tls_cert_file = cert ? cert_p : NULL, .tls_key_file = key ? key_p : NULL};
    qrl_rpc_client_t *c;
    cr_assert_eq(qrl_rpc_client_new(&o, &c, err), QRL_OK, "%s", err->msg);
    uint64_t step;
    qrl_status st = call_status(c, &step, err);
    if (st == QRL_OK) { /* and a mutating call with the token over the same channel */
        st = call_set(c, "rollout.max_staleness", "5", NULL, err);
    }
    qrl_rpc_client_destroy(c);
    return st;
}

Test(rpc_tls, tls_client_works_plaintext_does_not, .init = tls_setup, .fini = tls_teardown,
     .timeout = 60) {
    char cert[128], key[128];
    snprintf(cert, sizeof cert, "%s/server.crt", tls_dir);
    snprintf(key, sizeof key, "%s/server.key", tls_dir);
    qrl_rpc_server_opts o = {.token = TOKEN, .tls_cert_file = cert, .tls_key_file = key};
    start_server(&o);
    qrl_error err;
    cr_assert_eq(tls_status("server", NULL, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(staleness(), "5");
    cr_assert_eq(tls_status(NULL, NULL, NULL, &err), QRL_STATUS_NETWORK, "plaintext: %s", err.msg);
    cr_assert_eq(tls_status("other", NULL, NULL, &err), QRL_STATUS_NETWORK, "wrong CA: %s", err.msg);
    stop_server();
}

Test(rpc_tls, client_certificates_when_required, .init = tls_setup, .fini = tls_teardown,
     .timeout = 60) {
    char cert[128], key[128], ca[128];
    snprintf(cert, sizeof cert, "%s/server.crt", tls_dir);
    snprintf(key, sizeof key, "%s/server.key", tls_dir);
    snprintf(ca, sizeof ca, "%s/client.crt", tls_dir);
    qrl_rpc_server_opts o = {.token = TOKEN, .tls_cert_file = cert, .tls_key_file = key,
                             .tls_client_ca_file = ca};
    start_server(&o);
    qrl_error err;
    cr_assert_eq(tls_status("server", "client", "client", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(tls_status("server", NULL, NULL, &err), QRL_STATUS_NETWORK, "no client cert: %s",
                 err.msg);
    cr_assert_eq(tls_status("server", "other", "other", &err), QRL_STATUS_NETWORK,
                 "untrusted client cert: %s", err.msg);
    stop_server();
}

/* ---- construction errors, unreachable server ------------------------------------------ */

static void count_close(qrl_rpc_server_t *s, void *user) { ++*(int *)user; }

Test(rpc, server_and_client_option_errors, .timeout = 30) {
    qrl_log_set_level(QRL_LOG_LEVEL_OFF);
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    qrl_rpc_server_t *s = NULL;
    qrl_error err;
    qrl_rpc_server_opts none = {0};
    cr_assert_eq(qrl_rpc_server_new(&loop, &none, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "no bearer token"), "%s", err.msg);
    cr_assert_null(s);
    qrl_rpc_server_opts spaced = {.token = "has space"};
    cr_assert_eq(qrl_rpc_server_new(&loop, &spaced, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "byte 3"), "%s", err.msg);
    qrl_rpc_server_opts half = {.token = TOKEN, .tls_cert_file = "/nonexistent.crt"};
    cr_assert_eq(qrl_rpc_server_new(&loop, &half, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_rpc_server_opts missing = {.token = TOKEN, .tls_cert_file = "/nonexistent/x.crt",
                                   .tls_key_file = "/nonexistent/x.key"};
    cr_assert_eq(qrl_rpc_server_new(&loop, &missing, &s, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "/nonexistent/x.crt"), "%s", err.msg);

    /* a port in use is refused (no silent SO_REUSEPORT sharing); an unstarted server closes */
    qrl_rpc_server_opts ok = {.token = TOKEN};
    cr_assert_eq(qrl_rpc_server_new(&loop, &ok, &s, &err), QRL_OK, "%s", err.msg);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", qrl_rpc_server_port(s));
    qrl_rpc_server_opts same = {.token = TOKEN, .addr = addr};
    qrl_rpc_server_t *s2 = NULL;
    cr_assert_eq(qrl_rpc_server_new(&loop, &same, &s2, &err), QRL_STATUS_NETWORK);
    cr_assert(strstr(err.msg, addr), "%s", err.msg);
    int closed = 0;
    qrl_rpc_server_close(s, count_close, &closed);
    cr_assert_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    cr_assert_eq(closed, 1);
    cr_assert_eq(uv_loop_close(&loop), 0);

    qrl_rpc_client_t *c = NULL;
    qrl_rpc_client_opts notarget = {0};
    cr_assert_eq(qrl_rpc_client_new(&notarget, &c, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_rpc_client_opts certonly = {.target = "127.0.0.1:1", .tls_cert_file = "a", .tls_key_file = "b"};
    cr_assert_eq(qrl_rpc_client_new(&certonly, &c, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_rpc_client_opts noca = {.target = "127.0.0.1:1", .tls_ca_file = "/nonexistent/ca.crt"};
    cr_assert_eq(qrl_rpc_client_new(&noca, &c, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_null(c);
}

Test(rpc, unreachable_server_is_a_retriable_network_error, .timeout = 30) {
    /* a bound, never-listening socket: connections to its port are refused */
    uv_loop_t loop;
    uv_tcp_t sock;
    cr_assert_eq(uv_loop_init(&loop), 0);
    cr_assert_eq(uv_tcp_init(&loop, &sock), 0);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    cr_assert_eq(uv_tcp_bind(&sock, (const struct sockaddr *)&sa, 0), 0);
    struct sockaddr_in bound;
    int len = sizeof bound;
    cr_assert_eq(uv_tcp_getsockname(&sock, (struct sockaddr *)&bound, &len), 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", ntohs(bound.sin_port));
    qrl_rpc_client_opts o = {.target = target};
    qrl_rpc_client_t *c;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_new(&o, &c, &err), QRL_OK);
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp;
    double t0 = now_s();
    cr_assert_eq(qrl_rpc_client_call(c, QRL_RPC_LEARNER_STATUS, &rq.base, 5000, &resp, &err),
                 QRL_STATUS_NETWORK, "%s", err.msg);
    cr_assert(now_s() - t0 < 3, "a refused connection fails fast (%.2f s)", now_s() - t0);
    cr_assert(qrl_status_retriable(QRL_STATUS_NETWORK));
    cr_assert(strstr(err.msg, "UNAVAILABLE") && strstr(err.msg, target), "%s", err.msg);
    qrl_rpc_client_destroy(c);
    uv_close((uv_handle_t *)&sock, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

/* ---- tokens and status codes ----------------------------------------------------------- */

Test(rpc, token_files_and_environment) {
    char dir[64], path[512], tok[QRL_RPC_TOKEN_MAX + 1];
    qrl_error err;
    qrl_test_mkdtemp(dir);
    qrl_test_write(dir, "good", "abc-DEF_123\n", 12, path);
    cr_assert_eq(qrl_rpc_token_read(path, tok, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(tok, "abc-DEF_123");
    qrl_test_write(dir, "empty", "\n", 1, path);
    cr_assert_eq(qrl_rpc_token_read(path, tok, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "empty") && strstr(err.msg, path), "%s", err.msg);
    qrl_test_write(dir, "space", "abc def", 7, path);
    cr_assert_eq(qrl_rpc_token_read(path, tok, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "byte 3") && strstr(err.msg, "0x20"), "%s", err.msg);
    char big[QRL_RPC_TOKEN_MAX + 2];
    memset(big, 'a', sizeof big);
    qrl_test_write(dir, "big", big, sizeof big, path);
    cr_assert_eq(qrl_rpc_token_read(path, tok, &err), QRL_STATUS_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/missing", dir);
    cr_assert_eq(qrl_rpc_token_read(path, tok, &err), QRL_STATUS_NOT_FOUND);

    bool found;
    unsetenv(QRL_RPC_TOKEN_FILE_ENV);
    unsetenv(QRL_RPC_TOKEN_ENV);
    cr_assert_eq(qrl_rpc_token_resolve(NULL, tok, &found, &err), QRL_OK);
    cr_assert(!found);
    setenv(QRL_RPC_TOKEN_ENV, "from-env", 1);
    cr_assert_eq(qrl_rpc_token_resolve(NULL, tok, &found, &err), QRL_OK);
    cr_assert(found);
    cr_assert_str_eq(tok, "from-env");
    snprintf(path, sizeof path, "%s/good", dir);
    setenv(QRL_RPC_TOKEN_FILE_ENV, path, 1); /* a file wins over the token variable */
    cr_assert_eq(qrl_rpc_token_resolve(NULL, tok, &found, &err), QRL_OK);
    cr_assert_str_eq(tok, "abc-DEF_123");
    snprintf(path, sizeof path, "%s/missing", dir); /* and an explicit path over both */
    cr_assert_eq(qrl_rpc_token_resolve(path, tok, &found, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(!found);
    setenv(QRL_RPC_TOKEN_ENV, "bad token", 1);
    unsetenv(QRL_RPC_TOKEN_FILE_ENV);
    cr_assert_eq(qrl_rpc_token_resolve(NULL, tok, &found, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, QRL_RPC_TOKEN_ENV), "%s", err.msg);
    unsetenv(QRL_RPC_TOKEN_ENV);
    qrl_test_rmtree(dir);

    cr_assert(qrl_rpc_token_equal("abc", 3, "abc", 3));
    cr_assert(!qrl_rpc_token_equal("abd", 3, "abc", 3));
    cr_assert(!qrl_rpc_token_equal("ab", 2, "abc", 3));
    cr_assert(!qrl_rpc_token_equal("abcd", 4, "abc", 3));
    cr_assert(!qrl_rpc_token_equal("", 0, "abc", 3));
}

Test(rpc, status_mapping) {
    static const struct {
        qrl_status q;
        grpc_status_code g;
    } both_ways[] = {
        {QRL_OK, GRPC_STATUS_OK},
        {QRL_STATUS_INVALID_ARGUMENT, GRPC_STATUS_INVALID_ARGUMENT},
        {QRL_STATUS_NOT_FOUND, GRPC_STATUS_NOT_FOUND},
        {QRL_STATUS_UNSUPPORTED, GRPC_STATUS_FAILED_PRECONDITION},
        {QRL_STATUS_CORRUPT, GRPC_STATUS_DATA_LOSS},
        {QRL_STATUS_NETWORK, GRPC_STATUS_UNAVAILABLE},
        {QRL_STATUS_TIMEOUT, GRPC_STATUS_DEADLINE_EXCEEDED},
        {QRL_STATUS_PERMISSION, GRPC_STATUS_PERMISSION_DENIED},
        {QRL_STATUS_CANCELLED, GRPC_STATUS_CANCELLED},
        {QRL_STATUS_INTERNAL, GRPC_STATUS_INTERNAL},
    };
    for (size_t i = 0; i < sizeof both_ways / sizeof *both_ways; i++) {
        cr_assert_eq(qrl_rpc_status_to_grpc(both_ways[i].q), both_ways[i].g, "%s",
                     qrl_status_name(both_ways[i].q));
        cr_assert_eq(qrl_rpc_status_from_grpc(both_ways[i].g), both_ways[i].q, "%s",
                     qrl_rpc_grpc_code_name(both_ways[i].g));
    }
    cr_assert_eq(qrl_rpc_status_to_grpc(QRL_STATUS_PARSE), GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_rpc_status_to_grpc(QRL_STATUS_BUSY), GRPC_STATUS_UNAVAILABLE);
    cr_assert_eq(qrl_rpc_status_from_grpc(GRPC_STATUS_UNAUTHENTICATED), QRL_STATUS_PERMISSION);
    cr_assert_eq(qrl_rpc_status_from_grpc(GRPC_STATUS_RESOURCE_EXHAUSTED), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_rpc_status_from_grpc(GRPC_STATUS_UNIMPLEMENTED), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(qrl_rpc_status_from_grpc(GRPC_STATUS_UNKNOWN), QRL_STATUS_INTERNAL);
    cr_assert_str_eq(qrl_rpc_grpc_code_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
    cr_assert_str_eq(qrl_rpc_grpc_code_name((grpc_status_code)99), "UNKNOWN_CODE");
}
