/* Whole-model training engine (common/train/model_train.h):
 *  (a) forward log-probs = log softmax of the inference engine's prefill logits
 *      (common/model/forward.h) at the targets, on every HF fixture and stories260K;
 *  (b) gradients of every tensor vs finite differences on tiny random models (llama
 *      tied/untied, llama2.c interleaved RoPE, qwen2 bias, qwen3 q/k norm + o bias);
 *  (c) a packed batch of two sequences = the two run separately;
 *  (d) gradient accumulation over 2 micro-batches = one batch of both;
 *  (e) save (safetensors params + AdamW state) -> reload -> one more step: bit-identical;
 *  plus the error paths. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "train/adamw.h"
#include "train/model_train.h"
#include "unit/model_test_util.h"

static qrl_model *model_from_json(const char *json, qrl_rope_layout layout, uint64_t seed) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(json, strlen(json), "cfg", &cfg, &err), QRL_OK, "%s",
                 err.msg);
    cfg.rope.layout = layout;
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, seed);
    return m;
}

/* Teacher-forced logits [n, V] from the inference engine (one prefill). */
static float *infer_logits(const qrl_model *m, const int32_t *ids, int n) {
    qrl_error err;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16,
                           .n_blocks = n / 16 + 2, .max_seqs = 1, .max_seq_len = n,
                           .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 16, n, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    float *logits = malloc((size_t)n * m->cfg.vocab_size * sizeof(float));
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, n, logits, true, &err), QRL_OK, "%s",
                 err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    return logits;
}

/* log softmax(z)[tgt] and the entropy, in double. */
static void ref_logprob(const float *z, int V, int tgt, double *lp, double *ent) {
    double mx = -INFINITY, s = 0, sz = 0;
    for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
    for (int j = 0; j < V; j++) s += exp(z[j] - mx);
    double lse = mx + log(s);
    for (int j = 0; j < V; j++) sz += exp(z[j] - lse) * z[j];
    *lp = tgt >= 0 ? z[tgt] - lse : 0.0;
    *ent = lse - sz;
}

/* Single sequence: targets = next token, -1 at the end; seg 0; positions 0..n-1. */
static void single_seq(const int32_t *ids, int n, int32_t *tgt, int32_t *pos, int32_t *seg) {
    for (int t = 0; t < n; t++) tgt[t] = t + 1 < n ? ids[t + 1] : -1, pos[t] = t, seg[t] = 0;
}

/* (a) our logp/entropy vs the inference engine's logits.  Returns max relative error. */
static double check_vs_inference(qrl_model *m, const int32_t *ids, int n, const char *name) {
    qrl_error err;
    float *logits = infer_logits(m, ids, n);
    int32_t *tgt = malloc(n * sizeof *tgt), *pos = malloc(n * sizeof *pos),
            *seg = malloc(n * sizeof *seg);
    float *lp = malloc(n * sizeof *lp), *ent = malloc(n * sizeof *ent);
    single_seq(ids, n, tgt, pos, seg);
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, n, &tr, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_train_forward(tr, ids, tgt, pos, seg, n, lp, ent, &err), QRL_OK,
                 "%s", err.msg);
    double md = 0, mr = 0, mde = 0, mre = 0;
    for (int t = 0; t < n; t++) {
        double rl, re;
        ref_logprob(logits + (size_t)t * m->cfg.vocab_size, m->cfg.vocab_size, tgt[t], &rl, &re);
        md = fmax(md, fabs(lp[t] - rl)), mr = fmax(mr, fabs(rl));
        mde = fmax(mde, fabs(ent[t] - re)), mre = fmax(mre, fabs(re));
    }
    double e = md / mr, ee = mde / mre;
    fprintf(stderr, "model_train %-12s logp vs inference: max|diff| %.2e max|ref| %.2f rel %.2e;"
            " entropy rel %.2e\n", name, md, mr, e, ee);
    cr_expect(e <= 1e-5, "%s: logp relative error %.3e", name, e);
    cr_expect(ee <= 1e-5, "%s: entropy relative error %.3e", name, ee);
    qrl_model_train_destroy(tr);
    free(logits), free(tgt), free(pos), free(seg), free(lp), free(ent);
    return fmax(e, ee);
}

