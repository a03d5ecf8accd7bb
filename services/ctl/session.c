/* qrlctl: talking to the servers: RPC clients with the operator's token and TLS files,
 * calls with the --timeout deadline, failures reported as text or JSON with the exit
 * code of their status (ctl.h). */
#include <jansson.h>
#include <stdio.h>

#include "ctl.h"

int ctl_exit_code(qrl_status st) {
    switch (st) {
    case QRL_OK: return EXIT_OK;
    case QRL_STATUS_NETWORK:
    case QRL_STATUS_TIMEOUT:
    case QRL_STATUS_BUSY: return EXIT_UNREACHABLE;
    case QRL_STATUS_INVALID_ARGUMENT:
    case QRL_STATUS_NOT_FOUND:
    case QRL_STATUS_UNSUPPORTED:
    case QRL_STATUS_PERMISSION:
    case QRL_STATUS_OUT_OF_RANGE: return EXIT_REFUSED;
    default: return EXIT_SERVER;
    }
}

/* Report a failure (stderr; and stdout as JSON with --json); returns the exit code. */
int ctl_fail(const ctl *x, int code, qrl_status st, const char *msg) {
    fprintf(stderr, "qrlctl: %s\n", msg);
    if (x->json) {
        json_t *o = json_pack("{s:{s:s,s:s,s:b,s:i}}", "error", "status", qrl_status_name(st),
                              "message", msg, "retriable", qrl_status_retriable(st), "exit", code);
        if (o) {
            json_dumpf(o, stdout, JSON_INDENT(2));
            fputc('\n', stdout);
            json_decref(o);
        }
    }
    return code;
}

int ctl_fail_err(const ctl *x, const qrl_error *err) {
    return ctl_fail(x, ctl_exit_code(err->status), err->status, err->msg);
}

void ctl_print_json(json_t *o) {
    json_dumpf(o, stdout, JSON_INDENT(2));
    fputc('\n', stdout);
    json_decref(o);
}

qrl_status ctl_client_for(const ctl *x, const char *target, qrl_rpc_client_t **out,
                             qrl_error *err) {
    qrl_rpc_client_opts o = {.target = target,
                             .token = x->have_token ? x->token : NULL,
                             .tls_ca_file = x->tls_ca,
                             .tls_cert_file = x->tls_cert,
                             .tls_key_file = x->tls_key,
                             .tls_server_name = x->tls_name};
    return qrl_rpc_client_new(&o, out, err);
}

qrl_status ctl_call(const ctl *x, qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                       ProtobufCMessage **resp, qrl_error *err) {
    return qrl_rpc_client_call(c, id, req, x->timeout_ms, resp, err);
}
