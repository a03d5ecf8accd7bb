/* Round trip through a real Kafka broker with common/kafka (run by kafka_roundtrip.sh,
 * which starts the broker and creates the qrl topics with 4 partitions).
 *
 *   QRL_KAFKA_BOOTSTRAP=127.0.0.1:PORT kafka_roundtrip before-restart
 *   QRL_KAFKA_BOOTSTRAP=127.0.0.1:PORT kafka_roundtrip after-restart
 *
 * before-restart: topic settings and idempotent creation; keyed idempotent produce;
 * consume in a group with partial commits; a restarted consumer gets exactly the
 * uncommitted records; after a full commit only new records come; a 6 MiB record; the
 * dead-letter record; the errors for an oversized record and a missing topic.
 * after-restart (the broker was stopped and started on the same data directory): the
 * records and the group's committed offsets are still there. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "kafka/kafka.h"

#define N_MSGS 200
#define N_KEYS 100
#define N_PARTS 4
#define UNCOMMITTED_PER_PART 5
#define LARGE_BYTES (6 * 1024 * 1024)
#define GROUP "rt-group"

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            exit(1);                                                              \
        }                                                                         \
    } while (0)
#define CHECK_OK(expr)                                                            \
    do {                                                                          \
        qrl_status st_ = (expr);                                                  \
        CHECK(st_ == QRL_OK, "%s: %s", qrl_status_name(st_), err.msg);            \
    } while (0)

static const char *bootstrap;
static qrl_error err;

typedef struct sent {
    char key[16], payload[32];
    int32_t partition;
    int64_t offset;
    int seen;
} sent;
static sent msgs[N_MSGS + 1];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_delivery(void *user, void *opaque, const qrl_kafka_delivery *d) {
    int *failures = user;
    sent *m = opaque;
    if (d->status != QRL_OK) {
        (*failures)++;
        fprintf(stderr, "delivery failed: %s %s\n", d->topic, d->error);
        return;
    }
    if (m) {
        m->partition = d->partition;
        m->offset = d->offset;
    }
}

static qrl_kafka_producer_t *producer(int *failures) {
    qrl_kafka_producer_opts o = {.bootstrap = bootstrap, .client_id = "rt-producer", .linger_ms = -1,
                                 .on_delivery = on_delivery, .user = failures};
    qrl_kafka_producer_t *p;
    CHECK_OK(qrl_kafka_producer_new(&o, &p, &err));
    return p;
}

static qrl_kafka_consumer_t *consumer(const char *group, const char *topic) {
    qrl_kafka_consumer_opts o = {.bootstrap = bootstrap, .group_id = group, .client_id = group};
    qrl_kafka_consumer_t *c;
    CHECK_OK(qrl_kafka_consumer_new(&o, &topic, 1, &c, &err));
    return c;
}

/* Next record within timeout_s, or false. */
static bool next(qrl_kafka_consumer_t *c, double timeout_s, qrl_kafka_message *m) {
    double end = now_s() + timeout_s;
    while (now_s() < end) {
        bool got = false;
        qrl_status st = qrl_kafka_consumer_poll(c, 200, m, &got, &err);
        CHECK(st == QRL_OK || qrl_status_retriable(st), "poll: %s: %s", qrl_status_name(st), err.msg);
        if (got) return true;
    }
    return false;
}

static sent *find(const qrl_kafka_message *m) {
    for (int i = 0; i < N_MSGS + 1; i++)
        if (msgs[i].partition == m->partition && msgs[i].offset == m->offset) return &msgs[i];
    return NULL;
}

static void check_matches(const qrl_kafka_message *m, const sent *s) {
    CHECK(s, "record %s [%d] @%lld was never produced", m->topic, (int)m->partition, (long long)m->offset);
    CHECK(m->key_len == strlen(s->key) && memcmp(m->key, s->key, m->key_len) == 0,
          "key of [%d] @%lld differs (want %s)", (int)m->partition, (long long)m->offset, s->key);
    CHECK(m->len == strlen(s->payload) && memcmp(m->payload, s->payload, m->len) == 0,
          "payload of [%d] @%lld differs (want %s)", (int)m->partition, (long long)m->offset, s->payload);
}

