/* Pieces shared by the rpc server and client: tokens, status mapping, PEM files, gRPC
 * initialisation (rpc.h). */
#include <errno.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "rpc/rpc.h"
#include "rpc/rpc_internal.h"

/* ---- gRPC init and its log ---------------------------------------------------------- */

/* gRPC's gpr_log goes to our structured log, so a daemon's stderr has one format. */
static void grpc_log_bridge(gpr_log_func_args *a) {
    const char *file = a->file ? strrchr(a->file, '/') : NULL;
    file = file ? file + 1 : (a->file ? a->file : "?");
    switch (a->severity) {
    case GPR_LOG_SEVERITY_ERROR:
        QRL_LOG_ERROR("grpc", "%s file=%s:%d", a->message, file, a->line);
        break;
    case GPR_LOG_SEVERITY_INFO:
        QRL_LOG_INFO("grpc", "%s file=%s:%d", a->message, file, a->line);
        break;
    default:
        QRL_LOG_DEBUG("grpc", "%s file=%s:%d", a->message, file, a->line);
        break;
    }
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static void install_log(void) { gpr_set_log_function(grpc_log_bridge); }

void qrl_rpc_grpc_init_(void) {
    pthread_once(&log_once, install_log);
    grpc_init();
}

gpr_timespec qrl_rpc_deadline_(int ms) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* ---- files and tokens --------------------------------------------------------------- */

#define PEM_MAX ((size_t)1 << 20)

static qrl_status read_small_file(const char *path, const char *what, size_t max, char **out,
                                  size_t *len, qrl_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "%s %s: %s", what, path, strerror(errno));
    char *buf = malloc(max + 2);
    if (!buf) {
        fclose(f);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s %s: out of memory", what, path);
    }
    size_t n = fread(buf, 1, max + 1, f);
    bool bad = ferror(f);
    int e = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return qrl_error_set(err, QRL_STATUS_IO, "%s %s: %s", what, path, strerror(e));
    }
    if (n > max) {
        free(buf);
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s %s: larger than %zu bytes", what,
                             path, max);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return QRL_OK;
}

qrl_status qrl_rpc_read_pem_(const char *path, const char *what, char **out, qrl_error *err) {
    size_t n;
    qrl_status st = read_small_file(path, what, PEM_MAX, out, &n, err);
    if (st != QRL_OK) return st;
    if (n == 0 || !strstr(*out, "-----BEGIN ")) {
        free(*out);
        *out = NULL;
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s %s: not a PEM file (no '-----BEGIN' line)", what, path);
    }
    return QRL_OK;
}

qrl_status qrl_rpc_token_check_(const char *tok, const char *origin, qrl_error *err) {
    size_t n = strlen(tok);
    if (n == 0) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: empty token", origin);
    if (n > QRL_RPC_TOKEN_MAX)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: token of %zu bytes is longer than %d", origin, n,
                             QRL_RPC_TOKEN_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)tok[i];
        if (ch < 0x21 || ch > 0x7e)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s: byte %zu of the token is 0x%02x (printable ASCII without "
                                 "spaces expected)",
                                 origin, i, ch);
    }
    return QRL_OK;
}

qrl_status qrl_rpc_token_read(const char *path, char *out, qrl_error *err) {
    char *buf;
    size_t n;
    /* room for the token, a line ending and some trailing blanks */
    qrl_status st = read_small_file(path, "token file", QRL_RPC_TOKEN_MAX + 64, &buf, &n, err);
    if (st == QRL_STATUS_OUT_OF_RANGE)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "token file %s: longer than %d bytes", path, QRL_RPC_TOKEN_MAX);
    if (st != QRL_OK) return st;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                     buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (strlen(buf) != n) {
        free(buf);
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "token file %s: contains a NUL byte",
                             path);
    }
    char origin[600];
    snprintf(origin, sizeof origin, "token file %s", path);
    st = qrl_rpc_token_check_(buf, origin, err);
    if (st == QRL_OK) memcpy(out, buf, n + 1);
    free(buf);
    return st;
}

