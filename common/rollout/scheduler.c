/* Rollout scheduler core: slots, admission, chunked prefill, batched decode, sampling,
 * sync boundary and staleness (SPEC §4).  Group bookkeeping, scoring and emission are in
 * group.c.  docs/rollout.md describes the loop. */
#include "rollout/sched_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "model/forward.h"

uint64_t qrl_sched_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t qrl_sched_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *qrl_finish_reason_name(qrl_finish_reason r) {
    switch (r) {
    case QRL_FINISH_NONE: return "none";
    case QRL_FINISH_EOS: return "eos";
    case QRL_FINISH_STOP: return "stop";
    case QRL_FINISH_LENGTH: return "length";
    case QRL_FINISH_PROMPT_TOO_LONG: return "prompt_too_long";
    case QRL_FINISH_ABORTED: return "aborted";
    }
    return "?";
}

void qrl_scheduler_config_default(qrl_scheduler_config *c) {
    memset(c, 0, sizeof *c);
    c->max_slots = 16;
    c->kv_block_size = 16;
    c->kv_format = QRL_KV_FORMAT_F32;
    c->kv_sink = QRL_KV_PROTECTED_DEFAULT_SINK;
    c->kv_recent = QRL_KV_PROTECTED_DEFAULT_RECENT;
    c->prefill_chunk = 256;
    c->max_staleness = 1;
    c->eos_token_id = -1;
    c->device = -1;
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }


static qrl_status cpu_seq_new(qrl_scheduler *s, int *seq, qrl_error *err) {
    return qrl_kv_cache_seq_new(s->kv, seq, err);
}
static void cpu_seq_free(qrl_scheduler *s, int seq) { qrl_kv_cache_seq_free(s->kv, seq); }
static qrl_status cpu_reserve(qrl_scheduler *s, int seq, int n, qrl_error *err) {
    return qrl_kv_cache_reserve(s->kv, seq, n, err);
}
static void cpu_clear(qrl_scheduler *s, int seq) { qrl_kv_cache_set_len(s->kv, seq, 0); }
static int cpu_free_blocks(const qrl_scheduler *s) { return qrl_kv_cache_free_blocks(s->kv); }
static qrl_status cpu_prefill(qrl_scheduler *s, int seq, const int32_t *ids, int n,
                              float *logits, qrl_error *err) {
    return qrl_forward_prefill(s->fwd, s->kv, seq, ids, n, logits, false, err);
}
static qrl_status cpu_decode(qrl_scheduler *s, int b, qrl_error *err) {
    return qrl_forward_decode(s->fwd, s->kv, s->dec_seqs, s->dec_tokens, b, s->dec_logits, err);
}
static qrl_status cpu_load(qrl_scheduler *s, const qrl_model *model, qrl_error *err) {
    qrl_forward *f = NULL;
    QRL_TRY(qrl_forward_new(model, s->max_rows, s->ctx_len, &f, err));
    qrl_forward_set_recorder(f, s->trace_rec);
    qrl_forward_free(s->fwd);
    s->fwd = f;
    return QRL_OK;
}
static void cpu_close(qrl_scheduler *s) {
    qrl_forward_free(s->fwd);
    qrl_kv_cache_free(s->kv);
}
static qrl_status cpu_trace_open(qrl_scheduler *s, qrl_error *err) {
    QRL_TRY(qrl_trace_recorder_new(s->trace_layout, s->n_slots, &s->trace_rec, err));
    qrl_forward_set_recorder(s->fwd, s->trace_rec);
    char what[512];
    qrl_sched_trace_sites_text(s, what, sizeof what);
    QRL_LOG_INFO("sched", "trace recorder device=cpu sites=%u bytes_per_token=%zu recorded=%s",
                 qrl_trace_layout_n_sites(s->trace_layout),
                 qrl_trace_layout_record_bytes_per_token(s->trace_layout), what);
    return QRL_OK;
}
static void cpu_trace_clear(qrl_scheduler *s) { qrl_trace_recorder_clear(s->trace_rec); }
static void cpu_trace_target(qrl_scheduler *s, int row, qrl_trace_buf *buf, uint32_t token) {
    qrl_trace_recorder_target(s->trace_rec, row, buf, token);
}
static qrl_status cpu_trace_set_tap(qrl_scheduler *s, qrl_trace_tap_fn fn, void *ctx,
                                    qrl_error *err) {
    (void)err;
    qrl_trace_recorder_set_tap(s->trace_rec, fn, ctx);
    return QRL_OK;
}
static uint64_t cpu_trace_capture_ns(const qrl_scheduler *s) {
    return qrl_trace_recorder_capture_ns(s->trace_rec);
}
static void cpu_trace_close(qrl_scheduler *s) { qrl_trace_recorder_free(s->trace_rec); }
static const qrl_sched_backend CPU_BACKEND = {
    .seq_new = cpu_seq_new, .seq_free = cpu_seq_free, .reserve = cpu_reserve,
    .clear = cpu_clear, .free_blocks = cpu_free_blocks, .prefill = cpu_prefill,
    .decode = cpu_decode, .load = cpu_load, .close = cpu_close, .trace_open = cpu_trace_open,
    .trace_clear = cpu_trace_clear, .trace_target = cpu_trace_target,
    .trace_set_tap = cpu_trace_set_tap, .trace_capture_ns = cpu_trace_capture_ns,
    .trace_close = cpu_trace_close};

