/* common/kafka without a broker: error mapping, option checks, dead-letter encoding,
 * and what the calls return when nothing listens at the bootstrap address.  The
 * round trip through a real broker is tests/integration/kafka_roundtrip.sh. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "kafka/kafka.h"

/* "127.0.0.1:PORT" where nothing listens: a port the kernel just handed out and took back. */
static const char *dead_bootstrap(void) {
    static char buf[32];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    cr_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    snprintf(buf, sizeof buf, "127.0.0.1:%d", ntohs(a.sin_port));
    return buf;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(kafka, status_mapping_retriable_and_fatal) {
    struct { int code; qrl_status st; } cases[] = {
        {RD_KAFKA_RESP_ERR_NO_ERROR, QRL_OK},
        {RD_KAFKA_RESP_ERR__TRANSPORT, QRL_STATUS_NETWORK},
        {RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, QRL_STATUS_NETWORK},
        {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, QRL_STATUS_NETWORK},
        {RD_KAFKA_RESP_ERR__QUEUE_FULL, QRL_STATUS_BUSY},
        {RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS, QRL_STATUS_BUSY},
        {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, QRL_STATUS_TIMEOUT},
        {RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, QRL_STATUS_TIMEOUT},
        {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, QRL_STATUS_NOT_FOUND},
        {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, QRL_STATUS_NOT_FOUND},
        {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, QRL_STATUS_OUT_OF_RANGE},
        {RD_KAFKA_RESP_ERR_INVALID_CONFIG, QRL_STATUS_INVALID_ARGUMENT},
        {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, QRL_STATUS_PERMISSION},
        {RD_KAFKA_RESP_ERR__BAD_MSG, QRL_STATUS_CORRUPT},
        {RD_KAFKA_RESP_ERR__PURGE_QUEUE, QRL_STATUS_CANCELLED},
        {RD_KAFKA_RESP_ERR__FATAL, QRL_STATUS_INTERNAL},
        {RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, QRL_STATUS_INTERNAL},
        {12345, QRL_STATUS_INTERNAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(qrl_kafka_status_from_code(cases[i].code), cases[i].st, "%s -> %s, want %s",
                     rd_kafka_err2name(cases[i].code),
                     qrl_status_name(qrl_kafka_status_from_code(cases[i].code)),
                     qrl_status_name(cases[i].st));
    /* the classes the daemons branch on */
    cr_assert(qrl_status_retriable(qrl_kafka_status_from_code(RD_KAFKA_RESP_ERR__TRANSPORT)));
    cr_assert(qrl_status_retriable(qrl_kafka_status_from_code(RD_KAFKA_RESP_ERR__QUEUE_FULL)));
    cr_assert_not(qrl_status_retriable(qrl_kafka_status_from_code(RD_KAFKA_RESP_ERR__FATAL)));
    cr_assert_not(qrl_status_retriable(qrl_kafka_status_from_code(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE)));
}

Test(kafka, producer_options_rejected_with_the_key_named) {
    qrl_error err;
    qrl_kafka_producer_t *p = (void *)1;
    qrl_kafka_producer_opts o = {0};
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_null(p);
    cr_assert(strstr(err.msg, "bootstrap"), "%s", err.msg);

    o.bootstrap = "127.0.0.1:1";
    o.compression = "brotli";
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "brotli"), "%s", err.msg);

    o.compression = "zstd";
    const char *bad[] = {"no.such.property", "1", NULL};
    o.extra = bad;
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "no.such.property=1"), "%s", err.msg);

    const char *odd[] = {"linger.ms", NULL};
    o.extra = odd;
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "linger.ms has no value"), "%s", err.msg);

    o.extra = NULL;
    o.message_max_bytes = 10;
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_STATUS_OUT_OF_RANGE);
}

typedef struct seen {
    int n;
    qrl_status st;
    char topic[64];
    void *opaque;
} seen;

static void record(void *user, void *opaque, const qrl_kafka_delivery *d) {
    seen *s = user;
    s->n++;
    s->st = d->status;
    s->opaque = opaque;
    snprintf(s->topic, sizeof s->topic, "%s", d->topic);
}

