/* qrl-learner's typed settings: one field per row of main.c's config table (core/config.h
 * QRL_CFG_* rows; docs/config-qrl-learner.md).  The struct is bound to the config
 * (qrl_config_bind, by core/program.h), so every field holds its key's resolved value and
 * follows Learner.Set (qrlctl set) on the runtime-mutable keys.  Read on the loop thread
 * (the trainer gets what it needs copied into qrl_learner_config); strings and lists are
 * owned by the config. */
#ifndef QRL_LD_SETTINGS_H
#define QRL_LD_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/config.h"

typedef enum ld_learner_mode { LD_MODE_OVERLAP, LD_MODE_ALTERNATE } ld_learner_mode; /* learner.mode */
typedef enum ld_device { LD_DEVICE_CPU, LD_DEVICE_CUDA } ld_device;                   /* learner.device */
typedef enum ld_run_mode { LD_RUN_RL, LD_RUN_SFT } ld_run_mode;                       /* mode */
typedef enum ld_qat { LD_QAT_NONE, LD_QAT_NVFP4 } ld_qat;                               /* learner.qat */

typedef struct ld_settings {
    struct {
        const char *model;
        const char *tokenizer;
        int group_size;
        int quota;
        int64_t max_updates;
        int64_t seed;
        int64_t run_id;
        ld_learner_mode mode;
        int max_staleness;
        double lr;
        const char *lr_decay; /* constant|cosine: the value's text */
        double min_lr;
        int64_t warmup_steps;
        int64_t total_steps;
        int ppo_epochs;
        int minibatch_seqs;
        int max_tokens;
        bool activation_recompute;
        ld_device device;
        int cuda_device;
        int qat; /* ld_qat */
        bool qat_kv;
        bool trace_guidance;
        int trace_store_mb; /* learner.trace_store_mb: the TRACE chunk store's bound (trace.h) */
        int adv; /* index in grpo|drgrpo|rloo */
        bool dynamic_sampling;
        double accuracy_threshold;
        int redispatch_timeout_s;
        int heartbeat_interval_ms;
        int heartbeat_timeout_ms;
        const char *checkpoint_dir;
        int64_t checkpoint_every;
        int checkpoint_keep;
        const char *resume;
        int threads;
        const char *cuda_tuning; /* "name=value,..." (base/tuning.h), applied by main */
    } learner;
    struct {
        int mode; /* index in decoupled|prox|naive */
        double eps_low;
        double eps_high;
        double tis_cap;
        bool acr;
        bool dual_clip;
        double clip_c;
        double beta;
        int agg; /* index in token_mean|seq_mean */
        int is_level; /* index in token|seq */
        int mis; /* index in none|token|seq */
        double mis_low;
        double mis_high;
    } loss;
    struct {
        double beta1;
        double beta2;
        double eps;
        double weight_decay;
        double max_grad_norm;
    } adamw;
    struct {
        const char *path;
        const char *prompt_field;
        const char *answer_field;
        const char *task;
        const char *chat_template; /* auto|none|plain|chatml|llama3: the value's text */
    } dataset;
    struct {
        double temperature;
        double top_p;
        int top_k;
        int max_new_tokens;
        qrl_config_list stop_token_ids;
    } sampling;
    struct {
        const char *bootstrap;
        const char *prompts_topic;
        const char *results_topic;
        const char *dlq_topic;
        const char *trace_topic;
        const char *group;
        int session_timeout_ms;
        int poll_ms;
    } kafka;
    struct {
        const char *listen;
        const char *token_file;
    } rpc;
    struct {
        const char *listen;
        const char *transport; /* tcp|nccl|auto: the value's text */
        bool cuda_ipc;
        int nccl_device;
        int nccl_timeout_ms;
        int bucket_bytes;
        int tcp_throttle_ms;
    } weights;
    struct {
        double scale;
    } uaq;
    struct {
        const char *jsonl;
        const char *listen;
        const char *tensorboard_dir;
    } metrics;
    ld_run_mode mode;
} ld_settings;

#endif
