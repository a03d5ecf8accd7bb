/* qrl's thin layer over librdkafka (SPEC 8): an idempotent producer, a consumer-group
 * consumer with manual commits, a dead-letter helper, and the admin calls the deploy
 * scripts need (wait for a broker, create / describe topics).
 *
 * Errors come back as qrl_status with a message naming the broker list, topic,
 * partition and offset involved.  librdkafka's retriable errors (transport, timeouts,
 * leader changes, local queue full) map to retriable statuses (NETWORK, TIMEOUT, BUSY);
 * errors that will not go away by retrying (unknown topic, oversized message, bad
 * config, a fatal idempotent-producer error) map to fatal ones.
 *
 * Threading: a producer or consumer handle is used from one thread at a time; the
 * delivery callback runs on the thread that calls _poll/_flush.  librdkafka's own log
 * lines go through core/log.h with the tag "kafka". */
#ifndef QRL_KAFKA_KAFKA_H
#define QRL_KAFKA_KAFKA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The largest record qrl writes (SPEC 8: results are chunked below it).  The local
 * broker (deploy/kafka/kafka.sh) and the topics are configured to accept it. */
#define QRL_KAFKA_MAX_MESSAGE_BYTES (16 * 1024 * 1024)

#define QRL_KAFKA_TOPIC_PROMPTS "qrl.prompts"
#define QRL_KAFKA_TOPIC_RESULTS "qrl.results"
#define QRL_KAFKA_TOPIC_TRACE   "qrl.trace"
#define QRL_KAFKA_TOPIC_DLQ     "qrl.dlq"

/* Version of the dead-letter JSON record written by qrl_kafka_dlq_encode. */
#define QRL_KAFKA_DLQ_VERSION 1
/* Source payloads up to this size are copied into the dead-letter record (base64). */
#define QRL_KAFKA_DLQ_MAX_PAYLOAD (1024 * 1024)

typedef struct qrl_kafka_producer qrl_kafka_producer_t;
typedef struct qrl_kafka_consumer qrl_kafka_consumer_t;

/* ---- errors -------------------------------------------------------------------------- */

/* The qrl_status for a librdkafka error code (rd_kafka_resp_err_t, passed as int so this
 * header does not pull in rdkafka.h).  0 -> QRL_OK. */
qrl_status qrl_kafka_status_from_code(int rd_kafka_resp_err);

/* ---- producer ------------------------------------------------------------------------ */

/* Outcome of one produced message, passed to the delivery callback.  Strings are valid
 * only during the callback. */
typedef struct qrl_kafka_delivery {
    qrl_status status;     /* QRL_OK when the broker acknowledged it (acks=all) */
    const char *topic;
    int32_t partition;     /* -1 when it never got one */
    int64_t offset;        /* -1 unless delivered */
    const char *error;     /* NULL on success, else librdkafka's reason */
} qrl_kafka_delivery;

/* Called once per message from qrl_kafka_producer_poll / _flush on the caller's thread;
 * `msg_opaque` is the pointer given to qrl_kafka_producer_send. */
typedef void (*qrl_kafka_delivery_fn)(void *user, void *msg_opaque, const qrl_kafka_delivery *d);

typedef struct qrl_kafka_producer_opts {
    const char *bootstrap;       /* required: "host:port[,host:port...]" */
    const char *client_id;       /* NULL: "qrl" */
    const char *compression;     /* NULL: "lz4"; or "zstd", "none" */
    int linger_ms;               /* batching delay; < 0: 5 ms */
    int message_timeout_ms;      /* give up on a message after this (retries included); 0: 120000 */
    int message_max_bytes;       /* largest record; 0: QRL_KAFKA_MAX_MESSAGE_BYTES */
    /* NULL, or {key, value, key, value, ..., NULL}: librdkafka properties applied last
     * (e.g. "security.protocol", "sasl.mechanism" for an existing cluster). */
    const char *const *extra;
    qrl_kafka_delivery_fn on_delivery; /* may be NULL */
    void *user;                        /* passed to on_delivery */
} qrl_kafka_producer_opts;

/* Create an idempotent producer (enable.idempotence=true, acks=all, murmur2 key
 * partitioning like the Java client).  Nothing is sent until the first message.
 * Errors: INVALID_ARGUMENT for a missing bootstrap or a property librdkafka rejects
 * (the message names it).  *out is owned by the caller: qrl_kafka_producer_destroy. */
qrl_status qrl_kafka_producer_new(const qrl_kafka_producer_opts *opts, qrl_kafka_producer_t **out,
                                  qrl_error *err);

