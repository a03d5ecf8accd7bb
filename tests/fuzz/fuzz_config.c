/* libFuzzer target: bytes as a YAML config document for a fixed table of every type.
 * Any input must either load or fail with a message naming the origin; a document that
 * loads must survive qrl_config_write -> load again with the same values (round trip). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

static const qrl_config_entry table[] = {
    {"rollout.kv_cache", QRL_CONFIG_TYPE_ENUM, "int4-protected", 0, 0, "bf16|int8|int4|int4-protected", false, "KV cache"},
    {"rollout.max_new_tokens", QRL_CONFIG_TYPE_INT, "1024", 1, 1 << 20, NULL, true, "tokens"},
    {"rollout.temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 100, NULL, true, "temperature"},
    {"rollout.seed", QRL_CONFIG_TYPE_INT, "0", 0, 0, NULL, false, "seed (unbounded)"},
    {"rollout.stream", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, true, "stream"},
    {"kafka.brokers", QRL_CONFIG_TYPE_LIST, "localhost:9092", 0, 0, NULL, false, "brokers"},
    {"kafka.client_id", QRL_CONFIG_TYPE_STRING, "qrl", 0, 0, NULL, false, "client id"},
    {"learner.opt.lr", QRL_CONFIG_TYPE_DOUBLE, "1e-6", 0, INFINITY, NULL, true, "deep key"},
    {"log_level", QRL_CONFIG_TYPE_STRING, "info", 0, 0, NULL, false, "top-level key"},
};
#define N (sizeof table / sizeof table[0])

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_config: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qrl_config_t *cfg = NULL, *again = NULL;
    qrl_error err;
    if (qrl_config_new(table, N, &cfg, &err) != QRL_OK) fail("table", err.msg);
    if (qrl_config_load_buffer(cfg, "fuzz.yaml", data, size, &err) != QRL_OK) {
        if (strncmp(err.msg, "fuzz.yaml:", 10) != 0) fail("message does not name the origin", err.msg);
        qrl_config_destroy(cfg);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    qrl_config_write(cfg, f);
    fclose(f);
    if (qrl_config_new(table, N, &again, &err) != QRL_OK) fail("table", err.msg);
    if (qrl_config_load_buffer(again, "written", text, len, &err) != QRL_OK) fail(err.msg, text);
    for (size_t i = 0; i < N; i++) {
        const char *k = table[i].name;
        char a[4096], b[4096];
        qrl_config_value_text(cfg, k, a, sizeof a);
        qrl_config_value_text(again, k, b, sizeof b);
        if (strcmp(a, b) != 0) fail(k, text);
        if (table[i].type == QRL_CONFIG_TYPE_LIST) {
            size_t na, nb;
            const char *const *la = qrl_config_get_list(cfg, k, &na), *const *lb = qrl_config_get_list(again, k, &nb);
            if (na != nb) fail(k, text);
            for (size_t j = 0; j < na; j++)
                if (strcmp(la[j], lb[j]) != 0) fail(k, text);
        }
    }
    free(text);
    qrl_config_destroy(again);
    qrl_config_destroy(cfg);
    return 0;
}
