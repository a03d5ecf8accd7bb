#include <criterion/criterion.h>
#include <string.h>

#include "io/json_util.h"
#include "support/test_files.h"

static char dir[64];
static void setup(void) { qrl_test_mkdtemp(dir); }
static void teardown(void) { qrl_test_rmtree(dir); }
TestSuite(json_util, .init = setup, .fini = teardown);

static const char *config =
    "{\n"
    "  \"hidden_size\": 128,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_theta\": 10000,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"model_type\": \"llama\",\n"
    "  \"rope_scaling\": null,\n"
    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
    "  \"vocab_size\": \"2048\"\n"
    "}\n";

Test(json_util, typed_getters) {
    char path[512];
    qrl_test_write(dir, "config.json", config, strlen(config), path);
    json_t *root;
    qrl_error err;
    cr_assert_eq(qrl_json_load_file(path, &root, &err), QRL_OK, "%s", err.msg);
    int64_t i;
    double d;
    bool b;
    const char *s;
    json_t *o;
    cr_assert_eq(qrl_json_get_int(root, "config.json", "hidden_size", &i, &err), QRL_OK);
    cr_assert_eq(i, 128);
    cr_assert_eq(qrl_json_get_int_range(root, "config.json", "hidden_size", 1, 64, &i, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(err.msg, "config.json: field 'hidden_size' = 128 is outside [1, 64]");
    cr_assert_eq(qrl_json_get_number(root, "config.json", "rms_norm_eps", &d, &err), QRL_OK);
    cr_assert_eq(d, 1e-6);
    cr_assert_eq(qrl_json_get_number(root, "config.json", "rope_theta", &d, &err), QRL_OK);
    cr_assert_eq(d, 10000.0, "integers are numbers too");
    cr_assert_eq(qrl_json_get_bool(root, "config.json", "tie_word_embeddings", &b, &err), QRL_OK);
    cr_assert(b);
    cr_assert_eq(qrl_json_get_string(root, "config.json", "model_type", &s, &err), QRL_OK);
    cr_assert_str_eq(s, "llama");
    cr_assert_eq(qrl_json_get_array(root, "config.json", "architectures", &o, &err), QRL_OK);
    cr_assert_eq(json_array_size(o), 1);

    /* wrong types and missing fields name the file and the field */
    cr_assert_eq(qrl_json_get_int(root, "config.json", "vocab_size", &i, &err), QRL_STATUS_PARSE);
    cr_assert_str_eq(err.msg, "config.json: field 'vocab_size' must be an integer");
    cr_assert_eq(qrl_json_get_int(root, "config.json", "rms_norm_eps", &i, &err),
                 QRL_STATUS_PARSE);
    cr_assert_eq(qrl_json_get_bool(root, "config.json", "model_type", &b, &err), QRL_STATUS_PARSE);
    cr_assert_str_eq(err.msg, "config.json: field 'model_type' must be true or false");
    cr_assert_eq(qrl_json_get_int(root, "config.json", "num_layers", &i, &err),
                 QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "config.json: field 'num_layers' is missing");
    cr_assert_eq(qrl_json_get_object(root, "config.json", "rope_scaling", &o, &err),
                 QRL_STATUS_NOT_FOUND, "null counts as absent");
    cr_assert_eq(qrl_json_get_object(root, "config.json", "model_type", &o, &err),
                 QRL_STATUS_PARSE);

    /* optional fields */
    cr_assert_eq(qrl_json_opt_int(root, "config.json", "num_layers", 2, &i, &err), QRL_OK);
    cr_assert_eq(i, 2);
    cr_assert_eq(qrl_json_opt_int(root, "config.json", "hidden_size", 2, &i, &err), QRL_OK);
    cr_assert_eq(i, 128);
    cr_assert_eq(qrl_json_opt_object(root, "config.json", "rope_scaling", &o, &err), QRL_OK);
    cr_assert_null(o);
    cr_assert_eq(qrl_json_opt_string(root, "config.json", "chat", "plain", &s, &err), QRL_OK);
    cr_assert_str_eq(s, "plain");
    cr_assert_eq(qrl_json_opt_number(root, "config.json", "model_type", 1.0, &d, &err),
                 QRL_STATUS_PARSE);
    cr_assert_str_eq(err.msg, "config.json: field 'model_type' must be a number");
    cr_assert_eq(qrl_json_opt_bool(root, "config.json", "x", true, &b, &err), QRL_OK);
    cr_assert(b);
    cr_assert_eq(qrl_json_opt_array(root, "config.json", "hidden_size", &o, &err),
                 QRL_STATUS_PARSE);
    json_decref(root);
}

Test(json_util, load_errors_name_file_line_column) {
    char path[512];
    const char *bad = "{\n  \"a\": 1,\n  \"b\": tru\n}\n";
    qrl_test_write(dir, "bad.json", bad, strlen(bad), path);
    json_t *root;
    qrl_error err;
    cr_assert_eq(qrl_json_load_file(path, &root, &err), QRL_STATUS_PARSE);
    char want[600];
    snprintf(want, sizeof want, "%s:3:", path);
    cr_assert_not_null(strstr(err.msg, want), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "invalid JSON"), "%s", err.msg);

    const char *dup = "{\"a\": 1, \"a\": 2}";
    qrl_test_write(dir, "dup.json", dup, strlen(dup), path);
    cr_assert_eq(qrl_json_load_file(path, &root, &err), QRL_STATUS_PARSE);
    cr_assert_not_null(strstr(err.msg, "duplicate"), "%s", err.msg);

    snprintf(path, sizeof path, "%s/missing.json", dir);
    cr_assert_eq(qrl_json_load_file(path, &root, &err), QRL_STATUS_IO);
    cr_assert_not_null(strstr(err.msg, "missing.json: cannot open"), "%s", err.msg);

    cr_assert_eq(qrl_json_load_buffer("[1,", 3, "mem", &root, &err), QRL_STATUS_PARSE);
    cr_assert_not_null(strstr(err.msg, "mem:1:"), "%s", err.msg);
}

Test(json_util, reads_real_config) {
    char path[512];
    if (!qrl_test_data_path("tinystories_656k/config.json", path, sizeof path))
        cr_skip_test("no %s", path);
    json_t *root;
    qrl_error err;
    cr_assert_eq(qrl_json_load_file(path, &root, &err), QRL_OK, "%s", err.msg);
    int64_t i;
    cr_assert_eq(qrl_json_get_int(root, path, "num_key_value_heads", &i, &err), QRL_OK);
    cr_assert_eq(i, 4);
    double theta;
    cr_assert_eq(qrl_json_get_number(root, path, "rope_theta", &theta, &err), QRL_OK);
    cr_assert_eq(theta, 10000.0);
    json_decref(root);
}
