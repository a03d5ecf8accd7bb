/* Fuzz target for common/tokenizer/.
 * First byte 0: the rest is a tokenizer.json, loaded through a memfd (must load or fail
 * with a message, never crash).  Otherwise the rest is text: encoded by a byte-level
 * tokenizer (tests/fixtures/tokenizer/bl_qwen) and by llama2.c's tok512.bin; valid UTF-8
 * must decode back to its NFC form (byte-level) or to itself (llama2.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"

static qrl_tokenizer *g_bl, *g_l2;

static void load_fixed(void) {
    static int done;
    if (done) return;
    done = 1;
    qrl_error err;
    const char *d = getenv("QRL_DATA_DIR");
    char p[1024];
    snprintf(p, sizeof p, "%s/llama2c_stories260K/tok512.bin", d ? d : "../shared/data");
    if (qrl_tokenizer_load("tests/fixtures/tokenizer/bl_qwen", 0, &g_bl, &err) != QRL_OK) g_bl = NULL;
    if (qrl_tokenizer_load(p, 512, &g_l2, &err) != QRL_OK) g_l2 = NULL;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t l = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

static void check_roundtrip(const qrl_tokenizer *t, const uint8_t *s, size_t n, int nfc, int bos) {
    qrl_error err;
    int32_t *ids = NULL;
    size_t m = 0;
    if (qrl_tokenizer_encode(t, (const char *)s, n, bos, 0, &ids, &m, &err) != QRL_OK) return;
    char *out = NULL;
    if (qrl_tokenizer_decode(t, ids, m, 1, &out, &err) != QRL_OK) __builtin_trap();
    utf8proc_uint8_t *want = NULL;
    if (nfc) {
        if (utf8proc_map(s, (utf8proc_ssize_t)n, &want, UTF8PROC_STABLE | UTF8PROC_COMPOSE) < 0) goto done;
    } else {
        want = malloc(n + 1);
        memcpy(want, s, n);
        want[n] = 0;
    }
    /* an embedded NUL ends the C strings on both sides alike */
    if (strcmp(out, (const char *)want) != 0) __builtin_trap();
done:
    free(want);
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] == 0) {
        int fd = memfd_create("tokenizer.json", 0);
        if (fd < 0) return 0;
        if (write(fd, data + 1, size - 1) == (ssize_t)(size - 1)) {
            char path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            qrl_error err;
            qrl_tokenizer *t = NULL;
            if (qrl_tokenizer_load(path, 0, &t, &err) == QRL_OK) {
                int32_t *ids = NULL;
                size_t m = 0;
                if (qrl_tokenizer_encode(t, "Hello world <|x|> 12", 20, 1, 1, &ids, &m, &err) == QRL_OK) {
                    char *s = NULL;
                    if (qrl_tokenizer_decode(t, ids, m, 0, &s, &err) != QRL_OK) __builtin_trap();
                    free(s);
                }
                free(ids);
                qrl_tokenizer_free(t);
            } else if (err.msg[0] == '\0') {
                __builtin_trap(); /* a failure must say why */
            }
        }
        close(fd);
        return 0;
    }
    load_fixed();
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    if (memchr(s, 0, n)) return 0;
    if (g_bl && valid_utf8(s, n)) {
        /* valid UTF-8 only: the byte-level tokenizer refuses anything else */
        qrl_error err;
        int32_t *ids = NULL;
        size_t m = 0;
        qrl_status st = qrl_tokenizer_encode(g_bl, (const char *)s, n, 0, 0, &ids, &m, &err);
        free(ids);
        if (st == QRL_OK) check_roundtrip(g_bl, s, n, 1, 0);
    }
    if (g_l2) check_roundtrip(g_l2, s, n, 0, 1);
    return 0;
}
