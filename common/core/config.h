/* Table-driven configuration (STYLE 10, SPEC §9).
 *
 * Each program declares one static table of qrl_config_entry.  The table drives:
 *   - the YAML file (nested mappings: `rollout: {kv_cache: int4}` is key "rollout.kv_cache";
 *     a flat `rollout.kv_cache: int4` line is accepted too),
 *   - command-line overrides `--rollout.kv_cache=int4` or `--rollout.kv_cache int4`
 *     (a '-' in an option name reads as '_': `--max-new-tokens` sets max_new_tokens),
 *   - `--help` (text) and `--help-markdown` (docs/config-<program>.md via `make docs`),
 *   - the resolved config printed at start (qrl_config_write, YAML, loadable again),
 *   - qrl_config_set for `qrlctl set`, which only changes keys marked runtime_mutable.
 * Precedence: command line over YAML file over the table default.
 *
 * Typed settings (the redis createBoolConfig(..., &server.x, ...) idea): a row made with
 * QRL_CFG_INT/_BOOL/... also names the field of the program's settings struct it fills.
 * qrl_config_bind(cfg, &settings) writes every such field once, and from then on every
 * load, apply and set that changes a key writes its field too, after the same checks (a
 * refused change leaves the field as it was).  Code then reads `s->quota`, not a string
 * lookup; a misspelt field is a compile error and a field of the wrong C type too.
 *   typedef struct gen_settings { int64_t n; bool json; qrl_kv_enum kv; const char *model;
 *                                 qrl_config_list stops; } gen_settings;
 *   static const qrl_config_entry CONFIG[] = {
 *       QRL_CFG_INT("n", gen_settings, n, "200", 1, 1 << 24, false, "prompts"),
 *       QRL_CFG_ENUM("kv", gen_settings, kv, "f32", "f32|bf16", false, "KV format"), ...};
 * Field C types, by row type (the macros check them):
 *   BOOL    bool
 *   INT     int64_t (long, long long), or int when the row's range lies inside int's
 *           (checked by qrl_config_new: an int field needs a bounded range)
 *   DOUBLE  double (or float: the value rounded to float)
 *   STRING  const char *: owned by the cfg, valid until that key changes or cfg is destroyed
 *   ENUM    int or a C enum (int-sized): the index of the value in `choices`; or
 *           const char *: the value's text, owned as STRING's (for code that passes the name on)
 *   LIST    qrl_config_list {items, n}: array and strings owned by the cfg, valid as STRING
 * Rows written as plain initializers (no field) keep working and are read with the getters.
 * core/program.h binds a program's settings struct as part of the main() prelude.
 *
 * The library prints nothing on error: failures return a qrl_status and describe the
 * problem in the caller's qrl_error, naming the file:line:column and the key.
 *
 * Threading: a qrl_config_t is not locked.  Read and set it from one thread (the daemon's
 * event loop) or synchronise outside; string/list pointers returned by the getters stay
 * valid until that key is set again or the config is destroyed; so do bound fields, which
 * change with the key (a bound struct is written from the same thread). */
#ifndef QRL_CORE_CONFIG_H
#define QRL_CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum qrl_config_type {
    QRL_CONFIG_TYPE_BOOL,   /* true/false (also yes/no, on/off, 1/0) */
    QRL_CONFIG_TYPE_INT,    /* int64, decimal */
    QRL_CONFIG_TYPE_DOUBLE, /* finite double ("float" in help) */
    QRL_CONFIG_TYPE_STRING, /* UTF-8 text without NUL */
    QRL_CONFIG_TYPE_ENUM,   /* one of `choices` */
    QRL_CONFIG_TYPE_LIST,   /* list of strings: YAML sequence, or "a,b,c" as text */
} qrl_config_type;

/* The C type of the settings-struct field a row fills (set by the QRL_CFG_* macros). */
typedef enum qrl_config_field {
    QRL_CONFIG_FIELD_NONE = 0, /* no field: a plain row, read with the getters */
    QRL_CONFIG_FIELD_BOOL,     /* bool */
    QRL_CONFIG_FIELD_INT,      /* int (INT rows whose range fits in int) */
    QRL_CONFIG_FIELD_INT64,    /* int64_t */
    QRL_CONFIG_FIELD_FLOAT,    /* float */
    QRL_CONFIG_FIELD_DOUBLE,   /* double */
    QRL_CONFIG_FIELD_STRING,   /* const char *: STRING, or an ENUM's text */
    QRL_CONFIG_FIELD_ENUM,     /* int or an int-sized C enum: index in choices */
    QRL_CONFIG_FIELD_LIST,     /* qrl_config_list */
} qrl_config_field;

