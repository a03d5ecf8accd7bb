/* Activation recomputation in the training engine (common/train/model_train.h,
 * qrl_model_train_opts.recompute_activations): on stories260K (llama2.c, interleaved RoPE,
 * 5 layers) and every HF fixture (llama, llama3_rope, mistral, qwen2 q/k/v bias, qwen3 q/k
 * norm, qwen3_bf16), two packed micro-batches of several sequences each, gradients
 * accumulated over both: log-probs, entropies, logits and every gradient with
 * recomputation are BIT-identical (memcmp) to the engine that keeps everything; and the
 * activation block shrinks by exactly the (L - 1) per-layer sets the formula predicts. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "train/model_train.h"
#include "unit/model_test_util.h"

#define CAP 64 /* engine capacity: a multiple of 16, so no buffer is padded (exact sizes) */

enum { NMB = 2, MAXSEQ = 3 };
static const int LENS[NMB][MAXSEQ] = {{11, 17, 9}, {23, 30, 0}}; /* 37 and 53 tokens */

typedef mt_batch mbatch; /* CAP == 64 tokens */

/* Floats per token of one layer's saved activations (docs/train.md), its input x
 * included: x_in, h1, x_mid, h2 (4D); gate, up, hm (3F); q, qr, att (3Q); k, v, kr (3KV);
 * lse (H); rstd1, rstd2 (2); with q/k norm qn, kn, rstd_q, rstd_k. */
static size_t layer_floats(const qrl_model_config *c) {
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, H = (size_t)c->n_heads,
           Hkv = (size_t)c->n_kv_heads, Q = H * (size_t)c->head_dim,
           KV = Hkv * (size_t)c->head_dim;
    return 4 * D + 3 * F + 3 * Q + 3 * KV + H + 2 + (c->qk_norm ? Q + KV + H + Hkv : 0);
}

static size_t count_diff(const void *a, const void *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp((const float *)a + i, (const float *)b + i, 4) != 0;
    return d;
}

/* Both engines over the same two micro-batches (gradients accumulated); everything is
 * compared bit for bit, then the activation bytes. */
static void check_model(qrl_model *m, const char *name) {
    qrl_error err;
    const qrl_model_config *c = &m->cfg;
    qrl_model_train_t *tr[2];
    for (int r = 0; r < 2; r++) {
        qrl_model_train_opts o = {.max_tokens = CAP, .recompute_activations = r == 1};
        cr_assert_eq(qrl_model_train_new_opts(m, &o, &tr[r], &err), QRL_OK, "%s", err.msg);
    }
    mbatch mb[NMB];
    for (int k = 0; k < NMB; k++) mt_make_batch(&mb[k], LENS[k], LENS[k][MAXSEQ - 1] > 0 ? MAXSEQ : MAXSEQ - 1, c->vocab_size, 1000 + k);
    float lp[2][NMB][CAP], ent[2][NMB][CAP];
    float *logits[2][NMB];
    size_t nv = (size_t)CAP * (size_t)c->vocab_size;
    for (int r = 0; r < 2; r++) {
        qrl_model_train_zero_grad(tr[r]);
        for (int k = 0; k < NMB; k++) {
            const mbatch *b = &mb[k];
            cr_assert_eq(qrl_model_train_forward(tr[r], b->tok, b->tgt, b->pos, b->seg, b->T,
                                                 lp[r][k], ent[r][k], &err),
                         QRL_OK, "%s: %s", name, err.msg);
            logits[r][k] = malloc(nv * sizeof(float));
            memcpy(logits[r][k], qrl_model_train_logits(tr[r]),
                   (size_t)b->T * (size_t)c->vocab_size * sizeof(float));
            cr_assert_eq(qrl_model_train_backward(tr[r], b->c, b->e, &err), QRL_OK, "%s: %s",
                         name, err.msg);
        }
    }
    size_t d_lp = 0, d_ent = 0, d_logits = 0;
    for (int k = 0; k < NMB; k++) {
        size_t T = (size_t)mb[k].T;
        d_lp += count_diff(lp[0][k], lp[1][k], T);
        d_ent += count_diff(ent[0][k], ent[1][k], T);
        d_logits += count_diff(logits[0][k], logits[1][k], T * (size_t)c->vocab_size);
        free(logits[0][k]), free(logits[1][k]);
    }
    size_t n;
    const float *g0 = qrl_model_train_grads(tr[0], &n), *g1 = qrl_model_train_grads(tr[1], NULL);
    size_t d_g = count_diff(g0, g1, n), nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += g0[i] != 0.0f;
    cr_expect_eq(d_lp, 0, "%s: %zu log-probs differ with recomputation", name, d_lp);
    cr_expect_eq(d_ent, 0, "%s: %zu entropies differ", name, d_ent);
    cr_expect_eq(d_logits, 0, "%s: %zu logits differ", name, d_logits);
    cr_expect_eq(d_g, 0, "%s: %zu of %zu gradient floats differ", name, d_g, n);
    cr_expect(nonzero > n / 2, "%s: only %zu of %zu gradients non-zero", name, nonzero, n);

    /* memory: the (L - 1) dropped sets, each a layer's activations without its input x;
     * and the totals: per token L sets (recompute: L inputs + one set without its input)
     * plus what both keep, S = final x, head (hf, logits V, rstd, lse, entropy: D + V + 3),
     * cos/sin (hd), backward scratch (3D + 3Q + 3KV + 3F) and the ids (3). */
    size_t full = qrl_model_train_activation_bytes(tr[0]),
           rc = qrl_model_train_activation_bytes(tr[1]), L = (size_t)c->n_layers,
           lf = layer_floats(c), D = (size_t)c->dim, V = (size_t)c->vocab_size,
           F = (size_t)c->hidden_dim, hd = (size_t)c->head_dim, Q = (size_t)c->n_heads * hd,
           KV = (size_t)c->n_kv_heads * hd;
    size_t S = D + D + V + 3 + hd + 3 * D + 3 * Q + 3 * KV + 3 * F + 3;
    size_t expect_full = (L * lf + S) * CAP * sizeof(float),
           expect_rc = (L * D + lf - D + S) * CAP * sizeof(float);
    cr_expect_eq(full, expect_full, "%s: %zu bytes without recomputation, formula %zu", name,
                 full, expect_full);
    cr_expect_eq(rc, expect_rc, "%s: %zu bytes with recomputation, formula %zu", name, rc,
                 expect_rc);
    cr_expect_eq(full - rc, (L - 1) * (lf - D) * CAP * sizeof(float), "%s: saved %zu bytes",
                 name, full - rc);
    cr_expect(L > 1 ? rc < full : rc == full, "%s: %zu bytes with, %zu without", name, rc,
              full);
    /* the saved activations alone (layers, final x and head), without scratch and ids */
    size_t keep = D + D + V + 3;
    double pred = (double)(L * D + lf - D + keep) / (double)(L * lf + keep),
           meas = (double)rc / (double)full;
    fprintf(stderr, "model_train_recompute %-12s L=%zu D=%zu F=%d max_tokens=%d: activation "
            "bytes %zu -> %zu (%.3f; saved activations alone %.3f); logp/ent/logits/%zu grads "
            "bit-identical\n", name, L, D, c->hidden_dim, CAP, full, rc, meas, pred, n);
    qrl_model_train_destroy(tr[0]);
    qrl_model_train_destroy(tr[1]);
}

