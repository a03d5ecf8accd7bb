/* Model + tokenizer loading for the programs (load.h). */
#include "model/load.h"

#include <stdio.h>

qrl_status qrl_model_load_with_tokenizer(const char *path, const qrl_model_load_opts *o,
                                         qrl_model **m, qrl_tokenizer **tok, char *tok_path,
                                         size_t tok_path_cap, qrl_error *err) {
    *m = NULL, *tok = NULL;
    if (tok_path_cap) tok_path[0] = '\0';
    qrl_model *model;
    QRL_TRY(qrl_model_load(path, &model, err));
    char buf[4096];
    const char *tp = o->tokenizer && *o->tokenizer
                         ? o->tokenizer
                         : qrl_tokenizer_find_default(path, model->cfg.vocab_size, buf, sizeof buf);
    qrl_status st = QRL_OK;
    if (!tp) {
        if (o->tokenizer_optional) {
            *m = model;
            return QRL_OK;
        }
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "no tokenizer found beside %s; give %s",
                           path, o->tokenizer_option ? o->tokenizer_option : "--tokenizer");
        goto fail;
    }
    if ((size_t)snprintf(tok_path, tok_path_cap, "%s", tp) >= tok_path_cap) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                           "tokenizer path %.200s...: longer than %zu bytes", tp, tok_path_cap);
        goto fail;
    }
    QRL_TRY_GOTO(qrl_tokenizer_load(tp, model->cfg.vocab_size, tok, err), fail);
    *m = model;
    return QRL_OK;
fail:
    if (tok_path_cap) tok_path[0] = '\0';
    qrl_model_free(model);
    return st;
}
