/* qrl status codes and error reporting (STYLE 1-3): the kernels' base (kernels/ depends on
 * nothing else of the tree; common/core/status.h includes this).
 *
 * Recoverable failures (bad input, I/O, network, resources) are *returned* as a
 * qrl_status and described in a caller-owned qrl_error: what went wrong and where
 * (file, field, offset).  Broken internal invariants abort through QRL_CHECK, which
 * is never compiled out.
 *
 * Convention: a function that can fail takes `qrl_error *err` as its last parameter
 * (may be NULL: then only the status is returned) and returns qrl_status. */
#ifndef QRL_BASE_STATUS_H
#define QRL_BASE_STATUS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, retriable, message).  Retriable: trying again later may succeed
 * (network, broker busy, timeout); fatal: the same call fails the same way. */
#define QRL_STATUS_TABLE(X)                                              \
    X(OK,              false, "ok")                                      \
    X(INVALID_ARGUMENT,false, "invalid argument")                        \
    X(PARSE,           false, "malformed input")                         \
    X(NOT_FOUND,       false, "not found")                               \
    X(UNSUPPORTED,     false, "unsupported")                             \
    X(OUT_OF_RANGE,    false, "value out of range")                      \
    X(CORRUPT,         false, "corrupt data")                            \
    X(IO,              true,  "I/O error")                               \
    X(NOMEM,           true,  "out of memory")                           \
    X(NETWORK,         true,  "network error")                           \
    X(TIMEOUT,         true,  "timed out")                               \
    X(BUSY,            true,  "resource busy")                           \
    X(PERMISSION,      false, "permission denied")                       \
    X(CANCELLED,       false, "cancelled")                               \
    X(CUDA,            false, "CUDA error")                              \
    X(INTERNAL,        false, "internal error")

typedef enum qrl_status {
#define QRL_X_(name, retriable, msg) QRL_STATUS_##name,
    QRL_STATUS_TABLE(QRL_X_)
#undef QRL_X_
    QRL_STATUS_COUNT_
} qrl_status;

#define QRL_OK QRL_STATUS_OK
#define QRL_ERROR_MSG_MAX 512

/* Caller-owned error description.  `msg` always holds a NUL-terminated string;
 * `trace` accumulates the call sites a failure travelled through (QRL_TRY). */
typedef struct qrl_error {
    qrl_status status;
    char msg[QRL_ERROR_MSG_MAX];
    char trace[256];
} qrl_error;

/* Name ("INVALID_ARGUMENT") and message of a status; static strings. */
const char *qrl_status_name(qrl_status st);
const char *qrl_status_message(qrl_status st);
/* True for failures where retrying later may succeed (network, timeout, busy). */
bool qrl_status_retriable(qrl_status st);

/* Fill `err` (if non-NULL) with `st` and a printf-style message and return `st`.
 * The message should name the file/field/offset involved. */
qrl_status qrl_error_set(qrl_error *err, qrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
qrl_status qrl_error_setv(qrl_error *err, qrl_status st, const char *fmt, va_list ap);
/* Reset to OK with an empty message. */
void qrl_error_clear(qrl_error *err);
/* Append " <- file:line" to err->trace (used by QRL_TRY); no-op on NULL. */
void qrl_error_trace(qrl_error *err, const char *file, int line);

/* Return the failing status of `expr` to the caller, recording the call site in the
 * `err` variable in scope. */
#define QRL_TRY(expr)                                                      \
    do {                                                                   \
        qrl_status qrl_try_st_ = (expr);                                   \
        if (qrl_try_st_ != QRL_OK) {                                       \
            qrl_error_trace(err, __FILE__, __LINE__);                      \
            return qrl_try_st_;                                            \
        }                                                                  \
    } while (0)

/* Store the failing status of `expr` in the `st` variable in scope and jump to
 * `label` (the function's one cleanup label). */
#define QRL_TRY_GOTO(expr, label)                                          \
    do {                                                                   \
        st = (expr);                                                       \
        if (st != QRL_OK) {                                                \
            qrl_error_trace(err, __FILE__, __LINE__);                      \
            goto label;                                                    \
        }                                                                  \
    } while (0)

/* Invariant check: never compiled out; prints file:line and aborts. */
#define QRL_CHECK(cond)                                                    \
    do {                                                                   \
        if (__builtin_expect(!(cond), 0))                                  \
            qrl_check_fail_(#cond, __FILE__, __LINE__);                    \
    } while (0)
__attribute__((noreturn)) void qrl_check_fail_(const char *cond, const char *file, int line);

#ifdef __cplusplus
}
#endif
#endif
