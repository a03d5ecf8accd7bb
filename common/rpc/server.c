/* gRPC server whose handlers run on a libuv loop (rpc.h, docs/rpc.md).
 *
 * Two threads meet here.  The CQ thread owns the grpc_server, the completion queue and
 * every grpc_call: it accepts, authenticates, reads, decodes and sends.  The loop thread
 * runs handlers.  They exchange work through two queues:
 *   inbox  (CQ -> loop): decoded requests, "client went away" notices; uv_async_send wakes
 *          the loop;
 *   outbox (loop -> CQ): encoded replies, stream messages, drops, shutdown; a "kick" wakes
 *          the CQ thread: a call on a lame channel, which fails at once and so posts a
 *          completion to our queue without touching a socket (gRPC's C API has no other
 *          way to post one).  It is the only gRPC function the loop ever calls.
 * A call's memory is reference counted (CQ side, loop handle, each inbox notice), so
 * either thread may drop it last; its gRPC resources are only ever touched by the CQ
 * thread. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"
#include "rpc/rpc.h"
#include "rpc/rpc_internal.h"
#include "rpc/server_internal.h"
#include "wire/wire.h"

#define ACCEPT_DEPTH 8 /* request_call()s kept outstanding: a burst is accepted at once */
#define SHUTDOWN_GRACE_MS 5000 /* queued replies get this long to go out at close */

/* ---- inbox (CQ -> loop) ------------------------------------------------------------- */

static void inbox_post(qrl_rpc_server_t *s, in_item *it) {
    it->next = NULL;
    uv_mutex_lock(&s->in_mu);
    if (s->in_tail) s->in_tail->next = it;
    else s->in_head = it;
    s->in_tail = it;
    uv_mutex_unlock(&s->in_mu);
    uv_async_send(&s->async);
}

/* ---- outbox (loop -> CQ) ------------------------------------------------------------ */

/* Wake the CQ thread (out_mu held): one lame-channel call at a time, coalescing. */
static void kick_locked(qrl_rpc_server_t *s) {
    if (s->kick_pending || !s->cq_open) return;
    s->kick_pending = true;
    s->kick_call = grpc_channel_create_call(s->kick_channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
                                            grpc_slice_from_static_string("/qrl.internal/Kick"),
                                            NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array_init(&s->kick_md);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[1].data.recv_status_on_client.trailing_metadata = &s->kick_md;
    ops[1].data.recv_status_on_client.status = &s->kick_code;
    ops[1].data.recv_status_on_client.status_details = &s->kick_details;
    QRL_CHECK(grpc_call_start_batch(s->kick_call, ops, 2, &s->t_kick, NULL) == GRPC_CALL_OK);
}

void qrl_rpc_outbox_post_(qrl_rpc_server_t *s, out_item *it) {
    it->next = NULL;
    uv_mutex_lock(&s->out_mu);
    if (s->out_tail) s->out_tail->next = it;
    else s->out_head = it;
    s->out_tail = it;
    kick_locked(s);
    uv_mutex_unlock(&s->out_mu);
}

/* ---- CQ thread: sending -------------------------------------------------------------- */

static void sendq_clear(qrl_rpc_call_t *c) {
    for (out_item *it = c->sendq, *next; it; it = next) {
        next = it->next;
        if (it->kind == OUT_MESSAGE) atomic_fetch_sub(&c->queued, 1);
        qrl_rpc_out_item_free_(it);
    }
    c->sendq = c->sendq_tail = NULL;
}

static void call_kill(qrl_rpc_call_t *c) {
    c->dead = true;
    atomic_store(&c->cancelled, true);
    sendq_clear(c);
}

/* Start the next send of `c` when none is in flight. */
static void pump(qrl_rpc_call_t *c) {
    if (c->send_busy || !c->sendq || !c->call) return;
    if (c->dead) {
        sendq_clear(c);
        return;
    }
    out_item *it = c->sendq;
    c->sendq = it->next;
    if (!c->sendq) c->sendq_tail = NULL;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = true;
    }
    if (it->bytes) {
        grpc_slice sl = grpc_slice_new(it->bytes, it->len, free); /* takes the buffer */
        it->bytes = NULL;
        c->send_buf = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send_buf;
    }
    if (it->kind == OUT_FINISH) {
        c->send_details = grpc_slice_from_copied_string(it->details ? it->details : "");
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = it->code;
        ops[n++].data.send_status_from_server.status_details = &c->send_details;
    }
    c->send_kind = it->kind;
    qrl_rpc_out_item_free_(it);
    c->t_send = (rpc_tag){TAG_SEND, c};
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
    if (e != GRPC_CALL_OK) {
        QRL_LOG_WARN("rpc", "send failed to start method=%s error=%s", c->method ? c->method->path : "?",
                     grpc_call_error_to_string(e));
        if (c->send_buf) grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
        if (c->send_kind == OUT_FINISH) grpc_slice_unref(c->send_details);
        if (c->send_kind == OUT_MESSAGE) atomic_fetch_sub(&c->queued, 1);
        call_kill(c);
        return;
    }
    c->send_busy = true;
    c->pending++;
    c->server->pending_total++;
}

