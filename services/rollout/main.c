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

#include "base/tuning.h"
#include "core/config.h"
#include "core/log.h"
#include "core/program.h"
#include "rpc/rpc.h"
#include "model/kv_cache.h"
#include "model/load.h"
#include "model/model.h"
#include "model/trace_rec.h"
#include "rollout/gpu_memory.h"
#include "rollout.h"
#include "tokenizer/tokenizer.h"

/* The program's config table (STYLE 10; docs/config-qrl-rollout.md via `make docs`): each
 * row fills its field of rd_settings (rollout.h), which the daemon reads. */
#define S_ rd_settings
static const qrl_config_entry CONFIG[] = {
    QRL_CFG_STRING("rollout.model", S_, model, "", false,
                   "HuggingFace folder or llama2.c .bin (required)"),
    QRL_CFG_STRING("rollout.tokenizer", S_, tokenizer, "", false,
                   "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"),
    QRL_CFG_ENUM("rollout.precision", S_, precision, "f32",
                 "f32|bf16|w8a8-int8|w8a8-fp8|w4a16-nvfp4|w4a16-mxfp4|w4a4-nvfp4", false,
                 "weight format of the rollout engine (SPEC §3): every version the learner sends is quantized to it"),
    QRL_CFG_ENUM("rollout.kv_cache", S_, kv_cache, "f32", "f32|bf16|fp8|int8|int4|int4-protected|fp4", false,
                 "KV-cache format (SPEC §3); with rollout.device cuda, f32 runs as bf16"),
    QRL_CFG_ENUM("rollout.device", S_, device, "cpu", "cpu|cuda", false,
                 "engine: cpu (the CPU forward) or cuda (the CUDA forward: rollout.precision f32 or bf16 "
                 "(BF16 weights), w8a8-int8, w8a8-fp8, w4a16-nvfp4, w4a16-mxfp4 or w4a4-nvfp4; KV on "
                 "the GPU; decode rows sampled on the GPU with the CPU sampler's keyed draws)"),
    QRL_CFG_INT("rollout.cuda_device", S_, cuda_device, "0", 0, 64, false,
                "CUDA device ordinal of the engine with rollout.device cuda"),
    QRL_CFG_DOUBLE("rollout.gpu_memory_utilization", S_, gpu_memory_utilization, "0", 0, 1, false,
                   "rollout.device cuda: fraction of the device's total memory this replica may use "
                 "(weights, activations, KV cache; as vLLM's gpu_memory_utilization): the KV block pool is "
                 "sized to fit it (docs/rollout.md); 0 = off (a pool of rollout.slots full contexts)"),
    QRL_CFG_BOOL("rollout.enforce_eager", S_, enforce_eager, "false", false,
                 "rollout.device cuda: launch each decode step's kernels one by one instead of replaying "
                 "CUDA graphs (as vLLM's enforce_eager)"),
    QRL_CFG_STRING("rollout.cuda_tuning", S_, cuda_tuning, "", false,
                   "rollout.device cuda: kernel tuning knobs, name=value,... (docs/tuning.md); they win over "
                   "the QRL_* environment variables of the same knobs (\"\" = none)"),
    QRL_CFG_INT("rollout.drain_timeout_ms", S_, drain_timeout_ms, "0", 0, 86400000, false,
                "SIGTERM / learner SHUTDOWN drain: abort in-flight groups after this long (0 = wait for them)"),
    QRL_CFG_INT("rollout.kv_sink", S_, kv_sink, "16", 0, 1 << 20, false,
                "int4-protected: first positions (attention sinks) kept in the INT8 side cache"),
    QRL_CFG_INT("rollout.kv_recent", S_, kv_recent, "128", 0, 1 << 20, false,
                "int4-protected: most recent positions kept in the INT8 side cache"),
    QRL_CFG_INT("rollout.nccl_device", S_, nccl_device, "0", 0, 64, false,
                "CUDA device of the NCCL weight transport (used when the learner announces NCCL)"),
    QRL_CFG_INT("rollout.nccl_timeout_ms", S_, nccl_timeout_ms, "60000", 1000, 3600000, false,
                "NCCL weight transport: limit on joining an epoch and on receiving one version"),
    QRL_CFG_INT("rollout.slots", S_, slots, "16", 1, 4096, false,
                "D: concurrent sequences in the scheduler (SPEC §4)"),
    QRL_CFG_INT("rollout.prefill_chunk", S_, prefill_chunk, "256", 0, 1 << 20, false,
                "prompt tokens prefilled per step over all sequences (0 = no limit)"),
    QRL_CFG_INT("rollout.max_staleness", S_, max_staleness, "1", -1, 1 << 20, false,
                "restart a response whose oldest token is more versions behind (SPEC §4.5; -1 = no bound)"),
    QRL_CFG_DOUBLE("rollout.temperature", S_, temperature, "1.0", 0, 1e4, true,
                   "sampling temperature for PromptGroups without sampling params"),
    QRL_CFG_DOUBLE("rollout.top_p", S_, top_p, "1.0", 1e-6, 1, true,
                   "nucleus mass for PromptGroups without sampling params"),
    QRL_CFG_INT("rollout.top_k", S_, top_k, "0", 0, 1 << 30, true,
                "top-k for PromptGroups without sampling params (0 = off)"),
    QRL_CFG_INT("rollout.max_new_tokens", S_, max_new_tokens, "256", 1, 1 << 20, true,
                "response length limit for PromptGroups without sampling params"),
    QRL_CFG_INT("rollout.max_concurrency", S_, max_concurrency, "8", 1, 1 << 20, true,
                "prompt groups in flight on this replica (consumed, result not yet acknowledged)"),
    QRL_CFG_STRING("rollout.replica_id", S_, replica_id, "", false,
                   "replica name in results and status; default rollout-<host>-<pid>"),
    QRL_CFG_BOOL("rollout.emit_text", S_, emit_text, "true", false,
                 "put the decoded response text into results"),
    QRL_CFG_INT("rollout.threads", S_, threads, "0", 0, 1024, false,
                "OpenMP threads of the engine (0 = all cores)"),
    QRL_CFG_INT("rollout.step_delay_ms", S_, step_delay_ms, "0", 0, 10000, true,
                "sleep after each engine step (tests and demos: throttles a replica)"),
    QRL_CFG_BOOL("rollout.trace", S_, trace, "false", false,
                 "TRACE (SPEC §6): record each response token's FP4 quantization (block scales, code LSBs) at "
                 "the captured sites and produce it as TraceChunks on kafka.trace_topic; CPU or CUDA engine with "
                 "rollout.precision w4a4-nvfp4 and/or rollout.kv_cache fp4"),
    QRL_CFG_STRING("rollout.trace_sites", S_, trace_sites, "", false,
                   "rollout.trace: captured sites, clauses 'layers=A-B|all|deep,sites=attn_in,k,v,attn_out,"
                   "mlp_in,mlp_down' separated by ';' (\"\" = default: every linear input, K/V of the deeper "
                   "half; docs/rollout-daemon.md)"),
    QRL_CFG_ENUM("rollout.trace_fault", S_, trace_fault, "none", "none|drop|duplicate|reorder|mix|nan_scale",
                 false, "testing / fault injection only: drop each group's first TraceChunk, send every chunk "
                 "twice, reverse their order, give response 1's first record a NaN block scale with valid "
                 "CRCs (nan_scale), or all four (mix)"),
    QRL_CFG_STRING("kafka.bootstrap", S_, kafka.bootstrap, "127.0.0.1:19092", false,
                   "Kafka brokers host:port[,host:port]"),
    QRL_CFG_STRING("kafka.prompts_topic", S_, kafka.prompts_topic, QRL_KAFKA_TOPIC_PROMPTS, false,
                   "topic of PromptGroups"),
    QRL_CFG_STRING("kafka.results_topic", S_, kafka.results_topic, QRL_KAFKA_TOPIC_RESULTS, false,
                   "topic of GroupResults"),
    QRL_CFG_STRING("kafka.dlq_topic", S_, kafka.dlq_topic, QRL_KAFKA_TOPIC_DLQ, false,
                   "dead-letter topic for prompts that cannot be used"),
    QRL_CFG_STRING("kafka.trace_topic", S_, kafka.trace_topic, QRL_KAFKA_TOPIC_TRACE, false,
                   "topic of TraceChunks (rollout.trace), keyed by group id"),
    QRL_CFG_INT("kafka.max_trace_bytes", S_, kafka.max_trace_bytes, "921600", 1024, 16777216, false,
                "largest TraceChunk message: a response's records are split into chunks of at most this"),
    QRL_CFG_STRING("kafka.group", S_, kafka.group, "qrl-rollout", false,
                   "consumer group shared by the replicas"),
    QRL_CFG_INT("kafka.session_timeout_ms", S_, kafka.session_timeout_ms, "10000", 1000, 3600000, false,
                "group session timeout: a replica that dies loses its partitions after this"),
    QRL_CFG_INT("kafka.poll_ms", S_, kafka.poll_ms, "5", 1, 1000, false,
                "loop timer period for polling the consumer and the producer"),
    QRL_CFG_INT("kafka.max_result_bytes", S_, kafka.max_result_bytes, "921600", 1024, 16777216, false,
                "results larger than this are chunked (docs/wire.md)"),
    QRL_CFG_STRING("rpc.listen", S_, rpc_listen, "127.0.0.1:0", false,
                   "address of the Rollout control service (port 0 = any free; logged as rpc listening port=N)"),
    QRL_CFG_STRING("rpc.token_file", S_, rpc_token_file, "", false,
                   "bearer token file for mutating calls; default $QRL_RPC_TOKEN_FILE / $QRL_RPC_TOKEN"),
    QRL_RPC_SERVER_TLS_CONFIG_ROWS,
    QRL_CFG_STRING("learner.tls_ca_file", S_, learner_tls_ca, "", false,
                   "PEM CA of the learner's certificate: reach learner.addr over TLS"),
    QRL_CFG_STRING("learner.tls_cert_file", S_, learner_tls_cert, "", false,
                   "PEM client certificate for the learner (mutual TLS), with learner.tls_key_file"),
    QRL_CFG_STRING("learner.tls_key_file", S_, learner_tls_key, "", false,
                   "PEM key of learner.tls_cert_file"),
    QRL_CFG_STRING("learner.addr", S_, learner_addr, "", false,
                   "learner control service host:port to register with (heartbeats, weight sync); "
                 "\"\" = standalone (serve the loaded weights)"),
    QRL_CFG_STRING("metrics.jsonl", S_, metrics_jsonl, "", false,
                   "append one JSON line per produced group (optional)"),
    QRL_CFG_STRING("metrics.listen", S_, metrics_listen, "", false,
                   "Prometheus /metrics address host:port (\"\" = off; port 0 = any free, logged as metrics listening addr=...)"),
};
#undef S_
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static rd_settings S; /* bound to the config (qrl_config_bind): qrlctl set writes it too */

