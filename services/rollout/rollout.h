/* qrl-rollout internals (SPEC §1, §4, §8; STYLE 14; docs/rollout-daemon.md).
 *
 * Two threads:
 *   - the loop thread (main) runs one libuv loop: the Kafka consumer and producer (polled
 *     from a short uv_timer, never waiting), the gRPC Rollout service, signals, commits;
 *   - the engine thread owns the model and the qrl_scheduler and runs step() while work
 *     exists and it is not paused.
 * They meet in rd_engine: an input queue (loop -> engine, mutex + condvar) and an output
 * queue (engine -> loop, mutex + uv_async_t).  An rd_group travels loop -> engine ->
 * loop; only one side touches it at a time (whoever took it off a queue). */
#ifndef QRL_ROLLOUT_DAEMON_H
#define QRL_ROLLOUT_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "core/config.h"
#include "core/status.h"
#include "kafka/kafka.h"
#include "kafka/offsets.h"
#include "metrics.h"
#include "qrl.pb-c.h"
#include "rollout/scheduler.h"
#include "rpc/rpc.h"
#include "service/service.h"
#include "wire/wire.h"


/* rollout.device (choices order of the config row). */
typedef enum rd_device { RD_DEVICE_CPU = 0, RD_DEVICE_CUDA = 1 } rd_device;

/* rollout.trace_fault (choices order of the config row): test-only chunk faults on the
 * trace topic (docs/rollout-daemon.md "TRACE records"). */
typedef enum rd_trace_fault {
    RD_TRACE_FAULT_NONE = 0,
    RD_TRACE_FAULT_DROP,      /* the group's first chunk (response 0's chunk 0) is not sent */
    RD_TRACE_FAULT_DUPLICATE, /* every chunk is sent twice */
    RD_TRACE_FAULT_REORDER,   /* the group's chunks are sent in reverse order */
    RD_TRACE_FAULT_MIX,       /* all four at once */
    RD_TRACE_FAULT_NAN_SCALE, /* response 1's chunk 0: first block scale 0x7F (E4M3 NaN), CRCs
                                 recomputed: valid chunks whose record cannot guide */
} rd_trace_fault;

/* The daemon's settings: every key of main.c's config table, filled by qrl_config_bind
 * (core/config.h) and kept current by `qrlctl set` (the runtime-mutable ones).  Strings
 * are owned by the config. */
typedef struct rd_settings {
    const char *model, *tokenizer;
    const char *precision, *kv_cache;      /* enum texts: qrl_precision_parse / qrl_kv_format_parse */
    int device;                            /* rd_device */
    int cuda_device;
    double gpu_memory_utilization;
    bool enforce_eager;
    const char *cuda_tuning;               /* "name=value,..." (base/tuning.h), applied by main */
    int drain_timeout_ms;
    int kv_sink, kv_recent;
    int nccl_device, nccl_timeout_ms;
    int slots, prefill_chunk, max_staleness;
    double temperature, top_p;             /* runtime-mutable sampling defaults ... */
    int top_k, max_new_tokens;
    int max_concurrency;                   /* ... and the in-flight limit */
    const char *replica_id;
    bool emit_text;
    int threads, step_delay_ms;
    bool trace;                            /* rollout.trace: TRACE records on kafka.trace_topic */
    const char *trace_sites;               /* rollout.trace_sites (model/trace_rec.h spec) */
    int trace_fault;                       /* rd_trace_fault (tests only) */
    struct {
        const char *bootstrap, *prompts_topic, *results_topic, *dlq_topic, *group, *trace_topic;
        int session_timeout_ms, poll_ms, max_result_bytes, max_trace_bytes;
    } kafka;
    const char *rpc_listen, *rpc_token_file;
    const char *learner_addr, *learner_tls_ca, *learner_tls_cert, *learner_tls_key;
    const char *metrics_jsonl, *metrics_listen;
} rd_settings;

