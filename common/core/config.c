/* Table-driven configuration (config.h): the table, values, the YAML loader, set/get and
 * the resolved-config writer.  The command line and help text are in config_cli.c. */
#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/log.h"

#define KEY_MAX 128          /* longest dotted key name */
#define DEPTH_MAX 8          /* YAML mapping nesting */
#define ORIGIN_MAX 96

typedef struct value {
    bool b;
    int64_t i;     /* INT; ENUM: index into choices */
    double d;
    char *s;       /* STRING, ENUM */
    char **items;  /* LIST */
    size_t nitems;
} value;

struct qrl_config {
    const qrl_config_entry *table;
    size_t n;
    value *vals;
    char (*origin)[ORIGIN_MAX];
    char *bound; /* qrl_config_bind's settings struct, or NULL */
};

/* ---- small helpers ------------------------------------------------------------------ */

/* Indexed by qrl_config_type (checked when the table is validated). */
static const struct { const char *name, *expect; } types[] = {
    {"bool", "true or false"}, {"int", "an integer"}, {"float", "a number"},
    {"string", "a string"}, {"enum", "one of the allowed values"}, {"list", "a list of strings"},
};

const char *qrl_config_type_name(qrl_config_type t) {
    return (unsigned)t <= QRL_CONFIG_TYPE_LIST ? types[t].name : "?";
}

static void value_free(value *v) {
    free(v->s);
    for (size_t k = 0; k < v->nitems; k++) free(v->items[k]);
    free(v->items);
    memset(v, 0, sizeof *v);
}

/* Prepend printf-formatted text to err->msg, keeping the status. */
static qrl_status prefix_error(qrl_error *err, qrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static qrl_status prefix_error(qrl_error *err, qrl_status st, const char *fmt, ...) {
    if (!err) return st;
    char old[QRL_ERROR_MSG_MAX], pre[QRL_ERROR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    return qrl_error_set(err, st, "%s%s", pre, old);
}

static int find_key(const qrl_config_entry *t, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, key) == 0) return (int)i;
    return -1;
}

/* True when some key lies under `prefix` ("rollout" for "rollout.kv_cache"). */
static bool is_section(const qrl_config_entry *t, size_t n, const char *prefix) {
    size_t len = strlen(prefix);
    for (size_t i = 0; i < n; i++)
        if (strncmp(t[i].name, prefix, len) == 0 && t[i].name[len] == '.') return true;
    return false;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strnlen(a, KEY_MAX), lb = strnlen(b, KEY_MAX), row[KEY_MAX + 1];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

static const char *leaf(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* The known key closest to `key` (a typo, or the right key in the wrong section), or
 * NULL when nothing is close. */
static const char *closest_key(const qrl_config_entry *t, size_t n, const char *key) {
    const char *best = NULL;
    size_t best_d = 1 + strlen(key) / 3; /* farther than this is not a typo */
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(key, t[i].name), dl = edit_distance(leaf(key), leaf(t[i].name)) + 2;
        if (dl < d) d = dl;
        if (d <= best_d) best_d = d, best = t[i].name;
    }
    return best;
}

static qrl_status unknown_key(const qrl_config_entry *t, size_t n, const char *key, qrl_error *err) {
    const char *near = closest_key(t, n, key);
    return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "unknown key %s%s%s%s", key, near ? " (did you mean " : "",
                         near ? near : "", near ? "?)" : "");
}

