/* The verifier registry (SPEC §7): names -> score functions. */
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
};

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
