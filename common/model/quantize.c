/* Rollout precision of a model (qrl_model_quantize) and UAQ (qrl_model_apply_uaq /
 * qrl_model_undo_uaq); SPEC §3, docs/formats.md, docs/uaq.md. */
#include <math.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "model/model.h"

#define STORAGE_ALIGN 64

/* Master weight, bias and shape of linear `slot` of layer l. */
static void linear_source(const qrl_model *m, int l, int slot, const float **w, const float **b,
                          int *n_out, int *n_in) {
    const qrl_model_config *c = &m->cfg;
    const qrl_layer_weights *lw = &m->layers[l];
    int D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim,
        F = c->hidden_dim;
    switch (slot) {
    case QRL_LINEAR_Q: *w = lw->wq, *b = lw->bq, *n_out = Q, *n_in = D; break;
    case QRL_LINEAR_K: *w = lw->wk, *b = lw->bk, *n_out = KV, *n_in = D; break;
    case QRL_LINEAR_V: *w = lw->wv, *b = lw->bv, *n_out = KV, *n_in = D; break;
    case QRL_LINEAR_O: *w = lw->wo, *b = lw->bo, *n_out = D, *n_in = Q; break;
    case QRL_LINEAR_GATE: *w = lw->w_gate, *b = NULL, *n_out = F, *n_in = D; break;
    case QRL_LINEAR_UP: *w = lw->w_up, *b = NULL, *n_out = F, *n_in = D; break;
    default: *w = lw->w_down, *b = NULL, *n_out = D, *n_in = F; break;
    }
}

static size_t round_up(size_t n) { return (n + STORAGE_ALIGN - 1) / STORAGE_ALIGN * STORAGE_ALIGN; }

qrl_status qrl_model_quantize(qrl_model *m, qrl_precision p, qrl_error *err) {
    if ((unsigned)p >= QRL_PRECISION_COUNT_)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "model: bad precision %d", (int)p);
    int L = m->cfg.n_layers;
    size_t total = 0;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < QRL_LINEAR_SLOTS; s++) {
            const float *w, *b;
            int n, k;
            linear_source(m, l, s, &w, &b, &n, &k);
            if (p == QRL_PRECISION_W8A8_INT8 && k > QRL_INT8_GEMM_MAX_K)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "model: w8a8-int8 needs every linear's input width <= %d; "
                                     "layer %d has %d",
                                     QRL_INT8_GEMM_MAX_K, l, k);
            total += round_up(qrl_linear_storage_bytes(p, n, k));
        }
    void *storage = NULL;
    if (total > 0) QRL_TRY(qrl_alloc_aligned(total, STORAGE_ALIGN, &storage, err));
    if (p == QRL_PRECISION_BF16) qrl_model_round_bf16(m);
    /* every linear quantizes into its own part of the storage: in parallel (a 1.7B model's
     * FP8 / NVFP4 codes took ~50-60 s on one thread at a replica's start and on every host
     * weight swap); the bytes do not depend on the thread count */
    int nl = L * QRL_LINEAR_SLOTS;
    size_t *offs = malloc(((size_t)nl + 1) * sizeof *offs);
    if (!offs) {
        qrl_free_aligned(storage);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "model: quantization offsets");
    }
    offs[0] = 0;
    for (int i = 0; i < nl; i++) {
        const float *w, *b;
        int n, k;
        linear_source(m, i / QRL_LINEAR_SLOTS, i % QRL_LINEAR_SLOTS, &w, &b, &n, &k);
        offs[i + 1] = offs[i] + round_up(qrl_linear_storage_bytes(p, n, k));
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nl; i++) {
        const float *w, *b;
        int n, k;
        linear_source(m, i / QRL_LINEAR_SLOTS, i % QRL_LINEAR_SLOTS, &w, &b, &n, &k);
        size_t bytes = qrl_linear_storage_bytes(p, n, k);
        /* shapes come from a validated config and storage is sized above: cannot fail */
        qrl_status st = qrl_linear_init(&m->linears[i], p, w, b, n, k,
                                        bytes ? (unsigned char *)storage + offs[i] : NULL, NULL);
        QRL_CHECK(st == QRL_OK);
    }
    free(offs);
    /* LM head: high precision (F32; BF16 values and BF16 inputs under bf16) */
    qrl_precision hf = p == QRL_PRECISION_BF16 ? QRL_PRECISION_BF16 : QRL_PRECISION_F32;
    qrl_status st = qrl_linear_init(&m->lm_head_linear, hf, m->lm_head, NULL, m->cfg.vocab_size,
                                    m->cfg.dim, NULL, NULL);
    QRL_CHECK(st == QRL_OK);
    qrl_free_aligned(m->quant_storage);
    m->quant_storage = storage;
    m->precision = p;
    return QRL_OK;
}

/* ---- UAQ ---------------------------------------------------------------------------- */

static void scale_by(float *x, size_t n, float s, bool multiply) {
    if (!x) return;
    for (size_t i = 0; i < n; i++) x[i] = multiply ? x[i] * s : x[i] / s;
}

/* forward = true applies s; false undoes it (every operation inverted). */
static void uaq_rescale(qrl_model *m, float s, bool forward) {
    const qrl_model_config *c = &m->cfg;
    size_t D = c->dim, Q = (size_t)c->n_heads * c->head_dim,
           KV = (size_t)c->n_kv_heads * c->head_dim, F = c->hidden_dim, V = c->vocab_size;
    bool up = forward, down = !forward; /* "multiply" flags for x s and / s */
    for (int l = 0; l < c->n_layers; l++) {
        qrl_layer_weights *w = &m->layers[l];
        scale_by(w->attn_norm, D, s, up);      /* norm gains x s */
        scale_by(w->ffn_norm, D, s, up);
        scale_by(w->wq, Q * D, s, down);       /* readers of a scaled norm / s */
        scale_by(w->wk, KV * D, s, down);
        scale_by(w->w_gate, F * D, s, down);
        /* v_proj and up_proj: / s for the norm, x s to carry o/down's input scale */
        scale_by(w->bv, KV, s, up);            /* so v = (s h)Wv + s bv = s (h Wv + bv) */
        scale_by(w->wo, D * Q, s, down);       /* input scaled by s */
        scale_by(w->w_down, D * F, s, down);
    }
    if (!c->tie_embeddings) {
        scale_by(m->final_norm, D, s, up);
        scale_by(m->lm_head, V * D, s, down);
    }
}

qrl_status qrl_model_apply_uaq(qrl_model *m, float s, qrl_error *err) {
    if (!(isfinite(s) && s > 0.0f))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "uaq: scale %g must be finite and > 0", (double)s);
    if (m->uaq_scale != 1.0f)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "uaq: already applied with s=%g (undo it first)",
                             (double)m->uaq_scale);
    if (s == 1.0f) return QRL_OK;
    uaq_rescale(m, s, true);
    m->uaq_scale = s;
    return qrl_model_quantize(m, m->precision, err);
}

qrl_status qrl_model_undo_uaq(qrl_model *m, qrl_error *err) {
    if (m->uaq_scale == 1.0f) return QRL_OK;
    uaq_rescale(m, m->uaq_scale, false);
    m->uaq_scale = 1.0f;
    return qrl_model_quantize(m, m->precision, err);
}
