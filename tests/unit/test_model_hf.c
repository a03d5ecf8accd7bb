/* HuggingFace checkpoints: the real TinyStories-656K (BF16 and F32 files) against its
 * float64 reference, the HF transformers conformance fixtures (tests/fixtures/hf/<name>/,
 * made by tests/reference/make_hf_refs.py on a GPU machine), loader round trips, and
 * malformed folders. */
#include <criterion/criterion.h>
#include <dirent.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "unit/model_test_util.h"

/* Teacher-forced logits [n, vocab] for ids (one prefill, chunks of 16 rows). */
static float *teacher_forced(const qrl_model *m, const int32_t *ids, int n) {
    qrl_error err;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16,
                           .n_blocks = n / 16 + 2, .max_seqs = 1, .max_seq_len = n,
                           .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    qrl_forward *f;
    cr_assert_eq(qrl_forward_new(m, 16, n, &f, &err), QRL_OK, "%s", err.msg);
    int seq;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    float *logits = malloc((size_t)n * m->cfg.vocab_size * sizeof(float));
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, n, logits, true, &err), QRL_OK, "%s",
                 err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    return logits;
}

static int32_t *json_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return ids;
}

/* The float64 numpy reference (HF Llama semantics) of forward_reference.json.  Our F32
 * forward must agree to LAST_LOGITS_TOL absolute on the last position's logits (|logit|
 * up to ~13; measured max |diff| 3.1e-6 on x86-64) and on every argmax whose top1-top2
 * margin is at least ARGMAX_MARGIN (38 of the 40 positions). */
#define LAST_LOGITS_TOL 3e-5
#define ARGMAX_MARGIN 0.02

