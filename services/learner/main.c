/* qrl-learner: the learner daemon (SPEC §1, §5, §8, §9; docs/learner-daemon.md).
 * Dispatches PromptGroups from a JSONL dataset, trains on the GroupResults that come
 * back (decoupled PPO, common/learner/update.h), bumps the policy version and streams
 * the new weights to the registered rollout replicas.
 *
 *   qrl-learner --learner.model PATH --dataset.path FILE.jsonl [--config FILE.yaml] [--key=value ...]
 *
 * Errors at start are one line "qrl-learner: error: ..." on stderr and exit status 1. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#include "base/tuning.h"
#include "core/config.h"
#include "core/program.h"
#include "rpc/rpc.h"
#include "core/log.h"
#include "kafka/kafka.h"
#include "learner.h"
#include "settings.h"
#include "model/load.h"
#include "verify/verify.h"

/* The program's config table (STYLE 10; docs/config-qrl-learner.md via `make docs`). */
#define S_ ld_settings
static const qrl_config_entry CONFIG[] = {
    QRL_CFG_STRING("learner.model", S_, learner.model, "", false,
     "HuggingFace folder or llama2.c .bin: the initial policy (required)"),
    QRL_CFG_STRING("learner.tokenizer", S_, learner.tokenizer, "", false,
     "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"),
    QRL_CFG_INT("learner.group_size", S_, learner.group_size, "8", 1, 4096, false,
     "G: responses per prompt group"),
    QRL_CFG_INT("learner.quota", S_, learner.quota, "128", 1, 1 << 20, false,
     "T: finished groups per update"),
    QRL_CFG_INT("learner.max_updates", S_, learner.max_updates, "0", 0, 1e15, false,
     "stop after this many updates and tell the replicas to shut down (0 = run until stopped)"),
    QRL_CFG_INT("learner.seed", S_, learner.seed, "0", 0, 1e15, false,
     "dataset shuffle, sampling seed in PromptGroups, minibatch shuffle"),
    QRL_CFG_INT("learner.run_id", S_, learner.run_id, "0", 0, 1e15, false,
     "run nonce stamped on prompts (results of other runs are ignored); 0 = from the clock and pid"),
    QRL_CFG_ENUM("learner.mode", S_, learner.mode, "overlap", "overlap|alternate", false,
     "SPEC §4.6: overlap = replicas decode while the learner trains; alternate = they idle (synchronous)"),
    QRL_CFG_INT("learner.max_staleness", S_, learner.max_staleness, "1", 0, 1 << 20, false,
     "dispatch window: at most T x (1 + max_staleness) groups dispatched and not yet trained "
     "(SPEC §4.5; the replicas enforce the per-token bound)"),
    QRL_CFG_DOUBLE("learner.lr", S_, learner.lr, "1e-6", 1e-12, 1, true, "peak learning rate"),
    QRL_CFG_ENUM("learner.lr_decay", S_, learner.lr_decay, "constant", "constant|cosine", false,
     "LR schedule"),
    QRL_CFG_DOUBLE("learner.min_lr", S_, learner.min_lr, "0", 0, 1, false, "cosine floor"),
    QRL_CFG_INT("learner.warmup_steps", S_, learner.warmup_steps, "0", 0, 1e12, false,
     "linear warmup (optimizer steps)"),
    QRL_CFG_INT("learner.total_steps", S_, learner.total_steps, "1000", 1, 1e12, false,
     "cosine: steps to the floor"),
    QRL_CFG_INT("learner.ppo_epochs", S_, learner.ppo_epochs, "1", 1, 1000, false, "passes over each quota"),
    QRL_CFG_INT("learner.minibatch_seqs", S_, learner.minibatch_seqs, "0", 0, 1 << 24, false,
     "sequences per optimizer step (0 = the whole quota)"),
    QRL_CFG_INT("learner.max_tokens", S_, learner.max_tokens, "4096", 2, 1 << 24, false,
     "packed tokens per forward pass (micro-batch budget)"),
    QRL_CFG_BOOL("learner.activation_recompute", S_, learner.activation_recompute, "false", false,
     "training engine keeps only each layer's input and recomputes the layer in the backward: "
     "activations of 1 layer instead of L, for about one more forward per backward; same results "
     "(bit-identical on the cpu engine; ~1e-8 on cuda, whose gradients sum with atomics; also --mode sft)"),
    QRL_CFG_ENUM("learner.device", S_, learner.device, "cpu", "cpu|cuda", false,
     "training engine: cpu (F32 reference) or cuda (BF16 compute, F32 master weights and "
     "AdamW on the GPU; docs/train.md); RL updates only, --mode sft trains on the CPU"),
    QRL_CFG_INT("learner.cuda_device", S_, learner.cuda_device, "0", 0, 64, false,
     "GPU ordinal of the cuda training engine"),
    QRL_CFG_ENUM("learner.qat", S_, learner.qat, "none", "none|nvfp4", false,
     "quantization-aware training (SPEC §6, TRACE): nvfp4 = the policy's forward fake-quantizes weights and "
     "linear inputs to NVFP4 as a w4a4-nvfp4 rollout does, straight-through gradients (learner.device cpu or cuda)"),
    QRL_CFG_BOOL("learner.qat_kv", S_, learner.qat_kv, "false", false,
     "learner.qat nvfp4: fake-quantize K and V too (the replicas run rollout.kv_cache fp4)"),
    QRL_CFG_BOOL("learner.trace_guidance", S_, learner.trace_guidance, "true", false,
     "learner.qat nvfp4: consume kafka.trace_topic and round as the rollout's TRACE records say (false: "
     "nearest rounding everywhere, the topic is not read)"),
    QRL_CFG_INT("learner.trace_store_mb", S_, learner.trace_store_mb, "256", 1, 1 << 20, false,
     "learner.trace_guidance true: MiB of heap the TraceChunks take until their results go into an update (the "
     "response least recently added to is evicted beyond it; about 2 quotas of response tokens x the record bytes "
     "per token, plus ~0.5 KB per chunk)"),
    QRL_CFG_ENUM("learner.adv", S_, learner.adv, "grpo", "grpo|drgrpo|rloo", false, "advantage estimator"),
    QRL_CFG_BOOL("learner.dynamic_sampling", S_, learner.dynamic_sampling, "true", false,
     "drop groups whose rewards are all equal (DAPO)"),
    QRL_CFG_DOUBLE("learner.accuracy_threshold", S_, learner.accuracy_threshold, "1.0", -1e9, 1e9, false,
     "a response counts as correct when its reward >= this"),
    QRL_CFG_INT("learner.redispatch_timeout_s", S_, learner.redispatch_timeout_s, "0", 0, 1e9, false,
     "a group sent this many seconds ago with no result yet is sent again with the same id "
     "(a replica lost or dead-lettered its prompt); the first result trains, later ones are "
     "dropped as duplicates; 0 = never"),
    QRL_CFG_INT("learner.heartbeat_interval_ms", S_, learner.heartbeat_interval_ms, "1000", 50, 600000, false,
     "told to replicas at Register"),
    QRL_CFG_INT("learner.heartbeat_timeout_ms", S_, learner.heartbeat_timeout_ms, "10000", 100, 3600000, false,
     "a replica silent this long is removed"),
    QRL_CFG_ENUM("loss.mode", S_, loss.mode, "decoupled", "decoupled|prox|naive", false, "SPEC §5 loss"),
    QRL_CFG_DOUBLE("loss.eps_low", S_, loss.eps_low, "0.2", 0, 0.999999, false, "L = 1 - eps_low"),
    QRL_CFG_DOUBLE("loss.eps_high", S_, loss.eps_high, "0.28", 0, 100, false,
     "U = 1 + eps_high (before ACR)"),
    QRL_CFG_DOUBLE("loss.tis_cap", S_, loss.tis_cap, "2", 1e-6, 1e30, false, "C: TIS truncation of w"),
    QRL_CFG_BOOL("loss.acr", S_, loss.acr, "true", false, "adaptive clip range (decoupled mode)"),
    QRL_CFG_BOOL("loss.dual_clip", S_, loss.dual_clip, "false", false, "dual-clip for negative advantages"),
    QRL_CFG_DOUBLE("loss.clip_c", S_, loss.clip_c, "3", 1.000001, 1e6, false, "dual-clip constant"),
    QRL_CFG_DOUBLE("loss.beta", S_, loss.beta, "1e-3", 0, 1e6, false,
     "k3 KL to the initial policy (0 = off)"),
    QRL_CFG_ENUM("loss.agg", S_, loss.agg, "token_mean", "token_mean|seq_mean", false, "loss aggregation"),
    QRL_CFG_ENUM("loss.is_level", S_, loss.is_level, "token", "token|seq", false,
     "weight truncated at loss.tis_cap (decoupled mode): token w = exp(lp_prox - lp_behav), or seq: "
     "w_seq = exp(mean over the response of lp_prox - lp_behav), its geometric mean, on every token "
     "(seq-TIS; docs/loss.md)"),
    QRL_CFG_ENUM("loss.mis", S_, loss.mis, "none", "none|token|seq", false,
     "masked IS (decoupled mode): drop, instead of truncating, each token whose w (token: IcePop) or "
     "each sequence whose w_seq (seq: Seq-MIS, geometric mean) is outside [loss.mis_low, loss.mis_high]"),
    QRL_CFG_DOUBLE("loss.mis_low", S_, loss.mis_low, "0.5", 0, 1e30, false,
     "lower end of the kept band (included)"),
    QRL_CFG_DOUBLE("loss.mis_high", S_, loss.mis_high, "5", 0, 1e30, false,
     "upper end of the kept band (included; > loss.mis_low)"),
    QRL_CFG_DOUBLE("adamw.beta1", S_, adamw.beta1, "0.9", 0, 0.999999, false, "AdamW beta1"),
    QRL_CFG_DOUBLE("adamw.beta2", S_, adamw.beta2, "0.999", 0, 0.999999999, false, "AdamW beta2"),
    QRL_CFG_DOUBLE("adamw.eps", S_, adamw.eps, "1e-8", 1e-30, 1, false, "AdamW epsilon"),
    QRL_CFG_DOUBLE("adamw.weight_decay", S_, adamw.weight_decay, "0.01", 0, 10, false,
     "decoupled weight decay"),
    QRL_CFG_DOUBLE("adamw.max_grad_norm", S_, adamw.max_grad_norm, "1.0", 0, 1e9, false,
     "gradient clip (0 = off)"),
    QRL_CFG_STRING("dataset.path", S_, dataset.path, "", false,
     "JSONL prompts, one object per line (required; a bad line refuses the file)"),
    QRL_CFG_STRING("dataset.prompt_field", S_, dataset.prompt_field, "prompt", false, "prompt text field"),
    QRL_CFG_STRING("dataset.answer_field", S_, dataset.answer_field, "answer", false,
     "reference answer field (string or number)"),
    QRL_CFG_STRING("dataset.task", S_, dataset.task, "gsm8k", false,
     "verifier name put on every PromptGroup (qrl-verify --help lists them)"),
    QRL_CFG_ENUM("dataset.chat_template", S_, dataset.chat_template, "auto", "auto|none|plain|chatml|llama3", false,
     "prompt rendering: auto = the tokenizer's family; none = raw text with BOS"),
    QRL_CFG_DOUBLE("sampling.temperature", S_, sampling.temperature, "1.0", 0, 1e4, true,
     "put on dispatched groups"),
    QRL_CFG_DOUBLE("sampling.top_p", S_, sampling.top_p, "1.0", 1e-6, 1, true, "nucleus mass"),
    QRL_CFG_INT("sampling.top_k", S_, sampling.top_k, "0", 0, 1 << 30, true, "top-k (0 = off)"),
    QRL_CFG_INT("sampling.max_new_tokens", S_, sampling.max_new_tokens, "512", 1, 1 << 20, true,
     "response length limit"),
    QRL_CFG_LIST("sampling.stop_token_ids", S_, sampling.stop_token_ids, "", false,
     "token ids that end a response besides EOS, put on dispatched groups (at most 16; "
     "llama2.c story models: 1, their BOS)"),
    QRL_CFG_STRING("kafka.bootstrap", S_, kafka.bootstrap, "127.0.0.1:19092", false, "Kafka brokers"),
    QRL_CFG_STRING("kafka.prompts_topic", S_, kafka.prompts_topic, QRL_KAFKA_TOPIC_PROMPTS, false,
     "PromptGroups out"),
    QRL_CFG_STRING("kafka.results_topic", S_, kafka.results_topic, QRL_KAFKA_TOPIC_RESULTS, false,
     "GroupResults in"),
    QRL_CFG_STRING("kafka.dlq_topic", S_, kafka.dlq_topic, QRL_KAFKA_TOPIC_DLQ, false, "dead letters"),
    QRL_CFG_STRING("kafka.trace_topic", S_, kafka.trace_topic, QRL_KAFKA_TOPIC_TRACE, false,
     "TraceChunks in (learner.qat nvfp4 with learner.trace_guidance true)"),
    QRL_CFG_STRING("kafka.group", S_, kafka.group, "qrl-learner", false, "consumer group of the results"),
    QRL_CFG_INT("kafka.session_timeout_ms", S_, kafka.session_timeout_ms, "10000", 1000, 3600000, false,
     "group session timeout"),
    QRL_CFG_INT("kafka.poll_ms", S_, kafka.poll_ms, "5", 1, 1000, false,
     "loop timer period for Kafka polling"),
    QRL_CFG_STRING("rpc.listen", S_, rpc.listen, "127.0.0.1:0", false,
     "Learner control service (port 0 = any free; logged as rpc listening port=N)"),
    QRL_CFG_STRING("rpc.token_file", S_, rpc.token_file, "", false,
     "bearer token file; default $QRL_RPC_TOKEN_FILE / $QRL_RPC_TOKEN"),
    QRL_RPC_SERVER_TLS_CONFIG_ROWS,
    QRL_CFG_STRING("weights.listen", S_, weights.listen, "127.0.0.1:0", false,
     "TCP weight stream address (port 0 = any free; advertised in VersionEvents)"),
    QRL_CFG_ENUM("weights.transport", S_, weights.transport, "tcp", "tcp|nccl|auto", false,
     "weight broadcast: tcp stream; nccl (GPU learner, every replica with NCCL); auto = nccl when the "
     "learner has a GPU and every watching replica advertises NCCL, else tcp (docs/weight-sync.md)"),
    QRL_CFG_BOOL("weights.cuda_ipc", S_, weights.cuda_ipc, "true", false,
     "learner.device cuda: publish each version in device memory (BF16 cast and CRC-32C on the GPU) and "
     "send it to replicas on this node with a CUDA engine by CUDA IPC; others by weights.transport "
     "(docs/weight-sync.md)"),
    QRL_CFG_INT("weights.nccl_device", S_, weights.nccl_device, "0", 0, 64, false,
     "CUDA device of the learner's NCCL rank 0"),
    QRL_CFG_INT("weights.nccl_timeout_ms", S_, weights.nccl_timeout_ms, "60000", 1000, 3600000, false,
     "NCCL: limit on joining an epoch and on one broadcast; past it the version goes over TCP"),
    QRL_CFG_INT("weights.bucket_bytes", S_, weights.bucket_bytes, "1048576", 4096, 1 << 30, false,
     "bytes per CRC-32C-checked bucket of the stream"),
    QRL_CFG_INT("weights.tcp_throttle_ms", S_, weights.tcp_throttle_ms, "0", 0, 10000, false,
     "testing / fault injection only: sleep this long before each bucket of every TCP weight stream "
     "(a slow link; 0 = off)"),
    QRL_CFG_STRING("learner.checkpoint_dir", S_, learner.checkpoint_dir, "", false,
     "checkpoint root: DIR/step-NNNNNNNN/ folders + DIR/latest (empty = no checkpoints; "
     "docs/learner-daemon.md)"),
    QRL_CFG_INT("learner.checkpoint_every", S_, learner.checkpoint_every, "10", 1, 1e12, false,
     "checkpoint every N updates (also on SIGTERM/SIGINT, at max_updates and on Learner.Checkpoint)"),
    QRL_CFG_INT("learner.checkpoint_keep", S_, learner.checkpoint_keep, "2", 1, 1000000, false,
     "complete checkpoints kept (older ones are deleted)"),
    QRL_CFG_STRING("learner.resume", S_, learner.resume, "none", false,
     "none | auto (the newest complete checkpoint in checkpoint_dir, if any) | a checkpoint folder; "
     "--resume X is short for --learner.resume X"),
    QRL_CFG_DOUBLE("uaq.scale", S_, uaq.scale, "1.5", 1, 1000, false,
     "UAQ s (SPEC §3): applied once at start, training and broadcast in the scaled form; 1 = off"),
    QRL_CFG_STRING("metrics.jsonl", S_, metrics.jsonl, "", false, "append one JSON line per update"),
    QRL_CFG_STRING("metrics.listen", S_, metrics.listen, "", false,
     "Prometheus /metrics address host:port (\"\" = off; port 0 = any free, logged as metrics listening addr=...)"),
    QRL_CFG_STRING("metrics.tensorboard_dir", S_, metrics.tensorboard_dir, "", false,
     "TensorBoard event files: one event per update with the metrics.jsonl scalars (\"\" = off)"),
    QRL_CFG_INT("learner.threads", S_, learner.threads, "0", 0, 1024, false,
     "OpenMP threads (0 = all cores)"),
    QRL_CFG_STRING("learner.cuda_tuning", S_, learner.cuda_tuning, "", false,
     "learner.device cuda: kernel tuning knobs, name=value,... (docs/tuning.md); they win over the QRL_* "
     "environment variables of the same knobs (\"\" = none)"),
    /* --mode sft runs qrl-sft (docs/qrl-sft.md): the key stays so that --print-config and the
     * checkpoints' settings read as before */
    QRL_CFG_ENUM("mode", S_, mode, "rl", "rl|sft", false,
     "rl: the daemon; sft: `qrl-learner --mode sft ...` runs qrl-sft with the other arguments"),
};
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static ld_settings S; /* bound to the config (qrl_config_bind): Learner.Set writes it too */