static void sendq_append(qrl_rpc_call_t *c, out_item *it) {
    it->next = NULL;
    if (c->sendq_tail) c->sendq_tail->next = it;
    else c->sendq = it;
    c->sendq_tail = it;
    pump(c);
}

/* Answer `c` from the CQ thread (refusals before the loop sees the call). */
static void cq_refuse(qrl_rpc_call_t *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cq_refuse(qrl_rpc_call_t *c, grpc_status_code code, const char *fmt, ...) {
    out_item *it = calloc(1, sizeof *it);
    char *msg = malloc(QRL_ERROR_MSG_MAX);
    QRL_CHECK(it && msg);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, QRL_ERROR_MSG_MAX, fmt, ap);
    va_end(ap);
    it->kind = OUT_FINISH;
    it->call = c;
    it->code = code;
    it->details = msg;
    sendq_append(c, it);
}

/* Drop the CQ side's gRPC resources and reference once nothing is in flight and the loop
 * has let go. */
static void maybe_release(qrl_rpc_call_t *c) {
    if (c->pending > 0 || c->loop_holds || !c->call) return;
    qrl_rpc_server_t *s = c->server;
    sendq_clear(c);
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    grpc_call_unref(c->call);
    c->call = NULL;
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->live_prev) c->live_prev->live_next = c->live_next;
    else s->live = c->live_next;
    if (c->live_next) c->live_next->live_prev = c->live_prev;
    qrl_rpc_call_unref_(c);
}

/* ---- CQ thread: accepting and reading ----------------------------------------------- */

static void accept_one(qrl_rpc_server_t *s) {
    qrl_rpc_call_t *c = calloc(1, sizeof *c);
    QRL_CHECK(c);
    c->server = s;
    atomic_init(&c->refs, 1); /* the CQ side */
    atomic_init(&c->cancelled, false);
    atomic_init(&c->queued, 0);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (rpc_tag){TAG_NEW, c};
    grpc_call_error e =
        grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        QRL_LOG_ERROR("rpc", "request_call failed error=%s", grpc_call_error_to_string(e));
        grpc_call_details_destroy(&c->details);
        grpc_metadata_array_destroy(&c->md);
        free(c);
        return;
    }
    s->pending_total++;
}

