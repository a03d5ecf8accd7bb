/* qrl-learner internals (SPEC §1, §5, §8, §9; STYLE 14; docs/learner-daemon.md).
 *
 * Threads:
 *   - loop (main): one libuv loop: the Kafka producer (prompts, dead letters) and the
 *     results consumer, polled from a uv_timer with zero timeouts; the gRPC Learner
 *     service (Register, Heartbeat, WatchVersions, Status, ListReplicas, Set, Pause, Resume,
 *     Drain, Shutdown; membership table in members.c);
 *     signals; offset commits; the config;
 *   - trainer: owns the model's parameters and the qrl_learner; runs one update per job
 *     and builds the BF16 weight snapshot of the new version; writes checkpoint jobs
 *     (checkpoint.c) between updates;
 *   - weight server: accepts TCP connections and streams the newest snapshot (one short-
 *     lived thread per connection, so a slow replica never holds another).
 * Loop and trainer meet in ld_trainer: one job slot (loop -> trainer, mutex + condvar)
 * and one done slot (trainer -> loop, uv_async_t).  Only one update runs at a time. */
#ifndef QRL_LEARNER_DAEMON_H
#define QRL_LEARNER_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/config.h"
#include "core/shuffle.h"
#include "core/status.h"
#include "learner/checkpoint.h"
#include "learner/members.h"
#include "learner/update.h"
#include "model/model.h"
#include "qrl.pb-c.h"
#include "rpc/rpc.h"
#include "tasks/prompts.h"
#include "tokenizer/tokenizer.h"

/* ---- dataset ---------------------------------------------------------------------- */

/* The learner's prompts: a JSONL file read whole at start, rendered and tokenized once
 * (tasks/prompts.h, the loader qrl-eval and the benchmarks share; key_prefix "dataset."),
 * then walked in a seeded shuffled order per epoch (core/shuffle.h). */
typedef qrl_prompt_set ld_dataset;
typedef qrl_prompt ld_prompt;
/* The walk order of each epoch is qrl_epoch_order (core/shuffle.h). */

/* ---- weight snapshots and their TCP server (weights.c) --------------------------------- */

/* One version's BF16 stream (framing in weights.c), immutable once built; shared by
 * reference count between the server's threads. */
typedef struct ld_snapshot {
    uint64_t version;
    uint8_t *manifest;      /* encoded WeightManifest */
    size_t manifest_len;
    uint8_t *stream;        /* every tensor, BF16, in table order; NULL until
                               ld_snapshot_fill when the version lives on the device */
    size_t total;
    size_t bucket_bytes;
    int refs;               /* under the server's mutex */
    struct qrl_wipc_sender *ipc; /* non-NULL: the version is in this sender's device slot */
    uint32_t *bucket_crc;   /* device versions: the bucket CRC-32C computed on the GPU (owned) */
    pthread_mutex_t fill_mu;
} ld_snapshot;

/* Build the snapshot of `m` at `version`: BF16 of every tensor, CRC-32C per tensor and of
 * the whole stream, a validated manifest.  Errors: NOMEM, INTERNAL (manifest invalid). */
qrl_status ld_snapshot_build(const qrl_model *m, uint64_t version, size_t bucket_bytes,
                             ld_snapshot **out, qrl_error *err);
/* A snapshot of a version published on the device (weights/wipc.h): the manifest (ownership
 * passes), no host stream until ld_snapshot_fill.  Errors: NOMEM. */
qrl_status ld_snapshot_device(struct qrl_wipc_sender *ipc, uint64_t version, size_t bucket_bytes,
                              uint8_t *manifest, size_t manifest_len, size_t total, ld_snapshot **out,
                              qrl_error *err);
/* Make s->stream valid (copied once from the device slot; any thread).  Errors: NOT_FOUND
 * (the slot was reused by a newer version: this one is no longer served), NOMEM, CUDA. */
qrl_status ld_snapshot_fill(ld_snapshot *s, qrl_error *err);

typedef struct ld_wserver {
    int lfd;
    pthread_t thread;
    bool started;
    _Atomic int stop;
    pthread_mutex_t mu;
    ld_snapshot *cur;       /* newest version; NULL before the first update */
    char addr[300];         /* host:port advertised in VersionEvents */
    _Atomic uint64_t sends; /* streams completed */
} ld_wserver;

/* Bind `listen` (host:port; port 0 = any free), start the accept thread.  Errors:
 * INVALID_ARGUMENT (address), NETWORK (bind/listen), INTERNAL (thread). */
qrl_status ld_wserver_start(ld_wserver *w, const char *listen, qrl_error *err);
/* Serve `s` (ownership passes) to connections accepted from now on. */
void ld_wserver_publish(ld_wserver *w, ld_snapshot *s);
/* Stop accepting, wait for the accept thread; streams in progress finish on their own. */
void ld_wserver_stop(ld_wserver *w);
/* Fault injection (weights.tcp_throttle_ms; tests): every stream sleeps `ms` before each
 * bucket from now on, 0 = off.  Any thread. */
