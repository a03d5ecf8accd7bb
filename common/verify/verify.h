/* Reward verifiers (SPEC §7, §4 item 3): score one finished response against the
 * dataset's reference answer.
 *
 * Verifiers are looked up by name (qrl_verifier_find) and are stateless and reentrant:
 * any thread may call any verifier at any time.  The rules each one applies (answer
 * extraction priority, normalization, reference formats) are written down in
 * docs/verifiers.md; keep the two in step.
 *
 *   gsm8k      answer after the last `####`, else the last \boxed{}, else the last number
 *   math       MATH-500 / AIME / AMC: the last \boxed{} (or \fbox{}) only
 *   boxed      alias of math
 *   arith      synthetic multi-digit arithmetic: integer after the last `####`/`Answer:`
 *   countdown  synthetic countdown: an expression over the given numbers (each used once)
 *              that evaluates exactly to the target; reference {"numbers":[..],"target":N}
 *   name-twice story-name task: the given name twice as a word, the response ending a
 *              sentence within max_chars; reference {"name":"Lily","max_chars":400}
 *
 * Never crashes on any input (tests/fuzz/fuzz_verify.c). */
#ifndef QRL_VERIFY_VERIFY_H
#define QRL_VERIFY_VERIFY_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest extracted answer kept in qrl_verify_result.extracted (bytes, with the NUL).
 * Longer answers are compared in full but reported cut at a UTF-8 boundary. */
#define QRL_VERIFY_EXTRACTED_MAX 512

/* Outcome of scoring one response.  Filled by every score call, also when it fails
 * (then reward 0, correct false). */
typedef struct qrl_verify_result {
    double reward;    /* 1.0 when correct, else 0.0 (shaping: qrl_verify_shaped_reward) */
    bool correct;     /* the extracted answer matches the reference */
    bool found;       /* a final answer was extracted from the response */
    char extracted[QRL_VERIFY_EXTRACTED_MAX]; /* the raw extracted answer ("" if none) */
} qrl_verify_result;

/* Score `response` (NUL-terminated, any bytes) against `reference` (format per
 * verifier, docs/verifiers.md).  A wrong, missing or malformed answer in the response is
 * not an error: it gives reward 0.  Errors: QRL_STATUS_INVALID_ARGUMENT / PARSE when the
 * reference is empty or malformed (a dataset or config problem; the message names the
 * field), QRL_STATUS_NOMEM.  `result` is always filled; `err` may be NULL. */
typedef qrl_status (*qrl_verify_fn)(const char *response, const char *reference,
                                    qrl_verify_result *result, qrl_error *err);

typedef struct qrl_verifier {
    const char *name;        /* "gsm8k", "math", ... */
    const char *summary;     /* one line for --help */
    qrl_verify_fn score;
} qrl_verifier;

/* The verifier called `name` (exact, case-sensitive), or NULL when unknown.  The
 * returned pointer is static: valid for the life of the process, never freed. */
const qrl_verifier *qrl_verifier_find(const char *name);

/* Registered verifiers in a fixed order, aliases included: index 0..count-1; NULL past
 * the end.  For listing known tasks. */
size_t qrl_verifier_count(void);
const qrl_verifier *qrl_verifier_at(size_t i);

/* Reward with an optional format bonus: 1 when correct; `format_reward` when a final
 * answer was found in the expected place but is wrong; 0 when none was found.  With
 * format_reward = 0 (the default) this equals result->reward.  Stays in [0, 1] for
 * format_reward in [0, 1]. */
double qrl_verify_shaped_reward(const qrl_verify_result *result, double format_reward);

/* Equivalence of two math answers after normalization (the comparison the gsm8k and
 * math verifiers use; docs/verifiers.md "Comparison").  Either string may still carry
 * `$...$`, a \boxed{}, units, etc.  Sets *equal; fails only with QRL_STATUS_NOMEM. */
qrl_status qrl_verify_math_equal(const char *a, const char *b, bool *equal, qrl_error *err);

/* The normalized form of one math answer (docs/verifiers.md "Normalization"), for
 * tests and debugging: written to `out` (cut to out_size - 1 bytes, NUL-terminated).
 * Fails only with QRL_STATUS_NOMEM or INVALID_ARGUMENT (out_size 0). */
qrl_status qrl_verify_normalize(const char *answer, char *out, size_t out_size, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
