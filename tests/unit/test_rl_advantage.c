/* RL advantages and dynamic sampling (common/rl): GRPO / Dr.GRPO / RLOO against values
 * worked out by hand, singleton groups, zero-variance groups dropped, the over-sampling
 * bookkeeping, and bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "rl/rl.h"

#define EXPECT_NEAR(got, want, tol, ...) \
    cr_assert(fabs((double)(got) - (double)(want)) <= (tol), __VA_ARGS__)

/* rewards {1, 0, 0, 0}: mean 1/4; squared deviations 9/16 + 3 * 1/16 = 12/16 = 3/4;
 * sample variance (3/4) / 3 = 1/4, sample std 1/2 (population std would be sqrt(3)/4). */
Test(rl_advantage, grpo_uses_sample_std) {
    const float r[4] = {1, 0, 0, 0};
    float a[4];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_GRPO, r, 4, a, NULL), QRL_OK);
    EXPECT_NEAR(a[0], 0.75 / (0.5 + 1e-6), 1e-6, "a0 %g", a[0]);
    for (int i = 1; i < 4; i++) EXPECT_NEAR(a[i], -0.25 / (0.5 + 1e-6), 1e-6, "a%d %g", i, a[i]);
    /* 1.5 and -0.5 up to the 1e-6 epsilon: differs from the population-std 1.732 */
    EXPECT_NEAR(a[0], 1.5, 1e-5, "a0");
}

/* rewards {0.5, 1.5, 2.5}: mean 1.5, deviations -1, 0, 1, sample var 2/2 = 1, std 1. */
Test(rl_advantage, grpo_three_levels) {
    const float r[3] = {0.5f, 1.5f, 2.5f};
    float a[3];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_GRPO, r, 3, a, NULL), QRL_OK);
    EXPECT_NEAR(a[0], -1.0 / (1.0 + 1e-6), 1e-7, "a0");
    EXPECT_NEAR(a[1], 0.0, 1e-7, "a1");
    EXPECT_NEAR(a[2], 1.0 / (1.0 + 1e-6), 1e-7, "a2");
}

Test(rl_advantage, drgrpo_no_std) {
    const float r[4] = {1, 0, 0, 0};
    float a[4];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_DRGRPO, r, 4, a, NULL), QRL_OK);
    EXPECT_NEAR(a[0], 0.75, 1e-7, "a0");
    for (int i = 1; i < 4; i++) EXPECT_NEAR(a[i], -0.25, 1e-7, "a%d", i);
}

/* RLOO: r_i - mean of the others.  {1, 0, 0, 0}: 1 - 0 = 1; 0 - 1/3.
 * {3, 1, 2}: 3 - 1.5 = 1.5; 1 - 2.5 = -1.5; 2 - 2 = 0. */
Test(rl_advantage, rloo_leave_one_out) {
    const float r[4] = {1, 0, 0, 0};
    float a[4];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_RLOO, r, 4, a, NULL), QRL_OK);
    EXPECT_NEAR(a[0], 1.0, 1e-7, "a0");
    for (int i = 1; i < 4; i++) EXPECT_NEAR(a[i], -1.0 / 3.0, 1e-7, "a%d", i);
    const float r2[3] = {3, 1, 2};
    float b[3];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_RLOO, r2, 3, b, NULL), QRL_OK);
    EXPECT_NEAR(b[0], 1.5, 1e-7, "b0");
    EXPECT_NEAR(b[1], -1.5, 1e-7, "b1");
    EXPECT_NEAR(b[2], 0.0, 1e-7, "b2");
}

Test(rl_advantage, singleton_group_is_zero) {
    const float r[1] = {1};
    qrl_rl_adv_estimator est[3] = {QRL_RL_ADV_GRPO, QRL_RL_ADV_DRGRPO, QRL_RL_ADV_RLOO};
    for (int e = 0; e < 3; e++) {
        float a[1] = {42};
        cr_assert_eq(qrl_rl_advantage_group(est[e], r, 1, a, NULL), QRL_OK);
        cr_assert_eq(a[0], 0.0f, "estimator %d: %g", e, a[0]);
    }
}

