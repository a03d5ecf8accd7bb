#include "core/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int valid_align(size_t align) {
    return align >= sizeof(void *) && (align & (align - 1)) == 0;
}

qrl_status qrl_alloc_aligned(size_t size, size_t align, void **out, qrl_error *err) {
    if (align == 0) align = QRL_ALIGN_DEFAULT;
    if (!valid_align(align))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "alloc: alignment %zu is not a power of two >= %zu", align,
                             sizeof(void *));
    void *p = NULL;
    int rc = posix_memalign(&p, align, size ? size : 1);
    if (rc != 0 || !p)
        return qrl_error_set(err, QRL_STATUS_NOMEM,
                             "alloc: cannot allocate %zu bytes aligned to %zu", size, align);
    *out = p;
    return QRL_OK;
}

void qrl_free_aligned(void *p) { free(p); }

static int arena_align_ok(size_t align) {
    return align > 0 && (align & (align - 1)) == 0 && align <= QRL_ALIGN_DEFAULT;
}

static size_t align_up(size_t x, size_t align) { return (x + align - 1) & ~(align - 1); }

qrl_status qrl_arena_size_for(const size_t *sizes, size_t n, size_t align, size_t *out,
                              qrl_error *err) {
    if (align == 0) align = QRL_ALIGN_DEFAULT;
    if (!arena_align_ok(align))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "arena: alignment %zu is not a power of two in [1, %d]", align,
                             QRL_ALIGN_DEFAULT);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] > SIZE_MAX - align || total > SIZE_MAX - align_up(sizes[i], align))
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "arena: block %zu of %zu bytes makes the total overflow", i,
                                 sizes[i]);
        total += align_up(sizes[i], align);
    }
    *out = total;
    return QRL_OK;
}

qrl_status qrl_arena_init(qrl_arena *a, size_t size, int zero, qrl_error *err) {
    void *p;
    a->base = NULL;
    a->size = a->used = 0;
    QRL_TRY(qrl_alloc_aligned(size, QRL_ALIGN_DEFAULT, &p, err));
    if (zero) memset(p, 0, size);
    a->base = p;
    a->size = size;
    return QRL_OK;
}

qrl_status qrl_arena_alloc(qrl_arena *a, size_t size, size_t align, void **out, qrl_error *err) {
    if (align == 0) align = QRL_ALIGN_DEFAULT;
    /* the block itself is only QRL_ALIGN_DEFAULT-aligned, so larger would be a lie */
    if (!arena_align_ok(align))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "arena: alignment %zu is not a power of two in [1, %d]", align,
                             QRL_ALIGN_DEFAULT);
    size_t start = align_up(a->used, align);
    if (start > a->size || size > a->size - start)
        return qrl_error_set(err, QRL_STATUS_NOMEM,
                             "arena: %zu bytes requested, %zu of %zu left", size,
                             a->size - (a->used < a->size ? a->used : a->size), a->size);
    *out = a->base + start;
    a->used = start + size;
    return QRL_OK;
}

void qrl_arena_reset(qrl_arena *a) { a->used = 0; }

void qrl_arena_free(qrl_arena *a) {
    qrl_free_aligned(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

qrl_status qrl_arena_init_and_point(qrl_arena *a, const size_t *sizes, size_t n, size_t align,
                                    int zero, void **ptrs, qrl_error *err) {
    size_t total;
    QRL_TRY(qrl_arena_size_for(sizes, n, align, &total, err));
    QRL_TRY(qrl_arena_init(a, total, zero, err));
    for (size_t i = 0; i < n; i++) {
        qrl_status st = qrl_arena_alloc(a, sizes[i], align, &ptrs[i], err);
        QRL_CHECK(st == QRL_OK); /* the total above was computed for exactly these blocks */
    }
    return QRL_OK;
}