/* Length of the UTF-8 sequence at s (*cp its code point), 0 when invalid or NUL. */
static int utf8_next(const unsigned char *s, size_t len, uint32_t *cp) {
    static const uint32_t min_cp[] = {0, 1, 0x80, 0x800, 0x10000};
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || (size_t)n > len) return 0;
    uint32_t v = n == 1 ? c : c & (0x7fu >> n);
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[k] & 0x3f);
    }
    if (v < min_cp[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

static bool utf8_valid(const char *s, size_t len) {
    uint32_t cp;
    for (size_t k = 0; k < len;) {
        int m = utf8_next((const unsigned char *)s + k, len - k, &cp);
        if (!m) return false;
        k += (size_t)m;
    }
    return true;
}

/* Shortest "%.*g" text that reads back to the same double. */
static void format_double(double x, char *buf, size_t len) {
    snprintf(buf, len, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, len, "%.17g", x);
}

static bool has_range(const qrl_config_entry *e) {
    return (e->type == QRL_CONFIG_TYPE_INT || e->type == QRL_CONFIG_TYPE_DOUBLE) &&
           !(e->min == 0 && e->max == 0);
}

void qrl_config_entry_range(const qrl_config_entry *e, char *buf, size_t len) {
    char lo[32], hi[32];
    format_double(e->min, lo, sizeof lo);
    format_double(e->max, hi, sizeof hi);
    if (len) buf[0] = '\0';
    if (has_range(e)) snprintf(buf, len, "[%s, %s]", lo, hi);
}

static bool parse_bool(const char *t, bool *out) {
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int k = 0; k < 4; k++) {
        if (strcasecmp(t, yes[k]) == 0) return *out = true, true;
        if (strcasecmp(t, no[k]) == 0) return *out = false, true;
    }
    return false;
}

/* Index of `t` among e->choices ("a|b|c"), or -1. */
static int enum_index(const qrl_config_entry *e, const char *t) {
    size_t tl = strlen(t);
    int k = 0;
    for (const char *c = e->choices; c; k++) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        if (cl == tl && memcmp(c, t, tl) == 0) return k;
        c = bar ? bar + 1 : NULL;
    }
    return -1;
}

static qrl_status out_of_range(const qrl_config_entry *e, const char *text, qrl_error *err) {
    char r[80];
    qrl_config_entry_range(e, r, sizeof r);
    return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s = %.64s is outside %s", e->name, text, r);
}

/* "a, b,c" -> {"a", "b", "c"}; "" is the empty list.  False when out of memory. */
static bool split_list(const char *t, value *v) {
    size_t n = *t != '\0';
    for (const char *c = t; *c; c++) n += *c == ',';
    if (n && !(v->items = calloc(n, sizeof *v->items))) return false;
    for (const char *c = t; v->nitems < n; v->nitems++) {
        const char *end = c + strcspn(c, ","), *stop = end;
        while (c < end && isspace((unsigned char)*c)) c++;
        while (stop > c && isspace((unsigned char)stop[-1])) stop--;
        if (!(v->items[v->nitems] = strndup(c, (size_t)(stop - c)))) return false;
        c = end + 1;
    }
    return true;
}

/* Parse the text form of a value of `e` into *v (zeroed first).  The message names the
 * key; the caller adds where the text came from.  On error *v owns nothing. */
static qrl_status parse_text(const qrl_config_entry *e, const char *t, value *v, qrl_error *err) {
    memset(v, 0, sizeof *v);
    char *end = NULL;
    switch (e->type) {
    case QRL_CONFIG_TYPE_BOOL:
        if (!parse_bool(t, &v->b)) goto bad_type;
        return QRL_OK;
    case QRL_CONFIG_TYPE_INT:
        if (!*t || isspace((unsigned char)*t)) goto bad_type;
        errno = 0;
        v->i = strtoll(t, &end, 10);
        if (*end) goto bad_type;
        if (errno == ERANGE)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "%s = %.64s is outside the 64-bit integer range", e->name, t);
        if (has_range(e) && ((double)v->i < e->min || (double)v->i > e->max))
            return out_of_range(e, t, err);
        return QRL_OK;
    case QRL_CONFIG_TYPE_DOUBLE:
        if (!*t || isspace((unsigned char)*t)) goto bad_type;
        v->d = strtod(t, &end);
        if (*end) goto bad_type;
        if (!isfinite(v->d))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s: expected a finite number, got '%.64s'", e->name, t);
        if (has_range(e) && (v->d < e->min || v->d > e->max)) return out_of_range(e, t, err);
        return QRL_OK;
    case QRL_CONFIG_TYPE_STRING:
    case QRL_CONFIG_TYPE_ENUM: {
        int k = e->type == QRL_CONFIG_TYPE_ENUM ? enum_index(e, t) : 0;
        if (!utf8_valid(t, strlen(t))) goto bad_utf8;
        if (k < 0) {
            char list[256];
            size_t m = 0;
            for (const char *c = e->choices; *c && m + 3 < sizeof list; c++)
                m += (size_t)(*c == '|' ? snprintf(list + m, sizeof list - m, ", ") : (list[m] = *c, 1));
            list[m] = '\0';
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "%s: '%.64s' is not one of the allowed values: %s", e->name, t, list);
        }
        v->i = k;
        if (!(v->s = strdup(t))) goto nomem;
        return QRL_OK;
    }
    case QRL_CONFIG_TYPE_LIST:
        if (!utf8_valid(t, strlen(t))) goto bad_utf8;
        if (!split_list(t, v)) goto nomem;
        return QRL_OK;
    }
    return qrl_error_set(err, QRL_STATUS_INTERNAL, "%s: bad type %d", e->name, (int)e->type);
