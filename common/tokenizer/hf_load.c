/* HuggingFace tokenizer files: tokenizer.json, vocab.json + merges.txt, and
 * tokenizer_config.json.  Every error names the file and the JSON field (or line). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tokenizer/tok_internal.h"

static qrl_status read_json(const char *path, size_t flags, json_t **root, qrl_error *err) {
    json_error_t je;
    *root = json_load_file(path, JSON_REJECT_DUPLICATES | flags, &je);
    if (*root) return QRL_OK;
    if (je.line <= 0 && je.position == 0)
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot read: %s", path, je.text);
    return qrl_error_set(err, QRL_STATUS_PARSE, "%s: invalid JSON at line %d column %d: %s", path,
                         je.line, je.column, je.text);
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A token given as "text" or {"content": "text", ...}; NULL for null / absent. */
static const char *token_text(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static bool get_bool(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *type_of(json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* ---- added tokens ----------------------------------------------------------------- */

static qrl_status add_token_obj(qrl_tokenizer *tok, json_t *o, json_int_t id, const char *src,
                                const char *field, qrl_error *err) {
    const char *content = json_string_value(json_object_get(o, "content"));
    if (!content)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: missing string field content", src,
                             field);
    if (id < 0 || id >= (1 << 26))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: id %lld out of range", src, field,
                             (long long)id);
    bool special = get_bool(o, "special", false);
    /* HF's AddedToken default: normalized unless special */
    bool normalized = get_bool(o, "normalized", !special);
    return tok_add_token(tok, (int32_t)id, content, special, normalized, get_bool(o, "lstrip", false),
                         get_bool(o, "rstrip", false), src, err);
}

/* ---- tokenizer_config.json ---------------------------------------------------------- */

typedef struct hf_config {
    json_t *root;
    const char *bos, *eos, *klass;
    bool has_bos, has_prefix_space, prefix_space;
} hf_config;

static qrl_status load_config(qrl_tokenizer *tok, const char *path, hf_config *c, qrl_error *err) {
    if (!path) return QRL_OK;
    /* numbers there are settings such as model_max_length = 1e30, too big for an integer */
    QRL_TRY(read_json(path, JSON_DECODE_INT_AS_REAL, &c->root, err));
    if (!json_is_object(c->root))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: top level is not an object", path);
    json_t *atd = json_object_get(c->root, "added_tokens_decoder");
    if (atd && !json_is_object(atd))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: added_tokens_decoder is not an object",
                             path);
    const char *key;
    json_t *v;
    json_object_foreach(atd, key, v) {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        char field[96];
        snprintf(field, sizeof field, "added_tokens_decoder[\"%.40s\"]", key);
        if (*key == '\0' || *end != '\0' || errno)
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: key is not a token id", path,
                                 field);
        if (!json_is_object(v))
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s is not an object", path, field);
        QRL_TRY(add_token_obj(tok, v, id, path, field, err));
    }
    json_t *bos = json_object_get(c->root, "bos_token");
    c->has_bos = bos != NULL;
    c->bos = token_text(bos);
    c->eos = token_text(json_object_get(c->root, "eos_token"));
    c->klass = json_string_value(json_object_get(c->root, "tokenizer_class"));
    json_t *aps = json_object_get(c->root, "add_prefix_space");
    c->has_prefix_space = json_is_boolean(aps);
    c->prefix_space = json_is_true(aps);
    json_t *tpl = json_object_get(c->root, "chat_template");
    if (json_is_array(tpl)) tpl = json_object_get(json_array_get(tpl, 0), "template");
    const char *t = json_string_value(tpl);
    if (t && strstr(t, "<|im_start|>")) tok->chat_template = "chatml";
    else if (t && strstr(t, "<|start_header_id|>")) tok->chat_template = "llama3";
    return QRL_OK;
}

/* bos/eos by name after every token is known */
static void resolve_special(qrl_tokenizer *tok, const hf_config *c, const char *tpl_bos,
                            const char *src) {
    const char *bos = c->has_bos ? c->bos : tpl_bos;
    if (bos) {
        tok->bos = qrl_tokenizer_token_id(tok, bos);
        if (tok->bos < 0) QRL_LOG_WARN("tokenizer", "bos_token not in vocabulary file=%s token=%s", src, bos);
    }
    if (c->eos) {
        tok->eos = qrl_tokenizer_token_id(tok, c->eos);
        if (tok->eos < 0) QRL_LOG_WARN("tokenizer", "eos_token not in vocabulary file=%s token=%s", src, c->eos);
    }
}

