/* qrl-learner dispatch (dispatch.h): PromptGroups out, the group table, redispatch. */
#include "dispatch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "wire/wire.h"

typedef struct ld_ginfo { /* what a checkpoint needs of a dispatched group */
    uint64_t dispatch_version;
    uint64_t sent_ms; /* unix ms of its last production (learner.redispatch_timeout_s) */
    bool delivered;   /* the broker acknowledged its PromptGroup */
} ld_ginfo;

static struct {
    uint32_t *perm, epoch;
    size_t cursor;
    uint64_t next_id, in_flight;
    uint64_t oldest_dispatched;  /* ids below it are past GS_DISPATCHED (redispatch scan) */
    uint64_t redispatched;
    uint8_t *state;
    size_t state_cap;
    ld_ginfo *ginfo; /* [state_cap]: per group, for checkpoints */
} D;

void ld_dispatch_init(ld_core *c) {
    D.next_id = 1;
    D.perm = malloc(c->ds->n * sizeof *D.perm);
    QRL_CHECK(D.perm != NULL);
    qrl_epoch_order(c->ds->n, c->seed, 0, D.perm);
}

void ld_dispatch_free(void) {
    free(D.state);
    free(D.ginfo);
    free(D.perm);
    memset(&D, 0, sizeof D);
}

void ld_group_set(uint64_t id, uint8_t s) {
    if (id >= D.state_cap) {
        size_t n = D.state_cap ? D.state_cap : 1024;
        while (n <= id) n *= 2;
        uint8_t *ns = realloc(D.state, n);
        QRL_CHECK(ns != NULL);
        memset(ns + D.state_cap, 0, n - D.state_cap);
        ld_ginfo *gi = realloc(D.ginfo, n * sizeof *gi);
        QRL_CHECK(gi != NULL);
        memset(gi + D.state_cap, 0, (n - D.state_cap) * sizeof *gi);
        D.ginfo = gi;
        D.state = ns;
        D.state_cap = n;
    }
    D.state[id] = s;
}

uint8_t ld_group_state(uint64_t id) { return id < D.state_cap ? D.state[id] : GS_NONE; }

ld_dispatch_counts ld_dispatch_counts_now(void) {
    return (ld_dispatch_counts){.next_id = D.next_id, .in_flight = D.in_flight, .epoch = D.epoch,
                                .cursor = D.cursor, .redispatched = D.redispatched};
}

void ld_dispatch_acked(ld_core *c, uint64_t id) {
    if (id < D.state_cap) D.ginfo[id].delivered = true;
}

void ld_dispatch_taken(uint64_t n) { D.in_flight -= n; }

bool ld_dispatch_alternate(const ld_core *c) {
    return c->s->learner.mode == LD_MODE_ALTERNATE;
}

uint64_t ld_dispatch_window(const ld_core *c) {
    if (ld_dispatch_alternate(c)) return c->T; /* synchronous: one version's quota at a time */
    int64_t st = c->s->learner.max_staleness;
    return (uint64_t)c->T * (uint64_t)(1 + (st < 0 ? 1 : st));
}

/* Produce the PromptGroup of group `id`: prompt `item` of the dataset, drawn at (epoch,
 * index).  Also used to produce a resumed or stale group again (same id, same content). */
