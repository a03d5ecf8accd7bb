/* qrl-learner loop thread (STYLE 14; docs/learner-daemon.md): dispatches PromptGroups,
 * takes GroupResults in, hands quotas to the trainer, announces versions, serves the
 * Learner gRPC service.  Nothing here waits: Kafka is polled with zero timeouts from a
 * uv_timer, commits are asynchronous, the trainer is reached through its job slot.
 *
 * Group ids are 1, 2, 3, ... in dispatch order; state[id] says where each one is, which
 * is also the dedupe table (a result for a group that is not DISPATCHED is dropped). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "kafka/kafka.h"
#include "kafka/offsets.h"
#include "daemon.h"
#include "ld_nccl.h"
#include "weights/wipc.h"
#include "learner/metrics.h"
#include "rpc/rpc.h"
#include "verify/verify.h"
#include "wire/chunk_join.h"
#include "wire/wire.h"

static uint64_t unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* ---- producing ------------------------------------------------------------------------ */

static void out_send(ld_daemon *d, ld_out *o) {
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = o->key_id ? qrl_wire_group_key(o->key_id, key) : 0;
    qrl_error err;
    qrl_status st = qrl_kafka_producer_send(d->producer, o->topic, klen ? key : NULL, klen, o->buf,
                                            o->len, o, &err);
    if (st != QRL_OK) {
        if (st != QRL_STATUS_BUSY) QRL_LOG_WARN("learner", "send to %s: %s (retrying)", o->topic, err.msg);
        o->next = d->resend;
        d->resend = o;
    }
}

static void on_delivery(void *user, void *opaque, const qrl_kafka_delivery *dv) {
    ld_daemon *d = user;
    ld_out *o = opaque;
    if (!o) return;
    if (dv->status != QRL_OK) {
        QRL_LOG_WARN("learner", "delivery to %s failed: %s (sending again)", dv->topic, dv->error ? dv->error : "?");
        o->next = d->resend;
        d->resend = o;
        return;
    }
    if (o->key_id && o->topic == d->prompts_topic && o->key_id < d->state_cap) d->ginfo[o->key_id].delivered = true;
    free(o->buf);
    free(o);
}

static void queue_record(ld_daemon *d, const char *topic, uint64_t key_id, uint8_t *buf, size_t len) {
    ld_out *o = calloc(1, sizeof *o);
    QRL_CHECK(o != NULL);
    *o = (ld_out){.topic = topic, .key_id = key_id, .buf = buf, .len = len};
    out_send(d, o);
}

/* ---- dispatch ------------------------------------------------------------------------- */

static void state_set(ld_daemon *d, uint64_t id, uint8_t s) {
    if (id >= d->state_cap) {
        size_t n = d->state_cap ? d->state_cap : 1024;
        while (n <= id) n *= 2;
        uint8_t *ns = realloc(d->state, n);
        QRL_CHECK(ns != NULL);
        memset(ns + d->state_cap, 0, n - d->state_cap);
        ld_ginfo *gi = realloc(d->ginfo, n * sizeof *gi);
        QRL_CHECK(gi != NULL);
        memset(gi + d->state_cap, 0, (n - d->state_cap) * sizeof *gi);
        d->ginfo = gi;
        d->state = ns;
        d->state_cap = n;
    }
    d->state[id] = s;
}
static uint8_t state_of_group(const ld_daemon *d, uint64_t id) { return id < d->state_cap ? d->state[id] : GS_NONE; }

/* Groups that may be dispatched and not yet trained: one quota for the update being
 * filled plus one per version of staleness allowed (docs/learner-daemon.md). */
static bool alternate_mode(const ld_daemon *d) {
    return strcmp(qrl_config_get_string(d->cfg, "learner.mode"), "alternate") == 0;
}

static uint64_t in_flight_limit(const ld_daemon *d) {
    if (alternate_mode(d)) return d->T; /* synchronous: one version's quota at a time */
    int64_t s = qrl_config_get_int(d->cfg, "learner.max_staleness");
    return (uint64_t)d->T * (uint64_t)(1 + (s < 0 ? 1 : s));
}

static void send_group(ld_daemon *d, uint64_t id, uint32_t epoch, uint64_t index, uint32_t item,
                       uint64_t version);

static void dispatch_one(ld_daemon *d) {
    if (d->cursor == d->ds->n) {
        d->cursor = 0;
        d->epoch++;
        qrl_epoch_order(d->ds->n, d->seed, d->epoch, d->perm);
        QRL_LOG_INFO("learner", "dataset epoch=%u begins", d->epoch);
    }
    uint64_t index = d->cursor++;
    uint64_t id = d->next_id++;
    send_group(d, id, d->epoch, index, d->perm[index], d->version);
    state_set(d, id, GS_DISPATCHED);
    d->ginfo[id] = (ld_ginfo){.dispatch_version = d->version, .sent_ms = unix_ms()};
    d->in_flight++;
    QRL_LOG_DEBUG("learner", "dispatched group=%" PRIu64 " epoch=%u index=%" PRIu64, id, d->epoch, index);
}

/* Produce the PromptGroup of group `id`: prompt `item` of the dataset, drawn at (epoch,
 * index).  Also used to produce a resumed group again (same id, same content). */
