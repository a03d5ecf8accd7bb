/* qrl-generate: the prompts (--prompt, --prompts FILE.jsonl, --prompt-ids) read and encoded. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/log.h"
#include "core/program.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "generate.h"

/* ---- prompts ------------------------------------------------------------------------ */

int32_t *parse_id_list(const char *s, size_t *n, int vocab) {
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v >= vocab || (*end && *end != ','))
            qrl_die("--prompt-ids: item %zu ('%.*s') is not a token id in [0, %d)", *n,
                (int)strcspn(p, ","), p, vocab);
        if (*n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) qrl_die("--prompt-ids: empty list");
    return ids;
}

void free_prompts(prompt *ps, int n) {
    for (int i = 0; i < n; i++) {
        free(ps[i].text);
        free(ps[i].ids);
    }
    free(ps);
}

/* One {"prompt": "..."} object per line; blank lines skipped.  Dies naming the line. */
prompt *read_prompts_file(const char *path, int *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) qrl_die("%s: cannot open: %s", path, strerror(errno));
    prompt *ps = NULL;
    int n = 0, lineno = 0;
    char *line = NULL, msg[512] = "";
    size_t cap = 0;
    ssize_t len;
    while (!msg[0] && (len = getline(&line, &cap, f)) != -1) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)len, 0, &je);
        json_t *pv = j ? json_object_get(j, "prompt") : NULL;
        if (!j) {
            snprintf(msg, sizeof msg, "%s: line %d: %s", path, lineno, je.text);
        } else if (!json_is_string(pv)) {
            snprintf(msg, sizeof msg, "%s: line %d: field 'prompt' must be a string", path, lineno);
        } else {
            ps = realloc(ps, (size_t)(n + 1) * sizeof *ps);
            ps[n++] = (prompt){.text = strdup(json_string_value(pv))};
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (!msg[0] && n == 0) snprintf(msg, sizeof msg, "%s: no prompts", path);
    if (msg[0]) {
        free_prompts(ps, n);
        qrl_die("%s", msg);
    }
    *n_out = n;
    return ps;
}

void encode_prompt(const opts *o, const qrl_tokenizer *tok, prompt *p) {
    qrl_error err;
    char *text = p->text;
    char *templated = NULL;
    if (o->chat_template) {
        if (qrl_chat_template_apply(o->chat_template, o->system, p->text, &templated, &err) != QRL_OK)
            qrl_die_err(&err);
        text = templated;
    }
    /* BOS as the tokenizer wants it, unless the template already wrote it (llama3's
     * <|begin_of_text|>); chatml tokenizers have none. */
    bool add_bos = true;
    int32_t bos = qrl_tokenizer_bos(tok);
    const char *bos_piece = bos >= 0 ? qrl_tokenizer_piece(tok, bos) : NULL;
    if (o->chat_template && bos_piece && strncmp(text, bos_piece, strlen(bos_piece)) == 0)
        add_bos = false;
    if (qrl_tokenizer_encode(tok, text, strlen(text), add_bos, true, &p->ids, &p->n_ids, &err) != QRL_OK)
        qrl_die_err(&err);
    free(templated);
    if (p->n_ids == 0) qrl_die("prompt '%.40s' encodes to no tokens", p->text);
}
