/* SPEC §5 loss (common/rl/loss.c) on cases worked out by hand from the formulas:
 * each loss.mode, TIS truncation and the ACR bound (1 + eps_high) / r, clip and
 * dual-clip fractions, token- vs sequence-mean, masking, k3, the gradient against
 * central finite differences, and bad input; the rollout corrections beside TIS / ACR
 * (sequence-level TIS, token- and sequence-level masked IS) and their fractions.
 * Expected numbers are written as explicit double arithmetic on the formula, never
 * taken from the code under test. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rl/rl.h"

#define EXPECT_NEAR(got, want, tol, ...) \
    cr_assert(fabs((double)(got) - (double)(want)) <= (tol), __VA_ARGS__)
#define TOL 1e-5 /* inputs are float log-probs: ~1e-7 relative per value */

static qrl_rl_loss_config cfg_of(qrl_rl_loss_mode mode, bool acr) {
    qrl_rl_loss_config c;
    qrl_rl_loss_config_default(&c);
    c.mode = mode;
    c.acr = acr;
    c.beta = 0; /* k3 tested on its own */
    return c;
}

/* Two tokens shared by the mode tests (probabilities chosen so ratios are round):
 *   t0: p = .8, p_prox = .4, p_behav = .1, A = +1   (w = 4 > C = 2: truncated)
 *   t1: p = .33, p_prox = .3, p_behav = .2, A = -1  (w = 1.5)                   */
static float LP[2], LPP[2], LPB[2];
static const float ADV[2] = {1, -1};
static const uint8_t MASK2[2] = {1, 1};

static qrl_rl_loss_input two_tokens(void) {
    LP[0] = logf(0.8f), LPP[0] = logf(0.4f), LPB[0] = logf(0.1f);
    LP[1] = logf(0.33f), LPP[1] = logf(0.3f), LPB[1] = logf(0.2f);
    return (qrl_rl_loss_input){.n_seq = 1, .seq_len = 2, .lp = LP, .lp_prox = LPP,
                               .lp_behav = LPB, .adv = ADV, .mask = MASK2};
}

/* naive: R = p / p_behav.  t0: R = 8 > U = 1.28, A > 0 -> clipped: surr 1.28, loss
 * -1.28, grad 0.  t1: R = 1.65, A < 0: min(-1.65, -1.28) = -1.65 -> loss 1.65,
 * d/dlp = -A R = 1.65.  Token mean over 2. */
Test(rl_loss, mode_naive) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_NAIVE, true);
    qrl_rl_loss_input in = two_tokens();
    in.lp_prox = NULL; /* not needed by the naive baseline */
    double loss;
    float g[2];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-1.28 + 1.65) / 2, TOL, "loss %g", loss);
    EXPECT_NEAR(g[0], 0.0, 1e-12, "g0 %g", g[0]);
    EXPECT_NEAR(g[1], 1.65 / 2, TOL, "g1 %g", g[1]);
    EXPECT_NEAR(s.ratio_mean, (8 + 1.65) / 2, TOL, "ratio_mean");
    EXPECT_NEAR(s.clip_frac_high, 0.5, 0, "clip high");
    EXPECT_NEAR(s.clip_frac_low, 0.0, 0, "clip low");
    cr_assert_eq(s.tis_frac, 0.0);
    cr_assert(!s.has_behav_prox);
}

/* prox: R = p / p_prox, w_bar = 1.  t0: R = 2 > 1.28 -> loss -1.28, grad 0.
 * t1: R = 1.1, A = -1 -> loss 1.1, grad 1.1.  Statistics of behav/prox still logged:
 * KL estimate mean(log .1 - log .4, log .2 - log .3), max w = 4. */
Test(rl_loss, mode_prox) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_PROX, true);
    qrl_rl_loss_input in = two_tokens();
    double loss;
    float g[2];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-1.28 + 1.1) / 2, TOL, "loss %g", loss);
    EXPECT_NEAR(g[0], 0.0, 1e-12, "g0");
    EXPECT_NEAR(g[1], 1.1 / 2, TOL, "g1 %g", g[1]);
    cr_assert(s.has_behav_prox);
    EXPECT_NEAR(s.kl_behav_prox, (log(0.1 / 0.4) + log(0.2 / 0.3)) / 2, TOL, "kl");
    EXPECT_NEAR(s.max_w, 4.0, 1e-5, "max_w %g", s.max_w);
    cr_assert_eq(s.tis_frac, 0.0);
    cr_assert_eq(s.acr_frac, 0.0);
    /* lp_behav is optional in prox mode */
    in.lp_behav = NULL;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-1.28 + 1.1) / 2, TOL, "loss without lp_behav");
    cr_assert(!s.has_behav_prox);
}

/* decoupled + ACR: t0: w = 4, w_bar = C = 2, r = 1/2, U = 1.28 / 0.5 = 2.56; R = 2
 * inside -> surr 2, loss -2 * 2 = -4, grad -w_bar A R = -4.  t1: w = 1.5 (no
 * truncation), R = 1.1: surr -1.1, loss 1.65, grad 1.65. */
Test(rl_loss, mode_decoupled_acr) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    qrl_rl_loss_input in = two_tokens();
    double loss;
    float g[2];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-4.0 + 1.65) / 2, TOL, "loss %g", loss);
    EXPECT_NEAR(g[0], -4.0 / 2, TOL, "g0 %g", g[0]);
    EXPECT_NEAR(g[1], 1.65 / 2, TOL, "g1 %g", g[1]);
    cr_assert_eq(s.tis_frac, 0.5);
    cr_assert_eq(s.acr_frac, 0.5);
    cr_assert_eq(s.clip_frac_high, 0.0);
    cr_assert_eq(s.clip_frac_low, 0.0);
    EXPECT_NEAR(s.ratio_mean, (2 + 1.1) / 2, TOL, "ratio_mean");
    EXPECT_NEAR(s.max_w, 4.0, 1e-5, "max_w");
    EXPECT_NEAR(s.pg_loss, loss, 0, "pg_loss");
    cr_assert_eq(s.kl_loss, 0.0);
    cr_assert_eq(s.n_tokens, 2);
    cr_assert_eq(s.n_seqs, 1);
}