nomem:
    value_free(v);
    return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
bad_type:
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: expected %s, got '%.64s'", e->name,
                         types[e->type].expect, t);
bad_utf8:
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: value is not valid UTF-8 text", e->name);
}

/* Copy key i's value into its field of the bound struct (the kinds check_entry allows). */
static void write_field(const qrl_config_t *cfg, size_t i) {
    const qrl_config_entry *e = &cfg->table[i];
    const value *v = &cfg->vals[i];
    if (!cfg->bound || e->field == QRL_CONFIG_FIELD_NONE) return;
    void *p = cfg->bound + e->offset;
    switch (e->field) {
    case QRL_CONFIG_FIELD_NONE: break;
    case QRL_CONFIG_FIELD_BOOL: *(bool *)p = v->b; break;
    case QRL_CONFIG_FIELD_INT: *(int *)p = (int)v->i; break; /* range checked to fit */
    case QRL_CONFIG_FIELD_INT64: *(int64_t *)p = v->i; break;
    case QRL_CONFIG_FIELD_FLOAT: *(float *)p = (float)v->d; break;
    case QRL_CONFIG_FIELD_DOUBLE: *(double *)p = v->d; break;
    case QRL_CONFIG_FIELD_STRING: *(const char **)p = v->s; break;
    case QRL_CONFIG_FIELD_ENUM: *(int *)p = (int)v->i; break;
    case QRL_CONFIG_FIELD_LIST:
        *(qrl_config_list *)p = (qrl_config_list){(const char *const *)v->items, v->nitems};
        break;
    }
}

void qrl_config_bind(qrl_config_t *cfg, void *settings) {
    QRL_CHECK(cfg != NULL);
    cfg->bound = settings;
    for (size_t i = 0; i < cfg->n; i++) write_field(cfg, i);
}

static void commit(qrl_config_t *cfg, size_t i, value *v, const char *origin) {
    value_free(&cfg->vals[i]);
    cfg->vals[i] = *v;
    memset(v, 0, sizeof *v);
    write_field(cfg, i);
    size_t len = strlen(origin);
    /* keep the end ("...dir/file.yaml:12"): the line number matters more than the path */
    if (len >= ORIGIN_MAX) snprintf(cfg->origin[i], ORIGIN_MAX, "...%s", origin + len - (ORIGIN_MAX - 4));
    else memcpy(cfg->origin[i], origin, len + 1);
}

/* ---- table and lifetime -------------------------------------------------------------- */

static bool name_valid(const char *s) {
    size_t len = strnlen(s, KEY_MAX + 1);
    return len > 0 && len <= KEY_MAX && s[0] != '.' && s[len - 1] != '.' && !strstr(s, "..") &&
           strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_.") == len;
}

static qrl_status check_entry(const qrl_config_entry *t, size_t n, size_t i, qrl_error *err) {
    const qrl_config_entry *e = &t[i];
    if (!e->name || !name_valid(e->name))
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table entry %zu: bad name '%s'", i,
                             e->name ? e->name : "(null)");
    if ((unsigned)e->type > QRL_CONFIG_TYPE_LIST)
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s: bad type", e->name);
    if (e->type == QRL_CONFIG_TYPE_ENUM &&
        (!e->choices || !*e->choices || strstr(e->choices, "||") || e->choices[0] == '|' ||
         e->choices[strlen(e->choices) - 1] == '|'))
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s: enum needs choices \"a|b\"", e->name);
    if (has_range(e) && !(e->min <= e->max))
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s: min > max", e->name);
    /* the row type each field kind may hold (a hand-written row could pair them wrongly) */
    static const qrl_config_type field_type[] = {
        [QRL_CONFIG_FIELD_BOOL] = QRL_CONFIG_TYPE_BOOL,     [QRL_CONFIG_FIELD_INT] = QRL_CONFIG_TYPE_INT,
        [QRL_CONFIG_FIELD_INT64] = QRL_CONFIG_TYPE_INT,     [QRL_CONFIG_FIELD_FLOAT] = QRL_CONFIG_TYPE_DOUBLE,
        [QRL_CONFIG_FIELD_DOUBLE] = QRL_CONFIG_TYPE_DOUBLE, [QRL_CONFIG_FIELD_STRING] = QRL_CONFIG_TYPE_STRING,
        [QRL_CONFIG_FIELD_ENUM] = QRL_CONFIG_TYPE_ENUM,     [QRL_CONFIG_FIELD_LIST] = QRL_CONFIG_TYPE_LIST,
    };
    bool enum_text = e->field == QRL_CONFIG_FIELD_STRING && e->type == QRL_CONFIG_TYPE_ENUM;
    if (e->field != QRL_CONFIG_FIELD_NONE && !enum_text &&
        ((unsigned)e->field > QRL_CONFIG_FIELD_LIST || field_type[e->field] != e->type))
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s: field kind does not match the type",
                             e->name);
    if (e->field == QRL_CONFIG_FIELD_INT && !(has_range(e) && e->min >= INT_MIN && e->max <= INT_MAX))
        return qrl_error_set(err, QRL_STATUS_INTERNAL,
                             "config table: %s: an int field needs a range inside int's (or use int64_t)",
                             e->name);
    for (size_t j = 0; j < n; j++) {
        if (j != i && strcmp(t[j].name, e->name) == 0)
            return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s appears twice", e->name);
    }
    if (is_section(t, n, e->name))
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "config table: %s is both a key and a section", e->name);
    return QRL_OK;
}

