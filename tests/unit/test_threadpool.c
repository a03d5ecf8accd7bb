#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/threadpool.h"

typedef struct visit_ctx {
    int64_t n;
    unsigned char *hits;  /* per index */
    atomic_int chunks;
    atomic_int bad_thread;
    int size;
    int64_t begin_of[64]; /* per thread slot */
    int64_t end_of[64];
    pthread_t who[64];
} visit_ctx;

static void visit(void *p, int64_t b, int64_t e, int thread) {
    visit_ctx *c = p;
    if (thread < 0 || thread >= c->size || b >= e) atomic_fetch_add(&c->bad_thread, 1);
    for (int64_t i = b; i < e; i++) c->hits[i]++; /* chunks are disjoint: no race */
    c->begin_of[thread] = b;
    c->end_of[thread] = e;
    c->who[thread] = pthread_self();
    atomic_fetch_add(&c->chunks, 1);
}

static void check_cover(qrl_threadpool *pool, int64_t n) {
    visit_ctx *c = calloc(1, sizeof *c);
    c->n = n;
    c->size = qrl_threadpool_size(pool);
    c->hits = calloc((size_t)(n > 0 ? n : 1), 1);
    qrl_threadpool_parallel_for(pool, n, visit, c);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(c->hits[i], 1, "n=%lld index %lld", (long long)n, (long long)i);
    int want_chunks = n < c->size ? (int)(n > 0 ? n : 0) : c->size;
    cr_assert_eq(atomic_load(&c->chunks), want_chunks, "n=%lld size=%d", (long long)n, c->size);
    cr_assert_eq(atomic_load(&c->bad_thread), 0);
    /* chunk i is the i-th contiguous part, sizes differ by at most one */
    if (n >= c->size) {
        int64_t prev_end = 0;
        for (int t = 0; t < c->size; t++) {
            cr_assert_eq(c->begin_of[t], prev_end);
            int64_t len = c->end_of[t] - c->begin_of[t];
            cr_assert(len == n / c->size || len == n / c->size + 1);
            prev_end = c->end_of[t];
        }
        cr_assert_eq(prev_end, n);
    }
    free(c->hits);
    free(c);
}

Test(threadpool, covers_every_index_once) {
    const int sizes[] = {1, 2, 3, 4, 7};
    const int64_t ns[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 100, 1001, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        qrl_threadpool *pool;
        qrl_error err;
        cr_assert_eq(qrl_threadpool_new(sizes[s], &pool, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_threadpool_size(pool), sizes[s]);
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) check_cover(pool, ns[k]);
        qrl_threadpool_free(pool);
    }
    check_cover(NULL, 1000); /* no pool: inline */
}

Test(threadpool, chunks_run_on_distinct_threads) {
    qrl_threadpool *pool;
    cr_assert_eq(qrl_threadpool_new(4, &pool, NULL), QRL_OK);
    visit_ctx *c = calloc(1, sizeof *c);
    c->size = 4;
    c->hits = calloc(4, 1);
    qrl_threadpool_parallel_for(pool, 4, visit, c);
    cr_assert(pthread_equal(c->who[0], pthread_self()), "chunk 0 runs on the caller");
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            cr_assert_not(pthread_equal(c->who[i], c->who[j]), "slots %d and %d share a thread",
                          i, j);
    free(c->hits);
    free(c);
    qrl_threadpool_free(pool);
}

static void add_range(void *p, int64_t b, int64_t e, int thread) {
    (void)thread;
    int64_t s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add((_Atomic int64_t *)p, s);
}

Test(threadpool, many_rounds_back_to_back) {
    qrl_threadpool *pool;
    cr_assert_eq(qrl_threadpool_new(3, &pool, NULL), QRL_OK);
    for (int r = 0; r < 20000; r++) {
        _Atomic int64_t sum = 0;
        int64_t n = 1 + r % 97;
        qrl_threadpool_parallel_for(pool, n, add_range, &sum);
        cr_assert_eq(atomic_load(&sum), n * (n - 1) / 2, "round %d", r);
    }
    qrl_threadpool_free(pool);
}

typedef struct nested_ctx {
    qrl_threadpool *pool;
    _Atomic int64_t sum;
} nested_ctx;

static void outer_fn(void *p, int64_t b, int64_t e, int thread) {
    nested_ctx *c = p;
    /* a nested call runs inline on this thread instead of deadlocking */
    for (int64_t i = b; i < e; i++) qrl_threadpool_parallel_for(c->pool, 10, add_range, &c->sum);
}

Test(threadpool, nested_call_runs_inline) {
    nested_ctx c = {.sum = 0};
    cr_assert_eq(qrl_threadpool_new(4, &c.pool, NULL), QRL_OK);
    qrl_threadpool_parallel_for(c.pool, 8, outer_fn, &c);
    cr_assert_eq(atomic_load(&c.sum), 8 * 45);
    qrl_threadpool_free(c.pool);
}

static void *submitter(void *p) {
    qrl_threadpool *pool = p;
    for (int r = 0; r < 2000; r++) {
        _Atomic int64_t sum = 0;
        qrl_threadpool_parallel_for(pool, 1000, add_range, &sum);
        if (atomic_load(&sum) != 999 * 1000 / 2) return (void *)1;
    }
    return NULL;
}

Test(threadpool, concurrent_callers_are_serialized) {
    qrl_threadpool *pool;
    cr_assert_eq(qrl_threadpool_new(3, &pool, NULL), QRL_OK);
    pthread_t a, b;
    pthread_create(&a, NULL, submitter, pool);
    pthread_create(&b, NULL, submitter, pool);
    void *ra, *rb;
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    cr_assert_null(ra);
    cr_assert_null(rb);
    qrl_threadpool_free(pool);
}

Test(threadpool, sizes_and_errors) {
    qrl_threadpool *pool;
    qrl_error err;
    cr_assert_eq(qrl_threadpool_new(0, &pool, &err), QRL_OK);
    cr_assert_eq(qrl_threadpool_size(pool), (int)sysconf(_SC_NPROCESSORS_ONLN));
    qrl_threadpool_free(pool);
    cr_assert_eq(qrl_threadpool_new(-1, &pool, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "n_threads"), "%s", err.msg);
    cr_assert_eq(qrl_threadpool_new(5000, &pool, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_threadpool_free(NULL);
    cr_assert_eq(qrl_threadpool_size(NULL), 1);
}