/* A LIST key's value in a settings struct: n items, owned by the cfg. */
typedef struct qrl_config_list {
    const char *const *items;
    size_t n;
} qrl_config_list;

/* One key of a program's table.  Static data; the table must outlive every
 * qrl_config_t made from it. */
typedef struct qrl_config_entry {
    const char *name;        /* "section.key": lowercase [a-z0-9_] words joined by '.' */
    qrl_config_type type;
    const char *def;         /* default, as text (what --name=TEXT would give); NULL = "" */
    double min, max;         /* INT/DOUBLE inclusive range; min == max == 0: unbounded;
                                use +-INFINITY for one open side */
    const char *choices;     /* ENUM only: allowed values joined by '|', "bf16|int8|int4" */
    bool runtime_mutable;    /* qrl_config_set (qrlctl set) may change it while running */
    const char *doc;         /* one line for --help and docs/ */
    qrl_config_field field;  /* the bound field's C type; NONE: no field */
    size_t offset;           /* offsetof(settings struct, field) when field != NONE */
} qrl_config_entry;

/* Plain rows (8 initializers) leave `field` and `offset` zero: no field.  GCC's -Wextra
 * would call that a missing initializer; it is the intended default here. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* Field kinds chosen from the field's C type; a type the row cannot fill has no
 * association, so the table does not compile.  The field expression is not evaluated. */
#define QRL_CFG_FIELD_(T, f) (((T *)0)->f)
#define QRL_CFG_KIND_BOOL_(T, f) _Generic(QRL_CFG_FIELD_(T, f), bool: QRL_CONFIG_FIELD_BOOL)
#define QRL_CFG_KIND_INT_(T, f)                                                                  \
    _Generic(QRL_CFG_FIELD_(T, f), int: QRL_CONFIG_FIELD_INT, long: QRL_CONFIG_FIELD_INT64,      \
             long long: QRL_CONFIG_FIELD_INT64)
#define QRL_CFG_KIND_DOUBLE_(T, f) \
    _Generic(QRL_CFG_FIELD_(T, f), double: QRL_CONFIG_FIELD_DOUBLE, float: QRL_CONFIG_FIELD_FLOAT)
#define QRL_CFG_KIND_STRING_(T, f) _Generic(QRL_CFG_FIELD_(T, f), const char *: QRL_CONFIG_FIELD_STRING)
#define QRL_CFG_KIND_ENUM_(T, f) /* a C enum is compatible with int or unsigned int */        \
    _Generic(QRL_CFG_FIELD_(T, f), int: QRL_CONFIG_FIELD_ENUM, unsigned: QRL_CONFIG_FIELD_ENUM,  \
             const char *: QRL_CONFIG_FIELD_STRING)
