/* qrl-rollout's Prometheus metrics (metrics.h; names and meanings in docs/metrics.md). */
#include "metrics.h"

#include <stdlib.h>

#include "model/trace_rec.h"


enum {
    M_VERSION, M_STATE, M_SLOTS_TOTAL, M_SLOTS_IN_USE, M_GROUPS_ACTIVE, M_GROUPS_QUEUED, M_TOKENS_PER_S,
    M_KV_USED, M_TOKENS, M_RESTARTS, M_PRODUCED, M_DEAD_LETTERS, M_CONSUMED, M_DUPLICATES,
    M_TRACE_CHUNKS, M_TRACE_BYTES, M_TRACE_TOKENS, M_TRACE_BPT, M_TRACE_CAPTURE, M_TRACE_FAILED, M_COUNT
};

/* One row per series, in the order of the enum. */
static const struct {
    qrl_prom_type type;
    const char *name, *help;
} SERIES[M_COUNT] = {
    {QRL_PROM_GAUGE, "qrl_rollout_version", "Policy version the engine generates with."},
    {QRL_PROM_GAUGE, "qrl_rollout_state", "Service state (proto ServiceState): 2 running, 3 paused, 5 draining, 6 stopped."},
    {QRL_PROM_GAUGE, "qrl_rollout_slots", "Sequence slots of the scheduler (rollout.slots)."},
    {QRL_PROM_GAUGE, "qrl_rollout_slots_in_use", "Sequences in slots now."},
    {QRL_PROM_GAUGE, "qrl_rollout_groups_active", "Prompt groups inside the engine."},
    {QRL_PROM_GAUGE, "qrl_rollout_groups_queued", "Prompt groups consumed and not in the engine (waiting or being produced)."},
    {QRL_PROM_GAUGE, "qrl_rollout_tokens_per_second", "Generated tokens per second over the last ~2 s."},
    {QRL_PROM_GAUGE, "qrl_rollout_kv_used_ratio", "Fraction of the KV-cache blocks in use (0..1)."},
    {QRL_PROM_COUNTER, "qrl_rollout_tokens_generated_total", "Sampled tokens, discarded attempts included."},
    {QRL_PROM_COUNTER, "qrl_rollout_staleness_restarts_total", "Responses restarted for staleness (SPEC 4.5)."},
    {QRL_PROM_COUNTER, "qrl_rollout_groups_produced_total", "GroupResults acknowledged by the broker."},
    {QRL_PROM_COUNTER, "qrl_rollout_dead_letters_total", "Prompts sent to the dead-letter topic (acknowledged)."},
    {QRL_PROM_COUNTER, "qrl_rollout_prompts_consumed_total", "Records consumed from the prompts topic."},
    {QRL_PROM_COUNTER, "qrl_rollout_duplicates_skipped_total", "Prompts delivered again while still in flight here."},
    {QRL_PROM_COUNTER, "qrl_rollout_trace_chunks_total", "TraceChunk messages acknowledged (rollout.trace)."},
    {QRL_PROM_COUNTER, "qrl_rollout_trace_bytes_total", "Bytes of the acknowledged TraceChunk messages."},
    {QRL_PROM_COUNTER, "qrl_rollout_trace_tokens_total", "Response tokens covered by acknowledged TRACE records."},
    {QRL_PROM_GAUGE, "qrl_rollout_trace_bytes_per_token", "TRACE record bytes per response token, since start."},
    {QRL_PROM_GAUGE, "qrl_rollout_trace_capture_share", "TRACE recorder's share of the engine's forward time, since start."},
    {QRL_PROM_COUNTER, "qrl_rollout_trace_failed_total",
     "Responses whose TraceChunks the broker refused (given up: their results went without records)."},
};

struct rd_metrics {
    qrl_prom_series_t *s[M_COUNT];
};

qrl_status rd_metrics_start(qrl_prom_registry_t *reg, const char *replica_id, const char *precision,
                            const char *kv_format, rd_metrics **out, qrl_error *err) {
    *out = NULL;
    if (!reg) return QRL_OK;
    rd_metrics *m = calloc(1, sizeof *m);
    if (!m) return qrl_error_set(err, QRL_STATUS_NOMEM, "metrics: out of memory");
    qrl_status st;
    for (int i = 0; i < M_COUNT; i++)
        QRL_TRY_GOTO(qrl_prom_register(reg, SERIES[i].type, SERIES[i].name, SERIES[i].help, NULL, 0, &m->s[i],
                                       err), fail);
    const char *info_labels[] = {"replica", replica_id, "precision", precision, "kv_format", kv_format};
    qrl_prom_series_t *info;
    QRL_TRY_GOTO(qrl_prom_register(reg, QRL_PROM_GAUGE, "qrl_rollout_info",
                                   "Always 1; the labels describe the replica.", info_labels, 3, &info, err), fail);
    qrl_prom_set(info, 1);
    *out = m;
    return QRL_OK;
fail:
    free(m);
    return st;
}

void rd_metrics_update(rd_metrics *m, const Qrl__RolloutStatus *s, uint64_t dead_letters, uint64_t consumed,
                       uint64_t duplicates, const rd_metrics_trace *tr) {
    if (!m) return;
    qrl_prom_set(m->s[M_VERSION], (double)s->version);
    qrl_prom_set(m->s[M_STATE], (double)s->state);
    qrl_prom_set(m->s[M_SLOTS_TOTAL], s->slots_total);
    qrl_prom_set(m->s[M_SLOTS_IN_USE], s->slots_in_use);
    qrl_prom_set(m->s[M_GROUPS_ACTIVE], s->active_groups);
    qrl_prom_set(m->s[M_GROUPS_QUEUED], s->queued_groups);
    qrl_prom_set(m->s[M_TOKENS_PER_S], s->tokens_per_s);
    qrl_prom_set(m->s[M_KV_USED], s->kv_used);
    qrl_prom_set(m->s[M_TOKENS], (double)s->tokens_generated);
    qrl_prom_set(m->s[M_RESTARTS], (double)s->staleness_restarts);
    qrl_prom_set(m->s[M_PRODUCED], (double)s->groups_produced);
    qrl_prom_set(m->s[M_DEAD_LETTERS], (double)dead_letters);
    qrl_prom_set(m->s[M_CONSUMED], (double)consumed);
    qrl_prom_set(m->s[M_DUPLICATES], (double)duplicates);
    qrl_prom_set(m->s[M_TRACE_CHUNKS], (double)tr->chunks);
    qrl_prom_set(m->s[M_TRACE_BYTES], (double)tr->bytes);
    qrl_prom_set(m->s[M_TRACE_TOKENS], (double)tr->tokens);
    qrl_prom_set(m->s[M_TRACE_BPT], qrl_trace_metric_bytes_per_token(tr->record_bytes, tr->tokens));
    qrl_prom_set(m->s[M_TRACE_CAPTURE], tr->capture_share);
    qrl_prom_set(m->s[M_TRACE_FAILED], (double)tr->failed);
}

void rd_metrics_stop(rd_metrics *m) { free(m); }
