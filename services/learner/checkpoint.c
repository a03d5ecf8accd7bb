/* qrl-learner checkpoints (docs/learner-daemon.md "Checkpoints", "Resume", "Export"):
 *   - trainer side: write one (tensors, optimizer, manifest) from the job the loop made;
 *   - loop side: copy the loop's state into a job, finish it (commit the recorded
 *     offsets, answer Learner.Checkpoint), resolve and restore one at start;
 *   - the `qrl-learner export` subcommand (checkpoint -> HuggingFace folder, UAQ undone).
 * Common format code: common/learner/checkpoint.h. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "daemon.h"
#include "io/atomic_file.h"

static uint64_t ckpt_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ld_ckpt_run(ld_trainer *t, ld_job *j) {
    ld_ckpt_job *c = j->ckpt;
    qrl_error err;
    double t0 = now_s();
    c->state.learner_updates = qrl_learner_updates(t->l);
    j->st = qrl_learner_sync_host(t->l, &err); /* a GPU engine's AdamW state */
    if (j->st == QRL_OK)
        j->st = qrl_ckpt_write(c->root, t->m, qrl_learner_optimizer(t->l), &c->state, c->keep, c->dir, &c->bytes,
                           &err);
    c->seconds = now_s() - t0;
    if (j->st != QRL_OK) snprintf(j->error, sizeof j->error, "%s", err.msg);
}

qrl_status ld_ckpt_resolve(const char *resume, const char *root, bool *found, char *dir, qrl_ckpt_state *s,
                           qrl_error *err) {
    *found = false;
    memset(s, 0, sizeof *s);
    if (!*resume || strcmp(resume, "none") == 0) return QRL_OK;
    const char *path = resume;
    if (strcmp(resume, "auto") == 0) {
        if (!*root)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "learner.resume=auto needs learner.checkpoint_dir");
        struct stat sb;
        if (stat(root, &sb) != 0) {
            QRL_LOG_INFO("learner", "resume=auto: %s does not exist yet: starting fresh", root);
            return QRL_OK;
        }
        path = root;
        qrl_error e2;
        qrl_status st = qrl_ckpt_find(path, dir, &e2);
        if (st == QRL_STATUS_NOT_FOUND) {
            QRL_LOG_INFO("learner", "resume=auto: %s (starting fresh)", e2.msg);
            return QRL_OK;
        }
        if (st != QRL_OK) return qrl_error_set(err, st, "learner.resume: %s", e2.msg);
    } else {
        qrl_error e2;
        if (qrl_ckpt_find(path, dir, &e2) != QRL_OK)
            return qrl_error_set(err, e2.status, "learner.resume: %s", e2.msg);
    }
    QRL_TRY(qrl_ckpt_read(dir, s, err));
    *found = true;
    return QRL_OK;
}

qrl_status ld_ckpt_restore_trainer(ld_trainer *t, const char *dir, const qrl_ckpt_state *s, qrl_error *err) {
    QRL_TRY(qrl_ckpt_load_params(dir, t->m, err));
    QRL_TRY(qrl_ckpt_load_optimizer(dir, qrl_learner_optimizer(t->l), err));
    qrl_learner_set_updates(t->l, s->learner_updates);
    return qrl_learner_sync_device(t->l, err); /* a GPU engine takes both */
}

/* ---- loop side (the ld_daemon of loop.c, daemon.h) ----------------------------------- */

void ld_ckpt_safe_set(ld_daemon *d, int32_t p, int64_t upto) {
    if (p >= d->n_safe) {
        int64_t *ns = realloc(d->safe, (size_t)(p + 1) * sizeof *ns);
        QRL_CHECK(ns != NULL);
        for (int i = d->n_safe; i <= p; i++) ns[i] = -1;
        d->safe = ns;
        d->n_safe = p + 1;
    }
    if (upto > d->safe[p]) d->safe[p] = upto;
}

/* Copy the loop's side of a checkpoint (between updates: nothing is TRAINING) and hand it
 * to the trainer, which adds the tensors and writes the folder (checkpoint.c).  Updates
 * wait (ckpt_busy) until it is written; dispatch and intake go on. */