/* decoupled, ACR off (plain TIS): t0 U = 1.28, R = 2 clipped: loss -2 * 1.28 = -2.56,
 * grad 0, counted as clip-high; t1 unchanged. */
Test(rl_loss, mode_decoupled_tis_only) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, false);
    qrl_rl_loss_input in = two_tokens();
    double loss;
    float g[2];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-2.56 + 1.65) / 2, TOL, "loss %g", loss);
    EXPECT_NEAR(g[0], 0.0, 1e-12, "g0");
    EXPECT_NEAR(g[1], 1.65 / 2, TOL, "g1");
    cr_assert_eq(s.tis_frac, 0.5);
    cr_assert_eq(s.acr_frac, 0.0);
    cr_assert_eq(s.clip_frac_high, 0.5);
}

/* The ACR bound itself: w = 8 (log w = log 8), C = 2 -> w_bar = 2, r = 1/4,
 * U = 1.28 * 4 = 5.12.  R = 5.0 passes (loss -2 * 5 = -10, grad -10); R = 5.2 is
 * clipped at 5.12 (loss -10.24, grad 0).  Single tokens, A = 1, via the double API. */
Test(rl_loss, acr_upper_bound_is_one_plus_eps_over_r) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    double lpp = -1.0, lpb = -1.0 - log(8.0), d;
    unsigned f;
    double l = qrl_rl_loss_token(&c, lpp + log(5.0), lpp, lpb, NAN, 1.0, &d, NULL, &f);
    EXPECT_NEAR(l, -10.0, 1e-12, "loss %g", l);
    EXPECT_NEAR(d, -10.0, 1e-12, "grad %g", d);
    cr_assert_eq(f, QRL_RL_TOK_TIS | QRL_RL_TOK_ACR);
    l = qrl_rl_loss_token(&c, lpp + log(5.2), lpp, lpb, NAN, 1.0, &d, NULL, &f);
    EXPECT_NEAR(l, -2.0 * 1.28 * 4.0, 1e-12, "loss %g", l);
    cr_assert_eq(d, 0.0);
    cr_assert_eq(f, QRL_RL_TOK_TIS | QRL_RL_TOK_ACR | QRL_RL_TOK_CLIP_HIGH);
    /* w exactly at C is not truncated: w_bar = w = 2, U = 1.28 */
    l = qrl_rl_loss_token(&c, lpp + log(1.2), lpp, lpp - log(2.0), NAN, 1.0, &d, NULL, &f);
    EXPECT_NEAR(l, -2.0 * 1.2, 1e-9, "loss at w = C: %g", l);
    cr_assert_eq(f & (QRL_RL_TOK_TIS | QRL_RL_TOK_ACR), 0u);
    /* the lower bound is not widened: A = -1, R = 0.5 < L = 0.8 -> surr = 0.8 * -1,
     * loss = -2 * -0.8 = 1.6, grad 0 */
    l = qrl_rl_loss_token(&c, lpp + log(0.5), lpp, lpb, NAN, -1.0, &d, NULL, &f);
    EXPECT_NEAR(l, 1.6, 1e-12, "low clip loss %g", l);
    cr_assert_eq(d, 0.0);
    cr_assert(f & QRL_RL_TOK_CLIP_LOW);
}

/* Prox mode, lp_prox = -1, R set through lp; six tokens, the last masked:
 *   A=+1 R=1.5 -> high clip, loss -1.28, grad 0
 *   A=-1 R=0.5 -> low clip,  loss  0.8,  grad 0
 *   A=+1 R=0.5 -> unclipped, loss -0.5,  grad -0.5
 *   A=-1 R=1.5 -> unclipped, loss  1.5,  grad  1.5
 *   A=+1 R=1.0 -> unclipped, loss -1.0,  grad -1.0
 *   masked (A=-1 R=0.1, would clip low): nothing.      token mean over 5 */
Test(rl_loss, clip_fractions_counted) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_PROX, true);
    const double R[6] = {1.5, 0.5, 0.5, 1.5, 1.0, 0.1};
    const float A[6] = {1, -1, 1, -1, 1, -1};
    const uint8_t M[6] = {1, 1, 1, 1, 1, 0};
    float lp[6], lpp[6];
    for (int i = 0; i < 6; i++) lpp[i] = -1.0f, lp[i] = (float)(-1.0 + log(R[i]));
    qrl_rl_loss_input in = {.n_seq = 1, .seq_len = 6, .lp = lp, .lp_prox = lpp, .adv = A,
                            .mask = M};
    double loss;
    float g[6];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-1.28 + 0.8 - 0.5 + 1.5 - 1.0) / 5, TOL, "loss %g", loss);
    const double want_g[6] = {0, 0, -0.5 / 5, 1.5 / 5, -1.0 / 5, 0};
    for (int i = 0; i < 6; i++) EXPECT_NEAR(g[i], want_g[i], TOL, "g%d %g", i, g[i]);
    cr_assert_eq(s.clip_frac_low, 0.2);
    cr_assert_eq(s.clip_frac_high, 0.2);
    cr_assert_eq(s.n_tokens, 5);
}

/* Dual clip, prox mode, one token.  A = -1, R = 4: plain PPO loss -R A = 4, grad 4;
 * dual clip c = 3 bounds surr below by c A = -3: loss 3, grad 0.  R = 2.5 < c: not
 * active.  A = -2, R = 4: loss -(3 * -2) = 6.  A > 0 untouched. */
