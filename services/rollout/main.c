/* qrl-rollout: the rollout daemon (SPEC §1, §4, §8, §9; docs/rollout-daemon.md).
 * Consumes PromptGroups from Kafka, answers them with the CPU or CUDA engine
 * (rollout.device) through the partial-rollout scheduler, produces GroupResults, and commits each prompt's offset
 * only after its result is acknowledged.  Controlled through the gRPC Rollout service.
 *
 *   qrl-rollout --rollout.model PATH [--config FILE.yaml] [--key=value ...]
 *
 * Errors at start are one line "qrl-rollout: error: ..." on stderr and exit status 1. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "rpc/rpc.h"
#include "core/log.h"
#include "model/kv_cache.h"
#include "model/load.h"
#include "model/model.h"
#include "rollout.h"
#include "tokenizer/tokenizer.h"

/* The program's config table (STYLE 10; docs/config-qrl-rollout.md via `make docs`).
 * Keys read by rd_daemon_run (loop.c) as well as here. */
static const qrl_config_entry CONFIG[] = {
    {"rollout.model", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "HuggingFace folder or llama2.c .bin (required)"},
    {"rollout.tokenizer", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"},
    {"rollout.precision", QRL_CONFIG_TYPE_ENUM, "f32", 0, 0,
     "f32|bf16|w8a8-int8|w8a8-fp8|w4a16-nvfp4|w4a16-mxfp4|w4a4-nvfp4", false,
     "weight format of the rollout engine (SPEC §3): every version the learner sends is quantized to it"},
    {"rollout.kv_cache", QRL_CONFIG_TYPE_ENUM, "f32", 0, 0, "f32|bf16|fp8|int8|int4|int4-protected", false,
     "KV-cache format (SPEC §3); with rollout.device cuda, f32 runs as bf16"},
    {"rollout.device", QRL_CONFIG_TYPE_ENUM, "cpu", 0, 0, "cpu|cuda", false,
     "engine: cpu (the CPU forward) or cuda (the CUDA forward: rollout.precision f32 or bf16 "
     "(BF16 weights), w8a8-int8, w8a8-fp8, w4a16-nvfp4 or w4a16-mxfp4; KV on the GPU; decode "
     "rows sampled on the GPU with the CPU sampler's keyed draws)"},
    {"rollout.cuda_device", QRL_CONFIG_TYPE_INT, "0", 0, 64, NULL, false,
     "CUDA device ordinal of the engine with rollout.device cuda"},
    {"rollout.gpu_memory_utilization", QRL_CONFIG_TYPE_DOUBLE, "0", 0, 1, NULL, false,
     "rollout.device cuda: fraction of the device's total memory this replica may use "
     "(weights, activations, KV cache; as vLLM's gpu_memory_utilization): the KV block pool is "
     "sized to fit it (docs/rollout.md); 0 = off (a pool of rollout.slots full contexts)"},
    {"rollout.enforce_eager", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false,
     "rollout.device cuda: launch each decode step's kernels one by one instead of replaying "
     "CUDA graphs (as vLLM's enforce_eager)"},
    {"rollout.drain_timeout_ms", QRL_CONFIG_TYPE_INT, "0", 0, 86400000, NULL, false,
     "SIGTERM / learner SHUTDOWN drain: abort in-flight groups after this long (0 = wait for them)"},
    {"rollout.kv_sink", QRL_CONFIG_TYPE_INT, "16", 0, 1 << 20, NULL, false,
     "int4-protected: first positions (attention sinks) kept in the INT8 side cache"},
    {"rollout.kv_recent", QRL_CONFIG_TYPE_INT, "128", 0, 1 << 20, NULL, false,
     "int4-protected: most recent positions kept in the INT8 side cache"},
    {"rollout.nccl_device", QRL_CONFIG_TYPE_INT, "0", 0, 64, NULL, false,
     "CUDA device of the NCCL weight transport (used when the learner announces NCCL)"},
    {"rollout.nccl_timeout_ms", QRL_CONFIG_TYPE_INT, "60000", 1000, 3600000, NULL, false,
     "NCCL weight transport: limit on joining an epoch and on receiving one version"},
    {"rollout.slots", QRL_CONFIG_TYPE_INT, "16", 1, 4096, NULL, false,
     "D: concurrent sequences in the scheduler (SPEC §4)"},
    {"rollout.prefill_chunk", QRL_CONFIG_TYPE_INT, "256", 0, 1 << 20, NULL, false,
     "prompt tokens prefilled per step over all sequences (0 = no limit)"},
    {"rollout.max_staleness", QRL_CONFIG_TYPE_INT, "1", -1, 1 << 20, NULL, false,
     "restart a response whose oldest token is more versions behind (SPEC §4.5; -1 = no bound)"},
    {"rollout.temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 0, 1e4, NULL, true,
     "sampling temperature for PromptGroups without sampling params"},
    {"rollout.top_p", QRL_CONFIG_TYPE_DOUBLE, "1.0", 1e-6, 1, NULL, true,
     "nucleus mass for PromptGroups without sampling params"},
    {"rollout.top_k", QRL_CONFIG_TYPE_INT, "0", 0, 1 << 30, NULL, true,
     "top-k for PromptGroups without sampling params (0 = off)"},
    {"rollout.max_new_tokens", QRL_CONFIG_TYPE_INT, "256", 1, 1 << 20, NULL, true,
     "response length limit for PromptGroups without sampling params"},
    {"rollout.max_concurrency", QRL_CONFIG_TYPE_INT, "8", 1, 1 << 20, NULL, true,
     "prompt groups in flight on this replica (consumed, result not yet acknowledged)"},
    {"rollout.replica_id", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "replica name in results and status; default rollout-<host>-<pid>"},
    {"rollout.emit_text", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false,
     "put the decoded response text into results"},
    {"rollout.threads", QRL_CONFIG_TYPE_INT, "0", 0, 1024, NULL, false,
     "OpenMP threads of the engine (0 = all cores)"},
    {"rollout.step_delay_ms", QRL_CONFIG_TYPE_INT, "0", 0, 10000, NULL, true,
     "sleep after each engine step (tests and demos: throttles a replica)"},
    {"kafka.bootstrap", QRL_CONFIG_TYPE_STRING, "127.0.0.1:19092", 0, 0, NULL, false,
     "Kafka brokers host:port[,host:port]"},
    {"kafka.prompts_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_PROMPTS, 0, 0, NULL, false,
     "topic of PromptGroups"},
    {"kafka.results_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_RESULTS, 0, 0, NULL, false,
     "topic of GroupResults"},
    {"kafka.dlq_topic", QRL_CONFIG_TYPE_STRING, QRL_KAFKA_TOPIC_DLQ, 0, 0, NULL, false,
     "dead-letter topic for prompts that cannot be used"},
    {"kafka.group", QRL_CONFIG_TYPE_STRING, "qrl-rollout", 0, 0, NULL, false,
     "consumer group shared by the replicas"},
    {"kafka.session_timeout_ms", QRL_CONFIG_TYPE_INT, "10000", 1000, 3600000, NULL, false,
     "group session timeout: a replica that dies loses its partitions after this"},
    {"kafka.poll_ms", QRL_CONFIG_TYPE_INT, "5", 1, 1000, NULL, false,
     "loop timer period for polling the consumer and the producer"},
    {"kafka.max_result_bytes", QRL_CONFIG_TYPE_INT, "921600", 1024, 16777216, NULL, false,
     "results larger than this are chunked (docs/wire.md)"},
    {"rpc.listen", QRL_CONFIG_TYPE_STRING, "127.0.0.1:0", 0, 0, NULL, false,
     "address of the Rollout control service (port 0 = any free; logged as rpc listening port=N)"},
    {"rpc.token_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "bearer token file for mutating calls; default $QRL_RPC_TOKEN_FILE / $QRL_RPC_TOKEN"},
    QRL_RPC_SERVER_TLS_CONFIG_ROWS,
    {"learner.tls_ca_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "PEM CA of the learner's certificate: reach learner.addr over TLS"},
    {"learner.tls_cert_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "PEM client certificate for the learner (mutual TLS), with learner.tls_key_file"},
    {"learner.tls_key_file", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false, "PEM key of learner.tls_cert_file"},
    {"learner.addr", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "learner control service host:port to register with (heartbeats, weight sync); "
     "\"\" = standalone (serve the loaded weights)"},
    {"metrics.jsonl", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "append one JSON line per produced group (optional)"},
    {"metrics.listen", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "Prometheus /metrics address host:port (\"\" = off; port 0 = any free, logged as metrics listening addr=...)"},
};
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("qrl-rollout: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Default tokenizer beside a llama2.c .bin (tokenizer.bin, then tok<V>.bin) or the HF
 * folder itself; NULL when none exists. */
int main(int argc, char **argv) {
    qrl_config_t *cfg;
    qrl_config_action action;
    int npos;
    qrl_error err;
    if (qrl_config_parse_args(CONFIG, N_CONFIG, argc, argv, &cfg, &action, &npos, &err) != QRL_OK)
        die("%s", err.msg);
    if (action == QRL_CONFIG_ACTION_HELP) {
        fputs("qrl-rollout --rollout.model PATH [--config FILE.yaml] [--key=value ...]\n"
              "The rollout daemon: Kafka prompts -> CPU/CUDA engine -> Kafka results; gRPC Rollout\n"
              "service for status, pause, resume, drain and set.  SIGTERM/SIGINT drain.\n\n",
              stdout);
        qrl_config_help(CONFIG, N_CONFIG, "qrl-rollout", stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_HELP_MARKDOWN) {
        qrl_config_help_markdown(CONFIG, N_CONFIG, "qrl-rollout", stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_PRINT_CONFIG) { /* the resolved config as YAML, nothing run */
        qrl_config_write(cfg, stdout);
        qrl_config_destroy(cfg);
        return 0;
    }
    if (npos > 0) die("unexpected argument '%s' (see --help)", argv[1]);
    const char *model_path = qrl_config_get_string(cfg, "rollout.model");
    if (!*model_path) die("--rollout.model is required (see --help)");
    char idbuf[128];
    if (!*qrl_config_get_string(cfg, "rollout.replica_id")) {
        char host[64] = "localhost";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(idbuf, sizeof idbuf, "rollout-%s-%d", host, (int)getpid());
        if (qrl_config_apply(cfg, "rollout.replica_id", idbuf, "default", &err) != QRL_OK)
            die("%s", err.msg);
    }
    qrl_config_log(cfg, "rollout");

    int threads = (int)qrl_config_get_int(cfg, "rollout.threads");
    if (threads > 0) omp_set_num_threads(threads);
    qrl_kv_format kvf;
    if (qrl_kv_format_parse(qrl_config_get_string(cfg, "rollout.kv_cache"), &kvf, &err) != QRL_OK)
        die("%s", err.msg);
    if (!qrl_kv_format_implemented(kvf)) die("kv cache format not implemented by the CPU engine");
    bool cuda = strcmp(qrl_config_get_string(cfg, "rollout.device"), "cuda") == 0;
    qrl_precision prec;
    if (qrl_precision_parse(qrl_config_get_string(cfg, "rollout.precision"), &prec, &err) != QRL_OK)
        die("%s", err.msg);
    if (!cuda && qrl_config_get_double(cfg, "rollout.gpu_memory_utilization") > 0)
        die("rollout.gpu_memory_utilization applies to rollout.device cuda only (this replica "
            "runs on the CPU)");
    if (cuda) {
#ifndef QRL_HAVE_CUDA
        die("rollout.device cuda: UNSUPPORTED: this build has no CUDA (nvcc was not found when it "
            "was built)");
#endif
        /* the GPU forward has BF16, W8A8 (INT8, FP8) and W4A16 (NVFP4, MXFP4) weight GEMMs
         * (model/forward_cuda.h); w4a4-nvfp4 would run as w4a16 */
        if (prec == QRL_PRECISION_W4A4_NVFP4)
            die("rollout.precision %s with rollout.device cuda: UNSUPPORTED: the CUDA engine runs "
                "BF16, w8a8-int8, w8a8-fp8, w4a16-nvfp4 or w4a16-mxfp4 weights (use one of those "
                "or f32)", qrl_precision_name(prec));
        if (kvf == QRL_KV_FORMAT_FP4)
            die("rollout.kv_cache fp4 with rollout.device cuda: UNSUPPORTED (no CUDA kernels)");
    }

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = qrl_config_get_string(cfg, "rollout.tokenizer"),
                              .tokenizer_option = "--rollout.tokenizer"};
    if (qrl_model_load_with_tokenizer(model_path, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        die("%s", err.msg);
    if (qrl_model_quantize(m, prec, &err) != QRL_OK) die("%s", err.msg);
    char dev[32];
    if (cuda) snprintf(dev, sizeof dev, "cuda:%d", (int)qrl_config_get_int(cfg, "rollout.cuda_device"));
    else snprintf(dev, sizeof dev, "cpu");
    QRL_LOG_INFO("rollout", "model loaded path=%s vocab=%d ctx=%d layers=%d tokenizer=%s precision=%s kv_cache=%s "
                 "device=%s", model_path, m->cfg.vocab_size, m->cfg.max_seq_len, m->cfg.n_layers, tpath,
                 qrl_precision_name(prec), qrl_kv_format_name(kvf), dev);

    int rc = rd_daemon_run(cfg, m, tok);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return rc;
}
