#include "io/npy.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "io/atomic_file.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c writes and reads the host's bytes as little-endian"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER (1u << 20)

/* ---- writer ------------------------------------------------------------------------------ */

qrl_status qrl_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                             qrl_error *err) {
    if (ndim < 0 || ndim > QRL_TENSOR_MAX_DIMS)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: field shape: ndim %d outside [0, %d]", path, ndim,
                             QRL_TENSOR_MAX_DIMS);
    uint64_t numel = 1;
    char dims[QRL_TENSOR_MAX_DIMS * 24 + 4] = "";
    size_t dl = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) ||
            numel > (uint64_t)INT64_MAX / sizeof(float))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s: field shape: dimension %d = %lld is negative or overflows",
                                 path, i, (long long)shape[i]);
        dl += (size_t)snprintf(dims + dl, sizeof dims - dl, "%s%lld", i ? ", " : "",
                               (long long)shape[i]);
    }
    if (ndim == 1) dims[dl++] = ',', dims[dl] = '\0'; /* a Python 1-tuple */

    /* Byte-for-byte what numpy.save writes: the dict, 21 - len(str(shape[0])) spare spaces
     * (numpy's GROWTH_AXIS_MAX_DIGITS), then spaces and a final '\n' so that magic +
     * version + length + header is a multiple of 64 (numpy never pads by 0: by 64 then). */
    char header[640];
    int hl = snprintf(header, sizeof header,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    if (ndim > 0) {
        char d0[24];
        int grow = 21 - snprintf(d0, sizeof d0, "%lld", (long long)shape[0]);
        for (; grow > 0; grow--) header[hl++] = ' ';
    }
    size_t padlen = 64 - ((size_t)(10 + hl + 1) % 64);
    memset(header + hl, ' ', padlen);
    header[hl + padlen] = '\n';
    uint16_t hlen = (uint16_t)(hl + padlen + 1);

    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    qrl_status st;
    qrl_atomic_file af;
    QRL_TRY(qrl_atomic_file_open(path, &af, err));
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, pre, 10, err), fail);
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, header, hlen, err), fail);
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, data, numel * sizeof(float), err), fail);
    return qrl_atomic_file_commit(&af, err);
fail:
    qrl_atomic_file_abort(&af);
    return st;
}

/* ---- header dict parser ---------------------------------------------------------------- */

typedef struct cursor {
    const char *base, *p, *end;
    const char *path;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static qrl_status bad(cursor *c, const char *field, const char *what, qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field %s: %s (header byte %ld)", c->path,
                         field, what, (long)(c->p - c->base));
}

/* A Python string literal without escapes: 'abc' or "abc"; copied into buf. */
static qrl_status parse_str(cursor *c, const char *field, char *buf, size_t cap, qrl_error *err) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return bad(c, field, "expected a quoted string", err);
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (n + 1 >= cap || *c->p == '\\') return bad(c, field, "string too long or escaped", err);
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return bad(c, field, "unterminated string", err);
    c->p++;
    buf[n] = '\0';
    return QRL_OK;
}

static qrl_status parse_shape(cursor *c, int *ndim, int64_t *shape, qrl_error *err) {
    if (!eat(c, '(')) return bad(c, "shape", "expected a tuple '('", err);
    *ndim = 0;
    for (;;) {
        if (eat(c, ')')) return QRL_OK;
        skip_ws(c);
        if (c->p >= c->end || !isdigit((unsigned char)*c->p))
            return bad(c, "shape", "expected a non-negative integer", err);
        if (*ndim >= QRL_TENSOR_MAX_DIMS)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                 "%s: field shape: more than %d dimensions", c->path,
                                 QRL_TENSOR_MAX_DIMS);
        int64_t v = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            if (v > (INT64_MAX - 9) / 10) return bad(c, "shape", "dimension too large", err);
            v = v * 10 + (*c->p++ - '0');
        }
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
        shape[(*ndim)++] = v;
        if (eat(c, ',')) continue;
        if (eat(c, ')')) return QRL_OK;
        return bad(c, "shape", "expected ',' or ')'", err);
    }
}

typedef struct npy_header {
    char descr[16];
    int fortran; /* -1 until seen */
    int ndim;    /* -1 until seen */
    int64_t shape[QRL_TENSOR_MAX_DIMS];
} npy_header;