void ld_ckpt_start(ld_daemon *d) {
    if (d->ckpt_busy || !d->ckpt_root) return;
    ld_job *j = calloc(1, sizeof *j);
    ld_ckpt_job *c = calloc(1, sizeof *c);
    QRL_CHECK(j && c);
    qrl_ckpt_state *s = &c->state;
    s->step = d->step;
    s->version = d->version;
    s->run_id = d->run_id;
    s->seed = d->seed;
    s->uaq_scale = d->model->uaq_scale; /* set once at start: read-only afterwards */
    s->model = strdup(d->abs_model);
    s->tokenizer = strdup(d->abs_tok);
    s->dataset = strdup(d->abs_ds);
    s->results_topic = strdup(d->results_topic);
    s->dataset_prompts = d->ds->n;
    s->epoch = d->epoch;
    s->index = d->cursor;
    s->next_group_id = d->next_id;
    s->unix_ms = ckpt_unix_ms();
    size_t n = 0;
    for (uint64_t id = 1; id < d->next_id; id++) n += d->state[id] == GS_DISPATCHED || d->state[id] == GS_BUFFERED;
    s->pending = calloc(n ? n : 1, sizeof *s->pending);
    s->offsets = calloc(d->n_safe ? (size_t)d->n_safe : 1, sizeof *s->offsets);
    QRL_CHECK(s->model && s->tokenizer && s->dataset && s->results_topic && s->pending && s->offsets);
    uint64_t N = d->ds->n;
    for (uint64_t id = 1; id < d->next_id; id++) {
        QRL_CHECK(d->state[id] != GS_TRAINING);
        if (d->state[id] != GS_DISPATCHED && d->state[id] != GS_BUFFERED) continue;
        /* ids follow the dataset walk one to one: id k is position k-1 of the walk */
        s->pending[s->n_pending++] = (qrl_ckpt_group){.id = id, .epoch = (uint32_t)((id - 1) / N),
                                                      .index = (id - 1) % N,
                                                      .dispatch_version = d->ginfo[id].dispatch_version,
                                                      .delivered = d->ginfo[id].delivered};
    }
    for (int p = 0; p < d->n_safe; p++)
        if (d->safe[p] >= 0) s->offsets[s->n_offsets++] = (qrl_ckpt_offset){p, d->safe[p]};
    s->tag = strdup(d->n_ckpt_calls ? d->ckpt_tag : "");
    s->settings = ld_ckpt_settings_json(d->cfg); /* the loop thread owns cfg (qrlctl set) */
    QRL_CHECK(s->tag && s->settings);
    c->root = d->ckpt_root;
    c->keep = d->ckpt_keep;
    j->ckpt = c;
    d->ckpt_busy = true;
    ld_trainer_submit(&d->trainer, j);
}

static void ckpt_reply(ld_daemon *d, qrl_status st, const char *msg) {
    for (int i = 0; i < d->n_ckpt_calls; i++) {
        if (st != QRL_OK) {
            qrl_rpc_call_finish(d->ckpt_calls[i], st, "checkpoint failed: %s", msg);
            continue;
        }
        Qrl__CheckpointResponse r = QRL__CHECKPOINT_RESPONSE__INIT;
        r.path = d->ckpt_dir;
        r.step = d->ckpt_step;
        r.version = d->version;
        qrl_rpc_call_reply(d->ckpt_calls[i], &r.base);
    }
    d->n_ckpt_calls = 0;
}

void ld_ckpt_done(ld_daemon *d, ld_job *j) {
    ld_ckpt_job *c = j->ckpt;
    d->ckpt_busy = false;
    if (j->st != QRL_OK) {
        /* a full disk, say: training goes on; the previous checkpoint stays the newest */
        QRL_LOG_ERROR("learner", "checkpoint step=%" PRIu64 " failed: %s", c->state.step, j->error);
        ckpt_reply(d, j->st, j->error);
    } else {
        d->ckpt_step = c->state.step;
        snprintf(d->ckpt_dir, sizeof d->ckpt_dir, "%s", c->dir);
        QRL_LOG_INFO("learner", "checkpoint step=%" PRIu64 " version=%" PRIu64 " dir=%s bytes=%zu seconds=%.3f "
                     "pending=%zu", c->state.step, c->state.version, c->dir, c->bytes, c->seconds,
                     c->state.n_pending);
        /* the group's committed position is what the newest checkpoint has consumed */
        for (size_t i = 0; i < c->state.n_offsets; i++) {
            qrl_error err;
            if (qrl_kafka_consumer_commit_offset_async(d->consumer, d->results_topic, c->state.offsets[i].partition,
                                                       c->state.offsets[i].next_offset, &err) != QRL_OK)
                QRL_LOG_WARN("learner", "commit failed (the records will be read again): %s", err.msg);
        }
        ckpt_reply(d, QRL_OK, NULL);
    }
    qrl_ckpt_state_free(&c->state);
    free(c);
    j->ckpt = NULL;
    ld_job_free(j);
    if (d->close_after_ckpt) {
        d->close_after_ckpt = false;
        ld_begin_close(d);
        return;
    }
    ld_maybe_train(d);
}

