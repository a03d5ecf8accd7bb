/* Tokenizer tables, load dispatch, added-token splitting, encode driver and decode. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tok_internal.h"

/* ---- hashing ---------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static const char *piece_at(const qrl_tokenizer *tok, int32_t id) {
    return tok->arena + tok->piece_off[id];
}

static bool strmap_grow(qrl_tokenizer *tok) {
    tok_strmap *m = &tok->vocab;
    uint32_t old_cap = m->slots ? m->mask + 1 : 0;
    uint32_t cap = old_cap ? old_cap * 2 : 1024;
    int32_t *slots = malloc(sizeof *slots * cap);
    if (!slots) return false;
    memset(slots, 0xff, sizeof *slots * cap);
    for (uint32_t i = 0; i < old_cap; i++) {
        int32_t id = m->slots[i];
        if (id < 0) continue;
        const char *p = piece_at(tok, id);
        uint32_t h = (uint32_t)hash_bytes(p, strlen(p)) & (cap - 1);
        while (slots[h] >= 0) h = (h + 1) & (cap - 1);
        slots[h] = id;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return true;
}

int32_t tok_vocab_find(const qrl_tokenizer *tok, const char *s, size_t len) {
    const tok_strmap *m = &tok->vocab;
    if (!m->slots || memchr(s, '\0', len)) return -1; /* pieces never hold NUL */
    for (uint32_t h = (uint32_t)hash_bytes(s, len) & m->mask;; h = (h + 1) & m->mask) {
        int32_t id = m->slots[h];
        if (id < 0) return -1;
        const char *p = piece_at(tok, id);
        if (strncmp(p, s, len) == 0 && p[len] == '\0') return id;
    }
}

qrl_status tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, float prio, int32_t id) {
    if (!m->slots || (m->count + 1) * 4 > (m->mask + 1) * 3) {
        uint32_t old_cap = m->slots ? m->mask + 1 : 0, cap = old_cap ? old_cap * 2 : 1024;
        tok_pair *slots = malloc(sizeof *slots * cap);
        if (!slots) return QRL_STATUS_NOMEM;
        for (uint32_t i = 0; i < cap; i++) slots[i].key = UINT64_MAX;
        for (uint32_t i = 0; i < old_cap; i++) {
            if (m->slots[i].key == UINT64_MAX) continue;
            uint32_t h = (uint32_t)hash_u64(m->slots[i].key) & (cap - 1);
            while (slots[h].key != UINT64_MAX) h = (h + 1) & (cap - 1);
            slots[h] = m->slots[i];
        }
        free(m->slots);
        m->slots = slots;
        m->mask = cap - 1;
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t h = (uint32_t)hash_u64(key) & m->mask;
    while (m->slots[h].key != UINT64_MAX && m->slots[h].key != key) h = (h + 1) & m->mask;
    if (m->slots[h].key == key) {
        /* a pair listed twice takes its last rank, as HF's HashMap built from the list does */
        m->slots[h].prio = prio;
        m->slots[h].id = id;
        return QRL_OK;
    }
    m->slots[h] = (tok_pair){.key = key, .prio = prio, .id = id};
    m->count++;
    return QRL_OK;
}

const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    if (!m->slots) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t h = (uint32_t)hash_u64(key) & m->mask;; h = (h + 1) & m->mask) {
        if (m->slots[h].key == key) return &m->slots[h];
        if (m->slots[h].key == UINT64_MAX) return NULL;
    }
}

/* ---- tables ----------------------------------------------------------------------- */

qrl_tokenizer *tok_new(tok_kind kind) {
    qrl_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return NULL;
    tok->kind = kind;
    tok->bos = tok->eos = tok->unk = -1;
    tok->chat_template = "plain";
    for (int i = 0; i < 256; i++) tok->byte_ids[i] = -1;
    return tok;
}

qrl_status tok_reserve_ids(qrl_tokenizer *tok, int32_t n, const char *src, qrl_error *err) {
    if (n <= tok->n_ids) return QRL_OK;
    if (n <= tok->ids_cap) { tok->n_ids = n; return QRL_OK; }
    if (n > (1 << 26))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: token id %d is implausibly large",
                             src, n - 1);
    int32_t cap = tok->ids_cap ? tok->ids_cap : 1024;
    while (cap < n) cap *= 2;
    uint32_t *off = realloc(tok->piece_off, sizeof *off * (size_t)cap);
    if (!off) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    tok->piece_off = off;
    uint8_t *fl = realloc(tok->flags, (size_t)cap);
    if (!fl) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    tok->flags = fl;
    for (int32_t i = tok->ids_cap; i < cap; i++) { off[i] = TOK_NONE; fl[i] = 0; }
    tok->ids_cap = cap;
    tok->n_ids = n;
    return QRL_OK;
}

