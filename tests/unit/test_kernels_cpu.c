/* Each CPU op against a naive double-precision computation on random inputs of odd
 * sizes, with guard values around outputs to catch stray writes (STYLE 8). */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"

#define GUARD 8
#define GUARD_VAL 12345.678f

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { /* xorshift64, uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}
static float *rand_buf(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}
/* n floats with GUARD guard floats on each side; returns the interior. */
static float *guarded(size_t n) {
    float *p = malloc((n + 2 * GUARD) * sizeof(float));
    for (size_t i = 0; i < n + 2 * GUARD; i++) p[i] = GUARD_VAL;
    return p + GUARD;
}
static void check_guards(float *interior, size_t n) {
    for (int i = 1; i <= GUARD; i++) {
        cr_assert_eq(interior[-i], GUARD_VAL, "write before the output");
        cr_assert_eq(interior[n + i - 1], GUARD_VAL, "write after the output");
    }
    free(interior - GUARD);
}
/* max |a - ref| / max |ref| */
static double norm_err(const float *a, const double *ref, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}

Test(kernels_cpu, matmul_odd_shapes_with_and_without_bias) {
    const int ns[] = {1, 3, 7}, ks[] = {1, 5, 13, 67, 130}, ms[] = {1, 9, 33};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 3; c++)
                for (int use_bias = 0; use_bias < 2; use_bias++) {
                    int n = ns[a], k = ks[b], m = ms[c];
                    float *x = rand_buf((size_t)n * k), *w = rand_buf((size_t)m * k);
                    float *bias = use_bias ? rand_buf((size_t)m) : NULL;
                    float *out = guarded((size_t)n * m);
                    qrl_cpu_matmul(out, x, w, bias, n, k, m);
                    /* Per element: |out - exact| <= 1e-6 * sum |x_t w_t| (F32 summation of
                     * k terms in 8 partial sums; the bound holds with a wide margin). */
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < m; j++) {
                            double s = bias ? bias[j] : 0, mag = bias ? fabs(bias[j]) : 0;
                            for (int t = 0; t < k; t++) {
                                s += (double)x[i * k + t] * w[j * k + t];
                                mag += fabs((double)x[i * k + t] * w[j * k + t]);
                            }
                            double e = fabs(out[i * m + j] - s);
                            cr_assert(e <= 1e-6 * mag, "matmul n=%d k=%d m=%d err %g of %g", n, k, m,
                                      e, mag);
                        }
                    check_guards(out, (size_t)n * m);
                    free(x); free(w); free(bias);
                }
}

Test(kernels_cpu, matmul_same_bits_for_any_thread_count_and_batch) {
    int n = 5, k = 301, m = 257;
    float *x = rand_buf((size_t)n * k), *w = rand_buf((size_t)m * k);
    float *a = malloc(sizeof(float) * n * m), *b = malloc(sizeof(float) * n * m),
          *row = malloc(sizeof(float) * m);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    qrl_cpu_matmul(a, x, w, NULL, n, k, m);
    omp_set_num_threads(3);
    qrl_cpu_matmul(b, x, w, NULL, n, k, m);
    omp_set_num_threads(saved);
    cr_assert_eq(memcmp(a, b, sizeof(float) * n * m), 0);
    qrl_cpu_matmul(row, x + 3 * k, w, NULL, 1, k, m); /* row 3 alone */
    cr_assert_eq(memcmp(row, a + 3 * m, sizeof(float) * m), 0);
    free(x); free(w); free(a); free(b); free(row);
}

