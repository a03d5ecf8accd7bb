/* qrl's gRPC control plane (SPEC §8, docs/rpc.md): a server that hands decoded requests to
 * the owning daemon's libuv loop, and a blocking client for qrlctl, tests and the replica's
 * WatchVersions reader.  gRPC C core with protobuf-c payloads; the method table is
 * QRL_RPC_TABLE (wire/rpc_paths.h).
 *
 * Threads (STYLE 14; the full picture is in docs/rpc.md):
 *   - the server's completion-queue (CQ) thread owns every grpc_call: it accepts calls,
 *     checks the token, reads and decodes requests, and performs every send;
 *   - the daemon's loop thread runs the handlers and answers through qrl_rpc_call_*; those
 *     functions encode the reply and queue it for the CQ thread, they never wait.
 * Every qrl_rpc_server_* and qrl_rpc_call_* function is called on the loop thread (new and
 * handle before the loop runs also do).  Client functions block and belong on other threads
 * (qrlctl's main, a reader thread), never on a loop.
 *
 * Auth: mutating methods (needs_token in the table) require "authorization: Bearer
 * <token>", compared in constant time.  No header or another scheme: UNAUTHENTICATED; a
 * wrong token: PERMISSION_DENIED.  Either way the handler never runs. */
#ifndef QRL_RPC_RPC_H
#define QRL_RPC_RPC_H

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/config.h"
#include "core/status.h"
#include "qrl.pb-c.h"
#include "wire/rpc_paths.h"

/* Where the learner's control service listens unless told otherwise (loopback only). */
#define QRL_RPC_LEARNER_ADDR_DEFAULT "127.0.0.1:7070"
/* Environment variables for the bearer token: a file holding it, or the token itself. */
#define QRL_RPC_TOKEN_FILE_ENV "QRL_RPC_TOKEN_FILE"
#define QRL_RPC_TOKEN_ENV "QRL_RPC_TOKEN"
/* Longest token accepted (it travels in an HTTP/2 header). */
#define QRL_RPC_TOKEN_MAX 1024
/* Defaults of the server and client limits. */
#define QRL_RPC_MAX_REQUEST_DEFAULT ((size_t)4 << 20)
#define QRL_RPC_MAX_RESPONSE_DEFAULT ((size_t)64 << 20)
#define QRL_RPC_STREAM_QUEUE_DEFAULT 64u
#define QRL_RPC_MAX_CALLS_DEFAULT 1024u

/* ---- tokens and status codes -------------------------------------------------------- */

/* Read a bearer token from `path`: the file's content without trailing whitespace, 1 to
 * QRL_RPC_TOKEN_MAX printable ASCII characters without spaces.  out must hold
 * QRL_RPC_TOKEN_MAX + 1 bytes.  Errors: IO/NOT_FOUND (naming the path), INVALID_ARGUMENT
 * (empty, too long, or a character not allowed, with its offset). */
qrl_status qrl_rpc_token_read(const char *path, char *out, qrl_error *err);

/* The token a program should use: `path` when non-NULL, else the file named by
 * $QRL_RPC_TOKEN_FILE, else $QRL_RPC_TOKEN.  *found is false (and OK returned) when none
 * of them is set.  out as for qrl_rpc_token_read; errors as there. */
qrl_status qrl_rpc_token_resolve(const char *path, char *out, bool *found, qrl_error *err);

/* Constant-time equality of a presented token with the expected one (the time depends on
 * the expected length only). */
bool qrl_rpc_token_equal(const char *given, size_t given_len, const char *expected,
                         size_t expected_len);

/* qrl status -> gRPC code for replies (PARSE/OUT_OF_RANGE -> INVALID_ARGUMENT, UNSUPPORTED
 * -> FAILED_PRECONDITION, BUSY/NETWORK/IO -> UNAVAILABLE, TIMEOUT -> DEADLINE_EXCEEDED,
 * PERMISSION -> PERMISSION_DENIED, ...; docs/rpc.md has the table). */
