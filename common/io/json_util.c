#include "io/json_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

qrl_status qrl_json_load_buffer(const char *buf, size_t n, const char *name, json_t **out,
                                qrl_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s:%d:%d: invalid JSON: %s", name, jerr.line,
                             jerr.column, jerr.text);
    *out = root;
    return QRL_OK;
}

qrl_status qrl_json_load_file(const char *path, json_t **out, qrl_error *err) {
    /* read it ourselves so that "cannot open" is an IO error with errno's reason */
    FILE *f = fopen(path, "rb");
    if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    qrl_status st = QRL_OK;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory reading", path);
                goto done;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: read error: %s", path, strerror(errno));
        goto done;
    }
    st = qrl_json_load_buffer(buf, len, path, out, err);
done:
    free(buf);
    fclose(f);
    return st;
}

/* ---- typed getters -------------------------------------------------------------------- */

/* Looks `key` up: *v = NULL when absent or null (NOT_FOUND if required). */
static qrl_status field(const json_t *obj, const char *file, const char *key, bool required,
                        json_t **v, qrl_error *err) {
    if (!json_is_object(obj))
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: expected a JSON object holding field '%s'",
                             file, key);
    json_t *x = json_object_get(obj, key);
    if (x && json_is_null(x)) x = NULL;
    *v = x;
    if (!x && required)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: field '%s' is missing", file, key);
    return QRL_OK;
}

static qrl_status wrong_type(const char *file, const char *key, const char *what,
                             qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field '%s' must be %s", file, key, what);
}

static qrl_status as_int(const json_t *v, const char *file, const char *key, int64_t *out,
                         qrl_error *err) {
    if (!json_is_integer(v)) return wrong_type(file, key, "an integer", err);
    *out = (int64_t)json_integer_value(v);
    return QRL_OK;
}

static qrl_status as_number(const json_t *v, const char *file, const char *key, double *out,
                            qrl_error *err) {
    if (!json_is_number(v)) return wrong_type(file, key, "a number", err);
    *out = json_number_value(v);
    return QRL_OK;
}

static qrl_status as_bool(const json_t *v, const char *file, const char *key, bool *out,
                          qrl_error *err) {
    if (!json_is_boolean(v)) return wrong_type(file, key, "true or false", err);
    *out = json_is_true(v);
    return QRL_OK;
}

static qrl_status as_string(const json_t *v, const char *file, const char *key,
                            const char **out, qrl_error *err) {
    if (!json_is_string(v)) return wrong_type(file, key, "a string", err);
    *out = json_string_value(v);
    return QRL_OK;
}

qrl_status qrl_json_get_int(const json_t *obj, const char *file, const char *key, int64_t *out,
                            qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    return as_int(v, file, key, out, err);
}

qrl_status qrl_json_get_int_range(const json_t *obj, const char *file, const char *key,
                                  int64_t min, int64_t max, int64_t *out, qrl_error *err) {
    int64_t v;
    QRL_TRY(qrl_json_get_int(obj, file, key, &v, err));
    if (v < min || v > max)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: field '%s' = %lld is outside [%lld, %lld]", file, key,
                             (long long)v, (long long)min, (long long)max);
    *out = v;
    return QRL_OK;
}

qrl_status qrl_json_get_number(const json_t *obj, const char *file, const char *key, double *out,
                               qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    return as_number(v, file, key, out, err);
}

qrl_status qrl_json_get_bool(const json_t *obj, const char *file, const char *key, bool *out,
                             qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    return as_bool(v, file, key, out, err);
}

qrl_status qrl_json_get_string(const json_t *obj, const char *file, const char *key,
                               const char **out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    return as_string(v, file, key, out, err);
}

qrl_status qrl_json_get_object(const json_t *obj, const char *file, const char *key,
                               json_t **out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    if (!json_is_object(v)) return wrong_type(file, key, "an object", err);
    *out = v;
    return QRL_OK;
}

qrl_status qrl_json_get_array(const json_t *obj, const char *file, const char *key, json_t **out,
                              qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, true, &v, err));
    if (!json_is_array(v)) return wrong_type(file, key, "an array", err);
    *out = v;
    return QRL_OK;
}

qrl_status qrl_json_opt_int(const json_t *obj, const char *file, const char *key, int64_t def,
                            int64_t *out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (!v) {
        *out = def;
        return QRL_OK;
    }
    return as_int(v, file, key, out, err);
}

qrl_status qrl_json_opt_number(const json_t *obj, const char *file, const char *key, double def,
                               double *out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (!v) {
        *out = def;
        return QRL_OK;
    }
    return as_number(v, file, key, out, err);
}

qrl_status qrl_json_opt_bool(const json_t *obj, const char *file, const char *key, bool def,
                             bool *out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (!v) {
        *out = def;
        return QRL_OK;
    }
    return as_bool(v, file, key, out, err);
}

qrl_status qrl_json_opt_string(const json_t *obj, const char *file, const char *key,
                               const char *def, const char **out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (!v) {
        *out = def;
        return QRL_OK;
    }
    return as_string(v, file, key, out, err);
}

qrl_status qrl_json_opt_object(const json_t *obj, const char *file, const char *key,
                               json_t **out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (v && !json_is_object(v)) return wrong_type(file, key, "an object", err);
    *out = v;
    return QRL_OK;
}

qrl_status qrl_json_opt_array(const json_t *obj, const char *file, const char *key,
                              json_t **out, qrl_error *err) {
    json_t *v = NULL;
    QRL_TRY(field(obj, file, key, false, &v, err));
    if (v && !json_is_array(v)) return wrong_type(file, key, "an array", err);
    *out = v;
    return QRL_OK;
}