/* ---- before-restart --------------------------------------------------------------------- */

static void test_topics(void) {
    int parts = 0;
    int64_t maxb = 0;
    CHECK_OK(qrl_kafka_topic_describe(bootstrap, QRL_KAFKA_TOPIC_PROMPTS, 10000, &parts, &maxb, &err));
    CHECK(parts == N_PARTS, "qrl.prompts has %d partitions", parts);
    CHECK(maxb == QRL_KAFKA_MAX_MESSAGE_BYTES, "qrl.prompts max.message.bytes %lld", (long long)maxb);
    /* idempotent creation, and refusal to shrink what was asked for */
    const char *topics[] = {QRL_KAFKA_TOPIC_PROMPTS, QRL_KAFKA_TOPIC_DLQ};
    qrl_kafka_topic_spec spec = {.partitions = N_PARTS, .replication_factor = 1};
    CHECK_OK(qrl_kafka_topics_create(bootstrap, topics, 2, &spec, 10000, &err));
    spec.partitions = 8;
    qrl_status st = qrl_kafka_topics_create(bootstrap, topics, 1, &spec, 10000, &err);
    CHECK(st == QRL_STATUS_OUT_OF_RANGE && strstr(err.msg, "qrl.prompts") && strstr(err.msg, "4 partitions"),
          "%s: %s", qrl_status_name(st), err.msg);
    st = qrl_kafka_topic_describe(bootstrap, "qrl.absent", 10000, &parts, &maxb, &err);
    CHECK(st == QRL_STATUS_NOT_FOUND && strstr(err.msg, "qrl.absent"), "%s: %s", qrl_status_name(st), err.msg);
}

static void test_produce(void) {
    int failures = 0;
    qrl_kafka_producer_t *p = producer(&failures);
    for (int i = 0; i < N_MSGS; i++) {
        sent *m = &msgs[i];
        snprintf(m->key, sizeof m->key, "g%03d", i % N_KEYS);
        snprintf(m->payload, sizeof m->payload, "payload-%d", i);
        m->partition = -1;
        m->offset = -1;
        CHECK_OK(qrl_kafka_producer_send(p, QRL_KAFKA_TOPIC_PROMPTS, m->key, strlen(m->key), m->payload,
                                         strlen(m->payload), m, &err));
    }
    CHECK_OK(qrl_kafka_producer_flush(p, 30000, &err));
    CHECK(failures == 0 && qrl_kafka_producer_outstanding(p) == 0, "%d failed", failures);
    int per_part[N_PARTS] = {0};
    for (int i = 0; i < N_MSGS; i++) {
        CHECK(msgs[i].partition >= 0 && msgs[i].partition < N_PARTS && msgs[i].offset >= 0,
              "message %d: partition %d offset %lld", i, (int)msgs[i].partition, (long long)msgs[i].offset);
        per_part[msgs[i].partition]++;
        if (i >= N_KEYS) /* same key: same partition, later offset */
            CHECK(msgs[i].partition == msgs[i - N_KEYS].partition &&
                      msgs[i].offset > msgs[i - N_KEYS].offset,
                  "key %s went to [%d] and [%d]", msgs[i].key, (int)msgs[i - N_KEYS].partition,
                  (int)msgs[i].partition);
    }
    for (int k = 0; k < N_PARTS; k++)
        CHECK(per_part[k] > UNCOMMITTED_PER_PART, "partition %d got only %d records", k, per_part[k]);
    qrl_kafka_producer_destroy(p);
}

/* Offset of the record UNCOMMITTED_PER_PART from the end of partition k. */
static int64_t commit_point(int k) {
    int64_t offs[N_MSGS];
    int n = 0;
    for (int i = 0; i < N_MSGS; i++)
        if (msgs[i].partition == k) offs[n++] = msgs[i].offset;
    for (int a = 1; a < n; a++) /* insertion sort: n is small */
        for (int b = a; b > 0 && offs[b - 1] > offs[b]; b--) {
            int64_t t = offs[b];
            offs[b] = offs[b - 1];
            offs[b - 1] = t;
        }
    return offs[n - UNCOMMITTED_PER_PART];
}

