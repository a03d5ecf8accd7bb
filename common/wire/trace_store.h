/* The TraceChunk store a TRACE consumer holds until a response's records are joined
 * (qrl_wire_trace_join in wire.h): decoded chunks by (group id, response index, replica
 * id), each chunk index once.  Indexed so that storing a chunk is O(1) amortized (open
 * addressing on the key, binary search of the response's chunks for duplicates; chunks
 * arriving in index order append) and dropping a group costs that group's responses (a
 * per-group list); eviction and expiry take responses in order of their latest chunk (a
 * list kept in arrival order), so neither scans the store.  Before this index the learner
 * scanned every response per chunk: 20k chunks delayed update 1 by ~2.8 s and 80k timed
 * its consumer session out (bench/trace_store.c).
 *
 * Memory: qrl_trace_store_held_bytes is the heap the store holds, not wire bytes: each
 * decoded chunk's allocations (message struct, replica id, site ids, record) and each
 * response's (replica copy, chunk array) at glibc's chunk granularity (request + 8 rounded
 * up to 16, at least 32), plus the index arrays.  A small chunk costs several times its
 * wire bytes (~75 wire bytes held ~500 bytes), a large record about its wire bytes.
 * Single-threaded: one owner.  Zero-initialize ({0}); free with qrl_trace_store_free. */
#ifndef QRL_WIRE_TRACE_STORE_H
#define QRL_WIRE_TRACE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qrl.pb-c.h"

/* One response's chunks (fields read-only to the owner). */
typedef struct qrl_trace_store_entry {
    uint64_t group_id;
    uint32_t response;
    char *replica;              /* owned copy */
    Qrl__TraceChunk **chunks;   /* [n], ascending chunk_index, each index once (owned) */
    uint32_t n, cap;
    size_t held;                /* heap bytes of this response (see the file comment) */
    uint64_t first_ms, last_ms; /* arrival of the first / latest chunk */
    uint64_t hash;
    uint32_t seen_prev, seen_next; /* arrival order of the latest chunk (eviction, expiry) */
    uint32_t grp_prev, grp_next;   /* the group's responses */
    bool live;
} qrl_trace_store_entry;

typedef struct qrl_trace_store {
    qrl_trace_store_entry *e; /* slab; free entries chained through seen_next */
    uint32_t n_slab, cap_slab, free_head, live;
    uint32_t *by_key, *by_group; /* open addressing: entry + 1, 0 = empty; [mask + 1] */
    uint32_t mask;
    uint32_t seen_head, seen_tail;
    size_t chunk_held;           /* sum of the entries' held */
} qrl_trace_store;

typedef enum qrl_trace_store_add_result {
    QRL_TRACE_STORE_STORED = 0,
    QRL_TRACE_STORE_DUPLICATE, /* this response already holds the chunk index: freed */
} qrl_trace_store_add_result;

/* Store chunk t (validated by the caller; ownership passes, a duplicate is freed at once)
 * arrived at now_ms (any clock; the one expire gets).  First, while the store holds
 * responses and held + this chunk's cost > max_bytes, the response whose latest chunk is
 * oldest is dropped (*evicted counts them; may be NULL; *evicted_group / *evicted_response,
 * when not NULL, get the last one's group and response for a log line).  Aborts on out of memory (QRL_CHECK). */
qrl_trace_store_add_result qrl_trace_store_add(qrl_trace_store *s, Qrl__TraceChunk *t, uint64_t now_ms,
                                               size_t max_bytes, size_t *evicted, uint64_t *evicted_group,
                                               uint32_t *evicted_response);
/* The chunks of (group_id, response, replica), NULL when none (valid until the next add,
 * drop or expire). */
const qrl_trace_store_entry *qrl_trace_store_find(const qrl_trace_store *s, uint64_t group_id, uint32_t response,
                                                  const char *replica);
/* Drop every response of group_id (all replicas); returns how many. */
size_t qrl_trace_store_drop_group(qrl_trace_store *s, uint64_t group_id);
/* Drop the responses whose latest chunk arrived more than max_age_ms before now_ms;
 * returns how many. */
size_t qrl_trace_store_expire(qrl_trace_store *s, uint64_t now_ms, uint64_t max_age_ms);
/* Heap bytes held now (chunks, responses and the index; see the file comment). */
size_t qrl_trace_store_held_bytes(const qrl_trace_store *s);
/* Heap bytes one decoded chunk costs (its message allocations). */
size_t qrl_trace_store_chunk_cost(const Qrl__TraceChunk *t);
/* Free everything held; s is empty ({0}) after. */
void qrl_trace_store_free(qrl_trace_store *s);

#endif