qrl_status qrl_config_new(const qrl_config_entry *table, size_t n, qrl_config_t **out, qrl_error *err) {
    QRL_CHECK(out != NULL && (table != NULL || n == 0));
    *out = NULL;
    for (size_t i = 0; i < n; i++) /* names first: the default check below uses them */
        if (!table[i].name || !name_valid(table[i].name)) return check_entry(table, n, i, err);
    for (size_t i = 0; i < n; i++) QRL_TRY(check_entry(table, n, i, err));
    qrl_config_t *cfg = calloc(1, sizeof *cfg);
    if (cfg) {
        cfg->vals = calloc(n ? n : 1, sizeof *cfg->vals);
        cfg->origin = calloc(n ? n : 1, sizeof *cfg->origin);
    }
    if (!cfg || !cfg->vals || !cfg->origin) {
        qrl_config_destroy(cfg);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "config: out of memory");
    }
    cfg->table = table;
    cfg->n = n;
    for (size_t i = 0; i < n; i++) {
        value v;
        qrl_status st = parse_text(&table[i], table[i].def ? table[i].def : "", &v, err);
        if (st) {
            qrl_config_destroy(cfg);
            return prefix_error(err, st == QRL_STATUS_NOMEM ? st : QRL_STATUS_INTERNAL, "config table: bad default: ");
        }
        commit(cfg, i, &v, "default");
    }
    *out = cfg;
    return QRL_OK;
}

void qrl_config_destroy(qrl_config_t *cfg) {
    if (!cfg) return;
    for (size_t i = 0; cfg->vals && i < cfg->n; i++) value_free(&cfg->vals[i]);
    free(cfg->vals);
    free(cfg->origin);
    free(cfg);
}

/* ---- YAML loader --------------------------------------------------------------------- */

typedef struct loader {
    qrl_config_t *cfg;
    yaml_parser_t parser;
    const char *origin;
    value *stage;     /* values this document sets, committed only when all of it is valid */
    int *line;        /* per key: line (1-based) where this document set it; 0 = not set */
    char path[KEY_MAX + 1];
    qrl_error *err;
} loader;

/* Prefix the message already in ld->err with the location of mark m. */
static qrl_status locate(loader *ld, yaml_mark_t m, qrl_status st) {
    return prefix_error(ld->err, st, "%s:%zu:%zu: ", ld->origin, m.line + 1, m.column + 1);
}

