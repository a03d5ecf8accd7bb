/* qrl-learner intake (intake.h). */
#include "intake.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "dispatch.h"
#include "wire/chunk_join.h"
#include "wire/wire.h"

static struct {
    qrl_wire_joiner chunks;     /* chunked results being reassembled */
    ld_buffered *buf;
    size_t n_buf, cap_buf;
    uint64_t results, duplicates, dead_letters, other_run;
    int64_t *safe; /* per partition: next offset with every record before it used (-1 none) */
    int n_safe;
} I;

void ld_intake_free(void) {
    for (size_t i = 0; i < I.n_buf; i++) qrl_wire_free(&I.buf[i].r->base);
    qrl_wire_joiner_free(&I.chunks);
    free(I.buf);
    free(I.safe);
    memset(&I, 0, sizeof I);
}

ld_intake_counts ld_intake_counts_now(void) {
    return (ld_intake_counts){.results = I.results, .duplicates = I.duplicates, .dead_letters = I.dead_letters,
                              .other_run = I.other_run, .buffered = I.n_buf};
}

static void safe_set(int32_t p, int64_t upto) {
    if (p >= I.n_safe) {
        int64_t *ns = realloc(I.safe, (size_t)(p + 1) * sizeof *ns);
        QRL_CHECK(ns != NULL);
        for (int i = I.n_safe; i <= p; i++) ns[i] = -1;
        I.safe = ns;
        I.n_safe = p + 1;
    }
    if (upto > I.safe[p]) I.safe[p] = upto;
}

void ld_intake_committable(int32_t partition, int64_t upto) { safe_set(partition, upto); }

void ld_intake_done(ld_core *c, qrl_kafka_offset *rec) { qrl_service_record_done(c->svc, rec); }

/* The record's dead letter goes out (the shell logs it); its offset is released by the
 * caller at once, as before the shell (not from the acknowledgement). */
static void dead_letter(ld_core *c, const qrl_kafka_message *m, const char *why) {
    qrl_service_dead_letter(c->svc, m->partition, m->offset, m->key, m->key_len, m->payload, m->len, why, NULL);
    I.dead_letters++;
}

void ld_intake_record(ld_core *c, const qrl_kafka_message *m, qrl_kafka_offset *off) {
    I.results++;
    ProtobufCMessage *pm = NULL;
    qrl_error err;
    qrl_status st = m->payload && m->len
                        ? qrl_wire_decode(&qrl__group_result__descriptor, m->payload, m->len,
                                          QRL_KAFKA_MAX_MESSAGE_BYTES, &pm, &err)
                        : qrl_error_set(&err, QRL_STATUS_PARSE, "empty record");
    Qrl__GroupResult *r = (Qrl__GroupResult *)pm;
    if (st == QRL_OK && r->chunk_count > 1) {
        qrl_wire_join_outcome co;
        pm = NULL; /* the assembler owns the chunk now */
        st = qrl_wire_joiner_add(&I.chunks, r, m->partition, off, ld_unix_ms(), &co, &err);
        r = NULL;
        if (!co.done && st == QRL_OK) {
            if (!co.held) ld_intake_done(c, off); /* a later chunk of an open set */
            return;
        }
        if (co.done) { /* the set ends here: it continues under its first chunk's record */
            if (off != co.first) ld_intake_done(c, off);
            off = co.first;
            r = co.whole;
            pm = r ? &r->base : NULL;
        }
    }
    if (st == QRL_OK)
        st = qrl_wire_group_result_validate(r, c->G, (uint32_t)c->model->cfg.vocab_size, &err);
    if (st != QRL_OK) {
        char why[700];
        snprintf(why, sizeof why, "%s: %s", qrl_status_name(st), err.msg);
        dead_letter(c, m, why);
        qrl_wire_free(pm);
        ld_intake_done(c, off);
        return;
    }
    uint8_t gs = ld_group_state(r->group_id);
    uint64_t next_id = ld_dispatch_counts_now().next_id;
    if (r->run_id == c->run_id && gs == GS_NONE && r->group_id >= next_id) {
        /* this run never dispatched that id: a broken producer, not a redelivery */
        char why[200];
        snprintf(why, sizeof why, "NOT_FOUND: group_id %" PRIu64 " was never dispatched by run %" PRIu64
                 " (next id %" PRIu64 ")", r->group_id, c->run_id, next_id);
        dead_letter(c, m, why);
        qrl_wire_free(pm);
        ld_intake_done(c, off);
        return;
    }
    if (r->run_id != c->run_id || gs != GS_DISPATCHED) {
        if (r->run_id != c->run_id) I.other_run++;
        else I.duplicates++;
        QRL_LOG_INFO("learner", "result group=%" PRIu64 " run_id=%" PRIu64 " from %s ignored: %s",
                     r->group_id, r->run_id, r->replica_id,
                     r->run_id != c->run_id ? "another run" : gs == GS_NONE ? "never dispatched" : "duplicate");
        qrl_wire_free(pm);
        ld_intake_done(c, off);
        return;
    }
    if (I.n_buf == I.cap_buf) {
        I.cap_buf = I.cap_buf ? 2 * I.cap_buf : 64;
        I.buf = realloc(I.buf, I.cap_buf * sizeof *I.buf);
        QRL_CHECK(I.buf != NULL);
    }
    I.buf[I.n_buf++] = (ld_buffered){r, off};
    ld_group_set(r->group_id, GS_BUFFERED);
    QRL_LOG_DEBUG("learner", "result group=%" PRIu64 " from %s buffered=%zu", r->group_id, r->replica_id, I.n_buf);
}

