/* CUDA forward: making an engine (qrl_cuda_forward_new), in steps: check the descriptor,
 * look its precision up in one table, size the weights, size the KV cache and the
 * scratch, allocate, carve the arenas, set up the padding sequence.  The state is
 * forward_cuda_internal.h's. */
#ifdef QRL_HAVE_CUDA
#include "model/forward_cuda_internal.h"

#include "base/tuning.h"

/* How each weight precision runs.  f32 weights run as BF16. */
static const cuda_precision precisions[] = {
    {QRL_PRECISION_F32, QRL_PRECISION_BF16, PROJ_BF16, false, false, false},
    {QRL_PRECISION_BF16, QRL_PRECISION_BF16, PROJ_BF16, false, false, false},
    {QRL_PRECISION_W8A8_INT8, QRL_PRECISION_W8A8_INT8, PROJ_W8A8, false, false, false},
    {QRL_PRECISION_W8A8_FP8, QRL_PRECISION_W8A8_FP8, PROJ_W8A8, true, false, false},
    {QRL_PRECISION_W4A16_NVFP4, QRL_PRECISION_W4A16_NVFP4, PROJ_FP4, false, false, false},
    {QRL_PRECISION_W4A16_MXFP4, QRL_PRECISION_W4A16_MXFP4, PROJ_FP4, false, true, false},
    /* Hopper has no FP4 tensor cores: the activations are quantized per token to NVFP4 as
     * the CPU does (qrl_cuda_nvfp4_quantize_rows' codes), kept as their exact BF16 values
     * e2m1 * E4M3 block scale, and fed to the w4a16 GEMM with 1 / S_enc as a per-token
     * factor in its epilogue (gemm_fp4.cuh x_scale) */
    {QRL_PRECISION_W4A4_NVFP4, QRL_PRECISION_W4A4_NVFP4, PROJ_FP4, false, false, true},
};

/* Sizes the steps share that have no field in the engine. */
typedef struct layout {
    int q_rows[4], q_ins[4];  /* the four projections (qlin_shapes) */
    size_t max_ld;            /* w8a8: the ld of the widest input */
    size_t recs, side_recs;   /* quantized KV, per layer: records of the pool, of the side cache */
    int ring;                 /* int4-protected: side ring slots per sequence (0: none) */
    size_t act_floats, act_bf16;
} layout;

/* Shapes the kernels take: every count > 0, head_dim a power of two in 8..256, <= 8 query
 * heads per KV head. */
static qrl_status check_desc(const qrl_model_config *cfg, const qrl_cuda_forward_desc *d,
                             qrl_error *err) {
    if (d->max_rows <= 0 || d->max_ctx <= 0 || d->block_size <= 0 || d->n_blocks <= 0 ||
        d->max_seqs <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda forward: max_rows=%d max_ctx=%d block_size=%d n_blocks=%d "
                             "max_seqs=%d must be > 0",
                             d->max_rows, d->max_ctx, d->block_size, d->n_blocks, d->max_seqs);
    int hd = cfg->head_dim;
    if ((hd != 8 && hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256) ||
        cfg->n_heads / cfg->n_kv_heads > 8)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "cuda forward: head_dim %d / %d q heads per kv head (supported: "
                             "8..256 powers of two, <= 8)", hd, cfg->n_heads / cfg->n_kv_heads);
    return QRL_OK;
}

/* The table row of precision p; UNSUPPORTED when the device runs no such precision. */
static qrl_status find_precision(qrl_precision p, const cuda_precision **out, qrl_error *err) {
    for (size_t i = 0; i < sizeof precisions / sizeof *precisions; i++)
        if (precisions[i].precision == p) {
            *out = &precisions[i];
            return QRL_OK;
        }
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                         "cuda forward: weight precision '%s' (supported: f32 as bf16, bf16, "
                         "w8a8-int8, w8a8-fp8, w4a16-nvfp4, w4a16-mxfp4, w4a4-nvfp4)",
                         qrl_precision_name(p));
}

/* Whether projection i (0 qkv, 1 o, 2 gate+up, 3 down) has a bias. */
static bool qlin_has_bias(const qrl_model_config *c, int i) {
    return (i == 0 && c->qkv_bias) || (i == 1 && c->o_bias);
}

