/* Typed settings (config.h qrl_config_bind): every row type is written to its field at bind,
 * after a YAML load, an apply and a runtime set; refused changes leave the field as it was. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/config.h"

typedef enum kv_format { KV_BF16, KV_INT8, KV_INT4 } kv_format;

typedef struct settings {
    bool stream;
    int max_new;          /* int: its row's range fits */
    int64_t seed;
    double temperature;
    float top_p;
    const char *model;
    kv_format kv;         /* C enum */
    int device;           /* plain int enum */
    const char *kv_name;  /* an enum's text */
    qrl_config_list brokers;
    int untouched;        /* no row names it */
} settings;

static const qrl_config_entry table[] = {
    QRL_CFG_BOOL("rollout.stream", settings, stream, "false", true, "stream partial samples"),
    QRL_CFG_INT("rollout.max_new_tokens", settings, max_new, "1024", 1, 65536, true, "tokens per sample"),
    QRL_CFG_INT("seed", settings, seed, "1234", 0, INFINITY, false, "seed"),
    QRL_CFG_DOUBLE("rollout.temperature", settings, temperature, "1.0", 0, 100, true, "temperature"),
    QRL_CFG_DOUBLE("rollout.top_p", settings, top_p, "0.5", 0, 1, true, "nucleus mass"),
    QRL_CFG_STRING("rollout.model_path", settings, model, "m0", true, "model"),
    QRL_CFG_ENUM("rollout.kv_cache", settings, kv, "int4", "bf16|int8|int4", true, "KV format"),
    QRL_CFG_ENUM("device", settings, device, "cpu", "cpu|cuda", false, "engine"),
    QRL_CFG_ENUM("rollout.kv_name", settings, kv_name, "bf16", "bf16|int8|int4", true, "as text"),
    QRL_CFG_LIST("kafka.brokers", settings, brokers, "a:1,b:2", true, "brokers"),
    {"plain.row", QRL_CONFIG_TYPE_INT, "7", 0, 0, NULL, true, "a row without a field"},
};
#define N (sizeof table / sizeof table[0])

static qrl_config_t *bound(settings *s) {
    qrl_config_t *cfg = NULL;
    qrl_error err;
    cr_assert_eq(qrl_config_new(table, N, &cfg, &err), QRL_OK, "%s", err.msg);
    memset(s, 0, sizeof *s);
    s->untouched = 42;
    qrl_config_bind(cfg, s);
    return cfg;
}

Test(config_bind, bind_writes_every_default) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    cr_assert_eq(s.stream, false);
    cr_assert_eq(s.max_new, 1024);
    cr_assert_eq(s.seed, 1234);
    cr_assert_eq(s.temperature, 1.0);
    cr_assert_eq(s.top_p, 0.5f);
    cr_assert_str_eq(s.model, "m0");
    cr_assert_eq(s.kv, KV_INT4);
    cr_assert_eq(s.device, 0);
    cr_assert_str_eq(s.kv_name, "bf16");
    cr_assert_eq(s.brokers.n, 2);
    cr_assert_str_eq(s.brokers.items[0], "a:1");
    cr_assert_str_eq(s.brokers.items[1], "b:2");
    cr_assert_eq(s.untouched, 42);
    cr_assert_eq(qrl_config_get_int(cfg, "plain.row"), 7); /* the getters still serve every row */
    cr_assert_eq(qrl_config_get_enum(cfg, "rollout.kv_cache"), KV_INT4);
    qrl_config_destroy(cfg);
}

Test(config_bind, yaml_load_writes_fields) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    qrl_error err;
    const char *doc = "rollout:\n  stream: yes\n  max_new_tokens: 77\n  temperature: 0.25\n  top_p: 0.125\n"
                      "  model_path: /m/one\n  kv_cache: int8\n  kv_name: int4\nseed: 9000000000\ndevice: cuda\n"
                      "kafka: {brokers: [x:1, y:2, z:3]}\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", doc, strlen(doc), &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(s.stream, true);
    cr_assert_eq(s.max_new, 77);
    cr_assert_eq(s.seed, 9000000000LL);
    cr_assert_eq(s.temperature, 0.25);
    cr_assert_eq(s.top_p, 0.125f);
    cr_assert_str_eq(s.model, "/m/one");
    cr_assert_eq(s.kv, KV_INT8);
    cr_assert_eq(s.device, 1);
    cr_assert_str_eq(s.kv_name, "int4");
    cr_assert_eq(s.brokers.n, 3);
    cr_assert_str_eq(s.brokers.items[2], "z:3");
    cr_assert_eq(s.untouched, 42);
    qrl_config_destroy(cfg);
}

Test(config_bind, failed_load_changes_no_field) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    qrl_error err;
    /* valid lines before a bad one: all or nothing, fields too */
    const char *doc = "rollout:\n  max_new_tokens: 5\n  model_path: other\n  kv_cache: int9\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", doc, strlen(doc), &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(s.max_new, 1024);
    cr_assert_str_eq(s.model, "m0");
    cr_assert_eq(s.kv, KV_INT4);
    qrl_config_destroy(cfg);
}

