/* Model arena and tensor table (llm.c's malloc_and_point_parameters), the loader
 * dispatch, and helpers that fill or round the weights. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "cpu/ops.h"

#define ARENA_ALIGN 16 /* floats: every tensor starts on a 64-byte boundary */

/* Walk the tensor list in HF order (names without a layer index use "%.0d" with 0,
 * which prints nothing).  With `m->arena == NULL` only counts (n, floats);
 * otherwise fills m->tensors and points the weights.  One function so the count and
 * the layout cannot disagree. */
static void plan(qrl_model *m, int *n_out, size_t *floats_out) {
    const qrl_model_config *c = &m->cfg;
    int64_t D = c->dim, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, F = c->hidden_dim, V = c->vocab_size;
    size_t off = 0;
    int n = 0;
#define ADD(ptr, nm_fmt, layer, d0, d1)                                                \
    do {                                                                               \
        int64_t d0_ = (d0), d1_ = (d1);                                                \
        size_t cnt_ = (size_t)d0_ * (size_t)(d1_ > 0 ? d1_ : 1);                       \
        if (m->arena) {                                                                \
            qrl_model_tensor *t_ = &m->tensors[n];                                     \
            snprintf(t_->name, sizeof t_->name, nm_fmt, layer);                        \
            t_->ndim = d1_ > 0 ? 2 : 1;                                                \
            t_->shape[0] = d0_;                                                        \
            t_->shape[1] = d1_ > 0 ? d1_ : 0;                                          \
            t_->data = m->arena + off;                                                 \
            (ptr) = t_->data;                                                          \
        }                                                                              \
        n++;                                                                           \
        off += (cnt_ + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;                   \
    } while (0)
    ADD(m->tok_embedding, "model.embed_tokens.weight%.0d", 0, V, D);
    for (int l = 0; l < c->n_layers; l++) {
        qrl_layer_weights tmp, *w = m->layers ? &m->layers[l] : &tmp;
        memset(&tmp, 0, sizeof tmp);
        ADD(w->attn_norm, "model.layers.%d.input_layernorm.weight", l, D, 0);
        ADD(w->wq, "model.layers.%d.self_attn.q_proj.weight", l, Q, D);
        if (c->qkv_bias) ADD(w->bq, "model.layers.%d.self_attn.q_proj.bias", l, Q, 0);
        ADD(w->wk, "model.layers.%d.self_attn.k_proj.weight", l, KV, D);
        if (c->qkv_bias) ADD(w->bk, "model.layers.%d.self_attn.k_proj.bias", l, KV, 0);
        ADD(w->wv, "model.layers.%d.self_attn.v_proj.weight", l, KV, D);
        if (c->qkv_bias) ADD(w->bv, "model.layers.%d.self_attn.v_proj.bias", l, KV, 0);
        ADD(w->wo, "model.layers.%d.self_attn.o_proj.weight", l, D, Q);
        if (c->o_bias) ADD(w->bo, "model.layers.%d.self_attn.o_proj.bias", l, D, 0);
        if (c->qk_norm) {
            ADD(w->q_norm, "model.layers.%d.self_attn.q_norm.weight", l, c->head_dim, 0);
            ADD(w->k_norm, "model.layers.%d.self_attn.k_norm.weight", l, c->head_dim, 0);
        }
        ADD(w->ffn_norm, "model.layers.%d.post_attention_layernorm.weight", l, D, 0);
        ADD(w->w_gate, "model.layers.%d.mlp.gate_proj.weight", l, F, D);
        ADD(w->w_up, "model.layers.%d.mlp.up_proj.weight", l, F, D);
        ADD(w->w_down, "model.layers.%d.mlp.down_proj.weight", l, D, F);
    }
    ADD(m->final_norm, "model.norm.weight%.0d", 0, D, 0);
    if (!c->tie_embeddings) ADD(m->lm_head, "lm_head.weight%.0d", 0, V, D);
    else m->lm_head = m->tok_embedding;
#undef ADD
    if (m->arena) m->rope_inv_freq = m->arena + off;
    off += (size_t)(c->head_dim / 2 + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    *n_out = n;
    *floats_out = off;
}

qrl_status qrl_model_new(const qrl_model_config *cfg, qrl_model **out, qrl_error *err) {
    *out = NULL;
    QRL_TRY(qrl_model_config_validate(cfg, "model config", err));
    qrl_model *m = calloc(1, sizeof *m);
    if (!m) return qrl_error_set(err, QRL_STATUS_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    int n;
    size_t floats;
    plan(m, &n, &floats);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    m->tensors = calloc((size_t)n, sizeof *m->tensors);
    void *arena = NULL;
    if (qrl_alloc_aligned(floats * sizeof(float), 0, &arena, NULL) == QRL_OK) m->arena = arena;
    if (!m->layers || !m->tensors || !m->arena) {
        qrl_model_free(m);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "model: cannot allocate %zu MiB of weights",
                             floats * sizeof(float) >> 20);
    }
    memset(m->arena, 0, floats * sizeof(float));
    m->arena_floats = floats;
    plan(m, &m->n_tensors, &floats);
    qrl_cpu_rope_inv_freq(m->rope_inv_freq, cfg->head_dim, &cfg->rope);
    m->uaq_scale = 1.0f;
    m->linears = calloc((size_t)cfg->n_layers * QRL_LINEAR_SLOTS, sizeof *m->linears);
    if (!m->linears) {
        qrl_model_free(m);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "model: out of memory");
    }
    qrl_status st = qrl_model_quantize(m, QRL_PRECISION_F32, NULL); /* points the linears */
    QRL_CHECK(st == QRL_OK);
    *out = m;
    return QRL_OK;
}

void qrl_model_free(qrl_model *m) {
    if (!m) return;
    qrl_free_aligned(m->arena);
    qrl_free_aligned(m->quant_storage);
    free(m->linears);
    free(m->layers);
    free(m->tensors);
    free(m);
}

static bool has_file(const char *dir, const char *name) {
    char p[4096];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p && access(p, F_OK) == 0;
}

/* A folder without config.json that is a learner checkpoint (step folder or root) or a
 * launch.sh run folder: say what to load instead of "config.json: cannot open". */
static qrl_status not_a_model_folder(const char *path, qrl_error *err) {
    if (has_file(path, "config.json")) return QRL_OK;
    if (has_file(path, "manifest.json") && has_file(path, "params.safetensors"))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: a qrl-learner checkpoint (training state, not a model folder); export it "
                             "first: qrl-learner export --checkpoint %s --out DIR, then pass DIR", path, path);
    if (has_file(path, "latest"))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: a folder of qrl-learner checkpoints, not a model folder; export the newest "
                             "first: qrl-learner export --checkpoint %s --out DIR, then pass DIR", path, path);
    if (has_file(path, "final/config.json") && has_file(path, "checkpoints"))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: a launch.sh run folder, not a model folder; its trained model is %s/final",
                             path, path);
    return QRL_OK; /* the HF loader names what is missing */
}

