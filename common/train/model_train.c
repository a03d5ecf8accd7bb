/* Whole-model forward with saved activations and backward (model_train.h), composed from
 * the layer ops of kernels/cpu/train_ops.h in the order of common/model/forward.c:
 *   x = embed(tokens)
 *   per layer: h1 = rmsnorm(x); q,k,v = h1 W^T (+b); [Qwen3: head rmsnorm on q, k];
 *              rope(q, k); a = attention; x += a Wo^T (+bo);
 *              h2 = rmsnorm(x); x += (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T
 *   logits = rmsnorm(x) lm_head^T;  logp, entropy = fused log-softmax pass.
 * With activation recomputation the forward keeps only each layer's input x and writes
 * every layer into one shared set of buffers; the backward re-runs layer l's forward
 * (layer_forward, the same code as the forward: results are bit-identical) just before
 * layer l's backward. */
#include "train/model_train.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/tensor.h"
#include "cpu/quant.h"
#include "cpu/train_ops.h"

/* Activations of one layer, each [max_tokens, width] (its input x is in xs[]). */
typedef struct layer_act {
    float *h1, *rstd1;
    float *q, *k, *v; /* projections (+bias), before q/k norm and rope */
    float *qn, *kn, *rstd_q, *rstd_k; /* after head rmsnorm (qk_norm only) */
    float *qr, *kr;   /* after rope: what attention reads */
    float *att, *lse; /* attention output [T, Q], row lse [H, T] */
    float *x_mid;     /* [T, D] after the attention residual */
    float *h2, *rstd2;
    float *gate, *up, *hm; /* [T, F] */
    /* QAT: fake-quantized inputs of the projections and attention (aliases of the
     * unquantized buffers when that site is not quantized) */
    float *h1q, *krq, *vq, *attq, *h2q, *hmq;
} layer_act;

struct qrl_model_train {
    qrl_model *m;
    int max_T;
    bool recompute;    /* one shared layer_act, refilled by the backward */
    size_t n_params;
    size_t block_floats;
    float *grads;      /* arena_floats, same layout as m->arena */
    float *block;      /* every activation and scratch buffer below */
    float **xs;        /* [n_layers + 1] residual stream entering layer l; [n_layers] = final */
    layer_act *layers; /* [n_layers], or [1] (shared) with recompute */
    float *hf, *rstdf, *logits, *lse_v, *ent;
    float *cos_t, *sin_t;
    /* backward scratch */
    float *ao, *dres, *dh, *dq, *dk, *dv, *dqn, *dkn, *datt, *dgate, *dup, *dhm;
    int32_t *tokens, *targets, *seg;
    int T;            /* tokens of the saved forward; 0 = none */
    /* QAT (model_train.h): fake-quantized weights at the master weights' offsets, weight
     * quantization scratch, the attached records per packed position, counters */
    qrl_model_train_opts o;
    float *wfq;
    uint8_t *wq_codes, *wq_scales;
    const qrl_trace_response **g_rec; /* [max_T] */
    uint32_t *g_tok;                  /* [max_T] */
    bool counting;                    /* the forward counts; the backward's recompute not */
    bool qat_bf16;                    /* qat_set_bf16: the replicas run the BF16 stream */
    qrl_qat_stats qs;
};

static qrl_status qat_alloc(qrl_model_train_t *tr, qrl_error *err);

/* ---- RoPE in both layouts ------------------------------------------------------------------ */

/* llama2.c / Meta layout: pairs (2j, 2j + 1) (qrl_cpu_rope_apply INTERLEAVED). */
static void rope_interleaved(float *y, const float *x, const float *cos_t, const float *sin_t,
                             int T, int nh, int hd, bool inverse) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
            const float *xh = x + ((size_t)t * nh + h) * hd;
            float *yh = y + ((size_t)t * nh + h) * hd;
            for (int j = 0; j < half; j++) {
                float x0 = xh[2 * j], x1 = xh[2 * j + 1], sn = inverse ? -s[j] : s[j];
                if (inverse) { /* backward: dx += R(-angle) dy */
                    yh[2 * j] += x0 * c[j] - x1 * sn;
                    yh[2 * j + 1] += x0 * sn + x1 * c[j];
                } else {
                    yh[2 * j] = x0 * c[j] - x1 * sn;
                    yh[2 * j + 1] = x0 * sn + x1 * c[j];
                }
            }
        }
}

