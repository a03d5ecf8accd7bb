/* NCCL weight-sync group membership (sync_group.h). */
#include "weights/sync_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_members(const qrl_sync_group *g, const qrl_sync_member *m, size_t n) {
    if (g->n != n) return false;
    for (size_t i = 0; i < n; i++)
        if (qrl_sync_group_rank(g, m[i].id) == 0) return false;
    return true; /* ids are unique (the learner's replica table) */
}

qrl_status qrl_sync_group_plan(qrl_sync_group *g, const qrl_sync_member *m, size_t n, bool *use_nccl,
                               bool *new_epoch, qrl_error *err) {
    *new_epoch = false;
    bool *caps = calloc(n ? n : 1, sizeof *caps);
    if (!caps) return qrl_error_set(err, QRL_STATUS_NOMEM, "sync group of %zu replicas", n);
    for (size_t i = 0; i < n; i++) {
        caps[i] = m[i].nccl;
        if (!m[i].id || !m[i].id[0] || strlen(m[i].id) >= QRL_SYNC_ID_MAX) {
            free(caps);
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sync group: replica %zu id empty or "
                                 "longer than %d bytes", i, QRL_SYNC_ID_MAX - 1);
        }
    }
    bool nccl = qrl_wsync_use_nccl(g->mode, g->learner_nccl, caps, n) && n > 0;
    free(caps);
    if (nccl && (g->epoch == 0 || g->failed || !same_members(g, m, n))) {
        if (n > g->cap) {
            void *p = realloc(g->ids, n * sizeof *g->ids);
            if (!p) return qrl_error_set(err, QRL_STATUS_NOMEM, "sync group of %zu replicas", n);
            g->ids = p;
            g->cap = n;
        }
        for (size_t i = 0; i < n; i++) snprintf(g->ids[i], QRL_SYNC_ID_MAX, "%s", m[i].id);
        g->n = n;
        g->epoch++;
        g->failed = false;
        memset(g->uid, 0, sizeof g->uid);
        *new_epoch = true;
    }
    g->use_nccl = nccl;
    *use_nccl = nccl;
    return QRL_OK;
}

int qrl_sync_group_rank(const qrl_sync_group *g, const char *id) {
    for (size_t i = 0; i < g->n; i++)
        if (!strcmp(g->ids[i], id)) return (int)i + 1;
    return 0;
}

void qrl_sync_group_fill_event(qrl_sync_group *g, const char *id, Qrl__VersionEvent *ev) {
    int rank = g->use_nccl && !g->failed ? qrl_sync_group_rank(g, id) : 0;
    if (!rank) {
        ev->transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP;
        return;
    }
    ev->transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_NCCL;
    ev->sync_epoch = g->epoch;
    ev->nccl_unique_id.data = g->uid;
    ev->nccl_unique_id.len = sizeof g->uid;
    ev->rank = (uint32_t)rank;
    ev->world_size = (uint32_t)g->n + 1;
}

void qrl_sync_group_free(qrl_sync_group *g) {
    free(g->ids);
    g->ids = NULL;
    g->n = g->cap = 0;
}
