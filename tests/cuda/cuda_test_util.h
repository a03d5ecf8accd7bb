/* Helpers for the CUDA op tests: device buffers with guard regions, random inputs, errors. */
#ifndef QRL_TESTS_CUDA_TEST_UTIL_H
#define QRL_TESTS_CUDA_TEST_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/runtime.cuh"

#define GUARD 64                 /* elements each side of an output */
#define GUARD_BF16 0x7fa5u       /* NaN patterns no kernel produces */
#define GUARD_F32 0x7fa5a5a5u

static inline void require_gpu(void) {
    int n = 0;
    qrl_cuda_device_count(&n, NULL);
    if (n == 0) cr_skip_test("no CUDA device");
}

static inline uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float rng_unif(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f * 2.0f - 1.0f; }
static inline void rand_f32(float *x, size_t n, float scale, uint64_t *s) {
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_unif(s);
}
/* Random BF16 values, also returned as their exact F32 values in f (may be NULL). */
static inline void rand_bf16(uint16_t *x, float *f, size_t n, float mean, float scale, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        x[i] = qrl_cpu_bf16_store(mean + scale * rng_unif(s));
        if (f) f[i] = qrl_cpu_bf16_load(x[i]);
    }
}

/* Device copy of host data (n elements of `es` bytes). */
static inline void *dev_from(const void *h, size_t bytes) {
    void *d;
    cr_assert_eq(qrl_cuda_malloc(&d, bytes ? bytes : 1, NULL), QRL_OK);
    if (bytes) cr_assert_eq(qrl_cuda_copy_to_device(d, h, bytes, NULL), QRL_OK);
    return d;
}

/* An output buffer of n elements of es (2 or 4) bytes with GUARD poisoned elements on each
 * side; the whole buffer is poisoned, so unwritten outputs show too. */
typedef struct guarded { void *base; size_t n, es; } guarded;
static inline guarded guarded_new(size_t n, size_t es) {
    guarded g = {NULL, n, es};
    size_t tot = n + 2 * GUARD;
    unsigned char *h = malloc(tot * es);
    for (size_t i = 0; i < tot; i++) {
        if (es == 2) ((uint16_t *)h)[i] = GUARD_BF16;
        else ((uint32_t *)h)[i] = GUARD_F32;
    }
    g.base = dev_from(h, tot * es);
    free(h);
    return g;
}
static inline void *guarded_ptr(guarded g) { return (unsigned char *)g.base + GUARD * g.es; }
/* Copy the output back (n elements to out), checking both guards and that every output
 * element was written (no poison left). */
static inline void guarded_fetch(guarded g, void *out, const char *what) {
    cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK, "%s: kernel error", what);
    size_t tot = g.n + 2 * GUARD;
    unsigned char *h = malloc(tot * g.es);
    cr_assert_eq(qrl_cuda_copy_to_host(h, g.base, tot * g.es, NULL), QRL_OK);
    for (size_t i = 0; i < tot; i++) {
        uint32_t v = g.es == 2 ? ((uint16_t *)h)[i] : ((uint32_t *)h)[i];
        uint32_t pat = g.es == 2 ? GUARD_BF16 : GUARD_F32;
        int in_out = i >= GUARD && i < GUARD + g.n;
        if (!in_out) cr_assert_eq(v, pat, "%s: guard element %zu overwritten", what, i);
        else cr_assert_neq(v, pat, "%s: output element %zu not written", what, i - GUARD);
    }
    memcpy(out, h + GUARD * g.es, g.n * g.es);
    free(h);
    qrl_cuda_free(g.base);
}

static inline void bf16_to_f32_host(const uint16_t *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = qrl_cpu_bf16_load(x[i]);
}

/* ||got - want|| / ||want|| in double; NaN anywhere gives +inf. */
static inline double rel_err(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) return INFINITY;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