qrl_status tok_set_piece(qrl_tokenizer *tok, int32_t id, const char *s, size_t len,
                         bool in_vocab, const char *src, const char *what, qrl_error *err) {
    if (id < 0)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: negative token id %d", src, what,
                             id);
    if (id >= tok->n_ids) QRL_TRY(tok_reserve_ids(tok, id + 1, src, err));
    if (tok->piece_off[id] != TOK_NONE)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: token id %d assigned twice", src,
                             what, id);
    if (memchr(s, '\0', len))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: token %d holds a NUL byte", src,
                             what, id);
    if (tok->arena_len + len + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 16;
        while (cap < tok->arena_len + len + 1) cap *= 2;
        char *a = realloc(tok->arena, cap);
        if (!a) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
        tok->arena = a;
        tok->arena_cap = cap;
    }
    if (tok->arena_len > UINT32_MAX - len - 1)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: vocabulary text too large", src);
    tok->piece_off[id] = (uint32_t)tok->arena_len;
    memcpy(tok->arena + tok->arena_len, s, len);
    tok->arena[tok->arena_len + len] = '\0';
    tok->arena_len += len + 1;
    if (!in_vocab) return QRL_OK;
    if (!tok->vocab.slots || (tok->vocab.count + 1) * 2 > tok->vocab.mask + 1)
        if (!strmap_grow(tok))
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    if (tok_vocab_find(tok, s, len) >= 0) return QRL_OK; /* duplicate string: first id wins */
    tok_strmap *m = &tok->vocab;
    uint32_t h = (uint32_t)hash_bytes(s, len) & m->mask;
    while (m->slots[h] >= 0) h = (h + 1) & m->mask;
    m->slots[h] = id;
    m->count++;
    return QRL_OK;
}

bool tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, sizeof *p * cap);
        if (!p) return false;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return true;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

qrl_status tok_add_token(qrl_tokenizer *tok, int32_t id, const char *content, bool special,
                         bool normalized, bool lstrip, bool rstrip, const char *src,
                         qrl_error *err) {
    size_t len = strlen(content);
    if (len == 0)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: added token %d has empty content",
                             src, id);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id) return QRL_OK; /* tokenizer.json's entry comes first */
    if (id < 0 || id >= tok->n_ids || tok->piece_off[id] == TOK_NONE)
        QRL_TRY(tok_set_piece(tok, id, content, len, false, src, "added token", err));
    tok_added *a = realloc(tok->added, sizeof *a * (size_t)(tok->n_added + 1));
    if (!a) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    tok->added = a;
    char *c = dup_bytes(content, len);
    if (!c) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    a[tok->n_added++] = (tok_added){.id = id, .special = special, .normalized = normalized,
                                    .lstrip = lstrip, .rstrip = rstrip, .content = c, .len = len};
    tok->flags[id] |= TOK_FLAG_ADDED | (special ? TOK_FLAG_SPECIAL : 0);
    return QRL_OK;
}

/* ---- finishing a load ------------------------------------------------------------- */

static int cmp_added(const void *pa, const void *pb, void *ctx) {
    const tok_added *added = ctx;
    const tok_added *a = &added[*(const int *)pa], *b = &added[*(const int *)pb];
    uint8_t fa = (uint8_t)a->match[0], fb = (uint8_t)b->match[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->match_len != b->match_len) return a->match_len > b->match_len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static qrl_status build_matcher(qrl_tokenizer *tok, tok_matcher *m, bool normalized) {
    m->order = malloc(sizeof *m->order * (size_t)(tok->n_added + 1));
    if (!m->order) return QRL_STATUS_NOMEM;
    m->n = 0;
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].match_len > 0)
            m->order[m->n++] = i;
    qsort_r(m->order, (size_t)m->n, sizeof *m->order, cmp_added, tok->added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < m->n && (uint8_t)tok->added[m->order[k]].match[0] < b) k++;
        m->first[b] = k;
    }
    m->first[256] = m->n;
    return QRL_OK;
}