static void learner_config(const ld_settings *s, qrl_learner_config *lc) {
    qrl_learner_config_default(lc);
    static const qrl_rl_loss_mode modes[] = {QRL_RL_LOSS_DECOUPLED, QRL_RL_LOSS_PROX, QRL_RL_LOSS_NAIVE};
    static const qrl_rl_adv_estimator advs[] = {QRL_RL_ADV_GRPO, QRL_RL_ADV_DRGRPO, QRL_RL_ADV_RLOO};
    static const qrl_rl_mis mises[] = {QRL_RL_MIS_NONE, QRL_RL_MIS_TOKEN, QRL_RL_MIS_SEQ};
    lc->loss.mode = modes[s->loss.mode];
    lc->loss.eps_low = s->loss.eps_low;
    lc->loss.eps_high = s->loss.eps_high;
    lc->loss.tis_cap = s->loss.tis_cap;
    lc->loss.acr = s->loss.acr;
    lc->loss.dual_clip = s->loss.dual_clip;
    lc->loss.clip_c = s->loss.clip_c;
    lc->loss.beta = s->loss.beta;
    lc->loss.agg = s->loss.agg == 0 ? QRL_RL_AGG_TOKEN_MEAN : QRL_RL_AGG_SEQ_MEAN;
    lc->loss.is_level = s->loss.is_level == 0 ? QRL_RL_IS_TOKEN : QRL_RL_IS_SEQ;
    lc->loss.mis = mises[s->loss.mis];
    lc->loss.mis_low = s->loss.mis_low;
    lc->loss.mis_high = s->loss.mis_high;
    lc->adv = advs[s->learner.adv];
    lc->dynamic_sampling = s->learner.dynamic_sampling;
    lc->ppo_epochs = s->learner.ppo_epochs;
    lc->minibatch_seqs = s->learner.minibatch_seqs;
    lc->max_tokens = s->learner.max_tokens;
    lc->activation_recompute = s->learner.activation_recompute;
    lc->device = s->learner.device == LD_DEVICE_CUDA ? s->learner.cuda_device : -1;
    lc->device_weights = lc->device >= 0 && s->weights.cuda_ipc;
    lc->qat = s->learner.qat == LD_QAT_NVFP4 ? QRL_QAT_NVFP4 : QRL_QAT_OFF;
    lc->qat_kv = s->learner.qat_kv;
    lc->trace_guidance = s->learner.trace_guidance;
    lc->adamw.beta1 = (float)s->adamw.beta1;
    lc->adamw.beta2 = (float)s->adamw.beta2;
    lc->adamw.eps = (float)s->adamw.eps;
    lc->adamw.weight_decay = (float)s->adamw.weight_decay;
    lc->adamw.max_grad_norm = (float)s->adamw.max_grad_norm;
    lc->lr.decay = qrl_lr_decay_parse(s->learner.lr_decay);
    lc->lr.lr = s->learner.lr;
    lc->lr.min_lr = s->learner.min_lr;
    lc->lr.warmup_steps = s->learner.warmup_steps;
    lc->lr.total_steps = s->learner.total_steps;
    lc->accuracy_threshold = (float)s->learner.accuracy_threshold;
    lc->seed = (uint64_t)s->learner.seed;
    lc->uaq_scale = (float)s->uaq.scale;
}

