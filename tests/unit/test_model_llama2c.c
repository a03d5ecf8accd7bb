/* llama2.c checkpoints: the real stories260K model reproduces run.c's greedy output token
 * for token; malformed files are rejected with a clear message. */
#include <criterion/criterion.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "unit/model_test_util.h"

static qrl_kv_cache *new_cache(const qrl_model *m, int max_seq_len) {
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16,
                           .n_blocks = (max_seq_len + 15) / 16 + 1, .max_seqs = 2,
                           .max_seq_len = max_seq_len, .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    return kv;
}

Test(model_llama2c, stories260k_greedy_matches_run_c) {
    char bin[512], ref[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin) ||
        !qrl_test_data_path("llama2c_stories260K/greedy_reference.json", ref, sizeof ref))
        cr_skip_test("stories260K data not found at %s", bin);
    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->cfg.dim, 64);
    cr_assert_eq(m->cfg.n_layers, 5);
    cr_assert_eq(m->cfg.n_kv_heads, 4);
    cr_assert_eq(m->cfg.vocab_size, 512);
    cr_assert(m->cfg.tie_embeddings);
    cr_assert_eq(m->cfg.rope.layout, QRL_ROPE_LAYOUT_INTERLEAVED);
    cr_assert_eq(m->lm_head, m->tok_embedding);

    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    cr_assert_not_null(root);
    json_t *cases = json_object_get(root, "cases");
    cr_assert_eq(json_array_size(cases), 2);
    int V = m->cfg.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        json_t *jp = json_object_get(c, "prompt_token_ids");
        json_t *jg = json_object_get(c, "generated_token_ids");
        int steps = (int)json_integer_value(json_object_get(c, "steps"));
        int np = (int)json_array_size(jp);
        int32_t prompt[64];
        for (int i = 0; i < np; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(jp, i));
        cr_assert_eq(prompt[0], 1, "run.c starts at BOS = 1");

        qrl_kv_cache *kv = new_cache(m, m->cfg.max_seq_len);
        qrl_forward *f;
        cr_assert_eq(qrl_forward_new(m, 8, m->cfg.max_seq_len, &f, &err), QRL_OK, "%s", err.msg);
        int seq;
        cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
        /* run.c: forward positions 0..steps-1; prompt tokens forced, then argmax; the
         * prefill (chunks of 8 rows) stands in for the forced steps. */
        cr_assert_eq(qrl_forward_prefill(f, kv, seq, prompt, np, logits, false, &err), QRL_OK,
                     "%s", err.msg);
        int n_gen = steps - np + 1;
        cr_assert_eq((int)json_array_size(jg), n_gen);
        for (int t = 0; t < n_gen; t++) {
            int32_t next = qrl_cpu_argmax(logits, V);
            int want = (int)json_integer_value(json_array_get(jg, t));
            cr_assert_eq(next, want, "case %zu step %d: got %d, run.c %d", ci, t, next, want);
            if (t + 1 < n_gen)
                cr_assert_eq(qrl_forward_decode(f, kv, &seq, &next, 1, logits, &err), QRL_OK, "%s",
                             err.msg);
        }
        qrl_forward_free(f);
        qrl_kv_cache_free(kv);
    }
    free(logits);
    json_decref(root);
    qrl_model_free(m);
}

static void write_bin(const char *path, const int32_t hdr[7], size_t n_floats) {
    FILE *f = fopen(path, "wb");
    fwrite(hdr, 4, 7, f);
    float z = 0.01f;
    for (size_t i = 0; i < n_floats; i++) fwrite(&z, 4, 1, f);
    fclose(f);
}

Test(model_llama2c, file_size_must_match_header) {
    char dir[256], p[300];
    qrl_test_mkdtemp(dir);
    snprintf(p, sizeof p, "%s/m.bin", dir);
    /* dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 10 (tied), seq_len 4 */
    int32_t hdr[7] = {8, 16, 1, 2, 1, 10, 4};
    size_t D = 8, F = 16, KV = 4, V = 10, hs = 4;
    size_t n = V * D + (2 * D + D * D + 2 * D * KV + D * D + 3 * D * F) + D + 2 * 4 * hs / 2;
    write_bin(p, hdr, n);
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->cfg.head_dim, 4);
    qrl_model_free(m);

    write_bin(p, hdr, n - 1);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_CORRUPT);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, "too short") && strstr(err.msg, "m.bin"), "%s", err.msg);

    hdr[5] = -10; /* untied: the classifier must follow */
    write_bin(p, hdr, n);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_CORRUPT);
    write_bin(p, hdr, n + V * D);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_neq(m->lm_head, m->tok_embedding);
    qrl_model_free(m);

    int32_t bad[7] = {8, 16, 1, 3, 1, 10, 4}; /* 8 not divisible by 3 heads */
    write_bin(p, bad, n);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "n_heads"), "%s", err.msg);

    int32_t magic[7] = {0x616b3432, 1, 0, 0, 0, 0, 0};
    write_bin(p, magic, 4);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "ak42"), "%s", err.msg);

    FILE *f = fopen(p, "wb");
    fwrite(hdr, 4, 3, f);
    fclose(f);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "too short"), "%s", err.msg);

    snprintf(p, sizeof p, "%s/absent.bin", dir);
    cr_assert_eq(qrl_model_load(p, &m, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "absent.bin"), "%s", err.msg);
    qrl_test_rmtree(dir);
}