/* Queue one message (key and payload are copied; key may be NULL).  The partition is
 * chosen from the key.  Returns at once: BUSY when the local queue is full (poll, then
 * retry), OUT_OF_RANGE when the payload exceeds message_max_bytes, NOT_FOUND for a topic
 * the cluster does not have, INTERNAL after a fatal producer error (recreate the
 * producer).  The outcome arrives later through on_delivery (and is summed by _flush). */
qrl_status qrl_kafka_producer_send(qrl_kafka_producer_t *p, const char *topic, const void *key,
                                   size_t key_len, const void *payload, size_t len,
                                   void *msg_opaque, qrl_error *err);

/* Serve delivery callbacks, waiting up to timeout_ms for one.  Returns how many ran. */
int qrl_kafka_producer_poll(qrl_kafka_producer_t *p, int timeout_ms);

/* Wait until every queued message is delivered or failed (serving callbacks).
 * Returns TIMEOUT when some are still in flight after timeout_ms, else the status of the
 * first delivery that failed since the previous _flush (message names topic, partition
 * and reason), else QRL_OK. */
qrl_status qrl_kafka_producer_flush(qrl_kafka_producer_t *p, int timeout_ms, qrl_error *err);

/* Messages sent and not yet reported (queued or in flight). */
int qrl_kafka_producer_outstanding(const qrl_kafka_producer_t *p);

/* Drop whatever is still queued (their callbacks are not run) and free the producer.
 * Call _flush first to deliver them.  NULL is a no-op. */
void qrl_kafka_producer_destroy(qrl_kafka_producer_t *p);

/* ---- consumer ------------------------------------------------------------------------ */

typedef struct qrl_kafka_consumer_opts {
    const char *bootstrap;       /* required */
    const char *group_id;        /* required: the consumer group */
    const char *client_id;       /* NULL: "qrl" */
    int session_timeout_ms;      /* group session timeout; 0: 10000 */
    int max_poll_interval_ms;    /* longest gap between polls before leaving the group; 0: 300000 */
    const char *const *extra;    /* as for the producer */
} qrl_kafka_consumer_opts;

/* One consumed record.  The pointers stay valid until qrl_kafka_message_release. */
typedef struct qrl_kafka_message {
    const char *topic;
    int32_t partition;
    int64_t offset;
    const void *key;             /* NULL when the record has no key */
    size_t key_len;
    const void *payload;         /* NULL for an empty (tombstone) record */
    size_t len;
    int64_t timestamp_ms;        /* producer create time, -1 when unknown */
    void *impl_;                 /* private: the librdkafka message */
} qrl_kafka_message;

/* Create a consumer in group opts->group_id subscribed to `topics` (n_topics names).
 * Offsets are committed only by qrl_kafka_consumer_commit*; a partition without a
 * committed offset starts at the earliest record.  Errors: INVALID_ARGUMENT (missing
 * bootstrap/group, bad property, no topics).  Owned by the caller: _close. */
qrl_status qrl_kafka_consumer_new(const qrl_kafka_consumer_opts *opts, const char *const *topics,
                                  size_t n_topics, qrl_kafka_consumer_t **out, qrl_error *err);

/* Wait up to timeout_ms for the next record.  On QRL_OK, *got says whether `msg` was
 * filled (then release it with qrl_kafka_message_release).  A consumer error returns its
 * status (retriable ones: keep polling) with the topic/partition/offset it concerns. */
qrl_status qrl_kafka_consumer_poll(qrl_kafka_consumer_t *c, int timeout_ms, qrl_kafka_message *msg,
                                   bool *got, qrl_error *err);

/* Free the record behind `msg` (no-op when it holds none) and clear it. */
void qrl_kafka_message_release(qrl_kafka_message *msg);

/* Synchronously commit `msg`: the group's position for msg's partition becomes
 * msg->offset + 1, so the record and all before it are not delivered again.  Errors:
 * BUSY during a rebalance (the partition may have moved: its records will be delivered
 * again elsewhere), NETWORK/TIMEOUT. */
qrl_status qrl_kafka_consumer_commit(qrl_kafka_consumer_t *c, const qrl_kafka_message *msg,
                                     qrl_error *err);

/* As _commit, for an explicit (topic, partition, next offset to read). */
qrl_status qrl_kafka_consumer_commit_offset(qrl_kafka_consumer_t *c, const char *topic,
                                            int32_t partition, int64_t next_offset, qrl_error *err);

/* As _commit_offset, without waiting: the request is queued and this returns at once
 * (for an event loop).  The outcome is not reported; a failed commit only means the
 * records after the previous committed offset may be delivered again.  Errors:
 * INVALID_ARGUMENT/NOMEM when the request cannot be queued. */
qrl_status qrl_kafka_consumer_commit_offset_async(qrl_kafka_consumer_t *c, const char *topic,
                                                  int32_t partition, int64_t next_offset,
                                                  qrl_error *err);