qrl_status qrl_model_load(const char *path, qrl_model **out, qrl_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: no such file or directory", path);
    if (S_ISDIR(sb.st_mode)) {
        QRL_TRY(not_a_model_folder(path, err));
        return qrl_model_load_hf(path, out, err);
    }
    if (!S_ISREG(sb.st_mode))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: not a regular file or a checkpoint folder", path);
    /* a file of a HuggingFace checkpoint given instead of its folder */
    size_t n = strlen(path);
    if ((n >= 12 && strcmp(path + n - 12, ".safetensors") == 0) ||
        (n >= 5 && strcmp(path + n - 5, ".json") == 0))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: this is a file of a HuggingFace checkpoint; pass its folder "
                             "(config.json + model.safetensors) as the model", path);
    return qrl_model_load_llama2c(path, out, err);
}

const qrl_model_tensor *qrl_model_find_tensor(const qrl_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

/* splitmix64: small, seedable, good enough for test weights. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double gauss(uint64_t *s) {
    double u1 = ((splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = (splitmix64(s) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void qrl_model_init_random(qrl_model *m, uint64_t seed) {
    uint64_t s = seed ^ 0x5eed5eed5eedull;
    double std = 0.02 * sqrt(768.0 / m->cfg.dim);
    for (int i = 0; i < m->n_tensors; i++) {
        qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        bool is_bias = strstr(t->name, ".bias") != NULL;
        for (size_t j = 0; j < cnt; j++) {
            if (t->ndim == 2) t->data[j] = (float)(std * gauss(&s));
            else if (is_bias) t->data[j] = (float)(0.02 * gauss(&s));
            else t->data[j] = (float)(1.0 + 0.1 * gauss(&s));
        }
    }
}

void qrl_model_round_bf16(qrl_model *m) {
    for (int i = 0; i < m->n_tensors; i++) {
        qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        for (size_t j = 0; j < cnt; j++) t->data[j] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(t->data[j]));
    }
}
