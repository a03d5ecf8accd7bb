/* Exact verifiers of the synthetic tasks (SPEC §7; formats in docs/verifiers.md):
 *   arith      the integer after the last `####` / `Answer:` equals the reference
 *   countdown  an expression using each given number exactly once equals the target,
 *              evaluated with exact int64 rationals by a small parser (no eval) */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "verify/verify_internal.h"

#define COUNTDOWN_DEPTH_MAX 64
#define COUNTDOWN_LITERAL_DIGITS 18 /* fits in int64 */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Just after the last answer marker, `####` or `Answer:` (any case), or NULL. */
static const char *after_last_marker(const char *text) {
    const char *after = NULL;
    for (const char *p = text; *p; p++) {
        if (strncmp(p, "####", 4) == 0) after = p + 4;
        else if ((*p == 'a' || *p == 'A') && strncasecmp(p, "answer:", 7) == 0) after = p + 7;
    }
    return after;
}

/* An integer token at s (after whitespace): [+-]digits, not followed by more of a
 * number (".5", ",000", "/2") or by a letter.  Appends its canonical form (no '+', no
 * leading zeros, "-0" -> "0") to `canon` and returns the token's end, or NULL. */
static const char *parse_integer(const char *s, qrl_vbuf *canon, const char **start) {
    while (is_space(*s)) s++;
    *start = s;
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    const char *d = s;
    while (is_digit(*s)) s++;
    if (s == d) return NULL;
    if (is_alpha(*s) || ((*s == '.' || *s == ',' || *s == '/') && is_digit(s[1]))) return NULL;
    while (d < s - 1 && *d == '0') d++;
    if (neg && !(s - d == 1 && *d == '0')) qrl_vbuf_putc(canon, '-');
    qrl_vbuf_putn(canon, d, (size_t)(s - d));
    return s;
}

qrl_status qrl_verify_arith(const char *response, const char *reference, qrl_verify_result *res,
                            qrl_error *err) {
    qrl_verify_result_clear(res);
    if (!reference) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "arith verifier: NULL reference");
    if (!response) response = "";
    qrl_vbuf ref = {0}, ans = {0};
    qrl_status st = QRL_OK;
    const char *tok;
    /* reference: a bare integer, or a worked solution with a marker */
    const char *marker = after_last_marker(reference);
    const char *end = parse_integer(marker ? marker : reference, &ref, &tok);
    while (end && is_space(*end)) end++;
    if (!end || (!marker && *end != '\0')) {
        st = qrl_error_set(err, QRL_STATUS_PARSE,
                           "arith reference: expected an integer at offset %zu of '%.60s'",
                           (size_t)(tok - reference), reference);
        goto done;
    }
    marker = after_last_marker(response);
    if (marker && (end = parse_integer(marker, &ans, &tok))) {
        res->found = true;
        qrl_vbuf q = {0};
        qrl_vbuf_putn(&q, tok, (size_t)(end - tok));
        qrl_verify_set_extracted(res, qrl_vbuf_str(&q));
        qrl_vbuf_free(&q);
        res->correct = strcmp(qrl_vbuf_str(&ans), qrl_vbuf_str(&ref)) == 0;
        res->reward = res->correct ? 1.0 : 0.0;
    }
    if (ref.oom || ans.oom) {
        qrl_verify_result_clear(res);
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "arith verifier: out of memory");
    }
done:
    qrl_vbuf_free(&ref);
    qrl_vbuf_free(&ans);
    return st;
}

/* ---- countdown: exact rationals ---------------------------------------------------- */

typedef struct {
    long long n, d; /* d > 0, gcd(|n|, d) == 1 */
} rat;

static __int128 gcd128(__int128 a, __int128 b) {
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b) { __int128 t = a % b; a = b; b = t; }
    return a;
}

/* Reduce n/d into *out; false when d == 0 (division by zero) or it leaves int64. */
static bool rat_make(__int128 n, __int128 d, rat *out, qrl_countdown_outcome *why) {
    if (d == 0) { *why = QRL_COUNTDOWN_DIV_ZERO; return false; }
    if (d < 0) { n = -n; d = -d; }
    __int128 g = gcd128(n, d);
    if (g > 1) { n /= g; d /= g; }
    if (n > INT64_MAX || n < -INT64_MAX || d > INT64_MAX) { *why = QRL_COUNTDOWN_OVERFLOW; return false; }
    out->n = (long long)n;
    out->d = (long long)d;
    return true;
}

typedef struct {
    const char *s;
    size_t i;
    int depth;
    long long *used;
    size_t n_used;
    qrl_countdown_outcome why;
} cd_parser;

static bool cd_expr(cd_parser *p, rat *v);

