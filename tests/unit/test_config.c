#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"

#define FIX "tests/fixtures/config/"

static const qrl_config_entry table[] = {
    {"rollout.kv_cache", QRL_CONFIG_TYPE_ENUM, "int4-protected", 0, 0, "bf16|int8|int4|int4-protected",
     false, "KV cache format of the rollout decoder"},
    {"rollout.max_new_tokens", QRL_CONFIG_TYPE_INT, "1024", 1, 65536, NULL, true,
     "Most tokens generated per sample"},
    {"rollout.temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 100, NULL, true, "Sampling temperature"},
    {"rollout.stream", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, true, "Stream partial samples"},
    {"rollout.model_path", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false, "Model directory"},
    {"kafka.brokers", QRL_CONFIG_TYPE_LIST, "localhost:9092", 0, 0, NULL, false, "Bootstrap brokers"},
    {"learner.ppo.clip_low", QRL_CONFIG_TYPE_DOUBLE, "0.2", 0, 1, NULL, true, "PPO lower clip | epsilon"},
    {"learner.seed", QRL_CONFIG_TYPE_INT, "1234", 0, 0, NULL, false, "Random seed"},
};
#define N (sizeof table / sizeof table[0])

static qrl_config_t *fresh(void) {
    qrl_config_t *cfg = NULL;
    qrl_error err;
    cr_assert_eq(qrl_config_new(table, N, &cfg, &err), QRL_OK, "%s", err.msg);
    return cfg;
}

#define assert_msg_has(err, text) \
    cr_assert(strstr((err).msg, (text)) != NULL, "message '%s' lacks '%s'", (err).msg, (text))

Test(config, defaults) {
    qrl_config_t *cfg = fresh();
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.kv_cache"), "int4-protected");
    cr_assert_eq(qrl_config_get_enum(cfg, "rollout.kv_cache"), 3);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 1024);
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 1.0);
    cr_assert_eq(qrl_config_get_bool(cfg, "rollout.stream"), false);
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.model_path"), "");
    size_t n;
    const char *const *b = qrl_config_get_list(cfg, "kafka.brokers", &n);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(b[0], "localhost:9092");
    cr_assert_eq(qrl_config_get_double(cfg, "learner.ppo.clip_low"), 0.2);
    cr_assert_eq(qrl_config_get_int(cfg, "learner.seed"), 1234);
    cr_assert_str_eq(qrl_config_origin(cfg, "learner.seed"), "default");
    cr_assert_null(qrl_config_origin(cfg, "no.such"));
    qrl_config_destroy(cfg);
}

Test(config, yaml_load_nested_flat_and_lists) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_load_file(cfg, FIX "good.yaml", &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.kv_cache"), "int8");
    cr_assert_eq(qrl_config_get_enum(cfg, "rollout.kv_cache"), 1);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 512);
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 0.7);
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.model_path"), "/models/qwen 0.5b");
    size_t n;
    const char *const *b = qrl_config_get_list(cfg, "kafka.brokers", &n);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(b[0], "broker-a:9092");
    cr_assert_str_eq(b[1], "broker-b:9092");
    cr_assert_eq(qrl_config_get_double(cfg, "learner.ppo.clip_low"), 0.1); /* three levels, flow style */
    cr_assert_eq(qrl_config_get_int(cfg, "learner.seed"), 7);               /* flat dotted key */
    cr_assert_eq(qrl_config_get_bool(cfg, "rollout.stream"), false);         /* not in the file */
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.max_new_tokens"), FIX "good.yaml:4");
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.stream"), "default");
    qrl_config_destroy(cfg);
}

Test(config, empty_file_and_empty_section_are_valid) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_load_file(cfg, FIX "empty.yaml", &err), QRL_OK, "%s", err.msg);
    const char *doc = "rollout:\n  # kv_cache: int8\nkafka: {}\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", doc, strlen(doc), &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", "", 0, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 1024);
    qrl_config_destroy(cfg);
}

