/* Normalization of math answers to a canonical string (docs/verifiers.md
 * "Normalization").  A chain of small passes, each reading one string and writing the
 * next; the order matters and is the documented one.  Answers longer than
 * NORMALIZE_MAX bytes are not real final answers: they only lose their whitespace, so
 * every pass may be quadratic in the worst case without becoming a hazard. */
#include <stdint.h>
#include <string.h>

#include "verify/verify_internal.h"

#define NORMALIZE_MAX 4096
#define CANON_DEPTH_MAX 32

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Index of the '}' closing the '{' at s[open] (escaped \{ \} skipped), or n. */
static size_t match_brace(const char *s, size_t n, size_t open) {
    int depth = 0;
    for (size_t i = open; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) { i++; continue; }
        if (s[i] == '{') depth++;
        else if (s[i] == '}' && --depth == 0) return i;
    }
    return n;
}

/* ---- pass 1: delimiters, spacing, degree/percent/dollar signs, \dfrac -------------- */

typedef struct {
    const char *from;
    const char *to;
    bool command; /* a control word: must not be followed by a letter (\left vs \leftarrow) */
} rewrite;

static const rewrite REWRITES[] = {
    {"\\left.", "", false},  {"\\right.", "", false}, {"\\left", "", true},
    {"\\right", "", true},   {"\\bigl", "", true},    {"\\bigr", "", true},
    {"\\Bigl", "", true},    {"\\Bigr", "", true},    {"\\(", "", false},
    {"\\)", "", false},      {"\\[", "", false},      {"\\]", "", false},
    {"\\$", "", false},      {"$", "", false},        {"\\,", "", false},
    {"\\;", "", false},      {"\\:", "", false},      {"\\ ", " ", false},
    {"\\quad", " ", true},   {"\\qquad", " ", true},  {"~", " ", false},
    {"\\displaystyle", "", true},
    {"^{\\circ}", "", false}, {"^\\circ", "", false}, {"\\circ", "", true},
    {"\\degree", "", true},  {"\xc2\xb0", "", false}, /* U+00B0 degree sign */
    {"\\%", "", false},      {"%", "", false},
    {"\\dfrac", "\\frac", true}, {"\\tfrac", "\\frac", true},
    {"\\dbinom", "\\binom", true}, {"\\tbinom", "\\binom", true},
    {"\xe2\x88\x92", "-", false}, /* U+2212 minus sign */
    {"\\le", "\\leq", true}, {"\\ge", "\\geq", true},
};

static void pass_rewrite(const char *s, qrl_vbuf *o) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if (s[i] == '\\' && s[i + 1] == '\\') { /* a row break \\ (matrices) stays */
            qrl_vbuf_putn(o, s + i, 2);
            i += 2;
            continue;
        }
        /* `,\!` is the LaTeX thousands idiom (10,\!080): drop \! and the space after */
        if (s[i] == '\\' && s[i + 1] == '!') {
            i += 2;
            while (i < n && is_space(s[i])) i++;
            continue;
        }
        bool hit = false;
        for (size_t r = 0; r < sizeof REWRITES / sizeof REWRITES[0]; r++) {
            size_t k = strlen(REWRITES[r].from);
            if (strncmp(s + i, REWRITES[r].from, k) != 0) continue;
            if (REWRITES[r].command && is_alpha(s[i + k])) continue;
            qrl_vbuf_puts(o, REWRITES[r].to);
            i += k;
            hit = true;
            break;
        }
        if (!hit) qrl_vbuf_putc(o, s[i++]);
    }
}

/* ---- pass 2: \text{...} and friends ------------------------------------------------ */

static const char *const TEXT_COMMANDS[] = {
    "\\text", "\\textrm", "\\textbf", "\\textit", "\\mbox", "\\mathrm", "\\mathbf",
    "\\mathit", "\\textnormal", "\\operatorname",
};

/* Words only (letters, spaces, dots, slashes, ^digits): what a unit looks like. */
static bool looks_like_unit(const char *s, size_t n) {
    bool letter = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (is_alpha(c)) letter = true;
        else if (c == '^' && i + 1 < n && is_digit(s[i + 1])) i++;
        else if (!(is_space(c) || c == '.' || c == '/')) return false;
    }
    return letter;
}

/* \text{X}: dropped (with a following ^2 / ^{2}) when it follows a number-like
 * character and holds only words (a unit: 5\text{ cm}^2); unwrapped otherwise
 * (\text{(B)} -> (B), \text{Evelyn} -> Evelyn). */
