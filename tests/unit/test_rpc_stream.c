/* The rpc layer (common/rpc/rpc.h), streams and TLS: WatchVersions pushes from the loop,
 * clients leaving mid-stream, a slow reader dropped while a fast one keeps up, replies still
 * delivered when the server closes, TLS and mutual TLS with certificates made by the
 * openssl CLI.  Harness: tests/support/rpc_harness.h. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "rpc/rpc.h"
#include "support/rpc_harness.h"
#include "support/test_files.h"
#include "wire/wire.h"

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

Test(rpc, close_right_after_a_reply_still_delivers_it, .timeout = 30) {
    start_server(NULL);
    qrl_rpc_client_t *c = client(TOKEN), *w = client(TOKEN);
    qrl_rpc_client_stream_t *s = open_watch(w, "replica-0"); /* held: cancelled at close */
    wait_streams(1);
    Qrl__ShutdownRequest rq = QRL__SHUTDOWN_REQUEST__INIT;
    rq.reason = "now";
    ProtobufCMessage *resp;
    qrl_error err;
    cr_assert_eq(qrl_rpc_client_call(c, QRL_RPC_LEARNER_SHUTDOWN, &rq.base, 3000, &resp, &err),
                 QRL_OK, "%s", err.msg);
    cr_assert_str_eq(((Qrl__ControlResponse *)resp)->message, "bye");
    qrl_wire_free(resp);
    ProtobufCMessage *m;
    /* UNAVAILABLE: "server shutting down", or "Socket closed" when the connection goes first */
    cr_assert_eq(qrl_rpc_client_stream_next(s, 3000, &m, &err), QRL_STATUS_NETWORK, "%s", err.msg);
    cr_assert(strstr(err.msg, "UNAVAILABLE"), "%s", err.msg);
    for (int i = 0; i < 300 && !atomic_load(&H.server_gone); i++) usleep(10000);
    cr_assert(atomic_load(&H.server_gone), "the server did not close");
    cr_assert_eq(atomic_load(&H.closed), 1, "the stream's on_close ran");
    uint64_t step;
    cr_assert_eq(call_status(c, &step, &err), QRL_STATUS_NETWORK, "closed: %s", err.msg);
    qrl_rpc_client_stream_close(s);
    qrl_rpc_client_destroy(c);
    qrl_rpc_client_destroy(w);
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