Test(rl_loss, dual_clip_negative_advantages) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_PROX, true);
    double d, lpp = -2.0;
    unsigned f;
    double l = qrl_rl_loss_token(&c, lpp + log(4.0), lpp, NAN, NAN, -1.0, &d, NULL, &f);
    EXPECT_NEAR(l, 4.0, 1e-12, "no dual clip");
    EXPECT_NEAR(d, 4.0, 1e-12, "no dual clip grad");
    c.dual_clip = true;
    c.clip_c = 3.0;
    l = qrl_rl_loss_token(&c, lpp + log(4.0), lpp, NAN, NAN, -1.0, &d, NULL, &f);
    EXPECT_NEAR(l, 3.0, 1e-12, "dual clip %g", l);
    cr_assert_eq(d, 0.0);
    cr_assert(f & QRL_RL_TOK_DUAL_CLIP);
    l = qrl_rl_loss_token(&c, lpp + log(2.5), lpp, NAN, NAN, -1.0, &d, NULL, &f);
    EXPECT_NEAR(l, 2.5, 1e-12, "below c");
    EXPECT_NEAR(d, 2.5, 1e-12, "below c grad");
    cr_assert_eq(f, 0u);
    l = qrl_rl_loss_token(&c, lpp + log(4.0), lpp, NAN, NAN, -2.0, &d, NULL, &f);
    EXPECT_NEAR(l, 6.0, 1e-12, "A = -2");
    l = qrl_rl_loss_token(&c, lpp + log(4.0), lpp, NAN, NAN, 1.0, &d, NULL, &f);
    EXPECT_NEAR(l, -1.28, 1e-12, "A > 0 clipped high only");
    /* the fraction through the minibatch API: 1 of 2 tokens */
    float lp[2] = {(float)(lpp + log(4.0)), (float)(lpp + log(2.5))}, pp[2] = {-2, -2};
    const float A[2] = {-1, -1};
    qrl_rl_loss_input in = {.n_seq = 1, .seq_len = 2, .lp = lp, .lp_prox = pp, .adv = A,
                            .mask = MASK2};
    double loss;
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, NULL, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (3.0 + 2.5) / 2, TOL, "loss %g", loss);
    cr_assert_eq(s.dual_clip_frac, 0.5);
}

/* Three sequences of length 4: seq 0 has 1 response token (A = 2), seq 1 has 3
 * (A = -1), seq 2 none.  R = 1 everywhere (lp = lp_prox), so loss_t = -A.
 *   token mean:    (-2 + 1 + 1 + 1) / 4 = 0.25; grads -2/4 and 1/4
 *   sequence mean: (-2 / 1 + 3 / 3) / 2 = -0.5; grads -2/(1*2) and 1/(3*2) */
Test(rl_loss, token_mean_vs_sequence_mean) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_PROX, true);
    float lp[12], A[12];
    const uint8_t M[12] = {1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0};
    for (int i = 0; i < 12; i++) lp[i] = -0.7f, A[i] = i < 4 ? 2.0f : -1.0f;
    qrl_rl_loss_input in = {.n_seq = 3, .seq_len = 4, .lp = lp, .lp_prox = lp, .adv = A,
                            .mask = M};
    double loss;
    float g[12];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, 0.25, 1e-12, "token mean %g", loss);
    EXPECT_NEAR(g[0], -0.5, 1e-7, "g0");
    EXPECT_NEAR(g[5], 0.25, 1e-7, "g5");
    cr_assert_eq(s.n_seqs, 2);
    c.agg = QRL_RL_AGG_SEQ_MEAN;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, -0.5, 1e-12, "seq mean %g", loss);
    EXPECT_NEAR(g[0], -1.0, 1e-7, "g0");
    for (int i = 5; i < 8; i++) EXPECT_NEAR(g[i], 1.0 / 6.0, 1e-7, "g%d", i);
    for (int i = 8; i < 12; i++) cr_assert_eq(g[i], 0.0f);
}

/* The two-token decoupled case embedded in a [2, 4] layout whose masked slots hold
 * NaN, infinities and huge values: same loss and statistics, gradient 0 there. */
Test(rl_loss, masked_tokens_contribute_nothing) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.beta = 0.5;
    qrl_rl_loss_input ref = two_tokens();
    float lref2[2] = {LP[0] - 0.5f, LP[1] + 0.25f};
    ref.lp_ref = lref2;
    double want;
    qrl_rl_loss_stats ws;
    cr_assert_eq(qrl_rl_loss_compute(&c, &ref, &want, NULL, &ws, NULL), QRL_OK);
    float lp[8], lpp[8], lpb[8], lr[8], A[8];
    const uint8_t M[8] = {0, 1, 0, 0, 0, 0, 1, 0};
    for (int i = 0; i < 8; i++)
        lp[i] = NAN, lpp[i] = INFINITY, lpb[i] = -1e30f, lr[i] = NAN, A[i] = 1e30f;
    lp[1] = LP[0], lpp[1] = LPP[0], lpb[1] = LPB[0], lr[1] = lref2[0], A[1] = ADV[0];
    lp[6] = LP[1], lpp[6] = LPP[1], lpb[6] = LPB[1], lr[6] = lref2[1], A[6] = ADV[1];
    qrl_rl_loss_input in = {.n_seq = 2, .seq_len = 4, .lp = lp, .lp_prox = lpp,
                            .lp_behav = lpb, .lp_ref = lr, .adv = A, .mask = M};
    double loss;
    float g[8];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    cr_assert_eq(loss, want, "%g vs %g", loss, want);
    cr_assert_eq(s.max_w, ws.max_w);
    cr_assert_eq(s.k3_mean, ws.k3_mean);
    for (int i = 0; i < 8; i++)
        if (!M[i]) cr_assert_eq(g[i], 0.0f, "masked g%d", i);
    cr_assert(isfinite(g[1]) && isfinite(g[6]));
}

/* k3 with A = 0 (no policy term), beta = 0.1, two tokens:
 *   x = lp_ref - lp = 0.5:  k3 = e^0.5 - 0.5 - 1, d/dlp = beta (1 - e^0.5)
 *   x = -0.3:               k3 = e^-0.3 + 0.3 - 1, d/dlp = beta (1 - e^-0.3) */