void ld_wserver_set_throttle(int ms);
/* The newest snapshot with a reference taken (NULL before the first update); give it back
 * with ld_snapshot_unref.  Any thread. */
ld_snapshot *ld_wserver_current(ld_wserver *w);
void ld_snapshot_unref(ld_wserver *w, ld_snapshot *s);


/* ---- trainer thread (trainer.c) ------------------------------------------------------ */

/* One update: T decoded results in (owned by the job until it comes back). */
typedef struct ld_job {
    Qrl__GroupResult **results;
    size_t n;
    double lr;
    uint64_t version;       /* the version the update produces */
    /* set by the trainer */
    qrl_status st;
    char error[512];
    qrl_learner_stats stats;
    double update_s;        /* the update */
    double snapshot_s;      /* building the BF16 snapshot (device: cast + checksums) */
    bool ipc;               /* published on the device: ipc_handle names the slot */
    uint8_t ipc_handle[64];
    struct ld_ckpt_job *ckpt; /* non-NULL: a checkpoint instead of an update (written by the
                                 trainer between updates) */
    struct ld_trace_set *traces; /* [n] TRACE records of results[i]'s responses (trace.h;
                                    owned), or NULL: no QAT guidance */
    uint64_t trace_record_bytes, trace_tokens; /* of the decoded records (bytes per token) */
} ld_job;

typedef struct ld_trainer {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ld_job *job, *done;
    bool stop;
    uv_async_t *done_async;
    qrl_learner_t *l;       /* trainer thread only, after start */
    qrl_model *m;
    ld_wserver *ws;
    size_t bucket_bytes;
    struct qrl_wipc_sender *ipc; /* lc->device_weights: versions published on the device */
} ld_trainer;

/* ipc: the device-slot sender used when lc->device_weights (borrowed; outlives the
 * weight server), else NULL. */
qrl_status ld_trainer_start(ld_trainer *t, qrl_model *m, const qrl_learner_config *lc,
                            ld_wserver *ws, struct qrl_wipc_sender *ipc, size_t bucket_bytes,
                            uv_async_t *done_async, qrl_error *err);
/* Hand a job over (the trainer must be idle: one at a time). */
void ld_trainer_submit(ld_trainer *t, ld_job *j);
/* The finished job, or NULL. */
ld_job *ld_trainer_take_done(ld_trainer *t);
void ld_trainer_join(ld_trainer *t);
void ld_job_free(ld_job *j);

/* A checkpoint handed to the trainer between updates: the loop's state copied by the
 * loop thread (checkpoint.c); the trainer adds the tensors and writes the folder. */
typedef struct ld_ckpt_job {
    qrl_ckpt_state state;   /* owned (strings and arrays malloc'd by the loop) */
    const char *root;       /* learner.checkpoint_dir */
    int keep;
    /* set by the trainer */
    char dir[QRL_CKPT_PATH_MAX];
    size_t bytes;
    double seconds;
} ld_ckpt_job;

/* Restore the trainer's side of checkpoint `dir` (parameters into m, AdamW state, update
 * count); call after ld_trainer_start, before the first job.  Errors: as qrl_ckpt_load_*. */
qrl_status ld_trainer_restore(ld_trainer *t, const char *dir, const qrl_ckpt_state *s, qrl_error *err);

/* ---- the run's settings in checkpoints (checkpoint.c) -------------------------------- */


/* The run's settings at resume (docs/learner-daemon.md "Resume"): when learner.resume names
 * a checkpoint (or auto finds one), every key the manifest's "settings" record that this
 * start leaves at its default (not on the command line, not in a --config file) takes the
 * checkpoint's value (origin "checkpoint"), so a resumed learner runs as the run did (its
 * quota, model, dataset, ...); learner.resume itself is never restored.  Call right after
 * the config is parsed, before anything is read from it.  A checkpoint that cannot be
 * resolved here is left for ld_ckpt_configure to report.  Errors: INVALID_ARGUMENT when a
 * recorded value no longer fits this build's table (named). */
qrl_status ld_ckpt_restore_settings(qrl_config_t *cfg, qrl_error *err);
/* The config as a JSON object text {"key": "value text"} for the manifest (malloc'd). */
char *ld_ckpt_settings_json(const qrl_config_t *cfg);

/* ---- the daemon (loop.c) -------------------------------------------------------------- */

/* Run until max_updates are done (then replicas are told SHUTDOWN) or SIGTERM/SIGINT;
 * returns the exit status.  `lc` is the update config from the table. */
struct ld_settings;
/* `s` is cfg's bound settings struct (settings.h). */
int ld_daemon_run(qrl_config_t *cfg, const struct ld_settings *s, qrl_model *model, const ld_dataset *ds,
                  const qrl_learner_config *lc);


#endif
