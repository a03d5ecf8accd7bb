/* Finite-difference checks of the training layers without token mixing (train_ops.h):
 * embedding, linear, RMSNorm, per-head RMSNorm, SwiGLU, residual, log-prob/entropy.
 * Each reference forward below is written in double from the layer's formula (HF
 * modeling_llama / modeling_qwen3), independently of kernels/cpu/train_ops_*.c; see
 * gradcheck.h for the method and the bound.  RoPE and attention: test_train_ops_attn.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu/train_ops.h"
#include "gradcheck.h"

/* ---- embedding ------------------------------------------------------------------------ */

typedef struct { const int32_t *tok; int T, V, D; } emb_ctx;

static void emb_ref(const gc_case *c, double *y) {
    const emb_ctx *x = c->ctx;
    for (int t = 0; t < x->T; t++)
        for (int i = 0; i < x->D; i++) y[t * x->D + i] = c->in[0][x->tok[t] * x->D + i];
}

Test(train_ops, embedding_grad_accumulates_repeated_rows) {
    gc_rng r = {1};
    enum { T = 5, V = 7, D = 12 };
    const int32_t tok[T] = {3, 1, 3, 6, 0}; /* row 3 twice; rows 2, 4, 5 untouched */
    emb_ctx cx = {tok, T, V, D};
    gc_case c = {.name = "embedding", .n_in = 1, .in_name = {"table"},
                 .in = {gc_rand(&r, V * D, -1, 1)}, .in_len = {V * D}, .out_len = T * D,
                 .fwd = emb_ref, .ctx = &cx};
    double *cot = gc_rand(&r, T * D, -1, 1);
    float *table = gc_to_f32(c.in[0], V * D), *dy = gc_to_f32(cot, T * D);
    float *y = gc_zeros(T * D), *dtable = gc_prefilled(V * D);
    cr_assert_eq(qrl_train_embedding_forward(y, tok, table, T, V, D, NULL), QRL_OK);
    qrl_train_embedding_backward(dtable, dy, tok, T, V, D);
    gc_check(&c, y, cot, (float *[GC_MAX_IN]){dtable});
    /* row 3 = dy[0] + dy[2] exactly (two float adds onto the prefill, in token order) */
    for (int i = 0; i < D; i++)
        cr_expect_eq(dtable[3 * D + i], (GC_PREFILL + dy[0 * D + i]) + dy[2 * D + i]);
    gc_free(&c);
    free(cot), free(table), free(dy), free(y), free(dtable);
}

