/* The rpc server's shared state (server.c: CQ thread and lifecycle; call.c: the call API
 * the loop uses).  Not a public header; rpc.h is. */
#ifndef QRL_RPC_SERVER_INTERNAL_H
#define QRL_RPC_SERVER_INTERNAL_H

#include <grpc/grpc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <uv.h>

#include "rpc/rpc.h"
#include "wire/wire.h"

typedef enum tag_kind { TAG_NEW, TAG_RECV, TAG_CLOSE, TAG_SEND, TAG_KICK, TAG_SHUTDOWN } tag_kind;
typedef struct rpc_tag {
    tag_kind kind;
    qrl_rpc_call_t *call; /* NULL for server tags */
} rpc_tag;

typedef enum out_kind { OUT_MESSAGE, OUT_FINISH, OUT_DROP } out_kind;
typedef struct out_item {
    struct out_item *next;
    out_kind kind;
    qrl_rpc_call_t *call;
    uint8_t *bytes; /* MESSAGE, or FINISH with a reply; NULL otherwise */
    size_t len;
    grpc_status_code code; /* FINISH */
    char *details;         /* FINISH: status message (malloc'd) */
} out_item;

typedef enum in_kind { IN_REQUEST, IN_CLOSED } in_kind;
typedef struct in_item {
    struct in_item *next;
    in_kind kind;
    qrl_rpc_call_t *call;
} in_item;

struct qrl_rpc_call {
    qrl_rpc_server_t *server;
    atomic_int refs;
    /* ---- CQ thread only ---- */
    grpc_call *call; /* NULL once released (or before accept) */
    grpc_call_details details;
    grpc_metadata_array md;
    rpc_tag t_new, t_recv, t_close, t_send;
    int pending; /* batches outstanding on this call */
    grpc_byte_buffer *recv_buf;
    int close_cancelled;
    bool md_sent, send_busy, dead, loop_holds;
    out_kind send_kind;
    grpc_byte_buffer *send_buf;
    grpc_slice send_details;
    out_item *sendq, *sendq_tail;
    qrl_rpc_call_t *live_prev, *live_next;
    /* ---- set by the CQ thread before the loop sees the call, then read-only ---- */
    const qrl_rpc_method *method;
    ProtobufCMessage *request;
    char peer[96];
    /* ---- shared ---- */
    atomic_bool cancelled;
    atomic_uint queued; /* stream messages pushed and not yet sent */
    /* ---- loop thread only ---- */
    in_item in_req, in_closed;
    bool released, dropped;
    qrl_rpc_call_close_fn on_close;
    void *on_close_user;
    qrl_rpc_call_t *held_prev, *held_next;
};

struct qrl_rpc_server {
    uv_loop_t *loop;
    uv_async_t async;
    bool async_live;
    char *token;
    size_t token_len;
    bool token_for_reads;
    size_t max_request;
    unsigned max_stream_queue, max_calls;
    struct {
        qrl_rpc_handler_fn fn;
        void *user;
    } handlers[QRL_RPC_COUNT_];
    grpc_server *server;
    grpc_completion_queue *cq;
    grpc_channel *kick_channel;
    int port;
    char addr[256];
    uv_thread_t thread;
    bool started;
    /* ---- CQ thread only ---- */
    qrl_rpc_call_t *live; /* calls holding gRPC resources */
    int pending_total;    /* batches outstanding, request_call and shutdown included */
    unsigned loop_calls;  /* calls the loop holds */
    bool shutting_down;
    gpr_timespec grace_until; /* while shutting down: cancel every call after this */
    rpc_tag t_shutdown, t_kick;
    grpc_call *kick_call;
    grpc_metadata_array kick_md;
    grpc_status_code kick_code;
    grpc_slice kick_details;
    /* ---- outbox (loop -> CQ), under out_mu ---- */
    uv_mutex_t out_mu;
    out_item *out_head, *out_tail;
    bool kick_pending, cq_open, shutdown_req;
    /* ---- inbox (CQ -> loop), under in_mu ---- */
    uv_mutex_t in_mu;
    in_item *in_head, *in_tail;
    bool cq_done;
    /* ---- loop thread only ---- */
    qrl_rpc_call_t *held; /* calls handed to handlers and not released */
    bool closing;
    qrl_rpc_server_close_fn close_cb;
    void *close_user;
    /* ---- stats ---- */
    atomic_ullong st_calls, st_handled, st_unauth, st_denied, st_malformed, st_oversized,
        st_unimpl, st_busy, st_dropped;
};

/* ---- call memory -------------------------------------------------------------------- */

static inline void qrl_rpc_out_item_free_(out_item *it) {
    free(it->bytes);
    free(it->details);
    free(it);
}

static inline void qrl_rpc_call_unref_(qrl_rpc_call_t *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    qrl_wire_free(c->request);
    free(c);
}

/* Queue `it` for the CQ thread and wake it (any state; after the CQ thread has gone the
 * item waits for the server's final free). */
void qrl_rpc_outbox_post_(qrl_rpc_server_t *s, out_item *it);
/* Loop thread: hand a decoded request to its handler (call.c). */
void qrl_rpc_dispatch_(qrl_rpc_server_t *s, qrl_rpc_call_t *c);

#endif