Test(rl_loss, k3_value_and_gradient) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.beta = 0.1;
    float lp[2] = {-1.0f, -2.0f}, lr[2] = {-0.5f, -2.3f}, A[2] = {0, 0};
    qrl_rl_loss_input in = {.n_seq = 1, .seq_len = 2, .lp = lp, .lp_prox = lp,
                            .lp_behav = lp, .lp_ref = lr, .adv = A, .mask = MASK2};
    double x0 = (double)lr[0] - lp[0], x1 = (double)lr[1] - lp[1]; /* 0.5, ~-0.3 */
    double k0 = exp(x0) - x0 - 1, k1 = exp(x1) - x1 - 1;
    EXPECT_NEAR(k0, 0.1487212707, 1e-9, "hand value of k3(0.5)");
    double loss;
    float g[2];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, 0.1 * (k0 + k1) / 2, 1e-12, "loss %g", loss);
    EXPECT_NEAR(s.kl_loss, loss, 1e-15, "kl_loss");
    cr_assert_eq(s.pg_loss, 0.0);
    EXPECT_NEAR(g[0], 0.1 * (1 - exp(x0)) / 2, 1e-8, "g0 %g", g[0]);
    EXPECT_NEAR(g[1], 0.1 * (1 - exp(x1)) / 2, 1e-8, "g1 %g", g[1]);
    EXPECT_NEAR(s.k3_mean, (k0 + k1) / 2, 1e-12, "k3_mean");
    /* beta = 0: no loss term, k3 still logged */
    c.beta = 0;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    cr_assert_eq(loss, 0.0);
    cr_assert_eq(g[0], 0.0f);
    cr_assert(s.has_ref);
    EXPECT_NEAR(s.k3_mean, (k0 + k1) / 2, 1e-12, "k3_mean at beta 0");
    /* no reference log-probs: skipped */
    c.beta = 0.1;
    in.lp_ref = NULL;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    cr_assert_eq(loss, 0.0);
    cr_assert(!s.has_ref);
}

/* Gradient against central differences of the loss in double, random inputs with
 * every feature on (decoupled, ACR, dual clip, k3, sequence mean).  The perturbation
 * actually applied is (float)(lp + h) - (float)(lp - h).  Tokens within 2% of a clip
 * boundary (L, U from the test's own w and C, or c) are skipped. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* xorshift64*, [0, 1) */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

Test(rl_loss, gradient_matches_finite_differences) {
    enum { S = 5, T = 9, N = S * T };
    qrl_rl_loss_config c;
    qrl_rl_loss_config_default(&c);
    c.dual_clip = true;
    c.beta = 0.05;
    c.agg = QRL_RL_AGG_SEQ_MEAN;
    float lp[N], lpp[N], lpb[N], lr[N], A[N], g[N];
    uint8_t M[N];
    for (int i = 0; i < N; i++) {
        lpp[i] = (float)(-0.1 - 3.0 * urand());
        lp[i] = (float)(lpp[i] + 1.6 * (urand() - 0.5));
        lpb[i] = (float)(lpp[i] - 1.8 * (urand() - 0.3));
        lr[i] = (float)(lp[i] + urand() - 0.5);
        A[i] = (float)(4.0 * (urand() - 0.5));
        M[i] = (i % T) < 3 + (i / T) || urand() < 0.3; /* unequal lengths */
    }
    qrl_rl_loss_input in = {.n_seq = S, .seq_len = T, .lp = lp, .lp_prox = lpp,
                            .lp_behav = lpb, .lp_ref = lr, .adv = A, .mask = M};
    double loss;
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    cr_assert(s.tis_frac > 0 && s.clip_frac_high + s.clip_frac_low > 0,
              "inputs exercise TIS and clipping: tis %g clip %g %g", s.tis_frac,
              s.clip_frac_low, s.clip_frac_high);
    int checked = 0, nonzero = 0;
    for (int i = 0; i < N; i++) {
        if (!M[i]) continue;
        double R = exp((double)lp[i] - lpp[i]), w = exp((double)lpp[i] - lpb[i]);
        double U = 1.28 * (w > 2.0 ? w / 2.0 : 1.0);
        if (fabs(R / 0.8 - 1) < 0.02 || fabs(R / U - 1) < 0.02 || fabs(R / 3.0 - 1) < 0.02)
            continue;
        float keep = lp[i];
        float hi = (float)(keep + 1e-3), lo = (float)(keep - 1e-3);
        double lhi, llo;
        lp[i] = hi;
        cr_assert_eq(qrl_rl_loss_compute(&c, &in, &lhi, NULL, NULL, NULL), QRL_OK);
        lp[i] = lo;
        cr_assert_eq(qrl_rl_loss_compute(&c, &in, &llo, NULL, NULL, NULL), QRL_OK);
        lp[i] = keep;
        double fd = (lhi - llo) / ((double)hi - lo);
        cr_assert(fabs(fd - g[i]) <= 1e-6 + 1e-4 * fabs(fd), "token %d: fd %.9g grad %.9g", i,
                  fd, g[i]);
        checked++;
        nonzero += g[i] != 0;
    }
    cr_assert(checked >= 20 && nonzero >= 10, "checked %d nonzero %d", checked, nonzero);
}

Test(rl_loss, nan_lp_behav_names_token) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    float lp[6] = {-1, -1, -1, -1, -1, -1}, lpb[6] = {-1, -1, -1, -1, NAN, -1};
    const float A[6] = {1, 1, 1, 1, 1, 1};
    const uint8_t M[6] = {1, 1, 1, 1, 1, 1};
    qrl_rl_loss_input in = {.n_seq = 2, .seq_len = 3, .lp = lp, .lp_prox = lp,
                            .lp_behav = lpb, .adv = A, .mask = M};
    double loss = 123;
    qrl_error e;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, NULL, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "lp_behav[4]") && strstr(e.msg, "seq 1, pos 1"), "%s", e.msg);
    cr_assert_eq(loss, 123.0, "loss untouched");
    /* a NaN advantage is named too */
    lpb[4] = -1;
    float A2[6] = {1, 1, INFINITY, 1, 1, 1};
    in.adv = A2;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, NULL, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "adv[2]"), "%s", e.msg);
}

