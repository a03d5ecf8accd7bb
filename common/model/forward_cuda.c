/* CUDA forward pass: BF16, W8A8 (INT8, FP8), W4A16 (NVFP4, MXFP4) or W4A4 NVFP4 weights, BF16 or quantized paged KV (see
 * forward_cuda.h). */
#ifdef QRL_HAVE_CUDA
#include "model/forward_cuda_internal.h"

#include "core/log.h"

void *qrl_cuda_forward_stream(const qrl_cuda_forward *f) { return f->stream; }

/* Bytes of one token-head record (codes + F32 fields) of the main store. */
static size_t rec_bytes(const qrl_cuda_forward *f) {
    int fmt = f->d.kv_format, hd = f->cfg.head_dim;
    if (!f->quant) return (size_t)hd * 2;
    return (size_t)qrl_cuda_kvq_code_bytes(fmt, hd) + 4 * (size_t)qrl_cuda_kvq_scale_floats(fmt, hd);
}

size_t qrl_cuda_forward_kv_bytes_per_pos(const qrl_cuda_forward *f) {
    return (size_t)f->cfg.n_layers * 2 * f->cfg.n_kv_heads * rec_bytes(f);
}

size_t qrl_cuda_forward_kv_bytes_read(const qrl_cuda_forward *f, int n_ctx) {
    size_t per = (size_t)f->cfg.n_layers * 2 * f->cfg.n_kv_heads;
    if (f->d.kv_format != QRL_KV_FORMAT_INT4_PROTECTED) return per * rec_bytes(f) * (size_t)n_ctx;
    int a = f->d.protected_sink < n_ctx ? f->d.protected_sink : n_ctx;
    int b = n_ctx - f->d.protected_recent > a ? n_ctx - f->d.protected_recent : a;
    return per * (rec_bytes(f) * (size_t)(b - a) + ((size_t)f->cfg.head_dim + 4) * (size_t)(a + n_ctx - b));
}

qrl_kv_format qrl_cuda_forward_kv_format(const qrl_cuda_forward *f) { return f->d.kv_format; }

size_t qrl_cuda_forward_weight_bytes(const qrl_cuda_forward *f) {
    const qrl_model_config *c = &f->cfg;
    size_t embed = (size_t)c->vocab_size * c->dim;
    size_t total = f->warena_elems - (c->tie_embeddings ? 0 : embed);
    return total * 2 + f->qweight_bytes; /* tied: the table is read as the LM head */
}

qrl_precision qrl_cuda_forward_precision(const qrl_cuda_forward *f) {
    return f->prec->runs_as;
}

static qrl_status reserve(qrl_cuda_forward *f, int seq, int n, qrl_error *err);

/* The padding rows' sequence: one block at position 0 and fp8 head scales of 1 (never
 * calibrated: its K/V are never read by a caller's row). */
qrl_status qrl_cuda_forward_pad_seq_init(qrl_cuda_forward *f, qrl_error *err) {
    int p = f->pad_seq, KVH = f->cfg.n_kv_heads;
    f->seq_used[p] = 1;
    f->fp8_ready[p] = 1;
    QRL_TRY(reserve(f, p, 1, err));
    qrl_status st = QRL_OK;
    if (f->d.kv_format == QRL_KV_FORMAT_FP8) {
        float *ones = malloc((size_t)KVH * 2 * sizeof *ones);
        if (!ones) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: pad scales");
        for (int i = 0; i < 2 * KVH; i++) ones[i] = 1.0f;
        for (int l = 0; l < f->cfg.n_layers && st == QRL_OK; l++)
            st = cuda_st(cudaMemcpy(f->kvq[l].fp8_scale + (size_t)p * KVH * 2, ones,
                                    (size_t)KVH * 2 * 4, cudaMemcpyHostToDevice), "pad scales", err);
        free(ones);
    }
    if (st == QRL_OK) st = cuda_st(cudaStreamSynchronize(f->stream), "pad sequence", err);
    return st;
}

static void graphs_drop(qrl_cuda_forward *f) {
    for (int i = 0; i < QRL_CUDA_GRAPH_SLOTS; i++)
        if (f->graphs[i].rows) cudaGraphExecDestroy(f->graphs[i].exec);
    memset(f->graphs, 0, sizeof f->graphs);
}

qrl_status qrl_cuda_forward_set_recorder(qrl_cuda_forward *f, qrl_cuda_trace_recorder *rec,
                                         qrl_error *err) {
    if (rec) {
        bool lin = false;
        for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++)
            lin |= (QRL_TRACE_KINDS_LINEAR >> k & 1u) &&
                   qrl_cuda_trace_recorder_has_kind(rec, (qrl_trace_site_kind)k);
        bool kv = qrl_cuda_trace_recorder_has_kind(rec, QRL_TRACE_SITE_K) ||
                  qrl_cuda_trace_recorder_has_kind(rec, QRL_TRACE_SITE_V);
        if (lin && f->fuse_q)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda forward: TRACE linear sites "
                                 "on a fused w8a8 engine (no BF16 GEMM inputs to capture)");
        if (kv && !f->quant)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda forward: TRACE k / v sites "
                                 "need a quantized KV cache (kv %s writes no F32 rows)",
                                 qrl_kv_format_name(f->d.kv_format));
    }
    graphs_drop(f);
    f->rec = rec;
    return QRL_OK;
}