static qrl_status cpu_open(qrl_scheduler *s, const qrl_model *model, int n_blocks,
                           qrl_error *err) {
    const qrl_model_config *mc = &model->cfg;
    const qrl_scheduler_config *cfg = &s->cfg;
    qrl_kv_cache_desc kd = {
        .n_layers = mc->n_layers, .n_kv_heads = mc->n_kv_heads, .head_dim = mc->head_dim,
        .block_size = cfg->kv_block_size, .n_blocks = n_blocks, .max_seqs = cfg->max_slots,
        .max_seq_len = s->ctx_len, .format = cfg->kv_format,
        .protected_sink = cfg->kv_sink, .protected_recent = cfg->kv_recent};
    s->be = &CPU_BACKEND;
    QRL_TRY(qrl_kv_cache_new(&kd, &s->kv, err));
    return qrl_forward_new(model, s->max_rows, s->ctx_len, &s->fwd, err);
}

/* TRACE recording: the layout of the configured sites and the engine's recorder (targets:
 * one prefill row or one decode row per slot). */
static qrl_status trace_open(qrl_scheduler *s, const qrl_model *model, qrl_error *err) {
    if (!s->cfg.trace_record) return QRL_OK;
    qrl_trace_sites sites = s->cfg.trace_sites;
    if (sites.n_clauses == 0) qrl_trace_sites_default(&sites);
    QRL_TRY(qrl_trace_layout_new(&sites, &model->cfg, model->precision == QRL_PRECISION_W4A4_NVFP4,
                                 s->cfg.kv_format == QRL_KV_FORMAT_FP4, &s->trace_layout, err));
    return s->be->trace_open(s, err);
}

void qrl_sched_trace_sites_text(const qrl_scheduler *s, char *out, size_t cap) {
    size_t covered, wanted;
    qrl_trace_sites_coverage(&s->model->cfg, qrl_trace_layout_site_ids(s->trace_layout),
                             qrl_trace_layout_n_sites(s->trace_layout), 0, &covered, &wanted, NULL, 0, out, cap);
}

const qrl_trace_layout *qrl_scheduler_trace_layout(const qrl_scheduler *s) {
    return s->trace_layout;
}

void qrl_scheduler_trace_set_tap(qrl_scheduler *s, qrl_trace_tap_fn fn, void *ctx) {
    if (!s->trace_layout) return;
    qrl_error e;
    int prev = qrl_sched_dev_enter(s);
    if (s->be->trace_set_tap(s, fn, ctx, &e) != QRL_OK)
        QRL_LOG_ERROR("sched", "trace tap not set: %s", e.msg);
    qrl_sched_dev_leave(s, prev);
}