static qrl_status at(loader *ld, yaml_mark_t m, qrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static qrl_status at(loader *ld, yaml_mark_t m, qrl_status st, const char *fmt, ...) {
    if (!ld->err) return st;
    va_list ap;
    va_start(ap, fmt);
    qrl_error_setv(ld->err, st, fmt, ap);
    va_end(ap);
    return locate(ld, m, st);
}

static qrl_status next_event(loader *ld, yaml_event_t *ev) {
    if (yaml_parser_parse(&ld->parser, ev)) return QRL_OK;
    const yaml_parser_t *p = &ld->parser;
    const char *problem = p->problem ? p->problem : "parse error";
    if (p->error == YAML_READER_ERROR)
        return qrl_error_set(ld->err, QRL_STATUS_PARSE, "%s: byte %zu: malformed YAML: %s", ld->origin,
                             p->problem_offset, problem);
    return at(ld, p->problem_mark, QRL_STATUS_PARSE, "malformed YAML: %s%s%s", problem,
              p->context ? " " : "", p->context ? p->context : "");
}

static bool is_null(const yaml_event_t *ev) {
    const char *s = (const char *)ev->data.scalar.value;
    return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (ev->data.scalar.length == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
            strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0);
}

/* Resolve ld->path for a value event: the key's index, or an error for an unknown key
 * (a section name with a scalar/sequence value included) or a key already set.  A
 * section with a null value gives *idx = -1 and OK. */
static qrl_status leaf_index(loader *ld, yaml_mark_t key_mark, bool null, int *idx) {
    const qrl_config_t *cfg = ld->cfg;
    *idx = find_key(cfg->table, cfg->n, ld->path);
    if (*idx < 0) {
        if (is_section(cfg->table, cfg->n, ld->path) && null) return QRL_OK; /* "rollout:", keys commented out */
        if (is_section(cfg->table, cfg->n, ld->path))
            return at(ld, key_mark, QRL_STATUS_INVALID_ARGUMENT,
                      "%s is a section: expected a mapping of its keys", ld->path);
        return locate(ld, key_mark, unknown_key(cfg->table, cfg->n, ld->path, ld->err));
    }
    if (ld->line[*idx])
        return at(ld, key_mark, QRL_STATUS_PARSE, "duplicate key %s (first given at line %d)", ld->path,
                  ld->line[*idx]);
    return QRL_OK;
}

static qrl_status load_scalar(loader *ld, yaml_mark_t key_mark, const yaml_event_t *ev) {
    int idx;
    qrl_status st = leaf_index(ld, key_mark, is_null(ev), &idx);
    if (st || idx < 0) return st;
    const qrl_config_entry *e = &ld->cfg->table[idx];
    const char *s = (const char *)ev->data.scalar.value;
    if (is_null(ev))
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: missing value%s", e->name,
                  e->type == QRL_CONFIG_TYPE_STRING || e->type == QRL_CONFIG_TYPE_LIST
                      ? " (write '' for an empty one)" : "");
    if (strlen(s) != ev->data.scalar.length)
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: value contains a NUL byte", e->name);
    value v;
    if ((st = parse_text(e, s, &v, ld->err))) return locate(ld, ev->start_mark, st);
    ld->stage[idx] = v;
    ld->line[idx] = (int)key_mark.line + 1;
    return QRL_OK;
}

