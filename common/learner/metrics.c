/* The learner's Prometheus endpoint and TensorBoard events (metrics.h; names and
 * meanings in docs/metrics.md).  One table lists the per-update scalars: its keys are the
 * metrics.jsonl keys (services/learner/update.c) and the TensorBoard tags, its names the Prometheus series. */
#include "learner/metrics.h"

#include <stdbool.h>
#include <stdlib.h>

#include "core/log.h"
#include "metrics/prom.h"
#include "metrics/tfevents.h"

static const struct {
    const char *key, *name, *help;
} UPDATE[] = {
    {"version", "qrl_learner_version", "Policy version (bumped by each update)."},
    {"groups_used", "qrl_learner_groups_used", "Groups the last update trained on."},
    {"groups_dropped", "qrl_learner_groups_dropped", "Groups the last update dropped (all rewards equal)."},
    {"reward_mean", "qrl_learner_reward_mean", "Mean reward of the last update's responses."},
    {"reward_std", "qrl_learner_reward_std", "Population std of those rewards."},
    {"accuracy", "qrl_learner_accuracy", "Fraction of those responses with reward >= learner.accuracy_threshold."},
    {"response_len_mean", "qrl_learner_response_len_mean", "Mean response length in tokens."},
    {"version_min", "qrl_learner_token_version_min", "Oldest policy version of a trained token."},
    {"version_max", "qrl_learner_token_version_max", "Newest policy version of a trained token."},
    {"kl_behav_prox", "qrl_learner_kl_behav_prox", "KL(behaviour || proximal) estimate over trained tokens."},
    {"max_w", "qrl_learner_max_w", "Largest proximal/behaviour importance weight."},
    {"entropy", "qrl_learner_entropy", "Mean entropy (nats) of the pre-update policy."},
    {"loss", "qrl_learner_loss", "Mean loss over the update's minibatch passes."},
    {"tis_frac", "qrl_learner_tis_fraction", "Fraction of tokens whose weight was truncated at loss.tis_cap."},
    {"acr_frac", "qrl_learner_acr_fraction", "Fraction of tokens whose clip range ACR widened."},
    {"clip_low", "qrl_learner_clip_low_fraction", "Fraction of tokens clipped at the lower bound."},
    {"clip_high", "qrl_learner_clip_high_fraction", "Fraction of tokens clipped at the upper bound."},
    {"grad_norm", "qrl_learner_grad_norm", "Mean pre-clip gradient norm of the steps taken."},
    {"lr", "qrl_learner_lr", "Learning rate of the last optimizer step."},
    {"steps_taken", "qrl_learner_steps_taken", "Optimizer steps the last update took."},
    {"steps_skipped", "qrl_learner_steps_skipped", "Optimizer steps the last update skipped (non-finite)."},
    {"tokens_trained", "qrl_learner_tokens_trained", "Response tokens the last update trained on."},
    {"train_tokens_per_s", "qrl_learner_train_tokens_per_second", "Training throughput of the last update."},
    {"update_s", "qrl_learner_update_seconds", "Wall time of the last update."},
    {"snapshot_s", "qrl_learner_snapshot_seconds", "Time to build the last BF16 weight snapshot."},
};
#define N_UPDATE (sizeof UPDATE / sizeof UPDATE[0])

/* The loop's series: gauges, then totals. */
enum {
    L_STEP, L_STATE, L_IN_FLIGHT, L_BUFFERED, L_REPLICAS, L_SYNCED,
    L_DISPATCHED, L_RESULTS, L_DUPLICATES, L_DEAD_LETTERS, L_TOKENS_TOTAL, L_SKIPPED_TOTAL, L_COUNT
};
static const struct {
    qrl_prom_type type;
    const char *name, *help;
} LOOP[L_COUNT] = {
    {QRL_PROM_GAUGE, "qrl_learner_step", "Updates done."},
    {QRL_PROM_GAUGE, "qrl_learner_state", "Service state (proto ServiceState): 2 running, 3 paused, 5 draining, 6 stopped."},
    {QRL_PROM_GAUGE, "qrl_learner_groups_in_flight", "Groups dispatched with no result yet."},
    {QRL_PROM_GAUGE, "qrl_learner_groups_buffered", "Results waiting for a quota."},
    {QRL_PROM_GAUGE, "qrl_learner_replicas", "Registered rollout replicas."},
    {QRL_PROM_GAUGE, "qrl_learner_replicas_synced", "Registered replicas at the current version."},
    {QRL_PROM_COUNTER, "qrl_learner_groups_dispatched_total", "PromptGroups dispatched."},
    {QRL_PROM_COUNTER, "qrl_learner_results_total", "GroupResult records consumed."},
    {QRL_PROM_COUNTER, "qrl_learner_duplicates_total", "Results dropped as duplicates."},
    {QRL_PROM_COUNTER, "qrl_learner_dead_letters_total", "Results sent to the dead-letter topic."},
    {QRL_PROM_COUNTER, "qrl_learner_tokens_trained_total", "Response tokens trained on."},
    {QRL_PROM_COUNTER, "qrl_learner_steps_skipped_total", "Optimizer steps skipped (non-finite loss or gradient)."},
};

