/* Shared internals of common/tokenizer/ (not a public header).
 *
 * tokenizer.c      vocabulary tables, load dispatch, added-token split, encode driver, decode
 * bpe.c            merge engine, byte-level map, normalizers, pre-tokenizer regexes
 * hf_load.c        tokenizer.json, vocab.json + merges.txt, tokenizer_config.json
 * sentencepiece.c  llama2.c tokenizer.bin load and run.c encode
 * chat_template.c  prompt templates */
#ifndef QRL_TOKENIZER_TOK_INTERNAL_H
#define QRL_TOKENIZER_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

typedef enum tok_kind {
    TOK_KIND_BYTELEVEL = 0, /* GPT-2 byte-level BPE */
    TOK_KIND_SPBPE,         /* sentencepiece-style BPE: chars, byte fallback */
    TOK_KIND_LLAMA2C,       /* llama2.c tokenizer.bin, run.c semantics */
} tok_kind;

#define TOK_NONE UINT32_MAX /* piece_off of an unassigned id */

/* Open-addressing map piece string -> id (strings live in the tokenizer's arena). */
typedef struct tok_strmap {
    uint32_t mask, count; /* capacity - 1 (a power of two minus one), entries */
    int32_t *slots;       /* -1 empty, else id */
} tok_strmap;

/* Open-addressing map (left id, right id) -> (priority, merged id). */
typedef struct tok_pair {
    uint64_t key; /* (left << 32) | right; UINT64_MAX empty */
    float prio;   /* lower merges first: BPE rank, or -score for llama2.c */
    int32_t id;
} tok_pair;
typedef struct tok_pairmap {
    uint32_t mask, count;
    tok_pair *slots;
} tok_pairmap;

typedef struct tok_added {
    int32_t id;
    bool special, normalized, lstrip, rstrip;
    char *content; /* as written */
    size_t len;
    char *match; /* what is searched for: content, normalized when `normalized` */
    size_t match_len;
} tok_added;

/* Added-token matcher over one list (raw text or normalized text). */
typedef struct tok_matcher {
    int n;
    int *order;         /* indices into tok->added, by first byte then longest first */
    int first[257];     /* order[first[b] .. first[b+1]) start with byte b */
} tok_matcher;

typedef enum tok_norm_op {
    TOK_NORM_NFC = 0,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_PREPEND, /* prepend `a` to a non-empty string */
    TOK_NORM_REPLACE, /* replace every `a` with `b` */
} tok_norm_op;
typedef struct tok_norm_step {
    tok_norm_op op;
    char *a, *b;
} tok_norm_step;

typedef enum tok_split_mode { TOK_SPLIT_ISOLATED = 0, TOK_SPLIT_REMOVED } tok_split_mode;
typedef struct tok_split_step {
    pcre2_code *re;
    tok_split_mode mode;
} tok_split_step;

#define TOK_MAX_STEPS 8

struct qrl_tokenizer {
    tok_kind kind;
    int32_t n_ids, ids_cap;
    /* pieces: NUL-terminated strings in `arena` at piece_off[id] (TOK_NONE: unassigned) */
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *piece_off;
    /* decoded bytes of each id, in `dec` at dec_off[id], dec_len[id] bytes */
    char *dec;
    uint32_t *dec_off, *dec_len;
    uint8_t *flags; /* TOK_FLAG_* per id */
    tok_strmap vocab; /* model vocabulary (not added-only tokens) */
    tok_pairmap merges;
    tok_added *added;
    int n_added;
    tok_matcher match_raw, match_norm;
    int32_t bos, eos, unk;
    int32_t byte_ids[256]; /* first symbol of each byte: byte-level char / <0xNN> / byte+3 */
    /* normalizer */
    tok_norm_step norm[TOK_MAX_STEPS];
    int n_norm;
    /* pre-tokenizer: optional whole-segment transform, then regex splits */
    bool prefix_space;            /* ByteLevel add_prefix_space */
    char *metaspace;              /* Metaspace replacement, NULL when none */
    int metaspace_prepend;        /* 0 never, 1 first, 2 always */
    bool metaspace_split;
    tok_split_step split[TOK_MAX_STEPS];
    int n_split;
    /* model options */
    bool ignore_merges, byte_fallback, fuse_unk;
    /* decoder */
    char *dec_rep_a, *dec_rep_b; /* Replace / Metaspace decoder: a -> b in every piece */
    bool dec_byte_fallback;      /* <0xNN> pieces decode to the byte */
    bool dec_strip_first_space; /* Metaspace decoder: first token loses its leading space */
    int dec_strip_start, dec_strip_stop; /* Strip decoder over the fused text */
    char dec_strip_char;
    const char *chat_template; /* static name */
    float *scores;             /* llama2.c */
};

