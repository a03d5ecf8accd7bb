/* Encoding, decoding and schema-version checks of qrl messages (wire.h).
 *
 * Decoding walks the wire structure before protobuf-c sees it, for two reasons:
 * protobuf-c only says "failed", while operators need the byte offset and the field; and
 * it bounds what the unpacked message will allocate (2-byte empty submessages expand to
 * a ~200-byte struct each), so a hostile 1 MB record cannot make a daemon allocate GBs. */
#include "wire/wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- message table ------------------------------------------------------------------ */

static const ProtobufCMessageDescriptor *const messages[] = {
    &qrl__sampling_params__descriptor,
    &qrl__dataset_position__descriptor,
    &qrl__timings__descriptor,
    &qrl__prompt_group__descriptor,
    &qrl__response__descriptor,
    &qrl__group_result__descriptor,
    &qrl__trace_chunk__descriptor,
    &qrl__dead_letter__descriptor,
    &qrl__tensor_meta__descriptor,
    &qrl__weight_manifest__descriptor,
    &qrl__weight_bucket_header__descriptor,
    &qrl__replica_info__descriptor,
    &qrl__register_request__descriptor,
    &qrl__register_response__descriptor,
    &qrl__heartbeat_request__descriptor,
    &qrl__heartbeat_response__descriptor,
    &qrl__watch_versions_request__descriptor,
    &qrl__version_event__descriptor,
    &qrl__status_request__descriptor,
    &qrl__learner_status__descriptor,
    &qrl__rollout_status__descriptor,
    &qrl__pause_request__descriptor,
    &qrl__resume_request__descriptor,
    &qrl__drain_request__descriptor,
    &qrl__shutdown_request__descriptor,
    &qrl__control_response__descriptor,
    &qrl__checkpoint_request__descriptor,
    &qrl__checkpoint_response__descriptor,
    &qrl__set_request__descriptor,
    &qrl__set_response__descriptor,
    &qrl__list_replicas_request__descriptor,
    &qrl__replica_entry__descriptor,
    &qrl__list_replicas_response__descriptor,
};
#define N_MESSAGES (sizeof messages / sizeof messages[0])

size_t qrl_wire_message_count(void) { return N_MESSAGES; }

const ProtobufCMessageDescriptor *qrl_wire_message_at(size_t i) {
    QRL_CHECK(i < N_MESSAGES);
    return messages[i];
}

const ProtobufCMessageDescriptor *qrl_wire_message_find(const char *name) {
    for (size_t i = 0; i < N_MESSAGES; i++)
        if (strcmp(messages[i]->short_name, name) == 0) return messages[i];
    return NULL;
}

/* ---- reflection helpers ------------------------------------------------------------- */

static void *member(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    return (char *)m + f->offset;
}

static size_t repeated_count(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    return *(const size_t *)((const char *)m + f->quantifier_offset);
}

/* Field 1 must be `uint32 schema_version` in every message (checked by the tests). */
static uint32_t *version_field(const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(m->descriptor, 1);
    QRL_CHECK(f && f->type == PROTOBUF_C_TYPE_UINT32 && strcmp(f->name, "schema_version") == 0);
    return (uint32_t *)member(m, f);
}

/* Calls fn on every nested message of m (one level), with its field and index. */
typedef int (*child_fn)(ProtobufCMessage *child, const ProtobufCFieldDescriptor *f, size_t index,
                        int repeated, void *ctx);

static int for_each_child(const ProtobufCMessage *m, child_fn fn, void *ctx) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            ProtobufCMessage **arr = *(ProtobufCMessage ***)member(m, f);
            size_t n = repeated_count(m, f);
            for (size_t k = 0; k < n; k++)
                if (arr[k] && fn(arr[k], f, k, 1, ctx)) return 1;
        } else {
            ProtobufCMessage *sub = *(ProtobufCMessage **)member(m, f);
            if (sub && fn(sub, f, 0, 0, ctx)) return 1;
        }
    }
    return 0;
}

static int stamp_child(ProtobufCMessage *child, const ProtobufCFieldDescriptor *f, size_t index,
                       int repeated, void *ctx) {
    qrl_wire_stamp(child);
    return 0;
}

void qrl_wire_stamp(ProtobufCMessage *msg) {
    *version_field(msg) = QRL_WIRE_SCHEMA_VERSION;
    for_each_child(msg, stamp_child, NULL);
}

/* ---- field paths ("responses[2].timings") for messages ------------------------------ */

