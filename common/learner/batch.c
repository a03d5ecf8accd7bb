/* GroupResult messages -> the learner's update input (batch.h). */
#include "learner/batch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* What the view needs of one result; the rest is the wire validator's business. */
static qrl_status check_one(const Qrl__GroupResult *r, size_t i, size_t *n_resp, size_t *n_ids, qrl_error *err) {
    if (!r) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "batch: result %zu is missing", i);
    *n_resp += r->n_responses;
    *n_ids += r->n_prompt_token_ids;
    for (size_t t = 0; t < r->n_prompt_token_ids; t++)
        if (r->prompt_token_ids[t] > INT32_MAX)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "group %" PRIu64 ": prompt token %zu is %u",
                                 r->group_id, t, r->prompt_token_ids[t]);
    for (size_t k = 0; k < r->n_responses; k++) {
        const Qrl__Response *x = r->responses[k];
        if (!x)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "group %" PRIu64 ": response %zu is missing",
                                 r->group_id, k);
        if (x->n_behavior_logprobs != x->n_token_ids || (x->n_token_versions && x->n_token_versions != x->n_token_ids))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "group %" PRIu64 " response %zu: %zu tokens, %zu log-probs, %zu versions",
                                 r->group_id, k, x->n_token_ids, x->n_behavior_logprobs, x->n_token_versions);
        for (size_t t = 0; t < x->n_token_ids; t++)
            if (x->token_ids[t] > INT32_MAX)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "group %" PRIu64 " response %zu: token %zu is %u",
                                     r->group_id, k, t, x->token_ids[t]);
        *n_ids += x->n_token_ids;
    }
    return QRL_OK;
}

qrl_status qrl_learner_batch_from_wire(const Qrl__GroupResult *const *results, size_t n, qrl_learner_batch *b,
                                       qrl_error *err) {
    memset(b, 0, sizeof *b);
    size_t n_resp = 0, n_ids = 0;
    for (size_t g = 0; g < n; g++) QRL_TRY(check_one(results[g], g, &n_resp, &n_ids, err));
    b->groups = calloc(n ? n : 1, sizeof *b->groups);
    b->responses = calloc(n_resp ? n_resp : 1, sizeof *b->responses);
    b->ids = malloc((n_ids ? n_ids : 1) * sizeof *b->ids);
    if (!b->groups || !b->responses || !b->ids) {
        qrl_learner_batch_free(b);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "batch: %zu groups, %zu token ids", n, n_ids);
    }
    size_t ri = 0, ii = 0;
    for (size_t g = 0; g < n; g++) {
        const Qrl__GroupResult *r = results[g];
        qrl_learner_group *lg = &b->groups[g];
        lg->group_id = r->group_id;
        lg->prompt = b->ids + ii;
        lg->n_prompt = (int)r->n_prompt_token_ids;
        for (size_t t = 0; t < r->n_prompt_token_ids; t++) b->ids[ii++] = (int32_t)r->prompt_token_ids[t];
        lg->responses = b->responses + ri;
        lg->n_responses = (uint32_t)r->n_responses;
        for (size_t k = 0; k < r->n_responses; k++) {
            const Qrl__Response *src = r->responses[k];
            qrl_learner_response *dst = &b->responses[ri++];
            dst->tokens = b->ids + ii;
            for (size_t t = 0; t < src->n_token_ids; t++) b->ids[ii++] = (int32_t)src->token_ids[t];
            dst->logprobs = src->behavior_logprobs;
            dst->versions = src->n_token_versions ? src->token_versions : NULL;
            dst->n_tokens = (int)src->n_token_ids;
            dst->reward = src->reward;
        }
    }
    b->n_groups = n;
    return QRL_OK;
}

void qrl_learner_batch_free(qrl_learner_batch *b) {
    free(b->groups);
    free(b->responses);
    free(b->ids);
    memset(b, 0, sizeof *b);
}
