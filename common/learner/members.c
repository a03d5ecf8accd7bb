/* The learner's membership table (members.h; SPEC §8; docs/learner-daemon.md "Membership"):
 * who is registered, what each replica last reported, and who went silent.  One thread only.
 *
 * A replica silent past learner.heartbeat_timeout_ms is marked *lost*, not forgotten, so
 * `qrlctl replicas` can show it: it gets no more VersionEvents (its stream is ended), it is
 * not counted in LearnerStatus.replicas, and its heartbeats are answered known=false so a
 * replica that was only slow registers again cleanly. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "learner/members.h"
#include "rpc/rpc.h"

/* Deep copy of a message through its encoding (protobuf-c has no copy). */
static ProtobufCMessage *msg_dup(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    QRL_CHECK(buf != NULL);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *c = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    free(buf);
    QRL_CHECK(c != NULL); /* it was just encoded from a valid message */
    return c;
}

/* Free a copy made by msg_dup and clear the pointer. */
#define MSG_FREE(p)                                                   \
    do {                                                              \
        if (p) protobuf_c_message_free_unpacked(&(p)->base, NULL);    \
        (p) = NULL;                                                   \
    } while (0)

qrl_replica *qrl_members_find(qrl_members *m, const char *id) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->r[i].id, id) == 0) return &m->r[i];
    return NULL;
}

qrl_status qrl_members_register(qrl_members *m, const Qrl__ReplicaInfo *info, uint64_t have_version,
                               uint64_t now_ms, qrl_replica **out, qrl_error *err) {
    const char *id = info && info->id ? info->id : "";
    if (!*id || strlen(id) >= sizeof m->r[0].id)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "RegisterRequest.replica.id: empty or longer than %zu bytes",
                             sizeof m->r[0].id - 1);
    qrl_replica *r = qrl_members_find(m, id);
    if (!r && m->n < QRL_MAX_REPLICAS) r = &m->r[m->n++];
    for (int i = 0; !r && i < m->n; i++) /* full: the oldest lost entry makes room */
        if (m->r[i].lost && (!r || m->r[i].last_seen_ms < r->last_seen_ms)) r = &m->r[i];
    if (!r)
        return qrl_error_set(err, QRL_STATUS_BUSY, "%d replicas registered already", QRL_MAX_REPLICAS);
    if (strcmp(r->id, id) != 0) { /* a new entry (or a reused lost one) */
        QRL_CHECK(r->watch == NULL);
        MSG_FREE(r->info);
        MSG_FREE(r->status);
        memset(r, 0, sizeof *r);
        snprintf(r->id, sizeof r->id, "%s", id);
    }
    MSG_FREE(r->info);
    r->info = (Qrl__ReplicaInfo *)msg_dup(&info->base);
    MSG_FREE(r->status);
    r->version = have_version;
    r->registered_ms = r->last_seen_ms = now_ms;
    r->lost = r->draining = false;
    *out = r;
    return QRL_OK;
}

void qrl_members_heartbeat(qrl_replica *r, const Qrl__RolloutStatus *st, uint64_t now_ms) {
    r->last_seen_ms = now_ms;
    if (!st) return;
    r->version = st->version;
    MSG_FREE(r->status);
    r->status = (Qrl__RolloutStatus *)msg_dup(&st->base);
}

int qrl_members_expire(qrl_members *m, uint64_t now_ms, uint64_t timeout_ms) {
    int marked = 0;
    for (int i = 0; i < m->n; i++) {
        qrl_replica *r = &m->r[i];
        if (r->lost || now_ms - r->last_seen_ms <= timeout_ms) continue;
        r->lost = true;
        marked++;
        if (r->draining)
            QRL_LOG_INFO("learner", "replica %s drained and gone (silent %" PRIu64 " ms)", r->id,
                         now_ms - r->last_seen_ms);
        else
            QRL_LOG_WARN("learner", "replica %s lost: silent for %" PRIu64 " ms (timeout %" PRIu64
                         " ms); no more versions sent to it", r->id, now_ms - r->last_seen_ms, timeout_ms);
        if (r->watch) qrl_rpc_call_finish(r->watch, QRL_STATUS_CANCELLED, "heartbeat timeout");
        r->watch = NULL;
    }
    return marked;
}

int qrl_members_live(const qrl_members *m) {
    int n = 0;
    for (int i = 0; i < m->n; i++) n += !m->r[i].lost;
    return n;
}

void qrl_members_reply_list(qrl_rpc_call_t *call, const qrl_members *m) {
    Qrl__ListReplicasResponse resp = QRL__LIST_REPLICAS_RESPONSE__INIT;
    Qrl__ReplicaEntry *entries = calloc((size_t)m->n + 1, sizeof *entries);
    Qrl__ReplicaEntry **ptrs = calloc((size_t)m->n + 1, sizeof *ptrs);
    Qrl__RolloutStatus *st = calloc((size_t)m->n + 1, sizeof *st);
    QRL_CHECK(entries && ptrs && st);
    for (int i = 0; i < m->n; i++) {
        const qrl_replica *r = &m->r[i];
        qrl__replica_entry__init(&entries[i]);
        entries[i].info = r->info;
        entries[i].registered_unix_ms = r->registered_ms;
        entries[i].last_heartbeat_unix_ms = r->last_seen_ms;
        /* a shallow copy: only the state is ours to change */
        if (r->status) st[i] = *r->status;
        else {
            qrl__rollout_status__init(&st[i]);
            st[i].replica_id = (char *)r->id;
            st[i].version = r->version;
            st[i].state = QRL__SERVICE_STATE__SERVICE_STATE_STARTING;
        }
        if (r->lost)
            st[i].state = r->draining ? QRL__SERVICE_STATE__SERVICE_STATE_STOPPED
                                      : QRL__SERVICE_STATE__SERVICE_STATE_LOST;
        else if (r->draining)
            st[i].state = QRL__SERVICE_STATE__SERVICE_STATE_DRAINING;
        entries[i].status = &st[i];
        ptrs[i] = &entries[i];
    }
    resp.n_replicas = (size_t)m->n;
    resp.replicas = ptrs;
    qrl_rpc_call_reply(call, &resp.base);
    free(st);
    free(ptrs);
    free(entries);
}

void qrl_members_free(qrl_members *m) {
    for (int i = 0; i < m->n; i++) {
        MSG_FREE(m->r[i].info);
        MSG_FREE(m->r[i].status);
    }
    m->n = 0;
}