static bool parse_byte_piece(const char *p, uint8_t *byte) {
    /* "<0xHH>", as sentencepiece writes byte tokens */
    if (strlen(p) != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return false;
    if (!isxdigit((unsigned char)p[3]) || !isxdigit((unsigned char)p[4])) return false;
    *byte = (uint8_t)strtoul((char[]){p[3], p[4], 0}, NULL, 16);
    return true;
}

/* Bytes that token `id` decodes to, appended to *buf. */
static size_t decode_piece(const qrl_tokenizer *tok, int32_t id, char *out) {
    const char *p = piece_at(tok, id);
    size_t n = strlen(p), o = 0;
    uint8_t byte;
    if (tok->flags[id] & TOK_FLAG_ADDED) {
        for (int i = 0; i < tok->n_added; i++)
            if (tok->added[i].id == id) { p = tok->added[i].content; n = tok->added[i].len; }
        memcpy(out, p, n);
        return n;
    }
    if ((tok->kind == TOK_KIND_LLAMA2C || tok->dec_byte_fallback) && parse_byte_piece(p, &byte)) {
        out[0] = (char)byte;
        return 1;
    }
    if (tok->kind == TOK_KIND_BYTELEVEL) {
        for (size_t i = 0; i < n;) {
            /* decode one UTF-8 character of the mapped piece */
            uint8_t c = (uint8_t)p[i];
            int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if (i + (size_t)l > n) l = (int)(n - i);
            uint32_t cp = l == 1 ? c : l == 2 ? (c & 0x1Fu) : l == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (int k = 1; k < l; k++) cp = (cp << 6) | ((uint8_t)p[i + k] & 0x3Fu);
            int b = tok_cp_to_byte(cp);
            if (b >= 0) out[o++] = (char)b;
            else { memcpy(out + o, p + i, (size_t)l); o += (size_t)l; }
            i += (size_t)l;
        }
        return o;
    }
    if (tok->dec_rep_a && tok->dec_rep_a[0]) {
        size_t la = strlen(tok->dec_rep_a), lb = strlen(tok->dec_rep_b);
        for (size_t i = 0; i < n;) {
            if (i + la <= n && memcmp(p + i, tok->dec_rep_a, la) == 0) {
                memcpy(out + o, tok->dec_rep_b, lb);
                o += lb;
                i += la;
            } else {
                out[o++] = p[i++];
            }
        }
        return o;
    }
    memcpy(out, p, n);
    return n;
}

qrl_status tok_finish(qrl_tokenizer *tok, const char *src, qrl_error *err) {
    qrl_status st = QRL_OK;
    tok_scratch s = {0};
    if (tok->n_ids == 0)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: empty vocabulary", src);
    /* byte symbols */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (tok->kind == TOK_KIND_BYTELEVEL) {
            int l = tok_utf8_put(tok_byte_to_cp((uint8_t)b), buf);
            tok->byte_ids[b] = tok_vocab_find(tok, buf, (size_t)l);
        } else if (tok->kind == TOK_KIND_SPBPE && tok->byte_fallback) {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            tok->byte_ids[b] = tok_vocab_find(tok, buf, 6);
        } else if (tok->kind == TOK_KIND_LLAMA2C) {
            tok->byte_ids[b] = b + 3 < tok->n_ids ? b + 3 : -1;
        }
    }
    /* decoded bytes (a byte-level piece never decodes longer than itself; a Replace can) */
    size_t grow = 1;
    if (tok->dec_rep_a && tok->dec_rep_a[0]) {
        size_t la = strlen(tok->dec_rep_a), lb = strlen(tok->dec_rep_b);
        if (lb > la) grow = lb;
    }
    size_t cap = tok->arena_len * grow + 16;
    for (int i = 0; i < tok->n_added; i++) cap += tok->added[i].len + 1;
    tok->dec = malloc(cap);
    tok->dec_off = malloc(sizeof *tok->dec_off * (size_t)tok->n_ids);
    tok->dec_len = malloc(sizeof *tok->dec_len * (size_t)tok->n_ids);
    if (!tok->dec || !tok->dec_off || !tok->dec_len) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
        goto done;
    }
    size_t used = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        tok->dec_off[id] = (uint32_t)used;
        tok->dec_len[id] = 0;
        if (tok->piece_off[id] == TOK_NONE) continue;
        size_t n = decode_piece(tok, id, tok->dec + used);
        QRL_CHECK(used + n <= cap);
        tok->dec_len[id] = (uint32_t)n;
        used += n;
    }
    /* what each added token looks like in normalized text */
    for (int i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        const char *m = a->content;
        size_t ml = a->len;
        if (a->normalized && tok->n_norm > 0)
            QRL_TRY_GOTO(tok_normalize(tok, &s, a->content, a->len, &m, &ml, err), done);
        a->match = dup_bytes(m, ml);
        a->match_len = ml;
        if (!a->match) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src); goto done; }
    }
    if (build_matcher(tok, &tok->match_raw, false) != QRL_OK ||
        build_matcher(tok, &tok->match_norm, true) != QRL_OK)
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
done:
    tok_scratch_free(&s);
    return st;
}

