/* Helper of tests/integration/learner_resume.sh.
 *
 *   learner_resume_harness feed --bootstrap B --prompts T --results T --vocab V
 *                          [--hold-after N --go FILE] [--bad-first K] [--ignore-first ID]
 *                          [--timeout S]
 *       A scripted replica: reads every PromptGroup of topic --prompts (a fresh consumer
 *       group, from the earliest record, in record order) and answers each one at once
 *       with a GroupResult whose content is a function of the group id only: G responses
 *       of 3 + (id + k) % 4 tokens (id * 7 + k * 3 + t) % V, behavior log-prob -1 - t/64,
 *       version 0, reward 1 when (id + k) % 3 == 0 else 0 (never all equal for G >= 3).
 *       With --hold-after N, groups above N wait until FILE exists (so the test decides
 *       when updates past N*... may start).  With --bad-first K, groups up to K are first
 *       answered with four bad results (a log-prob missing, a NaN log-prob, an id never
 *       dispatched, schema_version 99), then with the good one.  With --ignore-first ID, the
 *       first delivery of group ID gets no answer (a lost prompt: the learner must send it
 *       again).  Runs until killed or S seconds (default 120).
 *   learner_resume_harness logits --checkpoint DIR --ids 1,2,3 --out FILE.npy [--model P]
 *       The learner's policy as a checkpoint holds it: the base model (manifest's or
 *       --model) with the checkpoint's parameters, UAQ-scaled as trained; the logits of
 *       every position of the ids as float32 [n, vocab] .npy.
 *   learner_resume_harness compare A.npy B.npy --tol X
 *       Max |a - b| over two equal-shape float32 arrays; exit 1 when above X. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/npy.h"
#include "kafka/kafka.h"
#include "learner/checkpoint.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "wire/wire.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return def;
}
static _Noreturn void die(const char *what, const char *msg) {
    fprintf(stderr, "learner_resume_harness: %s: %s\n", what, msg);
    exit(2);
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* bad: 0 = the good result; 1 = response 0 has one log-prob fewer than tokens; 2 = a NaN
 * log-prob; 3 = a group id never dispatched (id + 1000000); 4 = schema_version 99. */
static void answer(qrl_kafka_producer_t *p, const char *topic, const Qrl__PromptGroup *pg, uint32_t V,
                   int bad) {
    uint32_t G = pg->group_size;
    uint64_t id = pg->group_id + (bad == 3 ? 1000000 : 0);
    Qrl__Response *rs = calloc(G, sizeof *rs), **rp = calloc(G, sizeof *rp);
    uint32_t tok[G][8];
    float lp[G][8];
    uint64_t ver[G][8];
    for (uint32_t k = 0; k < G; k++) {
        qrl__response__init(&rs[k]);
        size_t n = 3 + (id + k) % 4;
        for (size_t t = 0; t < n; t++) {
            tok[k][t] = (uint32_t)((id * 7 + k * 3 + t) % V);
            lp[k][t] = -1.0f - (float)t / 64.0f;
            ver[k][t] = 0;
        }
        rs[k].token_ids = tok[k];
        rs[k].n_token_ids = n;
        rs[k].behavior_logprobs = lp[k];
        rs[k].n_behavior_logprobs = n;
        rs[k].token_versions = ver[k];
        rs[k].n_token_versions = n;
        rs[k].finish_reason = QRL__FINISH_REASON__FINISH_REASON_LENGTH;
        rs[k].reward = (id + k) % 3 == 0 ? 1.0f : 0.0f;
        rs[k].correct = rs[k].reward > 0;
        rp[k] = &rs[k];
    }
    if (bad == 1) rs[0].n_behavior_logprobs--;
    if (bad == 2) lp[G - 1][1] = NAN;
    Qrl__GroupResult r = QRL__GROUP_RESULT__INIT;
    r.group_id = id;
    r.run_id = pg->run_id;
    r.replica_id = "feeder";
    r.group_size = G;
    r.prompt_token_ids = pg->prompt_token_ids;
    r.n_prompt_token_ids = pg->n_prompt_token_ids;
    r.responses = rp;
    r.n_responses = G;
    r.position = pg->position;
    r.dispatch_version = pg->dispatch_version;
    r.task = pg->task;
    r.chunk_count = 1;
    uint8_t *buf;
    size_t len;
    qrl_error err;
    if (qrl_wire_encode_alloc(&r.base, &buf, &len, &err) != QRL_OK) die("encode", err.msg);
    if (bad == 4) { /* field 1 (schema_version, varint) leads the encoding */
        if (len < 2 || buf[0] != 0x08 || buf[1] != 0x01) die("bad", "unexpected encoding head");
        buf[1] = 99;
    }
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = qrl_wire_group_key(id, key);
    qrl_status st;
    while ((st = qrl_kafka_producer_send(p, topic, key, klen, buf, len, NULL, &err)) == QRL_STATUS_BUSY)
        qrl_kafka_producer_poll(p, 10);
    if (st != QRL_OK) die("send", err.msg);
    if (qrl_kafka_producer_flush(p, 10000, &err) != QRL_OK) die("flush", err.msg); /* in order, now */
    free(buf), free(rs), free(rp);
}

