/* GPU memory budget of the scheduler's CUDA engine (see gpu_memory.h). */
#include "rollout/gpu_memory.h"

#include <math.h>
#include <stdio.h>

#include "core/log.h"
#include "model/trace_rec.h"

static size_t cdiv(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

qrl_status qrl_gpu_budget_kv_blocks(const qrl_gpu_budget *b, int *kv_blocks, qrl_error *err) {
    *kv_blocks = 0;
    if (!(b->utilization > 0 && b->utilization <= 1))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "gpu memory utilization %g is outside (0, 1]", b->utilization);
    if (b->device_bytes == 0 || b->kv_bytes_per_pos == 0 || b->block_size < 1 || b->ctx_len < 1 ||
        b->max_slots < 1)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "gpu memory budget: device_bytes=%zu kv_bytes_per_pos=%zu block_size=%d "
                             "ctx_len=%d max_slots=%d must be > 0", b->device_bytes,
                             b->kv_bytes_per_pos, b->block_size, b->ctx_len, b->max_slots);
    size_t per_seq = cdiv((size_t)b->ctx_len, (size_t)b->block_size);
    size_t block_bytes = (size_t)b->block_size * b->kv_bytes_per_pos;
    size_t one_ctx = per_seq * block_bytes;
    /* the formula of gpu_memory.h, in doubles for the product, then whole bytes */
    double allowed = floor(b->utilization * (double)b->device_bytes);
    double used = (double)b->fixed_bytes + (double)b->max_slots * (double)b->slot_bytes;
    double budget = allowed - used;
    if (budget < (double)one_ctx)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "utilization %g of %.2f GiB = %.2f GiB; the engine needs "
                             "%.2f GiB for weights, activations and %d slots plus %.1f MiB of KV "
                             "cache for one full context (%d positions): raise the utilization or "
                             "lower the slots", b->utilization, (double)b->device_bytes / (1 << 30),
                             allowed / (1 << 30), used / (1 << 30), b->max_slots,
                             (double)one_ctx / (1 << 20), b->ctx_len);
    double blocks = floor(budget / (double)block_bytes);
    double cap = (double)b->max_slots * (double)per_seq;
    if (blocks > cap) blocks = cap;
    if (blocks > 2147483647.0) blocks = 2147483647.0;
    *kv_blocks = (int)blocks;
    return QRL_OK;
}

/* Bytes of one token-head K or V record of the CUDA engine's pool (rec_bytes of
 * model/forward_cuda.c: f32 runs as bf16; quantized codes plus their F32 fields). */
static size_t gpu_record_bytes(qrl_kv_format f, int hd) {
    switch (f) {
    case QRL_KV_FORMAT_FP8: return (size_t)hd;
    case QRL_KV_FORMAT_INT8: return (size_t)hd + 4;
    case QRL_KV_FORMAT_INT4:
    case QRL_KV_FORMAT_INT4_PROTECTED: return (size_t)hd / 2 + 8 * cdiv((size_t)hd, 32);
    default: return 2 * (size_t)hd;
    }
}

/* The CUDA TRACE recorder (model/trace_rec_cuda.h) when sc->trace_record: per slot a
 * window of record slabs (the layout's bytes per token rounded to 4); per pass of R rows
 * the row map and, with k / v sites, the fp4 KV record copies (kv_quant.cuh
 * qrl_cuda_kvq_fp4_copy_bytes).  Its pinned host staging (as many bytes as the store) is
 * not GPU memory.  A spec the layout refuses counts nothing (the scheduler refuses it). */
static void trace_bytes(const qrl_model *model, const qrl_scheduler_config *sc, size_t R,
                        size_t *per_slot, size_t *fixed) {
    *per_slot = *fixed = 0;
    if (!sc->trace_record) return;
    const qrl_model_config *c = &model->cfg;
    qrl_trace_sites sites = sc->trace_sites;
    if (sites.n_clauses == 0) qrl_trace_sites_default(&sites);
    qrl_trace_layout *l = NULL;
    if (qrl_trace_layout_new(&sites, c, model->precision == QRL_PRECISION_W4A4_NVFP4,
                             sc->kv_format == QRL_KV_FORMAT_FP4, &l, NULL) != QRL_OK)
        return;
    bool kv = false;
    for (int ly = 0; ly < c->n_layers && !kv; ly++)
        kv = qrl_trace_layout_find(l, ly, QRL_TRACE_SITE_K, 0) >= 0 ||
             qrl_trace_layout_find(l, ly, QRL_TRACE_SITE_V, 0) >= 0;
    size_t hd = (size_t)c->head_dim, vec = (4 + cdiv(hd, 16) + cdiv(hd, 2) + 3) & ~(size_t)3;
    *per_slot = QRL_GPU_TRACE_WINDOW * ((qrl_trace_layout_record_bytes_per_token(l) + 3) & ~(size_t)3);
    *fixed = 1024 + 8 * R + (kv ? R * 2 * (size_t)c->n_kv_heads * vec : 0);
    qrl_trace_layout_free(l);
}

