/* The learner's update input (update.h's qrl_learner_group) viewed from decoded
 * GroupResult messages (docs/wire.md): the unpacking direction of the wire form that
 * rollout/result.h packs.  Token ids are converted to int32; log-probs and versions are
 * borrowed from the messages. */
#ifndef QRL_LEARNER_BATCH_H
#define QRL_LEARNER_BATCH_H

#include <stddef.h>

#include "core/status.h"
#include "learner/update.h"
#include "qrl.pb-c.h"

/* n groups for qrl_learner_update, and the storage behind them. */
typedef struct qrl_learner_batch {
    qrl_learner_group *groups;       /* [n_groups], in the order of the results */
    size_t n_groups;
    qrl_learner_response *responses; /* storage: every group's responses */
    int32_t *ids;                    /* storage: prompt and response token ids as int32 */
} qrl_learner_batch;

/* Fill *b from results[0..n): group i is results[i] (group id, prompt, responses with
 * tokens, behaviour log-probs, token versions (NULL when the message has none) and
 * rewards).  The messages must outlive *b (log-probs and versions point into them).
 * Checks what the view relies on, not the wire rules (qrl_wire_group_result_validate):
 * a NULL result or response, a log-prob or version count other than the token count, a
 * token id above INT32_MAX -> INVALID_ARGUMENT naming the group and response; NOMEM.  On
 * error *b is empty.  Free with qrl_learner_batch_free. */
qrl_status qrl_learner_batch_from_wire(const Qrl__GroupResult *const *results, size_t n, qrl_learner_batch *b,
                                       qrl_error *err);
/* Free the storage (not the messages); *b becomes empty.  An empty batch is a no-op. */
void qrl_learner_batch_free(qrl_learner_batch *b);

#endif
