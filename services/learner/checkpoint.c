/* qrl-learner checkpoints, the loop's side (checkpoint.h): the checkpoint keys, resolving
 * and restoring one at start, copying the loop's state into a job, finishing it, and the
 * Learner.Checkpoint calls.  The trainer's side (tensors, AdamW state) is in trainer.c;
 * the format is common/learner/checkpoint.h. */
#include "checkpoint.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "dispatch.h"
#include "intake.h"

static struct {
    const char *root;    /* learner.checkpoint_dir; NULL = off */
    uint64_t every;
    uint64_t step;       /* step of the newest checkpoint, UINT64_MAX none */
    int keep;
    bool busy;
    char dir[QRL_CKPT_PATH_MAX];
    qrl_rpc_call_t *calls[16]; /* Checkpoint RPCs waiting for the next one */
    int n_calls;
    char tag[72];              /* the first waiting call's tag */
    char *abs_model, *abs_tok, *abs_ds; /* recorded in manifests (export reads the model) */
} K;

bool ld_ckpt_on(void) { return K.root != NULL; }
bool ld_ckpt_busy(void) { return K.busy; }
bool ld_ckpt_current(const ld_core *c) { return K.step == c->step; }

bool ld_ckpt_due(const ld_core *c) {
    return K.root && (c->step % K.every == 0 || K.n_calls || c->stopping ||
                      (c->max_updates && c->step >= c->max_updates));
}

bool ld_ckpt_last(uint64_t *step, const char **dir) {
    if (!K.root || K.step == UINT64_MAX) return false;
    *step = K.step;
    *dir = K.dir;
    return true;
}

void ld_ckpt_free(void) {
    free(K.abs_model), free(K.abs_tok), free(K.abs_ds);
    K.abs_model = K.abs_tok = K.abs_ds = NULL;
}

/* Resolve learner.resume ("none" | "auto" | a path) against learner.checkpoint_dir:
 * *found false for "none", or "auto" without any checkpoint yet; else dir (a complete
 * checkpoint folder) and *s (qrl_ckpt_read: validated). */
