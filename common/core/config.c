/* Table-driven configuration: YAML file, command-line overrides, set, help (config.h). */
#include "core/config.h"

#include <ctype.h>
#include <errno.h>
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
#define FILE_MAX (16u << 20) /* a config file larger than this is a mistake */

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
};

/* ---- small helpers ------------------------------------------------------------------ */

static const char *type_name(qrl_config_type t) {
    static const char *names[] = {"bool", "int", "float", "string", "enum", "list"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static const char *type_expect(qrl_config_type t) {
    static const char *names[] = {"true or false", "an integer", "a number", "a string",
                                  "one of the allowed values", "a list of strings"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
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

static qrl_status unknown_key(const qrl_config_entry *t, size_t n, const char *key,
                              const char *dashes, qrl_error *err) {
    const char *near = closest_key(t, n, key);
    if (near)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "unknown key %s%s (did you mean %s%s?)",
                             dashes, key, dashes, near);
    return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "unknown key %s%s", dashes, key);
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

static void format_range(const qrl_config_entry *e, char *buf, size_t len) {
    char lo[32], hi[32];
    format_double(e->min, lo, sizeof lo);
    format_double(e->max, hi, sizeof hi);
    snprintf(buf, len, "[%s, %s]", lo, hi);
}

static bool has_range(const qrl_config_entry *e) {
    return (e->type == QRL_CONFIG_TYPE_INT || e->type == QRL_CONFIG_TYPE_DOUBLE) &&
           !(e->min == 0 && e->max == 0);
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
    format_range(e, r, sizeof r);
    return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s = %.64s is outside %s", e->name, text, r);
}

static qrl_status split_list(const qrl_config_entry *e, const char *t, value *v, qrl_error *err) {
    if (*t == '\0') return QRL_OK; /* "" is the empty list */
    size_t n = 1;
    for (const char *c = t; *c; c++) n += *c == ',';
    v->items = calloc(n, sizeof *v->items);
    if (!v->items) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
    for (const char *c = t;; c++) {
        const char *end = strchr(c, ',');
        if (!end) end = c + strlen(c);
        while (c < end && isspace((unsigned char)*c)) c++;
        const char *stop = end;
        while (stop > c && isspace((unsigned char)stop[-1])) stop--;
        if (!(v->items[v->nitems] = strndup(c, (size_t)(stop - c))))
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
        v->nitems++;
        if (*end == '\0') return QRL_OK;
        c = end;
    }
}

/* Parse the text form of a value of `e` into *v (zeroed first).  The message names the
 * key; the caller adds where the text came from.  On error *v owns nothing. */
static qrl_status parse_text(const qrl_config_entry *e, const char *t, value *v, qrl_error *err) {
    memset(v, 0, sizeof *v);
    char *end = NULL;
    qrl_status st = QRL_OK;
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
        if (!utf8_valid(t, strlen(t))) goto bad_utf8;
        if (!(v->s = strdup(t))) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
        return QRL_OK;
    case QRL_CONFIG_TYPE_ENUM: {
        int k = enum_index(e, t);
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
        if (!(v->s = strdup(t))) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", e->name);
        return QRL_OK;
    }
    case QRL_CONFIG_TYPE_LIST:
        if (!utf8_valid(t, strlen(t))) goto bad_utf8;
        st = split_list(e, t, v, err);
        if (st) value_free(v);
        return st;
    }
    return qrl_error_set(err, QRL_STATUS_INTERNAL, "%s: bad type %d", e->name, (int)e->type);
bad_type:
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: expected %s, got '%.64s'", e->name,
                         type_expect(e->type), t);
bad_utf8:
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: value is not valid UTF-8 text", e->name);
}

static void commit(qrl_config_t *cfg, size_t i, value *v, const char *origin) {
    value_free(&cfg->vals[i]);
    cfg->vals[i] = *v;
    memset(v, 0, sizeof *v);
    size_t len = strlen(origin);
    /* keep the end ("...dir/file.yaml:12"): the line number matters more than the path */
    if (len >= ORIGIN_MAX) snprintf(cfg->origin[i], ORIGIN_MAX, "...%s", origin + len - (ORIGIN_MAX - 4));
    else memcpy(cfg->origin[i], origin, len + 1);
}

/* ---- table and lifetime -------------------------------------------------------------- */

static bool name_valid(const char *s) {
    size_t len = strnlen(s, KEY_MAX + 1);
    if (len == 0 || len > KEY_MAX || s[0] == '.' || s[len - 1] == '.') return false;
    for (size_t k = 0; k < len; k++) {
        if (s[k] == '.' && s[k + 1] == '.') return false;
        if (!(islower((unsigned char)s[k]) || isdigit((unsigned char)s[k]) || s[k] == '_' || s[k] == '.'))
            return false;
    }
    return true;
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
            return prefix_error(err, st == QRL_STATUS_NOMEM ? st : QRL_STATUS_INTERNAL,
                                "config table: bad default: ");
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

static qrl_status at(loader *ld, yaml_mark_t m, qrl_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static qrl_status at(loader *ld, yaml_mark_t m, qrl_status st, const char *fmt, ...) {
    if (!ld->err) return st;
    va_list ap;
    va_start(ap, fmt);
    qrl_error_setv(ld->err, st, fmt, ap);
    va_end(ap);
    return prefix_error(ld->err, st, "%s:%zu:%zu: ", ld->origin, m.line + 1, m.column + 1);
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
 * (a section name with a scalar/sequence value included) or a key already set. */
static qrl_status leaf_index(loader *ld, yaml_mark_t key_mark, int *idx) {
    const qrl_config_t *cfg = ld->cfg;
    *idx = find_key(cfg->table, cfg->n, ld->path);
    if (*idx < 0) {
        if (is_section(cfg->table, cfg->n, ld->path))
            return at(ld, key_mark, QRL_STATUS_INVALID_ARGUMENT,
                      "%s is a section: expected a mapping of its keys", ld->path);
        unknown_key(cfg->table, cfg->n, ld->path, "", ld->err);
        return prefix_error(ld->err, QRL_STATUS_NOT_FOUND, "%s:%zu:%zu: ", ld->origin, key_mark.line + 1,
                            key_mark.column + 1);
    }
    if (ld->line[*idx])
        return at(ld, key_mark, QRL_STATUS_PARSE, "duplicate key %s (first given at line %d)", ld->path,
                  ld->line[*idx]);
    return QRL_OK;
}

static qrl_status load_scalar(loader *ld, yaml_mark_t key_mark, const yaml_event_t *ev) {
    if (is_null(ev) && find_key(ld->cfg->table, ld->cfg->n, ld->path) < 0 &&
        is_section(ld->cfg->table, ld->cfg->n, ld->path))
        return QRL_OK; /* "rollout:" with every key commented out */
    int idx;
    qrl_status st = leaf_index(ld, key_mark, &idx);
    if (st) return st;
    const qrl_config_entry *e = &ld->cfg->table[idx];
    const char *s = (const char *)ev->data.scalar.value;
    if (is_null(ev))
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: missing value%s", e->name,
                  e->type == QRL_CONFIG_TYPE_STRING || e->type == QRL_CONFIG_TYPE_LIST
                      ? " (write '' for an empty one)" : "");
    if (strlen(s) != ev->data.scalar.length)
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: value contains a NUL byte", e->name);
    value v;
    st = parse_text(e, s, &v, ld->err);
    if (st)
        return prefix_error(ld->err, st, "%s:%zu:%zu: ", ld->origin, ev->start_mark.line + 1,
                            ev->start_mark.column + 1);
    ld->stage[idx] = v;
    ld->line[idx] = (int)key_mark.line + 1;
    return QRL_OK;
}

static qrl_status load_sequence(loader *ld, yaml_mark_t key_mark, const yaml_event_t *ev) {
    int idx;
    qrl_status st = leaf_index(ld, key_mark, &idx);
    if (st) return st;
    const qrl_config_entry *e = &ld->cfg->table[idx];
    if (e->type != QRL_CONFIG_TYPE_LIST)
        return at(ld, ev->start_mark, QRL_STATUS_INVALID_ARGUMENT, "%s: expected %s, got a sequence",
                  e->name, type_expect(e->type));
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
                    ld->path, type_expect(ld->cfg->table[idx].type));
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
    if (count == 0 && plen > 0 && !is_section(ld->cfg->table, ld->cfg->n, ld->path)) {
        unknown_key(ld->cfg->table, ld->cfg->n, ld->path, "", ld->err);
        return prefix_error(ld->err, QRL_STATUS_NOT_FOUND, "%s:%zu:%zu: ", ld->origin, start.line + 1,
                            start.column + 1);
    }
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

qrl_status qrl_config_load_buffer(qrl_config_t *cfg, const char *origin, const void *data, size_t len,
                                  qrl_error *err) {
    QRL_CHECK(cfg != NULL && origin != NULL && (data != NULL || len == 0));
    loader ld = {.cfg = cfg, .origin = origin, .err = err};
    ld.stage = calloc(cfg->n ? cfg->n : 1, sizeof *ld.stage);
    ld.line = calloc(cfg->n ? cfg->n : 1, sizeof *ld.line);
    qrl_status st;
    if (!ld.stage || !ld.line || !yaml_parser_initialize(&ld.parser)) {
        free(ld.stage);
        free(ld.line);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", origin);
    }
    yaml_parser_set_input_string(&ld.parser, data ? data : (const void *)"", len);
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

qrl_status qrl_config_load_file(qrl_config_t *cfg, const char *path, qrl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "%s: cannot open config file: %s", path, strerror(errno));
    char *buf = malloc(FILE_MAX + 1);
    size_t len = buf ? fread(buf, 1, FILE_MAX + 1, f) : 0;
    qrl_status st = QRL_OK;
    if (!buf) st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    else if (ferror(f)) st = qrl_error_set(err, QRL_STATUS_IO, "%s: read error: %s", path, strerror(errno));
    else if (len > FILE_MAX) st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: larger than %u bytes", path, FILE_MAX);
    fclose(f);
    if (!st) st = qrl_config_load_buffer(cfg, path, buf, len, err);
    free(buf);
    return st;
}

/* ---- set and get ---------------------------------------------------------------------- */

qrl_status qrl_config_set(qrl_config_t *cfg, const char *key, const char *value_text, qrl_error *err) {
    QRL_CHECK(cfg != NULL && key != NULL && value_text != NULL);
    int i = find_key(cfg->table, cfg->n, key);
    if (i < 0) return unknown_key(cfg->table, cfg->n, key, "", err);
    const qrl_config_entry *e = &cfg->table[i];
    if (!e->runtime_mutable)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s cannot be changed at run time (restart with --%s=VALUE)", key, key);
    value v;
    QRL_TRY(parse_text(e, value_text, &v, err));
    commit(cfg, (size_t)i, &v, "set");
    return QRL_OK;
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

bool qrl_config_value_text(const qrl_config_t *cfg, const char *key, char *buf, size_t len) {
    int i = find_key(cfg->table, cfg->n, key);
    if (i < 0) return false;
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        write_value(f, &cfg->table[i], &cfg->vals[i], false);
        fclose(f);
    }
    if (len) snprintf(buf, len, "%s", text ? text : "");
    free(text);
    return true;
}

void qrl_config_write(const qrl_config_t *cfg, FILE *out) {
    for (size_t i = 0; i < cfg->n; i++) {
        fprintf(out, "%s: ", cfg->table[i].name);
        write_value(out, &cfg->table[i], &cfg->vals[i], true);
        fprintf(out, "  # %s\n", cfg->origin[i]);
    }
}

void qrl_config_log(const qrl_config_t *cfg, const char *tag) {
    for (size_t i = 0; i < cfg->n; i++) {
        char *text = NULL;
        size_t tlen = 0;
        FILE *f = open_memstream(&text, &tlen);
        if (!f) return;
        write_value(f, &cfg->table[i], &cfg->vals[i], true);
        fclose(f);
        QRL_LOG_INFO(tag, "config %s=%s origin=%s", cfg->table[i].name, text, cfg->origin[i]);
        free(text);
    }
}

/* ---- help ----------------------------------------------------------------------------- */

void qrl_config_help(const qrl_config_entry *table, size_t n, const char *program, FILE *out) {
    fprintf(out,
            "usage: %s [--config FILE] [--section.key=VALUE ...] [--help] [--help-markdown]\n\n"
            "Keys are set in the YAML file (section: {key: value}) or on the command line\n"
            "(--section.key=VALUE or --section.key VALUE); the command line wins.\n"
            "Keys marked runtime can be changed on a running program with qrlctl set.\n\n",
            program);
    for (size_t i = 0; i < n; i++) {
        const qrl_config_entry *e = &table[i];
        char r[80] = "";
        fprintf(out, "  --%s=<%s>  default: %s", e->name, type_name(e->type),
                e->def && *e->def ? e->def : "\"\"");
        if (has_range(e)) format_range(e, r, sizeof r), fprintf(out, "  range: %s", r);
        if (e->type == QRL_CONFIG_TYPE_ENUM) fprintf(out, "  one of: %s", e->choices);
        fprintf(out, "%s\n      %s\n", e->runtime_mutable ? "  (runtime)" : "", e->doc ? e->doc : "");
    }
}

/* Markdown table cell text: '|' escaped, newlines flattened. */
static void md_cell(FILE *out, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", out);
        else fputc(*s == '\n' ? ' ' : *s, out);
    }
}

void qrl_config_help_markdown(const qrl_config_entry *table, size_t n, const char *program, FILE *out) {
    const char *base = strrchr(program, '/');
    base = base ? base + 1 : program;
    fprintf(out,
            "# %s configuration\n\n"
            "Generated by `%s --help-markdown` (`make docs`); do not edit by hand.\n"
            "Set keys in the YAML file given with `--config FILE` (nested by section) or on the\n"
            "command line as `--section.key=VALUE`; see [config.md](config.md). Keys marked\n"
            "*runtime* can be changed on a running program with `qrlctl set`.\n\n"
            "| key | type | default | allowed | runtime | description |\n"
            "| --- | --- | --- | --- | --- | --- |\n",
            base, base);
    for (size_t i = 0; i < n; i++) {
        const qrl_config_entry *e = &table[i];
        char r[80] = "";
        fprintf(out, "| `%s` | %s | ", e->name, type_name(e->type));
        if (e->def && *e->def) fputc('`', out), md_cell(out, e->def), fputc('`', out);
        else fputs("(empty)", out);
        fputs(" | ", out);
        if (has_range(e)) format_range(e, r, sizeof r), fputs(r, out);
        if (e->type == QRL_CONFIG_TYPE_ENUM) {
            fputc('`', out);
            for (const char *c = e->choices; *c; c++) {
                if (*c == '|') fputs("`, `", out);
                else fputc(*c, out);
            }
            fputc('`', out);
        }
        fprintf(out, " | %s | ", e->runtime_mutable ? "yes" : "no");
        md_cell(out, e->doc);
        fputs(" |\n", out);
    }
}

/* ---- command line ----------------------------------------------------------------------- */

typedef struct override {
    int idx;
    const char *value;
    const char *arg; /* argv element naming the key, for messages */
} override;

static qrl_status scan_args(qrl_config_t *cfg, int argc, char **argv, const char **files, int *nfiles,
                            override *ovr, int *novr, qrl_config_action *action, int *npos,
                            qrl_error *err) {
    bool options = true;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!options || a[0] != '-' || strcmp(a, "-") == 0) {
            argv[1 + (*npos)++] = a; /* positional; never beyond i, so nothing unread is lost */
        } else if (strcmp(a, "--") == 0) {
            options = false;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = QRL_CONFIG_ACTION_HELP;
        } else if (strcmp(a, "--help-markdown") == 0) {
            *action = QRL_CONFIG_ACTION_HELP_MARKDOWN;
        } else if (strncmp(a, "--config=", 9) == 0) {
            files[(*nfiles)++] = a + 9;
        } else if (strcmp(a, "--config") == 0) {
            if (i + 1 >= argc)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "--config needs a file name");
            files[(*nfiles)++] = argv[++i];
        } else if (a[1] == '-') {
            char name[KEY_MAX + 1];
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            snprintf(name, sizeof name, "%.*s", (int)(len < KEY_MAX ? len : KEY_MAX), a + 2);
            int idx = len <= KEY_MAX ? find_key(cfg->table, cfg->n, name) : -1;
            if (idx < 0) return unknown_key(cfg->table, cfg->n, name, "--", err);
            const char *val = eq ? eq + 1 : NULL;
            bool b;
            if (!val && cfg->table[idx].type == QRL_CONFIG_TYPE_BOOL)
                val = i + 1 < argc && parse_bool(argv[i + 1], &b) ? argv[++i] : "true";
            else if (!val && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0))
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s needs a value (%s=<%s>)", a, a,
                                     type_name(cfg->table[idx].type));
            else if (!val)
                val = argv[++i];
            ovr[(*novr)++] = (override){idx, val, a};
        } else {
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "unknown option %s (see --help)", a);
        }
    }
    return QRL_OK;
}