static int feed(int argc, char **argv) {
    const char *bootstrap = arg(argc, argv, "--bootstrap", NULL), *prompts = arg(argc, argv, "--prompts", NULL);
    const char *results = arg(argc, argv, "--results", NULL), *go = arg(argc, argv, "--go", NULL);
    uint32_t V = (uint32_t)atoi(arg(argc, argv, "--vocab", "0"));
    uint64_t hold = strtoull(arg(argc, argv, "--hold-after", "0"), NULL, 10);
    uint64_t bad_first = strtoull(arg(argc, argv, "--bad-first", "0"), NULL, 10);
    uint64_t ignore = strtoull(arg(argc, argv, "--ignore-first", "0"), NULL, 10);
    double timeout = atof(arg(argc, argv, "--timeout", "120"));
    if (!bootstrap || !prompts || !results || !V) die("feed", "--bootstrap, --prompts, --results, --vocab needed");
    if (hold && !go) die("feed", "--hold-after needs --go FILE");
    qrl_error err;
    qrl_kafka_producer_opts po = {.bootstrap = bootstrap, .client_id = "feeder", .linger_ms = 1};
    qrl_kafka_producer_t *p;
    if (qrl_kafka_producer_new(&po, &p, &err) != QRL_OK) die("producer", err.msg);
    char group[64];
    snprintf(group, sizeof group, "feeder-%d-%lld", (int)getpid(), (long long)time(NULL));
    qrl_kafka_consumer_opts co = {.bootstrap = bootstrap, .group_id = group, .client_id = "feeder"};
    qrl_kafka_consumer_t *c;
    if (qrl_kafka_consumer_new(&co, &prompts, 1, &c, &err) != QRL_OK) die("consumer", err.msg);
    double end = now_s() + timeout;
    uint64_t answered = 0;
    while (now_s() < end) {
        qrl_kafka_message m = {0};
        bool got = false;
        if (qrl_kafka_consumer_poll(c, 100, &m, &got, &err) != QRL_OK || !got) continue;
        ProtobufCMessage *pm;
        if (qrl_wire_decode(&qrl__prompt_group__descriptor, m.payload, m.len, QRL_KAFKA_MAX_MESSAGE_BYTES, &pm,
                            &err) != QRL_OK)
            die("decode", err.msg);
        const Qrl__PromptGroup *pg = (const Qrl__PromptGroup *)pm;
        if (hold && pg->group_id > hold && access(go, F_OK) != 0) {
            fprintf(stderr, "feeder: holding group %" PRIu64 " until %s exists\n", pg->group_id, go);
            while (access(go, F_OK) != 0 && now_s() < end) usleep(20000);
        }
        if (ignore && pg->group_id == ignore) {
            fprintf(stderr, "feeder: ignored the first delivery of group %" PRIu64 "\n", ignore);
            ignore = 0;
            qrl_wire_free(pm);
            qrl_kafka_message_release(&m);
            continue;
        }
        if (pg->group_id <= bad_first) /* the bad variants first, then the good result */
            for (int b = 1; b <= 4; b++) answer(p, results, pg, V, b);
        answer(p, results, pg, V, 0);
        answered++;
        fprintf(stderr, "feeder: answered group %" PRIu64 " (%" PRIu64 " so far)\n", pg->group_id, answered);
        qrl_wire_free(pm);
        qrl_kafka_message_release(&m);
    }
    qrl_kafka_consumer_close(c);
    qrl_kafka_producer_destroy(p);
    return 0;
}

