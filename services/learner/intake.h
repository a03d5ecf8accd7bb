/* qrl-learner intake (intake.c; docs/learner-daemon.md "Intake"): GroupResults in from the
 * results topic, chunked ones joined (wire/chunk_join.h), validated, deduplicated against
 * the group table and buffered for the next quota; the consumed records are committed only
 * once used (commit-after-use: with checkpoints on, with the checkpoint that covers them). */
#ifndef QRL_LD_INTAKE_H
#define QRL_LD_INTAKE_H

#include "daemon.h"
#include "kafka/offsets.h"

typedef struct ld_buffered { /* a result waiting for its quota */
    Qrl__GroupResult *r;      /* owned */
    int32_t partition;
    qrl_kafka_offset *off;    /* its record, pending until the result is used */
} ld_buffered;

typedef struct ld_intake_counts {
    uint64_t results, duplicates, dead_letters, other_run;
    size_t buffered;          /* results waiting for a quota */
} ld_intake_counts;

/* commit_with_checkpoints: used records are committed by the next checkpoint
 * (ld_intake_commit_saved) instead of at once. */
void ld_intake_init(bool commit_with_checkpoints);
/* Free the buffered results and the joiner's sets. */
void ld_intake_free(void);
/* Read up to 64 records (zero timeouts; nothing once the run is finished). */
void ld_intake_poll(ld_core *c);
/* Drop chunk sets incomplete for 60 s (counted as dead letters). */
void ld_intake_expire_chunks(ld_core *c);
ld_intake_counts ld_intake_counts_now(void);
/* Take the oldest n buffered results (n <= buffered): a malloc'd array, ownership passes. */
ld_buffered *ld_intake_take(size_t n);
/* A taken result's record is used up: commit (or remember) its partition's offset. */
void ld_intake_done(ld_core *c, int32_t partition, qrl_kafka_offset *off);
/* Checkpoint side: the committable offsets into s->offsets (malloc'd). */
void ld_intake_save(qrl_ckpt_state *s);
/* The checkpoint holding s is written: commit its offsets (the group's committed position is
 * what the newest checkpoint has consumed). */
void ld_intake_commit_saved(ld_core *c, const qrl_ckpt_state *s);
/* Resume: the checkpoint's offsets are the committable ones (when it read this topic);
 * warns when the group is committed past them. */
void ld_intake_restore(ld_core *c, const qrl_ckpt_state *s);

#endif
