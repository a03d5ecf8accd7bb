/* The learner's membership table (SPEC §8; docs/learner-daemon.md "Membership"): the
 * rollout replicas registered with the Learner service, what each last reported, and who
 * went silent.  Plain data owned by one thread (the learner's loop); entries live inside
 * the table, so a qrl_replica pointer stays valid until the table is freed. */
#ifndef QRL_LEARNER_MEMBERS_H
#define QRL_LEARNER_MEMBERS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"

struct qrl_rpc_call;

#define QRL_MAX_REPLICAS 256

/* One replica as the learner knows it. */
typedef struct qrl_replica {
    char id[128];
    uint64_t version;              /* weights version it holds (Register, heartbeats) */
    uint64_t registered_ms, last_seen_ms;
    struct qrl_rpc_call *watch;    /* its WatchVersions stream (borrowed), or NULL */
    Qrl__ReplicaInfo *info;        /* copy of its registration (owned) */
    Qrl__RolloutStatus *status;    /* copy of its last heartbeat's status (owned), or NULL */
    bool lost;                     /* silent past the heartbeat timeout: no more events;
                                      heartbeats get known=false until it registers again */
    bool draining;                 /* told to drain (Learner.Drain) */
} qrl_replica;

/* Zero-initialize (large: keep it off the stack); free with qrl_members_free. */
typedef struct qrl_members {
    qrl_replica r[QRL_MAX_REPLICAS];
    int n;
} qrl_members;

/* The replica called `id` (lost ones included), or NULL. */
qrl_replica *qrl_members_find(qrl_members *m, const char *id);
/* Register `info` (id checked: 1..127 bytes; copied): a new entry, or the same id
 * refreshed (a lost or restarted replica comes back clean: lost/draining cleared, old status
 * dropped).  A full table reuses the oldest lost entry.  *out points into the table.
 * Errors: INVALID_ARGUMENT (id), BUSY (full). */
qrl_status qrl_members_register(qrl_members *m, const Qrl__ReplicaInfo *info, uint64_t have_version,
                                uint64_t now_ms, qrl_replica **out, qrl_error *err);
/* A heartbeat from `r` at now_ms (unix ms) with its status (may be NULL; copied). */
void qrl_members_heartbeat(qrl_replica *r, const Qrl__RolloutStatus *st, uint64_t now_ms);
/* Mark replicas silent for more than timeout_ms lost (their stream is finished); returns
 * how many were marked now. */
int qrl_members_expire(qrl_members *m, uint64_t now_ms, uint64_t timeout_ms);
/* Replicas not lost. */
int qrl_members_live(const qrl_members *m);
/* Answer Learner.ListReplicas on `call`: every entry in registration order, with its last
 * status; a lost replica shows state LOST, one told to drain that went silent STOPPED. */
void qrl_members_reply_list(struct qrl_rpc_call *call, const qrl_members *m);
/* Free the copies the entries own; the table is empty afterwards. */
void qrl_members_free(qrl_members *m);

#endif
