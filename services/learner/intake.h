/* qrl-learner intake (intake.c; docs/learner-daemon.md "Intake"): GroupResults in from the
 * results topic, chunked ones joined (wire/chunk_join.h), validated, deduplicated against
 * the group table and buffered for the next quota.  The records come from the service
 * shell, which commits each once it is used up (commit-after-use; with checkpoints on, the
 * committable offsets come back here and go with the checkpoint that covers them). */
#ifndef QRL_LD_INTAKE_H
#define QRL_LD_INTAKE_H

#include "daemon.h"
#include "kafka/offsets.h"

typedef struct ld_buffered { /* a result waiting for its quota */
    Qrl__GroupResult *r;      /* owned */
    qrl_kafka_offset *off;    /* its record (the shell's), pending until the result is used */
} ld_buffered;

typedef struct ld_intake_counts {
    uint64_t results, duplicates, dead_letters, other_run;
    size_t buffered;          /* results waiting for a quota */
} ld_intake_counts;

/* Free the buffered results and the joiner's sets. */
void ld_intake_free(void);
/* One consumed record (the shell's record callback): `off` is released with
 * ld_intake_done once the record is used up. */
void ld_intake_record(ld_core *c, const qrl_kafka_message *m, qrl_kafka_offset *off);
/* With checkpoints on (the shell's committable callback): partition is used up to `upto`,
 * committed by the next checkpoint (ld_intake_commit_saved). */
void ld_intake_committable(int32_t partition, int64_t upto);
/* Drop chunk sets incomplete for 60 s (counted as dead letters). */
void ld_intake_expire_chunks(ld_core *c);
/* The counters and the buffer's size now. */
ld_intake_counts ld_intake_counts_now(void);
/* Take the oldest n buffered results (n <= buffered): a malloc'd array, ownership passes. */
ld_buffered *ld_intake_take(size_t n);
/* A taken result's record is used up (qrl_service_record_done). */
void ld_intake_done(ld_core *c, qrl_kafka_offset *off);
/* Checkpoint side: the committable offsets into s->offsets (malloc'd). */
void ld_intake_save(qrl_ckpt_state *s);
/* The checkpoint holding s is written: commit its offsets (the group's committed position is
 * what the newest checkpoint has consumed). */
void ld_intake_commit_saved(ld_core *c, const qrl_ckpt_state *s);
/* Resume: the checkpoint's offsets are the committable ones (when it read this topic);
 * warns when the group is committed past them. */
void ld_intake_restore(ld_core *c, const qrl_ckpt_state *s);

#endif
