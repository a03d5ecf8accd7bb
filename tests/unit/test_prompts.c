/* common/tasks/prompts.h: the one JSONL prompt loader (learner dispatch, qrl-eval,
 * bench/e2e_engine): fields, numbers as answers, rendering, limits, and every refusal
 * naming the file, line and setting. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/test_files.h"
#include "tasks/prompts.h"
#include "tasks/tasks.h"

static char dir[64];
static qrl_tokenizer *tok;

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/qrl_test_prompts_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    qrl_error err;
    cr_assert_eq(qrl_task_write_char_tokenizer(dir, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tokenizer_load(dir, QRL_TASK_CHAR_VOCAB, &tok, &err), QRL_OK, "%s", err.msg);
}
static void teardown(void) {
    qrl_tokenizer_free(tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(prompts, .init = setup, .fini = teardown);

static qrl_prompts_opts opts(void) {
    return (qrl_prompts_opts){.prompt_field = "q", .answer_field = "a", .chat_template = "auto", .tok = tok,
                              .max_tokens = 64, .key_prefix = "dataset."};
}

static const char *file(const char *name, const char *text) {
    static char path[512];
    qrl_test_write(dir, name, text, strlen(text), path);
    return path;
}

Test(prompts, reads_fields_numbers_and_renders_like_render) {
    const char *p = file("ok.jsonl", "{\"q\": \"1+2=\", \"a\": \"3\"}\n\n{\"q\": \"half\", \"a\": 0.5}\r\n"
                                     "{\"q\": \"x\", \"a\": 42, \"extra\": true}\n");
    qrl_prompts_opts o = opts();
    qrl_prompt_set s;
    qrl_error err;
    cr_assert_eq(qrl_prompts_load(p, &o, &s, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(s.n, 3, "the blank line is skipped");
    cr_assert_str_eq(s.items[0].user, "1+2=");
    cr_assert_str_eq(s.items[0].answer, "3");
    cr_assert_str_eq(s.items[1].answer, "0.5");
    cr_assert_str_eq(s.items[2].answer, "42");
    /* the char tokenizer's template is "plain": BOS, then one id per character */
    cr_assert_eq(s.items[0].ids[0], QRL_TASK_CHAR_BOS);
    for (size_t i = 0; i < s.n; i++) {
        char *text;
        int32_t *ids;
        size_t n;
        cr_assert_eq(qrl_prompt_render(tok, "auto", s.items[i].user, &text, &ids, &n, &err), QRL_OK, "%s", err.msg);
        cr_assert_str_eq(text, s.items[i].text);
        cr_assert_eq(n, s.items[i].n_ids);
        cr_assert_eq(memcmp(ids, s.items[i].ids, n * sizeof *ids), 0);
        free(text), free(ids);
    }
    cr_assert_eq(s.items[0].n_ids, strlen(s.items[0].text) + 1);
    qrl_prompts_free(&s);
    cr_assert_eq(s.n, 0);
    cr_assert_null(s.items);
}

Test(prompts, limit_stops_early_and_none_keeps_text) {
    const char *p = file("three.jsonl", "{\"q\": \"a\", \"a\": \"1\"}\n{\"q\": \"b\", \"a\": \"2\"}\n{\"q\": \"c\", \"a\": \"3\"}\n");
    qrl_prompts_opts o = opts();
    o.limit = 2;
    o.chat_template = "none";
    qrl_prompt_set s;
    qrl_error err;
    cr_assert_eq(qrl_prompts_load(p, &o, &s, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(s.n, 2);
    cr_assert_str_eq(s.items[1].text, "b");
    cr_assert_eq(s.items[1].n_ids, 2, "BOS + 'b'");
    qrl_prompts_free(&s);
}

/* load `text` and expect status st with `want` in the message */
static void refused(const char *text, qrl_prompts_opts o, qrl_status st, const char *want) {
    const char *p = file("bad.jsonl", text);
    qrl_prompt_set s = {.n = 7};
    qrl_error err;
    cr_assert_eq(qrl_prompts_load(p, &o, &s, &err), st, "%s: %s", text, err.msg);
    cr_assert(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
    cr_assert_eq(s.n, 0, "nothing is kept from a refused file");
    cr_assert_null(s.items);
}

Test(prompts, refusals_name_line_and_setting) {
    qrl_prompts_opts o = opts();
    refused("{\"q\": \"a\", \"a\": \"1\"}\n{\"q\": \"b\", \"a\":\n", o, QRL_STATUS_PARSE, "bad.jsonl:2: column");
    refused("[1, 2]\n", o, QRL_STATUS_INVALID_ARGUMENT, "bad.jsonl:1: not a JSON object");
    refused("{\"q\": 5, \"a\": \"1\"}\n", o, QRL_STATUS_INVALID_ARGUMENT,
            "bad.jsonl:1: field \"q\" (dataset.prompt_field) missing or not a string");
    refused("{\"q\": \"a\"}\n", o, QRL_STATUS_INVALID_ARGUMENT,
            "field \"a\" (dataset.answer_field) missing or not a string/number");
    refused("{\"q\": \"a\", \"a\": [1]}\n", o, QRL_STATUS_INVALID_ARGUMENT, "(dataset.answer_field)");
    refused("\n\n", o, QRL_STATUS_INVALID_ARGUMENT, "bad.jsonl: no prompts");
    qrl_prompts_opts shorter = o;
    shorter.max_tokens = 3;
    refused("{\"q\": \"ab\", \"a\": \"1\"}\n{\"q\": \"abc\", \"a\": \"1\"}\n", shorter, QRL_STATUS_INVALID_ARGUMENT,
            "bad.jsonl:2: prompt has 4 tokens (allowed 1..3");
    qrl_prompts_opts tmpl = o;
    tmpl.chat_template = "no-such-template";
    refused("{\"q\": \"a\", \"a\": \"1\"}\n", tmpl, QRL_STATUS_UNSUPPORTED, "bad.jsonl:1: dataset.chat_template: ");
    qrl_prompt_set s;
    qrl_error err;
    cr_assert_eq(qrl_prompts_load("/nonexistent/x.jsonl", &o, &s, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "dataset.path: cannot open /nonexistent/x.jsonl");
    o.key_prefix = NULL;
    cr_assert_eq(qrl_prompts_load("/nonexistent/x.jsonl", &o, &s, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "/nonexistent/x.jsonl: cannot open");
}
