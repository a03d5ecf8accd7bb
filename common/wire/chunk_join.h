/* Reassembly of chunked GroupResults (docs/wire.md "Chunking"; the split is
 * qrl_wire_result_encode_chunked in wire.h).  A result larger than the topic's message
 * limit arrives as chunk_count > 1 messages of the same key, hence the same partition and
 * in offset order.  The joiner holds incomplete sets; each set remembers the opaque tag
 * of its first chunk (the learner's pending Kafka offset), so the consumer can keep that
 * record uncommitted until the joined result is used.  Single-threaded: one owner. */
#ifndef QRL_WIRE_CHUNK_JOIN_H
#define QRL_WIRE_CHUNK_JOIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "qrl.pb-c.h"

#define QRL_WIRE_MAX_CHUNK_SETS 256 /* incomplete chunked results held at once */
#define QRL_WIRE_MAX_CHUNKS 4096    /* chunks of one result (4 GiB at 1 MiB chunks) */

typedef struct qrl_wire_chunk_set {
    uint64_t group_id;
    uint32_t whole_crc32c, chunk_count, n;
    char replica_id[128];
    Qrl__GroupResult **chunks; /* [chunk_count], n filled (owned) */
    int32_t partition;
    void *first;               /* the first chunk's tag: pending until the set ends */
    uint64_t started_ms;
} qrl_wire_chunk_set;

/* Zero-initialize ({0}); free with qrl_wire_joiner_free. */
typedef struct qrl_wire_joiner {
    qrl_wire_chunk_set *sets;
    size_t n, cap;
} qrl_wire_joiner;

typedef struct qrl_wire_join_outcome {
    bool held;                 /* this chunk opened a set: its tag stays pending */
    bool done;                 /* a set ended (joined, failed or expired): release `first` */
    int32_t partition;
    void *first;
    Qrl__GroupResult *whole;   /* the joined result when done without error (caller owns) */
} qrl_wire_join_outcome;

/* Add chunk message `r` (chunk_count > 1; ownership passes) read with tag `tag` from
 * `partition` at now_ms (any clock, the same one qrl_wire_joiner_expire gets).  Sets are
 * keyed by (group id, replica id, whole CRC-32C, chunk count), so a duplicate production by
 * another replica forms its own set.  out->held false and out->done false: the caller
 * releases this chunk's tag now.  out->done: the set is complete; on QRL_OK out->whole is
 * the reassembled result, on error (qrl_wire_result_join's: CORRUPT naming the chunk,
 * OUT_OF_RANGE, PARSE) nothing; either way the caller owns out->first.
 * Errors before a set exists: OUT_OF_RANGE (chunk_count above QRL_WIRE_MAX_CHUNKS), BUSY
 * (QRL_WIRE_MAX_CHUNK_SETS pending): the chunk is dropped and its tag is the caller's. */
qrl_status qrl_wire_joiner_add(qrl_wire_joiner *c, Qrl__GroupResult *r, int32_t partition, void *tag,
                               uint64_t now_ms, qrl_wire_join_outcome *out, qrl_error *err);
/* Drop sets older than max_age_ms (a replica died between chunks; its redelivered
 * production forms a new set): up to max_out outcomes (done, partition, first) written to
 * out; returns how many. */
size_t qrl_wire_joiner_expire(qrl_wire_joiner *c, uint64_t now_ms, uint64_t max_age_ms,
                              qrl_wire_join_outcome *out, size_t max_out);
/* Free every set held (their chunks included) and reset c to empty. */
void qrl_wire_joiner_free(qrl_wire_joiner *c);

#endif
