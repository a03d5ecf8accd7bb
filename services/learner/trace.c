/* qrl-learner TRACE intake (trace.h). */
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "dispatch.h"
#include "wire/trace_store.h"
#include "wire/wire.h"

static struct {
    qrl_trace_store st; /* (group, response, replica) -> chunks (wire/trace_store.h) */
    ld_trace_counts k;
    uint32_t *site_ids; /* the last site list sites_verdict judged, and its verdict */
    size_t n_site_ids;
    int verdict;
    bool warned_none, warned_part;
} T;

void ld_trace_free(void) {
    qrl_trace_store_free(&T.st);
    free(T.site_ids);
    memset(&T, 0, sizeof T);
}

ld_trace_counts ld_trace_counts_now(void) {
    ld_trace_counts k = T.k;
    k.held_bytes = qrl_trace_store_held_bytes(&T.st);
    return k;
}

bool ld_trace_consumed(const ld_core *c) {
    return c->s->learner.qat == LD_QAT_NVFP4 && c->s->learner.trace_guidance;
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
    /* a group this run has not dispatched can have no result to guide (intake.c dead-letters
     * such results), and one already in an update is spent */
    bool undispatched = gs == GS_NONE && t->group_id >= ld_dispatch_counts_now().next_id;
    if (t->run_id != c->run_id || undispatched || gs == GS_TRAINING || gs == GS_TRAINED || gs == GS_DROPPED) {
        *(t->run_id != c->run_id ? &T.k.other_run : undispatched ? &T.k.undispatched : &T.k.late) += 1;
        qrl_wire_free(pm);
        return;
    }
    size_t evicted = 0;
    uint64_t ev_group = 0;
    uint32_t ev_response = 0;
    if (qrl_trace_store_add(&T.st, t, ld_unix_ms(), (size_t)c->s->learner.trace_store_mb << 20, &evicted,
                            &ev_group, &ev_response) == QRL_TRACE_STORE_DUPLICATE) {
        T.k.duplicates++;
        return;
    }
    if (evicted) {
        QRL_LOG_WARN("learner", "trace store full (learner.trace_store_mb %d): evicted %zu responses, the last "
                     "group=%" PRIu64 " response=%u", c->s->learner.trace_store_mb, evicted, ev_group, ev_response);
        T.k.evicted += evicted;
    }
    T.k.chunks++;
    T.k.bytes += m->len;
}

/* Join and decode entry e for a response of `tokens` tokens: the records, or NULL with
 * *corrupt telling an incomplete set (false) from a bad one (true). */
static qrl_trace_response *join_one(ld_core *c, const qrl_trace_store_entry *e, uint32_t tokens, bool *corrupt) {
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

/* What records with these site ids guide of what this learner fake-quantizes (the linear
 * inputs at every layer, with learner.qat_kv K and V too): 0 nothing, 1 part, 2 all.  A
 * replica recording other sites (w4a16 with the fp4 KV cache records only K and V) would
 * otherwise count as guided while every quantizer it feeds rounds to nearest.  One warning
 * per kind of mismatch; the verdict is kept for the last list (replicas share one). */
static int sites_verdict(const ld_core *c, const uint32_t *ids, size_t n) {
    if (T.site_ids && n == T.n_site_ids && !memcmp(ids, T.site_ids, n * sizeof *ids)) return T.verdict;
    bool kv = c->s->learner.qat_kv;
    size_t cov = 0, wanted = 0;
    char miss[256], rec[256];
    qrl_trace_sites_coverage(&c->model->cfg, ids, n, QRL_TRACE_KINDS_LINEAR | (kv ? QRL_TRACE_KINDS_KV : 0), &cov,
                             &wanted, miss, sizeof miss, rec, sizeof rec);
    int v = cov == 0 ? 0 : cov < wanted ? 1 : 2;
    if (v == 0 && !T.warned_none) {
        QRL_LOG_WARN("learner", "trace records carry %s, but this learner fake-quantizes attn_in, attn_out, mlp_in, "
                     "mlp_down%s at all layers (learner.qat nvfp4, learner.qat_kv %s): they guide none of its "
                     "sites, so their responses train unguided (counted: trace sites_none)", rec, kv ? ", k, v" : "",
                     kv ? "true" : "false");
        T.warned_none = true;
    }
    if (v == 1 && !T.warned_part) {
        QRL_LOG_WARN("learner", "trace records cover %zu of the %zu (layer, site) pairs this learner fake-quantizes; "
                     "these have no records and round to nearest: %s", cov, wanted, miss);
        T.warned_part = true;
    }
    free(T.site_ids);
    T.site_ids = malloc((n ? n : 1) * sizeof *ids);
    QRL_CHECK(T.site_ids != NULL);
    memcpy(T.site_ids, ids, n * sizeof *ids);
    T.n_site_ids = n, T.verdict = v;
    return v;
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
        const qrl_trace_store_entry *e = qrl_trace_store_find(&T.st, r->group_id, k, rep);
        bool corrupt = false;
        out->trace[k] = e ? join_one(c, e, tokens, &corrupt) : NULL;
        if (out->trace[k] && !sites_verdict(c, e->chunks[0]->site_ids, e->chunks[0]->n_site_ids)) {
            qrl_trace_response_free(out->trace[k]);
            out->trace[k] = NULL;
            T.k.sites_none++;
            continue;
        }
        if (out->trace[k]) {
            T.k.joined++;
            for (size_t i = 0; i < e->n; i++) out->record_bytes += e->chunks[i]->record.len;
            out->tokens += tokens;
        } else {
            *(corrupt ? &T.k.corrupt : &T.k.missing) += 1;
        }
    }
    qrl_trace_store_drop_group(&T.st, r->group_id); /* in an update now: every chunk of it is spent */
}

void ld_trace_set_free(ld_trace_set *s) {
    for (uint32_t k = 0; s && s->trace && k < s->n; k++) qrl_trace_response_free(s->trace[k]);
    if (s) free(s->trace);
}

void ld_trace_expire(ld_core *c) { T.k.expired += qrl_trace_store_expire(&T.st, ld_unix_ms(), LD_TRACE_EXPIRE_MS); }