static void on_ckpt_call_close(qrl_rpc_call_t *call, void *user) {
    ld_daemon *d = user;
    for (int i = 0; i < d->n_ckpt_calls; i++)
        if (d->ckpt_calls[i] == call) d->ckpt_calls[i] = d->ckpt_calls[--d->n_ckpt_calls];
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client went away");
}

/* Learner.Checkpoint: a checkpoint at the next safe point (now when no update runs, else
 * right after it), answered with its folder, step and version. */
void ld_ckpt_h_checkpoint(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_daemon *d = user;
    const Qrl__CheckpointRequest *rq = (const Qrl__CheckpointRequest *)req;
    if (!d->ckpt_root)
        return qrl_rpc_call_finish(call, QRL_STATUS_UNSUPPORTED, "checkpoints are off (learner.checkpoint_dir is empty)");
    if (d->closing) return qrl_rpc_call_finish(call, QRL_STATUS_UNSUPPORTED, "the learner is stopping");
    const char *tag = rq->tag ? rq->tag : "";
    if (strlen(tag) >= sizeof d->ckpt_tag)
        return qrl_rpc_call_finish(call, QRL_STATUS_INVALID_ARGUMENT, "CheckpointRequest.tag: longer than %zu bytes",
                                   sizeof d->ckpt_tag - 1);
    if (d->n_ckpt_calls == (int)(sizeof d->ckpt_calls / sizeof d->ckpt_calls[0]))
        return qrl_rpc_call_finish(call, QRL_STATUS_BUSY, "too many Checkpoint calls waiting");
    if (!*tag && d->ckpt_step == d->step && !d->training && !d->ckpt_busy) {
        Qrl__CheckpointResponse r = QRL__CHECKPOINT_RESPONSE__INIT; /* nothing trained since */
        r.path = d->ckpt_dir;
        r.step = d->step;
        r.version = d->version;
        return qrl_rpc_call_reply(call, &r.base);
    }
    if (!d->n_ckpt_calls) snprintf(d->ckpt_tag, sizeof d->ckpt_tag, "%s", tag);
    d->ckpt_calls[d->n_ckpt_calls++] = call;
    qrl_rpc_call_on_close(call, on_ckpt_call_close, d);
    QRL_LOG_INFO("learner", "Checkpoint requested tag='%s'%s", tag,
                 d->training ? ": after the running update" : d->ckpt_busy ? ": one is being written" : "");
    if (!d->training) ld_ckpt_start(d); /* no-op while one is being written: that one answers */
}

/* Restore the loop's state from a checkpoint (after setup: the trainer holds the restored
 * parameters).  Groups pending at the checkpoint are DISPATCHED again (their results are
 * accepted); those whose PromptGroup the broker never acknowledged are produced again. */