/* One consumed PromptGroup, from the poll to the delivery report of its result. */
typedef struct rd_group {
    struct rd_group *next;        /* link in whichever queue/list holds it */
    struct rd_group *eprev, *enext; /* engine: the list of groups inside the scheduler */
    int32_t partition;
    qrl_kafka_offset *off;        /* its entry in the commit tracker (commit-after-produce) */
    uint64_t group_id;
    Qrl__PromptGroup *pg;         /* decoded prompt, owned (qrl_wire_free) */
    uint64_t consumed_us;         /* loop clock when consumed */
    /* set by the engine */
    Qrl__GroupResult *result;     /* owned (qrl__group_result__free_unpacked) */
    bool rejected;                /* the scheduler refused it: goes to the DLQ */
    char error[512];
    /* loop: result delivery (service/service.h resends them until acknowledged) */
    qrl_wire_chunks chunks;       /* encoded result, borrowed by the service until acknowledged */
    bool to_dlq;                  /* a dead-letter record was produced instead */
    /* TRACE (rollout.trace): every response's TraceChunks in response order, encoded by the
     * engine thread; borrowed by the service until acknowledged */
    qrl_wire_chunks trace;
    uint64_t trace_record_bytes;  /* record bytes of them (bytes per token: / trace_tokens) */
    uint64_t trace_tokens;        /* response tokens they cover */
    int sets_unacked;             /* sets produced for g (trace, result) not yet acknowledged */
    bool trace_failed;            /* its TraceChunks were given up (deliver.c): the result goes without */
    bool aborted;                 /* a set was given up in a drain: prompt left uncommitted */
} rd_group;

typedef struct rd_engine_stats {
    qrl_scheduler_stats sched;
    double tokens_per_s;          /* over the last ~2 s */
    int groups_in_engine;         /* submitted and not emitted */
    double idle_s;                /* seconds the engine thread waited with nothing to decode
                                     (no work, paused, or held for new weights) */
} rd_engine_stats;

typedef struct rd_engine {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* broadcast: the engine thread and rd_engine_swap_stream wait on it */
    rd_group *in_head, *in_tail;   /* loop -> engine */
    rd_group *out_head, *out_tail; /* engine -> loop */
    rd_group *active;              /* engine thread: groups inside the scheduler */
    bool paused, stop;
    uint64_t hold_until;           /* alternate mode: no steps before this version is in (0 = none) */
    uint64_t version;              /* the version of the weights in use */
    int step_delay_ms;             /* test/debug throttle (rollout.step_delay_ms) */
    rd_engine_stats stats;         /* snapshot after each step, under mu */
    double last_step_s;            /* monotonic time of the last step's snapshot, under mu */
    qrl_model *swap_model;         /* weights to swap in at the next step boundary (owned) */
    uint64_t swap_version;
    /* a device BF16 stream to swap in (rd_engine_swap_stream), under mu */
    const struct qrl_cuda_stream_tensor *swap_t;
    size_t swap_n;
    uint64_t swap_t_version;
    int swap_t_state;              /* 0 none, 1 waiting for the engine, 2 applied, 3 refused */
    char swap_t_error[512];
    double swap_t_s;               /* the swap's seconds on the engine thread */
    uv_async_t *done_async;        /* wakes the loop for out_* */
    /* engine thread only */
    qrl_scheduler *sched;
    const qrl_model *model;
    const qrl_tokenizer *tok;
    const char *replica_id;
    bool emit_text;
    size_t trace_max_bytes;        /* kafka.max_trace_bytes with rollout.trace, else 0 (set before rd_engine_start) */
    int running_groups;
    qrl_model *owned_model;        /* the last model swapped in (the first is main's) */
    int omp_threads;               /* the loop thread's OpenMP thread count at start */
} rd_engine;

/* The scheduler's settings from the daemon's (slots, prefill chunk, staleness, KV format,
 * EOS from `model` or `tok`); with rollout.device cuda the device, eager mode, the KV pool
 * sized to rollout.gpu_memory_utilization, and device / device_name for ReplicaInfo
 * ("cpu" / "cuda:N" and the device's description).  Errors: those of
 * qrl_scheduler_config_fit_gpu, prefixed "rollout.". */
qrl_status rd_engine_config(const rd_settings *s, const qrl_model *model, const qrl_tokenizer *tok,
                            qrl_scheduler_config *sc, char *device, size_t device_size, char *device_name,
                            size_t name_size, qrl_error *err);
/* Start the engine thread over a scheduler made from `model`/`tok` (borrowed, alive
 * until rd_engine_join).  Errors: those of qrl_scheduler_new, INTERNAL (thread). */
qrl_status rd_engine_start(rd_engine *e, const qrl_model *model, const qrl_tokenizer *tok,
                           const qrl_scheduler_config *sc, const char *replica_id,
                           bool emit_text, uv_async_t *done_async, qrl_error *err);
