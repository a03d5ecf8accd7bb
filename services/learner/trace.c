/* qrl-learner TRACE intake (trace.h). */
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "dispatch.h"
#include "wire/wire.h"

/* The chunks held for one response of one replica's answer to a group. */
typedef struct tr_entry {
    uint64_t group_id;
    uint32_t response;
    char *replica;              /* owned */
    Qrl__TraceChunk **chunks;   /* owned (qrl_wire_free), each chunk index once */
    size_t n, cap;
    size_t bytes;               /* message bytes of them */
    uint64_t first_ms, last_ms; /* arrival of the first / latest chunk */
} tr_entry;

static struct {
    tr_entry *e;
    size_t n, cap;
    ld_trace_counts k;
} T;

static void entry_free(tr_entry *e) {
    for (size_t i = 0; i < e->n; i++) qrl_wire_free(&e->chunks[i]->base);
    free(e->chunks);
    free(e->replica);
    T.k.held_bytes -= e->bytes;
}

static void entry_remove(size_t i) {
    entry_free(&T.e[i]);
    T.e[i] = T.e[--T.n];
}

void ld_trace_free(void) {
    while (T.n) entry_remove(T.n - 1);
    free(T.e);
    memset(&T, 0, sizeof T);
}

ld_trace_counts ld_trace_counts_now(void) { return T.k; }

bool ld_trace_consumed(const ld_core *c) {
    return c->s->learner.qat == LD_QAT_NVFP4 && c->s->learner.trace_guidance;
}

static tr_entry *entry_find(uint64_t group_id, uint32_t response, const char *replica) {
    for (size_t i = 0; i < T.n; i++)
        if (T.e[i].group_id == group_id && T.e[i].response == response && strcmp(T.e[i].replica, replica) == 0)
            return &T.e[i];
    return NULL;
}

/* Room for `bytes` more under learner.trace_store_mb: evict the responses whose first
 * chunk is oldest. */
static void make_room(const ld_core *c, size_t bytes) {
    size_t cap = (size_t)c->s->learner.trace_store_mb << 20;
    while (T.n && T.k.held_bytes + bytes > cap) {
        size_t old = 0;
        for (size_t i = 1; i < T.n; i++)
            if (T.e[i].first_ms < T.e[old].first_ms) old = i;
        QRL_LOG_WARN("learner", "trace store full (%zu bytes): evicting group=%" PRIu64 " response=%u",
                     T.k.held_bytes, T.e[old].group_id, T.e[old].response);
        T.k.evicted++;
        entry_remove(old);
    }
}

void ld_trace_record(ld_core *c, const qrl_kafka_message *m, qrl_kafka_offset *off) {
    ProtobufCMessage *pm = NULL;
    qrl_error err;
    qrl_status st = m->payload && m->len
                        ? qrl_wire_decode(&qrl__trace_chunk__descriptor, m->payload, m->len,
                                          QRL_KAFKA_MAX_MESSAGE_BYTES, &pm, &err)
                        : qrl_error_set(&err, QRL_STATUS_PARSE, "empty record");
    Qrl__TraceChunk *t = (Qrl__TraceChunk *)pm;
    if (st == QRL_OK) st = qrl_wire_trace_chunk_validate(t, &err);
    if (st == QRL_OK && t->format_version != QRL_WIRE_TRACE_FORMAT_RECORD)
        st = qrl_error_set(&err, QRL_STATUS_UNSUPPORTED, "TraceChunk format_version %u (this learner reads %u)",
                           t->format_version, QRL_WIRE_TRACE_FORMAT_RECORD);
    if (st != QRL_OK) {
        char why[700];
        snprintf(why, sizeof why, "%s: %s", qrl_status_name(st), err.msg);
        qrl_service_dead_letter_from(c->svc, c->s->kafka.trace_topic, m->partition, m->offset, m->key, m->key_len,
                                     m->payload, m->len, why, NULL);
        T.k.dead_letters++;
        qrl_wire_free(pm);
        qrl_service_record_done(c->svc, off);
        return;
    }
    qrl_service_record_done(c->svc, off); /* stored from here on (trace.h: lost on a restart) */
    uint8_t gs = ld_group_state(t->group_id);
    const char *rep = t->replica_id ? t->replica_id : "";
    tr_entry *e = entry_find(t->group_id, t->response_index, rep);
    bool dup = false;
    for (size_t i = 0; e && i < e->n; i++) dup |= e->chunks[i]->chunk_index == t->chunk_index;
    if (t->run_id != c->run_id || gs == GS_TRAINING || gs == GS_TRAINED || gs == GS_DROPPED || dup) {
        if (t->run_id != c->run_id) T.k.other_run++;
        else if (dup) T.k.duplicates++;
        else T.k.late++;
        qrl_wire_free(pm);
        return;
    }
    make_room(c, m->len);
    e = entry_find(t->group_id, t->response_index, rep); /* eviction moves entries */
    if (!e) {
        if (T.n == T.cap) {
            T.cap = T.cap ? 2 * T.cap : 64;
            T.e = realloc(T.e, T.cap * sizeof *T.e);
            QRL_CHECK(T.e != NULL);
        }
        e = &T.e[T.n++];
        *e = (tr_entry){.group_id = t->group_id, .response = t->response_index, .replica = strdup(rep),
                        .first_ms = ld_unix_ms()};
        QRL_CHECK(e->replica != NULL);
    }
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 4;
        e->chunks = realloc(e->chunks, e->cap * sizeof *e->chunks);
        QRL_CHECK(e->chunks != NULL);
    }
    e->chunks[e->n++] = t;
    e->bytes += m->len;
    e->last_ms = ld_unix_ms();
    T.k.held_bytes += m->len;
    T.k.chunks++;
    T.k.bytes += m->len;
}