static void test_group_commits(void) {
    /* A: consume everything, commit all but the last 5 records of each partition */
    qrl_kafka_consumer_t *c = consumer(GROUP, QRL_KAFKA_TOPIC_PROMPTS);
    qrl_kafka_message m;
    for (int n = 0; n < N_MSGS; n++) {
        CHECK(next(c, 30, &m), "consumer A got %d of %d records", n, N_MSGS);
        sent *s = find(&m);
        check_matches(&m, s);
        CHECK(s->seen++ == 0, "record [%d] @%lld delivered twice", (int)m.partition, (long long)m.offset);
        qrl_kafka_message_release(&m);
    }
    CHECK(qrl_kafka_consumer_assigned(c) == N_PARTS, "assigned %d", qrl_kafka_consumer_assigned(c));
    for (int k = 0; k < N_PARTS; k++) {
        CHECK_OK(qrl_kafka_consumer_commit_offset(c, QRL_KAFKA_TOPIC_PROMPTS, k, commit_point(k), &err));
        int64_t got = -2;
        CHECK_OK(qrl_kafka_consumer_committed(c, QRL_KAFKA_TOPIC_PROMPTS, k, 10000, &got, &err));
        CHECK(got == commit_point(k), "partition %d committed %lld, want %lld", k, (long long)got,
              (long long)commit_point(k));
    }
    qrl_kafka_consumer_close(c);

    /* B: exactly the uncommitted records come again (a committed one would come first:
     * order within a partition is kept) */
    for (int i = 0; i < N_MSGS; i++) msgs[i].seen = 0;
    c = consumer(GROUP, QRL_KAFKA_TOPIC_PROMPTS);
    for (int n = 0; n < N_PARTS * UNCOMMITTED_PER_PART; n++) {
        CHECK(next(c, 30, &m), "consumer B got %d of %d uncommitted records", n,
              N_PARTS * UNCOMMITTED_PER_PART);
        sent *s = find(&m);
        check_matches(&m, s);
        CHECK(m.offset >= commit_point(m.partition), "committed record [%d] @%lld redelivered",
              (int)m.partition, (long long)m.offset);
        CHECK(s->seen++ == 0, "record [%d] @%lld delivered twice", (int)m.partition, (long long)m.offset);
        CHECK_OK(qrl_kafka_consumer_commit(c, &m, &err));
        qrl_kafka_message_release(&m);
    }
    qrl_kafka_consumer_close(c);

    /* C: everything is committed, so the first record it sees is a new one */
    int failures = 0;
    qrl_kafka_producer_t *p = producer(&failures);
    sent *sentinel = &msgs[N_MSGS];
    snprintf(sentinel->key, sizeof sentinel->key, "sentinel");
    snprintf(sentinel->payload, sizeof sentinel->payload, "after-commit");
    CHECK_OK(qrl_kafka_producer_send(p, QRL_KAFKA_TOPIC_PROMPTS, "sentinel", 8, "after-commit", 12,
                                     sentinel, &err));
    CHECK_OK(qrl_kafka_producer_flush(p, 30000, &err));
    qrl_kafka_producer_destroy(p);
    c = consumer(GROUP, QRL_KAFKA_TOPIC_PROMPTS);
    CHECK(next(c, 30, &m), "consumer C got nothing");
    check_matches(&m, find(&m));
    CHECK(strcmp(find(&m)->key, "sentinel") == 0, "consumer C got old record [%d] @%lld",
          (int)m.partition, (long long)m.offset);
    CHECK_OK(qrl_kafka_consumer_commit(c, &m, &err));
    qrl_kafka_message_release(&m);
    qrl_kafka_consumer_close(c);
}