/* Hand a group to the engine (loop thread). */
void rd_engine_submit(rd_engine *e, rd_group *g);
void rd_engine_set_paused(rd_engine *e, bool paused);
void rd_engine_set_step_delay(rd_engine *e, int ms);
/* `alternate` mode (SPEC §4.6): take no decode step until weights of version >= `version`
 * are swapped in; prompts are still admitted.  0 releases the hold (drain). */
void rd_engine_hold_until(rd_engine *e, uint64_t version);
/* Swap to `m` (ownership passes to the engine) at policy `version` between two steps. */
void rd_engine_swap(rd_engine *e, qrl_model *m, uint64_t version);
/* Whether the engine takes device streams (qrl_scheduler_takes_stream). */
bool rd_engine_takes_stream(const rd_engine *e);
/* Swap to the device BF16 stream t[n] (borrowed until this returns) at `version` at the
 * next step boundary, and wait for it (any thread but the engine's).  *swap_s: the swap's
 * seconds on the engine thread (the only pause of decoding).  Errors: those of
 * qrl_scheduler_swap_weights_stream (the old weights stay), CANCELLED (engine stopping). */
qrl_status rd_engine_swap_stream(rd_engine *e, const struct qrl_cuda_stream_tensor *t, size_t n,
                                 uint64_t version, double *swap_s, qrl_error *err);
/* Take every finished group (loop thread); returns the list (linked through next). */
rd_group *rd_engine_take_done(rd_engine *e);
void rd_engine_get_stats(rd_engine *e, rd_engine_stats *out);
/* Ask the thread to end, join it, free the scheduler. */
void rd_engine_join(rd_engine *e);

/* Free a group and whatever it owns. */
void rd_group_free(rd_group *g);

/* TRACE (trace.c): bytes of g's TraceChunk messages (each once, as encoded). */
uint64_t rd_trace_msg_bytes(const rd_group *g);
/* Add acknowledged g's chunks, bytes, record bytes and tokens to the totals *t (metrics.h). */
struct rd_metrics_trace;
void rd_trace_count(struct rd_metrics_trace *t, const rd_group *g);
/* The TRACE fields of g's metrics.jsonl line, each after a comma, and the line's end: its
 * chunks and bytes, record bytes per token, the totals' trace-topic bytes/s since
 * t->start_us and the recorder's share of e's forward time (kept in t->capture_share for
 * Prometheus; docs/rollout-daemon.md). */
void rd_trace_jsonl(FILE *f, const rd_group *g, struct rd_metrics_trace *t, rd_engine *e, uint64_t now_us);
/* Produce g's TraceChunks as one set on `topic` keyed key[klen] (payloads borrowed from
 * g->trace until acknowledged, tag g, g->sets_unacked counted), through `fault`
 * (rd_trace_fault, tests only: the learner must survive a lost, a duplicated, a reordered
 * chunk and one whose record has a NaN block scale; nan_scale re-encodes g->trace first).
 * No chunks (or all dropped): nothing is produced. */
struct qrl_service;
void rd_trace_produce(struct qrl_service *svc, const char *topic, int fault, rd_group *g, const char *key,
                      size_t klen);

/* Receive one weight version from the TCP stream at `addr` (host:port; framing in
 * weights.c) into a new model shaped like `like`: manifest checked against the model,
 * buckets and tensors checked by CRC-32C.  Blocking (weights thread).  *out owned by the
 * caller.  Errors: NETWORK/TIMEOUT, INVALID_ARGUMENT (manifest does not fit the model),
 * CORRUPT (checksum, bucket order), PARSE/UNSUPPORTED (frames), NOMEM. */
qrl_status rd_weights_receive(const char *addr, const qrl_model *like, uint64_t version,
                              qrl_model **out, qrl_error *err);

/* A stream that arrived and passed qrl_wsync_verify_stream (the NCCL transport) into a new
 * model shaped like `like`: the manifest is checked against the model as on TCP (`from`
 * names the source in errors).  Errors: INVALID_ARGUMENT (manifest does not fit), NOMEM. */
qrl_status rd_weights_from_stream(const Qrl__WeightManifest *mf, const uint8_t *stream, const qrl_model *like,
                                  uint64_t version, const char *from, qrl_model **out, qrl_error *err);