static void rope_fwd(const qrl_model_train_t *tr, float *y, const float *x, int T, int nh) {
    int hd = tr->m->cfg.head_dim;
    if (tr->m->cfg.rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED)
        rope_interleaved(y, x, tr->cos_t, tr->sin_t, T, nh, hd, false);
    else
        qrl_train_rope_forward(y, x, tr->cos_t, tr->sin_t, T, nh, hd);
}

static void rope_bwd(const qrl_model_train_t *tr, float *dx, const float *dy, int T, int nh) {
    int hd = tr->m->cfg.head_dim;
    if (tr->m->cfg.rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED)
        rope_interleaved(dx, dy, tr->cos_t, tr->sin_t, T, nh, hd, true);
    else
        qrl_train_rope_backward(dx, dy, tr->cos_t, tr->sin_t, T, nh, hd);
}

/* ---- allocation -------------------------------------------------------------------------- */

#define ALIGN_FLOATS 16

/* Carve `n` floats from the block at *off (counting only when base is NULL). */
static float *carve(float *base, size_t *off, size_t n) {
    float *p = base ? base + *off : NULL;
    *off += (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    return p;
}

/* Layer sets of activations: one per layer, or one shared with recomputation. */
static int n_layer_sets(const qrl_model_train_t *tr) {
    int L = tr->m->cfg.n_layers;
    return tr->recompute && L > 0 ? 1 : L;
}

/* One walk for counting (b == NULL) and pointing, so the two cannot disagree.  The tables
 * tr->xs and tr->layers exist in both walks (they receive NULLs when counting). */
static size_t plan(qrl_model_train_t *tr, float *b) {
    const qrl_model_config *c = &tr->m->cfg;
    size_t T = (size_t)tr->max_T, D = (size_t)c->dim, F = (size_t)c->hidden_dim,
           H = (size_t)c->n_heads, Hkv = (size_t)c->n_kv_heads, hd = (size_t)c->head_dim,
           V = (size_t)c->vocab_size, Q = H * hd, KV = Hkv * hd, off = 0;
    for (int l = 0; l <= c->n_layers; l++) tr->xs[l] = carve(b, &off, T * D);
    for (int l = 0; l < n_layer_sets(tr); l++) {
        layer_act *a = &tr->layers[l];
        a->h1 = carve(b, &off, T * D), a->rstd1 = carve(b, &off, T);
        a->q = carve(b, &off, T * Q), a->k = carve(b, &off, T * KV), a->v = carve(b, &off, T * KV);
        if (c->qk_norm) {
            a->qn = carve(b, &off, T * Q), a->kn = carve(b, &off, T * KV);
            a->rstd_q = carve(b, &off, T * H), a->rstd_k = carve(b, &off, T * Hkv);
        } else {
            a->qn = a->q, a->kn = a->k, a->rstd_q = a->rstd_k = NULL;
        }
        a->qr = carve(b, &off, T * Q), a->kr = carve(b, &off, T * KV);
        a->att = carve(b, &off, T * Q), a->lse = carve(b, &off, H * T);
        a->x_mid = carve(b, &off, T * D);
        a->h2 = carve(b, &off, T * D), a->rstd2 = carve(b, &off, T);
        a->gate = carve(b, &off, T * F), a->up = carve(b, &off, T * F);
        a->hm = carve(b, &off, T * F);
        bool act = tr->o.qat != QRL_QAT_OFF && !tr->o.qat_weights_only;
        bool kv = tr->o.qat != QRL_QAT_OFF && tr->o.qat_kv;
        a->h1q = act ? carve(b, &off, T * D) : a->h1;
        a->attq = act ? carve(b, &off, T * Q) : a->att;
        a->h2q = act ? carve(b, &off, T * D) : a->h2;
        a->hmq = act ? carve(b, &off, T * F) : a->hm;
        a->krq = kv ? carve(b, &off, T * KV) : a->kr;
        a->vq = kv ? carve(b, &off, T * KV) : a->v;
    }
    tr->hf = carve(b, &off, T * D);
    tr->rstdf = carve(b, &off, T), tr->logits = carve(b, &off, T * V);
    tr->lse_v = carve(b, &off, T), tr->ent = carve(b, &off, T);
    tr->cos_t = carve(b, &off, T * hd / 2), tr->sin_t = carve(b, &off, T * hd / 2);
    tr->ao = carve(b, &off, T * D), tr->dres = carve(b, &off, T * D);
    tr->dh = carve(b, &off, T * D);
    tr->dq = carve(b, &off, T * Q), tr->dk = carve(b, &off, T * KV);
    tr->dv = carve(b, &off, T * KV);
    tr->dqn = carve(b, &off, T * Q), tr->dkn = carve(b, &off, T * KV);
    tr->datt = carve(b, &off, T * Q);
    tr->dgate = carve(b, &off, T * F), tr->dup = carve(b, &off, T * F);
    tr->dhm = carve(b, &off, T * F);
    /* int32 arrays share the float block (same size, 4 bytes) */
    tr->tokens = (int32_t *)carve(b, &off, T);
    tr->targets = (int32_t *)carve(b, &off, T);
    tr->seg = (int32_t *)carve(b, &off, T);
    return off;
}

qrl_status qrl_model_train_new_opts(qrl_model *m, const qrl_model_train_opts *o,
                                    qrl_model_train_t **out, qrl_error *err) {
    *out = NULL;
    if (o->max_tokens <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "model_train: max_tokens %d <= 0",
                             o->max_tokens);
    if ((unsigned)o->qat > QRL_QAT_NVFP4 ||
        (o->qat == QRL_QAT_OFF && (o->trace_guidance || o->qat_kv || o->qat_weights_only)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "model_train: qat %d with trace_guidance=%d qat_kv=%d "
                             "qat_weights_only=%d (those need qat nvfp4)", (int)o->qat,
                             o->trace_guidance, o->qat_kv, o->qat_weights_only);
    qrl_model_train_t *tr = calloc(1, sizeof *tr);
    if (!tr) return qrl_error_set(err, QRL_STATUS_NOMEM, "model_train: engine struct");
    tr->o = *o;
    tr->m = m;
    tr->max_T = o->max_tokens;
    tr->recompute = o->recompute_activations;
    tr->n_params = qrl_model_param_count(m);
    tr->xs = calloc((size_t)m->cfg.n_layers + 1, sizeof *tr->xs);
    tr->layers = calloc((size_t)n_layer_sets(tr) + 1, sizeof *tr->layers);
    void *blk = NULL, *g = NULL;
    qrl_status st = QRL_OK;
    if (!tr->xs || !tr->layers) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "model_train: layer tables");
        goto fail;
    }
    tr->block_floats = plan(tr, NULL);
    QRL_TRY_GOTO(qrl_alloc_aligned(tr->block_floats * sizeof(float), 0, &blk, err), fail);
    tr->block = blk;
    QRL_TRY_GOTO(qrl_alloc_aligned(m->arena_floats * sizeof(float), 0, &g, err), fail);
    tr->grads = g;
    memset(tr->block, 0, tr->block_floats * sizeof(float));
    memset(tr->grads, 0, m->arena_floats * sizeof(float));
    plan(tr, tr->block);
    if (o->qat != QRL_QAT_OFF) QRL_TRY_GOTO(qat_alloc(tr, err), fail);
    *out = tr;
    return QRL_OK;
fail:
    qrl_model_train_destroy(tr);
    return st;
}