static void send_group(ld_core *c, uint64_t id, uint32_t epoch, uint64_t index, uint32_t item,
                       uint64_t version) {
    const ld_prompt *p = &c->ds->items[item];
    Qrl__SamplingParams sp = QRL__SAMPLING_PARAMS__INIT;
    sp.temperature = (float)c->s->sampling.temperature;
    sp.top_p = (float)c->s->sampling.top_p;
    sp.top_k = (uint32_t)c->s->sampling.top_k;
    sp.max_new_tokens = (uint32_t)c->s->sampling.max_new_tokens;
    sp.seed = c->seed;
    /* validated in main.c: at most 16 ids inside the vocabulary */
    size_t n_stop = c->s->sampling.stop_token_ids.n;
    const char *const *stop = c->s->sampling.stop_token_ids.items;
    uint32_t stop_ids[16];
    for (size_t i = 0; i < n_stop && i < 16; i++) stop_ids[i] = (uint32_t)strtoul(stop[i], NULL, 10);
    sp.stop_token_ids = stop_ids;
    sp.n_stop_token_ids = n_stop < 16 ? n_stop : 16;
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = epoch;
    pos.index = index;
    pos.source = (char *)c->dataset_path;
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.group_id = id;
    pg.run_id = c->run_id;
    pg.group_size = c->G;
    pg.prompt_token_ids = (uint32_t *)p->ids; /* ids are >= 0: same bits */
    pg.n_prompt_token_ids = p->n_ids;
    pg.prompt_text = p->text;
    pg.reference_answer = p->answer;
    pg.task = (char *)c->task;
    pg.sampling = &sp;
    pg.position = &pos;
    pg.dispatch_version = version;
    pg.dispatched_unix_ms = ld_unix_ms();
    uint8_t *buf;
    size_t len;
    qrl_error err;
    QRL_CHECK(qrl_wire_encode_alloc(&pg.base, &buf, &len, &err) == QRL_OK); /* only NOMEM */
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = qrl_wire_group_key(id, key);
    /* the tag is the group id: ld_dispatch_acked marks it delivered */
    qrl_service_produce(c->svc, c->prompts_topic, key, klen, &buf, &len, 1, true, (void *)(uintptr_t)id);
}

static void dispatch_one(ld_core *c) {
    if (D.cursor == c->ds->n) {
        D.cursor = 0;
        D.epoch++;
        qrl_epoch_order(c->ds->n, c->seed, D.epoch, D.perm);
        QRL_LOG_INFO("learner", "dataset epoch=%u begins", D.epoch);
    }
    uint64_t index = D.cursor++;
    uint64_t id = D.next_id++;
    send_group(c, id, D.epoch, index, D.perm[index], c->version);
    ld_group_set(id, GS_DISPATCHED);
    D.ginfo[id] = (ld_ginfo){.dispatch_version = c->version, .sent_ms = ld_unix_ms()};
    D.in_flight++;
    QRL_LOG_DEBUG("learner", "dispatched group=%" PRIu64 " epoch=%u index=%" PRIu64, id, D.epoch, index);
}

/* learner.redispatch_timeout_s: a group produced that long ago (and acknowledged by the
 * broker) with no result yet is produced again with the same id and content: a replica
 * lost it (e.g. dead-lettered the prompt, or hung).  The first result for the id trains;
 * a later one is dropped as a duplicate, so nothing trains twice. */
void ld_dispatch_redispatch_stale(ld_core *c) {
    int64_t timeout_s = c->s->learner.redispatch_timeout_s;
    if (timeout_s <= 0 || c->paused || c->stopping || c->finished) return;
    uint64_t now = ld_unix_ms(), N = c->ds->n;
    if (D.oldest_dispatched == 0) D.oldest_dispatched = 1;
    while (D.oldest_dispatched < D.next_id && ld_group_state(D.oldest_dispatched) != GS_DISPATCHED)
        D.oldest_dispatched++;
    uint32_t *perm = NULL;
    uint32_t perm_epoch = UINT32_MAX;
    for (uint64_t id = D.oldest_dispatched; id < D.next_id; id++) {
        ld_ginfo *gi = &D.ginfo[id];
        if (ld_group_state(id) != GS_DISPATCHED || !gi->delivered ||
            now - gi->sent_ms < (uint64_t)timeout_s * 1000)
            continue;
        /* ids follow the dataset walk one to one: id k is position k - 1 of the walk */
        uint32_t epoch = (uint32_t)((id - 1) / N);
        uint64_t index = (id - 1) % N;
        const uint32_t *order = D.perm;
        if (epoch != D.epoch) {
            if (!perm) perm = malloc(N * sizeof *perm);
            QRL_CHECK(perm != NULL);
            if (perm_epoch != epoch) qrl_epoch_order(N, c->seed, epoch, perm), perm_epoch = epoch;
            order = perm;
        }
        QRL_LOG_WARN("learner", "group=%" PRIu64 " no result %.0f s after it was sent: dispatched "
                     "again at version %" PRIu64, id, (double)(now - gi->sent_ms) / 1000.0, c->version);
        send_group(c, id, epoch, index, order[index], c->version);
        gi->dispatch_version = c->version, gi->sent_ms = now, gi->delivered = false;
        D.redispatched++;
    }
    free(perm);
}