Test(model_train, hf_fixtures_logprobs_match_inference_engine) {
    DIR *d = opendir("tests/fixtures/hf");
    if (!d) cr_skip_test("tests/fixtures/hf not found (run from the repo root)");
    int done = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512], refp[600];
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", e->d_name);
        snprintf(refp, sizeof refp, "%s/reference.json", dir);
        json_error_t je;
        json_t *root = json_load_file(refp, 0, &je);
        if (!root) continue;
        qrl_model *m;
        qrl_error err;
        cr_assert_eq(qrl_model_load_hf(dir, &m, &err), QRL_OK, "%s", err.msg);
        json_t *a = json_object_get(root, "input_ids");
        int n = (int)json_array_size(a);
        int32_t *ids = malloc(n * sizeof *ids);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
        check_vs_inference(m, ids, n, e->d_name);
        qrl_model_free(m);
        json_decref(root);
        free(ids);
        done++;
    }
    closedir(d);
    cr_assert(done >= 5, "only %d HF fixtures found", done);
}

Test(model_train, stories260k_interleaved_rope_logprobs_match_inference_engine) {
    char bin[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin))
        cr_skip_test("stories260K not found at %s", bin);
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->cfg.rope.layout, QRL_ROPE_LAYOUT_INTERLEAVED);
    int32_t ids[40];
    ids[0] = 1;
    for (int i = 1; i < 40; i++) ids[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab_size);
    check_vs_inference(m, ids, 40, "stories260K");
    qrl_model_free(m);
}

/* ---- (b) finite differences ------------------------------------------------------------- */

#define TINY(mt, extra)                                                                        \
    "{\"model_type\": \"" mt "\", \"hidden_size\": 16, \"intermediate_size\": 24,"             \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"       \
    " \"vocab_size\": 19, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5" extra "}"

enum { GT = 13 }; /* two packed sequences of 8 and 5 tokens */

typedef mt_batch batch;

static double run_loss(qrl_model_train_t *tr, const batch *b, float *lp, float *ent) {
    qrl_error err;
    cr_assert_eq(qrl_model_train_forward(tr, b->tok, b->tgt, b->pos, b->seg, b->T, lp, ent, &err),
                 QRL_OK, "%s", err.msg);
    double L = 0;
    for (int t = 0; t < b->T; t++) L += (double)b->c[t] * lp[t] + (double)b->e[t] * ent[t];
    return L;
}

/* Gradient of every tensor at 6 elements (the 3 largest |g| and 3 spread ones) vs a 4-point
 * central difference of the F32 forward, loss summed in double.  Truncation is O(h^4) and
 * the F32 rounding noise of the loss (~1e-7 relative) enters as noise / h, so h = 5e-3
 * (x max(1, |w|)) balances the two: measured worst 7.5e-4 over all tensors of the five
 * models (h = 2e-3: 2e-3, noise-bound; h = 2e-2: 8e-3 on the Qwen3 embedding, curvature
 * through q/k norm).  Error per element: |analytic - numeric| / max |analytic| over the
 * tensor; bound 2e-3 (a missing or wrong term gives O(1)). */
static double gradcheck_model(const char *json, qrl_rope_layout layout, const char *name) {
    qrl_model *m = model_from_json(json, layout, 11);
    qrl_error err;
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, 64, &tr, &err), QRL_OK, "%s", err.msg);
    batch b;
    int lens[2] = {8, 5};
    mt_make_batch(&b, lens, 2, m->cfg.vocab_size, 5);
    cr_assert_eq(b.T, GT);
    float lp[64], ent[64];
    run_loss(tr, &b, lp, ent);
    qrl_model_train_zero_grad(tr);
    cr_assert_eq(qrl_model_train_backward(tr, b.c, b.e, &err), QRL_OK, "%s", err.msg);
    double worst = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        const float *g = qrl_model_train_grad_of(tr, t);
        double gmax = 0;
        for (size_t j = 0; j < cnt; j++) gmax = fmax(gmax, fabs(g[j]));
        cr_expect(gmax > 0, "%s: %s has an all-zero gradient", name, t->name);
        size_t pick[6];
        for (int r = 0; r < 3; r++) { /* 3 largest */
            size_t best = 0;
            double bv = -1;
            for (size_t j = 0; j < cnt; j++) {
                bool used = false;
                for (int q = 0; q < r; q++) used |= pick[q] == j;
                if (!used && fabs(g[j]) > bv) bv = fabs(g[j]), best = j;
            }
            pick[r] = best;
        }
        for (int r = 3; r < 6; r++) pick[r] = (cnt * (size_t)(2 * r - 5)) / 7 % cnt;
        double terr = 0;
        for (int r = 0; r < 6; r++) {
            float *p = t->data + pick[r], keep = *p;
            const float h = 5e-3f * fmaxf(1.0f, fabsf(keep));
            double f[4];
            const float off[4] = {-2, -1, 1, 2};
            for (int q = 0; q < 4; q++) {
                *p = keep + off[q] * h;
                f[q] = run_loss(tr, &b, lp, ent);
            }
            *p = keep;
            double num = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12.0 * h);
            double e = fabs(num - g[pick[r]]) / gmax;
            terr = fmax(terr, e);
        }
        fprintf(stderr, "model_train gradcheck %-9s %-44s max|g| %.2e err %.2e\n", name, t->name,
                gmax, terr);
        cr_expect(terr <= 2e-3, "%s: %s gradient error %.3e", name, t->name, terr);
        worst = fmax(worst, terr);
    }
    fprintf(stderr, "model_train gradcheck %s: worst %.2e over %d tensors\n", name, worst,
            m->n_tensors);
    qrl_model_train_destroy(tr);
    qrl_model_free(m);
    return worst;
}