Test(config, list_from_scalar_text_and_empty_list) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    const char *doc = "kafka:\n  brokers: a:1, b:2 ,c:3\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", doc, strlen(doc), &err), QRL_OK, "%s", err.msg);
    size_t n;
    const char *const *b = qrl_config_get_list(cfg, "kafka.brokers", &n);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(b[0], "a:1");
    cr_assert_str_eq(b[1], "b:2");
    cr_assert_str_eq(b[2], "c:3");
    doc = "kafka: {brokers: []}\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "mem", doc, strlen(doc), &err), QRL_OK, "%s", err.msg);
    qrl_config_get_list(cfg, "kafka.brokers", &n);
    cr_assert_eq(n, 0);
    qrl_config_destroy(cfg);
}

/* ---- file errors: status, file:line:column, key, and nothing applied ------------------- */

static void expect_file_error(const char *file, qrl_status want, const char *where, const char *text) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    qrl_error_clear(&err);
    cr_assert_eq(qrl_config_load_file(cfg, file, &err), want, "%s: got %s: %s", file,
                 qrl_status_name(err.status), err.msg);
    cr_assert_eq(err.status, want);
    cr_assert(strncmp(err.msg, where, strlen(where)) == 0, "message '%s' does not start with '%s'", err.msg, where);
    assert_msg_has(err, text);
    /* all or nothing: the valid lines before the bad one changed nothing */
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 1024);
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 1.0);
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.max_new_tokens"), "default");
    qrl_config_destroy(cfg);
}

Test(config, error_unknown_key_suggests_closest) {
    expect_file_error(FIX "unknown_key.yaml", QRL_STATUS_NOT_FOUND, FIX "unknown_key.yaml:3:3: ",
                      "unknown key rollout.kv_cahce (did you mean rollout.kv_cache?)");
}

Test(config, error_wrong_type) {
    expect_file_error(FIX "wrong_type.yaml", QRL_STATUS_INVALID_ARGUMENT, FIX "wrong_type.yaml:3:19: ",
                      "rollout.max_new_tokens: expected an integer, got 'abc'");
}

Test(config, error_out_of_range) {
    expect_file_error(FIX "out_of_range.yaml", QRL_STATUS_OUT_OF_RANGE, FIX "out_of_range.yaml:3:16: ",
                      "rollout.temperature = -1 is outside [0, 100]");
}

Test(config, error_bad_enum_lists_allowed) {
    expect_file_error(FIX "bad_enum.yaml", QRL_STATUS_INVALID_ARGUMENT, FIX "bad_enum.yaml:2:13: ",
                      "rollout.kv_cache: 'fp32' is not one of the allowed values: bf16, int8, int4, int4-protected");
}

Test(config, error_malformed_yaml_line_column) {
    expect_file_error(FIX "malformed.yaml", QRL_STATUS_PARSE, FIX "malformed.yaml:3:2: ", "malformed YAML: ");
}

Test(config, error_duplicate_key) {
    expect_file_error(FIX "duplicate.yaml", QRL_STATUS_PARSE, FIX "duplicate.yaml:6:3: ",
                      "duplicate key rollout.max_new_tokens (first given at line 2)");
}

Test(config, error_missing_or_unreadable_file) {
    expect_file_error(FIX "no_such.yaml", QRL_STATUS_NOT_FOUND, FIX "no_such.yaml: ", "cannot open");
    expect_file_error("tests/fixtures/config", QRL_STATUS_IO, "tests/fixtures/config: ",
                      "cannot read config file: Is a directory");
}

static void expect_buffer_error(const char *doc, qrl_status want, const char *text) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_load_buffer(cfg, "doc.yaml", doc, strlen(doc), &err), want, "%s -> %s: %s", doc,
                 qrl_status_name(err.status), err.msg);
    cr_assert(strncmp(err.msg, "doc.yaml:", 9) == 0, "%s", err.msg);
    assert_msg_has(err, text);
    qrl_config_destroy(cfg);
}

