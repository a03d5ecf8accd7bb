/* The F32 forward pass against an independent float64 implementation written here from
 * the HuggingFace modeling code (full-sequence causal attention, no KV cache), on random
 * tiny models covering each family feature: GQA, tied/untied head, Qwen2 q/k/v bias,
 * Qwen3 q/k norm with head_dim != hidden/heads and o_proj bias, llama3 RoPE scaling,
 * and the interleaved (llama2.c) rotation. */
#include <criterion/criterion.h>
#include <math.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "unit/model_test_util.h"

#define REL_TOL 1e-4

static void rms_d(double *out, const double *x, const float *w, int d, double eps) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) out[i] = x[i] * inv * w[i];
}

static void lin_d(double *out, const double *x, const float *w, const float *b, int k, int m) {
    for (int j = 0; j < m; j++) {
        double s = b ? b[j] : 0;
        for (int i = 0; i < k; i++) s += (double)w[(size_t)j * k + i] * x[i];
        out[j] = s;
    }
}

/* inv_freq from the transformers formulas, in double. */
static double inv_freq_d(const qrl_model_config *c, int j) {
    double f = 1.0 / pow(c->rope.theta, 2.0 * j / c->head_dim);
    const qrl_rope_params *p = &c->rope;
    if (p->scaling == QRL_ROPE_SCALING_LLAMA3) {
        double wl = 2 * M_PI / f, lo = p->original_max_position / p->low_freq_factor,
               hi = p->original_max_position / p->high_freq_factor;
        if (wl > lo) return f / p->factor;
        if (wl < hi) return f;
        double s = (p->original_max_position / wl - p->low_freq_factor) /
                   (p->high_freq_factor - p->low_freq_factor);
        return (1 - s) * f / p->factor + s * f;
    }
    return f;
}

static void rope_d(double *x, const qrl_model_config *c, int pos) {
    int hd = c->head_dim, half = hd / 2;
    for (int j = 0; j < half; j++) {
        double a = pos * inv_freq_d(c, j), cs = cos(a), sn = sin(a);
        int i0 = c->rope.layout == QRL_ROPE_LAYOUT_HALF ? j : 2 * j;
        int i1 = c->rope.layout == QRL_ROPE_LAYOUT_HALF ? j + half : 2 * j + 1;
        double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * cs - x1 * sn;
        x[i1] = x1 * cs + x0 * sn;
    }
}

/* logits[n][V] in double. */
static double *naive_forward(const qrl_model *m, const int32_t *ids, int n) {
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->hidden_dim,
        V = c->vocab_size, Q = H * hd, KV = KVH * hd;
    double *x = calloc((size_t)n * D, sizeof(double)), *h = malloc(sizeof(double) * D);
    double *q = malloc(sizeof(double) * (size_t)n * Q), *k = malloc(sizeof(double) * (size_t)n * KV),
           *v = malloc(sizeof(double) * (size_t)n * KV), *att = malloc(sizeof(double) * Q),
           *o = malloc(sizeof(double) * D), *g = malloc(sizeof(double) * F),
           *u = malloc(sizeof(double) * F), *sc = malloc(sizeof(double) * n);
    double *logits = malloc(sizeof(double) * (size_t)n * V);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++) x[(size_t)t * D + i] = m->tok_embedding[(size_t)ids[t] * D + i];
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &m->layers[l];
        for (int t = 0; t < n; t++) {
            rms_d(h, x + (size_t)t * D, w->attn_norm, D, c->norm_eps);
            double *qt = q + (size_t)t * Q, *kt = k + (size_t)t * KV;
            lin_d(qt, h, w->wq, w->bq, D, Q);
            lin_d(kt, h, w->wk, w->bk, D, KV);
            lin_d(v + (size_t)t * KV, h, w->wv, w->bv, D, KV);
            for (int hh = 0; hh < H; hh++) {
                if (c->qk_norm) rms_d(qt + hh * hd, qt + hh * hd, w->q_norm, hd, c->norm_eps);
                rope_d(qt + hh * hd, c, t);
            }
            for (int hh = 0; hh < KVH; hh++) {
                if (c->qk_norm) rms_d(kt + hh * hd, kt + hh * hd, w->k_norm, hd, c->norm_eps);
                rope_d(kt + hh * hd, c, t);
            }
        }
        double *xn = malloc(sizeof(double) * (size_t)n * D);
        memcpy(xn, x, sizeof(double) * (size_t)n * D);
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < H; hh++) {
                int kh = hh / (H / KVH);
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += q[(size_t)t * Q + hh * hd + i] * k[(size_t)s * KV + kh * hd + i];
                    sc[s] = d / sqrt((double)hd);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / sum * v[(size_t)s * KV + kh * hd + i];
                    att[hh * hd + i] = a;
                }
            }
            lin_d(o, att, w->wo, w->bo, Q, D);
            for (int i = 0; i < D; i++) xn[(size_t)t * D + i] += o[i];
        }
        for (int t = 0; t < n; t++) {
            double *xt = xn + (size_t)t * D;
            rms_d(h, xt, w->ffn_norm, D, c->norm_eps);
            lin_d(g, h, w->w_gate, NULL, D, F);
            lin_d(u, h, w->w_up, NULL, D, F);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            lin_d(o, g, w->w_down, NULL, F, D);
            for (int i = 0; i < D; i++) xt[i] += o[i];
        }
        memcpy(x, xn, sizeof(double) * (size_t)n * D);
        free(xn);
    }
    for (int t = 0; t < n; t++) {
        rms_d(h, x + (size_t)t * D, m->final_norm, D, c->norm_eps);
        lin_d(logits + (size_t)t * V, h, m->lm_head, NULL, D, V);
    }
    free(x); free(h); free(q); free(k); free(v); free(att); free(o); free(g); free(u); free(sc);
    return logits;
}