qrl_status qrl_scheduler_new(const qrl_model *model, const qrl_tokenizer *tok,
                             const qrl_scheduler_config *cfg, qrl_scheduler_group_fn on_group,
                             void *ctx, qrl_scheduler **out, qrl_error *err) {
    *out = NULL;
    const qrl_model_config *mc = &model->cfg;
    int ctx_len = cfg->max_ctx > 0 && cfg->max_ctx < mc->max_seq_len ? cfg->max_ctx
                                                                      : mc->max_seq_len;
    if (cfg->max_slots < 1 || cfg->kv_block_size < 1 || cfg->kv_blocks < 0 ||
        cfg->prefill_chunk < 0 || cfg->max_ctx < 0 || ctx_len < 1)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "scheduler: config max_slots=%d kv_block_size=%d kv_blocks=%d "
                             "prefill_chunk=%d max_ctx=%d: sizes must be positive (0 allowed "
                             "for kv_blocks, prefill_chunk, max_ctx)",
                             cfg->max_slots, cfg->kv_block_size, cfg->kv_blocks,
                             cfg->prefill_chunk, cfg->max_ctx);
    if (cfg->eos_token_id >= mc->vocab_size)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "scheduler: config eos_token_id=%d outside the vocabulary [0, %d)",
                             cfg->eos_token_id, mc->vocab_size);
    int per_seq = ceil_div(ctx_len, cfg->kv_block_size);
    int n_blocks = cfg->kv_blocks ? cfg->kv_blocks : per_seq * cfg->max_slots;
    /* Any single response must fit an empty pool, or admission could wait forever. */
    if (n_blocks < per_seq)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "scheduler: config kv_blocks=%d holds fewer than one full context "
                             "(%d positions need %d blocks of %d)",
                             n_blocks, ctx_len, per_seq, cfg->kv_block_size);
    qrl_scheduler *s = calloc(1, sizeof *s);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "scheduler: out of memory");
    qrl_status st = QRL_OK;
    s->cfg = *cfg;
    s->model = model;
    s->tok = tok;
    s->on_group = on_group;
    s->ctx = ctx;
    s->ctx_len = ctx_len;
    s->vocab = mc->vocab_size;
    s->version = cfg->version;
    s->n_slots = cfg->max_slots;
    s->max_rows = cfg->max_slots > 32 ? cfg->max_slots : 32;
    s->kv_total_blocks = n_blocks;
    int prev = qrl_sched_dev_enter(s);
    if (cfg->device >= 0) st = qrl_sched_gpu_open(s, model, n_blocks, err);
    else st = cpu_open(s, model, n_blocks, err);
    qrl_sched_dev_leave(s, prev);
    if (st != QRL_OK) goto fail;
    QRL_TRY_GOTO(trace_open(s, model, err), fail);
    QRL_TRY_GOTO(qrl_sampler_new(s->vocab, &s->sampler, err), fail);
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->logits = malloc(sizeof(float) * (size_t)s->n_slots * (size_t)s->vocab);
    s->dec_logits = malloc(sizeof(float) * (size_t)s->n_slots * (size_t)s->vocab);
    s->dec_seqs = malloc(sizeof(int) * (size_t)s->n_slots);
    s->dec_slots = malloc(sizeof(int) * (size_t)s->n_slots);
    s->dec_tokens = malloc(sizeof(int32_t) * (size_t)s->n_slots);
    if (s->be->decode_sample) {
        s->dec_draws = malloc(sizeof *s->dec_draws * (size_t)s->n_slots);
        s->dec_samples = malloc(sizeof *s->dec_samples * (size_t)s->n_slots);
        s->dec_errs = malloc(sizeof *s->dec_errs * (size_t)s->n_slots);
    }
    if (!s->slots || !s->logits || !s->dec_logits || !s->dec_seqs || !s->dec_slots ||
        !s->dec_tokens || (s->be->decode_sample && (!s->dec_draws || !s->dec_samples ||
                                                     !s->dec_errs))) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "scheduler: out of memory");
        goto fail;
    }
    *out = s;
    return QRL_OK;