qrl_status qrl_rpc_token_resolve(const char *path, char *out, bool *found, qrl_error *err) {
    *found = false;
    const char *env_file = getenv(QRL_RPC_TOKEN_FILE_ENV);
    if (!path && env_file && *env_file) path = env_file;
    if (path) {
        qrl_status st = qrl_rpc_token_read(path, out, err);
        if (st == QRL_OK) *found = true;
        return st;
    }
    const char *tok = getenv(QRL_RPC_TOKEN_ENV);
    if (!tok || !*tok) return QRL_OK;
    qrl_status st = qrl_rpc_token_check_(tok, "$" QRL_RPC_TOKEN_ENV, err);
    if (st != QRL_OK) return st;
    memcpy(out, tok, strlen(tok) + 1);
    *found = true;
    return QRL_OK;
}

bool qrl_rpc_token_equal(const char *given, size_t given_len, const char *expected,
                         size_t expected_len) {
    /* Walk the expected token whatever was given: the time says nothing about how many
     * leading bytes matched. */
    volatile unsigned char diff = given_len != expected_len;
    for (size_t i = 0; i < expected_len; i++) {
        unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)(g ^ (unsigned char)expected[i]);
    }
    return diff == 0;
}

/* ---- status codes ------------------------------------------------------------------- */

grpc_status_code qrl_rpc_status_to_grpc(qrl_status st) {
    switch (st) {
    case QRL_STATUS_OK: return GRPC_STATUS_OK;
    case QRL_STATUS_INVALID_ARGUMENT:
    case QRL_STATUS_PARSE:
    case QRL_STATUS_OUT_OF_RANGE: return GRPC_STATUS_INVALID_ARGUMENT;
    case QRL_STATUS_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case QRL_STATUS_UNSUPPORTED: return GRPC_STATUS_FAILED_PRECONDITION;
    case QRL_STATUS_CORRUPT: return GRPC_STATUS_DATA_LOSS;
    case QRL_STATUS_IO:
    case QRL_STATUS_NETWORK:
    case QRL_STATUS_BUSY: return GRPC_STATUS_UNAVAILABLE;
    case QRL_STATUS_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case QRL_STATUS_TIMEOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case QRL_STATUS_PERMISSION: return GRPC_STATUS_PERMISSION_DENIED;
    case QRL_STATUS_CANCELLED: return GRPC_STATUS_CANCELLED;
    default: return GRPC_STATUS_INTERNAL;
    }
}

qrl_status qrl_rpc_status_from_grpc(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_OK: return QRL_OK;
    case GRPC_STATUS_CANCELLED: return QRL_STATUS_CANCELLED;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_ALREADY_EXISTS: return QRL_STATUS_INVALID_ARGUMENT;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return QRL_STATUS_TIMEOUT;
    case GRPC_STATUS_NOT_FOUND: return QRL_STATUS_NOT_FOUND;
    case GRPC_STATUS_PERMISSION_DENIED:
    case GRPC_STATUS_UNAUTHENTICATED: return QRL_STATUS_PERMISSION;
    /* our servers answer overload with UNAVAILABLE; RESOURCE_EXHAUSTED is gRPC's size limit */
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_OUT_OF_RANGE: return QRL_STATUS_OUT_OF_RANGE;
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_UNIMPLEMENTED: return QRL_STATUS_UNSUPPORTED;
    case GRPC_STATUS_ABORTED: return QRL_STATUS_BUSY;
    case GRPC_STATUS_UNAVAILABLE: return QRL_STATUS_NETWORK;
    case GRPC_STATUS_DATA_LOSS: return QRL_STATUS_CORRUPT;
    default: return QRL_STATUS_INTERNAL; /* UNKNOWN, INTERNAL */
    }
}

const char *qrl_rpc_grpc_code_name(grpc_status_code code) {
    static const char *names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"};
    return (unsigned)code < sizeof names / sizeof *names ? names[code] : "UNKNOWN_CODE";
}

static const char *nonempty(const char *s) { return s && *s ? s : NULL; }

void qrl_rpc_server_opts_tls(qrl_rpc_server_opts *o, const qrl_config_t *cfg) {
    o->tls_cert_file = nonempty(qrl_config_get_string(cfg, "rpc.tls_cert_file"));
    o->tls_key_file = nonempty(qrl_config_get_string(cfg, "rpc.tls_key_file"));
    o->tls_client_ca_file = nonempty(qrl_config_get_string(cfg, "rpc.tls_client_ca_file"));
    o->token_for_reads = qrl_config_get_bool(cfg, "rpc.token_for_reads");
}