#define QRL_CFG_KIND_LIST_(T, f) _Generic(QRL_CFG_FIELD_(T, f), qrl_config_list: QRL_CONFIG_FIELD_LIST)
#define QRL_CFG_ROW_(nm, ty, T, f, kind, df, lo, hi, ch, mut, dc)                                 \
    {.name = (nm), .type = (ty), .def = (df), .min = (lo), .max = (hi), .choices = (ch),         \
     .runtime_mutable = (mut), .doc = (dc), .field = kind##_(T, f), .offset = offsetof(T, f)}

/* Rows bound to field `f` of settings struct `T` (see the top of this file for the types). */
#define QRL_CFG_BOOL(name, T, f, def, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_BOOL, T, f, QRL_CFG_KIND_BOOL, def, 0, 0, NULL, mut, doc)
#define QRL_CFG_INT(name, T, f, def, min, max, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_INT, T, f, QRL_CFG_KIND_INT, def, min, max, NULL, mut, doc)
#define QRL_CFG_DOUBLE(name, T, f, def, min, max, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_DOUBLE, T, f, QRL_CFG_KIND_DOUBLE, def, min, max, NULL, mut, doc)
#define QRL_CFG_STRING(name, T, f, def, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_STRING, T, f, QRL_CFG_KIND_STRING, def, 0, 0, NULL, mut, doc)
#define QRL_CFG_ENUM(name, T, f, def, choices, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_ENUM, T, f, QRL_CFG_KIND_ENUM, def, 0, 0, choices, mut, doc)
#define QRL_CFG_LIST(name, T, f, def, mut, doc) \
    QRL_CFG_ROW_(name, QRL_CONFIG_TYPE_LIST, T, f, QRL_CFG_KIND_LIST, def, 0, 0, NULL, mut, doc)

typedef struct qrl_config qrl_config_t;

/* Validate `table` (names well formed and unique, no key that is also a section,
 * defaults parse and lie in range, enums have choices) and make a config holding the
 * defaults.  The table is borrowed.  Errors: INTERNAL naming the bad entry (a bug in the
 * program's table), NOMEM.  *out is NULL on error; free with qrl_config_destroy. */
qrl_status qrl_config_new(const qrl_config_entry *table, size_t n, qrl_config_t **out,
                          qrl_error *err);
void qrl_config_destroy(qrl_config_t *cfg);

/* Apply a YAML file.  All or nothing: on error no key is changed.  Keys not in the file
 * keep their value.  An empty file (or only comments) is valid.  Errors, each prefixed
 * "path:line:column: " and naming the key:
 *   IO / NOT_FOUND   the file cannot be read
 *   PARSE            malformed YAML, top level not a mapping, several documents, an alias,
 *                    a non-scalar key, a key given twice, nesting deeper than 8
 *   NOT_FOUND        unknown key (with the closest known key suggested)
 *   INVALID_ARGUMENT wrong type ("expected an integer, got 'abc'"), bad enum value (lists
 *                    the allowed ones), missing value, a mapping where a value belongs
 *   OUT_OF_RANGE     "rollout.temperature = -1 is outside [0, 100]" */
qrl_status qrl_config_load_file(qrl_config_t *cfg, const char *path, qrl_error *err);
/* Same, from memory; `origin` names the text in messages and in qrl_config_write. */
qrl_status qrl_config_load_buffer(qrl_config_t *cfg, const char *origin, const void *data,
                                  size_t len, qrl_error *err);

/* Set `key` from its text form at run time (qrlctl set).  Errors: NOT_FOUND (unknown key,
 * with a suggestion), UNSUPPORTED (key not runtime-mutable), INVALID_ARGUMENT,
 * OUT_OF_RANGE.  On error the value is unchanged. */
qrl_status qrl_config_set(qrl_config_t *cfg, const char *key, const char *value_text,
                          qrl_error *err);

/* Set any key, runtime-mutable or not, before the program runs: command-line overrides,
 * the environment, a launcher.  `origin` is recorded for qrl_config_origin ("--name").
 * Errors as qrl_config_set, except UNSUPPORTED.  On error the value is unchanged. */
qrl_status qrl_config_apply(qrl_config_t *cfg, const char *key, const char *value_text,
                            const char *origin, qrl_error *err);

/* Bind `settings` (a struct of the type the table's QRL_CFG_* rows name; borrowed, it must
 * outlive the binding): write every bound row's current value into its field now, and
 * again whenever a load, apply or set changes the key.  Rows without a field are skipped.
 * One struct per cfg: a second bind replaces the first; NULL unbinds.  Cannot fail. */
void qrl_config_bind(qrl_config_t *cfg, void *settings);

/* Typed getters.  The key must be in the table with that type (QRL_CHECK: asking for
 * an unknown key or the wrong type is a programming error).  get_string serves STRING
 * and ENUM keys; get_enum returns the index of the value in `choices`. */
bool qrl_config_get_bool(const qrl_config_t *cfg, const char *key);
int64_t qrl_config_get_int(const qrl_config_t *cfg, const char *key);
double qrl_config_get_double(const qrl_config_t *cfg, const char *key);
const char *qrl_config_get_string(const qrl_config_t *cfg, const char *key);
int qrl_config_get_enum(const qrl_config_t *cfg, const char *key);
/* Items of a LIST key; *n receives the count.  Array and strings owned by cfg. */
const char *const *qrl_config_get_list(const qrl_config_t *cfg, const char *key, size_t *n);

/* Text form of a key's value (the form --key=TEXT accepts; lists joined by ','), into
 * buf (truncated to len).  Returns false when the key is unknown. */
bool qrl_config_value_text(const qrl_config_t *cfg, const char *key, char *buf, size_t len);
/* Where the current value came from: "default", "path:line", "--name", "set", or the
 * origin given to qrl_config_apply. */
const char *qrl_config_origin(const qrl_config_t *cfg, const char *key);
/* The keys in table order: how many, and the name of key i (NULL when i >= the count). */
size_t qrl_config_count(const qrl_config_t *cfg);
const char *qrl_config_key_at(const qrl_config_t *cfg, size_t i);

/* The resolved config as flat YAML, one "key: value  # origin" line per key, in table
 * order; qrl_config_load_* reads it back to the same values. */
void qrl_config_write(const qrl_config_t *cfg, FILE *out);
/* The same through the log (STYLE 12), one INFO line per key:
 *   [tag] config rollout.kv_cache=int4 origin=run.yaml:3 */
void qrl_config_log(const qrl_config_t *cfg, const char *tag);

/* "bool", "int", "float", "string", "enum", "list" ("?" for an invalid type). */
const char *qrl_config_type_name(qrl_config_type t);
/* An INT/DOUBLE entry's range as "[min, max]" (infinities as "inf") into buf; "" when
 * the entry has no range. */
void qrl_config_entry_range(const qrl_config_entry *e, char *buf, size_t len);

/* Help text (config_cli.c): usage line, then per key its --name, type, default, range or choices,
 * whether it is runtime-mutable, and its doc line. */
void qrl_config_help(const qrl_config_entry *table, size_t n, const char *program, FILE *out);
/* The same as a markdown page with one table (docs/config-<program>.md). */
void qrl_config_help_markdown(const qrl_config_entry *table, size_t n, const char *program,
                              FILE *out);

typedef enum qrl_config_action {
    QRL_CONFIG_ACTION_RUN,           /* config resolved: go on */
    QRL_CONFIG_ACTION_HELP,          /* print qrl_config_help and exit 0 */
    QRL_CONFIG_ACTION_HELP_MARKDOWN, /* print qrl_config_help_markdown and exit 0 */
    QRL_CONFIG_ACTION_PRINT_CONFIG,  /* --print-config: *out holds the resolved config; print it
                                        with qrl_config_write and exit 0 (nothing else runs) */
} qrl_config_action;

/* Command-line front end for a program's main() (config_cli.c):
 *   --config FILE | --config=FILE   YAML applied first (may repeat; applied in order)
 *   --section.key=VALUE | --section.key VALUE   overrides, applied after every file,
 *                                   left to right (the last one wins)
 *   --section.key                   for a bool key: true (a following true/false/yes/no/
 *                                   on/off/1/0 is taken as its value)
 *   --help | -h, --help-markdown    *action says so; no file is read then
 *   --print-config                  *action = PRINT_CONFIG: files and overrides are applied
 *                                   (errors as for RUN) and *out holds the result
 *   --KEY (unknown, no value)       NOT_FOUND "unknown key KEY" (not "needs a value")
 *   --                              everything after is positional
 * Other arguments are positional: they are moved to argv[1 .. *npositional] in order
 * (argv itself is permuted, getopt style).  On success with action RUN (or PRINT_CONFIG),
 * *out holds the resolved config (the defaults when no file/override is given), to be
 * destroyed by the caller; with a help action *out is NULL and no file has been read.
 * Errors: those of qrl_config_load_file; for overrides the message names the argument
 * ("--rollout.top_p=2: rollout.top_p = 2 is outside [0, 1]", "--rolout.top_p=1: unknown
 * key rolout.top_p (did you mean rollout.top_p?)"); INVALID_ARGUMENT for a missing value
 * or an option that is not --key.  *out is NULL on error. */
qrl_status qrl_config_parse_args(const qrl_config_entry *table, size_t n, int argc, char **argv,
                                 qrl_config_t **out, qrl_config_action *action,
                                 int *npositional, qrl_error *err);

#endif
