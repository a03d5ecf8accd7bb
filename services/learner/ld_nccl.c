/* qrl-learner NCCL weight broadcast (ld_nccl.h; docs/weight-sync.md).
 *
 * Loop thread: remembers each replica's advertised capability, plans every version's
 * transport from the replicas watching versions (common/weights/sync_group.h; a new epoch
 * gets a fresh ncclUniqueId, made here so it goes out in the same events), fills the
 * events, and queues the broadcast.  Broadcast thread: joins the epoch's communicator as
 * rank 0 when the epoch changes (the old one is destroyed), sends each queued version in
 * order (replicas receive in announcement order), every wait bounded by
 * weights.nccl_timeout_ms.  A failure marks the epoch failed; the loop learns it on its
 * tick (ld_nccl_take_failed), re-announces the version over TCP and the next NCCL plan
 * starts a new epoch. */
#include "ld_nccl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "weights/nccl_bcast.h"
#include "weights/wipc.h"

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void job_fail(ld_nccl *n, uint64_t version) {
    pthread_mutex_lock(&n->mu);
    n->failed = true;
    n->failed_version = version;
    pthread_mutex_unlock(&n->mu);
}

static void run_job(ld_nccl *n, ld_nccl_job *j) {
    qrl_error err;
    qrl_nccl_comm_t *c = n->comm;
    double t0 = mono_s();
    if (j->epoch == n->dead_epoch) { /* its unique id is spent: wait for the next epoch, over TCP */
        QRL_LOG_WARN("weights", "nccl epoch=%" PRIu64 " failed earlier: version %" PRIu64 " goes over TCP",
                     j->epoch, j->version);
        job_fail(n, j->version);
        return;
    }
    if (!c || n->comm_epoch != j->epoch || !qrl_nccl_comm_ok(c)) {
        qrl_nccl_comm_destroy(c);
        n->comm = c = NULL;
        n->comm_epoch = j->epoch;
        if (qrl_nccl_comm_init(j->uid, j->epoch, 0, j->world, n->device, n->timeout_ms, &c, &err) != QRL_OK) {
            QRL_LOG_ERROR("weights", "nccl epoch=%" PRIu64 " world=%d: %s (version %" PRIu64 " goes over TCP)",
                          j->epoch, j->world, err.msg, j->version);
            n->dead_epoch = j->epoch;
            job_fail(n, j->version);
            return;
        }
        n->comm = c;
    }
    const ld_snapshot *s = j->snap;
    uint64_t dtotal = 0;
    int ddev = -1;
    const uint8_t *dstream = s->ipc ? qrl_wipc_slot_acquire(s->ipc, s->version, &dtotal, &ddev) : NULL;
    if (dstream && ddev == n->device && dtotal == s->total && s->bucket_crc) {
        /* a device version on rank 0's GPU: broadcast straight from its slot, no host copy */
        double t1 = mono_s();
        qrl_status st = qrl_nccl_bcast_send_device(c, s->manifest, s->manifest_len, dstream, s->total, s->bucket_crc,
                                                   n->timeout_ms, &err);
        qrl_wipc_slot_release(s->ipc, s->version);
        if (st != QRL_OK) {
            QRL_LOG_ERROR("weights", "nccl broadcast of version %" PRIu64 " (epoch %" PRIu64 ", device): %s (it goes "
                          "over TCP)", j->version, j->epoch, err.msg);
            n->dead_epoch = j->epoch;
            job_fail(n, j->version);
            return;
        }
        double t2 = mono_s();
        QRL_LOG_INFO("weights", "nccl broadcast version=%" PRIu64 " epoch=%" PRIu64 " world=%d bytes=%zu join_s=%.3f "
                     "send_s=%.3f GBps=%.2f from=device", j->version, j->epoch, j->world, s->total, t1 - t0, t2 - t1,
                     (double)s->total / (t2 - t1 > 0 ? t2 - t1 : 1e-9) / 1e9);
        return;
    }
    if (dstream) qrl_wipc_slot_release(s->ipc, s->version);
    if (ld_snapshot_fill(j->snap, &err) != QRL_OK) { /* a device version: its host copy */
        QRL_LOG_ERROR("weights", "nccl version %" PRIu64 ": %s (it goes over TCP)", j->version, err.msg);
        job_fail(n, j->version);
        return;
    }
    uint32_t nb = qrl_wsync_bucket_count(s->total, s->bucket_bytes);
    uint32_t *crc = malloc(((size_t)nb + 1) * sizeof *crc);
    if (!crc) {
        job_fail(n, j->version);
        return;
    }
    qrl_wsync_bucket_crcs(s->stream, s->total, s->bucket_bytes, crc);
    double t1 = mono_s();
    qrl_status st = qrl_nccl_bcast_send(c, s->manifest, s->manifest_len, s->stream, s->total, crc, n->timeout_ms, &err);
    free(crc);
    if (st != QRL_OK) {
        QRL_LOG_ERROR("weights", "nccl broadcast of version %" PRIu64 " (epoch %" PRIu64 "): %s (it goes over TCP)",
                      j->version, j->epoch, err.msg);
        n->dead_epoch = j->epoch;
        job_fail(n, j->version);
        return;
    }
    double t2 = mono_s();
    QRL_LOG_INFO("weights", "nccl broadcast version=%" PRIu64 " epoch=%" PRIu64 " world=%d bytes=%zu join_s=%.3f "
                 "send_s=%.3f GBps=%.2f", j->version, j->epoch, j->world, s->total, t1 - t0, t2 - t1,
                 (double)s->total / (t2 - t1 > 0 ? t2 - t1 : 1e-9) / 1e9);
}

