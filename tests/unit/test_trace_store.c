/* The TraceChunk store (common/wire/trace_store.h): 50k small chunks of 2500 responses
 * stored in shuffled order with duplicates join to exactly the records that were sent;
 * dropping a group removes its responses only; expiry and eviction take the responses
 * whose latest chunk is oldest; the held bytes are the heap the store holds (measured). */
#include <criterion/criterion.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "wire/trace_store.h"
#include "wire/wire.h"

static const char *const REPLICAS[2] = {"r0", "replica-1"};
static const uint32_t SITES[3] = {0x00000, 0x01000, 0x10003};

/* Record bytes of chunk i of (group, response, replica r): 6 to 13 bytes of a pattern. */
static size_t record_of(uint64_t g, uint32_t k, int r, uint32_t i, uint8_t *out) {
    size_t n = 6 + (g + i) % 8;
    for (size_t b = 0; b < n; b++) out[b] = (uint8_t)(g * 131 + k * 31 + (uint64_t)r * 7 + i * 3 + b);
    return n;
}

static uint32_t chunks_of(uint64_t g, uint32_t k) { return 1 + (uint32_t)((g * 7 + k) % 8); }

/* The decoded TraceChunks of one response (count chunks_of, one token each). */
static void make_response(uint64_t g, uint32_t k, int r, Qrl__TraceChunk **out) {
    uint32_t n = chunks_of(g, k);
    uint8_t rec[8][16], *recp[8];
    size_t len[8];
    uint32_t begin[8], cnt[8], crc = 0;
    for (uint32_t i = 0; i < n; i++) {
        len[i] = record_of(g, k, r, i, rec[i]), recp[i] = rec[i], begin[i] = i, cnt[i] = 1;
        crc = qrl_crc32(crc, rec[i], len[i]);
    }
    qrl_wire_trace_ident id = {.group_id = g, .run_id = 5, .replica_id = REPLICAS[r], .response_index = k};
    qrl_wire_trace_pieces pc = {n, recp, len, begin, cnt, n, crc};
    qrl_wire_chunks w;
    qrl_error e;
    cr_assert_eq(qrl_wire_trace_chunks_encode(&id, SITES, 3, &pc, 4096, &w, &e), QRL_OK, "%s", e.msg);
    for (uint32_t i = 0; i < n; i++) {
        ProtobufCMessage *m = NULL;
        cr_assert_eq(qrl_wire_decode(&qrl__trace_chunk__descriptor, w.data[i], w.len[i], 0, &m, &e), QRL_OK);
        out[i] = (Qrl__TraceChunk *)m;
    }
    qrl_wire_chunks_free(&w);
}

