/* The gsm8k and math verifiers and the answer comparison they share
 * (docs/verifiers.md).  Comparison of two normalized answers, in order:
 *   1. equal strings (words of 3+ letters: ignoring case);
 *   2. both integer literals: equal as integers, exactly (any length);
 *   3. both evaluate numerically (expr.c): equal within relative 1e-6, at two variable
 *      assignments when a letter appears;
 *   4. both are unions (\cup), matrices, bracketed tuples/intervals/sets or bare comma
 *      lists of the same shape: element by element (sets and bare lists in any order). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "verify/verify_internal.h"

#define LIST_MAX 64      /* elements per tuple / list */
#define COMPARE_DEPTH 3  /* nesting of lists inside lists */
#define COMPARE_BUDGET 4096 /* element comparisons per answer pair: bounds adversarial input */

typedef struct {
    const char *p;
    size_t n;
} span;

typedef struct {
    int budget;
    bool oom;
} cmp_ctx;

static bool spans_equal(span a, span b, cmp_ctx *c, int depth);

static bool is_open(char ch) { return ch == '(' || ch == '[' || ch == '{'; }
static bool is_close(char ch) { return ch == ')' || ch == ']' || ch == '}'; }

/* Split `s` at top-level (bracket depth 0) occurrences of `sep`.  Returns the number of
 * parts (>= 1), or 0 when there are more than LIST_MAX. */
static size_t split_top(span s, const char *sep, span *parts) {
    size_t k = strlen(sep), count = 0, start = 0;
    int depth = 0;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.p[i];
        if (is_open(ch)) depth++;
        else if (is_close(ch)) depth--;
        else if (depth == 0 && i + k <= s.n && memcmp(s.p + i, sep, k) == 0) {
            if (count == LIST_MAX - 1) return 0;
            parts[count++] = (span){s.p + start, i - start};
            start = i + k;
            i += k - 1;
        }
    }
    parts[count++] = (span){s.p + start, s.n - start};
    return count;
}

/* "(a,b]" / "[a,b]" / "\{a,b\}": the opener and closer (as short strings) and the
 * inside, when one bracket pair spans the whole string. */
static bool bracketed(span s, char open[3], char close[3], span *inner) {
    size_t lo = 0, hi = 0;
    if (s.n >= 4 && s.p[0] == '\\' && s.p[1] == '{' && s.p[s.n - 2] == '\\' && s.p[s.n - 1] == '}') {
        lo = hi = 2;
    } else if (s.n >= 2 && (s.p[0] == '(' || s.p[0] == '[') && (s.p[s.n - 1] == ')' || s.p[s.n - 1] == ']')) {
        lo = hi = 1;
    } else {
        return false;
    }
    /* the first opener must close at the very end: "(a)(b)" is a product */
    int depth = 0;
    for (size_t i = lo - 1; i < s.n; i++) {
        if (is_open(s.p[i])) depth++;
        else if (is_close(s.p[i]) && --depth == 0 && i != s.n - 1) return false;
    }
    memcpy(open, s.p, lo);
    open[lo] = '\0';
    memcpy(close, s.p + s.n - hi, hi);
    close[hi] = '\0';
    *inner = (span){s.p + lo, s.n - lo - hi};
    return true;
}

/* \begin{pmatrix} ... \end{pmatrix} (any *matrix environment): the body. */
static bool matrix_body(span s, span *body) {
    static const char *const ENVS[] = {"pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix"};
    for (size_t e = 0; e < sizeof ENVS / sizeof ENVS[0]; e++) {
        char b[32], t[32];
        int bn = snprintf(b, sizeof b, "\\begin{%s}", ENVS[e]);
        int tn = snprintf(t, sizeof t, "\\end{%s}", ENVS[e]);
        if (s.n >= (size_t)(bn + tn) && memcmp(s.p, b, (size_t)bn) == 0 &&
            memcmp(s.p + s.n - tn, t, (size_t)tn) == 0) {
            *body = (span){s.p + bn, s.n - (size_t)bn - (size_t)tn};
            return true;
        }
    }
    return false;
}

/* An integer literal [+-]digits: its digits without leading zeros ("0" for zero) and
 * whether it is negative (never for zero). */