struct qrl_learner_metrics {
    qrl_prom_registry_t *reg;    /* the series' registry: owned when own_reg */
    bool own_reg;
    qrl_prom_server_t *server;   /* ours (qrl_learner_metrics_start), or NULL */
    qrl_prom_series_t *update[N_UPDATE], *loop[L_COUNT];
    qrl_tfevents_t *tb;
};

static qrl_status metrics_open_events(qrl_learner_metrics_t *m, const char *tb_dir, qrl_error *err);

/* Register the series on m->reg (when set) and open the event file (when tb_dir). */
static qrl_status metrics_open(qrl_learner_metrics_t *m, const char *tb_dir, qrl_error *err) {
    for (size_t i = 0; m->reg && i < L_COUNT; i++)
        QRL_TRY(qrl_prom_register(m->reg, LOOP[i].type, LOOP[i].name, LOOP[i].help, NULL, 0, &m->loop[i], err));
    for (size_t i = 0; m->reg && i < N_UPDATE; i++)
        QRL_TRY(qrl_prom_register(m->reg, QRL_PROM_GAUGE, UPDATE[i].name, UPDATE[i].help, NULL, 0, &m->update[i],
                                  err));
    return metrics_open_events(m, tb_dir, err);
}

/* Open the TensorBoard event file in tb_dir ("" = none). */
static qrl_status metrics_open_events(qrl_learner_metrics_t *m, const char *tb_dir, qrl_error *err) {
    qrl_status st;
    if (*tb_dir) {
        qrl_error inner;
        if ((st = qrl_tfevents_open(tb_dir, &m->tb, &inner)) != QRL_OK)
            return qrl_error_set(err, st, "metrics.tensorboard_dir: %s", inner.msg);
        QRL_LOG_INFO("learner", "tensorboard events file=%s", qrl_tfevents_path(m->tb));
    }
    return QRL_OK;
}

qrl_status qrl_learner_metrics_new(qrl_prom_registry_t *reg, const char *tb_dir, qrl_learner_metrics_t **out,
                                   qrl_error *err) {
    *out = NULL;
    if (!reg && !*tb_dir) return QRL_OK;
    qrl_learner_metrics_t *m = calloc(1, sizeof *m);
    if (!m) return qrl_error_set(err, QRL_STATUS_NOMEM, "metrics: out of memory");
    m->reg = reg;
    qrl_status st = metrics_open(m, tb_dir, err);
    if (st != QRL_OK) {
        qrl_learner_metrics_stop(m);
        return st;
    }
    *out = m;
    return QRL_OK;
}

qrl_status qrl_learner_metrics_start(const char *listen, const char *tb_dir, qrl_learner_metrics_t **out,
                                     qrl_error *err) {
    *out = NULL;
    if (!*listen && !*tb_dir) return QRL_OK;
    qrl_learner_metrics_t *m = calloc(1, sizeof *m);
    if (!m) return qrl_error_set(err, QRL_STATUS_NOMEM, "metrics: out of memory");
    qrl_status st = QRL_OK;
    qrl_error inner;
    if (*listen) {
        QRL_TRY_GOTO(qrl_prom_registry_new(&m->reg, err), fail);
        m->own_reg = true;
    }
    QRL_TRY_GOTO(metrics_open(m, "", err), fail); /* the series first, the event file last (as before) */
    if (*listen && (st = qrl_prom_server_start(m->reg, listen, &m->server, &inner)) != QRL_OK) {
        qrl_error_set(err, st, "metrics.listen: %s", inner.msg);
        goto fail;
    }
    QRL_TRY_GOTO(metrics_open_events(m, tb_dir, err), fail);
    *out = m;
    return QRL_OK;
fail:
    qrl_learner_metrics_stop(m);
    return st;
}