/* w8a8: codes, scales and F32 biases per layer, then activation codes and the split-K
 * workspace of the largest shape any batch up to max_rows runs. */
static void size_w8a8(qrl_cuda_forward *f, layout *lo) {
    size_t L = f->cfg.n_layers, R = f->d.max_rows;
    for (size_t l = 0; l < L; l++)
        for (int i = 0; i < 4; i++) {
            size_t rows = (size_t)lo->q_rows[i], ld = qrl_cuda_w8a8_ld(lo->q_ins[i]);
            size_t codes = rows * ld;
            f->qarena_bytes += up256(codes) + up256(rows * 4);
            f->qweight_bytes += codes + rows * 4;
            if (qlin_has_bias(&f->cfg, i)) f->qarena_bytes += up256(rows * 4);
            if (ld > lo->max_ld) lo->max_ld = ld;
        }
    for (int i = 0; i < 4; i++)
        for (int t = 1; t <= (int)R; t++)
            f->gwork_floats = max_sz(f->gwork_floats,
                                     qrl_cuda_w8a8_work_floats(t, lo->q_rows[i],
                                                               qrl_cuda_w8a8_ld(lo->q_ins[i])));
    f->qarena_bytes += up256(R * lo->max_ld) + up256(R * 4) + up256(f->gwork_floats * 4);
}

/* w4a16: codes, block scales, row scales and F32 biases per layer; above 64 rows the
 * prefill GEMMs decode one projection at a time into a BF16 scratch. */
static void size_fp4(qrl_cuda_forward *f, const layout *lo) {
    size_t L = f->cfg.n_layers, R = f->d.max_rows;
    bool mx = f->prec->mx;
    for (size_t l = 0; l < L; l++)
        for (int i = 0; i < 4; i++) {
            size_t rows = (size_t)lo->q_rows[i];
            size_t codes = rows * qrl_cuda_fp4_code_bytes(lo->q_ins[i]),
                   bs = rows * qrl_cuda_fp4_scale_bytes(lo->q_ins[i], mx);
            f->qarena_bytes += up256(codes) + up256(bs) + up256(rows * 4);
            f->qweight_bytes += codes + bs + rows * 4;
            if (qlin_has_bias(&f->cfg, i)) f->qarena_bytes += up256(rows * 4);
        }
    if (R > 64)
        for (int i = 0; i < 4; i++)
            f->fp4_work_elems = max_sz(f->fp4_work_elems, (size_t)lo->q_rows[i] * lo->q_ins[i]);
    f->qarena_bytes += up256(f->fp4_work_elems * 2);
}

/* The BF16 arena (warena_elems: embedding, final norm, LM head unless tied, per layer the
 * norms and, BF16 projections, the projections and biases) and the quantized one
 * (qarena_bytes, qweight_bytes and the scratch sizes in it). */
static void size_weights(qrl_cuda_forward *f, layout *lo) {
    const qrl_model_config *cfg = &f->cfg;
    size_t hd = cfg->head_dim, D = cfg->dim, F = cfg->hidden_dim, V = cfg->vocab_size,
           L = cfg->n_layers, Q = (size_t)cfg->n_heads * hd, KV = (size_t)cfg->n_kv_heads * hd;
    size_t W = Q + 2 * KV;
    size_t per_layer = 2 * D + (cfg->qk_norm ? 2 * hd : 0);
    if (f->prec->proj == PROJ_BF16)
        per_layer += W * D + (cfg->qkv_bias ? W : 0) + D * Q + (cfg->o_bias ? D : 0) + 2 * F * D +
                     D * F;
    qlin_shapes(cfg, lo->q_rows, lo->q_ins);
    if (f->prec->proj == PROJ_W8A8) size_w8a8(f, lo);
    if (f->prec->proj == PROJ_FP4) size_fp4(f, lo);
    f->warena_elems = V * D + D + (cfg->tie_embeddings ? 0 : V * D) + L * per_layer;
}

/* Elements per row of xb: the norms' and SwiGLU's BF16 outputs; w4a4: also the attention
 * output's quantized values (Q wide). */
