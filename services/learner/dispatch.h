/* qrl-learner dispatch (dispatch.c; docs/learner-daemon.md "Dispatch"): the seeded walk over
 * the dataset, one PromptGroup per position, and the group table.  Group ids are 1, 2, 3,
 * ... in dispatch order, id k being position k - 1 of the walk; the table says where each
 * one is, which is also the dedupe table (a result for a group that is not DISPATCHED is
 * dropped). */
#ifndef QRL_LD_DISPATCH_H
#define QRL_LD_DISPATCH_H

#include "daemon.h"

/* Counters and the walk's position (Status, metrics, the close line). */
typedef struct ld_dispatch_counts {
    uint64_t next_id;      /* the id the next group gets (dispatched so far: next_id - 1) */
    uint64_t in_flight;    /* dispatched, not yet taken into an update */
    uint32_t epoch;
    size_t cursor;         /* index of the next position in the epoch */
    uint64_t redispatched; /* groups produced again after learner.redispatch_timeout_s */
} ld_dispatch_counts;

/* The walk at epoch 0, first id 1. */
void ld_dispatch_init(ld_core *c);
/* Free the walk and the group table. */
void ld_dispatch_free(void);
/* learner.mode alternate (SPEC §4.6): one version's quota at a time. */
bool ld_dispatch_alternate(const ld_core *c);
/* Groups that may be dispatched and not yet trained: one quota for the update being filled
 * plus one per version of staleness allowed (T in alternate mode). */
uint64_t ld_dispatch_window(const ld_core *c);
/* Dispatch up to the window (nothing while paused, stopping or finished; never past
 * max_updates x T groups in all). */
void ld_dispatch_fill(ld_core *c);
/* Produce again, with the same id and content, every group sent more than
 * learner.redispatch_timeout_s ago (and acknowledged) that has no result yet. */
void ld_dispatch_redispatch_stale(ld_core *c);
/* The broker acknowledged group id's PromptGroup (the shell's acknowledged callback). */
void ld_dispatch_acked(ld_core *c, uint64_t id);
/* `n` groups left the window (an update took them). */
void ld_dispatch_taken(uint64_t n);
/* Where group `id` is (GS_*; GS_NONE for an id never dispatched). */
uint8_t ld_group_state(uint64_t id);
/* Move group `id` to `s` (the table grows as ids do). */
void ld_group_set(uint64_t id, uint8_t s);
/* The counters and the walk's position now. */
ld_dispatch_counts ld_dispatch_counts_now(void);
/* Checkpoint side: the walk's position and the pending (DISPATCHED or BUFFERED) groups into
 * s (s->pending malloc'd; between updates: nothing is TRAINING). */
void ld_dispatch_save(const ld_core *c, qrl_ckpt_state *s);
/* Resume: the walk and the table from s; pending groups are DISPATCHED again (their results
 * are accepted), those the broker never acknowledged produced again.  Returns how many were
 * produced again. */
size_t ld_dispatch_restore(ld_core *c, const qrl_ckpt_state *s);

#endif
