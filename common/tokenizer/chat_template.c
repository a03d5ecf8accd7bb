/* One-turn chat/prompt templates (SPEC §2): plain, chatml (Qwen), llama3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* Pieces joined in order; a NULL-system template leaves out its system block. */
typedef struct chat_tpl {
    const char *name;
    const char *sys_pre, *sys_post; /* around the system text */
    const char *user_pre, *user_post;
    const char *head;               /* before everything (BOS of llama3) */
    const char *assistant;          /* opens the reply */
} chat_tpl;

static const chat_tpl k_templates[] = {
    {"plain", "", "\n\n", "", "", "", ""},
    {"chatml", "<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n", "",
     "<|im_start|>assistant\n"},
    {"llama3", "<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>",
     "<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>", "<|begin_of_text|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
};

qrl_status qrl_chat_template_apply(const char *name, const char *system, const char *user,
                                   char **out, qrl_error *err) {
    *out = NULL;
    if (!name || !user)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "chat template: %s is NULL",
                             name ? "user" : "name");
    const chat_tpl *t = NULL;
    for (size_t i = 0; i < sizeof k_templates / sizeof k_templates[0]; i++)
        if (strcmp(k_templates[i].name, name) == 0) t = &k_templates[i];
    if (!t)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "chat template \"%s\" is not supported (plain, chatml, llama3)", name);
    const char *parts[9] = {t->head, system ? t->sys_pre : "", system ? system : "",
                            system ? t->sys_post : "", t->user_pre, user, t->user_post,
                            t->assistant, NULL};
    size_t n = 1;
    for (int i = 0; parts[i]; i++) n += strlen(parts[i]);
    char *s = malloc(n);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "chat template: out of memory");
    size_t o = 0;
    for (int i = 0; parts[i]; i++) {
        size_t l = strlen(parts[i]);
        memcpy(s + o, parts[i], l);
        o += l;
    }
    s[o] = '\0';
    *out = s;
    return QRL_OK;
}