/* ---- merges ----------------------------------------------------------------------- */

static qrl_status add_merge(qrl_tokenizer *tok, const char *a, size_t la, const char *b,
                            size_t lb, size_t rank, const char *src, const char *where,
                            qrl_error *err) {
    int32_t ia = tok_vocab_find(tok, a, la), ib = tok_vocab_find(tok, b, lb);
    if (ia < 0 || ib < 0) {
        const char *m = ia < 0 ? a : b;
        int ml = (int)(ia < 0 ? la : lb);
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: token \"%.*s\" is not in the vocab",
                             src, where, ml > 64 ? 64 : ml, m);
    }
    char stack[256], *ab = la + lb <= sizeof stack ? stack : malloc(la + lb);
    if (!ab) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    memcpy(ab, a, la);
    memcpy(ab + la, b, lb);
    int32_t id = tok_vocab_find(tok, ab, la + lb);
    qrl_status st = QRL_OK;
    if (id < 0)
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "%s: %s: merged token \"%.*s\" is not in the vocab", src, where,
                           (int)(la + lb > 64 ? 64 : la + lb), ab);
    else if (tok_pairmap_put(&tok->merges, ia, ib, (float)rank, id) != QRL_OK)
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", src);
    if (ab != stack) free(ab);
    return st;
}

/* "a b" (one space) as in merges.txt and older tokenizer.json files */
static qrl_status add_merge_line(qrl_tokenizer *tok, const char *line, size_t n, size_t rank,
                                 const char *src, const char *where, qrl_error *err) {
    const char *sp = memchr(line, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - line) - 1) || sp == line || sp + 1 == line + n)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: expected \"left right\", got \"%.*s\"",
                             src, where, (int)(n > 64 ? 64 : n), line);
    return add_merge(tok, line, (size_t)(sp - line), sp + 1, n - (size_t)(sp - line) - 1, rank,
                     src, where, err);
}

/* ---- normalizer / pre-tokenizer / decoder ------------------------------------------ */

static qrl_status pattern_of(json_t *o, const char **pat, bool *literal, const char *src,
                             const char *field, qrl_error *err) {
    json_t *p = json_object_get(o, "pattern");
    if ((*pat = json_string_value(json_object_get(p, "String")))) { *literal = true; return QRL_OK; }
    if ((*pat = json_string_value(json_object_get(p, "Regex")))) { *literal = false; return QRL_OK; }
    return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s.pattern: expected {\"String\"} or {\"Regex\"}",
                         src, field);
}

static qrl_status parse_normalizer(qrl_tokenizer *tok, json_t *n, const char *src,
                                   const char *field, qrl_error *err) {
    if (!n || json_is_null(n)) return QRL_OK;
    const char *t = type_of(n);
    if (!t) return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: missing type", src, field);
    if (strcmp(t, "Sequence") == 0) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) QRL_TRY(parse_normalizer(tok, v, src, field, err));
        return QRL_OK;
    }
    if (tok->n_norm == TOK_MAX_STEPS)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: too many steps", src, field);
    tok_norm_step *st = &tok->norm[tok->n_norm];
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int k = 0; k < 4; k++)
        if (strcmp(t, forms[k]) == 0) { st->op = (tok_norm_op)k; tok->n_norm++; return QRL_OK; }
    if (strcmp(t, "Prepend") == 0) {
        const char *p = json_string_value(json_object_get(n, "prepend"));
        if (!p) return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: Prepend without prepend", src, field);
        st->op = TOK_NORM_PREPEND;
        st->a = xstrdup(p);
        tok->n_norm++;
        return st->a ? QRL_OK : QRL_STATUS_NOMEM;
    }
    if (strcmp(t, "Replace") == 0) {
        const char *pat, *content = json_string_value(json_object_get(n, "content"));
        bool literal;
        QRL_TRY(pattern_of(n, &pat, &literal, src, field, err));
        if (!literal || !content)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                 "%s: %s: Replace supports a String pattern and content only", src, field);
        st->op = TOK_NORM_REPLACE;
        st->a = xstrdup(pat);
        st->b = xstrdup(content);
        tok->n_norm++;
        return st->a && st->b ? QRL_OK : QRL_STATUS_NOMEM;
    }
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: normalizer type \"%s\" is not supported",
                         src, field, t);
}

