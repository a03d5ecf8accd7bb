/* CUDA conversion kernels against the CPU reference (STYLE 8): fresh random inputs,
 * odd sizes, guard regions around the output. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "cuda/convert.cuh"
#include "cuda/runtime.cuh"

#define GUARD 64
static const uint16_t GUARD_BF16 = 0x7fa5; /* a NaN pattern no conversion produces */

static void require_gpu(void) {
    int n = 0;
    qrl_cuda_device_count(&n, NULL);
    if (n == 0) cr_skip_test("no CUDA device");
}

Test(cuda_convert, f32_to_bf16_matches_cpu_rne) {
    require_gpu();
    const size_t sizes[] = {1, 7, 255, 256, 1000003};
    srand(12345);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        float *x = malloc(n * sizeof *x);
        for (size_t i = 0; i < n; i++)
            x[i] = ((float)rand() / RAND_MAX - 0.5f) * powf(2.0f, (float)(rand() % 40 - 20));
        if (n > 4) { x[0] = NAN; x[1] = INFINITY; x[2] = -0.0f; x[3] = 1.00390625f; /* tie */ }
        float *dx; uint16_t *dy;
        cr_assert_eq(qrl_cuda_malloc((void **)&dx, n * 4, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_malloc((void **)&dy, (n + 2 * GUARD) * 2, NULL), QRL_OK);
        uint16_t *y = malloc((n + 2 * GUARD) * 2);
        for (size_t i = 0; i < n + 2 * GUARD; i++) y[i] = GUARD_BF16;
        cr_assert_eq(qrl_cuda_copy_to_device(dy, y, (n + 2 * GUARD) * 2, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_copy_to_device(dx, x, n * 4, NULL), QRL_OK);
        qrl_error err;
        cr_assert_eq(qrl_cuda_f32_to_bf16(dx, dy + GUARD, n, NULL, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_synchronize(&err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_copy_to_host(y, dy, (n + 2 * GUARD) * 2, NULL), QRL_OK);
        for (size_t i = 0; i < GUARD; i++) {
            cr_assert_eq(y[i], GUARD_BF16, "guard before output written at %zu", i);
            cr_assert_eq(y[GUARD + n + i], GUARD_BF16, "guard after output written at %zu", i);
        }
        for (size_t i = 0; i < n; i++) {
            uint16_t want = qrl_f32_to_bf16(x[i]);
            uint16_t got = y[GUARD + i];
            if (isnan(x[i])) cr_assert(isnan(qrl_bf16_to_f32(got)), "NaN lost at %zu", i);
            else cr_assert_eq(got, want, "n=%zu i=%zu x=%a gpu=%04x cpu=%04x", n, i, x[i], got, want);
        }
        qrl_cuda_free(dx); qrl_cuda_free(dy); free(x); free(y);
    }
}

Test(cuda_convert, bf16_to_f32_exact) {
    require_gpu();
    size_t n = 65536; /* every bf16 bit pattern */
    uint16_t *x = malloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = (uint16_t)i;
    uint16_t *dx; float *dy;
    cr_assert_eq(qrl_cuda_malloc((void **)&dx, n * 2, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_malloc((void **)&dy, n * 4, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_device(dx, x, n * 2, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_bf16_to_f32(dx, dy, n, NULL, NULL), QRL_OK);
    float *y = malloc(n * 4);
    cr_assert_eq(qrl_cuda_copy_to_host(y, dy, n * 4, NULL), QRL_OK);
    for (size_t i = 0; i < n; i++) {
        float want = qrl_bf16_to_f32((uint16_t)i);
        cr_assert(memcmp(&want, &y[i], 4) == 0 || (isnan(want) && isnan(y[i])), "pattern %04zx", i);
    }
    qrl_cuda_free(dx); qrl_cuda_free(dy); free(x); free(y);
}