qrl_status qrl_config_parse_args(const qrl_config_entry *table, size_t n, int argc, char **argv,
                                 qrl_config_t **out, qrl_config_action *action, int *npositional,
                                 qrl_error *err) {
    QRL_CHECK(out != NULL && action != NULL && npositional != NULL && argc >= 1 && argv != NULL);
    *out = NULL;
    *action = QRL_CONFIG_ACTION_RUN;
    *npositional = 0;
    qrl_config_t *cfg = NULL;
    QRL_TRY(qrl_config_new(table, n, &cfg, err));
    qrl_status st = QRL_STATUS_NOMEM;
    const char **files = calloc((size_t)argc, sizeof *files);
    override *ovr = calloc((size_t)argc, sizeof *ovr);
    int nfiles = 0, novr = 0;
    if (!files || !ovr) {
        qrl_error_set(err, st, "config: out of memory");
        goto done;
    }
    QRL_TRY_GOTO(scan_args(cfg, argc, argv, files, &nfiles, ovr, &novr, action, npositional, err), done);
    if (*action != QRL_CONFIG_ACTION_RUN) goto done; /* help needs no file, and *out stays NULL */
    for (int k = 0; k < nfiles; k++) QRL_TRY_GOTO(qrl_config_load_file(cfg, files[k], err), done);
    for (int k = 0; k < novr; k++) {
        const qrl_config_entry *e = &table[ovr[k].idx];
        value v;
        st = parse_text(e, ovr[k].value, &v, err);
        if (st) {
            if (strchr(ovr[k].arg, '=')) prefix_error(err, st, "%s: ", ovr[k].arg);
            else prefix_error(err, st, "%s %s: ", ovr[k].arg, ovr[k].value);
            goto done;
        }
        char where[KEY_MAX + 3];
        snprintf(where, sizeof where, "--%s", e->name);
        commit(cfg, (size_t)ovr[k].idx, &v, where);
    }
    *out = cfg;
    cfg = NULL;
done:
    free(files);
    free(ovr);
    qrl_config_destroy(cfg);
    return st;
}