/* R = exp(0 - (-800)) overflows to inf with A < 0: -inf surrogate, reported by token,
 * gradient buffer zeroed. */
Test(rl_loss, overflowing_ratio_is_an_error) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_NAIVE, true);
    float lp[2] = {-1, 0}, lpb[2] = {-1, -800};
    const float A[2] = {1, -1};
    qrl_rl_loss_input in = {.n_seq = 1, .seq_len = 2, .lp = lp, .lp_behav = lpb, .adv = A,
                            .mask = MASK2};
    double loss = 7;
    float g[2] = {5, 5};
    qrl_error e;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, NULL, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(e.msg, "token 1"), "%s", e.msg);
    cr_assert_eq(loss, 7.0);
    cr_assert_eq(g[0], 0.0f);
}

Test(rl_loss, missing_arrays_and_bad_config) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    qrl_rl_loss_input in = two_tokens();
    in.lp_behav = NULL;
    double loss;
    qrl_error e;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, NULL, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "lp_behav"), "%s", e.msg);
    in = two_tokens();
    in.lp_prox = NULL;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, NULL, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "lp_prox"), "%s", e.msg);
    in = two_tokens();
    qrl_rl_loss_config b = c;
    b.eps_low = 1.0;
    cr_assert_eq(qrl_rl_loss_compute(&b, &in, &loss, NULL, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "eps_low"), "%s", e.msg);
    b = c, b.eps_high = -0.1;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "eps_high"), "%s", e.msg);
    b = c, b.tis_cap = 0;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "tis_cap"), "%s", e.msg);
    b = c, b.dual_clip = true, b.clip_c = 1.0;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "clip_c"), "%s", e.msg);
    b = c, b.beta = NAN;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "beta"), "%s", e.msg);
    b = c, b.mode = (qrl_rl_loss_mode)7;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "loss.mode"), "%s", e.msg);
    b = c, b.tis_cap = INFINITY; /* no truncation is allowed */
    cr_assert_eq(qrl_rl_loss_config_validate(&b, NULL), QRL_OK);
}

Test(rl_loss, defaults_are_spec) {
    qrl_rl_loss_config c;
    qrl_rl_loss_config_default(&c);
    cr_assert_eq(c.mode, QRL_RL_LOSS_DECOUPLED);
    cr_assert_eq(c.eps_low, 0.2);
    cr_assert_eq(c.eps_high, 0.28);
    cr_assert_eq(c.tis_cap, 2.0);
    cr_assert_eq(c.beta, 1e-3);
    cr_assert(c.acr);
    cr_assert_eq(c.clip_c, 3.0);
    cr_assert_eq(c.agg, QRL_RL_AGG_TOKEN_MEAN);
}

Test(rl_loss, no_response_tokens) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    const uint8_t M[2] = {0, 0};
    qrl_rl_loss_input in = two_tokens();
    in.mask = M;
    double loss = 9;
    float g[2] = {3, 3};
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    cr_assert_eq(loss, 0.0);
    cr_assert_eq(g[0], 0.0f);
    cr_assert_eq(s.n_tokens, 0);
}

/* ---- rollout corrections beside TIS / ACR (docs/loss.md "Rollout corrections") ---- */

/* Sequence-level TIS (loss.is_level seq), decoupled + ACR, C = 2, token mean.  [2, 3]
 * layout, beta 0:
 *   seq 0: two tokens (slot 2 masked, its lp_behav NaN: never read) with log w = log 9
 *     and 0: w_seq = exp((log 9 + 0) / 2) = 3 > C -> w_bar = 2 on both, r = 2/3,
 *     U = 1.28 / (2/3) = 1.92.  t0: R = 1.5, A = +1 -> inside: loss -2 * 1.5 = -3,
 *     grad -3.  t1: R = 2.0 > 1.92, A = +1 -> clipped: loss -2 * 1.92 = -3.84, grad 0.
 *   seq 1: three tokens with log w = 0.2, -0.1, 0.5: w_seq = exp(0.6 / 3) = e^0.2 < C,
 *     w_bar = e^0.2 on all three (not the token weights e^0.2, e^-0.1, e^0.5); R = 1,
 *     A = -1 -> surr -1, loss e^0.2, grad e^0.2 each.
 * N = 5.  Token-level TIS on the same data would give seq 0 t0 w = 9 -> w_bar 2,
 * U = 1.28 * 4.5 = 5.76: loss -3; t1 w = 1, U 1.28: -1.28. */
static float SQ_LP[6], SQ_LPP[6], SQ_LPB[6];
static const float SQ_A[6] = {1, 1, 0, -1, -1, -1};
static const uint8_t SQ_M[6] = {1, 1, 0, 1, 1, 1};
static qrl_rl_loss_input seq_tis_input(void) {
    const double lw[6] = {log(9.0), 0, 0, 0.2, -0.1, 0.5}, R[6] = {1.5, 2.0, 1, 1, 1, 1};
    for (int i = 0; i < 6; i++) {
        SQ_LPP[i] = -1.25f;
        SQ_LPB[i] = (float)(-1.25 - lw[i]);
        SQ_LP[i] = (float)(-1.25 + log(R[i]));
    }
    SQ_LPB[2] = NAN, SQ_LP[2] = NAN;
    return (qrl_rl_loss_input){.n_seq = 2, .seq_len = 3, .lp = SQ_LP, .lp_prox = SQ_LPP,
                               .lp_behav = SQ_LPB, .adv = SQ_A, .mask = SQ_M};
}