Test(config, error_structure) {
    expect_buffer_error("- a\n- b\n", QRL_STATUS_PARSE, "doc.yaml:1:1: the top level must be a mapping");
    expect_buffer_error("rollout: 5\n", QRL_STATUS_INVALID_ARGUMENT, "doc.yaml:1:1: rollout is a section");
    expect_buffer_error("rollout: {max_new_tokens: {a: 1}}\n", QRL_STATUS_INVALID_ARGUMENT,
                        "rollout.max_new_tokens: expected an integer, got a mapping");
    expect_buffer_error("rollout: {temperature: [1]}\n", QRL_STATUS_INVALID_ARGUMENT,
                        "rollout.temperature: expected a number, got a sequence");
    expect_buffer_error("kafka: {brokers: [[a]]}\n", QRL_STATUS_INVALID_ARGUMENT, "kafka.brokers: list items must be strings");
    expect_buffer_error("rollout: &r {stream: true}\nkafka: *r\n", QRL_STATUS_PARSE, "doc.yaml:2:8: kafka: YAML aliases");
    expect_buffer_error("rollout: {seed: 1}\n", QRL_STATUS_NOT_FOUND, "doc.yaml:1:11: unknown key rollout.seed (did you mean learner.seed?)");
    expect_buffer_error("kv_cache: int8\n", QRL_STATUS_NOT_FOUND, "unknown key kv_cache (did you mean rollout.kv_cache?)");
    expect_buffer_error("zzz: {}\n", QRL_STATUS_NOT_FOUND, "doc.yaml:1:1: unknown key zzz");
    expect_buffer_error("rollout:\n  max_new_tokens:\n", QRL_STATUS_INVALID_ARGUMENT, "doc.yaml:2:18: rollout.max_new_tokens: missing value");
    expect_buffer_error("rollout: {model_path: ~}\n", QRL_STATUS_INVALID_ARGUMENT, "missing value (write '' for an empty one)");
    expect_buffer_error("rollout: {model_path: \"a\\0b\"}\n", QRL_STATUS_INVALID_ARGUMENT, "contains a NUL byte");
    expect_buffer_error("rollout: {seed: 1}\n---\nx: 1\n", QRL_STATUS_NOT_FOUND, "unknown key");
    expect_buffer_error("learner: {seed: 1}\n---\nlearner: {seed: 2}\n", QRL_STATUS_PARSE, "doc.yaml:2:1: several YAML documents");
    expect_buffer_error("rollout:\n\tstream: true\n", QRL_STATUS_PARSE, "doc.yaml:2:1: malformed YAML");
    expect_buffer_error("rollout: {stream: maybe}\n", QRL_STATUS_INVALID_ARGUMENT, "rollout.stream: expected true or false, got 'maybe'");
    expect_buffer_error("learner.seed: 9223372036854775808\n", QRL_STATUS_OUT_OF_RANGE, "outside the 64-bit integer range");
    expect_buffer_error("rollout.temperature: .inf\n", QRL_STATUS_INVALID_ARGUMENT, "expected a number, got '.inf'");
    expect_buffer_error("rollout.temperature: 1e999\n", QRL_STATUS_INVALID_ARGUMENT, "expected a finite number");
    expect_buffer_error("rollout.max_new_tokens: 1.5\n", QRL_STATUS_INVALID_ARGUMENT, "expected an integer, got '1.5'");
    expect_buffer_error("rollout.max_new_tokens: 0\n", QRL_STATUS_OUT_OF_RANGE, "rollout.max_new_tokens = 0 is outside [1, 65536]");
    expect_buffer_error("a:\n b:\n  c:\n   d:\n    e:\n     f:\n      g:\n       h:\n        i: 1\n", QRL_STATUS_PARSE,
                        "nested deeper than 8");
}

/* ---- command line ---------------------------------------------------------------------- */

Test(config, precedence_cli_over_yaml_over_default) {
    char *argv[] = {"prog", "--rollout.temperature=0.25", "input.jsonl", "--learner.seed", "99",
                    "--config", FIX "good.yaml", "--rollout.stream", "out", "--", "--not-an-option", NULL};
    int argc = 11, npos = -1;
    qrl_config_t *cfg = NULL;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, argc, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_RUN);
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 0.25); /* CLI over YAML (0.7) */
    cr_assert_eq(qrl_config_get_int(cfg, "learner.seed"), 99);             /* CLI over YAML (7), "--k v" */
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 512);  /* YAML over default */
    cr_assert_eq(qrl_config_get_bool(cfg, "rollout.stream"), true);        /* bare bool flag */
    cr_assert_eq(qrl_config_get_double(cfg, "learner.ppo.clip_low"), 0.1);
    cr_assert_str_eq(qrl_config_origin(cfg, "learner.seed"), "--learner.seed");
    cr_assert_eq(npos, 3);
    cr_assert_str_eq(argv[1], "input.jsonl");
    cr_assert_str_eq(argv[2], "out");
    cr_assert_str_eq(argv[3], "--not-an-option");
    qrl_config_destroy(cfg);
}