static void check_tinystories(const char *rel, float **logits_out) {
    char dir[512], ref[512];
    if (!qrl_test_data_path(rel, dir, sizeof dir) ||
        !qrl_test_data_path("tinystories_656k/forward_reference.json", ref, sizeof ref))
        cr_skip_test("TinyStories data not found at %s", dir);
    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load(dir, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert(m->cfg.tie_embeddings);
    cr_assert_eq(m->lm_head, m->tok_embedding);
    cr_assert_eq(m->cfg.rope.layout, QRL_ROPE_LAYOUT_HALF);
    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    cr_assert_not_null(root);
    int n;
    int32_t *ids = json_ids(json_object_get(root, "input_ids"), &n);
    cr_assert_eq(n, 40);
    int V = m->cfg.vocab_size;
    float *logits = teacher_forced(m, ids, n);

    json_t *last = json_object_get(root, "last_position_logits");
    cr_assert_eq((int)json_array_size(last), V);
    double md = 0;
    for (int i = 0; i < V; i++) {
        double d = fabs(logits[(size_t)(n - 1) * V + i] - json_number_value(json_array_get(last, i)));
        if (d > md) md = d;
    }
    fprintf(stderr, "tinystories %s: last-position logits max |diff| = %.3g (tol %.1g)\n", rel, md,
            LAST_LOGITS_TOL);
    cr_assert(md <= LAST_LOGITS_TOL, "%s: max |diff| %g", rel, md);

    json_t *am = json_object_get(root, "argmax_next_token"), *mg = json_object_get(root, "top1_top2_margin");
    int checked = 0;
    for (int t = 0; t < n; t++) {
        if (json_number_value(json_array_get(mg, t)) < ARGMAX_MARGIN) continue;
        int got = qrl_cpu_argmax(logits + (size_t)t * V, V);
        cr_assert_eq(got, json_integer_value(json_array_get(am, t)), "%s position %d", rel, t);
        checked++;
    }
    cr_assert_eq(checked, 38);
    free(ids);
    json_decref(root);
    qrl_model_free(m);
    *logits_out = logits;
}

Test(model_hf, tinystories_bf16_and_f32_match_reference) {
    float *a, *b;
    check_tinystories("tinystories_656k", &a);
    check_tinystories("tinystories_656k_f32", &b);
    /* Same weight values (the F32 file is an exact upcast): identical logits. */
    cr_assert_eq(memcmp(a, b, (size_t)40 * 2048 * sizeof(float)), 0);
    free(a);
    free(b);
}

/* ---- HF transformers conformance fixtures ------------------------------------------ */

/* max|diff| / max|ref| over all positions' logits.  Measured (x86-64, transformers 5.17):
 * 4.6e-7 .. 7.8e-7 for the five F32 fixtures, 5.3e-7 for qwen3_bf16.  The BF16 bound
 * equals the F32 one: the BF16 weights upcast exactly and both sides compute in F32. */
#define F32_REL_TOL 1e-4
#define BF16_REL_TOL 1e-4

static void check_fixture(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/reference.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    cr_assert_not_null(root, "%s: %s", p, je.text);
    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load(dir, &m, &err), QRL_OK, "%s: %s", name, err.msg);
    int V = m->cfg.vocab_size, n;
    int32_t *ids = json_ids(json_object_get(root, "input_ids"), &n);
    json_t *jl = json_object_get(root, "logits");
    cr_assert_eq((int)json_array_size(jl), n, "%s: logits rows", name);
    float *logits = teacher_forced(m, ids, n);
    float *ref = malloc((size_t)n * V * sizeof(float));
    for (int t = 0; t < n; t++) {
        json_t *row = json_array_get(jl, t);
        cr_assert_eq((int)json_array_size(row), V, "%s: logits[%d] length", name, t);
        for (int i = 0; i < V; i++) ref[(size_t)t * V + i] = (float)json_number_value(json_array_get(row, i));
    }
    double md, mr;
    mt_max_diff(logits, ref, (size_t)n * V, &md, &mr);
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    double tol = dt && strcmp(dt, "bfloat16") == 0 ? BF16_REL_TOL : F32_REL_TOL;
    fprintf(stderr, "fixture %s (%s): max|diff|/max|ref| = %.3g (max|ref| %.3g, tol %.1g)\n", name,
            dt ? dt : "?", md / mr, mr, tol);
    cr_assert(md / mr <= tol, "%s: max|diff|/max|ref| = %g > %g", name, md / mr, tol);

    json_t *g = json_object_get(root, "greedy");
    int np, ng;
    int32_t *prompt = json_ids(json_object_get(g, "prompt_ids"), &np);
    int32_t *want = json_ids(json_object_get(g, "output_ids"), &ng);
    int max_new = (int)json_integer_value(json_object_get(g, "max_new_tokens"));
    cr_assert(ng <= max_new);
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 8,
                           .n_blocks = (np + ng) / 8 + 2, .max_seqs = 1, .max_seq_len = np + ng,
                           .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 8, np + ng, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, prompt, np, logits, false, &err), QRL_OK, "%s",
                 err.msg);
    for (int t = 0; t < ng; t++) {
        int32_t tok = qrl_cpu_argmax(logits, V);
        cr_assert_eq(tok, want[t], "%s: greedy token %d: got %d, HF %d", name, t, tok, want[t]);
        if (t + 1 < ng)
            cr_assert_eq(qrl_forward_decode(f, kv, &seq, &tok, 1, logits, &err), QRL_OK, "%s", err.msg);
    }
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    free(prompt);
    free(want);
    free(ref);
    free(logits);
    free(ids);
    json_decref(root);
    qrl_model_free(m);
}

Test(model_hf, transformers_fixtures) {
    const char *base = "tests/fixtures/hf";
    DIR *dp = opendir(base);
    if (!dp) cr_skip_test("no %s (made by tests/reference/make_hf_refs.py)", base);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char dir[600], ref[700];
        snprintf(dir, sizeof dir, "%s/%s", base, de->d_name);
        snprintf(ref, sizeof ref, "%s/reference.json", dir);
        if (access(ref, R_OK) != 0) continue;
        check_fixture(dir, de->d_name);
        n++;
    }
    closedir(dp);
    if (n == 0) cr_skip_test("no fixtures under %s", base);
}

/* ---- loader round trips and malformed folders -------------------------------------- */

static const char *CFG_QWEN3 =
    "{\"model_type\": \"qwen3\", \"hidden_size\": 32, \"intermediate_size\": 48,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 16, \"vocab_size\": 50, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"eos_token_id\": 3}";

static qrl_model *model_from_json(const char *json, uint64_t seed) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(json, strlen(json), "cfg", &cfg, &err), QRL_OK, "%s",
                 err.msg);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, seed);
    return m;
}