static void cd_skip(cd_parser *p) {
    while (is_space(p->s[p->i])) p->i++;
}

static bool cd_factor(cd_parser *p, rat *v) {
    cd_skip(p);
    char c = p->s[p->i];
    if (c == '(') {
        if (++p->depth > COUNTDOWN_DEPTH_MAX) { p->why = QRL_COUNTDOWN_TOO_DEEP; return false; }
        p->i++;
        if (!cd_expr(p, v)) return false;
        cd_skip(p);
        if (p->s[p->i] != ')') { p->why = QRL_COUNTDOWN_SYNTAX; return false; }
        p->i++;
        p->depth--;
        return true;
    }
    if (!is_digit(c)) { p->why = QRL_COUNTDOWN_SYNTAX; return false; }
    long long x = 0;
    size_t k = 0;
    while (is_digit(p->s[p->i + k])) {
        if (k == COUNTDOWN_LITERAL_DIGITS) { p->why = QRL_COUNTDOWN_OVERFLOW; return false; }
        x = x * 10 + (p->s[p->i + k] - '0');
        k++;
    }
    p->i += k;
    if (p->n_used == QRL_COUNTDOWN_NUMBERS_MAX) { p->why = QRL_COUNTDOWN_TOO_MANY; return false; }
    p->used[p->n_used++] = x;
    v->n = x;
    v->d = 1;
    return true;
}

static bool cd_term(cd_parser *p, rat *v) {
    if (!cd_factor(p, v)) return false;
    for (;;) {
        cd_skip(p);
        char op = p->s[p->i];
        if (op != '*' && op != '/') return true;
        p->i++;
        rat r;
        if (!cd_factor(p, &r)) return false;
        bool ok = op == '*' ? rat_make((__int128)v->n * r.n, (__int128)v->d * r.d, v, &p->why)
                            : rat_make((__int128)v->n * r.d, (__int128)v->d * r.n, v, &p->why);
        if (!ok) return false;
    }
}

static bool cd_expr(cd_parser *p, rat *v) {
    if (!cd_term(p, v)) return false;
    for (;;) {
        cd_skip(p);
        char op = p->s[p->i];
        if (op != '+' && op != '-') return true;
        p->i++;
        rat r;
        if (!cd_term(p, &r)) return false;
        __int128 a = (__int128)v->n * r.d, b = (__int128)r.n * v->d;
        if (!rat_make(op == '+' ? a + b : a - b, (__int128)v->d * r.d, v, &p->why)) return false;
    }
}

qrl_countdown_outcome qrl_countdown_eval(const char *expr, long long *num, long long *den,
                                         long long *used, size_t *n_used) {
    cd_parser p = {.s = expr, .i = 0, .depth = 0, .used = used, .n_used = 0, .why = QRL_COUNTDOWN_OK};
    rat v = {0, 1};
    bool ok = cd_expr(&p, &v);
    if (ok) {
        cd_skip(&p);
        if (p.s[p.i] != '\0') { ok = false; p.why = QRL_COUNTDOWN_SYNTAX; }
    }
    *n_used = p.n_used;
    if (!ok) return p.why;
    *num = v.n;
    *den = v.d;
    return QRL_COUNTDOWN_OK;
}

/* ---- countdown: reference and response --------------------------------------------- */

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static qrl_status countdown_reference(const char *reference, long long *numbers, size_t *count,
                                      long long *target, qrl_error *err) {
    json_error_t jerr;
    json_t *root = json_loads(reference, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return qrl_error_set(err, QRL_STATUS_PARSE, "countdown reference: JSON error at offset %d: %s",
                             jerr.position, jerr.text);
    qrl_status st = QRL_OK;
    json_t *arr = json_object_get(root, "numbers");
    if (!arr) arr = json_object_get(root, "nums");
    json_t *t = json_object_get(root, "target");
    if (!json_is_object(root) || !json_is_array(arr)) {
        st = qrl_error_set(err, QRL_STATUS_PARSE, "countdown reference: field \"numbers\" (array) missing");
        goto done;
    }
    size_t n = json_array_size(arr);
    if (n == 0 || n > QRL_COUNTDOWN_NUMBERS_MAX) {
        st = qrl_error_set(err, QRL_STATUS_PARSE, "countdown reference: field \"numbers\" has %zu entries (1..%d)",
                           n, QRL_COUNTDOWN_NUMBERS_MAX);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            st = qrl_error_set(err, QRL_STATUS_PARSE,
                               "countdown reference: field \"numbers\"[%zu] is not a non-negative integer", i);
            goto done;
        }
        numbers[i] = json_integer_value(x);
    }
    if (!json_is_integer(t)) {
        st = qrl_error_set(err, QRL_STATUS_PARSE, "countdown reference: field \"target\" (integer) missing");
        goto done;
    }
    *count = n;
    *target = json_integer_value(t);
done:
    json_decref(root);
    return st;
}

