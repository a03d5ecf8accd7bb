/* Learner checkpoints (SPEC §5 "checkpoint/resume", STYLE 13; docs/learner-daemon.md
 * "Checkpoints"): one folder per checkpoint, written so that a crash at any point leaves
 * either the previous checkpoint or the new complete one.
 *
 *   ROOT/step-00000012[-TAG]/params.safetensors   F32 master weights as the learner trains
 *                                                  them (UAQ-scaled when uaq_scale != 1),
 *                                                  HF tensor names, the learner's layout
 *                         /optimizer.bin          AdamW m, v, step (qrl_adamw_save)
 *                         /manifest.json          everything else; written LAST: a folder
 *                                                  without it is partial and never read
 *   ROOT/latest                                   "step-00000012[-TAG]\n", replaced atomically
 *
 * Every file is written through common/io/atomic_file.h (temp, fsync, rename, fsync of
 * the folder).  The manifest records each file's size and CRC-32, so a truncated or
 * garbled tensor file is refused at load with the file named.
 *
 * Threading: functions are reentrant; the daemon writes from its trainer thread with a
 * state copied by the loop thread. */
#ifndef QRL_LEARNER_CHECKPOINT_H
#define QRL_LEARNER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "train/adamw.h"

#define QRL_CKPT_FORMAT "qrl-learner-checkpoint"
#define QRL_CKPT_FORMAT_VERSION 1
#define QRL_CKPT_PATH_MAX 4096

/* A group dispatched and not yet trained when the checkpoint was taken: its result is
 * accepted after a restart, and its PromptGroup is produced again when its first
 * delivery was not acknowledged (it may never have reached the broker). */
typedef struct qrl_ckpt_group {
    uint64_t id;
    uint32_t epoch;            /* dataset position it was drawn from */
    uint64_t index;            /* position in the epoch's permutation */
    uint64_t dispatch_version;
    bool delivered;            /* the broker acknowledged its PromptGroup */
} qrl_ckpt_group;

/* Per results partition: the next offset to read so that no untrained result is skipped
 * (every record before it was trained, dead-lettered or skipped). */
typedef struct qrl_ckpt_offset {
    int32_t partition;
    int64_t next_offset;
} qrl_ckpt_offset;

/* Everything but the tensors.  Strings and arrays are owned by the struct
 * (qrl_ckpt_state_free) when filled by qrl_ckpt_read; the writer only reads them. */
typedef struct qrl_ckpt_state {
    uint64_t step;             /* updates done */
    uint64_t version;          /* policy version of the saved parameters */
    uint64_t run_id;
    uint64_t seed;             /* learner.seed: dataset order, sampling, minibatch shuffle */
    uint64_t learner_updates;  /* keys the minibatch shuffle (qrl_learner_set_updates) */
    float uaq_scale;           /* 1 = none; the parameters are in the scaled form */
    char *model;               /* the base model path (export reads its config) */
    char *tokenizer;           /* the tokenizer path used ("" when unknown) */
    char *dataset;             /* dataset.path */
    uint64_t dataset_prompts;  /* prompts in it (a different file refuses the resume) */
    uint32_t epoch;            /* dataset cursor: next prompt is perm(seed, epoch)[index] */
    uint64_t index;
    uint64_t next_group_id;    /* ids 1 .. next_group_id-1 were dispatched */
    qrl_ckpt_group *pending;   /* dispatched, not trained; ascending ids */
    size_t n_pending;
    char *results_topic;
    qrl_ckpt_offset *offsets;  /* ascending partitions */
    size_t n_offsets;
    char *tag;                 /* "" or the Checkpoint RPC's tag */
    uint64_t unix_ms;          /* when it was taken */
    char *settings;            /* the run's settings: a JSON object {"key": "value text"} of the
                                  learner's config (manifest "settings"); NULL = none recorded
                                  (older checkpoints); qrl-learner --resume restores them */
} qrl_ckpt_state;

void qrl_ckpt_state_free(qrl_ckpt_state *s);

/* Write a checkpoint of (m's tensors, opt, *s) into ROOT/step-NNNNNNNN[-TAG]/ (ROOT is
 * created when missing; an older partial folder of the same name is reused), then point
 * ROOT/latest at it and delete all but the newest `keep` (>= 1) complete checkpoints and
 * any partial folder of a lower step.  The trained ids are written as ranges: every id
 * below next_group_id that is not pending.  out_dir (may be NULL) receives the folder
 * path (QRL_CKPT_PATH_MAX bytes).  bytes_out (may be NULL): bytes written.
 * Errors: INVALID_ARGUMENT (tag with '/' or not [A-Za-z0-9_.-], keep < 1), IO (naming
 * the file), NOMEM.  Pruning failures are only logged. */
qrl_status qrl_ckpt_write(const char *root, const qrl_model *m, const qrl_adamw_t *opt,
                          const qrl_ckpt_state *s, int keep, char *out_dir, size_t *bytes_out,
                          qrl_error *err);

/* Resolve `path` to one complete checkpoint folder into out_dir (QRL_CKPT_PATH_MAX):
 * a step folder (must hold manifest.json), or a root: the complete step-* folder with the
 * highest step (ROOT/latest is only a hint for tools; folders without a manifest are
 * skipped with a WARN).  Errors: NOT_FOUND (no such path, or a root without any complete
 * checkpoint: the message says which), IO. */
qrl_status qrl_ckpt_find(const char *path, char *out_dir, qrl_error *err);

/* Read and validate dir/manifest.json into *out (zeroed first; free with
 * qrl_ckpt_state_free), and check the recorded size and CRC-32 of every tensor file.
 * Errors name the file and the field: NOT_FOUND/IO, PARSE (bad JSON: line and column),
 * CORRUPT (missing or mistyped field, inconsistent ids or ranges, a file of the wrong
 * size or CRC), UNSUPPORTED (other format or version), NOMEM. */
qrl_status qrl_ckpt_read(const char *dir, qrl_ckpt_state *out, qrl_error *err);

/* Copy dir/params.safetensors into m's tensors (every tensor of m by name, F32, same
 * shape; no extra tensors).  Call after qrl_ckpt_read validated the files.  m->uaq_scale
 * is not changed (the caller applies the scale before, see docs).  Errors name the file
 * and the tensor: NOT_FOUND, CORRUPT (shape, dtype, extra tensor), IO. */
qrl_status qrl_ckpt_load_params(const char *dir, qrl_model *m, qrl_error *err);

/* Only the "settings" object of dir/manifest.json (no file checks: cheap, for restoring a
 * run's config before anything loads) into *out (malloc'd JSON object text; NULL when the
 * manifest records none).  Errors: NOT_FOUND/IO, PARSE, CORRUPT ("settings" not an object
 * of strings). */
qrl_status qrl_ckpt_read_settings(const char *dir, char **out, qrl_error *err);

/* qrl_adamw_load(opt, dir/optimizer.bin). */
qrl_status qrl_ckpt_load_optimizer(const char *dir, qrl_adamw_t *opt, qrl_error *err);

#endif
