/* Status table and qrl_error (status.h). */
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    bool retriable;
    const char *msg;
} status_table[] = {
#define QRL_X_(name, retriable, msg) {#name, retriable, msg},
    QRL_STATUS_TABLE(QRL_X_)
#undef QRL_X_
};

const char *qrl_status_name(qrl_status st) {
    return (unsigned)st < QRL_STATUS_COUNT_ ? status_table[st].name : "UNKNOWN";
}

const char *qrl_status_message(qrl_status st) {
    return (unsigned)st < QRL_STATUS_COUNT_ ? status_table[st].msg : "unknown status";
}

bool qrl_status_retriable(qrl_status st) {
    return (unsigned)st < QRL_STATUS_COUNT_ && status_table[st].retriable;
}

qrl_status qrl_error_setv(qrl_error *err, qrl_status st, const char *fmt, va_list ap) {
    if (err) {
        err->status = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        err->trace[0] = '\0';
    }
    return st;
}

qrl_status qrl_error_set(qrl_error *err, qrl_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    qrl_error_setv(err, st, fmt, ap);
    va_end(ap);
    return st;
}

void qrl_error_clear(qrl_error *err) {
    if (!err) return;
    err->status = QRL_OK;
    err->msg[0] = '\0';
    err->trace[0] = '\0';
}

void qrl_error_trace(qrl_error *err, const char *file, int line) {
    if (!err) return;
    size_t n = strlen(err->trace);
    if (n + 8 >= sizeof err->trace) return; /* full: keep the innermost sites */
    const char *base = strrchr(file, '/');
    snprintf(err->trace + n, sizeof err->trace - n, " <- %s:%d", base ? base + 1 : file, line);
}

void qrl_check_fail_(const char *cond, const char *file, int line) {
    fprintf(stderr, "qrl: internal check failed: %s at %s:%d\n", cond, file, line);
    fflush(stderr);
    abort();
}
