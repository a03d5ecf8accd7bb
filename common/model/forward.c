/* CPU reference forward pass (see forward.h). */
#include "model/forward.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/quant.h"
#include "model/linear.h"
#include "model/trace_rec.h"

struct qrl_forward {
    const qrl_model *m;
    int max_rows, max_ctx, n_threads;
    qrl_linear_scratch *lin; /* activation quantization, dequantized weight rows */
    float *kvbuf;           /* [n_threads][2][max_ctx][head_dim] gathered K, V (quantized KV) */
    float *x, *xb, *xb2;    /* [R, D] residual stream, normed input, projection out */
    float *q, *att;         /* [R, Q] */
    float *k, *v;           /* [R, KV] */
    float *hb, *hb2;        /* [R, F] */
    float *cos, *sin;       /* [R, head_dim / 2] */
    float *scratch;         /* [n_threads, max_ctx] attention scores */
    int *row_seq, *row_pos; /* [R] */
    qrl_trace_recorder *rec; /* borrowed, NULL = not recording */
    int row0;               /* call row of the pass's first row (recorder targets) */
};

qrl_status qrl_forward_new(const qrl_model *m, int max_rows, int max_ctx, qrl_forward **out,
                           qrl_error *err) {
    *out = NULL;
    if (max_rows <= 0 || max_ctx <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "forward: max_rows = %d and max_ctx = %d must be > 0", max_rows,
                             max_ctx);
    const qrl_model_config *c = &m->cfg;
    qrl_forward *f = calloc(1, sizeof *f);
    if (!f) return qrl_error_set(err, QRL_STATUS_NOMEM, "forward: out of memory");
    f->m = m;
    f->max_rows = max_rows;
    f->max_ctx = max_ctx < c->max_seq_len ? max_ctx : c->max_seq_len;
    f->n_threads = omp_get_max_threads();
    size_t R = (size_t)max_rows, D = c->dim, Q = (size_t)c->n_heads * c->head_dim,
           KV = (size_t)c->n_kv_heads * c->head_dim, F = c->hidden_dim, H2 = c->head_dim / 2;
    size_t total = 3 * R * D + 2 * R * Q + 2 * R * KV + 2 * R * F + 2 * R * H2 +
                   (size_t)f->n_threads * f->max_ctx;
    size_t kvbuf = (size_t)f->n_threads * 2 * f->max_ctx * c->head_dim;
    int max_in = (int)(D > Q ? D : Q);
    if ((int)F > max_in) max_in = (int)F;
    float *p = malloc(total * sizeof(float));
    f->kvbuf = malloc(kvbuf * sizeof(float));
    f->row_seq = malloc(R * sizeof(int));
    f->row_pos = malloc(R * sizeof(int));
    qrl_status st = qrl_linear_scratch_new(max_rows, max_in, &f->lin, err);
    if (!p || !f->kvbuf || !f->row_seq || !f->row_pos || st != QRL_OK) {
        free(p);
        qrl_forward_free(f);
        if (st != QRL_OK) return st;
        return qrl_error_set(err, QRL_STATUS_NOMEM, "forward: cannot allocate %zu MiB",
                             (total + kvbuf) * sizeof(float) >> 20);
    }
    f->x = p;               p += R * D;
    f->xb = p;              p += R * D;
    f->xb2 = p;             p += R * D;
    f->q = p;               p += R * Q;
    f->att = p;             p += R * Q;
    f->k = p;               p += R * KV;
    f->v = p;               p += R * KV;
    f->hb = p;              p += R * F;
    f->hb2 = p;             p += R * F;
    f->cos = p;             p += R * H2;
    f->sin = p;             p += R * H2;
    f->scratch = p;
    *out = f;
    return QRL_OK;
}

void qrl_forward_free(qrl_forward *f) {
    if (!f) return;
    free(f->x); /* start of the one activation block */
    free(f->kvbuf);
    qrl_linear_scratch_free(f->lin);
    free(f->row_seq);
    free(f->row_pos);
    free(f);
}

int qrl_forward_max_ctx(const qrl_forward *f) { return f->max_ctx; }

void qrl_forward_set_recorder(qrl_forward *f, qrl_trace_recorder *rec) { f->rec = rec; }

