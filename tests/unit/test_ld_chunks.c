/* Chunked-result reassembly (common/wire/chunk_join.h): chunks of one production joined in
 * any order, another replica's production of the same group kept apart, a corrupted chunk
 * refused with its offset released, an incomplete set expired, and the limits (chunk
 * count, open sets) refusing before anything is held. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "wire/chunk_join.h"
#include "wire/wire.h"

/* A result of g responses of len tokens from `replica` (heap), big enough to chunk. */
static Qrl__GroupResult *make_result(uint64_t id, const char *replica, size_t g, size_t len) {
    Qrl__GroupResult *r = calloc(1, sizeof *r);
    qrl__group_result__init(r);
    r->group_id = id, r->run_id = 5, r->replica_id = strdup(replica);
    r->group_size = (uint32_t)g, r->chunk_count = 1;
    r->n_prompt_token_ids = 3;
    r->prompt_token_ids = malloc(3 * sizeof(uint32_t));
    for (int i = 0; i < 3; i++) r->prompt_token_ids[i] = (uint32_t)(10 + i);
    r->n_responses = g;
    r->responses = calloc(g, sizeof *r->responses);
    for (size_t i = 0; i < g; i++) {
        Qrl__Response *x = calloc(1, sizeof *x);
        qrl__response__init(x);
        x->n_token_ids = x->n_behavior_logprobs = len;
        x->token_ids = malloc(len * sizeof(uint32_t));
        x->behavior_logprobs = malloc(len * sizeof(float));
        for (size_t t = 0; t < len; t++) {
            x->token_ids[t] = (uint32_t)((i * 31 + t * 7) % 500);
            x->behavior_logprobs[t] = -(float)(t % 50) / 10.0f;
        }
        x->reward = (float)(i % 2);
        r->responses[i] = x;
    }
    return r;
}

/* Encode r as chunks of at most `limit` bytes and decode them back (the learner's view). */
static size_t chunk_messages(Qrl__GroupResult *r, size_t limit, Qrl__GroupResult ***out) {
    qrl_wire_chunks ch;
    qrl_error e;
    cr_assert_eq(qrl_wire_result_encode_chunked(r, limit, &ch, &e), QRL_OK, "%s", e.msg);
    cr_assert_gt(ch.count, 2);
    *out = calloc(ch.count, sizeof **out);
    for (size_t i = 0; i < ch.count; i++) {
        ProtobufCMessage *m;
        cr_assert_eq(qrl_wire_decode(&qrl__group_result__descriptor, ch.data[i], ch.len[i],
                                     QRL_WIRE_DEFAULT_CHUNK_BYTES, &m, &e), QRL_OK, "%s", e.msg);
        (*out)[i] = (Qrl__GroupResult *)m;
    }
    size_t n = ch.count;
    qrl_wire_chunks_free(&ch);
    return n;
}

static void *off_of(int *slot) { return slot; }

Test(ld_chunks, joins_any_order_and_keeps_replicas_apart) {
    Qrl__GroupResult *a = make_result(42, "r0", 4, 600), *b = make_result(42, "r1", 4, 600);
    Qrl__GroupResult **ca, **cb;
    size_t na = chunk_messages(a, 2048, &ca), nb = chunk_messages(b, 2048, &cb);
    int offs[2];
    qrl_wire_joiner c = {0};
    qrl_wire_join_outcome o;
    qrl_error e;
    /* interleave the two productions; a's chunks in reverse order */
    for (size_t i = 0; i < na; i++) {
        cr_assert_eq(qrl_wire_joiner_add(&c, ca[na - 1 - i], 3, off_of(&offs[0]), 1000, &o, &e), QRL_OK,
                     "%s", e.msg);
        cr_assert_eq(o.held, i == 0, "only the first chunk of a set holds its offset");
        if (i + 1 < na) {
            cr_assert(!o.done);
            if (i < nb - 1)
                cr_assert_eq(qrl_wire_joiner_add(&c, cb[i], 4, off_of(&offs[1]), 1000, &o, &e), QRL_OK);
            cr_assert(!o.done);
        }
    }
    cr_assert(o.done, "a's last chunk completes its set");
    cr_assert_eq(o.partition, 3);
    cr_assert_eq(o.first, off_of(&offs[0]));
    cr_assert_not_null(o.whole);
    cr_assert_eq(o.whole->group_id, 42);
    cr_assert_str_eq(o.whole->replica_id, "r0");
    cr_assert_eq(o.whole->n_responses, 4);
    cr_assert_eq(o.whole->responses[3]->n_token_ids, 600);
    cr_assert_eq(o.whole->responses[3]->token_ids[599], (3 * 31 + 599 * 7) % 500);
    qrl_wire_free(&o.whole->base);
    cr_assert_eq(c.n, 1, "r1's production is still open on its own");
    cr_assert_eq(qrl_wire_joiner_add(&c, cb[nb - 1], 4, off_of(&offs[1]), 1000, &o, &e), QRL_OK);
    cr_assert(o.done && o.whole && strcmp(o.whole->replica_id, "r1") == 0);
    cr_assert_eq(o.first, off_of(&offs[1]));
    qrl_wire_free(&o.whole->base);
    cr_assert_eq(c.n, 0);
    qrl_wire_joiner_free(&c);
    qrl_wire_free(&a->base), qrl_wire_free(&b->base);
    free(ca), free(cb);
}