/* Token check: 0 pass, else the gRPC code to refuse with (message in msg). */
static grpc_status_code check_auth(qrl_rpc_server_t *s, qrl_rpc_call_t *c, char *msg, size_t cap) {
    if (!c->method->needs_token && !s->token_for_reads) return GRPC_STATUS_OK;
    const grpc_slice *val = NULL;
    for (size_t i = 0; i < c->md.count; i++)
        if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
            val = &c->md.metadata[i].value;
            break;
        }
    static const char scheme[] = "Bearer ";
    size_t n = val ? GRPC_SLICE_LENGTH(*val) : 0;
    const char *p = val ? (const char *)GRPC_SLICE_START_PTR(*val) : NULL;
    if (!val || n < sizeof scheme - 1 || strncasecmp(p, scheme, sizeof scheme - 1) != 0) {
        snprintf(msg, cap, "%s needs the bearer token (metadata 'authorization: Bearer <token>')",
                 c->method->path);
        atomic_fetch_add(&s->st_unauth, 1);
        return GRPC_STATUS_UNAUTHENTICATED;
    }
    if (!s->token || !qrl_rpc_token_equal(p + sizeof scheme - 1, n - (sizeof scheme - 1), s->token,
                                          s->token_len)) {
        snprintf(msg, cap, "%s: the bearer token is not valid for this server", c->method->path);
        atomic_fetch_add(&s->st_denied, 1);
        return GRPC_STATUS_PERMISSION_DENIED;
    }
    return GRPC_STATUS_OK;
}

static void on_new_call(qrl_rpc_server_t *s, qrl_rpc_call_t *c) {
    atomic_fetch_add(&s->st_calls, 1);
    c->live_next = s->live;
    if (s->live) s->live->live_prev = c;
    s->live = c;
    char *peer = grpc_call_get_peer(c->call);
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
    gpr_free(peer);

    /* RECV_CLOSE_ON_SERVER completes when the call is over: sent, cancelled or lost. */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->t_close = (rpc_tag){TAG_CLOSE, c};
    QRL_CHECK(grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) == GRPC_CALL_OK);
    c->pending++;
    s->pending_total++;

    const char *path = (const char *)GRPC_SLICE_START_PTR(c->details.method);
    size_t plen = GRPC_SLICE_LENGTH(c->details.method);
    c->method = qrl_rpc_method_find(path, plen);
    if (!c->method || !s->handlers[c->method->id].fn) {
        atomic_fetch_add(&s->st_unimpl, 1);
        cq_refuse(c, GRPC_STATUS_UNIMPLEMENTED, "method %.*s is not served here",
                  (int)(plen > 200 ? 200 : plen), path);
        return;
    }
    char msg[QRL_ERROR_MSG_MAX];
    grpc_status_code code = check_auth(s, c, msg, sizeof msg);
    if (code != GRPC_STATUS_OK) {
        QRL_LOG_WARN("rpc", "refused method=%s peer=%s code=%s", c->method->path, c->peer,
                     qrl_rpc_grpc_code_name(code));
        cq_refuse(c, code, "%s", msg);
        return;
    }
    if (s->loop_calls >= s->max_calls) {
        atomic_fetch_add(&s->st_busy, 1);
        cq_refuse(c, GRPC_STATUS_UNAVAILABLE, "%s: server busy (%u calls in progress)",
                  c->method->path, s->loop_calls);
        return;
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    c->t_recv = (rpc_tag){TAG_RECV, c};
    QRL_CHECK(grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL) == GRPC_CALL_OK);
    c->pending++;
    s->pending_total++;
}

