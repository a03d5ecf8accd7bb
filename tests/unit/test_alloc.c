#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"

/* Under make sanitize, let an impossible allocation fail with NULL (as libc does) instead
 * of ASan aborting, so the NOMEM path is tested there too. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

Test(alloc, aligned_blocks) {
    const size_t aligns[] = {0, 8, 16, 64, 256, 4096};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        void *p = NULL;
        qrl_error err;
        cr_assert_eq(qrl_alloc_aligned(1000, aligns[i], &p, &err), QRL_OK, "%s", err.msg);
        size_t a = aligns[i] ? aligns[i] : QRL_ALIGN_DEFAULT;
        cr_assert_eq((uintptr_t)p % a, 0, "align %zu", a);
        memset(p, 0xab, 1000);
        qrl_free_aligned(p);
    }
    void *z = NULL;
    cr_assert_eq(qrl_alloc_aligned(0, 0, &z, NULL), QRL_OK);
    cr_assert_not_null(z);
    qrl_free_aligned(z);
    qrl_free_aligned(NULL);
}

Test(alloc, errors) {
    void *p = NULL;
    qrl_error err;
    cr_assert_eq(qrl_alloc_aligned(16, 48, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "48"), "%s", err.msg);
    cr_assert_eq(qrl_alloc_aligned(16, 2, &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_alloc_aligned(SIZE_MAX - 4096, 64, &p, &err), QRL_STATUS_NOMEM);
    cr_assert_not_null(strstr(err.msg, "cannot allocate"), "%s", err.msg);
    cr_assert_null(p);
}

Test(arena, bump_allocation_and_overflow) {
    qrl_arena a;
    qrl_error err;
    cr_assert_eq(qrl_arena_init(&a, 256, 1, &err), QRL_OK);
    cr_assert_eq((uintptr_t)a.base % QRL_ALIGN_DEFAULT, 0);
    for (size_t i = 0; i < 256; i++) cr_assert_eq(a.base[i], 0, "zero-filled");
    void *x, *y, *z;
    cr_assert_eq(qrl_arena_alloc(&a, 10, 0, &x, &err), QRL_OK);
    cr_assert_eq(qrl_arena_alloc(&a, 3, 4, &y, &err), QRL_OK);
    cr_assert_eq((unsigned char *)x, a.base);
    cr_assert_eq((unsigned char *)y, a.base + 12); /* 10 rounded up to 4 */
    cr_assert_eq(qrl_arena_alloc(&a, 100, 64, &z, &err), QRL_OK);
    cr_assert_eq((unsigned char *)z, a.base + 64);
    cr_assert_eq(a.used, 164);
    cr_assert_eq(qrl_arena_alloc(&a, 100, 64, &z, &err), QRL_STATUS_NOMEM);
    cr_assert_not_null(strstr(err.msg, "100 bytes requested"), "%s", err.msg);
    cr_assert_eq(a.used, 164, "a failed request takes nothing");
    cr_assert_eq(qrl_arena_alloc(&a, 60, 4, &z, &err), QRL_OK); /* exactly fills it */
    cr_assert_eq(a.used, 224);
    cr_assert_eq(qrl_arena_alloc(&a, 8, 128, &z, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_arena_reset(&a);
    cr_assert_eq(qrl_arena_alloc(&a, 256, 0, &z, &err), QRL_OK);
    cr_assert_eq((unsigned char *)z, a.base);
    qrl_arena_free(&a);
    cr_assert_null(a.base);
}

Test(arena, init_and_point_like_llm_c) {
    /* a parameter group: wte, wpe, ln gains (odd sizes on purpose) */
    const size_t sizes[4] = {2048 * 128 * 4, 3, 128 * 4, 0};
    size_t total;
    cr_assert_eq(qrl_arena_size_for(sizes, 4, 0, &total, NULL), QRL_OK);
    cr_assert_eq(total, 2048 * 128 * 4 + 64 + 512);
    qrl_arena a;
    void *ptrs[4];
    cr_assert_eq(qrl_arena_init_and_point(&a, sizes, 4, 0, 0, ptrs, NULL), QRL_OK);
    cr_assert_eq(a.size, total);
    cr_assert_eq((unsigned char *)ptrs[0], a.base);
    cr_assert_eq((unsigned char *)ptrs[1], a.base + 2048 * 128 * 4);
    cr_assert_eq((unsigned char *)ptrs[2], a.base + 2048 * 128 * 4 + 64);
    for (int i = 0; i < 4; i++) cr_assert_eq((uintptr_t)ptrs[i] % 64, 0);
    memset(ptrs[0], 1, sizes[0]); /* the whole block is usable (ASan checks) */
    memset(ptrs[2], 1, sizes[2]);
    qrl_arena_free(&a);

    const size_t huge[2] = {SIZE_MAX / 2, SIZE_MAX / 2 + 100};
    qrl_error err;
    cr_assert_eq(qrl_arena_size_for(huge, 2, 0, &total, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_not_null(strstr(err.msg, "block 1"), "%s", err.msg);
}
