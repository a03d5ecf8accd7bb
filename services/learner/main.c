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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#include "core/config.h"
#include "rpc/rpc.h"
#include "core/log.h"
#include "kafka/kafka.h"
#include "learner.h"
#include "model/load.h"
#include "verify/verify.h"

/* The program's config table (STYLE 10; docs/config-qrl-learner.md via `make docs`). */
static const qrl_config_entry CONFIG[] = {
    {"learner.model", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "HuggingFace folder or llama2.c .bin: the initial policy (required)"},
    {"learner.tokenizer", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"},
    {"learner.group_size", QRL_CONFIG_TYPE_INT, "8", 1, 4096, NULL, false, "G: responses per prompt group"},
    {"learner.quota", QRL_CONFIG_TYPE_INT, "128", 1, 1 << 20, NULL, false, "T: finished groups per update"},
    {"learner.max_updates", QRL_CONFIG_TYPE_INT, "0", 0, 1e15, NULL, false,
     "stop after this many updates and tell the replicas to shut down (0 = run until stopped)"},
    {"learner.seed", QRL_CONFIG_TYPE_INT, "0", 0, 1e15, NULL, false,
     "dataset shuffle, sampling seed in PromptGroups, minibatch shuffle"},
    {"learner.run_id", QRL_CONFIG_TYPE_INT, "0", 0, 1e15, NULL, false,
     "run nonce stamped on prompts (results of other runs are ignored); 0 = from the clock and pid"},
    {"learner.mode", QRL_CONFIG_TYPE_ENUM, "overlap", 0, 0, "overlap|alternate", false,
     "SPEC §4.6: overlap = replicas decode while the learner trains; alternate = they idle (synchronous)"},
    {"learner.max_staleness", QRL_CONFIG_TYPE_INT, "1", 0, 1 << 20, NULL, false,
     "dispatch window: at most T x (1 + max_staleness) groups dispatched and not yet trained "
     "(SPEC §4.5; the replicas enforce the per-token bound)"},
    {"learner.lr", QRL_CONFIG_TYPE_DOUBLE, "1e-6", 1e-12, 1, NULL, true, "peak learning rate"},
    {"learner.lr_decay", QRL_CONFIG_TYPE_ENUM, "constant", 0, 0, "constant|cosine", false, "LR schedule"},
    {"learner.min_lr", QRL_CONFIG_TYPE_DOUBLE, "0", 0, 1, NULL, false, "cosine floor"},
    {"learner.warmup_steps", QRL_CONFIG_TYPE_INT, "0", 0, 1e12, NULL, false, "linear warmup (optimizer steps)"},
    {"learner.total_steps", QRL_CONFIG_TYPE_INT, "1000", 1, 1e12, NULL, false, "cosine: steps to the floor"},
    {"learner.ppo_epochs", QRL_CONFIG_TYPE_INT, "1", 1, 1000, NULL, false, "passes over each quota"},
    {"learner.minibatch_seqs", QRL_CONFIG_TYPE_INT, "0", 0, 1 << 24, NULL, false,
     "sequences per optimizer step (0 = the whole quota)"},
    {"learner.max_tokens", QRL_CONFIG_TYPE_INT, "4096", 2, 1 << 24, NULL, false,
     "packed tokens per forward pass (micro-batch budget)"},
    {"learner.activation_recompute", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false,
     "training engine keeps only each layer's input and recomputes the layer in the backward: "
     "activations of 1 layer instead of L, for about one more forward per backward; same results "
     "(bit-identical on the cpu engine; ~1e-8 on cuda, whose gradients sum with atomics; also --mode sft)"},
    {"learner.device", QRL_CONFIG_TYPE_ENUM, "cpu", 0, 0, "cpu|cuda", false,
     "training engine: cpu (F32 reference) or cuda (BF16 compute, F32 master weights and "
     "AdamW on the GPU; docs/train.md); RL updates only, --mode sft trains on the CPU"},
    {"learner.cuda_device", QRL_CONFIG_TYPE_INT, "0", 0, 64, NULL, false,
     "GPU ordinal of the cuda training engine"},
    {"learner.adv", QRL_CONFIG_TYPE_ENUM, "grpo", 0, 0, "grpo|drgrpo|rloo", false, "advantage estimator"},
    {"learner.dynamic_sampling", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false,
     "drop groups whose rewards are all equal (DAPO)"},
    {"learner.accuracy_threshold", QRL_CONFIG_TYPE_DOUBLE, "1.0", -1e9, 1e9, NULL, false,
     "a response counts as correct when its reward >= this"},
    {"learner.redispatch_timeout_s", QRL_CONFIG_TYPE_INT, "0", 0, 1e9, NULL, false,
     "a group sent this many seconds ago with no result yet is sent again with the same id "
     "(a replica lost or dead-lettered its prompt); the first result trains, later ones are "
     "dropped as duplicates; 0 = never"},
    {"learner.heartbeat_interval_ms", QRL_CONFIG_TYPE_INT, "1000", 50, 600000, NULL, false,
     "told to replicas at Register"},
    {"learner.heartbeat_timeout_ms", QRL_CONFIG_TYPE_INT, "10000", 100, 3600000, NULL, false,
     "a replica silent this long is removed"},
    {"loss.mode", QRL_CONFIG_TYPE_ENUM, "decoupled", 0, 0, "decoupled|prox|naive", false, "SPEC §5 loss"},
    {"loss.eps_low", QRL_CONFIG_TYPE_DOUBLE, "0.2", 0, 0.999999, NULL, false, "L = 1 - eps_low"},
    {"loss.eps_high", QRL_CONFIG_TYPE_DOUBLE, "0.28", 0, 100, NULL, false, "U = 1 + eps_high (before ACR)"},
    {"loss.tis_cap", QRL_CONFIG_TYPE_DOUBLE, "2", 1e-6, 1e30, NULL, false, "C: TIS truncation of w"},
    {"loss.acr", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false, "adaptive clip range (decoupled mode)"},
    {"loss.dual_clip", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false, "dual-clip for negative advantages"},
    {"loss.clip_c", QRL_CONFIG_TYPE_DOUBLE, "3", 1.000001, 1e6, NULL, false, "dual-clip constant"},
    {"loss.beta", QRL_CONFIG_TYPE_DOUBLE, "1e-3", 0, 1e6, NULL, false, "k3 KL to the initial policy (0 = off)"},
    {"loss.agg", QRL_CONFIG_TYPE_ENUM, "token_mean", 0, 0, "token_mean|seq_mean", false, "loss aggregation"},
    {"loss.is_level", QRL_CONFIG_TYPE_ENUM, "token", 0, 0, "token|seq", false,
     "weight truncated at loss.tis_cap (decoupled mode): token w = exp(lp_prox - lp_behav), or seq: "
     "w_seq = exp(mean over the response of lp_prox - lp_behav), its geometric mean, on every token "
     "(seq-TIS; docs/loss.md)"},
    {"loss.mis", QRL_CONFIG_TYPE_ENUM, "none", 0, 0, "none|token|seq", false,
     "masked IS (decoupled mode): drop, instead of truncating, each token whose w (token: IcePop) or "
     "each sequence whose w_seq (seq: Seq-MIS, geometric mean) is outside [loss.mis_low, loss.mis_high]"},
    {"loss.mis_low", QRL_CONFIG_TYPE_DOUBLE, "0.5", 0, 1e30, NULL, false, "lower end of the kept band (included)"},
    {"loss.mis_high", QRL_CONFIG_TYPE_DOUBLE, "5", 0, 1e30, NULL, false,
     "upper end of the kept band (included; > loss.mis_low)"},
    {"adamw.beta1", QRL_CONFIG_TYPE_DOUBLE, "0.9", 0, 0.999999, NULL, false, "AdamW beta1"},
    {"adamw.beta2", QRL_CONFIG_TYPE_DOUBLE, "0.999", 0, 0.999999999, NULL, false, "AdamW beta2"},
    {"adamw.eps", QRL_CONFIG_TYPE_DOUBLE, "1e-8", 1e-30, 1, NULL, false, "AdamW epsilon"},
    {"adamw.weight_decay", QRL_CONFIG_TYPE_DOUBLE, "0.01", 0, 10, NULL, false, "decoupled weight decay"},
    {"adamw.max_grad_norm", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 1e9, NULL, false, "gradient clip (0 = off)"},
    {"dataset.path", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "JSONL prompts, one object per line (required; a bad line refuses the file)"},
    {"dataset.prompt_field", QRL_CONFIG_TYPE_STRING, "prompt", 0, 0, NULL, false, "prompt text field"},
    {"dataset.answer_field", QRL_CONFIG_TYPE_STRING, "answer", 0, 0, NULL, false,
     "reference answer field (string or number)"},
    {"dataset.task", QRL_CONFIG_TYPE_STRING, "gsm8k", 0, 0, NULL, false,
     "verifier name put on every PromptGroup (qrl-verify --help lists them)"},
    {"dataset.chat_template", QRL_CONFIG_TYPE_ENUM, "auto", 0, 0, "auto|none|plain|chatml|llama3", false,
     "prompt rendering: auto = the tokenizer's family; none = raw text with BOS"},
    {"sampling.temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 1e4, NULL, true, "put on dispatched groups"},
    {"sampling.top_p", QRL_CONFIG_TYPE_DOUBLE, "1.0", 1e-6, 1, NULL, true, "nucleus mass"},
    {"sampling.top_k", QRL_CONFIG_TYPE_INT, "0", 0, 1 << 30, NULL, true, "top-k (0 = off)"},
    {"sampling.max_new_tokens", QRL_CONFIG_TYPE_INT, "512", 1, 1 << 20, NULL, true, "response length limit"},
    {"sampling.stop_token_ids", QRL_CONFIG_TYPE_LIST, "", 0, 0, NULL, false,
     "token ids that end a response besides EOS, put on dispatched groups (at most 16; "
     "llama2.c story models: 1, their BOS)"},
    {"kafka.bootstrap", QRL_CONFIG_TYPE_STRING, "127.0.0.1:19092", 0, 0, NULL, false, "Kafka brokers"},
    {"kafka.prompts_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_PROMPTS, 0, 0, NULL, false, "PromptGroups out"},
    {"kafka.results_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_RESULTS, 0, 0, NULL, false, "GroupResults in"},
    {"kafka.dlq_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_DLQ, 0, 0, NULL, false, "dead letters"},
    {"kafka.group", QRL_CONFIG_TYPE_STRING, "qrl-learner", 0, 0, NULL, false, "consumer group of the results"},
    {"kafka.session_timeout_ms", QRL_CONFIG_TYPE_INT, "10000", 1000, 3600000, NULL, false, "group session timeout"},
    {"kafka.poll_ms", QRL_CONFIG_TYPE_INT, "5", 1, 1000, NULL, false, "loop timer period for Kafka polling"},
    {"rpc.listen", QRL_CONFIG_TYPE_STRING, "127.0.0.1:0", 0, 0, NULL, false,
     "Learner control service (port 0 = any free; logged as rpc listening port=N)"},
    {"rpc.token_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "bearer token file; default $QRL_RPC_TOKEN_FILE / $QRL_RPC_TOKEN"},
    QRL_RPC_SERVER_TLS_CONFIG_ROWS,
    {"weights.listen", QRL_CONFIG_TYPE_STRING, "127.0.0.1:0", 0, 0, NULL, false,
     "TCP weight stream address (port 0 = any free; advertised in VersionEvents)"},
    {"weights.transport", QRL_CONFIG_TYPE_ENUM, "tcp", 0, 0, "tcp|nccl|auto", false,
     "weight broadcast: tcp stream; nccl (GPU learner, every replica with NCCL); auto = nccl when the "
     "learner has a GPU and every watching replica advertises NCCL, else tcp (docs/weight-sync.md)"},
    {"weights.cuda_ipc", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false,
     "learner.device cuda: publish each version in device memory (BF16 cast and CRC-32C on the GPU) and "
     "send it to replicas on this node with a CUDA engine by CUDA IPC; others by weights.transport "
     "(docs/weight-sync.md)"},
    {"weights.nccl_device", QRL_CONFIG_TYPE_INT, "0", 0, 64, NULL, false,
     "CUDA device of the learner's NCCL rank 0"},
    {"weights.nccl_timeout_ms", QRL_CONFIG_TYPE_INT, "60000", 1000, 3600000, NULL, false,
     "NCCL: limit on joining an epoch and on one broadcast; past it the version goes over TCP"},
    {"weights.bucket_bytes", QRL_CONFIG_TYPE_INT, "1048576", 4096, 1 << 30, NULL, false,
     "bytes per CRC-32C-checked bucket of the stream"},
    {"weights.tcp_throttle_ms", QRL_CONFIG_TYPE_INT, "0", 0, 10000, NULL, false,
     "testing / fault injection only: sleep this long before each bucket of every TCP weight stream "
     "(a slow link; 0 = off)"},
    {"learner.checkpoint_dir", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "checkpoint root: DIR/step-NNNNNNNN/ folders + DIR/latest (empty = no checkpoints; "
     "docs/learner-daemon.md)"},
    {"learner.checkpoint_every", QRL_CONFIG_TYPE_INT, "10", 1, 1e12, NULL, false,
     "checkpoint every N updates (also on SIGTERM/SIGINT, at max_updates and on Learner.Checkpoint)"},
    {"learner.checkpoint_keep", QRL_CONFIG_TYPE_INT, "2", 1, 1000000, NULL, false,
     "complete checkpoints kept (older ones are deleted)"},
    {"learner.resume", QRL_CONFIG_TYPE_STRING, "none", 0, 0, NULL, false,
     "none | auto (the newest complete checkpoint in checkpoint_dir, if any) | a checkpoint folder; "
     "--resume X is short for --learner.resume X"},
    {"uaq.scale", QRL_CONFIG_TYPE_DOUBLE, "1.5", 1, 1000, NULL, false,
     "UAQ s (SPEC §3): applied once at start, training and broadcast in the scaled form; 1 = off"},
    {"metrics.jsonl", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false, "append one JSON line per update"},
    {"metrics.listen", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "Prometheus /metrics address host:port (\"\" = off; port 0 = any free, logged as metrics listening addr=...)"},
    {"metrics.tensorboard_dir", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "TensorBoard event files: one event per update with the metrics.jsonl scalars (\"\" = off)"},
    {"learner.threads", QRL_CONFIG_TYPE_INT, "0", 0, 1024, NULL, false, "OpenMP threads (0 = all cores)"},
    /* --mode sft runs qrl-sft (docs/qrl-sft.md): the key stays so that --print-config and the
     * checkpoints' settings read as before */
    {"mode", QRL_CONFIG_TYPE_ENUM, "rl", 0, 0, "rl|sft", false,
     "rl: the daemon; sft: `qrl-learner --mode sft ...` runs qrl-sft with the other arguments"},
};
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("qrl-learner: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void learner_config(const qrl_config_t *cfg, qrl_learner_config *lc) {
    qrl_learner_config_default(lc);
    static const qrl_rl_loss_mode modes[] = {QRL_RL_LOSS_DECOUPLED, QRL_RL_LOSS_PROX, QRL_RL_LOSS_NAIVE};
    static const qrl_rl_adv_estimator advs[] = {QRL_RL_ADV_GRPO, QRL_RL_ADV_DRGRPO, QRL_RL_ADV_RLOO};
    lc->loss.mode = modes[qrl_config_get_enum(cfg, "loss.mode")];
    lc->loss.eps_low = qrl_config_get_double(cfg, "loss.eps_low");
    lc->loss.eps_high = qrl_config_get_double(cfg, "loss.eps_high");
    lc->loss.tis_cap = qrl_config_get_double(cfg, "loss.tis_cap");
    lc->loss.acr = qrl_config_get_bool(cfg, "loss.acr");
    lc->loss.dual_clip = qrl_config_get_bool(cfg, "loss.dual_clip");
    lc->loss.clip_c = qrl_config_get_double(cfg, "loss.clip_c");
    lc->loss.beta = qrl_config_get_double(cfg, "loss.beta");
    lc->loss.agg = qrl_config_get_enum(cfg, "loss.agg") == 0 ? QRL_RL_AGG_TOKEN_MEAN : QRL_RL_AGG_SEQ_MEAN;
    static const qrl_rl_mis mises[] = {QRL_RL_MIS_NONE, QRL_RL_MIS_TOKEN, QRL_RL_MIS_SEQ};
    lc->loss.is_level = qrl_config_get_enum(cfg, "loss.is_level") == 0 ? QRL_RL_IS_TOKEN : QRL_RL_IS_SEQ;
    lc->loss.mis = mises[qrl_config_get_enum(cfg, "loss.mis")];
    lc->loss.mis_low = qrl_config_get_double(cfg, "loss.mis_low");
    lc->loss.mis_high = qrl_config_get_double(cfg, "loss.mis_high");
    lc->adv = advs[qrl_config_get_enum(cfg, "learner.adv")];
    lc->dynamic_sampling = qrl_config_get_bool(cfg, "learner.dynamic_sampling");
    lc->ppo_epochs = (int)qrl_config_get_int(cfg, "learner.ppo_epochs");
    lc->minibatch_seqs = (int)qrl_config_get_int(cfg, "learner.minibatch_seqs");
    lc->max_tokens = (int)qrl_config_get_int(cfg, "learner.max_tokens");
    lc->activation_recompute = qrl_config_get_bool(cfg, "learner.activation_recompute");
    lc->device = qrl_config_get_enum(cfg, "learner.device") == 1
                     ? (int)qrl_config_get_int(cfg, "learner.cuda_device") : -1;
    lc->device_weights = lc->device >= 0 && qrl_config_get_bool(cfg, "weights.cuda_ipc");
    lc->adamw.beta1 = (float)qrl_config_get_double(cfg, "adamw.beta1");
    lc->adamw.beta2 = (float)qrl_config_get_double(cfg, "adamw.beta2");
    lc->adamw.eps = (float)qrl_config_get_double(cfg, "adamw.eps");
    lc->adamw.weight_decay = (float)qrl_config_get_double(cfg, "adamw.weight_decay");
    lc->adamw.max_grad_norm = (float)qrl_config_get_double(cfg, "adamw.max_grad_norm");
    lc->lr.decay = qrl_lr_decay_parse(qrl_config_get_string(cfg, "learner.lr_decay"));
    lc->lr.lr = qrl_config_get_double(cfg, "learner.lr");
    lc->lr.min_lr = qrl_config_get_double(cfg, "learner.min_lr");
    lc->lr.warmup_steps = qrl_config_get_int(cfg, "learner.warmup_steps");
    lc->lr.total_steps = qrl_config_get_int(cfg, "learner.total_steps");
    lc->accuracy_threshold = (float)qrl_config_get_double(cfg, "learner.accuracy_threshold");
    lc->seed = (uint64_t)qrl_config_get_int(cfg, "learner.seed");
    lc->uaq_scale = (float)qrl_config_get_double(cfg, "uaq.scale");
}

/* The older spellings `qrl-learner export ...` and `qrl-learner --mode sft ...` (the
 * launcher and scripts use them): run the tool beside this binary (qrl-export, qrl-sft)
 * on the other arguments, named "qrl-learner" so its messages read as they did.  Returns
 * only when argv is neither (or the tool cannot be started: die). */
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
    if (n <= 0) die("cannot find this program's folder to run %s: %s", tool, strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    *slash = 0;
    snprintf(path, sizeof path, "%s/%s", self, tool);
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) die("out of memory");
    int k = 0;
    av[k++] = "qrl-learner";
    for (int i = 1; i < argc; i++)
        if (i < at || i >= at + skip) av[k++] = argv[i];
    execv(path, av);
    die("cannot run %s: %s", path, strerror(errno));
}

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
    qrl_config_action action;
    int npos;
    qrl_error err;
    if (qrl_config_parse_args(CONFIG, N_CONFIG, argc, argv, &cfg, &action, &npos, &err) != QRL_OK)
        die("%s", err.msg);
    if (action == QRL_CONFIG_ACTION_HELP) {
        fputs("qrl-learner --learner.model PATH --dataset.path FILE.jsonl [--config FILE.yaml] [--key=value ...]\n"
              "qrl-learner export ...     runs qrl-export (a checkpoint as a HuggingFace folder)\n"
              "qrl-learner --mode sft ... runs qrl-sft (supervised warm start)\n"
              "The learner daemon: dataset -> Kafka prompts; Kafka results -> PPO update -> new\n"
              "version streamed to the replicas; gRPC Learner service.  SIGTERM/SIGINT stop it.\n\n",
              stdout);
        qrl_config_help(CONFIG, N_CONFIG, "qrl-learner", stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_HELP_MARKDOWN) {
        qrl_config_help_markdown(CONFIG, N_CONFIG, "qrl-learner", stdout);
        return 0;
    }
    /* --resume: the run's settings recorded in its checkpoint, for every key not given now */
    if (ld_ckpt_restore_settings(cfg, &err) != QRL_OK) die("%s", err.msg);
    if (action == QRL_CONFIG_ACTION_PRINT_CONFIG) { /* the resolved config as YAML, nothing run */
        qrl_config_write(cfg, stdout);
        qrl_config_destroy(cfg);
        return 0;
    }
    if (npos > 0) die("unexpected argument '%s' (see --help)", argv[1]);
    if (qrl_config_get_enum(cfg, "mode") == 1) /* from a --config file: argv was redirected already */
        die("mode sft: run qrl-sft (or give --mode sft on the command line)");
    const char *model_path = qrl_config_get_string(cfg, "learner.model");
    const char *ds_path = qrl_config_get_string(cfg, "dataset.path");
    if (!*model_path) die("--learner.model is required (see --help)");
    if (!*ds_path) die("--dataset.path is required (see --help)");
    if (!qrl_verifier_find(qrl_config_get_string(cfg, "dataset.task")))
        die("dataset.task: unknown verifier '%s' (qrl-verify --help lists them)",
            qrl_config_get_string(cfg, "dataset.task"));
    qrl_config_log(cfg, "learner");
    int threads = (int)qrl_config_get_int(cfg, "learner.threads");
    if (threads > 0) omp_set_num_threads(threads);

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = qrl_config_get_string(cfg, "learner.tokenizer"),
                              .tokenizer_option = "--learner.tokenizer"};
    if (qrl_model_load_with_tokenizer(model_path, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        die("%s", err.msg);
    size_t n_stop;
    const char *const *stop = qrl_config_get_list(cfg, "sampling.stop_token_ids", &n_stop);
    if (n_stop > 16) die("sampling.stop_token_ids: at most 16 ids");
    for (size_t i = 0; i < n_stop; i++) {
        char *end;
        long v = strtol(stop[i], &end, 10);
        if (end == stop[i] || *end || v < 0 || v >= m->cfg.vocab_size)
            die("sampling.stop_token_ids: '%s' is not a token id in [0, %d)", stop[i], m->cfg.vocab_size);
    }
    qrl_learner_config lc;
    learner_config(cfg, &lc);
    size_t ctx = (size_t)m->cfg.max_seq_len;
    ld_dataset ds;
    if (ld_dataset_load(ds_path, qrl_config_get_string(cfg, "dataset.prompt_field"),
                        qrl_config_get_string(cfg, "dataset.answer_field"),
                        qrl_config_get_string(cfg, "dataset.chat_template"), tok,
                        ctx - 1, &ds, &err) != QRL_OK)
        die("%s", err.msg);
    QRL_LOG_INFO("learner", "model loaded path=%s vocab=%d ctx=%d layers=%d tokenizer=%s dataset=%s prompts=%zu",
                 model_path, m->cfg.vocab_size, m->cfg.max_seq_len, m->cfg.n_layers, tpath, ds_path, ds.n);
    ld_wserver_set_throttle((int)qrl_config_get_int(cfg, "weights.tcp_throttle_ms"));
    int rc = ld_daemon_run(cfg, m, &ds, &lc);
    ld_dataset_free(&ds);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return rc;
}