/* The group's committed next offset for (topic, partition) into *next_offset (-1 when
 * none is committed).  Waits up to timeout_ms for the group coordinator. */
qrl_status qrl_kafka_consumer_committed(qrl_kafka_consumer_t *c, const char *topic, int32_t partition,
                                        int timeout_ms, int64_t *next_offset, qrl_error *err);

/* Number of partitions currently assigned to this member (0 before the first rebalance). */
int qrl_kafka_consumer_assigned(qrl_kafka_consumer_t *c);

/* Leave the group (its partitions move to the other members at once, uncommitted
 * records are delivered again there) and free the consumer.  NULL is a no-op. */
void qrl_kafka_consumer_close(qrl_kafka_consumer_t *c);

/* ---- dead letters -------------------------------------------------------------------- */

/* The dead-letter record for a source record that could not be used: JSON (jansson)
 *   {"version":1, "source_topic":"...", "partition":N, "offset":N, "error":"...",
 *    "key_b64":"..."|null, "payload_bytes":N, "payload_b64":"..."|null,
 *    "payload_omitted":bool, "time_ms":N}
 * payload_b64 holds the source payload when it is at most QRL_KAFKA_DLQ_MAX_PAYLOAD bytes.
 * (JSON for now: a DeadLetter protobuf message may replace it; the "version" field tells
 * them apart.)  *out is malloc'd, NUL-terminated; the caller frees it. */
qrl_status qrl_kafka_dlq_encode(const char *source_topic, int32_t partition, int64_t offset,
                                const void *key, size_t key_len, const void *payload, size_t len,
                                const char *error, char **out, size_t *out_len, qrl_error *err);

/* Queue the dead-letter record for `src` with reason `error` on `dlq_topic` (NULL:
 * QRL_KAFKA_TOPIC_DLQ), unkeyed.  Delivery is reported like any other message. */
qrl_status qrl_kafka_dlq_send(qrl_kafka_producer_t *p, const char *dlq_topic,
                              const qrl_kafka_message *src, const char *error, qrl_error *err);

/* ---- admin (common/kafka/admin.c) ----------------------------------------------------- */

/* Wait until a broker of `bootstrap` answers a metadata request, up to timeout_ms.
 * *n_brokers (may be NULL) gets the cluster's broker count.  Errors: TIMEOUT (message
 * says what the last attempt saw), INVALID_ARGUMENT. */
qrl_status qrl_kafka_wait_ready(const char *bootstrap, int timeout_ms, int *n_brokers, qrl_error *err);

typedef struct qrl_kafka_topic_spec {
    int partitions;              /* >= 1 */
    int replication_factor;      /* >= 1; 1 for the local broker */
    int64_t max_message_bytes;   /* topic max.message.bytes; 0: QRL_KAFKA_MAX_MESSAGE_BYTES */
} qrl_kafka_topic_spec;

/* Create `topics` with `spec`, idempotently: a topic that exists already is left alone
 * if it has at least spec->partitions partitions (else OUT_OF_RANGE naming it).  Returns
 * once every partition of every topic has a leader, or TIMEOUT after timeout_ms. */
qrl_status qrl_kafka_topics_create(const char *bootstrap, const char *const *topics, size_t n_topics,
                                   const qrl_kafka_topic_spec *spec, int timeout_ms, qrl_error *err);

/* Partition count and max.message.bytes of an existing topic.  NOT_FOUND when absent. */
qrl_status qrl_kafka_topic_describe(const char *bootstrap, const char *topic, int timeout_ms,
                                    int *partitions, int64_t *max_message_bytes, qrl_error *err);

/* Whether `topic` is a legal Kafka topic name: 1..249 characters of [A-Za-z0-9._-], not
 * "." or "..".  Errors: INVALID_ARGUMENT naming the config key `key` and the name. */
qrl_status qrl_kafka_topic_name_check(const char *key, const char *topic, qrl_error *err);

/* Check at a daemon's start that topics[i] (the value of config key keys[i]) exist on
 * `bootstrap`: one metadata request each, all within about timeout_ms.  With max_bytes
 * non-NULL, max_bytes[i] gets topic i's max.message.bytes (-1 when it could not be read).
 * Errors: INVALID_ARGUMENT (a name qrl_kafka_topic_name_check refuses), NOT_FOUND ("KEY:
 * topic T does not exist on B"), TIMEOUT/NETWORK when no broker answered (the caller
 * may go on: it cannot tell). */
qrl_status qrl_kafka_topics_check(const char *bootstrap, const char *const *keys, const char *const *topics,
                                  size_t n, int timeout_ms, int64_t *max_bytes, qrl_error *err);

#endif
