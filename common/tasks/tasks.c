/* Built-in task generators and the character tokenizer (tasks.h; docs/tasks.md). */
#include "tasks/tasks.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

int qrl_task_split_parse(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "train") == 0) return QRL_TASK_SPLIT_TRAIN;
    if (strcmp(name, "test") == 0) return QRL_TASK_SPLIT_TEST;
    return -1;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Counter-based draw: depends only on (seed, index, k), so item i never depends on how
 * many items came before it. */
static uint64_t draw(uint64_t seed, uint64_t index, uint64_t k) {
    return mix64(mix64(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) ^
                 mix64(index + 0x8cb92ba72f3d8dd7ull) ^ (k * 0xd1b54a32d192ed03ull));
}

/* 1 in 10 of all keys is test (a content hash, independent of any seed). */
static qrl_task_split split_of_key(uint64_t key) {
    return mix64(key * 0x9e3779b97f4a7c15ull + 0x5851f42d4c957f2dull) % 10 == 0
               ? QRL_TASK_SPLIT_TEST : QRL_TASK_SPLIT_TRAIN;
}

/* ---- arith ------------------------------------------------------------------------- */

qrl_task_arith_params qrl_task_arith_default(void) {
    return (qrl_task_arith_params){.min_digits = 3, .max_digits = 3};
}

qrl_task_split qrl_task_arith_split_of(uint64_t a, uint64_t b) {
    return split_of_key(a * 1000000007ull + b);
}

void qrl_task_arith_format(uint64_t a, uint64_t b, qrl_task_item *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->prompt, sizeof out->prompt, "%llu+%llu=", (unsigned long long)a,
             (unsigned long long)b);
    snprintf(out->answer, sizeof out->answer, "%llu", (unsigned long long)(a + b));
    /* one line per column from the right: "x+y(+1)=s"; the carry is the "+1" of the next */
    size_t o = 0;
    int carry = 0;
    uint64_t x = a, y = b;
    do {
        int dx = (int)(x % 10), dy = (int)(y % 10), s = dx + dy + carry;
        o += (size_t)snprintf(out->solution + o, sizeof out->solution - o,
                              carry ? "%d+%d+1=%d\n" : "%d+%d=%d\n", dx, dy, s);
        carry = s >= 10;
        x /= 10, y /= 10;
    } while (x || y);
    snprintf(out->solution + o, sizeof out->solution - o, "#### %llu",
             (unsigned long long)(a + b));
}

qrl_status qrl_task_arith_item(const qrl_task_arith_params *p, qrl_task_split split,
                               uint64_t seed, uint64_t index, qrl_task_item *out,
                               qrl_error *err) {
    if (p->min_digits < 1 || p->max_digits > 9 || p->min_digits > p->max_digits)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "arith: digits %d..%d: need 1 <= min <= max <= 9", p->min_digits,
                             p->max_digits);
    for (uint64_t k = 0;; k += 3) {
        int nd = p->min_digits + (int)(draw(seed, index, k) % (uint64_t)(p->max_digits - p->min_digits + 1));
        uint64_t lo = 1;
        for (int i = 1; i < nd; i++) lo *= 10;
        uint64_t span = nd == 1 ? 10 : 9 * lo; /* 1 digit: 0..9, else no leading zero */
        if (nd == 1) lo = 0;
        uint64_t a = lo + draw(seed, index, k + 1) % span, b = lo + draw(seed, index, k + 2) % span;
        if (qrl_task_arith_split_of(a, b) != split) continue; /* 1 in 10 (train) or 9 in 10 */
        qrl_task_arith_format(a, b, out);
        return QRL_OK;
    }
}

/* ---- story-name ---------------------------------------------------------------------- */

static const char *const NAMES[] = {"Lily", "Sue", "Mia", "Anna", "Lucy", "Amy", "Mary", "Sara",
                                    "Emma", "Kate", "Jane", "Zoe", "Tim", "Ben", "Tom", "Max",
                                    "Sam", "Jack", "Bob", "Leo", "Jim", "Joe", "Dan", "Spot"};
