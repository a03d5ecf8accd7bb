/* CPU reference forward pass (see forward.h). */
#include "model/forward.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"

struct qrl_forward {
    const qrl_model *m;
    int max_rows, max_ctx, n_threads;
    float *x, *xb, *xb2;    /* [R, D] residual stream, normed input, projection out */
    float *q, *att;         /* [R, Q] */
    float *k, *v;           /* [R, KV] */
    float *hb, *hb2;        /* [R, F] */
    float *cos, *sin;       /* [R, head_dim / 2] */
    float *scratch;         /* [n_threads, max_ctx] attention scores */
    int *row_seq, *row_pos; /* [R] */
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
    float *p = malloc(total * sizeof(float));
    f->row_seq = malloc(R * sizeof(int));
    f->row_pos = malloc(R * sizeof(int));
    if (!p || !f->row_seq || !f->row_pos) {
        free(p);
        qrl_forward_free(f);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "forward: cannot allocate %zu MiB",
                             total * sizeof(float) >> 20);
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
    free(f->row_seq);
    free(f->row_pos);
    free(f);
}

int qrl_forward_max_ctx(const qrl_forward *f) { return f->max_ctx; }

/* Run n rows (row r = token tokens[r] of sequence row_seq[r] at position row_pos[r]; KV
 * capacity already reserved).  Logits for rows [from, n) go to logits[(r - from) * V]. */
static void run_rows(qrl_forward *f, qrl_kv_cache *kv, const int32_t *tokens, int n,
                     float *logits, int from) {
    const qrl_model *m = f->m;
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim, F = c->hidden_dim;
    int Q = H * hd, KV = KVH * hd, half = hd / 2, group = H / KVH;
    float scale = 1.0f / sqrtf((float)hd);

    int max_pos = 0;
    for (int r = 0; r < n; r++) {
        if (f->row_pos[r] > max_pos) max_pos = f->row_pos[r];
        memcpy(f->x + (size_t)r * D, m->tok_embedding + (size_t)tokens[r] * D, D * sizeof(float));
        qrl_cpu_rope_cos_sin(f->cos + (size_t)r * half, f->sin + (size_t)r * half, m->rope_inv_freq,
                             half, f->row_pos[r]);
    }
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &m->layers[l];
        qrl_cpu_rmsnorm(f->xb, f->x, w->attn_norm, n, D, c->norm_eps);
        qrl_cpu_matmul(f->q, f->xb, w->wq, w->bq, n, D, Q);
        qrl_cpu_matmul(f->k, f->xb, w->wk, w->bk, n, D, KV);
        qrl_cpu_matmul(f->v, f->xb, w->wv, w->bv, n, D, KV);
        if (c->qk_norm) {
            qrl_cpu_rmsnorm(f->q, f->q, w->q_norm, n * H, hd, c->norm_eps);
            qrl_cpu_rmsnorm(f->k, f->k, w->k_norm, n * KVH, hd, c->norm_eps);
        }
        for (int r = 0; r < n; r++) {
            const float *cs = f->cos + (size_t)r * half, *sn = f->sin + (size_t)r * half;
            qrl_cpu_rope_apply(f->q + (size_t)r * Q, H, hd, cs, sn, c->rope.layout);
            qrl_cpu_rope_apply(f->k + (size_t)r * KV, KVH, hd, cs, sn, c->rope.layout);
            qrl_kv_cache_write(kv, f->row_seq[r], l, f->row_pos[r], f->k + (size_t)r * KV,
                               f->v + (size_t)r * KV);
        }
        /* Attention: (row, head) pairs in parallel, one scratch row per thread; serial
         * when the work is too small to pay for a fork/join. */
        long work = (long)n * H * (max_pos + 1) * hd;
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
        qrl_cpu_matmul(f->xb2, f->att, w->wo, w->bo, n, Q, D);
        qrl_cpu_add(f->x, f->xb2, (size_t)n * D);

        qrl_cpu_rmsnorm(f->xb, f->x, w->ffn_norm, n, D, c->norm_eps);
        qrl_cpu_matmul(f->hb, f->xb, w->w_gate, NULL, n, D, F);
        qrl_cpu_matmul(f->hb2, f->xb, w->w_up, NULL, n, D, F);
        qrl_cpu_silu_mul(f->hb, f->hb, f->hb2, (size_t)n * F);
        qrl_cpu_matmul(f->xb2, f->hb, w->w_down, NULL, n, F, D);
        qrl_cpu_add(f->x, f->xb2, (size_t)n * D);
    }
    if (logits && from < n) {
        int nl = n - from;
        qrl_cpu_rmsnorm(f->xb, f->x + (size_t)from * D, m->final_norm, nl, D, c->norm_eps);
        qrl_cpu_matmul(logits, f->xb, m->lm_head, NULL, nl, D, c->vocab_size);
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
        run_rows(f, kv, tokens + c0, rows, out, from);
        /* Commit per chunk: the next chunk attends to these positions. */
        qrl_kv_cache_set_len(kv, seq, len + c0 + rows);
    }
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
    run_rows(f, kv, tokens, batch, logits, 0);
    for (int i = 0; i < batch; i++) qrl_kv_cache_set_len(kv, seqs[i], f->row_pos[i] + 1);
    return QRL_OK;
}
