/* A growable byte buffer: appends double the capacity as needed and keep one NUL after the
 * bytes (so text can be used as a C string; binary users ignore it).  An allocation failure
 * sets `oom` and turns later appends into no-ops, so a builder checks once at the end.
 * Zero-initialize (qrl_buf b = {0}); the caller frees p (free(), or qrl_buf_free). */
#ifndef QRL_CORE_BUF_H
#define QRL_CORE_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct qrl_buf {
    char *p;     /* len bytes, then a NUL; NULL before the first append */
    size_t len, cap;
    bool oom;
} qrl_buf;

/* Append n bytes of data (n may be 0: the buffer then exists and is NUL-terminated). */
void qrl_buf_append(qrl_buf *b, const void *data, size_t n);
/* Free the bytes and reset to empty. */
void qrl_buf_free(qrl_buf *b);

#endif
