/* qrl-learner: records out (produce.c).  Every record is kept until the broker
 * acknowledges it and produced again after a failed send or delivery. */
#ifndef QRL_LD_PRODUCE_H
#define QRL_LD_PRODUCE_H

#include "daemon.h"

/* Called for an acknowledged keyed record (key_id != 0) of c->prompts_topic. */
typedef void (*ld_produce_acked_fn)(ld_core *c, uint64_t key_id);

/* Set the acknowledgement callback (before the first record). */
void ld_produce_init(ld_produce_acked_fn acked);
/* Produce buf[len] (ownership passes) to `topic` (a string that outlives the record),
 * keyed by the group key of key_id (0: unkeyed). */
void ld_produce(ld_core *c, const char *topic, uint64_t key_id, uint8_t *buf, size_t len);
/* The producer's delivery callback (qrl_kafka_producer_opts.on_delivery; user = the core). */
void ld_produce_on_delivery(void *user, void *opaque, const qrl_kafka_delivery *dv);
/* Send again what failed (each tick). */
void ld_produce_resend(ld_core *c);
/* Free the records still waiting to be sent again. */
void ld_produce_free(void);

#endif