Test(model_train_recompute, stories260k_bit_identical_and_smaller) {
    char bin[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin))
        cr_skip_test("stories260K not found at %s", bin);
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->cfg.rope.layout, QRL_ROPE_LAYOUT_INTERLEAVED);
    cr_assert(m->cfg.n_layers >= 3, "stories260K has %d layers", m->cfg.n_layers);
    check_model(m, "stories260K");
    qrl_model_free(m);
}

Test(model_train_recompute, hf_fixtures_bit_identical_and_smaller) {
    DIR *d = opendir("tests/fixtures/hf");
    if (!d) cr_skip_test("tests/fixtures/hf not found (run from the repo root)");
    int done = 0, qk_norm = 0, bias = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512];
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", e->d_name);
        qrl_model *m;
        qrl_error err;
        cr_assert_eq(qrl_model_load_hf(dir, &m, &err), QRL_OK, "%s", err.msg);
        qk_norm += m->cfg.qk_norm;
        bias += m->layers[0].bq != NULL;
        check_model(m, e->d_name);
        qrl_model_free(m);
        done++;
    }
    closedir(d);
    cr_assert(done >= 5, "only %d HF fixtures found", done);
    cr_assert(qk_norm > 0 && bias > 0, "fixtures lack q/k norm (%d) or q/k/v bias (%d)",
              qk_norm, bias);
}

/* One layer: nothing to drop (the single set is the shared one), same results. */
Test(model_train_recompute, one_layer_model_same_bytes) {
    const char *json =
        "{\"model_type\": \"llama\", \"hidden_size\": 16, \"intermediate_size\": 24,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 19, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5}";
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(json, strlen(json), "cfg", &cfg, &err), QRL_OK, "%s",
                 err.msg);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 5);
    check_model(m, "tiny-1-layer");
    qrl_model_train_opts o = {.max_tokens = 0, .recompute_activations = true};
    qrl_model_train_t *tr = (qrl_model_train_t *)&o; /* must be reset to NULL on error */
    cr_assert_eq(qrl_model_train_new_opts(m, &o, &tr, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_null(tr);
    cr_assert(strstr(err.msg, "max_tokens 0"), "%s", err.msg);
    qrl_model_free(m);
}
