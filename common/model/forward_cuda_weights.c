/* CUDA forward: weights onto the device (qrl_cuda_forward_upload: BF16, or the model's
 * W8A8 / W4A16 codes and scales unchanged) and random weights for benchmarks; the RoPE
 * tables.  The state is forward_cuda_internal.h's. */
#ifdef QRL_HAVE_CUDA
#include "model/forward_cuda_internal.h"

#include "cuda/convert.cuh"

/* F32 host -> BF16 device, through a host staging buffer. */
static qrl_status put(uint16_t *dst, const float *src, size_t n, uint16_t *stage, qrl_error *err) {
    for (size_t i = 0; i < n; i++) stage[i] = qrl_cpu_bf16_store(src[i]);
    return cuda_st(cudaMemcpy(dst, stage, n * 2, cudaMemcpyHostToDevice), "upload", err);
}

static qrl_status rope_tables(qrl_cuda_forward *f, const float *inv_freq, qrl_error *err) {
    int half = f->cfg.head_dim / 2, T = f->d.max_ctx;
    float *h = malloc((size_t)2 * T * half * sizeof(float));
    if (!h) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: rope tables");
    for (int t = 0; t < T; t++)
        qrl_cpu_rope_cos_sin(h + (size_t)t * half, h + ((size_t)T + t) * half, inv_freq, half, t);
    qrl_status st = cuda_st(cudaMemcpy(f->cos_tab, h, (size_t)2 * T * half * 4,
                                       cudaMemcpyHostToDevice), "rope upload", err);
    free(h);
    return st;
}

/* Rows [row0, row0 + l->n_out) of a device projection from a w8a8 linear: codes (INT8 or
 * E4M3 bytes) zero-padded to the device row length, scales and bias as they are (F32). */
static qrl_status put_qlin(const qlin_dev *g, int row0, const qrl_linear *l, uint8_t *stage,
                           qrl_error *err) {
    QRL_CHECK(l->fmt == QRL_PRECISION_W8A8_INT8 || l->fmt == QRL_PRECISION_W8A8_FP8);
    size_t N = l->n_out, K = l->n_in, ld = qrl_cuda_w8a8_ld(l->n_in);
    memset(stage, 0, N * ld);
    for (size_t n = 0; n < N; n++) memcpy(stage + n * ld, (const uint8_t *)l->codes + n * K, K);
    QRL_TRY(cuda_st(cudaMemcpy(g->codes + (size_t)row0 * ld, stage, N * ld,
                               cudaMemcpyHostToDevice), "w8a8 codes upload", err));
    QRL_TRY(cuda_st(cudaMemcpy(g->scales + row0, l->scales, N * 4, cudaMemcpyHostToDevice),
                    "w8a8 scales upload", err));
    if (g->bias && l->bias)
        QRL_TRY(cuda_st(cudaMemcpy(g->bias + row0, l->bias, N * 4, cudaMemcpyHostToDevice),
                        "bias upload", err));
    return QRL_OK;
}

/* Rows [row0, row0 + l->n_out) of a device projection from a w4a16 / w4a4 linear: codes and block
 * scales byte for byte, the row factor 1 / S_enc (NVFP4, the CPU's F32 division) or 1. */
