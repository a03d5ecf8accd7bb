/* Prompt datasets (prompts.h): one JSONL reader and one rendering rule for the learner, the
 * evaluator and the benchmarks. */
#include "tasks/prompts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* render_stage: *stage = 0 when the chat template failed, 1 when tokenizing did. */
static qrl_status render_stage(const qrl_tokenizer *tok, const char *chat_template, const char *user, char **text,
                               int32_t **ids, size_t *n, int *stage, qrl_error *err) {
    *text = NULL, *ids = NULL, *n = 0, *stage = 0;
    bool add_bos = true;
    if (strcmp(chat_template, "none") != 0) {
        const char *name = strcmp(chat_template, "auto") == 0 ? qrl_tokenizer_chat_template_name(tok) : chat_template;
        QRL_TRY(qrl_chat_template_apply(name, NULL, user, text, err));
        add_bos = strcmp(name, "plain") == 0; /* chatml/llama3 carry their own start */
    } else if (!(*text = strdup(user))) {
        return qrl_error_set(err, QRL_STATUS_NOMEM, "out of memory");
    }
    *stage = 1;
    qrl_status st = qrl_tokenizer_encode(tok, *text, strlen(*text), add_bos, !add_bos, ids, n, err);
    if (st != QRL_OK) free(*text), *text = NULL;
    return st;
}

qrl_status qrl_prompt_render(const qrl_tokenizer *tok, const char *chat_template, const char *user,
                             char **text, int32_t **ids, size_t *n, qrl_error *err) {
    int stage;
    return render_stage(tok, chat_template, user, text, ids, n, &stage, err);
}

/* The answer field as text: strings as they are, numbers in their shortest exact form. */
static bool answer_text(const json_t *a, char *num, size_t cap, const char **out) {
    if (json_is_string(a)) *out = json_string_value(a);
    else if (json_is_integer(a)) snprintf(num, cap, "%lld", (long long)json_integer_value(a)), *out = num;
    else if (json_is_real(a)) snprintf(num, cap, "%.17g", json_real_value(a)), *out = num;
    else return false;
    return true;
}

static qrl_status add_line(qrl_prompt_set *s, size_t *cap, const char *path, size_t lineno, const char *line,
                           size_t len, const qrl_prompts_opts *o, const char *kp, qrl_error *err) {
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    if (!j) return qrl_error_set(err, QRL_STATUS_PARSE, "%s:%zu: column %d: %s", path, lineno, je.column, je.text);
    qrl_status st = QRL_OK;
    json_t *p = json_is_object(j) ? json_object_get(j, o->prompt_field) : NULL;
    json_t *a = json_is_object(j) ? json_object_get(j, o->answer_field) : NULL;
    char num[64];
    const char *ans = NULL;
    if (!json_is_object(j))
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: not a JSON object", path, lineno);
    else if (!json_is_string(p))
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: field \"%s\" (%sprompt_field) missing or not a string",
                           path, lineno, o->prompt_field, kp);
    else if (!answer_text(a, num, sizeof num, &ans))
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                           "%s:%zu: field \"%s\" (%sanswer_field) missing or not a string/number", path, lineno,
                           o->answer_field, kp);
    if (st == QRL_OK && s->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        qrl_prompt *ni = realloc(s->items, nc * sizeof *ni);
        if (!ni) st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        else s->items = ni, *cap = nc;
    }
    if (st == QRL_OK) {
        qrl_prompt *q = &s->items[s->n];
        *q = (qrl_prompt){0};
        qrl_error e2;
        int stage;
        q->user = strdup(json_string_value(p));
        q->answer = strdup(ans);
        if (!q->user || !q->answer) {
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        } else if ((st = render_stage(o->tok, o->chat_template, q->user, &q->text, &q->ids, &q->n_ids, &stage,
                                      &e2)) != QRL_OK) {
            st = stage == 0 ? qrl_error_set(err, e2.status, "%s:%zu: %schat_template: %s", path, lineno, kp, e2.msg)
                            : qrl_error_set(err, e2.status, "%s:%zu: tokenizing the prompt: %s", path, lineno, e2.msg);
        } else if (q->n_ids == 0 || q->n_ids > o->max_tokens) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                               "%s:%zu: prompt has %zu tokens (allowed 1..%zu: the model context minus one)", path,
                               lineno, q->n_ids, o->max_tokens);
        }
        if (st == QRL_OK) s->n++;
        else free(q->user), free(q->answer), free(q->text), free(q->ids);
    }
    json_decref(j);
    return st;
}

qrl_status qrl_prompts_load(const char *path, const qrl_prompts_opts *o, qrl_prompt_set *out, qrl_error *err) {
    *out = (qrl_prompt_set){0};
    const char *kp = o->key_prefix ? o->key_prefix : "";
    FILE *f = fopen(path, "r");
    if (!f)
        return *kp ? qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%spath: cannot open %s", kp, path)
                   : qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: cannot open", path);
    char *line = NULL;
    size_t lcap = 0, cap = 0, lineno = 0;
    ssize_t len;
    qrl_status st = QRL_OK;
    while ((o->limit == 0 || out->n < o->limit) && (len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) k--;
        if (k == 0) continue;
        if ((st = add_line(out, &cap, path, lineno, line, k, o, kp, err)) != QRL_OK) break;
    }
    free(line);
    fclose(f);
    if (st == QRL_OK && out->n == 0)
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: no prompts", path);
    if (st != QRL_OK) qrl_prompts_free(out);
    return st;
}

void qrl_prompts_free(qrl_prompt_set *s) {
    for (size_t i = 0; i < s->n; i++) {
        free(s->items[i].user);
        free(s->items[i].text);
        free(s->items[i].answer);
        free(s->items[i].ids);
    }
    free(s->items);
    *s = (qrl_prompt_set){0};
}