Test(model_hf, save_load_round_trip_f32_and_bf16) {
    qrl_model *m = model_from_json(CFG_QWEN3, 7);
    char dir[256];
    qrl_test_mkdtemp(dir);
    qrl_error err;
    qrl_model *r;
    mt_save_hf(m, dir, CFG_QWEN3, "F32", NULL, NULL);
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(r->n_tensors, m->n_tensors);
    cr_assert_eq(r->arena_floats, m->arena_floats);
    cr_assert_eq(memcmp(r->arena, m->arena, m->arena_floats * sizeof(float)), 0);
    cr_assert_not_null(qrl_model_find_tensor(r, "model.layers.1.self_attn.k_norm.weight"));
    qrl_model_free(r);

    mt_save_hf(m, dir, CFG_QWEN3, "BF16", NULL, NULL);
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    cr_assert_eq(memcmp(r->arena, m->arena, m->arena_floats * sizeof(float)), 0);
    qrl_model_free(r);
    qrl_test_rmtree(dir);
    qrl_model_free(m);
}

Test(model_hf, missing_tensor_is_named) {
    qrl_model *m = model_from_json(CFG_QWEN3, 1);
    char dir[256];
    qrl_test_mkdtemp(dir);
    mt_save_hf(m, dir, CFG_QWEN3, "F32", "model.layers.1.self_attn.q_norm.weight", NULL);
    qrl_error err;
    qrl_model *r = (qrl_model *)1;
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_null(r);
    cr_assert(strstr(err.msg, "missing tensor 'model.layers.1.self_attn.q_norm.weight'"), "%s",
              err.msg);
    cr_assert(strstr(err.msg, "model.safetensors"), "%s", err.msg);
    /* untied: lm_head.weight is required */
    mt_save_hf(m, dir, CFG_QWEN3, "F32", "lm_head.weight", NULL);
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "'lm_head.weight'"), "%s", err.msg);
    qrl_test_rmtree(dir);
    qrl_model_free(m);
}

Test(model_hf, shape_disagreeing_with_config_is_named) {
    qrl_model *m = model_from_json(CFG_QWEN3, 1);
    char dir[256];
    qrl_test_mkdtemp(dir);
    mt_save_hf(m, dir, CFG_QWEN3, "BF16", NULL, "model.layers.0.self_attn.k_proj.weight");
    qrl_error err;
    qrl_model *r;
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "'model.layers.0.self_attn.k_proj.weight' has shape [33, 32], "
                              "config.json implies [32, 32]"),
              "%s", err.msg);
    qrl_test_rmtree(dir);
    qrl_model_free(m);
}

Test(model_hf, unknown_model_type_and_missing_weights) {
    char dir[256], p[300];
    qrl_test_mkdtemp(dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    mt_write_text(p, "{\"model_type\": \"gpt2\", \"hidden_size\": 8}");
    qrl_error err;
    qrl_model *r;
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "config.json") && strstr(err.msg, "model_type 'gpt2'"), "%s", err.msg);
    mt_write_text(p, CFG_QWEN3);
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "model.safetensors"), "%s", err.msg);
    qrl_test_rmtree(dir);
}

Test(model_hf, sharded_checkpoint_through_the_index) {
    qrl_model *m = model_from_json(CFG_QWEN3, 9);
    char dir[256], p[512];
    qrl_test_mkdtemp(dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    mt_write_text(p, CFG_QWEN3);
    /* two shards: the first half of the tensor table, then the rest */
    int half = m->n_tensors / 2;
    mt_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    json_t *wmap = json_object();
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *s = &m->tensors[i];
        t[i] = (mt_tensor){s->name, s->ndim, {s->shape[0], s->shape[1]}, s->data};
        json_object_set_new(wmap, s->name, json_string(i < half ? "model-00001-of-00002.safetensors"
                                                                 : "model-00002-of-00002.safetensors"));
    }
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    mt_write_safetensors(p, t, half, "BF16");
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    mt_write_safetensors(p, t + half, m->n_tensors - half, "F32");
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wmap);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    json_decref(idx);
    qrl_error err;
    qrl_model *r;
    cr_assert_eq(qrl_model_load(dir, &r, &err), QRL_OK, "%s", err.msg);
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *a = &m->tensors[i], *b = &r->tensors[i];
        size_t cnt = (size_t)a->shape[0] * (size_t)(a->ndim == 2 ? a->shape[1] : 1);
        for (size_t j = 0; j < cnt; j++) {
            float want = i < half ? qrl_bf16_to_f32(qrl_f32_to_bf16(a->data[j])) : a->data[j];
            cr_assert_eq(b->data[j], want, "%s[%zu]", a->name, j);
        }
    }
    qrl_model_free(r);
    free(t);
    qrl_test_rmtree(dir);
    qrl_model_free(m);
}
