/* qrl-learner: what the loop's sections share (private to services/learner;
 * docs/learner-daemon.md).  Everything here belongs to the loop thread.
 *
 * The loop is cut along its own sections, each with its state private to its file:
 *   dispatch.c    the dataset walk, the group table (the dedupe table), redispatch;
 *   intake.c      results in: decode, chunk joins, validation, dedupe, buffering, and the
 *                 commit-after-use offsets;
 *   checkpoint.c  checkpoints and resume, behind checkpoint.h;
 *   control.c     the Learner RPC handlers, the membership table and version events;
 *   update.c      quotas to the trainer and what a finished update sets off;
 *   loop.c        the daemon on the service shell (common/service/service.h: the loop,
 *                 tick, signals, close chain, Kafka consumer with commit-after-use,
 *                 producer with resend, dead letters, Status/Pause/Resume/Set, metrics
 *                 outputs), setup and Shutdown; the only file that sees every section.
 * Calls go down that list's dependency order only (dispatch <- intake <- checkpoint <-
 * control <- update <- loop); nothing below calls up (the shell's callbacks land in
 * loop.c, which hands them down). */
#ifndef QRL_LEARNER_DAEMON_PRIVATE_H
#define QRL_LEARNER_DAEMON_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>

#include "learner.h"
#include "learner/metrics.h"
#include "ld_nccl.h"
#include "service/service.h"
#include "settings.h"

/* Where a group is (dispatch.c's table, indexed by group id). */
enum { GS_NONE = 0, GS_DISPATCHED, GS_BUFFERED, GS_TRAINING, GS_TRAINED, GS_DROPPED };

/* The run and the parts every section reaches: set up by loop.c, one per process. */
typedef struct ld_core {
    qrl_config_t *cfg;              /* the loop thread owns it (Learner.Set writes it) */
    const ld_settings *s;           /* cfg's typed fields (settings.h), bound: Set updates them */
    qrl_model *model;               /* the trainer's after start; read-only here (cfg, uaq_scale) */
    const ld_dataset *ds;
    const char *prompts_topic, *results_topic, *dlq_topic, *task, *dataset_path;
    uint64_t run_id, seed, max_updates;
    uint32_t G, T;                  /* group size, quota */
    uint64_t version, step;         /* the newest version and the updates that made it */
    bool paused, stopping, closing, finished;
    bool training;                  /* an update is on the trainer (update.c) */
    double last_reward, last_accuracy, last_train_tps; /* of the newest update (Status) */
    uint64_t started_ms;            /* unix ms at start (Status.uptime_s) */
    qrl_service_t *svc;             /* the shell: produce, record done, commits, dead letters */
    ld_trainer trainer;
    ld_wserver ws;
    ld_nccl nccl;                   /* weights.transport nccl|auto (ld_nccl.c) */
    struct qrl_wipc_sender *ipc;    /* weights.cuda_ipc on a CUDA learner (weights/wipc.h), or NULL */
    qrl_learner_metrics_t *lm;      /* metrics.listen / metrics.tensorboard_dir; NULL when off */
} ld_core;

/* Wall clock, unix ms. */
static inline uint64_t ld_unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

#endif