static qrl_status load_sequence(loader *ld, yaml_mark_t key_mark, const yaml_event_t *ev) {
    int idx;
    qrl_status st = leaf_index(ld, key_mark, false, &idx);
    if (st) return st;
    const qrl_config_entry *e = &ld->cfg->table[idx];
    if (e->type != QRL_CONFIG_TYPE_LIST)
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: expected %s, got a sequence",
                  e->name, types[e->type].expect);
    value v = {0};
    size_t cap = 0;
    for (;;) {
        yaml_event_t it;
        if ((st = next_event(ld, &it))) break;
        if (it.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&it);
            ld->stage[idx] = v;
            ld->line[idx] = (int)key_mark.line + 1;
            return QRL_OK;
        }
        if (it.type != YAML_SCALAR_EVENT)
            st = at(ld, it.start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: list items must be strings", e->name);
        else if (!utf8_valid((const char *)it.data.scalar.value, it.data.scalar.length))
            st = at(ld, it.start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: item contains a NUL byte", e->name);
        else if (v.nitems == cap) {
            char **grown = realloc(v.items, (cap = cap ? 2 * cap : 4) * sizeof *grown);
            if (grown) v.items = grown;
            else st = qrl_error_set(ld->err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
        }
        if (!st && !(v.items[v.nitems] = strdup((const char *)it.data.scalar.value)))
            st = qrl_error_set(ld->err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
        yaml_event_delete(&it);
        if (st) break;
        v.nitems++;
    }
    value_free(&v);
    return st;
}

static qrl_status load_mapping(loader *ld, size_t plen, yaml_mark_t start, int depth);

/* One "key: value" pair of the mapping at ld->path[0..plen). */
static qrl_status load_pair(loader *ld, size_t plen, const yaml_event_t *key, int depth) {
    const char *k = (const char *)key->data.scalar.value;
    size_t klen = key->data.scalar.length, nlen = plen + (plen ? 1 : 0) + klen;
    if (nlen > KEY_MAX || klen == 0 || strlen(k) != klen)
        return at(ld, key->start_mark, QRL_STATUS_NOT_FOUND, "unknown key '%.*s%s%.40s'", (int)plen,
                  ld->path, plen ? "." : "", k);
    if (plen) ld->path[plen] = '.';
    memcpy(ld->path + nlen - klen, k, klen + 1);
    yaml_event_t v;
    qrl_status st = next_event(ld, &v);
    if (st) return st;
    switch (v.type) {
    case YAML_MAPPING_START_EVENT: {
        int idx = find_key(ld->cfg->table, ld->cfg->n, ld->path);
        if (idx >= 0)
            st = at(ld, v.start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: expected %s, got a mapping",
                    ld->path, types[ld->cfg->table[idx].type].expect);
        else if (depth >= DEPTH_MAX)
            st = at(ld, v.start_mark, QRL_STATUS_PARSE, "%s: mappings nested deeper than %d", ld->path,
                    DEPTH_MAX);
        else
            st = load_mapping(ld, nlen, key->start_mark, depth + 1);
        break;
    }
    case YAML_SCALAR_EVENT: st = load_scalar(ld, key->start_mark, &v); break;
    case YAML_SEQUENCE_START_EVENT: st = load_sequence(ld, key->start_mark, &v); break;
    default:
        st = at(ld, v.start_mark, QRL_STATUS_PARSE, "%s: YAML aliases (*name) are not supported", ld->path);
    }
    yaml_event_delete(&v);
    ld->path[plen] = '\0';
    return st;
}

static qrl_status load_mapping(loader *ld, size_t plen, yaml_mark_t start, int depth) {
    size_t count = 0;
    for (;; count++) {
        yaml_event_t k;
        qrl_status st = next_event(ld, &k);
        if (st) return st;
        if (k.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&k);
            break;
        }
        if (k.type != YAML_SCALAR_EVENT)
            st = at(ld, k.start_mark, QRL_STATUS_PARSE, "%s%skeys must be plain names", ld->path,
                    plen ? ": " : "");
        else
            st = load_pair(ld, plen, &k, depth);
        yaml_event_delete(&k);
        if (st) return st;
    }
    if (count == 0 && plen > 0 && !is_section(ld->cfg->table, ld->cfg->n, ld->path))
        return locate(ld, start, unknown_key(ld->cfg->table, ld->cfg->n, ld->path, ld->err));
    return QRL_OK;
}

static qrl_status load_stream(loader *ld) {
    for (int docs = 0;;) {
        yaml_event_t ev;
        qrl_status st = next_event(ld, &ev);
        if (st) return st;
        yaml_event_type_t t = ev.type;
        if (t == YAML_DOCUMENT_START_EVENT && docs++ > 0)
            st = at(ld, ev.start_mark, QRL_STATUS_PARSE, "several YAML documents; a config file holds one");
        else if (t == YAML_MAPPING_START_EVENT)
            st = load_mapping(ld, 0, ev.start_mark, 1);
        else if ((t == YAML_SCALAR_EVENT && !is_null(&ev)) || t == YAML_SEQUENCE_START_EVENT ||
                 t == YAML_ALIAS_EVENT)
            st = at(ld, ev.start_mark, QRL_STATUS_PARSE,
                    "the top level must be a mapping of sections (rollout: {key: value})");
        yaml_event_delete(&ev);
        if (st || t == YAML_STREAM_END_EVENT) return st;
    }
}

/* Load from `f` when non-NULL, else from data[0..len). */
static qrl_status load(qrl_config_t *cfg, const char *origin, FILE *f, const void *data, size_t len,
                       qrl_error *err) {
    QRL_CHECK(cfg != NULL && origin != NULL && (f || data != NULL || len == 0));
    loader ld = {.cfg = cfg, .origin = origin, .err = err};
    ld.stage = calloc(cfg->n ? cfg->n : 1, sizeof *ld.stage);
    ld.line = calloc(cfg->n ? cfg->n : 1, sizeof *ld.line);
    qrl_status st;
    if (!ld.stage || !ld.line || !yaml_parser_initialize(&ld.parser)) {
        free(ld.stage);
        free(ld.line);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", origin);
    }
    if (f) yaml_parser_set_input_file(&ld.parser, f);
    else yaml_parser_set_input_string(&ld.parser, data ? data : (const void *)"", len);
    st = load_stream(&ld);
    char where[ORIGIN_MAX + 32];
    size_t olen = strlen(origin), keep = ORIGIN_MAX - 20; /* room for "...", ":line" */
    const char *tail = olen > keep ? origin + olen - keep : origin;
    for (size_t i = 0; i < cfg->n; i++) {
        if (!ld.line[i]) continue;
        snprintf(where, sizeof where, "%s%s:%d", tail == origin ? "" : "...", tail, ld.line[i]);
        if (st == QRL_OK) commit(cfg, i, &ld.stage[i], where);
        else value_free(&ld.stage[i]);
    }
    yaml_parser_delete(&ld.parser);
    free(ld.stage);
    free(ld.line);
    return st;
}

qrl_status qrl_config_load_buffer(qrl_config_t *cfg, const char *origin, const void *data, size_t len,
                                  qrl_error *err) {
    return load(cfg, origin, NULL, data, len, err);
}

qrl_status qrl_config_load_file(qrl_config_t *cfg, const char *path, qrl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "%s: cannot open config file: %s", path, strerror(errno));
    qrl_status st = load(cfg, path, f, NULL, 0, err);
    if (st && ferror(f)) /* libyaml only says "input error" (a directory, a failing disk) */
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot read config file: %s", path, strerror(errno));
    fclose(f);
    return st;
}