/* The expression: inside the last <answer>...</answer>, else the last \boxed{}, else the
 * rest of the line after the last `####` / `Answer:`. */
static bool countdown_extract(const char *response, qrl_vbuf *out) {
    const char *open = NULL, *best = NULL, *best_end = NULL;
    for (const char *p = response; (p = strchr(p, '<')); p++) {
        if (strncmp(p, "<answer>", 8) == 0) open = p + 8;
        else if (strncmp(p, "</answer>", 9) == 0 && open) { best = open; best_end = p; open = NULL; }
    }
    if (best) {
        qrl_vbuf_putn(out, best, (size_t)(best_end - best));
        return true;
    }
    if (qrl_verify_extract_boxed(response, out) || out->oom) return !out->oom;
    const char *m = after_last_marker(response);
    if (!m) return false;
    while (*m == ' ' || *m == '\t') m++;
    qrl_vbuf_putn(out, m, strcspn(m, "\n"));
    return true;
}

/* Operator spellings a model may use for the four ASCII ones; `$` dropped. */
static void countdown_ascii(const char *s, qrl_vbuf *out) {
    static const struct { const char *from, *to; } MAP[] = {
        {"\\times", "*"}, {"\\cdot", "*"}, {"\\div", "/"}, {"\xc3\x97", "*"}, {"\xc3\xb7", "/"},
        {"\\left", ""},   {"\\right", ""}, {"$", ""},      {"\\(", ""},       {"\\)", ""},
    };
    for (size_t i = 0; s[i];) {
        bool hit = false;
        for (size_t m = 0; m < sizeof MAP / sizeof MAP[0] && !hit; m++) {
            size_t k = strlen(MAP[m].from);
            if (strncmp(s + i, MAP[m].from, k) == 0) {
                qrl_vbuf_puts(out, MAP[m].to);
                i += k;
                hit = true;
            }
        }
        if (!hit) qrl_vbuf_putc(out, s[i++]);
    }
}

qrl_status qrl_verify_countdown(const char *response, const char *reference, qrl_verify_result *res,
                                qrl_error *err) {
    qrl_verify_result_clear(res);
    if (!reference) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "countdown verifier: NULL reference");
    if (!response) response = "";
    long long numbers[QRL_COUNTDOWN_NUMBERS_MAX], used[QRL_COUNTDOWN_NUMBERS_MAX], target = 0;
    size_t count = 0, n_used = 0;
    QRL_TRY(countdown_reference(reference, numbers, &count, &target, err));

    qrl_vbuf raw = {0}, expr = {0};
    qrl_status st = QRL_OK;
    if (!countdown_extract(response, &raw)) goto done;
    countdown_ascii(qrl_vbuf_str(&raw), &expr);
    if (raw.oom || expr.oom) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "countdown verifier: out of memory");
        goto done;
    }
    /* trim, and a trailing sentence dot */
    char *e = expr.p ? expr.p : (char *)"";
    size_t n = expr.len;
    while (n && (is_space(e[n - 1]) || e[n - 1] == '.')) e[--n] = '\0';
    while (is_space(*e)) e++;
    if (!*e) goto done;
    res->found = true;
    qrl_verify_set_extracted(res, e);
    /* "expr = target": the right side must be the target */
    char *eq = strchr(e, '=');
    if (eq) {
        qrl_vbuf rhs = {0};
        const char *tok, *end = parse_integer(eq + 1, &rhs, &tok);
        while (end && is_space(*end)) end++;
        bool ok = end && *end == '\0' && strtoll(qrl_vbuf_str(&rhs), NULL, 10) == target &&
                  rhs.len < COUNTDOWN_LITERAL_DIGITS;
        qrl_vbuf_free(&rhs);
        if (!ok) goto done;
        *eq = '\0';
    }
    long long num = 0, den = 1;
    if (qrl_countdown_eval(e, &num, &den, used, &n_used) != QRL_COUNTDOWN_OK) goto done;
    if (n_used != count || den != 1 || num != target) goto done;
    qsort(used, n_used, sizeof used[0], cmp_ll);
    qsort(numbers, count, sizeof numbers[0], cmp_ll);
    if (memcmp(used, numbers, count * sizeof numbers[0]) != 0) goto done;
    res->correct = true;
    res->reward = 1.0;
done:
    qrl_vbuf_free(&raw);
    qrl_vbuf_free(&expr);
    return st;
}