void qrl_cuda_forward_graph_stats(const qrl_cuda_forward *f, long *captures, long *replays) {
    *captures = f->graph_captures;
    *replays = f->graph_replays;
}

void qrl_cuda_forward_free(qrl_cuda_forward *f) {
    if (!f) return;
    cudaFree(f->warena); cudaFree(f->kv); cudaFree(f->cos_tab); cudaFree(f->d_tables);
    cudaFree(f->d_meta); cudaFree(f->x); cudaFree(f->xb); cudaFree(f->qarena);
    cudaFree(f->d_sreq); free(f->h_sreq);
    graphs_drop(f);
    qrl_cuda_gemm_free(f->gemm);
    if (f->stream) cudaStreamDestroy(f->stream);
    free(f->layers); free(f->h_tables); free(f->h_meta); free(f->seq_len); free(f->seq_blocks);
    free(f->seq_used); free(f->free_blocks); free(f->fp8_ready); free(f->kvq);
    free(f);
}

/* ---- sequences ------------------------------------------------------------------ */

qrl_status qrl_cuda_forward_seq_new(qrl_cuda_forward *f, int *seq, qrl_error *err) {
    for (int s = 0; s < f->d.max_seqs; s++)
        if (!f->seq_used[s]) {
            f->seq_used[s] = 1;
            f->seq_len[s] = 0;
            f->fp8_ready[s] = 0;
            f->seq_blocks[s] = 0;
            *seq = s;
            return QRL_OK;
        }
    return qrl_error_set(err, QRL_STATUS_BUSY, "cuda forward: all %d sequence slots taken",
                         f->d.max_seqs);
}

void qrl_cuda_forward_seq_free(qrl_cuda_forward *f, int seq) {
    if (seq < 0 || seq >= f->d.max_seqs || !f->seq_used[seq]) return;
    for (int i = 0; i < f->seq_blocks[seq]; i++)
        f->free_blocks[f->n_free++] = f->h_tables[(size_t)seq * f->max_blocks + i];
    f->seq_used[seq] = 0;
    f->seq_len[seq] = 0;
    f->seq_blocks[seq] = 0;
}

int qrl_cuda_forward_seq_len(const qrl_cuda_forward *f, int seq) { return f->seq_len[seq]; }

/* Blocks for positions [0, n); new table entries go to the device (async, in order). */
static qrl_status reserve(qrl_cuda_forward *f, int seq, int n, qrl_error *err) {
    QRL_CHECK(seq >= 0 && seq < f->slots && f->seq_used[seq]);
    if (n > f->d.max_ctx)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda forward: sequence %d needs %d positions, context is %d", seq,
                             n, f->d.max_ctx);
    int need = (n + f->d.block_size - 1) / f->d.block_size, have = f->seq_blocks[seq];
    if (need <= have) return QRL_OK;
    if (need - have > f->n_free)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda forward: KV pool exhausted (%d free, "
                             "sequence %d needs %d more)", f->n_free, seq, need - have);
    int32_t *row = f->h_tables + (size_t)seq * f->max_blocks;
    for (int i = have; i < need; i++) row[i] = f->free_blocks[--f->n_free];
    f->seq_blocks[seq] = need;
    return cuda_st(cudaMemcpyAsync(f->d_tables + (size_t)seq * f->max_blocks + have, row + have,
                                   (size_t)(need - have) * 4, cudaMemcpyHostToDevice, f->stream),
                   "block table upload", err);
}

/* A caller's sequence id: in range, in use (never the internal padding sequence). */
static qrl_status check_seq(const qrl_cuda_forward *f, int seq, const char *what, qrl_error *err) {
    if (seq < 0 || seq >= f->d.max_seqs || !f->seq_used[seq])
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: sequence %d not in use", what, seq);
    return QRL_OK;
}

qrl_status qrl_cuda_forward_seq_reserve(qrl_cuda_forward *f, int seq, int n, qrl_error *err) {
    QRL_TRY(check_seq(f, seq, "seq_reserve", err));
    return reserve(f, seq, n, err);
}

void qrl_cuda_forward_seq_clear(qrl_cuda_forward *f, int seq) {
    if (seq < 0 || seq >= f->d.max_seqs || !f->seq_used[seq]) return;
    for (int i = 0; i < f->seq_blocks[seq]; i++)
        f->free_blocks[f->n_free++] = f->h_tables[(size_t)seq * f->max_blocks + i];
    f->seq_len[seq] = 0;
    f->seq_blocks[seq] = 0;
    f->fp8_ready[seq] = 0;
}

