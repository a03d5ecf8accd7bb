/* qrl-learner updates (update.h). */
#include "update.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "checkpoint.h"
#include "control.h"
#include "core/log.h"
#include "dispatch.h"
#include "intake.h"
#include "trace.h"

static struct {
    ld_buffered *training; /* the quota the trainer holds */
    size_t n_training;
} U;

void ld_update_free(void) {
    free(U.training);
    U.training = NULL, U.n_training = 0;
}

void ld_update_try(ld_core *c) {
    if (c->training || ld_ckpt_busy() || ld_intake_counts_now().buffered < c->T || c->stopping || c->finished)
        return;
    ld_job *j = calloc(1, sizeof *j);
    QRL_CHECK(j != NULL);
    j->results = calloc(c->T, sizeof *j->results);
    QRL_CHECK(j->results != NULL);
    U.training = ld_intake_take(c->T);
    bool guided = ld_trace_consumed(c);
    if (guided) {
        j->traces = calloc(c->T, sizeof *j->traces);
        QRL_CHECK(j->traces != NULL);
    }
    for (uint32_t i = 0; i < c->T; i++) {
        j->results[i] = U.training[i].r;
        if (guided) { /* the join: as late as possible, so records that came after their result count */
            ld_trace_take(c, U.training[i].r, &j->traces[i]);
            j->trace_record_bytes += j->traces[i].record_bytes;
            j->trace_tokens += j->traces[i].tokens;
        }
        ld_group_set(U.training[i].r->group_id, GS_TRAINING);
    }
    U.n_training = c->T;
    c->training = true;
    ld_dispatch_taken(c->T);
    j->n = c->T;
    j->lr = c->s->learner.lr;
    j->version = c->version + 1;
    ld_trainer_submit(&c->trainer, j);
    /* alternate mode (SPEC §4.6): replicas decode nothing while the update runs; the next
     * quota is dispatched once the new version is published (ld_dispatch_fill) */
    if (ld_dispatch_alternate(c)) ld_control_announce(c, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_PAUSE);
    ld_dispatch_fill(c); /* the quota left the window: refill it (overlap mode) */
}

static void write_metrics(const ld_core *c, const ld_job *j, const ld_buffered *b) {
    FILE *f = qrl_service_metrics_jsonl(c->svc); /* metrics.jsonl, opened by the shell */
    if (!f) return;
    const qrl_learner_stats *s = &j->stats;
    fprintf(f, "{\"unix_ms\":%" PRIu64 ",\"step\":%" PRIu64 ",\"version\":%" PRIu64 ",\"groups\":[", ld_unix_ms(),
            c->step, c->version);
    for (size_t i = 0; i < j->n; i++) fprintf(f, "%s%" PRIu64, i ? "," : "", b[i].r->group_id);
    fprintf(f, "],\"dropped\":[");
    bool first = true;
    for (size_t i = 0; i < j->n; i++) { /* the update's dynamic-sampling rule: all rewards equal */
        const Qrl__GroupResult *r = b[i].r;
        bool same = true;
        for (size_t k = 1; k < r->n_responses; k++) same &= r->responses[k]->reward == r->responses[0]->reward;
        if (same && s->groups_dropped > 0) {
            fprintf(f, "%s%" PRIu64, first ? "" : ",", r->group_id);
            first = false;
        }
    }
    fprintf(f, "],\"groups_used\":%zu,\"groups_dropped\":%zu,\"reward_mean\":%.6g,\"reward_std\":%.6g,"
            "\"accuracy\":%.6g,\"response_len_mean\":%.6g,\"version_min\":%" PRIu64 ",\"version_max\":%" PRIu64
            ",\"kl_behav_prox\":%.6g,\"max_w\":%.6g,\"entropy\":%.6g,\"loss\":%.6g,\"tis_frac\":%.6g,"
            "\"acr_frac\":%.6g,\"seq_tis_frac\":%.6g,\"mis_frac\":%.6g,\"mis_seq_frac\":%.6g,"
            "\"disc_mean\":%.6g,\"disc_p99\":%.6g,\"disc_max\":%.6g,\"clip_low\":%.6g,\"clip_high\":%.6g,\"grad_norm\":%.6g,\"lr\":%.6g,"
            "\"steps_taken\":%d,\"steps_skipped\":%d,\"tokens_trained\":%zu,\"train_tokens_per_s\":%.6g,"
            "\"update_s\":%.6g,\"snapshot_s\":%.6g,\"prox_s\":%.6g,\"ref_s\":%.6g,\"train_s\":%.6g,"
            "\"trace_rows_guided\":%" PRIu64 ",\"trace_rows_unguided\":%" PRIu64 ",\"trace_disagree_share\":%.6g,"
            "\"trace_bytes_per_token\":%.6g,\"trace_record_bytes\":%" PRIu64,
            s->groups_used, s->groups_dropped, s->reward_mean, s->reward_std, s->accuracy, s->response_len_mean,
            s->version_min, s->version_max, s->kl_behav_prox, s->max_w, s->entropy_mean, s->loss_mean,
            s->tis_frac, s->acr_frac, s->seq_tis_frac, s->mis_frac, s->mis_seq_frac, s->discrepancy_mean,
            s->discrepancy_p99, s->discrepancy_max, s->clip_frac_low, s->clip_frac_high, s->grad_norm_mean, s->lr,
            s->steps_taken, s->steps_skipped, s->tokens_trained, s->train_tokens_per_s, j->update_s,
            j->snapshot_s, s->time_prox_s, s->time_ref_s, s->time_train_s, s->trace_rows_guided,
            s->trace_rows_unguided, qrl_trace_metric_disagree_share(s->trace_disagree, s->trace_elements_guided),
            qrl_trace_metric_bytes_per_token(j->trace_record_bytes, j->trace_tokens), j->trace_record_bytes);
    if (ld_trace_consumed(c)) { /* the store's counters since start (trace.h), held_bytes now */
        ld_trace_counts k = ld_trace_counts_now();
        fprintf(f, ",\"trace_store_chunks\":%" PRIu64 ",\"trace_store_bytes\":%" PRIu64 ",\"trace_store_duplicates\":%" PRIu64
                ",\"trace_store_late\":%" PRIu64 ",\"trace_store_other_run\":%" PRIu64 ",\"trace_store_undispatched\":%" PRIu64
                ",\"trace_store_dead_letters\":%" PRIu64 ",\"trace_store_evicted\":%" PRIu64 ",\"trace_store_expired\":%" PRIu64
                ",\"trace_store_joined\":%" PRIu64 ",\"trace_store_missing\":%" PRIu64 ",\"trace_store_corrupt\":%" PRIu64
                ",\"trace_store_sites_none\":%" PRIu64 ",\"trace_store_held_bytes\":%zu", k.chunks, k.bytes, k.duplicates,
                k.late, k.other_run, k.undispatched, k.dead_letters, k.evicted, k.expired, k.joined, k.missing, k.corrupt,
                k.sites_none, k.held_bytes);
    }
    fprintf(f, "}\n");
    fflush(f);
}