/* ---- encode ----------------------------------------------------------------------- */

/* Leftmost, then longest, eligible added token in t[0..n). */
static bool find_added(const qrl_tokenizer *tok, const tok_matcher *m, const char *t, size_t n,
                       bool parse_special, size_t *at, size_t *len, int *which) {
    if (m->n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)t[i];
        for (int k = m->first[b]; k < m->first[b + 1]; k++) {
            const tok_added *a = &tok->added[m->order[k]];
            if (a->special && !parse_special) continue;
            if (a->match_len <= n - i && memcmp(a->match, t + i, a->match_len) == 0) {
                *at = i;
                *len = a->match_len;
                *which = m->order[k];
                return true;
            }
        }
    }
    return false;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Split t[0..n) by the added tokens of matcher m; text between them goes to `text_fn`. */
typedef qrl_status (*segment_fn)(const qrl_tokenizer *tok, tok_scratch *s, const char *t,
                                 size_t n, bool at_start, bool parse_special, tok_ids *out,
                                 qrl_error *err);

static qrl_status split_added(const qrl_tokenizer *tok, tok_scratch *s, const tok_matcher *m,
                              const char *t, size_t n, bool at_start, bool parse_special,
                              segment_fn text_fn, tok_ids *out, qrl_error *err) {
    size_t pos = 0;
    while (pos < n) {
        size_t at = 0, ml = 0;
        int which = -1;
        bool found = find_added(tok, m, t + pos, n - pos, parse_special, &at, &ml, &which);
        size_t seg_end = found ? pos + at : n, next = found ? pos + at + ml : n;
        if (found && tok->added[which].lstrip)
            while (seg_end > pos && is_ws(t[seg_end - 1])) seg_end--;
        if (found && tok->added[which].rstrip)
            while (next < n && is_ws(t[next])) next++;
        if (seg_end > pos)
            QRL_TRY(text_fn(tok, s, t + pos, seg_end - pos, at_start && pos == 0, parse_special,
                            out, err));
        if (found && !tok_ids_push(out, tok->added[which].id))
            return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
        pos = next;
    }
    return QRL_OK;
}

static qrl_status encode_normalized(const qrl_tokenizer *tok, tok_scratch *s, const char *t,
                                    size_t n, bool at_start, bool parse_special, tok_ids *out,
                                    qrl_error *err) {
    return tok_encode_segment(tok, s, t, n, at_start, out, err);
}

static qrl_status encode_raw(const qrl_tokenizer *tok, tok_scratch *s, const char *t, size_t n,
                             bool at_start, bool parse_special, tok_ids *out, qrl_error *err) {
    const char *norm = t;
    size_t nlen = n;
    QRL_TRY(tok_normalize(tok, s, t, n, &norm, &nlen, err));
    if (norm != t) {
        /* the segment encoder reuses s->buf and s->tmp; keep the normalized text in buf2 */
        if (s->buf2_cap < nlen + 1) {
            char *b = realloc(s->buf2, nlen + 1);
            if (!b) return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
            s->buf2 = b;
            s->buf2_cap = nlen + 1;
        }
        memcpy(s->buf2, norm, nlen);
        norm = s->buf2;
    }
    return split_added(tok, s, &tok->match_norm, norm, nlen, at_start, parse_special,
                       encode_normalized, out, err);
}

qrl_status qrl_tokenizer_encode(const qrl_tokenizer *tok, const char *text, size_t len,
                                bool add_bos, bool parse_special, int32_t **ids,
                                size_t *n_ids, qrl_error *err) {
    qrl_status st = QRL_OK;
    tok_scratch s = {0};
    tok_ids out = {0};
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "encode: text is NULL");
    if (!tok_ids_push(&out, 0)) return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
    out.n = 0;
    if (add_bos && tok->bos >= 0) tok_ids_push(&out, tok->bos);
    if (tok->kind == TOK_KIND_LLAMA2C) {
        QRL_TRY_GOTO(tok_llama2c_encode(tok, &s, text, len, &out, err), fail);
    } else {
        size_t bad = tok_utf8_validate(text, len);
        if (bad < len) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                               "encode: text is not valid UTF-8 at byte offset %zu", bad);
            goto fail;
        }
        QRL_TRY_GOTO(split_added(tok, &s, &tok->match_raw, text, len, true, parse_special,
                                 encode_raw, &out, err),
                     fail);
    }
    tok_scratch_free(&s);
    *ids = out.v;
    *n_ids = out.n;
    return QRL_OK;
