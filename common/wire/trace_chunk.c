/* TraceChunk encoding and the per-response completeness check (wire.h, proto/qrl.proto
 * "qrl.trace").  Records are cut by token range by the producer (model/trace_rec.h), so
 * each chunk is a whole, self-checking TRACE record; this file only frames them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "wire/wire.h"

/* Bytes of a TraceChunk besides the record payload, the site ids and the replica id:
 * tags and worst-case varints of the 14 scalar fields and three length prefixes, rounded
 * up.  Site ids cost at most 5 bytes each (packed) plus their length prefix. */
#define TRACE_CHUNK_OVERHEAD 128

size_t qrl_wire_trace_record_budget(size_t max_bytes, size_t n_sites, const char *replica_id) {
    size_t fixed = TRACE_CHUNK_OVERHEAD + 5 * n_sites + (replica_id ? strlen(replica_id) : 0);
    return max_bytes > fixed ? max_bytes - fixed : 0;
}

qrl_status qrl_wire_trace_chunks_encode(const qrl_wire_trace_ident *id, const uint32_t *site_ids,
                                        size_t n_sites, const qrl_wire_trace_pieces *p,
                                        size_t max_bytes, qrl_wire_chunks *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    if (p->count == 0 || n_sites == 0 || id->group_id == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "TraceChunk group %llu response %u: %zu pieces, %zu site ids (need "
                             "both, and a group id)", (unsigned long long)id->group_id,
                             id->response_index, p->count, n_sites);
    out->data = calloc(p->count, sizeof *out->data);
    out->len = calloc(p->count, sizeof *out->len);
    if (!out->data || !out->len) {
        qrl_wire_chunks_free(out);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "TraceChunk: %zu chunks", p->count);
    }
    out->count = p->count;
    qrl_status st = QRL_OK;
    for (size_t i = 0; i < p->count && st == QRL_OK; i++) {
        Qrl__TraceChunk c = QRL__TRACE_CHUNK__INIT;
        c.group_id = id->group_id;
        c.run_id = id->run_id;
        c.replica_id = (char *)(id->replica_id ? id->replica_id : "");
        c.response_index = id->response_index;
        c.chunk_index = (uint32_t)i;
        c.chunk_count = (uint32_t)p->count;
        c.token_begin = p->token_begin[i];
        c.token_count = p->token_count[i];
        c.n_site_ids = n_sites;
        c.site_ids = (uint32_t *)site_ids;
        c.format_version = QRL_WIRE_TRACE_FORMAT_RECORD;
        c.block_size = 16;
        c.record.data = p->record[i];
        c.record.len = p->len[i];
        c.response_tokens = p->n_tokens;
        c.response_crc32 = p->crc32;
        st = qrl_wire_encode_alloc(&c.base, &out->data[i], &out->len[i], err);
        if (st == QRL_OK && out->len[i] > max_bytes)
            st = qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                               "TraceChunk group %llu response %u chunk %zu: %zu bytes, over the "
                               "limit of %zu (records must fit qrl_wire_trace_record_budget)",
                               (unsigned long long)id->group_id, id->response_index, i,
                               out->len[i], max_bytes);
    }
    if (st != QRL_OK) qrl_wire_chunks_free(out);
    return st;
}

static bool same_str(const char *a, const char *b) { return !strcmp(a ? a : "", b ? b : ""); }

static bool same_ident(const Qrl__TraceChunk *a, const Qrl__TraceChunk *b) {
    return a->group_id == b->group_id && a->run_id == b->run_id &&
           same_str(a->replica_id, b->replica_id) && a->response_index == b->response_index &&
           a->chunk_count == b->chunk_count && a->response_tokens == b->response_tokens &&
           a->response_crc32 == b->response_crc32 && a->n_site_ids == b->n_site_ids &&
           !memcmp(a->site_ids, b->site_ids, a->n_site_ids * sizeof *a->site_ids);
}

static bool same_payload(const Qrl__TraceChunk *a, const Qrl__TraceChunk *b) {
    return a->token_begin == b->token_begin && a->token_count == b->token_count &&
           a->record.len == b->record.len &&
           !memcmp(a->record.data, b->record.data, a->record.len);
}

qrl_status qrl_wire_trace_join(Qrl__TraceChunk *const *chunks, size_t n,
                               const Qrl__TraceChunk **ordered, size_t *count, qrl_error *err) {
    *count = 0;
    if (n == 0 || !chunks[0])
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "TraceChunk join: no chunks");
    const Qrl__TraceChunk *first = chunks[0];
    char where[80];
    snprintf(where, sizeof where, "TraceChunk group %llu response %u",
             (unsigned long long)first->group_id, first->response_index);
    for (size_t i = 0; i < n; i++) ordered[i] = NULL;
    size_t total = first->chunk_count, have = 0;
    for (size_t i = 0; i < n; i++) {
        const Qrl__TraceChunk *c = chunks[i];
        QRL_TRY(qrl_wire_trace_chunk_validate(c, err));
        if (c->format_version != QRL_WIRE_TRACE_FORMAT_RECORD)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s chunk %u: format_version %u, "
                                 "joining needs %u", where, c->chunk_index, c->format_version,
                                 QRL_WIRE_TRACE_FORMAT_RECORD);
        if (!same_ident(c, first))
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s chunk %u: group, run, replica, "
                                 "response, chunk_count, response_tokens, response_crc32 or "
                                 "site_ids differ from chunk %u's", where, c->chunk_index,
                                 first->chunk_index);
        if (c->chunk_index >= n) continue; /* cannot be complete: found missing below */
        const Qrl__TraceChunk *o = ordered[c->chunk_index];
        if (o && !same_payload(o, c))
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: chunk %u given twice with "
                                 "different contents", where, c->chunk_index);
        if (!o) ordered[c->chunk_index] = c, have++;
    }
    if (have < total || total > n) {
        char miss[160] = "";
        size_t len = 0, shown = 0;
        for (size_t i = 0; i < total && len + 16 < sizeof miss; i++)
            if (i >= n || !ordered[i])
                len += (size_t)snprintf(miss + len, sizeof miss - len, "%s%zu", shown++ ? ", " : "", i);
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: incomplete, %zu of %zu chunks "
                             "(missing %s)", where, have, total, miss);
    }
    uint32_t next = 0, crc = 0;
    for (size_t i = 0; i < total; i++) {
        const Qrl__TraceChunk *c = ordered[i];
        if (c->token_begin != next)
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s chunk %zu: starts at token %u, "
                                 "the previous chunks end at %u", where, i, c->token_begin, next);
        next += c->token_count;
        crc = qrl_crc32(crc, c->record.data, c->record.len);
    }
    if (next != first->response_tokens)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: chunks cover %u tokens, "
                             "response_tokens is %u", where, next, first->response_tokens);
    if (crc != first->response_crc32)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: CRC-32 of the records 0x%08x, "
                             "response_crc32 0x%08x", where, crc, first->response_crc32);
    *count = total;
    return QRL_OK;
}