int qrl_cuda_forward_free_blocks(const qrl_cuda_forward *f) { return f->n_free; }

qrl_status qrl_cuda_forward_seq_set_len_unwritten(qrl_cuda_forward *f, int seq, int len,
                                                  qrl_error *err) {
    QRL_TRY(check_seq(f, seq, "seq_set_len_unwritten", err));
    QRL_TRY(reserve(f, seq, len, err));
    f->seq_len[seq] = len;
    return cuda_st(cudaStreamSynchronize(f->stream), "table sync", err);
}

/* ---- the pass ------------------------------------------------------------------- */

/* y [n, m] F32 = a projection of x [n, k] (BF16): the BF16 GEMM, w8a8 (per-token INT8
 * or E4M3 quantization of x, the W8A8 GEMM with its epilogue and the F32 bias; defer
 * (optional): the GEMM may leave its epilogue to y's reader, qrl_cuda_w8a8_gemm_args) or w4a16
 * (the FP4 GEMM on x as it is, row scale and F32 bias; w4a4: x is already the NVFP4
 * values of the activations and f->a4_sdec their per-token 1 / S_enc).  xq_ready: w8a8 only, x's codes
 * are already in f->xq / f->sx (written by the norm or SwiGLU, act_q) and x is unused. */
static qrl_status project(qrl_cuda_forward *f, float *y, const uint16_t *x, const uint16_t *w,
                          const qlin_dev *q, int n, int k, int m, bool xq_ready,
                          qrl_cuda_w8a8_epi *defer, qrl_error *err) {
    if (defer) defer->on = false; /* set again only by a W8A8 GEMM that leaves its epilogue */
    if (f->prec->proj == PROJ_FP4) {
        qrl_cuda_fp4_gemm_args a = {.y = y, .x = x, .codes = q->codes, .scales = q->bscales,
                                    .row_scale = q->scales, .x_scale = f->a4_sdec,
                                    .bias = q->bias, .T = n, .N = m,
                                    .K = k, .mx = f->prec->mx, .kernel = QRL_CUDA_FP4_AUTO,
                                    .work = f->fp4_work, .work_elems = f->fp4_work_elems,
                                    .blas = f->gemm};
        return qrl_cuda_fp4_gemm(&a, f->stream, err);
    }
    if (f->prec->proj == PROJ_BF16) return qrl_cuda_gemm_bf16(f->gemm, y, x, w, n, k, m, f->stream, err);
    int ld = qrl_cuda_w8a8_ld(k);
    if (!xq_ready && f->prec->fp8)
        QRL_TRY(qrl_cuda_fp8_quantize_rows(f->xq, f->sx, x, 1, n, k, ld, f->stream, err));
    else if (!xq_ready)
        QRL_TRY(qrl_cuda_int8_quantize_rows((int8_t *)f->xq, f->sx, x, 1, n, k, ld, f->stream, err));
    qrl_cuda_w8a8_gemm_args a = {.y = y, .xq = f->xq, .sx = f->sx, .wq = q->codes,
                                 .sw = q->scales, .bias = q->bias, .T = n, .N = m, .ld = ld,
                                 .fp8 = f->prec->fp8, .kernel = QRL_CUDA_W8A8_AUTO, .work = f->gwork,
                                 .work_floats = f->gwork_floats, .blas = f->gemm,
                                 .defer = defer};
    return qrl_cuda_w8a8_gemm(&a, f->stream, err);
}

/* Where the norm or SwiGLU before a projection of k inputs writes its codes when the w8a8
 * quantization is fused (f->fuse_q; project's xq_ready). */
static qrl_cuda_w8a8_act act_q(const qrl_cuda_forward *f, int k) {
    return (qrl_cuda_w8a8_act){.q = f->xq, .scales = f->sx, .ld = qrl_cuda_w8a8_ld(k), .fp8 = f->prec->fp8};
}

/* Upload the metadata of n rows described by h_meta (tokens, seqs, positions at [0, R),
 * [R, 2R), [2R, 3R); packed to [3, n] here) and, fp8, the runs of rows of sequences whose
 * head scales this pass calibrates (*n_runs of them). */
