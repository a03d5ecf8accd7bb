/* Numeric evaluation of a normalized LaTeX math answer, for equivalence checks
 * (docs/verifiers.md "Comparison"): 0.5 vs \frac{1}{2}, 2\sqrt{5} vs \sqrt{20},
 * 2k+2 vs 2(k+1).  Recursive descent over
 *
 *   expr  := term (('+' | '-') term)*
 *   term  := unary (('*' | '/' | \cdot | \times | \div | <implicit>) unary)*
 *   unary := ('-' | '+') unary | power
 *   power := primary ('!')? ('^' exponent)*
 *   primary := number | INT\frac{INT}{INT} (mixed number) | ( expr ) | { expr }
 *            | \frac{a}{b} | \sqrt[n]{a} | \binom{n}{k} | \pi | \sin x ... | letter
 *
 * Single letters are variables, given fixed non-integer values at two points; a run of
 * three or more letters is a word, not a product, and is refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "verify/verify_internal.h"

#define EVAL_DEPTH_MAX 100
#define NUMBER_MAX 64

typedef struct {
    const char *s;
    size_t i;
    int point;
    int depth;
    bool vars;
    bool ok;
} ev;

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

bool qrl_verify_close(double a, double b) {
    if (a == b) return true;
    return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b));
}

static double fail(ev *e) {
    e->ok = false;
    return NAN;
}

static void skip_spaces(ev *e) {
    while (e->s[e->i] == ' ') e->i++;
}

/* Value of variable `c` at a point: distinct, non-integer, positive (so \sqrt{x} and
 * \ln x stay defined). */
static double var_value(char c, int point) {
    int k = (c >= 'a' && c <= 'z') ? c - 'a' : 26 + (c - 'A');
    return point == 0 ? 1.1 + 0.137 * k : 0.6 + 0.291 * k + 0.001 * k * k;
}

/* Control word at s[i] (after the backslash): its length if it equals `w`. */
static size_t word_at(const char *s, size_t i, const char *w) {
    size_t n = strlen(w);
    return (strncmp(s + i, w, n) == 0 && !is_alpha(s[i + n])) ? n : 0;
}

static double parse_expr(ev *e);
static double parse_unary(ev *e);
static double parse_power(ev *e);

/* A decimal literal: digits [. digits] or . digits */
static double parse_number(ev *e, bool *integer) {
    const char *s = e->s + e->i;
    size_t k = 0;
    while (is_digit(s[k])) k++;
    *integer = true;
    if (s[k] == '.' && is_digit(s[k + 1])) {
        *integer = false;
        k++;
        while (is_digit(s[k])) k++;
    }
    if (k == 0 || k >= NUMBER_MAX) return fail(e);
    char buf[NUMBER_MAX];
    memcpy(buf, s, k);
    buf[k] = '\0';
    e->i += k;
    return strtod(buf, NULL);
}

/* {expr} as a TeX argument */
static double parse_group(ev *e) {
    skip_spaces(e);
    if (e->s[e->i] != '{') return fail(e);
    e->i++;
    double v = parse_expr(e);
    skip_spaces(e);
    if (e->s[e->i] != '}') return fail(e);
    e->i++;
    return v;
}

/* \frac{INT}{INT} right after an integer: the fraction of a mixed number (1\frac{4}{5}) */
static bool mixed_fraction(ev *e, double *frac) {
    const char *s = e->s + e->i;
    if (strncmp(s, "\\frac{", 6) != 0) return false;
    size_t k = 6, a = 0, b = 0;
    while (is_digit(s[k + a])) a++;
    if (!a || strncmp(s + k + a, "}{", 2) != 0) return false;
    size_t k2 = k + a + 2;
    while (is_digit(s[k2 + b])) b++;
    if (!b || s[k2 + b] != '}') return false;
    char buf[NUMBER_MAX];
    if (a >= NUMBER_MAX || b >= NUMBER_MAX) return false;
    memcpy(buf, s + k, a);
    buf[a] = '\0';
    double num = strtod(buf, NULL);
    memcpy(buf, s + k2, b);
    buf[b] = '\0';
    *frac = num / strtod(buf, NULL);
    e->i += k2 + b + 1;
    return true;
}

static const struct {
    const char *name;
    double (*fn)(double);
} FUNCTIONS[] = {
    {"sin", sin},   {"cos", cos},       {"tan", tan},       {"ln", log},
    {"log", log10}, {"exp", exp},       {"arcsin", asin},   {"arccos", acos},
    {"arctan", atan},
};

static double cot(double x) { return 1.0 / tan(x); }
static double sec(double x) { return 1.0 / cos(x); }
static double csc(double x) { return 1.0 / sin(x); }