/* Attention of the query heads of kv head `kvh` for row r over a quantized cache: K/V of
 * positions [0, pos] gathered as dequantized F32 rows, one partial softmax-attention
 * over the main store's rows and one over the int4-protected side cache's rows (empty
 * for the other formats), merged by max and sum of exponentials (quant.h; SPEC §3). */
static void attend_quantized(qrl_forward *f, qrl_kv_cache *kv, int r, int l, int kvh,
                             float scale) {
    const qrl_model_config *c = &f->m->cfg;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, Q = c->n_heads * hd;
    int n_ctx = f->row_pos[r] + 1, n4;
    float *kb = f->kvbuf + (size_t)omp_get_thread_num() * 2 * f->max_ctx * hd;
    float *vb = kb + (size_t)f->max_ctx * hd;
    qrl_kv_cache_gather(kv, f->row_seq[r], l, kvh, n_ctx, kb, vb, &n4);
    float acc[2][QRL_KV_MAX_HEAD_DIM];
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const float *q = f->q + (size_t)r * Q + (size_t)h * hd;
        qrl_attention_partial parts[2] = {{0, 0, acc[0]}, {0, 0, acc[1]}};
        qrl_attention_partial_f32(q, kb, vb, n4, hd, scale, &parts[0]);
        qrl_attention_partial_f32(q, kb + (size_t)n4 * hd, vb + (size_t)n4 * hd, n_ctx - n4, hd,
                                  scale, &parts[1]);
        qrl_attention_merge(parts, 2, hd, f->att + (size_t)r * Q + (size_t)h * hd);
    }
}

/* Attention of all rows for layer l (K/V of the rows not written yet).  F32/BF16 caches
 * keep the reference two-pass kernel; quantized caches go through attend_quantized. */
static void attention(qrl_forward *f, qrl_kv_cache *kv, int n, int l, float scale, int max_pos) {
    const qrl_model_config *c = &f->m->cfg;
    int H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, Q = H * hd, KV = KVH * hd;
    int group = H / KVH;
    qrl_kv_format fmt = qrl_kv_cache_describe(kv)->format;
    /* fp8: the sequence's first rows fix its per-head scales (runs of rows of one seq) */
    for (int r = 0; r < n;) {
        int e = r + 1;
        while (e < n && f->row_seq[e] == f->row_seq[r]) e++;
        qrl_kv_cache_calibrate(kv, f->row_seq[r], l, f->k + (size_t)r * KV, f->v + (size_t)r * KV,
                               e - r);
        r = e;
    }
    long work = (long)n * H * (max_pos + 1) * hd;
    if (fmt == QRL_KV_FORMAT_INT4_PROTECTED) {
        /* The recent ring holds only the newest positions: each row attends right after
         * its own write, before a later row of its sequence overwrites a slot it reads. */
        for (int r = 0; r < n; r++) {
            qrl_kv_cache_write(kv, f->row_seq[r], l, f->row_pos[r], f->k + (size_t)r * KV,
                               f->v + (size_t)r * KV);
#pragma omp parallel for schedule(static) num_threads(f->n_threads) if (work / n > 65536)
            for (int g = 0; g < KVH; g++) attend_quantized(f, kv, r, l, g, scale);
        }
        return;
    }
    for (int r = 0; r < n; r++)
        qrl_kv_cache_write(kv, f->row_seq[r], l, f->row_pos[r], f->k + (size_t)r * KV,
                           f->v + (size_t)r * KV);
    if (fmt != QRL_KV_FORMAT_F32 && fmt != QRL_KV_FORMAT_BF16) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(f->n_threads) if (work > 65536)
        for (int r = 0; r < n; r++)
            for (int g = 0; g < KVH; g++) attend_quantized(f, kv, r, l, g, scale);
        return;
    }
    /* (row, head) pairs in parallel, one scratch row per thread; serial when the work is
     * too small to pay for a fork/join. */
#pragma omp parallel for collapse(2) schedule(static) num_threads(f->n_threads) if (work > 65536)
    for (int r = 0; r < n; r++) {
        for (int h = 0; h < H; h++) {
            qrl_kv_view view;
            qrl_kv_cache_view(kv, f->row_seq[r], l, &view);
            float *scratch = f->scratch + (size_t)omp_get_thread_num() * f->max_ctx;
            qrl_cpu_attention_head(f->att + (size_t)r * Q + (size_t)h * hd,
                                   f->q + (size_t)r * Q + (size_t)h * hd, &view, h / group,
                                   f->row_pos[r] + 1, scale, scratch);
        }
    }
}