void ld_dispatch_fill(ld_core *c) {
    if (c->paused || c->stopping || c->finished) return;
    /* alternate mode is on-policy: the next quota goes out once its version is published
     * (update.c's finish), so no replica can start it on the old weights before the PAUSE
     * event reaches it (prompts travel by Kafka, the event by the WatchVersions stream) */
    if (ld_dispatch_alternate(c) && c->training) return;
    uint64_t total_cap = c->max_updates ? c->max_updates * c->T : UINT64_MAX;
    while (D.in_flight < ld_dispatch_window(c) && D.next_id - 1 < total_cap) dispatch_one(c);
}

/* ---- checkpoints -------------------------------------------------------------------- */

void ld_dispatch_save(const ld_core *c, qrl_ckpt_state *s) {
    s->dataset_prompts = c->ds->n;
    s->epoch = D.epoch;
    s->index = D.cursor;
    s->next_group_id = D.next_id;
    size_t n = 0;
    for (uint64_t id = 1; id < D.next_id; id++) n += D.state[id] == GS_DISPATCHED || D.state[id] == GS_BUFFERED;
    s->pending = calloc(n ? n : 1, sizeof *s->pending);
    QRL_CHECK(s->pending != NULL);
    uint64_t N = c->ds->n;
    for (uint64_t id = 1; id < D.next_id; id++) {
        QRL_CHECK(D.state[id] != GS_TRAINING);
        if (D.state[id] != GS_DISPATCHED && D.state[id] != GS_BUFFERED) continue;
        /* ids follow the dataset walk one to one: id k is position k-1 of the walk */
        s->pending[s->n_pending++] = (qrl_ckpt_group){.id = id, .epoch = (uint32_t)((id - 1) / N),
                                                      .index = (id - 1) % N,
                                                      .dispatch_version = D.ginfo[id].dispatch_version,
                                                      .delivered = D.ginfo[id].delivered};
    }
}

size_t ld_dispatch_restore(ld_core *c, const qrl_ckpt_state *s) {
    D.epoch = s->epoch;
    D.cursor = s->index;
    D.next_id = s->next_group_id;
    qrl_epoch_order(c->ds->n, c->seed, D.epoch, D.perm);
    if (D.next_id > 1) ld_group_set(D.next_id - 1, GS_TRAINED);
    for (uint64_t id = 1; id < D.next_id; id++) D.state[id] = GS_TRAINED;
    uint32_t *perm = malloc(c->ds->n * sizeof *perm);
    QRL_CHECK(perm != NULL);
    size_t resent = 0;
    for (size_t i = 0; i < s->n_pending; i++) {
        const qrl_ckpt_group *g = &s->pending[i];
        D.state[g->id] = GS_DISPATCHED;
        D.ginfo[g->id] = (ld_ginfo){.dispatch_version = g->dispatch_version, .sent_ms = ld_unix_ms(),
                                    .delivered = g->delivered};
        D.in_flight++;
        if (g->delivered) continue;
        qrl_epoch_order(c->ds->n, c->seed, g->epoch, perm);
        send_group(c, g->id, g->epoch, g->index, perm[g->index], g->dispatch_version);
        resent++;
    }
    free(perm);
    return resent;
}
