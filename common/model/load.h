/* A model and its tokenizer, loaded the way every program does it (qrl-learner,
 * qrl-rollout, qrl-eval, qrl-generate): one place for the default-tokenizer rule and for
 * its error message. */
#ifndef QRL_MODEL_LOAD_H
#define QRL_MODEL_LOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_model_load_opts {
    const char *tokenizer;        /* tokenizer path; NULL or "" = the model's default */
    const char *tokenizer_option; /* option named when none is found ("--learner.tokenizer");
                                     NULL = "--tokenizer" */
    bool tokenizer_optional;      /* none found: OK with *tok = NULL and tok_path "" (the
                                     caller decides; qrl-generate --prompt-ids) */
} qrl_model_load_opts;

/* Load the checkpoint at `path` (qrl_model_load: a folder is a HuggingFace checkpoint, a
 * file a llama2.c .bin), then its tokenizer: o->tokenizer when given, else
 * qrl_tokenizer_find_default (the HF folder itself, its tokenizer.bin; beside a .bin:
 * tokenizer.bin or tok<vocab>.bin), loaded with the model's vocab size as the hint.
 * *m and *tok are owned by the caller (qrl_model_free, qrl_tokenizer_free); tok_path
 * (tok_path_cap bytes) receives the tokenizer path used, "" when there is none.
 * Errors: those of qrl_model_load (a missing path: NOT_FOUND "PATH: no such file or
 * directory"); NOT_FOUND "no tokenizer found beside PATH; give OPTION"; those of
 * qrl_tokenizer_load; INVALID_ARGUMENT (the tokenizer path does not fit tok_path).  On
 * error *m and *tok are NULL and nothing stays allocated. */
qrl_status qrl_model_load_with_tokenizer(const char *path, const qrl_model_load_opts *o,
                                         qrl_model **m, qrl_tokenizer **tok, char *tok_path,
                                         size_t tok_path_cap, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
