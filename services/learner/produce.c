/* qrl-learner records out (produce.h): nothing waits; a record that cannot be sent now,
 * or whose delivery failed, waits in the resend list for the next tick. */
#include "produce.h"

#include <stdlib.h>
#include <sys/time.h>

#include "core/log.h"
#include "wire/wire.h"

typedef struct ld_out { /* one produced record, kept until acknowledged */
    struct ld_out *next;
    const char *topic;
    uint64_t key_id;    /* 0: unkeyed */
    uint8_t *buf;
    size_t len;
} ld_out;

static struct {
    ld_out *resend;
    ld_produce_acked_fn acked;
} P;

uint64_t ld_unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

void ld_produce_init(ld_produce_acked_fn acked) { P.acked = acked; }

static void out_send(ld_core *c, ld_out *o) {
    char key[QRL_WIRE_KEY_MAX];
    size_t klen = o->key_id ? qrl_wire_group_key(o->key_id, key) : 0;
    qrl_error err;
    qrl_status st = qrl_kafka_producer_send(c->producer, o->topic, klen ? key : NULL, klen, o->buf,
                                            o->len, o, &err);
    if (st != QRL_OK) {
        if (st != QRL_STATUS_BUSY) QRL_LOG_WARN("learner", "send to %s: %s (retrying)", o->topic, err.msg);
        o->next = P.resend;
        P.resend = o;
    }
}

void ld_produce_on_delivery(void *user, void *opaque, const qrl_kafka_delivery *dv) {
    ld_core *c = user;
    ld_out *o = opaque;
    if (!o) return;
    if (dv->status != QRL_OK) {
        QRL_LOG_WARN("learner", "delivery to %s failed: %s (sending again)", dv->topic, dv->error ? dv->error : "?");
        o->next = P.resend;
        P.resend = o;
        return;
    }
    if (o->key_id && o->topic == c->prompts_topic && P.acked) P.acked(c, o->key_id);
    free(o->buf);
    free(o);
}

void ld_produce(ld_core *c, const char *topic, uint64_t key_id, uint8_t *buf, size_t len) {
    ld_out *o = calloc(1, sizeof *o);
    QRL_CHECK(o != NULL);
    *o = (ld_out){.topic = topic, .key_id = key_id, .buf = buf, .len = len};
    out_send(c, o);
}

void ld_produce_resend(ld_core *c) {
    ld_out *o = P.resend;
    P.resend = NULL;
    while (o) {
        ld_out *next = o->next;
        o->next = NULL;
        out_send(c, o);
        o = next;
    }
}

void ld_produce_free(void) {
    while (P.resend) {
        ld_out *n = P.resend->next;
        free(P.resend->buf);
        free(P.resend);
        P.resend = n;
    }
}