void qrl_gpu_budget_estimate(const qrl_model *model, const qrl_scheduler_config *sc,
                             qrl_gpu_budget *b) {
    const qrl_model_config *c = &model->cfg;
    int ctx = sc->max_ctx > 0 && sc->max_ctx < c->max_seq_len ? sc->max_ctx : c->max_seq_len;
    /* prefill rows as the scheduler's gpu_open picks them */
    int max_rows = sc->max_slots > 32 ? sc->max_slots : 32;
    int rows = sc->prefill_chunk > 0 ? sc->prefill_chunk : 256;
    if (rows > ctx) rows = ctx;
    if (rows < max_rows) rows = max_rows;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, V = (size_t)c->vocab_size,
           L = (size_t)c->n_layers, hd = (size_t)c->head_dim, H = (size_t)c->n_heads,
           KVH = (size_t)c->n_kv_heads, Q = H * hd, KV = KVH * hd, R = (size_t)rows;
    size_t W = Q + 2 * KV;
    qrl_precision p = model->precision;
    bool qproj = p != QRL_PRECISION_F32 && p != QRL_PRECISION_BF16;
    /* weights: BF16 embedding (+ LM head when untied), norms; projections BF16 or the
     * model's codes and scales (+ 64 bytes a row for the w8a8 K padding and alignment) */
    size_t bf16 = V * D * (c->tie_embeddings ? 1 : 2) + D + L * (2 * D + (c->qk_norm ? 2 * hd : 0));
    size_t q_rows[4] = {W, D, 2 * F, D}, q_ins[4] = {D, Q, D, F}, qbytes = 0, max_out = 0;
    for (int i = 0; i < 4; i++) {
        if (qproj)
            qbytes += L * (qrl_linear_storage_bytes(p, (int)q_rows[i], (int)q_ins[i]) + 64 * q_rows[i] + 1024);
        else
            bf16 += L * q_rows[i] * q_ins[i];
        max_out = max_sz(max_out, q_rows[i]);
    }
    bf16 += L * ((c->qkv_bias ? W : 0) + (c->o_bias ? D : 0)) * 2; /* F32 biases, as 2 bf16 */
    /* w8a8 activation codes and split-K partials (at most 8 splits); w4a16 prefill scratch */
    if (qproj) qbytes += R * max_sz(max_sz(D, Q), F) * 2 + R * 4 + 8 * R * max_out * 4 + 2 * max_out * max_sz(D, F) * 2;
    /* activations (F32 and BF16 rows), flash-decoding scratch (a split per 64 positions, +1
     * for the quantized kernels), rope tables */
    size_t splits = cdiv((size_t)ctx, 64) + 1;
    size_t act = 4 * (R * D + R * max_sz(max_sz(W, 2 * F), D) + R * Q + R * V + R * H * splits * (hd + 2) +
                      R + R * 2 * KV) +
                 2 * (R * max_sz(D, F) + R * Q) + 2 * (size_t)ctx * (hd / 2) * 4 + 64 * R;
    size_t rec = gpu_record_bytes(sc->kv_format, (int)hd);
    b->kv_bytes_per_pos = L * 2 * KVH * rec;
    /* per slot: block tables (host and device), fp8 head scales, int4-protected side cache
     * (sink + recent + 64 ring slack positions at the INT8 record size) */
    size_t side = 0;
    if (sc->kv_format == QRL_KV_FORMAT_INT4_PROTECTED)
        side = (size_t)sc->kv_sink + (sc->kv_recent > 0 ? (size_t)sc->kv_recent + 64 : 0);
    size_t trace_slot, trace_fixed;
    trace_bytes(model, sc, R, &trace_slot, &trace_fixed);
    b->slot_bytes = 2 * cdiv((size_t)ctx, (size_t)sc->kv_block_size) * 4 + L * KVH * 2 * 4 +
                    L * 2 * KVH * side * (hd + 4) + trace_slot;
    /* one more slot and block (the padding rows' sequence), 256-byte alignment of every
     * per-layer array */
    b->fixed_bytes = 2 * bf16 + qbytes + act + b->slot_bytes + trace_fixed +
                     (size_t)sc->kv_block_size * b->kv_bytes_per_pos + L * 16 * 256 +
                     QRL_GPU_BUDGET_RESERVE_BYTES;
    b->block_size = sc->kv_block_size;
    b->ctx_len = ctx;
    b->max_slots = sc->max_slots;
}

qrl_status qrl_scheduler_config_fit_gpu(qrl_scheduler_config *sc, const qrl_model *model,
                                        double utilization, qrl_error *err) {
    qrl_gpu_budget b;
    qrl_gpu_budget_estimate(model, sc, &b);
    b.utilization = utilization;
    qrl_status st = qrl_rollout_gpu_check(sc->device, NULL, 0, &b.device_bytes, err);
    int blocks = 0;
    if (st == QRL_OK) st = qrl_gpu_budget_kv_blocks(&b, &blocks, err);
    if (st != QRL_OK) {
        char msg[QRL_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        return qrl_error_set(err, st, "gpu_memory_utilization %g: %s", utilization, msg);
    }
    sc->kv_blocks = blocks;
    size_t per_seq = cdiv((size_t)b.ctx_len, (size_t)b.block_size);
    QRL_LOG_INFO("sched", "gpu memory budget device=cuda:%d utilization=%g of %.2f GiB: fixed %.2f GiB "
                 "+ %d slots x %.2f MiB, kv %zu bytes/pos: kv_blocks=%d (%.1f full contexts of %d)",
                 sc->device, utilization, (double)b.device_bytes / (1 << 30),
                 (double)b.fixed_bytes / (1 << 30), b.max_slots, (double)b.slot_bytes / (1 << 20),
                 b.kv_bytes_per_pos, blocks, (double)blocks / (double)per_seq, b.ctx_len);
    return QRL_OK;
}