#define N_NAMES (int)(sizeof NAMES / sizeof NAMES[0])
#define N_GIRLS 12
/* kind 0 is a child (girl/boy by the name); the others are animals */
static const char *const KINDS[] = {"", "dog", "cat", "bird"};
#define N_KINDS (int)(sizeof KINDS / sizeof KINDS[0])
static const char *const ADJS[] = {"", "little ", "happy ", "kind ", "brave ", "curious ",
                                   "shy ", "funny "};
#define N_ADJS (int)(sizeof ADJS / sizeof ADJS[0])

qrl_task_split qrl_task_story_split_of(int name, int kind, int adjective) {
    return split_of_key(((uint64_t)name * 64 + (uint64_t)kind) * 64 + (uint64_t)adjective + 77);
}

qrl_status qrl_task_story_item(qrl_task_split split, uint64_t seed, uint64_t index,
                               int max_chars, qrl_task_item *out, qrl_error *err) {
    if (max_chars < 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "story-name: max_chars %d < 1",
                             max_chars);
    for (uint64_t k = 0;; k += 3) {
        int n = (int)(draw(seed, index, k) % N_NAMES), kd = (int)(draw(seed, index, k + 1) % N_KINDS);
        int ad = (int)(draw(seed, index, k + 2) % N_ADJS);
        if (qrl_task_story_split_of(n, kd, ad) != split) continue;
        memset(out, 0, sizeof *out);
        const char *kind = kd ? KINDS[kd] : n < N_GIRLS ? "girl" : "boy";
        bool vowel = strchr("aeiou", ADJS[ad][0] ? ADJS[ad][0] : kind[0]) != NULL;
        snprintf(out->prompt, sizeof out->prompt, "Once upon a time, there was %s %s%s named %s.",
                 vowel ? "an" : "a", ADJS[ad], kind, NAMES[n]);
        snprintf(out->answer, sizeof out->answer, "{\"name\":\"%s\",\"max_chars\":%d}", NAMES[n],
                 max_chars);
        return QRL_OK;
    }
}

/* ---- character tokenizer --------------------------------------------------------------- */

static qrl_status dump(json_t *o, const char *dir, const char *name, qrl_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = o ? json_dump_file(o, path, JSON_INDENT(1) | JSON_SORT_KEYS) : -1;
    json_decref(o);
    if (rc != 0) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot write", path);
    return QRL_OK;
}

static json_t *added(const char *content, int id) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

qrl_status qrl_task_write_char_tokenizer(const char *dir, qrl_error *err) {
    json_t *vocab = json_object();
    if (!vocab) return qrl_error_set(err, QRL_STATUS_NOMEM, "tokenizer: out of memory");
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, "<s>", json_integer(QRL_TASK_CHAR_BOS));
    json_object_set_new(vocab, "</s>", json_integer(QRL_TASK_CHAR_EOS));
    json_object_set_new(vocab, "\n", json_integer(3));
    for (int c = 0x20; c < 0x7f; c++) {
        char s[2] = {(char)c, 0};
        json_object_set_new(vocab, s, json_integer(4 + c - 0x20));
    }
    json_t *tok = json_pack("{s:s, s:n, s:[o,o,o], s:n, s:n, s:n, s:n, s:{s:s, s:o, s:[], s:s, "
                            "s:b, s:b, s:b}}",
                            "version", "1.0", "truncation", "added_tokens", added("<unk>", 0),
                            added("<s>", QRL_TASK_CHAR_BOS), added("</s>", QRL_TASK_CHAR_EOS),
                            "normalizer", "pre_tokenizer", "post_processor", "decoder", "model",
                            "type", "BPE", "vocab", vocab, "merges", "unk_token", "<unk>",
                            "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0);
    QRL_TRY(dump(tok, dir, "tokenizer.json", err));
    json_t *cfg = json_pack("{s:s, s:s, s:s, s:s, s:i, s:b, s:b}", "tokenizer_class",
                            "PreTrainedTokenizerFast", "bos_token", "<s>", "eos_token", "</s>",
                            "unk_token", "<unk>", "model_max_length", 1024, "add_bos_token", 1,
                            "add_eos_token", 0);
    return dump(cfg, dir, "tokenizer_config.json", err);
}
