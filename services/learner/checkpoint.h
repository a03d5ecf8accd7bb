/* qrl-learner checkpoints, the loop's side (checkpoint.c; docs/learner-daemon.md
 * "Checkpoints", "Resume"; the format: common/learner/checkpoint.h).  A checkpoint is
 * taken between updates: the loop copies its state (dispatch.h, intake.h) into a job, the
 * trainer adds the tensors and writes the folder (trainer.c), and the loop then commits the
 * offsets it covers and answers the Checkpoint calls waiting for it. */
#ifndef QRL_LD_CHECKPOINT_H
#define QRL_LD_CHECKPOINT_H

#include "daemon.h"

/* Read the checkpoint keys and resolve learner.resume (before the trainer exists): when a
 * checkpoint is to be resumed, *resumed, its folder in rdir (QRL_CKPT_PATH_MAX) and its
 * state in *rs (free with qrl_ckpt_state_free); its run id, seed and UAQ scale replace the
 * configured ones in c and lc (the parameters are stored scaled).  Errors: a named resume
 * path that does not resolve, "auto" without learner.checkpoint_dir, a malformed
 * checkpoint, another dataset (INVALID_ARGUMENT). */
qrl_status ld_ckpt_configure(ld_core *c, qrl_learner_config *lc, bool *resumed, char *rdir,
                             qrl_ckpt_state *rs, qrl_error *err);
/* Restore from the checkpoint (after setup: trainer, producer, consumer exist): the
 * trainer's parameters and AdamW state, the dispatch walk and table, the offsets, and the
 * restored version's snapshot for the weight server.  Errors: as qrl_ckpt_load_*. */
qrl_status ld_ckpt_restore(ld_core *c, const char *dir, const qrl_ckpt_state *s, qrl_error *err);
/* Checkpoints are on (learner.checkpoint_dir not empty). */
bool ld_ckpt_on(void);
/* A checkpoint job is on the trainer. */
bool ld_ckpt_busy(void);
/* The newest checkpoint holds c->step (nothing trained since). */
bool ld_ckpt_current(const ld_core *c);
/* After an update: a checkpoint is due (every learner.checkpoint_every updates, a waiting
 * Checkpoint call, stopping, or max_updates reached). */
bool ld_ckpt_due(const ld_core *c);
/* Copy the loop's state into a checkpoint job for the trainer (no-op while one runs or
 * when off).  Updates wait (ld_ckpt_busy) until it is written; dispatch and intake go on. */
void ld_ckpt_start(ld_core *c);
/* The trainer wrote it (or failed): log, commit the covered offsets, answer the waiting
 * calls; frees j.  Training goes on after a failure (the previous checkpoint stays). */
void ld_ckpt_done(ld_core *c, ld_job *j);
/* The newest checkpoint's step and folder (valid until the next one), false when none. */
bool ld_ckpt_last(uint64_t *step, const char **dir);
/* Learner.Checkpoint handler (user = the core). */
void ld_ckpt_h_checkpoint(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user);
/* Free what configure kept. */
void ld_ckpt_free(void);

#endif