static void *bcast_main(void *arg) {
    ld_nccl *n = arg;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->head && !n->stop) pthread_cond_wait(&n->cv, &n->mu);
        ld_nccl_job *j = n->head;
        if (j) {
            n->head = j->next;
            if (!n->head) n->tail = NULL;
        }
        bool stop = n->stop;
        pthread_mutex_unlock(&n->mu);
        if (!j) break;
        if (!stop) run_job(n, j);
        ld_snapshot_unref(n->ws, j->snap);
        free(j);
    }
    qrl_nccl_comm_destroy(n->comm);
    n->comm = NULL;
    return NULL;
}

qrl_status ld_nccl_start(ld_nccl *n, const char *transport, int device, int timeout_ms, ld_wserver *ws,
                         qrl_error *err) {
    memset(n, 0, sizeof *n);
    QRL_TRY(qrl_wsync_mode_parse(transport, &n->g.mode, err));
    n->g.learner_nccl = qrl_nccl_available();
    n->device = device;
    n->timeout_ms = timeout_ms;
    n->ws = ws;
    if (n->g.mode == QRL_WSYNC_MODE_NCCL && !n->g.learner_nccl)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "weights.transport=nccl: this learner has no CUDA "
                             "device or was built without NCCL (use tcp or auto)");
    if (n->g.mode == QRL_WSYNC_MODE_TCP) return QRL_OK;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (pthread_create(&n->thread, NULL, bcast_main, n) != 0)
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "weights: cannot create the nccl thread");
    n->started = true;
    QRL_LOG_INFO("weights", "weight transport=%s learner_nccl=%d device=%d",
                 transport, n->g.learner_nccl, n->device);
    return QRL_OK;
}

void ld_nccl_note(ld_nccl *n, const char *id, bool nccl) {
    for (size_t i = 0; i < n->n_caps; i++)
        if (!strcmp(n->caps[i].id, id)) {
            n->caps[i].nccl = nccl;
            return;
        }
    void *p = realloc(n->caps, (n->n_caps + 1) * sizeof *n->caps);
    if (!p) return; /* unknown replicas count as TCP-only */
    n->caps = p;
    snprintf(n->caps[n->n_caps].id, sizeof n->caps[0].id, "%s", id);
    n->caps[n->n_caps++].nccl = nccl;
}

bool ld_nccl_plan(ld_nccl *n, const char *const *ids, size_t n_ids, uint64_t version) {
    n->announcing = false;
    if (!n->started) return false;
    qrl_sync_member *m = calloc(n_ids ? n_ids : 1, sizeof *m);
    if (!m) return false;
    for (size_t i = 0; i < n_ids; i++) {
        m[i].id = ids[i];
        for (size_t k = 0; k < n->n_caps; k++)
            if (!strcmp(n->caps[k].id, ids[i])) m[i].nccl = n->caps[k].nccl;
    }
    pthread_mutex_lock(&n->mu);
    if (n->failed) n->g.failed = true; /* a failure the loop has not taken yet */
    pthread_mutex_unlock(&n->mu);
    bool nccl = false, fresh = false;
    qrl_error err;
    if (qrl_sync_group_plan(&n->g, m, n_ids, &nccl, &fresh, &err) != QRL_OK) {
        QRL_LOG_WARN("weights", "sync group: %s (version %" PRIu64 " goes over TCP)", err.msg, version);
        nccl = false;
    } else if (fresh && qrl_nccl_unique_id(n->g.uid, &err) != QRL_OK) {
        QRL_LOG_ERROR("weights", "nccl epoch %" PRIu64 ": %s (version %" PRIu64 " goes over TCP)", n->g.epoch,
                      err.msg, version);
        n->g.failed = true;
        nccl = false;
    } else if (fresh) {
        QRL_LOG_INFO("weights", "nccl epoch=%" PRIu64 " members=%zu (from version %" PRIu64 ")", n->g.epoch, n_ids,
                     version);
    }
    free(m);
    n->g.use_nccl = nccl;
    n->announcing = nccl;
    return nccl;
}

void ld_nccl_fill_event(ld_nccl *n, const char *id, Qrl__VersionEvent *ev) {
    if (n->announcing) qrl_sync_group_fill_event(&n->g, id, ev);
    else ev->transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP;
}

void ld_nccl_send(ld_nccl *n, uint64_t version) {
    if (!n->announcing) return;
    n->announcing = false;
    ld_snapshot *s = ld_wserver_current(n->ws);
    ld_nccl_job *j = s && s->version == version ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        if (s) ld_snapshot_unref(n->ws, s);
        job_fail(n, version);
        return;
    }
    *j = (ld_nccl_job){.version = version, .epoch = n->g.epoch, .world = (int)n->g.n + 1, .snap = s};
    memcpy(j->uid, n->g.uid, sizeof j->uid);
    pthread_mutex_lock(&n->mu);
    if (n->tail) n->tail->next = j;
    else n->head = j;
    n->tail = j;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

bool ld_nccl_take_failed(ld_nccl *n, uint64_t *version) {
    if (!n->started) return false;
    pthread_mutex_lock(&n->mu);
    bool f = n->failed;
    *version = n->failed_version;
    n->failed = false;
    pthread_mutex_unlock(&n->mu);
    if (f) n->g.failed = true;
    return f;
}

void ld_nccl_stop(ld_nccl *n) {
    if (n->started) {
        pthread_mutex_lock(&n->mu);
        n->stop = true;
        pthread_cond_signal(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->thread, NULL);
        n->started = false;
    }
    qrl_sync_group_free(&n->g);
    free(n->caps);
    n->caps = NULL;
    n->n_caps = 0;
}
