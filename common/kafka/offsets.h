/* In-order offset tracking for commit-after-use (SPEC §8: consumers commit offsets only
 * after the data is safely used).  Records of a partition are pushed in consumption
 * order and marked done in any order; the committable offset of a partition is one past
 * the last record of its longest done prefix.  Commits only move forward: a record seen
 * again after a rebalance lies at or below what was committed already.
 *
 * Single-threaded (the daemon's loop thread).  Used by qrl-rollout (prompts: done when the
 * result is acknowledged) and qrl-learner (results: done when trained). */
#ifndef QRL_KAFKA_OFFSETS_H
#define QRL_KAFKA_OFFSETS_H

#include <stdint.h>

typedef struct qrl_kafka_offsets qrl_kafka_offsets; /* opaque */
typedef struct qrl_kafka_offset qrl_kafka_offset;   /* one pushed record, opaque */

/* New empty tracker; NULL when out of memory.  Free with qrl_kafka_offsets_free, which
 * also frees every entry still pushed. */
qrl_kafka_offsets *qrl_kafka_offsets_new(void);
void qrl_kafka_offsets_free(qrl_kafka_offsets *t);

/* Record a consumed message (partition >= 0, offset >= 0).  The entry is owned by the
 * tracker and stays valid until it is marked done.  Aborts when out of memory (a few
 * bytes per in-flight record, bounded by the daemon's in-flight limit). */
qrl_kafka_offset *qrl_kafka_offsets_push(qrl_kafka_offsets *t, int32_t partition, int64_t offset);

/* Mark `e` done (it is freed once it leaves the done prefix: do not use it again).
 * Returns the offset to commit for its partition (next offset to read) when that moves
 * past the last committed one, else -1; *partition receives the partition.  After a
 * successful commit call qrl_kafka_offsets_committed; after a failed one do nothing (the
 * next done record retries, and redelivered records are deduplicated downstream). */
int64_t qrl_kafka_offsets_done(qrl_kafka_offsets *t, qrl_kafka_offset *e, int32_t *partition);
void qrl_kafka_offsets_committed(qrl_kafka_offsets *t, int32_t partition, int64_t upto);
/* The Kafka offset a pushed, not yet done entry was recorded with. */
int64_t qrl_kafka_offset_value(const qrl_kafka_offset *e);

#endif
