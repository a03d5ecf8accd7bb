/* qrl-generate: a response as text, and its JSON line or plain-text output. */
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

/* Text of a response (special tokens skipped), or NULL without a tokenizer.  Decoded in
 * the context of its prompt (decode(prompt + response) minus decode(prompt)) so that
 * SentencePiece leading-space rules apply as they would to the whole sequence. */
char *response_text(const qrl_tokenizer *tok, const prompt *p, const response *r) {
    if (!tok) return NULL;
    qrl_error err;
    int32_t *all = malloc((p->n_ids + (size_t)r->n + 1) * sizeof *all);
    memcpy(all, p->ids, p->n_ids * sizeof *all);
    memcpy(all + p->n_ids, r->tokens, (size_t)r->n * sizeof *all);
    char *full, *head, *text;
    if (qrl_tokenizer_decode(tok, all, p->n_ids + (size_t)r->n, true, &full, &err) != QRL_OK ||
        qrl_tokenizer_decode(tok, all, p->n_ids, true, &head, &err) != QRL_OK)
        qrl_die_err(&err);
    size_t hl = strlen(head);
    if (strncmp(full, head, hl) == 0) {
        text = strdup(full + hl);
    } else if (qrl_tokenizer_decode(tok, r->tokens, (size_t)r->n, true, &text, &err) != QRL_OK) {
        qrl_die_err(&err);
    }
    free(full);
    free(head);
    free(all);
    return text;
}

/* JSON strings must be valid UTF-8, but a response can stop inside a multi-byte character
 * (byte-level tokens).  Replace each invalid or cut sequence with U+FFFD, as HuggingFace's
 * decode does; token_ids keep the exact output.  Returns a malloc'd copy. */
char *utf8_lossy(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = malloc(3 * n + 1); /* each bad byte becomes 3 bytes at most */
    if (!out) qrl_die("out of memory");
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k, i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3, i += 1;
        }
    }
    out[o] = '\0';
    return out;
}

void emit(const opts *op, const prompt *p, int pi, int ri, const response *r, char *text, double secs) {
    if (op->output == OUTPUT_TEXT) { /* the prompt and its continuation; a blank line between responses */
        static bool first = true;
        char *valid = text ? utf8_lossy(text) : NULL;
        printf("%s%s%s\n", first ? "" : "\n", p->text ? p->text : "", valid ? valid : "");
        first = false;
        free(valid);
        if (fflush(stdout) != 0 || ferror(stdout)) qrl_die("writing to stdout failed: %s", strerror(errno));
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", p->text ? json_string(p->text) : json_null());
    json_object_set_new(o, "prompt_index", json_integer(pi));
    json_object_set_new(o, "response_index", json_integer(ri));
    char *valid = text ? utf8_lossy(text) : NULL;
    json_object_set_new(o, "text", valid ? json_string(valid) : json_null());
    free(valid);
    json_t *ids = json_array(), *lps = json_array();
    for (int i = 0; i < r->n; i++) {
        json_array_append_new(ids, json_integer(r->tokens[i]));
        json_array_append_new(lps, json_real(r->logprobs[i]));
    }
    json_object_set_new(o, "token_ids", ids);
    json_object_set_new(o, "logprobs", lps);
    json_object_set_new(o, "finish_reason", json_string(r->finish));
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)p->n_ids));
    json_object_set_new(o, "tokens_per_s", json_real(secs > 0 ? r->n / secs : 0));
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    /* a full disk or a closed pipe must not look like success */
    if (fflush(stdout) != 0 || ferror(stdout)) qrl_die("writing to stdout failed: %s", strerror(errno));
    free(s);
    json_decref(o);
}