static size_t xb_elems(const qrl_cuda_forward *f) {
    const qrl_model_config *c = &f->cfg;
    size_t n = max_sz(c->dim, c->hidden_dim);
    return f->prec->a4 ? max_sz(n, (size_t)c->n_heads * c->head_dim) : n;
}

/* The KV format (f32 runs as bf16) and its pool (kv_pool_bytes: BF16 K and V per layer,
 * or per layer K and V codes, F32 fields, fp8 scales and the side cache), the attention's
 * workspace and the activations.  Errors: UNSUPPORTED (a format the device does not
 * run), OUT_OF_RANGE (int4-protected sink or recent outside [0, max_ctx]). */
static qrl_status size_kv_scratch(qrl_cuda_forward *f, layout *lo, qrl_error *err) {
    const qrl_model_config *cfg = &f->cfg;
    const qrl_cuda_forward_desc *d = &f->d;
    int hd = cfg->head_dim;
    if (f->d.kv_format == QRL_KV_FORMAT_F32) f->d.kv_format = QRL_KV_FORMAT_BF16;
    int fmt = f->d.kv_format;
    f->quant = fmt != QRL_KV_FORMAT_BF16;
    if (f->quant && qrl_cuda_kvq_code_bytes(fmt, hd) == 0)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "cuda forward: kv format '%s' with head_dim %d (supported: bf16, fp8, "
                             "int8, int4, fp4, int4-protected; even head_dim <= 256)", qrl_kv_format_name(d->kv_format), hd);
    if (fmt == QRL_KV_FORMAT_INT4_PROTECTED &&
        (d->protected_sink < 0 || d->protected_recent < 0 || d->protected_sink > d->max_ctx ||
         d->protected_recent > d->max_ctx))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda forward: int4-protected sink=%d and recent=%d must be in [0, %d]",
                             d->protected_sink, d->protected_recent, d->max_ctx);
    if (fmt != QRL_KV_FORMAT_INT4_PROTECTED) f->d.protected_sink = f->d.protected_recent = 0;
    size_t D = cfg->dim, F = cfg->hidden_dim, V = cfg->vocab_size, L = cfg->n_layers,
           Q = (size_t)cfg->n_heads * hd, KV = (size_t)cfg->n_kv_heads * hd, R = d->max_rows;
    size_t W = Q + 2 * KV;
    f->kv_layer_elems = (size_t)f->pool_blocks * d->block_size * KV;
    f->work_floats = qrl_cuda_attention_work_floats((int)R, cfg->n_heads, hd, d->max_ctx);
    lo->recs = (size_t)f->pool_blocks * d->block_size * cfg->n_kv_heads;
    lo->ring = d->protected_recent > 0 ? d->protected_recent + QRL_CUDA_KV_RING_SLACK : 0;
    lo->side_recs = (size_t)f->slots * (d->protected_sink + lo->ring) * cfg->n_kv_heads;
    size_t q_layer = 0;
    if (f->quant) {
        size_t cb = (size_t)qrl_cuda_kvq_code_bytes(fmt, hd), sf = qrl_cuda_kvq_scale_floats(fmt, hd);
        q_layer = 2 * (up256(lo->recs * cb) + up256(lo->recs * sf * 4)) +
                  up256((size_t)f->slots * cfg->n_kv_heads * 2 * 4) +
                  2 * (up256(lo->side_recs * hd) + up256(lo->side_recs * 4));
        size_t wq = qrl_cuda_attention_q_work_floats((int)R, cfg->n_heads, hd, d->max_ctx);
        if (wq > f->work_floats) f->work_floats = wq;
    }
    f->kv_pool_bytes = f->quant ? L * q_layer : L * 2 * f->kv_layer_elems * 2;
    lo->act_floats = R * D + R * max_sz(max_sz(W, 2 * F), D) + R * Q + R * V + f->work_floats +
                     R + R * 2 * KV + (f->prec->a4 ? R : 0);
    lo->act_bf16 = R * xb_elems(f) + R * Q;
    return QRL_OK;
}

/* The host bookkeeping: per-layer tables, block tables, row metadata, sequence state, the
 * free list (every block free), sampler rows.  Errors: NOMEM. */
