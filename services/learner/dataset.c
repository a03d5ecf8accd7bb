/* qrl-learner dataset: a JSONL file read whole at start, templated and tokenized once,
 * then walked in a seeded shuffled order per epoch (docs/learner-daemon.md "Dataset").
 * A bad line refuses the file: a silently shrunken dataset would change the run. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "learner.h"

static qrl_status add_prompt(ld_dataset *d, size_t *cap, const char *path, size_t line,
                             const char *user, const char *answer, const char *tmpl,
                             const qrl_tokenizer *tok, size_t max_tokens, qrl_error *err) {
    char *text = NULL;
    bool add_bos = true;
    if (strcmp(tmpl, "none") != 0) {
        const char *name = strcmp(tmpl, "auto") == 0 ? qrl_tokenizer_chat_template_name(tok) : tmpl;
        qrl_error e2;
        if (qrl_chat_template_apply(name, NULL, user, &text, &e2) != QRL_OK)
            return qrl_error_set(err, e2.status, "%s:%zu: dataset.chat_template: %s", path, line, e2.msg);
        add_bos = strcmp(name, "plain") == 0; /* chatml/llama3 carry their own start */
    } else {
        text = strdup(user);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    qrl_error e2;
    if (!text || qrl_tokenizer_encode(tok, text, strlen(text), add_bos, !add_bos, &ids, &n, &e2) != QRL_OK) {
        free(text);
        return qrl_error_set(err, text ? e2.status : QRL_STATUS_NOMEM, "%s:%zu: tokenizing the prompt: %s",
                             path, line, text ? e2.msg : "out of memory");
    }
    if (n == 0 || n > max_tokens) {
        free(text);
        free(ids);
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: prompt has %zu tokens (allowed "
                             "1..%zu: the model context minus one)", path, line, n, max_tokens);
    }
    if (d->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        ld_prompt *np = realloc(d->items, *cap * sizeof *np);
        if (!np) {
            free(text);
            free(ids);
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        }
        d->items = np;
    }
    ld_prompt *p = &d->items[d->n++];
    p->text = text;
    p->answer = strdup(answer);
    p->ids = (uint32_t *)ids; /* ids are >= 0: same bits */
    p->n_ids = n;
    if (!p->answer) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    return QRL_OK;
}

qrl_status ld_dataset_load(const char *path, const char *prompt_field, const char *answer_field,
                           const char *chat_template, const qrl_tokenizer *tok,
                           size_t max_prompt_tokens, ld_dataset *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "dataset.path: cannot open %s", path);
    char *line = NULL;
    size_t lcap = 0, cap = 0, lineno = 0;
    ssize_t len;
    qrl_status st = QRL_OK;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) k--;
        if (k == 0) continue;
        json_error_t je;
        json_t *o = json_loadb(line, k, 0, &je);
        if (!o) {
            st = qrl_error_set(err, QRL_STATUS_PARSE, "%s:%zu: column %d: %s", path, lineno, je.column, je.text);
            break;
        }
        json_t *p = json_is_object(o) ? json_object_get(o, prompt_field) : NULL;
        json_t *a = json_is_object(o) ? json_object_get(o, answer_field) : NULL;
        char num[64];
        const char *ans = NULL;
        if (json_is_string(a)) ans = json_string_value(a);
        else if (json_is_integer(a)) snprintf(num, sizeof num, "%lld", (long long)json_integer_value(a)), ans = num;
        else if (json_is_real(a)) snprintf(num, sizeof num, "%.17g", json_real_value(a)), ans = num;
        if (!json_is_object(o))
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: not a JSON object", path, lineno);
        else if (!json_is_string(p))
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: field \"%s\" (dataset.prompt_field)"
                               " missing or not a string", path, lineno, prompt_field);
        else if (!ans)
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: field \"%s\" (dataset.answer_field)"
                               " missing or not a string/number", path, lineno, answer_field);
        else
            st = add_prompt(out, &cap, path, lineno, json_string_value(p), ans, chat_template, tok,
                            max_prompt_tokens, err);
        json_decref(o);
        if (st != QRL_OK) break;
    }
    free(line);
    fclose(f);
    if (st == QRL_OK && out->n == 0)
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: no prompts", path);
    if (st != QRL_OK) ld_dataset_free(out);
    return st;
}

void ld_dataset_free(ld_dataset *d) {
    for (size_t i = 0; i < d->n; i++) {
        free(d->items[i].text);
        free(d->items[i].answer);
        free(d->items[i].ids);
    }
    free(d->items);
    memset(d, 0, sizeof *d);
}
