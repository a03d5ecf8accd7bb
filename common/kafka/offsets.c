#include "kafka/offsets.h"

#include <stdbool.h>
#include <stdlib.h>

#include "core/status.h"

struct qrl_kafka_offset {
    struct qrl_kafka_offset *next;
    int64_t offset;
    int32_t partition;
    bool done;
};

typedef struct part {
    qrl_kafka_offset *head, *tail; /* pushed records, consumption order */
    int64_t committed;             /* next offset last committed (-1: none) */
} part;

struct qrl_kafka_offsets {
    part *parts;
    int n_parts;
};

qrl_kafka_offsets *qrl_kafka_offsets_new(void) { return calloc(1, sizeof(qrl_kafka_offsets)); }

void qrl_kafka_offsets_free(qrl_kafka_offsets *t) {
    if (!t) return;
    for (int i = 0; i < t->n_parts; i++)
        while (t->parts[i].head) {
            qrl_kafka_offset *n = t->parts[i].head->next;
            free(t->parts[i].head);
            t->parts[i].head = n;
        }
    free(t->parts);
    free(t);
}

static part *part_get(qrl_kafka_offsets *t, int32_t p) {
    QRL_CHECK(p >= 0);
    if (p >= t->n_parts) {
        part *np = realloc(t->parts, (size_t)(p + 1) * sizeof *np);
        QRL_CHECK(np != NULL);
        for (int i = t->n_parts; i <= p; i++) np[i] = (part){.committed = -1};
        t->parts = np;
        t->n_parts = p + 1;
    }
    return &t->parts[p];
}

qrl_kafka_offset *qrl_kafka_offsets_push(qrl_kafka_offsets *t, int32_t partition, int64_t offset) {
    part *pt = part_get(t, partition);
    qrl_kafka_offset *o = calloc(1, sizeof *o);
    QRL_CHECK(o != NULL);
    o->offset = offset;
    o->partition = partition;
    if (pt->tail) pt->tail->next = o;
    else pt->head = o;
    pt->tail = o;
    return o;
}

int64_t qrl_kafka_offsets_done(qrl_kafka_offsets *t, qrl_kafka_offset *e, int32_t *partition) {
    int32_t p = e->partition;
    part *pt = part_get(t, p);
    e->done = true;
    int64_t upto = -1;
    while (pt->head && pt->head->done) {
        qrl_kafka_offset *h = pt->head;
        if (h->offset + 1 > upto) upto = h->offset + 1;
        pt->head = h->next;
        free(h);
    }
    if (!pt->head) pt->tail = NULL;
    if (partition) *partition = p;
    return upto > pt->committed ? upto : -1;
}

void qrl_kafka_offsets_committed(qrl_kafka_offsets *t, int32_t partition, int64_t upto) {
    part *pt = part_get(t, partition);
    if (upto > pt->committed) pt->committed = upto;
}

int64_t qrl_kafka_offset_value(const qrl_kafka_offset *e) { return e->offset; }