static void send_group(ld_daemon *d, uint64_t id, uint32_t epoch, uint64_t index, uint32_t item,
                       uint64_t version) {
    const ld_prompt *p = &d->ds->items[item];
    Qrl__SamplingParams sp = QRL__SAMPLING_PARAMS__INIT;
    sp.temperature = (float)qrl_config_get_double(d->cfg, "sampling.temperature");
    sp.top_p = (float)qrl_config_get_double(d->cfg, "sampling.top_p");
    sp.top_k = (uint32_t)qrl_config_get_int(d->cfg, "sampling.top_k");
    sp.max_new_tokens = (uint32_t)qrl_config_get_int(d->cfg, "sampling.max_new_tokens");
    sp.seed = d->seed;
    size_t n_stop; /* validated in main.c: at most 16 ids inside the vocabulary */
    const char *const *stop = qrl_config_get_list(d->cfg, "sampling.stop_token_ids", &n_stop);
    uint32_t stop_ids[16];
    for (size_t i = 0; i < n_stop && i < 16; i++) stop_ids[i] = (uint32_t)strtoul(stop[i], NULL, 10);
    sp.stop_token_ids = stop_ids;
    sp.n_stop_token_ids = n_stop < 16 ? n_stop : 16;
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = epoch;
    pos.index = index;
    pos.source = (char *)d->dataset_path;
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.group_id = id;
    pg.run_id = d->run_id;
    pg.group_size = d->G;
    pg.prompt_token_ids = p->ids;
    pg.n_prompt_token_ids = p->n_ids;
    pg.prompt_text = p->text;
    pg.reference_answer = p->answer;
    pg.task = (char *)d->task;
    pg.sampling = &sp;
    pg.position = &pos;
    pg.dispatch_version = version;
    pg.dispatched_unix_ms = unix_ms();
    uint8_t *buf;
    size_t len;
    qrl_error err;
    QRL_CHECK(qrl_wire_encode_alloc(&pg.base, &buf, &len, &err) == QRL_OK); /* only NOMEM */
    queue_record(d, d->prompts_topic, id, buf, len);
}

/* learner.redispatch_timeout_s: a group produced that long ago (and acknowledged by the
 * broker) with no result yet is produced again with the same id and content: a replica
 * lost it (e.g. dead-lettered the prompt, or hung).  The first result for the id trains;
 * a later one is dropped as a duplicate, so nothing trains twice. */
static void redispatch_stale(ld_daemon *d) {
    int64_t timeout_s = qrl_config_get_int(d->cfg, "learner.redispatch_timeout_s");
    if (timeout_s <= 0 || d->paused || d->stopping || d->finished) return;
    uint64_t now = unix_ms(), N = d->ds->n;
    if (d->oldest_dispatched == 0) d->oldest_dispatched = 1;
    while (d->oldest_dispatched < d->next_id && state_of_group(d, d->oldest_dispatched) != GS_DISPATCHED)
        d->oldest_dispatched++;
    uint32_t *perm = NULL;
    uint32_t perm_epoch = UINT32_MAX;
    for (uint64_t id = d->oldest_dispatched; id < d->next_id; id++) {
        ld_ginfo *gi = &d->ginfo[id];
        if (state_of_group(d, id) != GS_DISPATCHED || !gi->delivered ||
            now - gi->sent_ms < (uint64_t)timeout_s * 1000)
            continue;
        /* ids follow the dataset walk one to one: id k is position k - 1 of the walk */
        uint32_t epoch = (uint32_t)((id - 1) / N);
        uint64_t index = (id - 1) % N;
        const uint32_t *order = d->perm;
        if (epoch != d->epoch) {
            if (!perm) perm = malloc(N * sizeof *perm);
            QRL_CHECK(perm != NULL);
            if (perm_epoch != epoch) qrl_epoch_order(N, d->seed, epoch, perm), perm_epoch = epoch;
            order = perm;
        }
        QRL_LOG_WARN("learner", "group=%" PRIu64 " no result %.0f s after it was sent: dispatched "
                     "again at version %" PRIu64, id, (double)(now - gi->sent_ms) / 1000.0, d->version);
        send_group(d, id, epoch, index, order[index], d->version);
        gi->dispatch_version = d->version, gi->sent_ms = now, gi->delivered = false;
        d->redispatched++;
    }
    free(perm);
}

static void dispatch(ld_daemon *d) {
    if (d->paused || d->stopping || d->finished) return;
    uint64_t total_cap = d->max_updates ? d->max_updates * d->T : UINT64_MAX;
    while (d->in_flight < in_flight_limit(d) && d->next_id - 1 < total_cap) dispatch_one(d);
}

/* ---- intake --------------------------------------------------------------------------- */

/* Record a consumed message for commit-after-use (kafka/offsets.h). */
static qrl_kafka_offset *part_push(ld_daemon *d, int32_t p, int64_t offset) {
    return qrl_kafka_offsets_push(d->offsets, p, offset);
}


/* The record is used up: commit its partition up to the first record still in use (with
 * checkpoints on: remember it; the next checkpoint commits it). */
static void part_done(ld_daemon *d, int32_t p, qrl_kafka_offset *o) {
    int64_t upto = qrl_kafka_offsets_done(d->offsets, o, &p);
    if (upto < 0) return;
    if (d->ckpt_root) { /* committed with the next checkpoint (ckpt_done) */
        ld_ckpt_safe_set(d, p, upto);
        qrl_kafka_offsets_committed(d->offsets, p, upto);
        return;
    }
    qrl_error err;
    if (qrl_kafka_consumer_commit_offset_async(d->consumer, d->results_topic, p, upto, &err) != QRL_OK) {
        QRL_LOG_WARN("learner", "commit failed (the records will be delivered again): %s", err.msg);
        return;
    }
    qrl_kafka_offsets_committed(d->offsets, p, upto);
    QRL_LOG_DEBUG("learner", "commit partition=%d next_offset=%" PRId64, (int)p, upto);
}

static void dead_letter(ld_daemon *d, const qrl_kafka_message *m, const char *why) {
    char *rec;
    size_t len;
    qrl_error err;
    QRL_CHECK(qrl_kafka_dlq_encode(m->topic, m->partition, m->offset, m->key, m->key_len, m->payload,
                                   m->len, why, &rec, &len, &err) == QRL_OK);
    QRL_LOG_WARN("learner", "dead letter partition=%d offset=%" PRId64 ": %s", (int)m->partition, m->offset, why);
    queue_record(d, d->dlq_topic, 0, (uint8_t *)rec, len);
    d->dead_letters++;
}

