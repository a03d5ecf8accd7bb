/* Atomic file replacement (atomic_file.h). */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Release the path block; the fd is closed by the callers. */
static void end(qrl_atomic_file *af) {
    free(af->path);
    af->path = af->tmp = NULL;
    af->fd = -1;
}

qrl_status qrl_atomic_file_open(const char *path, qrl_atomic_file *af, qrl_error *err) {
    af->fd = -1;
    af->path = af->tmp = NULL;
    /* rename() would replace a device, FIFO or symlink with a regular file (as root even
     * /dev/full): only ever replace regular files */
    struct stat sb;
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: exists and is not a regular file; refusing to replace it", path);
    size_t n = strlen(path);
    char *block = malloc(2 * n + 6);
    if (!block) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    memcpy(block, path, n + 1);
    af->path = block;
    af->tmp = block + n + 1;
    memcpy(af->tmp, path, n);
    memcpy(af->tmp + n, ".tmp", 5);
    af->fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (af->fd < 0) {
        qrl_status st = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot create: %s", af->tmp,
                                      strerror(errno));
        end(af);
        return st;
    }
    return QRL_OK;
}

qrl_status qrl_atomic_file_write(qrl_atomic_file *af, const void *data, size_t len,
                                 qrl_error *err) {
    QRL_CHECK(af->fd >= 0);
    const uint8_t *p = data;
    while (len > 0) {
        /* 1 GiB per call: Linux moves at most ~2 GiB per write() anyway */
        ssize_t w = write(af->fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return qrl_error_set(err, QRL_STATUS_IO, "%s: write: %s", af->tmp,
                                 w < 0 ? strerror(errno) : "no progress");
        p += w;
        len -= (size_t)w;
    }
    return QRL_OK;
}

/* fsync the folder holding af->path so that the rename itself survives a crash. */
static qrl_status fsync_folder(const char *path, qrl_error *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return qrl_error_set(err, QRL_STATUS_IO, "%s: fsync of folder %s: %s", path, dir,
                             strerror(e));
    }
    close(fd);
    return QRL_OK;
}

qrl_status qrl_atomic_file_commit(qrl_atomic_file *af, qrl_error *err) {
    QRL_CHECK(af->fd >= 0);
    qrl_status st = QRL_OK;
    if (fsync(af->fd) != 0) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: fsync: %s", af->tmp, strerror(errno));
        qrl_atomic_file_abort(af);
        return st;
    }
    int rc = close(af->fd);
    af->fd = -1;
    if (rc != 0) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: close: %s", af->tmp, strerror(errno));
        qrl_atomic_file_abort(af);
        return st;
    }
    if (rename(af->tmp, af->path) != 0) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot rename to %s: %s", af->tmp,
                           af->path, strerror(errno));
        qrl_atomic_file_abort(af);
        return st;
    }
    st = fsync_folder(af->path, err);
    end(af); /* renamed: nothing left to remove */
    return st;
}

void qrl_atomic_file_abort(qrl_atomic_file *af) {
    if (!af->path) return;
    if (af->fd >= 0) close(af->fd);
    unlink(af->tmp);
    end(af);
}