static qrl_status upload_rows(qrl_cuda_forward *f, int n, int *n_runs_out, qrl_error *err) {
    int R = f->d.max_rows;
    memmove(f->h_meta + n, f->h_meta + R, (size_t)n * 4);      /* pack to [3, n] (overlaps */
    memmove(f->h_meta + 2 * n, f->h_meta + 2 * R, (size_t)n * 4); /* when n > R / 2) */
    QRL_TRY(cuda_st(cudaMemcpyAsync(f->d_meta, f->h_meta, (size_t)3 * n * 4,
                                    cudaMemcpyHostToDevice, f->stream), "meta upload", err));
    /* fp8: runs of rows of sequences without scales yet calibrate them (as the CPU's
     * qrl_kv_cache_calibrate on the sequence's first pass) */
    int n_runs = 0;
    if (f->d.kv_format == QRL_KV_FORMAT_FP8) {
        int32_t *runs = f->h_meta + 3 * R;
        for (int r = 0; r < n;) {
            int e = r + 1, sq = f->h_meta[n + r]; /* packed: seqs at [n, 2n) */
            while (e < n && f->h_meta[n + e] == sq) e++;
            if (!f->fp8_ready[sq]) runs[n_runs] = r, runs[R + n_runs] = e - r, runs[2 * R + n_runs++] = sq;
            r = e;
        }
        if (n_runs) {
            memmove(runs + n_runs, runs + R, (size_t)n_runs * 4);
            memmove(runs + 2 * n_runs, runs + 2 * R, (size_t)n_runs * 4);
            QRL_TRY(cuda_st(cudaMemcpyAsync(f->d_runs, runs, (size_t)3 * n_runs * 4,
                                            cudaMemcpyHostToDevice, f->stream), "runs upload", err));
        }
    }
    *n_runs_out = n_runs;
    return QRL_OK;
}

/* The pass over n uploaded rows (upload_rows): kernels only (no host synchronization, no
 * copies), so a decode step can be captured as a CUDA graph; logits (device) for rows
 * [from, n).  max_len bounds every row's position + 1 (the attention's split plan). */
