/* qrl-learner updates (update.c; docs/learner-daemon.md "Updates"): a full quota of
 * buffered results goes to the trainer as one job; a finished update bumps the version,
 * writes metrics.jsonl, releases the results' records, announces the version and starts a
 * checkpoint when one is due.  One update at a time; none while a checkpoint is written. */
#ifndef QRL_LD_UPDATE_H
#define QRL_LD_UPDATE_H

#include "daemon.h"

/* What a finished update leaves the loop to do. */
typedef enum ld_update_next {
    LD_UPDATE_NEXT_TRAIN, /* go on: the next quota may start */
    LD_UPDATE_NEXT_LAST,  /* max_updates reached: replicas told SHUTDOWN; end the run soon */
    LD_UPDATE_NEXT_FAIL,  /* the update failed (a model/config problem): the run is finished */
} ld_update_next;

/* Free what an unfinished update left (at exit). */
void ld_update_free(void);
/* Start an update when a quota is buffered and nothing else holds the trainer (not while
 * stopping or finished); in alternate mode the replicas are told to pause. */
void ld_update_try(ld_core *c);
/* The trainer finished update job j (frees it). */
ld_update_next ld_update_finish(ld_core *c, ld_job *j);

#endif