grpc_status_code qrl_rpc_status_to_grpc(qrl_status st);
/* gRPC code -> qrl status for callers (UNAVAILABLE -> NETWORK, DEADLINE_EXCEEDED ->
 * TIMEOUT: retriable; UNAUTHENTICATED/PERMISSION_DENIED -> PERMISSION; RESOURCE_EXHAUSTED
 * (a message over the size limit) -> OUT_OF_RANGE; FAILED_PRECONDITION/UNIMPLEMENTED ->
 * UNSUPPORTED; ...). */
qrl_status qrl_rpc_status_from_grpc(grpc_status_code code);
/* "PERMISSION_DENIED"; static string ("UNKNOWN_CODE" outside the range). */
const char *qrl_rpc_grpc_code_name(grpc_status_code code);

/* ---- server ------------------------------------------------------------------------- */

typedef struct qrl_rpc_server qrl_rpc_server_t;
/* One incoming call, handed to a handler.  The loop owns the handle from the handler
 * until it calls exactly one of qrl_rpc_call_reply / qrl_rpc_call_finish (or the server's
 * close callback has run); after that the handle is gone. */
typedef struct qrl_rpc_call qrl_rpc_call_t;

/* Runs on the loop thread.  `request` is a decoded message of the method's request type
 * (already version-checked), owned by the call and valid until the call is released.
 * The handler may answer at once or keep `call` and answer later. */
typedef void (*qrl_rpc_handler_fn)(qrl_rpc_call_t *call, const ProtobufCMessage *request,
                                   void *user);
/* The client went away (cancelled, deadline passed, connection lost, or the stream was
 * dropped) while the loop holds `call`.  Runs on the loop; the handle is still valid and
 * must still be released (qrl_rpc_call_finish). */
typedef void (*qrl_rpc_call_close_fn)(qrl_rpc_call_t *call, void *user);
typedef void (*qrl_rpc_server_close_fn)(qrl_rpc_server_t *server, void *user);

typedef struct qrl_rpc_server_opts {
    const char *addr;            /* "host:port"; NULL = "127.0.0.1:0" (port 0 = any free) */
    const char *token;           /* bearer token (copied); NULL needs allow_no_token */
    bool allow_no_token;         /* without a token every mutating call is UNAUTHENTICATED */
    bool token_for_reads;        /* read-only methods (Status, ListReplicas) need it too */
    const char *tls_cert_file;   /* PEM server certificate chain; with tls_key_file: TLS */
    const char *tls_key_file;    /* PEM private key */
    const char *tls_client_ca_file; /* PEM CA: require and verify client certificates */
    size_t max_request_bytes;    /* gRPC receive limit and decode limit; 0 = default */
    unsigned max_stream_queue;   /* pushed, unsent messages per stream before it is dropped */
    unsigned max_calls;          /* calls held by the loop at once; more get UNAVAILABLE */
} qrl_rpc_server_opts;

/* Counters since the server started (read on any thread). */
typedef struct qrl_rpc_server_stats {
    uint64_t calls;          /* calls accepted */
    uint64_t handled;        /* handed to a handler */
    uint64_t unauthenticated;/* refused: no token */
    uint64_t denied;         /* refused: wrong token */
    uint64_t malformed;      /* refused: request did not decode (INVALID_ARGUMENT) */
    uint64_t oversized;      /* refused by our decode limit */
    uint64_t unimplemented;  /* unknown method or no handler */
    uint64_t busy;           /* refused: max_calls reached */
    uint64_t streams_dropped;/* streams dropped for a full queue */
} qrl_rpc_server_stats;

/* The four config rows qrl_rpc_server_opts_tls reads, for a daemon's key table (an array
 * of core/config.h's option rows; learner and rollout share them). */