/* Join and decode entry e for a response of `tokens` tokens: the records, or NULL with
 * *corrupt telling an incomplete set (false) from a bad one (true). */
static qrl_trace_response *join_one(ld_core *c, const tr_entry *e, uint32_t tokens, bool *corrupt) {
    *corrupt = false;
    const Qrl__TraceChunk **ord = malloc(e->n * sizeof *ord);
    const uint8_t **recs = malloc(e->n * sizeof *recs);
    size_t *lens = malloc(e->n * sizeof *lens);
    uint32_t *begins = malloc(e->n * sizeof *begins);
    QRL_CHECK(ord && recs && lens && begins);
    size_t cnt = 0;
    qrl_error err;
    qrl_trace_response *rec = NULL;
    qrl_status st = qrl_wire_trace_join(e->chunks, e->n, ord, &cnt, &err);
    if (st == QRL_OK && ord[0]->response_tokens != tokens)
        st = qrl_error_set(&err, QRL_STATUS_CORRUPT, "records cover %u tokens, the result has %u",
                           ord[0]->response_tokens, tokens);
    if (st == QRL_OK) {
        for (size_t i = 0; i < cnt; i++)
            recs[i] = ord[i]->record.data, lens[i] = ord[i]->record.len, begins[i] = ord[i]->token_begin;
        st = qrl_trace_response_decode(&c->model->cfg, ord[0]->site_ids, ord[0]->n_site_ids, recs, lens, begins,
                                       cnt, ord[0]->response_tokens, &rec, &err);
    }
    if (st != QRL_OK) {
        *corrupt = st != QRL_STATUS_NOT_FOUND;
        QRL_LOG_WARN("learner", "trace group=%" PRIu64 " response=%u from %s: %s: %s (trained unguided)",
                     e->group_id, e->response, e->replica, qrl_status_name(st), err.msg);
        rec = NULL;
    }
    free(ord), free(recs), free(lens), free(begins);
    return rec;
}

void ld_trace_take(ld_core *c, const Qrl__GroupResult *r, ld_trace_set *out) {
    memset(out, 0, sizeof *out);
    out->n = (uint32_t)r->n_responses;
    out->trace = calloc(out->n ? out->n : 1, sizeof *out->trace);
    QRL_CHECK(out->trace != NULL);
    const char *rep = r->replica_id ? r->replica_id : "";
    for (uint32_t k = 0; k < out->n; k++) {
        uint32_t tokens = (uint32_t)r->responses[k]->n_token_ids;
        if (tokens == 0) continue; /* nothing to train, nothing to guide */
        tr_entry *e = entry_find(r->group_id, k, rep);
        bool corrupt = false;
        out->trace[k] = e ? join_one(c, e, tokens, &corrupt) : NULL;
        if (out->trace[k]) {
            T.k.joined++;
            for (size_t i = 0; i < e->n; i++) out->record_bytes += e->chunks[i]->record.len;
            out->tokens += tokens;
        } else {
            *(corrupt ? &T.k.corrupt : &T.k.missing) += 1;
        }
    }
    for (size_t i = T.n; i-- > 0;) /* the group is in an update now: every chunk of it is spent */
        if (T.e[i].group_id == r->group_id) entry_remove(i);
}

void ld_trace_set_free(ld_trace_set *s) {
    for (uint32_t k = 0; s && s->trace && k < s->n; k++) qrl_trace_response_free(s->trace[k]);
    if (s) free(s->trace);
}

void ld_trace_expire(ld_core *c) {
    uint64_t now = ld_unix_ms();
    for (size_t i = T.n; i-- > 0;)
        if (now - T.e[i].last_ms > LD_TRACE_EXPIRE_MS) {
            T.k.expired++;
            entry_remove(i);
        }
}
