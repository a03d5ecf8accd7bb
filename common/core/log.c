#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* INFO until set; DEBUG-level callers see the env override through the first write. */
int qrl_log_threshold_ = QRL_LOG_LEVEL_INFO;

static const char *level_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

int qrl_log_level_parse(const char *name) {
    static const char *lower[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i <= QRL_LOG_LEVEL_OFF; i++)
        if (name && strcasecmp(name, lower[i]) == 0) return i;
    return -1;
}

void qrl_log_set_level(qrl_log_level level) { qrl_log_threshold_ = (int)level; }

/* Read QRL_LOG_LEVEL once, before main, so the macros' check is right from the start. */
__attribute__((constructor)) static void log_init_from_env(void) {
    int lv = qrl_log_level_parse(getenv("QRL_LOG_LEVEL"));
    if (lv >= 0) qrl_log_threshold_ = lv;
}

void qrl_log_write_(qrl_log_level level, const char *tag, const char *fmt, ...) {
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], tag ? tag : "-");
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) n += vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    line[n] = '\n';
    /* one write per line so concurrent threads do not interleave inside a line */
    fwrite(line, 1, (size_t)n + 1, stderr);
}