static qrl_status add_split(qrl_tokenizer *tok, const char *pat, bool literal, tok_split_mode mode,
                            const char *src, const char *field, qrl_error *err) {
    if (tok->n_split == TOK_MAX_STEPS)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: too many steps", src, field);
    QRL_TRY(tok_regex_compile(pat, literal, &tok->split[tok->n_split].re, src, field, err));
    tok->split[tok->n_split++].mode = mode;
    return QRL_OK;
}

static qrl_status parse_pretok(qrl_tokenizer *tok, json_t *p, const char *src, const char *field,
                               qrl_error *err) {
    if (!p || json_is_null(p)) return QRL_OK;
    const char *t = type_of(p);
    if (!t) return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: missing type", src, field);
    bool first = tok->n_split == 0 && !tok->metaspace && !tok->prefix_space;
    if (strcmp(t, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) QRL_TRY(parse_pretok(tok, v, src, field, err));
        return QRL_OK;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        tok->kind = TOK_KIND_BYTELEVEL;
        if (get_bool(p, "add_prefix_space", false)) {
            if (!first)
                return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                     "%s: %s: ByteLevel add_prefix_space after another step", src, field);
            tok->prefix_space = true;
        }
        if (get_bool(p, "use_regex", true))
            QRL_TRY(add_split(tok, tok_gpt2_regex, false, TOK_SPLIT_ISOLATED, src, field, err));
        return QRL_OK;
    }
    if (strcmp(t, "Split") == 0) {
        const char *pat, *beh = json_string_value(json_object_get(p, "behavior"));
        bool literal;
        QRL_TRY(pattern_of(p, &pat, &literal, src, field, err));
        tok_split_mode mode;
        if (beh && strcmp(beh, "Isolated") == 0) mode = TOK_SPLIT_ISOLATED;
        else if (beh && strcmp(beh, "Removed") == 0) mode = TOK_SPLIT_REMOVED;
        else return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: Split behavior \"%s\" is not supported",
                                  src, field, beh ? beh : "(none)");
        if (get_bool(p, "invert", false))
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: Split invert is not supported", src, field);
        return add_split(tok, pat, literal, mode, src, field, err);
    }
    if (strcmp(t, "Digits") == 0)
        return add_split(tok, get_bool(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", false,
                         TOK_SPLIT_ISOLATED, src, field, err);
    if (strcmp(t, "Metaspace") == 0) {
        if (!first)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: Metaspace after another step",
                                 src, field);
        const char *r = json_string_value(json_object_get(p, "replacement"));
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        tok->metaspace = xstrdup(r ? r : "\xe2\x96\x81");
        if (!tok->metaspace) return QRL_STATUS_NOMEM;
        tok->metaspace_prepend = scheme ? (strcmp(scheme, "always") == 0 ? 2 : strcmp(scheme, "first") == 0)
                                        : (get_bool(p, "add_prefix_space", true) ? 2 : 0);
        tok->metaspace_split = get_bool(p, "split", true);
        return QRL_OK;
    }
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: %s: pre-tokenizer type \"%s\" is not supported",
                         src, field, t);
}

static qrl_status parse_decoder(qrl_tokenizer *tok, json_t *d, bool *fused, const char *src,
                                qrl_error *err) {
    if (!d || json_is_null(d)) return QRL_OK;
    const char *t = type_of(d);
    if (!t) return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: decoder: missing type", src);
    if (strcmp(t, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(d, "decoders"), i, v) QRL_TRY(parse_decoder(tok, v, fused, src, err));
        return QRL_OK;
    }
    if (strcmp(t, "ByteLevel") == 0) { tok->kind = TOK_KIND_BYTELEVEL; return QRL_OK; }
    if (strcmp(t, "ByteFallback") == 0) { tok->dec_byte_fallback = true; return QRL_OK; }
    if (strcmp(t, "Fuse") == 0) { *fused = true; return QRL_OK; }
    if (strcmp(t, "Replace") == 0 || strcmp(t, "Metaspace") == 0) {
        const char *a, *b = " ";
        bool literal = true;
        if (t[0] == 'R') {
            QRL_TRY(pattern_of(d, &a, &literal, src, "decoder.Replace", err));
            b = json_string_value(json_object_get(d, "content"));
        } else {
            a = json_string_value(json_object_get(d, "replacement"));
            const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
            tok->dec_strip_first_space = scheme ? strcmp(scheme, "never") != 0
                                                : get_bool(d, "add_prefix_space", true);
        }
        if (!a || !b || !literal || tok->dec_rep_a)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                 "%s: decoder.%s: only one String replacement is supported", src, t);
        tok->dec_rep_a = xstrdup(a);
        tok->dec_rep_b = xstrdup(b);
        return tok->dec_rep_a && tok->dec_rep_b ? QRL_OK : QRL_STATUS_NOMEM;
    }
    if (strcmp(t, "Strip") == 0) {
        const char *c = json_string_value(json_object_get(d, "content"));
        if (!*fused || !c || strlen(c) != 1)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                 "%s: decoder.Strip: supported after Fuse with a one-byte content", src);
        tok->dec_strip_char = c[0];
        tok->dec_strip_start = (int)json_integer_value(json_object_get(d, "start"));
        tok->dec_strip_stop = (int)json_integer_value(json_object_get(d, "stop"));
        return QRL_OK;
    }
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: decoder type \"%s\" is not supported", src, t);
}

