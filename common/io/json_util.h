/* Helpers over jansson: load a JSON file with errors naming file:line:column, and typed
 * field getters whose errors name the file and the field, e.g.
 *   "config.json: field 'hidden_size' must be an integer".
 *
 * `file` is the label used in messages (usually the path); `obj` must be a JSON object.
 * Returned strings and objects are borrowed from `obj` (valid while it lives). */
#ifndef QRL_IO_JSON_UTIL_H
#define QRL_IO_JSON_UTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Parse the file at `path` (duplicate keys rejected).  *out is a new reference owned by
 * the caller (json_decref).  Errors: IO (cannot open/read), PARSE ("path:line:col: why"). */
qrl_status qrl_json_load_file(const char *path, json_t **out, qrl_error *err);
/* Same for an in-memory buffer of `n` bytes; `name` is used in messages. */
qrl_status qrl_json_load_buffer(const char *buf, size_t n, const char *name, json_t **out,
                                qrl_error *err);

/* Required fields: NOT_FOUND when absent (or null), PARSE when of the wrong type,
 * OUT_OF_RANGE (get_int_range) when outside [min, max]. */
qrl_status qrl_json_get_int(const json_t *obj, const char *file, const char *key, int64_t *out,
                            qrl_error *err);
qrl_status qrl_json_get_int_range(const json_t *obj, const char *file, const char *key,
                                  int64_t min, int64_t max, int64_t *out, qrl_error *err);
/* Accepts JSON integers and reals. */
qrl_status qrl_json_get_number(const json_t *obj, const char *file, const char *key, double *out,
                               qrl_error *err);
qrl_status qrl_json_get_bool(const json_t *obj, const char *file, const char *key, bool *out,
                             qrl_error *err);
qrl_status qrl_json_get_string(const json_t *obj, const char *file, const char *key,
                               const char **out, qrl_error *err);
qrl_status qrl_json_get_object(const json_t *obj, const char *file, const char *key,
                               json_t **out, qrl_error *err);
qrl_status qrl_json_get_array(const json_t *obj, const char *file, const char *key, json_t **out,
                              qrl_error *err);

/* Optional fields: absent or null gives `def` (NULL for the pointer kinds) and OK;
 * present with the wrong type is PARSE as above. */
qrl_status qrl_json_opt_int(const json_t *obj, const char *file, const char *key, int64_t def,
                            int64_t *out, qrl_error *err);
qrl_status qrl_json_opt_number(const json_t *obj, const char *file, const char *key, double def,
                               double *out, qrl_error *err);
qrl_status qrl_json_opt_bool(const json_t *obj, const char *file, const char *key, bool def,
                             bool *out, qrl_error *err);
qrl_status qrl_json_opt_string(const json_t *obj, const char *file, const char *key,
                               const char *def, const char **out, qrl_error *err);
qrl_status qrl_json_opt_object(const json_t *obj, const char *file, const char *key,
                               json_t **out, qrl_error *err);
qrl_status qrl_json_opt_array(const json_t *obj, const char *file, const char *key,
                              json_t **out, qrl_error *err);

#endif
