/* NVFP4 per-row quantization on the GPU (kernels/cuda/nvfp4_quant.cuh, nvfp4_dev.cuh)
 * against qrl_nvfp4_quantize_row (kernels/cpu/quant.h), bit for bit.
 *
 * Fresh random rows (F32 and BF16 inputs; n odd, short last blocks, each launch shape of
 * the kernel: 1 block per thread in registers, 2, and the two-pass path above 32768), rows
 * with per-block spreads of 2^-40 .. 2^20 (block scales that underflow to 0 and whose
 * codes are then 0), an all-zero row, huge values (1e38, FLT_MAX: S_enc ~ 1e-35), tiny
 * ones (subnormal 1e-40: S_enc saturates to FLT_MAX), NaN and +-Inf in a block (that
 * block's scale 0x7F, codes 0, the rest of the row coded as finite values with the absmax
 * over finite elements), negative values rounding to zero (code 0x8), and a row built so
 * x * r_b lands exactly on every E2M1 rounding midpoint (ties to the even code).  Checked:
 *   - S_enc, block scales, packed codes: memcmp with the CPU's (every byte written, guard
 *     bytes on both sides untouched);
 *   - xq == e2m1(code) * decode(scale) as BF16 (exact; NaN where the scale is NaN) and
 *     s_dec == 1.0f / S_enc bitwise. */
#include <float.h>

#include "cpu/quant.h"
#include "cuda/nvfp4_quant.cuh"
#include "cuda_test_util.h"

#define BGUARD 64 /* guard bytes each side of a byte output */

/* A device byte buffer of n bytes with BGUARD bytes of 0xA5 each side and 0xA5 inside. */
static uint8_t *bytes_new(size_t n) {
    uint8_t *h = malloc(n + 2 * BGUARD);
    memset(h, 0xA5, n + 2 * BGUARD);
    uint8_t *d = dev_from(h, n + 2 * BGUARD);
    free(h);
    return d + BGUARD;
}

/* Fetch n bytes, asserting the guards are intact; frees the device buffer. */
static void bytes_fetch(uint8_t *d, size_t n, uint8_t *out, const char *what) {
    cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK, "%s: kernel error", what);
    uint8_t *h = malloc(n + 2 * BGUARD);
    cr_assert_eq(qrl_cuda_copy_to_host(h, d - BGUARD, n + 2 * BGUARD, NULL), QRL_OK);
    for (size_t i = 0; i < BGUARD; i++) {
        cr_assert_eq(h[i], 0xA5, "%s: guard byte before the output overwritten", what);
        cr_assert_eq(h[BGUARD + n + i], 0xA5, "%s: guard byte after the output overwritten", what);
    }
    memcpy(out, h + BGUARD, n);
    free(h);
    qrl_cuda_free(d - BGUARD);
}

/* Quantize x [rows, n] (F32; as BF16 when bf16, rounding it first) on the GPU and compare
 * every output with qrl_nvfp4_quantize_row on the same F32 values. */
