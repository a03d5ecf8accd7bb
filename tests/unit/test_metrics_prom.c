/* Prometheus registry and /metrics endpoint (common/metrics/prom.h).  Expected texts are
 * written by hand from the exposition-format rules, never produced by the renderer; the
 * HTTP tests talk to the server through a plain socket client. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics/prom.h"
#include "support/http_client.h"

static qrl_prom_registry_t *new_reg(void) {
    qrl_prom_registry_t *r;
    qrl_error err;
    cr_assert_eq(qrl_prom_registry_new(&r, &err), QRL_OK);
    return r;
}

static qrl_prom_series_t *reg(qrl_prom_registry_t *r, qrl_prom_type t, const char *name, const char *help,
                              const char *const *labels, size_t n) {
    qrl_prom_series_t *s;
    qrl_error err;
    qrl_status st = qrl_prom_register(r, t, name, help, labels, n, &s, &err);
    cr_assert_eq(st, QRL_OK, "%s: %s", name, err.msg);
    return s;
}

static char *render(qrl_prom_registry_t *r) {
    char *t;
    size_t len;
    qrl_error err;
    cr_assert_eq(qrl_prom_render(r, &t, &len, &err), QRL_OK);
    cr_assert_eq(strlen(t), len);
    return t;
}

Test(prom, renders_families_in_order_with_help_type_and_labels) {
    qrl_prom_registry_t *r = new_reg();
    qrl_prom_series_t *tok = reg(r, QRL_PROM_COUNTER, "qrl_tokens_total", "Tokens generated.", NULL, 0);
    const char *a[] = {"topic", "prompts"}, *b[] = {"topic", "results"};
    qrl_prom_series_t *qa = reg(r, QRL_PROM_GAUGE, "qrl_queue", "Queued records.", a, 1);
    qrl_prom_series_t *qb = reg(r, QRL_PROM_GAUGE, "qrl_queue", "Queued records.", b, 1);
    qrl_prom_add(tok, 5);
    qrl_prom_add(tok, 37);
    qrl_prom_set(qa, 3);
    qrl_prom_set(qb, -0.25);
    char *t = render(r);
    cr_expect_str_eq(t,
                     "# HELP qrl_tokens_total Tokens generated.\n"
                     "# TYPE qrl_tokens_total counter\n"
                     "qrl_tokens_total 42\n"
                     "# HELP qrl_queue Queued records.\n"
                     "# TYPE qrl_queue gauge\n"
                     "qrl_queue{topic=\"prompts\"} 3\n"
                     "qrl_queue{topic=\"results\"} -0.25\n");
    cr_expect_eq(qrl_prom_get(tok), 42.0);
    free(t);
    qrl_prom_registry_destroy(r);
}

Test(prom, escapes_label_values_and_help) {
    qrl_prom_registry_t *r = new_reg();
    const char *l[] = {"path", "C:\\dir\n\"x\"", "empty", ""};
    qrl_prom_set(reg(r, QRL_PROM_GAUGE, "g", "line one\nback\\slash \"quoted\"", l, 2), 1);
    char *t = render(r);
    /* HELP escapes backslash and newline only; label values also the double quote */
    cr_expect_str_eq(t,
                     "# HELP g line one\\nback\\\\slash \"quoted\"\n"
                     "# TYPE g gauge\n"
                     "g{path=\"C:\\\\dir\\n\\\"x\\\"\",empty=\"\"} 1\n");
    free(t);
    qrl_prom_registry_destroy(r);
}

Test(prom, value_spellings) {
    qrl_prom_registry_t *r = new_reg();
    const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    double vals[] = {0.1, 1e300, NAN, INFINITY, -INFINITY, 123456789012345678.0, 0, 2.5e-7};
    const char *want[] = {"0.1", "1e+300", "NaN", "+Inf", "-Inf", "1.2345678901234568e+17", "0", "2.5e-07"};
    for (int i = 0; i < 8; i++) qrl_prom_set(reg(r, QRL_PROM_GAUGE, names[i], "", NULL, 0), vals[i]);
    char *t = render(r);
    for (int i = 0; i < 8; i++) {
        char line[80];
        snprintf(line, sizeof line, "\n%s %s\n", names[i], want[i]);
        cr_expect(strstr(t, line) != NULL, "missing '%s' in:\n%s", line + 1, t);
    }
    free(t);
    qrl_prom_registry_destroy(r);
}

Test(prom, registration_errors) {
    qrl_prom_registry_t *r = new_reg();
    qrl_prom_series_t *s;
    qrl_error err;
    const char *ok[] = {"k", "v"}, *reserved[] = {"__name", "v"}, *badl[] = {"1x", "v"},
               *twice[] = {"k", "a", "k", "b"};
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "9lives", "", NULL, 0, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "9lives") != NULL, "%s", err.msg);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "a-b", "", NULL, 0, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "", "", NULL, 0, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "m", "", reserved, 1, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "__name") != NULL, "%s", err.msg);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "m", "", badl, 1, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "m", "", twice, 2, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "given twice") != NULL, "%s", err.msg);
    cr_expect_null(s);
    /* a family keeps its type and help; a label set is registered once */
    reg(r, QRL_PROM_GAUGE, "ns:m", "help", ok, 1);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_COUNTER, "ns:m", "help", NULL, 0, &s, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "another type") != NULL, "%s", err.msg);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "ns:m", "other", NULL, 0, &s, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "help") != NULL, "%s", err.msg);
    cr_expect_eq(qrl_prom_register(r, QRL_PROM_GAUGE, "ns:m", "help", ok, 1, &s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "registered twice") != NULL, "%s", err.msg);
    /* nothing of the refused registrations shows */
    char *t = render(r);
    cr_expect_str_eq(t, "# HELP ns:m help\n# TYPE ns:m gauge\nns:m{k=\"v\"} 0\n");
    free(t);
    qrl_prom_registry_destroy(r);
}