static void pass_text(const char *s, qrl_vbuf *o) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        if (s[i] == '\\') {
            for (size_t c = 0; c < sizeof TEXT_COMMANDS / sizeof TEXT_COMMANDS[0]; c++) {
                size_t l = strlen(TEXT_COMMANDS[c]);
                if (strncmp(s + i, TEXT_COMMANDS[c], l) == 0 && !is_alpha(s[i + l])) { k = l; break; }
            }
        }
        size_t j = i + k;
        while (k && j < n && s[j] == ' ') j++;
        if (!k || j >= n || s[j] != '{' || match_brace(s, n, j) == n) {
            qrl_vbuf_putc(o, s[i++]);
            continue;
        }
        size_t close = match_brace(s, n, j);
        const char *c = s + j + 1;
        size_t cn = close - j - 1;
        size_t p = o->len; /* previous meaningful output char */
        while (p > 0 && is_space(o->p[p - 1])) p--;
        char prev = p > 0 ? o->p[p - 1] : '\0';
        i = close + 1;
        if ((is_digit(prev) || prev == '}' || prev == ')' || prev == '.') && looks_like_unit(c, cn)) {
            if (s[i] == '^' && is_digit(s[i + 1])) i += 2;
            else if (strncmp(s + i, "^{", 2) == 0 && is_digit(s[i + 2]) && s[i + 3] == '}') i += 4;
            continue;
        }
        qrl_vbuf_putn(o, c, cn);
    }
}

/* ---- pass 3: trailing words after a plain number ("18 dollars", "5 cm^2") ---------- */

static void pass_trailing_words(const char *s, qrl_vbuf *o) {
    size_t n = strlen(s), end = n;
    while (end > 0 && (is_space(s[end - 1]) || s[end - 1] == '.')) end--; /* "5 apples." */
    size_t full = end;
    for (;;) {
        size_t e = end;
        while (e > 0 && is_space(s[e - 1])) e--;
        size_t w = e;
        if (w >= 2 && s[w - 2] == '^' && is_digit(s[w - 1])) w -= 2; /* cm^2 */
        size_t letters_end = w;
        while (w > 0 && is_alpha(s[w - 1])) w--;
        /* a word of two or more letters, preceded by whitespace (so 2k stays) */
        if (letters_end - w < 2 || w == 0 || !is_space(s[w - 1]) || (w > 1 && s[w - 2] == '\\')) break;
        end = w;
    }
    if (end == full) { qrl_vbuf_puts(o, s); return; }
    /* keep the cut only when a number remains: a plain one, or a constant expression
     * (2\sqrt{3} units) */
    size_t a = 0, b = end;
    while (a < b && is_space(s[a])) a++;
    while (b > a && is_space(s[b - 1])) b--;
    size_t k = a < b ? qrl_verify_number_len(s + a, s + a) : 0;
    bool number = k && a + k == b;
    if (!number && a < b) {
        qrl_vbuf t = {0};
        qrl_vbuf_putn(&t, s + a, b - a);
        double v;
        bool vars = true;
        number = !t.oom && qrl_verify_eval(qrl_vbuf_str(&t), 0, &v, &vars) && !vars;
        qrl_vbuf_free(&t);
    }
    if (number) qrl_vbuf_putn(o, s + a, b - a);
    else qrl_vbuf_puts(o, s);
}

/* ---- pass 4: a leading "x =" / "\theta =" / "x \in" ------------------------------- */

static void pass_leading_var(const char *s, qrl_vbuf *o) {
    size_t i = 0;
    while (is_space(s[i])) i++;
    size_t v = i;
    if (s[i] == '\\' && is_alpha(s[i + 1])) {
        i++;
        while (is_alpha(s[i])) i++;
    } else if (is_alpha(s[i]) && !is_alpha(s[i + 1])) {
        i++;
    }
    if (i == v) { qrl_vbuf_puts(o, s); return; }
    if (s[i] == '_') { /* x_1 or x_{12} */
        if (s[i + 1] == '{') { size_t c = match_brace(s, strlen(s), i + 1); i = s[c] ? c + 1 : i; }
        else if (s[i + 1]) i += 2;
    }
    while (is_space(s[i])) i++;
    size_t k = 0;
    if (s[i] == '=') k = 1;
    else if (strncmp(s + i, "\\in", 3) == 0 && !is_alpha(s[i + 3])) k = 3;
    /* only one assignment: "x = y = 3" or "a = 1, b = 2" are left alone */
    if (!k || strchr(s + i + k, '=')) { qrl_vbuf_puts(o, s); return; }
    qrl_vbuf_puts(o, s + i + k);
}