qrl_status qrl_model_train_new(qrl_model *m, int max_tokens, qrl_model_train_t **out,
                               qrl_error *err) {
    qrl_model_train_opts o = {.max_tokens = max_tokens, .recompute_activations = false};
    return qrl_model_train_new_opts(m, &o, out, err);
}

size_t qrl_model_train_activation_bytes(const qrl_model_train_t *tr) {
    return tr->block_floats * sizeof(float);
}

void qrl_model_train_destroy(qrl_model_train_t *tr) {
    if (!tr) return;
    qrl_free_aligned(tr->block);
    qrl_free_aligned(tr->grads);
    qrl_free_aligned(tr->wfq);
    free(tr->wq_codes);
    free(tr->wq_scales);
    free(tr->g_rec);
    free(tr->g_tok);
    free(tr->xs);
    free(tr->layers);
    free(tr);
}

float *qrl_model_train_params(qrl_model_train_t *tr, size_t *n) {
    if (n) *n = tr->n_params;
    return tr->m->arena;
}

float *qrl_model_train_grads(qrl_model_train_t *tr, size_t *n) {
    if (n) *n = tr->n_params;
    return tr->grads;
}

float *qrl_model_train_grad_of(qrl_model_train_t *tr, const qrl_model_tensor *t) {
    QRL_CHECK(t->data >= tr->m->arena && t->data < tr->m->arena + tr->n_params);
    return tr->grads + (t->data - tr->m->arena);
}

