/* Ingest rate of the learner's TraceChunk store (common/wire/trace_store.h) against its
 * anchor, the store it replaced (services/learner/trace.c before: an array of responses
 * scanned per chunk to find the chunk's response, so N chunks cost O(N^2)).  Chunks are
 * small (one per response, 4 responses per group, as in a long-response run cut into many
 * chunks or many short responses); the take (join lookup + group drop) is timed too.
 *   build/bench/trace_store [--out FILE]   (default bench/results/trace_store.json; CPU) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/crc32.h"
#include "wire/trace_store.h"
#include "wire/wire.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static Qrl__TraceChunk *make_chunk(uint64_t g, uint32_t k) {
    static const uint32_t sites[2] = {0x00000, 0x03000};
    uint8_t rec[24];
    for (size_t b = 0; b < sizeof rec; b++) rec[b] = (uint8_t)(g + k + b);
    uint8_t *rp = rec;
    size_t len = sizeof rec;
    uint32_t begin = 0, cnt = 1, crc = qrl_crc32(0, rec, len);
    qrl_wire_trace_ident id = {.group_id = g, .run_id = 1, .replica_id = "replica-0", .response_index = k};
    qrl_wire_trace_pieces pc = {1, &rp, &len, &begin, &cnt, 1, crc};
    qrl_wire_chunks w;
    qrl_error e;
    ProtobufCMessage *m = NULL;
    if (qrl_wire_trace_chunks_encode(&id, sites, 2, &pc, 4096, &w, &e) != QRL_OK ||
        qrl_wire_decode(&qrl__trace_chunk__descriptor, w.data[0], w.len[0], 0, &m, &e) != QRL_OK) {
        fprintf(stderr, "trace_store: %s\n", e.msg);
        exit(1);
    }
    qrl_wire_chunks_free(&w);
    return (Qrl__TraceChunk *)m;
}

/* The anchor: the old store's lookup (linear scan by group, response, replica) and its
 * per-response duplicate scan; the same allocations per response. */
typedef struct old_entry {
    uint64_t group_id;
    uint32_t response;
    char *replica;
    Qrl__TraceChunk **chunks;
    size_t n, cap;
} old_entry;

static old_entry *old_find(old_entry *e, size_t n, uint64_t g, uint32_t k, const char *rep) {
    for (size_t i = 0; i < n; i++)
        if (e[i].group_id == g && e[i].response == k && !strcmp(e[i].replica, rep)) return &e[i];
    return NULL;
}

static double run_old(Qrl__TraceChunk **ch, size_t n, double *take_s) {
    old_entry *e = NULL;
    size_t ne = 0, cap = 0;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        Qrl__TraceChunk *t = ch[i];
        old_entry *x = old_find(e, ne, t->group_id, t->response_index, t->replica_id);
        bool dup = false;
        for (size_t j = 0; x && j < x->n; j++) dup |= x->chunks[j]->chunk_index == t->chunk_index;
        if (dup) continue;
        if (!x) {
            if (ne == cap) cap = cap ? 2 * cap : 64, e = realloc(e, cap * sizeof *e);
            x = &e[ne++];
            *x = (old_entry){.group_id = t->group_id, .response = t->response_index, .replica = strdup(t->replica_id)};
        }
        if (x->n == x->cap) x->cap = x->cap ? 2 * x->cap : 4, x->chunks = realloc(x->chunks, x->cap * sizeof *x->chunks);
        x->chunks[x->n++] = t;
    }
    double t1 = now();
    for (uint64_t g = 1; ne; g++) { /* take every group in order: 4 lookups, then the drop scan */
        for (uint32_t k = 0; k < 4; k++)
            if (!old_find(e, ne, g, k, "replica-0")) exit(2);
        for (size_t i = ne; i-- > 0;)
            if (e[i].group_id == g) {
                free(e[i].chunks), free(e[i].replica); /* the chunks stay: run_new reuses them */
                e[i] = e[--ne];
            }
    }
    *take_s = now() - t1;
    free(e);
    return t1 - t0;
}

static double run_new(Qrl__TraceChunk **ch, size_t n, double *take_s, size_t *held) {
    qrl_trace_store s = {0};
    double t0 = now();
    for (size_t i = 0; i < n; i++) qrl_trace_store_add(&s, ch[i], 0, SIZE_MAX, NULL, NULL, NULL);
    double t1 = now();
    *held = qrl_trace_store_held_bytes(&s);
    for (uint64_t g = 1; s.live; g++) {
        for (uint32_t k = 0; k < 4; k++)
            if (!qrl_trace_store_find(&s, g, k, "replica-0")) exit(3);
        qrl_trace_store_drop_group(&s, g); /* frees the chunks */
    }
    *take_s = now() - t1;
    qrl_trace_store_free(&s);
    return t1 - t0;
}

int main(int argc, char **argv) {
    const char *out = "bench/results/trace_store.json";
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--out")) out = argv[++i];
    static const size_t sizes[] = {20000, 40000, 80000};
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "trace_store: cannot write %s\n", out);
        return 1;
    }
    fprintf(f, "[\n");
    printf("%8s %14s %14s %10s %12s %12s %12s %12s\n", "chunks", "old chunks/s", "new chunks/s", "speedup",
           "old take s", "new take s", "wire MB", "held MB");
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si], wire = 0;
        Qrl__TraceChunk **ch = malloc(n * sizeof *ch);
        for (size_t i = 0; i < n; i++) {
            ch[i] = make_chunk(1 + i / 4, (uint32_t)(i % 4));
            wire += protobuf_c_message_get_packed_size(&ch[i]->base);
        }
        double old_take, new_take;
        size_t held;
        double old_s = run_old(ch, n, &old_take);
        double new_s = run_new(ch, n, &new_take, &held);
        free(ch);
        printf("%8zu %14.0f %14.0f %9.0fx %12.4f %12.4f %12.2f %12.2f\n", n, n / old_s, n / new_s, old_s / new_s,
               old_take, new_take, wire / 1e6, held / 1e6);
        fprintf(f, "  {\"chunks\": %zu, \"old_ingest_s\": %.6f, \"new_ingest_s\": %.6f, \"old_take_s\": %.6f, "
                   "\"new_take_s\": %.6f, \"wire_bytes\": %zu, \"held_bytes\": %zu}%s\n",
                n, old_s, new_s, old_take, new_take, wire, held, si + 1 < sizeof sizes / sizeof *sizes ? "," : "");
    }
    fprintf(f, "]\n");
    fclose(f);
    printf("(old: the per-chunk scan this store replaced; take: 4 lookups + the group's drop per group; %s)\n", out);
    return 0;
}
