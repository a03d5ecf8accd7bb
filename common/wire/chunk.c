/* Chunking of large results, Kafka keys and CRC-32C (wire.h, docs/wire.md).
 *
 * A result over the topic's message limit is encoded whole, and the bytes are cut into
 * pieces carried by GroupResult chunk messages.  Byte-level cutting (rather than spreading
 * responses over chunks) handles a single response larger than the limit with no extra
 * rule, and the consumer must hold the whole group before training anyway. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

/* Bytes a chunk message spends besides chunk_data's payload and the replica id: tags and
 * worst-case varints of schema_version, group_id, run_id, replica_id's length, chunk_index,
 * chunk_count, chunk_data's length, whole_bytes, whole_crc32c (65), rounded up. */
#define CHUNK_OVERHEAD 96
#define CHUNK_MIN_BYTES 256

void qrl_wire_chunks_free(qrl_wire_chunks *c) {
    if (!c) return;
    for (size_t i = 0; i < c->count; i++) free(c->data ? c->data[i] : NULL);
    free(c->data);
    free(c->len);
    memset(c, 0, sizeof *c);
}

static qrl_status chunks_alloc(qrl_wire_chunks *out, size_t count, qrl_error *err) {
    out->data = calloc(count, sizeof *out->data);
    out->len = calloc(count, sizeof *out->len);
    if (!out->data || !out->len) {
        qrl_wire_chunks_free(out);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "GroupResult: cannot allocate %zu chunks",
                             count);
    }
    out->count = count;
    return QRL_OK;
}

qrl_status qrl_wire_result_encode_chunked(Qrl__GroupResult *r, size_t max_bytes,
                                          qrl_wire_chunks *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    size_t id_len = r->replica_id ? strlen(r->replica_id) : 0;
    if (max_bytes < CHUNK_MIN_BYTES + id_len)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "GroupResult group %llu: chunk limit %zu is below %zu bytes",
                             (unsigned long long)r->group_id, max_bytes, CHUNK_MIN_BYTES + id_len);
    r->chunk_index = 0;
    r->chunk_count = 1;
    r->chunk_data.len = 0;
    r->chunk_data.data = NULL;
    r->whole_bytes = 0;
    r->whole_crc32c = 0;

    uint8_t *whole;
    size_t len;
    QRL_TRY(qrl_wire_encode_alloc(&r->base, &whole, &len, err));
    if (len <= max_bytes) {
        qrl_status st = chunks_alloc(out, 1, err);
        if (st != QRL_OK) {
            free(whole);
            return st;
        }
        out->data[0] = whole;
        out->len[0] = len;
        return QRL_OK;
    }

    size_t piece = max_bytes - CHUNK_OVERHEAD - id_len;
    size_t count = (len + piece - 1) / piece;
    qrl_status st = chunks_alloc(out, count, err);
    if (st != QRL_OK) {
        free(whole);
        return st;
    }
    uint32_t crc = qrl_wire_crc32c(0, whole, len);
    for (size_t i = 0; i < count; i++) {
        Qrl__GroupResult c = QRL__GROUP_RESULT__INIT;
        c.group_id = r->group_id;
        c.run_id = r->run_id;
        c.replica_id = r->replica_id;
        c.chunk_index = (uint32_t)i;
        c.chunk_count = (uint32_t)count;
        c.chunk_data.data = whole + i * piece;
        c.chunk_data.len = i + 1 < count ? piece : len - i * piece;
        c.whole_bytes = len;
        c.whole_crc32c = crc;
        st = qrl_wire_encode_alloc(&c.base, &out->data[i], &out->len[i], err);
        if (st != QRL_OK) break;
        QRL_CHECK(out->len[i] <= max_bytes);
    }
    free(whole);
    if (st != QRL_OK) qrl_wire_chunks_free(out);
    return st;
}

static int same_str(const char *a, const char *b) {
    return !strcmp(a ? a : "", b ? b : "");
}