static bool integer_digits(span s, span *digits, bool *negative) {
    size_t i = (s.n > 0 && (s.p[0] == '-' || s.p[0] == '+')) ? 1 : 0;
    if (i == s.n) return false;
    for (size_t k = i; k < s.n; k++)
        if (s.p[k] < '0' || s.p[k] > '9') return false;
    while (i + 1 < s.n && s.p[i] == '0') i++;
    *digits = (span){s.p + i, s.n - i};
    *negative = s.p[0] == '-' && !(digits->n == 1 && digits->p[0] == '0');
    return true;
}

/* Letters only, three or more: a word answer (compared ignoring case). */
static bool is_word(span s) {
    for (size_t i = 0; i < s.n; i++)
        if (!((s.p[i] >= 'a' && s.p[i] <= 'z') || (s.p[i] >= 'A' && s.p[i] <= 'Z'))) return false;
    return true;
}

static bool eval_span(span s, int point, double *v, bool *vars, cmp_ctx *c) {
    qrl_vbuf b = {0};
    qrl_vbuf_putn(&b, s.p, s.n);
    if (b.oom) { c->oom = true; return false; }
    bool ok = qrl_verify_eval(qrl_vbuf_str(&b), point, v, vars);
    qrl_vbuf_free(&b);
    return ok;
}

static bool lists_equal(const span *a, const span *b, size_t n, bool ordered, cmp_ctx *c, int depth) {
    if (ordered) {
        for (size_t i = 0; i < n; i++)
            if (!spans_equal(a[i], b[i], c, depth + 1)) return false;
        return true;
    }
    bool used[LIST_MAX] = {false};
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < n && (used[j] || !spans_equal(a[i], b[j], c, depth + 1))) j++;
        if (j == n) return false;
        used[j] = true;
    }
    return true;
}

/* Compare after splitting both at `sep`; *handled tells whether `sep` applied. */
static bool split_compare(span a, span b, const char *sep, bool ordered, cmp_ctx *c, int depth,
                          bool *handled) {
    span pa[LIST_MAX], pb[LIST_MAX];
    size_t na = split_top(a, sep, pa), nb = split_top(b, sep, pb);
    *handled = na != 1 || nb != 1;
    if (!*handled) return false;
    return na == nb && na > 0 && lists_equal(pa, pb, na, ordered, c, depth);
}

static bool spans_equal(span a, span b, cmp_ctx *c, int depth) {
    if (c->budget-- <= 0 || c->oom) return false;
    if (a.n == b.n && memcmp(a.p, b.p, a.n) == 0) return true;
    if (a.n == 0 || b.n == 0) return false;
    if (a.n == b.n && a.n >= 3 && is_word(a) && is_word(b) && strncasecmp(a.p, b.p, a.n) == 0)
        return true; /* \text{East} vs east */

    span da, db;
    bool sa, sb;
    if (integer_digits(a, &da, &sa) && integer_digits(b, &db, &sb)) /* exact: 1000001 != 1000000 */
        return sa == sb && da.n == db.n && memcmp(da.p, db.p, da.n) == 0;

    double va, vb;
    bool xa, xb;
    if (eval_span(a, 0, &va, &xa, c) && eval_span(b, 0, &vb, &xb, c)) {
        if (!qrl_verify_close(va, vb)) return false;
        if (!xa && !xb) return true;
        /* a variable appears: agree at a second assignment too (2k+2 vs 2(k+1)) */
        return eval_span(a, 1, &va, &xa, c) && eval_span(b, 1, &vb, &xb, c) && qrl_verify_close(va, vb);
    }
    if (depth >= COMPARE_DEPTH) return false;

    bool handled;
    bool r = split_compare(a, b, "\\cup", true, c, depth, &handled);
    if (handled) return r;

    span ma, mb;
    if (matrix_body(a, &ma) && matrix_body(b, &mb)) {
        span ra[LIST_MAX], rb[LIST_MAX];
        size_t na = split_top(ma, "\\\\", ra), nb = split_top(mb, "\\\\", rb);
        if (na != nb || na == 0) return false;
        for (size_t i = 0; i < na; i++) {
            r = split_compare(ra[i], rb[i], "&", true, c, depth, &handled);
            if (!handled) r = spans_equal(ra[i], rb[i], c, depth + 1);
            if (!r) return false;
        }
        return true;
    }

    char oa[3], ca[3], ob[3], cb[3];
    span ia, ib;
    if (bracketed(a, oa, ca, &ia) && bracketed(b, ob, cb, &ib)) {
        if (strcmp(oa, ob) != 0 || strcmp(ca, cb) != 0) return false;
        bool set = strcmp(oa, "\\{") == 0;
        span pa[LIST_MAX], pb[LIST_MAX];
        size_t na = split_top(ia, ",", pa), nb = split_top(ib, ",", pb);
        return na == nb && na > 0 && lists_equal(pa, pb, na, !set, c, depth);
    }

    /* bare lists "1,-2" vs "-2,1": solutions, in any order */
    r = split_compare(a, b, ",", false, c, depth, &handled);
    return handled && r;
}

