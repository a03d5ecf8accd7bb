/* Reassembly of chunked GroupResults (chunk_join.h; docs/wire.md).  The set's first
 * chunk keeps its tag pending until the joined result is used (so a restarted learner
 * reads the whole set again); the later chunks are released at once. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "wire/chunk_join.h"
#include "wire/wire.h"

static bool same_set(const qrl_wire_chunk_set *s, const Qrl__GroupResult *r) {
    return s->group_id == r->group_id && s->whole_crc32c == r->whole_crc32c &&
           s->chunk_count == r->chunk_count && strcmp(s->replica_id, r->replica_id) == 0;
}

static void set_free(qrl_wire_chunk_set *s) {
    for (uint32_t i = 0; i < s->n; i++) qrl_wire_free(&s->chunks[i]->base);
    free(s->chunks);
}

static void remove_at(qrl_wire_joiner *c, size_t i) {
    set_free(&c->sets[i]);
    c->sets[i] = c->sets[--c->n];
}

qrl_status qrl_wire_joiner_add(qrl_wire_joiner *c, Qrl__GroupResult *r, int32_t partition, void *tag,
                         uint64_t now_ms, qrl_wire_join_outcome *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    size_t i = 0;
    while (i < c->n && !same_set(&c->sets[i], r)) i++;
    if (i == c->n) {
        if (r->chunk_count > QRL_WIRE_MAX_CHUNKS) {
            uint32_t count = r->chunk_count; /* read before the free (was a use after free) */
            qrl_wire_free(&r->base);
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "chunked result: chunk_count %u above %d",
                                 count, QRL_WIRE_MAX_CHUNKS);
        }
        if (c->n == QRL_WIRE_MAX_CHUNK_SETS) {
            qrl_wire_free(&r->base);
            return qrl_error_set(err, QRL_STATUS_BUSY,
                                 "chunked result: %d incomplete sets pending", QRL_WIRE_MAX_CHUNK_SETS);
        }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 8;
            c->sets = realloc(c->sets, c->cap * sizeof *c->sets);
            QRL_CHECK(c->sets != NULL);
        }
        qrl_wire_chunk_set *s = &c->sets[c->n++];
        memset(s, 0, sizeof *s);
        s->group_id = r->group_id;
        s->whole_crc32c = r->whole_crc32c;
        s->chunk_count = r->chunk_count;
        snprintf(s->replica_id, sizeof s->replica_id, "%s", r->replica_id);
        s->chunks = calloc(r->chunk_count, sizeof *s->chunks);
        QRL_CHECK(s->chunks != NULL);
        s->partition = partition;
        s->first = tag;
        s->started_ms = now_ms;
        out->held = true;
    }
    qrl_wire_chunk_set *s = &c->sets[i];
    if (s->n == s->chunk_count) { /* cannot happen: a full set is joined at once */
        qrl_wire_free(&r->base);
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "chunked result group %" PRIu64 ": extra chunk",
                             r->group_id);
    }
    s->chunks[s->n++] = r;
    if (s->n < s->chunk_count) return QRL_OK;
    /* complete: join (checks indices, sizes, CRC, and that the whole decodes) */
    out->done = true;
    out->partition = s->partition;
    out->first = s->first;
    qrl_status st = qrl_wire_result_join(s->chunks, s->n, 0, &out->whole, err);
    QRL_LOG_INFO("learner", "chunked result group=%" PRIu64 " joined from %u chunks: %s", s->group_id,
                  s->chunk_count, qrl_status_name(st));
    remove_at(c, i);
    return st;
}

size_t qrl_wire_joiner_expire(qrl_wire_joiner *c, uint64_t now_ms, uint64_t max_age_ms, qrl_wire_join_outcome *out,
                        size_t max_out) {
    size_t k = 0;
    for (size_t i = 0; i < c->n && k < max_out;) {
        qrl_wire_chunk_set *s = &c->sets[i];
        if (now_ms - s->started_ms < max_age_ms) { i++; continue; }
        QRL_LOG_WARN("learner", "chunked result group=%" PRIu64 " from %s incomplete after %" PRIu64
                     " ms (%u of %u chunks): dropped", s->group_id, s->replica_id, now_ms - s->started_ms,
                     s->n, s->chunk_count);
        out[k++] = (qrl_wire_join_outcome){.done = true, .partition = s->partition, .first = s->first};
        remove_at(c, i);
    }
    return k;
}

void qrl_wire_joiner_free(qrl_wire_joiner *c) {
    for (size_t i = 0; i < c->n; i++) set_free(&c->sets[i]);
    free(c->sets);
    memset(c, 0, sizeof *c);
}
