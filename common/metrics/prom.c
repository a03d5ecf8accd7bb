/* Prometheus registry and /metrics endpoint (metrics/prom.h).
 *
 * A series keeps its value as the bit pattern of a double in an _Atomic uint64_t, so an
 * update is one store (set) or one compare-and-swap loop (add) and never takes the
 * registry's mutex; the mutex only guards the family list (register, render).  Label
 * sets are escaped once at registration into the `{a="b"}` text the renderer prints. */
#include "metrics/prom.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/log.h"

struct qrl_prom_series {
    _Atomic uint64_t bits; /* a double's bits */
    qrl_prom_type type;
    char *labels;          /* "" or {name="escaped value",...} */
};

typedef struct prom_family {
    struct prom_family *next;
    char *name, *help;
    qrl_prom_type type;
    qrl_prom_series_t **series;
    size_t n, cap;
} prom_family;

struct qrl_prom_registry {
    pthread_mutex_t mu;
    prom_family *head, *tail;
};

/* ---- growable text ------------------------------------------------------------------ */

typedef qrl_buf sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) { qrl_buf_append(b, s, n); }
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* HELP text escapes '\' and newline; label values also escape '"'. */
static void sb_escaped(sbuf *b, const char *s, bool quote) {
    for (; *s; s++) {
        if (*s == '\\') sb_add(b, "\\\\", 2);
        else if (*s == '\n') sb_add(b, "\\n", 2);
        else if (*s == '"' && quote) sb_add(b, "\\\"", 2);
        else sb_add(b, s, 1);
    }
}

/* ---- registry ----------------------------------------------------------------------- */

qrl_status qrl_prom_registry_new(qrl_prom_registry_t **out, qrl_error *err) {
    *out = NULL;
    qrl_prom_registry_t *r = calloc(1, sizeof *r);
    if (!r) return qrl_error_set(err, QRL_STATUS_NOMEM, "prometheus registry: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return QRL_OK;
}

void qrl_prom_registry_destroy(qrl_prom_registry_t *r) {
    if (!r) return;
    for (prom_family *f = r->head, *next; f; f = next) {
        next = f->next;
        for (size_t i = 0; i < f->n; i++) {
            free(f->series[i]->labels);
            free(f->series[i]);
        }
        free(f->series);
        free(f->name);
        free(f->help);
        free(f);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static bool name_ok(const char *s, bool colon) {
    if (!s || !*s) return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
        if (!alpha && !(p > s && c >= '0' && c <= '9')) return false;
    }
    return true;
}

static qrl_status labels_text(const char *name, const char *const *labels, size_t n, char **out,
                              qrl_error *err) {
    *out = NULL;
    sbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        const char *ln = labels[2 * i], *lv = labels[2 * i + 1];
        if (!name_ok(ln, false) || strncmp(ln, "__", 2) == 0) {
            free(b.p);
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric %s: label %zu: bad label name '%s'",
                                 name, i, ln ? ln : "(null)");
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(labels[2 * k], ln) == 0) {
                free(b.p);
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric %s: label '%s' given twice",
                                     name, ln);
            }
        sb_str(&b, i ? "," : "{");
        sb_str(&b, ln);
        sb_str(&b, "=\"");
        sb_escaped(&b, lv ? lv : "", true);
        sb_str(&b, "\"");
    }
    if (n) sb_str(&b, "}");
    else sb_add(&b, "", 0);
    if (b.oom || !b.p) {
        free(b.p);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "metric %s: out of memory", name);
    }
    *out = b.p;
    return QRL_OK;
}

qrl_status qrl_prom_register(qrl_prom_registry_t *r, qrl_prom_type type, const char *name,
                             const char *help, const char *const *labels, size_t n_labels,
                             qrl_prom_series_t **out, qrl_error *err) {
    *out = NULL;
    if (!name_ok(name, true))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric name '%s': expected [a-zA-Z_:][a-zA-Z0-9_:]*",
                             name ? name : "(null)");
    if (type != QRL_PROM_COUNTER && type != QRL_PROM_GAUGE)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric %s: unknown type %d", name, (int)type);
    if (!help) help = "";
    char *lt;
    QRL_TRY(labels_text(name, labels, n_labels, &lt, err));
    qrl_status st = QRL_OK;
    pthread_mutex_lock(&r->mu);
    prom_family *f = r->head;
    while (f && strcmp(f->name, name) != 0) f = f->next;
    if (f && (f->type != type || strcmp(f->help, help) != 0)) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric %s: registered before with another %s",
                           name, f->type != type ? "type" : "help text");
        goto done;
    }
    for (size_t i = 0; f && i < f->n; i++)
        if (strcmp(f->series[i]->labels, lt) == 0) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metric %s%s: registered twice", name, lt);
            goto done;
        }
    if (!f) {
        f = calloc(1, sizeof *f);
        if (!f || !(f->name = strdup(name)) || !(f->help = strdup(help))) {
            if (f) free(f->name);
            free(f);
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "metric %s: out of memory", name);
            goto done;
        }
        f->type = type;
        if (r->tail) r->tail->next = f;
        else r->head = f;
        r->tail = f;
    }
    if (f->n == f->cap) {
        size_t c = f->cap ? 2 * f->cap : 4;
        qrl_prom_series_t **ns = realloc(f->series, c * sizeof *ns);
        if (!ns) {
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "metric %s: out of memory", name);
            goto done;
        }
        f->series = ns;
        f->cap = c;
    }
    qrl_prom_series_t *s = calloc(1, sizeof *s);
    if (!s) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "metric %s: out of memory", name);
        goto done;
    }
    s->type = type;
    s->labels = lt;
    lt = NULL;
    atomic_init(&s->bits, 0); /* +0.0 */
    f->series[f->n++] = s;
    *out = s;
