/* Per-token log-probabilities of target tokens and entropy of the LM head's softmax, in
 * one fused pass per row, and their backward (see train_ops.h). */
#include <math.h>
#include <stddef.h>

#include "cpu/train_ops.h"
#include "cpu/train_internal.h"

qrl_status qrl_train_logprob_forward(float *logp, float *ent, float *lse, const float *logits,
                                     const int32_t *targets, int T, int V, qrl_error *err) {
    QRL_CHECK(T > 0 && V > 0);
    for (int t = 0; t < T; t++)
        if (targets[t] >= V || (targets[t] < 0 && targets[t] != QRL_TRAIN_TARGET_IGNORE))
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "logprob: target id %d at position %d outside [0, %d) "
                                 "(and not the ignore id %d)",
                                 (int)targets[t], t, V, QRL_TRAIN_TARGET_IGNORE);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * V * 16))
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * V;
        /* Online over the row: m = running max, s = 1 + r = sum exp(z - m) (the max's own
         * term is the 1, kept apart so that log1p(r) resolves r < 1e-16), w = sum
         * exp(z - m) (z - m).  Raising the max to m' rescales by a = exp(m - m') and
         * shifts w by -(m' - m) s.  Keeping z - m (not z) in w avoids the cancellation
         * of lse - E[z] when the entropy is small and the logits large. */
        double m = -INFINITY, r = 0.0, w = 0.0;
        for (int j = 0; j < V; j++) {
            double x = z[j];
            if (x == -INFINITY) continue; /* masked token: no mass, no entropy term */
            if (x > m) {
                if (m > -INFINITY) {
                    double a = exp(m - x);
                    w = (w - (x - m) * (1.0 + r)) * a;
                    r = (1.0 + r) * a;
                } /* else the first finite value: nothing to rescale */
                m = x;
                continue; /* its term: exp(0) = 1, times (x - m) = 0 */
            }
            double e = exp(x - m);
            r += e;
            w += e * (x - m);
        }
        double log_s = log1p(r), l = m + log_s;
        lse[t] = (float)l;
        if (ent) ent[t] = (float)(log_s - w / (1.0 + r));
        logp[t] = targets[t] == QRL_TRAIN_TARGET_IGNORE ? 0.0f : (float)((double)z[targets[t]] - l);
    }
    return QRL_OK;
}

void qrl_train_logprob_backward(float *dlogits, const float *logits, const int32_t *targets,
                                const float *lse, const float *ent, const float *dlogp,
                                const float *dent, int T, int V) {
    QRL_CHECK(T > 0 && V > 0);
    QRL_CHECK(!dent || ent);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * V * 16))
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * V;
        float *dz = dlogits + (size_t)t * V;
        const int32_t tgt = targets[t];
        const float gl = tgt == QRL_TRAIN_TARGET_IGNORE ? 0.0f : dlogp[t];
        const float ge = dent ? dent[t] : 0.0f;
        const float l = lse[t], H = ent ? ent[t] : 0.0f;
        for (int j = 0; j < V; j++) {
            float lp = z[j] - l; /* log p_j; read before the write: dz may alias z */
            float p = expf(lp);
            /* d logp_tgt / dz_j = 1[j == tgt] - p_j;  d H / dz_j = -p_j (log p_j + H) */
            float dh = p > 0.0f ? -p * (lp + H) : 0.0f; /* p == 0 at -inf logits */
            dz[j] = gl * ((j == tgt ? 1.0f : 0.0f) - p) + ge * dh;
        }
    }
}
