/* Training layers without token mixing: embedding, linear, RMSNorm, SwiGLU, residual
 * (forward with saved state, and backward; see train_ops.h for the conventions). */
#include <math.h>
#include <stddef.h>

#include "cpu/train_ops.h"
#include "cpu/train_internal.h"

/* ---- embedding ------------------------------------------------------------------------ */

qrl_status qrl_train_embedding_forward(float *out, const int32_t *tokens, const float *table,
                                       int T, int V, int D, qrl_error *err) {
    QRL_CHECK(T > 0 && V > 0 && D > 0);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "embedding: token id %d at position %d outside [0, %d)",
                                 (int)tokens[t], t, V);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * D))
    for (int t = 0; t < T; t++) {
        const float *row = table + (size_t)tokens[t] * D;
        float *o = out + (size_t)t * D;
        for (int i = 0; i < D; i++) o[i] = row[i];
    }
    return QRL_OK;
}

void qrl_train_embedding_backward(float *dtable, const float *dout, const int32_t *tokens,
                                  int T, int V, int D) {
    QRL_CHECK(T > 0 && V > 0 && D > 0);
    for (int t = 0; t < T; t++) QRL_CHECK(tokens[t] >= 0 && tokens[t] < V);
    /* Tokens repeat, so rows collide: split the work by columns instead of tokens, and
     * every element is still summed in token order. */
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * D))
    for (int i = 0; i < D; i++)
        for (int t = 0; t < T; t++)
            dtable[(size_t)tokens[t] * D + i] += dout[(size_t)t * D + i];
}

/* ---- linear layer -------------------------------------------------------------------- */

void qrl_train_matmul_forward(float *y, const float *x, const float *W, const float *b, int T,
                              int K, int N) {
    QRL_CHECK(T > 0 && K > 0 && N > 0);
const int64_t work = (int64_t)T * K * N;
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL(work))
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            float acc = b ? b[n] : 0.0f;
            y[(size_t)t * N + n] = acc + qrl_train_dot_(x + (size_t)t * K, W + (size_t)n * K, K);
        }
}

/* y[k] += a * x[k], vectorized (gcc 12 -O2 left the plain loop scalar); each element is
 * still one multiply and one add (no FMA contraction under -std=c11), so results are
 * unchanged bit for bit. */
static inline void axpy_(float *restrict y, const float *restrict x, float a, int n) {
#pragma omp simd
    for (int k = 0; k < n; k++) y[k] += a * x[k];
}

void qrl_train_matmul_backward(float *dx, float *dW, float *db, const float *dy, const float *x,
                               const float *W, int T, int K, int N) {
    QRL_CHECK(T > 0 && K > 0 && N > 0);
    const int64_t work = (int64_t)T * K * N;
    if (dx) {
        /* dx[t, :] += sum_n dy[t, n] W[n, :]: one row of dx per iteration, axpy inner loop */
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(work))
        for (int t = 0; t < T; t++) {
            float *dxt = dx + (size_t)t * K;
            for (int n = 0; n < N; n++) {
                float d = dy[(size_t)t * N + n];
                axpy_(dxt, W + (size_t)n * K, d, K);
            }
        }
    }
    if (dW || db) {
        /* dW[n, :] += sum_t dy[t, n] x[t, :]: one row of dW per iteration */
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(work))
        for (int n = 0; n < N; n++) {
            float bsum = 0.0f;
            for (int t = 0; t < T; t++) {
                float d = dy[(size_t)t * N + n];
                bsum += d;
                if (dW) axpy_(dW + (size_t)n * K, x + (size_t)t * K, d, K);
            }
            if (db) db[n] += bsum;
        }
    }
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

void qrl_train_rmsnorm_forward(float *y, float *rstd, const float *x, const float *g, int n,
                               int d, float eps) {
    QRL_CHECK(n > 0 && d > 0);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)n * d))
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * d;
        float *yi = y + (size_t)i * d;
        float ss = 0.0f;
        for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
        /* HF: hidden * torch.rsqrt(variance + eps), then weight * hidden */
        float r = 1.0f / sqrtf(ss / (float)d + eps);
        rstd[i] = r;
        for (int j = 0; j < d; j++) yi[j] = g[j] * (xi[j] * r);
    }
}

void qrl_train_rmsnorm_backward(float *dx, float *dg, const float *dy, const float *x,
                                const float *g, const float *rstd, int n, int d) {
    QRL_CHECK(n > 0 && d > 0);
    if (dx) {
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)n * d))
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * d, *dyi = dy + (size_t)i * d;
            float r = rstd[i];
            /* mean over the row of dxh * xh, with dxh = dy * g and xh = x * rstd */
            float m = 0.0f;
            for (int j = 0; j < d; j++) m += dyi[j] * g[j] * (xi[j] * r);
            m /= (float)d;
            float *dxi = dx + (size_t)i * d;
            for (int j = 0; j < d; j++) dxi[j] += r * (dyi[j] * g[j] - xi[j] * r * m);
        }
    }
    if (dg) {
        /* columns in parallel, rows summed in order */
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)n * d))
        for (int j = 0; j < d; j++) {
            float s = 0.0f;
            for (int i = 0; i < n; i++) s += dy[(size_t)i * d + j] * (x[(size_t)i * d + j] * rstd[i]);
            dg[j] += s;
        }
    }
}

/* ---- SwiGLU and residual ----------------------------------------------------------------- */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void qrl_train_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    QRL_CHECK(n > 0);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(8 * n))
    for (int64_t i = 0; i < n; i++) h[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void qrl_train_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                               const float *up, int64_t n) {
    QRL_CHECK(n > 0);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(8 * n))
    for (int64_t i = 0; i < n; i++) {
        float s = sigmoidf(gate[i]);
        float silu = gate[i] * s;
        /* d silu / dx = s + x s (1 - s) */
        if (dgate) dgate[i] += dh[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        if (dup) dup[i] += dh[i] * silu;
    }
}

void qrl_train_residual_forward(float *y, const float *a, const float *b, int64_t n) {
    QRL_CHECK(n > 0);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(8 * n))
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void qrl_train_residual_backward(float *da, float *db, const float *dy, int64_t n) {
    QRL_CHECK(n > 0);
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL(8 * n))
    for (int64_t i = 0; i < n; i++) {
        if (da) da[i] += dy[i];
        if (db) db[i] += dy[i];
    }
}
