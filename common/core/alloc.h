/* Aligned allocation and a one-block bump arena (STYLE 6: allocate up front).
 *
 * The arena is llm.c's malloc_and_point_parameters made general: size it once for a
 * group of tensors, carve the tensors out of it in order, free it in one call.  Nothing
 * in the arena is freed individually; nothing is zeroed unless asked for. */
#ifndef QRL_CORE_ALLOC_H
#define QRL_CORE_ALLOC_H

#include <stddef.h>

#include "core/status.h"

#define QRL_ALIGN_DEFAULT 64 /* a cache line; also enough for every SIMD load we use */

/* Allocate `size` bytes aligned to `align` (0 = QRL_ALIGN_DEFAULT; else a power of two
 * >= sizeof(void *)).
 * *out is owned by the caller: free with qrl_free_aligned.  size 0 gives a unique pointer.
 * Errors: INVALID_ARGUMENT (bad alignment), NOMEM. */
qrl_status qrl_alloc_aligned(size_t size, size_t align, void **out, qrl_error *err);
/* Free a block from qrl_alloc_aligned; NULL is a no-op. */
void qrl_free_aligned(void *p);

typedef struct qrl_arena {
    unsigned char *base; /* owned; NULL after qrl_arena_free */
    size_t size;         /* bytes in the block */
    size_t used;         /* bytes handed out, alignment padding included */
} qrl_arena;

/* Bytes an arena needs to hold blocks of the given sizes, each aligned to `align`
 * (0 = QRL_ALIGN_DEFAULT), when allocated in this order.  Errors: INVALID_ARGUMENT
 * (bad alignment), OUT_OF_RANGE (the total overflows size_t). */
qrl_status qrl_arena_size_for(const size_t *sizes, size_t n, size_t align, size_t *out,
                              qrl_error *err);
/* Allocate the arena's block (aligned to QRL_ALIGN_DEFAULT; zero-filled when `zero`).
 * Errors: NOMEM.  Free with qrl_arena_free. */
qrl_status qrl_arena_init(qrl_arena *a, size_t size, int zero, qrl_error *err);
/* Bump-allocate `size` bytes aligned to `align` (0 = QRL_ALIGN_DEFAULT; a power of two
 * no larger than QRL_ALIGN_DEFAULT).  *out stays valid until qrl_arena_reset/free.
 * Errors: INVALID_ARGUMENT (bad alignment), NOMEM (would pass the end; names the sizes). */
qrl_status qrl_arena_alloc(qrl_arena *a, size_t size, size_t align, void **out, qrl_error *err);
/* Hand the whole block out again (pointers from before become invalid to use). */
void qrl_arena_reset(qrl_arena *a);
void qrl_arena_free(qrl_arena *a);

/* One arena holding `n` blocks of `sizes[i]` bytes, each aligned to `align`:
 * ptrs[i] points at block i (malloc_and_point_parameters).  The arena owns the memory.
 * Errors: as qrl_arena_size_for and qrl_arena_init. */
qrl_status qrl_arena_init_and_point(qrl_arena *a, const size_t *sizes, size_t n, size_t align,
                                    int zero, void **ptrs, qrl_error *err);

#endif
