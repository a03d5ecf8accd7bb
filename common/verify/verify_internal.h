/* Shared pieces of the verifiers (not part of the public API): a growable string,
 * answer extraction, normalization, expression evaluation. */
#ifndef QRL_VERIFY_INTERNAL_H
#define QRL_VERIFY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "verify/verify.h"

/* ---- growable NUL-terminated string; an allocation failure sets `oom` and later
 * appends are dropped, so callers check once at the end ---- */
typedef struct qrl_vbuf {
    char *p;
    size_t len, cap;
    bool oom;
} qrl_vbuf;

void qrl_vbuf_putn(qrl_vbuf *b, const char *s, size_t n);
void qrl_vbuf_puts(qrl_vbuf *b, const char *s);
void qrl_vbuf_putc(qrl_vbuf *b, char c);
void qrl_vbuf_reset(qrl_vbuf *b);                 /* len 0, keeps the memory */
void qrl_vbuf_free(qrl_vbuf *b);
const char *qrl_vbuf_str(const qrl_vbuf *b);      /* "" while nothing was written */

/* ---- extraction (extract.c).  Each appends the answer to `out` and returns true when
 * one was found; `out` is left empty otherwise.  Inputs are NUL-terminated. ---- */

/* Content of the last well-formed \boxed{...} / \fbox{...} (nested braces balanced),
 * or of `\boxed X` (the run of characters up to whitespace or `$`).  Empty boxes do
 * not count. */
bool qrl_verify_extract_boxed(const char *text, qrl_vbuf *out);
/* GSM8K style: the line after the last `####`; its first number if it has one, else
 * the trimmed line. */
bool qrl_verify_extract_hashes(const char *text, qrl_vbuf *out);
/* The last number in the text: -12, 1,000, 3.5, .5, 3/4, \frac{3}{4}. */
bool qrl_verify_extract_last_number(const char *text, qrl_vbuf *out);
/* The first number at the start of `s` (after spaces): its length, or 0. */
size_t qrl_verify_number_len(const char *s, const char *text_start);
/* The reference answer of a math task: after `####`, else the last box, else the whole
 * string (trimmed). */
bool qrl_verify_reference_answer(const char *reference, qrl_vbuf *out);

/* Copy `s` into result->extracted, cut at a UTF-8 boundary. */
void qrl_verify_set_extracted(qrl_verify_result *result, const char *s);
/* Reset a result to "nothing found, reward 0". */
void qrl_verify_result_clear(qrl_verify_result *result);

/* ---- normalization (normalize.c): the canonical string form of a math answer ---- */
bool qrl_verify_normalize_into(const char *answer, qrl_vbuf *out); /* false on OOM */

/* ---- constant/polynomial expression evaluation (expr.c) ----
 * Evaluates a normalized LaTeX expression (numbers, + - * / ^, implicit products,
 * \frac, \sqrt, \pi, a few functions, single-letter variables) with variable values
 * taken from point `point` (0 or 1).  Returns false when the string is not an
 * expression it understands or the value is not finite.  *has_vars tells whether a
 * variable was used. */
bool qrl_verify_eval(const char *s, int point, double *value, bool *has_vars);

/* ---- the verifiers (registered in verify.c) ---- */
qrl_status qrl_verify_gsm8k(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);
qrl_status qrl_verify_math(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);
qrl_status qrl_verify_arith(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);
qrl_status qrl_verify_contains(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);
qrl_status qrl_verify_countdown(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);
qrl_status qrl_verify_name_twice(const char *response, const char *reference, qrl_verify_result *res, qrl_error *err);

/* ---- countdown expressions (synthetic.c), exposed for tests ---- */
typedef enum qrl_countdown_outcome {
    QRL_COUNTDOWN_OK = 0,
    QRL_COUNTDOWN_SYNTAX,       /* not + - * / ( ) and non-negative integers */
    QRL_COUNTDOWN_DIV_ZERO,
    QRL_COUNTDOWN_OVERFLOW,     /* an intermediate value left the int64 rational range */
    QRL_COUNTDOWN_TOO_DEEP,     /* parentheses nested deeper than the limit */
    QRL_COUNTDOWN_TOO_MANY,     /* more numbers than QRL_COUNTDOWN_NUMBERS_MAX */
} qrl_countdown_outcome;

#define QRL_COUNTDOWN_NUMBERS_MAX 64

/* Evaluate `expr` exactly: *num / *den (reduced, den > 0); the literals used are
 * stored in used[0..*n_used).  Unary signs are not allowed. */
qrl_countdown_outcome qrl_countdown_eval(const char *expr, long long *num, long long *den,
                                         long long *used, size_t *n_used);

/* Relative-tolerance equality used for every numeric comparison (1e-6). */
bool qrl_verify_close(double a, double b);

#endif