#define TOK_FLAG_SPECIAL 1u
#define TOK_FLAG_ADDED 2u

/* ---- tokenizer.c: tables ---------------------------------------------------------- */
qrl_tokenizer *tok_new(tok_kind kind);
/* Grow the id space to at least n ids (new ids unassigned). */
qrl_status tok_reserve_ids(qrl_tokenizer *tok, int32_t n, const char *src, qrl_error *err);
/* Assign a piece string to an id; in_vocab: also index it in tok->vocab.  A second piece
 * for the same id is an error (CORRUPT naming src/what). */
qrl_status tok_set_piece(qrl_tokenizer *tok, int32_t id, const char *s, size_t len,
                         bool in_vocab, const char *src, const char *what, qrl_error *err);
int32_t tok_vocab_find(const qrl_tokenizer *tok, const char *s, size_t len);
/* Add (or update, by id) an added token. */
qrl_status tok_add_token(qrl_tokenizer *tok, int32_t id, const char *content, bool special,
                         bool normalized, bool lstrip, bool rstrip, const char *src,
                         qrl_error *err);
qrl_status tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, float prio, int32_t id);
const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);
/* After loading: decoded bytes per id, matchers, byte ids.  Called by the loaders. */
qrl_status tok_finish(qrl_tokenizer *tok, const char *src, qrl_error *err);

/* Growable int32 vector used by encode. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
bool tok_ids_push(tok_ids *v, int32_t id);

/* ---- bpe.c ------------------------------------------------------------------------- */
typedef struct tok_cand {
    float prio;
    int32_t pos, rpos, lid, rid, id;
} tok_cand;

/* Per-call working memory of encode (a tokenizer is shared between threads). */
typedef struct tok_scratch {
    int32_t *sym, *nxt, *prv;
    size_t sym_cap;
    tok_cand *heap;
    size_t heap_n, heap_cap;
    char *buf; /* normalizer / transform output */
    size_t buf_cap;
    char *buf2; /* normalized text while its pieces are encoded */
    size_t buf2_cap;
    char *tmp;
    size_t tmp_cap;
    size_t *spans, *spans2; /* (start, len) pairs */
    size_t n_spans, spans_cap, n_spans2, spans2_cap;
    pcre2_match_data *md;
} tok_scratch;
void tok_scratch_free(tok_scratch *s);
/* Make room for n symbols in s->sym / nxt / prv. */
bool tok_scratch_symbols(tok_scratch *s, size_t n);

/* GPT-2 bytes_to_unicode: the code point standing for byte b; and back (-1 when none). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);
/* Encode one code point as UTF-8 into out[4]; returns its length. */
int tok_utf8_put(uint32_t cp, char *out);
/* Length of a valid UTF-8 prefix check: returns the offset of the first invalid byte,
 * or len when all valid. */
size_t tok_utf8_validate(const char *s, size_t len);

/* Run the merges over s->sym[0..n) (linked through nxt/prv) and push the result. */
bool tok_merge_word(const qrl_tokenizer *tok, tok_scratch *s, int n, tok_ids *out);
/* Normalize s[0..len) into s->buf; *out and *out_len give the result (may be s itself). */
qrl_status tok_normalize(const qrl_tokenizer *tok, tok_scratch *s, const char *in, size_t len,
                         const char **out, size_t *out_len, qrl_error *err);
/* Pre-tokenize and BPE one normalized segment (no added tokens inside). */
qrl_status tok_encode_segment(const qrl_tokenizer *tok, tok_scratch *s, const char *text,
                              size_t len, bool at_start, tok_ids *out, qrl_error *err);
/* Compile a pre-tokenizer regex written in Oniguruma syntax (HF) for PCRE2. */
qrl_status tok_regex_compile(const char *pattern, bool literal, pcre2_code **re,
                             const char *src, const char *what, qrl_error *err);
extern const char *const tok_gpt2_regex;
extern const char *const tok_qwen2_regex;

/* ---- hf_load.c / sentencepiece.c ---------------------------------------------------- */
qrl_status tok_load_hf_json(qrl_tokenizer *tok, const char *json_path, const char *config_path,
                            qrl_error *err);
qrl_status tok_load_vocab_merges(qrl_tokenizer *tok, const char *vocab_path,
                                 const char *merges_path, const char *config_path,
                                 qrl_error *err);
qrl_status tok_load_llama2c(qrl_tokenizer *tok, const char *path, int vocab_size,
                            qrl_error *err);
qrl_status tok_llama2c_encode(const qrl_tokenizer *tok, tok_scratch *s, const char *text,
                              size_t len, tok_ids *out, qrl_error *err);

#endif