#define QRL_RPC_SERVER_TLS_CONFIG_ROWS                                                           \
    {"rpc.tls_cert_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,                        \
     "PEM certificate chain of the control service; with rpc.tls_key_file: TLS (docs/rpc.md)"}, \
    {"rpc.tls_key_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,                         \
     "PEM private key of rpc.tls_cert_file"},                                                   \
    {"rpc.tls_client_ca_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,                   \
     "PEM CA: require client certificates signed by it (mutual TLS)"},                          \
    {"rpc.token_for_reads", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false,                   \
     "read-only calls (Status, ListReplicas) need the bearer token too"}

/* Fill o's TLS files and token_for_reads from a daemon's config keys rpc.tls_cert_file,
 * rpc.tls_key_file, rpc.tls_client_ca_file (empty = unset) and rpc.token_for_reads; the
 * table must have all four (both daemons do).  Strings are borrowed from cfg. */
void qrl_rpc_server_opts_tls(qrl_rpc_server_opts *o, const qrl_config_t *cfg);

/* Create a server for `loop` and bind opts->addr (nothing is served until
 * qrl_rpc_server_start).  Call on the loop thread or before the loop runs.  Errors:
 * INVALID_ARGUMENT (no token and !allow_no_token, half a TLS pair, a bad token), IO
 * (unreadable PEM files), NETWORK (cannot bind, naming the address).  *out is owned by the
 * caller and released with qrl_rpc_server_close (also when never started). */
qrl_status qrl_rpc_server_new(uv_loop_t *loop, const qrl_rpc_server_opts *opts,
                              qrl_rpc_server_t **out, qrl_error *err);
/* Route method `id` to `fn` (with `user`).  Before start only.  Methods without a
 * handler answer UNIMPLEMENTED. */
void qrl_rpc_server_handle(qrl_rpc_server_t *s, qrl_rpc_id id, qrl_rpc_handler_fn fn,
                           void *user);
/* Start serving: starts gRPC and the CQ thread.  Errors: INTERNAL (thread creation). */
qrl_status qrl_rpc_server_start(qrl_rpc_server_t *s, qrl_error *err);
/* The bound port (useful with port 0). */
int qrl_rpc_server_port(const qrl_rpc_server_t *s);
void qrl_rpc_server_get_stats(const qrl_rpc_server_t *s, qrl_rpc_server_stats *out);
/* Stop: no new calls; replies already given are still sent (up to 5 s); calls the loop
 * still holds (streams, unanswered calls) are cancelled with UNAVAILABLE and their on_close
 * runs; requests not yet handed to a handler are refused with UNAVAILABLE.  Then the CQ
 * thread ends, the loop handle closes, `cb` runs on the loop (may be NULL), and `s` and
 * every call handle still held are freed.  Never blocks the loop. */
void qrl_rpc_server_close(qrl_rpc_server_t *s, qrl_rpc_server_close_fn cb, void *user);

/* ---- calls (loop thread) ------------------------------------------------------------ */

const qrl_rpc_method *qrl_rpc_call_method(const qrl_rpc_call_t *call);
/* Client address as gRPC reports it ("ipv4:127.0.0.1:51234"); owned by the call. */
const char *qrl_rpc_call_peer(const qrl_rpc_call_t *call);
/* True once the client has gone (or the stream was dropped). */
bool qrl_rpc_call_cancelled(const qrl_rpc_call_t *call);
/* Ask for `fn` when the client goes away while the loop still holds the call. */
void qrl_rpc_call_on_close(qrl_rpc_call_t *call, qrl_rpc_call_close_fn fn, void *user);

/* Answer a unary call with `response` (the method's response type; schema version stamped
 * here; still owned by the caller) and release the call.  An encoding failure sends
 * INTERNAL instead (and is logged). */
void qrl_rpc_call_reply(qrl_rpc_call_t *call, ProtobufCMessage *response);
/* End any call with status `st` and a printf-style message for the client, and release
 * it.  QRL_OK is allowed only for a stream (a unary call answers with a message). */
void qrl_rpc_call_finish(qrl_rpc_call_t *call, qrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Queue one message on a server stream (encoded here, sent by the CQ thread).  Errors:
 * CANCELLED when the stream is over (client gone, or dropped now or before because
 * max_stream_queue messages were still unsent: a slow client never holds the loop);
 * OUT_OF_RANGE/NOMEM when `msg` cannot be encoded (the stream stays open).  After
 * CANCELLED the caller still releases the call with qrl_rpc_call_finish. */
qrl_status qrl_rpc_call_push(qrl_rpc_call_t *call, ProtobufCMessage *msg, qrl_error *err);

/* The Set handler both daemons share: qrl_config_set(cfg, key, value) and reply with a
 * SetResponse (old and new text), or fail: unknown key, bad or out-of-range value ->
 * INVALID_ARGUMENT; key not runtime-mutable -> FAILED_PRECONDITION; the config is then
 * unchanged.  Releases the call. */
void qrl_rpc_call_config_set(qrl_rpc_call_t *call, qrl_config_t *cfg,
                             const Qrl__SetRequest *req);

/* ---- client (blocking; any thread but a loop) --------------------------------------- */

typedef struct qrl_rpc_client qrl_rpc_client_t;
typedef struct qrl_rpc_client_stream qrl_rpc_client_stream_t;

typedef struct qrl_rpc_client_opts {
    const char *target;          /* "host:port" */
    const char *token;           /* sent as "authorization: Bearer <token>"; NULL = none */
    const char *tls_ca_file;     /* PEM roots that sign the server's certificate; NULL =
                                    plaintext */
    const char *tls_cert_file;   /* PEM client certificate (mutual TLS), with tls_key_file */
    const char *tls_key_file;
    const char *tls_server_name; /* name to check the certificate against instead of the
                                    target's host */
    size_t max_response_bytes;   /* 0 = QRL_RPC_MAX_RESPONSE_DEFAULT */
} qrl_rpc_client_opts;

/* Make a channel (connects lazily, on the first call).  Errors: INVALID_ARGUMENT (no
 * target, bad token, half a key pair), IO (unreadable PEM).  Free with
 * qrl_rpc_client_destroy. */
qrl_status qrl_rpc_client_new(const qrl_rpc_client_opts *opts, qrl_rpc_client_t **out,
                              qrl_error *err);
void qrl_rpc_client_destroy(qrl_rpc_client_t *c);

/* Call unary method `id` with `req` (stamped here, still owned by the caller) and wait at
 * most timeout_ms (> 0).  On OK *resp is a decoded message of the response type, owned by
 * the caller (qrl_wire_free).  Errors from the server map through qrl_rpc_status_from_grpc;
 * NETWORK and TIMEOUT are retriable.  The message names the method, the target, the gRPC
 * code and its details ("/qrl.Learner/Set at 127.0.0.1:7070: PERMISSION_DENIED: ...").  A
 * response that does not decode: PARSE. */
qrl_status qrl_rpc_client_call(qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                               int timeout_ms, ProtobufCMessage **resp, qrl_error *err);

/* The same with raw bytes and any method path (tests and tools): *resp (malloc'd, free())
 * and *resp_len receive the reply bytes on OK. */
qrl_status qrl_rpc_client_call_raw(qrl_rpc_client_t *c, const char *path, const void *req,
                                   size_t req_len, int timeout_ms, uint8_t **resp,
                                   size_t *resp_len, qrl_error *err);

/* Open server stream `id` with `req`; timeout_ms bounds the whole stream (0 = none).
 * Returns once the request is sent; connection errors may only show at the first next().
 * *out is owned by the caller: qrl_rpc_client_stream_close. */
qrl_status qrl_rpc_client_stream_open(qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                                      int timeout_ms, qrl_rpc_client_stream_t **out,
                                      qrl_error *err);
/* Wait at most wait_ms (< 0: no limit) for the next message.
 *   OK with *msg set: a message (owned by the caller, qrl_wire_free);
 *   OK with *msg NULL: the server ended the stream with OK;
 *   TIMEOUT with qrl_rpc_client_stream_ended false: nothing yet, the stream is still open;
 *   any other error: the stream is over (server status mapped as for calls). */
qrl_status qrl_rpc_client_stream_next(qrl_rpc_client_stream_t *s, int wait_ms,
                                      ProtobufCMessage **msg, qrl_error *err);
bool qrl_rpc_client_stream_ended(const qrl_rpc_client_stream_t *s);
/* Cancel the stream if still open and free it (NULL is a no-op). */
void qrl_rpc_client_stream_close(qrl_rpc_client_stream_t *s);

#endif