Test(model_train, gradcheck_llama_untied) {
    gradcheck_model(TINY("llama", ""), QRL_ROPE_LAYOUT_HALF, "llama");
}
Test(model_train, gradcheck_llama_tied) {
    gradcheck_model(TINY("llama", ", \"tie_word_embeddings\": true"), QRL_ROPE_LAYOUT_HALF,
                    "llamatied");
}
Test(model_train, gradcheck_llama2c_interleaved_rope) {
    gradcheck_model(TINY("llama", ""), QRL_ROPE_LAYOUT_INTERLEAVED, "llama2c");
}
Test(model_train, gradcheck_qwen2_qkv_bias_tied) {
    gradcheck_model(TINY("qwen2", ", \"tie_word_embeddings\": true"), QRL_ROPE_LAYOUT_HALF,
                    "qwen2");
}
Test(model_train, gradcheck_qwen3_qk_norm_head_dim_o_bias) {
    gradcheck_model(TINY("qwen3", ", \"head_dim\": 6, \"attention_bias\": true,"
                                  " \"tie_word_embeddings\": false"),
                    QRL_ROPE_LAYOUT_HALF, "qwen3");
}

/* ---- (c), (d) packing and accumulation ----------------------------------------------------- */

/* Per-tensor max|a - b| / max|b| over the whole parameter block, worst tensor. */
static double grad_err(const qrl_model *m, const float *a, const float *b) {
    double worst = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t off = (size_t)(t->data - m->arena),
               cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        double md, mr;
        mt_max_diff(a + off, b + off, cnt, &md, &mr);
        worst = fmax(worst, mr > 0 ? md / mr : md);
    }
    return worst;
}

#define PACK_JSON                                                                              \
    TINY("qwen3", ", \"head_dim\": 8, \"attention_bias\": true, \"tie_word_embeddings\": true")

