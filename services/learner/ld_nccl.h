/* qrl-learner NCCL weight broadcast (ld_nccl.c; docs/weight-sync.md): the sync group's
 * membership on the loop thread, and a broadcast thread that is rank 0 of the current
 * epoch's communicator.  loop.c calls, per version: ld_nccl_plan (before the events),
 * ld_nccl_fill_event (in each event), ld_nccl_send (after); ld_nccl_take_failed on its
 * tick (a failed broadcast is re-announced over TCP). */
#ifndef QRL_LEARNER_LD_NCCL_H
#define QRL_LEARNER_LD_NCCL_H

#include "learner.h"
#include "weights/sync_group.h"

typedef struct ld_nccl_job {
    struct ld_nccl_job *next;
    uint64_t version, epoch;
    int world;
    uint8_t uid[QRL_NCCL_ID_BYTES];
    ld_snapshot *snap;         /* a reference */
} ld_nccl_job;

/* weights.transport = tcp | nccl | auto: the sync group (loop thread) and a broadcast
 * thread that is rank 0 of the current epoch's communicator. */
typedef struct ld_nccl {
    qrl_sync_group g;          /* loop thread */
    bool announcing;           /* between ld_nccl_plan and ld_nccl_send: events may say NCCL */
    struct { char id[QRL_SYNC_ID_MAX]; bool nccl; } *caps; /* what replicas advertised */
    size_t n_caps;
    int device, timeout_ms;
    ld_wserver *ws;
    bool started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ld_nccl_job *head, *tail;  /* under mu */
    bool stop;                 /* under mu */
    uint64_t failed_version;   /* under mu: a broadcast that failed (0 none), for the loop */
    bool failed;               /* under mu */
    void *comm;                /* broadcast thread: qrl_nccl_comm_t of comm_epoch */
    uint64_t comm_epoch;
    uint64_t dead_epoch;       /* broadcast thread: an epoch that failed (its id is spent) */
} ld_nccl;

/* Start with weights.transport (`transport`: tcp|nccl|auto), weights.nccl_device and
 * weights.nccl_timeout_ms; the broadcast thread runs unless the transport is tcp.  Errors:
 * INVALID_ARGUMENT (transport), UNSUPPORTED (nccl asked for without a GPU/NCCL), INTERNAL
 * (thread). */
qrl_status ld_nccl_start(ld_nccl *n, const char *transport, int device, int timeout_ms, ld_wserver *ws,
                         qrl_error *err);
/* Remember what replica `id` advertised at Register (ReplicaInfo.nccl). */
void ld_nccl_note(ld_nccl *n, const char *id, bool nccl);
/* Before announcing `version` to the watching replicas ids[n_ids]: choose its transport,
 * start a new epoch (fresh unique id) when the members changed.  Returns true for NCCL. */
bool ld_nccl_plan(ld_nccl *n, const char *const *ids, size_t n_ids, uint64_t version);
/* The transport fields of an event to replica `id` (TCP unless inside an NCCL announcement). */
void ld_nccl_fill_event(ld_nccl *n, const char *id, Qrl__VersionEvent *ev);
/* After announcing: queue the broadcast of the newest snapshot (when the plan said NCCL). */
void ld_nccl_send(ld_nccl *n, uint64_t version);
/* A broadcast that failed since the last call: *version set, true once per failure; the
 * epoch is marked failed (the next NCCL plan starts another) and the caller re-announces
 * the version over TCP. */
bool ld_nccl_take_failed(ld_nccl *n, uint64_t *version);
void ld_nccl_stop(ld_nccl *n);

#endif
