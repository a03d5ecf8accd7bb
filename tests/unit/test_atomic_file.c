/* Atomic file replacement (common/io/atomic_file.h): the file appears only at commit with
 * exactly the bytes written, nothing is left behind on abort or error, and an old file
 * stays whole until the rename. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "support/test_files.h"

/* Whole content of path into buf (cap bytes); returns the length, -1 when it cannot open. */
static long slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

Test(atomic_file, commit_writes_exact_bytes_and_leaves_no_temp) {
    char dir[64], path[512], tmp[600];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    qrl_error err;
    qrl_atomic_file af;
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_OK, "%s", err.msg);
    cr_expect(exists(tmp), "writes go to PATH.tmp");
    cr_expect(!exists(path), "PATH appears only at commit");
    static char big[3 << 20]; /* several MiB: more than one write() on most systems */
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i * 7 + i / 4096);
    cr_assert_eq(qrl_atomic_file_write(&af, "head", 4, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_write(&af, NULL, 0, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_write(&af, big, sizeof big, &err), QRL_OK, "%s", err.msg);
    cr_expect(!exists(path));
    cr_assert_eq(qrl_atomic_file_commit(&af, &err), QRL_OK, "%s", err.msg);
    cr_expect(!exists(tmp), "temp file left behind");
    static char got[(3 << 20) + 16];
    long n = slurp(path, got, sizeof got);
    cr_assert_eq(n, (long)(4 + sizeof big));
    cr_expect(memcmp(got, "head", 4) == 0);
    cr_expect(memcmp(got + 4, big, sizeof big) == 0, "content differs");
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777 & ~0022, 0644 & ~0022u, "mode 0644 (less umask)");
    qrl_atomic_file_abort(&af); /* after commit: a no-op */
    cr_expect(exists(path), "abort after commit must not remove the file");
    qrl_test_rmtree(dir);
}

Test(atomic_file, abort_leaves_neither_file_nor_temp) {
    char dir[64], path[512], tmp[600];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/gone.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    qrl_error err;
    qrl_atomic_file af;
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_write(&af, "partial", 7, &err), QRL_OK, "%s", err.msg);
    qrl_atomic_file_abort(&af);
    cr_expect(!exists(path));
    cr_expect(!exists(tmp), "abort must remove the temp file");
    qrl_atomic_file_abort(&af); /* twice: still a no-op */
    qrl_atomic_file ended = QRL_ATOMIC_FILE_INIT;
    qrl_atomic_file_abort(&ended); /* never opened */
    qrl_test_rmtree(dir);
}

Test(atomic_file, old_file_intact_until_commit) {
    char dir[64], path[512], got[64];
    qrl_test_mkdtemp(dir);
    qrl_test_write(dir, "state.bin", "old content", 11, path);
    qrl_error err;
    qrl_atomic_file af;
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_write(&af, "new", 3, &err), QRL_OK, "%s", err.msg);
    /* a reader before commit sees the old file whole, not the partial new one */
    long n = slurp(path, got, sizeof got);
    cr_assert_eq(n, 11);
    cr_expect(memcmp(got, "old content", 11) == 0);
    cr_assert_eq(qrl_atomic_file_write(&af, " content!", 9, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_commit(&af, &err), QRL_OK, "%s", err.msg);
    n = slurp(path, got, sizeof got);
    cr_assert_eq(n, 12);
    cr_expect(memcmp(got, "new content!", 12) == 0);

    /* abort leaves the old file as it was */
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_write(&af, "x", 1, &err), QRL_OK, "%s", err.msg);
    qrl_atomic_file_abort(&af);
    n = slurp(path, got, sizeof got);
    cr_assert_eq(n, 12);
    cr_expect(memcmp(got, "new content!", 12) == 0);
    qrl_test_rmtree(dir);
}

static void expect_open_io(const char *path) {
    qrl_error err;
    qrl_atomic_file af;
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_STATUS_IO, "%s", path);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_expect_not_null(strstr(err.msg, tmp), "message names %s: %s", tmp, err.msg);
    cr_expect_not_null(strstr(err.msg, "cannot create"), "%s", err.msg);
    qrl_atomic_file_abort(&af); /* after a failed open: a no-op */
    cr_expect(!exists(tmp));
}

Test(atomic_file, unwritable_folder_is_io_naming_the_path) {
    char dir[64], path[600];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/missing/out.bin", dir);
    expect_open_io(path);
    /* a regular file where a folder should be (fails for root too) */
    char file[512];
    qrl_test_write(dir, "plain", "x", 1, file);
    snprintf(path, sizeof path, "%s/out.bin", file);
    expect_open_io(path);
    /* a folder without write permission; root bypasses the mode bits, so only as others */
    if (geteuid() != 0) {
        char ro[512];
        snprintf(ro, sizeof ro, "%s/ro", dir);
        cr_assert_eq(mkdir(ro, 0555), 0);
        snprintf(path, sizeof path, "%s/out.bin", ro);
        expect_open_io(path);
        chmod(ro, 0755);
    }
    qrl_test_rmtree(dir);
}

Test(atomic_file, failed_rename_removes_temp_and_keeps_target) {
    /* PATH becomes a non-empty folder after open (open refuses one up front):
     * rename(file, folder) then fails with EISDIR */
    char dir[64], path[512], tmp[600], inner[512];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/target", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    qrl_error err;
    qrl_atomic_file af;
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(mkdir(path, 0755), 0);
    qrl_test_write(path, "keep", "k", 1, inner);
    cr_assert_eq(qrl_atomic_file_write(&af, "data", 4, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_atomic_file_commit(&af, &err), QRL_STATUS_IO);
    cr_expect_not_null(strstr(err.msg, "cannot rename"), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_expect(!exists(tmp), "temp file left behind after a failed commit");
    cr_expect(exists(inner), "target untouched");
    qrl_atomic_file_abort(&af); /* after a failed commit: a no-op */
    qrl_test_rmtree(dir);
}

Test(atomic_file, refuses_to_replace_what_is_not_a_regular_file) {
    char dir[64], path[512], fifo[512];
    qrl_test_mkdtemp(dir);
    qrl_error err;
    qrl_atomic_file af;
    /* a folder, a FIFO, a symlink (even to a regular file), a device */
    snprintf(path, sizeof path, "%s/folder", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "not a regular file"), "%s", err.msg);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_assert_eq(qrl_atomic_file_open(fifo, &af, &err), QRL_STATUS_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "%s/link", dir);
    cr_assert_eq(symlink(fifo, path), 0);
    cr_assert_eq(qrl_atomic_file_open(path, &af, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_atomic_file_open("/dev/null", &af, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "/dev/null"), "%s", err.msg);
    struct stat sb;
    cr_assert_eq(stat(fifo, &sb), 0);
    cr_expect(S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    qrl_test_rmtree(dir);
}