Test(model_train, packed_batch_equals_separate_sequences_and_accumulation) {
    qrl_model *m = model_from_json(PACK_JSON, QRL_ROPE_LAYOUT_HALF, 3);
    qrl_error err;
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, 64, &tr, &err), QRL_OK, "%s", err.msg);
    size_t n;
    float *g = qrl_model_train_grads(tr, &n);
    float *g_pack = malloc(n * sizeof *g), *g_sum = malloc(n * sizeof *g),
          *g_acc = malloc(n * sizeof *g);
    int lens[2] = {9, 6};
    batch both, one[2];
    mt_make_batch(&both, lens, 2, m->cfg.vocab_size, 77);
    for (int s = 0; s < 2; s++) { /* the same two sequences, alone */
        int o = s ? lens[0] : 0;
        batch *b = &one[s];
        b->T = lens[s];
        for (int t = 0; t < b->T; t++) {
            b->tok[t] = both.tok[o + t], b->tgt[t] = both.tgt[o + t], b->seg[t] = 0;
            b->pos[t] = t, b->c[t] = both.c[o + t], b->e[t] = both.e[o + t];
        }
    }
    float lp_pack[64], ent_pack[64], lp_one[64], ent_one[64];
    qrl_model_train_zero_grad(tr);
    run_loss(tr, &both, lp_pack, ent_pack);
    cr_assert_eq(qrl_model_train_backward(tr, both.c, both.e, &err), QRL_OK);
    memcpy(g_pack, g, n * sizeof *g);

    /* (c) separately, each from zero, summed here; logp compared per token */
    memset(g_sum, 0, n * sizeof *g);
    double lp_diff = 0;
    for (int s = 0; s < 2; s++) {
        qrl_model_train_zero_grad(tr);
        run_loss(tr, &one[s], lp_one, ent_one);
        for (int t = 0; t < one[s].T; t++) {
            int o = s ? lens[0] : 0;
            lp_diff = fmax(lp_diff, fabs(lp_one[t] - lp_pack[o + t]));
            lp_diff = fmax(lp_diff, fabs(ent_one[t] - ent_pack[o + t]));
        }
        cr_assert_eq(qrl_model_train_backward(tr, one[s].c, one[s].e, &err), QRL_OK);
        for (size_t i = 0; i < n; i++) g_sum[i] += g[i];
    }
    /* (d) accumulation: two micro-batches without zeroing in between */
    qrl_model_train_zero_grad(tr);
    for (int s = 0; s < 2; s++) {
        run_loss(tr, &one[s], lp_one, ent_one);
        cr_assert_eq(qrl_model_train_backward(tr, one[s].c, one[s].e, &err), QRL_OK);
    }
    memcpy(g_acc, g, n * sizeof *g);
    double e_sep = grad_err(m, g_pack, g_sum), e_acc = grad_err(m, g_acc, g_pack),
           e_acc_sum = grad_err(m, g_acc, g_sum);
    fprintf(stderr, "model_train packing: logp/entropy max|diff| packed vs separate %.2e; grads "
            "packed vs sum of separate %.2e; accumulated vs packed %.2e; accumulated vs sum of "
            "separate %.2e\n", lp_diff, e_sep, e_acc, e_acc_sum);
    cr_expect(lp_diff <= 1e-6, "packed logp differs by %.3e", lp_diff);
    cr_expect(e_sep <= 1e-5, "packed vs separate gradients %.3e", e_sep);
    cr_expect(e_acc <= 1e-5, "accumulated vs packed gradients %.3e", e_acc);
    cr_expect(e_acc_sum <= 1e-6, "accumulated vs summed gradients %.3e", e_acc_sum);
    free(g_pack), free(g_sum), free(g_acc);
    qrl_model_train_destroy(tr);
    qrl_model_free(m);
}

/* ---- (e) save -> reload -> step ------------------------------------------------------------ */

static void train_step(qrl_model_train_t *tr, qrl_adamw_t *opt, const batch *b, double lr) {
    float lp[64], ent[64];
    qrl_error err;
    qrl_model_train_zero_grad(tr);
    run_loss(tr, b, lp, ent);
    cr_assert_eq(qrl_model_train_backward(tr, b->c, b->e, &err), QRL_OK);
    size_t n;
    float *p = qrl_model_train_params(tr, &n), *g = qrl_model_train_grads(tr, NULL);
    cr_assert_eq(qrl_adamw_step(opt, p, g, lr, NULL, &err), QRL_OK, "%s", err.msg);
}