static qrl_status alloc_host(qrl_cuda_forward *f, qrl_error *err) {
    size_t L = f->cfg.n_layers, R = f->d.max_rows;
    f->layers = calloc(L, sizeof *f->layers);
    f->h_tables = malloc((size_t)f->slots * f->max_blocks * sizeof(int32_t));
    f->h_meta = malloc(6 * R * sizeof(int32_t));
    f->fp8_ready = calloc(f->slots, 1);
    f->kvq = calloc(L, sizeof *f->kvq);
    f->seq_len = calloc(f->slots, sizeof(int32_t));
    f->seq_blocks = calloc(f->slots, sizeof(int32_t));
    f->seq_used = calloc(f->slots, 1);
    f->free_blocks = malloc((size_t)f->pool_blocks * sizeof(int32_t));
    f->h_sreq = malloc(R * (sizeof *f->h_sreq + sizeof *f->h_sout));
    if (!f->layers || !f->h_tables || !f->h_meta || !f->seq_len || !f->seq_blocks ||
        !f->seq_used || !f->free_blocks || !f->fp8_ready || !f->kvq || !f->h_sreq)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: out of host memory");
    memset(f->h_tables, 0, (size_t)f->slots * f->max_blocks * sizeof(int32_t));
    for (int i = 0; i < f->pool_blocks; i++) f->free_blocks[i] = f->pool_blocks - 1 - i;
    f->n_free = f->pool_blocks;
    return QRL_OK;
}

/* The stream, the GEMM handle and the device arrays (an empty one is not allocated).
 * Errors: CUDA, naming the array and its size. */
static qrl_status alloc_device(qrl_cuda_forward *f, const layout *lo, qrl_error *err) {
    size_t R = f->d.max_rows, half = f->cfg.head_dim / 2;
    QRL_TRY(cuda_st(cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking), "stream", err));
    QRL_TRY(qrl_cuda_gemm_new(&f->gemm, err));
    struct { void **p; size_t bytes; const char *what; } allocs[] = {
        {(void **)&f->warena, f->warena_elems * 2, "weights"},
        {(void **)&f->kv, f->kv_pool_bytes, "kv pool"},
        {(void **)&f->cos_tab, 2 * (size_t)f->d.max_ctx * half * 4, "rope tables"},
        {(void **)&f->d_tables, (size_t)f->slots * f->max_blocks * 4, "block tables"},
        {(void **)&f->d_meta, 7 * R * 4, "row metadata"},
        {(void **)&f->x, lo->act_floats * 4, "activations"},
        {(void **)&f->xb, lo->act_bf16 * 2, "bf16 activations"},
        {(void **)&f->qarena, f->qarena_bytes, "quantized weights"},
        {(void **)&f->d_sreq, R * (sizeof *f->d_sreq + sizeof *f->d_sout), "sampler rows"},
    };
    for (size_t i = 0; i < sizeof allocs / sizeof *allocs; i++) {
        if (allocs[i].bytes == 0) continue;
        cudaError_t e = cudaMalloc(allocs[i].p, allocs[i].bytes);
        if (e != cudaSuccess)
            return qrl_error_set(err, QRL_STATUS_CUDA, "cuda forward: cannot allocate %zu MiB for %s: %s",
                                 allocs[i].bytes >> 20, allocs[i].what, cudaGetErrorString(e));
    }
    return QRL_OK;
}

/* The views into the activation, metadata, sampler and rope allocations. */
static void carve_scratch(qrl_cuda_forward *f) {
    const qrl_model_config *cfg = &f->cfg;
    size_t D = cfg->dim, F = cfg->hidden_dim, V = cfg->vocab_size, hd = cfg->head_dim,
           Q = (size_t)cfg->n_heads * hd, KV = (size_t)cfg->n_kv_heads * hd, R = f->d.max_rows;
    size_t W = Q + 2 * KV, half = hd / 2;
    f->sin_tab = f->cos_tab + (size_t)f->d.max_ctx * half;
    f->d_tok = f->d_meta + 3 * R;
    f->proj = f->x + R * D;
    f->q = f->proj + R * max_sz(max_sz(W, 2 * F), D);
    f->logits = f->q + R * Q;
    f->work = f->logits + R * V;
    f->d_lp = f->work + f->work_floats;
    f->kvf = f->d_lp + R;
    if (f->prec->a4) f->a4_sdec = f->kvf + R * 2 * KV;
    f->d_runs = f->d_meta + 4 * R;
    f->d_sout = (qrl_cuda_sample_out *)(f->d_sreq + R);
    f->h_sout = (qrl_cuda_sample_out *)(f->h_sreq + R);
    f->att = f->xb + R * xb_elems(f);
}

