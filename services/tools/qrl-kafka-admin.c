/* qrl-kafka-admin: the few Kafka admin steps qrl's scripts need, without a JVM start
 * (deploy/kafka/kafka.sh calls it; see docs/kafka.md).
 *
 *   qrl-kafka-admin wait --bootstrap B [--timeout S]
 *   qrl-kafka-admin create-topics --bootstrap B --topics a,b,c [--partitions N]
 *                   [--replication-factor R] [--max-message-bytes N] [--timeout S]
 *   qrl-kafka-admin describe --bootstrap B --topics a,b [--timeout S]
 *
 * Exit status: 0 done, 1 failed or a usage error (one line on stderr says why; 1 for usage
 * errors as in every qrl program). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "kafka/kafka.h"

#define MAX_TOPICS 64

static void usage(FILE *f) {
    fputs("usage: qrl-kafka-admin wait --bootstrap B [--timeout S]\n"
          "       qrl-kafka-admin create-topics --bootstrap B --topics a,b,c [--partitions N]\n"
          "                       [--replication-factor R] [--max-message-bytes N] [--timeout S]\n"
          "       qrl-kafka-admin describe --bootstrap B --topics a,b [--timeout S]\n"
          "  wait           until a broker answers a metadata request (default timeout 30 s)\n"
          "  create-topics  create the topics if missing (idempotent) and wait for their leaders;\n"
          "                 defaults: 4 partitions, replication 1, max.message.bytes 16777216\n"
          "  describe       print 'topic=T partitions=N max.message.bytes=M' per topic\n",
          f);
}

typedef struct args {
    const char *cmd, *bootstrap;
    char *topics_buf;
    const char *topics[MAX_TOPICS];
    size_t n_topics;
    long partitions, replication, timeout_s;
    long long max_bytes;
} args;

/* Parse a whole decimal number in [lo, hi]; exits with the usage status (1) otherwise. */
static long long parse_num(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "qrl-kafka-admin: error: %s '%s' is not a number in [%lld, %lld]\n", flag, s, lo, hi);
        exit(1);
    }
    return v;
}

static void parse(int argc, char **argv, args *a) {
    if (argc < 2) { usage(stderr); exit(1); }
    a->cmd = argv[1];
    if (!strcmp(a->cmd, "-h") || !strcmp(a->cmd, "--help")) { usage(stdout); exit(0); }
    if (strcmp(a->cmd, "wait") && strcmp(a->cmd, "create-topics") && strcmp(a->cmd, "describe")) {
        fprintf(stderr, "qrl-kafka-admin: error: unknown command '%s' (wait | create-topics | describe; see --help)\n",
                a->cmd);
        exit(1);
    }
    for (int i = 2; i < argc; i++) {
        char *flag = argv[i], *val = strchr(flag, '=');
        if (val) *val++ = '\0';
        else if (i + 1 < argc) val = argv[++i];
        else { fprintf(stderr, "qrl-kafka-admin: error: %s needs a value\n", flag); exit(1); }
        if (!strcmp(flag, "--bootstrap")) a->bootstrap = val;
        else if (!strcmp(flag, "--topics")) a->topics_buf = val;
        else if (!strcmp(flag, "--partitions")) a->partitions = (long)parse_num(flag, val, 1, 100000);
        else if (!strcmp(flag, "--replication-factor")) a->replication = (long)parse_num(flag, val, 1, 32);
        else if (!strcmp(flag, "--max-message-bytes")) a->max_bytes = parse_num(flag, val, 1024, 1LL << 30);
        else if (!strcmp(flag, "--timeout")) a->timeout_s = (long)parse_num(flag, val, 1, 3600);
        else { fprintf(stderr, "qrl-kafka-admin: error: unknown option %s (see --help)\n", flag); exit(1); }
    }
    if (!a->bootstrap || !*a->bootstrap) {
        fprintf(stderr, "qrl-kafka-admin: error: %s: --bootstrap is required\n", a->cmd);
        exit(1);
    }
    for (char *t = a->topics_buf ? strtok(a->topics_buf, ",") : NULL; t; t = strtok(NULL, ",")) {
        if (a->n_topics == MAX_TOPICS) {
            fprintf(stderr, "qrl-kafka-admin: error: more than %d topics\n", MAX_TOPICS);
            exit(1);
        }
        a->topics[a->n_topics++] = t;
    }
}

int main(int argc, char **argv) {
    args a = {.partitions = 4, .replication = 1, .timeout_s = 30, .max_bytes = QRL_KAFKA_MAX_MESSAGE_BYTES};
    parse(argc, argv, &a);
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status st;
    int timeout_ms = (int)a.timeout_s * 1000;

    if (!strcmp(a.cmd, "wait")) {
        int n = 0;
        st = qrl_kafka_wait_ready(a.bootstrap, timeout_ms, &n, &err);
        if (st == QRL_OK) printf("ready bootstrap=%s brokers=%d\n", a.bootstrap, n);
    } else if (!strcmp(a.cmd, "create-topics") || !strcmp(a.cmd, "describe")) {
        if (a.n_topics == 0) {
            fprintf(stderr, "qrl-kafka-admin: error: %s: --topics is required\n", a.cmd);
            return 1;
        }
        if (!strcmp(a.cmd, "create-topics")) {
            qrl_kafka_topic_spec spec = {.partitions = (int)a.partitions,
                                         .replication_factor = (int)a.replication,
                                         .max_message_bytes = a.max_bytes};
            st = qrl_kafka_topics_create(a.bootstrap, a.topics, a.n_topics, &spec, timeout_ms, &err);
            for (size_t i = 0; st == QRL_OK && i < a.n_topics; i++)
                printf("topic=%s ready (partitions>=%ld)\n", a.topics[i], a.partitions);
        } else {
            st = QRL_OK;
            for (size_t i = 0; i < a.n_topics && st == QRL_OK; i++) {
                int parts = 0;
                int64_t maxb = 0;
                st = qrl_kafka_topic_describe(a.bootstrap, a.topics[i], timeout_ms, &parts, &maxb, &err);
                if (st == QRL_OK)
                    printf("topic=%s partitions=%d max.message.bytes=%lld\n", a.topics[i], parts,
                           (long long)maxb);
            }
        }
    } else {
        fprintf(stderr, "qrl-kafka-admin: unknown command '%s'\n", a.cmd);
        usage(stderr);
        return 1;
    }
    if (st != QRL_OK) {
        fprintf(stderr, "qrl-kafka-admin %s: %s: %s\n", a.cmd, qrl_status_name(st), err.msg);
        return 1;
    }
    return 0;
}
