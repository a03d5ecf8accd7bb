/* The BF16 GEMM of the decode step (qrl_cuda_gemm_bf16: the skinny kernel of
 * gemm_bf16_skinny.cuh for small batches, cuBLAS otherwise) against an F64 sum of the same
 * BF16 inputs, on fresh random data (qrl_cuda_fill_random_bf16, a new seed per case).
 *
 * Bound per element: |y - ref| <= TOL * sum_k |x w| (F32 accumulation of up to 9728
 * products: ~600 tensor-core steps of 2^-24 relative each in the worst case is 4e-5, the
 * random-walk typical case ~2e-6; TOL = 1e-5).  Skinny and cuBLAS must also agree within
 * 2 TOL * sum |x w|.  Every output lies between guard regions and starts poisoned (each
 * element must be written).  Shapes: n = 1 .. 65 rows (odd ones, tile edges), m = 1 ..
 * 151936 outputs, k = 8 .. 9728; rows checked: all for m <= 2560, else the first and last
 * 160 and every 61st.
 *
 * Also: AUTO gives the bits of the kernel qrl_cuda_gemm_bf16_picks_skinny names, falls
 * back to cuBLAS for k % 8 != 0 or misaligned operands (where a forced SKINNY returns
 * UNSUPPORTED); QRL_GEMM_BF16_CUBLAS=1 makes a new handle use cuBLAS; a row's outputs have
 * the same bits at any batch size and on a repeated launch (the split-K counters reset
 * themselves). */
#include <cuda_runtime.h>

#include "cuda_test_util.h"

#include "cuda/gemm.cuh"
#include "cuda/gemm_bf16_skinny.cuh"
#include "cuda/pointwise.cuh"

#define TOL 1e-5

static qrl_cuda_gemm *handle(qrl_cuda_gemm_bf16_kernel k) {
    qrl_cuda_gemm *g;
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_new(&g, &err), QRL_OK, "%s", err.msg);
    qrl_cuda_gemm_set_bf16_kernel(g, k);
    return g;
}