/* ---- pass 5: canonical arguments (\frac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2},
 * ^{2} -> ^2) ------------------------------------------------------------------------- */

static void canon(const char *s, size_t n, qrl_vbuf *o, int depth);

/* One TeX argument at s[*i]: a {group}, a control word, or one character.  Emits it
 * as a braced group (`braced`) or as written, canonicalized inside. */
static void canon_arg(const char *s, size_t n, size_t *i, qrl_vbuf *o, int depth, bool braced) {
    size_t j = *i;
    while (j < n && is_space(s[j])) j++;
    if (j >= n) { *i = j; if (braced) qrl_vbuf_puts(o, "{}"); return; }
    size_t a, e; /* content [a, e), next position after */
    size_t next;
    if (s[j] == '{') {
        size_t c = match_brace(s, n, j);
        a = j + 1;
        e = c;
        next = c < n ? c + 1 : n;
    } else if (s[j] == '\\') {
        a = j;
        e = j + 1;
        if (e < n && is_alpha(s[e])) { while (e < n && is_alpha(s[e])) e++; }
        else if (e < n) e++;
        next = e;
    } else {
        a = j;
        e = j + 1;
        /* a multi-byte UTF-8 character stays whole */
        while (e < n && ((unsigned char)s[e] & 0xC0) == 0x80) e++;
        next = e;
    }
    *i = next;
    if (!braced && e - a == 1) { qrl_vbuf_putc(o, s[a]); return; }
    qrl_vbuf_putc(o, '{');
    canon(s + a, e - a, o, depth + 1);
    qrl_vbuf_putc(o, '}');
}

static void canon(const char *s, size_t n, qrl_vbuf *o, int depth) {
    if (depth > CANON_DEPTH_MAX) { qrl_vbuf_putn(o, s, n); return; }
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '\\' && i + 1 < n && is_alpha(s[i + 1])) {
            size_t j = i + 1;
            while (j < n && is_alpha(s[j])) j++;
            size_t len = j - i;
            qrl_vbuf_putn(o, s + i, len);
            i = j;
            if ((len == 5 && strncmp(s + i - 5, "\\frac", 5) == 0) ||
                (len == 6 && strncmp(s + i - 6, "\\binom", 6) == 0)) {
                canon_arg(s, n, &i, o, depth, true);
                canon_arg(s, n, &i, o, depth, true);
            } else if (len == 5 && strncmp(s + i - 5, "\\sqrt", 5) == 0) {
                size_t k = i;
                while (k < n && is_space(s[k])) k++;
                if (k < n && s[k] == '[') {
                    const char *rb = memchr(s + k, ']', n - k);
                    if (rb) {
                        qrl_vbuf_putc(o, '[');
                        canon(s + k + 1, (size_t)(rb - s) - k - 1, o, depth + 1);
                        qrl_vbuf_putc(o, ']');
                        i = (size_t)(rb - s) + 1;
                    }
                }
                canon_arg(s, n, &i, o, depth, true);
            }
            continue;
        }
        if (c == '\\' && i + 1 < n) { /* control symbol: \{ \} \\ \, ... */
            qrl_vbuf_putn(o, s + i, 2);
            i += 2;
            continue;
        }
        if (c == '^' || c == '_') {
            qrl_vbuf_putc(o, c);
            i++;
            size_t k = i;
            while (k < n && is_space(s[k])) k++;
            if (k < n && s[k] == '{') {
                size_t close = match_brace(s, n, k);
                size_t a = k + 1, e = close;
                while (a < e && is_space(s[a])) a++;
                while (e > a && is_space(s[e - 1])) e--;
                if (close < n && e - a == 1 && s[a] != '\\') { /* ^{2} -> ^2 */
                    qrl_vbuf_putc(o, s[a]);
                    i = close + 1;
                    continue;
                }
            }
            i = k;
            continue;
        }
        if (c == '{') {
            size_t close = match_brace(s, n, i);
            qrl_vbuf_putc(o, '{');
            canon(s + i + 1, (close < n ? close : n) - i - 1, o, depth + 1);
            if (close < n) qrl_vbuf_putc(o, '}');
            i = close < n ? close + 1 : n;
            continue;
        }
        qrl_vbuf_putc(o, c);
        i++;
    }
}