/* Gradient twin of a weight pointer (NULL stays NULL: no bias, no q/k norm). */
static float *gtwin(const qrl_model_train_t *tr, const float *w) {
    return w ? tr->grads + (w - tr->m->arena) : NULL;
}

void qrl_model_train_zero_grad(qrl_model_train_t *tr) {
    memset(tr->grads, 0, tr->n_params * sizeof(float));
}

void qrl_model_train_positions(int32_t *pos, const int32_t *seg, int T) {
    for (int t = 0; t < T; t++) pos[t] = (t > 0 && seg[t] == seg[t - 1]) ? pos[t - 1] + 1 : 0;
}

const float *qrl_model_train_logits(const qrl_model_train_t *tr) {
    return tr->T > 0 ? tr->logits : NULL;
}

/* ---- QAT (model_train.h) ------------------------------------------------------------------ */

/* The parameter the forward computes with: under QAT its copy in wfq (projections
 * fake-quantized, every other parameter rounded to BF16, as a replica receives it), else
 * the master itself.  NULL (an absent bias) stays NULL. */
static const float *WQ(const qrl_model_train_t *tr, const float *w) {
    return tr->wfq && w ? tr->wfq + (w - tr->m->arena) : w;
}

static qrl_status qat_alloc(qrl_model_train_t *tr, qrl_error *err) {
    const qrl_model_config *c = &tr->m->cfg;
    int64_t D = c->dim, F = c->hidden_dim, Q = (int64_t)c->n_heads * c->head_dim;
    int64_t big = (F > Q ? F : Q) * (D > Q ? D : Q); /* largest projection, rows x cols */
    int64_t cols = D > Q ? (D > F ? D : F) : (Q > F ? Q : F);
    void *w = NULL;
    QRL_TRY(qrl_alloc_aligned(tr->m->arena_floats * sizeof(float), 0, &w, err));
    tr->wfq = w;
    memcpy(tr->wfq, tr->m->arena, tr->m->arena_floats * sizeof(float));
    tr->wq_codes = malloc((size_t)(big / 2 + cols));
    tr->wq_scales = malloc((size_t)(big / QRL_NVFP4_BLOCK + cols));
    tr->g_rec = calloc((size_t)tr->max_T, sizeof *tr->g_rec);
    tr->g_tok = calloc((size_t)tr->max_T, sizeof *tr->g_tok);
    if (!tr->wq_codes || !tr->wq_scales || !tr->g_rec || !tr->g_tok)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "model_train: QAT buffers");
    return QRL_OK;
}

void qrl_model_train_qat_weight(const float *w, int rows, int cols, uint8_t *codes,
                                uint8_t *scales, float *y) {
    float genc;
    qrl_nvfp4 q = {.rows = rows, .cols = cols, .codes = codes, .scales = scales,
                   .global_enc = &genc, .per_row = false};
    qrl_status st = qrl_nvfp4_quantize(w, &q, NULL);
    QRL_CHECK(st == QRL_OK);
    qrl_nvfp4_dequantize(&q, y);
}

/* The replica's copy of the master weights (they change at every optimizer step): every
 * parameter as is, or rounded to BF16 with qat_set_bf16 (a broadcast version: the weight
 * stream is BF16, so such a replica decodes nvfp4(bf16(w)); the rounding flips enough
 * FP4 codes to make the two forwards differ by nats), then every projection
 * fake-quantized from that value as qrl_model_quantize quantizes it. */
