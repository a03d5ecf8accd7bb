/* Test helper: a rollout scheduler's group result (valid only during its callback) copied
 * into a qrl_learner_group, so a test can train on what the CPU scheduler decoded.  Kept
 * out of common/ so that common/learner does not depend on common/rollout (the daemons
 * meet through the wire's GroupResult instead). */
#ifndef QRL_TESTS_SUPPORT_LEARNER_GROUP_H
#define QRL_TESTS_SUPPORT_LEARNER_GROUP_H

#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "learner/update.h"
#include "rollout/scheduler.h"

/* Deep copy of `res` into one owned allocation: *out (group, response table and every
 * array) is freed with qrl_learner_group_free.  Rewards are converted to float.
 * Errors: NOMEM. */
static inline qrl_status qrl_learner_group_from_scheduler(const qrl_scheduler_group_result *res,
                                                          qrl_learner_group **out, qrl_error *err) {
    *out = NULL;
    size_t G = res->group_size, ntok = 0;
    for (size_t i = 0; i < G; i++) ntok += (size_t)res->responses[i].n_tokens;
    /* one block: group, responses, prompt, then per-response tokens / lp / versions */
    size_t bytes = sizeof(qrl_learner_group) + G * sizeof(qrl_learner_response) +
                   ntok * (sizeof(uint64_t) + sizeof(int32_t) + sizeof(float)) +
                   (size_t)res->n_prompt * sizeof(int32_t);
    char *blk = calloc(1, bytes);
    if (!blk) return qrl_error_set(err, QRL_STATUS_NOMEM, "learner group copy: %zu bytes", bytes);
    qrl_learner_group *g = (qrl_learner_group *)blk;
    qrl_learner_response *rs = (qrl_learner_response *)(g + 1);
    uint64_t *ver = (uint64_t *)(rs + G); /* 8-byte arrays first keep alignment */
    int32_t *tok = (int32_t *)(ver + ntok);
    float *lp = (float *)(tok + ntok);
    int32_t *prompt = (int32_t *)(lp + ntok);
    memcpy(prompt, res->prompt, (size_t)res->n_prompt * sizeof *prompt);
    *g = (qrl_learner_group){.group_id = res->group_id, .prompt = prompt,
                             .n_prompt = res->n_prompt, .responses = rs,
                             .n_responses = res->group_size};
    for (size_t i = 0; i < G; i++) {
        const qrl_scheduler_response *s = &res->responses[i];
        size_t n = (size_t)s->n_tokens;
        if (n) { /* an empty response may carry NULL arrays */
            memcpy(tok, s->tokens, n * sizeof *tok);
            memcpy(lp, s->logprobs, n * sizeof *lp);
            memcpy(ver, s->versions, n * sizeof *ver);
        }
        rs[i] = (qrl_learner_response){.tokens = tok, .logprobs = lp, .versions = ver,
                                       .n_tokens = s->n_tokens, .reward = (float)s->reward};
        tok += n, lp += n, ver += n;
    }
    *out = g;
    return QRL_OK;
}

/* Free a group made by qrl_learner_group_from_scheduler; NULL is a no-op. */
static inline void qrl_learner_group_free(qrl_learner_group *g) { free(g); }

#endif