/* The older spellings `qrl-learner export ...` and `qrl-learner --mode sft ...` (the
 * launcher and scripts use them): run the tool beside this binary (qrl-export, qrl-sft)
 * on the other arguments, named "qrl-learner" so its messages read as they did.  Returns
 * only when argv is neither (or the tool cannot be started: die). */
static _Noreturn void redirect_die(const char *what, const char *why) {
    fprintf(stderr, "qrl-learner: error: %s: %s\n", what, why);
    exit(1);
}

static void redirect_tools(int argc, char **argv) {
    const char *tool = NULL;
    int skip = 0, at = 0;
    if (argc > 1 && strcmp(argv[1], "export") == 0) tool = "qrl-export", skip = 1, at = 1;
    for (int i = 1; !tool && i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--mode=sft") == 0) tool = "qrl-sft", skip = 1, at = i;
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc && strcmp(argv[i + 1], "sft") == 0)
            tool = "qrl-sft", skip = 2, at = i;
    }
    if (!tool) return;
    char self[4096], path[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) redirect_die("cannot find this program's folder", strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    *slash = 0;
    snprintf(path, sizeof path, "%s/%s", self, tool);
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) redirect_die(tool, "out of memory");
    int k = 0;
    av[k++] = "qrl-learner";
    for (int i = 1; i < argc; i++)
        if (i < at || i >= at + skip) av[k++] = argv[i];
    execv(path, av);
    redirect_die(path, strerror(errno));
}