static qrl_status put_fp4lin(const qlin_dev *g, int row0, const qrl_linear *l, bool mx,
                             float *stage, qrl_error *err) {
    QRL_CHECK(mx ? l->fmt == QRL_PRECISION_W4A16_MXFP4
                 : l->fmt == QRL_PRECISION_W4A16_NVFP4 || l->fmt == QRL_PRECISION_W4A4_NVFP4);
    size_t N = l->n_out, cb = qrl_cuda_fp4_code_bytes(l->n_in),
           nb = qrl_cuda_fp4_scale_bytes(l->n_in, mx);
    QRL_TRY(cuda_st(cudaMemcpy(g->codes + (size_t)row0 * cb, l->codes, N * cb,
                               cudaMemcpyHostToDevice), "fp4 codes upload", err));
    QRL_TRY(cuda_st(cudaMemcpy(g->bscales + (size_t)row0 * nb, l->block_scales, N * nb,
                               cudaMemcpyHostToDevice), "fp4 block scales upload", err));
    float rs = mx ? 1.0f : 1.0f / l->global_enc[0];
    for (size_t n = 0; n < N; n++) stage[n] = rs;
    QRL_TRY(cuda_st(cudaMemcpy(g->scales + row0, stage, N * 4, cudaMemcpyHostToDevice),
                    "fp4 row scales upload", err));
    if (g->bias && l->bias)
        QRL_TRY(cuda_st(cudaMemcpy(g->bias + row0, l->bias, N * 4, cudaMemcpyHostToDevice),
                        "bias upload", err));
    return QRL_OK;
}

static qrl_status upload_qproj(qrl_cuda_forward *f, const qrl_model *m, qrl_error *err) {
    const qrl_model_config *c = &m->cfg;
    int rows[4], ins[4];
    qlin_shapes(c, rows, ins);
    size_t stage_bytes = 0;
    for (int i = 0; i < 4; i++)
        stage_bytes = max_sz(stage_bytes, (size_t)rows[i] * max_sz(qrl_cuda_w8a8_ld(ins[i]), 4));
    uint8_t *stage = malloc(stage_bytes);
    if (!stage) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: quantized upload staging");
    qrl_status st = QRL_OK;
    int Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim, F = c->hidden_dim;
    for (int l = 0; l < c->n_layers && st == QRL_OK; l++) {
        const layer_dev *g = &f->layers[l];
        /* fused as the BF16 path: q|k|v rows, gate|up rows (per-channel scales keep each
         * output channel what the separate linear computes) */
        struct { const qlin_dev *g; int row0, slot; } parts[] = {
            {&g->qkv, 0, QRL_LINEAR_Q}, {&g->qkv, Q, QRL_LINEAR_K}, {&g->qkv, Q + KV, QRL_LINEAR_V},
            {&g->o, 0, QRL_LINEAR_O}, {&g->gu, 0, QRL_LINEAR_GATE}, {&g->gu, F, QRL_LINEAR_UP},
            {&g->down, 0, QRL_LINEAR_DOWN}};
        for (size_t i = 0; i < sizeof parts / sizeof *parts && st == QRL_OK; i++) {
            const qrl_linear *ql = qrl_model_linear(m, l, parts[i].slot);
            st = f->prec->proj == PROJ_FP4 ? put_fp4lin(parts[i].g, parts[i].row0, ql, f->prec->mx, (float *)stage, err)
                        : put_qlin(parts[i].g, parts[i].row0, ql, stage, err);
        }
    }
    free(stage);
    return st;
}