static uint16_t *dev_random(size_t n, uint64_t seed, float std) {
    uint16_t *d;
    qrl_error err;
    cr_assert_eq(qrl_cuda_malloc((void **)&d, n * 2, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_fill_random_bf16(d, n, seed, 0.0f, std, NULL, &err), QRL_OK, "%s", err.msg);
    return d;
}

/* y = x . w^T through g into a guarded buffer, copied to out[n * m]. */
static void run_gemm(qrl_cuda_gemm *g, float *out, const uint16_t *dx, const uint16_t *dw, int n,
                     int k, int m, const char *what) {
    guarded gy = guarded_new((size_t)n * m, 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_bf16(g, guarded_ptr(gy), dx, dw, n, k, m, NULL, &err), QRL_OK,
                 "%s n=%d k=%d m=%d: %s", what, n, k, m, err.msg);
    guarded_fetch(gy, out, what);
}

static int row_checked(int r, int m) { return m <= 2560 || r < 160 || r >= m - 160 || r % 61 == 0; }

static void gemm_case(qrl_cuda_gemm *sk, qrl_cuda_gemm *bl, qrl_cuda_gemm *au, int n, int k, int m,
                      uint64_t seed) {
    size_t nk = (size_t)n * k, nm = (size_t)n * m;
    uint16_t *dx = dev_random(nk, seed, 1.0f), *dw = dev_random((size_t)m * k, seed + 1, 0.05f);
    float *ys = malloc(nm * 4), *yb = malloc(nm * 4), *ya = malloc(nm * 4);
    run_gemm(sk, ys, dx, dw, n, k, m, "skinny");
    run_gemm(bl, yb, dx, dw, n, k, m, "cublas");
    run_gemm(au, ya, dx, dw, n, k, m, "auto");
    int pick = qrl_cuda_gemm_bf16_picks_skinny(au, dx, dw, n, k, m);
    cr_assert(!memcmp(ya, pick ? ys : yb, nm * 4), "auto n=%d k=%d m=%d is not the %s result", n,
              k, m, pick ? "skinny" : "cublas");
    /* the checked weight rows and x on the host, as F32 (exact) */
    int *rows = malloc((size_t)m * sizeof(int)), nr = 0;
    for (int r = 0; r < m; r++)
        if (row_checked(r, m)) rows[nr++] = r;
    uint16_t *x16 = malloc(nk * 2), *w16 = malloc((size_t)nr * k * 2);
    float *x = malloc(nk * 4), *w = malloc((size_t)nr * k * 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_copy_to_host(x16, dx, nk * 2, &err), QRL_OK, "%s", err.msg);
    for (int i = 0; i < nr; i++)
        cr_assert_eq(qrl_cuda_copy_to_host(w16 + (size_t)i * k, dw + (size_t)rows[i] * k,
                                           (size_t)k * 2, &err), QRL_OK, "%s", err.msg);
    bf16_to_f32_host(x16, x, nk);
    bf16_to_f32_host(w16, w, (size_t)nr * k);
    double worst_s = 0, worst_b = 0, worst_sb = 0;
    int bad = 0;
#pragma omp parallel for reduction(max : worst_s, worst_b, worst_sb) reduction(+ : bad) schedule(dynamic, 8)
    for (int i = 0; i < nr; i++) {
        const float *wr = w + (size_t)i * k;
        for (int t = 0; t < n; t++) {
            const float *xr = x + (size_t)t * k;
            double s = 0, a = 0;
            for (int j = 0; j < k; j++) {
                double p = (double)xr[j] * wr[j];
                s += p;
                a += fabs(p);
            }
            size_t o = (size_t)t * m + rows[i];
            double den = a > 0 ? a : 1e-30;
            double es = fabs(ys[o] - s) / den, eb = fabs(yb[o] - s) / den;
            double esb = fabs((double)ys[o] - yb[o]) / den;
            if (!(es <= TOL) || !(eb <= TOL) || !(esb <= 2 * TOL)) bad++;
            worst_s = fmax(worst_s, es), worst_b = fmax(worst_b, eb), worst_sb = fmax(worst_sb, esb);
        }
    }
    fprintf(stderr, "gemm n=%d k=%d m=%d (%d rows checked, %d splits): err/sum|xw| skinny %.1e "
            "cublas %.1e skinny-cublas %.1e\n", n, k, m, nr, qrl_cuda_gemm_bf16_skinny_splits(k, m),
            worst_s, worst_b, worst_sb);
    cr_assert_eq(bad, 0, "gemm n=%d k=%d m=%d: %d elements out of bound (worst skinny %g cublas %g "
                 "skinny-cublas %g)", n, k, m, bad, worst_s, worst_b, worst_sb);
    qrl_cuda_free(dx); qrl_cuda_free(dw);
    free(ys); free(yb); free(ya); free(rows); free(x16); free(w16); free(x); free(w);
}

static const int NS[] = {1, 2, 3, 7, 8, 9, 16, 31, 32, 33, 63, 64, 65};
static const int MS[] = {1, 7, 129, 2048, 2560, 6144};
static const int KS[] = {8, 136, 2560, 9728};

Test(cuda_gemm_bf16, against_f64_reference, .timeout = 600) {
    require_gpu();
    qrl_cuda_gemm *sk = handle(QRL_CUDA_GEMM_BF16_SKINNY), *bl = handle(QRL_CUDA_GEMM_BF16_CUBLAS),
                  *au = handle(QRL_CUDA_GEMM_BF16_AUTO);
    uint64_t seed = 1000;
    /* every n with 4 (m, k) pairs, rotating so each n meets several m and every k */
    for (int i = 0; i < 13; i++)
        for (int j = 0; j < 4; j++) gemm_case(sk, bl, au, NS[i], KS[(i + j) % 4], MS[(i + 2 * j) % 6], seed += 2);
    /* the LM head's vocabulary (no split; many blocks) */
    const int big[][2] = {{1, 2560}, {8, 136}, {33, 8}, {64, 2560}, {65, 2560}, {3, 9728}};
    for (int i = 0; i < 6; i++) gemm_case(sk, bl, au, big[i][0], big[i][1], 151936, seed += 2);
    qrl_cuda_gemm_free(sk); qrl_cuda_gemm_free(bl); qrl_cuda_gemm_free(au);
}

/* Rows of an n-row product equal the first rows of the 64-row one, bit for bit, and a
 * second launch gives the same bits (split-K shapes and one without a split). */
Test(cuda_gemm_bf16, batch_invariant_and_repeatable) {
    require_gpu();
    qrl_cuda_gemm *sk = handle(QRL_CUDA_GEMM_BF16_SKINNY);
    const int shapes[][2] = {{9728, 2560}, {2560, 6144}, {2560, 19456}, {4096, 2560}, {2560, 151936}};
    const int ns[] = {1, 3, 8, 17, 40, 63};
    for (int s = 0; s < 5; s++) {
        int k = shapes[s][0], m = shapes[s][1];
        uint16_t *dx = dev_random((size_t)64 * k, 77 + s, 1.0f), *dw = dev_random((size_t)m * k, 88 + s, 0.05f);
        float *y64 = malloc((size_t)64 * m * 4), *y = malloc((size_t)64 * m * 4);
        run_gemm(sk, y64, dx, dw, 64, k, m, "skinny 64");
        run_gemm(sk, y, dx, dw, 64, k, m, "skinny 64 again");
        cr_assert(!memcmp(y, y64, (size_t)64 * m * 4), "k=%d m=%d: a second launch differs", k, m);
        for (int i = 0; i < 6; i++) {
            run_gemm(sk, y, dx, dw, ns[i], k, m, "skinny n");
            cr_assert(!memcmp(y, y64, (size_t)ns[i] * m * 4),
                      "k=%d m=%d (%d splits): rows of n=%d differ from the same rows at n=64", k, m,
                      qrl_cuda_gemm_bf16_skinny_splits(k, m), ns[i]);
        }
        fprintf(stderr, "batch invariance k=%d m=%d (%d splits): ok\n", k, m,
                qrl_cuda_gemm_bf16_skinny_splits(k, m));
        qrl_cuda_free(dx); qrl_cuda_free(dw);
        free(y64); free(y);
    }
    qrl_cuda_gemm_free(sk);
}

/* Operands the skinny kernel does not take: AUTO gives cuBLAS's bits, SKINNY says so. */
Test(cuda_gemm_bf16, fallback_and_errors) {
    require_gpu();
    qrl_cuda_gemm *sk = handle(QRL_CUDA_GEMM_BF16_SKINNY), *bl = handle(QRL_CUDA_GEMM_BF16_CUBLAS),
                  *au = handle(QRL_CUDA_GEMM_BF16_AUTO);
    qrl_error err;
    int n = 5, m = 300;
    uint16_t *dx = dev_random(8 * 1024, 5, 1.0f), *dw = dev_random(300 * 1024 + 8, 6, 0.05f);
    /* room for the 5 x 300 outputs here and the 8 x 2560 ones of the A/B switch below */
    float *ya = malloc((size_t)8 * 2560 * 4), *yb = malloc((size_t)8 * 2560 * 4);
    /* k = 12 and 33 (not multiples of 8); k = 64 with w one element off 16-byte alignment */
    const int ks[] = {12, 33, 64};
    for (int i = 0; i < 3; i++) {
        const uint16_t *w = i == 2 ? dw + 1 : dw;
        run_gemm(au, ya, dx, w, n, ks[i], m, "auto fallback");
        run_gemm(bl, yb, dx, w, n, ks[i], m, "cublas");
        cr_assert(!memcmp(ya, yb, (size_t)n * m * 4), "k=%d: AUTO is not cuBLAS's result", ks[i]);
        float *y;
        cr_assert_eq(qrl_cuda_malloc((void **)&y, (size_t)n * m * 4, &err), QRL_OK);
        cr_assert_eq(qrl_cuda_gemm_bf16(sk, y, dx, w, n, ks[i], m, NULL, &err), QRL_STATUS_UNSUPPORTED,
                     "k=%d: forced skinny accepted", ks[i]);
        qrl_cuda_free(y);
    }
    cr_assert_eq(qrl_cuda_gemm_bf16(sk, NULL, dx, dw, 0, 64, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_gemm_bf16(au, NULL, dx, dw, 4, 64, -1, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    /* the A/B switch: a handle made with QRL_GEMM_BF16_CUBLAS=1 runs cuBLAS where AUTO takes
     * the skinny kernel (8 rows of Qwen3-4B's o projection, 2560 x 4096) */
    qrl_cuda_gemm *env;
    setenv("QRL_GEMM_BF16_CUBLAS", "1", 1);
    cr_assert_eq(qrl_cuda_gemm_new(&env, &err), QRL_OK, "%s", err.msg);
    unsetenv("QRL_GEMM_BF16_CUBLAS");
    uint16_t *ox = dev_random((size_t)8 * 4096, 7, 1.0f), *ow = dev_random((size_t)2560 * 4096, 8, 0.05f);
    int sms = 0;
    cr_assert_eq(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    if (qrl_cuda_gemm_bf16_skinny_blocks(8, 4096, 2560) >= sms) /* 140 blocks: up to 140 SMs */
        cr_assert(qrl_cuda_gemm_bf16_picks_skinny(au, ox, ow, 8, 4096, 2560), "AUTO: no skinny kernel");
    cr_assert(!qrl_cuda_gemm_bf16_picks_skinny(env, ox, ow, 8, 4096, 2560),
              "QRL_GEMM_BF16_CUBLAS=1 still picks the skinny kernel");
    run_gemm(env, ya, ox, ow, 8, 4096, 2560, "env cublas");
    run_gemm(sk, yb, ox, ow, 8, 4096, 2560, "skinny");
    cr_assert(memcmp(ya, yb, (size_t)8 * 2560 * 4), "QRL_GEMM_BF16_CUBLAS=1 gave the skinny kernel's bits");
    qrl_cuda_free(ox); qrl_cuda_free(ow);
    qrl_cuda_gemm_free(env);
    qrl_cuda_free(dx); qrl_cuda_free(dw);
    free(ya); free(yb);
    qrl_cuda_gemm_free(sk); qrl_cuda_gemm_free(bl); qrl_cuda_gemm_free(au);
}
