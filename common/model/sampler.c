/* Sampler with a counter-based RNG (see sampler.h for the procedure). */
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "cpu/ops.h"

struct qrl_sampler {
    int vocab;
    int32_t *order; /* [vocab] token ids, sorted by z descending when truncating */
    double *z;      /* [vocab] logits / T in double */
};

/* ---- Philox-4x32-10 (Random123's philox4x32_R with R = 10) ------------------------- */

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void qrl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u; /* golden ratio */
            k1 += 0xBB67AE85u; /* sqrt(3) - 1 */
        }
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
        mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

double qrl_sampler_uniform(uint64_t seed, uint64_t group, uint32_t response, uint32_t position) {
    uint32_t ctr[4] = {position, response, (uint32_t)group, (uint32_t)(group >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    qrl_philox4x32_10(ctr, key, o);
    uint64_t bits = (((uint64_t)o[0] << 32) | o[1]) >> 11;
    return (double)bits * 0x1.0p-53;
}

/* ---- sampler ----------------------------------------------------------------------- */

qrl_status qrl_sampler_new(int vocab, qrl_sampler **out, qrl_error *err) {
    *out = NULL;
    if (vocab <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "sampler: vocab = %d must be > 0", vocab);
    qrl_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->order = malloc((size_t)vocab * sizeof *s->order);
        s->z = malloc((size_t)vocab * sizeof *s->z);
    }
    if (!s || !s->order || !s->z) {
        qrl_sampler_free(s);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "sampler: out of memory");
    }
    s->vocab = vocab;
    *out = s;
    return QRL_OK;
}

void qrl_sampler_free(qrl_sampler *s) {
    if (!s) return;
    free(s->order);
    free(s->z);
    free(s);
}

qrl_status qrl_sampling_params_validate(const qrl_sampling_params *p, qrl_error *err) {
    if (isnan(p->temperature))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: temperature is NaN");
    if (p->top_k < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: top_k = %d must be >= 0",
                             p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "sampling: top_p = %g must be in (0, 1]", (double)p->top_p);
    return QRL_OK;
}

/* Sort key: z descending, then id ascending (a total order: deterministic). */
static int by_z_desc(const void *a, const void *b, void *zv) {
    const double *z = zv;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double zi = z[i], zj = z[j];
    if (zi > zj) return -1;
    if (zi < zj) return 1;
    return (i > j) - (i < j);
}

/* log(sum(exp(z[order[k]]))) for k in [0, n), stable. */
static double logsumexp_of(const double *z, const int32_t *order, int n) {
    double mx = -INFINITY;
    for (int k = 0; k < n; k++) mx = fmax(mx, z[order ? order[k] : k]);
    double sum = 0;
    for (int k = 0; k < n; k++) sum += exp(z[order ? order[k] : k] - mx);
    return mx + log(sum);
}

qrl_status qrl_sampler_sample(qrl_sampler *s, const float *logits, const qrl_sampling_params *p,
                              uint64_t group, uint32_t response, uint32_t position,
                              qrl_sample *out, qrl_error *err) {
    QRL_TRY(qrl_sampling_params_validate(p, err));
    int V = s->vocab;
    bool any = false;
    for (int i = 0; i < V; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: logits[%d] is %s", i,
                                 isnan(logits[i]) ? "NaN" : "+inf");
        any |= logits[i] != -INFINITY;
    }
    if (!any) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: all logits are -inf");

    if (p->temperature <= 0) {
        int tok = qrl_cpu_argmax(logits, V);
        for (int i = 0; i < V; i++) s->z[i] = logits[i];
        out->token = tok;
        out->logprob = (float)(s->z[tok] - logsumexp_of(s->z, NULL, V));
        out->logprob_truncated = 0.0f;
        out->truncated = V > 1;
        return QRL_OK;
    }

    double T = p->temperature;
    for (int i = 0; i < V; i++) s->z[i] = (double)logits[i] / T;
    double lse_full = logsumexp_of(s->z, NULL, V);

    bool use_k = p->top_k > 0 && p->top_k < V, use_p = p->top_p < 1.0f;
    int n_kept = V;
    const int32_t *kept = NULL; /* NULL: all ids in order */
    if (use_k || use_p) {
        for (int i = 0; i < V; i++) s->order[i] = i;
        qsort_r(s->order, (size_t)V, sizeof *s->order, by_z_desc, s->z);
        if (use_k) {
            double thr = s->z[s->order[p->top_k - 1]];
            n_kept = p->top_k;
            while (n_kept < V && s->z[s->order[n_kept]] >= thr) n_kept++; /* boundary ties */
        }
        if (use_p) {
            double lse_k = logsumexp_of(s->z, s->order, n_kept), cum = 0;
            int k = 0;
            while (k < n_kept && cum < p->top_p) {
                cum += exp(s->z[s->order[k]] - lse_k);
                k++;
            }
            n_kept = k > 0 ? k : 1;
        }
        kept = s->order;
    }
    double lse_kept = kept ? logsumexp_of(s->z, kept, n_kept) : lse_full;

    double u = qrl_sampler_uniform(p->seed, group, response, position), cum = 0;
    int tok = -1;
    for (int k = 0; k < n_kept; k++) {
        int id = kept ? kept[k] : k;
        double pr = exp(s->z[id] - lse_kept);
        if (pr <= 0) continue;
        tok = id;
        cum += pr;
        if (u < cum) break;
    }
    QRL_CHECK(tok >= 0); /* at least one finite logit survives every cut */
    out->token = tok;
    out->logprob = (float)(s->z[tok] - lse_full);
    out->truncated = n_kept < V;
    out->logprob_truncated = out->truncated ? (float)(s->z[tok] - lse_kept) : out->logprob;
    return QRL_OK;
}
