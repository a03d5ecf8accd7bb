/* Blocking gRPC client of qrl's control plane (rpc.h): unary calls with a deadline and a
 * server-stream reader.  Each call or stream has its own pluck completion queue, so one
 * client may be used from several threads at once. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "rpc/rpc.h"
#include "rpc/rpc_internal.h"
#include "wire/wire.h"

struct qrl_rpc_client {
    grpc_channel *ch;
    char target[256];
    char *auth; /* "Bearer <token>" or NULL */
    size_t max_response;
};

#define TAG_SEND ((void *)1)
#define TAG_RECV ((void *)2)
#define TAG_STATUS ((void *)3)

qrl_status qrl_rpc_client_new(const qrl_rpc_client_opts *o, qrl_rpc_client_t **out,
                              qrl_error *err) {
    *out = NULL;
    if (!o || !o->target || !*o->target)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rpc client: no target address");
    if (o->token) {
        qrl_status st = qrl_rpc_token_check_(o->token, "rpc client token", err);
        if (st != QRL_OK) return st;
    }
    if (!o->tls_cert_file != !o->tls_key_file)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rpc client %s: a client certificate needs both tls_cert_file and "
                             "tls_key_file",
                             o->target);
    if (o->tls_cert_file && !o->tls_ca_file)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rpc client %s: a client certificate needs tls_ca_file (TLS)", o->target);
    char *ca = NULL, *cert = NULL, *key = NULL;
    qrl_status st = QRL_OK;
    if (o->tls_ca_file) QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_ca_file, "tls_ca_file", &ca, err), done);
    if (o->tls_cert_file) {
        QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_cert_file, "tls_cert_file", &cert, err), done);
        QRL_TRY_GOTO(qrl_rpc_read_pem_(o->tls_key_file, "tls_key_file", &key, err), done);
    }
    qrl_rpc_client_t *c = calloc(1, sizeof *c);
    QRL_CHECK(c);
    snprintf(c->target, sizeof c->target, "%s", o->target);
    c->max_response = o->max_response_bytes ? o->max_response_bytes : QRL_RPC_MAX_RESPONSE_DEFAULT;
    if (c->max_response > QRL_WIRE_MAX_MESSAGE_BYTES) c->max_response = QRL_WIRE_MAX_MESSAGE_BYTES;
    if (o->token) {
        size_t n = strlen(o->token) + 8;
        c->auth = malloc(n);
        QRL_CHECK(c->auth);
        snprintf(c->auth, n, "Bearer %s", o->token);
    }
    qrl_rpc_grpc_init_();
    grpc_channel_credentials *creds;
    if (ca) {
        grpc_ssl_pem_key_cert_pair kp = {key, cert};
        creds = grpc_ssl_credentials_create(ca, cert ? &kp : NULL, NULL, NULL);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    size_t n = 0;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[n++].value.integer = (int)c->max_response;
    args[n].type = GRPC_ARG_INTEGER; /* control traffic goes direct, never via $http_proxy */
    args[n].key = GRPC_ARG_ENABLE_HTTP_PROXY;
    args[n++].value.integer = 0;
    if (o->tls_server_name) {
        args[n].type = GRPC_ARG_STRING;
        args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n++].value.string = (char *)o->tls_server_name;
    }
    grpc_channel_args cargs = {n, args};
    c->ch = grpc_channel_create(c->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    *out = c;
done:
    free(ca);
    free(cert);
    free(key);
    return st;
}

void qrl_rpc_client_destroy(qrl_rpc_client_t *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c->auth);
    free(c);
    grpc_shutdown();
}

/* ---- helpers ------------------------------------------------------------------------ */

static void cq_free(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
}

