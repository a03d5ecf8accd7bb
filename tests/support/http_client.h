/* A plain-socket HTTP/1.0 client for the tests of the /metrics endpoints (no libcurl:
 * the request bytes are exactly what the test writes).  Header-only (static inline). */
#ifndef QRL_TESTS_SUPPORT_HTTP_CLIENT_H
#define QRL_TESTS_SUPPORT_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One HTTP/1.0 exchange with 127.0.0.1:port; returns the whole response (malloc'd). */
static inline char *qrl_test_http(int port, const char *request) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect to port %d", port);
    size_t n = strlen(request);
    cr_assert_eq(write(fd, request, n), (ssize_t)n);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1024 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

static inline const char *qrl_test_http_body(const char *resp) {
    const char *b = strstr(resp, "\r\n\r\n");
    cr_assert(b, "no header end in: %s", resp);
    return b + 4;
}

#endif
