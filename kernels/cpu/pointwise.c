/* Normalization and pointwise ops of the Llama block: RMSNorm, SwiGLU's silu*mul,
 * residual add, softmax, argmax. */
#include <math.h>

#include "cpu/ops.h"

void qrl_cpu_rmsnorm(float *out, const float *x, const float *weight, int n, int d, float eps) {
#pragma omp parallel for schedule(static) if (n > 1 && (long)n * d > 16384)
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        float *o = out + (size_t)r * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        /* HF: hidden * rsqrt(var + eps) in F32, then weight * hidden. */
        float inv = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) o[i] = weight[i] * (xr[i] * inv);
    }
}

void qrl_cpu_silu_mul(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void qrl_cpu_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void qrl_cpu_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

int qrl_cpu_argmax(const float *x, int n) {
    int best = 0;
    float bv = x[0];
    for (int i = 1; i < n; i++) {
        /* `bv != bv`: a leading NaN loses to the first real number. */
        if (x[i] > bv || (bv != bv && x[i] == x[i])) {
            bv = x[i];
            best = i;
        }
    }
    return best;
}