static void on_result(ld_daemon *d, const qrl_kafka_message *m) {
    qrl_kafka_offset *off = part_push(d, m->partition, m->offset);
    int32_t part = m->partition;
    d->results++;
    ProtobufCMessage *pm = NULL;
    qrl_error err;
    qrl_status st = m->payload && m->len
                        ? qrl_wire_decode(&qrl__group_result__descriptor, m->payload, m->len,
                                          QRL_KAFKA_MAX_MESSAGE_BYTES, &pm, &err)
                        : qrl_error_set(&err, QRL_STATUS_PARSE, "empty record");
    Qrl__GroupResult *r = (Qrl__GroupResult *)pm;
    if (st == QRL_OK && r->chunk_count > 1) {
        qrl_wire_join_outcome co;
        pm = NULL; /* the assembler owns the chunk now */
        st = qrl_wire_joiner_add(&d->chunks, r, m->partition, off, unix_ms(), &co, &err);
        r = NULL;
        if (!co.done && st == QRL_OK) {
            if (!co.held) part_done(d, m->partition, off); /* a later chunk of an open set */
            return;
        }
        if (co.done) { /* the set ends here: it continues under its first chunk's record */
            if (off != co.first) part_done(d, m->partition, off);
            off = co.first;
            part = co.partition;
            r = co.whole;
            pm = r ? &r->base : NULL;
        }
    }
    if (st == QRL_OK)
        st = qrl_wire_group_result_validate(r, d->G, (uint32_t)d->model->cfg.vocab_size, &err);
    if (st != QRL_OK) {
        char why[700];
        snprintf(why, sizeof why, "%s: %s", qrl_status_name(st), err.msg);
        dead_letter(d, m, why);
        qrl_wire_free(pm);
        part_done(d, part, off);
        return;
    }
    uint8_t gs = state_of_group(d, r->group_id);
    if (r->run_id == d->run_id && gs == GS_NONE && r->group_id >= d->next_id) {
        /* this run never dispatched that id: a broken producer, not a redelivery */
        char why[200];
        snprintf(why, sizeof why, "NOT_FOUND: group_id %" PRIu64 " was never dispatched by run %" PRIu64
                 " (next id %" PRIu64 ")", r->group_id, d->run_id, d->next_id);
        dead_letter(d, m, why);
        qrl_wire_free(pm);
        part_done(d, part, off);
        return;
    }
    if (r->run_id != d->run_id || gs != GS_DISPATCHED) {
        if (r->run_id != d->run_id) d->other_run++;
        else d->duplicates++;
        QRL_LOG_INFO("learner", "result group=%" PRIu64 " run_id=%" PRIu64 " from %s ignored: %s",
                     r->group_id, r->run_id, r->replica_id,
                     r->run_id != d->run_id ? "another run" : gs == GS_NONE ? "never dispatched" : "duplicate");
        qrl_wire_free(pm);
        part_done(d, part, off);
        return;
    }
    if (d->n_buf == d->cap_buf) {
        d->cap_buf = d->cap_buf ? 2 * d->cap_buf : 64;
        d->buf = realloc(d->buf, d->cap_buf * sizeof *d->buf);
        QRL_CHECK(d->buf != NULL);
    }
    d->buf[d->n_buf++] = (ld_buffered){r, part, off};
    state_set(d, r->group_id, GS_BUFFERED);
    QRL_LOG_DEBUG("learner", "result group=%" PRIu64 " from %s buffered=%zu", r->group_id, r->replica_id, d->n_buf);
}

/* ---- updates -------------------------------------------------------------------------- */

static void push_event(ld_daemon *d, qrl_replica *r, Qrl__VersionEventKind kind);

static void maybe_train(ld_daemon *d) {
    if (d->training || d->ckpt_busy || d->n_buf < d->T || d->stopping || d->finished) return;
    ld_job *j = calloc(1, sizeof *j);
    QRL_CHECK(j != NULL);
    j->results = calloc(d->T, sizeof *j->results);
    d->training = malloc(d->T * sizeof *d->training);
    QRL_CHECK(j->results && d->training);
    for (uint32_t i = 0; i < d->T; i++) {
        d->training[i] = d->buf[i];
        j->results[i] = d->buf[i].r;
        state_set(d, d->buf[i].r->group_id, GS_TRAINING);
    }
    memmove(d->buf, d->buf + d->T, (d->n_buf - d->T) * sizeof *d->buf);
    d->n_buf -= d->T;
    d->n_training = d->T;
    d->in_flight -= d->T;
    j->n = d->T;
    j->lr = qrl_config_get_double(d->cfg, "learner.lr");
    j->version = d->version + 1;
    ld_trainer_submit(&d->trainer, j);
    /* alternate mode (SPEC §4.6): replicas decode nothing while the update runs; the next
     * quota's prompts wait at the replicas for the new version */
    if (alternate_mode(d))
        for (int i = 0; i < d->members.n; i++)
            push_event(d, &d->members.r[i], QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_PAUSE);
    dispatch(d); /* the quota left the window: refill it */
}

/* Whether r takes versions by CUDA IPC: the learner publishes on the device and r runs a
 * CUDA engine on this node (ReplicaInfo.node_id equal to ours). */
static bool replica_ipc(const ld_daemon *d, const qrl_replica *r) {
    return d->ipc && d->node_id[0] && r->info && r->info->node_id && !strcmp(r->info->node_id, d->node_id);
}

static void push_event(ld_daemon *d, qrl_replica *r, Qrl__VersionEventKind kind) {
    if (!r->watch) return;
    Qrl__VersionEvent ev = QRL__VERSION_EVENT__INIT;
    ev.kind = kind;
    ev.version = d->version;
    ev.step = d->step;
    ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP;
    ev.weight_addr = d->ws.addr;
    ld_nccl_fill_event(&d->nccl, r->id, &ev); /* NCCL fields inside an NCCL announcement */
    if (kind == QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION && d->ipc_version == d->version &&
        replica_ipc(d, r)) { /* same node: the device slot (the TCP address stays as fallback) */
        ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_CUDA_IPC;
        ev.ipc_handle.data = d->ipc_handle;
        ev.ipc_handle.len = sizeof d->ipc_handle;
    }
    ev.sent_unix_ms = unix_ms();
    qrl_error err;
    if (qrl_rpc_call_push(r->watch, &ev.base, &err) != QRL_OK) {
        QRL_LOG_WARN("learner", "VersionEvent to %s: %s", r->id, err.msg);
        qrl_rpc_call_finish(r->watch, QRL_STATUS_CANCELLED, "stream over");
        r->watch = NULL;
    }
}

