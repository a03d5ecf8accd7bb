/* The kernel tuning table (kernels/base/tuning.h): defaults, the environment, the setter
 * and the "name=value,..." parser of the cuda_tuning config keys. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/tuning.h"

static void clean(void) {
    qrl_tuning_reset();
    for (int k = 0; k < QRL_TUNING_COUNT_; k++) unsetenv(qrl_tuning_info_of(k)->env);
}

TestSuite(tuning, .init = clean, .fini = clean);

Test(tuning, table_rows_have_names_defaults_and_docs) {
    for (int k = 0; k < QRL_TUNING_COUNT_; k++) {
        const qrl_tuning_info *t = qrl_tuning_info_of(k);
        cr_assert(t->name && *t->name && t->doc && *t->doc, "knob %d", k);
        cr_assert(!strncmp(t->env, "QRL_", 4), "%s", t->env);
        cr_assert(t->dflt >= t->min && t->dflt <= t->max, "%s default in range", t->name);
        for (const char *a = t->name, *b = t->env + 4; *a || *b; a++, b++) /* env = QRL_ + upper */
            cr_assert(*b == (*a >= 'a' && *a <= 'z' ? *a - 'a' + 'A' : *a), "%s vs %s", t->name, t->env);
    }
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTN_CHUNK_MIN), 512);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTNQ_DEQ), 2);
    cr_assert_float_eq(qrl_tuning_real(QRL_TUNING_GEMM_BF16_SKINNY_MAX_MB), 24.0, 1e-12);
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_W8A8_UNFUSED));
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_W8A8_EPILOGUE_PASS));
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_KV_STORE_UNFUSED));
}

Test(tuning, environment_is_read_at_each_use) {
    setenv("QRL_ATTN_LEGACY", "1", 1);
    cr_assert(qrl_tuning_bool(QRL_TUNING_ATTN_LEGACY));
    setenv("QRL_ATTN_LEGACY", "0", 1);
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_ATTN_LEGACY));
    setenv("QRL_ATTNQ_STAGES", "4", 1);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTNQ_STAGES), 4);
    setenv("QRL_ATTNQ_STAGES", "", 1); /* empty: unset */
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTNQ_STAGES), 3);
    setenv("QRL_ATTNQ_STAGES", "9", 1); /* out of range: the default holds */
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTNQ_STAGES), 3);
    setenv("QRL_ATTN_CHUNK_MIN", "lots", 1);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTN_CHUNK_MIN), 512);
}

Test(tuning, set_wins_over_the_environment_until_dropped) {
    qrl_error err;
    setenv("QRL_GEMM_BF16_SKINNY_MAX_N", "16", 1);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_GEMM_BF16_SKINNY_MAX_N), 16);
    cr_assert_eq(qrl_tuning_set("gemm_bf16_skinny_max_n", "4", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_GEMM_BF16_SKINNY_MAX_N), 4);
    cr_assert_eq(qrl_tuning_set("QRL_GEMM_BF16_SKINNY_MAX_N", "2", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_GEMM_BF16_SKINNY_MAX_N), 2);
    cr_assert_eq(qrl_tuning_set("gemm_bf16_skinny_max_n", NULL, &err), QRL_OK);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_GEMM_BF16_SKINNY_MAX_N), 16);
    cr_assert_eq(qrl_tuning_set("fp4_no_splitk", "true", &err), QRL_OK);
    cr_assert(qrl_tuning_bool(QRL_TUNING_FP4_NO_SPLITK));
    qrl_tuning_reset();
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_FP4_NO_SPLITK));
}

Test(tuning, set_refuses_bad_names_and_values_naming_the_knob) {
    qrl_error err;
    cr_assert_eq(qrl_tuning_set("attn_stagez", "2", &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "attn_stagez"), "%s", err.msg);
    cr_assert_eq(qrl_tuning_set("attn_stages", "4", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "attn_stages") && strstr(err.msg, "'4'"), "%s", err.msg);
    cr_assert_eq(qrl_tuning_set("attn_legacy", "maybe", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "attn_legacy"), "%s", err.msg);
    cr_assert_eq(qrl_tuning_set("attn_chunk_min", "12x", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_tuning_set("gemm_bf16_skinny_max_mb", "-1", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "gemm_bf16_skinny_max_mb"), "%s", err.msg);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTN_STAGES), 2); /* unchanged */
}

Test(tuning, apply_sets_a_list_or_nothing) {
    qrl_error err;
    cr_assert_eq(qrl_tuning_apply("", &err), QRL_OK);
    cr_assert_eq(qrl_tuning_apply(NULL, &err), QRL_OK);
    cr_assert_eq(qrl_tuning_apply(" attn_stages = 3 , attnq_deq=1,, gemm_bf16_skinny_max_mb=12.5 ", &err),
                 QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTN_STAGES), 3);
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTNQ_DEQ), 1);
    cr_assert_float_eq(qrl_tuning_real(QRL_TUNING_GEMM_BF16_SKINNY_MAX_MB), 12.5, 1e-12);
    /* a bad item anywhere sets nothing */
    cr_assert_eq(qrl_tuning_apply("attn_wavefit=1,attnq_deq=7", &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "attnq_deq"), "%s", err.msg);
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_ATTN_WAVEFIT));
    cr_assert_eq(qrl_tuning_apply("attn_wavefit=1,nope=1", &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "nope"), "%s", err.msg);
    cr_assert_not(qrl_tuning_bool(QRL_TUNING_ATTN_WAVEFIT));
    cr_assert_eq(qrl_tuning_apply("attn_wavefit", &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "attn_wavefit"), "%s", err.msg);
    cr_assert_eq(qrl_tuning_apply("attn_stages=", &err), QRL_OK); /* drops */
    cr_assert_eq(qrl_tuning_int(QRL_TUNING_ATTN_STAGES), 2);
}