static grpc_byte_buffer *bytes_to_bb(const void *p, size_t len) {
    grpc_slice sl = grpc_slice_from_copied_buffer(p, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* Copy a received message out (malloc'd; a 1-byte buffer for an empty one). */
static uint8_t *bb_to_bytes(grpc_byte_buffer *bb, size_t *len) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    *len = GRPC_SLICE_LENGTH(all);
    uint8_t *p = malloc(*len ? *len : 1);
    if (p) memcpy(p, GRPC_SLICE_START_PTR(all), *len);
    grpc_slice_unref(all);
    return p;
}

static qrl_status status_error(const qrl_rpc_client_t *c, const char *path, grpc_status_code code,
                               grpc_slice details, qrl_error *err) {
    return qrl_error_set(err, qrl_rpc_status_from_grpc(code), "%s at %s: %s: %.*s", path, c->target,
                         qrl_rpc_grpc_code_name(code), (int)GRPC_SLICE_LENGTH(details),
                         (const char *)GRPC_SLICE_START_PTR(details));
}

static size_t auth_md(const qrl_rpc_client_t *c, grpc_metadata *md) {
    if (!c->auth) return 0;
    memset(md, 0, sizeof *md);
    md->key = grpc_slice_from_static_string("authorization");
    md->value = grpc_slice_from_static_string(c->auth); /* lives as long as the client */
    return 1;
}

/* ---- unary -------------------------------------------------------------------------- */

qrl_status qrl_rpc_client_call_raw(qrl_rpc_client_t *c, const char *path, const void *req,
                                   size_t req_len, int timeout_ms, uint8_t **resp, size_t *resp_len,
                                   qrl_error *err) {
    *resp = NULL;
    *resp_len = 0;
    if (timeout_ms <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: timeout %d ms must be > 0", path,
                             timeout_ms);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = qrl_rpc_deadline_(timeout_ms);
    grpc_slice method = grpc_slice_from_copied_string(path);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               deadline, NULL);
    grpc_slice_unref(method);
    grpc_metadata md;
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *send = bytes_to_bb(req, req_len), *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = auth_md(c, &md);
    ops[0].data.send_initial_metadata.metadata = &md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    qrl_status st = QRL_OK;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, TAG_SEND, NULL);
    if (e != GRPC_CALL_OK) {
        st = qrl_error_set(err, QRL_STATUS_INTERNAL, "%s at %s: cannot start the call: %s", path,
                           c->target, grpc_call_error_to_string(e));
        goto done;
    }
    /* gRPC ends the call at its deadline; the margin only guards against a stuck library */
    grpc_event ev = grpc_completion_queue_pluck(
        cq, TAG_SEND, gpr_time_add(deadline, gpr_time_from_seconds(5, GPR_TIMESPAN)), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_call_cancel(call, NULL);
        ev = grpc_completion_queue_pluck(cq, TAG_SEND, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    }
    QRL_CHECK(ev.type == GRPC_OP_COMPLETE);
    if (code != GRPC_STATUS_OK) {
        st = status_error(c, path, code, details, err);
        goto done;
    }
    if (!recv) {
        st = qrl_error_set(err, QRL_STATUS_PARSE, "%s at %s: the server sent no response message",
                           path, c->target);
        goto done;
    }
    *resp = bb_to_bytes(recv, resp_len);
    if (!*resp)
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s at %s: cannot read the response", path,
                           c->target);
done:
    grpc_byte_buffer_destroy(send);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    cq_free(cq);
    return st;
}

qrl_status qrl_rpc_client_call(qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                               int timeout_ms, ProtobufCMessage **resp, qrl_error *err) {
    *resp = NULL;
    const qrl_rpc_method *m = qrl_rpc_method_get(id);
    QRL_CHECK(!m->server_stream && req && req->descriptor == m->request);
    uint8_t *buf, *out;
    size_t len, out_len;
    QRL_TRY(qrl_wire_encode_alloc(req, &buf, &len, err));
    qrl_status st = qrl_rpc_client_call_raw(c, m->path, buf, len, timeout_ms, &out, &out_len, err);
    free(buf);
    if (st != QRL_OK) return st;
    qrl_error e;
    st = qrl_wire_decode(m->response, out, out_len, c->max_response, resp, &e);
    free(out);
    if (st != QRL_OK)
        return qrl_error_set(err, st, "%s at %s: response: %s", m->path, c->target, e.msg);
    return QRL_OK;
}

/* ---- server stream ------------------------------------------------------------------ */

struct qrl_rpc_client_stream {
    qrl_rpc_client_t *client;
    const qrl_rpc_method *m;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata md;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code code;
    grpc_slice details;
    grpc_byte_buffer *recv;
    bool recv_pending, status_pending, asked_md, ended;
    qrl_status end_st;
    char end_msg[QRL_ERROR_MSG_MAX];
};