Test(rl_loss, seq_tis_geometric_mean_weight) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.is_level = QRL_RL_IS_SEQ;
    qrl_rl_loss_input in = seq_tis_input();
    double loss;
    float g[6];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    double e02 = exp(0.2); /* 1.2214027582 */
    EXPECT_NEAR(loss, (-3.0 - 3.84 + 3 * e02) / 5, TOL, "loss %g", loss);
    const double want_g[6] = {-3.0 / 5, 0, 0, e02 / 5, e02 / 5, e02 / 5};
    for (int i = 0; i < 6; i++) EXPECT_NEAR(g[i], want_g[i], TOL, "g%d %g", i, g[i]);
    EXPECT_NEAR(s.tis_frac, 2.0 / 5, 1e-15, "tis_frac %g", s.tis_frac); /* seq 0's tokens */
    EXPECT_NEAR(s.acr_frac, 2.0 / 5, 1e-15, "acr_frac");
    EXPECT_NEAR(s.seq_tis_frac, 0.5, 1e-15, "seq_tis_frac %g", s.seq_tis_frac);
    EXPECT_NEAR(s.clip_frac_high, 1.0 / 5, 1e-15, "clip_high");
    cr_assert_eq(s.mis_frac, 0.0);
    cr_assert_eq(s.mis_seq_frac, 0.0);
    /* ACR off: U = 1.28 for seq 0: both tokens clipped, -2 * 1.28 each, grad 0 */
    c.acr = false;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-2.56 - 2.56 + 3 * e02) / 5, TOL, "loss without ACR %g", loss);
    cr_assert_eq(g[0], 0.0f);
    EXPECT_NEAR(s.clip_frac_high, 2.0 / 5, 1e-15, "clip_high without ACR");
    cr_assert_eq(s.acr_frac, 0.0);
    /* the token-level default on the same data: seq 0 -3 and -1.28; seq 1 token weights
     * e^0.2, e^-0.1, e^0.5 (all < C) */
    c.acr = true, c.is_level = QRL_RL_IS_TOKEN;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-3.0 - 1.28 + exp(0.2) + exp(-0.1) + exp(0.5)) / 5, TOL, "token TIS %g",
                loss);
    cr_assert_eq(s.seq_tis_frac, 0.0);
    EXPECT_NEAR(s.tis_frac, 1.0 / 5, 1e-15, "token tis_frac");
    /* sequence mean: seq 0 (-3 - 3.84) / 2, seq 1 3 e^0.2 / 3, over 2 sequences */
    c.is_level = QRL_RL_IS_SEQ, c.agg = QRL_RL_AGG_SEQ_MEAN;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, ((-3.0 - 3.84) / 2 + e02) / 2, TOL, "seq mean %g", loss);
    EXPECT_NEAR(g[0], -3.0 / 4, TOL, "seq-mean g0 %g", g[0]);
    EXPECT_NEAR(g[3], e02 / 6, TOL, "seq-mean g3 %g", g[3]);
}

/* Token-level masked IS (loss.mis token, IcePop), band [0.5, 5], decoupled, one
 * sequence of 4 tokens, token mean over all 4:
 *   t0: w = 4 (kept), R = 1.1, A = +1 -> loss -4 * 1.1 = -4.4, grad -4.4
 *   t1: w = 6 > 5: dropped (R = 2, A = +1 would be clipped high: not counted)
 *   t2: w = 0.4 < 0.5: dropped (R = 0.5, A = -1 would be clipped low: not counted)
 *   t3: w = e^-0.5 with mis_low set to exactly that value: kept (band closed);
 *       R = 1, A = -1 -> loss e^-0.5, grad e^-0.5
 * With tis_cap = inf (pure IcePop: kept weights are not truncated): loss
 * (-4.4 + e^-0.5) / 4.  With tis_cap 2 (TIS then mask): t0 w_bar = 2, r = 1/2,
 * U = 2.56 (ACR): loss -2.2, tis_frac 1/4. */
Test(rl_loss, token_mis_drops_tokens_outside_band) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.mis = QRL_RL_MIS_TOKEN;
    c.tis_cap = INFINITY;
    c.mis_low = exp((double)-1.0f - (double)-0.5f); /* = t3's w, computed as the loss does */
    c.mis_high = 5.0;
    cr_assert(fabs(c.mis_low - 0.6065306597) < 1e-9);
    const double lw[4] = {log(4.0), log(6.0), log(0.4), 0}, R[4] = {1.1, 2.0, 0.5, 1.0};
    const float A[4] = {1, 1, -1, -1};
    const uint8_t M[4] = {1, 1, 1, 1};
    float lp[4], lpp[4], lpb[4];
    for (int i = 0; i < 3; i++) {
        lpp[i] = -2.0f;
        lpb[i] = (float)(-2.0 - lw[i]);
        lp[i] = (float)(-2.0 + log(R[i]));
    }
    lpp[3] = -1.0f, lpb[3] = -0.5f, lp[3] = -1.0f; /* w = e^-0.5, R = 1 */
    qrl_rl_loss_input in = {.n_seq = 1, .seq_len = 4, .lp = lp, .lp_prox = lpp,
                            .lp_behav = lpb, .adv = A, .mask = M};
    double loss;
    float g[4];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    double em05 = exp(-0.5);
    EXPECT_NEAR(loss, (-4.4 + em05) / 4, TOL, "loss %g", loss);
    const double want_g[4] = {-4.4 / 4, 0, 0, em05 / 4};
    for (int i = 0; i < 4; i++) EXPECT_NEAR(g[i], want_g[i], TOL, "g%d %g", i, g[i]);
    cr_assert_eq(g[1], 0.0f);
    cr_assert_eq(g[2], 0.0f);
    cr_assert_eq(s.mis_frac, 0.5);
    cr_assert_eq(s.mis_seq_frac, 0.0);
    cr_assert_eq(s.tis_frac, 0.0);
    cr_assert_eq(s.clip_frac_high, 0.0);
    cr_assert_eq(s.clip_frac_low, 0.0);
    EXPECT_NEAR(s.ratio_mean, (1.1 + 2.0 + 0.5 + 1.0) / 4, TOL, "ratio_mean over all tokens");
    EXPECT_NEAR(s.max_w, 6.0, 1e-5, "max_w still sees the dropped token");
    /* TIS then mask: t0 truncated at C = 2 with ACR */
    c.tis_cap = 2.0;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-2.2 + em05) / 4, TOL, "loss with C = 2: %g", loss);
    cr_assert_eq(s.tis_frac, 0.25);
    cr_assert_eq(s.acr_frac, 0.25);
    cr_assert_eq(s.mis_frac, 0.5);
    /* one band step tighter than t3's w drops it too */
    c.mis_low = nextafter(c.mis_low, 1.0);
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, -2.2 / 4, TOL, "t3 dropped: %g", loss);
    cr_assert_eq(s.mis_frac, 0.75);
}