Test(rl_advantage, equal_rewards_give_zero) {
    const float r[3] = {1, 1, 1};
    float a[3];
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_GRPO, r, 3, a, NULL), QRL_OK);
    for (int i = 0; i < 3; i++) cr_assert_eq(a[i], 0.0f); /* 0 / (0 + 1e-6) */
}

/* Three groups back to back: {1,0} {2} {0,0,3}.
 * GRPO {1,0}: mean .5, sample std sqrt(.5) -> +-0.5 / (0.70710678 + 1e-6);
 * {2}: 0; {0,0,3}: mean 1, dev -1,-1,2, sample var 6/2 = 3, std sqrt(3). */
Test(rl_advantage, groups_with_offsets) {
    const float r[6] = {1, 0, 2, 0, 0, 3};
    const size_t off[4] = {0, 2, 3, 6};
    float a[6];
    cr_assert_eq(qrl_rl_advantage_groups(QRL_RL_ADV_GRPO, r, off, 3, a, NULL), QRL_OK);
    double s1 = sqrt(0.5) + 1e-6, s3 = sqrt(3.0) + 1e-6;
    EXPECT_NEAR(a[0], 0.5 / s1, 1e-6, "a0");
    EXPECT_NEAR(a[1], -0.5 / s1, 1e-6, "a1");
    cr_assert_eq(a[2], 0.0f);
    EXPECT_NEAR(a[3], -1.0 / s3, 1e-6, "a3");
    EXPECT_NEAR(a[4], -1.0 / s3, 1e-6, "a4");
    EXPECT_NEAR(a[5], 2.0 / s3, 1e-6, "a5");
}

Test(rl_advantage, broadcast_to_tokens) {
    const float as[2] = {0.5f, -2.0f};
    const uint8_t m[6] = {0, 1, 1, 1, 1, 0};
    float at[6];
    memset(at, 0x7f, sizeof at);
    qrl_rl_advantage_broadcast(as, 2, 3, m, at);
    const float want[6] = {0, 0.5f, 0.5f, -2.0f, -2.0f, 0};
    for (int i = 0; i < 6; i++) cr_assert_eq(at[i], want[i], "token %d", i);
}

Test(rl_advantage, non_finite_reward_named) {
    const float r[6] = {1, 0, 2, 0, NAN, 3};
    const size_t off[4] = {0, 2, 3, 6};
    float a[6] = {7, 7, 7, 7, 7, 7};
    qrl_error e;
    cr_assert_eq(qrl_rl_advantage_groups(QRL_RL_ADV_GRPO, r, off, 3, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "rewards[4]"), "%s", e.msg);
    cr_assert_eq(a[0], 7.0f, "nothing written on error");
    const float inf[2] = {INFINITY, 0};
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_RLOO, inf, 2, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "rewards[0]"), "%s", e.msg);
}

Test(rl_advantage, bad_arguments) {
    const float r[2] = {1, 0};
    float a[2];
    qrl_error e;
    cr_assert_eq(qrl_rl_advantage_group(QRL_RL_ADV_GRPO, r, 0, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "empty"), "%s", e.msg);
    cr_assert_eq(qrl_rl_advantage_group((qrl_rl_adv_estimator)9, r, 2, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "estimator"), "%s", e.msg);
    const size_t bad_off[3] = {0, 2, 2}; /* group 1 empty */
    cr_assert_eq(qrl_rl_advantage_groups(QRL_RL_ADV_GRPO, r, bad_off, 2, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "group 1"), "%s", e.msg);
    const size_t bad0[2] = {1, 2};
    cr_assert_eq(qrl_rl_advantage_groups(QRL_RL_ADV_GRPO, r, bad0, 1, a, &e),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "offsets[0]"), "%s", e.msg);
}

/* ---- dynamic sampling ---- */