Test(model_train, save_reload_one_more_step_is_bit_identical) {
    char dir[64], stp[600], adp[600];
    qrl_test_mkdtemp(dir);
    snprintf(stp, sizeof stp, "%s/params.safetensors", dir);
    snprintf(adp, sizeof adp, "%s/adamw.bin", dir);
    qrl_model *m = model_from_json(PACK_JSON, QRL_ROPE_LAYOUT_HALF, 9);
    qrl_error err;
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, 64, &tr, &err), QRL_OK, "%s", err.msg);
    size_t n;
    qrl_model_train_params(tr, &n);
    qrl_adamw_config ac = qrl_adamw_config_default();
    qrl_adamw_t *opt;
    cr_assert_eq(qrl_adamw_new(n, &ac, &opt, &err), QRL_OK, "%s", err.msg);
    int lens[3] = {5, 7, 4};
    batch b;
    mt_make_batch(&b, lens, 3, m->cfg.vocab_size, 123);
    train_step(tr, opt, &b, 1e-2);
    train_step(tr, opt, &b, 1e-2);
    /* save: every tensor as F32 safetensors, and the optimizer state */
    qrl_tensor *tt = calloc((size_t)m->n_tensors, sizeof *tt);
    qrl_safetensors_entry *en = calloc((size_t)m->n_tensors, sizeof *en);
    for (int i = 0; i < m->n_tensors; i++) {
        qrl_tensor_init(&tt[i], QRL_DTYPE_F32, m->tensors[i].ndim, m->tensors[i].shape,
                        m->tensors[i].data);
        en[i].name = m->tensors[i].name, en[i].tensor = &tt[i];
    }
    cr_assert_eq(qrl_safetensors_write(stp, en, (size_t)m->n_tensors, NULL, 0, &err), QRL_OK,
                 "%s", err.msg);
    cr_assert_eq(qrl_adamw_save(opt, adp, &err), QRL_OK, "%s", err.msg);
    free(tt), free(en);
    train_step(tr, opt, &b, 1e-2); /* the uninterrupted run's third step */

    /* reload into a fresh model, engine and optimizer, then take the third step */
    qrl_model *m2;
    cr_assert_eq(qrl_model_new(&m->cfg, &m2, &err), QRL_OK);
    qrl_safetensors *st;
    cr_assert_eq(qrl_safetensors_open(stp, &st, &err), QRL_OK, "%s", err.msg);
    for (int i = 0; i < m2->n_tensors; i++) {
        qrl_tensor t;
        cr_assert_eq(qrl_safetensors_get(st, m2->tensors[i].name, &t, &err), QRL_OK, "%s",
                     err.msg);
        size_t cnt = (size_t)m2->tensors[i].shape[0] *
                     (size_t)(m2->tensors[i].ndim == 2 ? m2->tensors[i].shape[1] : 1);
        cr_assert_eq(t.dtype, QRL_DTYPE_F32);
        memcpy(m2->tensors[i].data, t.data, cnt * sizeof(float));
    }
    qrl_safetensors_close(st);
    qrl_model_train_t *tr2;
    cr_assert_eq(qrl_model_train_new(m2, 64, &tr2, &err), QRL_OK);
    qrl_adamw_t *opt2;
    cr_assert_eq(qrl_adamw_new(n, &ac, &opt2, &err), QRL_OK);
    cr_assert_eq(qrl_adamw_load(opt2, adp, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_adamw_steps(opt2), 2);
    train_step(tr2, opt2, &b, 1e-2);
    size_t n2;
    float *p1 = qrl_model_train_params(tr, NULL), *p2 = qrl_model_train_params(tr2, &n2);
    cr_assert_eq(n2, n);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += memcmp(&p1[i], &p2[i], sizeof(float)) != 0;
    cr_expect_eq(diff, 0, "%zu of %zu parameters differ after resume", diff, n);
    qrl_adamw_destroy(opt), qrl_adamw_destroy(opt2);
    qrl_model_train_destroy(tr), qrl_model_train_destroy(tr2);
    qrl_model_free(m), qrl_model_free(m2);
    qrl_test_rmtree(dir);
}

/* ---- error paths -------------------------------------------------------------------------- */

Test(model_train, bad_inputs_are_reported) {
    qrl_model *m = model_from_json(TINY("llama", ""), QRL_ROPE_LAYOUT_HALF, 1);
    qrl_error err;
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, 0, &tr, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_null(tr);
    cr_assert_eq(qrl_model_train_new(m, 8, &tr, &err), QRL_OK);
    float dl[16] = {0};
    cr_assert_eq(qrl_model_train_backward(tr, dl, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "without a forward"), "%s", err.msg);
    int32_t tok[16] = {1, 2, 3, 4}, tgt[16] = {2, 3, 4, -1}, pos[16] = {0, 1, 2, 3},
            seg[16] = {0};
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, 9, NULL, NULL, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "max_tokens 8"), "%s", err.msg);
    tok[2] = 19;
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, 4, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    tok[2] = 3, tgt[1] = 25;
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, 4, NULL, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    tgt[1] = 3, pos[3] = 64;
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, 4, NULL, NULL, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "t=3"), "%s", err.msg);
    cr_assert_eq(qrl_model_train_backward(tr, dl, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    pos[3] = 3;
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, 4, NULL, NULL, &err), QRL_OK);
    cr_assert_not_null(qrl_model_train_logits(tr));
    cr_assert_eq(qrl_model_train_backward(tr, dl, NULL, &err), QRL_OK);
    cr_assert_eq(qrl_model_train_backward(tr, dl, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_model_train_destroy(tr);
    qrl_model_free(m);
}