Test(prom, negative_add_to_counter_is_a_bug, .signal = SIGABRT) {
    qrl_prom_registry_t *r = new_reg();
    qrl_prom_add(reg(r, QRL_PROM_COUNTER, "c_total", "", NULL, 0), -1);
}

typedef struct adder {
    qrl_prom_series_t *c, *g;
} adder;

static void *add_many(void *p) {
    adder *a = p;
    for (int i = 0; i < 100000; i++) {
        qrl_prom_add(a->c, 1);
        qrl_prom_add(a->g, i % 2 ? 0.5 : -0.5);
    }
    return NULL;
}

Test(prom, concurrent_adds_lose_nothing) {
    qrl_prom_registry_t *r = new_reg();
    adder a = {reg(r, QRL_PROM_COUNTER, "c_total", "", NULL, 0), reg(r, QRL_PROM_GAUGE, "g", "", NULL, 0)};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, add_many, &a);
    for (int i = 0; i < 20; i++) free(render(r)); /* rendering meanwhile is allowed */
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    cr_expect_eq(qrl_prom_get(a.c), 400000.0);
    cr_expect_eq(qrl_prom_get(a.g), 0.0);
    qrl_prom_registry_destroy(r);
}

/* ---- HTTP ---------------------------------------------------------------------------- */

Test(prom_http, serves_metrics_404_405_and_head) {
    qrl_prom_registry_t *r = new_reg();
    const char *l[] = {"replica", "r\"1"};
    qrl_prom_series_t *v = reg(r, QRL_PROM_GAUGE, "qrl_rollout_version", "Policy version.", l, 1);
    qrl_prom_set(v, 7);
    qrl_prom_server_t *s;
    qrl_error err;
    cr_assert_eq(qrl_prom_server_start(r, "127.0.0.1:0", &s, &err), QRL_OK, "%s", err.msg);
    int port = qrl_prom_server_port(s);
    cr_assert(port > 0 && port < 65536, "port %d", port);

    const char *want = "# HELP qrl_rollout_version Policy version.\n"
                       "# TYPE qrl_rollout_version gauge\n"
                       "qrl_rollout_version{replica=\"r\\\"1\"} 7\n";
    char *resp = qrl_test_http(port, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    cr_expect(strncmp(resp, "HTTP/1.0 200", 12) == 0 || strncmp(resp, "HTTP/1.1 200", 12) == 0, "%s", resp);
    cr_expect(strstr(resp, "Content-Type: text/plain; version=0.0.4") != NULL, "%s", resp);
    cr_expect_str_eq(qrl_test_http_body(resp), want);
    free(resp);

    qrl_prom_set(v, 8.5); /* a later scrape sees the new value */
    resp = qrl_test_http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    cr_expect(strstr(qrl_test_http_body(resp), "qrl_rollout_version{replica=\"r\\\"1\"} 8.5\n") != NULL, "%s", resp);
    free(resp);

    resp = qrl_test_http(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
    cr_expect(strstr(resp, " 200 ") != NULL, "%s", resp);
    cr_expect_str_eq(qrl_test_http_body(resp), "");
    free(resp);

    resp = qrl_test_http(port, "GET /other HTTP/1.0\r\n\r\n");
    cr_expect(strstr(resp, " 404 ") != NULL, "%s", resp);
    free(resp);
    resp = qrl_test_http(port, "GET /metrics/x HTTP/1.0\r\n\r\n");
    cr_expect(strstr(resp, " 404 ") != NULL, "%s", resp);
    free(resp);

    resp = qrl_test_http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    cr_expect(strstr(resp, " 405 ") != NULL, "%s", resp);
    cr_expect(strstr(resp, "Allow: GET, HEAD") != NULL, "%s", resp);
    free(resp);
    resp = qrl_test_http(port, "DELETE /metrics HTTP/1.0\r\n\r\n");
    cr_expect(strstr(resp, " 405 ") != NULL, "%s", resp);
    free(resp);

    qrl_prom_server_stop(s);
    /* the port is free again: stop closed the listening socket */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_expect_neq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "still listening after stop");
    close(fd);
    qrl_prom_registry_destroy(r);
}

Test(prom_http, bad_addresses_and_busy_port) {
    qrl_prom_registry_t *r = new_reg();
    qrl_prom_server_t *s;
    qrl_error err;
    const char *bad[] = {"127.0.0.1", "127.0.0.1:", ":9100", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:9x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(qrl_prom_server_start(r, bad[i], &s, &err), QRL_STATUS_INVALID_ARGUMENT, "%s", bad[i]);
        cr_expect(strstr(err.msg, "metrics address") != NULL, "%s", err.msg);
        cr_expect_null(s);
    }
    qrl_prom_server_t *first;
    cr_assert_eq(qrl_prom_server_start(r, "127.0.0.1:0", &first, &err), QRL_OK, "%s", err.msg);
    char again[64];
    snprintf(again, sizeof again, "127.0.0.1:%d", qrl_prom_server_port(first));
    cr_expect_eq(qrl_prom_server_start(r, again, &s, &err), QRL_STATUS_NETWORK);
    cr_expect(strstr(err.msg, "bind") != NULL, "%s", err.msg);
    qrl_prom_server_stop(first);
    qrl_prom_server_stop(NULL);
    qrl_prom_registry_destroy(r);
}
