/* The wire form of a finished scheduler group (docs/wire.md): a qrl_scheduler_group_result
 * (scheduler.h, valid only during its callback) packed into the GroupResult message the
 * rollout daemon produces.  The other direction, GroupResult -> the learner's update
 * input, is beside that type: learner/batch.h. */
#ifndef QRL_ROLLOUT_RESULT_H
#define QRL_ROLLOUT_RESULT_H

#include <stdbool.h>

#include "core/status.h"
#include "qrl.pb-c.h"
#include "rollout/scheduler.h"

/* A GroupResult from finished group `r` and the PromptGroup it answers (`pg`: run_id,
 * dispatch_version, position are copied from it): token ids, behaviour log-probs, token
 * versions, rewards, finish reasons, verifier answers, timings (per response; the group's
 * are the queue mean and the sums), the response text when emit_text, chunk_count 1.
 * Everything is copied into malloc'd memory: *out is freed with
 * qrl__group_result__free_unpacked(*out, NULL) and does not borrow from r or pg.
 * Errors: NOMEM (nothing is returned). */
qrl_status qrl_scheduler_result_to_wire(const qrl_scheduler_group_result *r, const Qrl__PromptGroup *pg,
                                        const char *replica_id, bool emit_text, Qrl__GroupResult **out,
                                        qrl_error *err);

#endif