/* NCCL weight transport (rd_nccl.c): this replica's communicator, one epoch at a time. */
typedef struct rd_nccl {
    struct qrl_nccl_comm *comm;   /* NULL until the first NCCL event */
    uint64_t epoch;
    int device;                   /* CUDA device (rollout.nccl_device) */
    int timeout_ms;               /* join and receive limit (rollout.nccl_timeout_ms) */
    uint8_t *dbuf;                /* the device path's receive buffer (dcap bytes on device) */
    uint64_t dcap;
} rd_nccl;
/* Whether this replica can join an NCCL sync group (GPU and NCCL in the build): ReplicaInfo.nccl. */
bool rd_nccl_capable(void);
/* Receive the version an NCCL NEW_VERSION event announces: joins the event's epoch first when
 * it differs from the one held (the old communicator is destroyed), then receives and
 * verifies (qrl_nccl_bcast_recv) and converts like rd_weights_receive.  Weights thread.
 * Errors: those of qrl_nccl_comm_init/qrl_nccl_bcast_recv/rd_weights_from_stream, and
 * INVALID_ARGUMENT for an event without a 128-byte unique id or a rank outside the world. */
qrl_status rd_nccl_receive(rd_nccl *n, const Qrl__VersionEvent *ev, const qrl_model *like, qrl_model **out,
                           qrl_error *err);
void rd_nccl_close(rd_nccl *n);

/* Registration with the learner, heartbeats and WatchVersions (control.c): a thread of
 * blocking gRPC client calls, and a weights thread that fetches the announced versions. */
typedef struct rd_control {
    pthread_t thread;
    bool started;
    _Atomic int stop;             /* set by the loop thread; read between calls */
    char learner[256];
    char token[1025];
    bool have_token;
    Qrl__ReplicaInfo info;        /* strings borrowed from the config / daemon */
    rd_engine *engine;
    const qrl_model *model;
    uv_async_t *drain_async;      /* a SHUTDOWN event asks the loop to drain */
    const char *tls_ca, *tls_cert, *tls_key; /* learner.tls_* (NULL: plaintext), from cfg */
    qrl_rpc_client_t *client;     /* the learner's, made by rd_control_start */
    _Atomic int state;            /* Qrl__ServiceState the loop is in (for heartbeats) */
    _Atomic uint32_t max_concurrency; /* rollout.max_concurrency now (the loop copies it) */
    rd_nccl nccl;                 /* NCCL transport state (weights thread) */
    /* The weights thread (control.c): fetches what the control thread hands it, so a long
     * transfer or quantization never delays a heartbeat. */
    pthread_t weights_thread;
    pthread_mutex_t weights_mu;   /* guards the two below; weights_cv signals a new pending or the stop */
    pthread_cond_t weights_cv;
    Qrl__VersionEvent *pending;   /* newest NEW_VERSION not started yet (a copy, owned; latest wins) */
    uint64_t fetched;             /* newest version handed to the engine (a failed fetch leaves it) */
    struct rd_ipc {               /* CUDA IPC transport (rd_ipc.c; weights thread) */
        int device;               /* -1: no CUDA engine, no IPC */
        struct qrl_wipc_receiver *rx; /* made at the first IPC version */
        char node_id[160];        /* ReplicaInfo.node_id */
    } ipc;
} rd_control;
/* Make the learner client (errors: those of qrl_rpc_client_new, e.g. an unreadable
 * learner.tls_ca_file: IO) and start both threads (INTERNAL). */
qrl_status rd_control_start(rd_control *c, qrl_error *err);
/* Advertise the NCCL capability (c->info.nccl) and take rollout.nccl_* (rd_nccl.c). */
void rd_nccl_configure(rd_control *c, const rd_settings *s);
/* With rollout.device cuda: advertise this node (ReplicaInfo.node_id) so a learner here
 * sends versions by CUDA IPC (rd_ipc.c). */
void rd_ipc_configure(rd_control *c, const rd_settings *s);
/* Take a CUDA_IPC VersionEvent's version: map the learner's slot, copy and verify it on
 * this GPU, swap it into the engine (device-side; the host path for engines that cannot
 * take a stream).  *ms: wall time until swapped.  Errors: those of qrl_wipc_receive and the
 * swap; the caller falls back to TCP (ev->weight_addr). */
qrl_status rd_ipc_fetch_apply(rd_control *c, const Qrl__VersionEvent *ev, qrl_error *err);
void rd_ipc_close(rd_control *c);
/* Swap a verified device BF16 stream (manifest mf, device bytes d_stream) into the engine
 * and wait for it (rd_engine_swap_stream): the device side of CUDA IPC and NCCL.  Errors:
 * INVALID_ARGUMENT (a tensor not BF16), those of the swap (UNSUPPORTED from an engine that
 * takes host weights). */