qrl_status qrl_cuda_forward_upload(qrl_cuda_forward *f, const qrl_model *m, qrl_error *err) {
    const qrl_model_config *c = &m->cfg, *e = &f->cfg;
    if (c->dim != e->dim || c->hidden_dim != e->hidden_dim || c->n_layers != e->n_layers ||
        c->n_heads != e->n_heads || c->n_kv_heads != e->n_kv_heads || c->head_dim != e->head_dim ||
        c->vocab_size != e->vocab_size || c->qkv_bias != e->qkv_bias || c->o_bias != e->o_bias ||
        c->qk_norm != e->qk_norm || c->tie_embeddings != e->tie_embeddings)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "cuda forward upload: model config differs from the engine's");
    if (m->precision != qrl_cuda_forward_precision(f) &&
        (f->prec->proj != PROJ_BF16 || qrl_precision_is_quantized(m->precision)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "cuda forward upload: model precision '%s', engine runs '%s'",
                             qrl_precision_name(m->precision),
                             qrl_precision_name(qrl_cuda_forward_precision(f)));
    size_t D = c->dim, F = c->hidden_dim, V = c->vocab_size, hd = c->head_dim,
           Q = (size_t)c->n_heads * hd, KV = (size_t)c->n_kv_heads * hd;
    uint16_t *stage = malloc(max_sz(V * D, max_sz(2 * F * D, (Q + 2 * KV) * D)) * 2);
    if (!stage) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: upload staging");
    qrl_status st;
    QRL_TRY_GOTO(put(f->embed, m->tok_embedding, V * D, stage, err), done);
    QRL_TRY_GOTO(put(f->final_norm, m->final_norm, D, stage, err), done);
    if (!c->tie_embeddings) QRL_TRY_GOTO(put(f->lm_head, m->lm_head, V * D, stage, err), done);
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &m->layers[l];
        layer_dev *g = &f->layers[l];
        QRL_TRY_GOTO(put(g->attn_norm, w->attn_norm, D, stage, err), done);
        QRL_TRY_GOTO(put(g->ffn_norm, w->ffn_norm, D, stage, err), done);
        if (c->qk_norm) {
            QRL_TRY_GOTO(put(g->q_norm, w->q_norm, hd, stage, err), done);
            QRL_TRY_GOTO(put(g->k_norm, w->k_norm, hd, stage, err), done);
        }
        if (f->prec->proj != PROJ_BF16) continue;
        QRL_TRY_GOTO(put(g->wqkv, w->wq, Q * D, stage, err), done);
        QRL_TRY_GOTO(put(g->wqkv + Q * D, w->wk, KV * D, stage, err), done);
        QRL_TRY_GOTO(put(g->wqkv + (Q + KV) * D, w->wv, KV * D, stage, err), done);
        if (c->qkv_bias) {
            QRL_TRY_GOTO(put(g->bqkv, w->bq, Q, stage, err), done);
            QRL_TRY_GOTO(put(g->bqkv + Q, w->bk, KV, stage, err), done);
            QRL_TRY_GOTO(put(g->bqkv + Q + KV, w->bv, KV, stage, err), done);
        }
        QRL_TRY_GOTO(put(g->wo, w->wo, D * Q, stage, err), done);
        if (c->o_bias) QRL_TRY_GOTO(put(g->bo, w->bo, D, stage, err), done);
        QRL_TRY_GOTO(put(g->wgu, w->w_gate, F * D, stage, err), done);
        QRL_TRY_GOTO(put(g->wgu + F * D, w->w_up, F * D, stage, err), done);
        QRL_TRY_GOTO(put(g->wdown, w->w_down, D * F, stage, err), done);
    }
    if (f->prec->proj != PROJ_BF16) QRL_TRY_GOTO(upload_qproj(f, m, err), done);
    st = rope_tables(f, m->rope_inv_freq, err);
done:
    free(stage);
    return st;
}

/* ---- from a device BF16 stream (qrl_cuda_forward_upload_stream) --------------------- */

typedef struct stream_src {
    const qrl_model *like;
    const qrl_cuda_stream_tensor *t;
    size_t n;
    qrl_error *err;
} stream_src;

/* The stream tensor holding like's weight `field` (numel elements); NULL with *err set. */
static const uint16_t *src_of(const stream_src *s, const float *field, uint64_t numel) {
    const char *name = NULL;
    for (int i = 0; i < s->like->n_tensors && !name; i++)
        if (s->like->tensors[i].data == field) name = s->like->tensors[i].name;
    if (!name) {
        qrl_error_set(s->err, QRL_STATUS_INTERNAL, "cuda forward upload_stream: a weight has no tensor name");
        return NULL;
    }
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) {
            if (s->t[i].numel == numel) return s->t[i].bf16;
            qrl_error_set(s->err, QRL_STATUS_INVALID_ARGUMENT, "cuda forward upload_stream: tensor '%s' has %llu "
                          "elements, the model %llu", name, (unsigned long long)s->t[i].numel,
                          (unsigned long long)numel);
            return NULL;
        }
    qrl_error_set(s->err, QRL_STATUS_INVALID_ARGUMENT, "cuda forward upload_stream: tensor '%s' is not in the "
                  "stream", name);
    return NULL;
}

