/* Membership of the NCCL weight-sync group, as the learner (rank 0) tracks it (SPEC §8
 * "Weight sync"; docs/weight-sync.md).  Before each version is announced the learner plans
 * its transport from the replicas that watch versions: NCCL or TCP (qrl_wsync_use_nccl);
 * with NCCL, a set of replicas other than the current epoch's members (or a failed epoch)
 * starts a new epoch: epoch + 1, a fresh ncclUniqueId, ranks 1..n in the order given.
 * Membership therefore changes only at a sync boundary.  No CUDA here. */
#ifndef QRL_WEIGHTS_SYNC_GROUP_H
#define QRL_WEIGHTS_SYNC_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"
#include "weights/nccl_bcast.h"
#include "weights/wsync.h"

#define QRL_SYNC_ID_MAX 128

typedef struct qrl_sync_member {
    const char *id;
    bool nccl;          /* advertised in Register (ReplicaInfo.nccl) */
} qrl_sync_member;

typedef struct qrl_sync_group {
    qrl_wsync_mode mode;
    bool learner_nccl;  /* the learner can be rank 0 (GPU + NCCL build) */
    uint64_t epoch;     /* 0: no NCCL epoch yet */
    bool use_nccl;      /* the last plan's transport */
    bool failed;        /* the epoch's communicator failed: the next NCCL plan starts another */
    uint8_t uid[QRL_NCCL_ID_BYTES];
    char (*ids)[QRL_SYNC_ID_MAX]; /* members, rank = index + 1 */
    size_t n, cap;
} qrl_sync_group;

/* Plan the next version's transport for the watching replicas m[n].  *new_epoch is set when
 * NCCL is chosen and the members changed (any order) or the epoch failed: the epoch is then
 * bumped, members = m's ids in order, and the caller must give it a fresh unique id
 * (qrl_nccl_unique_id into g->uid) before announcing.  Errors: INVALID_ARGUMENT (an id
 * empty or longer than QRL_SYNC_ID_MAX - 1), NOMEM; the group is unchanged then. */
qrl_status qrl_sync_group_plan(qrl_sync_group *g, const qrl_sync_member *m, size_t n, bool *use_nccl,
                               bool *new_epoch, qrl_error *err);
/* Rank of replica `id` in the current epoch (1..n), 0 if it is not a member. */
int qrl_sync_group_rank(const qrl_sync_group *g, const char *id);
/* Fill a VersionEvent's transport fields for replica `id`: NCCL (unique id, rank, world
 * size, epoch) when the last plan chose NCCL and it is a member, TCP otherwise (weight_addr
 * is the caller's, set either way as the fallback).  The event borrows g->uid. */
void qrl_sync_group_fill_event(qrl_sync_group *g, const char *id, Qrl__VersionEvent *ev);
void qrl_sync_group_free(qrl_sync_group *g);

#endif
