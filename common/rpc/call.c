/* The call API of the rpc server, used on the loop thread (rpc.h): replies, stream pushes,
 * status, the shared Set handler.  Nothing here waits: a reply is encoded and queued for
 * the CQ thread (server.c), which sends it. */
#include <grpc/grpc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "rpc/rpc.h"
#include "rpc/server_internal.h"
#include "wire/wire.h"

static void held_add(qrl_rpc_server_t *s, qrl_rpc_call_t *c) {
    c->held_prev = NULL;
    c->held_next = s->held;
    if (s->held) s->held->held_prev = c;
    s->held = c;
}

static void held_remove(qrl_rpc_server_t *s, qrl_rpc_call_t *c) {
    if (c->held_prev) c->held_prev->held_next = c->held_next;
    else s->held = c->held_next;
    if (c->held_next) c->held_next->held_prev = c->held_prev;
    c->held_prev = c->held_next = NULL;
}

/* Hand the call back to the CQ thread with its last words; the loop's reference travels
 * with the item.  `bytes` and `details` (malloc'd or NULL) are taken. */
static void call_release(qrl_rpc_call_t *c, uint8_t *bytes, size_t len, grpc_status_code code,
                         char *details) {
    QRL_CHECK(!c->released);
    c->released = true;
    held_remove(c->server, c);
    out_item *it = calloc(1, sizeof *it);
    QRL_CHECK(it);
    it->kind = OUT_FINISH;
    it->call = c;
    it->bytes = bytes;
    it->len = len;
    it->code = code;
    it->details = details;
    qrl_rpc_outbox_post_(c->server, it);
}

static char *vformat(const char *fmt, va_list ap) {
    char *msg = malloc(QRL_ERROR_MSG_MAX);
    QRL_CHECK(msg);
    vsnprintf(msg, QRL_ERROR_MSG_MAX, fmt, ap);
    return msg;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    return msg;
}

void qrl_rpc_dispatch_(qrl_rpc_server_t *s, qrl_rpc_call_t *c) {
    held_add(s, c);
    if (s->closing) {
        call_release(c, NULL, 0, GRPC_STATUS_UNAVAILABLE,
                     format("%s: server shutting down", c->method->path));
        return;
    }
    s->handlers[c->method->id].fn(c, c->request, s->handlers[c->method->id].user);
}

/* ---- calls -------------------------------------------------------------------------- */

const qrl_rpc_method *qrl_rpc_call_method(const qrl_rpc_call_t *c) { return c->method; }
const char *qrl_rpc_call_peer(const qrl_rpc_call_t *c) { return c->peer; }

bool qrl_rpc_call_cancelled(const qrl_rpc_call_t *c) {
    return c->dropped || atomic_load(&((qrl_rpc_call_t *)c)->cancelled);
}

void qrl_rpc_call_on_close(qrl_rpc_call_t *c, qrl_rpc_call_close_fn fn, void *user) {
    QRL_CHECK(!c->released);
    c->on_close = fn;
    c->on_close_user = user;
}

void qrl_rpc_call_reply(qrl_rpc_call_t *c, ProtobufCMessage *resp) {
    QRL_CHECK(!c->released && !c->method->server_stream);
    QRL_CHECK(resp && resp->descriptor == c->method->response);
    uint8_t *buf;
    size_t len;
    qrl_error e;
    if (qrl_wire_encode_alloc(resp, &buf, &len, &e) != QRL_OK) {
        QRL_LOG_ERROR("rpc", "cannot encode a reply method=%s error=\"%s\"", c->method->path, e.msg);
        call_release(c, NULL, 0, GRPC_STATUS_INTERNAL,
                     format("%s: cannot encode the response: %s", c->method->path, e.msg));
        return;
    }
    call_release(c, buf, len, GRPC_STATUS_OK, NULL);
}

void qrl_rpc_call_finish(qrl_rpc_call_t *c, qrl_status st, const char *fmt, ...) {
    QRL_CHECK(!c->released);
    QRL_CHECK(st != QRL_OK || c->method->server_stream);
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    call_release(c, NULL, 0, qrl_rpc_status_to_grpc(st), msg);
}

qrl_status qrl_rpc_call_push(qrl_rpc_call_t *c, ProtobufCMessage *msg, qrl_error *err) {
    QRL_CHECK(!c->released && c->method->server_stream);
    QRL_CHECK(msg && msg->descriptor == c->method->response);
    qrl_rpc_server_t *s = c->server;
    if (c->dropped || atomic_load(&c->cancelled))
        return qrl_error_set(err, QRL_STATUS_CANCELLED, "%s: stream to %s is closed",
                             c->method->path, c->peer);
    unsigned q = atomic_load(&c->queued);
    if (q >= s->max_stream_queue) {
        c->dropped = true;
        atomic_fetch_add(&s->st_dropped, 1);
        QRL_LOG_WARN("rpc", "dropping stream method=%s peer=%s queued=%u", c->method->path,
                     c->peer, q);
        out_item *it = calloc(1, sizeof *it);
        QRL_CHECK(it);
        it->kind = OUT_DROP;
        it->call = c;
        it->details = format("stream dropped: %u messages unsent (client not reading)", q);
        qrl_rpc_outbox_post_(s, it);
        return qrl_error_set(err, QRL_STATUS_CANCELLED,
                             "%s: stream to %s dropped: %u messages unsent (client not reading)",
                             c->method->path, c->peer, q);
    }
    out_item *it = calloc(1, sizeof *it);
    QRL_CHECK(it);
    qrl_status st = qrl_wire_encode_alloc(msg, &it->bytes, &it->len, err);
    if (st != QRL_OK) {
        free(it);
        return st;
    }
    it->kind = OUT_MESSAGE;
    it->call = c;
    atomic_fetch_add(&c->queued, 1);
    qrl_rpc_outbox_post_(s, it);
    return QRL_OK;
}

void qrl_rpc_call_config_set(qrl_rpc_call_t *c, qrl_config_t *cfg, const Qrl__SetRequest *req) {
    const char *key = req->key ? req->key : "";
    char old_text[1024] = "", new_text[1024] = "";
    qrl_config_value_text(cfg, key, old_text, sizeof old_text);
    qrl_error e;
    qrl_status st = qrl_config_set(cfg, key, req->value ? req->value : "", &e);
    if (st != QRL_OK) {
        QRL_LOG_INFO("rpc", "config set refused key=%s peer=%s status=%s", key, c->peer,
                     qrl_status_name(st));
        /* unknown key or bad value: the caller's argument; immutable: the server's state */
        grpc_status_code code = st == QRL_STATUS_UNSUPPORTED ? GRPC_STATUS_FAILED_PRECONDITION
                                                             : GRPC_STATUS_INVALID_ARGUMENT;
        call_release(c, NULL, 0, code, format("%s", e.msg));
        return;
    }
    qrl_config_value_text(cfg, key, new_text, sizeof new_text);
    QRL_LOG_INFO("rpc", "config set key=%s old=%s new=%s peer=%s", key, old_text, new_text, c->peer);
    Qrl__SetResponse r = QRL__SET_RESPONSE__INIT;
    r.key = (char *)key;
    r.old_value = old_text;
    r.new_value = new_text;
    qrl_rpc_call_reply(c, &r.base);
}