fail:
    tok_scratch_free(&s);
    free(out.v);
    return st;
}

/* ---- decode ----------------------------------------------------------------------- */

qrl_status qrl_tokenizer_decode(const qrl_tokenizer *tok, const int32_t *ids, size_t n,
                                bool skip_special, char **text, qrl_error *err) {
    *text = NULL;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || tok->piece_off[id] == TOK_NONE)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "decode: id %d at index %zu is not a token (vocab size %d)", id,
                                 i, tok->n_ids);
        total += tok->dec_len[id];
    }
    char *buf = malloc(total);
    if (!buf) return qrl_error_set(err, QRL_STATUS_NOMEM, "decode: out of memory");
    size_t o = 0;
    bool first = true;
    int32_t prev = -1;
    for (size_t i = 0; i < n; prev = ids[i], i++) {
        int32_t id = ids[i];
        if (skip_special && (tok->flags[id] & TOK_FLAG_SPECIAL)) continue;
        const char *p = tok->dec + tok->dec_off[id];
        size_t l = tok->dec_len[id];
        /* run.c: the piece after BOS loses its leading space (the dummy prefix) */
        if (tok->kind == TOK_KIND_LLAMA2C && prev == tok->bos && l > 0 && p[0] == ' ') { p++; l--; }
        /* Metaspace decoder: the first token loses the prepended space */
        if (first && tok->dec_strip_first_space && l > 0 && p[0] == ' ') { p++; l--; }
        first = false;
        memcpy(buf + o, p, l);
        o += l;
    }
    /* Strip decoder (after Fuse): up to `start` leading / `stop` trailing characters */
    size_t from = 0;
    for (int k = 0; k < tok->dec_strip_start && from < o && buf[from] == tok->dec_strip_char; k++)
        from++;
    for (int k = 0; k < tok->dec_strip_stop && o > from && buf[o - 1] == tok->dec_strip_char; k++)
        o--;
    memmove(buf, buf + from, o - from);
    buf[o - from] = '\0';
    *text = buf;
    return QRL_OK;
}

/* ---- load dispatch, accessors ----------------------------------------------------- */

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static char *join_path(const char *dir, size_t dir_len, const char *name) {
    size_t n = dir_len + 1 + strlen(name) + 1;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%.*s/%s", (int)dir_len, dir, name);
    return p;
}

static qrl_status load_dir(qrl_tokenizer **tokp, const char *dir, int hint, qrl_error *err) {
    qrl_status st = QRL_OK;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char *json = join_path(dir, dl, "tokenizer.json"), *vocab = join_path(dir, dl, "vocab.json");
    char *merges = join_path(dir, dl, "merges.txt");
    char *config = join_path(dir, dl, "tokenizer_config.json");
    char *bin = join_path(dir, dl, "tokenizer.bin");
    if (!json || !vocab || !merges || !config || !bin) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    const char *cfg = is_file(config) ? config : NULL;
    if (is_file(json)) {
        *tokp = tok_new(TOK_KIND_BYTELEVEL);
        if (!*tokp) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", dir); goto done; }
        st = tok_load_hf_json(*tokp, json, cfg, err);
    } else if (is_file(vocab) && is_file(merges)) {
        *tokp = tok_new(TOK_KIND_BYTELEVEL);
        if (!*tokp) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", dir); goto done; }
        st = tok_load_vocab_merges(*tokp, vocab, merges, cfg, err);
    } else if (is_file(bin)) {
        *tokp = tok_new(TOK_KIND_LLAMA2C);
        if (!*tokp) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", dir); goto done; }
        st = tok_load_llama2c(*tokp, bin, hint, err);
    } else {
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                           "%s: no tokenizer.json, vocab.json + merges.txt or tokenizer.bin", dir);
    }
done:
    free(json); free(vocab); free(merges); free(config); free(bin);
    return st;
}

