/* Inputs and the boundary check of the device-sampler comparisons (header-only; shared by
 * tests/cuda/test_cuda_sample.c and the CPU harness tests/reference/sample_emu.cc). */
#ifndef QRL_TESTS_SAMPLE_CASES_H
#define QRL_TESTS_SAMPLE_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/sampler.h"

#define SC_KINDS 6

static inline uint64_t sc_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float sc_unif(uint64_t *s) { /* [-1, 1) */
    return (float)(sc_next(s) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* Fresh logits of one of SC_KINDS shapes:
 *   0 spread (uniform in [-4, 4)), 1 peaked ([-12, 12)), 2 ties (multiples of 0.5 in
 *   [-3, 3], -0 and +0 both present: top-k boundaries fall inside tie groups),
 *   3 a quarter -inf, 4 three finite logits and the rest -inf (top-k past the finite
 *   ones keeps everything), 5 a near-flat row (1e-3 wide: long top-p prefixes). */
static inline void sc_fill(float *x, int V, int kind, uint64_t seed) {
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + (uint64_t)kind;
    for (int i = 0; i < V; i++) {
        float u = sc_unif(&s);
        switch (kind) {
        case 0: x[i] = 4.0f * u; break;
        case 1: x[i] = 12.0f * u; break;
        case 2: x[i] = roundf(6.0f * u) * 0.5f; break; /* roundf(-0.2) = -0 */
        case 3: x[i] = (sc_next(&s) & 3) == 0 ? -INFINITY : 6.0f * u; break;
        case 4: x[i] = -INFINITY; break;
        default: x[i] = 1e-3f * u; break;
        }
    }
    if (kind == 3) x[V / 2] = 1.0f; /* at least one finite */
    if (kind == 4)
        for (int k = 0; k < 3 && k < V; k++) x[(int)(sc_next(&s) % (uint64_t)V)] = 2.0f * sc_unif(&s);
}

/* The comparison grid: for each T in {0 (greedy), 0.5, 1, 1.5}, top_k in {0, 1, 20, V},
 * top_p in {1, 0.9, 0.5}, rows_per rows of rotating kinds, each with its own seed and group.
 * Row r (< SC_GRID * rows_per) of vocabulary V: logits into x[V], params, group. */
#define SC_GRID 48
static inline void sc_grid_row(int V, int rows_per, int r, float *x, qrl_sampling_params *sp,
                               uint64_t *group) {
    static const float Ts[4] = {0.0f, 0.5f, 1.0f, 1.5f}, Ps[3] = {1.0f, 0.9f, 0.5f};
    int j = r % rows_per, c = r / rows_per, pi = c % 3, ki = c / 3 % 4, ti = c / 12;
    int Ks[4] = {0, 1, 20, V};
    uint64_t seed = ((uint64_t)V << 32) ^ ((uint64_t)r * 7919u);
    sc_fill(x, V, (j + ki + pi) % SC_KINDS, seed);
    sp->temperature = Ts[ti];
    sp->top_k = Ks[ki];
    sp->top_p = Ps[pi];
    sp->seed = seed * 31 + 1;
    *group = seed ^ ((uint64_t)j << 40);
}

typedef struct sc_walk_ctx { const double *z; } sc_walk_ctx;
static inline int sc_by_z(const void *a, const void *b, void *ctx) {
    const double *z = ((const sc_walk_ctx *)ctx)->z;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (z[i] != z[j]) return z[i] > z[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* How close the draw u (or the top-p mass p) lies to a cumulative boundary between
 * tokens ta and tb of the CPU's walk, recomputed here in double from the procedure in
 * model/sampler.h: the smaller of |u - running sum through the earlier of the two| (when
 * they differ and both are kept) and, with top-p, the distance of p from the running
 * sums either side of the cut.  Two correct implementations that sum in different orders
 * can pick different tokens, or cut top-p one token apart (then logprob_truncated
 * differs), only when this is about 1e-15 (a tie group whose mass reaches p exactly). */
static inline double sc_boundary_dist(const float *x, int V, const qrl_sampling_params *p,
                                      double u, int ta, int tb) {
    double *z = (double *)malloc((size_t)V * sizeof *z);
    int32_t *ord = (int32_t *)malloc((size_t)V * sizeof *ord);
    double T = p->temperature, mx = -INFINITY, dist = INFINITY;
    for (int i = 0; i < V; i++) z[i] = x[i] / T, ord[i] = i, mx = fmax(mx, z[i]);
    int use_k = p->top_k > 0 && p->top_k < V, use_p = p->top_p < 1.0f, n = V;
    if (use_k || use_p) {
        sc_walk_ctx c = {z};
        qsort_r(ord, (size_t)V, sizeof *ord, sc_by_z, &c);
    }
    if (use_k) {
        n = p->top_k;
        while (n < V && z[ord[n]] >= z[ord[p->top_k - 1]]) n++;
    }
    double sum = 0;
    for (int k = 0; k < n; k++) sum += exp(z[ord[k]] - mx);
    if (use_p) {
        double cum = 0;
        int k = 0;
        while (k < n && cum < p->top_p) {
            double prev = cum;
            cum += exp(z[ord[k]] - mx) / sum;
            k++;
            if (cum >= p->top_p) dist = fmin(fabs(cum - p->top_p), fabs(prev - p->top_p));
        }
        n = k > 0 ? k : 1;
        sum = 0;
        for (int j = 0; j < n; j++) sum += exp(z[ord[j]] - mx);
    }
    int pa = -1, pb = -1;
    for (int k = 0; k < n; k++) pa = ord[k] == ta ? k : pa, pb = ord[k] == tb ? k : pb;
    if (ta != tb && pa >= 0 && pb >= 0) {
        int first = pa < pb ? pa : pb;
        double cum = 0;
        for (int k = 0; k <= first; k++) cum += exp(z[ord[k]] - mx) / sum;
        dist = fmin(dist, fabs(u - cum));
    }
    free(z);
    free(ord);
    return dist;
}

#endif