Test(kafka, undeliverable_message_is_reported_by_callback_and_flush) {
    seen s = {0};
    int tag = 7;
    qrl_error err;
    qrl_kafka_producer_opts o = {.bootstrap = dead_bootstrap(), .linger_ms = 0, .message_timeout_ms = 300,
                                 .message_max_bytes = 4096, .on_delivery = record, .user = &s};
    qrl_kafka_producer_t *p;
    cr_assert_eq(qrl_kafka_producer_new(&o, &p, &err), QRL_OK, "%s", err.msg);

    static char big[5000];
    cr_assert_eq(qrl_kafka_producer_send(p, "qrl.results", NULL, 0, big, sizeof big, NULL, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "qrl.results") && strstr(err.msg, "4096"), "%s", err.msg);

    cr_assert_eq(qrl_kafka_producer_send(p, "qrl.prompts", "k", 1, "v", 1, &tag, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kafka_producer_outstanding(p), 1);
    qrl_status st = qrl_kafka_producer_flush(p, 5000, &err);
    cr_assert_eq(st, QRL_STATUS_TIMEOUT, "%s: %s", qrl_status_name(st), err.msg);
    cr_assert(strstr(err.msg, "qrl.prompts") && strstr(err.msg, o.bootstrap), "%s", err.msg);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.st, QRL_STATUS_TIMEOUT);
    cr_assert_eq(s.opaque, &tag);
    cr_assert_str_eq(s.topic, "qrl.prompts");
    cr_assert_eq(qrl_kafka_producer_outstanding(p), 0);
    /* the failure is reported once */
    cr_assert_eq(qrl_kafka_producer_flush(p, 1000, &err), QRL_OK);
    qrl_kafka_producer_destroy(p);
}