static const qrl_program PROGRAM = {
    .name = "qrl-learner",
    .usage = "qrl-learner --learner.model PATH --dataset.path FILE.jsonl [--config FILE.yaml] [--key=value ...]\n"
             "qrl-learner export ...     runs qrl-export (a checkpoint as a HuggingFace folder)\n"
             "qrl-learner --mode sft ... runs qrl-sft (supervised warm start)\n"
             "The learner daemon: dataset -> Kafka prompts; Kafka results -> PPO update -> new\n"
             "version streamed to the replicas; gRPC Learner service.  SIGTERM/SIGINT stop it.\n\n",
    .table = CONFIG,
    .n = N_CONFIG,
    .settings = &S,
    /* --resume: the run's settings recorded in its checkpoint, for every key not given now */
    .resolve = ld_ckpt_restore_settings,
};

int main(int argc, char **argv) {
    redirect_tools(argc, argv);
    for (int i = 1; i < argc; i++) /* --resume X: short for --learner.resume X */
        if (strcmp(argv[i], "--resume") == 0) argv[i] = "--learner.resume";
        else if (strncmp(argv[i], "--resume=", 9) == 0) {
            static char buf[4200];
            snprintf(buf, sizeof buf, "--learner.resume=%s", argv[i] + 9);
            argv[i] = buf;
        }
    qrl_config_t *cfg;
    int rc = qrl_program_start(&PROGRAM, argc, argv, &cfg, NULL);
    if (rc != QRL_PROGRAM_RUN) return rc;
    if (S.mode == LD_RUN_SFT) /* from a --config file: argv was redirected already */
        qrl_die("mode sft: run qrl-sft (or give --mode sft on the command line)");
    if (!*S.learner.model) qrl_die("--learner.model is required (see --help)");
    if (!*S.dataset.path) qrl_die("--dataset.path is required (see --help)");
    if (!qrl_verifier_find(S.dataset.task))
        qrl_die("dataset.task: unknown verifier '%s' (qrl-verify --help lists them)", S.dataset.task);
    if (S.learner.qat_kv && S.learner.qat != LD_QAT_NVFP4)
        qrl_die("learner.qat_kv true needs learner.qat nvfp4 (it fake-quantizes K and V in the QAT forward)");
    if (S.learner.min_lr > S.learner.lr)
        qrl_die("learner.min_lr %g is above learner.lr %g (the cosine schedule's floor)", S.learner.min_lr,
                S.learner.lr);
    qrl_config_log(cfg, "learner");
    if (S.learner.threads > 0) omp_set_num_threads(S.learner.threads);

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_error err;
    if (qrl_tuning_apply(S.learner.cuda_tuning, &err) != QRL_OK)
        qrl_die("learner.cuda_tuning: %s", err.msg); /* before any kernel */
    qrl_model_load_opts lo = {.tokenizer = S.learner.tokenizer, .tokenizer_option = "--learner.tokenizer"};
    if (qrl_model_load_with_tokenizer(S.learner.model, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        qrl_die_err(&err);
    const qrl_config_list *stop = &S.sampling.stop_token_ids;
    if (stop->n > 16) qrl_die("sampling.stop_token_ids: at most 16 ids");
    for (size_t i = 0; i < stop->n; i++) {
        char *end;
        long v = strtol(stop->items[i], &end, 10);
        if (end == stop->items[i] || *end || v < 0 || v >= m->cfg.vocab_size)
            qrl_die("sampling.stop_token_ids: '%s' is not a token id in [0, %d)", stop->items[i], m->cfg.vocab_size);
    }
    qrl_learner_config lc;
    learner_config(&S, &lc);
    size_t ctx = (size_t)m->cfg.max_seq_len;
    ld_dataset ds;
    qrl_prompts_opts po = {.prompt_field = S.dataset.prompt_field, .answer_field = S.dataset.answer_field,
                           .chat_template = S.dataset.chat_template, .tok = tok, .max_tokens = ctx - 1,
                           .key_prefix = "dataset."};
    if (qrl_prompts_load(S.dataset.path, &po, &ds, &err) != QRL_OK) qrl_die_err(&err);
    QRL_LOG_INFO("learner", "model loaded path=%s vocab=%d ctx=%d layers=%d tokenizer=%s dataset=%s prompts=%zu",
                 S.learner.model, m->cfg.vocab_size, m->cfg.max_seq_len, m->cfg.n_layers, tpath, S.dataset.path,
                 ds.n);
    ld_wserver_set_throttle(S.weights.tcp_throttle_ms);
    rc = ld_daemon_run(cfg, &S, m, &ds, &lc);
    qrl_prompts_free(&ds);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return rc;
}