static qrl_status launch_rows(qrl_cuda_forward *f, int n, int max_len, int from, int n_runs,
                              qrl_error *err) {
    const qrl_model_config *c = &f->cfg;
    int D = c->dim, F = c->hidden_dim, hd = c->head_dim, H = c->n_heads, KVH = c->n_kv_heads;
    int Q = H * hd, KV = KVH * hd;
    void *s = f->stream;
    const int32_t *tok = f->d_meta, *rseq = f->d_meta + n, *rpos = f->d_meta + 2 * n;
    QRL_TRY(qrl_cuda_embed(f->x, f->embed, tok, n, D, s, err));
    /* fused w8a8: the norms and SwiGLU write only codes (no BF16 rows) */
    bool fq = f->fuse_q;
    qrl_cuda_w8a8_act aq_d = act_q(f, D), aq_f = act_q(f, F);
    const qrl_cuda_w8a8_act *qd = fq ? &aq_d : NULL, *qf = fq ? &aq_f : NULL;
    uint16_t *xb = fq ? NULL : f->xb;
    /* TRACE: the rows each site's quantizer reads, captured right after they are written
     * (one NULL test per site when not recording); in w4a4 the activation quantizers write
     * the linear sites' records themselves (SINK: the F32 values they quantize are never in
     * memory, xb holds the codes' values) */
#define CAPTURE(kind, src, bf16, stride)                                                    \
    if (f->rec)                                                                             \
    QRL_TRY(qrl_cuda_trace_recorder_capture(f->rec, l, kind, src, bf16, stride, n, err))
#define SINK(kind, len)                                                                     \
    if (f->rec) qrl_cuda_trace_recorder_sink(f->rec, l, kind, len, &a4q)
    /* w4a4-nvfp4: the four projection inputs quantized per token into xb / a4_sdec, fused
     * into the norms and SwiGLU (one block per row already: the row absmax is one more
     * block reduction); the attention output by a separate kernel (its row spans heads
     * computed by different blocks, a split-K merge: no single block sees the row) */
    bool a4 = f->prec->a4;
    qrl_cuda_nvfp4_act a4q = {.xq = f->xb, .s_dec = f->a4_sdec};
    /* w8a8: o's and down's GEMMs may leave their epilogue to the norm that reads f->proj
     * next (the ffn norm; the next attention norm or the final norm), saving a pass over
     * it; the norm finishes each value with the pass's operations (bit-identical).  Not
     * while TRACE records (the passes exactly as they were). */
    qrl_cuda_w8a8_epi epi = {0};
    qrl_cuda_w8a8_epi *de = f->defer_epi && !f->rec ? &epi : NULL;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_dev *w = &f->layers[l];
        uint16_t *kc = f->kv + (size_t)l * 2 * f->kv_layer_elems, *vc = kc + f->kv_layer_elems;
        if (a4) {
            SINK(QRL_TRACE_SITE_ATTN_IN, D);
            QRL_TRY(qrl_cuda_rmsnorm_nvfp4(NULL, f->x, l ? f->proj : NULL, NULL, w->attn_norm, n,
                                           D, c->norm_eps, &a4q, s, err));
        } else {
            QRL_TRY(qrl_cuda_rmsnorm_w8a8(xb, f->x, l ? f->proj : NULL, NULL, w->attn_norm, n, D,
                                          c->norm_eps, qd, l ? de : NULL, s, err));
            CAPTURE(QRL_TRACE_SITE_ATTN_IN, f->xb, true, D);
        }
        QRL_TRY(project(f, f->proj, f->xb, w->wqkv, &w->qkv, n, D, Q + 2 * KV, fq, NULL, err));
        qrl_cuda_rope_kv_args ra = {
            .qkv = f->proj, .bias = w->bqkv, .q_norm = w->q_norm, .k_norm = w->k_norm,
            .eps = c->norm_eps, .cos_tab = f->cos_tab, .sin_tab = f->sin_tab,
            .interleaved = c->rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED, .row_seq = rseq,
            .row_pos = rpos, .block_tables = f->d_tables, .max_blocks_per_seq = f->max_blocks,
            .block_size = f->d.block_size, .k_cache = kc, .v_cache = vc, .q_out = f->q, .n = n,
            .n_heads = H, .n_kv_heads = KVH, .head_dim = hd, .kv_out = f->quant ? f->kvf : NULL};
        /* int8 / int4 / int4-protected, fp8 once calibrated: the RoPE kernel quantizes K and
         * V straight into the cache (no F32 rows, no store launch), unless TRACE reads the
         * F32 rows or the A/B knob keeps the separate store */
        bool kv_direct = f->quant && f->fuse_kv && !f->rec && !n_runs &&
                         f->kvq[l].format != QRL_CUDA_KVQ_FP4;
        if (kv_direct) ra.kvq_store = 1, ra.kvq = f->kvq[l];
        QRL_TRY(qrl_cuda_rope_kv(&ra, s, err));
        if (f->quant) {
            const qrl_cuda_kvq_layer *kq = &f->kvq[l];
            /* fp4 KV: k / v records are the cache's own (S_enc, scales, codes), copied by
             * the store; the other formats: NVFP4 of the F32 rows the store quantizes */
            bool kv4 = kq->format == QRL_CUDA_KVQ_FP4;
            uint8_t *kv4_copy = kv4 && f->rec ? qrl_cuda_trace_recorder_kv_copy(f->rec, l) : NULL;
            if (!kv4) {
                CAPTURE(QRL_TRACE_SITE_K, f->kvf, false, 2 * KV);
                CAPTURE(QRL_TRACE_SITE_V, f->kvf + KV, false, 2 * KV);
            }
            if (n_runs) QRL_TRY(qrl_cuda_kv_fp8_calibrate(kq, f->kvf, f->d_runs, n_runs, s, err));
            if (!kv_direct) QRL_TRY(qrl_cuda_kv_store_copy(kq, f->kvf, rseq, rpos, n, kv4_copy, s, err));
            if (kv4_copy) QRL_TRY(qrl_cuda_trace_recorder_capture_kv_fp4(f->rec, l, f->kvf, n, err));
            QRL_TRY(qrl_cuda_attention_q(kq, f->att, f->q, rseq, rpos, n, H, 1.0f / sqrtf((float)hd),
                                         max_len, f->work, f->work_floats, s, err));
            goto post_attention;
        }
        qrl_cuda_attention_args aa = {
            .out = f->att, .q = f->q, .k_cache = kc, .v_cache = vc, .block_tables = f->d_tables,
            .max_blocks_per_seq = f->max_blocks, .block_size = f->d.block_size, .row_seq = rseq,
            .row_pos = rpos, .n = n, .n_heads = H, .n_kv_heads = KVH, .head_dim = hd,
            .scale = 1.0f / sqrtf((float)hd), .max_len = max_len, .work = f->work,
            .work_floats = f->work_floats};
        QRL_TRY(qrl_cuda_attention(&aa, s, err));
    post_attention:
        if (a4) {
            SINK(QRL_TRACE_SITE_ATTN_OUT, Q);
            QRL_TRY(qrl_cuda_nvfp4_quantize_rows(&a4q, f->att, true, n, Q, s, err));
        } else {
            CAPTURE(QRL_TRACE_SITE_ATTN_OUT, f->att, true, Q);
        }
        QRL_TRY(project(f, f->proj, a4 ? f->xb : f->att, w->wo, &w->o, n, Q, D, false, de, err));
        if (a4) {
            SINK(QRL_TRACE_SITE_MLP_IN, D);
            QRL_TRY(qrl_cuda_rmsnorm_nvfp4(NULL, f->x, f->proj, w->bo, w->ffn_norm, n, D,
                                           c->norm_eps, &a4q, s, err));
        } else {
            QRL_TRY(qrl_cuda_rmsnorm_w8a8(xb, f->x, f->proj, w->bo, w->ffn_norm, n, D,
                                          c->norm_eps, qd, de, s, err));
            CAPTURE(QRL_TRACE_SITE_MLP_IN, f->xb, true, D);
        }
        QRL_TRY(project(f, f->proj, f->xb, w->wgu, &w->gu, n, D, 2 * F, fq, NULL, err));
        if (a4) {
            SINK(QRL_TRACE_SITE_MLP_DOWN, F);
            QRL_TRY(qrl_cuda_swiglu_nvfp4(NULL, f->proj, n, F, &a4q, s, err));
        } else {
            QRL_TRY(qrl_cuda_swiglu_w8a8(xb, f->proj, n, F, qf, s, err));
            CAPTURE(QRL_TRACE_SITE_MLP_DOWN, f->xb, true, F);
        }
        QRL_TRY(project(f, f->proj, f->xb, w->wdown, &w->down, n, F, D, fq, de, err));
    }