static qrl_status ckpt_resolve(const char *resume, const char *root, bool *found, char *dir, qrl_ckpt_state *s,
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

/* Copy the loop's side of a checkpoint (between updates: nothing is TRAINING) and hand it
 * to the trainer, which adds the tensors and writes the folder. */
void ld_ckpt_start(ld_core *d) {
    if (K.busy || !K.root) return;
    ld_job *j = calloc(1, sizeof *j);
    ld_ckpt_job *c = calloc(1, sizeof *c);
    QRL_CHECK(j && c);
    qrl_ckpt_state *s = &c->state;
    s->step = d->step;
    s->version = d->version;
    s->run_id = d->run_id;
    s->seed = d->seed;
    s->uaq_scale = d->model->uaq_scale; /* set once at start: read-only afterwards */
    s->model = strdup(K.abs_model);
    s->tokenizer = strdup(K.abs_tok);
    s->dataset = strdup(K.abs_ds);
    s->results_topic = strdup(d->results_topic);
    s->unix_ms = ld_unix_ms();
    ld_dispatch_save(d, s);
    ld_intake_save(s);
    QRL_CHECK(s->model && s->tokenizer && s->dataset && s->results_topic);
    s->tag = strdup(K.n_calls ? K.tag : "");
    s->settings = ld_ckpt_settings_json(d->cfg); /* the loop thread owns cfg (qrlctl set) */
    QRL_CHECK(s->tag && s->settings);
    c->root = K.root;
    c->keep = K.keep;
    j->ckpt = c;
    K.busy = true;
    ld_trainer_submit(&d->trainer, j);
}

static void ckpt_reply(const ld_core *d, qrl_status st, const char *msg) {
    for (int i = 0; i < K.n_calls; i++) {
        if (st != QRL_OK) {
            qrl_rpc_call_finish(K.calls[i], st, "checkpoint failed: %s", msg);
            continue;
        }
        Qrl__CheckpointResponse r = QRL__CHECKPOINT_RESPONSE__INIT;
        r.path = K.dir;
        r.step = K.step;
        r.version = d->version;
        qrl_rpc_call_reply(K.calls[i], &r.base);
    }
    K.n_calls = 0;
}

void ld_ckpt_done(ld_core *d, ld_job *j) {
    ld_ckpt_job *c = j->ckpt;
    K.busy = false;
    if (j->st != QRL_OK) {
        /* a full disk, say: training goes on; the previous checkpoint stays the newest */
        QRL_LOG_ERROR("learner", "checkpoint step=%" PRIu64 " failed: %s", c->state.step, j->error);
        ckpt_reply(d, j->st, j->error);
    } else {
        K.step = c->state.step;
        snprintf(K.dir, sizeof K.dir, "%s", c->dir);
        QRL_LOG_INFO("learner", "checkpoint step=%" PRIu64 " version=%" PRIu64 " dir=%s bytes=%zu seconds=%.3f "
                     "pending=%zu", c->state.step, c->state.version, c->dir, c->bytes, c->seconds,
                     c->state.n_pending);
        ld_intake_commit_saved(d, &c->state);
        ckpt_reply(d, QRL_OK, NULL);
    }
    qrl_ckpt_state_free(&c->state);
    free(c);
    j->ckpt = NULL;
    ld_job_free(j);
}

static void on_ckpt_call_close(qrl_rpc_call_t *call, void *user) {
    for (int i = 0; i < K.n_calls; i++)
        if (K.calls[i] == call) K.calls[i] = K.calls[--K.n_calls];
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client went away");
}

/* Learner.Checkpoint: a checkpoint at the next safe point (now when no update runs, else
 * right after it), answered with its folder, step and version. */
void ld_ckpt_h_checkpoint(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    ld_core *d = user;
    const Qrl__CheckpointRequest *rq = (const Qrl__CheckpointRequest *)req;
    if (!K.root)
        return qrl_rpc_call_finish(call, QRL_STATUS_UNSUPPORTED, "checkpoints are off (learner.checkpoint_dir is empty)");
    if (d->closing) return qrl_rpc_call_finish(call, QRL_STATUS_UNSUPPORTED, "the learner is stopping");
    const char *tag = rq->tag ? rq->tag : "";
    if (strlen(tag) >= sizeof K.tag)
        return qrl_rpc_call_finish(call, QRL_STATUS_INVALID_ARGUMENT, "CheckpointRequest.tag: longer than %zu bytes",
                                   sizeof K.tag - 1);
    if (K.n_calls == (int)(sizeof K.calls / sizeof K.calls[0]))
        return qrl_rpc_call_finish(call, QRL_STATUS_BUSY, "too many Checkpoint calls waiting");
    if (!*tag && K.step == d->step && !d->training && !K.busy) {
        Qrl__CheckpointResponse r = QRL__CHECKPOINT_RESPONSE__INIT; /* nothing trained since */
        r.path = K.dir;
        r.step = d->step;
        r.version = d->version;
        return qrl_rpc_call_reply(call, &r.base);
    }
    if (!K.n_calls) snprintf(K.tag, sizeof K.tag, "%s", tag);
    K.calls[K.n_calls++] = call;
    qrl_rpc_call_on_close(call, on_ckpt_call_close, d);
    QRL_LOG_INFO("learner", "Checkpoint requested tag='%s'%s", tag,
                 d->training ? ": after the running update" : K.busy ? ": one is being written" : "");
    if (!d->training) ld_ckpt_start(d); /* no-op while one is being written: that one answers */
}

qrl_status ld_ckpt_restore(ld_core *d, const char *dir, const qrl_ckpt_state *s, qrl_error *err) {
    QRL_TRY(ld_trainer_restore(&d->trainer, dir, s, err));
    d->step = s->step;
    d->version = s->version;
    K.step = s->step;
    snprintf(K.dir, sizeof K.dir, "%s", dir);
    size_t resent = ld_dispatch_restore(d, s);
    ld_intake_restore(d, s);
    if (d->version > 0) { /* replicas that join (or come back) get the restored version */
        ld_snapshot *snap;
        QRL_TRY(ld_snapshot_build(d->model, d->version, (size_t)d->s->weights.bucket_bytes,
                                  &snap, err));
        ld_wserver_publish(&d->ws, snap);
    }
    ld_dispatch_counts dc = ld_dispatch_counts_now();
    QRL_LOG_INFO("learner", "resumed from %s: step=%" PRIu64 " version=%" PRIu64 " run_id=%" PRIu64 " epoch=%u "
                 "index=%zu next_group=%" PRIu64 " pending=%zu (produced again: %zu) uaq_scale=%g", dir, d->step,
                 d->version, d->run_id, dc.epoch, dc.cursor, dc.next_id, s->n_pending, resent,
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
    /* before the program binds its settings: a struct of our own for the two keys read */
    ld_settings ts;
    qrl_config_bind(cfg, &ts);
    const char *resume = ts.learner.resume;
    const char *root = ts.learner.checkpoint_dir;
    qrl_config_bind(cfg, NULL); /* both are read below before anything changes them */
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
qrl_status ld_ckpt_configure(ld_core *d, qrl_learner_config *lc, bool *resumed, char *rdir,
                             qrl_ckpt_state *rs, qrl_error *err) {
    const char *root = d->s->learner.checkpoint_dir;
    K.root = *root ? root : NULL;
    K.every = (uint64_t)d->s->learner.checkpoint_every;
    K.keep = d->s->learner.checkpoint_keep;
    K.step = UINT64_MAX;
    const char *mp = d->s->learner.model;
    char tbuf[QRL_CKPT_PATH_MAX];
    const char *tp = d->s->learner.tokenizer;
    if (!*tp) tp = qrl_tokenizer_find_default(mp, d->model->cfg.vocab_size, tbuf, sizeof tbuf);
    K.abs_model = abs_path(mp);
    K.abs_tok = abs_path(tp ? tp : "");
    K.abs_ds = abs_path(d->dataset_path);
    QRL_TRY(ckpt_resolve(d->s->learner.resume, root, resumed, rdir, rs, err));
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
    if (strcmp(rs->dataset, K.abs_ds) != 0)
        QRL_LOG_WARN("learner", "resume: dataset %s, the checkpoint was taken on %s", K.abs_ds, rs->dataset);
    d->seed = lc->seed = rs->seed;
    lc->uaq_scale = rs->uaq_scale;
    d->run_id = rs->run_id;
    return QRL_OK;
}
