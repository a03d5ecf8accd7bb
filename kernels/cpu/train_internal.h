/* Shared by kernels/cpu/train_ops_*.c only (not a public header). */
#ifndef QRL_CPU_TRAIN_INTERNAL_H
#define QRL_CPU_TRAIN_INTERNAL_H

#include <stdint.h>

/* A loop goes parallel only when it does at least this many multiply-adds (or
 * equivalent, ~0.5 ms on one core): a parallel region costs microseconds on an idle
 * machine, but on a busy one a descheduled thread stalls the whole region.  Measured on
 * the 2-core CI machine under load: tests/unit/test_train_tiny.c took 3-8 s with its
 * ~100k-MAC layers parallel, 1.2-1.5 s on one thread. */
#define QRL_TRAIN_PAR_WORK (INT64_C(1) << 20)
#define QRL_TRAIN_PARALLEL(work) ((int64_t)(work) >= QRL_TRAIN_PAR_WORK)

/* sum_i a[i] b[i] in F32 with 8 independent partial sums (latency-bound otherwise: the
 * compiler may not reassociate a float reduction), combined in a fixed order. */
static inline float qrl_train_dot_(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) s[j] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#endif