Test(kernels_cpu, rmsnorm) {
    const int ds[] = {1, 7, 64, 129};
    for (int c = 0; c < 4; c++) {
        int n = 3, d = ds[c];
        float *x = rand_buf((size_t)n * d), *w = rand_buf((size_t)d), *out = guarded((size_t)n * d);
        qrl_cpu_rmsnorm(out, x, w, n, d, 1e-5f);
        double *ref = malloc(sizeof(double) * n * d);
        for (int r = 0; r < n; r++) {
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
            for (int i = 0; i < d; i++) ref[r * d + i] = x[r * d + i] / sqrt(ss / d + 1e-5) * w[i];
        }
        cr_assert(norm_err(out, ref, (size_t)n * d) < 1e-6, "d=%d", d);
        check_guards(out, (size_t)n * d);
        /* in place gives the same bits */
        float *y = malloc(sizeof(float) * n * d), *o2 = malloc(sizeof(float) * n * d);
        memcpy(y, x, sizeof(float) * n * d);
        qrl_cpu_rmsnorm(o2, x, w, n, d, 1e-5f);
        qrl_cpu_rmsnorm(y, y, w, n, d, 1e-5f);
        cr_assert_eq(memcmp(y, o2, sizeof(float) * n * d), 0);
        free(x); free(w); free(ref); free(y); free(o2);
    }
}

Test(kernels_cpu, silu_mul_add_softmax) {
    size_t n = 1001;
    float *g = rand_buf(n), *u = rand_buf(n), *out = guarded(n);
    for (size_t i = 0; i < n; i++) g[i] *= 12; /* reach the saturated tails */
    qrl_cpu_silu_mul(out, g, u, n);
    double *ref = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) ref[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
    cr_assert(norm_err(out, ref, n) < 1e-6);
    check_guards(out, n);

    float *x = rand_buf(n), *y = rand_buf(n), *x0 = malloc(sizeof(float) * n);
    memcpy(x0, x, sizeof(float) * n);
    qrl_cpu_add(x, y, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(x[i], x0[i] + y[i]);

    for (size_t i = 0; i < n; i++) x[i] = x0[i] * 30; /* wide range: needs max-subtraction */
    qrl_cpu_softmax(x, (int)n);
    double mx = -INFINITY, s = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, x0[i] * 30.0);
    for (size_t i = 0; i < n; i++) s += exp(x0[i] * 30.0 - mx);
    for (size_t i = 0; i < n; i++) ref[i] = exp(x0[i] * 30.0 - mx) / s;
    cr_assert(norm_err(x, ref, n) < 1e-5);
    free(g); free(u); free(ref); free(x); free(y); free(x0);
}

Test(kernels_cpu, argmax_first_on_ties_and_ignores_nan) {
    float a[] = {1, 5, 3, 5, -2};
    cr_assert_eq(qrl_cpu_argmax(a, 5), 1);
    float b[] = {NAN, -1, 2, NAN, 2};
    cr_assert_eq(qrl_cpu_argmax(b, 5), 2);
    float c[] = {-INFINITY, -INFINITY};
    cr_assert_eq(qrl_cpu_argmax(c, 2), 0);
    float d[] = {7};
    cr_assert_eq(qrl_cpu_argmax(d, 1), 0);
}

