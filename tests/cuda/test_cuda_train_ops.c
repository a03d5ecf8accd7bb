/* CUDA training layers (kernels/cuda/train_ops.cuh, gemm.cuh's row-major GEMMs) against the
 * CPU reference layers (kernels/cpu/train_ops.h) on fresh random inputs, several shapes
 * including odd sizes.  Inputs that are BF16 on the GPU are rounded to BF16 first and the
 * CPU runs on those exact values in F32, so the bounds only cover the GPU's own roundings:
 *   F32 outputs (rstd, accumulated gradients, logp/ent/lse): relative L2 <= 1e-5 .. 1e-4
 *   (summation order; atomics), BF16 outputs: relative L2 <= 8e-3 (2^-8 per element,
 *   plus the difference of one rounding inside the op). */
#include "cuda_test_util.h"

#include "cpu/train_ops.h"
#include "cuda/gemm.cuh"
#include "cuda/train_ops.cuh"

#define TOL_F32 1e-5
#define TOL_SUM 1e-4
#define TOL_BF16 8e-3

static uint64_t seed_state = 0x7a11u;

static float *fetch_f32(const void *d, size_t n) {
    float *h = malloc(n * 4);
    cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(h, d, n * 4, NULL), QRL_OK);
    return h;
}
static float *fetch_bf16(const void *d, size_t n) {
    uint16_t *b = malloc(n * 2);
    float *h = malloc(n * 4);
    cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(b, d, n * 2, NULL), QRL_OK);
    bf16_to_f32_host(b, h, n);
    free(b);
    return h;
}
static float *rnd(size_t n, float scale) {
    float *x = malloc(n * 4);
    rand_f32(x, n, scale, &seed_state);
    return x;
}
/* BF16 device copy of n random values; their exact F32 values in *f. */
static uint16_t *rnd_bf16_dev(size_t n, float mean, float scale, float **f) {
    uint16_t *b = malloc(n * 2);
    *f = malloc(n * 4);
    rand_bf16(b, *f, n, mean, scale, &seed_state);
    uint16_t *d = dev_from(b, n * 2);
    free(b);
    return d;
}
static void expect_rel(const float *got, const float *want, size_t n, double tol,
                       const char *what) {
    double e = rel_err(got, want, n);
    cr_expect(e <= tol, "%s: relative L2 error %.3e > %.1e", what, e, tol);
}
static float bf16r(float x) { return qrl_cpu_bf16_load(qrl_cpu_bf16_store(x)); }