static void test_large_record(void) {
    unsigned char *big = malloc(LARGE_BYTES);
    CHECK(big, "malloc");
    uint32_t x = 12345;
    for (size_t i = 0; i < LARGE_BYTES; i++) big[i] = (unsigned char)((x = x * 1664525u + 1013904223u) >> 24);
    int failures = 0;
    qrl_kafka_producer_t *p = producer(&failures);
    CHECK_OK(qrl_kafka_producer_send(p, QRL_KAFKA_TOPIC_RESULTS, "big", 3, big, LARGE_BYTES, NULL, &err));
    CHECK_OK(qrl_kafka_producer_flush(p, 60000, &err));
    /* over the limit: refused at once, naming the topic */
    unsigned char *huge = calloc(1, QRL_KAFKA_MAX_MESSAGE_BYTES + 1);
    CHECK(huge, "calloc");
    qrl_status st = qrl_kafka_producer_send(p, QRL_KAFKA_TOPIC_RESULTS, NULL, 0, huge,
                                            QRL_KAFKA_MAX_MESSAGE_BYTES + 1, NULL, &err);
    CHECK(st == QRL_STATUS_OUT_OF_RANGE && strstr(err.msg, QRL_KAFKA_TOPIC_RESULTS), "%s: %s",
          qrl_status_name(st), err.msg);
    free(huge);
    qrl_kafka_producer_destroy(p);

    qrl_kafka_consumer_t *c = consumer("rt-large", QRL_KAFKA_TOPIC_RESULTS);
    qrl_kafka_message m;
    CHECK(next(c, 30, &m), "large record not consumed");
    CHECK(m.len == LARGE_BYTES && memcmp(m.payload, big, LARGE_BYTES) == 0, "large record differs (%zu bytes)",
          m.len);
    qrl_kafka_message_release(&m);
    qrl_kafka_consumer_close(c);
    free(big);
}

static void test_dead_letter(void) {
    int failures = 0;
    qrl_kafka_producer_t *p = producer(&failures);
    qrl_kafka_message src = {.topic = QRL_KAFKA_TOPIC_PROMPTS, .partition = 2, .offset = 41,
                             .key = "g007", .key_len = 4, .payload = "\x01\x02\xff", .len = 3};
    CHECK_OK(qrl_kafka_dlq_send(p, NULL, &src, "PromptGroup: field 'tokens' truncated at byte 2", &err));
    CHECK_OK(qrl_kafka_producer_flush(p, 30000, &err));
    CHECK(failures == 0, "dlq delivery failed");
    qrl_kafka_producer_destroy(p);

    qrl_kafka_consumer_t *c = consumer("rt-dlq", QRL_KAFKA_TOPIC_DLQ);
    qrl_kafka_message m;
    CHECK(next(c, 30, &m), "no dead letter consumed");
    CHECK(m.key == NULL, "dead letters are unkeyed");
    json_error_t je;
    json_t *j = json_loadb(m.payload, m.len, 0, &je);
    CHECK(j, "dead letter is not JSON: %s", je.text);
    CHECK(json_integer_value(json_object_get(j, "version")) == QRL_KAFKA_DLQ_VERSION, "version");
    CHECK(!strcmp(json_string_value(json_object_get(j, "source_topic")), "qrl.prompts"), "source_topic");
    CHECK(json_integer_value(json_object_get(j, "partition")) == 2, "partition");
    CHECK(json_integer_value(json_object_get(j, "offset")) == 41, "offset");
    CHECK(!strcmp(json_string_value(json_object_get(j, "error")),
                  "PromptGroup: field 'tokens' truncated at byte 2"), "error");
    CHECK(!strcmp(json_string_value(json_object_get(j, "key_b64")), "ZzAwNw=="), "key_b64");
    CHECK(!strcmp(json_string_value(json_object_get(j, "payload_b64")), "AQL/"), "payload_b64");
    json_decref(j);
    CHECK_OK(qrl_kafka_consumer_commit(c, &m, &err));
    qrl_kafka_message_release(&m);
    qrl_kafka_consumer_close(c);
}