static void qat_weights(qrl_model_train_t *tr) {
    const qrl_model_config *c = &tr->m->cfg;
    const float *a = tr->m->arena;
    size_t n = qrl_model_param_count(tr->m); /* the tensors; rope_inv_freq is not streamed */
    if (tr->qat_bf16)
        for (size_t k = 0; k < n; k++) tr->wfq[k] = qrl_bf16_to_f32(qrl_f32_to_bf16(a[k]));
    else
        memcpy(tr->wfq, a, n * sizeof *a);
    int D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim,
        KV = c->n_kv_heads * c->head_dim;
    /* Version 0 under UAQ: the replicas quantize the unscaled checkpoint W, the masters
     * hold W/s (q, k, o, gate, down; v and up are unscaled, docs/uaq.md).  nvfp4(W/s) is
     * nvfp4(W)/s except where W sits exactly on an FP4 rounding midpoint, common in
     * BF16-valued checkpoints (0.1-0.4% of the codes of qrl-task init-model's qwen3-tiny):
     * there the F32 rounding of W/s picks a side that round-half-even on W need not, and
     * update 1 trained against another policy (bench/e2e.sh fp4+trace: disagree share 0.08,
     * |lp_prox - lp_behav| 0.04; now 1e-7).  So quantize (W/s)*s, which is W again for
     * BF16-valued W at s = 1.5 (docs/uaq.md; not for every s), within 1 ulp otherwise, and
     * divide the dequantized value by s (model_train_cuda.c's qat_weights does the same). */
    float us = tr->qat_bf16 ? 1.0f : tr->m->uaq_scale;
    static const bool scaled[7] = {true, true, false, true, true, false, true};
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &tr->m->layers[l];
        const float *ws[7] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
        int rows[7] = {Q, KV, KV, D, F, F, D}, cols[7] = {D, D, D, Q, D, D, F};
        for (int i = 0; i < 7; i++) {
            float *y = (float *)WQ(tr, ws[i]), f = scaled[i] ? us : 1.0f;
            size_t n = (size_t)rows[i] * (size_t)cols[i];
            if (f != 1.0f)
                for (size_t k = 0; k < n; k++) y[k] *= f;
            qrl_model_train_qat_weight(y, rows[i], cols[i], tr->wq_codes, tr->wq_scales, y);
            if (f != 1.0f)
                for (size_t k = 0; k < n; k++) y[k] /= f;
        }
    }
}

bool qrl_model_train_qat_quantize_row(const qrl_trace_response *rec, uint32_t token, int layer,
                                      qrl_trace_site_kind kind, int head, const float *x,
                                      uint32_t n, float *y, uint8_t *codes, uint64_t *disagree) {
    qrl_trace_entry e;
    if (rec && qrl_trace_response_entry(rec, token, layer, kind, head, &e) && e.len == n) {
        /* The tensor scale from this vector's own amax, the block scales and bits from the
         * record: the learner's vector may be a multiple of the rollout's (UAQ: the norm
         * outputs and the o/down inputs are s times a replica's that decodes the unscaled
         * checkpoint, version 0), and the E4M3 block scales are relative to the tensor
         * scale, so the same codes come out.  With identical inputs it is the recorded
         * scale exactly (the same amax, the same function). */
        e.global_enc = qrl_nvfp4_global_enc(qrl_quant_absmax(x, n, NULL));
        uint64_t d = 0;
        qrl_trace_guided_quantize(x, &e, codes, y, &d);
        if (disagree) *disagree += d;
        return true;
    }
    qrl_nvfp4_fake_quantize_row(x, n, y);
    return false;
}

/* Site (l, kind) of T rows of `width` floats, `heads` vectors per row: x -> y (nothing
 * when y aliases x: the site is not quantized). */
static void fq_act(qrl_model_train_t *tr, int l, qrl_trace_site_kind kind, const float *x,
                   float *y, int T, int width, int heads) {
    if (y == x) return;
    uint32_t len = (uint32_t)(width / heads);
    uint64_t guided = 0, nearest = 0, dis = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            size_t off = (size_t)t * width + (size_t)h * len;
            bool g = qrl_model_train_qat_quantize_row(tr->g_rec[t], tr->g_tok[t], l, kind, h,
                                                      x + off, len, y + off, NULL, &dis);
            *(g ? &guided : &nearest) += len;
        }
    if (tr->counting) {
        tr->qs.elements_guided += guided;
        tr->qs.elements_nearest += nearest;
        tr->qs.disagree += dis;
    }
}

void qrl_model_train_qat_set_bf16(qrl_model_train_t *tr, bool on) { tr->qat_bf16 = on; }

void qrl_model_train_qat_clear(qrl_model_train_t *tr) {
    if (tr->g_rec) memset(tr->g_rec, 0, (size_t)tr->max_T * sizeof *tr->g_rec);
}