Test(config, cli_last_override_wins_and_bool_forms) {
    char *argv[] = {"prog", "--rollout.max_new_tokens=10", "--rollout.max_new_tokens", "20",
                    "--rollout.stream", "off", "--kafka.brokers=x:1,y:2", NULL};
    int npos;
    qrl_config_t *cfg;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, 7, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 20);
    cr_assert_eq(qrl_config_get_bool(cfg, "rollout.stream"), false);
    size_t n;
    cr_assert_str_eq(qrl_config_get_list(cfg, "kafka.brokers", &n)[1], "y:2");
    cr_assert_eq(n, 2);
    cr_assert_eq(npos, 0);
    qrl_config_destroy(cfg);
}

Test(config, cli_dashes_read_as_underscores) {
    char *argv[] = {"prog", "--rollout.max-new-tokens=33", "--rollout.kv-cache", "int4", NULL};
    int npos;
    qrl_config_t *cfg;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, 4, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 33);
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.kv_cache"), "int4");
    qrl_config_destroy(cfg);
}

static void expect_args_error(int argc, char **argv, qrl_status want, const char *text) {
    int npos;
    qrl_config_t *cfg = (qrl_config_t *)1;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, argc, argv, &cfg, &act, &npos, &err), want, "%s: %s",
                 qrl_status_name(err.status), err.msg);
    cr_assert_null(cfg);
    assert_msg_has(err, text);
}

Test(config, cli_errors) {
    char *a1[] = {"p", "--rollout.temprature=1", NULL};
    expect_args_error(2, a1, QRL_STATUS_NOT_FOUND,
                      "--rollout.temprature=1: unknown key rollout.temprature (did you mean rollout.temperature?)");
    char *a2[] = {"p", "--rollout.max_new_tokens=abc", NULL};
    expect_args_error(2, a2, QRL_STATUS_INVALID_ARGUMENT,
                      "--rollout.max_new_tokens=abc: rollout.max_new_tokens: expected an integer, got 'abc'");
    char *a3[] = {"p", "--learner.ppo.clip_low", "2", NULL};
    expect_args_error(3, a3, QRL_STATUS_OUT_OF_RANGE,
                      "--learner.ppo.clip_low 2: learner.ppo.clip_low = 2 is outside [0, 1]");
    char *a4[] = {"p", "--rollout.kv_cache", NULL};
    expect_args_error(2, a4, QRL_STATUS_INVALID_ARGUMENT, "--rollout.kv_cache needs a value");
    char *a5[] = {"p", "--rollout.kv_cache", "--rollout.stream", NULL};
    expect_args_error(3, a5, QRL_STATUS_INVALID_ARGUMENT, "--rollout.kv_cache needs a value");
    char *a6[] = {"p", "-x", NULL};
    expect_args_error(2, a6, QRL_STATUS_INVALID_ARGUMENT, "unknown option -x");
    char *a7[] = {"p", "--config", FIX "bad_enum.yaml", NULL};
    expect_args_error(3, a7, QRL_STATUS_INVALID_ARGUMENT, FIX "bad_enum.yaml:2:13: rollout.kv_cache");
    char *a8[] = {"p", "--config", NULL};
    expect_args_error(2, a8, QRL_STATUS_INVALID_ARGUMENT, "--config needs a file name");
    char *a9[] = {"p", "--rollout.nope", "3", NULL}; /* unknown key in the "--key value" form */
    expect_args_error(3, a9, QRL_STATUS_NOT_FOUND, "--rollout.nope 3: unknown key rollout.nope");
    /* an unknown flag without a value is an unknown key, not a key missing its value */
    char *a10[] = {"p", "--version", NULL};
    expect_args_error(2, a10, QRL_STATUS_NOT_FOUND, "--version: unknown key version");
    char *a11[] = {"p", "--foo", "--rollout.kv_cache=int4", NULL};
    expect_args_error(3, a11, QRL_STATUS_NOT_FOUND, "--foo: unknown key foo");
    char *a12[] = {"p", "--rollout.temprature", NULL};
    expect_args_error(2, a12, QRL_STATUS_NOT_FOUND,
                      "--rollout.temprature: unknown key rollout.temprature (did you mean rollout.temperature?)");
}