Test(cuda_train_ops, rmsnorm_forward_backward) {
    require_gpu();
    const int shapes[][2] = {{1, 64}, {37, 96}, {130, 1000}, {17, 4096}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], d = shapes[si][1];
        size_t nd = (size_t)n * d;
        float *x = rnd(nd, 2.0f), *add = rnd(nd, 1.0f), *bias = rnd(d, 0.5f), *g = rnd(d, 1.0f);
        float *dx0 = rnd(nd, 1.0f), *dg0 = rnd(d, 1.0f), *dy = rnd(nd, 1.0f);
        /* CPU: x_out = x + (add + bias), then norm; backward accumulates onto dx0, dg0 */
        float *xo = malloc(nd * 4), *y = malloc(nd * 4), *rs = malloc(n * 4);
        for (size_t i = 0; i < nd; i++) xo[i] = x[i] + (add[i] + bias[i % d]);
        qrl_train_rmsnorm_forward(y, rs, xo, g, n, d, 1e-5f);
        float *dx = malloc(nd * 4), *dg = malloc(d * 4);
        memcpy(dx, dx0, nd * 4), memcpy(dg, dg0, d * 4);
        qrl_train_rmsnorm_backward(dx, dg, dy, xo, g, rs, n, d);

        float *d_x = dev_from(x, nd * 4), *d_add = dev_from(add, nd * 4),
              *d_b = dev_from(bias, d * 4), *d_g = dev_from(g, d * 4);
        float *d_xo = dev_from(x, nd * 4);
        guarded gy = guarded_new(nd, 2), grs = guarded_new(n, 4), gdxb = guarded_new(nd, 2);
        cr_assert_eq(qrl_cuda_train_rmsnorm_forward(guarded_ptr(gy), guarded_ptr(grs), d_xo, d_x,
                                                    d_add, d_b, d_g, n, d, 1e-5f, NULL, NULL),
                     QRL_OK);
        float *got_xo = fetch_f32(d_xo, nd);
        uint16_t *yb = malloc(nd * 2);
        float *got_y = malloc(nd * 4), *got_rs = malloc(n * 4);
        guarded_fetch(gy, yb, "rmsnorm y"), guarded_fetch(grs, got_rs, "rmsnorm rstd");
        bf16_to_f32_host(yb, got_y, nd);
        expect_rel(got_xo, xo, nd, 1e-7, "rmsnorm x_out");
        expect_rel(got_rs, rs, n, TOL_F32, "rmsnorm rstd");
        expect_rel(got_y, y, nd, TOL_BF16, "rmsnorm y");

        float *d_dx = dev_from(dx0, nd * 4), *d_dg = dev_from(dg0, d * 4),
              *d_dy = dev_from(dy, nd * 4), *d_rs = dev_from(rs, n * 4),
              *d_xo2 = dev_from(xo, nd * 4);
        cr_assert_eq(qrl_cuda_train_rmsnorm_backward(d_dx, guarded_ptr(gdxb), d_dg, d_dy, d_xo2,
                                                     d_g, d_rs, n, d, NULL, NULL), QRL_OK);
        float *got_dx = fetch_f32(d_dx, nd), *got_dg = fetch_f32(d_dg, d);
        float *got_dxb = malloc(nd * 4);
        guarded_fetch(gdxb, yb, "rmsnorm dx_bf16");
        bf16_to_f32_host(yb, got_dxb, nd);
        expect_rel(got_dx, dx, nd, TOL_F32, "rmsnorm dx");
        expect_rel(got_dxb, dx, nd, TOL_BF16, "rmsnorm dx bf16");
        expect_rel(got_dg, dg, d, TOL_SUM, "rmsnorm dg");
        qrl_cuda_free(d_x), qrl_cuda_free(d_add), qrl_cuda_free(d_b), qrl_cuda_free(d_g);
        qrl_cuda_free(d_xo), qrl_cuda_free(d_dx), qrl_cuda_free(d_dg), qrl_cuda_free(d_dy);
        qrl_cuda_free(d_rs), qrl_cuda_free(d_xo2);
        free(x), free(add), free(bias), free(g), free(dx0), free(dg0), free(dy), free(xo);
        free(y), free(rs), free(dx), free(dg), free(got_xo), free(yb), free(got_y);
        free(got_rs), free(got_dx), free(got_dg), free(got_dxb);
    }
}

/* Reference rotation of one row for either layout; inverse = the transpose (backward). */
static void rope_ref(float *y, const float *x, const float *c, const float *s, int hd,
                     int interleaved, int inverse) {
    for (int p = 0; p < hd / 2; p++) {
        int a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + hd / 2;
        float sn = inverse ? -s[p] : s[p];
        y[a] = x[a] * c[p] - x[b] * sn;
        y[b] = x[b] * c[p] + x[a] * sn;
    }
}