/* A dropped token keeps its k3 term: the single-token API, beta 0.1, x = lp_ref - lp
 * = 0.5: loss 0.1 (e^0.5 - 1.5), grad 0.1 (1 - e^0.5); flags = MIS only (R = 8 with
 * A = +1 would be clipped high). */
Test(rl_loss, token_mis_keeps_k3_of_dropped_tokens) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.mis = QRL_RL_MIS_TOKEN, c.beta = 0.1;
    double lpp = -2.0, lp = lpp + log(8.0), d, R;
    unsigned f;
    double l = qrl_rl_loss_token(&c, lp, lpp, lpp - log(10.0), lp + 0.5, 1.0, &d, &R, &f);
    EXPECT_NEAR(l, 0.1 * (exp(0.5) - 1.5), 1e-12, "loss %g", l);
    EXPECT_NEAR(d, 0.1 * (1 - exp(0.5)), 1e-12, "grad %g", d);
    EXPECT_NEAR(R, 8.0, 1e-12, "ratio");
    cr_assert_eq(f, (unsigned)QRL_RL_TOK_MIS);
    /* inside the band (w = 3): the ordinary decoupled token, TIS at C = 2, ACR U = 1.92:
     * R = 8 clipped -> -2 * 1.92 + k3 */
    l = qrl_rl_loss_token(&c, lp, lpp, lpp - log(3.0), lp + 0.5, 1.0, &d, &R, &f);
    EXPECT_NEAR(l, -2 * 1.92 + 0.1 * (exp(0.5) - 1.5), 1e-12, "kept token %g", l);
    cr_assert_eq(f, QRL_RL_TOK_TIS | QRL_RL_TOK_ACR | QRL_RL_TOK_CLIP_HIGH);
    /* naive and prox modes take no rollout correction */
    c.mode = QRL_RL_LOSS_PROX;
    l = qrl_rl_loss_token(&c, lp, lpp, lpp - log(10.0), NAN, 1.0, &d, &R, &f);
    EXPECT_NEAR(l, -1.28, 1e-12, "prox mode ignores loss.mis: %g", l);
}

/* Sequence-level masked IS (loss.mis seq), band [0.8, 1.25], C = 2, ACR, R = 1 and
 * A = +1 everywhere (loss_t = -w_bar), [3, 2] layout:
 *   seq 0: log w = log 2, 0 -> w_seq = sqrt 2 = 1.414 > 1.25: dropped whole
 *   seq 1: log w = 1, -1    -> w_seq = 1: kept, although each token weight (e, 1/e) is
 *          outside the band; token weights (is_level token): t0 w = e > C -> w_bar 2,
 *          loss -2, grad -2; t1 w_bar = 1/e, loss -1/e
 *   seq 2: one token (slot 5 masked), log w = -0.3 -> 0.741 < 0.8: dropped
 * Token mean over N = 5: (-2 - 1/e) / 5; mis_frac 3/5, mis_seq_frac 2/3, tis_frac 1/5.
 * Pure Seq-MIS with geometric weights (is_level seq, C = inf): seq 1 w_bar = 1 on both
 * tokens: -2 / 5; sequence mean: (0 + (-2 / 2) + 0) / 3 (dropped sequences still count).
 * Token-level MIS with the same band keeps only seq 0 t1 (w = 1): -1 / 5. */
Test(rl_loss, seq_mis_drops_whole_sequences) {
    qrl_rl_loss_config c = cfg_of(QRL_RL_LOSS_DECOUPLED, true);
    c.mis = QRL_RL_MIS_SEQ, c.mis_low = 0.8, c.mis_high = 1.25;
    const double lw[6] = {log(2.0), 0, 1.0, -1.0, -0.3, 0};
    const float A[6] = {1, 1, 1, 1, 1, 1};
    const uint8_t M[6] = {1, 1, 1, 1, 1, 0};
    float lp[6], lpp[6], lpb[6];
    for (int i = 0; i < 6; i++) {
        lpp[i] = lp[i] = -1.5f;
        lpb[i] = (float)(-1.5 - lw[i]);
    }
    lpb[5] = NAN;
    qrl_rl_loss_input in = {.n_seq = 3, .seq_len = 2, .lp = lp, .lp_prox = lpp,
                            .lp_behav = lpb, .adv = A, .mask = M};
    double loss;
    float g[6];
    qrl_rl_loss_stats s;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, (-2.0 - exp(-1.0)) / 5, TOL, "loss %g", loss);
    const double want_g[6] = {0, 0, -2.0 / 5, -exp(-1.0) / 5, 0, 0};
    for (int i = 0; i < 6; i++) EXPECT_NEAR(g[i], want_g[i], TOL, "g%d %g", i, g[i]);
    EXPECT_NEAR(s.mis_frac, 3.0 / 5, 1e-15, "mis_frac %g", s.mis_frac);
    EXPECT_NEAR(s.mis_seq_frac, 2.0 / 3, 1e-15, "mis_seq_frac %g", s.mis_seq_frac);
    EXPECT_NEAR(s.tis_frac, 1.0 / 5, 1e-15, "tis_frac");
    cr_assert_eq(s.seq_tis_frac, 0.0);
    /* pure Seq-MIS: geometric-mean weights, no truncation */
    c.is_level = QRL_RL_IS_SEQ, c.tis_cap = INFINITY;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, -2.0 / 5, TOL, "pure seq-MIS %g", loss);
    EXPECT_NEAR(g[2], -1.0 / 5, TOL, "g2");
    EXPECT_NEAR(g[3], -1.0 / 5, TOL, "g3");
    cr_assert_eq(s.tis_frac, 0.0);
    c.agg = QRL_RL_AGG_SEQ_MEAN;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, -1.0 / 3, TOL, "seq mean %g", loss);
    /* token-level MIS, same band */
    c.agg = QRL_RL_AGG_TOKEN_MEAN, c.mis = QRL_RL_MIS_TOKEN, c.is_level = QRL_RL_IS_TOKEN;
    cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
    EXPECT_NEAR(loss, -1.0 / 5, TOL, "token MIS %g", loss);
    EXPECT_NEAR(s.mis_frac, 4.0 / 5, 1e-15, "token mis_frac");
    cr_assert_eq(s.mis_seq_frac, 0.0);
}