void ld_intake_expire_chunks(ld_core *c) {
    qrl_wire_join_outcome gone[16];
    size_t n_gone = qrl_wire_joiner_expire(&I.chunks, ld_unix_ms(), 60000, gone, 16);
    for (size_t i = 0; i < n_gone; i++) {
        I.dead_letters++;
        ld_intake_done(c, gone[i].first);
    }
}

ld_buffered *ld_intake_take(size_t n) {
    QRL_CHECK(n <= I.n_buf);
    ld_buffered *out = malloc((n ? n : 1) * sizeof *out);
    QRL_CHECK(out != NULL);
    memcpy(out, I.buf, n * sizeof *out);
    memmove(I.buf, I.buf + n, (I.n_buf - n) * sizeof *I.buf);
    I.n_buf -= n;
    return out;
}

/* ---- checkpoints -------------------------------------------------------------------- */

void ld_intake_save(qrl_ckpt_state *s) {
    s->offsets = calloc(I.n_safe ? (size_t)I.n_safe : 1, sizeof *s->offsets);
    QRL_CHECK(s->offsets != NULL);
    for (int p = 0; p < I.n_safe; p++)
        if (I.safe[p] >= 0) s->offsets[s->n_offsets++] = (qrl_ckpt_offset){p, I.safe[p]};
}

void ld_intake_commit_saved(ld_core *c, const qrl_ckpt_state *s) {
    for (size_t i = 0; i < s->n_offsets; i++) {
        qrl_error err;
        if (qrl_service_commit(c->svc, s->offsets[i].partition, s->offsets[i].next_offset, &err) != QRL_OK)
            QRL_LOG_WARN("learner", "commit failed (the records will be read again): %s", err.msg);
    }
}

void ld_intake_restore(ld_core *c, const qrl_ckpt_state *s) {
    bool same_topic = strcmp(s->results_topic, c->results_topic) == 0;
    for (size_t i = 0; same_topic && i < s->n_offsets; i++) {
        safe_set(s->offsets[i].partition, s->offsets[i].next_offset);
        int64_t committed = -1;
        qrl_error e2;
        if (qrl_kafka_consumer_committed(qrl_service_consumer(c->svc), c->results_topic, s->offsets[i].partition,
                                         5000, &committed, &e2) != QRL_OK)
            QRL_LOG_WARN("learner", "resume: committed offset of partition %d: %s", (int)s->offsets[i].partition,
                         e2.msg);
        else if (committed > s->offsets[i].next_offset)
            QRL_LOG_WARN("learner", "resume: partition %d is committed up to %" PRId64 ", past this checkpoint's %"
                         PRId64 " (an older checkpoint?): results in between are not read again",
                         (int)s->offsets[i].partition, committed, s->offsets[i].next_offset);
    }
}