static void on_recv(qrl_rpc_server_t *s, qrl_rpc_call_t *c, bool ok) {
    if (!ok || c->dead) return; /* the call is failing; RECV_CLOSE tells the rest */
    if (!c->recv_buf) {
        atomic_fetch_add(&s->st_malformed, 1);
        cq_refuse(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: no request message", c->method->path);
        return;
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->recv_buf)) {
        atomic_fetch_add(&s->st_malformed, 1);
        cq_refuse(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: unreadable request", c->method->path);
        return;
    }
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    size_t len = GRPC_SLICE_LENGTH(all);
    if (len > s->max_request) { /* gRPC enforces the same limit first; this is the backstop */
        atomic_fetch_add(&s->st_oversized, 1);
        grpc_slice_unref(all);
        cq_refuse(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: request of %zu bytes is over the limit %zu",
                  c->method->path, len, s->max_request);
        return;
    }
    qrl_error e;
    qrl_status st = qrl_wire_decode(c->method->request, GRPC_SLICE_START_PTR(all), len,
                                    s->max_request, &c->request, &e);
    grpc_slice_unref(all);
    if (st != QRL_OK) {
        atomic_fetch_add(&s->st_malformed, 1);
        QRL_LOG_DEBUG("rpc", "malformed request method=%s peer=%s status=%s error=\"%s\"",
                      c->method->path, c->peer, qrl_status_name(st), e.msg);
        cq_refuse(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", c->method->path, e.msg);
        return;
    }
    atomic_fetch_add(&s->st_handled, 1);
    c->loop_holds = true;
    s->loop_calls++;
    atomic_fetch_add(&c->refs, 1); /* the loop's handle */
    c->in_req.kind = IN_REQUEST;
    c->in_req.call = c;
    inbox_post(s, &c->in_req);
}

static void on_close(qrl_rpc_server_t *s, qrl_rpc_call_t *c) {
    if (!c->close_cancelled) return;
    call_kill(c);
    if (c->loop_holds) {
        atomic_fetch_add(&c->refs, 1); /* the notice's */
        c->in_closed.kind = IN_CLOSED;
        c->in_closed.call = c;
        inbox_post(s, &c->in_closed);
    }
}

static void on_send(qrl_rpc_call_t *c, bool ok) {
    c->send_busy = false;
    if (c->send_buf) grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = NULL;
    if (c->send_kind == OUT_FINISH) grpc_slice_unref(c->send_details);
    if (c->send_kind == OUT_MESSAGE) atomic_fetch_sub(&c->queued, 1);
    if (!ok) call_kill(c);
    pump(c);
}

/* No new calls.  Calls the loop still holds (streams, unanswered calls) are cancelled now;
 * replies already queued are sent; whatever is left after SHUTDOWN_GRACE_MS is cancelled. */
static void begin_shutdown(qrl_rpc_server_t *s) {
    if (s->shutting_down) return;
    s->shutting_down = true;
    s->t_shutdown = (rpc_tag){TAG_SHUTDOWN, NULL};
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    s->pending_total++;
    for (qrl_rpc_call_t *c = s->live; c; c = c->live_next)
        if (c->loop_holds && !c->dead)
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, "server shutting down",
                                         NULL);
    s->grace_until = qrl_rpc_deadline_(SHUTDOWN_GRACE_MS);
}

/* Work the loop queued: replies, pushes, drops, shutdown. */
static void drain_outbox(qrl_rpc_server_t *s) {
    uv_mutex_lock(&s->out_mu);
    out_item *it = s->out_head;
    s->out_head = s->out_tail = NULL;
    bool shut = s->shutdown_req;
    uv_mutex_unlock(&s->out_mu);
    for (out_item *next; it; it = next) {
        next = it->next;
        qrl_rpc_call_t *c = it->call;
        switch (it->kind) {
        case OUT_MESSAGE:
            if (c->call && !c->dead) {
                sendq_append(c, it);
            } else {
                atomic_fetch_sub(&c->queued, 1);
                qrl_rpc_out_item_free_(it);
            }
            break;
        case OUT_FINISH: /* the loop let go of the call: its reference comes with the item */
            QRL_CHECK(c->loop_holds && c->call);
            c->loop_holds = false;
            s->loop_calls--;
            qrl_rpc_call_unref_(c); /* the CQ side still holds one */
            if (!c->dead) sendq_append(c, it);
            else qrl_rpc_out_item_free_(it);
            maybe_release(c);
            break;
        case OUT_DROP:
            if (c->call && !c->dead) {
                grpc_call_cancel_with_status(c->call, GRPC_STATUS_UNAVAILABLE, it->details, NULL);
                call_kill(c);
            }
            qrl_rpc_out_item_free_(it);
            break;
        }
    }
    if (shut) begin_shutdown(s);
}

static void cq_thread_main(void *arg) {
    qrl_rpc_server_t *s = arg;
    for (int i = 0; i < ACCEPT_DEPTH; i++) accept_one(s);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(
            s->cq, s->shutting_down ? s->grace_until : gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) { /* grace is over: end whatever is still open */
            grpc_server_cancel_all_calls(s->server);
            s->grace_until = gpr_inf_future(GPR_CLOCK_MONOTONIC);
            continue;
        }
        QRL_CHECK(ev.type == GRPC_OP_COMPLETE);
        rpc_tag *t = ev.tag;
        qrl_rpc_call_t *c = t->call;
        if (t->kind != TAG_KICK) s->pending_total--;
        if (c && t->kind != TAG_NEW) c->pending--;
        switch (t->kind) {
        case TAG_NEW:
            if (!ev.success) { /* shutting down: this request_call will never match */
                grpc_call_details_destroy(&c->details);
                grpc_metadata_array_destroy(&c->md);
                free(c);
                c = NULL;
                break;
            }
            if (!s->shutting_down) accept_one(s);
            on_new_call(s, c);
            break;
        case TAG_RECV: on_recv(s, c, ev.success); break;
        case TAG_CLOSE: on_close(s, c); break;
        case TAG_SEND: on_send(c, ev.success); break;
        case TAG_KICK:
            uv_mutex_lock(&s->out_mu);
            grpc_call_unref(s->kick_call);
            s->kick_call = NULL;
            grpc_metadata_array_destroy(&s->kick_md);
            grpc_slice_unref(s->kick_details);
            s->kick_pending = false;
            uv_mutex_unlock(&s->out_mu);
            drain_outbox(s);
            break;
        case TAG_SHUTDOWN: break;
        }
        if (c) maybe_release(c);
        if (s->shutting_down && s->pending_total == 0) {
            uv_mutex_lock(&s->out_mu);
            bool idle = !s->kick_pending;
            if (idle) s->cq_open = false; /* no more kicks: the queue may go */
            uv_mutex_unlock(&s->out_mu);
            if (idle) break;
        }
    }
    /* Calls the loop still holds: give back their gRPC side now; the loop frees the rest. */
    while (s->live) {
        qrl_rpc_call_t *c = s->live;
        c->loop_holds = false;
        maybe_release(c);
    }
    grpc_server_destroy(s->server);
    s->server = NULL;
    grpc_channel_destroy(s->kick_channel);
    s->kick_channel = NULL;
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    s->cq = NULL;
    grpc_shutdown();
    uv_mutex_lock(&s->in_mu);
    s->cq_done = true;
    uv_mutex_unlock(&s->in_mu);
    uv_async_send(&s->async);
}

