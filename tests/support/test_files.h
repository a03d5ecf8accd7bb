/* Test helpers for files: a private temp folder, writing raw bytes, the shared data path.
 * Header-only (static inline) so that each test takes only what it uses. */
#ifndef QRL_TESTS_SUPPORT_TEST_FILES_H
#define QRL_TESTS_SUPPORT_TEST_FILES_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Create a fresh folder /tmp/qrl-test-XXXXXX into buf (at least 64 bytes). */
static inline void qrl_test_mkdtemp(char *buf) {
    strcpy(buf, "/tmp/qrl-test-XXXXXX");
    cr_assert_not_null(mkdtemp(buf), "mkdtemp failed");
}

static inline int qrl_test_rm_one_(const char *p, const struct stat *sb, int flag,
                                   struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Remove a folder made by qrl_test_mkdtemp and everything in it. */
static inline void qrl_test_rmtree(const char *dir) {
    if (strncmp(dir, "/tmp/qrl-test-", 14) == 0)
        nftw(dir, qrl_test_rm_one_, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write n bytes to dir/name; the full path goes to out (at least 512 bytes). */
static inline void qrl_test_write(const char *dir, const char *name, const void *bytes,
                                  size_t n, char *out) {
    snprintf(out, 512, "%s/%s", dir, name);
    FILE *f = fopen(out, "wb");
    cr_assert_not_null(f, "cannot create %s", out);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Path of a file under the shared data folder: $QRL_DATA_DIR or ../shared/data (run from
 * the repo root).  Returns 0 when the file is not there. */
static inline int qrl_test_data_path(const char *rel, char *out, size_t cap) {
    const char *base = getenv("QRL_DATA_DIR");
    snprintf(out, cap, "%s/%s", base && *base ? base : "../shared/data", rel);
    return access(out, R_OK) == 0;
}

#endif
