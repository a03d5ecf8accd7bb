/* qrlctl output: protobuf-c messages as JSON, key/value lines and tables (ctl.h). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/status.h"
#include "ctl.h"

/* ---- field access ----------------------------------------------------------------- */

static size_t elt_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4; /* 32-bit ints, float, bool (protobuf_c_boolean), enum (int) */
    }
}

static bool is_numeric(ProtobufCType t) {
    return t != PROTOBUF_C_TYPE_STRING && t != PROTOBUF_C_TYPE_BYTES &&
           t != PROTOBUF_C_TYPE_MESSAGE && t != PROTOBUF_C_TYPE_ENUM;
}

const char *ctl_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t cap) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
    if (!v) {
        snprintf(buf, cap, "%d", value);
        return buf;
    }
    const ProtobufCEnumValue *zero = protobuf_c_enum_descriptor_get_value(d, 0);
    size_t plen = 0;
    if (zero) {
        const char *u = strstr(zero->name, "UNSPECIFIED");
        if (u) plen = (size_t)(u - zero->name);
    }
    return strncmp(v->name, zero ? zero->name : "", plen) == 0 && v->name[plen] ? v->name + plen
                                                                                 : v->name;
}

/* JSON strings must be UTF-8: invalid bytes become U+FFFD. */
static json_t *json_string_lossy(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    size_t n = strlen(s), o = 0;
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    j = json_string(out);
    free(out);
    return j;
}

static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p) {
    char buf[32];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t v = *(const uint64_t *)p;
        if (v <= INT64_MAX) return json_integer((json_int_t)v);
        snprintf(buf, sizeof buf, "%" PRIu64, v);
        return json_string(buf);
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        double v = *(const float *)p;
        return isfinite(v) ? json_real(v) : json_null();
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double v = *(const double *)p;
        return isfinite(v) ? json_real(v) : json_null();
    }
    case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM:
        return json_string(ctl_enum_short(f->descriptor, *(const int *)p, buf, sizeof buf));
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string_lossy(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *hex = malloc(b->len * 2 + 1);
        if (!hex) return NULL;
        for (size_t i = 0; i < b->len; i++) snprintf(hex + 2 * i, 3, "%02x", b->data[i]);
        hex[b->len * 2] = '\0';
        json_t *j = json_string(hex);
        free(hex);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? ctl_message_json(sub) : json_null();
    }
    }
    return json_null();
}

json_t *ctl_message_json(const ProtobufCMessage *m) {
    json_t *o = json_object();
    if (!o) return NULL;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (strcmp(f->name, "schema_version") == 0) continue;
        const char *member = (const char *)m + f->offset;
        json_t *v;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
            const char *arr = *(char *const *)member;
            v = json_array();
            for (size_t k = 0; v && k < n; k++)
                json_array_append_new(v, value_json(f, arr + k * elt_size(f->type)));
        } else {
            v = value_json(f, member);
        }
        json_object_set_new(o, f->name, v ? v : json_null());
    }
    return o;
}

/* ---- flattened fields --------------------------------------------------------------- */

typedef void (*field_fn)(void *ctx, const char *name, const ProtobufCFieldDescriptor *f,
                         const void *value);

/* Visit the leaves of `m` with dotted names; a repeated field is visited with value NULL. */
static void walk(const ProtobufCMessage *m, const char *prefix, field_fn fn, void *ctx) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (strcmp(f->name, "schema_version") == 0) continue;
        char name[256];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", f->name);
        const char *member = (const char *)m + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            fn(ctx, name, f, NULL); /* NULL value: a repeated field, count at member */
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)member;
            if (sub) walk(sub, name, fn, ctx);
            continue;
        }
        fn(ctx, name, f, member);
    }
}

static void value_text(const ProtobufCFieldDescriptor *f, const void *p, char *buf, size_t cap) {
    json_t *j = value_json(f, p);
    if (json_is_string(j)) snprintf(buf, cap, "%s", json_string_value(j));
    else if (json_is_real(j)) snprintf(buf, cap, "%.6g", json_real_value(j));
    else if (j) {
        char *s = json_dumps(j, JSON_ENCODE_ANY);
        snprintf(buf, cap, "%s", s ? s : "?");
        free(s);
    }
    json_decref(j);
}

typedef struct list_ctx {
    bool numeric_only;
    const char *indent;
    ctl_table *t; /* text listing, or */
    json_t *obj;  /* JSON object */
} list_ctx;

static void list_field(void *vctx, const char *name, const ProtobufCFieldDescriptor *f,
                       const void *value) {
    list_ctx *ctx = vctx;
    if (!value) return; /* repeated fields are not listed */
    if (ctx->numeric_only && !is_numeric(f->type)) return;
    if (ctx->obj) {
        json_object_set_new(ctx->obj, name, value_json(f, value));
        return;
    }
    char label[300], text[512];
    snprintf(label, sizeof label, "%s%s", ctx->indent, name);
    value_text(f, value, text, sizeof text);
    const char *cells[2] = {label, text};
    ctl_table_row(ctx->t, cells);
}

void ctl_print_fields(FILE *out, const ProtobufCMessage *m, const char *indent, bool numeric_only) {
    list_ctx ctx = {numeric_only, indent, ctl_table_new(2), NULL};
    walk(m, "", list_field, &ctx);
    ctl_table_print(ctx.t, out);
    ctl_table_free(ctx.t);
}

json_t *ctl_numeric_json(const ProtobufCMessage *m) {
    list_ctx ctx = {true, "", NULL, json_object()};
    if (ctx.obj) walk(m, "", list_field, &ctx);
    return ctx.obj;
}

/* ---- tables ------------------------------------------------------------------------- */

struct ctl_table {
    int ncol;
    size_t nrows, cap;
    char **cells; /* nrows * ncol */
};

ctl_table *ctl_table_new(int ncol) {
    ctl_table *t = calloc(1, sizeof *t);
    QRL_CHECK(t);
    t->ncol = ncol;
    return t;
}

void ctl_table_row(ctl_table *t, const char *const *cells) {
    if (t->nrows == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->cells = realloc(t->cells, t->cap * (size_t)t->ncol * sizeof *t->cells);
        QRL_CHECK(t->cells);
    }
    for (int c = 0; c < t->ncol; c++) {
        t->cells[t->nrows * (size_t)t->ncol + (size_t)c] = strdup(cells[c] ? cells[c] : "");
        QRL_CHECK(t->cells[t->nrows * (size_t)t->ncol + (size_t)c]);
    }
    t->nrows++;
}

void ctl_table_print(const ctl_table *t, FILE *out) {
    size_t width[16] = {0};
    QRL_CHECK(t->ncol <= 16);
    for (size_t r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncol; c++) {
            size_t w = strlen(t->cells[r * (size_t)t->ncol + (size_t)c]);
            if (w > width[c]) width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncol; c++) {
            const char *s = t->cells[r * (size_t)t->ncol + (size_t)c];
            if (c == t->ncol - 1) fprintf(out, "%s\n", s);
            else fprintf(out, "%-*s  ", (int)width[c], s);
        }
    }
}

void ctl_table_free(ctl_table *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncol; i++) free(t->cells[i]);
    free(t->cells);
    free(t);
}