static void pass_canon(const char *s, qrl_vbuf *o) { canon(s, strlen(s), o, 0); }

/* ---- pass 6: thousands separators outside brackets ("1,000" -> "1000", but
 * "(12,102)" is a pair and "3, 500" a list) ----------------------------------------- */

static void pass_thousands(const char *s, qrl_vbuf *o) {
    size_t n = strlen(s);
    int depth = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '(' || c == '[') depth++;
        else if ((c == ')' || c == ']') && depth > 0) depth--;
        bool start = is_digit(c) && (i == 0 || !(is_digit(s[i - 1]) || s[i - 1] == '.' || s[i - 1] == ','));
        if (depth == 0 && start) {
            size_t d = 0;
            while (i + d < n && is_digit(s[i + d])) d++;
            size_t e = i + d, groups = 0;
            while (d <= 3 && s[e] == ',' && is_digit(s[e + 1]) && is_digit(s[e + 2]) &&
                   is_digit(s[e + 3]) && !is_digit(s[e + 4])) {
                e += 4;
                groups++;
            }
            if (groups) {
                for (size_t k = i; k < e; k++)
                    if (s[k] != ',') qrl_vbuf_putc(o, s[k]);
                i = e;
                continue;
            }
            qrl_vbuf_putn(o, s + i, d);
            i += d;
            continue;
        }
        qrl_vbuf_putc(o, c);
        i++;
    }
}

/* ---- pass 7: whitespace out (one space kept where it ends a control word before a
 * letter), trailing dots, outer braces, "(B)" -> "B" ------------------------------- */

static void pass_squeeze(const char *s, qrl_vbuf *o) {
    size_t n = strlen(s);
    bool in_word = false; /* inside a control word (\cot) */
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (is_space(c)) {
            size_t k = i;
            while (k < n && is_space(s[k])) k++;
            if (in_word && k < n && is_alpha(s[k])) qrl_vbuf_putc(o, ' ');
            i = k - 1;
            in_word = false;
            continue;
        }
        if (c == '\\') in_word = i + 1 < n && is_alpha(s[i + 1]);
        else if (!is_alpha(c)) in_word = false;
        qrl_vbuf_putc(o, c);
    }
    /* trailing sentence punctuation */
    while (o->len > 0 && (o->p[o->len - 1] == '.' || o->p[o->len - 1] == ',') &&
           !(o->len > 1 && o->p[o->len - 2] == '\\')) {
        o->p[--o->len] = '\0';
    }
    /* {5} -> 5 while one group spans the whole string */
    while (o->len >= 2 && o->p[0] == '{' && match_brace(o->p, o->len, 0) == o->len - 1) {
        memmove(o->p, o->p + 1, o->len - 2);
        o->len -= 2;
        o->p[o->len] = '\0';
    }
    /* (B) -> B: a multiple-choice letter */
    if (o->len == 3 && o->p[0] == '(' && is_alpha(o->p[1]) && o->p[2] == ')') {
        o->p[0] = o->p[1];
        o->len = 1;
        o->p[1] = '\0';
    }
}

/* ---- driver ------------------------------------------------------------------------ */

typedef void (*pass_fn)(const char *s, qrl_vbuf *o);

bool qrl_verify_normalize_into(const char *answer, qrl_vbuf *out) {
    qrl_vbuf a = {0}, b = {0};
    /* a reference or a box may itself hold a box: use its content */
    if (!qrl_verify_extract_boxed(answer, &a)) qrl_vbuf_puts(&a, answer);
    if (a.len > NORMALIZE_MAX) {
        for (size_t i = 0; i < a.len; i++)
            if (!is_space(a.p[i])) qrl_vbuf_putc(out, a.p[i]);
        bool ok = !a.oom && !out->oom;
        qrl_vbuf_free(&a);
        return ok;
    }
    static const pass_fn PASSES[] = {pass_rewrite, pass_text, pass_trailing_words,
                                     pass_leading_var, pass_canon, pass_thousands};
    for (size_t p = 0; p < sizeof PASSES / sizeof PASSES[0]; p++) {
        qrl_vbuf_reset(&b);
        PASSES[p](qrl_vbuf_str(&a), &b);
        qrl_vbuf t = a;
        a = b;
        b = t;
    }
    pass_squeeze(qrl_vbuf_str(&a), out);
    bool ok = !a.oom && !b.oom && !out->oom;
    qrl_vbuf_free(&a);
    qrl_vbuf_free(&b);
    return ok;
}