Test(ld_chunks, corrupt_chunk_refused_and_offset_released) {
    Qrl__GroupResult *a = make_result(7, "r0", 4, 600), **ca;
    size_t n = chunk_messages(a, 2048, &ca);
    ca[1]->chunk_data.data[5] ^= 0x40; /* a flipped bit in the middle of the whole */
    int off;
    qrl_wire_joiner c = {0};
    qrl_wire_join_outcome o;
    qrl_error e;
    for (size_t i = 0; i + 1 < n; i++)
        cr_assert_eq(qrl_wire_joiner_add(&c, ca[i], 0, off_of(&off), 5, &o, &e), QRL_OK);
    cr_assert_eq(qrl_wire_joiner_add(&c, ca[n - 1], 0, off_of(&off), 5, &o, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "CRC") || strstr(e.msg, "crc"), "%s", e.msg);
    cr_assert(o.done && !o.whole, "done without a result: the caller dead-letters it");
    cr_assert_eq(o.first, off_of(&off));
    cr_assert_eq(c.n, 0);
    qrl_wire_joiner_free(&c);
    qrl_wire_free(&a->base);
    free(ca);
}

Test(ld_chunks, incomplete_set_expires_and_limits_refuse) {
    Qrl__GroupResult *a = make_result(9, "r0", 4, 600), **ca;
    size_t n = chunk_messages(a, 2048, &ca);
    int off;
    qrl_wire_joiner c = {0};
    qrl_wire_join_outcome o, gone[4];
    qrl_error e;
    cr_assert_eq(qrl_wire_joiner_add(&c, ca[0], 2, off_of(&off), 1000, &o, &e), QRL_OK);
    cr_assert_eq(qrl_wire_joiner_expire(&c, 60999, 60000, gone, 4), 0, "not yet 60 s old");
    cr_assert_eq(qrl_wire_joiner_expire(&c, 61000, 60000, gone, 4), 1);
    cr_assert(gone[0].done && !gone[0].whole && gone[0].partition == 2 && gone[0].first == off_of(&off));
    cr_assert_eq(c.n, 0);
    for (size_t i = 1; i < n; i++) qrl_wire_free(&ca[i]->base);
    /* limits: too many chunks; too many open sets (the chunk is dropped, nothing held) */
    Qrl__GroupResult *big = make_result(10, "r0", 1, 1);
    big->chunk_count = QRL_WIRE_MAX_CHUNKS + 1;
    cr_assert_eq(qrl_wire_joiner_add(&c, big, 0, off_of(&off), 0, &o, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(e.msg, "chunked result: chunk_count 4097 above 4096");
    cr_assert(!o.held && !o.done);
    for (int i = 0; i < QRL_WIRE_MAX_CHUNK_SETS; i++) {
        Qrl__GroupResult *r = make_result(100 + (uint64_t)i, "r0", 1, 1);
        r->chunk_count = 2;
        cr_assert_eq(qrl_wire_joiner_add(&c, r, 0, off_of(&off), 0, &o, &e), QRL_OK);
    }
    Qrl__GroupResult *r = make_result(99999, "r0", 1, 1);
    r->chunk_count = 2;
    cr_assert_eq(qrl_wire_joiner_add(&c, r, 0, off_of(&off), 0, &o, &e), QRL_STATUS_BUSY);
    cr_assert(strstr(e.msg, "256 incomplete sets") != NULL, "%s", e.msg);
    qrl_wire_joiner_free(&c);
    qrl_wire_free(&a->base);
    free(ca);
}