/* Run n rows (row r = token tokens[r] of sequence row_seq[r] at position row_pos[r]; KV
 * capacity already reserved).  Logits for rows [from, n) go to logits[(r - from) * V].
 * Projections run through the model's linears (its precision, SPEC §3). */
static void run_rows(qrl_forward *f, qrl_kv_cache *kv, const int32_t *tokens, int n,
                     float *logits, int from) {
    const qrl_model *m = f->m;
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->hidden_dim;
    int Q = H * hd, KV = KVH * hd, half = hd / 2;
    float scale = 1.0f / sqrtf((float)hd);

    int max_pos = 0;
    for (int r = 0; r < n; r++) {
        if (f->row_pos[r] > max_pos) max_pos = f->row_pos[r];
        memcpy(f->x + (size_t)r * D, m->tok_embedding + (size_t)tokens[r] * D, D * sizeof(float));
        qrl_cpu_rope_cos_sin(f->cos + (size_t)r * half, f->sin + (size_t)r * half, m->rope_inv_freq,
                             half, f->row_pos[r]);
    }
    /* TRACE: the exact rows each linear / KV write quantizes, before it does (one test per
     * site when not recording) */
    bool rec = f->rec && qrl_trace_recorder_begin_pass(f->rec, f->row0, n);
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &m->layers[l];
#define LIN(slot, in, out) qrl_linear_forward(qrl_model_linear(m, l, slot), in, n, out, f->lin)
#define CAPTURE(kind, buf, width)                                                           \
    if (rec)                                                                                \
        for (int r_ = 0; r_ < n; r_++)                                                      \
            qrl_trace_recorder_capture(f->rec, r_, l, kind, (buf) + (size_t)r_ * (width))
        qrl_cpu_rmsnorm(f->xb, f->x, w->attn_norm, n, D, c->norm_eps);
        CAPTURE(QRL_TRACE_SITE_ATTN_IN, f->xb, D);
        LIN(QRL_LINEAR_Q, f->xb, f->q);
        LIN(QRL_LINEAR_K, f->xb, f->k);
        LIN(QRL_LINEAR_V, f->xb, f->v);
        if (c->qk_norm) {
            qrl_cpu_rmsnorm(f->q, f->q, w->q_norm, n * H, hd, c->norm_eps);
            qrl_cpu_rmsnorm(f->k, f->k, w->k_norm, n * KVH, hd, c->norm_eps);
        }
        for (int r = 0; r < n; r++) {
            const float *cs = f->cos + (size_t)r * half, *sn = f->sin + (size_t)r * half;
            qrl_cpu_rope_apply(f->q + (size_t)r * Q, H, hd, cs, sn, c->rope.layout);
            qrl_cpu_rope_apply(f->k + (size_t)r * KV, KVH, hd, cs, sn, c->rope.layout);
        }
        CAPTURE(QRL_TRACE_SITE_K, f->k, KV);
        CAPTURE(QRL_TRACE_SITE_V, f->v, KV);
        attention(f, kv, n, l, scale, max_pos);
        CAPTURE(QRL_TRACE_SITE_ATTN_OUT, f->att, Q);
        LIN(QRL_LINEAR_O, f->att, f->xb2);
        qrl_cpu_add(f->x, f->xb2, (size_t)n * D);

        qrl_cpu_rmsnorm(f->xb, f->x, w->ffn_norm, n, D, c->norm_eps);
        CAPTURE(QRL_TRACE_SITE_MLP_IN, f->xb, D);
        LIN(QRL_LINEAR_GATE, f->xb, f->hb);
        LIN(QRL_LINEAR_UP, f->xb, f->hb2);
        qrl_cpu_silu_mul(f->hb, f->hb, f->hb2, (size_t)n * F);
        CAPTURE(QRL_TRACE_SITE_MLP_DOWN, f->hb, F);
        LIN(QRL_LINEAR_DOWN, f->hb, f->xb2);
        qrl_cpu_add(f->x, f->xb2, (size_t)n * D);
#undef CAPTURE
#undef LIN
    }
    if (logits && from < n) {
        int nl = n - from;
        qrl_cpu_rmsnorm(f->xb, f->x + (size_t)from * D, m->final_norm, nl, D, c->norm_eps);
        qrl_linear_forward(&m->lm_head_linear, f->xb, nl, logits, f->lin);
    }
}

