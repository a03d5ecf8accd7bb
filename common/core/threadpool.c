#include "core/threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct qrl_threadpool {
    int n_threads; /* caller included */
    pthread_t *workers;
    int n_started;
    pthread_mutex_t submit; /* one parallel_for at a time */
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* new generation posted, or stop */
    pthread_cond_t done_cv; /* pending reached 0 */
    uint64_t generation;
    int pending; /* workers still running the current generation */
    int stop;
    /* the current job */
    qrl_parallel_fn fn;
    void *ctx;
    int64_t n;
};

typedef struct worker_arg {
    qrl_threadpool *pool;
    int index;
} worker_arg;

/* Set while a thread runs a chunk: a nested parallel_for then runs inline. */
static _Thread_local int in_chunk;

static void chunk_bounds(int64_t n, int parts, int i, int64_t *b, int64_t *e) {
    /* n * i / parts without overflow for any int64 n */
    int64_t q = n / parts, r = n % parts;
    *b = q * i + (i < r ? i : r);
    *e = *b + q + (i < r ? 1 : 0);
}

static void run_chunk(qrl_threadpool *p, int i) {
    int64_t b, e;
    chunk_bounds(p->n, p->n_threads, i, &b, &e);
    if (b < e) {
        in_chunk = 1;
        p->fn(p->ctx, b, e, i);
        in_chunk = 0;
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    qrl_threadpool *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunk(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

qrl_status qrl_threadpool_new(int n_threads, qrl_threadpool **out, qrl_error *err) {
    if (n_threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)(c > 1024 ? 1024 : c) : 1;
    }
    if (n_threads < 0 || n_threads > 1024)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "threadpool: n_threads = %d is outside [0, 1024]", n_threads);
    qrl_threadpool *p = calloc(1, sizeof *p);
    if (p) p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p || !p->workers) {
        free(p);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "threadpool: out of memory");
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        int rc = wa ? 0 : -1;
        if (wa) {
            *wa = (worker_arg){p, i};
            rc = pthread_create(&p->workers[i], NULL, worker_main, wa);
            if (rc != 0) free(wa);
        }
        if (rc != 0) {
            qrl_threadpool_free(p);
            return qrl_error_set(err, QRL_STATUS_INTERNAL,
                                 "threadpool: cannot start worker %d of %d", i, n_threads - 1);
        }
        p->n_started++;
    }
    *out = p;
    return QRL_OK;
}

void qrl_threadpool_free(qrl_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->submit);
    free(p->workers);
    free(p);
}

int qrl_threadpool_size(const qrl_threadpool *p) { return p ? p->n_threads : 1; }

void qrl_threadpool_parallel_for(qrl_threadpool *p, int64_t n, qrl_parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || in_chunk) {
        int saved = in_chunk;
        in_chunk = 1;
        fn(ctx, 0, n, 0);
        in_chunk = saved;
        return;
    }
    pthread_mutex_lock(&p->submit);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_chunk(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->submit);
}