qrl_status qrl_tokenizer_load(const char *path, int vocab_size_hint, qrl_tokenizer **out,
                              qrl_error *err) {
    qrl_status st = QRL_OK;
    qrl_tokenizer *tok = NULL;
    *out = NULL;
    struct stat sb;
    if (!path) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tokenizer path is NULL");
    if (stat(path, &sb) != 0)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        st = load_dir(&tok, path, vocab_size_hint, err);
    } else {
        /* a JSON file starts with '{'; anything else is taken for a llama2.c tokenizer.bin */
        FILE *f = fopen(path, "rb");
        if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: %s", path, strerror(errno));
        int c;
        while ((c = fgetc(f)) != EOF && isspace(c)) {}
        fclose(f);
        tok = tok_new(c == '{' ? TOK_KIND_BYTELEVEL : TOK_KIND_LLAMA2C);
        if (!tok) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        if (c == '{') {
            const char *slash = strrchr(path, '/');
            char *config = slash ? join_path(path, (size_t)(slash - path), "tokenizer_config.json")
                                 : dup_bytes("tokenizer_config.json", 21);
            if (!config) st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
            else st = tok_load_hf_json(tok, path, is_file(config) ? config : NULL, err);
            free(config);
        } else {
            st = tok_load_llama2c(tok, path, vocab_size_hint, err);
        }
    }
    if (st != QRL_OK) {
        qrl_error_trace(err, __FILE__, __LINE__);
        qrl_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return QRL_OK;
}

void qrl_tokenizer_free(qrl_tokenizer *tok) {
    if (!tok) return;
    free(tok->arena);
    free(tok->piece_off);
    free(tok->dec);
    free(tok->dec_off);
    free(tok->dec_len);
    free(tok->flags);
    free(tok->vocab.slots);
    free(tok->merges.slots);
    for (int i = 0; i < tok->n_added; i++) { free(tok->added[i].content); free(tok->added[i].match); }
    free(tok->added);
    free(tok->match_raw.order);
    free(tok->match_norm.order);
    for (int i = 0; i < tok->n_norm; i++) { free(tok->norm[i].a); free(tok->norm[i].b); }
    free(tok->metaspace);
    for (int i = 0; i < tok->n_split; i++) pcre2_code_free(tok->split[i].re);
    free(tok->dec_rep_a);
    free(tok->dec_rep_b);
    free(tok->scores);
    free(tok);
}

int qrl_tokenizer_vocab_size(const qrl_tokenizer *tok) { return tok->n_ids; }
int32_t qrl_tokenizer_bos(const qrl_tokenizer *tok) { return tok->bos; }
int32_t qrl_tokenizer_eos(const qrl_tokenizer *tok) { return tok->eos; }
const char *qrl_tokenizer_chat_template_name(const qrl_tokenizer *tok) { return tok->chat_template; }

const char *qrl_tokenizer_piece(const qrl_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_ids || tok->piece_off[id] == TOK_NONE) return NULL;
    return piece_at(tok, id);
}

bool qrl_tokenizer_is_special(const qrl_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->flags[id] & TOK_FLAG_SPECIAL);
}

int32_t qrl_tokenizer_token_id(const qrl_tokenizer *tok, const char *piece) {
    if (!piece) return -1;
    size_t n = strlen(piece);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->added[i].content, piece, n) == 0)
            return tok->added[i].id;
    return tok_vocab_find(tok, piece, n);
}

const char *qrl_tokenizer_find_default(const char *model_path, int vocab_size, char *buf, size_t n) {
    struct stat sb;
    if (stat(model_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(buf, n, "%s/tokenizer.json", model_path);
        if (stat(buf, &sb) == 0) return model_path;
        snprintf(buf, n, "%s/vocab.json", model_path);
        if (stat(buf, &sb) == 0) return model_path;
        /* a llama2.c model exported to an HF folder carries its tokenizer.bin along */
        snprintf(buf, n, "%s/tokenizer.bin", model_path);
        return stat(buf, &sb) == 0 ? buf : NULL;
    }
    const char *slash = strrchr(model_path, '/');
    int dl = slash ? (int)(slash - model_path) : 1;
    const char *dir = slash ? model_path : ".";
    snprintf(buf, n, "%.*s/tokenizer.bin", dl, dir);
    if (stat(buf, &sb) == 0) return buf;
    snprintf(buf, n, "%.*s/tok%d.bin", dl, dir, vocab_size);
    if (stat(buf, &sb) == 0) return buf;
    return NULL;
}