Test(rl_dynsample, zero_variance_groups_dropped) {
    /* {1,1,1} drop, {0,1} keep, {0,0} drop, {5} drop (singleton), {0.5,0.5,0.25} keep */
    const float r[11] = {1, 1, 1, 0, 1, 0, 0, 5, 0.5f, 0.5f, 0.25f};
    const size_t off[6] = {0, 3, 5, 7, 8, 11};
    uint8_t keep[5];
    size_t n_kept = 99;
    cr_assert_eq(qrl_rl_groups_filter(r, off, 5, keep, &n_kept, NULL), QRL_OK);
    const uint8_t want[5] = {0, 1, 0, 0, 1};
    for (int g = 0; g < 5; g++) cr_assert_eq(keep[g], want[g], "group %d", g);
    cr_assert_eq(n_kept, 2);
    cr_assert(qrl_rl_group_zero_variance(r, 3));
    cr_assert(!qrl_rl_group_zero_variance(r + 3, 2));
    qrl_error e;
    const size_t bad[3] = {0, 3, 1};
    cr_assert_eq(qrl_rl_groups_filter(r, bad, 2, keep, NULL, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "group 1"), "%s", e.msg);
}

Test(rl_dynsample, fills_to_target) {
    qrl_rl_dynsample ds;
    cr_assert_eq(qrl_rl_dynsample_init(&ds, 2, 2.0, NULL), QRL_OK);
    cr_assert_eq(ds.max_offered, 4);
    const float same[2] = {1, 1}, diff[2] = {0, 1};
    bool keep = true;
    cr_assert_eq(qrl_rl_dynsample_offer(&ds, same, 2, &keep), QRL_RL_DYNSAMPLE_NEED_MORE);
    cr_assert(!keep);
    cr_assert_eq(qrl_rl_dynsample_offer(&ds, diff, 2, &keep), QRL_RL_DYNSAMPLE_NEED_MORE);
    cr_assert(keep);
    cr_assert_eq(qrl_rl_dynsample_offer(&ds, diff, 2, &keep), QRL_RL_DYNSAMPLE_FULL);
    cr_assert(keep);
    cr_assert_eq(ds.offered, 3);
    cr_assert_eq(ds.kept, 2);
    cr_assert_eq(ds.dropped, 1);
    /* offering after FULL is not counted */
    cr_assert_eq(qrl_rl_dynsample_offer(&ds, diff, 2, &keep), QRL_RL_DYNSAMPLE_FULL);
    cr_assert(!keep);
    cr_assert_eq(ds.offered, 3);
    cr_assert_eq(ds.total_kept, 2);
}

Test(rl_dynsample, bounded_oversampling_exhausts) {
    qrl_rl_dynsample ds;
    /* target 4, factor 1.3: max_offered = ceil(5.2) = 6 */
    cr_assert_eq(qrl_rl_dynsample_init(&ds, 4, 1.3, NULL), QRL_OK);
    cr_assert_eq(ds.max_offered, 6);
    const float same[3] = {0, 0, 0}, diff[3] = {0, 0, 1};
    qrl_rl_dynsample_state st = QRL_RL_DYNSAMPLE_NEED_MORE;
    for (int i = 0; i < 6; i++) st = qrl_rl_dynsample_offer(&ds, i % 2 ? diff : same, 3, NULL);
    cr_assert_eq(st, QRL_RL_DYNSAMPLE_EXHAUSTED);
    cr_assert_eq(ds.kept, 3);
    cr_assert_eq(ds.dropped, 3);
    qrl_rl_dynsample_reset(&ds);
    cr_assert_eq(qrl_rl_dynsample_state_of(&ds), QRL_RL_DYNSAMPLE_NEED_MORE);
    cr_assert_eq(ds.kept + ds.dropped + ds.offered, 0);
    cr_assert_eq(ds.total_kept, 3);
    cr_assert_eq(ds.total_dropped, 3);
}

Test(rl_dynsample, init_rejects_bad_values) {
    qrl_rl_dynsample ds;
    qrl_error e;
    cr_assert_eq(qrl_rl_dynsample_init(&ds, 0, 2.0, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "target"), "%s", e.msg);
    cr_assert_eq(qrl_rl_dynsample_init(&ds, 4, 0.5, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "max_oversample"), "%s", e.msg);
    cr_assert_eq(qrl_rl_dynsample_init(&ds, 4, NAN, &e), QRL_STATUS_INVALID_ARGUMENT);
}