qrl_status qrl_wire_result_join(Qrl__GroupResult *const *chunks, size_t n, size_t max_whole,
                                Qrl__GroupResult **out, qrl_error *err) {
    *out = NULL;
    if (max_whole == 0 || max_whole > QRL_WIRE_MAX_MESSAGE_BYTES)
        max_whole = QRL_WIRE_MAX_MESSAGE_BYTES;
    if (n < 2 || !chunks[0])
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "GroupResult join: %zu chunks (need >= 2)", n);
    const Qrl__GroupResult *first = chunks[0];
    unsigned long long gid = (unsigned long long)first->group_id;
    if (first->chunk_count != n)
        return qrl_error_set(err, QRL_STATUS_CORRUPT,
                             "GroupResult group %llu: %zu chunks given, chunk_count is %u", gid, n,
                             first->chunk_count);
    const Qrl__GroupResult **order = calloc(n, sizeof *order);
    if (!order) return qrl_error_set(err, QRL_STATUS_NOMEM, "GroupResult group %llu: no memory", gid);
    qrl_status st = QRL_OK;
    uint8_t *whole = NULL;
    uint64_t total = 0;
    for (size_t i = 0; i < n && st == QRL_OK; i++) {
        const Qrl__GroupResult *c = chunks[i];
        if (!c) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "GroupResult group %llu: chunks[%zu] is NULL",
                               gid, i);
            break;
        }
        if (c->group_id != first->group_id || c->run_id != first->run_id ||
            !same_str(c->replica_id, first->replica_id) || c->chunk_count != first->chunk_count ||
            c->whole_bytes != first->whole_bytes || c->whole_crc32c != first->whole_crc32c) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                               "GroupResult group %llu chunk %u: group_id, run_id, replica_id, "
                               "chunk_count, whole_bytes or whole_crc32c differ from chunk %u's",
                               gid, c->chunk_index, first->chunk_index);
            break;
        }
        /* a chunk message now (chunk_count == n >= 2): index < count, data present */
        QRL_TRY_GOTO(qrl_wire_group_result_validate(c, 0, 0, err), done);
        if (order[c->chunk_index]) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "GroupResult group %llu: chunk %u given twice",
                               gid, c->chunk_index);
            break;
        }
        order[c->chunk_index] = c;
        total += c->chunk_data.len;
    }
    if (st != QRL_OK) goto done;
    /* n distinct indices below n: every index is present */
    if (total != first->whole_bytes) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "GroupResult group %llu: chunks hold %llu bytes, whole_bytes is %llu", gid,
                           (unsigned long long)total, (unsigned long long)first->whole_bytes);
        goto done;
    }
    if (total > max_whole) {
        st = qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                           "GroupResult group %llu: whole result of %llu bytes exceeds %zu", gid,
                           (unsigned long long)total, max_whole);
        goto done;
    }
    whole = malloc((size_t)total);
    if (!whole) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "GroupResult group %llu: no memory", gid);
        goto done;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(whole + off, order[i]->chunk_data.data, order[i]->chunk_data.len);
        off += order[i]->chunk_data.len;
    }
    uint32_t crc = qrl_wire_crc32c(0, whole, off);
    if (crc != first->whole_crc32c) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "GroupResult group %llu: CRC-32C of the joined %zu bytes is %08x, "
                           "chunks say %08x",
                           gid, off, crc, first->whole_crc32c);
        goto done;
    }
    ProtobufCMessage *m;
    QRL_TRY_GOTO(qrl_wire_decode(&qrl__group_result__descriptor, whole, off, max_whole, &m, err),
                 done);
    Qrl__GroupResult *res = (Qrl__GroupResult *)m;
    if (res->group_id != first->group_id || res->chunk_count != 1) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "GroupResult group %llu: joined bytes hold group %llu with chunk_count "
                           "%u (expected this group, whole)",
                           gid, (unsigned long long)res->group_id, res->chunk_count);
        qrl_wire_free(m);
        goto done;
    }
    *out = res;
done:
    free(whole);
    free(order);
    return st;
}

/* ---- keys --------------------------------------------------------------------------- */

size_t qrl_wire_group_key(uint64_t group_id, char out[QRL_WIRE_KEY_MAX]) {
    int n = snprintf(out, QRL_WIRE_KEY_MAX, "%llu", (unsigned long long)group_id);
    QRL_CHECK(n > 0 && n < QRL_WIRE_KEY_MAX);
    return (size_t)n;
}

qrl_status qrl_wire_group_key_parse(const void *key, size_t len, uint64_t *group_id,
                                    qrl_error *err) {
    const uint8_t *k = key;
    *group_id = 0;
    if (len == 0 || len > QRL_WIRE_KEY_MAX - 1)
        return qrl_error_set(err, QRL_STATUS_PARSE, "group key: length %zu is not 1..%d", len,
                             QRL_WIRE_KEY_MAX - 1);
    if (k[0] == '0')
        return qrl_error_set(err, QRL_STATUS_PARSE, "group key: byte 0 is a leading '0'");
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (k[i] < '0' || k[i] > '9')
            return qrl_error_set(err, QRL_STATUS_PARSE, "group key: byte %zu (0x%02x) is not a digit",
                                 i, k[i]);
        unsigned d = (unsigned)(k[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return qrl_error_set(err, QRL_STATUS_PARSE, "group key: value overflows uint64 at byte %zu",
                                 i);
        v = v * 10 + d;
    }
    *group_id = v;
    return QRL_OK;
}