qrl_status qrl_model_train_qat_attach(qrl_model_train_t *tr, int seq_begin, int n_prompt,
                                      int n_response, const qrl_trace_response *rec,
                                      qrl_error *err) {
    int t0 = seq_begin + n_prompt - 1;
    if (seq_begin < 0 || n_prompt < 1 || n_response < 0 ||
        (int64_t)seq_begin + n_prompt + n_response > tr->max_T)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "model_train: attach of a sequence at %d (prompt %d, response %d) "
                             "outside the row of %d tokens", seq_begin, n_prompt, n_response,
                             tr->max_T);
    bool ok = tr->g_rec && tr->o.trace_guidance && rec &&
              qrl_trace_response_n_tokens(rec) == (uint32_t)n_response;
    for (int k = 0; k < n_response; k++) {
        if (tr->g_rec) tr->g_rec[t0 + k] = ok ? rec : NULL;
        if (tr->g_tok) tr->g_tok[t0 + k] = (uint32_t)k;
    }
    *(ok ? &tr->qs.rows_guided : &tr->qs.rows_unguided) += 1;
    return QRL_OK;
}

void qrl_model_train_qat_stats(const qrl_model_train_t *tr, qrl_qat_stats *out) {
    *out = tr->qs;
}

void qrl_model_train_qat_stats_reset(qrl_model_train_t *tr) { memset(&tr->qs, 0, sizeof tr->qs); }

/* ---- forward ----------------------------------------------------------------------------- */

/* Activations of layer l: its own set, or the shared one with recomputation. */
static layer_act *act_of(const qrl_model_train_t *tr, int l) {
    return &tr->layers[tr->recompute ? 0 : l];
}

/* Layer l's forward over T tokens from x_in into a (tr->cos_t, sin_t and seg of the
 * current batch).  The one composition of the layer ops: the forward and the backward's
 * recomputation both call it, so the two cannot diverge.  x_out NULL (recomputation)
 * stops after the MLP's hidden activation: the backward needs nothing past it. */
static void layer_forward(qrl_model_train_t *tr, int l, layer_act *a, const float *x_in,
                          float *x_out, int T) {
    const qrl_model_config *c = &tr->m->cfg;
    const qrl_layer_weights *w = &tr->m->layers[l];
    const int D = c->dim, F = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads,
              hd = c->head_dim, Q = H * hd, KV = Hkv * hd;
    qrl_train_rmsnorm_forward(a->h1, a->rstd1, x_in, WQ(tr, w->attn_norm), T, D, c->norm_eps);
    fq_act(tr, l, QRL_TRACE_SITE_ATTN_IN, a->h1, a->h1q, T, D, 1);
    qrl_train_matmul_forward(a->q, a->h1q, WQ(tr, w->wq), WQ(tr, w->bq), T, D, Q);
    qrl_train_matmul_forward(a->k, a->h1q, WQ(tr, w->wk), WQ(tr, w->bk), T, D, KV);
    qrl_train_matmul_forward(a->v, a->h1q, WQ(tr, w->wv), WQ(tr, w->bv), T, D, KV);
    if (c->qk_norm) {
        qrl_train_head_rmsnorm_forward(a->qn, a->rstd_q, a->q, WQ(tr, w->q_norm), T, H, hd,
                                       c->norm_eps);
        qrl_train_head_rmsnorm_forward(a->kn, a->rstd_k, a->k, WQ(tr, w->k_norm), T, Hkv, hd,
                                       c->norm_eps);
    }
    rope_fwd(tr, a->qr, a->qn, T, H);
    rope_fwd(tr, a->kr, a->kn, T, Hkv);
    fq_act(tr, l, QRL_TRACE_SITE_K, a->kr, a->krq, T, KV, Hkv);
    fq_act(tr, l, QRL_TRACE_SITE_V, a->v, a->vq, T, KV, Hkv);
    qrl_train_attention_forward(a->att, a->lse, a->qr, a->krq, a->vq, tr->seg, T, H, Hkv, hd);
    fq_act(tr, l, QRL_TRACE_SITE_ATTN_OUT, a->att, a->attq, T, Q, 1);
    qrl_train_matmul_forward(tr->ao, a->attq, WQ(tr, w->wo), WQ(tr, w->bo), T, Q, D);
    qrl_train_residual_forward(a->x_mid, x_in, tr->ao, (int64_t)T * D);
    qrl_train_rmsnorm_forward(a->h2, a->rstd2, a->x_mid, WQ(tr, w->ffn_norm), T, D, c->norm_eps);
    fq_act(tr, l, QRL_TRACE_SITE_MLP_IN, a->h2, a->h2q, T, D, 1);
    qrl_train_matmul_forward(a->gate, a->h2q, WQ(tr, w->w_gate), NULL, T, D, F);
    qrl_train_matmul_forward(a->up, a->h2q, WQ(tr, w->w_up), NULL, T, D, F);
    qrl_train_swiglu_forward(a->hm, a->gate, a->up, (int64_t)T * F);
    fq_act(tr, l, QRL_TRACE_SITE_MLP_DOWN, a->hm, a->hmq, T, F, 1);
    if (!x_out) return;
    qrl_train_matmul_forward(tr->ao, a->hmq, WQ(tr, w->w_down), NULL, T, F, D);
    qrl_train_residual_forward(x_out, a->x_mid, tr->ao, (int64_t)T * D);
}