/* The per-update values, in the order of UPDATE. */
static void update_values(uint64_t version, const qrl_learner_metrics_record *u, double v[N_UPDATE]) {
    const qrl_learner_stats *s = u->stats;
    const double x[] = {
        (double)version, (double)s->groups_used, (double)s->groups_dropped, s->reward_mean, s->reward_std,
        s->accuracy, s->response_len_mean, (double)s->version_min, (double)s->version_max, s->kl_behav_prox,
        s->max_w, s->entropy_mean, s->loss_mean, s->tis_frac, s->acr_frac, s->clip_frac_low, s->clip_frac_high,
        s->grad_norm_mean, s->lr, s->steps_taken, s->steps_skipped, (double)s->tokens_trained,
        s->train_tokens_per_s, u->update_s, u->snapshot_s,
    };
    _Static_assert(sizeof x / sizeof x[0] == N_UPDATE, "one value per UPDATE row");
    for (size_t i = 0; i < N_UPDATE; i++) v[i] = x[i];
}

void qrl_learner_metrics_update(qrl_learner_metrics_t *m, uint64_t step, uint64_t version,
                                const qrl_learner_metrics_record *u) {
    if (!m) return;
    double v[N_UPDATE];
    update_values(version, u, v);
    if (m->reg) {
        for (size_t i = 0; i < N_UPDATE; i++) qrl_prom_set(m->update[i], v[i]);
        qrl_prom_set(m->loop[L_STEP], (double)step);
        qrl_prom_add(m->loop[L_TOKENS_TOTAL], (double)u->stats->tokens_trained);
        qrl_prom_add(m->loop[L_SKIPPED_TOTAL], (double)u->stats->steps_skipped);
    }
    if (m->tb) {
        qrl_tfevents_scalar sc[N_UPDATE];
        for (size_t i = 0; i < N_UPDATE; i++) sc[i] = (qrl_tfevents_scalar){UPDATE[i].key, (float)v[i]};
        qrl_error err;
        if (qrl_tfevents_write_scalars(m->tb, (int64_t)step, 0, sc, N_UPDATE, &err) != QRL_OK) {
            QRL_LOG_WARN("learner", "tensorboard: %s (no more events are written)", err.msg);
            qrl_tfevents_close(m->tb);
            m->tb = NULL;
        }
    }
}

void qrl_learner_metrics_tick(qrl_learner_metrics_t *m, const qrl_learner_metrics_state *s) {
    if (!m || !m->reg) return;
    qrl_prom_set(m->loop[L_STATE], s->state);
    qrl_prom_set(m->loop[L_IN_FLIGHT], (double)s->groups_in_flight);
    qrl_prom_set(m->loop[L_BUFFERED], (double)s->groups_buffered);
    qrl_prom_set(m->loop[L_REPLICAS], s->replicas);
    qrl_prom_set(m->loop[L_SYNCED], s->replicas_synced);
    qrl_prom_set(m->loop[L_DISPATCHED], (double)s->groups_dispatched);
    qrl_prom_set(m->loop[L_RESULTS], (double)s->results);
    qrl_prom_set(m->loop[L_DUPLICATES], (double)s->duplicates);
    qrl_prom_set(m->loop[L_DEAD_LETTERS], (double)s->dead_letters);
}

int qrl_learner_metrics_port(const qrl_learner_metrics_t *m) {
    return m && m->server ? qrl_prom_server_port(m->server) : -1;
}

const char *qrl_learner_metrics_events_path(const qrl_learner_metrics_t *m) {
    return m && m->tb ? qrl_tfevents_path(m->tb) : NULL;
}

void qrl_learner_metrics_stop(qrl_learner_metrics_t *m) {
    if (!m) return;
    qrl_prom_server_stop(m->server);
    if (m->own_reg) qrl_prom_registry_destroy(m->reg);
    qrl_tfevents_close(m->tb);
    free(m);
}