Test(kafka, consumer_options_and_dead_broker) {
    qrl_error err;
    qrl_kafka_consumer_t *c = (void *)1;
    const char *topic = "qrl.prompts";
    qrl_kafka_consumer_opts o = {.bootstrap = dead_bootstrap()};
    cr_assert_eq(qrl_kafka_consumer_new(&o, &topic, 1, &c, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_null(c);
    cr_assert(strstr(err.msg, "group_id"), "%s", err.msg);
    o.group_id = "g";
    cr_assert_eq(qrl_kafka_consumer_new(&o, &topic, 0, &c, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "no topics"), "%s", err.msg);

    cr_assert_eq(qrl_kafka_consumer_new(&o, &topic, 1, &c, &err), QRL_OK, "%s", err.msg);
    qrl_kafka_message m;
    bool got = true;
    qrl_status st = qrl_kafka_consumer_poll(c, 200, &m, &got, &err);
    cr_assert(st == QRL_OK || qrl_status_retriable(st), "%s: %s", qrl_status_name(st), err.msg);
    cr_assert_not(got);
    cr_assert_eq(qrl_kafka_consumer_assigned(c), 0);
    qrl_kafka_message_release(&m); /* releasing an empty message is a no-op */
    qrl_kafka_consumer_close(c);
}

Test(kafka, admin_calls_time_out_on_a_dead_broker) {
    qrl_error err;
    const char *b = dead_bootstrap();
    double t0 = now_s();
    cr_assert_eq(qrl_kafka_wait_ready(b, 800, NULL, &err), QRL_STATUS_TIMEOUT);
    double dt = now_s() - t0;
    cr_assert(dt >= 0.7 && dt < 5, "waited %.2f s", dt);
    cr_assert(strstr(err.msg, b), "%s", err.msg);

    const char *topics[] = {"qrl.prompts"};
    qrl_kafka_topic_spec spec = {.partitions = 0, .replication_factor = 1};
    cr_assert_eq(qrl_kafka_topics_create(b, topics, 1, &spec, 500, &err), QRL_STATUS_OUT_OF_RANGE);
    spec.partitions = 2;
    cr_assert_eq(qrl_kafka_topics_create(b, topics, 1, &spec, 500, &err), QRL_STATUS_TIMEOUT);
    cr_assert_eq(qrl_kafka_wait_ready("", 500, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
}

Test(kafka, topic_names_checked_naming_the_key) {
    qrl_error err;
    cr_assert_eq(qrl_kafka_topic_name_check("kafka.trace_topic", "qrl.trace", &err), QRL_OK);
    cr_assert_eq(qrl_kafka_topic_name_check("kafka.trace_topic", "a-B_9.x", &err), QRL_OK);
    const char *bad[] = {"", ".", "..", "qrl trace", "qrl/trace", "trace\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(qrl_kafka_topic_name_check("kafka.trace_topic", bad[i], &err), QRL_STATUS_INVALID_ARGUMENT,
                     "'%s'", bad[i]);
        cr_assert(strncmp(err.msg, "kafka.trace_topic: ", 19) == 0, "%s", err.msg);
    }
    cr_assert_eq(qrl_kafka_topic_name_check("kafka.dlq_topic", NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "empty"), "%s", err.msg);
    char longname[251];
    memset(longname, 'a', 250);
    longname[250] = 0;
    cr_assert_eq(qrl_kafka_topic_name_check("k", longname, &err), QRL_STATUS_INVALID_ARGUMENT);
    longname[249] = 0;
    cr_assert_eq(qrl_kafka_topic_name_check("k", longname, &err), QRL_OK);

    /* a bad name is refused before any broker is asked; a dead broker times out (bounded) */
    const char *keys[] = {"kafka.results_topic", "kafka.trace_topic"};
    const char *topics[] = {"qrl.results", ""};
    const char *b = dead_bootstrap();
    double t0 = now_s();
    cr_assert_eq(qrl_kafka_topics_check(b, keys, topics, 2, 600, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "kafka.trace_topic"), "%s", err.msg);
    cr_assert(now_s() - t0 < 0.5);
    topics[1] = "qrl.trace";
    cr_assert_eq(qrl_kafka_topics_check(b, keys, topics, 2, 600, NULL, &err), QRL_STATUS_TIMEOUT);
    double dt = now_s() - t0;
    cr_assert(dt >= 0.5 && dt < 5, "waited %.2f s", dt);
}

static json_t *dlq_json(const void *key, size_t key_len, const void *payload, size_t len, const char *error) {
    qrl_error err;
    char *s = NULL;
    size_t n = 0;
    cr_assert_eq(qrl_kafka_dlq_encode("qrl.results", 3, 1234567890123LL, key, key_len, payload, len, error,
                                      &s, &n, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(n, strlen(s));
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    cr_assert_not_null(j, "%s: %s", s, je.text);
    free(s);
    return j;
}

static const char *jstr(json_t *j, const char *k) { return json_string_value(json_object_get(j, k)); }

Test(kafka, dead_letter_record_fields) {
    json_t *j = dlq_json("g007", 4, "\x01\x02\xff", 3, "bad PromptGroup at byte 2");
    cr_assert_eq(json_integer_value(json_object_get(j, "version")), 1);
    cr_assert_str_eq(jstr(j, "source_topic"), "qrl.results");
    cr_assert_eq(json_integer_value(json_object_get(j, "partition")), 3);
    cr_assert_eq(json_integer_value(json_object_get(j, "offset")), 1234567890123LL);
    cr_assert_str_eq(jstr(j, "error"), "bad PromptGroup at byte 2");
    cr_assert_str_eq(jstr(j, "key_b64"), "ZzAwNw==");
    cr_assert_str_eq(jstr(j, "payload_b64"), "AQL/");
    cr_assert_eq(json_integer_value(json_object_get(j, "payload_bytes")), 3);
    cr_assert(json_is_false(json_object_get(j, "payload_omitted")));
    cr_assert(json_integer_value(json_object_get(j, "time_ms")) > 1600000000000LL);
    json_decref(j);
}

Test(kafka, dead_letter_base64_padding_rfc4648) {
    /* RFC 4648 section 10 test vectors, through the key field */
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        json_t *j = dlq_json(in[i], strlen(in[i]), NULL, 0, "e");
        cr_assert_str_eq(jstr(j, "key_b64"), out[i], "base64(\"%s\")", in[i]);
        cr_assert(json_is_null(json_object_get(j, "payload_b64")));
        json_decref(j);
    }
}

Test(kafka, dead_letter_large_payload_and_bad_text) {
    size_t n = QRL_KAFKA_DLQ_MAX_PAYLOAD + 1;
    char *big = calloc(1, n);
    cr_assert_not_null(big);
    json_t *j = dlq_json(NULL, 0, big, n, "not UTF-8: \xc3\x28 here");
    cr_assert(json_is_null(json_object_get(j, "key_b64")));
    cr_assert(json_is_null(json_object_get(j, "payload_b64")));
    cr_assert(json_is_true(json_object_get(j, "payload_omitted")));
    cr_assert_eq(json_integer_value(json_object_get(j, "payload_bytes")), (json_int_t)n);
    cr_assert_str_eq(jstr(j, "error"), "not UTF-8: ?( here");
    json_decref(j);
    free(big);

    qrl_error err;
    char *s = (void *)1;
    cr_assert_eq(qrl_kafka_dlq_encode("t", 0, 0, NULL, 0, NULL, 0, NULL, &s, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_null(s);
}