/* ---- tokenizer.json ----------------------------------------------------------------- */

static qrl_status load_vocab_obj(qrl_tokenizer *tok, json_t *vocab, const char *src,
                                 const char *field, qrl_error *err) {
    if (!json_is_object(vocab))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: missing or non-object field %s", src, field);
    int32_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 26))
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s[\"%.64s\"]: not a token id", src,
                                 field, key);
        if (json_integer_value(v) > max_id) max_id = (int32_t)json_integer_value(v);
    }
    QRL_TRY(tok_reserve_ids(tok, max_id + 1, src, err));
    json_object_foreach(vocab, key, v)
        QRL_TRY(tok_set_piece(tok, (int32_t)json_integer_value(v), key, strlen(key), true, src,
                              field, err));
    return QRL_OK;
}

qrl_status tok_load_hf_json(qrl_tokenizer *tok, const char *path, const char *config_path,
                            qrl_error *err) {
    qrl_status st = QRL_OK;
    json_t *root = NULL;
    hf_config cfg = {0};
    char where[64];
    QRL_TRY_GOTO(read_json(path, 0, &root, err), done);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: missing field model", path);
        goto done;
    }
    const char *mt = type_of(model);
    if (mt && strcmp(mt, "BPE") != 0) {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: model.type \"%s\" is not supported (BPE only)",
                           path, mt);
        goto done;
    }
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
    json_t *dropout = json_object_get(model, "dropout");
    if ((cont && *cont) || (eow && *eow) || (json_is_number(dropout) && json_number_value(dropout) > 0)) {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                           "%s: model: continuing_subword_prefix / end_of_word_suffix / dropout "
                           "are not supported", path);
        goto done;
    }
    tok->kind = TOK_KIND_SPBPE; /* until a ByteLevel step says otherwise */
    QRL_TRY_GOTO(load_vocab_obj(tok, json_object_get(model, "vocab"), path, "model.vocab", err), done);
    json_t *merges = json_object_get(model, "merges");
    if (merges && !json_is_array(merges)) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: model.merges is not an array", path);
        goto done;
    }
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        snprintf(where, sizeof where, "model.merges[%zu]", i);
        if (json_is_string(m)) {
            QRL_TRY_GOTO(add_merge_line(tok, json_string_value(m), json_string_length(m), i, path,
                                        where, err), done);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            QRL_TRY_GOTO(add_merge(tok, json_string_value(a), json_string_length(a),
                                   json_string_value(b), json_string_length(b), i, path, where, err),
                         done);
        } else {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: expected \"a b\" or [a, b]", path, where);
            goto done;
        }
    }
    tok->byte_fallback = get_bool(model, "byte_fallback", false);
    tok->fuse_unk = get_bool(model, "fuse_unk", false);
    tok->ignore_merges = get_bool(model, "ignore_merges", false);
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) tok->unk = tok_vocab_find(tok, unk, strlen(unk));
    json_t *added = json_object_get(root, "added_tokens");
    json_array_foreach(added, i, m) {
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        json_t *id = json_object_get(m, "id");
        if (!json_is_integer(id)) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %s: missing integer field id", path, where);
            goto done;
        }
        QRL_TRY_GOTO(add_token_obj(tok, m, json_integer_value(id), path, where, err), done);
    }
    QRL_TRY_GOTO(parse_normalizer(tok, json_object_get(root, "normalizer"), path, "normalizer", err), done);
    QRL_TRY_GOTO(parse_pretok(tok, json_object_get(root, "pre_tokenizer"), path, "pre_tokenizer", err), done);
    bool fused = false;
    QRL_TRY_GOTO(parse_decoder(tok, json_object_get(root, "decoder"), &fused, path, err), done);
    if (tok->prefix_space && tok->metaspace) {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: pre_tokenizer: ByteLevel with Metaspace", path);
        goto done;
    }
    /* BOS from the post-processor's template when tokenizer_config.json has no bos_token */
    const char *tpl_bos = NULL;
    json_t *pp = json_object_get(root, "post_processor");
    if (type_of(pp) && strcmp(type_of(pp), "TemplateProcessing") == 0)
        tpl_bos = json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(pp, "single"), 0), "SpecialToken"), "id"));
    QRL_TRY_GOTO(load_config(tok, config_path, &cfg, err), done);
    resolve_special(tok, &cfg, tpl_bos, path);
    st = tok_finish(tok, path, err);