#undef CAPTURE
#undef SINK
    QRL_TRY(qrl_cuda_rmsnorm_w8a8(f->xb, f->x, f->proj, NULL, f->final_norm, n, D, c->norm_eps,
                                  NULL, de, s, err));
    if (from < n)
        QRL_TRY(qrl_cuda_gemm_bf16(f->gemm, f->logits, f->xb + (size_t)from * D, f->lm_head,
                                   n - from, D, c->vocab_size, s, err));
    return QRL_OK;
}

/* Every sequence of the n packed rows has its fp8 scales once the pass has run. */
static void mark_calibrated(qrl_cuda_forward *f, int n) {
    for (int r = 0; r < n; r++) f->fp8_ready[f->h_meta[n + r]] = 1;
}

/* Rows described by h_meta (tokens, seqs, positions) for n rows; logits (device) for rows
 * [from, n). */
static qrl_status run_rows(qrl_cuda_forward *f, int n, int max_len, int from, qrl_error *err) {
    int n_runs = 0;
    QRL_TRY(upload_rows(f, n, &n_runs, err));
    QRL_TRY(launch_rows(f, n, max_len, from, n_runs, err));
    mark_calibrated(f, n);
    return QRL_OK;
}

/* ---- CUDA graphs for the decode step ---------------------------------------------- */

/* Rows a graph is captured for: 1, 2, 4, then multiples of 8 (vLLM's capture sizes),
 * clamped to max_rows. */
static int graph_rows(const qrl_cuda_forward *f, int n) {
    int p = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : (n + 7) / 8 * 8;
    return p < f->d.max_rows ? p : f->d.max_rows;
}

/* The attention's planning length: max_len rounded up to a multiple of 64 and of 1/16 of
 * its power of two (<= ~6% over), clamped to the context: a bucket keeps one graph for
 * 64-512 consecutive steps of a growing batch. */
static int len_bucket(const qrl_cuda_forward *f, int max_len) {
    int g = 64;
    while (g * 32 <= max_len) g *= 2;
    int b = (max_len + g - 1) / g * g;
    return b < f->d.max_ctx ? b : f->d.max_ctx;
}

/* The graph for (rows, len): a kept one, or captured now (evicting the least recently
 * used).  *exec NULL when the capture failed: graphs are then off for the engine. */
static qrl_status graph_get(qrl_cuda_forward *f, int rows, int len, cudaGraphExec_t *exec,
                            qrl_error *err) {
    *exec = NULL;
    graph_slot *victim = &f->graphs[0];
    for (int i = 0; i < QRL_CUDA_GRAPH_SLOTS; i++) {
        graph_slot *g = &f->graphs[i];
        if (g->rows == rows && g->len == len) {
            g->used = ++f->graph_clock;
            f->graph_replays++;
            *exec = g->exec;
            return QRL_OK;
        }
        if (!g->rows || (victim->rows && g->used < victim->used)) victim = g;
    }
    cudaStream_t s = f->stream;
    cudaGraph_t graph = NULL;
    qrl_error cap_err;
    qrl_status st = QRL_OK;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        f->graphs_off = true;
        QRL_LOG_WARN("cuda", "cannot begin a decode step graph capture: %s; decoding eagerly from "
                     "now on", cudaGetErrorString(e));
        return QRL_OK;
    }
    st = launch_rows(f, rows, len, 0, 0, &cap_err);
    e = cudaStreamEndCapture(s, &graph);
    cudaGraphExec_t x = NULL;
    if (st == QRL_OK && e == cudaSuccess) e = cudaGraphInstantiate(&x, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (st != QRL_OK || e != cudaSuccess) {
        cudaGetLastError(); /* clear the (non-sticky) error the failed capture left */
        f->graphs_off = true;
        QRL_LOG_WARN("cuda", "decode step graph capture failed (rows=%d len=%d): %s; decoding "
                     "eagerly from now on", rows, len,
                     st != QRL_OK ? cap_err.msg : cudaGetErrorString(e));
        return QRL_OK;
    }
    if (victim->rows) cudaGraphExecDestroy(victim->exec);
    *victim = (graph_slot){.rows = rows, .len = len, .exec = x, .used = ++f->graph_clock};
    f->graph_captures++;
    *exec = x;
    return QRL_OK;
}

