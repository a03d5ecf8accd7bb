/* Growable byte buffer (buf.h). */
#include "core/buf.h"

#include <stdlib.h>
#include <string.h>

void qrl_buf_append(qrl_buf *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (b->len + n + 1 > c) c *= 2;
        char *np = realloc(b->p, c);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

void qrl_buf_free(qrl_buf *b) {
    free(b->p);
    *b = (qrl_buf){0};
}