static double parse_command(ev *e) {
    const char *s = e->s;
    size_t i = e->i + 1, k;
    if ((k = word_at(s, i, "frac"))) {
        e->i = i + k;
        double a = parse_group(e);
        double b = parse_group(e);
        return a / b;
    }
    if ((k = word_at(s, i, "sqrt"))) {
        e->i = i + k;
        double root = 2.0;
        skip_spaces(e);
        if (s[e->i] == '[') {
            e->i++;
            root = parse_expr(e);
            skip_spaces(e);
            if (s[e->i] != ']') return fail(e);
            e->i++;
        }
        double x = parse_group(e);
        if (x < 0 || root <= 0) return fail(e);
        return root == 2.0 ? sqrt(x) : pow(x, 1.0 / root);
    }
    if ((k = word_at(s, i, "binom"))) {
        e->i = i + k;
        double n = parse_group(e), r = parse_group(e);
        if (!(n >= 0 && r >= 0 && n <= 1000 && r <= n && n == floor(n) && r == floor(r))) return fail(e);
        double v = 1.0;
        for (int j = 1; j <= (int)r; j++) v = v * (n - r + j) / j;
        return round(v);
    }
    if ((k = word_at(s, i, "pi"))) {
        e->i = i + k;
        return M_PI;
    }
    double (*fn)(double) = NULL;
    for (size_t f = 0; f < sizeof FUNCTIONS / sizeof FUNCTIONS[0] && !fn; f++)
        if ((k = word_at(s, i, FUNCTIONS[f].name))) fn = FUNCTIONS[f].fn;
    if (!fn && (k = word_at(s, i, "cot"))) fn = cot;
    if (!fn && (k = word_at(s, i, "sec"))) fn = sec;
    if (!fn && (k = word_at(s, i, "csc"))) fn = csc;
    if (fn) {
        e->i = i + k;
        return fn(parse_power(e));
    }
    return fail(e); /* \infty, \pm, \cup, ...: not a value */
}

static double parse_primary(ev *e) {
    skip_spaces(e);
    if (++e->depth > EVAL_DEPTH_MAX) return fail(e);
    const char *s = e->s;
    char c = s[e->i];
    double v;
    if (is_digit(c) || (c == '.' && is_digit(s[e->i + 1]))) {
        bool integer;
        v = parse_number(e, &integer);
        double frac;
        if (integer && e->ok && mixed_fraction(e, &frac)) v += frac;
    } else if (c == '(' || c == '{') {
        char close = c == '(' ? ')' : '}';
        e->i++;
        v = parse_expr(e);
        skip_spaces(e);
        if (s[e->i] != close) v = fail(e);
        else e->i++;
    } else if (c == '\\') {
        v = parse_command(e);
    } else if (is_alpha(c)) {
        if (is_alpha(s[e->i + 1]) && is_alpha(s[e->i + 2])) v = fail(e); /* a word */
        else {
            v = var_value(c, e->point);
            e->vars = true;
            e->i++;
        }
    } else {
        v = fail(e);
    }
    e->depth--;
    return v;
}

static double parse_exponent(ev *e) {
    skip_spaces(e);
    char c = e->s[e->i];
    if (c == '-' || c == '+') {
        e->i++;
        double v = parse_primary(e);
        return c == '-' ? -v : v;
    }
    return parse_primary(e);
}

static double parse_power(ev *e) {
    double v = parse_primary(e);
    while (e->ok) {
        skip_spaces(e);
        char c = e->s[e->i];
        if (c == '!') {
            if (!(v >= 0 && v <= 170 && v == floor(v))) return fail(e);
            double f = 1.0;
            for (int j = 2; j <= (int)v; j++) f *= j;
            v = f;
            e->i++;
        } else if (c == '^') {
            e->i++;
            v = pow(v, parse_exponent(e));
        } else {
            break;
        }
    }
    return v;
}

static double parse_unary(ev *e) {
    skip_spaces(e);
    if (++e->depth > EVAL_DEPTH_MAX) return fail(e);
    char c = e->s[e->i];
    double v;
    if (c == '-' || c == '+') {
        e->i++;
        v = parse_unary(e);
        if (c == '-') v = -v;
    } else {
        v = parse_power(e);
    }
    e->depth--;
    return v;
}

/* Can a factor start here (for implicit multiplication)? */
static bool starts_factor(const ev *e) {
    const char *s = e->s + e->i;
    char c = *s;
    if (is_digit(c) || c == '.' || c == '(' || c == '{' || is_alpha(c)) return true;
    if (c != '\\') return false;
    return !(word_at(s, 1, "cdot") || word_at(s, 1, "times") || word_at(s, 1, "div")) && is_alpha(s[1]);
}

static double parse_term(ev *e) {
    double v = parse_unary(e);
    while (e->ok) {
        skip_spaces(e);
        const char *s = e->s + e->i;
        size_t k;
        if (*s == '*') {
            e->i++;
            v *= parse_unary(e);
        } else if (*s == '/') {
            e->i++;
            v /= parse_unary(e);
        } else if (*s == '\\' && ((k = word_at(s, 1, "cdot")) || (k = word_at(s, 1, "times")))) {
            e->i += k + 1;
            v *= parse_unary(e);
        } else if (*s == '\\' && (k = word_at(s, 1, "div"))) {
            e->i += k + 1;
            v /= parse_unary(e);
        } else if (starts_factor(e)) {
            v *= parse_power(e);
        } else {
            break;
        }
    }
    return v;
}

static double parse_expr(ev *e) {
    if (++e->depth > EVAL_DEPTH_MAX) return fail(e);
    double v = parse_term(e);
    while (e->ok) {
        skip_spaces(e);
        char c = e->s[e->i];
        if (c == '+') { e->i++; v += parse_term(e); }
        else if (c == '-') { e->i++; v -= parse_term(e); }
        else break;
    }
    e->depth--;
    return v;
}

bool qrl_verify_eval(const char *s, int point, double *value, bool *has_vars) {
    ev e = {.s = s, .i = 0, .point = point, .depth = 0, .vars = false, .ok = true};
    double v = parse_expr(&e);
    skip_spaces(&e);
    if (!e.ok || e.s[e.i] != '\0' || !isfinite(v)) return false;
    *value = v;
    *has_vars = e.vars;
    return true;
}