Test(train_ops, embedding_rejects_out_of_range_token) {
    float table[4 * 2] = {0}, y[3 * 2] = {7, 7, 7, 7, 7, 7};
    const int32_t tok[3] = {1, 4, 0};
    qrl_error err;
    cr_assert_eq(qrl_train_embedding_forward(y, tok, table, 3, 4, 2, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "token id 4 at position 1"), "%s", err.msg);
    cr_expect_eq(y[0], 7.0f, "nothing written on error");
    const int32_t neg[1] = {-1};
    cr_assert_eq(qrl_train_embedding_forward(y, neg, table, 1, 4, 2, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
}

/* ---- linear ---------------------------------------------------------------------------- */

typedef struct { int T, K, N; } mm_ctx;

static void mm_ref(const gc_case *c, double *y) {
    const mm_ctx *x = c->ctx;
    for (int t = 0; t < x->T; t++)
        for (int n = 0; n < x->N; n++) {
            double s = c->n_in > 2 ? c->in[2][n] : 0.0;
            for (int k = 0; k < x->K; k++) s += c->in[0][t * x->K + k] * c->in[1][n * x->K + k];
            y[t * x->N + n] = s;
        }
}

static void run_matmul(int T, int K, int N, int bias, uint64_t seed) {
    gc_rng r = {seed};
    mm_ctx cx = {T, K, N};
    gc_case c = {.name = bias ? "matmul+bias" : "matmul", .n_in = bias ? 3 : 2,
                 .in_name = {"x", "W", "b"},
                 .in = {gc_rand(&r, T * K, -1, 1), gc_rand(&r, N * K, -1, 1),
                        bias ? gc_rand(&r, N, -1, 1) : NULL},
                 .in_len = {T * K, N * K, N}, .out_len = T * N, .fwd = mm_ref, .ctx = &cx};
    double *cot = gc_rand(&r, T * N, -1, 1);
    float *x = gc_to_f32(c.in[0], T * K), *W = gc_to_f32(c.in[1], N * K);
    float *b = bias ? gc_to_f32(c.in[2], N) : NULL, *dy = gc_to_f32(cot, T * N);
    float *y = gc_zeros(T * N), *dx = gc_prefilled(T * K), *dW = gc_prefilled(N * K);
    float *db = bias ? gc_prefilled(N) : NULL;
    qrl_train_matmul_forward(y, x, W, b, T, K, N);
    qrl_train_matmul_backward(dx, dW, db, dy, x, W, T, K, N);
    gc_check(&c, y, cot, (float *[GC_MAX_IN]){dx, dW, db});
    gc_free(&c);
    free(cot), free(x), free(W), free(b), free(dy), free(y), free(dx), free(dW), free(db);
}

Test(train_ops, matmul_grad) {
    run_matmul(5, 12, 7, 1, 2);
    run_matmul(3, 9, 13, 0, 3);
}

Test(train_ops, matmul_backward_skips_null_grads) {
    /* dW only: dx and db stay untouched (frozen input / no bias) */
    float x[2 * 3] = {1, 2, 3, 4, 5, 6}, W[1 * 3] = {1, 1, 1}, dy[2] = {1, -1};
    float dW[3] = {0};
    qrl_train_matmul_backward(NULL, dW, NULL, dy, x, W, 2, 3, 1);
    for (int i = 0; i < 3; i++) cr_expect_eq(dW[i], -3.0f);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

typedef struct { int n, d; double eps; } rms_ctx;

static void rms_ref(const gc_case *c, double *y) {
    const rms_ctx *x = c->ctx;
    for (int i = 0; i < x->n; i++) {
        const double *xi = c->in[0] + i * x->d;
        double ms = 0.0;
        for (int j = 0; j < x->d; j++) ms += xi[j] * xi[j];
        double r = 1.0 / sqrt(ms / x->d + x->eps);
        for (int j = 0; j < x->d; j++) y[i * x->d + j] = xi[j] * r * c->in[1][j];
    }
}

/* heads = 0: plain RMSNorm over n = T rows of width d; heads > 0: Qwen3 per-head norm of
 * [T, heads, d] with one shared gain. */
static void run_rmsnorm(int T, int heads, int d, float eps, uint64_t seed) {
    gc_rng r = {seed};
    int n = heads ? T * heads : T;
    rms_ctx cx = {n, d, eps};
    gc_case c = {.name = heads ? "head_rmsnorm" : "rmsnorm", .n_in = 2, .in_name = {"x", "g"},
                 .in = {gc_rand(&r, n * d, -2, 2), gc_rand(&r, d, 0.5, 1.5)},
                 .in_len = {n * d, d}, .out_len = n * d, .fwd = rms_ref, .ctx = &cx};
    double *cot = gc_rand(&r, n * d, -1, 1);
    float *x = gc_to_f32(c.in[0], n * d), *g = gc_to_f32(c.in[1], d), *dy = gc_to_f32(cot, n * d);
    float *y = gc_zeros(n * d), *rstd = gc_zeros(n), *dx = gc_prefilled(n * d), *dg = gc_prefilled(d);
    if (heads) {
        qrl_train_head_rmsnorm_forward(y, rstd, x, g, T, heads, d, eps);
        qrl_train_head_rmsnorm_backward(dx, dg, dy, x, g, rstd, T, heads, d);
    } else {
        qrl_train_rmsnorm_forward(y, rstd, x, g, n, d, eps);
        qrl_train_rmsnorm_backward(dx, dg, dy, x, g, rstd, n, d);
    }
    gc_check(&c, y, cot, (float *[GC_MAX_IN]){dx, dg});
    gc_free(&c);
    free(cot), free(x), free(g), free(dy), free(y), free(rstd), free(dx), free(dg);
}

Test(train_ops, rmsnorm_grad) { run_rmsnorm(5, 0, 12, 1e-5f, 4); }
Test(train_ops, head_rmsnorm_grad_shared_gain) { run_rmsnorm(5, 3, 4, 1e-6f, 5); }

Test(train_ops, rmsnorm_hand_values) {
    /* x = [3, 4]: mean square 12.5, eps 0 -> rstd = 1/sqrt(12.5); y = x * rstd * g */
    float x[2] = {3, 4}, g[2] = {2, 0.5f}, y[2], rstd[1];
    qrl_train_rmsnorm_forward(y, rstd, x, g, 1, 2, 0.0f);
    cr_expect_float_eq(rstd[0], 0.28284271f, 1e-7f);
    cr_expect_float_eq(y[0], 1.69705627f, 1e-6f);
    cr_expect_float_eq(y[1], 0.56568542f, 1e-6f);
}

/* ---- SwiGLU and residual --------------------------------------------------------------------- */

static void swiglu_ref(const gc_case *c, double *y) {
    for (size_t i = 0; i < c->out_len; i++) {
        double g = c->in[0][i];
        y[i] = g / (1.0 + exp(-g)) * c->in[1][i];
    }
}

Test(train_ops, swiglu_grad) {
    gc_rng r = {6};
    enum { N = 5 * 12 };
    gc_case c = {.name = "swiglu", .n_in = 2, .in_name = {"gate", "up"},
                 .in = {gc_rand(&r, N, -5, 5), gc_rand(&r, N, -1, 1)}, .in_len = {N, N},
                 .out_len = N, .fwd = swiglu_ref};
    double *cot = gc_rand(&r, N, -1, 1);
    float *gate = gc_to_f32(c.in[0], N), *up = gc_to_f32(c.in[1], N), *dy = gc_to_f32(cot, N);
    float *h = gc_zeros(N), *dgate = gc_prefilled(N), *dup = gc_prefilled(N);
    qrl_train_swiglu_forward(h, gate, up, N);
    qrl_train_swiglu_backward(dgate, dup, dy, gate, up, N);
    gc_check(&c, h, cot, (float *[GC_MAX_IN]){dgate, dup});
    gc_free(&c);
    free(cot), free(gate), free(up), free(dy), free(h), free(dgate), free(dup);
}

static void residual_ref(const gc_case *c, double *y) {
    for (size_t i = 0; i < c->out_len; i++) y[i] = c->in[0][i] + c->in[1][i];
}

Test(train_ops, residual_grad_and_shared_input) {
    gc_rng r = {7};
    enum { N = 17 };
    gc_case c = {.name = "residual", .n_in = 2, .in_name = {"a", "b"},
                 .in = {gc_rand(&r, N, -1, 1), gc_rand(&r, N, -1, 1)}, .in_len = {N, N},
                 .out_len = N, .fwd = residual_ref};
    double *cot = gc_rand(&r, N, -1, 1);
    float *a = gc_to_f32(c.in[0], N), *b = gc_to_f32(c.in[1], N), *dy = gc_to_f32(cot, N);
    float *y = gc_zeros(N), *da = gc_prefilled(N), *db = gc_prefilled(N);
    qrl_train_residual_forward(y, a, b, N);
    qrl_train_residual_backward(da, db, dy, N);
    gc_check(&c, y, cot, (float *[GC_MAX_IN]){da, db});
    /* y = a + a: the same gradient buffer receives dy twice */
    float *dd = gc_zeros(N);
    qrl_train_residual_backward(dd, dd, dy, N);
    for (int i = 0; i < N; i++) cr_expect_eq(dd[i], 2.0f * dy[i]);
    gc_free(&c);
    free(cot), free(a), free(b), free(dy), free(y), free(da), free(db), free(dd);
}

/* ---- log-probabilities and entropy ------------------------------------------------------------- */

typedef struct { const int32_t *tgt; int T, V; } lp_ctx;

/* Output [2T]: logp of each target, then each row's entropy -sum p log p (two passes:
 * max, then the normalised probabilities). */
static void lp_ref(const gc_case *c, double *y) {
    const lp_ctx *x = c->ctx;
    for (int t = 0; t < x->T; t++) {
        const double *z = c->in[0] + t * x->V;
        double m = -INFINITY, s = 0.0, H = 0.0;
        for (int j = 0; j < x->V; j++) m = fmax(m, z[j]);
        for (int j = 0; j < x->V; j++) s += exp(z[j] - m);
        for (int j = 0; j < x->V; j++) {
            double lp = z[j] - m - log(s);
            H -= exp(lp) * lp;
        }
        y[t] = x->tgt[t] < 0 ? 0.0 : z[x->tgt[t]] - m - log(s);
        y[x->T + t] = H;
    }
}

static void run_logprob(double lo, double hi, double offset, uint64_t seed) {
    gc_rng r = {seed};
    enum { T = 5, V = 11 };
    const int32_t tgt[T] = {3, QRL_TRAIN_TARGET_IGNORE, 10, 0, 3};
    lp_ctx cx = {tgt, T, V};
    double *z = gc_rand(&r, T * V, lo, hi);
    for (int i = 0; i < T * V; i++) z[i] = (double)(float)(z[i] + offset);
    gc_case c = {.name = offset != 0.0 ? "logprob(offset)" : "logprob", .n_in = 1,
                 .in_name = {"logits"}, .in = {z}, .in_len = {T * V}, .out_len = 2 * T,
                 .fwd = lp_ref, .ctx = &cx};
    double *cot = gc_rand(&r, 2 * T, -1, 1); /* [dlogp | dent] */
    float *logits = gc_to_f32(z, T * V), *up = gc_to_f32(cot, 2 * T);
    float out[2 * T], lse[T], *dz = gc_zeros(T * V);
    cr_assert_eq(qrl_train_logprob_forward(out, out + T, lse, logits, tgt, T, V, NULL), QRL_OK);
    qrl_train_logprob_backward(dz, logits, tgt, lse, out + T, up, up + T, T, V);
    /* the loss layer writes dlogits (not +=): add the prefill gc_check expects */
    for (int i = 0; i < T * V; i++) dz[i] += GC_PREFILL;
    gc_check(&c, out, cot, (float *[GC_MAX_IN]){dz});
    /* in place over the logits gives the same bits */
    qrl_train_logprob_backward(logits, logits, tgt, lse, out + T, up, up + T, T, V);
    for (int i = 0; i < T * V; i++) cr_expect_eq(logits[i] + GC_PREFILL, dz[i]);
    gc_free(&c);
    free(cot), free(logits), free(up), free(dz);
}

Test(train_ops, logprob_entropy_grad) {
    run_logprob(-3, 3, 0.0, 8);
    run_logprob(-8, 8, 200.0, 9); /* large logits: forward still within 1e-5 relative */
}

Test(train_ops, logprob_cross_entropy_gradient_is_softmax_minus_onehot) {
    /* logits [0, ln 3]: p = [1/4, 3/4]; target 1; dlogp = -1 -> dz = p - onehot */
    float z[2] = {0.0f, logf(3.0f)}, lp, H, lse, dz[2];
    int32_t tgt = 1;
    float dl = -1.0f;
    cr_assert_eq(qrl_train_logprob_forward(&lp, &H, &lse, z, &tgt, 1, 2, NULL), QRL_OK);
    cr_expect_float_eq(lp, logf(0.75f), 1e-6f);
    cr_expect_float_eq(lse, logf(4.0f), 1e-6f);
    cr_expect_float_eq(H, -(0.25 * log(0.25) + 0.75 * log(0.75)), 1e-6f);
    qrl_train_logprob_backward(dz, z, &tgt, &lse, &H, &dl, NULL, 1, 2);
    cr_expect_float_eq(dz[0], 0.25f, 1e-6f);
    cr_expect_float_eq(dz[1], -0.25f, 1e-6f);
}

Test(train_ops, logprob_tiny_entropy_and_masked_logits) {
    /* Row 0: [50, 0 x 10]: H = log(1 + 10 e^-50) + 500 e^-50 / (1 + 10 e^-50) ~ 9.8e-20;
     * lse - E[z] would cancel to 0 in float: the shifted sums keep it to 1e-6 relative.
     * Row 1: three -inf logits (masked vocabulary, the first one leading the row):
     * finite outputs, zero gradient there. */
    enum { V = 11 };
    float z[2 * V] = {0};
    z[0] = 50.0f;
    z[V + 0] = z[V + 3] = z[V + 7] = -INFINITY, z[V + 1] = 1.0f;
    int32_t tgt[2] = {0, 1};
    float lp[2], H[2], lse[2], dz[2 * V], dl[2] = {-1, -1}, de[2] = {0.5f, 0.5f};
    cr_assert_eq(qrl_train_logprob_forward(lp, H, lse, z, tgt, 2, V, NULL), QRL_OK);
    double e = exp(-50.0), want = log1p(10 * e) + 500 * e / (1 + 10 * e);
    cr_expect(fabs(H[0] - want) <= 1e-6 * want, "H = %.9g, want %.9g", H[0], want);
    /* row 1: 7 zeros and a 1 among 8 finite entries */
    double s = 7.0 + exp(1.0), p1 = exp(1.0) / s;
    cr_expect_float_eq(lp[1], log(p1), 1e-6f);
    cr_expect_float_eq(H[1], -(7.0 * (1.0 / s) * log(1.0 / s) + p1 * log(p1)), 1e-6f);
    qrl_train_logprob_backward(dz, z, tgt, lse, H, dl, de, 2, V);
    for (int j = 0; j < 2 * V; j++) cr_expect(isfinite(dz[j]), "dz[%d] = %g", j, dz[j]);
    cr_expect_eq(dz[V + 0], 0.0f);
    cr_expect_eq(dz[V + 3], 0.0f);
    cr_expect_eq(dz[V + 7], 0.0f);
}

Test(train_ops, logprob_rejects_bad_targets) {
    float z[2 * 3] = {0}, lp[2] = {9, 9}, lse[2];
    qrl_error err;
    int32_t big[2] = {0, 3}, neg[2] = {-2, 0};
    cr_assert_eq(qrl_train_logprob_forward(lp, NULL, lse, z, big, 2, 3, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "target id 3 at position 1"), "%s", err.msg);
    cr_expect_eq(lp[0], 9.0f, "nothing written on error");
    cr_assert_eq(qrl_train_logprob_forward(lp, NULL, lse, z, neg, 2, 3, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "position 0"), "%s", err.msg);
}