/* ---- loop thread -------------------------------------------------------------------- */

static void server_free(qrl_rpc_server_t *s) {
    for (out_item *it = s->out_head, *next; it; it = next) { /* posted after the CQ thread left */
        next = it->next;
        if (it->kind == OUT_FINISH) qrl_rpc_call_unref_(it->call);
        qrl_rpc_out_item_free_(it);
    }
    for (in_item *it = s->in_head, *next; it; it = next) {
        next = it->next;
        qrl_rpc_call_unref_(it->call);
    }
    for (qrl_rpc_call_t *c = s->held, *next; c; c = next) { /* never released */
        next = c->held_next;
        qrl_rpc_call_unref_(c);
    }
    uv_mutex_destroy(&s->out_mu);
    uv_mutex_destroy(&s->in_mu);
    free(s->token);
    free(s);
}

static void on_async_closed(uv_handle_t *h) {
    qrl_rpc_server_t *s = h->data;
    if (s->close_cb) s->close_cb(s, s->close_user);
    server_free(s);
}

static void on_async(uv_async_t *h) {
    qrl_rpc_server_t *s = h->data;
    uv_mutex_lock(&s->in_mu);
    in_item *it = s->in_head;
    s->in_head = s->in_tail = NULL;
    bool done = s->cq_done;
    uv_mutex_unlock(&s->in_mu);
    for (in_item *next; it; it = next) {
        next = it->next; /* `it` lives inside the call, which the handler may release */
        qrl_rpc_call_t *c = it->call;
        if (it->kind == IN_REQUEST) {
            qrl_rpc_dispatch_(s, c);
        } else {
            if (!c->released && c->on_close) c->on_close(c, c->on_close_user);
            qrl_rpc_call_unref_(c);
        }
    }
    if (done && s->async_live) {
        uv_thread_join(&s->thread); /* it has posted its last event: returns at once */
        s->async_live = false;
        uv_close((uv_handle_t *)&s->async, on_async_closed);
    }
}