fail:
    qrl_scheduler_free(s);
    return st;
}

void qrl_scheduler_free(qrl_scheduler *s) {
    if (!s) return;
    while (s->head) {
        qrl_sched_group *g = s->head;
        s->head = g->next;
        qrl_sched_group_free(g);
    }
    if (s->be) {
        int prev = qrl_sched_dev_enter(s);
        if (s->trace_layout) s->be->trace_close(s);
        s->be->close(s);
        qrl_sched_dev_leave(s, prev);
    }
    qrl_trace_layout_free(s->trace_layout);
    qrl_sampler_free(s->sampler);
    free(s->slots);
    free(s->logits);
    free(s->dec_logits);
    free(s->dec_seqs);
    free(s->dec_slots);
    free(s->dec_tokens);
    free(s->dec_draws);
    free(s->dec_samples);
    free(s->dec_errs);
    free(s);
}

bool qrl_scheduler_idle(const qrl_scheduler *s) { return s->head == NULL; }

void qrl_scheduler_get_stats(const qrl_scheduler *s, qrl_scheduler_stats *out) {
    *out = s->stats;
    out->version = s->version;
    out->running = 0;
    for (int i = 0; i < s->n_slots; i++) out->running += s->slots[i].g != NULL;
    out->queued_responses = 0;
    for (const qrl_sched_group *g = s->head; g; g = g->next)
        if (!g->too_long) out->queued_responses += (int)(g->G - g->next_admit);
    out->kv_free_blocks = s->be->free_blocks(s);
    out->kv_total_blocks = s->kv_total_blocks;
    out->trace_buf_bytes = 0;
    out->trace_capture_us = s->trace_layout ? s->be->trace_capture_ns(s) / 1000 : 0;
    for (const qrl_sched_group *g = s->head; g; g = g->next)
        for (uint32_t r = 0; r < g->G; r++)
            if (g->resp[r].trace) out->trace_buf_bytes += qrl_trace_buf_bytes(g->resp[r].trace);
}

/* ---- admission -------------------------------------------------------------------- */

/* KV positions a response can occupy at most: its last token is sampled, never fed. */
static int response_positions(const qrl_scheduler *s, const qrl_sched_group *g) {
    return g->n_prompt + qrl_sched_response_cap(s, g) - 1;
}

/* Fill free slots in FIFO order (groups by submission, responses by index).  Stops at the
 * first response whose worst-case KV does not fit the free blocks: no overtaking, so a
 * long prompt is never starved by short ones. */
static qrl_status admit(qrl_scheduler *s, qrl_error *err) {
    int bs = s->cfg.kv_block_size;
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].g) continue;
        qrl_sched_group *g = s->head;
        while (g && (g->too_long || g->next_admit >= g->G)) g = g->next;
        if (!g) return QRL_OK;
        int need = response_positions(s, g);
        if (ceil_div(need, bs) > s->be->free_blocks(s)) return QRL_OK;
        qrl_sched_slot *sl = &s->slots[i];
        QRL_TRY(s->be->seq_new(s, &sl->seq, err));
        qrl_status st = s->be->reserve(s, sl->seq, need, err);
        if (st != QRL_OK) {
            s->be->seq_free(s, sl->seq);
            return st;
        }
        sl->g = g;
        sl->r = (int)g->next_admit++;
        sl->fed = 0;
        sl->ready = NULL;
        qrl_sched_resp *rp = &g->resp[sl->r];
        rp->admitted_us = qrl_sched_now_us();
        rp->started_unix_ms = qrl_sched_unix_ms();
    }
    return QRL_OK;
}

/* ---- prefill and decode ----------------------------------------------------------- */

static int seq_total(const qrl_sched_slot *sl) {
    return sl->g->n_prompt + sl->g->resp[sl->r].n_gen;
}