qrl_status ld_ckpt_restore(ld_daemon *d, const char *dir, const qrl_ckpt_state *s, qrl_error *err) {
    QRL_TRY(ld_ckpt_restore_trainer(&d->trainer, dir, s, err));
    d->step = s->step;
    d->version = s->version;
    d->epoch = s->epoch;
    d->cursor = s->index;
    d->next_id = s->next_group_id;
    d->ckpt_step = s->step;
    snprintf(d->ckpt_dir, sizeof d->ckpt_dir, "%s", dir);
    qrl_epoch_order(d->ds->n, d->seed, d->epoch, d->perm);
    if (d->next_id > 1) ld_state_set(d, d->next_id - 1, GS_TRAINED);
    for (uint64_t id = 1; id < d->next_id; id++) d->state[id] = GS_TRAINED;
    uint32_t *perm = malloc(d->ds->n * sizeof *perm);
    QRL_CHECK(perm != NULL);
    size_t resent = 0;
    for (size_t i = 0; i < s->n_pending; i++) {
        const qrl_ckpt_group *g = &s->pending[i];
        d->state[g->id] = GS_DISPATCHED;
        d->ginfo[g->id] = (ld_ginfo){.dispatch_version = g->dispatch_version,
                                     .sent_ms = (uint64_t)ckpt_unix_ms(), .delivered = g->delivered};
        d->in_flight++;
        if (g->delivered) continue;
        qrl_epoch_order(d->ds->n, d->seed, g->epoch, perm);
        ld_send_group(d, g->id, g->epoch, g->index, perm[g->index], g->dispatch_version);
        resent++;
    }
    free(perm);
    bool same_topic = strcmp(s->results_topic, d->results_topic) == 0;
    for (size_t i = 0; same_topic && i < s->n_offsets; i++) {
        ld_ckpt_safe_set(d, s->offsets[i].partition, s->offsets[i].next_offset);
        int64_t committed = -1;
        qrl_error e2;
        if (qrl_kafka_consumer_committed(d->consumer, d->results_topic, s->offsets[i].partition, 5000, &committed,
                                         &e2) != QRL_OK)
            QRL_LOG_WARN("learner", "resume: committed offset of partition %d: %s", (int)s->offsets[i].partition,
                         e2.msg);
        else if (committed > s->offsets[i].next_offset)
            QRL_LOG_WARN("learner", "resume: partition %d is committed up to %" PRId64 ", past this checkpoint's %"
                         PRId64 " (an older checkpoint?): results in between are not read again",
                         (int)s->offsets[i].partition, committed, s->offsets[i].next_offset);
    }
    if (d->version > 0) { /* replicas that join (or come back) get the restored version */
        ld_snapshot *snap;
        QRL_TRY(ld_snapshot_build(d->model, d->version, (size_t)qrl_config_get_int(d->cfg, "weights.bucket_bytes"),
                                  &snap, err));
        ld_wserver_publish(&d->ws, snap);
    }
    QRL_LOG_INFO("learner", "resumed from %s: step=%" PRIu64 " version=%" PRIu64 " run_id=%" PRIu64 " epoch=%u "
                 "index=%zu next_group=%" PRIu64 " pending=%zu (produced again: %zu) uaq_scale=%g", dir, d->step,
                 d->version, d->run_id, d->epoch, d->cursor, d->next_id, s->n_pending, resent,
                 (double)d->model->uaq_scale);
    return QRL_OK;
}

char *ld_ckpt_settings_json(const qrl_config_t *cfg) {
    json_t *o = json_object();
    char *text = NULL;
    for (size_t i = 0; o && i < qrl_config_count(cfg); i++) {
        const char *k = qrl_config_key_at(cfg, i);
        char v[8192];
        if (qrl_config_value_text(cfg, k, v, sizeof v)) json_object_set_new(o, k, json_string(v));
    }
    if (o) text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

qrl_status ld_ckpt_restore_settings(qrl_config_t *cfg, qrl_error *err) {
    const char *resume = qrl_config_get_string(cfg, "learner.resume");
    const char *root = qrl_config_get_string(cfg, "learner.checkpoint_dir");
    if (!*resume || strcmp(resume, "none") == 0) return QRL_OK;
    bool is_auto = strcmp(resume, "auto") == 0;
    struct stat sb;
    if (is_auto && (!*root || stat(root, &sb) != 0)) return QRL_OK; /* nothing to resume (yet) */
    char dir[QRL_CKPT_PATH_MAX];
    qrl_error e2;
    if (qrl_ckpt_find(is_auto ? root : resume, dir, &e2) != QRL_OK) return QRL_OK; /* reported later */
    char *text = NULL;
    if (qrl_ckpt_read_settings(dir, &text, &e2) != QRL_OK) return QRL_OK;   /* reported later */
    if (!text) {
        QRL_LOG_WARN("learner", "resume: %s records no settings (an older checkpoint): the command line and "
                     "the defaults apply", dir);
        return QRL_OK;
    }
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    const char *k;
    json_t *v;
    int restored = 0, kept = 0;
    qrl_status st = QRL_OK;
    json_object_foreach(o, k, v) {
        if (strcmp(k, "learner.resume") == 0) continue;
        const char *origin = NULL;
        for (size_t i = 0; i < qrl_config_count(cfg) && !origin; i++)
            if (strcmp(qrl_config_key_at(cfg, i), k) == 0) origin = qrl_config_origin(cfg, k);
        if (!origin) {
            QRL_LOG_WARN("learner", "resume: %s/manifest.json: setting %s is not a key of this build: ignored", dir, k);
            continue;
        }
        char now[8192];
        qrl_config_value_text(cfg, k, now, sizeof now);
        if (strcmp(origin, "default") != 0) { /* given for this start: it wins */
            if (strcmp(now, json_string_value(v)) != 0) {
                QRL_LOG_INFO("learner", "resume: %s=%s (origin %s) instead of the run's %s", k, now, origin,
                             json_string_value(v));
                kept++;
            }
            continue;
        }
        if (strcmp(now, json_string_value(v)) == 0) continue;
        if (qrl_config_apply(cfg, k, json_string_value(v), "checkpoint", &e2) != QRL_OK) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "resume: %s/manifest.json: setting %s: %s "
                               "(give --%s for this start)", dir, k, e2.msg, k);
            break;
        }
        restored++;
    }
    json_decref(o);
    if (st == QRL_OK)
        QRL_LOG_INFO("learner", "resume: the run's settings from %s/manifest.json: %d restored (origin=checkpoint), "
                     "%d given anew", dir, restored, kept);
    return st;
}