qrl_status rd_apply_device_stream(rd_control *c, const Qrl__WeightManifest *mf, const uint8_t *d_stream,
                                  uint64_t version, double *swap_s, qrl_error *err);
/* The NCCL device path (rd_nccl.c): when the engine takes device streams and runs on the
 * NCCL device, receive straight into device memory, verify there, swap (no host copy).
 * Errors: those of qrl_nccl_bcast_recv_device and the swap. */
bool rd_nccl_device_path(const rd_control *c);
qrl_status rd_nccl_fetch_apply_device(rd_control *c, const Qrl__VersionEvent *ev, qrl_error *err);
void rd_control_stop(rd_control *c);

/* The daemon (loop.c; its delivery policy in deliver.c). */
typedef struct rd_daemon rd_daemon;
struct rd_daemon {
    qrl_service_t *svc;
    uv_async_t done_async;
    uv_async_t drain_async;     /* control thread: the learner announced SHUTDOWN */
    rd_control control;
    char control_addr[300], host[128];
    const rd_settings *s;       /* bound to cfg: the Set RPC changes both */
    qrl_config_t *cfg;
    const qrl_model *model;
    rd_engine engine;
    const char *prompts_topic, *results_topic, *dlq_topic, *trace_topic, *replica_id;
    uint64_t *live;         /* group ids in flight, n_live of them */
    int n_live, cap_live;
    int inflight;           /* consumed, not yet acknowledged */
    bool paused, draining, closing;
    uint64_t drain_deadline_ms; /* uv_now() after which a drain aborts what is left; 0 = none */
    int step_delay_ms;
    uint64_t groups_produced, dead_letters, duplicates, consumed;
    rd_metrics_trace tr;    /* acknowledged TRACE chunks, bytes, record bytes, tokens; given-up sets */
    uint64_t results_undeliverable; /* results the broker refused (dead-lettered instead) */
    uint64_t fail_logged;   /* deliver.c: (set kind, qrl_status) causes logged once, bit kind*20+st */
    char kv_format[16], precision[16];
    char device[16], device_name[160]; /* ReplicaInfo: "cpu" / "cuda:N" and its description */
    rd_metrics *prom;       /* metrics.listen; NULL when off */
    uint64_t prom_ms;
};

/* What to do with a set of g's the broker did not take (deliver.c; docs/rollout-daemon.md
 * "When the broker refuses"). */
typedef enum rd_delivery_act {
    RD_DELIVERY_RETRY = 0, /* send it again (after the shell's backoff) */
    RD_DELIVERY_SKIP,      /* give this set up; g goes on (TRACE chunks: the result goes without records) */
    RD_DELIVERY_DLQ,       /* give it up and dead-letter g's prompt with reason `why` (a result refused) */
    RD_DELIVERY_ABORT,     /* give it up and abort g: its prompt stays uncommitted (redelivered) */
} rd_delivery_act;
/* The policy for a failed set of g on `topic` (the daemon's topic pointer: results, trace
 * or dlq), last failure st/why, `fails` attempts over failing_ms (the shell's undeliverable
 * callback).  Counts and logs (once per cause) what it gives up; writes the dead-letter
 * reason into why_out[why_size] for RD_DELIVERY_DLQ. */
rd_delivery_act rd_delivery_policy(rd_daemon *d, rd_group *g, const char *topic, qrl_status st, const char *why,
                                   int fails, uint64_t failing_ms, char *why_out, size_t why_size);
/* At start: kafka.results_topic, kafka.dlq_topic and (rollout.trace) kafka.trace_topic are
 * legal names, the trace topic is none of the others, and all exist on kafka.bootstrap
 * (metadata, bounded; a broker that does not answer in time is warned about, not refused:
 * the producer keeps trying as before).  Warns when the trace topic's max.message.bytes is
 * below kafka.max_trace_bytes (those chunks are refused: their responses go without
 * records).  Errors: INVALID_ARGUMENT / NOT_FOUND naming the key and the topic. */
qrl_status rd_check_topics(const rd_settings *s, qrl_error *err);
/* Run the loop until drained; returns the process exit status.  `s` is bound to `cfg`
 * (the Set RPC changes both); all three borrowed for the call. */
int rd_daemon_run(const rd_settings *s, qrl_config_t *cfg, const qrl_model *model, const qrl_tokenizer *tok);

#endif