/* Feed every sequence with more than one token outstanding (new prompts, re-prefills),
 * at most prefill_chunk tokens in all; a sequence that reaches its end gets the logits of
 * its last position in its row of s->logits.  One token outstanding goes to decode. */
static qrl_status prefill(qrl_scheduler *s, qrl_error *err) {
    long budget = s->cfg.prefill_chunk > 0 ? s->cfg.prefill_chunk : LONG_MAX;
    for (int i = 0; i < s->n_slots && budget > 0; i++) {
        qrl_sched_slot *sl = &s->slots[i];
        if (!sl->g || sl->ready) continue;
        int total = seq_total(sl), left = total - sl->fed;
        if (left <= 1) continue;
        int n = left < budget ? left : (int)budget;
        bool last = sl->fed + n == total;
        float *row = s->logits + (size_t)i * s->vocab;
        qrl_sched_resp *rp = &sl->g->resp[sl->r];
        if (s->trace_layout) { /* the row whose logits sample token n_gen: its record */
            s->be->trace_clear(s);
            if (last && rp->trace) s->be->trace_target(s, n - 1, rp->trace, (uint32_t)rp->n_gen);
        }
        uint64_t t0 = qrl_sched_now_us();
        QRL_TRY(s->be->prefill(s, sl->seq, rp->ids + sl->fed, n, last ? row : NULL, err));
        uint64_t dt = qrl_sched_now_us() - t0;
        rp->prefill_us += dt;
        s->stats.forward_us += dt;
        sl->fed += n;
        budget -= n;
        s->stats.prefill_tokens += (uint64_t)n;
        if (last) sl->ready = row;
    }
    return QRL_OK;
}

/* One batched decode over every sequence with exactly one token outstanding; the engine
 * samples the rows itself when it can (the keys sample_all would use), unless
 * cfg.host_sampling. */
static qrl_status decode(qrl_scheduler *s, qrl_error *err) {
    bool on_engine = s->be->decode_sample && !s->cfg.host_sampling;
    int b = 0;
    if (s->trace_layout) s->be->trace_clear(s);
    for (int i = 0; i < s->n_slots; i++) {
        qrl_sched_slot *sl = &s->slots[i];
        if (!sl->g || sl->ready || seq_total(sl) - sl->fed != 1) continue;
        s->dec_slots[b] = i;
        s->dec_seqs[b] = sl->seq;
        s->dec_tokens[b] = sl->g->resp[sl->r].ids[sl->fed];
        qrl_sched_resp *rp = &sl->g->resp[sl->r];
        if (s->trace_layout && rp->trace) /* this row's logits sample token n_gen */
            s->be->trace_target(s, b, rp->trace, (uint32_t)rp->n_gen);
        if (on_engine)
            s->dec_draws[b] = (qrl_sample_draw){
                .params = sl->g->sampling, .group = sl->g->group_id, .response = (uint32_t)sl->r,
                .position = (uint32_t)seq_total(sl)}; /* the new token's absolute index */
        b++;
    }
    if (b == 0) return QRL_OK;
    uint64_t t0 = qrl_sched_now_us();
    QRL_TRY(on_engine ? s->be->decode_sample(s, b, err) : s->be->decode(s, b, err));
    uint64_t dt = qrl_sched_now_us() - t0;
    for (int j = 0; j < b; j++) {
        qrl_sched_slot *sl = &s->slots[s->dec_slots[j]];
        sl->fed++;
        if (on_engine) sl->drawn = j + 1;
        else sl->ready = s->dec_logits + (size_t)j * s->vocab;
        sl->g->resp[sl->r].decode_us += dt;
    }
    s->stats.forward_us += dt;
    s->stats.decode_rows += (uint64_t)b;
    return QRL_OK;
}

/* ---- sampling and ending ---------------------------------------------------------- */

static void release(qrl_scheduler *s, qrl_sched_slot *sl, qrl_finish_reason why) {
    qrl_sched_resp *rp = &sl->g->resp[sl->r];
    rp->finish = why;
    rp->finished_unix_ms = qrl_sched_unix_ms();
    sl->g->n_done++;
    s->be->seq_free(s, sl->seq);
    memset(sl, 0, sizeof *sl);
}