static char *abs_path(const char *p) {
    char *r = *p ? realpath(p, NULL) : NULL;
    r = r ? r : strdup(p);
    QRL_CHECK(r != NULL);
    return r;
}

/* Checkpoint keys, and the checkpoint to resume from (learner.resume): its run id, seed
 * and UAQ scale replace the configured ones (the parameters are stored scaled). */
qrl_status ld_ckpt_configure(ld_daemon *d, const qrl_tokenizer *tok, qrl_learner_config *lc, bool *resumed,
                                 char *rdir, qrl_ckpt_state *rs, qrl_error *err) {
    (void)tok;
    const char *root = qrl_config_get_string(d->cfg, "learner.checkpoint_dir");
    d->ckpt_root = *root ? root : NULL;
    d->ckpt_every = (uint64_t)qrl_config_get_int(d->cfg, "learner.checkpoint_every");
    d->ckpt_keep = (int)qrl_config_get_int(d->cfg, "learner.checkpoint_keep");
    d->ckpt_step = UINT64_MAX;
    const char *mp = qrl_config_get_string(d->cfg, "learner.model");
    char tbuf[QRL_CKPT_PATH_MAX];
    const char *tp = qrl_config_get_string(d->cfg, "learner.tokenizer");
    if (!*tp) tp = qrl_tokenizer_find_default(mp, d->model->cfg.vocab_size, tbuf, sizeof tbuf);
    d->abs_model = abs_path(mp);
    d->abs_tok = abs_path(tp ? tp : "");
    d->abs_ds = abs_path(d->dataset_path);
    QRL_TRY(ld_ckpt_resolve(qrl_config_get_string(d->cfg, "learner.resume"), root, resumed, rdir, rs, err));
    if (!*resumed) return QRL_OK;
    if (rs->dataset_prompts != d->ds->n) {
        qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s/manifest.json: field \"dataset.prompts\": %" PRIu64
                      ", but %s has %zu prompts (another dataset?)", rdir, rs->dataset_prompts, d->dataset_path,
                      d->ds->n);
        qrl_ckpt_state_free(rs);
        return err->status;
    }
    if (rs->seed != d->seed)
        QRL_LOG_WARN("learner", "resume: learner.seed=%" PRIu64 " differs from the checkpoint's %" PRIu64
                     ": using the checkpoint's", d->seed, rs->seed);
    if (rs->uaq_scale != lc->uaq_scale)
        QRL_LOG_WARN("learner", "resume: uaq.scale=%g differs from the checkpoint's %g: using the checkpoint's",
                     (double)lc->uaq_scale, (double)rs->uaq_scale);
    if (strcmp(rs->results_topic, d->results_topic) != 0)
        QRL_LOG_WARN("learner", "resume: the checkpoint consumed topic %s, this run reads %s: its offsets do "
                     "not apply", rs->results_topic, d->results_topic);
    if (strcmp(rs->dataset, d->abs_ds) != 0)
        QRL_LOG_WARN("learner", "resume: dataset %s, the checkpoint was taken on %s", d->abs_ds, rs->dataset);
    d->seed = lc->seed = rs->seed;
    lc->uaq_scale = rs->uaq_scale;
    d->run_id = rs->run_id;
    return QRL_OK;
}
