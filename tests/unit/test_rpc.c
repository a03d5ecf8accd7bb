/* The rpc layer (common/rpc/rpc.h), unary side: a real gRPC server on 127.0.0.1 (a free
 * port) whose handlers run on a libuv loop thread (tests/support/rpc_harness.h), driven by
 * the blocking client.  Round trips, auth, Set, deadlines, limits, garbage payloads,
 * construction errors, tokens and status mapping.  Streams and TLS: test_rpc_stream.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "rpc/rpc.h"
#include "support/rpc_harness.h"
#include "support/test_files.h"
#include "wire/wire.h"

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

Test(rpc, unknown_method_and_malformed_payloads, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN);
    qrl_error err;
    uint8_t req[2] = {0x08, 0x01}, *resp;
    size_t n;
    cr_assert_eq(qrl_rpc_client_call_raw(c, "/qrl.Learner/Nope", req, 2, 2000, &resp, &n, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "UNIMPLEMENTED") && strstr(err.msg, "/qrl.Learner/Nope"), "%s", err.msg);
    /* a malformed payload: refused with the decoder's message, the server keeps serving */
    uint8_t bad[] = {0x08, 0x01, 0x12, 0x09, 'k'}; /* key says 9 bytes, 1 follows */
    cr_assert_eq(qrl_rpc_client_call_raw(c, "/qrl.Learner/Set", bad, sizeof bad, 2000, &resp, &n, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "INVALID_ARGUMENT: /qrl.Learner/Set: SetRequest") &&
                  strstr(err.msg, "byte"),
              "%s", err.msg);
    uint8_t v2[] = {0x08, 0x02}; /* schema_version 2: unknown */
    cr_assert_eq(qrl_rpc_client_call_raw(c, "/qrl.Learner/Status", v2, sizeof v2, 2000, &resp, &n, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "schema_version got 2"), "%s", err.msg);
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(step, 1, "no refused call reached the handler");
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