qrl_status qrl_cuda_forward_prefill(qrl_cuda_forward *f, int seq, const int32_t *tokens, int n,
                                    float *logits, bool all_logits, qrl_error *err) {
    int V = f->cfg.vocab_size, R = f->d.max_rows;
    if (n <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "prefill: %d tokens (need >= 1)", n);
    if (seq < 0 || seq >= f->d.max_seqs || !f->seq_used[seq])
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "prefill: sequence %d not in use", seq);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "prefill: token %d (index %d) is outside the vocabulary [0, %d)",
                                 tokens[i], i, V);
    int len = f->seq_len[seq];
    if ((int64_t)len + n > f->d.max_ctx)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "prefill: %d tokens at position %d exceed the context of %d", n, len,
                             f->d.max_ctx);
    QRL_TRY(reserve(f, seq, len + n, err));
    /* int4-protected: a pass may hold at most RING_SLACK + 1 rows of a sequence (the side
     * ring's slack, kv_quant.cuh) */
    int chunk = R;
    if (f->d.kv_format == QRL_KV_FORMAT_INT4_PROTECTED && chunk > QRL_CUDA_KV_RING_SLACK + 1)
        chunk = QRL_CUDA_KV_RING_SLACK + 1;
    for (int c0 = 0; c0 < n; c0 += chunk) {
        int rows = n - c0 < chunk ? n - c0 : chunk;
        for (int r = 0; r < rows; r++) {
            f->h_meta[r] = tokens[c0 + r];
            f->h_meta[R + r] = seq;
            f->h_meta[2 * R + r] = len + c0 + r;
        }
        if (f->rec) QRL_TRY(qrl_cuda_trace_recorder_begin_pass(f->rec, c0, rows, f->h_meta + R, err));
        int from = rows;
        float *dst = NULL;
        if (logits && all_logits) from = 0, dst = logits + (size_t)c0 * V;
        else if (logits && c0 + rows == n) from = rows - 1, dst = logits;
        QRL_TRY(run_rows(f, rows, len + c0 + rows, from, err));
        if (f->rec) qrl_cuda_trace_recorder_poll(f->rec); /* host work while the pass runs */
        if (dst)
            QRL_TRY(cuda_st(cudaMemcpyAsync(dst, f->logits, (size_t)(rows - from) * V * 4,
                                            cudaMemcpyDeviceToHost, f->stream), "logits", err));
        QRL_TRY(cuda_st(cudaStreamSynchronize(f->stream), "prefill", err));
        f->seq_len[seq] = len + c0 + rows;
    }
    if (f->rec) qrl_cuda_trace_recorder_end_call(f->rec); /* targets are for one call */
    return QRL_OK;
}

/* The checks, KV reservation and pass of a decode step: logits [batch, vocab] in f->logits
 * on the device, sequence lengths not yet advanced. */
static qrl_status decode_rows(qrl_cuda_forward *f, const int *seqs, const int32_t *tokens,
                              int batch, qrl_error *err) {
    int V = f->cfg.vocab_size, R = f->d.max_rows;
    if (batch <= 0 || batch > R)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "decode: batch %d outside [1, %d] (max_rows)", batch, R);
    int max_len = 0;
    for (int i = 0; i < batch; i++) {
        int s = seqs[i];
        if (s < 0 || s >= f->d.max_seqs || !f->seq_used[s])
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "decode: sequence %d (batch row %d) not in use", s, i);
        if (tokens[i] < 0 || tokens[i] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "decode: token %d (batch row %d) is outside the vocabulary [0, %d)",
                                 tokens[i], i, V);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "decode: sequence %d appears twice in the batch (rows %d, %d)",
                                     s, j, i);
        if (f->seq_len[s] + 1 > f->d.max_ctx)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "decode: sequence %d is at the context limit of %d", s, f->d.max_ctx);
    }
    for (int i = 0; i < batch; i++) {
        QRL_TRY(reserve(f, seqs[i], f->seq_len[seqs[i]] + 1, err));
        f->h_meta[i] = tokens[i];
        f->h_meta[R + i] = seqs[i];
        f->h_meta[2 * R + i] = f->seq_len[seqs[i]];
        if (f->seq_len[seqs[i]] + 1 > max_len) max_len = f->seq_len[seqs[i]] + 1;
    }
    max_len = len_bucket(f, max_len);
    int rows = f->graphs_off ? batch : graph_rows(f, batch);
    for (int i = batch; i < rows; i++) { /* padding: position 0 of the internal sequence */
        f->h_meta[i] = 0;
        f->h_meta[R + i] = f->pad_seq;
        f->h_meta[2 * R + i] = 0;
    }
    if (f->rec) QRL_TRY(qrl_cuda_trace_recorder_begin_pass(f->rec, 0, rows, f->h_meta + R, err));
    int n_runs = 0;
    QRL_TRY(upload_rows(f, rows, &n_runs, err));
    cudaGraphExec_t exec = NULL;
    if (!f->graphs_off && n_runs == 0) QRL_TRY(graph_get(f, rows, max_len, &exec, err));
    if (exec && cudaGraphLaunch(exec, f->stream) != cudaSuccess) {
        cudaError_t e = cudaGetLastError(); /* a sticky error fails the eager launches too */
        graphs_drop(f);
        f->graphs_off = true;
        QRL_LOG_WARN("cuda", "decode step graph launch failed: %s; decoding eagerly from now on",
                     cudaGetErrorString(e));
        exec = NULL;
    }
    if (!exec) QRL_TRY(launch_rows(f, rows, max_len, 0, n_runs, err));
    if (f->rec) qrl_cuda_trace_recorder_poll(f->rec); /* host work while the pass runs */
    mark_calibrated(f, rows);
    return QRL_OK;
}