Test(kernels_cpu, rope_inv_freq_default_linear_llama3) {
    qrl_rope_params p = {.theta = 10000.0, .scaling = QRL_ROPE_SCALING_NONE};
    float f[4];
    qrl_cpu_rope_inv_freq(f, 8, &p);
    const double plain[4] = {1.0, 0.1, 0.01, 0.001}; /* 10000^(-2j/8) */
    for (int j = 0; j < 4; j++) cr_assert(fabs(f[j] - plain[j]) <= 1e-7 * plain[j], "j=%d %g", j, f[j]);
    p.scaling = QRL_ROPE_SCALING_LINEAR;
    p.factor = 4;
    qrl_cpu_rope_inv_freq(f, 8, &p);
    for (int j = 0; j < 4; j++) cr_assert(fabs(f[j] - plain[j] / 4) <= 1e-7 * plain[j]);
    /* llama3, factor 8, low 1, high 4, original context 64: band edges at wavelengths
     * 64 / 1 = 64 and 64 / 4 = 16.  Hand computation:
     *   j=0: wavelength 2*pi = 6.28 < 16       -> kept:    1
     *   j=1: wavelength 62.83 in [16, 64]      -> smooth = (64 / 62.83 - 1) / 3 = 0.0061972
     *        (1 - smooth) * 0.1 / 8 + smooth * 0.1 = 0.0130422560
     *   j=2: wavelength 628 > 64               -> divided: 0.01 / 8 = 0.00125
     *   j=3: wavelength 6283 > 64              -> divided: 0.001 / 8 = 0.000125 */
    p = (qrl_rope_params){.theta = 10000.0, .scaling = QRL_ROPE_SCALING_LLAMA3, .factor = 8,
                          .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 64};
    qrl_cpu_rope_inv_freq(f, 8, &p);
    const double l3[4] = {1.0, 0.013042256043820465, 0.00125, 0.000125};
    for (int j = 0; j < 4; j++) cr_assert(fabs(f[j] - l3[j]) <= 2e-7 * l3[j], "j=%d %.9g", j, f[j]);
    /* Llama 3.1 8B's own parameters (theta 500000, head_dim 128, 8192): the highest
     * frequencies are untouched, the lowest divided by exactly 8. */
    float g[64], h[64];
    p = (qrl_rope_params){.theta = 500000.0, .scaling = QRL_ROPE_SCALING_LLAMA3, .factor = 8,
                          .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 8192};
    qrl_cpu_rope_inv_freq(g, 128, &p);
    p.scaling = QRL_ROPE_SCALING_NONE;
    qrl_cpu_rope_inv_freq(h, 128, &p);
    cr_assert_eq(g[0], h[0]);
    cr_assert_eq(g[63], h[63] / 8);
}

