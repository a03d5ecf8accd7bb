/* Answer extraction from free text: \boxed{}, GSM8K `####`, the last number.
 * Every scan is linear in the text length (responses can be long and adversarial). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "verify/verify_internal.h"

/* ---- growable string ---------------------------------------------------------------- */

static bool vbuf_reserve(qrl_vbuf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) { b->oom = true; return false; }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = true; return false; }
    b->p = p;
    b->cap = cap;
    return true;
}

void qrl_vbuf_putn(qrl_vbuf *b, const char *s, size_t n) {
    if (!vbuf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void qrl_vbuf_puts(qrl_vbuf *b, const char *s) { qrl_vbuf_putn(b, s, strlen(s)); }

void qrl_vbuf_putc(qrl_vbuf *b, char c) { qrl_vbuf_putn(b, &c, 1); }

void qrl_vbuf_reset(qrl_vbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

void qrl_vbuf_free(qrl_vbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

const char *qrl_vbuf_str(const qrl_vbuf *b) { return b->p ? b->p : ""; }

/* ---- helpers ------------------------------------------------------------------------ */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Append s[0..n) without leading/trailing whitespace; true when something remained. */
static bool put_trimmed(qrl_vbuf *out, const char *s, size_t n) {
    while (n && is_space(*s)) { s++; n--; }
    while (n && is_space(s[n - 1])) n--;
    qrl_vbuf_putn(out, s, n);
    return n > 0 && !out->oom;
}

void qrl_verify_result_clear(qrl_verify_result *result) {
    result->reward = 0.0;
    result->correct = false;
    result->found = false;
    result->extracted[0] = '\0';
}

void qrl_verify_set_extracted(qrl_verify_result *result, const char *s) {
    size_t n = strlen(s);
    if (n >= QRL_VERIFY_EXTRACTED_MAX) {
        n = QRL_VERIFY_EXTRACTED_MAX - 1;
        /* do not cut inside a UTF-8 sequence: back off over continuation bytes */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    memcpy(result->extracted, s, n);
    result->extracted[n] = '\0';
}

/* ---- \boxed{} ----------------------------------------------------------------------- */

/* Length of the box command at p ("\boxed" or "\fbox"), or 0.  `\boxedx` is another
 * command, not a box. */
static size_t box_command_len(const char *p) {
    size_t k = 0;
    if (strncmp(p, "\\boxed", 6) == 0) k = 6;
    else if (strncmp(p, "\\fbox", 5) == 0) k = 5;
    return (k && !is_alpha(p[k])) ? k : 0;
}

bool qrl_verify_extract_boxed(const char *text, qrl_vbuf *out) {
    size_t n = strlen(text);
    /* One pass pairs every unescaped '{' with its '}' (a stack of open positions), so
     * each box is resolved in O(1) and many unclosed boxes stay linear. */
    uint32_t *close_at = NULL, *stack = NULL;
    if (n > UINT32_MAX - 1) return false; /* texts this large are not responses */
    bool any_box = false;
    for (size_t i = 0; i < n && !any_box; i++) any_box = text[i] == '\\' && box_command_len(text + i);
    if (!any_box) return false;
    close_at = malloc((n + 1) * sizeof *close_at);
    stack = malloc((n + 1) * sizeof *stack);
    if (!close_at || !stack) { out->oom = true; free(close_at); free(stack); return false; }
    size_t depth = 0;
    for (size_t i = 0; i < n; i++) {
        close_at[i] = UINT32_MAX;
        if (text[i] == '\\' && (text[i + 1] == '{' || text[i + 1] == '}' || text[i + 1] == '\\')) {
            close_at[++i] = UINT32_MAX; /* escaped brace or "\\": not a group delimiter */
            continue;
        }
        if (text[i] == '{') stack[depth++] = (uint32_t)i;
        else if (text[i] == '}' && depth) close_at[stack[--depth]] = (uint32_t)i;
    }
    const char *best = NULL;
    size_t best_n = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] != '\\') continue;
        size_t k = box_command_len(text + i);
        if (!k) continue;
        size_t j = i + k;
        while (j < n && (text[j] == ' ' || text[j] == '\t')) j++;
        const char *c;
        size_t cn;
        if (j < n && text[j] == '{') {
            if (close_at[j] == UINT32_MAX) continue; /* unclosed: not a box */
            c = text + j + 1;
            cn = close_at[j] - j - 1;
        } else {
            /* `\boxed 5`: the run up to whitespace, `$` or a closing brace */
            size_t e = j;
            while (e < n && !is_space(text[e]) && text[e] != '$' && text[e] != '}') e++;
            c = text + j;
            cn = e - j;
        }
        size_t a = 0;
        while (a < cn && is_space(c[a])) a++;
        if (a == cn) continue; /* empty box */
        best = c;
        best_n = cn;
    }
    free(close_at);
    free(stack);
    if (!best) return false;
    return put_trimmed(out, best, best_n);
}

/* ---- numbers ------------------------------------------------------------------------ */

static size_t digits_at(const char *s) {
    size_t k = 0;
    while (is_digit(s[k])) k++;
    return k;
}

/* `\frac{12}{34}` (also \dfrac, \tfrac) at s: its length, or 0. */
static size_t frac_number_len(const char *s) {
    size_t k;
    if (strncmp(s, "\\frac{", 6) == 0) k = 5;
    else if (strncmp(s, "\\dfrac{", 7) == 0 || strncmp(s, "\\tfrac{", 7) == 0) k = 6;
    else return 0;
    size_t d = digits_at(s + k + 1);
    if (!d || s[k + 1 + d] != '}' || s[k + 2 + d] != '{') return 0;
    k += 3 + d;
    d = digits_at(s + k);
    if (!d || s[k + d] != '}') return 0;
    return k + d + 1;
}

size_t qrl_verify_number_len(const char *s, const char *text_start) {
    size_t k = 0;
    char prev = s > text_start ? s[-1] : ' ';
    if (is_digit(prev) || prev == '.') return 0; /* inside another number */
    if (*s == '-') {
        /* a sign, not a minus between operands: "5-3" is two numbers */
        if (is_digit(prev) || is_alpha(prev) || prev == ')' || prev == ']' || prev == '}') return 0;
        k = 1;
    }
    size_t f = frac_number_len(s + k);
    if (f) return k + f;
    size_t d = digits_at(s + k);
    if (d == 0) {
        if (s[k] == '.' && is_digit(s[k + 1])) return k + 1 + digits_at(s + k + 1); /* .5 */
        return 0;
    }
    size_t end = k + d;
    if (d <= 3) {
        /* thousands groups: 1,000 and 12,345,678 (exactly three digits per group) */
        size_t e = end;
        while (s[e] == ',' && digits_at(s + e + 1) == 3) e += 4;
        end = e;
    }
    if (s[end] == '.' && is_digit(s[end + 1])) {
        end += 1 + digits_at(s + end + 1);
    } else if (s[end] == '/' && is_digit(s[end + 1])) {
        end += 1 + digits_at(s + end + 1); /* a/b */
    }
    return end;
}

bool qrl_verify_extract_last_number(const char *text, qrl_vbuf *out) {
    const char *best = NULL;
    size_t best_n = 0;
    for (const char *p = text; *p;) {
        size_t k = qrl_verify_number_len(p, text);
        if (k) {
            best = p;
            best_n = k;
            p += k;
        } else {
            p++;
        }
    }
    if (!best) return false;
    qrl_vbuf_putn(out, best, best_n);
    return !out->oom;
}

/* ---- GSM8K #### --------------------------------------------------------------------- */

bool qrl_verify_extract_hashes(const char *text, qrl_vbuf *out) {
    const char *last = NULL;
    for (const char *p = text; (p = strstr(p, "####")); p += 4) last = p;
    if (!last) return false;
    const char *s = last + 4;
    while (*s == '#') s++;                   /* "#####" still marks the answer */
    while (is_space(*s)) s++;                /* the answer may sit on the next line */
    size_t n = strcspn(s, "\n");
    for (size_t i = 0; i < n; i++) {
        size_t k = qrl_verify_number_len(s + i, s);
        if (k && i + k <= n) {
            qrl_vbuf_putn(out, s + i, k);
            return !out->oom;
        }
    }
    return put_trimmed(out, s, n);
}

bool qrl_verify_reference_answer(const char *reference, qrl_vbuf *out) {
    if (strstr(reference, "####")) return qrl_verify_extract_hashes(reference, out);
    if (qrl_verify_extract_boxed(reference, out)) return true;
    if (out->oom) return false;
    return put_trimmed(out, reference, strlen(reference));
}
