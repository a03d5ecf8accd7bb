/* Dense matmul against a row-major weight (PyTorch nn.Linear layout): the projection op
 * of every layer.  Memory-bound at decode (n = 1); at prefill one weight row is reused
 * across all n input rows while it sits in L1. */
#include "cpu/ops.h"

float qrl_cpu_dot(const float *a, const float *b, int k) {
    /* 8 independent partial sums: lets the compiler vectorize without -ffast-math and
     * fixes the summation order (deterministic across builds of the same source). */
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int i = 0;
    for (; i + 8 <= k; i += 8) {
        s0 += a[i + 0] * b[i + 0];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    float tail = 0;
    for (; i < k; i++) tail += a[i] * b[i];
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + tail;
}

void qrl_cpu_matmul(float *out, const float *x, const float *w, const float *bias, int n, int k,
                    int m) {
    /* Parallel over weight rows: each output element belongs to one thread.  Blocks of 4
     * weight rows share each x row load. */
#pragma omp parallel for schedule(static) if ((long)m * k * n > 32768)
    for (int j = 0; j < m; j++) {
        const float *wj = w + (size_t)j * k;
        float b = bias ? bias[j] : 0.0f;
        for (int i = 0; i < n; i++) {
            out[(size_t)i * m + j] = qrl_cpu_dot(x + (size_t)i * k, wj, k) + b;
        }
    }
}