typedef struct path {
    char buf[256];
    size_t len;
} path;

/* Appends ".name" or ".name[i]" (no dot at the root); returns the old length. */
static size_t path_push(path *p, const char *name, size_t index, int repeated) {
    size_t old = p->len;
    int n = repeated ? snprintf(p->buf + old, sizeof p->buf - old, "%s%s[%zu]",
                                old ? "." : "", name, index)
                     : snprintf(p->buf + old, sizeof p->buf - old, "%s%s", old ? "." : "", name);
    if (n > 0) p->len = old + (size_t)n < sizeof p->buf ? old + (size_t)n : sizeof p->buf - 1;
    return old;
}

static void path_pop(path *p, size_t old) {
    p->len = old;
    p->buf[old] = '\0';
}

/* ---- schema versions ---------------------------------------------------------------- */

typedef struct version_ctx {
    path p;
    const char *top;
    qrl_error *err;
    qrl_status st;
} version_ctx;

static int check_one(const ProtobufCMessage *m, version_ctx *c);

static int check_child(ProtobufCMessage *child, const ProtobufCFieldDescriptor *f, size_t index,
                       int repeated, void *ctx) {
    version_ctx *c = ctx;
    size_t old = path_push(&c->p, f->name, index, repeated);
    int stop = check_one(child, c);
    path_pop(&c->p, old);
    return stop;
}

static int check_one(const ProtobufCMessage *m, version_ctx *c) {
    uint32_t v = *version_field(m);
    if (v < QRL_WIRE_SCHEMA_VERSION_MIN || v > QRL_WIRE_SCHEMA_VERSION) {
        char expected[32];
        if (QRL_WIRE_SCHEMA_VERSION_MIN == QRL_WIRE_SCHEMA_VERSION)
            snprintf(expected, sizeof expected, "%u", QRL_WIRE_SCHEMA_VERSION);
        else
            snprintf(expected, sizeof expected, "%u..%u", QRL_WIRE_SCHEMA_VERSION_MIN,
                     QRL_WIRE_SCHEMA_VERSION);
        c->st = qrl_error_set(c->err, QRL_STATUS_UNSUPPORTED,
                              "%s%s%s: schema_version got %u%s, expected %s", c->top,
                              c->p.len ? "." : "", c->p.buf, v, v == 0 ? " (missing)" : "",
                              expected);
        return 1;
    }
    return for_each_child(m, check_child, c);
}

qrl_status qrl_wire_check_versions(const ProtobufCMessage *msg, qrl_error *err) {
    version_ctx c = {.top = msg->descriptor->short_name, .err = err, .st = QRL_OK};
    check_one(msg, &c);
    return c.st;
}

/* ---- encode ------------------------------------------------------------------------- */

size_t qrl_wire_encoded_size(ProtobufCMessage *msg) {
    qrl_wire_stamp(msg);
    return protobuf_c_message_get_packed_size(msg);
}

qrl_status qrl_wire_encode(ProtobufCMessage *msg, uint8_t *buf, size_t cap, size_t *len,
                           qrl_error *err) {
    *len = 0;
    size_t need = qrl_wire_encoded_size(msg);
    if (need > QRL_WIRE_MAX_MESSAGE_BYTES)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: encoding of %zu bytes exceeds the %zu-byte message cap",
                             msg->descriptor->short_name, need, QRL_WIRE_MAX_MESSAGE_BYTES);
    if (need > cap)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: encoding needs %zu bytes, buffer holds %zu",
                             msg->descriptor->short_name, need, cap);
    size_t wrote = protobuf_c_message_pack(msg, buf);
    QRL_CHECK(wrote == need);
    *len = wrote;
    return QRL_OK;
}

qrl_status qrl_wire_encode_alloc(ProtobufCMessage *msg, uint8_t **buf, size_t *len,
                                 qrl_error *err) {
    *buf = NULL;
    *len = 0;
    size_t need = qrl_wire_encoded_size(msg);
    if (need > QRL_WIRE_MAX_MESSAGE_BYTES)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: encoding of %zu bytes exceeds the %zu-byte message cap",
                             msg->descriptor->short_name, need, QRL_WIRE_MAX_MESSAGE_BYTES);
    uint8_t *b = malloc(need ? need : 1);
    if (!b)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: cannot allocate %zu bytes",
                             msg->descriptor->short_name, need);
    size_t wrote = protobuf_c_message_pack(msg, b);
    QRL_CHECK(wrote == need);
    *buf = b;
    *len = wrote;
    return QRL_OK;
}