static qrl_status parse_dict(cursor *c, npy_header *h, qrl_error *err) {
    h->descr[0] = '\0';
    h->fortran = h->ndim = -1;
    if (!eat(c, '{')) return bad(c, "header", "expected a dict '{'", err);
    for (;;) {
        if (eat(c, '}')) break;
        char key[32];
        QRL_TRY(parse_str(c, "header", key, sizeof key, err));
        if (!eat(c, ':')) return bad(c, key, "expected ':'", err);
        skip_ws(c);
        if (strcmp(key, "descr") == 0) {
            QRL_TRY(parse_str(c, "descr", h->descr, sizeof h->descr, err));
        } else if (strcmp(key, "fortran_order") == 0) {
            size_t left = (size_t)(c->end - c->p);
            if (left >= 4 && memcmp(c->p, "True", 4) == 0) h->fortran = 1, c->p += 4;
            else if (left >= 5 && memcmp(c->p, "False", 5) == 0) h->fortran = 0, c->p += 5;
            else return bad(c, "fortran_order", "expected True or False", err);
        } else if (strcmp(key, "shape") == 0) {
            QRL_TRY(parse_shape(c, &h->ndim, h->shape, err));
        } else {
            return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field header: unknown key '%s'",
                                 c->path, key);
        }
        if (eat(c, ',')) continue;
        if (eat(c, '}')) break;
        return bad(c, key, "expected ',' or '}'", err);
    }
    const char *missing = !h->descr[0] ? "descr" : h->fortran < 0 ? "fortran_order"
                                                 : h->ndim < 0    ? "shape"
                                                                  : NULL;
    if (missing)
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field %s: missing from the header",
                             c->path, missing);
    return QRL_OK;
}

/* ---- reader ------------------------------------------------------------------------------ */

static qrl_status read_header(FILE *f, const char *path, long file_size, npy_header *h,
                              long *data_start, qrl_error *err) {
    unsigned char pre[12];
    if (file_size < 10 || fread(pre, 1, 10, f) != 10)
        return qrl_error_set(err, QRL_STATUS_PARSE,
                             "%s: field magic: file is %ld bytes, too short for a .npy header",
                             path, file_size);
    if (memcmp(pre, NPY_MAGIC, 6) != 0)
        return qrl_error_set(err, QRL_STATUS_PARSE,
                             "%s: field magic: not a .npy file (no \\x93NUMPY)", path);
    uint32_t hlen;
    long prefix;
    if (pre[6] == 1 && pre[7] == 0) {
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
        prefix = 10;
    } else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0) {
        if (file_size < 12 || fread(pre + 10, 1, 2, f) != 2)
            return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field header_len: truncated", path);
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 |
               (uint32_t)pre[11] << 24;
        prefix = 12;
    } else {
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: field version: %d.%d is not 1.0, 2.0 or 3.0", path, pre[6],
                             pre[7]);
    }
    if (hlen > NPY_MAX_HEADER || (long)hlen > file_size - prefix)
        return qrl_error_set(err, QRL_STATUS_PARSE,
                             "%s: field header_len: %u bytes exceeds the file (%ld bytes)", path,
                             hlen, file_size);
    char *text = malloc(hlen + 1);
    if (!text) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    qrl_status st = QRL_OK;
    if (fread(text, 1, hlen, f) != hlen) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: read error in the header", path);
    } else {
        cursor c = {text, text, text + hlen, path};
        st = parse_dict(&c, h, err);
    }
    free(text);
    *data_start = prefix + (long)hlen;
    return st;
}

qrl_status qrl_npy_read(const char *path, qrl_tensor *out, qrl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    qrl_status st = QRL_OK;
    void *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: not a readable regular file", path);
        goto done;
    }
    npy_header h;
    long data_start = 0;
    st = read_header(f, path, (long)sb.st_size, &h, &data_start, err);
    if (st != QRL_OK) goto done;

    qrl_dtype dt;
    if (strcmp(h.descr, "<f4") == 0) dt = QRL_DTYPE_F32;
    else if (strcmp(h.descr, "<i4") == 0) dt = QRL_DTYPE_I32;
    else if (strcmp(h.descr, "<i8") == 0) dt = QRL_DTYPE_I64;
    else {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                           "%s: field descr: '%s' is not one of '<f4', '<i4', '<i8'", path,
                           h.descr);
        goto done;
    }
    if (h.fortran) {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                           "%s: field fortran_order: only C order is supported", path);
        goto done;
    }
    uint64_t numel = 1, nbytes;
    int overflow = 0;
    for (int i = 0; i < h.ndim; i++)
        overflow |= __builtin_mul_overflow(numel, (uint64_t)h.shape[i], &numel);
    overflow |= __builtin_mul_overflow(numel, (uint64_t)qrl_dtype_size(dt), &nbytes);
    uint64_t have = (uint64_t)(sb.st_size - data_start);
    if (overflow || nbytes != have) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "%s: field shape: the file holds %llu data bytes, the shape and "
                           "descr '%s' need %s%llu",
                           path, (unsigned long long)have, h.descr, overflow ? "more than " : "",
                           (unsigned long long)(overflow ? UINT64_MAX : nbytes));
        goto done;
    }
    st = qrl_alloc_aligned((size_t)nbytes, 0, &buf, err);
    if (st != QRL_OK) goto done;
    if (nbytes && fread(buf, 1, (size_t)nbytes, f) != nbytes) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: read error in the data", path);
        goto done;
    }
    qrl_tensor_init(out, dt, h.ndim, h.shape, buf);
    buf = NULL;
done:
    qrl_free_aligned(buf);
    fclose(f);
    return st;
}

void qrl_npy_free(qrl_tensor *t) {
    if (!t) return;
    qrl_free_aligned(t->data);
    t->data = NULL;
}
