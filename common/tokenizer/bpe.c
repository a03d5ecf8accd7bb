/* BPE: merge engine, GPT-2 byte map, normalizers, pre-tokenizer regexes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* GPT-2's pre-tokenizer (HF ByteLevel use_regex) and Qwen2's Split pattern, verbatim. */
const char *const tok_gpt2_regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const tok_qwen2_regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- bytes and UTF-8 ---------------------------------------------------------------- */

/* bytes_to_unicode(): printable bytes stand for themselves, the other 68 are moved to
 * U+0100.. in byte order (0x00-0x20, 0x7F-0xA0, 0xAD). */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    if (b == 0xAD) return 256u + 67u;
    return b;
}

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xFF && cp != 0xAD)) return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

int tok_utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the UTF-8 character starting at s[0] (1 for a stray byte). */
static size_t utf8_len(const char *s, size_t n) {
    uint8_t c = (uint8_t)s[0];
    size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return l <= n ? l : 1;
}

size_t tok_utf8_validate(const char *s, size_t len) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t l;
        uint32_t cp, min;
        if ((c >> 5) == 6) { l = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c >> 4) == 14) { l = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c >> 3) == 30) { l = 4; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (i + l > len) return i;
        for (size_t k = 1; k < l; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += l;
    }
    return len;
}

static bool ensure(char **b, size_t *cap, size_t need) {
    if (*cap >= need) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *p = realloc(*b, c);
    if (!p) return false;
    *b = p;
    *cap = c;
    return true;
}

void tok_scratch_free(tok_scratch *s) {
    free(s->sym);
    free(s->nxt);
    free(s->prv);
    free(s->heap);
    free(s->buf);
    free(s->buf2);
    free(s->tmp);
    free(s->spans);
    free(s->spans2);
    if (s->md) pcre2_match_data_free(s->md);
    memset(s, 0, sizeof *s);
}

/* ---- merge engine ------------------------------------------------------------------ */

static bool cand_less(const tok_cand *a, const tok_cand *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->pos < b->pos);
}

static bool heap_push(tok_scratch *s, tok_cand c) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        tok_cand *h = realloc(s->heap, sizeof *h * cap);
        if (!h) return false;
        s->heap = h;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
    return true;
}

static tok_cand heap_pop(tok_scratch *s) {
    tok_cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const tok_cand *best = &last;
        if (l < n && cand_less(&s->heap[l], best)) { m = l; best = &s->heap[l]; }
        if (l + 1 < n && cand_less(&s->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n > 0) s->heap[i] = last;
    return top;
}

static bool push_pair(const qrl_tokenizer *tok, tok_scratch *s, int32_t l, int32_t r) {
    const tok_pair *p = tok_pairmap_get(&tok->merges, s->sym[l], s->sym[r]);
    if (!p) return true;
    return heap_push(s, (tok_cand){.prio = p->prio, .pos = l, .rpos = r, .lid = s->sym[l],
                                   .rid = s->sym[r], .id = p->id});
}

bool tok_scratch_symbols(tok_scratch *s, size_t n) {
    if (s->sym_cap >= n) return true;
    size_t cap = s->sym_cap ? s->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(s->sym, sizeof *a * cap);
    if (!a) return false;
    s->sym = a;
    int32_t *b = realloc(s->nxt, sizeof *b * cap);
    if (!b) return false;
    s->nxt = b;
    int32_t *c = realloc(s->prv, sizeof *c * cap);
    if (!c) return false;
    s->prv = c;
    s->sym_cap = cap;
    return true;
}

/* Lowest priority first, leftmost among equals: HF's Word::merge_all for BPE ranks, and
 * run.c's "best score, first position" loop for llama2.c, in O(n log n). */
bool tok_merge_word(const qrl_tokenizer *tok, tok_scratch *s, int n, tok_ids *out) {
    if (n == 1) return tok_ids_push(out, s->sym[0]);
    for (int i = 0; i < n; i++) { s->nxt[i] = i + 1 < n ? i + 1 : -1; s->prv[i] = i - 1; }
    s->heap_n = 0;
    for (int i = 0; i + 1 < n; i++)
        if (!push_pair(tok, s, i, i + 1)) return false;
    while (s->heap_n > 0) {
        tok_cand c = heap_pop(s);
        /* stale when either side has merged since the candidate was queued */
        if (s->sym[c.pos] != c.lid || s->nxt[c.pos] != c.rpos || s->sym[c.rpos] != c.rid) continue;
        s->sym[c.pos] = c.id;
        s->sym[c.rpos] = -1;
        int32_t nn = s->nxt[c.rpos];
        s->nxt[c.pos] = nn;
        if (nn >= 0) s->prv[nn] = c.pos;
        if (s->prv[c.pos] >= 0 && !push_pair(tok, s, s->prv[c.pos], c.pos)) return false;
        if (nn >= 0 && !push_pair(tok, s, c.pos, nn)) return false;
    }
    for (int i = 0; i >= 0; i = s->nxt[i])
        if (!tok_ids_push(out, s->sym[i])) return false;
    return true;
}

/* ---- normalizers ------------------------------------------------------------------ */

/* No code point below U+0300 changes under NFC or combines with what precedes it. */
static bool nfc_stable_fast(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0xCC) return false;
    return true;
}