static qrl_finish_reason end_check(qrl_scheduler *s, qrl_sched_group *g, qrl_sched_resp *rp,
                                   int32_t tok) {
    if (s->cfg.eos_token_id >= 0 && tok == s->cfg.eos_token_id) return QRL_FINISH_EOS;
    for (int k = 0; k < g->n_stop_ids; k++)
        if (tok == g->stop_ids[k]) return QRL_FINISH_STOP;
    if (g->n_stop_strings > 0 && qrl_sched_stop_string_hit(s, g, rp)) return QRL_FINISH_STOP;
    if (rp->n_gen >= g->max_new) return QRL_FINISH_LENGTH;
    if (g->n_prompt + rp->n_gen >= s->ctx_len) return QRL_FINISH_LENGTH;
    return QRL_FINISH_NONE;
}

/* Sample the next token of every sequence whose logits are ready, in slot order (the
 * device's sample where it drew one). */
static void sample_all(qrl_scheduler *s) {
    for (int i = 0; i < s->n_slots; i++) {
        qrl_sched_slot *sl = &s->slots[i];
        if (!sl->g || (!sl->ready && !sl->drawn)) continue;
        qrl_sched_group *g = sl->g;
        qrl_sched_resp *rp = &g->resp[sl->r];
        int pos = g->n_prompt + rp->n_gen; /* absolute index of the new token */
        qrl_sample smp;
        qrl_error e;
        const qrl_error *pe = &e;
        qrl_status st;
        if (sl->drawn) {
            smp = s->dec_samples[sl->drawn - 1];
            pe = &s->dec_errs[sl->drawn - 1];
            st = pe->status;
        } else {
            st = qrl_sampler_sample(s->sampler, sl->ready, &g->sampling, g->group_id,
                                    (uint32_t)sl->r, (uint32_t)pos, &smp, &e);
        }
        sl->ready = NULL;
        sl->drawn = 0;
        if (st != QRL_OK) {
            QRL_LOG_ERROR("sched", "sampling failed group=%llu response=%d pos=%d: %s",
                          (unsigned long long)g->group_id, sl->r, pos, pe->msg);
            release(s, sl, QRL_FINISH_ABORTED);
            continue;
        }
        int k = rp->n_gen++;
        rp->ids[pos] = smp.token;
        rp->lp_full[k] = smp.logprob;
        rp->lp[k] = smp.truncated ? smp.logprob_truncated : smp.logprob;
        rp->ver[k] = s->version;
        rp->truncated_tokens += smp.truncated;
        s->stats.tokens_generated++;
        qrl_finish_reason why = end_check(s, g, rp, smp.token);
        if (why != QRL_FINISH_NONE) release(s, sl, why);
    }
}

static qrl_status step(qrl_scheduler *s, int *emitted, qrl_error *err) {
    if (emitted) *emitted = 0;
    s->stats.steps++;
    QRL_TRY(admit(s, err));
    QRL_TRY(prefill(s, err));
    QRL_TRY(decode(s, err));
    sample_all(s);
    /* the records of the responses that ended reach their buffers before emission */
    if (s->trace_layout && s->be->trace_sync) QRL_TRY(s->be->trace_sync(s, err));
    int n = qrl_sched_emit_finished(s);
    if (emitted) *emitted = n;
    return QRL_OK;
}

qrl_status qrl_scheduler_step(qrl_scheduler *s, int *emitted, qrl_error *err) {
    int prev = qrl_sched_dev_enter(s);
    qrl_status st = step(s, emitted, err);
    qrl_sched_dev_leave(s, prev);
    return st;
}

/* ---- sync boundary ---------------------------------------------------------------- */

static bool same_arch(const qrl_model_config *a, const qrl_model_config *b) {
    return a->dim == b->dim && a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->vocab_size == b->vocab_size &&
           a->max_seq_len == b->max_seq_len;
}