static void check_qk(int T, int nh, int hd, int with_norm, int with_bias, int interleaved) {
    size_t n = (size_t)T * nh * hd, half = hd / 2;
    float *xf;
    uint16_t *d_x = rnd_bf16_dev(n, 0.0f, 2.0f, &xf);
    float *bias = with_bias ? rnd((size_t)nh * hd, 0.5f) : NULL;
    float *g = with_norm ? rnd(hd, 1.0f) : NULL;
    float *cs = malloc(T * half * 4), *sn = malloc(T * half * 4), *inv = malloc(half * 4);
    int32_t *pos = malloc(T * 4);
    for (int t = 0; t < T; t++) pos[t] = (t * 37) % 500;
    for (size_t j = 0; j < half; j++) inv[j] = powf(10000.0f, -2.0f * j / hd);
    qrl_train_rope_cos_sin(cs, sn, pos, inv, T, hd);
    /* CPU: xb = bf16(x + bias), xn = norm(xb) * g, y = rope(xn) */
    float *xb = malloc(n * 4), *xn = malloc(n * 4), *y = malloc(n * 4), *rs = malloc(T * nh * 4);
    for (size_t i = 0; i < n; i++) xb[i] = bias ? bf16r(xf[i] + bias[i % ((size_t)nh * hd)]) : xf[i];
    if (g) qrl_train_head_rmsnorm_forward(xn, rs, xb, g, T, nh, hd, 1e-6f);
    else memcpy(xn, xb, n * 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            size_t o = ((size_t)t * nh + h) * hd;
            rope_ref(y + o, xn + o, cs + t * half, sn + t * half, hd, interleaved, 0);
        }
    float *d_cs = dev_from(cs, T * half * 4), *d_sn = dev_from(sn, T * half * 4);
    float *d_bias = bias ? dev_from(bias, (size_t)nh * hd * 4) : NULL;
    float *d_g = g ? dev_from(g, hd * 4) : NULL;
    guarded gy = guarded_new(n, 2), grs = guarded_new((size_t)T * nh, 4);
    cr_assert_eq(qrl_cuda_train_qk_forward(guarded_ptr(gy), d_x, g ? guarded_ptr(grs) : NULL,
                                           d_bias, d_g, d_cs, d_sn, T, nh, hd, interleaved, 1e-6f,
                                           NULL, NULL), QRL_OK);
    uint16_t *yb = malloc(n * 2);
    float *got_y = malloc(n * 4), *got_rs = malloc(T * nh * 4);
    guarded_fetch(gy, yb, "qk y");
    bf16_to_f32_host(yb, got_y, n);
    float *got_x = fetch_bf16(d_x, n);
    char what[96];
    snprintf(what, sizeof what, "qk T=%d nh=%d hd=%d norm=%d bias=%d il=%d", T, nh, hd, with_norm,
             with_bias, interleaved);
    expect_rel(got_x, xb, n, 0.0, what);
    expect_rel(got_y, y, n, TOL_BF16, what);
    if (g) {
        guarded_fetch(grs, got_rs, "qk rstd");
        expect_rel(got_rs, rs, (size_t)T * nh, TOL_F32, what);
    } else {
        qrl_cuda_free(grs.base);
    }
    /* backward: dy at the rope output -> dxn = R^T dy -> norm backward -> dx, dg, dbias */
    float *dy = rnd(n, 1.0f), *dxn = malloc(n * 4), *dx = calloc(n, 4);
    float *dg = calloc(hd, 4), *db = calloc((size_t)nh * hd, 4);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            size_t o = ((size_t)t * nh + h) * hd;
            rope_ref(dxn + o, dy + o, cs + t * half, sn + t * half, hd, interleaved, 1);
        }
    if (g) qrl_train_head_rmsnorm_backward(dx, dg, dxn, xb, g, rs, T, nh, hd);
    else memcpy(dx, dxn, n * 4);
    for (size_t i = 0; i < n; i++) db[i % ((size_t)nh * hd)] += dx[i];
    float *d_dy = dev_from(dy, n * 4), *d_rs = g ? dev_from(rs, T * nh * 4) : NULL;
    float *d_dg = dev_from(dg, hd * 4), *d_db = dev_from(db, (size_t)nh * hd * 4);
    cr_assert_eq(qrl_cuda_copy_to_device(d_dg, (float[256]){0}, hd * 4, NULL), QRL_OK);
    float *zeros = calloc((size_t)nh * hd, 4);
    cr_assert_eq(qrl_cuda_copy_to_device(d_db, zeros, (size_t)nh * hd * 4, NULL), QRL_OK);
    guarded gdx = guarded_new(n, 2);
    cr_assert_eq(qrl_cuda_train_qk_backward(guarded_ptr(gdx), g ? d_dg : NULL,
                                            bias ? d_db : NULL, d_dy, d_x, d_g, d_rs, d_cs, d_sn,
                                            T, nh, hd, interleaved, NULL, NULL), QRL_OK);
    float *got_dx = malloc(n * 4);
    guarded_fetch(gdx, yb, "qk dx");
    bf16_to_f32_host(yb, got_dx, n);
    expect_rel(got_dx, dx, n, TOL_BF16, what);
    if (g) {
        float *got_dg = fetch_f32(d_dg, hd);
        expect_rel(got_dg, dg, hd, TOL_SUM, what);
        free(got_dg);
    }
    if (bias) {
        float *got_db = fetch_f32(d_db, (size_t)nh * hd);
        expect_rel(got_db, db, (size_t)nh * hd, TOL_SUM, what);
        free(got_db);
    }
    qrl_cuda_free(d_x), qrl_cuda_free(d_cs), qrl_cuda_free(d_sn), qrl_cuda_free(d_bias);
    qrl_cuda_free(d_g), qrl_cuda_free(d_dy), qrl_cuda_free(d_rs), qrl_cuda_free(d_dg);
    qrl_cuda_free(d_db);
    free(xf), free(bias), free(g), free(cs), free(sn), free(inv), free(pos), free(xb), free(xn);
    free(y), free(rs), free(yb), free(got_y), free(got_rs), free(got_x), free(dy), free(dxn);
    free(dx), free(dg), free(db), free(zeros), free(got_dx);
}