/* The transport of the version about to be announced: the replicas watching versions form
 * the sync group (ld_nccl.c). */
static void plan_transport(ld_daemon *d) {
    const char *ids[QRL_MAX_REPLICAS];
    size_t n = 0;
    for (int i = 0; i < d->members.n; i++) /* CUDA IPC replicas are not in the NCCL group */
        if (d->members.r[i].watch && !d->members.r[i].lost && !replica_ipc(d, &d->members.r[i]))
            ids[n++] = d->members.r[i].id;
    ld_nccl_plan(&d->nccl, ids, n, d->version);
}

static void begin_close(ld_daemon *d);
/* The end of the run (max_updates, Shutdown, a resumed finished run): the final state is
 * checkpointed first when nothing has checkpointed it yet (max_updates started one already). */
static void on_exit_timer(uv_timer_t *t) {
    ld_daemon *d = t->data;
    if (d->ckpt_root && !d->ckpt_busy && !d->training && d->ckpt_step != d->step) ld_ckpt_start(d);
    begin_close(d);
}

static void write_metrics(ld_daemon *d, const ld_job *j, const ld_buffered *b) {
    if (!d->metrics) return;
    const qrl_learner_stats *s = &j->stats;
    fprintf(d->metrics, "{\"unix_ms\":%" PRIu64 ",\"step\":%" PRIu64 ",\"version\":%" PRIu64
            ",\"groups\":[", unix_ms(), d->step, d->version);
    for (size_t i = 0; i < j->n; i++) fprintf(d->metrics, "%s%" PRIu64, i ? "," : "", b[i].r->group_id);
    fprintf(d->metrics, "],\"dropped\":[");
    bool first = true;
    for (size_t i = 0; i < j->n; i++) { /* the update's dynamic-sampling rule: all rewards equal */
        const Qrl__GroupResult *r = b[i].r;
        bool same = true;
        for (size_t k = 1; k < r->n_responses; k++) same &= r->responses[k]->reward == r->responses[0]->reward;
        if (same && s->groups_dropped > 0) {
            fprintf(d->metrics, "%s%" PRIu64, first ? "" : ",", r->group_id);
            first = false;
        }
    }
    fprintf(d->metrics, "],\"groups_used\":%zu,\"groups_dropped\":%zu,\"reward_mean\":%.6g,\"reward_std\":%.6g,"
            "\"accuracy\":%.6g,\"response_len_mean\":%.6g,\"version_min\":%" PRIu64 ",\"version_max\":%" PRIu64
            ",\"kl_behav_prox\":%.6g,\"max_w\":%.6g,\"entropy\":%.6g,\"loss\":%.6g,\"tis_frac\":%.6g,"
            "\"acr_frac\":%.6g,\"seq_tis_frac\":%.6g,\"mis_frac\":%.6g,\"mis_seq_frac\":%.6g,"
            "\"disc_mean\":%.6g,\"disc_p99\":%.6g,\"disc_max\":%.6g,\"clip_low\":%.6g,\"clip_high\":%.6g,\"grad_norm\":%.6g,\"lr\":%.6g,"
            "\"steps_taken\":%d,\"steps_skipped\":%d,\"tokens_trained\":%zu,\"train_tokens_per_s\":%.6g,"
            "\"update_s\":%.6g,\"snapshot_s\":%.6g,\"prox_s\":%.6g,\"ref_s\":%.6g,\"train_s\":%.6g}\n",
            s->groups_used, s->groups_dropped, s->reward_mean, s->reward_std, s->accuracy, s->response_len_mean,
            s->version_min, s->version_max, s->kl_behav_prox, s->max_w, s->entropy_mean, s->loss_mean,
            s->tis_frac, s->acr_frac, s->seq_tis_frac, s->mis_frac, s->mis_seq_frac, s->discrepancy_mean,
            s->discrepancy_p99, s->discrepancy_max, s->clip_frac_low, s->clip_frac_high, s->grad_norm_mean, s->lr,
            s->steps_taken, s->steps_skipped, s->tokens_trained, s->train_tokens_per_s, j->update_s,
            j->snapshot_s, s->time_prox_s, s->time_ref_s, s->time_train_s);
    fflush(d->metrics);
}