/* The quantized KV arena, layer by layer (the order size_kv_scratch counts). */
static void carve_kvq(qrl_cuda_forward *f, const layout *lo) {
    const qrl_model_config *cfg = &f->cfg;
    int fmt = f->d.kv_format, hd = cfg->head_dim;
    unsigned char *qp = (unsigned char *)f->kv;
    size_t cb = (size_t)qrl_cuda_kvq_code_bytes(fmt, hd), sf = qrl_cuda_kvq_scale_floats(fmt, hd);
    for (int l = 0; l < cfg->n_layers; l++) {
        qrl_cuda_kvq_layer *c = &f->kvq[l];
        c->format = fmt;
        for (int w = 0; w < 2; w++) {
            c->codes[w] = qp; qp += up256(lo->recs * cb);
            c->scales[w] = sf ? (float *)qp : NULL; qp += up256(lo->recs * sf * 4);
        }
        c->fp8_scale = (float *)qp; qp += up256((size_t)f->slots * cfg->n_kv_heads * 2 * 4);
        for (int w = 0; w < 2; w++) {
            c->side_codes[w] = (int8_t *)qp; qp += up256(lo->side_recs * hd);
            c->side_scales[w] = (float *)qp; qp += up256(lo->side_recs * 4);
        }
        c->sink = f->d.protected_sink;
        c->recent = f->d.protected_recent;
        c->ring = lo->ring;
        c->block_tables = f->d_tables;
        c->max_blocks_per_seq = f->max_blocks;
        c->block_size = f->d.block_size;
        c->n_kv_heads = cfg->n_kv_heads;
        c->head_dim = hd;
    }
    QRL_CHECK((size_t)(qp - (unsigned char *)f->kv) <= f->kv_pool_bytes);
}

/* The BF16 weight arena (the order upload and init_random fill). */
static void carve_weights(qrl_cuda_forward *f) {
    const qrl_model_config *cfg = &f->cfg;
    size_t D = cfg->dim, F = cfg->hidden_dim, V = cfg->vocab_size, hd = cfg->head_dim,
           Q = (size_t)cfg->n_heads * hd, KV = (size_t)cfg->n_kv_heads * hd;
    size_t W = Q + 2 * KV;
    uint16_t *p = f->warena;
    f->embed = p; p += V * D;
    f->final_norm = p; p += D;
    f->lm_head = f->embed;
    if (!cfg->tie_embeddings) { f->lm_head = p; p += V * D; }
    for (int l = 0; l < cfg->n_layers; l++) {
        layer_dev *w = &f->layers[l];
        w->attn_norm = p; p += D;
        w->ffn_norm = p; p += D;
        if (cfg->qk_norm) { w->q_norm = p; p += hd; w->k_norm = p; p += hd; }
        if (f->prec->proj != PROJ_BF16) continue;
        w->wqkv = p; p += W * D;
        if (cfg->qkv_bias) { w->bqkv = p; p += W; }
        w->wo = p; p += D * Q;
        if (cfg->o_bias) { w->bo = p; p += D; }
        w->wgu = p; p += 2 * F * D;
        w->wdown = p; p += D * F;
    }
    QRL_CHECK((size_t)(p - f->warena) == f->warena_elems);
}

/* The quantized weight arena (the order size_w8a8 / size_fp4 count): per layer and
 * projection codes, (fp4) block scales, scales, bias; then w8a8's activation codes, scales
 * and split-K workspace, or fp4's BF16 prefill scratch. */
