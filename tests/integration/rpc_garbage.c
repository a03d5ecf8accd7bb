/* Garbage over the wire for tests/integration/control_plane.sh: N malformed gRPC requests
 * to one control service of a running daemon, straight on the gRPC C core (not through
 * common/rpc/client.c, so a bug shared by our client and server cannot hide itself).
 *
 *   rpc_garbage --target HOST:PORT --service learner|rollout [--token-file F] [--tls-ca F]
 *               [--count N] [--seed S] [--token-for-reads]
 *   rpc_garbage --target HOST:PORT --call PATH [--token-file F] [--tls-ca F]
 *
 * Fuzz mode sends, in a seeded random mix: random bytes to every method path of the
 * service (no token, a wrong token, the right one), wrong paths, messages over the 4 MiB
 * limit, truncated protobuf, a unary call with no message or with two, calls cancelled at
 * once and calls with a 1 ms deadline.  Each request has the gRPC codes it may get (a
 * malformed body: INVALID_ARGUMENT; no token: UNAUTHENTICATED; ...); any other code is a
 * violation.  Requests that could change the daemon (Register, Pause, Drain, Shutdown, ...
 * with the right token) carry a body that can never decode, so the daemon's state is left
 * alone.  At the end one valid Status call must answer OK.  Prints the counts per code;
 * exit 0 when there was no violation, 1 otherwise, 2 on usage errors.
 *
 * Call mode sends one valid empty request (schema_version 1) to PATH and prints the gRPC
 * code name (OK, UNAUTHENTICATED, ...); exit 0 whatever the code. */
#include <getopt.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc/rpc.h"

#define NCODES 17 /* OK .. UNAUTHENTICATED */
#define MAX_BODY ((size_t)4 << 20) /* the daemons' default request limit */
#define CALL_MS 5000

enum { F_NO_MESSAGE = 1, F_TWO_MESSAGES = 2, F_CANCEL = 4 };
/* What the authorization header carries: nothing, a wrong token, the right one, the
 * right one plus a byte, the right one less its last byte, "Bearer " alone, another
 * scheme with the right token. */
enum { TOK_NONE, TOK_WRONG, TOK_GOOD, TOK_LONGER, TOK_SHORTER, TOK_EMPTY, TOK_BASIC, TOK_KINDS };

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static grpc_channel *ch;
static char auth[TOK_KINDS][QRL_RPC_TOKEN_MAX + 16];
static long counts[NCODES];
static int violations;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *msg) {
    fprintf(stderr, "rpc_garbage: %s\n", msg);
    exit(2);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot read a --tls-ca file");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) die("cannot read a --tls-ca file");
    p[n] = 0;
    fclose(f);
    return p;
}

static void wait_tag(grpc_completion_queue *cq, void *tag) {
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE) die("completion queue failed");
}

/* One call: `body` (len bytes) to `path` with the given token and flags; returns the
 * status code the client saw. */