static void on_trained(uv_async_t *h) {
    ld_daemon *d = h->data;
    ld_job *j = ld_trainer_take_done(&d->trainer);
    if (!j) return;
    if (j->ckpt) return ld_ckpt_done(d, j);
    if (j->st != QRL_OK) {
        /* A bad group refuses the whole update (update.h): nothing changed.  The results
         * passed the wire validators, so this is a model/config problem: stop. */
        QRL_LOG_ERROR("learner", "update %" PRIu64 " failed: %s", d->step + 1, j->error);
        for (size_t i = 0; i < d->n_training; i++) d->training[i].r = NULL; /* freed with j */
        ld_job_free(j);
        free(d->training);
        d->training = NULL;
        d->finished = true;
        begin_close(d);
        return;
    }
    d->step++;
    d->version = j->version;
    if (j->ipc) {
        d->ipc_version = j->version;
        memcpy(d->ipc_handle, j->ipc_handle, sizeof d->ipc_handle);
    }
    const qrl_learner_stats *s = &j->stats;
    d->last_reward = s->reward_mean;
    d->last_accuracy = s->accuracy;
    d->last_train_tps = s->train_tokens_per_s;
    QRL_LOG_INFO("learner", "update step=%" PRIu64 " version=%" PRIu64 " groups=%zu used=%zu dropped=%zu "
                 "reward=%.4f acc=%.3f kl_behav_prox=%.3g tis=%.4f acr=%.4f steps=%d tokens=%zu "
                 "update_s=%.2f snapshot_s=%.3f", d->step, d->version, s->groups_in, s->groups_used,
                 s->groups_dropped, s->reward_mean, s->accuracy, s->kl_behav_prox, s->tis_frac, s->acr_frac,
                 s->steps_taken, s->tokens_trained, j->update_s, j->snapshot_s);
    write_metrics(d, j, d->training);
    qrl_learner_metrics_update(d->lm, d->step, d->version,
                               &(qrl_learner_metrics_record){&j->stats, j->update_s, j->snapshot_s});
    for (size_t i = 0; i < d->n_training; i++) {
        state_set(d, d->training[i].r->group_id, GS_TRAINED);
        part_done(d, d->training[i].partition, d->training[i].off);
    }
    ld_job_free(j);
    free(d->training);
    d->training = NULL;
    d->n_training = 0;
    plan_transport(d);
    for (int i = 0; i < d->members.n; i++)
        push_event(d, &d->members.r[i], QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    ld_nccl_send(&d->nccl, d->version);
    if (d->ckpt_root && (d->step % d->ckpt_every == 0 || d->n_ckpt_calls || d->stopping ||
                         (d->max_updates && d->step >= d->max_updates)))
        ld_ckpt_start(d);
    if (d->max_updates && d->step >= d->max_updates) {
        QRL_LOG_INFO("learner", "max_updates=%" PRIu64 " reached: telling replicas to shut down", d->max_updates);
        d->finished = true;
        for (int i = 0; i < d->members.n; i++)
            push_event(d, &d->members.r[i], QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
        /* give the events (and the last weight streams) a moment to leave */
        uv_timer_start(&d->exit_timer, on_exit_timer, 1500, 0);
        return;
    }
    maybe_train(d);
    if (d->stopping) begin_close(d);
}

/* ---- closing -------------------------------------------------------------------------- */

static void close_handle(uv_handle_t *h) {
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void on_rpc_closed(qrl_rpc_server_t *s, void *user) {
    ld_daemon *d = user;
    close_handle((uv_handle_t *)&d->tick);
    close_handle((uv_handle_t *)&d->exit_timer);
    close_handle((uv_handle_t *)&d->sigterm);
    close_handle((uv_handle_t *)&d->sigint);
    close_handle((uv_handle_t *)&d->train_async);
}

static void begin_close(ld_daemon *d) {
    if (d->ckpt_busy) { /* the trainer is writing a checkpoint: close when it is done */
        d->close_after_ckpt = true;
        return;
    }
    if (d->closing) return;
    d->closing = true;
    QRL_LOG_INFO("learner", "stopping: step=%" PRIu64 " version=%" PRIu64 " dispatched=%" PRIu64
                 " results=%" PRIu64 " duplicates=%" PRIu64 " dead_letters=%" PRIu64
                 " redispatched=%" PRIu64, d->step, d->version, d->next_id - 1, d->results,
                 d->duplicates, d->dead_letters, d->redispatched);
    uv_timer_stop(&d->tick);
    for (int i = 0; i < d->members.n; i++) d->members.r[i].watch = NULL; /* the server cancels them */
    qrl_rpc_server_close(d->rpc, on_rpc_closed, d);
}

static void on_signal(uv_signal_t *h, int sig) {
    ld_daemon *d = h->data;
    if (d->stopping) {
        QRL_LOG_ERROR("learner", "second signal %d: exiting now", sig);
        _exit(1);
    }
    d->stopping = true;
    QRL_LOG_INFO("learner", "%s: no more dispatch; stopping after the running update%s",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", d->ckpt_root ? " and a checkpoint" : "");
    if (d->training) return; /* on_trained checkpoints and closes */
    if (d->ckpt_root && !d->ckpt_busy && d->ckpt_step != d->step) ld_ckpt_start(d);
    begin_close(d);
}

/* ---- tick ----------------------------------------------------------------------------- */

static void expire_replicas(ld_daemon *d) {
    qrl_members_expire(&d->members, unix_ms(), (uint64_t)qrl_config_get_int(d->cfg, "learner.heartbeat_timeout_ms"));
}

static void publish_metrics(ld_daemon *d);

static void on_tick(uv_timer_t *t) {
    ld_daemon *d = t->data;
    qrl_wire_join_outcome gone[16];
    size_t n_gone = qrl_wire_joiner_expire(&d->chunks, unix_ms(), 60000, gone, 16);
    for (size_t i = 0; i < n_gone; i++) {
        d->dead_letters++;
        part_done(d, gone[i].partition, gone[i].first);
    }
    qrl_kafka_producer_poll(d->producer, 0);
    uint64_t failed;
    if (ld_nccl_take_failed(&d->nccl, &failed) && failed == d->version) /* NCCL failed: TCP instead */
        for (int i = 0; i < d->members.n; i++)
            push_event(d, &d->members.r[i], QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    ld_out *o = d->resend;
    d->resend = NULL;
    while (o) {
        ld_out *next = o->next;
        o->next = NULL;
        out_send(d, o);
        o = next;
    }
    dispatch(d);
    redispatch_stale(d);
    for (int n = 0; n < 64 && !d->finished; n++) {
        qrl_kafka_message msg = {0};
        bool got = false;
        qrl_error err;
        if (qrl_kafka_consumer_poll(d->consumer, 0, &msg, &got, &err) != QRL_OK) {
            if (uv_now(&d->loop) - d->warned_ms >= 1000) {
                d->warned_ms = uv_now(&d->loop);
                QRL_LOG_WARN("learner", "consumer: %s", err.msg);
            }
            break;
        }
        if (!got) break;
        on_result(d, &msg);
        qrl_kafka_message_release(&msg);
    }
    maybe_train(d);
    expire_replicas(d);
    publish_metrics(d);
}

/* ---- rpc ------------------------------------------------------------------------------ */

/* A registered replica that is not lost, or NULL. */
static qrl_replica *replica_find(ld_daemon *d, const char *id) {
    qrl_replica *r = qrl_members_find(&d->members, id);
    return r && !r->lost ? r : NULL;
}

static Qrl__ServiceState service_state(const ld_daemon *d) {
    if (d->closing || d->finished) return QRL__SERVICE_STATE__SERVICE_STATE_STOPPED;
    if (d->stopping) return QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    if (d->paused) return QRL__SERVICE_STATE__SERVICE_STATE_PAUSED;
    return QRL__SERVICE_STATE__SERVICE_STATE_RUNNING;
}

static void h_register(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const Qrl__RegisterRequest *rq = (const Qrl__RegisterRequest *)req;
    qrl_replica *r;
    qrl_error err;
    if (qrl_members_register(&d->members, rq->replica, rq->have_version, unix_ms(), &r, &err) != QRL_OK)
        return qrl_rpc_call_finish(call, err.status, "%s", err.msg);
    QRL_LOG_INFO("learner", "replica registered id=%s have_version=%" PRIu64 " control=%s replicas=%d", r->id,
                 rq->have_version, r->info->control_addr, qrl_members_live(&d->members));
    ld_nccl_note(&d->nccl, r->id, rq->replica->nccl);
    Qrl__RegisterResponse resp = QRL__REGISTER_RESPONSE__INIT;
    resp.replica_id = r->id;
    resp.run_id = d->run_id;
    resp.current_version = d->version;
    resp.heartbeat_interval_ms = (uint32_t)qrl_config_get_int(d->cfg, "learner.heartbeat_interval_ms");
    resp.heartbeat_timeout_ms = (uint32_t)qrl_config_get_int(d->cfg, "learner.heartbeat_timeout_ms");
    resp.kafka_brokers = (char *)qrl_config_get_string(d->cfg, "kafka.bootstrap");
    resp.prompts_topic = (char *)d->prompts_topic;
    resp.results_topic = (char *)d->results_topic;
    resp.dlq_topic = (char *)d->dlq_topic;
    resp.max_staleness = (uint32_t)qrl_config_get_int(d->cfg, "learner.max_staleness");
    resp.mode = (char *)qrl_config_get_string(d->cfg, "learner.mode");
    qrl_rpc_call_reply(call, &resp.base);
}

static void h_heartbeat(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const Qrl__HeartbeatRequest *rq = (const Qrl__HeartbeatRequest *)req;
    qrl_replica *r = replica_find(d, rq->replica_id ? rq->replica_id : "");
    if (r) qrl_members_heartbeat(r, rq->status, unix_ms());
    Qrl__HeartbeatResponse resp = QRL__HEARTBEAT_RESPONSE__INIT;
    resp.known = r != NULL;
    resp.current_version = d->version;
    qrl_rpc_call_reply(call, &resp.base);
}

static void on_watch_close(qrl_rpc_call_t *call, void *user) {
    ld_daemon *d = user;
    for (int i = 0; i < d->members.n; i++)
        if (d->members.r[i].watch == call) d->members.r[i].watch = NULL;
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client went away");
}

static void h_watch(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const Qrl__WatchVersionsRequest *rq = (const Qrl__WatchVersionsRequest *)req;
    qrl_replica *r = replica_find(d, rq->replica_id ? rq->replica_id : "");
    if (!r) return qrl_rpc_call_finish(call, QRL_STATUS_NOT_FOUND, "replica '%s' is not registered",
                                       rq->replica_id ? rq->replica_id : "");
    if (r->watch) qrl_rpc_call_finish(r->watch, QRL_STATUS_CANCELLED, "replaced by a newer stream");
    r->watch = call;
    qrl_rpc_call_on_close(call, on_watch_close, d);
    /* a replica behind the current version (a late joiner) gets it at once */
    if (rq->have_version < d->version)
        push_event(d, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION);
    if (d->finished && r->watch) push_event(d, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
}

static void h_status(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    Qrl__LearnerStatus s = QRL__LEARNER_STATUS__INIT;
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = d->epoch;
    pos.index = d->cursor;
    pos.source = (char *)d->dataset_path;
    s.state = service_state(d);
    s.version = d->version;
    s.step = d->step;
    s.run_id = d->run_id;
    s.mode = (char *)qrl_config_get_string(d->cfg, "learner.mode");
    s.replicas = (uint32_t)qrl_members_live(&d->members);
    for (int i = 0; i < d->members.n; i++)
        s.replicas_synced += !d->members.r[i].lost && d->members.r[i].version == d->version;
    s.lr = qrl_config_get_double(d->cfg, "learner.lr");
    s.groups_in_flight = d->in_flight - d->n_buf;
    s.groups_buffered = d->n_buf;
    s.quota = d->T;
    s.position = &pos;
    s.train_tokens_per_s = d->last_train_tps;
    s.reward_mean = (float)d->last_reward;
    s.accuracy = (float)d->last_accuracy;
    s.uptime_s = (unix_ms() - d->started_ms) / 1000;
    for (int i = 0; i < d->members.n; i++) /* the live replicas' decode rates, from heartbeats */
        if (!d->members.r[i].lost && d->members.r[i].status)
            s.rollout_tokens_per_s += d->members.r[i].status->tokens_per_s;
    if (d->ckpt_root && d->ckpt_step != UINT64_MAX) {
        s.last_checkpoint_step = d->ckpt_step;
        s.last_checkpoint_path = d->ckpt_dir;
    }
    qrl_rpc_call_reply(call, &s.base);
}

static void publish_metrics(ld_daemon *d) {
    if (!d->lm) return;
    qrl_learner_metrics_state s = {.groups_dispatched = d->next_id - 1, .groups_in_flight = d->in_flight - d->n_buf,
                          .groups_buffered = d->n_buf, .results = d->results, .duplicates = d->duplicates,
                          .dead_letters = d->dead_letters, .replicas = qrl_members_live(&d->members),
                          .state = service_state(d)};
    for (int i = 0; i < d->members.n; i++)
        s.replicas_synced += !d->members.r[i].lost && d->members.r[i].version == d->version;
    qrl_learner_metrics_tick(d->lm, &s);
}

static void reply_control(ld_daemon *d, qrl_rpc_call_t *call, const char *msg) {
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = service_state(d);
    r.message = (char *)msg;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_pause(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    d->paused = true;
    QRL_LOG_INFO("learner", "paused: no more dispatch (in-flight groups are still trained)");
    reply_control(d, call, "dispatch paused");
}

static void h_resume(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    d->paused = false;
    QRL_LOG_INFO("learner", "resumed");
    reply_control(d, call, "dispatch resumed");
}

static void h_set(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    qrl_rpc_call_config_set(call, d->cfg, (const Qrl__SetRequest *)req);
}

static void h_list_replicas(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    qrl_members_reply_list(call, &((ld_daemon *)user)->members);
}

/* Drain one replica ("" = every one): its SHUTDOWN event makes it finish the groups it
 * holds, deliver their results and exit (docs/rollout-daemon.md "Drain"). */
static void h_drain(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const char *id = ((const Qrl__DrainRequest *)req)->replica_id;
    id = id ? id : "";
    int told = 0;
    for (int i = 0; i < d->members.n; i++) {
        qrl_replica *r = &d->members.r[i];
        if (r->lost || (*id && strcmp(r->id, id) != 0)) continue;
        if (!r->watch)
            return qrl_rpc_call_finish(call, QRL_STATUS_BUSY, "replica '%s' has no open WatchVersions "
                                       "stream yet; try again", r->id);
        push_event(d, r, QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
        r->draining = true;
        told++;
    }
    if (*id && !told)
        return qrl_rpc_call_finish(call, QRL_STATUS_NOT_FOUND, "replica '%s' is not registered (or lost)", id);
    QRL_LOG_INFO("learner", "drain %s: %d replica(s) told to finish their groups and stop", *id ? id : "all", told);
    Qrl__ControlResponse r = QRL__CONTROL_RESPONSE__INIT;
    r.state = QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
    char msg[200];
    snprintf(msg, sizeof msg, "%d replica(s) draining", told);
    r.message = msg;
    qrl_rpc_call_reply(call, &r.base);
}

static void h_shutdown(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const Qrl__ShutdownRequest *rq = (const Qrl__ShutdownRequest *)req;
    /* an operator's normal early end (deploy/local/launch.sh reads this line): as SIGTERM,
     * the running update finishes and the final state is checkpointed */
    QRL_LOG_INFO("learner", "Shutdown requested reason='%s' at step=%" PRIu64 ": telling replicas to shut down; "
                 "stopping after the running update%s", rq->reason ? rq->reason : "", d->step,
                 d->ckpt_root ? " and a checkpoint" : "");
    reply_control(d, call, "shutting down");
    for (int i = 0; i < d->members.n; i++)
        push_event(d, &d->members.r[i], QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN);
    d->stopping = true;
    if (!d->training) uv_timer_start(&d->exit_timer, on_exit_timer, 500, 0);
}


/* ---- run ------------------------------------------------------------------------------ */

static qrl_status setup(ld_daemon *d, const qrl_learner_config *lc, qrl_error *err) {
    qrl_config_t *cfg = d->cfg;
    QRL_TRY(ld_wserver_start(&d->ws, qrl_config_get_string(cfg, "weights.listen"), err));
    QRL_TRY(ld_nccl_start(&d->nccl, cfg, &d->ws, err));
    QRL_TRY(ld_trainer_start(&d->trainer, d->model, lc, &d->ws, NULL,
                             (size_t)qrl_config_get_int(cfg, "weights.bucket_bytes"), &d->train_async, err));
    if (lc->device_weights) { /* after the engine: its errors name the device first */
        QRL_TRY(qrl_wipc_sender_new(lc->device, &d->ipc, err));
        qrl_wipc_node_id(d->node_id);
        d->trainer.ipc = d->ipc; /* before the first job: ld_trainer_submit's mutex orders it */
        QRL_LOG_INFO("weights", "versions are published on cuda:%d; replicas on node %s take them by CUDA IPC",
                     lc->device, d->node_id);
    }
    const char *bootstrap = qrl_config_get_string(cfg, "kafka.bootstrap");
    qrl_kafka_producer_opts po = {.bootstrap = bootstrap, .client_id = "qrl-learner", .linger_ms = 2,
                                  .on_delivery = on_delivery, .user = d};
    QRL_TRY(qrl_kafka_producer_new(&po, &d->producer, err));
    qrl_kafka_consumer_opts co = {.bootstrap = bootstrap, .group_id = qrl_config_get_string(cfg, "kafka.group"),
                                  .client_id = "qrl-learner",
                                  .session_timeout_ms = (int)qrl_config_get_int(cfg, "kafka.session_timeout_ms")};
    QRL_TRY(qrl_kafka_consumer_new(&co, &d->results_topic, 1, &d->consumer, err));
    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have = false;
    const char *tf = qrl_config_get_string(cfg, "rpc.token_file");
    QRL_TRY(qrl_rpc_token_resolve(*tf ? tf : NULL, token, &have, err));
    if (!have) QRL_LOG_WARN("learner", "no rpc token (rpc.token_file): mutating calls are refused");
    qrl_rpc_server_opts ro = {.addr = qrl_config_get_string(cfg, "rpc.listen"), .token = have ? token : NULL,
                              .allow_no_token = !have};
    qrl_rpc_server_opts_tls(&ro, cfg);
    QRL_TRY(qrl_rpc_server_new(&d->loop, &ro, &d->rpc, err));
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_REGISTER, h_register, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_HEARTBEAT, h_heartbeat, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_WATCH_VERSIONS, h_watch, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_STATUS, h_status, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_PAUSE, h_pause, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_RESUME, h_resume, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_SET, h_set, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_SHUTDOWN, h_shutdown, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_CHECKPOINT, ld_ckpt_h_checkpoint, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_LIST_REPLICAS, h_list_replicas, d);
    qrl_rpc_server_handle(d->rpc, QRL_RPC_LEARNER_DRAIN, h_drain, d);
    QRL_TRY(qrl_rpc_server_start(d->rpc, err));
    QRL_LOG_INFO("learner", "rpc listening port=%d", qrl_rpc_server_port(d->rpc));
    const char *mp = qrl_config_get_string(cfg, "metrics.jsonl");
    if (*mp && !(d->metrics = fopen(mp, "a")))
        return qrl_error_set(err, QRL_STATUS_IO, "metrics.jsonl: cannot open %s", mp);
    return qrl_learner_metrics_start(qrl_config_get_string(cfg, "metrics.listen"),
                                     qrl_config_get_string(cfg, "metrics.tensorboard_dir"), &d->lm, err);
}

int ld_daemon_run(qrl_config_t *cfg, qrl_model *model, const qrl_tokenizer *tok, const ld_dataset *ds,
                  const qrl_learner_config *lc) {
    static ld_daemon dd; /* one per process; handles outlive every callback */
    ld_daemon *d = &dd;
    d->cfg = cfg;
    d->offsets = qrl_kafka_offsets_new();
    QRL_CHECK(d->offsets != NULL);
    d->model = model;
    d->started_ms = unix_ms();
    d->ds = ds;
    d->prompts_topic = qrl_config_get_string(cfg, "kafka.prompts_topic");
    d->results_topic = qrl_config_get_string(cfg, "kafka.results_topic");
    d->dlq_topic = qrl_config_get_string(cfg, "kafka.dlq_topic");
    d->task = qrl_config_get_string(cfg, "dataset.task");
    d->dataset_path = qrl_config_get_string(cfg, "dataset.path");
    d->G = (uint32_t)qrl_config_get_int(cfg, "learner.group_size");
    d->T = (uint32_t)qrl_config_get_int(cfg, "learner.quota");
    d->max_updates = (uint64_t)qrl_config_get_int(cfg, "learner.max_updates");
    d->seed = (uint64_t)qrl_config_get_int(cfg, "learner.seed");
    d->run_id = (uint64_t)qrl_config_get_int(cfg, "learner.run_id");
    if (!d->run_id) d->run_id = (unix_ms() << 16) ^ (uint64_t)getpid();
    d->next_id = 1;
    d->perm = malloc(ds->n * sizeof *d->perm);
    QRL_CHECK(d->perm != NULL);
    qrl_epoch_order(ds->n, d->seed, 0, d->perm);
    qrl_error err;
    qrl_learner_config lcr = *lc;
    qrl_ckpt_state rs;
    char rdir[QRL_CKPT_PATH_MAX];
    bool resumed = false;
    if (ld_ckpt_configure(d, tok, &lcr, &resumed, rdir, &rs, &err) != QRL_OK) {
        fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
        return 1;
    }
    uv_loop_init(&d->loop);
    uv_async_init(&d->loop, &d->train_async, on_trained);
    d->train_async.data = d;
    if (setup(d, &lcr, &err) != QRL_OK || (resumed && ld_ckpt_restore(d, rdir, &rs, &err) != QRL_OK)) {
        fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
        _exit(1); /* handles half made; nothing in flight yet */
    }
    qrl_ckpt_state_free(&rs);
    if (d->max_updates && d->step >= d->max_updates) { /* resumed a finished run */
        QRL_LOG_INFO("learner", "max_updates=%" PRIu64 " reached already (step %" PRIu64 "): stopping",
                     d->max_updates, d->step);
        d->finished = true;
    }
    uv_timer_init(&d->loop, &d->tick);
    uv_timer_init(&d->loop, &d->exit_timer);
    d->tick.data = d->exit_timer.data = d;
    int period = (int)qrl_config_get_int(cfg, "kafka.poll_ms");
    uv_timer_start(&d->tick, on_tick, (uint64_t)period, (uint64_t)period);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d->sigint.data = d;
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    if (d->finished) uv_timer_start(&d->exit_timer, on_exit_timer, 1500, 0);
    QRL_LOG_INFO("learner", "serving run_id=%" PRIu64 " prompts=%s results=%s G=%u T=%u window=%" PRIu64
                 " dataset=%zu prompts", d->run_id, d->prompts_topic, d->results_topic, d->G, d->T,
                 in_flight_limit(d), ds->n);

    uv_run(&d->loop, UV_RUN_DEFAULT);

    ld_trainer_join(&d->trainer);
    ld_nccl_stop(&d->nccl);
    ld_wserver_stop(&d->ws);
    qrl_wipc_sender_free(d->ipc); /* after the servers: their snapshots read its slots */
    qrl_kafka_consumer_close(d->consumer);
    int rc = qrl_kafka_producer_flush(d->producer, 10000, &err) == QRL_OK ? 0 : 1;
    if (rc) fprintf(stderr, "qrl-learner: error: %s\n", err.msg);
    qrl_kafka_producer_destroy(d->producer);
    uv_loop_close(&d->loop);
    for (size_t i = 0; i < d->n_buf; i++) qrl_wire_free(&d->buf[i].r->base);
    qrl_wire_joiner_free(&d->chunks);
    qrl_kafka_offsets_free(d->offsets);
    qrl_members_free(&d->members);
    while (d->resend) {
        ld_out *n = d->resend->next;
        free(d->resend->buf);
        free(d->resend);
        d->resend = n;
    }
    free(d->training);
    free(d->buf);
    free(d->state);
    free(d->ginfo);
    free(d->safe);
    free(d->abs_model), free(d->abs_tok), free(d->abs_ds);
    free(d->perm);
    if (d->metrics) fclose(d->metrics);
    qrl_learner_metrics_stop(d->lm);
    QRL_LOG_INFO("learner", "stopped rc=%d step=%" PRIu64 " version=%" PRIu64, rc, d->step, d->version);
    return rc;
}

/* ---- for checkpoint.c (daemon.h) ----------------------------------------------------------- */

void ld_state_set(ld_daemon *d, uint64_t id, uint8_t s) { state_set(d, id, s); }
void ld_send_group(ld_daemon *d, uint64_t id, uint32_t epoch, uint64_t index, uint32_t item, uint64_t version) {
    send_group(d, id, epoch, index, item, version);
}
void ld_maybe_train(ld_daemon *d) { maybe_train(d); }
void ld_begin_close(ld_daemon *d) { begin_close(d); }