/* ---- structural scan ---------------------------------------------------------------- */

enum { WT_VARINT = 0, WT_64BIT = 1, WT_LEN = 2, WT_32BIT = 5 };
#define SCAN_MAX_DEPTH 16

typedef struct scan_ctx {
    const uint8_t *base; /* start of the whole input, for absolute offsets */
    size_t unpacked;     /* estimate of what protobuf-c will allocate */
    size_t unpacked_cap;
    path p;
    const char *top;
    qrl_error *err;
} scan_ctx;

static qrl_status scan_fail(scan_ctx *c, const uint8_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static qrl_status scan_fail(scan_ctx *c, const uint8_t *at, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return qrl_error_set(c->err, QRL_STATUS_PARSE, "%s: byte %zu (%s): %s", c->top,
                         (size_t)(at - c->base), c->p.len ? c->p.buf : "top level", what);
}

/* Reads a varint of at most `max_bytes` bytes from p[*off..n). 0 on success, else -1
 * (runs past the end) or -2 (too long). */
static int read_varint(const uint8_t *p, size_t n, size_t *off, unsigned max_bytes, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned i = 0; i < max_bytes; i++) {
        if (*off >= n) return -1;
        uint8_t b = p[(*off)++];
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -2;
}

static int wire_type_of(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FLOAT:
        return WT_32BIT;
    case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return WT_64BIT;
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_BYTES: case PROTOBUF_C_TYPE_MESSAGE:
        return WT_LEN;
    default:
        return WT_VARINT;
    }
}

static size_t element_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

/* Checks a packed repeated scalar's payload and returns its element count, or -1. */
static long long packed_count(scan_ctx *c, const ProtobufCFieldDescriptor *f, const uint8_t *p,
                              size_t n) {
    int wt = wire_type_of(f->type);
    if (wt == WT_32BIT || wt == WT_64BIT) {
        size_t w = wt == WT_32BIT ? 4 : 8;
        if (n % w) {
            scan_fail(c, p, "packed length %zu is not a multiple of %zu", n, w);
            return -1;
        }
        return (long long)(n / w);
    }
    if (f->type == PROTOBUF_C_TYPE_BOOL) { /* protobuf-c reads packed bools one byte each */
        for (size_t i = 0; i < n; i++)
            if (p[i] > 1) {
                scan_fail(c, p + i, "packed bool is not 0 or 1");
                return -1;
            }
        return (long long)n;
    }
    /* one varint ends at each byte without the high bit; none may run over 10 bytes */
    long long count = 0;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] & 0x80) {
            if (++run == 10) {
                scan_fail(c, p + i - 9, "varint longer than 10 bytes in packed field");
                return -1;
            }
        } else {
            run = 0;
            count++;
        }
    }
    if (run) {
        scan_fail(c, p + n - run, "packed field ends inside a varint");
        return -1;
    }
    return count;
}

static qrl_status scan_message(scan_ctx *c, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                               size_t n, int depth);

/* One known field's payload: wire type, sizes, and recursion into messages. */
static qrl_status scan_field(scan_ctx *c, const ProtobufCFieldDescriptor *f, int wt,
                             const uint8_t *field_start, const uint8_t *payload, size_t plen,
                             size_t index, int depth) {
    int want = wire_type_of(f->type);
    int repeated = f->label == PROTOBUF_C_LABEL_REPEATED;
    int packed = repeated && want != WT_LEN && wt == WT_LEN;
    size_t old = path_push(&c->p, f->name, index, repeated && !packed);
    qrl_status st = QRL_OK;
    if (packed) {
        long long count = packed_count(c, f, payload, plen);
        if (count < 0) st = QRL_STATUS_PARSE;
        else c->unpacked += (size_t)count * element_size(f->type);
    } else if (wt != want) {
        st = scan_fail(c, field_start, "wire type %d, field type needs %d", wt, want);
    } else {
        if (repeated) c->unpacked += element_size(f->type);
        if (f->type == PROTOBUF_C_TYPE_STRING) c->unpacked += plen + 1;
        else if (f->type == PROTOBUF_C_TYPE_BYTES) c->unpacked += plen;
        else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth + 1 >= SCAN_MAX_DEPTH) st = scan_fail(c, payload, "nesting too deep");
            else st = scan_message(c, f->descriptor, payload, plen, depth + 1);
        }
    }
    path_pop(&c->p, old);
    return st;
}