static void test_missing_topic(void) {
    /* auto.create.topics.enable=false: the delivery fails, naming the topic */
    const char *extra[] = {"topic.metadata.propagation.max.ms", "500", NULL};
    qrl_kafka_producer_opts o = {.bootstrap = bootstrap, .linger_ms = 0, .message_timeout_ms = 10000,
                                 .extra = extra};
    qrl_kafka_producer_t *p;
    CHECK_OK(qrl_kafka_producer_new(&o, &p, &err));
    qrl_status st = qrl_kafka_producer_send(p, "qrl.absent", NULL, 0, "x", 1, NULL, &err);
    if (st == QRL_OK) st = qrl_kafka_producer_flush(p, 20000, &err);
    CHECK(st == QRL_STATUS_NOT_FOUND && strstr(err.msg, "qrl.absent"), "%s: %s", qrl_status_name(st), err.msg);
    qrl_kafka_producer_destroy(p);
}

/* ---- after-restart ---------------------------------------------------------------------- */

static void test_after_restart(void) {
    /* every record is still there for a new group */
    qrl_kafka_consumer_t *c = consumer("rt-fresh", QRL_KAFKA_TOPIC_PROMPTS);
    qrl_kafka_message m;
    int n = 0, sentinels = 0;
    while (n < N_MSGS + 1 && next(c, 30, &m)) {
        char want[32];
        if (m.key_len == 8 && !memcmp(m.key, "sentinel", 8)) {
            sentinels++;
        } else {
            char text[32] = {0};
            int i = -1;
            if (m.len < sizeof text) memcpy(text, m.payload, m.len);
            CHECK(sscanf(text, "payload-%d", &i) == 1 && i >= 0 && i < N_MSGS,
                  "unexpected record [%d] @%lld", (int)m.partition, (long long)m.offset);
            snprintf(want, sizeof want, "g%03d", i % N_KEYS);
            CHECK(m.key_len == 4 && !memcmp(m.key, want, 4), "record %d has the wrong key", i);
        }
        n++;
        qrl_kafka_message_release(&m);
    }
    CHECK(n == N_MSGS + 1 && sentinels == 1, "after restart read %d records (%d sentinels), want %d", n,
          sentinels, N_MSGS + 1);
    qrl_kafka_consumer_close(c);

    /* the group's commits survived: it sees only a record produced now */
    int failures = 0;
    qrl_kafka_producer_t *p = producer(&failures);
    CHECK_OK(qrl_kafka_producer_send(p, QRL_KAFKA_TOPIC_PROMPTS, "restart", 7, "after-restart", 13, NULL, &err));
    CHECK_OK(qrl_kafka_producer_flush(p, 30000, &err));
    qrl_kafka_producer_destroy(p);
    c = consumer(GROUP, QRL_KAFKA_TOPIC_PROMPTS);
    CHECK(next(c, 30, &m), "group got nothing after restart");
    CHECK(m.key_len == 7 && !memcmp(m.key, "restart", 7), "group got old record [%d] @%lld after restart",
          (int)m.partition, (long long)m.offset);
    qrl_kafka_message_release(&m);
    qrl_kafka_consumer_close(c);
}

#define RUN(fn)                                                                   \
    do {                                                                          \
        double t0_ = now_s();                                                     \
        fn();                                                                     \
        printf("ok   %-20s %.2f s\n", #fn, now_s() - t0_);                        \
        fflush(stdout);                                                           \
    } while (0)

int main(int argc, char **argv) {
    bootstrap = getenv("QRL_KAFKA_BOOTSTRAP");
    if (!bootstrap || argc != 2) {
        fprintf(stderr, "usage: QRL_KAFKA_BOOTSTRAP=host:port %s before-restart|after-restart\n", argv[0]);
        return 2;
    }
    qrl_error_clear(&err);
    if (!strcmp(argv[1], "before-restart")) {
        RUN(test_topics);
        RUN(test_produce);
        RUN(test_group_commits);
        RUN(test_large_record);
        RUN(test_dead_letter);
        RUN(test_missing_topic);
    } else if (!strcmp(argv[1], "after-restart")) {
        RUN(test_after_restart);
    } else {
        fprintf(stderr, "unknown phase %s\n", argv[1]);
        return 2;
    }
    return 0;
}