static void check_rows(const float *x_in, int rows, int n, bool bf16, const char *what) {
    size_t tot = (size_t)rows * n;
    float *x = malloc(tot * 4);
    uint16_t *xb = malloc(tot * 2);
    for (size_t i = 0; i < tot; i++) {
        xb[i] = qrl_cpu_bf16_store(x_in[i]);
        x[i] = bf16 ? qrl_cpu_bf16_load(xb[i]) : x_in[i];
    }
    int cb = qrl_cuda_nvfp4_code_bytes(n), nb = qrl_cuda_nvfp4_blocks(n);
    uint8_t *wc = malloc((size_t)rows * cb), *ws = malloc((size_t)rows * nb);
    float *we = malloc((size_t)rows * 4);
    for (int r = 0; r < rows; r++)
        qrl_nvfp4_quantize_row(x + (size_t)r * n, n, wc + (size_t)r * cb, ws + (size_t)r * nb, &we[r]);

    void *dx = bf16 ? dev_from(xb, tot * 2) : dev_from(x, tot * 4);
    uint8_t *dc = bytes_new((size_t)rows * cb), *ds = bytes_new((size_t)rows * nb);
    guarded ge = guarded_new(rows, 4), gd = guarded_new(rows, 4), gq = guarded_new(tot, 2);
    qrl_cuda_nvfp4_act a = {.codes = dc, .scales = ds, .s_enc = guarded_ptr(ge),
                            .xq = guarded_ptr(gq), .s_dec = guarded_ptr(gd)};
    qrl_error err;
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, dx, bf16, rows, n, NULL, &err), QRL_OK, "%s",
                 err.msg);
    uint8_t *gc = malloc((size_t)rows * cb), *gs = malloc((size_t)rows * nb);
    float *genc = malloc((size_t)rows * 4), *gdec = malloc((size_t)rows * 4);
    uint16_t *gxq = malloc(tot * 2);
    bytes_fetch(dc, (size_t)rows * cb, gc, "codes");
    bytes_fetch(ds, (size_t)rows * nb, gs, "scales");
    guarded_fetch(ge, genc, "s_enc");
    guarded_fetch(gd, gdec, "s_dec");
    guarded_fetch(gq, gxq, "xq");
    for (int r = 0; r < rows; r++) {
        cr_assert(memcmp(&genc[r], &we[r], 4) == 0, "%s n=%d bf16=%d row %d: S_enc gpu %.9g cpu %.9g",
                  what, n, bf16, r, genc[r], we[r]);
        float dec = 1.0f / we[r];
        cr_assert(memcmp(&gdec[r], &dec, 4) == 0, "%s row %d: s_dec gpu %.9g want %.9g", what, r,
                  gdec[r], dec);
        for (int b = 0; b < nb; b++)
            cr_assert_eq(gs[(size_t)r * nb + b], ws[(size_t)r * nb + b],
                         "%s n=%d bf16=%d row %d block %d: scale gpu 0x%02x cpu 0x%02x", what, n,
                         bf16, r, b, gs[(size_t)r * nb + b], ws[(size_t)r * nb + b]);
        for (int i = 0; i < cb; i++)
            cr_assert_eq(gc[(size_t)r * cb + i], wc[(size_t)r * cb + i],
                         "%s n=%d bf16=%d row %d byte %d (x %g, %g): codes gpu 0x%02x cpu 0x%02x",
                         what, n, bf16, r, i, x[(size_t)r * n + 2 * i],
                         2 * i + 1 < n ? x[(size_t)r * n + 2 * i + 1] : 0.0f,
                         gc[(size_t)r * cb + i], wc[(size_t)r * cb + i]);
        for (int j = 0; j < n; j++) {
            uint8_t c = qrl_nibble_get(wc + (size_t)r * cb, j);
            float want = qrl_e2m1_decode(c) * qrl_e4m3_decode(ws[(size_t)r * nb + j / 16]);
            float got = qrl_cpu_bf16_load(gxq[(size_t)r * n + j]);
            if (isnan(want)) cr_assert(isnan(got), "%s row %d xq[%d] = %g, want NaN", what, r, j, got);
            else cr_assert(got == want && signbit(got) == signbit(want),
                           "%s row %d xq[%d] gpu %.9g want %.9g", what, r, j, got, want);
        }
    }
    qrl_cuda_free(dx);
    free(x); free(xb); free(wc); free(ws); free(we); free(gc); free(gs); free(genc); free(gdec);
    free(gxq);
}

static void check_both(const float *x, int rows, int n, const char *what) {
    check_rows(x, rows, n, false, what);
    check_rows(x, rows, n, true, what);
}

Test(cuda_nvfp4, random_rows) {
    require_gpu();
    static const int ns[] = {1, 7, 16, 17, 33, 100, 128, 1000, 2048, 2049, 6144, 8192, 9001,
                             32768, 40000};
    uint64_t s = 0x4f4e5f3131ull;
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        int n = ns[k], rows = n > 8192 ? 3 : 9;
        float *x = malloc((size_t)rows * n * 4);
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < n; j++) /* row scale from 2^-12 to 2^12, blocks spread 2^-3..1 */
                x[(size_t)r * n + j] = ldexpf(rng_unif(&s), 3 * (r - 4) - (j / 16) % 4);
        check_both(x, rows, n, "random");
        free(x);
    }
}

