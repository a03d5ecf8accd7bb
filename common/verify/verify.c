/* The verifier registry (SPEC §7): names -> score functions. */
#include <stdio.h>
#include <string.h>

#include "verify/verify_internal.h"

static const qrl_verifier VERIFIERS[] = {
    {"gsm8k", "GSM8K: answer after the last ####, else the last \\boxed{}, else the last number",
     qrl_verify_gsm8k},
    {"math", "MATH-500/AIME/AMC: the last \\boxed{} only, normalized and compared to the reference",
     qrl_verify_math},
    {"boxed", "alias of math", qrl_verify_math},
    {"arith", "synthetic arithmetic: the integer after the last ####/Answer: equals the reference",
     qrl_verify_arith},
    {"countdown", "synthetic countdown: expression using each number once equals the target; "
                  "reference {\"numbers\":[..],\"target\":N}",
     qrl_verify_countdown},
    {"name-twice", "story-name task: the given name at least twice, ending a sentence within max_chars; "
                   "reference {\"name\":\"Lily\",\"max_chars\":400} or a bare name",
     qrl_verify_name_twice},
    {"contains", "smoke tests: correct when the response contains the reference text (exact bytes)",
     qrl_verify_contains},
};

/* Tiny task for cluster smoke tests with story models (tests/integration/learner_cluster.sh):
 * rewards vary from response to response without any reasoning ability. */
qrl_status qrl_verify_contains(const char *response, const char *reference, qrl_verify_result *res,
                               qrl_error *err) {
    memset(res, 0, sizeof *res);
    if (!reference || !*reference)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "contains verifier: empty reference");
    const char *hit = strstr(response ? response : "", reference);
    res->found = res->correct = hit != NULL;
    res->reward = hit ? 1.0 : 0.0;
    if (hit) snprintf(res->extracted, sizeof res->extracted, "%s", reference);
    return QRL_OK;
}

#define N_VERIFIERS (sizeof VERIFIERS / sizeof VERIFIERS[0])

const qrl_verifier *qrl_verifier_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_VERIFIERS; i++)
        if (strcmp(VERIFIERS[i].name, name) == 0) return &VERIFIERS[i];
    return NULL;
}

size_t qrl_verifier_count(void) { return N_VERIFIERS; }

const qrl_verifier *qrl_verifier_at(size_t i) { return i < N_VERIFIERS ? &VERIFIERS[i] : NULL; }

double qrl_verify_shaped_reward(const qrl_verify_result *result, double format_reward) {
    if (result->correct) return 1.0;
    return result->found ? format_reward : 0.0;
}
