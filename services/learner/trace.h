/* qrl-learner TRACE intake (trace.c; docs/learner-daemon.md "TRACE records"): TraceChunks
 * in from kafka.trace_topic (learner.qat nvfp4 with learner.trace_guidance on), held in a
 * bounded store by (group id, response index, replica id) until the result they belong to
 * is taken into an update, then joined (wire.h qrl_wire_trace_join) and decoded
 * (model/trace_rec.h) into the response's records for the QAT forward.
 *
 * Records arrive on their own topic, so nothing orders them against their result: a
 * chunk may come before or after it, twice, or never.  Duplicates are kept once;
 * reordering is what the join sorts out; a response whose records are missing,
 * incomplete or corrupt when its result is taken trains unguided (nearest rounding) and is
 * counted, never dropped.  A chunk that does not decode or validate goes to the dead-letter
 * topic.  Chunk records are committed as soon as they are stored: a learner that restarts
 * loses the stored chunks, and the results they belonged to train unguided (counted).
 *
 * Store: wire/trace_store.h, indexed (storing a chunk is O(1) amortized, a take costs its
 * group's responses; the scan per chunk it replaced timed the consumer session out at 80k
 * chunks).  Chunks are dropped on arrival, counted, when they belong to another run
 * (other_run), to a group this run has not dispatched (undispatched: its result could not
 * be trained either, intake.c dead-letters it) or to a group already in an update (late).
 * Bounds: at most learner.trace_store_mb MiB of heap is held (what the decoded chunks and
 * the index take, ~0.5 KB per small chunk, about the wire bytes for large records; beyond
 * it the response least recently added to is evicted first, counted); a response's chunks
 * are forgotten LD_TRACE_EXPIRE_MS after its last chunk arrived without its result being
 * taken, and at once when its group is taken.
 *
 * Sites: records guide only the quantizers whose sites they carry.  At the take a record's
 * site list is checked against what this learner fake-quantizes (learner.qat: the linear
 * inputs at every layer; learner.qat_kv: K and V too): records of none of them (a w4a16
 * replica with the fp4 KV cache records only K and V) leave the response unguided, counted
 * (sites_none), with one warning naming both sides; records of part of them guide where
 * they exist and one warning names the sites without records.  Loop thread only. */
#ifndef QRL_LD_TRACE_H
#define QRL_LD_TRACE_H

#include "daemon.h"
#include "model/trace_rec.h"

#define LD_TRACE_EXPIRE_MS 300000                /* 5 min after a response's last chunk */

/* The decoded records of one result's responses (owned; trace[k] NULL: none). */
typedef struct ld_trace_set {
    qrl_trace_response **trace; /* [n] */
    uint32_t n;
    uint64_t record_bytes;      /* record bytes of the decoded responses */
    uint64_t tokens;            /* response tokens they cover */
} ld_trace_set;

typedef struct ld_trace_counts {
    uint64_t chunks, bytes;     /* chunks stored (each index once) and their message bytes */
    uint64_t duplicates, late, other_run, undispatched, dead_letters, evicted, expired;
    /* responses at take: decoded / none or incomplete / bad / decoded but of none of the
     * sites this learner fake-quantizes (trained unguided: ld_trace_take) */
    uint64_t joined, missing, corrupt, sites_none;
    size_t held_bytes;          /* heap bytes the store holds now (wire/trace_store.h) */
} ld_trace_counts;

/* Whether this learner reads kafka.trace_topic (learner.qat nvfp4, trace_guidance on). */
bool ld_trace_consumed(const ld_core *c);
/* One consumed record of kafka.trace_topic: decoded and stored, or dead-lettered; its
 * offset is released at once. */
void ld_trace_record(ld_core *c, const qrl_kafka_message *m, qrl_kafka_offset *off);
/* The records of result r's responses (each its replica's, run's and group's), joined and
 * decoded now into *out (responses still missing get NULL and are counted); the group's
 * other stored chunks are forgotten.  Call when the result goes into an update. */
void ld_trace_take(ld_core *c, const Qrl__GroupResult *r, ld_trace_set *out);
void ld_trace_set_free(ld_trace_set *s);
/* Forget responses whose last chunk is older than LD_TRACE_EXPIRE_MS (the tick). */
void ld_trace_expire(ld_core *c);
ld_trace_counts ld_trace_counts_now(void);
/* Free the store. */
void ld_trace_free(void);

#endif
