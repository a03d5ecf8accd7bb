/* Model + tokenizer loading for the programs (common/model/load.h): the error paths name
 * the path (missing model, no tokenizer beside it and the option to give, a missing
 * explicit tokenizer, a tokenizer path too long for the caller's buffer) and leave nothing
 * allocated (ASan in make sanitize); the default tokenizer beside a llama2.c .bin; an
 * optional tokenizer. */
#include <criterion/criterion.h>
#include <string.h>

#include "model/load.h"
#include "support/test_files.h"

#define HF_NO_TOK "tests/fixtures/hf/llama" /* config + weights, no tokenizer files */

Test(model_load, missing_model_path_is_named) {
    qrl_model *m = (qrl_model *)1;
    qrl_tokenizer *tok = (qrl_tokenizer *)1;
    char tp[64] = "junk";
    qrl_error err;
    qrl_model_load_opts o = {.tokenizer_option = "--learner.tokenizer"};
    cr_assert_eq(qrl_model_load_with_tokenizer("/nonexistent/qrl-model-xyz", &o, &m, &tok, tp,
                                               sizeof tp, &err),
                 QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "/nonexistent/qrl-model-xyz: no such file or directory");
    cr_assert_null(m);
    cr_assert_null(tok);
    cr_assert_str_eq(tp, "");
}

Test(model_load, no_tokenizer_beside_names_model_and_option) {
    if (access(HF_NO_TOK "/config.json", R_OK) != 0) cr_skip_test(HF_NO_TOK " not found");
    qrl_model *m;
    qrl_tokenizer *tok;
    char tp[256];
    qrl_error err;
    qrl_model_load_opts o = {.tokenizer_option = "--rollout.tokenizer"};
    cr_assert_eq(qrl_model_load_with_tokenizer(HF_NO_TOK, &o, &m, &tok, tp, sizeof tp, &err),
                 QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "no tokenizer found beside " HF_NO_TOK "; give --rollout.tokenizer");
    cr_assert_null(m);
    cr_assert_null(tok);
    /* the option defaults to --tokenizer */
    o.tokenizer_option = NULL;
    o.tokenizer = ""; /* empty = the default, as an unset config string */
    cr_assert_eq(qrl_model_load_with_tokenizer(HF_NO_TOK, &o, &m, &tok, tp, sizeof tp, &err),
                 QRL_STATUS_NOT_FOUND);
    cr_assert_str_eq(err.msg, "no tokenizer found beside " HF_NO_TOK "; give --tokenizer");
    /* optional: the model alone */
    o.tokenizer_optional = true;
    cr_assert_eq(qrl_model_load_with_tokenizer(HF_NO_TOK, &o, &m, &tok, tp, sizeof tp, &err),
                 QRL_OK, "%s", err.msg);
    cr_assert_not_null(m);
    cr_assert_null(tok);
    cr_assert_str_eq(tp, "");
    cr_assert_eq(m->cfg.vocab_size, 256);
    qrl_model_free(m);
}

Test(model_load, default_and_explicit_tokenizer_beside_llama2c_bin) {
    char bin[512], tokp[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin) ||
        !qrl_test_data_path("llama2c_stories260K/tok512.bin", tokp, sizeof tokp))
        cr_skip_test("stories260K not found at %s", bin);
    qrl_model *m;
    qrl_tokenizer *tok;
    char tp[512];
    qrl_error err;
    qrl_model_load_opts o = {0};
    cr_assert_eq(qrl_model_load_with_tokenizer(bin, &o, &m, &tok, tp, sizeof tp, &err), QRL_OK,
                 "%s", err.msg);
    cr_assert_str_eq(tp, tokp, "the default tokenizer beside the .bin is tok<vocab>.bin");
    cr_assert_eq(qrl_tokenizer_vocab_size(tok), 512);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);

    o.tokenizer = tokp; /* explicit */
    cr_assert_eq(qrl_model_load_with_tokenizer(bin, &o, &m, &tok, tp, sizeof tp, &err), QRL_OK,
                 "%s", err.msg);
    cr_assert_str_eq(tp, tokp);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);

    /* a missing explicit tokenizer: the tokenizer loader's error, naming it */
    o.tokenizer = "/nonexistent/tok-xyz.bin";
    cr_assert_neq(qrl_model_load_with_tokenizer(bin, &o, &m, &tok, tp, sizeof tp, &err), QRL_OK);
    cr_assert(strstr(err.msg, "/nonexistent/tok-xyz.bin"), "%s", err.msg);
    cr_assert_null(m);
    cr_assert_null(tok);

    /* the caller's buffer too small for the path: refused, nothing loaded */
    o.tokenizer = tokp;
    char small[8];
    cr_assert_eq(qrl_model_load_with_tokenizer(bin, &o, &m, &tok, small, sizeof small, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "longer than 8 bytes"), "%s", err.msg);
    cr_assert_null(m);
    cr_assert_str_eq(small, "");
}
