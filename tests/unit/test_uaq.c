/* UAQ (SPEC §3, docs/uaq.md): logits before and after qrl_model_apply_uaq(1.5) agree to
 * 1e-5 relative (max|diff|/max|ref|, F32) on stories260K, TinyStories and every HF
 * fixture; s = 2 is exact (bitwise logits and round trip); undo restores each weight
 * within 2^-23 relative; which tensors move; re-quantization; errors. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "support/test_files.h"

#define N_IDS 24
#define UAQ_REL_TOL 1e-5

static void logits_of(const qrl_model *m, float *out) {
    int V = m->cfg.vocab_size;
    int32_t ids[N_IDS];
    for (int i = 0; i < N_IDS; i++) ids[i] = (i * 7919 + 1) % V;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 8, .n_blocks = 4,
                           .max_seqs = 1, .max_seq_len = N_IDS, .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f;
    qrl_error err;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK);
    cr_assert_eq(qrl_forward_new(m, 8, N_IDS, &f, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, N_IDS, out, true, &err), QRL_OK, "%s", err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

static size_t tensor_len(const qrl_model_tensor *t) {
    return (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
}

/* Copy of every weight, in tensor order. */
static float *snapshot(const qrl_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) n += tensor_len(&m->tensors[i]);
    float *s = malloc(n * sizeof(float)), *p = s;
    for (int i = 0; i < m->n_tensors; i++) {
        memcpy(p, m->tensors[i].data, tensor_len(&m->tensors[i]) * sizeof(float));
        p += tensor_len(&m->tensors[i]);
    }
    return s;
}

/* Expected factor of tensor `name` under UAQ: 's' multiplied, '/' divided, '=' unchanged. */
static char expected_op(const qrl_model *m, const char *name) {
    static const char *const mul[] = {"input_layernorm", "post_attention_layernorm", "v_proj.bias"};
    static const char *const div[] = {"q_proj.weight", "k_proj.weight", "o_proj.weight",
                                      "gate_proj.weight", "down_proj.weight"};
    for (size_t i = 0; i < 3; i++)
        if (strstr(name, mul[i])) return 's';
    for (size_t i = 0; i < 5; i++)
        if (strstr(name, div[i])) return '/';
    if (!m->cfg.tie_embeddings && strcmp(name, "model.norm.weight") == 0) return 's';
    if (!m->cfg.tie_embeddings && strcmp(name, "lm_head.weight") == 0) return '/';
    return '='; /* v/up weights, q/k biases, o bias, q_norm/k_norm, embedding, tied head */
}

/* Apply UAQ(s), compare logits and each tensor, undo, compare weights again. */
static void check_model(qrl_model *m, const char *name, float s) {
    int V = m->cfg.vocab_size;
    size_t nl = (size_t)N_IDS * V;
    float *before = malloc(nl * sizeof(float)), *after = malloc(nl * sizeof(float));
    float *w0 = snapshot(m);
    qrl_error err;
    logits_of(m, before);
    cr_assert_eq(qrl_model_apply_uaq(m, s, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->uaq_scale, s);
    logits_of(m, after);
    double md = 0, mr = 0;
    for (size_t i = 0; i < nl; i++) {
        md = fmax(md, fabs((double)after[i] - before[i]));
        mr = fmax(mr, fabs((double)before[i]));
    }
    /* each tensor moved as docs/uaq.md says */
    const float *p = w0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        char op = expected_op(m, t->name);
        for (size_t j = 0; j < tensor_len(t); j++) {
            float want = op == 's' ? p[j] * s : op == '/' ? p[j] / s : p[j];
            cr_assert(t->data[j] == want, "%s: %s[%zu] = %g, want %g (op %c)", name, t->name, j,
                      t->data[j], want, op);
        }
        p += tensor_len(t);
    }
    cr_assert_eq(qrl_model_undo_uaq(m, &err), QRL_OK);
    cr_assert_eq(m->uaq_scale, 1.0f);
    double worst = 0;
    p = w0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        for (size_t j = 0; j < tensor_len(t); j++) {
            double e = fabs((double)t->data[j] - p[j]) / fmax(fabs((double)p[j]), 0x1p-126);
            worst = fmax(worst, e);
            cr_assert(e <= 0x1p-23, "%s: %s[%zu] %.9g back as %.9g", name, t->name, j, p[j],
                      t->data[j]);
        }
        p += tensor_len(t);
    }
    fprintf(stderr, "uaq %-22s s=%g: logits max|diff|/max|ref| = %.3g; undo max rel err %.3g "
                    "(2^-23 = %.3g)\n",
            name, (double)s, md / mr, worst, 0x1p-23);
    if (s == 2.0f) {
        cr_assert_eq(memcmp(after, before, nl * sizeof(float)), 0, "%s: s=2 must be exact", name);
        cr_assert_eq(worst, 0.0, "%s: s=2 round trip must be exact", name);
    }
    cr_assert(md / mr <= UAQ_REL_TOL, "%s: %g", name, md / mr);
    free(before), free(after), free(w0);
}