static qrl_status sync_boundary(qrl_scheduler *s, uint64_t version, qrl_error *err);

static qrl_status swap_weights(qrl_scheduler *s, const qrl_model *model, uint64_t version,
                               qrl_error *err) {
    if (!same_arch(&s->model->cfg, &model->cfg))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swap_weights: the new model's architecture (dim, layers, heads, "
                             "vocab, context) differs from the running one");
    if (version <= s->version)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swap_weights: version %llu is not newer than %llu",
                             (unsigned long long)version, (unsigned long long)s->version);
    if (s->trace_layout && model->precision != s->model->precision)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swap_weights: TRACE recording was set up for precision %s, the new "
                             "model is %s", qrl_precision_name(s->model->precision),
                             qrl_precision_name(model->precision));
    QRL_TRY(s->be->load(s, model, err));
    s->model = model;
    return sync_boundary(s, version, err);
}

qrl_status qrl_scheduler_swap_weights(qrl_scheduler *s, const qrl_model *model,
                                      uint64_t version, qrl_error *err) {
    int prev = qrl_sched_dev_enter(s);
    qrl_status st = swap_weights(s, model, version, err);
    qrl_sched_dev_leave(s, prev);
    return st;
}

bool qrl_scheduler_takes_stream(const qrl_scheduler *s) {
    if (!s->be || !s->be->load_stream) return false;
    qrl_precision p = s->model->precision;
    return !qrl_precision_is_quantized(p) || p == QRL_PRECISION_W8A8_INT8 || p == QRL_PRECISION_W8A8_FP8;
}

qrl_status qrl_scheduler_swap_weights_stream(qrl_scheduler *s, const struct qrl_cuda_stream_tensor *t,
                                             size_t n, uint64_t version, qrl_error *err) {
    if (!qrl_scheduler_takes_stream(s))
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "swap_weights_stream: this engine (%s, %s) takes host "
                             "models only", s->gpu ? "cuda" : "cpu", qrl_precision_name(s->model->precision));
    if (version <= s->version)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "swap_weights: version %llu is not newer than %llu",
                             (unsigned long long)version, (unsigned long long)s->version);
    int prev = qrl_sched_dev_enter(s);
    qrl_status st = s->be->load_stream(s, t, n, err);
    if (st == QRL_OK) st = sync_boundary(s, version, err);
    qrl_sched_dev_leave(s, prev);
    return st;
}

/* After new weights are in: every unfinished response restarts or is re-prefilled. */
static qrl_status sync_boundary(qrl_scheduler *s, uint64_t version, qrl_error *err) {
    s->version = version;
    int restarted = 0, reprefilled = 0;
    for (int i = 0; i < s->n_slots; i++) {
        qrl_sched_slot *sl = &s->slots[i];
        if (!sl->g) continue;
        qrl_sched_resp *rp = &sl->g->resp[sl->r];
        /* Fresh KV: drop every position, then take back the same worst-case blocks (they
         * were just returned, so this cannot fail for lack of blocks). */
        s->be->clear(s, sl->seq);
        QRL_TRY(s->be->reserve(s, sl->seq, response_positions(s, sl->g), err));
        sl->fed = 0;
        sl->ready = NULL;
        sl->drawn = 0;
        if (rp->n_gen > 0 && s->cfg.max_staleness >= 0 &&
            version - rp->ver[0] > (uint64_t)s->cfg.max_staleness) {
            qrl_sched_resp_restart(rp);
            s->stats.restarts++;
            restarted++;
        } else if (rp->n_gen > 0) {
            /* kept tokens keep the records of the forward that sampled them (trace_rec.h) */
            if (rp->trace) qrl_trace_buf_truncate(rp->trace, (uint32_t)rp->n_gen);
            rp->reprefills++;
            s->stats.reprefills++;
            reprefilled++;
        }
    }
    QRL_LOG_INFO("sched", "sync boundary version=%llu reprefill=%d restart=%d",
                 (unsigned long long)version, reprefilled, restarted);
    return QRL_OK;
}
