/* Built-in tasks (issue 10 item 3; docs/tasks.md): synthetic data generators with a
 * disjoint train/test split, and the character-level tokenizer of the tiny models
 * trained on them.
 *
 *   arith       multi-digit addition with worked column steps, e.g.
 *                 prompt   "4173+2958="
 *                 solution "3+8=11\n7+5+1=13\n1+9+1=11\n4+2+1=7\n#### 7131"
 *                 answer   "7131"
 *               scored by the `arith` verifier (the integer after the last ####).
 *   story-name  an opening line for a story model (stories260K), e.g.
 *                 prompt   "Once upon a time, there was a little girl named Lily."
 *                 answer   "{\"name\":\"Lily\",\"max_chars\":600}"
 *               scored by the `name-twice` verifier (common/verify/synthetic.c).
 *
 * Split: every problem belongs to exactly one split by a hash of its content (never of
 * the seed), so a test set of any seed is disjoint from a train set of any seed.
 * Generation is deterministic for (task, split, seed, index). */
#ifndef QRL_TASKS_TASKS_H
#define QRL_TASKS_TASKS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qrl_task_split {
    QRL_TASK_SPLIT_TRAIN = 0,
    QRL_TASK_SPLIT_TEST = 1,
} qrl_task_split;

/* "train" | "test" -> the split; -1 when unknown. */
int qrl_task_split_parse(const char *name);

/* One generated example; NUL-terminated strings. */
typedef struct qrl_task_item {
    char prompt[128];
    char answer[96];
    char solution[512]; /* worked solution ending in the verifier's format ("" for tasks
                           without one, story-name) */
} qrl_task_item;

typedef struct qrl_task_arith_params {
    int min_digits, max_digits; /* digits of each operand (both have the same count,
                                   drawn uniformly in [min, max]); 1..9 */
} qrl_task_arith_params;

/* Defaults of the demo (docs/tasks.md "Recipe"). */
qrl_task_arith_params qrl_task_arith_default(void);

/* The split an addition a + b belongs to: TEST for 10% of all pairs, by a hash. */
qrl_task_split qrl_task_arith_split_of(uint64_t a, uint64_t b);

/* Fill the worked example of a + b (a, b < 10^9). */
void qrl_task_arith_format(uint64_t a, uint64_t b, qrl_task_item *out);

/* Example `index` of (split, seed): operands drawn from a counter-based RNG keyed by
 * (seed, index), redrawn until the pair is in `split`.
 * Errors: INVALID_ARGUMENT (digits outside 1..9 or min > max). */
qrl_status qrl_task_arith_item(const qrl_task_arith_params *p, qrl_task_split split,
                               uint64_t seed, uint64_t index, qrl_task_item *out,
                               qrl_error *err);

/* story-name: character name + opening line.  `max_chars` goes into the reference. */
qrl_task_split qrl_task_story_split_of(int name, int kind, int adjective);
qrl_status qrl_task_story_item(qrl_task_split split, uint64_t seed, uint64_t index,
                               int max_chars, qrl_task_item *out, qrl_error *err);

/* The character-level tokenizer of the built-in tiny models: id 0 "<unk>", 1 "<s>"
 * (BOS), 2 "</s>" (EOS), then "\n" (3) and printable ASCII 0x20..0x7E (4..98), no
 * merges, no normalizer: encode maps each character to one id, decode(encode(s)) == s
 * for ASCII s without control characters other than "\n". */
#define QRL_TASK_CHAR_VOCAB 99
#define QRL_TASK_CHAR_BOS 1
#define QRL_TASK_CHAR_EOS 2

/* Write tokenizer.json and tokenizer_config.json (bos "<s>", eos "</s>", no chat
 * template: prompts render "plain") into folder `dir` (must exist).  Errors: IO. */
qrl_status qrl_task_write_char_tokenizer(const char *dir, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
