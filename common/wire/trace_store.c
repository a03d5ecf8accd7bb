/* The TraceChunk store (trace_store.h). */
#include "wire/trace_store.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

#define NIL UINT32_MAX

/* glibc's chunk for a malloc(n): n + 8 bytes of header rounded up to 16, at least 32. */
static size_t heap(size_t n) {
    if (!n) return 0;
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

size_t qrl_trace_store_chunk_cost(const Qrl__TraceChunk *t) {
    size_t b = heap(sizeof *t) + heap(t->n_site_ids * sizeof *t->site_ids) + heap(t->scales.len) +
               heap(t->bits.len) + heap(t->record.len);
    /* protobuf-c points an absent string at a shared empty one */
    if (t->replica_id && t->replica_id != protobuf_c_empty_string) b += heap(strlen(t->replica_id) + 1);
    return b;
}

/* splitmix64's finalizer */
static uint64_t mix(uint64_t x) {
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t key_hash(uint64_t group_id, uint32_t response, const char *replica) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the replica id */
    for (const unsigned char *p = (const unsigned char *)replica; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return mix(h ^ mix(group_id ^ (uint64_t)response << 48 ^ (uint64_t)response));
}

static uint64_t group_hash(uint64_t group_id) { return mix(group_id); }

size_t qrl_trace_store_held_bytes(const qrl_trace_store *s) {
    size_t index = heap((size_t)s->cap_slab * sizeof *s->e) + (s->by_key ? 2 * heap(((size_t)s->mask + 1) * 4) : 0);
    return s->chunk_held + index;
}

/* ---- the two tables: slots hold entry + 1; linear probing, backward-shift deletion ---- */

static uint64_t slot_home_hash(const qrl_trace_store *s, const uint32_t *tab, uint32_t v) {
    const qrl_trace_store_entry *e = &s->e[v - 1];
    return tab == s->by_key ? e->hash : group_hash(e->group_id);
}

static void tab_put(qrl_trace_store *s, uint32_t *tab, uint64_t h, uint32_t idx) {
    uint32_t i = (uint32_t)h & s->mask;
    while (tab[i]) i = (i + 1) & s->mask;
    tab[i] = idx + 1;
}

static void tab_del(qrl_trace_store *s, uint32_t *tab, uint32_t i) {
    for (uint32_t j = i;;) {
        j = (j + 1) & s->mask;
        if (!tab[j]) break;
        uint32_t k = (uint32_t)slot_home_hash(s, tab, tab[j]) & s->mask;
        /* the entry at j may move to i when its home k is not in (i, j] (cyclically) */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) tab[i] = tab[j], i = j;
    }
    tab[i] = 0;
}

/* Slot of entry idx in tab (it is there). */
static uint32_t tab_slot_of(const qrl_trace_store *s, const uint32_t *tab, uint64_t h, uint32_t idx) {
    uint32_t i = (uint32_t)h & s->mask;
    while (tab[i] != idx + 1) i = (i + 1) & s->mask;
    return i;
}

static uint32_t group_head(const qrl_trace_store *s, uint64_t group_id, uint32_t *slot) {
    if (!s->by_group) return NIL;
    for (uint32_t i = (uint32_t)group_hash(group_id) & s->mask; s->by_group[i]; i = (i + 1) & s->mask)
        if (s->e[s->by_group[i] - 1].group_id == group_id) {
            if (slot) *slot = i;
            return s->by_group[i] - 1;
        }
    return NIL;
}

static void rebuild(qrl_trace_store *s, uint32_t cap) {
    free(s->by_key), free(s->by_group);
    s->mask = cap - 1;
    s->by_key = calloc(cap, sizeof *s->by_key);
    s->by_group = calloc(cap, sizeof *s->by_group);
    QRL_CHECK(s->by_key && s->by_group);
    for (uint32_t i = 0; i < s->n_slab; i++) {
        const qrl_trace_store_entry *e = &s->e[i];
        if (!e->live) continue;
        tab_put(s, s->by_key, e->hash, i);
        if (e->grp_prev == NIL) tab_put(s, s->by_group, group_hash(e->group_id), i);
    }
}

/* ---- entries ----------------------------------------------------------------------------- */

static void seen_unlink(qrl_trace_store *s, uint32_t i) {
    qrl_trace_store_entry *e = &s->e[i];
    if (e->seen_prev != NIL) s->e[e->seen_prev].seen_next = e->seen_next;
    else s->seen_head = e->seen_next;
    if (e->seen_next != NIL) s->e[e->seen_next].seen_prev = e->seen_prev;
    else s->seen_tail = e->seen_prev;
}

static void seen_append(qrl_trace_store *s, uint32_t i) {
    qrl_trace_store_entry *e = &s->e[i];
    e->seen_prev = s->seen_tail, e->seen_next = NIL;
    if (s->seen_tail != NIL) s->e[s->seen_tail].seen_next = i;
    else s->seen_head = i;
    s->seen_tail = i;
}

static void entry_remove(qrl_trace_store *s, uint32_t i) {
    qrl_trace_store_entry *e = &s->e[i];
    tab_del(s, s->by_key, tab_slot_of(s, s->by_key, e->hash, i));
    if (e->grp_prev != NIL) {
        s->e[e->grp_prev].grp_next = e->grp_next;
    } else { /* the group's head: its slot goes to the next response, or away */
        uint32_t slot = tab_slot_of(s, s->by_group, group_hash(e->group_id), i);
        if (e->grp_next != NIL) s->by_group[slot] = e->grp_next + 1;
        else tab_del(s, s->by_group, slot);
    }
    if (e->grp_next != NIL) s->e[e->grp_next].grp_prev = e->grp_prev;
    seen_unlink(s, i);
    for (uint32_t k = 0; k < e->n; k++) protobuf_c_message_free_unpacked(&e->chunks[k]->base, NULL);
    free(e->chunks);
    free(e->replica);
    s->chunk_held -= e->held;
    *e = (qrl_trace_store_entry){.seen_next = s->free_head};
    s->free_head = i;
    s->live--;
}

static uint32_t find_idx(const qrl_trace_store *s, uint64_t h, uint64_t group_id, uint32_t response,
                         const char *replica) {
    if (!s->by_key) return NIL;
    for (uint32_t i = (uint32_t)h & s->mask; s->by_key[i]; i = (i + 1) & s->mask) {
        const qrl_trace_store_entry *e = &s->e[s->by_key[i] - 1];
        if (e->hash == h && e->group_id == group_id && e->response == response && !strcmp(e->replica, replica))
            return s->by_key[i] - 1;
    }
    return NIL;
}

const qrl_trace_store_entry *qrl_trace_store_find(const qrl_trace_store *s, uint64_t group_id, uint32_t response,
                                                  const char *replica) {
    uint32_t i = find_idx(s, key_hash(group_id, response, replica), group_id, response, replica);
    return i == NIL ? NULL : &s->e[i];
}

static uint32_t entry_new(qrl_trace_store *s, uint64_t h, uint64_t group_id, uint32_t response, const char *replica,
                          uint64_t now_ms) {
    if (!s->by_key) s->seen_head = s->seen_tail = s->free_head = NIL, rebuild(s, 64);
    else if (2 * ((size_t)s->live + 1) > (size_t)s->mask + 1) rebuild(s, 2 * (s->mask + 1));
    uint32_t i = s->free_head;
    if (i != NIL) {
        s->free_head = s->e[i].seen_next;
    } else {
        if (s->n_slab == s->cap_slab) {
            s->cap_slab = s->cap_slab ? 2 * s->cap_slab : 64;
            s->e = realloc(s->e, (size_t)s->cap_slab * sizeof *s->e);
            QRL_CHECK(s->e != NULL);
        }
        i = s->n_slab++;
    }
    qrl_trace_store_entry *e = &s->e[i];
    *e = (qrl_trace_store_entry){.group_id = group_id, .response = response, .replica = strdup(replica),
                                 .first_ms = now_ms, .hash = h, .grp_prev = NIL, .grp_next = NIL, .live = true};
    QRL_CHECK(e->replica != NULL);
    e->held = heap(strlen(replica) + 1);
    s->chunk_held += e->held;
    tab_put(s, s->by_key, h, i);
    uint32_t slot, head = group_head(s, group_id, &slot);
    if (head == NIL) {
        tab_put(s, s->by_group, group_hash(group_id), i);
    } else { /* second in the group's list: the head's slot stays */
        e->grp_prev = head, e->grp_next = s->e[head].grp_next;
        if (e->grp_next != NIL) s->e[e->grp_next].grp_prev = i;
        s->e[head].grp_next = i;
    }
    seen_append(s, i);
    s->live++;
    return i;
}

qrl_trace_store_add_result qrl_trace_store_add(qrl_trace_store *s, Qrl__TraceChunk *t, uint64_t now_ms,
                                               size_t max_bytes, size_t *evicted, uint64_t *evicted_group,
                                               uint32_t *evicted_response) {
    const char *rep = t->replica_id ? t->replica_id : "";
    uint64_t h = key_hash(t->group_id, t->response_index, rep);
    uint32_t i = find_idx(s, h, t->group_id, t->response_index, rep);
    uint32_t lo = 0;
    if (i != NIL) { /* binary search for the chunk index; in-order arrival ends at n */
        const qrl_trace_store_entry *e = &s->e[i];
        uint32_t hi = e->n;
        if (hi && e->chunks[hi - 1]->chunk_index < t->chunk_index) lo = hi;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (e->chunks[mid]->chunk_index < t->chunk_index) lo = mid + 1;
            else hi = mid;
        }
        if (lo < e->n && e->chunks[lo]->chunk_index == t->chunk_index) {
            protobuf_c_message_free_unpacked(&t->base, NULL);
            return QRL_TRACE_STORE_DUPLICATE;
        }
    }
    size_t cost = qrl_trace_store_chunk_cost(t), n_ev = 0;
    /* a new response adds its replica copy and first chunk array */
    size_t need = cost + (i == NIL ? heap(strlen(rep) + 1) + heap(4 * sizeof(void *)) : 0);
    while (s->live && qrl_trace_store_held_bytes(s) + need > max_bytes) {
        uint32_t old = s->seen_head;
        if (evicted_group) *evicted_group = s->e[old].group_id;
        if (evicted_response) *evicted_response = s->e[old].response;
        if (old == i) i = NIL, lo = 0; /* its own response went: starts again */
        entry_remove(s, old);
        n_ev++;
    }
    if (evicted) *evicted = n_ev;
    if (i == NIL) i = entry_new(s, h, t->group_id, t->response_index, rep, now_ms);
    qrl_trace_store_entry *e = &s->e[i];
    if (e->n == e->cap) {
        size_t before = heap((size_t)e->cap * sizeof *e->chunks);
        e->cap = e->cap ? 2 * e->cap : 4;
        e->chunks = realloc(e->chunks, (size_t)e->cap * sizeof *e->chunks);
        QRL_CHECK(e->chunks != NULL);
        size_t after = heap((size_t)e->cap * sizeof *e->chunks);
        e->held += after - before, s->chunk_held += after - before;
    }
    memmove(&e->chunks[lo + 1], &e->chunks[lo], (e->n - lo) * sizeof *e->chunks);
    e->chunks[lo] = t;
    e->n++;
    e->held += cost, s->chunk_held += cost;
    e->last_ms = now_ms;
    seen_unlink(s, i);
    seen_append(s, i);
    return QRL_TRACE_STORE_STORED;
}

size_t qrl_trace_store_drop_group(qrl_trace_store *s, uint64_t group_id) {
    size_t n = 0;
    for (uint32_t i; (i = group_head(s, group_id, NULL)) != NIL; n++) entry_remove(s, i);
    return n;
}

size_t qrl_trace_store_expire(qrl_trace_store *s, uint64_t now_ms, uint64_t max_age_ms) {
    size_t n = 0;
    while (s->live && now_ms - s->e[s->seen_head].last_ms > max_age_ms) {
        entry_remove(s, s->seen_head);
        n++;
    }
    return n;
}

void qrl_trace_store_free(qrl_trace_store *s) {
    while (s->live) entry_remove(s, s->seen_head);
    free(s->e), free(s->by_key), free(s->by_group);
    memset(s, 0, sizeof *s);
}
