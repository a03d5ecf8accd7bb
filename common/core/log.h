/* Structured logging to stderr (STYLE 12).
 *
 * One line per event:  2026-11-29T20:01:02.123Z INFO  [rollout] msg key=value ...
 * The level check happens before the arguments are evaluated.  Metrics are not logs:
 * they go through the metrics module. */
#ifndef QRL_CORE_LOG_H
#define QRL_CORE_LOG_H

typedef enum qrl_log_level {
    QRL_LOG_LEVEL_DEBUG = 0,
    QRL_LOG_LEVEL_INFO,
    QRL_LOG_LEVEL_WARN,
    QRL_LOG_LEVEL_ERROR,
    QRL_LOG_LEVEL_OFF,
} qrl_log_level;

/* Process-wide threshold; default INFO, or QRL_LOG_LEVEL=debug|info|warn|error|off
 * from the environment at the first log call. Thread-safe to read. */
extern int qrl_log_threshold_;
void qrl_log_set_level(qrl_log_level level);
/* Parse "debug"/"info"/"warn"/"error"/"off"; returns -1 when unknown. */
int qrl_log_level_parse(const char *name);

/* `fmt` is the message followed by key=value fields, e.g.
 *   QRL_LOG_INFO("kafka", "connected broker=%s partitions=%d", host, n); */
void qrl_log_write_(qrl_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define QRL_LOG_(level, tag, ...)                                        \
    do {                                                                 \
        if ((int)(level) >= qrl_log_threshold_)                          \
            qrl_log_write_((level), (tag), __VA_ARGS__);                 \
    } while (0)
#define QRL_LOG_DEBUG(tag, ...) QRL_LOG_(QRL_LOG_LEVEL_DEBUG, tag, __VA_ARGS__)
#define QRL_LOG_INFO(tag, ...)  QRL_LOG_(QRL_LOG_LEVEL_INFO, tag, __VA_ARGS__)
#define QRL_LOG_WARN(tag, ...)  QRL_LOG_(QRL_LOG_LEVEL_WARN, tag, __VA_ARGS__)
#define QRL_LOG_ERROR(tag, ...) QRL_LOG_(QRL_LOG_LEVEL_ERROR, tag, __VA_ARGS__)

#endif