done:
    pthread_mutex_unlock(&r->mu);
    free(lt);
    return st;
}

static uint64_t to_bits(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}
static double from_bits(uint64_t b) {
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

void qrl_prom_set(qrl_prom_series_t *s, double v) { atomic_store_explicit(&s->bits, to_bits(v), memory_order_relaxed); }

void qrl_prom_add(qrl_prom_series_t *s, double v) {
    QRL_CHECK(s->type != QRL_PROM_COUNTER || !(v < 0));
    uint64_t old = atomic_load_explicit(&s->bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&s->bits, &old, to_bits(from_bits(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

double qrl_prom_get(const qrl_prom_series_t *s) {
    return from_bits(atomic_load_explicit(&((qrl_prom_series_t *)s)->bits, memory_order_relaxed));
}

/* Shortest of %.15g / %.17g that reads back exactly; Prometheus' spellings of the
 * non-finite values. */
static void format_value(double v, char buf[40]) {
    if (isnan(v)) snprintf(buf, 40, "NaN");
    else if (isinf(v)) snprintf(buf, 40, v > 0 ? "+Inf" : "-Inf");
    else {
        snprintf(buf, 40, "%.15g", v);
        if (strtod(buf, NULL) != v) snprintf(buf, 40, "%.17g", v);
    }
}

qrl_status qrl_prom_render(qrl_prom_registry_t *r, char **out, size_t *len, qrl_error *err) {
    *out = NULL;
    *len = 0;
    sbuf b = {0};
    sb_add(&b, "", 0);
    pthread_mutex_lock(&r->mu);
    for (const prom_family *f = r->head; f; f = f->next) {
        sb_str(&b, "# HELP ");
        sb_str(&b, f->name);
        sb_str(&b, " ");
        sb_escaped(&b, f->help, false);
        sb_str(&b, "\n# TYPE ");
        sb_str(&b, f->name);
        sb_str(&b, f->type == QRL_PROM_COUNTER ? " counter\n" : " gauge\n");
        for (size_t i = 0; i < f->n; i++) {
            char v[40];
            format_value(qrl_prom_get(f->series[i]), v);
            sb_str(&b, f->name);
            sb_str(&b, f->series[i]->labels);
            sb_str(&b, " ");
            sb_str(&b, v);
            sb_str(&b, "\n");
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (b.oom) {
        free(b.p);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "prometheus render: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return QRL_OK;
}

/* ---- HTTP endpoint ------------------------------------------------------------------ */

struct qrl_prom_server {
    struct MHD_Daemon *mhd;
    qrl_prom_registry_t *reg;
    int port;
};

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned code, const char *text,
                                  const char *allow) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result rc = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    qrl_prom_server_t *s = cls;
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0, head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!get && !head) return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", "GET, HEAD");
    if (strcmp(url, "/metrics") != 0) return reply_text(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n", NULL);
    char *text;
    size_t len;
    qrl_error err;
    if (qrl_prom_render(s->reg, &text, &len, &err) != QRL_OK)
        return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Bind and listen on `where` ourselves so port 0 works and the bound port is known. */
static qrl_status open_listener(const char *where, int *fd_out, char *addr, size_t addr_len, int *port,
                                qrl_error *err) {
    const char *colon = where ? strrchr(where, ':') : NULL;
    if (!colon || colon == where || !colon[1] || strlen(where) >= 300)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metrics address '%s': expected host:port",
                             where ? where : "(null)");
    char host[300];
    size_t hl = (size_t)(colon - where);
    memcpy(host, where, hl);
    host[hl] = 0;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || errno || colon[1] == '-' || colon[1] == '+')
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "metrics address '%s': port '%s' is not 0..65535",
                             where, colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE}, *res = NULL;
    int gr = getaddrinfo(host, colon + 1, &hints, &res);
    if (gr != 0)
        return qrl_error_set(err, QRL_STATUS_NETWORK, "metrics address '%s': cannot resolve '%s': %s", where,
                             host, gai_strerror(gr));
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) { e = errno; continue; }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return qrl_error_set(err, QRL_STATUS_NETWORK, "metrics address '%s': bind/where: %s", where, strerror(e));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char num[INET6_ADDRSTRLEN] = "?";
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, num, sizeof num);
        *port = ntohs(a->sin6_port);
        snprintf(addr, addr_len, "[%s]:%d", num, *port);
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, num, sizeof num);
        *port = ntohs(a->sin_port);
        snprintf(addr, addr_len, "%s:%d", num, *port);
    }
    *fd_out = fd;
    return QRL_OK;
}

qrl_status qrl_prom_server_start(qrl_prom_registry_t *r, const char *where, qrl_prom_server_t **out,
                                 qrl_error *err) {
    *out = NULL;
    int fd = -1;
    char addr[340];
    qrl_prom_server_t *s = calloc(1, sizeof *s);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "metrics server: out of memory");
    s->reg = r;
    qrl_status st = open_listener(where, &fd, addr, sizeof addr, &s->port, err);
    if (st != QRL_OK) {
        free(s);
        return st;
    }
    /* One internal polling thread is plenty for a scrape every few seconds; the
     * connection limit and timeout keep a stuck client from holding resources. */
    s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, on_request, s,
                              MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, 32u,
                              MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!s->mhd) {
        close(fd);
        free(s);
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "metrics address '%s': libmicrohttpd did not start", where);
    }
    QRL_LOG_INFO("metrics", "metrics listening addr=%s", addr);
    *out = s;
    return QRL_OK;
}

int qrl_prom_server_port(const qrl_prom_server_t *s) { return s->port; }

void qrl_prom_server_stop(qrl_prom_server_t *s) {
    if (!s) return;
    MHD_stop_daemon(s->mhd); /* closes the listening socket too */
    free(s);
}