static qrl_status d2d(qrl_cuda_forward *f, uint16_t *dst, const stream_src *s, const float *field, size_t numel) {
    const uint16_t *src = src_of(s, field, numel);
    if (!src) return s->err->status;
    return cuda_st(cudaMemcpyAsync(dst, src, numel * 2, cudaMemcpyDeviceToDevice, f->stream), "d2d copy", s->err);
}

/* Rows [row0, row0 + N) of a w8a8 projection from BF16 weights W [N, K] (and bias [N]). */
static qrl_status quant_rows(qrl_cuda_forward *f, const qlin_dev *g, int row0, const stream_src *s,
                             const float *w, const float *b, int N, int K) {
    qrl_error *err = s->err;
    const uint16_t *src = src_of(s, w, (uint64_t)N * K);
    if (!src) return s->err->status;
    int ld = qrl_cuda_w8a8_ld(K);
    uint8_t *codes = g->codes + (size_t)row0 * ld;
    QRL_TRY(f->prec->fp8 ? qrl_cuda_fp8_quantize_rows(codes, g->scales + row0, src, 1, N, K, ld, f->stream, s->err)
                   : qrl_cuda_int8_quantize_rows((int8_t *)codes, g->scales + row0, src, 1, N, K, ld, f->stream,
                                                 s->err));
    if (!g->bias || !b) return QRL_OK;
    const uint16_t *bs = src_of(s, b, (uint64_t)N);
    if (!bs) return s->err->status;
    return qrl_cuda_bf16_to_f32(bs, g->bias + row0, (size_t)N, f->stream, s->err);
}

