/* Sampler: Philox known answers, keyed reproducibility, masks, log-probs against a
 * direct double computation, the truncated flag, and bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "model/sampler.h"

/* Random123 tests/kat_vectors, the three "philox4x32 10" lines: ctr[4] key[2] -> out[4]. */
Test(sampler, philox4x32_10_known_answers) {
    const uint32_t v[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        qrl_philox4x32_10(v[i], v[i] + 4, out);
        for (int j = 0; j < 4; j++) cr_assert_eq(out[j], v[i][6 + j], "vector %d word %d", i, j);
    }
}

Test(sampler, uniform_is_keyed_and_uniform) {
    double base = qrl_sampler_uniform(1, 2, 3, 4);
    cr_assert_eq(base, qrl_sampler_uniform(1, 2, 3, 4));
    cr_assert_neq(base, qrl_sampler_uniform(2, 2, 3, 4));
    cr_assert_neq(base, qrl_sampler_uniform(1, 3, 3, 4));
    cr_assert_neq(base, qrl_sampler_uniform(1, 2, 4, 4));
    cr_assert_neq(base, qrl_sampler_uniform(1, 2, 3, 5));
    cr_assert_neq(base, qrl_sampler_uniform(1, 2ull | (1ull << 40), 3, 4)); /* high group bits */
    /* mean and a coarse histogram over 40000 positions */
    int bins[10] = {0};
    double sum = 0;
    for (uint32_t p = 0; p < 40000; p++) {
        double u = qrl_sampler_uniform(9, 77, 0, p);
        cr_assert(u >= 0 && u < 1);
        sum += u;
        bins[(int)(u * 10)]++;
    }
    cr_assert(fabs(sum / 40000 - 0.5) < 0.01);
    for (int b = 0; b < 10; b++) cr_assert(abs(bins[b] - 4000) < 300, "bin %d: %d", b, bins[b]);
    /* neighbouring responses are not correlated (same position, response r vs r+1) */
    double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
    for (uint32_t r = 0; r < 20000; r++) {
        double x = qrl_sampler_uniform(5, 1, r, 10), y = qrl_sampler_uniform(5, 1, r + 1, 10);
        sx += x, sy += y, sxy += x * y, sxx += x * x, syy += y * y;
    }
    double n = 20000, corr = (sxy / n - sx / n * sy / n) /
                             sqrt((sxx / n - sx * sx / n / n) * (syy / n - sy * sy / n / n));
    cr_assert(fabs(corr) < 0.03, "corr %g", corr);
}

static double lse(const float *x, int n, double T) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = fmax(mx, x[i] / T);
    for (int i = 0; i < n; i++) s += exp(x[i] / T - mx);
    return mx + log(s);
}

static qrl_sampler *new_sampler(int V) {
    qrl_sampler *s;
    qrl_error err;
    cr_assert_eq(qrl_sampler_new(V, &s, &err), QRL_OK);
    return s;
}

Test(sampler, greedy_logprob_uses_t1) {
    float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f, 1.0f};
    qrl_sampler *s = new_sampler(6);
    qrl_sampling_params p = {.temperature = 0, .top_p = 1, .seed = 3};
    qrl_sample out;
    qrl_error err;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, 0, 0, &out, &err), QRL_OK);
    cr_assert_eq(out.token, 1); /* first of the tied maxima */
    cr_assert(fabs(out.logprob - (2.0 - lse(logits, 6, 1.0))) < 1e-6);
    cr_assert(out.truncated);
    cr_assert_eq(out.logprob_truncated, 0.0f);
    qrl_sampler_free(s);
}

Test(sampler, reproducible_and_order_independent_with_full_vocab_logprob) {
    enum { V = 300 };
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)sin(i * 0.37) * 4;
    qrl_sampler *s = new_sampler(V);
    qrl_sampling_params p = {.temperature = 0.7f, .top_p = 1, .seed = 1234};
    qrl_sample a[50], b[50];
    qrl_error err;
    for (int i = 0; i < 50; i++)
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 11, 2, (uint32_t)i, &a[i], &err), QRL_OK);
    for (int i = 49; i >= 0; i--) /* reverse order: same draws */
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 11, 2, (uint32_t)i, &b[i], &err), QRL_OK);
    int differs = 0;
    double L = lse(logits, V, 0.7);
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(a[i].token, b[i].token);
        cr_assert_eq(a[i].logprob, b[i].logprob);
        cr_assert_not(a[i].truncated);
        cr_assert_eq(a[i].logprob_truncated, a[i].logprob);
        double want = logits[a[i].token] / 0.7 - L;
        cr_assert(fabs(a[i].logprob - want) < 1e-5, "logprob %g vs %g", a[i].logprob, want);
        differs += a[i].token != a[0].token;
    }
    cr_assert_gt(differs, 10, "draws should vary with the position");
    qrl_sample c;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 12, 2, 0, &c, &err), QRL_OK); /* other group */
    p.seed = 1235;
    int same = 0;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 11, 2, (uint32_t)i, &c, &err), QRL_OK);
        same += c.token == a[i].token;
    }
    cr_assert_lt(same, 45, "another seed gives other draws");
    qrl_sampler_free(s);
}