Test(kernels_cpu, rope_apply_both_layouts) {
    int H = 3, hd = 10, half = 5, pos = 17;
    float inv[5], cs[5], sn[5];
    qrl_rope_params p = {.theta = 10000.0};
    qrl_cpu_rope_inv_freq(inv, hd, &p);
    qrl_cpu_rope_cos_sin(cs, sn, inv, half, pos);
    for (int j = 0; j < half; j++) {
        double a = (double)(float)(pos * inv[j]);
        cr_assert(fabs(cs[j] - cos(a)) < 1e-7 && fabs(sn[j] - sin(a)) < 1e-7);
    }
    for (int layout = 0; layout < 2; layout++) {
        float *x = rand_buf((size_t)H * hd), *y = malloc(sizeof(float) * H * hd);
        memcpy(y, x, sizeof(float) * H * hd);
        qrl_cpu_rope_apply(y, H, hd, cs, sn, (qrl_rope_layout)layout);
        for (int h = 0; h < H; h++)
            for (int j = 0; j < half; j++) {
                int i0 = layout == QRL_ROPE_LAYOUT_HALF ? j : 2 * j;
                int i1 = layout == QRL_ROPE_LAYOUT_HALF ? j + half : 2 * j + 1;
                double x0 = x[h * hd + i0], x1 = x[h * hd + i1], c = cs[j], s = sn[j];
                cr_assert(fabs(y[h * hd + i0] - (x0 * c - x1 * s)) < 1e-6);
                cr_assert(fabs(y[h * hd + i1] - (x1 * c + x0 * s)) < 1e-6);
            }
        free(x); free(y);
    }
    /* position 0 is the identity */
    qrl_cpu_rope_cos_sin(cs, sn, inv, half, 0);
    float z[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, z0[10];
    memcpy(z0, z, sizeof z);
    qrl_cpu_rope_apply(z, 1, hd, cs, sn, QRL_ROPE_LAYOUT_HALF);
    cr_assert_eq(memcmp(z, z0, sizeof z), 0);
}

/* Paged attention vs dense double attention; blocks deliberately out of order. */
static void attention_case(qrl_dtype dt, int n_ctx, int block_size, double tol) {
    int KVH = 3, hd = 12, n_blocks = (n_ctx + block_size - 1) / block_size + 2;
    size_t row = (size_t)KVH * hd, blk = (size_t)block_size * row;
    float *kd = rand_buf((size_t)n_ctx * row), *vd = rand_buf((size_t)n_ctx * row), *q = rand_buf(hd);
    for (int i = 0; i < hd; i++) q[i] *= 3;
    int32_t table[128];
    for (int b = 0; b < n_blocks; b++) table[b] = (b * 5 + 3) % n_blocks; /* a permutation */
    size_t esz = dt == QRL_DTYPE_F32 ? 4 : 2;
    unsigned char *kp = calloc((size_t)n_blocks * blk, esz), *vp = calloc((size_t)n_blocks * blk, esz);
    for (int t = 0; t < n_ctx; t++)
        for (size_t i = 0; i < row; i++) {
            size_t at = (size_t)table[t / block_size] * blk + (size_t)(t % block_size) * row + i;
            float kv = kd[t * row + i], vv = vd[t * row + i];
            if (dt == QRL_DTYPE_BF16) {
                ((uint16_t *)kp)[at] = qrl_cpu_bf16_store(kv);
                ((uint16_t *)vp)[at] = qrl_cpu_bf16_store(vv);
            } else {
                ((float *)kp)[at] = kv;
                ((float *)vp)[at] = vv;
            }
        }
    qrl_kv_view view = {.k = kp, .v = vp, .dtype = dt, .block_table = table,
                        .block_size = block_size, .n_kv_heads = KVH, .head_dim = hd};
    float *out = guarded((size_t)hd), *scratch = malloc(sizeof(float) * n_ctx);
    int kvh = 2;
    float scale = 1.0f / sqrtf((float)hd);
    qrl_cpu_attention_head(out, q, &view, kvh, n_ctx, scale, scratch);
    double *s = malloc(sizeof(double) * n_ctx), ref[12] = {0}, mx = -INFINITY, sum = 0;
    for (int t = 0; t < n_ctx; t++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * kd[t * row + kvh * hd + i];
        s[t] = d * scale;
        mx = fmax(mx, s[t]);
    }
    for (int t = 0; t < n_ctx; t++) sum += (s[t] = exp(s[t] - mx));
    for (int t = 0; t < n_ctx; t++)
        for (int i = 0; i < hd; i++) ref[i] += s[t] / sum * vd[t * row + kvh * hd + i];
    double e = norm_err(out, ref, (size_t)hd);
    cr_assert(e < tol, "dtype %s n_ctx %d block %d: err %g", qrl_dtype_name(dt), n_ctx, block_size, e);
    check_guards(out, (size_t)hd);
    free(kd); free(vd); free(q); free(kp); free(vp); free(scratch); free(s);
}

Test(kernels_cpu, attention_paged_f32_and_bf16) {
    const int ctxs[] = {1, 2, 17, 100}, bss[] = {1, 3, 16};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++) {
            attention_case(QRL_DTYPE_F32, ctxs[a], bss[b], 1e-6);
            attention_case(QRL_DTYPE_BF16, ctxs[a], bss[b], 2e-2); /* K/V carry 8 bits */
        }
}

Test(kernels_cpu, bf16_round_to_nearest_even) {
    cr_assert_eq(qrl_cpu_bf16_store(1.0f), 0x3f80);
    float f;
    uint32_t u = 0x3f808000u; /* exactly halfway between 0x3f80 and 0x3f81: to even */
    memcpy(&f, &u, 4);
    cr_assert_eq(qrl_cpu_bf16_store(f), 0x3f80);
    u = 0x3f818000u; /* halfway between 0x3f81 and 0x3f82: to even */
    memcpy(&f, &u, 4);
    cr_assert_eq(qrl_cpu_bf16_store(f), 0x3f82);
    u = 0x3f808001u; /* above halfway: up */
    memcpy(&f, &u, 4);
    cr_assert_eq(qrl_cpu_bf16_store(f), 0x3f81);
    cr_assert(isnan(qrl_cpu_bf16_load(qrl_cpu_bf16_store(NAN))));
    cr_assert_eq(qrl_cpu_bf16_load(qrl_cpu_bf16_store(INFINITY)), INFINITY);
    cr_assert_eq(qrl_cpu_bf16_load(0xc000), -2.0f);
}