static int logits(int argc, char **argv) {
    const char *ck = arg(argc, argv, "--checkpoint", NULL), *ids_s = arg(argc, argv, "--ids", NULL);
    const char *out = arg(argc, argv, "--out", NULL), *model = arg(argc, argv, "--model", NULL);
    if (!ck || !ids_s || !out) die("logits", "--checkpoint, --ids, --out needed");
    char dir[QRL_CKPT_PATH_MAX];
    qrl_error err;
    qrl_ckpt_state s;
    if (qrl_ckpt_find(ck, dir, &err) != QRL_OK || qrl_ckpt_read(dir, &s, &err) != QRL_OK) die("checkpoint", err.msg);
    qrl_model *m;
    if (qrl_model_load(model ? model : s.model, &m, &err) != QRL_OK) die("model", err.msg);
    m->uaq_scale = s.uaq_scale;
    if (qrl_ckpt_load_params(dir, m, &err) != QRL_OK) die("params", err.msg);
    int32_t ids[256];
    int n = 0;
    for (const char *q = ids_s; *q && n < 256;) {
        ids[n++] = (int32_t)strtol(q, (char **)&q, 10);
        if (*q == ',') q++;
    }
    int V = m->cfg.vocab_size;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16, .n_blocks = (n + 15) / 16,
                           .max_seqs = 1, .max_seq_len = n, .format = QRL_KV_FORMAT_F32,
                           .protected_sink = 0, .protected_recent = 0};
    qrl_kv_cache *kv;
    qrl_forward *f;
    if (qrl_kv_cache_new(&d, &kv, &err) != QRL_OK) die("kv", err.msg);
    if (qrl_forward_new(m, n, n, &f, &err) != QRL_OK) die("forward", err.msg);
    float *lg = malloc((size_t)n * (size_t)V * sizeof *lg);
    int seq = 0;
    if (qrl_kv_cache_seq_new(kv, &seq, &err) != QRL_OK) die("kv seq", err.msg);
    if (qrl_forward_prefill(f, kv, seq, ids, n, lg, true, &err) != QRL_OK) die("prefill", err.msg);
    int64_t shape[2] = {n, V};
    if (qrl_npy_write_f32(out, lg, 2, shape, &err) != QRL_OK) die("npy", err.msg);
    free(lg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    qrl_model_free(m);
    qrl_ckpt_state_free(&s);
    return 0;
}

static int compare(int argc, char **argv) {
    if (argc < 4) die("compare", "A.npy B.npy --tol X");
    double tol = atof(arg(argc, argv, "--tol", "0"));
    qrl_tensor a, b;
    qrl_error err;
    if (qrl_npy_read(argv[2], &a, &err) != QRL_OK || qrl_npy_read(argv[3], &b, &err) != QRL_OK)
        die("npy", err.msg);
    if (a.dtype != QRL_DTYPE_F32 || b.dtype != QRL_DTYPE_F32 || qrl_tensor_numel(&a) != qrl_tensor_numel(&b))
        die("compare", "different dtypes or shapes");
    double mx = 0, mag = 0;
    for (int64_t i = 0; i < qrl_tensor_numel(&a); i++) {
        double x = ((float *)a.data)[i], y = ((float *)b.data)[i];
        if (!(fabs(x - y) <= mx)) mx = fabs(x - y);
        if (fabs(x) > mag) mag = fabs(x);
    }
    printf("max_abs_diff=%.3g max_abs=%.3g elements=%lld\n", mx, mag, (long long)qrl_tensor_numel(&a));
    qrl_npy_free(&a), qrl_npy_free(&b);
    return mx <= tol ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage", "feed | logits | compare (see the file comment)");
    if (strcmp(argv[1], "feed") == 0) return feed(argc, argv);
    if (strcmp(argv[1], "logits") == 0) return logits(argc, argv);
    if (strcmp(argv[1], "compare") == 0) return compare(argc, argv);
    die("usage", "feed | logits | compare");
}