qrl_status qrl_model_train_forward(qrl_model_train_t *tr, const int32_t *tokens,
                                   const int32_t *targets, const int32_t *pos,
                                   const int32_t *seg, int T, float *logp, float *ent,
                                   qrl_error *err) {
    const qrl_model *m = tr->m;
    const qrl_model_config *c = &m->cfg;
    const int D = c->dim, L = c->n_layers, hd = c->head_dim, V = c->vocab_size;
    tr->T = 0;
    if (T <= 0 || T > tr->max_T)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "model_train: batch of %d tokens outside [1, max_tokens %d]", T,
                             tr->max_T);
    for (int t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= c->max_seq_len)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "model_train: position id %d at t=%d outside [0, %d)", pos[t],
                                 t, c->max_seq_len);
    memcpy(tr->tokens, tokens, (size_t)T * sizeof *tokens);
    memcpy(tr->targets, targets, (size_t)T * sizeof *targets);
    memcpy(tr->seg, seg, (size_t)T * sizeof *seg);
    if (tr->wfq) qat_weights(tr); /* first: the embedding is read from it too */
    QRL_TRY(qrl_train_embedding_forward(tr->xs[0], tokens, WQ(tr, m->tok_embedding), T, V, D, err));
    qrl_train_rope_cos_sin(tr->cos_t, tr->sin_t, pos, m->rope_inv_freq, T, hd);
    tr->counting = true;
    for (int l = 0; l < L; l++) layer_forward(tr, l, act_of(tr, l), tr->xs[l], tr->xs[l + 1], T);
    tr->counting = false;
    qrl_train_rmsnorm_forward(tr->hf, tr->rstdf, tr->xs[L], WQ(tr, m->final_norm), T, D, c->norm_eps);
    qrl_train_matmul_forward(tr->logits, tr->hf, WQ(tr, m->lm_head), NULL, T, D, V);
    float *lp = logp ? logp : tr->dh; /* dh is free scratch until the backward */
    QRL_TRY(qrl_train_logprob_forward(lp, tr->ent, tr->lse_v, tr->logits, targets, T, V, err));
    if (ent) memcpy(ent, tr->ent, (size_t)T * sizeof *ent);
    tr->T = T;
    return QRL_OK;
}

/* ---- backward ---------------------------------------------------------------------------- */

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof *p); }