static void check_path(const char *path, const char *name) {
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(path, &m, &err), QRL_OK, "%s", err.msg);
    check_model(m, name, 1.5f);
    check_model(m, name, 2.0f);
    qrl_model_free(m);
}

Test(uaq, logits_invariant_on_real_checkpoints) {
    char p[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", p, sizeof p))
        cr_skip_test("no %s", p);
    check_path(p, "stories260K");
    if (qrl_test_data_path("tinystories_656k/config.json", p, sizeof p)) {
        qrl_test_data_path("tinystories_656k", p, sizeof p);
        check_path(p, "tinystories_656k");
    }
}

Test(uaq, logits_invariant_on_every_hf_fixture) {
    DIR *dp = opendir("tests/fixtures/hf");
    cr_assert_not_null(dp);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        char dir[512];
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", e->d_name);
        check_path(dir, e->d_name);
        n++;
    }
    closedir(dp);
    cr_assert_geq(n, 6);
}

Test(uaq, requantizes_and_refuses_bad_scales) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN2, .dim = 32, .hidden_dim = 48, .n_layers = 1,
                          .n_heads = 2, .n_kv_heads = 1, .head_dim = 16, .vocab_size = 40,
                          .max_seq_len = 32, .norm_eps = 1e-6f, .qkv_bias = true,
                          .rope = {.theta = 10000.0}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK);
    qrl_model_init_random(m, 9);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W8A8_INT8, &err), QRL_OK);
    float s0 = qrl_model_linear(m, 0, QRL_LINEAR_Q)->scales[3];
    cr_assert_eq(qrl_model_apply_uaq(m, 1.5f, &err), QRL_OK);
    const qrl_linear *q = qrl_model_linear(m, 0, QRL_LINEAR_Q);
    cr_assert_eq(q->fmt, QRL_PRECISION_W8A8_INT8);
    cr_assert_eq(q->scales[3], qrl_quant_absmax(m->layers[0].wq + 3 * 32, 32, NULL) / 127.0f,
                 "re-quantized from the scaled master weights");
    cr_assert_float_eq(q->scales[3], s0 / 1.5f, 1e-6f * s0);
    cr_assert_eq(qrl_model_linear(m, 0, QRL_LINEAR_UP)->scales[0],
                 qrl_quant_absmax(m->layers[0].w_up, 32, NULL) / 127.0f);
    cr_assert_eq(qrl_model_apply_uaq(m, 1.5f, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "uaq: already applied with s=1.5 (undo it first)");
    cr_assert_eq(qrl_model_undo_uaq(m, &err), QRL_OK);
    cr_assert_eq(qrl_model_undo_uaq(m, &err), QRL_OK, "undo without UAQ is a no-op");
    float bad[] = {0.0f, -1.5f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(qrl_model_apply_uaq(m, bad[i], &err), QRL_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(err.msg, "must be finite and > 0"), "%s", err.msg);
    }
    cr_assert_eq(qrl_model_apply_uaq(m, 1.0f, &err), QRL_OK);
    cr_assert_eq(m->uaq_scale, 1.0f, "s = 1 is a no-op");
    qrl_model_free(m);
}