qrl_status qrl_cuda_forward_decode(qrl_cuda_forward *f, const int *seqs, const int32_t *tokens,
                                   int batch, float *logits, int32_t *greedy_tokens,
                                   float *greedy_logprob, qrl_error *err) {
    int V = f->cfg.vocab_size;
    QRL_TRY(decode_rows(f, seqs, tokens, batch, err));
    if (greedy_tokens || greedy_logprob) {
        QRL_TRY(qrl_cuda_greedy(f->logits, batch, V, f->d_tok, f->d_lp, f->stream, err));
        if (greedy_tokens)
            QRL_TRY(cuda_st(cudaMemcpyAsync(greedy_tokens, f->d_tok, (size_t)batch * 4,
                                            cudaMemcpyDeviceToHost, f->stream), "tokens", err));
        if (greedy_logprob)
            QRL_TRY(cuda_st(cudaMemcpyAsync(greedy_logprob, f->d_lp, (size_t)batch * 4,
                                            cudaMemcpyDeviceToHost, f->stream), "logprob", err));
    }
    if (logits)
        QRL_TRY(cuda_st(cudaMemcpyAsync(logits, f->logits, (size_t)batch * V * 4,
                                        cudaMemcpyDeviceToHost, f->stream), "logits", err));
    QRL_TRY(cuda_st(cudaStreamSynchronize(f->stream), "decode", err));
    for (int i = 0; i < batch; i++) f->seq_len[seqs[i]]++;
    if (f->rec) qrl_cuda_trace_recorder_end_call(f->rec); /* targets are for one call */
    return QRL_OK;
}

qrl_status qrl_cuda_forward_decode_sample(qrl_cuda_forward *f, const int *seqs,
                                          const int32_t *tokens, int batch,
                                          const qrl_sample_draw *draws, qrl_sample *out,
                                          qrl_error *row_err, qrl_error *err) {
    int V = f->cfg.vocab_size;
    for (int i = 0; i < batch && i < f->d.max_rows; i++) { /* decode_rows checks batch */
        const qrl_sample_draw *d = &draws[i];
        qrl_error e;
        if (qrl_sampling_params_validate(&d->params, &e) != QRL_OK)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "decode: batch row %d: %s", i,
                                 e.msg);
        f->h_sreq[i] = (qrl_cuda_sample_req){
            .seed = d->params.seed, .group = d->group, .response = d->response,
            .position = d->position, .temperature = d->params.temperature,
            .top_k = d->params.top_k, .top_p = d->params.top_p};
    }
    QRL_TRY(decode_rows(f, seqs, tokens, batch, err));
    QRL_TRY(cuda_st(cudaMemcpyAsync(f->d_sreq, f->h_sreq, (size_t)batch * sizeof *f->h_sreq,
                                    cudaMemcpyHostToDevice, f->stream), "sampler upload", err));
    QRL_TRY(qrl_cuda_sample(f->logits, batch, V, f->d_sreq, f->d_sout, f->stream, err));
    QRL_TRY(cuda_st(cudaMemcpyAsync(f->h_sout, f->d_sout, (size_t)batch * sizeof *f->h_sout,
                                    cudaMemcpyDeviceToHost, f->stream), "samples", err));
    QRL_TRY(cuda_st(cudaStreamSynchronize(f->stream), "decode", err));
    if (f->rec) qrl_cuda_trace_recorder_end_call(f->rec); /* targets are for one call */
    for (int i = 0; i < batch; i++) {
        f->seq_len[seqs[i]]++;
        const qrl_cuda_sample_out *o = &f->h_sout[i];
        qrl_error_clear(&row_err[i]);
        if (qrl_cuda_sample_check(o, &row_err[i]) != QRL_OK) continue;
        out[i] = (qrl_sample){.token = o->token, .logprob = o->logprob,
                              .logprob_truncated = o->logprob_truncated,
                              .truncated = o->truncated != 0};
    }
    return QRL_OK;
}
#else
typedef int qrl_forward_cuda_unused_; /* ISO C forbids an empty translation unit */
#endif