qrl_status qrl_cuda_forward_upload_stream(qrl_cuda_forward *f, const qrl_model *like,
                                          const qrl_cuda_stream_tensor *t, size_t n, qrl_error *err) {
    const qrl_model_config *c = &f->cfg;
    if (like->cfg.dim != c->dim || like->cfg.n_layers != c->n_layers || like->cfg.vocab_size != c->vocab_size ||
        like->cfg.hidden_dim != c->hidden_dim)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "cuda forward upload_stream: model config differs from the engine's");
    if (f->prec->proj == PROJ_FP4)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda forward upload_stream: %s projections are "
                             "quantized on the host (qrl_cuda_forward_upload)",
                             qrl_precision_name(qrl_cuda_forward_precision(f)));
    stream_src s = {like, t, n, err};
    size_t D = c->dim, F = c->hidden_dim, V = c->vocab_size, hd = c->head_dim,
           Q = (size_t)c->n_heads * hd, KV = (size_t)c->n_kv_heads * hd;
    QRL_TRY(d2d(f, f->embed, &s, like->tok_embedding, V * D));
    QRL_TRY(d2d(f, f->final_norm, &s, like->final_norm, D));
    if (!c->tie_embeddings) QRL_TRY(d2d(f, f->lm_head, &s, like->lm_head, V * D));
    for (int l = 0; l < c->n_layers; l++) {
        const qrl_layer_weights *w = &like->layers[l];
        layer_dev *g = &f->layers[l];
        QRL_TRY(d2d(f, g->attn_norm, &s, w->attn_norm, D));
        QRL_TRY(d2d(f, g->ffn_norm, &s, w->ffn_norm, D));
        if (c->qk_norm) {
            QRL_TRY(d2d(f, g->q_norm, &s, w->q_norm, hd));
            QRL_TRY(d2d(f, g->k_norm, &s, w->k_norm, hd));
        }
        if (f->prec->proj == PROJ_W8A8) { /* fused as upload_qproj: q|k|v rows, gate|up rows */
            QRL_TRY(quant_rows(f, &g->qkv, 0, &s, w->wq, w->bq, (int)Q, (int)D));
            QRL_TRY(quant_rows(f, &g->qkv, (int)Q, &s, w->wk, w->bk, (int)KV, (int)D));
            QRL_TRY(quant_rows(f, &g->qkv, (int)(Q + KV), &s, w->wv, w->bv, (int)KV, (int)D));
            QRL_TRY(quant_rows(f, &g->o, 0, &s, w->wo, w->bo, (int)D, (int)Q));
            QRL_TRY(quant_rows(f, &g->gu, 0, &s, w->w_gate, NULL, (int)F, (int)D));
            QRL_TRY(quant_rows(f, &g->gu, (int)F, &s, w->w_up, NULL, (int)F, (int)D));
            QRL_TRY(quant_rows(f, &g->down, 0, &s, w->w_down, NULL, (int)D, (int)F));
            continue;
        }
        QRL_TRY(d2d(f, g->wqkv, &s, w->wq, Q * D));
        QRL_TRY(d2d(f, g->wqkv + Q * D, &s, w->wk, KV * D));
        QRL_TRY(d2d(f, g->wqkv + (Q + KV) * D, &s, w->wv, KV * D));
        if (c->qkv_bias) {
            QRL_TRY(d2d(f, g->bqkv, &s, w->bq, Q));
            QRL_TRY(d2d(f, g->bqkv + Q, &s, w->bk, KV));
            QRL_TRY(d2d(f, g->bqkv + Q + KV, &s, w->bv, KV));
        }
        QRL_TRY(d2d(f, g->wo, &s, w->wo, D * Q));
        if (c->o_bias) QRL_TRY(d2d(f, g->bo, &s, w->bo, D));
        QRL_TRY(d2d(f, g->wgu, &s, w->w_gate, F * D));
        QRL_TRY(d2d(f, g->wgu + F * D, &s, w->w_up, F * D));
        QRL_TRY(d2d(f, g->wdown, &s, w->w_down, D * F));
    }
    return cuda_st(cudaStreamSynchronize(f->stream), "upload_stream", err);
}

/* Benchmarks' quantized projections: uniform codes (INT8, E4M3 values, or FP4 code bytes
 * with unit block scales), row scales giving the BF16 path's std (E2M1 over uniform codes
 * has RMS sqrt(68.5 / 8)), zero biases.  Runs on f->stream and waits for it. */
static qrl_status random_qproj(qrl_cuda_forward *f, uint64_t seed, float std, qrl_error *err) {
    const qrl_model_config *c = &f->cfg;
    QRL_TRY(cuda_st(cudaMemsetAsync(f->qarena, 0, f->qarena_bytes, f->stream), "memset", err));
    int rows[4], ins[4];
    qlin_shapes(c, rows, ins);
    size_t smax = 0;
    for (int i = 0; i < 4; i++) smax = max_sz(smax, (size_t)rows[i]);
    float *h = malloc(smax * sizeof(float));
    if (!h) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: projection scales");
    float scale = f->prec->proj == PROJ_FP4 ? std / sqrtf(68.5f / 8.0f)
                         : std * sqrtf(3.0f) / (f->prec->fp8 ? QRL_E4M3_MAX : 127.0f);
    for (size_t i = 0; i < smax; i++) h[i] = scale;
    qrl_status st = QRL_OK;
    for (int l = 0; l < c->n_layers && st == QRL_OK; l++) {
        const qlin_dev *ql[4] = {&f->layers[l].qkv, &f->layers[l].o, &f->layers[l].gu,
                                 &f->layers[l].down};
        for (int i = 0; i < 4 && st == QRL_OK; i++) {
            uint64_t sd = seed + 1000 + 4 * l + i;
            size_t n = (size_t)rows[i] * (f->prec->proj == PROJ_FP4 ? (size_t)qrl_cuda_fp4_code_bytes(ins[i])
                                                 : (size_t)qrl_cuda_w8a8_ld(ins[i]));
            st = f->prec->fp8 ? qrl_cuda_fill_random_fp8(ql[i]->codes, n, sd, f->stream, err)
                        : qrl_cuda_fill_random_int8((int8_t *)ql[i]->codes, n, sd, f->stream, err);
            if (st == QRL_OK && f->prec->proj == PROJ_FP4)
                st = cuda_st(cudaMemsetAsync(ql[i]->bscales, f->prec->mx ? 127 : 0x38,
                                             (size_t)rows[i] * qrl_cuda_fp4_scale_bytes(ins[i], f->prec->mx),
                                             f->stream), "fp4 block scales", err);
            /* on the stream: after the arena's memset above, which a legacy-stream copy could
             * overtake */
            if (st == QRL_OK)
                st = cuda_st(cudaMemcpyAsync(ql[i]->scales, h, (size_t)rows[i] * 4,
                                             cudaMemcpyHostToDevice, f->stream), "row scales", err);
        }
    }
    cudaError_t se = cudaStreamSynchronize(f->stream); /* the copies read h */
    free(h);
    return st != QRL_OK ? st : cuda_st(se, "projection scales", err);
}