static bool ascii_only(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return false;
    return true;
}

qrl_status tok_normalize(const qrl_tokenizer *tok, tok_scratch *s, const char *in, size_t len,
                         const char **out, size_t *out_len, qrl_error *err) {
    const char *cur = in;
    size_t n = len;
    for (int k = 0; k < tok->n_norm; k++) {
        const tok_norm_step *st = &tok->norm[k];
        /* write into whichever of buf/tmp does not hold `cur` */
        char **dst = cur == s->buf ? &s->tmp : &s->buf;
        size_t *cap = cur == s->buf ? &s->tmp_cap : &s->buf_cap;
        size_t m = 0;
        if (st->op <= TOK_NORM_NFKD) {
            if (st->op == TOK_NORM_NFC ? nfc_stable_fast(cur, n) : ascii_only(cur, n)) continue;
            static const int opts[] = {
                UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
                UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t rl =
                utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)n, &r,
                             (utf8proc_option_t)opts[st->op]);
            if (rl < 0)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "normalize: %s",
                                     utf8proc_errmsg(rl));
            if (!ensure(dst, cap, (size_t)rl + 1)) { free(r); goto nomem; }
            memcpy(*dst, r, (size_t)rl);
            free(r);
            m = (size_t)rl;
        } else if (st->op == TOK_NORM_PREPEND) {
            if (n == 0) continue;
            size_t la = strlen(st->a);
            if (!ensure(dst, cap, la + n + 1)) goto nomem;
            memcpy(*dst, st->a, la);
            memcpy(*dst + la, cur, n);
            m = la + n;
        } else { /* REPLACE */
            size_t la = strlen(st->a), lb = strlen(st->b);
            if (la == 0) continue;
            size_t worst = lb > la ? n / la * lb + n : n;
            if (!ensure(dst, cap, worst + 1)) goto nomem;
            for (size_t i = 0; i < n;) {
                if (i + la <= n && memcmp(cur + i, st->a, la) == 0) {
                    memcpy(*dst + m, st->b, lb);
                    m += lb;
                    i += la;
                } else {
                    (*dst)[m++] = cur[i++];
                }
            }
        }
        cur = *dst;
        n = m;
    }
    *out = cur;
    *out_len = n;
    return QRL_OK;
nomem:
    return qrl_error_set(err, QRL_STATUS_NOMEM, "normalize: out of memory");
}

/* ---- pre-tokenizer ----------------------------------------------------------------- */

/* HF tokenizers runs its patterns with Oniguruma, where \s is Unicode White_Space; PCRE2's
 * UCP \s also takes U+180E (via \h).  Rewrite \s / \S to the property so both agree. */