qrl_status qrl_model_train_backward(qrl_model_train_t *tr, const float *dlogp,
                                    const float *dent, qrl_error *err) {
    if (tr->T <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "model_train: backward without a forward (each forward allows "
                             "one backward)");
    const qrl_model *m = tr->m;
    const qrl_model_config *c = &m->cfg;
    const int T = tr->T, D = c->dim, F = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads,
              hd = c->head_dim, V = c->vocab_size, Q = H * hd, KV = Hkv * hd;
    const size_t TD = (size_t)T * D, TF = (size_t)T * F, TQ = (size_t)T * Q,
                 TKV = (size_t)T * KV;
    tr->T = 0; /* the logits become their gradient: this forward is consumed */

    /* head: dlogits in place, then lm_head (tied: its twin is the embedding's gradient) */
    qrl_train_logprob_backward(tr->logits, tr->logits, tr->targets, tr->lse_v, tr->ent, dlogp,
                               dent, T, V);
    zero(tr->dh, TD);
    qrl_train_matmul_backward(tr->dh, gtwin(tr, m->lm_head), NULL, tr->logits, tr->hf,
                              WQ(tr, m->lm_head), T, D, V);
    zero(tr->dres, TD);
    qrl_train_rmsnorm_backward(tr->dres, gtwin(tr, m->final_norm), tr->dh, tr->xs[c->n_layers],
                               WQ(tr, m->final_norm), tr->rstdf, T, D);

    /* dres holds d loss / d (residual stream) at the current point, walking back */
    for (int l = c->n_layers - 1; l >= 0; l--) {
        const qrl_layer_weights *w = &m->layers[l];
        layer_act *a = act_of(tr, l);
        /* recomputation: the shared set still holds the last layer from the forward */
        if (tr->recompute && l + 1 < c->n_layers) layer_forward(tr, l, a, tr->xs[l], NULL, T);
        /* MLP: x_out = x_mid + down(swiglu(gate(h2), up(h2))); dres passes to x_mid as is */
        zero(tr->dhm, TF);
        qrl_train_matmul_backward(tr->dhm, gtwin(tr, w->w_down), NULL, tr->dres, a->hmq,
                                  WQ(tr, w->w_down), T, F, D);
        zero(tr->dgate, TF), zero(tr->dup, TF);
        qrl_train_swiglu_backward(tr->dgate, tr->dup, tr->dhm, a->gate, a->up, (int64_t)TF);
        zero(tr->dh, TD);
        qrl_train_matmul_backward(tr->dh, gtwin(tr, w->w_gate), NULL, tr->dgate, a->h2q,
                                  WQ(tr, w->w_gate), T, D, F);
        qrl_train_matmul_backward(tr->dh, gtwin(tr, w->w_up), NULL, tr->dup, a->h2q,
                                  WQ(tr, w->w_up), T, D, F);
        qrl_train_rmsnorm_backward(tr->dres, gtwin(tr, w->ffn_norm), tr->dh, a->x_mid,
                                   WQ(tr, w->ffn_norm), a->rstd2, T, D);
        /* attention: x_mid = x_in + o(attn(rope(norm(q)), rope(norm(k)), v)) */
        zero(tr->datt, TQ);
        qrl_train_matmul_backward(tr->datt, gtwin(tr, w->wo), gtwin(tr, w->bo), tr->dres,
                                  a->attq, WQ(tr, w->wo), T, Q, D);
        zero(tr->dq, TQ), zero(tr->dk, TKV), zero(tr->dv, TKV);
        qrl_train_attention_backward(tr->dq, tr->dk, tr->dv, tr->datt, a->qr, a->krq, a->vq,
                                     a->att, a->lse, tr->seg, T, H, Hkv, hd);
        /* rope: dq holds d/d qr; its inverse rotation goes to dqn (d/d qn) */
        zero(tr->dqn, TQ), zero(tr->dkn, TKV);
        rope_bwd(tr, tr->dqn, tr->dq, T, H);
        rope_bwd(tr, tr->dkn, tr->dk, T, Hkv);
        float *dqp = tr->dqn, *dkp = tr->dkn; /* d/d (projection output) */
        if (c->qk_norm) {
            zero(tr->dq, TQ), zero(tr->dk, TKV);
            qrl_train_head_rmsnorm_backward(tr->dq, gtwin(tr, w->q_norm), tr->dqn, a->q,
                                            WQ(tr, w->q_norm), a->rstd_q, T, H, hd);
            qrl_train_head_rmsnorm_backward(tr->dk, gtwin(tr, w->k_norm), tr->dkn, a->k,
                                            WQ(tr, w->k_norm), a->rstd_k, T, Hkv, hd);
            dqp = tr->dq, dkp = tr->dk;
        }
        zero(tr->dh, TD);
        qrl_train_matmul_backward(tr->dh, gtwin(tr, w->wq), gtwin(tr, w->bq), dqp, a->h1q,
                                  WQ(tr, w->wq), T, D, Q);
        qrl_train_matmul_backward(tr->dh, gtwin(tr, w->wk), gtwin(tr, w->bk), dkp, a->h1q,
                                  WQ(tr, w->wk), T, D, KV);
        qrl_train_matmul_backward(tr->dh, gtwin(tr, w->wv), gtwin(tr, w->bv), tr->dv, a->h1q,
                                  WQ(tr, w->wv), T, D, KV);
        qrl_train_rmsnorm_backward(tr->dres, gtwin(tr, w->attn_norm), tr->dh, tr->xs[l],
                                   WQ(tr, w->attn_norm), a->rstd1, T, D);
    }
    qrl_train_embedding_backward(gtwin(tr, m->tok_embedding), tr->dres, tr->tokens, T, V, D);
    return QRL_OK;
}
