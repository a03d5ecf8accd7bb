/* Producer / consumer / control helper of tests/integration/rollout_daemon.sh.
 *
 *   rollout_harness produce --bootstrap B [--topic T] --first-id K --groups N
 *                   [--group-size G] [--max-new-tokens M] [--tokenizer tok512.bin]
 *                   [--garbage] [--too-long CTX] [--run-id R]
 *       N PromptGroups with ids K..K+N-1 (prompt text "Once upon a time ..." tokenized
 *       with the tokenizer, or raw ids without one), then optionally one garbage record
 *       and one PromptGroup (id K+N) whose prompt has CTX tokens.  Waits for delivery.
 *   rollout_harness consume --bootstrap B --expect N [--expect-dlq D] [--timeout S]
 *                   [--results-topic T] [--dlq-topic T] [--group-size G]
 *       Reads the results and DLQ topics from the beginning (a fresh consumer group)
 *       until N distinct group ids and D dead letters are seen or S seconds pass (then a
 *       few more seconds to catch duplicates), and prints a JSON summary on stdout.
 *       With --version-from ID --version V, every token of groups with id >= ID must
 *       carry policy version V ("version_mismatch" counts the responses that do not).
 *       Exit 0 when the expectations hold and every result validates, else 1.
 *   rollout_harness rpc --addr HOST:PORT [--token-file F] status|drain|pause|resume|set K V
 *       Calls the replica's Rollout service; prints the reply as JSON. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kafka/kafka.h"
#include "rpc/rpc.h"
#include "tokenizer/tokenizer.h"
#include "wire/wire.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return def;
}
static bool flag(int argc, char **argv, const char *name) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return true;
    return false;
}
static _Noreturn void die(const char *msg) {
    fprintf(stderr, "rollout_harness: %s\n", msg);
    exit(2);
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *STORIES[] = {
    "Once upon a time, there was a little girl named Lily.",
    "One day, a big dog went to the park.",
    "Tom had a red ball. He liked to play",
    "The sun was hot and the cat was sleepy.",
    "Sue and Ben went to the store to buy",
};

static int produce(int argc, char **argv) {
    const char *bootstrap = arg(argc, argv, "--bootstrap", NULL);
    if (!bootstrap) die("produce needs --bootstrap");
    const char *topic = arg(argc, argv, "--topic", QRL_KAFKA_TOPIC_PROMPTS);
    uint64_t first = strtoull(arg(argc, argv, "--first-id", "1"), NULL, 10);
    int n = atoi(arg(argc, argv, "--groups", "4"));
    uint32_t G = (uint32_t)atoi(arg(argc, argv, "--group-size", "4"));
    uint32_t max_new = (uint32_t)atoi(arg(argc, argv, "--max-new-tokens", "16"));
    int too_long = atoi(arg(argc, argv, "--too-long", "0"));
    const char *tokp = arg(argc, argv, "--tokenizer", NULL);
    qrl_error err;
    qrl_tokenizer *tok = NULL;
    if (tokp && qrl_tokenizer_load(tokp, 512, &tok, &err) != QRL_OK) die(err.msg);
    qrl_kafka_producer_opts po = {.bootstrap = bootstrap, .client_id = "rollout-harness"};
    qrl_kafka_producer_t *p;
    if (qrl_kafka_producer_new(&po, &p, &err) != QRL_OK) die(err.msg);
    for (int i = 0; i <= n; i++) {
        if (i == n && !too_long) break;
        Qrl__SamplingParams sp = QRL__SAMPLING_PARAMS__INIT;
        sp.temperature = 1.0f;
        sp.top_p = 0.95f;
        sp.max_new_tokens = max_new;
        sp.seed = 1234;
        Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
        pg.group_id = first + (uint64_t)i;
        pg.run_id = strtoull(arg(argc, argv, "--run-id", "7"), NULL, 10);
        pg.group_size = G;
        pg.sampling = &sp;
        pg.dispatch_version = 0;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (i == n) { /* too long: raw ids */
            n_ids = (size_t)too_long;
            ids = malloc(n_ids * sizeof *ids);
            for (size_t k = 0; k < n_ids; k++) ids[k] = (int32_t)(100 + k % 300);
        } else if (tok) {
            const char *text = STORIES[i % 5];
            if (qrl_tokenizer_encode(tok, text, strlen(text), true, true, &ids, &n_ids, &err) != QRL_OK)
                die(err.msg);
            pg.prompt_text = (char *)text;
        } else {
            n_ids = 8;
            ids = malloc(n_ids * sizeof *ids);
            for (size_t k = 0; k < n_ids; k++) ids[k] = (int32_t)(1 + (i * 7 + (int)k) % 400);
        }
        uint32_t *u = malloc(n_ids * sizeof *u);
        for (size_t k = 0; k < n_ids; k++) u[k] = (uint32_t)ids[k];
        pg.prompt_token_ids = u;
        pg.n_prompt_token_ids = n_ids;
        uint8_t *buf;
        size_t len;
        if (qrl_wire_encode_alloc(&pg.base, &buf, &len, &err) != QRL_OK) die(err.msg);
        char key[QRL_WIRE_KEY_MAX];
        size_t kl = qrl_wire_group_key(pg.group_id, key);
        while (qrl_kafka_producer_send(p, topic, key, kl, buf, len, NULL, &err) == QRL_STATUS_BUSY)
            qrl_kafka_producer_poll(p, 50);
        free(buf);
        free(u);
        free(ids);
    }
    if (flag(argc, argv, "--garbage")) {
        static const char junk[] = "\xff\xff\xff\x0fnot a PromptGroup";
        if (qrl_kafka_producer_send(p, topic, "junk", 4, junk, sizeof junk - 1, NULL, &err) != QRL_OK)
            die(err.msg);
    }
    qrl_status st = qrl_kafka_producer_flush(p, 30000, &err);
    qrl_kafka_producer_destroy(p);
    qrl_tokenizer_free(tok);
    if (st != QRL_OK) die(err.msg);
    fprintf(stderr, "rollout_harness: produced %d groups%s%s to %s\n", n,
            too_long ? " + 1 too long" : "", flag(argc, argv, "--garbage") ? " + garbage" : "",
            topic);
    return 0;
}