static qrl_status scan_message(scan_ctx *c, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                               size_t n, int depth) {
    /* occurrences per field so far: the index of a repeated element, for paths */
    size_t seen[64] = {0};
    QRL_CHECK(d->n_fields <= 64);
    qrl_error *err = c->err; /* for QRL_TRY */
    c->unpacked += d->sizeof_message;
    size_t off = 0;
    while (off < n) {
        const uint8_t *field_start = p + off;
        uint64_t key;
        int r = read_varint(p, n, &off, 5, &key);
        if (r) return scan_fail(c, field_start, r == -1 ? "truncated tag" : "tag varint too long");
        uint64_t number = key >> 3;
        int wt = (int)(key & 7);
        if (number == 0 || number > 0x1fffffff)
            return scan_fail(c, field_start, "field number %llu out of range",
                             (unsigned long long)number);
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)number);
        char fname[96];
        if (f) snprintf(fname, sizeof fname, "%s (field %llu)", f->name, (unsigned long long)number);
        else snprintf(fname, sizeof fname, "unknown field %llu", (unsigned long long)number);
        const uint8_t *payload = p + off;
        size_t plen;
        uint64_t v;
        switch (wt) {
        case WT_VARINT:
            r = read_varint(p, n, &off, 10, &v);
            if (r)
                return scan_fail(c, field_start, "%s: %s", fname,
                                 r == -1 ? "truncated varint" : "varint longer than 10 bytes");
            plen = (size_t)(p + off - payload);
            break;
        case WT_64BIT:
        case WT_32BIT:
            plen = wt == WT_64BIT ? 8 : 4;
            if (n - off < plen)
                return scan_fail(c, field_start, "%s: truncated %zu-byte value (%zu bytes left)", fname,
                                 plen, n - off);
            off += plen;
            break;
        case WT_LEN:
            r = read_varint(p, n, &off, 5, &v);
            if (r)
                return scan_fail(c, field_start, "%s: %s", fname,
                                 r == -1 ? "truncated length" : "length varint too long");
            if (v > n - off)
                return scan_fail(c, field_start, "%s: length %llu runs past the end (%zu bytes left)",
                                 fname, (unsigned long long)v, n - off);
            payload = p + off;
            plen = (size_t)v;
            off += plen;
            break;
        default:
            return scan_fail(c, field_start, "%s: unsupported wire type %d", fname, wt);
        }
        if (f) {
            size_t idx = (size_t)(f - d->fields);
            QRL_TRY(scan_field(c, f, wt, field_start, payload, plen, seen[idx]++, depth));
        } else {
            c->unpacked += sizeof(ProtobufCMessageUnknownField) + plen; /* kept by protobuf-c */
        }
        if (c->unpacked > c->unpacked_cap)
            return scan_fail(c, field_start,
                             "would unpack to more than %zu bytes of memory", c->unpacked_cap);
    }
    return QRL_OK;
}

/* ---- decode ------------------------------------------------------------------------- */

qrl_status qrl_wire_decode(const ProtobufCMessageDescriptor *desc, const void *data, size_t len,
                           size_t max_len, ProtobufCMessage **out, qrl_error *err) {
    *out = NULL;
    const char *name = desc->short_name;
    if (max_len == 0 || max_len > QRL_WIRE_MAX_MESSAGE_BYTES) max_len = QRL_WIRE_MAX_MESSAGE_BYTES;
    if (len > max_len)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: %zu bytes exceed the limit of %zu",
                             name, len, max_len);
    if (len == 0) return qrl_error_set(err, QRL_STATUS_PARSE, "%s: empty input", name);

    /* legitimate messages unpack to ~2-4x their size; 16x plus slack for tiny ones */
    scan_ctx c = {.base = data, .unpacked_cap = 16 * max_len + (1u << 20), .top = name,
                  .err = err};
    QRL_TRY(scan_message(&c, desc, data, len, 0));

    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, data);
    if (!m)
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: protobuf-c refused the %zu-byte encoding",
                             name, len);
    qrl_status st = qrl_wire_check_versions(m, err);
    if (st != QRL_OK) {
        protobuf_c_message_free_unpacked(m, NULL);
        return st;
    }
    *out = m;
    return QRL_OK;
}

void qrl_wire_free(ProtobufCMessage *msg) {
    if (msg) protobuf_c_message_free_unpacked(msg, NULL);
}