Test(sampler, empirical_distribution_matches_softmax) {
    float logits[5] = {1.0f, 0.0f, -1.0f, 2.0f, -INFINITY};
    qrl_sampler *s = new_sampler(5);
    qrl_sampling_params p = {.temperature = 1.3f, .top_p = 1, .seed = 99};
    int counts[5] = {0}, N = 40000;
    qrl_sample out;
    qrl_error err;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, (uint32_t)(i % 7), (uint32_t)i, &out, &err),
                     QRL_OK);
        counts[out.token]++;
    }
    double L = lse(logits, 5, 1.3);
    for (int t = 0; t < 5; t++) {
        double want = exp(logits[t] / 1.3 - L);
        cr_assert(fabs(counts[t] / (double)N - want) < 0.01, "token %d: %g vs %g", t,
                  counts[t] / (double)N, want);
    }
    cr_assert_eq(counts[4], 0);
    qrl_sampler_free(s);
}

Test(sampler, top_k_mask_keeps_boundary_ties) {
    float logits[6] = {5, 3, 3, 1, 0, -2};
    qrl_sampler *s = new_sampler(6);
    qrl_sampling_params p = {.temperature = 2.0f, .top_k = 2, .top_p = 1, .seed = 5};
    int counts[6] = {0};
    qrl_error err;
    double L = lse(logits, 6, 2.0);
    double Lk = log(exp(5 / 2.0) + 2 * exp(3 / 2.0)); /* kept: ids 0, 1, 2 (tie at k) */
    for (int i = 0; i < 6000; i++) {
        qrl_sample o;
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 1, 0, (uint32_t)i, &o, &err), QRL_OK);
        counts[o.token]++;
        cr_assert(o.truncated);
        cr_assert(fabs(o.logprob - (logits[o.token] / 2.0 - L)) < 1e-6);
        cr_assert(fabs(o.logprob_truncated - (logits[o.token] / 2.0 - Lk)) < 1e-6);
    }
    cr_assert_gt(counts[1], 0);
    cr_assert_gt(counts[2], 0);
    cr_assert_eq(counts[3] + counts[4] + counts[5], 0);
    /* k >= vocab: nothing is cut */
    p.top_k = 6;
    qrl_sample o;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 1, 0, 0, &o, &err), QRL_OK);
    cr_assert_not(o.truncated);
    qrl_sampler_free(s);
}

Test(sampler, top_p_keeps_smallest_prefix_reaching_p) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 at T = 1 */
    float logits[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    qrl_sampler *s = new_sampler(4);
    qrl_error err;
    struct { float p; int kept[4]; } cases[] = {
        {0.40f, {0, 1, 0, 0}},  /* 0.5 alone reaches 0.4 */
        {0.75f, {0, 1, 0, 1}},  /* 0.5 + 0.3 */
        {0.90f, {1, 1, 0, 1}},  /* + 0.15 */
        {0.99f, {1, 1, 1, 1}},  /* all four: yet "truncated" stays false */
    };
    for (int c = 0; c < 4; c++) {
        qrl_sampling_params p = {.temperature = 1.0f, .top_p = cases[c].p, .seed = 8};
        double Lk = 0;
        int n_kept = 0;
        for (int t = 0; t < 4; t++)
            if (cases[c].kept[t]) Lk += exp(logits[t]), n_kept++;
        Lk = log(Lk);
        int counts[4] = {0};
        for (int i = 0; i < 4000; i++) {
            qrl_sample o;
            cr_assert_eq(qrl_sampler_sample(s, logits, &p, 3, 1, (uint32_t)i, &o, &err), QRL_OK);
            cr_assert(cases[c].kept[o.token], "p=%g sampled cut token %d", cases[c].p, o.token);
            cr_assert_eq(o.truncated, n_kept < 4);
            cr_assert(fabs(o.logprob_truncated - (logits[o.token] - Lk)) < 1e-6);
            counts[o.token]++;
        }
        if (c == 1) cr_assert(fabs(counts[1] / 4000.0 - 0.5 / 0.8) < 0.03, "%d", counts[1]);
    }
    /* top-k then top-p on the renormalized survivors: k = 2 keeps 0.5, 0.3 -> 0.625,
     * 0.375; p = 0.6 keeps only the first. */
    qrl_sampling_params p = {.temperature = 1.0f, .top_k = 2, .top_p = 0.6f, .seed = 8};
    for (int i = 0; i < 200; i++) {
        qrl_sample o;
        cr_assert_eq(qrl_sampler_sample(s, logits, &p, 3, 1, (uint32_t)i, &o, &err), QRL_OK);
        cr_assert_eq(o.token, 1);
        cr_assert(fabs(o.logprob_truncated) < 1e-7);
    }
    qrl_sampler_free(s);
}

Test(sampler, bad_input) {
    float logits[3] = {0, 1, 2};
    qrl_sampler *s = new_sampler(3);
    qrl_sample o;
    qrl_error err;
    qrl_sampling_params p = {.temperature = 1, .top_p = 0, .seed = 1};
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, 0, 0, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "top_p"), "%s", err.msg);
    p.top_p = 1.5f;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, 0, 0, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    p.top_p = 1;
    p.top_k = -1;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, 0, 0, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "top_k"), "%s", err.msg);
    p.top_k = 0;
    logits[1] = NAN;
    cr_assert_eq(qrl_sampler_sample(s, logits, &p, 0, 0, 0, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "logits[1] is NaN"), "%s", err.msg);
    float ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    cr_assert_eq(qrl_sampler_sample(s, ninf, &p, 0, 0, 0, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_sampler *bad;
    cr_assert_eq(qrl_sampler_new(0, &bad, &err), QRL_STATUS_OUT_OF_RANGE);
    qrl_sampler_free(s);
}