/* ---- server lifecycle --------------------------------------------------------------- */

static bool host_is_loopback(const char *addr) {
    return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "localhost:", 10) == 0 ||
           strncmp(addr, "[::1]:", 6) == 0 || strncmp(addr, "ipv4:127.", 9) == 0 ||
           strncmp(addr, "unix:", 5) == 0;
}

qrl_status qrl_rpc_server_new(uv_loop_t *loop, const qrl_rpc_server_opts *o, qrl_rpc_server_t **out,
                              qrl_error *err) {
    *out = NULL;
    static const qrl_rpc_server_opts defaults;
    if (!o) o = &defaults;
    const char *addr = o->addr ? o->addr : "127.0.0.1:0";
    if (!o->token && !o->allow_no_token)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rpc server %s: no bearer token configured (set a token file or $%s)",
                             addr, QRL_RPC_TOKEN_ENV);
    if (o->token) {
        qrl_status st = qrl_rpc_token_check_(o->token, "rpc server token", err);
        if (st != QRL_OK) return st;
    }
    bool tls = o->tls_cert_file || o->tls_key_file;
    if (tls && !(o->tls_cert_file && o->tls_key_file))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rpc server %s: TLS needs both tls_cert_file and tls_key_file", addr);
    if (o->tls_client_ca_file && !tls)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rpc server %s: tls_client_ca_file needs tls_cert_file and tls_key_file",
                             addr);
    char *cert = NULL, *key = NULL, *ca = NULL;
    qrl_status st = QRL_OK;
    if (tls) {
        QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_cert_file, "tls_cert_file", &cert, err), fail_pem);
        QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_key_file, "tls_key_file", &key, err), fail_pem);
        if (o->tls_client_ca_file)
            QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_client_ca_file, "tls_client_ca_file", &ca, err),
                         fail_pem);
    }

    qrl_rpc_server_t *s = calloc(1, sizeof *s);
    QRL_CHECK(s);
    s->loop = loop;
    s->token = o->token ? strdup(o->token) : NULL;
    s->token_len = o->token ? strlen(o->token) : 0;
    s->token_for_reads = o->token_for_reads;
    s->max_request = o->max_request_bytes ? o->max_request_bytes : QRL_RPC_MAX_REQUEST_DEFAULT;
    if (s->max_request > QRL_WIRE_MAX_MESSAGE_BYTES) s->max_request = QRL_WIRE_MAX_MESSAGE_BYTES;
    s->max_stream_queue = o->max_stream_queue ? o->max_stream_queue : QRL_RPC_STREAM_QUEUE_DEFAULT;
    s->max_calls = o->max_calls ? o->max_calls : QRL_RPC_MAX_CALLS_DEFAULT;
    snprintf(s->addr, sizeof s->addr, "%s", addr);

    qrl_rpc_grpc_init_();
    grpc_arg args[5];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)s->max_request;
    args[1].type = GRPC_ARG_INTEGER; /* find peers that vanished without closing (streams) */
    args[1].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[1].value.integer = 30000;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
    args[2].value.integer = 10000;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[3].value.integer = 100;
    args[4].type = GRPC_ARG_INTEGER; /* a second daemon on our port must fail, not share it */
    args[4].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[4].value.integer = 0;
    grpc_channel_args cargs = {sizeof args / sizeof *args, args};
    s->server = grpc_server_create(&cargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    grpc_server_credentials *creds;
    if (tls) {
        grpc_ssl_pem_key_cert_pair kp = {key, cert};
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &kp, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    s->port = grpc_server_add_http2_port(s->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        grpc_server_destroy(s->server);
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->cq);
        grpc_shutdown();
        free(s->token);
        free(s);
        st = qrl_error_set(err, QRL_STATUS_NETWORK,
                           "rpc server: cannot listen on %s (address in use or not local?)", addr);
        goto fail_pem;
    }
    s->kick_channel = grpc_lame_client_channel_create("qrl-kick", GRPC_STATUS_UNAVAILABLE, "kick");
    s->t_kick = (rpc_tag){TAG_KICK, NULL};
    QRL_CHECK(uv_mutex_init(&s->out_mu) == 0 && uv_mutex_init(&s->in_mu) == 0);
    QRL_CHECK(uv_async_init(loop, &s->async, on_async) == 0);
    s->async.data = s;
    s->async_live = true;
    atomic_init(&s->st_calls, 0);
    QRL_LOG_INFO("rpc", "listening addr=%s port=%d tls=%s client_certs=%s token=%s reads_need_token=%s",
                 addr, s->port, tls ? "yes" : "no", ca ? "required" : "no",
                 s->token ? "set" : "none", s->token_for_reads ? "yes" : "no");
    if (!host_is_loopback(addr) && !tls)
        QRL_LOG_WARN("rpc", "listening beyond loopback without TLS: the token travels in clear addr=%s",
                     addr);
    *out = s;
fail_pem:
    free(cert);
    free(key);
    free(ca);
    return st;
}