qrl_status tok_regex_compile(const char *pattern, bool literal, pcre2_code **re,
                             const char *src, const char *what, qrl_error *err) {
    size_t n = strlen(pattern);
    char *p = malloc(n * 16 + 1);
    if (!p) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (!literal && pattern[i] == '\\' && i + 1 < n) {
            char c = pattern[i + 1];
            if (c == 's' || c == 'S') {
                o += (size_t)sprintf(p + o, "\\%c{White_Space}", c == 's' ? 'p' : 'P');
                i++;
                continue;
            }
            p[o++] = pattern[i++];
        }
        p[o++] = pattern[i];
    }
    p[o] = '\0';
    int code;
    PCRE2_SIZE off;
    *re = pcre2_compile((PCRE2_SPTR)p, o, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0),
                        &code, &off, NULL);
    free(p);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: regex error at offset %zu: %s",
                             src, what, (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if absent */
    return QRL_OK;
}

static bool span_push(size_t **v, size_t *n, size_t *cap, size_t start, size_t len) {
    if (*n + 2 > *cap) {
        size_t c = *cap ? *cap * 2 : 128;
        size_t *p = realloc(*v, sizeof *p * c);
        if (!p) return false;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = start;
    (*v)[(*n)++] = len;
    return true;
}

/* Split every span of s->spans by one regex into s->spans2, then swap. */
static qrl_status split_spans(const tok_split_step *step, tok_scratch *s, const char *t,
                              qrl_error *err) {
    s->n_spans2 = 0;
    if (!s->md) s->md = pcre2_match_data_create(4, NULL);
    if (!s->md) return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
    for (size_t k = 0; k < s->n_spans; k += 2) {
        const char *sub = t + s->spans[k];
        size_t len = s->spans[k + 1], pos = 0, last = 0;
        while (pos < len) {
            int rc = pcre2_match(step->re, (PCRE2_SPTR)sub, len, pos, PCRE2_NO_UTF_CHECK, s->md,
                                 NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return qrl_error_set(err, QRL_STATUS_INTERNAL, "encode: pre-tokenizer regex: %s",
                                     (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            size_t a = ov[0], b = ov[1];
            if (b == a) { pos = a + utf8_len(sub + a, len - a); continue; }
            if (a > last && step->mode == TOK_SPLIT_ISOLATED &&
                !span_push(&s->spans2, &s->n_spans2, &s->spans2_cap, s->spans[k] + last, a - last))
                goto nomem;
            if (step->mode == TOK_SPLIT_ISOLATED &&
                !span_push(&s->spans2, &s->n_spans2, &s->spans2_cap, s->spans[k] + a, b - a))
                goto nomem;
            if (step->mode == TOK_SPLIT_REMOVED && a > last &&
                !span_push(&s->spans2, &s->n_spans2, &s->spans2_cap, s->spans[k] + last, a - last))
                goto nomem;
            last = pos = b;
        }
        if (last < len &&
            !span_push(&s->spans2, &s->n_spans2, &s->spans2_cap, s->spans[k] + last, len - last))
            goto nomem;
    }
    size_t *tv = s->spans, tc = s->spans_cap;
    s->spans = s->spans2;
    s->spans_cap = s->spans2_cap;
    s->n_spans = s->n_spans2;
    s->spans2 = tv;
    s->spans2_cap = tc;
    return QRL_OK;
nomem:
    return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
}

/* Initial symbols of one pre-token, then the merges. */
static qrl_status encode_word(const qrl_tokenizer *tok, tok_scratch *s, const char *w, size_t n,
                              tok_ids *out, qrl_error *err) {
    if (!tok_scratch_symbols(s, n)) goto nomem;
    int k = 0;
    if (tok->kind == TOK_KIND_BYTELEVEL) {
        if (tok->ignore_merges) { /* Llama-3: a pre-token that is a whole token stays one */
            if (!ensure(&s->tmp, &s->tmp_cap, 2 * n + 1)) goto nomem;
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                m += (size_t)tok_utf8_put(tok_byte_to_cp((uint8_t)w[i]), s->tmp + m);
            int32_t id = tok_vocab_find(tok, s->tmp, m);
            if (id >= 0) return tok_ids_push(out, id) ? QRL_OK : QRL_STATUS_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            int32_t id = tok->byte_ids[(uint8_t)w[i]];
            if (id < 0) id = tok->unk;
            if (id < 0)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "encode: the vocabulary has no token for byte 0x%02X",
                                     (uint8_t)w[i]);
            s->sym[k++] = id;
        }
    } else {
        bool prev_unk = false;
        for (size_t i = 0; i < n;) {
            size_t l = utf8_len(w + i, n - i);
            int32_t id = tok_vocab_find(tok, w + i, l);
            bool fallback = id < 0 && tok->byte_fallback;
            for (size_t b = 0; fallback && b < l; b++) fallback = tok->byte_ids[(uint8_t)w[i + b]] >= 0;
            if (id >= 0) {
                s->sym[k++] = id;
                prev_unk = false;
            } else if (fallback) {
                for (size_t b = 0; b < l; b++) s->sym[k++] = tok->byte_ids[(uint8_t)w[i + b]];
                prev_unk = false;
            } else if (tok->unk >= 0) {
                if (!(tok->fuse_unk && prev_unk)) s->sym[k++] = tok->unk;
                prev_unk = true;
            } else {
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "encode: no token for the character at byte %zu and no "
                                     "unk_token", i);
            }
            i += l;
        }
    }
    if (k == 0) return QRL_OK;
    if (!tok_merge_word(tok, s, k, out)) goto nomem;
    return QRL_OK;
nomem:
    return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
}

qrl_status tok_encode_segment(const qrl_tokenizer *tok, tok_scratch *s, const char *text,
                              size_t len, bool at_start, tok_ids *out, qrl_error *err) {
    const char *t = text;
    size_t n = len;
    if (tok->prefix_space && n > 0 && t[0] != ' ') {
        if (!ensure(&s->buf, &s->buf_cap, n + 2)) goto nomem;
        s->buf[0] = ' ';
        memcpy(s->buf + 1, t, n);
        t = s->buf;
        n++;
    }
    size_t ml = tok->metaspace ? strlen(tok->metaspace) : 0;
    if (tok->metaspace) {
        /* Metaspace: ' ' -> replacement, which is also prepended (always, or only to the
         * start of the input) unless the text already starts with it */
        bool pre = tok->metaspace_prepend == 2 || (tok->metaspace_prepend == 1 && at_start);
        if (!ensure(&s->buf, &s->buf_cap, (n + 1) * ml + 1)) goto nomem;
        size_t m = 0;
        if (pre && n > 0 && t[0] != ' ' &&
            !(n >= ml && memcmp(t, tok->metaspace, ml) == 0)) {
            memcpy(s->buf, tok->metaspace, ml);
            m = ml;
        }
        for (size_t i = 0; i < n; i++) {
            if (t[i] == ' ') { memcpy(s->buf + m, tok->metaspace, ml); m += ml; }
            else s->buf[m++] = t[i];
        }
        t = s->buf;
        n = m;
    }
    s->n_spans = 0;
    if (n == 0) return QRL_OK;
    if (tok->metaspace && tok->metaspace_split) {
        /* each replacement starts a new piece (MergedWithNext) */
        size_t start = 0;
        for (size_t i = ml; i + ml <= n; i++)
            if (memcmp(t + i, tok->metaspace, ml) == 0 && i > start) {
                if (!span_push(&s->spans, &s->n_spans, &s->spans_cap, start, i - start)) goto nomem;
                start = i;
            }
        if (!span_push(&s->spans, &s->n_spans, &s->spans_cap, start, n - start)) goto nomem;
    } else if (!span_push(&s->spans, &s->n_spans, &s->spans_cap, 0, n)) {
        goto nomem;
    }
    for (int k = 0; k < tok->n_split; k++) QRL_TRY(split_spans(&tok->split[k], s, t, err));
    for (size_t k = 0; k < s->n_spans; k += 2)
        QRL_TRY(encode_word(tok, s, t + s->spans[k], s->spans[k + 1], out, err));
    return QRL_OK;
nomem:
    return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
}
