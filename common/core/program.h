/* The main() prelude every qrl program shares: command line -> config -> typed settings.
 *
 * One static description of the program, one call at the top of main():
 *
 *   typedef struct eval_settings { const char *model; int k; ... } eval_settings;
 *   static const qrl_config_entry CONFIG[] = {
 *       QRL_CFG_STRING("model", eval_settings, model, "", false, "model folder (required)"), ...};
 *   static eval_settings S;
 *   static const qrl_program PROGRAM = {
 *       .name = "qrl-eval", .usage = "qrl-eval --model DIR ... [options]\n\n",
 *       .table = CONFIG, .n = sizeof CONFIG / sizeof CONFIG[0], .settings = &S};
 *
 *   int main(int argc, char **argv) {
 *       qrl_config_t *cfg;
 *       int rc = qrl_program_start(&PROGRAM, argc, argv, &cfg, NULL);
 *       if (rc != QRL_PROGRAM_RUN) return rc;  // help, --print-config or an argument error
 *       if (!*S.model) qrl_die("--model is required");
 *       ...
 *       qrl_config_destroy(cfg);
 *   }
 *
 * qrl_program_start does, in order, what the four mains did by hand:
 *   1. .quiet: log threshold WARN unless $QRL_LOG_LEVEL is set (a tool whose stdout is its
 *      output); otherwise the log level stays as core/log.h set it from the environment;
 *   2. qrl_config_parse_args(table, n, ...) (--config FILE, --key=VALUE, --help, ...);
 *      an error prints "NAME: error: MSG" on stderr and returns 1;
 *   3. --help: .usage (if any), then qrl_config_help on stdout, returns 0;
 *      --help-markdown: qrl_config_help_markdown on stdout, returns 0;
 *   4. .resolve(cfg, err), if given: a last change to the resolved config that
 *      --print-config must show (qrl-learner's --resume restoring the run's settings);
 *      an error prints like step 2 and returns 1;
 *   5. --print-config: qrl_config_write on stdout, the config destroyed, returns 0;
 *   6. positional arguments: with npositional NULL any is refused, "NAME: error:
 *      unexpected argument 'ARG' (see --help)", returns 1; else *npositional = their count
 *      (argv[1 ..] holds them, as qrl_config_parse_args leaves them);
 *   7. .settings, if given: qrl_config_bind(cfg, .settings), so every QRL_CFG_* field holds
 *      its resolved value (and follows later qrl_config_set calls: qrlctl set).
 * Only then does it return QRL_PROGRAM_RUN with *cfg the resolved config (the caller
 * destroys it; bound STRING/LIST fields point into it).  On any other return *cfg is NULL
 * and main() returns that value as the exit status, as the programs always have: 0 for
 * help and --print-config, 1 for a bad command line.
 *
 * For qrl-learner and qrl-rollout (their owners migrate): the learner keeps its `export`
 * dispatch and --resume aliasing before the call and passes ld_ckpt_restore_settings as
 * .resolve; the rollout applies its default replica id after the call (qrl_config_apply
 * writes the bound field too).  Both keep their own qrl_config_log line after it.
 *
 * qrl_die / qrl_die_err replace each program's die(): they print "NAME: error: MSG" (NAME
 * from the last qrl_program_start, "qrl" before one) and exit(1).  For main() and the
 * static helpers of a program's own file only (STYLE 1: library code returns a status). */
#ifndef QRL_CORE_PROGRAM_H
#define QRL_CORE_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/config.h"
#include "core/status.h"

/* qrl_program_start's "go on" value: not an exit status (those are >= 0). */
#define QRL_PROGRAM_RUN (-1)

/* A program's description; static data, borrowed by qrl_program_start. */
typedef struct qrl_program {
    const char *name;              /* "qrl-eval": --help's program name, the error prefix */
    const char *usage;             /* printed by --help before the key list; NULL: none */
    const qrl_config_entry *table; /* the program's config table (config.h) */
    size_t n;
    void *settings;                /* struct the table's QRL_CFG_* rows fill; NULL: none */
    bool quiet;                    /* default log threshold WARN (see step 1 above) */
    /* Step 4 above; NULL: none.  Errors as qrl_config_* (the message is printed). */
    qrl_status (*resolve)(qrl_config_t *cfg, qrl_error *err);
} qrl_program;

/* The prelude above.  Returns QRL_PROGRAM_RUN with *cfg owned by the caller, or the exit
 * status main() should return (0 or 1; *cfg NULL), having printed what the user asked
 * for or the error.  npositional: NULL when the program takes no positional argument. */
int qrl_program_start(const qrl_program *p, int argc, char **argv, qrl_config_t **cfg,
                      int *npositional);

/* Print "NAME: error: " + the printf-formatted message + newline on stderr; exit(1). */
_Noreturn void qrl_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* qrl_die("%s", err->msg). */
_Noreturn void qrl_die_err(const qrl_error *err);

#endif