qrl_status qrl_cuda_forward_init_random(qrl_cuda_forward *f, uint64_t seed, qrl_error *err) {
    const qrl_model_config *c = &f->cfg;
    float std = 0.02f * sqrtf(768.0f / (float)c->dim);
    QRL_TRY(qrl_cuda_fill_random_bf16(f->warena, f->warena_elems, seed, 0.0f, std, f->stream, err));
    /* norm gains near 1 */
    QRL_TRY(qrl_cuda_fill_random_bf16(f->final_norm, c->dim, seed + 1, 1.0f, 0.1f, f->stream, err));
    for (int l = 0; l < c->n_layers; l++) {
        QRL_TRY(qrl_cuda_fill_random_bf16(f->layers[l].attn_norm, 2 * (size_t)c->dim, seed + 2 + l,
                                          1.0f, 0.1f, f->stream, err));
        if (c->qk_norm)
            QRL_TRY(qrl_cuda_fill_random_bf16(f->layers[l].q_norm, 2 * (size_t)c->head_dim,
                                              seed + 7 * l, 1.0f, 0.1f, f->stream, err));
    }
    if (f->prec->proj != PROJ_BF16) QRL_TRY(random_qproj(f, seed, std, err));
    if (!f->quant) {
        QRL_TRY(qrl_cuda_fill_random_bf16(f->kv, (size_t)c->n_layers * 2 * f->kv_layer_elems,
                                          seed + 99, 0.0f, 1.0f, f->stream, err));
    } else {
        size_t recs = (size_t)f->pool_blocks * f->d.block_size * c->n_kv_heads;
        size_t side = (size_t)f->slots * (f->kvq[0].sink + f->kvq[0].ring) * c->n_kv_heads;
        for (int l = 0; l < c->n_layers; l++)
            QRL_TRY(qrl_cuda_kvq_fill_random(&f->kvq[l], recs, side, f->slots, seed + 99 + l,
                                             f->stream, err));
        /* the random head scales stand: decode does not recalibrate them */
        memset(f->fp8_ready, 1, (size_t)f->slots);
    }
    float *inv = malloc(c->head_dim / 2 * sizeof(float));
    if (!inv) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: inv_freq");
    qrl_cpu_rope_inv_freq(inv, c->head_dim, &c->rope);
    qrl_status st = rope_tables(f, inv, err);
    free(inv);
    QRL_TRY(st);
    return cuda_st(cudaStreamSynchronize(f->stream), "init_random", err);
}

#else
typedef int qrl_forward_cuda_weights_unused_; /* ISO C forbids an empty translation unit */
#endif
