/* qrl-verify: score one response (stdin) with a named verifier (SPEC §7).
 *
 *   echo 'so #### 18' | qrl-verify --task gsm8k --reference 18
 *   {"reward": 1.0, "correct": true, "found": true, "extracted": "18"}
 *
 * Exit status: 0 scored (whatever the reward), 1 an error: a usage error (unknown task,
 * missing option; as every qrl program), the reference was rejected or reading failed. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "verify/verify.h"

#define STDIN_MAX (64u << 20) /* a response longer than this is not a response */

static void usage(FILE *f) {
    fprintf(f,
            "usage: qrl-verify --task NAME --reference REF [--format-reward F] < response\n"
            "\n"
            "Scores the response read from stdin against REF and prints one JSON line:\n"
            "  {\"reward\": R, \"correct\": B, \"found\": B, \"extracted\": \"...\"}\n"
            "\n"
            "  --task NAME          verifier to use (below)\n"
            "  --reference REF      reference answer (format per task: docs/verifiers.md)\n"
            "  --format-reward F    reward for a found but wrong answer (default 0)\n"
            "  --help               this text\n"
            "\n"
            "tasks:\n");
    for (size_t i = 0; i < qrl_verifier_count(); i++) {
        const qrl_verifier *v = qrl_verifier_at(i);
        fprintf(f, "  %-10s %s\n", v->name, v->summary);
    }
    fprintf(f, "\nexit status: 0 scored, 1 an error (usage error, bad reference or read error)\n");
}

static void known_tasks(FILE *f) {
    for (size_t i = 0; i < qrl_verifier_count(); i++)
        fprintf(f, "%s%s", i ? ", " : "", qrl_verifier_at(i)->name);
}

/* Whole stdin as a NUL-terminated string (NULs inside end the response early, as
 * they would for the daemon's C strings). */
static char *read_stdin(void) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len + 1 == cap) {
            if (cap >= STDIN_MAX) { free(buf); errno = EFBIG; return NULL; }
            char *p = realloc(buf, cap * 2);
            if (!p) { free(buf); return NULL; }
            buf = p;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, stdin);
        len += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) { free(buf); return NULL; }
    buf[len] = '\0';
    return buf;
}

/* JSON strings must be UTF-8: invalid bytes become U+FFFD. */
static json_t *json_string_lossy(const char *s) {
    size_t n = strlen(s), o = 0;
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

int main(int argc, char **argv) {
    const char *task = NULL, *reference = NULL;
    double format_reward = 0.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        const char *val = NULL;
        size_t k = 0;
        const char *opts[] = {"--task", "--reference", "--format-reward"};
        for (size_t o = 0; o < 3 && !val; o++) {
            k = strlen(opts[o]);
            if (strncmp(a, opts[o], k) != 0) continue;
            if (a[k] == '=') val = a + k + 1;
            else if (a[k] == '\0' && i + 1 < argc) val = argv[++i];
            else if (a[k] == '\0') {
                fprintf(stderr, "qrl-verify: error: option %s needs a value\n", opts[o]);
                return 1; /* usage error (every qrl program: 1) */
            }
        }
        if (!val) {
            fprintf(stderr, "qrl-verify: error: unknown argument '%s' (see --help)\n", a);
            return 1; /* usage error (every qrl program: 1) */
        }
        if (strncmp(a, "--task", 6) == 0) task = val;
        else if (strncmp(a, "--reference", 11) == 0) reference = val;
        else {
            char *end;
            format_reward = strtod(val, &end);
            if (end == val || *end != '\0' || !(format_reward >= 0.0 && format_reward <= 1.0)) {
                fprintf(stderr, "qrl-verify: error: --format-reward '%s' is not a number in [0, 1]\n", val);
                return 1; /* usage error (every qrl program: 1) */
            }
        }
    }
    if (!task || !reference) {
        fprintf(stderr, "qrl-verify: error: --task and --reference are required (see --help)\n");
        return 1; /* usage error (every qrl program: 1) */
    }
    const qrl_verifier *v = qrl_verifier_find(task);
    if (!v) {
        fprintf(stderr, "qrl-verify: error: unknown task '%s'; known tasks: ", task);
        known_tasks(stderr);
        fprintf(stderr, "\n");
        return 1; /* usage error (every qrl program: 1) */
    }
    char *response = read_stdin();
    if (!response) {
        fprintf(stderr, "qrl-verify: reading the response from stdin: %s\n", strerror(errno));
        return 1;
    }
    qrl_verify_result r;
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status st = v->score(response, reference, &r, &err);
    free(response);
    if (st != QRL_OK) {
        fprintf(stderr, "qrl-verify: %s: %s\n", qrl_status_name(st), err.msg);
        return 1;
    }
    json_t *o = json_object();
    json_object_set_new(o, "reward", json_real(qrl_verify_shaped_reward(&r, format_reward)));
    json_object_set_new(o, "correct", json_boolean(r.correct));
    json_object_set_new(o, "found", json_boolean(r.found));
    json_object_set_new(o, "extracted", json_string_lossy(r.extracted));
    char *line = json_dumps(o, JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!line) {
        fprintf(stderr, "qrl-verify: out of memory\n");
        return 1;
    }
    printf("%s\n", line);
    /* a full disk or a closed pipe must not look like success */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "qrl-verify: writing the result to stdout failed: %s\n", strerror(errno));
        free(line);
        return 1;
    }
    free(line);
    return 0;
}