Test(config_bind, apply_writes_fields_of_immutable_keys_too) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    qrl_error err;
    cr_assert_eq(qrl_config_apply(cfg, "device", "cuda", "--device", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "seed", "5", "--seed", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.stream", "on", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.max_new_tokens", "3", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.temperature", "2.5", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.top_p", "1", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.model_path", "", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.kv_cache", "bf16", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "kafka.brokers", "", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_apply(cfg, "rollout.kv_name", "int8", "env", &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(s.kv_name, "int8");
    cr_assert_eq(s.device, 1);
    cr_assert_eq(s.seed, 5);
    cr_assert_eq(s.stream, true);
    cr_assert_eq(s.max_new, 3);
    cr_assert_eq(s.temperature, 2.5);
    cr_assert_eq(s.top_p, 1.0f);
    cr_assert_str_eq(s.model, "");
    cr_assert_eq(s.kv, KV_BF16);
    cr_assert_eq(s.brokers.n, 0);
    qrl_config_destroy(cfg);
}

Test(config_bind, runtime_set_writes_fields) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    qrl_error err;
    cr_assert_eq(qrl_config_set(cfg, "rollout.stream", "true", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_tokens", "65536", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.temperature", "0", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.top_p", "0.75", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.model_path", "m1", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.kv_cache", "int8", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "kafka.brokers", "q:9", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "rollout.kv_name", "int8", &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(s.kv_name, "int8");
    cr_assert_eq(s.stream, true);
    cr_assert_eq(s.max_new, 65536);
    cr_assert_eq(s.temperature, 0.0);
    cr_assert_eq(s.top_p, 0.75f);
    cr_assert_str_eq(s.model, "m1");
    cr_assert_eq(s.kv, KV_INT8);
    cr_assert_eq(qrl_config_get_enum(cfg, "rollout.kv_cache"), (int)s.kv);
    cr_assert_eq(s.brokers.n, 1);
    cr_assert_str_eq(s.brokers.items[0], "q:9");
    qrl_config_destroy(cfg);
}

Test(config_bind, refused_set_leaves_fields) {
    settings s;
    qrl_config_t *cfg = bound(&s);
    qrl_error err;
    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_tokens", "65537", &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_tokens", "12x", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(s.max_new, 1024);
    cr_assert_eq(qrl_config_set(cfg, "rollout.temperature", "101", &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(s.temperature, 1.0);
    cr_assert_eq(qrl_config_set(cfg, "rollout.top_p", "nan", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(s.top_p, 0.5f);
    cr_assert_eq(qrl_config_set(cfg, "rollout.kv_cache", "int9", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(s.kv, KV_INT4);
    cr_assert_eq(qrl_config_set(cfg, "rollout.kv_name", "int9", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(s.kv_name, "bf16");
    cr_assert_eq(qrl_config_set(cfg, "rollout.stream", "maybe", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(s.stream, false);
    /* not runtime-mutable: refused by set, the field keeps its value */
    cr_assert_eq(qrl_config_set(cfg, "device", "cuda", &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(s.device, 0);
    cr_assert_eq(qrl_config_set(cfg, "seed", "1", &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(s.seed, 1234);
    cr_assert_eq(qrl_config_apply(cfg, "seed", "-1", "env", &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(s.seed, 1234);
    cr_assert_str_eq(s.model, "m0");
    cr_assert_eq(s.brokers.n, 2);
    qrl_config_destroy(cfg);
}

Test(config_bind, parse_args_then_bind) {
    char *argv[] = {"prog", "--rollout.kv-cache=bf16", "--rollout.max-new-tokens", "8", NULL};
    qrl_config_t *cfg;
    qrl_config_action act;
    int npos;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, 4, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    settings s = {0};
    qrl_config_bind(cfg, &s);
    cr_assert_eq(s.kv, KV_BF16);
    cr_assert_eq(s.max_new, 8);
    qrl_config_bind(cfg, NULL); /* unbound: later sets write nothing */
    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_tokens", "9", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(s.max_new, 8);
    qrl_config_destroy(cfg);
}

Test(config_bind, table_checks_field_kinds) {
    qrl_config_t *cfg = NULL;
    qrl_error err;
    /* an int field needs a range inside int's */
    const qrl_config_entry unbounded[] = {QRL_CFG_INT("x", settings, max_new, "1", 0, 0, false, "x")};
    cr_assert_eq(qrl_config_new(unbounded, 1, &cfg, &err), QRL_STATUS_INTERNAL);
    cr_assert(strstr(err.msg, "x: an int field needs a range") != NULL, "%s", err.msg);
    const qrl_config_entry wide[] = {QRL_CFG_INT("x", settings, max_new, "1", 0, 1e10, false, "x")};
    cr_assert_eq(qrl_config_new(wide, 1, &cfg, &err), QRL_STATUS_INTERNAL);
    /* a hand-made row pairing a kind with the wrong type */
    qrl_config_entry wrong = QRL_CFG_BOOL("x", settings, stream, "false", false, "x");
    wrong.type = QRL_CONFIG_TYPE_INT;
    cr_assert_eq(qrl_config_new(&wrong, 1, &cfg, &err), QRL_STATUS_INTERNAL);
    cr_assert(strstr(err.msg, "field kind does not match") != NULL, "%s", err.msg);
    cr_assert_null(cfg);
}
