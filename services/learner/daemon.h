/* qrl-learner loop state shared by loop.c and the loop side of checkpoint.c (private to
 * services/learner; docs/learner-daemon.md).  Everything here belongs to the loop thread. */
#ifndef QRL_LEARNER_DAEMON_PRIVATE_H
#define QRL_LEARNER_DAEMON_PRIVATE_H

#include <stdio.h>

#include "kafka/kafka.h"
#include "kafka/offsets.h"
#include "learner.h"
#include "learner/metrics.h"
#include "wire/chunk_join.h"
#include "ld_nccl.h"
#include "rpc/rpc.h"

enum { GS_NONE = 0, GS_DISPATCHED, GS_BUFFERED, GS_TRAINING, GS_TRAINED, GS_DROPPED };

typedef struct ld_out { /* one produced record, kept until acknowledged */
    struct ld_out *next;
    const char *topic;
    uint64_t key_id;    /* 0: unkeyed */
    uint8_t *buf;
    size_t len;
} ld_out;

typedef struct ld_buffered { /* a result waiting for its quota */
    Qrl__GroupResult *r;
    int32_t partition;
    qrl_kafka_offset *off;
} ld_buffered;

typedef struct ld_ginfo { /* what a checkpoint needs of a dispatched group */
    uint64_t dispatch_version;
    uint64_t sent_ms; /* unix ms of its last production (learner.redispatch_timeout_s) */
    bool delivered;   /* the broker acknowledged its PromptGroup */
} ld_ginfo;

typedef struct ld_daemon {
    uv_loop_t loop;
    uv_timer_t tick, exit_timer;
    uv_signal_t sigterm, sigint;
    uv_async_t train_async;
    qrl_config_t *cfg;
    qrl_model *model;
    const ld_dataset *ds;
    const char *prompts_topic, *results_topic, *dlq_topic, *task, *dataset_path;
    qrl_kafka_producer_t *producer;
    qrl_kafka_consumer_t *consumer;
    qrl_rpc_server_t *rpc;
    ld_trainer trainer;
    ld_wserver ws;
    ld_nccl nccl;               /* weights.transport nccl|auto (ld_nccl.c) */
    struct qrl_wipc_sender *ipc; /* weights.cuda_ipc on a CUDA learner (weights/wipc.h), or NULL */
    char node_id[160];          /* qrl_wipc_node_id: replicas with the same one take CUDA IPC */
    uint64_t ipc_version;       /* the version whose slot ipc_handle names (0: none) */
    uint8_t ipc_handle[64];
    uint64_t run_id, seed, version, step, max_updates;
    uint32_t G, T;
    /* dispatch */
    uint32_t *perm, epoch;
    size_t cursor;
    uint64_t next_id, in_flight; /* dispatched, not yet taken into an update */
    uint64_t oldest_dispatched;  /* ids below it are past GS_DISPATCHED (redispatch scan) */
    uint64_t redispatched;       /* groups produced again after learner.redispatch_timeout_s */
    uint8_t *state;
    size_t state_cap;
    ld_ginfo *ginfo; /* [state_cap]: per group, for checkpoints */
    ld_out *resend;
    /* intake */
    qrl_kafka_offsets *offsets; /* commit-after-use tracking of consumed records */
    qrl_wire_joiner chunks;     /* chunked results being reassembled (wire/chunk_join.h) */
    ld_buffered *buf;
    size_t n_buf, cap_buf;
    ld_buffered *training; /* the quota the trainer holds */
    size_t n_training;
    uint64_t results, duplicates, dead_letters, other_run;
    /* membership */
    qrl_members members;
    bool paused, stopping, closing, finished;
    double last_reward, last_accuracy, last_train_tps;
    uint64_t warned_ms;
    FILE *metrics;
    qrl_learner_metrics_t *lm;      /* metrics.listen / metrics.tensorboard_dir; NULL when off */
    /* checkpoints (docs/learner-daemon.md "Checkpoints"); ckpt_root NULL = off */
    const char *ckpt_root;
    uint64_t ckpt_every, ckpt_step; /* ckpt_step: step of the newest checkpoint, UINT64_MAX none */
    int ckpt_keep;
    bool ckpt_busy, close_after_ckpt;
    char ckpt_dir[QRL_CKPT_PATH_MAX];
    qrl_rpc_call_t *ckpt_calls[16]; /* Checkpoint RPCs waiting for the next one */
    int n_ckpt_calls;
    char ckpt_tag[72];              /* the first waiting call's tag */
    int64_t *safe; /* per partition: next offset with every record before it used (-1 none) */
    int n_safe;
    char *abs_model, *abs_tok, *abs_ds; /* recorded in manifests (export reads the model) */
    uint64_t started_ms;        /* unix ms at start (Status.uptime_s) */
} ld_daemon;

/* loop.c */
void ld_state_set(ld_daemon *d, uint64_t id, uint8_t s);
/* Produce the PromptGroup of group `id` (dataset item `item`, drawn at (epoch, index)). */
void ld_send_group(ld_daemon *d, uint64_t id, uint32_t epoch, uint64_t index, uint32_t item, uint64_t version);
void ld_maybe_train(ld_daemon *d);
void ld_begin_close(ld_daemon *d);

/* checkpoint.c, loop side (docs/learner-daemon.md "Checkpoints", "Resume") */
/* A consumed record is used up: remember its partition's committable offset (committed
 * with the next checkpoint). */
void ld_ckpt_safe_set(ld_daemon *d, int32_t p, int64_t upto);
/* Copy the loop's state into a checkpoint job for the trainer (no-op while one runs). */
void ld_ckpt_start(ld_daemon *d);
/* The trainer wrote it (or failed): log, commit the recorded offsets, answer RPCs. */
void ld_ckpt_done(ld_daemon *d, ld_job *j);
/* Learner.Checkpoint handler. */
void ld_ckpt_h_checkpoint(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user);
/* Checkpoint keys and the checkpoint to resume (before the trainer exists). */
qrl_status ld_ckpt_configure(ld_daemon *d, const qrl_tokenizer *tok, qrl_learner_config *lc, bool *resumed,
                             char *rdir, qrl_ckpt_state *rs, qrl_error *err);
/* Restore from a checkpoint (after setup: trainer, producer, consumer exist). */
qrl_status ld_ckpt_restore(ld_daemon *d, const char *dir, const qrl_ckpt_state *s, qrl_error *err);

#endif