static qrl_status check_cache(const qrl_forward *f, const qrl_kv_cache *kv, qrl_error *err) {
    const qrl_kv_cache_desc *d = qrl_kv_cache_describe(kv);
    const qrl_model_config *c = &f->m->cfg;
    if (d->n_layers != c->n_layers || d->n_kv_heads != c->n_kv_heads || d->head_dim != c->head_dim)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "forward: kv cache shape (layers=%d kv_heads=%d head_dim=%d) does "
                             "not match the model (%d, %d, %d)",
                             d->n_layers, d->n_kv_heads, d->head_dim, c->n_layers, c->n_kv_heads,
                             c->head_dim);
    return QRL_OK;
}

static int context_limit(const qrl_forward *f, const qrl_kv_cache *kv) {
    int lim = f->max_ctx, kvl = qrl_kv_cache_describe(kv)->max_seq_len;
    return kvl < lim ? kvl : lim;
}

qrl_status qrl_forward_prefill(qrl_forward *f, qrl_kv_cache *kv, int seq, const int32_t *tokens,
                               int n, float *logits, bool all_logits, qrl_error *err) {
    QRL_TRY(check_cache(f, kv, err));
    int V = f->m->cfg.vocab_size;
    if (n <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "prefill: %d tokens (need >= 1)", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "prefill: token %d (index %d) is outside the vocabulary [0, %d)",
                                 tokens[i], i, V);
    int len = qrl_kv_cache_seq_len(kv, seq), lim = context_limit(f, kv);
    if ((int64_t)len + n > lim)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "prefill: %d tokens at position %d exceed the context of %d", n, len,
                             lim);
    QRL_TRY(qrl_kv_cache_reserve(kv, seq, len + n, err));
    for (int c0 = 0; c0 < n; c0 += f->max_rows) {
        int rows = n - c0 < f->max_rows ? n - c0 : f->max_rows;
        for (int r = 0; r < rows; r++) {
            f->row_seq[r] = seq;
            f->row_pos[r] = len + c0 + r;
        }
        float *out = NULL;
        int from = rows;
        if (logits && all_logits) {
            out = logits + (size_t)c0 * V;
            from = 0;
        } else if (logits && c0 + rows == n) {
            out = logits;
            from = rows - 1;
        }
        f->row0 = c0;
        run_rows(f, kv, tokens + c0, rows, out, from);
        /* Commit per chunk: the next chunk attends to these positions. */
        qrl_kv_cache_set_len(kv, seq, len + c0 + rows);
    }
    if (f->rec) qrl_trace_recorder_clear(f->rec); /* targets are for one call */
    return QRL_OK;
}

qrl_status qrl_forward_decode(qrl_forward *f, qrl_kv_cache *kv, const int *seqs,
                              const int32_t *tokens, int batch, float *logits, qrl_error *err) {
    QRL_TRY(check_cache(f, kv, err));
    int V = f->m->cfg.vocab_size, lim = context_limit(f, kv);
    if (batch <= 0 || batch > f->max_rows)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "decode: batch %d outside [1, %d] (max_rows)", batch, f->max_rows);
    for (int i = 0; i < batch; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "decode: token %d (batch row %d) is outside the vocabulary [0, %d)",
                                 tokens[i], i, V);
        for (int j = 0; j < i; j++)
            if (seqs[j] == seqs[i])
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "decode: sequence %d appears twice in the batch (rows %d, %d)",
                                     seqs[i], j, i);
        int len = qrl_kv_cache_seq_len(kv, seqs[i]);
        if (len + 1 > lim)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "decode: sequence %d is at the context limit of %d", seqs[i], lim);
    }
    for (int i = 0; i < batch; i++) {
        int len = qrl_kv_cache_seq_len(kv, seqs[i]);
        QRL_TRY(qrl_kv_cache_reserve(kv, seqs[i], len + 1, err));
        f->row_seq[i] = seqs[i];
        f->row_pos[i] = len;
    }
    f->row0 = 0;
    run_rows(f, kv, tokens, batch, logits, 0);
    for (int i = 0; i < batch; i++) qrl_kv_cache_set_len(kv, seqs[i], f->row_pos[i] + 1);
    if (f->rec) qrl_trace_recorder_clear(f->rec); /* targets are for one call */
    return QRL_OK;
}
