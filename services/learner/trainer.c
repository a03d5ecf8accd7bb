/* qrl-learner trainer thread: owns the parameters; one qrl_learner_update per job, then
 * the BF16 snapshot of the new version for the weight server (STYLE 14: compute never
 * runs on the loop). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "learner/batch.h"
#include "learner.h"
#include "trace.h"
#include "weights/wipc.h"
#include "wire/wire.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ld_job_free(ld_job *j) {
    if (!j) return;
    for (size_t i = 0; i < j->n; i++) qrl_wire_free(j->results[i] ? &j->results[i]->base : NULL);
    for (size_t i = 0; j->traces && i < j->n; i++) ld_trace_set_free(&j->traces[i]);
    free(j->traces);
    free(j->results);
    free(j);
}

/* The new version straight from the device parameters into a CUDA IPC slot (weights/wipc.h):
 * BF16 cast and checksums on the GPU, no host copy; the TCP server copies the slot to the
 * host only if a replica asks for it over TCP (ld_snapshot_fill). */
static qrl_status publish_device(ld_trainer *t, ld_job *j, ld_snapshot **out, qrl_error *err) {
    int dev;
    const float *params = qrl_learner_device_params(t->l, &dev);
    const qrl_model *m = t->m;
    size_t n = (size_t)m->n_tensors;
    qrl_wsync_tensor *ts = NULL;
    const float **src = NULL;
    qrl_status st = params ? qrl_wipc_model_table(m, params, &ts, &src, err)
                           : qrl_error_set(err, QRL_STATUS_INTERNAL, "weight publish: the training engine is not on a GPU");
    qrl_wipc_published pub;
    if (st == QRL_OK) st = qrl_wipc_publish(t->ipc, ts, src, n, j->version, t->bucket_bytes, &pub, err);
    if (st == QRL_OK) {
        st = ld_snapshot_device(t->ipc, j->version, t->bucket_bytes, pub.manifest, pub.manifest_len, pub.total,
                                out, err);
        if (st == QRL_OK) (*out)->bucket_crc = pub.bucket_crc;
        else free(pub.bucket_crc);
        if (st == QRL_OK) {
            j->ipc = true;
            memcpy(j->ipc_handle, pub.handle, sizeof j->ipc_handle);
            QRL_LOG_INFO("weights", "version=%llu on the device bytes=%llu cast_ms=%.1f crc_ms=%.1f",
                         (unsigned long long)j->version, (unsigned long long)pub.total, pub.cast_s * 1e3,
                         pub.crc_s * 1e3);
        }
    }
    free(ts);
    free(src);
    return st;
}

/* ---- checkpoints (the format: common/learner/checkpoint.h) --------------------------- */

/* Write checkpoint job j->ckpt (between updates: the parameters are at rest); sets
 * j->st / j->error. */
static void run_checkpoint(ld_trainer *t, ld_job *j) {
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

qrl_status ld_trainer_restore(ld_trainer *t, const char *dir, const qrl_ckpt_state *s, qrl_error *err) {
    QRL_TRY(qrl_ckpt_load_params(dir, t->m, err));
    QRL_TRY(qrl_ckpt_load_optimizer(dir, qrl_learner_optimizer(t->l), err));
    qrl_learner_set_updates(t->l, s->learner_updates);
    return qrl_learner_sync_device(t->l, err); /* a GPU engine takes both */
}

static void run_job(ld_trainer *t, ld_job *j) {
    if (j->ckpt) { /* between updates: the parameters are at rest */
        run_checkpoint(t, j);
        return;
    }
    qrl_learner_batch b = {0};
    qrl_error err;
    double t0 = now_s();
    /* the update input viewing the decoded results (learner/batch.h: ids as int32) */
    j->st = qrl_learner_batch_from_wire((const Qrl__GroupResult *const *)j->results, j->n, &b, &err);
    /* QAT: each response's TRACE records (NULL: unguided), alive until the job is freed */
    for (size_t i = 0; j->st == QRL_OK && j->traces && i < b.n_groups; i++) {
        qrl_learner_response *rs = (qrl_learner_response *)b.groups[i].responses; /* b's own storage */
        for (uint32_t k = 0; k < b.groups[i].n_responses && k < j->traces[i].n; k++) rs[k].trace = j->traces[i].trace[k];
    }
    if (j->st == QRL_OK) j->st = qrl_learner_set_lr(t->l, j->lr, &err);
    if (j->st == QRL_OK) j->st = qrl_learner_update(t->l, b.groups, b.n_groups, &j->stats, &err);
    j->update_s = now_s() - t0;
    qrl_learner_batch_free(&b);
    if (j->st != QRL_OK) {
        snprintf(j->error, sizeof j->error, "%s", err.msg);
        return;
    }
    t0 = now_s();
    ld_snapshot *s;
    j->st = t->ipc ? publish_device(t, j, &s, &err) : ld_snapshot_build(t->m, j->version, t->bucket_bytes, &s, &err);
    j->snapshot_s = now_s() - t0;
    if (j->st != QRL_OK) snprintf(j->error, sizeof j->error, "%s", err.msg);
    else ld_wserver_publish(t->ws, s); /* before the loop announces the version */
}

static void *trainer_main(void *arg) {
    ld_trainer *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->job && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (t->stop) break;
        ld_job *j = t->job;
        t->job = NULL;
        pthread_mutex_unlock(&t->mu);
        run_job(t, j);
        pthread_mutex_lock(&t->mu);
        t->done = j;
        uv_async_send(t->done_async);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

qrl_status ld_trainer_start(ld_trainer *t, qrl_model *m, const qrl_learner_config *lc,
                            ld_wserver *ws, struct qrl_wipc_sender *ipc, size_t bucket_bytes,
                            uv_async_t *done_async, qrl_error *err) {
    QRL_TRY(qrl_learner_new(m, lc, &t->l, err));
    t->m = m;
    t->ws = ws;
    t->ipc = lc->device_weights ? ipc : NULL;
    t->bucket_bytes = bucket_bytes;
    t->done_async = done_async;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (pthread_create(&t->thread, NULL, trainer_main, t) != 0)
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "trainer: cannot create the thread");
    t->started = true;
    return QRL_OK;
}

void ld_trainer_submit(ld_trainer *t, ld_job *j) {
    pthread_mutex_lock(&t->mu);
    QRL_CHECK(t->job == NULL);
    t->job = j;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

ld_job *ld_trainer_take_done(ld_trainer *t) {
    pthread_mutex_lock(&t->mu);
    ld_job *j = t->done;
    t->done = NULL;
    pthread_mutex_unlock(&t->mu);
    return j;
}

/* Waits for a running update to finish (its job is then freed unreported). */
void ld_trainer_join(ld_trainer *t) {
    if (!t->started) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    ld_job_free(t->job);
    ld_job_free(t->done);
    t->job = t->done = NULL;
    qrl_learner_destroy(t->l);
    t->started = false;
}