static grpc_status_code do_call(const char *path, const uint8_t *body, size_t len, int tok, int flags,
                                int deadline_ms) {
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice method = grpc_slice_from_copied_string(path);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                         gpr_time_from_millis(deadline_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               deadline, NULL);
    grpc_slice_unref(method);
    grpc_metadata md;
    memset(&md, 0, sizeof md);
    md.key = grpc_slice_from_static_string("authorization");
    md.value = grpc_slice_from_static_string(auth[tok]);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)body, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();

    grpc_op send[4], recv_ops[3];
    memset(send, 0, sizeof send);
    memset(recv_ops, 0, sizeof recv_ops);
    size_t n = 0;
    send[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    send[n].data.send_initial_metadata.count = tok == TOK_NONE ? 0 : 1;
    send[n++].data.send_initial_metadata.metadata = tok == TOK_NONE ? NULL : &md;
    if (!(flags & F_NO_MESSAGE)) {
        send[n].op = GRPC_OP_SEND_MESSAGE;
        send[n++].data.send_message.send_message = bb;
    }
    if (!(flags & F_TWO_MESSAGES)) send[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    recv_ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    recv_ops[0].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    recv_ops[1].op = GRPC_OP_RECV_MESSAGE;
    recv_ops[1].data.recv_message.recv_message = &recv;
    recv_ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    recv_ops[2].data.recv_status_on_client.status = &code;
    recv_ops[2].data.recv_status_on_client.status_details = &details;
    recv_ops[2].data.recv_status_on_client.trailing_metadata = &trail_md;
    void *tag_send = (void *)1, *tag_recv = (void *)2, *tag_second = (void *)3;
    if (grpc_call_start_batch(call, send, n, tag_send, NULL) != GRPC_CALL_OK) die("start_batch (send)");
    if (grpc_call_start_batch(call, recv_ops, 3, tag_recv, NULL) != GRPC_CALL_OK) die("start_batch (recv)");
    if (flags & F_CANCEL) grpc_call_cancel(call, NULL);
    wait_tag(cq, tag_send);
    if (flags & F_TWO_MESSAGES) { /* a second message on a unary call, then close */
        grpc_op second[2];
        memset(second, 0, sizeof second);
        second[0].op = GRPC_OP_SEND_MESSAGE;
        second[0].data.send_message.send_message = bb;
        second[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        if (grpc_call_start_batch(call, second, 2, tag_second, NULL) == GRPC_CALL_OK) wait_tag(cq, tag_second);
    }
    wait_tag(cq, tag_recv);
    grpc_byte_buffer_destroy(bb);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return code;
}

/* Bodies that never decode: a length-delimited field 15 claiming 65535 bytes that are not
 * there, then `extra` random bytes (fewer than claimed). */
static size_t body_undecodable(uint8_t *b, size_t extra) {
    b[0] = 0x7a;
    b[1] = 0xff;
    b[2] = 0xff;
    b[3] = 0x03;
    for (size_t i = 0; i < extra; i++) b[4 + i] = (uint8_t)rnd();
    return 4 + extra;
}

/* A valid prefix (schema_version = 1) and a string field 15 of 8 bytes, cut inside them. */
static size_t body_truncated(uint8_t *b) {
    static const uint8_t whole[] = {0x08, 0x01, 0x7a, 0x08, 'g', 'a', 'r', 'b', 'a', 'g', 'e', '!'};
    size_t cut = 5 + rnd() % 7; /* 5..11: inside the 8 string bytes */
    memcpy(b, whole, cut);
    return cut;
}

static void expect(const char *what, const char *path, grpc_status_code got, unsigned allowed) {
    /* Learner.Checkpoint has no handler yet (checkpointing is another branch's work) */
    if (strcmp(path, "/qrl.Learner/Checkpoint") == 0) allowed |= 1u << GRPC_STATUS_UNIMPLEMENTED;
    if (got >= 0 && got < NCODES) counts[got]++;
    if (got >= 0 && got < NCODES && (allowed & (1u << got))) return;
    if (violations++ < 20)
        fprintf(stderr, "rpc_garbage: VIOLATION %s %s: got %s\n", what, path, qrl_rpc_grpc_code_name(got));
}

#define B(c) (1u << GRPC_STATUS_##c)

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"target", required_argument, NULL, 't'}, {"service", required_argument, NULL, 's'},
        {"token-file", required_argument, NULL, 'k'}, {"tls-ca", required_argument, NULL, 'c'},
        {"count", required_argument, NULL, 'n'}, {"seed", required_argument, NULL, 'r'},
        {"call", required_argument, NULL, 'p'}, {"token-for-reads", no_argument, NULL, 'R'},
        {NULL, 0, NULL, 0}};
    const char *target = NULL, *service = NULL, *token_file = NULL, *ca_file = NULL, *one = NULL;
    long count = 1000;
    bool reads_need_token = false;
    rng_state = 1;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 't': target = optarg; break;
        case 's': service = optarg; break;
        case 'k': token_file = optarg; break;
        case 'c': ca_file = optarg; break;
        case 'n': count = atol(optarg); break;
        case 'r': rng_state = strtoull(optarg, NULL, 10); break;
        case 'p': one = optarg; break;
        case 'R': reads_need_token = true; break;
        default: die("usage: see the comment at the top of rpc_garbage.c");
        }
    }
    if (!target || (!one && (!service || (strcmp(service, "learner") && strcmp(service, "rollout")))))
        die("need --target and --service learner|rollout (or --call PATH)");
    char token[QRL_RPC_TOKEN_MAX + 1] = "";
    qrl_error err;
    if (token_file && qrl_rpc_token_read(token_file, token, &err) != QRL_OK) die(err.msg);
    snprintf(auth[TOK_WRONG], sizeof auth[0], "Bearer not-the-token");
    snprintf(auth[TOK_GOOD], sizeof auth[0], "Bearer %s", token);
    snprintf(auth[TOK_LONGER], sizeof auth[0], "Bearer %sx", token);
    snprintf(auth[TOK_SHORTER], sizeof auth[0], "Bearer %.*s", (int)(strlen(token) ? strlen(token) - 1 : 0), token);
    snprintf(auth[TOK_EMPTY], sizeof auth[0], "Bearer ");
    snprintf(auth[TOK_BASIC], sizeof auth[0], "Basic %s", token);

    grpc_init();
    grpc_channel_credentials *creds;
    char *ca = ca_file ? read_file(ca_file) : NULL;
    creds = ca ? grpc_ssl_credentials_create(ca, NULL, NULL, NULL) : grpc_insecure_credentials_create();
    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[0].value.integer = -1; /* we mean to send too much */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_HTTP_PROXY;
    args[1].value.integer = 0;
    grpc_channel_args cargs = {2, args};
    ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    static const uint8_t empty_req[] = {0x08, 0x01}; /* schema_version = 1, nothing else */

    if (one) {
        grpc_status_code c = do_call(one, empty_req, sizeof empty_req, token_file ? TOK_GOOD : TOK_NONE, 0,
                                     CALL_MS);
        printf("%s\n", qrl_rpc_grpc_code_name(c));
        grpc_channel_destroy(ch);
        grpc_shutdown();
        free(ca);
        return 0;
    }

    const char *svc = strcmp(service, "learner") == 0 ? "qrl.Learner" : "qrl.Rollout";
    const char *other_path = strcmp(service, "learner") == 0 ? "/qrl.Rollout/Status" : "/qrl.Learner/Status";
    const qrl_rpc_method *methods[QRL_RPC_COUNT_];
    int nm = 0;
    for (int i = 0; i < QRL_RPC_COUNT_; i++)
        if (strcmp(qrl_rpc_method_get((qrl_rpc_id)i)->service, svc) == 0) methods[nm++] = qrl_rpc_method_get((qrl_rpc_id)i);
    uint8_t *body = malloc(MAX_BODY + 4096);
    if (!body) die("out of memory");
    char path[2048];
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
        const qrl_rpc_method *m = methods[rnd() % (uint64_t)nm];
        /* Read-only methods and those whose random body is harmless (an unknown replica id,
         * an unknown config key) get random bytes even with the right token. */
        bool harmless = !m->needs_token || strcmp(m->method, "Set") == 0 ||
                        strcmp(m->method, "Heartbeat") == 0 || strcmp(m->method, "WatchVersions") == 0;
        bool token_needed = m->needs_token || reads_need_token;
        int kind = (int)(i % 20 == 7 ? 100 : rnd() % 10); /* every 20th: oversized */
        int tok = (int)(rnd() % 8);
        if (tok >= TOK_KINDS) tok = TOK_GOOD; /* a little more often: reach the decoder */
        size_t len;
        unsigned refused = tok == TOK_NONE || tok == TOK_BASIC ? B(UNAUTHENTICATED) : B(PERMISSION_DENIED);
        switch (kind) {
        case 100: /* over the limit: refused by gRPC before anything is decoded */
            len = MAX_BODY + 1 + rnd() % 4096;
            for (size_t k = 0; k < len; k += 8) body[k] = (uint8_t)rnd();
            expect("oversized", m->path, do_call(m->path, body, len, TOK_GOOD, 0, CALL_MS), B(RESOURCE_EXHAUSTED));
            break;
        case 0: case 1: case 2: case 3: { /* random bytes to a real method */
            len = rnd() % 300;
            if (tok == TOK_GOOD && !harmless) len = body_undecodable(body, len);
            else
                for (size_t k = 0; k < len; k++) body[k] = (uint8_t)rnd();
            unsigned ok = B(INVALID_ARGUMENT);
            if (harmless) ok |= B(OK) | B(NOT_FOUND) | B(FAILED_PRECONDITION);
            if (token_needed && tok != TOK_GOOD) ok = refused;
            expect("random", m->path, do_call(m->path, body, len, tok, 0, CALL_MS), ok);
            break;
        }
        case 4: { /* wrong paths */
            int w = (int)(rnd() % 5);
            if (w == 0) snprintf(path, sizeof path, "/%s/Nope", svc);
            else if (w == 1) snprintf(path, sizeof path, "%s", other_path);
            else if (w == 2) snprintf(path, sizeof path, "/%s/", svc);
            else if (w == 3) {
                size_t pl = 1 + rnd() % 60;
                path[0] = '/';
                for (size_t k = 1; k <= pl; k++) path[k] = (char)('!' + rnd() % 94);
                path[pl + 1] = 0;
            } else {
                path[0] = '/';
                memset(path + 1, 'x', 1500);
                path[1501] = 0;
            }
            len = rnd() % 64;
            for (size_t k = 0; k < len; k++) body[k] = (uint8_t)rnd();
            expect("wrong path", path, do_call(path, body, len, tok, 0, CALL_MS), B(UNIMPLEMENTED));
            break;
        }
        case 5: case 6: /* truncated protobuf */
            len = body_truncated(body);
            expect("truncated", m->path, do_call(m->path, body, len, tok, 0, CALL_MS),
                   token_needed && tok != TOK_GOOD ? refused : B(INVALID_ARGUMENT));
            break;
        case 7: /* unary call with no message, or with two */
            len = body_undecodable(body, rnd() % 32);
            if (rnd() % 2)
                expect("no message", m->path, do_call(m->path, body, len, tok, F_NO_MESSAGE, CALL_MS),
                       (token_needed && tok != TOK_GOOD ? refused : 0) | B(INVALID_ARGUMENT) | B(UNKNOWN) |
                           B(INTERNAL));
            else
                expect("two messages", m->path, do_call(m->path, body, len, tok, F_TWO_MESSAGES, CALL_MS),
                       (token_needed && tok != TOK_GOOD ? refused : 0) | B(INVALID_ARGUMENT) | B(INTERNAL) |
                           B(UNKNOWN));
            break;
        case 8: /* cancelled at once (a quick server may still answer first) */
            len = body_undecodable(body, rnd() % 32);
            expect("cancelled", m->path, do_call(m->path, body, len, tok, F_CANCEL, CALL_MS),
                   B(CANCELLED) | (token_needed && tok != TOK_GOOD ? refused : B(INVALID_ARGUMENT)));
            break;
        default: /* a 1 ms deadline: whatever comes first, but the daemon must cope */
            len = body_undecodable(body, rnd() % 32);
            expect("1 ms deadline", m->path, do_call(m->path, body, len, tok, 0, 1), ~0u);
            break;
        }
    }
    double secs = now_s() - t0;
    /* still answering, with a real answer */
    char status_path[64];
    snprintf(status_path, sizeof status_path, "/%s/Status", svc);
    grpc_status_code last = do_call(status_path, empty_req, sizeof empty_req, token_file ? TOK_GOOD : TOK_NONE,
                                    0, CALL_MS);
    if (last != GRPC_STATUS_OK) {
        fprintf(stderr, "rpc_garbage: Status after the garbage: %s\n", qrl_rpc_grpc_code_name(last));
        violations++;
    }
    printf("%ld requests to %s in %.2f s (%.0f us each):", count, svc, secs, secs * 1e6 / (double)count);
    for (int c = 0; c < NCODES; c++)
        if (counts[c]) printf(" %s=%ld", qrl_rpc_grpc_code_name((grpc_status_code)c), counts[c]);
    printf("; violations=%d\n", violations);
    free(body);
    free(ca);
    grpc_channel_destroy(ch);
    grpc_shutdown();
    return violations ? 1 : 0;
}