done:
    json_decref(root);
    json_decref(cfg.root);
    return st;
}

/* ---- vocab.json + merges.txt (GPT-2 / Qwen2 slow-tokenizer files) ------------------- */

qrl_status tok_load_vocab_merges(qrl_tokenizer *tok, const char *vocab_path,
                                 const char *merges_path, const char *config_path,
                                 qrl_error *err) {
    qrl_status st = QRL_OK;
    json_t *vocab = NULL;
    hf_config cfg = {0};
    char *text = NULL;
    tok->kind = TOK_KIND_BYTELEVEL;
    QRL_TRY_GOTO(read_json(vocab_path, 0, &vocab, err), done);
    QRL_TRY_GOTO(load_vocab_obj(tok, vocab, vocab_path, "top-level object", err), done);
    FILE *f = fopen(merges_path, "rb");
    if (!f) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: %s", merges_path, strerror(errno));
        goto done;
    }
    size_t cap = 1 << 20, n = 0, got;
    text = malloc(cap);
    while (text && (got = fread(text + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *t2 = realloc(text, cap *= 2);
            if (!t2) { free(text); text = NULL; }
            else text = t2;
        }
    }
    bool rd_err = ferror(f);
    fclose(f);
    if (!text || rd_err) {
        st = qrl_error_set(err, text ? QRL_STATUS_IO : QRL_STATUS_NOMEM, "%s: read failed", merges_path);
        goto done;
    }
    size_t rank = 0, line_no = 0;
    for (size_t p = 0; p < n;) {
        size_t e = p;
        while (e < n && text[e] != '\n') e++;
        size_t l = e - p;
        line_no++;
        if (l > 0 && text[p + l - 1] == '\r') l--;
        /* a "#version: 0.2" header line, and blank lines, carry no merge */
        if (l > 0 && !(line_no == 1 && text[p] == '#')) {
            char where[48];
            snprintf(where, sizeof where, "line %zu", line_no);
            QRL_TRY_GOTO(add_merge_line(tok, text + p, l, rank++, merges_path, where, err), done);
        }
        p = e + 1;
    }
    QRL_TRY_GOTO(load_config(tok, config_path, &cfg, err), done);
    /* the slow tokenizer classes fix the normalizer and pre-tokenizer */
    bool qwen = cfg.klass && strncmp(cfg.klass, "Qwen2Tokenizer", 14) == 0;
    if (qwen) {
        tok->norm[tok->n_norm++].op = TOK_NORM_NFC;
        QRL_TRY_GOTO(add_split(tok, tok_qwen2_regex, false, TOK_SPLIT_ISOLATED, vocab_path,
                               "Qwen2 pre-tokenizer", err), done);
    } else {
        QRL_TRY_GOTO(add_split(tok, tok_gpt2_regex, false, TOK_SPLIT_ISOLATED, vocab_path,
                               "GPT-2 pre-tokenizer", err), done);
    }
    tok->prefix_space = cfg.has_prefix_space && cfg.prefix_space;
    resolve_special(tok, &cfg, NULL, vocab_path);
    st = tok_finish(tok, vocab_path, err);
done:
    free(text);
    json_decref(vocab);
    json_decref(cfg.root);
    return st;
}