/* The stored chunks of (g, k, r) join to the records that were sent. */
static void check_join(const qrl_trace_store *s, uint64_t g, uint32_t k, int r) {
    const qrl_trace_store_entry *e = qrl_trace_store_find(s, g, k, REPLICAS[r]);
    cr_assert_not_null(e, "group %llu response %u replica %s missing", (unsigned long long)g, k, REPLICAS[r]);
    uint32_t n = chunks_of(g, k);
    cr_assert_eq(e->n, n);
    const Qrl__TraceChunk *ord[8];
    size_t cnt = 0;
    qrl_error err;
    cr_assert_eq(qrl_wire_trace_join(e->chunks, e->n, ord, &cnt, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(cnt, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t want[16];
        size_t len = record_of(g, k, r, i, want);
        cr_assert_eq(e->chunks[i], ord[i], "stored out of index order");
        cr_assert_eq(ord[i]->group_id, g);
        cr_assert_str_eq(ord[i]->replica_id, REPLICAS[r]);
        cr_assert_eq(ord[i]->record.len, len);
        cr_assert_arr_eq(ord[i]->record.data, want, len);
    }
}

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Whether mallinfo2 sees this process's allocations (ASan and valgrind replace malloc). */
static bool heap_counted(void) {
    size_t a = heap_in_use();
    void *p = malloc(1 << 16);
    size_t b = heap_in_use();
    free(p);
    return b >= a + (1 << 16);
}

#define GROUPS 1250 /* x 4 responses x 2 replicas x 4.5 chunks = 45k, + 1 in 8 twice */

Test(trace_store, many_chunks_shuffled_with_duplicates_join_exactly) {
    size_t n_unique = 0;
    for (uint64_t g = 1; g <= GROUPS; g++)
        for (uint32_t k = 0; k < 4; k++) n_unique += 2 * chunks_of(g, k);
    size_t n_all = n_unique + n_unique / 8 + 8, before = heap_in_use();
    Qrl__TraceChunk **all = malloc(n_all * sizeof *all);
    cr_assert_not_null(all);
    size_t n = 0, dups = 0;
    for (uint64_t g = 1; g <= GROUPS; g++)
        for (uint32_t k = 0; k < 4; k++)
            for (int r = 0; r < 2; r++) {
                make_response(g, k, r, all + n);
                size_t c = chunks_of(g, k);
                if ((g + k + (uint64_t)r) % 8 == 0) { /* its chunk 0 again: a duplicate */
                    Qrl__TraceChunk *again[8];
                    make_response(g, k, r, again);
                    for (size_t i = 1; i < c; i++) qrl_wire_free(&again[i]->base);
                    all[n + c] = again[0], dups++;
                    c++;
                }
                n += c;
            }
    cr_assert_geq(n_unique, 40000);
    uint64_t rs = 42; /* Fisher-Yates with an LCG: arrival in any order */
    for (size_t i = n; i > 1; i--) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        size_t j = (size_t)((rs >> 33) % i);
        Qrl__TraceChunk *x = all[i - 1];
        all[i - 1] = all[j], all[j] = x;
    }
    qrl_trace_store s = {0};
    size_t stored = 0, wire = 0, dup_seen = 0, ev = 1;
    for (size_t i = 0; i < n; i++) {
        qrl_trace_store_add_result a = qrl_trace_store_add(&s, all[i], 1000 + i, SIZE_MAX, &ev, NULL, NULL);
        cr_assert_eq(ev, 0);
        if (a == QRL_TRACE_STORE_STORED) wire += protobuf_c_message_get_packed_size(&all[i]->base);
        *(a == QRL_TRACE_STORE_STORED ? &stored : &dup_seen) += 1;
    }
    free(all);
    cr_assert_eq(stored, n_unique);
    cr_assert_eq(dup_seen, dups);
    cr_assert_eq(s.live, GROUPS * 8);
    /* the accounting is the heap the store holds: within 10% of malloc's own count, while
     * the chunks' wire bytes are a fraction of it (the newcomer's ~10x) */
    size_t held = qrl_trace_store_held_bytes(&s), measured = 0;
    measured = heap_in_use() - before; /* the chunks and the store: `all` is freed */
    bool counted = heap_counted();
    if (counted)
        cr_assert(held > measured * 9 / 10 && held < measured * 11 / 10, "held %zu, heap %zu", held, measured);
    cr_log_info("%zu chunks, %zu wire bytes: held %zu, heap %zu", stored, wire, held, measured);
    for (uint64_t g = 1; g <= GROUPS; g++)
        for (uint32_t k = 0; k < 4; k++)
            for (int r = 0; r < 2; r++) check_join(&s, g, k, r);
    cr_assert_null(qrl_trace_store_find(&s, GROUPS + 1, 0, "r0"));
    cr_assert_null(qrl_trace_store_find(&s, 1, 4, "r0"));
    cr_assert_null(qrl_trace_store_find(&s, 1, 0, "r1"));
    /* taking every odd group drops its 8 responses and nothing else */
    for (uint64_t g = 1; g <= GROUPS; g += 2) cr_assert_eq(qrl_trace_store_drop_group(&s, g), 8);
    cr_assert_eq(qrl_trace_store_drop_group(&s, 1), 0);
    cr_assert_eq(s.live, GROUPS / 2 * 8);
    for (uint64_t g = 1; g <= GROUPS; g++)
        for (uint32_t k = 0; k < 4; k++)
            for (int r = 0; r < 2; r++)
                if (g % 2) cr_assert_null(qrl_trace_store_find(&s, g, k, REPLICAS[r]));
                else check_join(&s, g, k, r);
    qrl_trace_store_free(&s);
    cr_assert_eq(qrl_trace_store_held_bytes(&s), 0);
    if (counted) cr_assert_leq(heap_in_use(), before + 65536, "the store leaked: %zu -> %zu", before, heap_in_use());
}

Test(trace_store, expiry_and_eviction_take_the_least_recent_response) {
    qrl_trace_store s = {0};
    Qrl__TraceChunk *c[8];
    /* groups 1..4, response 0 of r0, chunk 0 each at t = 10 * g */
    for (uint64_t g = 1; g <= 4; g++) {
        make_response(g, 0, 0, c);
        for (uint32_t i = 0; i < chunks_of(g, 0); i++)
            if (i == 0) cr_assert_eq(qrl_trace_store_add(&s, c[i], 10 * g, SIZE_MAX, NULL, NULL, NULL), 0);
            else qrl_wire_free(&c[i]->base);
    }
    /* group 1's response gets a chunk (index 1) at t = 50: now the most recent */
    make_response(1, 0, 0, c);
    qrl_wire_free(&c[0]->base);
    for (uint32_t i = 2; i < chunks_of(1, 0); i++) qrl_wire_free(&c[i]->base);
    cr_assert_eq(qrl_trace_store_add(&s, c[1], 50, SIZE_MAX, NULL, NULL, NULL), QRL_TRACE_STORE_STORED);
    cr_assert_eq(qrl_trace_store_find(&s, 1, 0, "r0")->n, 2);
    cr_assert_eq(qrl_trace_store_find(&s, 1, 0, "r0")->first_ms, 10);
    /* expire at t = 75 with max age 40: groups 2 (20) and 3 (30) go, 4 (40) and 1 (50) stay */
    cr_assert_eq(qrl_trace_store_expire(&s, 75, 40), 2);
    cr_assert_null(qrl_trace_store_find(&s, 2, 0, "r0"));
    cr_assert_null(qrl_trace_store_find(&s, 3, 0, "r0"));
    cr_assert_not_null(qrl_trace_store_find(&s, 4, 0, "r0"));
    /* a bound just above what is held: the next chunk evicts group 4's response (oldest) */
    size_t held = qrl_trace_store_held_bytes(&s), ev = 0;
    uint64_t eg = 0;
    uint32_t er = 9;
    make_response(9, 1, 1, c);
    for (uint32_t i = 1; i < chunks_of(9, 1); i++) qrl_wire_free(&c[i]->base);
    size_t cost = qrl_trace_store_chunk_cost(c[0]);
    cr_assert_gt(cost, c[0]->record.len);
    cr_assert_eq(qrl_trace_store_add(&s, c[0], 80, held + cost / 2, &ev, &eg, &er), QRL_TRACE_STORE_STORED);
    cr_assert_eq(ev, 1);
    cr_assert_eq(eg, 4);
    cr_assert_eq(er, 0);
    cr_assert_null(qrl_trace_store_find(&s, 4, 0, "r0"));
    cr_assert_not_null(qrl_trace_store_find(&s, 1, 0, "r0"));
    cr_assert_not_null(qrl_trace_store_find(&s, 9, 1, "replica-1"));
    cr_assert_leq(qrl_trace_store_held_bytes(&s), held + cost / 2);
    /* a bound below one chunk: everything else goes, the chunk is still stored */
    make_response(10, 0, 0, c);
    for (uint32_t i = 1; i < chunks_of(10, 0); i++) qrl_wire_free(&c[i]->base);
    cr_assert_eq(qrl_trace_store_add(&s, c[0], 90, 1, &ev, NULL, NULL), QRL_TRACE_STORE_STORED);
    cr_assert_eq(ev, 2);
    cr_assert_eq(s.live, 1);
    cr_assert_eq(qrl_trace_store_expire(&s, 90, 0), 0);
    cr_assert_eq(qrl_trace_store_expire(&s, 91, 0), 1);
    cr_assert_eq(s.live, 0);
    qrl_trace_store_free(&s);
}