/* ---- set and get ---------------------------------------------------------------------- */

static qrl_status set_key(qrl_config_t *cfg, const char *key, const char *text, const char *origin,
                          bool running, qrl_error *err) {
    QRL_CHECK(cfg != NULL && key != NULL && text != NULL && origin != NULL);
    int i = find_key(cfg->table, cfg->n, key);
    if (i < 0) return unknown_key(cfg->table, cfg->n, key, err);
    const qrl_config_entry *e = &cfg->table[i];
    if (running && !e->runtime_mutable)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s cannot be changed at run time (restart with --%s=VALUE)", key, key);
    value v;
    QRL_TRY(parse_text(e, text, &v, err));
    commit(cfg, (size_t)i, &v, origin);
    return QRL_OK;
}

qrl_status qrl_config_apply(qrl_config_t *cfg, const char *key, const char *value_text, const char *origin,
                            qrl_error *err) {
    return set_key(cfg, key, value_text, origin, false, err);
}

qrl_status qrl_config_set(qrl_config_t *cfg, const char *key, const char *value_text, qrl_error *err) {
    return set_key(cfg, key, value_text, "set", true, err);
}

static const value *get(const qrl_config_t *cfg, const char *key, qrl_config_type t1, qrl_config_type t2) {
    QRL_CHECK(cfg != NULL && key != NULL);
    int i = find_key(cfg->table, cfg->n, key);
    if (i < 0 || (cfg->table[i].type != t1 && cfg->table[i].type != t2)) {
        char what[KEY_MAX + 96];
        snprintf(what, sizeof what, "config key '%.*s' %s", KEY_MAX, key,
                 i < 0 ? "is not in the table" : "is read with the wrong type");
        qrl_check_fail_(what, __FILE__, __LINE__);
    }
    return &cfg->vals[i];
}

bool qrl_config_get_bool(const qrl_config_t *cfg, const char *key) {
    return get(cfg, key, QRL_CONFIG_TYPE_BOOL, QRL_CONFIG_TYPE_BOOL)->b;
}
int64_t qrl_config_get_int(const qrl_config_t *cfg, const char *key) {
    return get(cfg, key, QRL_CONFIG_TYPE_INT, QRL_CONFIG_TYPE_INT)->i;
}
double qrl_config_get_double(const qrl_config_t *cfg, const char *key) {
    return get(cfg, key, QRL_CONFIG_TYPE_DOUBLE, QRL_CONFIG_TYPE_DOUBLE)->d;
}
const char *qrl_config_get_string(const qrl_config_t *cfg, const char *key) {
    return get(cfg, key, QRL_CONFIG_TYPE_STRING, QRL_CONFIG_TYPE_ENUM)->s;
}
int qrl_config_get_enum(const qrl_config_t *cfg, const char *key) {
    return (int)get(cfg, key, QRL_CONFIG_TYPE_ENUM, QRL_CONFIG_TYPE_ENUM)->i;
}
const char *const *qrl_config_get_list(const qrl_config_t *cfg, const char *key, size_t *n) {
    const value *v = get(cfg, key, QRL_CONFIG_TYPE_LIST, QRL_CONFIG_TYPE_LIST);
    *n = v->nitems;
    return (const char *const *)v->items;
}

