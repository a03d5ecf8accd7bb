/* Deterministic test data for the format tests and bench/quant_error.c: a splitmix64
 * generator, Gaussian rows, outlier-heavy K-like vectors and the relative Frobenius
 * error.  Header-only (static) so each test binary stays one file. */
#ifndef QRL_TESTS_QUANT_TESTDATA_H
#define QRL_TESTS_QUANT_TESTDATA_H

#include <math.h>
#include <stdint.h>

typedef struct { uint64_t s; } td_rng;

static inline uint64_t td_next(td_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in (0, 1) */
static inline double td_uniform(td_rng *r) {
    return ((double)(td_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double td_gauss(td_rng *r) {
    double u = td_uniform(r), v = td_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static inline void td_fill_gauss(td_rng *r, float *x, int64_t n, double sigma) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sigma * td_gauss(r));
}

/* K-like rows [n_vec, dim]: keys carry a few fixed outlier channels with a large
 * offset and spread (as measured in KIVI/KVQuant): channel c is an outlier when
 * c % 37 == 5 (about 3%), with mean +-8 and sigma 4; other channels N(0, 1). */
static inline void td_fill_klike(td_rng *r, float *x, int64_t n_vec, int dim) {
    for (int64_t t = 0; t < n_vec; t++)
        for (int c = 0; c < dim; c++) {
            double v = td_gauss(r);
            if (c % 37 == 5) v = (c % 2 ? 8.0 : -8.0) + 4.0 * v;
            x[t * dim + c] = (float)v;
        }
}

/* ||x - y||_F / ||x||_F in double */
static inline double td_rel_err(const float *x, const float *y, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - y[i];
        num += d * d;
        den += (double)x[i] * x[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

#endif