static const qrl_program PROGRAM = {
    .name = "qrl-rollout",
    .usage = "qrl-rollout --rollout.model PATH [--config FILE.yaml] [--key=value ...]\n"
             "The rollout daemon: Kafka prompts -> CPU/CUDA engine -> Kafka results; gRPC Rollout\n"
             "service for status, pause, resume, drain and set.  SIGTERM/SIGINT drain.\n\n",
    .table = CONFIG,
    .n = N_CONFIG,
    .settings = &S,
};

int main(int argc, char **argv) {
    qrl_config_t *cfg;
    qrl_error err;
    int rc = qrl_program_start(&PROGRAM, argc, argv, &cfg, NULL);
    if (rc != QRL_PROGRAM_RUN) return rc;
    if (!*S.model) qrl_die("--rollout.model is required (see --help)");
    char idbuf[128];
    if (!*S.replica_id) {
        char host[64] = "localhost";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        snprintf(idbuf, sizeof idbuf, "rollout-%s-%d", host, (int)getpid());
        if (qrl_config_apply(cfg, "rollout.replica_id", idbuf, "default", &err) != QRL_OK) qrl_die_err(&err);
    }
    qrl_config_log(cfg, "rollout");
    if (qrl_tuning_apply(S.cuda_tuning, &err) != QRL_OK) qrl_die("rollout.cuda_tuning: %s", err.msg); /* before any kernel */

    if (S.threads > 0) omp_set_num_threads(S.threads);
    qrl_kv_format kvf;
    if (qrl_kv_format_parse(S.kv_cache, &kvf, &err) != QRL_OK) qrl_die_err(&err);
    if (!qrl_kv_format_implemented(kvf)) qrl_die("kv cache format not implemented by the CPU engine");
    bool cuda = S.device == RD_DEVICE_CUDA;
    qrl_precision prec;
    if (qrl_precision_parse(S.precision, &prec, &err) != QRL_OK) qrl_die_err(&err);
    if (!cuda && S.gpu_memory_utilization > 0)
        qrl_die("rollout.gpu_memory_utilization applies to rollout.device cuda only (this replica "
                "runs on the CPU)");
    if (cuda) {
        /* a build without CUDA answers UNSUPPORTED before any device is looked at */
        if (qrl_rollout_gpu_check(S.cuda_device, NULL, 0, NULL, &err) == QRL_STATUS_UNSUPPORTED)
            qrl_die("rollout.device cuda: UNSUPPORTED: this build has no CUDA (nvcc was not found when it "
                    "was built)");
    }
    /* TRACE records FP4 quantizations (CPU engine: the forward's recorder; CUDA engine: the
     * device recorder, model/trace_rec_cuda.h) */
    if (S.trace && prec != QRL_PRECISION_W4A4_NVFP4 && kvf != QRL_KV_FORMAT_FP4)
        qrl_die("rollout.trace needs FP4 sites: rollout.precision w4a4-nvfp4 and/or rollout.kv_cache fp4 "
                "(got rollout.precision %s, rollout.kv_cache %s)", qrl_precision_name(prec),
                qrl_kv_format_name(kvf));
    qrl_trace_sites sites; /* checked with rollout.trace off too: a bad value is a bad value */
    if (qrl_trace_sites_parse(S.trace_sites, &sites, &err) != QRL_OK)
        qrl_die("rollout.trace_sites '%s': %s", S.trace_sites, err.msg);

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = S.tokenizer, .tokenizer_option = "--rollout.tokenizer"};
    if (qrl_model_load_with_tokenizer(S.model, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        qrl_die_err(&err);
    if (qrl_model_quantize(m, prec, &err) != QRL_OK) qrl_die_err(&err);
    if (S.trace) { /* the spec against this model: its layers, an FP4 vector among the sites */
        qrl_trace_layout *tl;
        if (qrl_trace_layout_new(&sites, &m->cfg, prec == QRL_PRECISION_W4A4_NVFP4,
                                 kvf == QRL_KV_FORMAT_FP4, &tl, &err) != QRL_OK)
            qrl_die("rollout.trace_sites '%s'%s: %s", S.trace_sites,
                    *S.trace_sites ? "" : " (the default)", err.msg);
        qrl_trace_layout_free(tl);
        char dropped[768]; /* sites asked for that are not FP4 here: said, not silently lost */
        if (qrl_trace_sites_dropped(&sites, &m->cfg, prec == QRL_PRECISION_W4A4_NVFP4, kvf == QRL_KV_FORMAT_FP4,
                                    dropped, sizeof dropped))
            QRL_LOG_WARN("rollout", "rollout.trace_sites: not recorded: %s (here rollout.precision %s, "
                         "rollout.kv_cache %s)", dropped, qrl_precision_name(prec), qrl_kv_format_name(kvf));
    }
    char dev[32];
    if (cuda) snprintf(dev, sizeof dev, "cuda:%d", S.cuda_device);
    else snprintf(dev, sizeof dev, "cpu");
    QRL_LOG_INFO("rollout", "model loaded path=%s vocab=%d ctx=%d layers=%d tokenizer=%s precision=%s kv_cache=%s "
                 "device=%s", S.model, m->cfg.vocab_size, m->cfg.max_seq_len, m->cfg.n_layers, tpath,
                 qrl_precision_name(prec), qrl_kv_format_name(kvf), dev);

    rc = rd_daemon_run(&S, cfg, m, tok);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return rc;
}