const char *qrl_config_origin(const qrl_config_t *cfg, const char *key) {
    int i = find_key(cfg->table, cfg->n, key);
    return i < 0 ? NULL : cfg->origin[i];
}

/* ---- writing values --------------------------------------------------------------------- */

/* A string YAML reads back unchanged without quotes (and that is not a null word). */
static bool plain_safe(const char *s) {
    if (!isalnum((unsigned char)s[0]) && s[0] != '_' && s[0] != '/') return false;
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_./+-", *c)) return false;
    return strcmp(s, "null") && strcmp(s, "Null") && strcmp(s, "NULL");
}

static void write_yaml_string(FILE *f, const char *s) {
    if (plain_safe(s)) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (size_t k = 0, len = strlen(s); k < len;) {
        uint32_t cp = 0xfffd;
        int m = utf8_next((const unsigned char *)s + k, len - k, &cp);
        if (m == 0) m = 1; /* not reached: values are validated UTF-8 */
        if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (char)cp);
        else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) fprintf(f, "\\x%02x", (unsigned)cp);
        else if (cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe || cp == 0xffff)
            fprintf(f, "\\u%04x", (unsigned)cp); /* line breaks, BOM, non-characters */
        else fwrite(s + k, 1, (size_t)m, f);
        k += (size_t)m;
    }
    fputc('"', f);
}

/* yaml: a YAML scalar/flow sequence; else the text form --key=TEXT accepts. */
static void write_value(FILE *f, const qrl_config_entry *e, const value *v, bool yaml) {
    char num[40];
    switch (e->type) {
    case QRL_CONFIG_TYPE_BOOL: fputs(v->b ? "true" : "false", f); break;
    case QRL_CONFIG_TYPE_INT: fprintf(f, "%lld", (long long)v->i); break;
    case QRL_CONFIG_TYPE_DOUBLE:
        format_double(v->d, num, sizeof num);
        fputs(num, f);
        break;
    case QRL_CONFIG_TYPE_STRING:
    case QRL_CONFIG_TYPE_ENUM: yaml ? write_yaml_string(f, v->s) : (void)fputs(v->s, f); break;
    case QRL_CONFIG_TYPE_LIST:
        if (yaml) fputc('[', f);
        for (size_t k = 0; k < v->nitems; k++) {
            if (k) fputs(yaml ? ", " : ",", f);
            yaml ? write_yaml_string(f, v->items[k]) : (void)fputs(v->items[k], f);
        }
        if (yaml) fputc(']', f);
        break;
    }
}

/* write_value into a malloc'd string (NULL when out of memory). */
static char *value_string(const qrl_config_t *cfg, size_t i, bool yaml) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    write_value(f, &cfg->table[i], &cfg->vals[i], yaml);
    fclose(f);
    return text;
}

bool qrl_config_value_text(const qrl_config_t *cfg, const char *key, char *buf, size_t len) {
    int i = find_key(cfg->table, cfg->n, key);
    if (i < 0) return false;
    char *text = value_string(cfg, (size_t)i, false);
    if (len) snprintf(buf, len, "%s", text ? text : "");
    free(text);
    return true;
}

size_t qrl_config_count(const qrl_config_t *cfg) { return cfg->n; }

const char *qrl_config_key_at(const qrl_config_t *cfg, size_t i) { return i < cfg->n ? cfg->table[i].name : NULL; }

void qrl_config_write(const qrl_config_t *cfg, FILE *out) {
    for (size_t i = 0; i < cfg->n; i++) {
        fprintf(out, "%s: ", cfg->table[i].name);
        write_value(out, &cfg->table[i], &cfg->vals[i], true);
        fprintf(out, "  # %s\n", cfg->origin[i]);
    }
}

void qrl_config_log(const qrl_config_t *cfg, const char *tag) {
    for (size_t i = 0; i < cfg->n; i++) {
        char *text = value_string(cfg, i, true);
        QRL_LOG_INFO(tag, "config %s=%s origin=%s", cfg->table[i].name, text ? text : "?", cfg->origin[i]);
        free(text);
    }
}