void qrl_rpc_server_handle(qrl_rpc_server_t *s, qrl_rpc_id id, qrl_rpc_handler_fn fn, void *user) {
    QRL_CHECK(!s->started && (unsigned)id < QRL_RPC_COUNT_);
    s->handlers[id].fn = fn;
    s->handlers[id].user = user;
}

qrl_status qrl_rpc_server_start(qrl_rpc_server_t *s, qrl_error *err) {
    QRL_CHECK(!s->started && !s->closing);
    grpc_server_start(s->server);
    s->cq_open = true;
    int rc = uv_thread_create(&s->thread, cq_thread_main, s);
    if (rc != 0) {
        s->cq_open = false;
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "rpc server %s: cannot start its thread: %s",
                             s->addr, uv_strerror(rc));
    }
    s->started = true;
    return QRL_OK;
}

int qrl_rpc_server_port(const qrl_rpc_server_t *s) { return s->port; }

void qrl_rpc_server_get_stats(const qrl_rpc_server_t *s, qrl_rpc_server_stats *o) {
    qrl_rpc_server_t *m = (qrl_rpc_server_t *)s; /* atomics are read-only here */
    o->calls = atomic_load(&m->st_calls);
    o->handled = atomic_load(&m->st_handled);
    o->unauthenticated = atomic_load(&m->st_unauth);
    o->denied = atomic_load(&m->st_denied);
    o->malformed = atomic_load(&m->st_malformed);
    o->oversized = atomic_load(&m->st_oversized);
    o->unimplemented = atomic_load(&m->st_unimpl);
    o->busy = atomic_load(&m->st_busy);
    o->streams_dropped = atomic_load(&m->st_dropped);
}

void qrl_rpc_server_close(qrl_rpc_server_t *s, qrl_rpc_server_close_fn cb, void *user) {
    QRL_CHECK(!s->closing);
    s->closing = true;
    s->close_cb = cb;
    s->close_user = user;
    QRL_LOG_INFO("rpc", "closing addr=%s port=%d", s->addr, s->port);
    if (s->started) { /* the CQ thread shuts gRPC down, then wakes the loop one last time */
        uv_mutex_lock(&s->out_mu);
        s->shutdown_req = true;
        kick_locked(s);
        uv_mutex_unlock(&s->out_mu);
        return;
    }
    /* Never started: no thread, no call; tear down here (brief, nothing to wait for). */
    s->t_shutdown = (rpc_tag){TAG_SHUTDOWN, NULL};
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    grpc_event ev; /* the server may be destroyed only once its shutdown tag is out */
    do ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    while (ev.type == GRPC_OP_COMPLETE && ev.tag != &s->t_shutdown);
    grpc_server_destroy(s->server);
    grpc_channel_destroy(s->kick_channel);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->cq);
    grpc_shutdown();
    s->async_live = false;
    uv_close((uv_handle_t *)&s->async, on_async_closed);
}

