/* libFuzzer target for the reward verifiers (common/verify): the input is split at its
 * first NUL into response and reference (no NUL: the reference is empty), and every
 * verifier scores it, also against fixed well-formed references so that response
 * parsing is reached whatever the reference bytes are.  Checks the result invariants. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "verify/verify.h"

static void check(const qrl_verify_result *r, qrl_status st) {
    if (r->reward != 0.0 && r->reward != 1.0) abort();
    if (r->correct != (r->reward == 1.0)) abort();
    if (r->correct && !r->found) abort();
    if (st != QRL_OK && r->reward != 0.0) abort();
    if (memchr(r->extracted, '\0', sizeof r->extracted) == NULL) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t rn = nul ? (size_t)(nul - data) : size;
    size_t fn = nul ? size - rn - 1 : 0;
    char *response = malloc(rn + 1), *reference = malloc(fn + 1);
    if (!response || !reference) { free(response); free(reference); return 0; }
    memcpy(response, data, rn);
    response[rn] = '\0';
    if (fn) memcpy(reference, nul + 1, fn);
    reference[fn] = '\0';
    /* a reference holding NULs is cut at the first, as a C string would be */

    static const char *fixed[] = {"42", "\\frac{1}{2}", "#### 1,000", "(1, 2]", "x^2+1",
                                  "{\"numbers\":[25,5,4,3],\"target\":77}"};
    for (size_t i = 0; i < qrl_verifier_count(); i++) {
        const qrl_verifier *v = qrl_verifier_at(i);
        qrl_verify_result r;
        qrl_error err;
        check(&r, v->score(response, reference, &r, &err));
        for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++)
            check(&r, v->score(response, fixed[k], &r, &err));
    }
    bool eq;
    qrl_verify_math_equal(response, reference, &eq, NULL);
    char norm[64];
    qrl_verify_normalize(response, norm, sizeof norm, NULL);
    free(response);
    free(reference);
    return 0;
}