static void check_against_naive(const char *json, qrl_rope_layout layout, int n, int max_rows,
                                qrl_kv_format fmt, double tol) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(json, strlen(json), "cfg", &cfg, &err), QRL_OK, "%s",
                 err.msg);
    cfg.rope.layout = layout;
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 42);
    int32_t ids[64];
    for (int i = 0; i < n; i++) ids[i] = (i * 7919 + 13) % cfg.vocab_size;
    double *ref = naive_forward(m, ids, n);

    qrl_kv_cache_desc d = {.n_layers = cfg.n_layers, .n_kv_heads = cfg.n_kv_heads,
                           .head_dim = cfg.head_dim, .block_size = 3, .n_blocks = 40,
                           .max_seqs = 2, .max_seq_len = 64, .format = fmt};
    qrl_kv_cache *kv;
    qrl_forward *f;
    int seq, V = cfg.vocab_size;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, max_rows, 64, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, n, logits, true, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_len(kv, seq), n);
    double md = 0, mr = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        md = fmax(md, fabs(logits[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    fprintf(stderr, "%s layout=%d kv=%s: max|diff|/max|ref| = %.3g\n", cfg.model_type, layout,
            qrl_kv_format_name(fmt), md / mr);
    cr_assert(mr > 0.1, "degenerate logits");
    cr_assert(md / mr < tol, "%s: rel err %g", cfg.model_type, md / mr);
    free(logits);
    free(ref);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    qrl_model_free(m);
}

#define BASE(mt, extra)                                                                       \
    "{\"model_type\": \"" mt "\", \"hidden_size\": 48, \"intermediate_size\": 72,"           \
    " \"num_hidden_layers\": 3, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"     \
    " \"vocab_size\": 97, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5" extra "}"

Test(model_forward, llama_gqa_tied) {
    check_against_naive(BASE("llama", ", \"tie_word_embeddings\": true"), QRL_ROPE_LAYOUT_HALF, 37,
                        5, QRL_KV_FORMAT_F32, REL_TOL);
}

Test(model_forward, llama_interleaved_rope_llama2c_style) {
    check_against_naive(BASE("llama", ""), QRL_ROPE_LAYOUT_INTERLEAVED, 29, 64, QRL_KV_FORMAT_F32,
                        REL_TOL);
}

Test(model_forward, mistral) {
    check_against_naive(BASE("mistral", ", \"sliding_window\": 4096"), QRL_ROPE_LAYOUT_HALF, 20, 7,
                        QRL_KV_FORMAT_F32, REL_TOL);
}

Test(model_forward, qwen2_qkv_bias) {
    check_against_naive(BASE("qwen2", ", \"rope_theta\": 1000000.0"), QRL_ROPE_LAYOUT_HALF, 33, 4,
                        QRL_KV_FORMAT_F32, REL_TOL);
}

Test(model_forward, qwen3_qk_norm_head_dim_o_bias) {
    check_against_naive(BASE("qwen3", ", \"head_dim\": 16, \"attention_bias\": true,"
                                      " \"tie_word_embeddings\": true"),
                        QRL_ROPE_LAYOUT_HALF, 31, 8, QRL_KV_FORMAT_F32, REL_TOL);
}

Test(model_forward, llama3_rope_scaling_transformers5_layout) {
    /* theta 10000, head_dim 8: wavelengths 6.3, 63, 628, 6283; with
     * original_max_position_embeddings 64 (bands at 16 and 64) they fall in all three
     * llama3 regimes (kept, interpolated, divided). */
    check_against_naive(BASE("llama", ", \"rope_parameters\": {\"rope_type\": \"llama3\","
                                      " \"rope_theta\": 10000.0, \"factor\": 8.0,"
                                      " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                                      " \"original_max_position_embeddings\": 64}"),
                        QRL_ROPE_LAYOUT_HALF, 41, 9, QRL_KV_FORMAT_F32, REL_TOL);
}

Test(model_forward, bf16_kv_cache_is_close) {
    /* K/V rounded to BF16 (8 significant bits): error ~1e-3 relative, bounded at 1e-2. */
    check_against_naive(BASE("llama", ""), QRL_ROPE_LAYOUT_HALF, 25, 6, QRL_KV_FORMAT_BF16, 1e-2);
}
