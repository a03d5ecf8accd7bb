/* The shared main() prelude (core/program.h): exit statuses, messages, settings binding. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "core/program.h"

typedef struct settings {
    const char *model;
    int k;
} settings;

static const qrl_config_entry table[] = {
    QRL_CFG_STRING("model", settings, model, "", false, "model folder"),
    QRL_CFG_INT("k", settings, k, "4", 0, 64, true, "samples"),
};

static settings S;
static int resolved;

static qrl_status resolve_k(qrl_config_t *cfg, qrl_error *err) {
    resolved++;
    return qrl_config_apply(cfg, "k", "9", "resume", err);
}

static const qrl_program PROGRAM = {.name = "qrl-test", .usage = "qrl-test --model DIR\n\n", .table = table,
                                    .n = 2, .settings = &S};
static const qrl_program RESOLVING = {.name = "qrl-test", .table = table, .n = 2, .settings = &S,
                                      .resolve = resolve_k};

#define ARGS(...) ((char *[]){"qrl-test", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"qrl-test", __VA_ARGS__}) / sizeof(char *)))

Test(program, run_binds_settings) {
    qrl_config_t *cfg;
    memset(&S, 0, sizeof S);
    cr_assert_eq(qrl_program_start(&PROGRAM, ARGC("--model", "m", "--k=7"), ARGS("--model", "m", "--k=7"), &cfg,
                                   NULL),
                 QRL_PROGRAM_RUN);
    cr_assert_not_null(cfg);
    cr_assert_str_eq(S.model, "m");
    cr_assert_eq(S.k, 7);
    qrl_error err;
    cr_assert_eq(qrl_config_set(cfg, "k", "8", &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(S.k, 8); /* bound: a later set writes the field */
    qrl_config_destroy(cfg);
}

Test(program, help_prints_usage_then_keys, .init = cr_redirect_stdout) {
    qrl_config_t *cfg = (qrl_config_t *)1;
    cr_assert_eq(qrl_program_start(&PROGRAM, ARGC("--help"), ARGS("--help"), &cfg, NULL), 0);
    cr_assert_null(cfg);
    fflush(stdout);
    cr_assert_stdout_eq_str("qrl-test --model DIR\n\n"
                            "usage: qrl-test [--config FILE] [--section.key=VALUE ...] [--print-config] "
                            "[--help] [--help-markdown]\n\n"
                            "Keys are set in the YAML file (section: {key: value}) or on the command line\n"
                            "(--section.key=VALUE or --section.key VALUE); the command line wins.\n"
                            "--print-config prints the resolved config (key: value  # origin) and exits.\n"
                            "Keys marked runtime can be changed on a running program with qrlctl set.\n\n"
                            "  --model=<string>  default: \"\"\n      model folder\n"
                            "  --k=<int>  default: 4  range: [0, 64]  (runtime)\n      samples\n");
}

Test(program, print_config_shows_the_resolved_config, .init = cr_redirect_stdout) {
    qrl_config_t *cfg;
    resolved = 0;
    cr_assert_eq(qrl_program_start(&RESOLVING, ARGC("--print-config"), ARGS("--print-config"), &cfg, NULL), 0);
    cr_assert_null(cfg);
    cr_assert_eq(resolved, 1);
    fflush(stdout);
    cr_assert_stdout_eq_str("model: \"\"  # default\nk: 9  # resume\n");
}

Test(program, bad_argument_is_one_error_line_and_status_1, .init = cr_redirect_stderr) {
    qrl_config_t *cfg;
    cr_assert_eq(qrl_program_start(&PROGRAM, ARGC("--k=65"), ARGS("--k=65"), &cfg, NULL), 1);
    cr_assert_null(cfg);
    fflush(stderr);
    cr_assert_stderr_eq_str("qrl-test: error: --k=65: k = 65 is outside [0, 64]\n");
}

Test(program, positional_refused_unless_asked_for, .init = cr_redirect_stderr) {
    qrl_config_t *cfg;
    cr_assert_eq(qrl_program_start(&PROGRAM, ARGC("stray"), ARGS("stray"), &cfg, NULL), 1);
    fflush(stderr);
    cr_assert_stderr_eq_str("qrl-test: error: unexpected argument 'stray' (see --help)\n");
    int npos = -1;
    char **argv = ARGS("a", "--k", "1", "b");
    cr_assert_eq(qrl_program_start(&PROGRAM, 5, argv, &cfg, &npos), QRL_PROGRAM_RUN);
    cr_assert_eq(npos, 2);
    cr_assert_str_eq(argv[1], "a");
    cr_assert_str_eq(argv[2], "b");
    qrl_config_destroy(cfg);
}

Test(program, die_prints_the_program_name, .init = cr_redirect_stderr, .exit_code = 1) {
    qrl_config_t *cfg;
    char *argv[] = {"qrl-test", NULL};
    cr_assert_eq(qrl_program_start(&PROGRAM, 1, argv, &cfg, NULL), QRL_PROGRAM_RUN);
    qrl_die("--model is required (%d)", 1);
}

/* --print-config shows only a command line the run would take: a stray word is refused
 * first (a bool key then a word, "--flag maybe", leaves "maybe" stray). */
Test(program, print_config_refuses_a_stray_argument, .init = cr_redirect_stderr) {
    qrl_config_t *cfg;
    cr_assert_eq(qrl_program_start(&PROGRAM, ARGC("--print-config", "stray"), ARGS("--print-config", "stray"), &cfg,
                                   NULL),
                 1);
    cr_assert_null(cfg);
    fflush(stderr);
    cr_assert_stderr_eq_str("qrl-test: error: unexpected argument 'stray' (see --help)\n");
}
