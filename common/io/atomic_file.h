/* Atomic file replacement: write PATH.tmp, fsync it, rename it over PATH, fsync the folder.
 * Readers of PATH see either the old file or the complete new one, never a partial write
 * (STYLE 13).  Used by the safetensors writer, the AdamW state file and the npy writer.
 *
 *     qrl_atomic_file af;
 *     QRL_TRY(qrl_atomic_file_open(path, &af, err));
 *     QRL_TRY_GOTO(qrl_atomic_file_write(&af, buf, n, err), fail);
 *     return qrl_atomic_file_commit(&af, err);
 *   fail:
 *     qrl_atomic_file_abort(&af);
 *     return st;
 *
 * Error messages name the temp file PATH.tmp (which contains PATH), plus the folder for a
 * failed folder fsync. */
#ifndef QRL_IO_ATOMIC_FILE_H
#define QRL_IO_ATOMIC_FILE_H

#include <stddef.h>

#include "core/status.h"

/* Caller-owned handle (e.g. on the stack); fields are private.  Between a successful
 * open and the end (commit or abort) it owns an open temp file and a copy of the path.
 * Once ended (also after a failed open or a failed commit) it owns nothing, and abort on
 * it is a no-op. */
typedef struct qrl_atomic_file {
    int fd;     /* the temp file, -1 once closed */
    char *path; /* the final name; one heap block with tmp; NULL once ended */
    char *tmp;  /* path + ".tmp" */
} qrl_atomic_file;

/* An ended handle: lets a cleanup label call abort on a path that jumps there before
 * open (`qrl_atomic_file af = QRL_ATOMIC_FILE_INIT;`). */
#define QRL_ATOMIC_FILE_INIT {.fd = -1, .path = NULL, .tmp = NULL}

/* Create (or truncate) PATH.tmp, mode 0644.  PATH itself is not touched until commit.
 * Errors: IO (cannot create, e.g. missing or unwritable folder; names PATH.tmp), NOMEM.
 * On failure *af is left ended. */
qrl_status qrl_atomic_file_open(const char *path, qrl_atomic_file *af, qrl_error *err);

/* Append len bytes (data may be NULL when len is 0), looping over short writes and EINTR.
 * Errors: IO.  On failure the handle stays open: end it with qrl_atomic_file_abort. */
qrl_status qrl_atomic_file_write(qrl_atomic_file *af, const void *data, size_t len,
                                 qrl_error *err);

/* fsync and close the temp file, rename it to PATH (replacing any old file), fsync the
 * folder so that the rename is durable.  Always ends the handle.  On an error before the
 * rename the temp file is removed and PATH keeps its old content; an error in the folder
 * fsync (after the rename) leaves the new file in place but reports IO since its
 * durability is not known.  Errors: IO. */
qrl_status qrl_atomic_file_commit(qrl_atomic_file *af, qrl_error *err);

/* Close and remove the temp file and end the handle; PATH is untouched.  Safe after any
 * failure and after commit (then a no-op), so a cleanup label may always call it. */
void qrl_atomic_file_abort(qrl_atomic_file *af);

#endif