Test(cuda_nvfp4, wide_block_spread) {
    require_gpu();
    /* block b of a row scaled by 2^(20 - 4 (b % 16)): down to 2^-40, whose block scale
     * underflows to 0 (codes 0) against the row's absmax */
    uint64_t s = 0x5350524541ull;
    int rows = 4, n = 16 * 40 + 5;
    float *x = malloc((size_t)rows * n * 4);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) x[(size_t)r * n + j] = ldexpf(rng_unif(&s), 20 - 4 * ((j / 16 + r) % 16));
    check_both(x, rows, n, "spread");
    free(x);
}

Test(cuda_nvfp4, special_rows) {
    require_gpu();
    enum { N = 70, ROWS = 9 };
    float x[ROWS * N];
    uint64_t s = 0x5350454349ull;
    for (int i = 0; i < ROWS * N; i++) x[i] = rng_unif(&s);
    for (int j = 0; j < N; j++) x[0 * N + j] = 0.0f;                           /* zeros */
    for (int j = 0; j < N; j++) x[1 * N + j] = (j % 3 ? 1e38f : -FLT_MAX) * rng_unif(&s);
    x[1 * N + 5] = FLT_MAX;                                                  /* huge */
    for (int j = 0; j < N; j++) x[2 * N + j] = 1e-40f * rng_unif(&s);         /* subnormal */
    x[3 * N + 3] = NAN;                                                       /* NaN block */
    x[4 * N + 20] = INFINITY, x[4 * N + 50] = -INFINITY;                      /* Inf blocks */
    x[5 * N + 69] = NAN;                                                      /* short block */
    for (int j = 0; j < N; j++) x[6 * N + j] = -1e-3f * fabsf(rng_unif(&s));  /* -> -0 codes */
    x[6 * N + 0] = 100.0f;
    for (int j = 0; j < N; j++) x[7 * N + j] = 1e-30f * rng_unif(&s);         /* tiny */
    for (int j = 0; j < N; j++) x[8 * N + j] = NAN;                           /* all NaN */
    check_both(x, ROWS, N, "special");
}

Test(cuda_nvfp4, e2m1_midpoints) {
    require_gpu();
    /* absmax 2688 gives S_enc = 1; a block with absmax 6 gets scale 1.0 (code 0x38) and
     * r_b = 1, so its codes are E2M1(x) of the values as written: every midpoint, values
     * just off them, negatives, zeros of both signs */
    static const float blk[3][16] = {
        {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, -0.25f, -0.75f, -1.25f, -1.75f,
         -2.5f, -3.5f, -5.0f, -6.0f},
        {0.2500001f, 0.7499999f, 1.2500001f, 1.7499999f, 2.5000002f, 3.4999998f, 5.0000005f,
         0.0f, -0.0f, -0.1f, 0.1f, 0.5f, 1.5f, 3.0f, 4.0f, 6.0f},
        {0.24999999f, 0.7500001f, 1.2499999f, 1.7500001f, 2.4999998f, 3.5000002f, 4.9999995f,
         6.0f, 1.0f, 2.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f}};
    enum { N = 64 };
    float x[N] = {0};
    for (int b = 0; b < 3; b++) memcpy(x + 16 * b, blk[b], sizeof blk[b]);
    x[48] = 2688.0f;
    check_rows(x, 1, N, false, "midpoints");
}

Test(cuda_nvfp4, bad_arguments) {
    require_gpu();
    qrl_error err;
    float *d = dev_from((float[4]){1, 2, 3, 4}, 16);
    uint8_t *c = dev_from((uint8_t[2]){0}, 2);
    qrl_cuda_nvfp4_act a = {.codes = c}, none = {0};
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, d, false, 0, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "rows=0"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, d, false, 1, 0, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, NULL, false, 1, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&none, d, false, 1, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "no output"), "%s", err.msg);
    qrl_cuda_free(d);
    qrl_cuda_free(c);
}