ld_update_next ld_update_finish(ld_core *c, ld_job *j) {
    c->training = false;
    if (j->st != QRL_OK) {
        /* A bad group refuses the whole update (update.h): nothing changed.  The results
         * passed the wire validators, so this is a model/config problem: stop. */
        QRL_LOG_ERROR("learner", "update %" PRIu64 " failed: %s", c->step + 1, j->error);
        ld_job_free(j); /* frees the results the quota held */
        free(U.training);
        U.training = NULL;
        c->finished = true;
        return LD_UPDATE_NEXT_FAIL;
    }
    c->step++;
    c->version = j->version;
    const qrl_learner_stats *s = &j->stats;
    c->last_reward = s->reward_mean;
    c->last_accuracy = s->accuracy;
    c->last_train_tps = s->train_tokens_per_s;
    QRL_LOG_INFO("learner", "update step=%" PRIu64 " version=%" PRIu64 " groups=%zu used=%zu dropped=%zu "
                 "reward=%.4f acc=%.3f kl_behav_prox=%.3g tis=%.4f acr=%.4f steps=%d tokens=%zu "
                 "update_s=%.2f snapshot_s=%.3f", c->step, c->version, s->groups_in, s->groups_used,
                 s->groups_dropped, s->reward_mean, s->accuracy, s->kl_behav_prox, s->tis_frac, s->acr_frac,
                 s->steps_taken, s->tokens_trained, j->update_s, j->snapshot_s);
    write_metrics(c, j, U.training);
    qrl_learner_metrics_update(c->lm, c->step, c->version,
                               &(qrl_learner_metrics_record){&j->stats, j->update_s, j->snapshot_s});
    for (size_t i = 0; i < U.n_training; i++) {
        ld_group_set(U.training[i].r->group_id, GS_TRAINED);
        ld_intake_done(c, U.training[i].off);
    }
    uint8_t handle[64];
    bool ipc = j->ipc;
    if (ipc) memcpy(handle, j->ipc_handle, sizeof handle);
    ld_job_free(j);
    free(U.training);
    U.training = NULL;
    U.n_training = 0;
    ld_control_publish_version(c, ipc ? handle : NULL);
    ld_dispatch_fill(c); /* alternate mode: the next quota, for the version just published */
    if (ld_ckpt_due(c)) ld_ckpt_start(c);
    if (c->max_updates && c->step >= c->max_updates) {
        QRL_LOG_INFO("learner", "max_updates=%" PRIu64 " reached: telling replicas to shut down", c->max_updates);
        c->finished = true;
        ld_control_announce(c, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
        return LD_UPDATE_NEXT_LAST;
    }
    return LD_UPDATE_NEXT_TRAIN;
}
