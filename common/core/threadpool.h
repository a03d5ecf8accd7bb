/* A small fixed pool of pthreads for code that must not depend on OpenMP.
 *
 * qrl_threadpool_parallel_for splits [0, n) into one contiguous chunk per thread (the
 * caller's thread runs chunk 0) and returns when all chunks are done.  The split is a
 * pure function of n and the pool size, so per-chunk partial results are reproducible.
 * Calls from several threads are serialized; a call from inside a running chunk runs
 * its whole range inline on that thread (no deadlock, no nested parallelism). */
#ifndef QRL_CORE_THREADPOOL_H
#define QRL_CORE_THREADPOOL_H

#include <stdint.h>

#include "core/status.h"

typedef struct qrl_threadpool qrl_threadpool; /* opaque */

/* fn runs on [begin, end) (never empty); `thread` in [0, pool size) names the executing
 * slot (use it to index per-thread scratch). */
typedef void (*qrl_parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Start a pool of `n_threads` (0 = online CPUs) threads in total, the caller's included
 * (so n_threads - 1 workers).  *out is owned by the caller: free with qrl_threadpool_free.
 * Errors: INVALID_ARGUMENT (n_threads < 0 or > 1024), NOMEM, INTERNAL (pthread_create). */
qrl_status qrl_threadpool_new(int n_threads, qrl_threadpool **out, qrl_error *err);
/* Join the workers and free the pool; NULL is a no-op.  Not while a parallel_for runs. */
void qrl_threadpool_free(qrl_threadpool *pool);
/* Threads in the pool, the caller's included. */
int qrl_threadpool_size(const qrl_threadpool *pool);
/* Run fn over [0, n) split into at most qrl_threadpool_size chunks; blocks until done.
 * n <= 0 calls nothing.  A NULL pool runs everything inline as thread 0. */
void qrl_threadpool_parallel_for(qrl_threadpool *pool, int64_t n, qrl_parallel_fn fn, void *ctx);

#endif
