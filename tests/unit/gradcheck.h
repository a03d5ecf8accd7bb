/* Finite-difference gradient checking for the training layers (test_train_ops*.c).
 *
 * A case holds its differentiable inputs in double, a double-precision reference forward
 * written independently of the code under test, and a fixed output cotangent c.  The
 * loss is the linear functional L = sum_i c_i y_i; its gradient with respect to every
 * input element is taken by central differences of the double forward (h = 1e-5: the
 * truncation error ~h^2 and the rounding error ~1e-16 / h are both below 1e-9 relative
 * for these O(1) inputs), and compared with the F32 backward fed dy = c.
 *
 * Error measure (ggml test-backend-ops style, per tensor): max_i |a_i - r_i| /
 * max_i |r_i|.  F32 backward vs exact gradient is expected near 1e-6; the bound asserted
 * is 1e-3. */
#ifndef QRL_TESTS_UNIT_GRADCHECK_H
#define QRL_TESTS_UNIT_GRADCHECK_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define GC_MAX_IN 6
#define GC_H 1e-5
#define GC_BOUND 1e-3

typedef struct gc_case gc_case;
struct gc_case {
    const char *name;
    int n_in;
    const char *in_name[GC_MAX_IN];
    double *in[GC_MAX_IN];
    size_t in_len[GC_MAX_IN];
    size_t out_len;
    void (*fwd)(const gc_case *c, double *out); /* double reference forward */
    const void *ctx;                            /* shapes and non-differentiable inputs */
};

/* xorshift64*: deterministic inputs; uniform in [lo, hi), rounded to F32 so that the F32
 * and the double paths see the same numbers. */
typedef struct { uint64_t s; } gc_rng;
static inline double gc_uniform(gc_rng *r, double lo, double hi) {
    r->s ^= r->s >> 12, r->s ^= r->s << 25, r->s ^= r->s >> 27;
    double u = (double)((r->s * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
    return (double)(float)(lo + (hi - lo) * u);
}
static inline double *gc_rand(gc_rng *r, size_t n, double lo, double hi) {
    double *p = malloc(n * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) p[i] = gc_uniform(r, lo, hi);
    return p;
}
static inline float *gc_to_f32(const double *x, size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}
static inline float *gc_zeros(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    cr_assert_not_null(p);
    return p;
}

/* Gradient buffers start at GC_PREFILL, not 0, so that every check also proves the
 * backward accumulates (+=) as train_ops.h promises; gc_check subtracts it. */
#define GC_PREFILL 0.25f
static inline float *gc_prefilled(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) p[i] = GC_PREFILL;
    return p;
}

/* max |(a - off) - r| / max |r| (0 when both are all zero). */
static inline double gc_err_off(const float *a, double off, const double *r, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - off - r[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs(r[i]) > den) den = fabs(r[i]);
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}
static inline double gc_err(const float *a, const double *r, size_t n) {
    return gc_err_off(a, 0.0, r, n);
}

static inline double gc_loss(const gc_case *c, const double *cot, double *buf) {
    c->fwd(c, buf);
    double L = 0.0;
    for (size_t i = 0; i < c->out_len; i++) L += cot[i] * buf[i];
    return L;
}

/* Central-difference gradient of sum(cot * fwd) with respect to input k, into g. */
static inline void gc_numgrad(const gc_case *c, int k, const double *cot, double *g) {
    double *buf = malloc(c->out_len * sizeof *buf);
    cr_assert_not_null(buf);
    double *x = c->in[k];
    for (size_t i = 0; i < c->in_len[k]; i++) {
        double x0 = x[i];
        x[i] = x0 + GC_H;
        double lp = gc_loss(c, cot, buf);
        x[i] = x0 - GC_H;
        double lm = gc_loss(c, cot, buf);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * GC_H);
    }
    free(buf);
}

/* Compare the F32 forward output y with the double reference (bound 1e-5: F32 rounding
 * of O(10)-term sums), then each analytic gradient grads[k] (made by gc_prefilled; NULL =
 * input not checked) with the numeric one.  Prints every measured error. */
static inline void gc_check(const gc_case *c, const float *y, const double *cot,
                            float *const grads[GC_MAX_IN]) {
    double *ref = malloc(c->out_len * sizeof *ref);
    cr_assert_not_null(ref);
    c->fwd(c, ref);
    double fe = gc_err(y, ref, c->out_len);
    fprintf(stderr, "gradcheck %-22s forward        err %.2e\n", c->name, fe);
    cr_expect(fe <= 1e-5, "%s: forward error %.3e vs double reference", c->name, fe);
    free(ref);
    for (int k = 0; k < c->n_in; k++) {
        if (!grads[k]) continue;
        double *g = malloc(c->in_len[k] * sizeof *g);
        cr_assert_not_null(g);
        gc_numgrad(c, k, cot, g);
        double e = gc_err_off(grads[k], GC_PREFILL, g, c->in_len[k]);
        fprintf(stderr, "gradcheck %-22s d%-12s  err %.2e\n", c->name, c->in_name[k], e);
        cr_expect(e <= GC_BOUND, "%s: d%s relative error %.3e > %.0e", c->name, c->in_name[k],
                  e, GC_BOUND);
        free(g);
    }
}

static inline void gc_free(gc_case *c) {
    for (int k = 0; k < c->n_in; k++) free(c->in[k]), c->in[k] = NULL;
}

#endif