qrl_status qrl_verify_normalize(const char *answer, char *out, size_t out_size, qrl_error *err) {
    if (!answer || !out || out_size == 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "verify normalize: NULL answer or empty output buffer");
    qrl_vbuf b = {0};
    if (!qrl_verify_normalize_into(answer, &b)) {
        qrl_vbuf_free(&b);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "verify normalize: out of memory");
    }
    size_t n = b.len < out_size - 1 ? b.len : out_size - 1;
    memcpy(out, qrl_vbuf_str(&b), n);
    out[n] = '\0';
    qrl_vbuf_free(&b);
    return QRL_OK;
}

qrl_status qrl_verify_math_equal(const char *a, const char *b, bool *equal, qrl_error *err) {
    *equal = false;
    if (!a || !b) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "verify compare: NULL answer");
    qrl_vbuf na = {0}, nb = {0};
    qrl_status st = QRL_OK;
    if (!qrl_verify_normalize_into(a, &na) || !qrl_verify_normalize_into(b, &nb)) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "verify compare: out of memory");
        goto done;
    }
    cmp_ctx c = {.budget = COMPARE_BUDGET, .oom = false};
    *equal = spans_equal((span){qrl_vbuf_str(&na), na.len}, (span){qrl_vbuf_str(&nb), nb.len}, &c, 0);
    if (c.oom) {
        *equal = false;
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "verify compare: out of memory");
    }
done:
    qrl_vbuf_free(&na);
    qrl_vbuf_free(&nb);
    return st;
}

/* ---- verifiers ---------------------------------------------------------------------- */

static qrl_status score_math_like(const char *task, bool gsm8k, const char *response,
                                  const char *reference, qrl_verify_result *res, qrl_error *err) {
    qrl_verify_result_clear(res);
    if (!reference) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s verifier: NULL reference", task);
    if (!response) response = "";
    qrl_vbuf ref = {0}, ans = {0};
    qrl_status st = QRL_OK;
    if (!qrl_verify_reference_answer(reference, &ref)) {
        st = ref.oom ? qrl_error_set(err, QRL_STATUS_NOMEM, "%s verifier: out of memory", task)
                     : qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "%s verifier: reference '%.60s' holds no answer", task, reference);
        goto done;
    }
    /* gsm8k: #### > last box > last number; math: last box only */
    bool found = gsm8k ? qrl_verify_extract_hashes(response, &ans) : false;
    if (!found && !ans.oom) found = qrl_verify_extract_boxed(response, &ans);
    if (gsm8k && !found && !ans.oom) found = qrl_verify_extract_last_number(response, &ans);
    if (ans.oom) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s verifier: out of memory", task);
        goto done;
    }
    if (!found) goto done;
    res->found = true;
    qrl_verify_set_extracted(res, qrl_vbuf_str(&ans));
    bool equal;
    QRL_TRY_GOTO(qrl_verify_math_equal(qrl_vbuf_str(&ans), qrl_vbuf_str(&ref), &equal, err), done);
    res->correct = equal;
    res->reward = equal ? 1.0 : 0.0;
done:
    qrl_vbuf_free(&ref);
    qrl_vbuf_free(&ans);
    return st;
}

qrl_status qrl_verify_gsm8k(const char *response, const char *reference, qrl_verify_result *res,
                            qrl_error *err) {
    return score_math_like("gsm8k", true, response, reference, res, err);
}

qrl_status qrl_verify_math(const char *response, const char *reference, qrl_verify_result *res,
                           qrl_error *err) {
    return score_math_like("math", false, response, reference, res, err);
}
