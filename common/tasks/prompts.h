/* Prompt datasets: a JSONL file of {"<prompt_field>": text, "<answer_field>": text|number}
 * lines, each prompt rendered with a chat template and tokenized the way the learner sends
 * it to the replicas (SPEC §4 dataset; docs/learner-daemon.md "Dataset").  The learner's
 * dispatcher, qrl-eval and bench/e2e_engine read datasets through this one loader, so a
 * prompt has the same ids wherever it is decoded.
 *
 * Rendering: chat_template "none" tokenizes the text as is with BOS; "auto" takes the
 * tokenizer's own template (qrl_tokenizer_chat_template_name); any other name is applied
 * (qrl_chat_template_apply).  A "plain" template gets BOS; chatml/llama3 carry their own
 * start, so no BOS is added and the text is parsed for special tokens. */
#ifndef QRL_TASKS_PROMPTS_H
#define QRL_TASKS_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

typedef struct qrl_prompt {
    char *user;      /* the prompt field as read */
    char *text;      /* after the chat template */
    char *answer;    /* the answer field; a number as its shortest exact text ("%.17g") */
    int32_t *ids;    /* the rendered text's tokens, n_ids of them, 1 <= n_ids <= max_tokens */
    size_t n_ids;
} qrl_prompt;

typedef struct qrl_prompt_set {
    qrl_prompt *items;
    size_t n;
} qrl_prompt_set;

typedef struct qrl_prompts_opts {
    const char *prompt_field, *answer_field; /* JSON keys of each line */
    const char *chat_template;               /* "auto", "none" or a template name */
    const qrl_tokenizer *tok;                /* borrowed for the call */
    size_t max_tokens;                       /* longest prompt allowed (model context - 1) */
    size_t limit;                            /* stop after this many prompts; 0 = the whole file */
    const char *key_prefix;                  /* names the settings in messages: "dataset."
                                                -> "(dataset.prompt_field)"; NULL = "" */
} qrl_prompts_opts;

/* Read, render and tokenize `path`.  Blank lines are skipped; any bad line refuses the whole
 * file (a silently shrunken dataset would change the run).  *out is owned by the caller
 * (qrl_prompts_free); on error it is empty.  Errors, each naming "path:line" and the field:
 * NOT_FOUND (cannot open), PARSE (not JSON, with the column), INVALID_ARGUMENT (not an
 * object, a field missing or of the wrong type, a prompt of 0 or more than max_tokens
 * tokens, no prompts at all), UNSUPPORTED (an unknown chat template), NOMEM; the
 * tokenizer's own errors. */
qrl_status qrl_prompts_load(const char *path, const qrl_prompts_opts *o, qrl_prompt_set *out,
                            qrl_error *err);
void qrl_prompts_free(qrl_prompt_set *s);

/* Render one user prompt as qrl_prompts_load does: *text (malloc'd) and its tokens *ids
 * (malloc'd, *n).  Errors: the template's and the tokenizer's, NOMEM. */
qrl_status qrl_prompt_render(const qrl_tokenizer *tok, const char *chat_template, const char *user,
                             char **text, int32_t **ids, size_t *n, qrl_error *err);

#endif