/* The call is over: collect its status (the status batch completes right after). */
static qrl_status stream_end(qrl_rpc_client_stream_t *s, qrl_error *err) {
    if (s->status_pending) {
        grpc_event ev =
            grpc_completion_queue_pluck(s->cq, TAG_STATUS, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        QRL_CHECK(ev.type == GRPC_OP_COMPLETE);
        s->status_pending = false;
    }
    s->ended = true;
    qrl_error e;
    s->end_st = s->code == GRPC_STATUS_OK ? QRL_OK
                                          : status_error(s->client, s->m->path, s->code, s->details, &e);
    if (s->end_st != QRL_OK) snprintf(s->end_msg, sizeof s->end_msg, "%s", e.msg);
    return s->end_st == QRL_OK ? QRL_OK : qrl_error_set(err, s->end_st, "%s", s->end_msg);
}

qrl_status qrl_rpc_client_stream_open(qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                                      int timeout_ms, qrl_rpc_client_stream_t **out,
                                      qrl_error *err) {
    *out = NULL;
    const qrl_rpc_method *m = qrl_rpc_method_get(id);
    QRL_CHECK(m->server_stream && req && req->descriptor == m->request);
    uint8_t *buf;
    size_t len;
    QRL_TRY(qrl_wire_encode_alloc(req, &buf, &len, err));
    qrl_rpc_client_stream_t *s = calloc(1, sizeof *s);
    QRL_CHECK(s);
    s->client = c;
    s->m = m;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        timeout_ms > 0 ? qrl_rpc_deadline_(timeout_ms) : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice method = grpc_slice_from_static_string(m->path);
    s->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, method, NULL,
                                       deadline, NULL);
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trail_md);
    s->details = grpc_empty_slice();
    grpc_byte_buffer *send = bytes_to_bb(buf, len);
    free(buf);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = auth_md(c, &s->md);
    ops[0].data.send_initial_metadata.metadata = &s->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    QRL_CHECK(grpc_call_start_batch(s->call, ops, 3, TAG_SEND, NULL) == GRPC_CALL_OK);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trail_md;
    ops[0].data.recv_status_on_client.status = &s->code;
    ops[0].data.recv_status_on_client.status_details = &s->details;
    QRL_CHECK(grpc_call_start_batch(s->call, ops, 1, TAG_STATUS, NULL) == GRPC_CALL_OK);
    s->status_pending = true;
    grpc_event ev = grpc_completion_queue_pluck(s->cq, TAG_SEND, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    QRL_CHECK(ev.type == GRPC_OP_COMPLETE);
    grpc_byte_buffer_destroy(send);
    if (!ev.success) { /* could not even send: the status says why */
        qrl_status st = stream_end(s, err);
        if (st == QRL_OK)
            st = qrl_error_set(err, QRL_STATUS_NETWORK, "%s at %s: the request could not be sent",
                               m->path, c->target);
        qrl_rpc_client_stream_close(s);
        return st;
    }
    *out = s;
    return QRL_OK;
}

qrl_status qrl_rpc_client_stream_next(qrl_rpc_client_stream_t *s, int wait_ms, ProtobufCMessage **msg,
                                      qrl_error *err) {
    *msg = NULL;
    if (s->ended)
        return s->end_st == QRL_OK ? QRL_OK : qrl_error_set(err, s->end_st, "%s", s->end_msg);
    if (!s->recv_pending) {
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        size_t n = 0;
        if (!s->asked_md) {
            ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
            ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
            s->asked_md = true;
        }
        ops[n].op = GRPC_OP_RECV_MESSAGE;
        ops[n++].data.recv_message.recv_message = &s->recv;
        QRL_CHECK(grpc_call_start_batch(s->call, ops, n, TAG_RECV, NULL) == GRPC_CALL_OK);
        s->recv_pending = true;
    }
    gpr_timespec until =
        wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME) : qrl_rpc_deadline_(wait_ms);
    grpc_event ev = grpc_completion_queue_pluck(s->cq, TAG_RECV, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT)
        return qrl_error_set(err, QRL_STATUS_TIMEOUT, "%s at %s: no message within %d ms",
                             s->m->path, s->client->target, wait_ms);
    s->recv_pending = false;
    if (!ev.success || !s->recv) return stream_end(s, err);
    size_t len;
    uint8_t *bytes = bb_to_bytes(s->recv, &len);
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    if (!bytes)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s at %s: cannot read a message", s->m->path,
                             s->client->target);
    qrl_error e;
    qrl_status st = qrl_wire_decode(s->m->response, bytes, len, s->client->max_response, msg, &e);
    free(bytes);
    if (st != QRL_OK)
        return qrl_error_set(err, st, "%s at %s: stream message: %s", s->m->path, s->client->target,
                             e.msg);
    return QRL_OK;
}

bool qrl_rpc_client_stream_ended(const qrl_rpc_client_stream_t *s) { return s->ended; }

void qrl_rpc_client_stream_close(qrl_rpc_client_stream_t *s) {
    if (!s) return;
    if (s->recv_pending || s->status_pending) grpc_call_cancel(s->call, NULL);
    if (s->recv_pending)
        grpc_completion_queue_pluck(s->cq, TAG_RECV, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (s->status_pending)
        grpc_completion_queue_pluck(s->cq, TAG_STATUS, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (s->recv) grpc_byte_buffer_destroy(s->recv);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    grpc_call_unref(s->call);
    cq_free(s->cq);
    free(s);
}