Test(cuda_train_ops, qk_bias_norm_rope) {
    require_gpu();
    check_qk(1, 1, 8, 0, 0, 1);      /* llama2.c stories260K: hd 8, interleaved */
    check_qk(37, 4, 16, 0, 1, 0);    /* qwen2: bias, no norm */
    check_qk(50, 2, 32, 1, 0, 0);    /* qwen3: head norm */
    check_qk(129, 14, 64, 1, 1, 0);  /* both, 0.5B head count */
    check_qk(33, 2, 128, 1, 0, 1);
    check_qk(9, 3, 256, 0, 0, 0);
}

Test(cuda_train_ops, swiglu_colsum_embedding) {
    require_gpu();
    const int64_t n = 12345;
    float *gf, *uf;
    uint16_t *d_g = rnd_bf16_dev(n, 0.0f, 4.0f, &gf), *d_u = rnd_bf16_dev(n, 0.0f, 2.0f, &uf);
    float *h = malloc(n * 4), *dh = rnd(n, 1.0f), *dg = calloc(n, 4), *du = calloc(n, 4);
    qrl_train_swiglu_forward(h, gf, uf, n);
    qrl_train_swiglu_backward(dg, du, dh, gf, uf, n);
    guarded gh = guarded_new(n, 2), gdg = guarded_new(n, 2), gdu = guarded_new(n, 2);
    float *d_dh = dev_from(dh, n * 4);
    cr_assert_eq(qrl_cuda_train_swiglu_forward(guarded_ptr(gh), d_g, d_u, n, NULL, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_train_swiglu_backward(guarded_ptr(gdg), guarded_ptr(gdu), d_dh, d_g, d_u,
                                                n, NULL, NULL), QRL_OK);
    uint16_t *b = malloc(n * 2);
    float *got = malloc(n * 4);
    guarded_fetch(gh, b, "swiglu h"), bf16_to_f32_host(b, got, n);
    expect_rel(got, h, n, TOL_BF16, "swiglu h");
    guarded_fetch(gdg, b, "swiglu dgate"), bf16_to_f32_host(b, got, n);
    expect_rel(got, dg, n, TOL_BF16, "swiglu dgate");
    guarded_fetch(gdu, b, "swiglu dup"), bf16_to_f32_host(b, got, n);
    expect_rel(got, du, n, TOL_BF16, "swiglu dup");

    /* column sums of F32 and BF16 rows onto a random start */
    const int T = 300, N = 77;
    float *y = rnd((size_t)T * N, 1.0f), *db0 = rnd(N, 1.0f), *want = malloc(N * 4);
    for (int f32 = 0; f32 <= 1; f32++) {
        uint16_t *yb = malloc((size_t)T * N * 2);
        float *yv = malloc((size_t)T * N * 4);
        for (int i = 0; i < T * N; i++) yb[i] = qrl_cpu_bf16_store(y[i]), yv[i] = f32 ? y[i] : qrl_cpu_bf16_load(yb[i]);
        memcpy(want, db0, N * 4);
        qrl_train_matmul_backward(NULL, NULL, want, yv, yv, yv, T, 1, N); /* db += colsum */
        void *d_y = f32 ? dev_from(y, (size_t)T * N * 4) : dev_from(yb, (size_t)T * N * 2);
        float *d_db = dev_from(db0, N * 4);
        cr_assert_eq(qrl_cuda_train_colsum(d_db, d_y, f32, T, N, NULL, NULL), QRL_OK);
        float *got_db = fetch_f32(d_db, N);
        expect_rel(got_db, want, N, TOL_SUM, f32 ? "colsum f32" : "colsum bf16");
        qrl_cuda_free(d_y), qrl_cuda_free(d_db);
        free(yb), free(yv), free(got_db);
    }
    /* embedding: forward gathers F32 rows; backward adds repeated tokens' rows */
    const int V = 50, D = 33, TT = 40;
    float *table = rnd((size_t)V * D, 1.0f), *dx = rnd((size_t)TT * D, 1.0f);
    float *dtab = rnd((size_t)V * D, 1.0f), *x = malloc((size_t)TT * D * 4);
    int32_t tok[40];
    for (int t = 0; t < TT; t++) tok[t] = (t * 7) % 13; /* many repeats */
    float *d_table = dev_from(table, (size_t)V * D * 4), *d_dtab = dev_from(dtab, (size_t)V * D * 4);
    float *d_dx = dev_from(dx, (size_t)TT * D * 4);
    int32_t *d_tok = dev_from(tok, sizeof tok);
    guarded gx = guarded_new((size_t)TT * D, 4);
    cr_assert_eq(qrl_train_embedding_forward(x, tok, table, TT, V, D, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_train_embedding_forward(guarded_ptr(gx), d_tok, d_table, TT, D, NULL,
                                                  NULL), QRL_OK);
    float *got_x = malloc((size_t)TT * D * 4);
    guarded_fetch(gx, got_x, "embedding x");
    expect_rel(got_x, x, (size_t)TT * D, 0.0, "embedding forward");
    qrl_train_embedding_backward(dtab, dx, tok, TT, V, D);
    cr_assert_eq(qrl_cuda_train_embedding_backward(d_dtab, d_dx, d_tok, TT, D, NULL, NULL), QRL_OK);
    float *got_dt = fetch_f32(d_dtab, (size_t)V * D);
    expect_rel(got_dt, dtab, (size_t)V * D, TOL_F32, "embedding backward");
    qrl_cuda_free(d_g), qrl_cuda_free(d_u), qrl_cuda_free(d_dh), qrl_cuda_free(d_table);
    qrl_cuda_free(d_dtab), qrl_cuda_free(d_dx), qrl_cuda_free(d_tok);
    free(gf), free(uf), free(h), free(dh), free(dg), free(du), free(b), free(got), free(y);
    free(db0), free(want), free(table), free(dx), free(dtab), free(x), free(got_x), free(got_dt);
}

Test(cuda_train_ops, logprob_forward_backward) {
    require_gpu();
    const int shapes[][2] = {{1, 7}, {19, 1000}, {5, 151936}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int T = shapes[si][0], V = shapes[si][1];
        size_t n = (size_t)T * V;
        float *z = rnd(n, 8.0f), *dlogp = rnd(T, 1.0f), *dent = rnd(T, 1.0f);
        int32_t *tg = malloc(T * 4);
        for (int t = 0; t < T; t++) tg[t] = t % 4 == 3 ? -1 : (t * 131) % V;
        float *lp = malloc(T * 4), *ent = malloc(T * 4), *lse = malloc(T * 4), *dz = malloc(n * 4);
        cr_assert_eq(qrl_train_logprob_forward(lp, ent, lse, z, tg, T, V, NULL), QRL_OK);
        qrl_train_logprob_backward(dz, z, tg, lse, ent, dlogp, dent, T, V);
        float *d_z = dev_from(z, n * 4), *d_dlp = dev_from(dlogp, T * 4),
              *d_dent = dev_from(dent, T * 4);
        int32_t *d_tg = dev_from(tg, T * 4);
        guarded glp = guarded_new(T, 4), gent = guarded_new(T, 4), glse = guarded_new(T, 4);
        guarded gdz = guarded_new(n, 2);
        cr_assert_eq(qrl_cuda_train_logprob_forward(guarded_ptr(glp), guarded_ptr(gent),
                                                    guarded_ptr(glse), d_z, d_tg, T, V, NULL,
                                                    NULL), QRL_OK);
        float *g_lp = malloc(T * 4), *g_ent = malloc(T * 4), *g_lse = malloc(T * 4);
        guarded_fetch(glp, g_lp, "logp"), guarded_fetch(gent, g_ent, "ent");
        guarded_fetch(glse, g_lse, "lse");
        char what[64];
        snprintf(what, sizeof what, "logprob T=%d V=%d", T, V);
        for (int t = 0; t < T; t++) {
            cr_expect(fabsf(g_lp[t] - lp[t]) <= 2e-5f * (1 + fabsf(lse[t])), "%s logp[%d] %g vs %g",
                      what, t, g_lp[t], lp[t]);
            cr_expect(fabsf(g_ent[t] - ent[t]) <= 2e-5f * (1 + fabsf(lse[t])), "%s ent[%d] %g vs %g",
                      what, t, g_ent[t], ent[t]);
            cr_expect(fabsf(g_lse[t] - lse[t]) <= 2e-5f * (1 + fabsf(lse[t])), "%s lse[%d]", what, t);
        }
        /* backward from the CPU's statistics, so only the kernel is compared */
        float *d_lse = dev_from(lse, T * 4), *d_ent = dev_from(ent, T * 4);
        cr_assert_eq(qrl_cuda_train_logprob_backward(guarded_ptr(gdz), d_z, d_tg, d_lse, d_ent,
                                                     d_dlp, d_dent, T, V, NULL, NULL), QRL_OK);
        uint16_t *b = malloc(n * 2);
        float *got = malloc(n * 4);
        guarded_fetch(gdz, b, "dlogits");
        bf16_to_f32_host(b, got, n);
        expect_rel(got, dz, n, TOL_BF16, what);
        qrl_cuda_free(d_z), qrl_cuda_free(d_dlp), qrl_cuda_free(d_dent), qrl_cuda_free(d_tg);
        qrl_cuda_free(d_lse), qrl_cuda_free(d_ent);
        free(z), free(dlogp), free(dent), free(tg), free(lp), free(ent), free(lse), free(dz);
        free(g_lp), free(g_ent), free(g_lse), free(b), free(got);
    }
}

/* The three row-major GEMM kinds against qrl_train_matmul_{forward,backward} on the same
 * BF16 values: F32 output accumulating (beta 1) and BF16 output overwriting. */
Test(cuda_train_ops, gemm_row_major_kinds) {
    require_gpu();
    qrl_cuda_gemm *g;
    cr_assert_eq(qrl_cuda_gemm_new(&g, NULL), QRL_OK);
    const int shapes[][3] = {{1, 16, 8}, {37, 64, 100}, {300, 256, 130}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int T = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
        float *xf, *wf, *dyf;
        uint16_t *d_x = rnd_bf16_dev((size_t)T * K, 0, 1, &xf),
                 *d_w = rnd_bf16_dev((size_t)N * K, 0, 1, &wf),
                 *d_dy = rnd_bf16_dev((size_t)T * N, 0, 1, &dyf);
        float *y = malloc((size_t)T * N * 4), *dx0 = rnd((size_t)T * K, 1), *dw0 = rnd((size_t)N * K, 1);
        float *dx = malloc((size_t)T * K * 4), *dw = malloc((size_t)N * K * 4);
        memcpy(dx, dx0, (size_t)T * K * 4), memcpy(dw, dw0, (size_t)N * K * 4);
        qrl_train_matmul_forward(y, xf, wf, NULL, T, K, N);
        qrl_train_matmul_backward(dx, dw, NULL, dyf, xf, wf, T, K, N);
        guarded gy = guarded_new((size_t)T * N, 2);
        float *d_dx = dev_from(dx0, (size_t)T * K * 4), *d_dw = dev_from(dw0, (size_t)N * K * 4);
        cr_assert_eq(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, guarded_ptr(gy), 0, d_x, d_w, T, K, N, 0.0f,
                                      NULL, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, d_dx, 1, d_dy, d_w, T, K, N, 1.0f, NULL, NULL),
                     QRL_OK);
        cr_assert_eq(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, d_dw, 1, d_dy, d_x, T, K, N, 1.0f, NULL, NULL),
                     QRL_OK);
        uint16_t *b = malloc((size_t)T * N * 2);
        float *got_y = malloc((size_t)T * N * 4);
        guarded_fetch(gy, b, "gemm y"), bf16_to_f32_host(b, got_y, (size_t)T * N);
        float *got_dx = fetch_f32(d_dx, (size_t)T * K), *got_dw = fetch_f32(d_dw, (size_t)N * K);
        expect_rel(got_y, y, (size_t)T * N, TOL_BF16, "gemm fwd");
        expect_rel(got_dx, dx, (size_t)T * K, TOL_F32, "gemm dx");
        expect_rel(got_dw, dw, (size_t)N * K, TOL_F32, "gemm dw");
        qrl_cuda_free(d_x), qrl_cuda_free(d_w), qrl_cuda_free(d_dy), qrl_cuda_free(d_dx);
        qrl_cuda_free(d_dw);
        free(xf), free(wf), free(dyf), free(y), free(dx0), free(dw0), free(dx), free(dw), free(b);
        free(got_y), free(got_dx), free(got_dw);
    }
    cr_expect_eq(qrl_cuda_gemm_rm(g, 7, NULL, 1, NULL, NULL, 1, 1, 1, 0.0f, NULL, NULL),
                 QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_gemm_free(g);
}
