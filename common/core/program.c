/* The shared main() prelude (program.h). */
#include "core/program.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"

static const char *program_name = "qrl"; /* qrl_die's prefix */

static void vprint_error(const char *fmt, va_list ap) {
    fprintf(stderr, "%s: error: ", program_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    return 1;
}

_Noreturn void qrl_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    exit(1);
}

_Noreturn void qrl_die_err(const qrl_error *err) { qrl_die("%s", err->msg); }

int qrl_program_start(const qrl_program *p, int argc, char **argv, qrl_config_t **cfg,
                      int *npositional) {
    QRL_CHECK(p != NULL && p->name != NULL && cfg != NULL);
    *cfg = NULL;
    program_name = p->name;
    if (p->quiet && !getenv("QRL_LOG_LEVEL")) qrl_log_set_level(QRL_LOG_LEVEL_WARN);
    qrl_config_t *c;
    qrl_config_action action;
    int npos;
    qrl_error err;
    if (qrl_config_parse_args(p->table, p->n, argc, argv, &c, &action, &npos, &err) != QRL_OK)
        return fail("%s", err.msg);
    if (action == QRL_CONFIG_ACTION_HELP) {
        if (p->usage) fputs(p->usage, stdout);
        qrl_config_help(p->table, p->n, p->name, stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_HELP_MARKDOWN) {
        qrl_config_help_markdown(p->table, p->n, p->name, stdout);
        return 0;
    }
    if (p->resolve && p->resolve(c, &err) != QRL_OK) {
        qrl_config_destroy(c);
        return fail("%s", err.msg);
    }
    /* a stray argument is refused before --print-config, so that a command line the run
     * would refuse ("--loss.acr maybe": a bool, then a word) is not shown as valid */
    if (npos > 0 && !npositional) {
        int rc = fail("unexpected argument '%s' (see --help)", argv[1]);
        qrl_config_destroy(c);
        return rc;
    }
    if (action == QRL_CONFIG_ACTION_PRINT_CONFIG) { /* the resolved config as YAML, nothing run */
        qrl_config_write(c, stdout);
        qrl_config_destroy(c);
        return 0;
    }
    if (npositional) *npositional = npos;
    if (p->settings) qrl_config_bind(c, p->settings);
    *cfg = c;
    return QRL_PROGRAM_RUN;
}
