/* Kernel tuning knobs (tuning.h): the table, the parser, and the values programs set. */
#include "base/tuning.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const qrl_tuning_info knobs[QRL_TUNING_COUNT_] = {
#define QRL_X_(id, name, type, dflt, lo, hi, doc) \
    [QRL_TUNING_##id] = {name, "QRL_" #id, doc, QRL_TUNING_##type, dflt, lo, hi},
    QRL_TUNING_TABLE(QRL_X_)
#undef QRL_X_
};

/* What qrl_tuning_set gave: the value, published by its flag (release / acquire). */
static _Atomic double set_value[QRL_TUNING_COUNT_];
static atomic_bool set_flag[QRL_TUNING_COUNT_];
static atomic_bool warned[QRL_TUNING_COUNT_]; /* a bad environment value was reported */

const qrl_tuning_info *qrl_tuning_info_of(qrl_tuning_knob k) { return &knobs[k]; }

/* Text -> a value of the knob's type within its range; false when it is not one. */
static bool parse(const qrl_tuning_info *t, const char *s, double *out) {
    if (t->type == QRL_TUNING_BOOL) {
        static const char *yes[] = {"1", "true", "on", "yes"}, *no[] = {"0", "false", "off", "no"};
        for (int i = 0; i < 4; i++) {
            if (!strcasecmp(s, yes[i])) return *out = 1, true;
            if (!strcasecmp(s, no[i])) return *out = 0, true;
        }
        return false;
    }
    char *end;
    errno = 0;
    double v = t->type == QRL_TUNING_INT ? (double)strtol(s, &end, 10) : strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < t->min || v > t->max) return false;
    *out = v;
    return true;
}

static double value(qrl_tuning_knob k) {
    if (atomic_load_explicit(&set_flag[k], memory_order_acquire))
        return atomic_load_explicit(&set_value[k], memory_order_relaxed);
    const qrl_tuning_info *t = &knobs[k];
    const char *e = getenv(t->env);
    double v;
    if (!e || !*e) return t->dflt;
    if (parse(t, e, &v)) return v;
    if (!atomic_exchange(&warned[k], true))
        fprintf(stderr, "qrl: ignoring %s=\"%s\" (%s; default %g holds)\n", t->env, e,
                t->type == QRL_TUNING_BOOL ? "want 0 or 1" : "not a number in range", t->dflt);
    return t->dflt;
}

bool qrl_tuning_bool(qrl_tuning_knob k) { return value(k) != 0; }
int qrl_tuning_int(qrl_tuning_knob k) { return (int)value(k); }
double qrl_tuning_real(qrl_tuning_knob k) { return value(k); }

/* The knob named name (table name or environment variable); -1 when none. */
static int find(const char *name, size_t len) {
    for (int k = 0; k < QRL_TUNING_COUNT_; k++)
        if ((strlen(knobs[k].name) == len && !strncmp(knobs[k].name, name, len)) ||
            (strlen(knobs[k].env) == len && !strncmp(knobs[k].env, name, len)))
            return k;
    return -1;
}

/* Knob and value of name (nlen bytes) = val (vlen bytes; "": drop what was set). */
static qrl_status check_pair(const char *name, size_t nlen, const char *val, size_t vlen, int *k,
                             double *v, bool *drop, qrl_error *err) {
    int found = find(name, nlen);
    if (found < 0)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "tuning: no knob '%.*s' (docs/tuning.md)",
                             (int)nlen, name);
    const qrl_tuning_info *t = &knobs[found];
    char buf[64];
    if (vlen >= sizeof buf)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tuning: %s: value too long",
                             t->name);
    memcpy(buf, val, vlen);
    buf[vlen] = '\0';
    *drop = vlen == 0;
    if (!*drop && !parse(t, buf, v)) {
        if (t->type == QRL_TUNING_BOOL)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "tuning: %s: '%s' is not a boolean (0/1)", t->name, buf);
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "tuning: %s: '%s' is not %s in [%g, %g]", t->name, buf,
                             t->type == QRL_TUNING_INT ? "an integer" : "a number", t->min, t->max);
    }
    *k = found;
    return QRL_OK;
}

static bool blank(char c) { return c == ' ' || c == '\t'; }

/* One "name=value" item of len bytes, blanks around name and value allowed; *k -1 for an
 * empty item (nothing to do). */
static qrl_status check_item(const char *item, size_t len, int *k, double *v, bool *drop,
                             qrl_error *err) {
    while (len && blank(*item)) item++, len--;
    while (len && blank(item[len - 1])) len--;
    *k = -1;
    if (!len) return QRL_OK;
    const char *eq = memchr(item, '=', len);
    if (!eq)
        return qrl_error_set(err, QRL_STATUS_PARSE, "tuning: '%.*s' is not name=value",
                             (int)len, item);
    size_t nlen = (size_t)(eq - item);
    while (nlen && blank(item[nlen - 1])) nlen--;
    const char *val = eq + 1;
    size_t vlen = len - (size_t)(val - item);
    while (vlen && blank(*val)) val++, vlen--;
    return check_pair(item, nlen, val, vlen, k, v, drop, err);
}

static void store(int k, double v, bool drop) {
    if (drop) {
        atomic_store_explicit(&set_flag[k], false, memory_order_release);
        return;
    }
    atomic_store_explicit(&set_value[k], v, memory_order_relaxed);
    atomic_store_explicit(&set_flag[k], true, memory_order_release);
}

qrl_status qrl_tuning_set(const char *name, const char *value_text, qrl_error *err) {
    int k;
    double v = 0;
    bool drop = false;
    const char *val = value_text ? value_text : "";
    QRL_TRY(check_pair(name, strlen(name), val, strlen(val), &k, &v, &drop, err));
    store(k, v, drop);
    return QRL_OK;
}

qrl_status qrl_tuning_apply(const char *list, qrl_error *err) {
    for (int pass = 0; pass < 2; pass++) { /* check all, then set all */
        for (const char *p = list; p && *p;) {
            const char *c = strchr(p, ',');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            int k;
            double v = 0;
            bool drop = false;
            QRL_TRY(check_item(p, len, &k, &v, &drop, err));
            if (pass == 1 && k >= 0) store(k, v, drop);
            p += len + (c != NULL);
        }
    }
    return QRL_OK;
}

void qrl_tuning_reset(void) {
    for (int k = 0; k < QRL_TUNING_COUNT_; k++)
        atomic_store_explicit(&set_flag[k], false, memory_order_release);
}
