/* CPU throughput of the SPEC §5 loss (qrl_rl_loss_compute: loss + gradient + stats).
 *   build/bench/bench_rl_loss [n_seq] [seq_len] [reps]     (default 64 4096 20) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rl/rl.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    size_t S = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    size_t T = argc > 2 ? strtoul(argv[2], NULL, 10) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    size_t n = S * T;
    float *buf = malloc(n * 6 * sizeof(float));
    uint8_t *mask = malloc(n);
    if (!buf || !mask || reps < 1) return 1;
    float *lp = buf, *lpp = buf + n, *lpb = buf + 2 * n, *lr = buf + 3 * n, *adv = buf + 4 * n,
          *grad = buf + 5 * n;
    srand(1);
    for (size_t i = 0; i < n; i++) {
        lpp[i] = -3.0f * (float)rand() / (float)RAND_MAX;
        lp[i] = lpp[i] + 0.2f * ((float)rand() / (float)RAND_MAX - 0.5f);
        lpb[i] = lpp[i] + 0.4f * ((float)rand() / (float)RAND_MAX - 0.5f);
        lr[i] = lp[i] + 0.1f;
        adv[i] = (i / T) % 2 ? 1.0f : -1.0f;
        mask[i] = (i % T) < T - (i / T) % (T / 2 + 1); /* unequal lengths */
    }
    qrl_rl_loss_config cfg;
    qrl_rl_loss_config_default(&cfg);
    qrl_rl_loss_input in = {.n_seq = S, .seq_len = T, .lp = lp, .lp_prox = lpp,
                            .lp_behav = lpb, .lp_ref = lr, .adv = adv, .mask = mask};
    qrl_rl_loss_stats st;
    double loss = 0;
    qrl_error err;
    double t0 = now();
    for (int r = 0; r < reps; r++)
        if (qrl_rl_loss_compute(&cfg, &in, &loss, grad, &st, &err) != QRL_OK) {
            fprintf(stderr, "loss: %s\n", err.msg);
            return 1;
        }
    double dt = (now() - t0) / reps;
    printf("rl_loss n_seq=%zu seq_len=%zu tokens=%zu response_tokens=%zu ms=%.3f "
           "Mtok_per_s=%.1f loss=%.6f tis_frac=%.4f clip_low=%.4f clip_high=%.4f\n",
           S, T, n, st.n_tokens, dt * 1e3, (double)n / dt * 1e-6, loss, st.tis_frac,
           st.clip_frac_low, st.clip_frac_high);
    free(buf);
    free(mask);
    return 0;
}
