#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"

static int evaluated;
static int side_effect(void) { return ++evaluated; }

Test(log, level_names_parse) {
    cr_assert_eq(qrl_log_level_parse("debug"), QRL_LOG_LEVEL_DEBUG);
    cr_assert_eq(qrl_log_level_parse("WARN"), QRL_LOG_LEVEL_WARN);
    cr_assert_eq(qrl_log_level_parse("off"), QRL_LOG_LEVEL_OFF);
    cr_assert_eq(qrl_log_level_parse("loud"), -1);
    cr_assert_eq(qrl_log_level_parse(NULL), -1);
}

Test(log, arguments_not_evaluated_below_threshold) {
    qrl_log_set_level(QRL_LOG_LEVEL_WARN);
    evaluated = 0;
    QRL_LOG_DEBUG("test", "x=%d", side_effect());
    QRL_LOG_INFO("test", "x=%d", side_effect());
    cr_assert_eq(evaluated, 0);
    QRL_LOG_ERROR("test", "x=%d", side_effect());
    cr_assert_eq(evaluated, 1);
}

Test(log, one_line_with_level_tag_and_fields, .init = cr_redirect_stderr) {
    qrl_log_set_level(QRL_LOG_LEVEL_INFO);
    QRL_LOG_INFO("kafka", "connected broker=%s partitions=%d", "127.0.0.1:19092", 4);
    QRL_LOG_DEBUG("kafka", "hidden=1");
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    char line[512] = {0}, extra[64] = {0};
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_null(fgets(extra, sizeof extra, f), "debug line leaked: %s", extra);
    /* 2026-11-29T20:01:02.123Z INFO  [kafka] connected broker=... */
    cr_assert_eq(strlen(line) > 25 && line[4] == '-' && line[10] == 'T' && line[23] == 'Z', 1, "%s", line);
    cr_assert(strstr(line, " INFO  [kafka] connected broker=127.0.0.1:19092 partitions=4\n"), "%s", line);
}