static void carve_qweights(qrl_cuda_forward *f, const layout *lo) {
    const qrl_model_config *cfg = &f->cfg;
    bool fp4 = f->prec->proj == PROJ_FP4, mx = f->prec->mx;
    size_t R = f->d.max_rows;
    unsigned char *qp = f->qarena;
    for (int l = 0; l < cfg->n_layers; l++) {
        qlin_dev *ql[4] = {&f->layers[l].qkv, &f->layers[l].o, &f->layers[l].gu,
                           &f->layers[l].down};
        for (int i = 0; i < 4; i++) {
            size_t rows = (size_t)lo->q_rows[i];
            ql[i]->codes = qp;
            qp += up256(rows * (fp4 ? (size_t)qrl_cuda_fp4_code_bytes(lo->q_ins[i])
                                    : (size_t)qrl_cuda_w8a8_ld(lo->q_ins[i])));
            if (fp4) { ql[i]->bscales = qp; qp += up256(rows * qrl_cuda_fp4_scale_bytes(lo->q_ins[i], mx)); }
            ql[i]->scales = (float *)qp; qp += up256(rows * 4);
            if (qlin_has_bias(cfg, i)) { ql[i]->bias = (float *)qp; qp += up256(rows * 4); }
        }
    }
    if (fp4) {
        if (f->fp4_work_elems) f->fp4_work = (uint16_t *)qp;
        qp += up256(f->fp4_work_elems * 2);
    } else {
        f->xq = qp; qp += up256(R * lo->max_ld);
        f->sx = (float *)qp; qp += up256(R * 4);
        f->gwork = (float *)qp; qp += up256(f->gwork_floats * 4);
    }
    QRL_CHECK((size_t)(qp - f->qarena) == f->qarena_bytes);
}

qrl_status qrl_cuda_forward_new(const qrl_model_config *cfg, const qrl_cuda_forward_desc *d,
                                qrl_cuda_forward **out, qrl_error *err) {
    *out = NULL;
    const cuda_precision *prec = NULL;
    QRL_TRY(check_desc(cfg, d, err));
    QRL_TRY(find_precision(d->precision, &prec, err));
    qrl_cuda_forward *f = calloc(1, sizeof *f);
    if (!f) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: out of memory");
    f->prec = prec;
    f->fuse_q = prec->proj == PROJ_W8A8 && !qrl_tuning_bool(QRL_TUNING_W8A8_UNFUSED);
    f->fuse_kv = !qrl_tuning_bool(QRL_TUNING_KV_STORE_UNFUSED);
    f->defer_epi = prec->proj == PROJ_W8A8 && !qrl_tuning_bool(QRL_TUNING_W8A8_EPILOGUE_PASS);
    f->cfg = *cfg;
    f->d = *d;
    if (f->d.max_ctx > cfg->max_seq_len) f->d.max_ctx = cfg->max_seq_len;
    f->max_blocks = (f->d.max_ctx + d->block_size - 1) / d->block_size;
    f->slots = d->max_seqs + 1;
    f->pool_blocks = d->n_blocks + 1;
    f->pad_seq = d->max_seqs;
    f->graphs_off = d->eager;
    layout lo = {0};
    size_weights(f, &lo);
    qrl_status st = size_kv_scratch(f, &lo, err);
    if (st != QRL_OK) { /* nothing allocated yet (freeing would start a CUDA context) */
        free(f);
        return st;
    }
    QRL_TRY_GOTO(alloc_host(f, err), fail);
    QRL_TRY_GOTO(alloc_device(f, &lo, err), fail);
    carve_scratch(f);
    if (f->quant) carve_kvq(f, &lo);
    carve_weights(f);
    if (f->prec->proj != PROJ_BF16) carve_qweights(f, &lo);
    QRL_TRY_GOTO(cuda_st(cudaMemsetAsync(f->d_tables, 0, (size_t)f->slots * f->max_blocks * 4,
                                         f->stream), "memset", err), fail);
    QRL_TRY_GOTO(qrl_cuda_forward_pad_seq_init(f, err), fail);
    *out = f;
    return QRL_OK;
fail:
    qrl_cuda_forward_free(f);
    return st;
}
#else
typedef int qrl_forward_cuda_new_unused_; /* ISO C forbids an empty translation unit */
#endif
