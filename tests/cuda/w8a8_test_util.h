/* Shared by the W8A8 GPU tests (test_cuda_w8a8.c, test_cuda_w8a8_tc.c): activations with
 * specials, zero-padded code rows, and the GPU per-token quantization (INT8 or FP8 E4M3)
 * checked byte for byte against the CPU's (qrl_int8_quantize_rows /
 * qrl_fp8_quantize_rows).  Include after cuda_test_util.h. */
#ifndef QRL_TESTS_CUDA_W8A8_TEST_UTIL_H
#define QRL_TESTS_CUDA_W8A8_TEST_UTIL_H

#include "cpu/quant.h"
#include "cuda/gemm_w8a8.cuh"

/* x [T, K]: uniform in [-scale, scale]; row 1 (when T > 2) with NaN, +Inf, -Inf; row 2
 * (when T > 3) all zeros. */
static void rand_acts(float *x, int T, int K, float scale, uint64_t *s) {
    rand_f32(x, (size_t)T * K, scale, s);
    if (T > 2) {
        x[K + 0] = NAN;
        if (K > 1) x[K + 1] = INFINITY;
        if (K > 2) x[K + K / 2] = -INFINITY;
    }
    if (T > 3) memset(x + 2 * (size_t)K, 0, (size_t)K * 4);
}

/* Code bytes [T, K] -> [T, ld] zero padded (caller frees). */
static void *pad_codes(const void *q, int T, int K, int ld) {
    uint8_t *p = calloc((size_t)T * ld, 1);
    for (int t = 0; t < T; t++) memcpy(p + (size_t)t * ld, (const uint8_t *)q + (size_t)t * K, K);
    return p;
}

/* GPU quantization (fp8: E4M3, else INT8) of x (F32, or its BF16 rounding when bf16) vs
 * the CPU's: scales and every code byte (padding included) equal. */
static void check_quantize(const float *x, int T, int K, int bf16, int fp8) {
    int ld = qrl_cuda_w8a8_ld(K);
    float *xr = malloc((size_t)T * K * 4), *cs = malloc((size_t)T * 4), *gs_h = malloc((size_t)T * 4);
    uint16_t *xb = malloc((size_t)T * K * 2);
    for (size_t i = 0; i < (size_t)T * K; i++) {
        xb[i] = qrl_cpu_bf16_store(x[i]);
        xr[i] = bf16 ? qrl_cpu_bf16_load(xb[i]) : x[i];
    }
    uint8_t *cq = malloc((size_t)T * K), *got = malloc((size_t)T * ld);
    if (fp8) qrl_fp8_quantize_rows(xr, T, K, cq, cs);
    else qrl_int8_quantize_rows(xr, T, K, (int8_t *)cq, cs);
    uint8_t *want = pad_codes(cq, T, K, ld);
    void *dx = bf16 ? dev_from(xb, (size_t)T * K * 2) : dev_from(xr, (size_t)T * K * 4);
    guarded gq = guarded_new((size_t)T * ld / 4, 4), gs = guarded_new(T, 4);
    qrl_error err;
    qrl_status st = fp8 ? qrl_cuda_fp8_quantize_rows(guarded_ptr(gq), guarded_ptr(gs), dx, bf16, T, K, ld, NULL, &err)
                        : qrl_cuda_int8_quantize_rows(guarded_ptr(gq), guarded_ptr(gs), dx, bf16, T, K, ld, NULL, &err);
    cr_assert_eq(st, QRL_OK, "T=%d K=%d bf16=%d fp8=%d: %s", T, K, bf16, fp8, err.msg);
    guarded_fetch(gq, got, fp8 ? "fp8 codes" : "int8 codes"); /* frees gq */
    guarded_fetch(gs, gs_h, fp8 ? "fp8 scales" : "int8 scales");
    cr_assert(memcmp(gs_h, cs, (size_t)T * 4) == 0, "T=%d K=%d bf16=%d fp8=%d: scales differ", T, K, bf16, fp8);
    for (size_t i = 0; i < (size_t)T * ld; i++)
        cr_assert_eq(got[i], want[i], "T=%d K=%d bf16=%d fp8=%d: code %zu (row %zu col %zu): gpu 0x%02x "
                     "cpu 0x%02x", T, K, bf16, fp8, i, i / ld, i % ld, got[i], want[i]);
    qrl_cuda_free(dx);
    free(xr); free(cs); free(gs_h); free(xb); free(cq); free(got); free(want);
}

#endif