typedef struct seen {
    uint64_t id;
    int count;
} seen;

static int consume(int argc, char **argv) {
    const char *bootstrap = arg(argc, argv, "--bootstrap", NULL);
    if (!bootstrap) die("consume needs --bootstrap");
    const char *results = arg(argc, argv, "--results-topic", QRL_KAFKA_TOPIC_RESULTS);
    const char *dlq = arg(argc, argv, "--dlq-topic", QRL_KAFKA_TOPIC_DLQ);
    int expect = atoi(arg(argc, argv, "--expect", "0"));
    int expect_dlq = atoi(arg(argc, argv, "--expect-dlq", "0"));
    double timeout = atof(arg(argc, argv, "--timeout", "60"));
    uint32_t G = (uint32_t)atoi(arg(argc, argv, "--group-size", "0"));
    uint64_t version_from = strtoull(arg(argc, argv, "--version-from", "0"), NULL, 10);
    uint64_t want_version = strtoull(arg(argc, argv, "--version", "0"), NULL, 10);
    size_t version_mismatch = 0, version_checked = 0;
    char group[64];
    snprintf(group, sizeof group, "rollout-harness-%d-%ld", (int)getpid(), (long)time(NULL));
    const char *topics[2] = {results, dlq};
    qrl_kafka_consumer_opts co = {.bootstrap = bootstrap, .group_id = group};
    qrl_kafka_consumer_t *c;
    qrl_error err;
    if (qrl_kafka_consumer_new(&co, topics, 2, &c, &err) != QRL_OK) die(err.msg);

    seen *ids = NULL;
    size_t n_ids = 0, raw = 0, bad = 0, chunks = 0, dlq_n = 0, responses = 0;
    json_t *errors = json_array(), *dlq_errors = json_array(), *finish = json_object();
    json_t *replicas = json_object(), *lengths = json_array();
    bool lengths_equal = true;
    double t0 = now_s(), done_at = 0;
    while (now_s() - t0 < timeout) {
        if (!done_at && (int)n_ids >= expect && (int)dlq_n >= expect_dlq) done_at = now_s();
        if (done_at && now_s() - done_at > 2.0) break; /* linger to catch duplicates */
        qrl_kafka_message m = {0};
        bool got = false;
        if (qrl_kafka_consumer_poll(c, 200, &m, &got, &err) != QRL_OK || !got) continue;
        if (strcmp(m.topic, dlq) == 0) {
            dlq_n++;
            json_error_t je;
            json_t *j = json_loadb(m.payload, m.len, 0, &je);
            json_t *e = j ? json_object_get(j, "error") : NULL;
            json_array_append_new(dlq_errors, json_string(e ? json_string_value(e) : "?"));
            json_decref(j);
            qrl_kafka_message_release(&m);
            continue;
        }
        raw++;
        ProtobufCMessage *pm = NULL;
        if (qrl_wire_decode(&qrl__group_result__descriptor, m.payload, m.len, 0, &pm, &err) != QRL_OK) {
            bad++;
            json_array_append_new(errors, json_string(err.msg));
            qrl_kafka_message_release(&m);
            continue;
        }
        Qrl__GroupResult *r = (Qrl__GroupResult *)pm;
        if (r->chunk_count > 1) chunks++; /* not expected with these sizes */
        uint32_t expected_g = r->prompt_token_ids && r->n_prompt_token_ids > 0 ? G : 0;
        if (qrl_wire_group_result_validate(r, expected_g, 512, &err) != QRL_OK) {
            bad++;
            json_array_append_new(errors, json_string(err.msg));
        }
        size_t k = 0;
        while (k < n_ids && ids[k].id != r->group_id) k++;
        if (k == n_ids) {
            ids = realloc(ids, (n_ids + 1) * sizeof *ids);
            ids[n_ids++] = (seen){r->group_id, 0};
        }
        ids[k].count++;
        json_object_set_new(replicas, r->replica_id,
                            json_integer(json_integer_value(json_object_get(replicas, r->replica_id)) + 1));
        for (size_t i = 0; i < r->n_responses; i++) {
            const Qrl__Response *x = r->responses[i];
            responses++;
            if (x->n_token_ids != x->n_behavior_logprobs || x->n_token_ids != x->n_token_versions)
                lengths_equal = false;
            if (version_from && r->group_id >= version_from) {
                version_checked++;
                for (size_t k = 0; k < x->n_token_versions; k++)
                    if (x->token_versions[k] != want_version) {
                        version_mismatch++;
                        break;
                    }
            }
            const char *fr = x->finish_reason == 1 ? "eos" : x->finish_reason == 2 ? "stop"
                           : x->finish_reason == 3 ? "length" : x->finish_reason == 4 ? "prompt_too_long"
                           : x->finish_reason == 5 ? "aborted" : "unspecified";
            json_object_set_new(finish, fr, json_integer(json_integer_value(json_object_get(finish, fr)) + 1));
            if (json_array_size(lengths) < 8)
                json_array_append_new(lengths, json_pack("{sI sI sI sI}", "group", (json_int_t)r->group_id,
                                                         "tokens", (json_int_t)x->n_token_ids,
                                                         "logprobs", (json_int_t)x->n_behavior_logprobs,
                                                         "versions", (json_int_t)x->n_token_versions));
        }
        qrl_wire_free(pm);
        qrl_kafka_message_release(&m);
    }
    qrl_kafka_consumer_close(c);
    json_t *jids = json_array(), *dups = json_array();
    for (size_t i = 0; i < n_ids; i++) {
        json_array_append_new(jids, json_integer((json_int_t)ids[i].id));
        if (ids[i].count > 1) json_array_append_new(dups, json_integer((json_int_t)ids[i].id));
    }
    bool ok = (int)n_ids == expect && (int)dlq_n >= expect_dlq && bad == 0 && lengths_equal &&
              version_mismatch == 0;
    json_t *out = json_pack("{sb sI sI sI so so sI sI sI so so so so so sb}", "ok", ok,
                            "distinct", (json_int_t)n_ids, "raw_results", (json_int_t)raw,
                            "duplicates", (json_int_t)(raw - n_ids), "duplicate_ids", dups,
                            "group_ids", jids, "responses", (json_int_t)responses,
                            "invalid", (json_int_t)bad, "dlq", (json_int_t)dlq_n, "dlq_errors",
                            dlq_errors, "finish", finish, "by_replica", replicas, "invalid_errors",
                            errors, "response_lengths", lengths, "lengths_equal", lengths_equal);
    json_object_set_new(out, "version_checked", json_integer((json_int_t)version_checked));
    json_object_set_new(out, "version_mismatch", json_integer((json_int_t)version_mismatch));
    char *s = json_dumps(out, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(out);
    free(ids);
    (void)chunks;
    return ok ? 0 : 1;
}

static int rpc(int argc, char **argv) {
    const char *addr = arg(argc, argv, "--addr", NULL);
    const char *cmd = argc > 2 ? argv[argc - 1] : "";
    bool is_set = argc >= 5 && strcmp(argv[argc - 3], "set") == 0;
    if (!addr) die("rpc needs --addr");
    qrl_error err;
    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have = false;
    if (qrl_rpc_token_resolve(arg(argc, argv, "--token-file", NULL), token, &have, &err) != QRL_OK)
        die(err.msg);
    qrl_rpc_client_opts o = {.target = addr, .token = have ? token : NULL};
    qrl_rpc_client_t *c;
    if (qrl_rpc_client_new(&o, &c, &err) != QRL_OK) die(err.msg);
    ProtobufCMessage *resp = NULL;
    qrl_status st;
    if (is_set) {
        Qrl__SetRequest r = QRL__SET_REQUEST__INIT;
        r.key = argv[argc - 2];
        r.value = argv[argc - 1];
        st = qrl_rpc_client_call(c, QRL_RPC_ROLLOUT_SET, &r.base, 5000, &resp, &err);
    } else if (strcmp(cmd, "status") == 0) {
        Qrl__StatusRequest r = QRL__STATUS_REQUEST__INIT;
        st = qrl_rpc_client_call(c, QRL_RPC_ROLLOUT_STATUS, &r.base, 5000, &resp, &err);
    } else if (strcmp(cmd, "drain") == 0) {
        Qrl__DrainRequest r = QRL__DRAIN_REQUEST__INIT;
        st = qrl_rpc_client_call(c, QRL_RPC_ROLLOUT_DRAIN, &r.base, 5000, &resp, &err);
    } else if (strcmp(cmd, "pause") == 0 || strcmp(cmd, "resume") == 0) {
        Qrl__PauseRequest r = QRL__PAUSE_REQUEST__INIT; /* same shape as ResumeRequest */
        r.reason = "rollout_harness";
        if (cmd[0] == 'p') {
            st = qrl_rpc_client_call(c, QRL_RPC_ROLLOUT_PAUSE, &r.base, 5000, &resp, &err);
        } else {
            Qrl__ResumeRequest q = QRL__RESUME_REQUEST__INIT;
            q.reason = "rollout_harness";
            st = qrl_rpc_client_call(c, QRL_RPC_ROLLOUT_RESUME, &q.base, 5000, &resp, &err);
        }
    } else {
        die("rpc: command is status, drain, pause, resume or set KEY VALUE");
    }
    qrl_rpc_client_destroy(c);
    if (st != QRL_OK) {
        printf("{\"error\":\"%s\"}\n", qrl_status_name(st));
        fprintf(stderr, "rollout_harness: %s\n", err.msg);
        return 1;
    }
    if (resp->descriptor == &qrl__rollout_status__descriptor) {
        const Qrl__RolloutStatus *s = (const Qrl__RolloutStatus *)resp;
        printf("{\"replica_id\":\"%s\",\"state\":%d,\"slots_total\":%u,\"slots_in_use\":%u,"
               "\"queued_groups\":%u,\"active_groups\":%u,\"tokens_per_s\":%.1f,"
               "\"groups_produced\":%" PRIu64 ",\"tokens_generated\":%" PRIu64
               ",\"staleness_restarts\":%" PRIu64 ",\"precision\":\"%s\",\"kv_format\":\"%s\"}\n",
               s->replica_id, (int)s->state, s->slots_total, s->slots_in_use, s->queued_groups,
               s->active_groups, s->tokens_per_s, s->groups_produced, s->tokens_generated,
               s->staleness_restarts, s->precision, s->kv_format);
    } else if (resp->descriptor == &qrl__control_response__descriptor) {
        const Qrl__ControlResponse *r = (const Qrl__ControlResponse *)resp;
        printf("{\"state\":%d,\"message\":\"%s\"}\n", (int)r->state, r->message);
    } else {
        const Qrl__SetResponse *r = (const Qrl__SetResponse *)resp;
        printf("{\"key\":\"%s\",\"old\":\"%s\",\"new\":\"%s\"}\n", r->key, r->old_value, r->new_value);
    }
    qrl_wire_free(resp);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage: rollout_harness produce|consume|rpc ... (see the file comment)");
    if (strcmp(argv[1], "produce") == 0) return produce(argc, argv);
    if (strcmp(argv[1], "consume") == 0) return consume(argc, argv);
    if (strcmp(argv[1], "rpc") == 0) return rpc(argc, argv);
    die("unknown command (produce, consume, rpc)");
}