Test(config, cli_print_config) {
    char *argv[] = {"p", "--print-config", "--rollout.max_new_tokens=33", NULL};
    int npos;
    qrl_config_t *cfg = NULL;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, 3, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_PRINT_CONFIG);
    cr_assert_not_null(cfg);
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 33);
    qrl_config_destroy(cfg);
    char *bad[] = {"p", "--print-config", "--rollout.max_new_tokens=abc", NULL}; /* errors as for a run */
    expect_args_error(3, bad, QRL_STATUS_INVALID_ARGUMENT, "expected an integer");
    char *help[] = {"p", "--print-config", "--help", NULL}; /* help wins */
    cfg = (qrl_config_t *)1;
    cr_assert_eq(qrl_config_parse_args(table, N, 3, help, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_HELP);
    cr_assert_null(cfg);
}

Test(config, cli_help_reads_no_file) {
    char *argv[] = {"p", "--config", FIX "no_such.yaml", "--help", NULL};
    int npos;
    qrl_config_t *cfg = (qrl_config_t *)1;
    qrl_config_action act;
    qrl_error err;
    cr_assert_eq(qrl_config_parse_args(table, N, 4, argv, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_HELP);
    cr_assert_null(cfg);
    char *argv2[] = {"p", "--help-markdown", NULL};
    cr_assert_eq(qrl_config_parse_args(table, N, 2, argv2, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_HELP_MARKDOWN);
    char *argv3[] = {"p", NULL}; /* no file, no override: the defaults */
    cr_assert_eq(qrl_config_parse_args(table, N, 1, argv3, &cfg, &act, &npos, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(act, QRL_CONFIG_ACTION_RUN);
    cr_assert_eq(qrl_config_get_int(cfg, "learner.seed"), 1234);
    qrl_config_destroy(cfg);
}

/* ---- set (qrlctl set) ------------------------------------------------------------------ */

Test(config, set_mutable_refuses_immutable_and_bad_values) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_set(cfg, "rollout.temperature", "0.5", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 0.5);
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.temperature"), "set");

    cr_assert_eq(qrl_config_set(cfg, "rollout.kv_cache", "int8", &err), QRL_STATUS_UNSUPPORTED);
    assert_msg_has(err, "rollout.kv_cache cannot be changed at run time");
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.kv_cache"), "int4-protected");

    cr_assert_eq(qrl_config_set(cfg, "rollout.temperature", "101", &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(err.msg, "rollout.temperature = 101 is outside [0, 100]");
    cr_assert_eq(qrl_config_get_double(cfg, "rollout.temperature"), 0.5);

    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_tokens", "12x", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "rollout.max_new_tokens: expected an integer, got '12x'");
    cr_assert_eq(qrl_config_get_int(cfg, "rollout.max_new_tokens"), 1024);

    cr_assert_eq(qrl_config_set(cfg, "rollout.max_new_token", "5", &err), QRL_STATUS_NOT_FOUND);
    assert_msg_has(err, "did you mean rollout.max_new_tokens?");

    cr_assert_eq(qrl_config_set(cfg, "rollout.stream", "yes", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_bool(cfg, "rollout.stream"), true);
    qrl_config_destroy(cfg);
}

/* ---- help, markdown, write ------------------------------------------------------------- */

static char *capture(void (*fn)(const qrl_config_entry *, size_t, const char *, FILE *)) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fn(table, N, "qrl-test", f);
    fclose(f);
    return text;
}

Test(config, help_lists_every_key) {
    char *text = capture(qrl_config_help);
    for (size_t i = 0; i < N; i++) {
        char want[256];
        snprintf(want, sizeof want, "--%s=", table[i].name);
        cr_assert(strstr(text, want), "help lacks %s:\n%s", want, text);
        cr_assert(strstr(text, table[i].doc), "help lacks doc of %s", table[i].name);
    }
    cr_assert(strstr(text, "--rollout.temperature=<float>  default: 1.0  range: [0, 100]  (runtime)"), "%s", text);
    cr_assert(strstr(text, "one of: bf16|int8|int4|int4-protected\n"), "%s", text);
    free(text);
}

Test(config, markdown_has_a_row_per_key) {
    char *text = capture(qrl_config_help_markdown);
    cr_assert(strncmp(text, "# qrl-test configuration\n", 25) == 0, "%s", text);
    for (size_t i = 0; i < N; i++) {
        char want[256];
        snprintf(want, sizeof want, "| `%s` | ", table[i].name);
        cr_assert(strstr(text, want), "markdown lacks %s:\n%s", want, text);
    }
    cr_assert(strstr(text, "| `rollout.max_new_tokens` | int | `1024` | [1, 65536] | yes | Most tokens generated per sample |"), "%s", text);
    cr_assert(strstr(text, "`bf16`, `int8`, `int4`, `int4-protected` | no |"), "%s", text);
    cr_assert(strstr(text, "PPO lower clip \\| epsilon"), "doc '|' not escaped:\n%s", text); /* keeps the table */
    free(text);
}

Test(config, write_reads_back_to_the_same_values) {
    qrl_config_t *cfg = fresh(), *again = fresh();
    qrl_error err;
    const char *doc = "rollout:\n  model_path: \"tab\\there \\\"q\\\" caf\\u00e9 \\u2028 null\"\n"
                      "  temperature: 0.1\nkafka: {brokers: [\"a, b\", '', null, plain]}\nlearner.seed: -5\n";
    cr_assert_eq(qrl_config_load_buffer(cfg, "in.yaml", doc, strlen(doc), &err), QRL_OK, "%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    qrl_config_write(cfg, f);
    fclose(f);
    cr_assert(strstr(text, "learner.seed: -5  # in.yaml:5\n"), "%s", text);
    cr_assert(strstr(text, "rollout.temperature: 0.1  # in.yaml:3\n"), "%s", text);
    cr_assert_eq(qrl_config_load_buffer(again, "out.yaml", text, len, &err), QRL_OK, "%s\n%s", err.msg, text);
    cr_assert_str_eq(qrl_config_get_string(again, "rollout.model_path"), "tab\there \"q\" caf\xc3\xa9 \xe2\x80\xa8 null");
    cr_assert_eq(qrl_config_get_double(again, "rollout.temperature"), 0.1);
    size_t n;
    const char *const *b = qrl_config_get_list(again, "kafka.brokers", &n);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(b[0], "a, b");
    cr_assert_str_eq(b[1], "");
    cr_assert_str_eq(b[2], "null");
    cr_assert_str_eq(b[3], "plain");
    char buf[64];
    cr_assert(qrl_config_value_text(again, "kafka.brokers", buf, sizeof buf));
    cr_assert_str_eq(buf, "a, b,,null,plain");
    cr_assert_not(qrl_config_value_text(again, "kafka.nope", buf, sizeof buf));
    free(text);
    qrl_config_destroy(again);
    qrl_config_destroy(cfg);
}

/* ---- table validation and programming errors ------------------------------------------- */

static void expect_table_error(const qrl_config_entry *t, size_t n, const char *text) {
    qrl_config_t *cfg = (qrl_config_t *)1;
    qrl_error err;
    cr_assert_eq(qrl_config_new(t, n, &cfg, &err), QRL_STATUS_INTERNAL, "%s", err.msg);
    cr_assert_null(cfg);
    assert_msg_has(err, text);
}

Test(config, table_validation) {
    const qrl_config_entry bad_default[] = {{"a.n", QRL_CONFIG_TYPE_INT, "ten", 0, 0, NULL, false, ""}};
    expect_table_error(bad_default, 1, "config table: bad default: a.n: expected an integer, got 'ten'");
    const qrl_config_entry default_out[] = {{"a.n", QRL_CONFIG_TYPE_INT, "0", 1, 5, NULL, false, ""}};
    expect_table_error(default_out, 1, "a.n = 0 is outside [1, 5]");
    const qrl_config_entry twice[] = {{"a.n", QRL_CONFIG_TYPE_INT, "0", 0, 0, NULL, false, ""},
                                      {"a.n", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false, ""}};
    expect_table_error(twice, 2, "a.n appears twice");
    const qrl_config_entry both[] = {{"a.n", QRL_CONFIG_TYPE_INT, "0", 0, 0, NULL, false, ""},
                                     {"a.n.m", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false, ""}};
    expect_table_error(both, 2, "a.n is both a key and a section");
    const qrl_config_entry no_choices[] = {{"a.e", QRL_CONFIG_TYPE_ENUM, "x", 0, 0, NULL, false, ""}};
    expect_table_error(no_choices, 1, "a.e: enum needs choices");
    const qrl_config_entry bad_name[] = {{"A.b-c", QRL_CONFIG_TYPE_INT, "0", 0, 0, NULL, false, ""}};
    expect_table_error(bad_name, 1, "bad name 'A.b-c'");
    const qrl_config_entry min_max[] = {{"a.d", QRL_CONFIG_TYPE_DOUBLE, "0", 1, -1, NULL, false, ""}};
    expect_table_error(min_max, 1, "a.d: min > max");
    const qrl_config_entry half_open[] = {{"a.d", QRL_CONFIG_TYPE_DOUBLE, "1e300", 0, INFINITY, NULL, false, ""}};
    qrl_config_t *cfg;
    qrl_error err;
    cr_assert_eq(qrl_config_new(half_open, 1, &cfg, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_set(cfg, "a.d", "5", &err), QRL_STATUS_UNSUPPORTED);
    qrl_config_destroy(cfg);
}

Test(config, get_unknown_key_aborts, .signal = SIGABRT) {
    qrl_config_t *cfg = fresh();
    qrl_config_get_int(cfg, "rollout.nope");
}

Test(config, get_wrong_type_aborts, .signal = SIGABRT) {
    qrl_config_t *cfg = fresh();
    qrl_config_get_int(cfg, "rollout.temperature");
}

Test(config, apply_sets_immutable_keys_with_origin) {
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_apply(cfg, "rollout.kv_cache", "bf16", "env QRL_KV", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_config_get_enum(cfg, "rollout.kv_cache"), 0);
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.kv_cache"), "env QRL_KV");
    cr_assert_eq(qrl_config_apply(cfg, "rollout.kv_cache", "int3", "x", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(qrl_config_get_string(cfg, "rollout.kv_cache"), "bf16");
    cr_assert_str_eq(qrl_config_origin(cfg, "rollout.kv_cache"), "env QRL_KV");
    qrl_config_destroy(cfg);
}

Test(config, log_prints_one_line_per_key, .init = cr_redirect_stderr) {
    qrl_log_set_level(QRL_LOG_LEVEL_INFO); /* whatever QRL_LOG_LEVEL the caller set */
    qrl_config_t *cfg = fresh();
    qrl_error err;
    cr_assert_eq(qrl_config_set(cfg, "rollout.temperature", "0.5", &err), QRL_OK, "%s", err.msg);
    qrl_config_log(cfg, "test");
    fflush(stderr);
    qrl_config_destroy(cfg);
    FILE *f = cr_get_redirected_stderr();
    char line[512];
    size_t lines = 0;
    bool saw_kv = false, saw_temp = false;
    while (fgets(line, sizeof line, f)) {
        lines += strstr(line, "[test] config ") != NULL;
        saw_kv |= strstr(line, "config rollout.kv_cache=int4-protected origin=default") != NULL;
        saw_temp |= strstr(line, "config rollout.temperature=0.5 origin=set") != NULL;
    }
    cr_assert_eq(lines, N);
    cr_assert(saw_kv && saw_temp);
}
