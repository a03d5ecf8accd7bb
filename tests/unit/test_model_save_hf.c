/* qrl_model_save_hf: what it writes loads back (qrl_model_load_hf) with the same weights
 * and the same logits, for a llama2.c model (q/k rows permuted from interleaved to
 * rotate_half RoPE) and for HF fixtures (biases, QK-norm, untied head); refusals. */
#include <criterion/criterion.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "unit/model_test_util.h"

/* Last-position logits after prefilling `n` tokens. */
static void logits_of(const qrl_model *m, const int32_t *tok, int n, float *out) {
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16, .n_blocks = 8,
                           .max_seqs = 1, .max_seq_len = 64, .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f;
    qrl_error err;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 16, 64, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, tok, n, out, false, &err), QRL_OK, "%s", err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

static void check_roundtrip(qrl_model *m, qrl_dtype dt, double tol) {
    char dir[256];
    qrl_test_mkdtemp(dir);
    qrl_error err;
    cr_assert_eq(qrl_model_save_hf(m, dir, dt, &err), QRL_OK, "%s", err.msg);
    qrl_model *back;
    cr_assert_eq(qrl_model_load_hf(dir, &back, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(back->cfg.dim, m->cfg.dim);
    cr_assert_eq(back->cfg.n_kv_heads, m->cfg.n_kv_heads);
    cr_assert_eq(back->cfg.head_dim, m->cfg.head_dim);
    cr_assert_eq(back->cfg.qkv_bias, m->cfg.qkv_bias);
    cr_assert_eq(back->cfg.qk_norm, m->cfg.qk_norm);
    cr_assert_eq(back->cfg.tie_embeddings, m->cfg.tie_embeddings);
    cr_assert_eq(back->cfg.bos_id, m->cfg.bos_id);
    cr_assert_eq(back->cfg.n_eos, m->cfg.n_eos);
    cr_assert_eq(back->cfg.rope.theta, m->cfg.rope.theta);
    cr_assert_eq(back->cfg.rope.scaling, m->cfg.rope.scaling);
    cr_assert_eq(back->cfg.rope.layout, QRL_ROPE_LAYOUT_HALF);
    cr_assert_eq(back->n_tensors, m->n_tensors);
    int V = m->cfg.vocab_size;
    int32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    logits_of(m, tok, 12, a);
    logits_of(back, tok, 12, b);
    double md, mr;
    mt_max_diff(b, a, (size_t)V, &md, &mr);
    cr_assert(md <= tol * mr, "logits differ after save/load: max |d| %g, max |ref| %g", md, mr);
    free(a);
    free(b);
    qrl_model_free(back);
    qrl_test_rmtree(dir);
}

Test(model_save_hf, llama2c_interleaved_permuted_to_half) {
    char bin[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin))
        cr_skip_test("stories260K data not found at %s", bin);
    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    /* F32: the same numbers, only the per-head sums run in another order. */
    check_roundtrip(m, QRL_DTYPE_F32, 1e-5);
    qrl_model_free(m);
}

Test(model_save_hf, hf_fixtures_f32_exact_weights) {
    const char *names[] = {"llama", "llama3_rope", "qwen2", "qwen3", "mistral"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[256], dir[256];
        snprintf(src, sizeof src, "tests/fixtures/hf/%s", names[i]);
        qrl_error err;
        qrl_model *m, *back;
        cr_assert_eq(qrl_model_load_hf(src, &m, &err), QRL_OK, "%s", err.msg);
        qrl_test_mkdtemp(dir);
        cr_assert_eq(qrl_model_save_hf(m, dir, QRL_DTYPE_F32, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_model_load_hf(dir, &back, &err), QRL_OK, "%s: %s", names[i], err.msg);
        cr_assert_eq(back->arena_floats, m->arena_floats);
        cr_assert_eq(memcmp(back->arena, m->arena, m->arena_floats * sizeof(float)), 0,
                     "%s: weights changed in an F32 round trip", names[i]);
        cr_assert_eq(back->cfg.rope.scaling, m->cfg.rope.scaling, "%s", names[i]);
        cr_assert_eq(back->cfg.rope.factor, m->cfg.rope.factor, "%s", names[i]);
        qrl_model_free(back);
        qrl_test_rmtree(dir);
        /* BF16: the logits of the BF16-rounded model. */
        qrl_model_round_bf16(m);
        check_roundtrip(m, QRL_DTYPE_BF16, 1e-6);
        qrl_model_free(m);
    }
}

Test(model_save_hf, refusals) {
    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load_hf("tests/fixtures/hf/llama", &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_save_hf(m, "/tmp", QRL_DTYPE_F16, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "F16"), "%s", err.msg);
    cr_assert_eq(qrl_model_apply_uaq(m, 2.0f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_save_hf(m, "/tmp", QRL_DTYPE_F32, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "UAQ"), "%s", err.msg);
    cr_assert_eq(qrl_model_undo_uaq(m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_save_hf(m, "/nonexistent-qrl/x/y", QRL_DTYPE_F32, &err), QRL_STATUS_IO);
    cr_assert(strstr(err.msg, "/nonexistent-qrl/x/y"), "%s", err.msg);
    qrl_model_free(m);
}