/* The corrections' gradients against central differences (the rollout-correction part
 * of gradient_matches_finite_differences): decoupled + ACR + k3, each correction.
 * Tokens within 2% of L or of U (from the test's own w / w_seq and C) are skipped. */
Test(rl_loss, corrections_gradient_matches_finite_differences) {
    enum { S = 6, T = 8, N = S * T };
    float lp[N], lpp[N], lpb[N], lr[N], A[N], g[N];
    uint8_t M[N];
    for (int i = 0; i < N; i++) {
        lpp[i] = (float)(-0.1 - 3.0 * urand());
        lp[i] = (float)(lpp[i] + 1.6 * (urand() - 0.5));
        lpb[i] = (float)(lpp[i] - 2.0 * (urand() - 0.4));
        lr[i] = (float)(lp[i] + urand() - 0.5);
        A[i] = (float)(4.0 * (urand() - 0.5));
        M[i] = (i % T) < 2 + (i / T) || urand() < 0.3;
    }
    const struct { qrl_rl_is_level lvl; qrl_rl_mis mis; double lo, hi, C; } cases[] = {
        {QRL_RL_IS_SEQ, QRL_RL_MIS_NONE, 0.5, 5, 1.1},
        {QRL_RL_IS_TOKEN, QRL_RL_MIS_TOKEN, 0.6, 1.8, 1.5},
        {QRL_RL_IS_SEQ, QRL_RL_MIS_SEQ, 0.8, 1.3, 1.1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        qrl_rl_loss_config c;
        qrl_rl_loss_config_default(&c);
        c.beta = 0.05, c.is_level = cases[k].lvl, c.mis = cases[k].mis;
        c.mis_low = cases[k].lo, c.mis_high = cases[k].hi, c.tis_cap = cases[k].C;
        qrl_rl_loss_input in = {.n_seq = S, .seq_len = T, .lp = lp, .lp_prox = lpp,
                                .lp_behav = lpb, .lp_ref = lr, .adv = A, .mask = M};
        double loss;
        qrl_rl_loss_stats s;
        cr_assert_eq(qrl_rl_loss_compute(&c, &in, &loss, g, &s, NULL), QRL_OK);
        bool used = c.mis == QRL_RL_MIS_NONE ? s.seq_tis_frac > 0
                                             : s.mis_frac > 0 && s.mis_frac < 1;
        cr_assert(used, "case %zu exercises its correction: seq_tis %g mis %g", k,
                  s.seq_tis_frac, s.mis_frac);
        int checked = 0;
        for (int i = 0; i < N; i++) {
            if (!M[i]) continue;
            int q = i / T;
            double ws = 0, n = 0;
            for (int t = 0; t < T; t++)
                if (M[q * T + t]) ws += (double)lpp[q * T + t] - lpb[q * T + t], n++;
            double w = c.is_level == QRL_RL_IS_SEQ ? exp(ws / n) : exp((double)lpp[i] - lpb[i]);
            double R = exp((double)lp[i] - lpp[i]);
            double U = 1.28 * (w > c.tis_cap ? w / c.tis_cap : 1.0);
            if (fabs(R / 0.8 - 1) < 0.02 || fabs(R / U - 1) < 0.02) continue;
            float keep = lp[i], hi = (float)(keep + 1e-3), lo = (float)(keep - 1e-3);
            double lhi, llo;
            lp[i] = hi;
            cr_assert_eq(qrl_rl_loss_compute(&c, &in, &lhi, NULL, NULL, NULL), QRL_OK);
            lp[i] = lo;
            cr_assert_eq(qrl_rl_loss_compute(&c, &in, &llo, NULL, NULL, NULL), QRL_OK);
            lp[i] = keep;
            double fd = (lhi - llo) / ((double)hi - lo);
            cr_assert(fabs(fd - g[i]) <= 1e-6 + 1e-4 * fabs(fd),
                      "case %zu token %d: fd %.9g grad %.9g", k, i, fd, g[i]);
            checked++;
        }
        cr_assert(checked >= 15, "case %zu: checked %d", k, checked);
    }
}

Test(rl_loss, correction_config_errors) {
    qrl_rl_loss_config c;
    qrl_rl_loss_config_default(&c);
    cr_assert_eq(c.is_level, QRL_RL_IS_TOKEN);
    cr_assert_eq(c.mis, QRL_RL_MIS_NONE);
    cr_assert_eq(c.mis_low, 0.5);
    cr_assert_eq(c.mis_high, 5.0);
    qrl_error e;
    qrl_rl_loss_config b = c;
    b.mis_low = -1, b.mis_high = 0; /* not checked while mis is none */
    cr_assert_eq(qrl_rl_loss_config_validate(&b, NULL), QRL_OK);
    b.mis = QRL_RL_MIS_TOKEN;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "loss.mis_low"), "%s", e.msg);
    b.mis_low = 2, b.mis_high = 2;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "loss.mis_high"), "%s", e.msg);
    b.mis_high = NAN;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    b.mis_low = 0, b.mis_high = INFINITY; /* one-sided band: allowed */
    cr_assert_eq(qrl_rl_loss_config_validate(&b, NULL), QRL_OK);
    b = c, b.mis = (qrl_rl_mis)9;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "loss.mis:"), "%s", e.msg);
    b = c, b.is_level = (qrl_rl_is_level)9;
    cr_assert_eq(qrl_rl_loss_config_validate(&b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "loss.is_level"), "%s", e.msg);
}
