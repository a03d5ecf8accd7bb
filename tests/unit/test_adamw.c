/* AdamW (common/train/adamw.h) and the learning-rate schedule (lr_schedule.h).
 * Expected optimizer values come from the Adam/AdamW paper form of the update written
 * here in double (bias-corrected m_hat, v_hat; eps added to sqrt(v_hat)), which is
 * algebraically PyTorch's _single_tensor_adamw; never from the code under test. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "support/test_files.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

/* ---- helpers ------------------------------------------------------------------------- */

static qrl_adamw_t *make(size_t n, qrl_adamw_config cfg) {
    qrl_adamw_t *o = NULL;
    qrl_error err;
    cr_assert_eq(qrl_adamw_new(n, &cfg, &o, &err), QRL_OK, "%s", err.msg);
    return o;
}

/* Deterministic gradient for step s, element i: mixed signs and magnitudes. */
static float grad_at(int s, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(s * 40503u + 17u);
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    return ((float)(h & 0xFFFF) / 65535.0f - 0.5f) * 0.2f;
}

static void fill_grads(float *g, size_t n, int s) {
    for (size_t i = 0; i < n; i++) g[i] = grad_at(s, i);
}

/* zlib's CRC-32, written bit by bit here to forge files with a valid checksum. */
static uint32_t crc32_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 16);
    cr_assert_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

/* ---- the update against the formula ------------------------------------------------------------ */

Test(adamw, three_steps_match_the_formula) {
    enum { N = 5 };
    const double lr = 0.1;
    qrl_adamw_config cfg = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .max_grad_norm = 0.0f};
    float p[N] = {0.5f, -1.25f, 2.0f, 0.0f, -0.3f};
    const float g[3][N] = {{0.2f, -0.5f, 1e-3f, 0.0f, 3.0f},
                           {-0.1f, -0.4f, 2e-3f, 0.0f, -3.0f},
                           {0.3f, 0.1f, -5e-3f, 0.0f, 0.5f}};
    /* reference: the optimizer stores F32 hyperparameters, so the same rounded values */
    const double b1 = (double)cfg.beta1, b2 = (double)cfg.beta2, eps = (double)cfg.eps,
                 wd = (double)cfg.weight_decay;
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i];
    qrl_adamw_t *o = make(N, cfg);
    double worst = 0.0;
    for (int s = 0; s < 3; s++) {
        qrl_adamw_step_info info;
        cr_assert_eq(qrl_adamw_step(o, p, g[s], lr, &info, NULL), QRL_OK);
        cr_expect_eq(info.step, s + 1);
        cr_expect_eq(info.clip_scale, 1.0f);
        int t = s + 1;
        for (int i = 0; i < N; i++) {
            rp[i] *= 1.0 - lr * wd;
            rm[i] = b1 * rm[i] + (1 - b1) * g[s][i];
            rv[i] = b2 * rv[i] + (1 - b2) * g[s][i] * g[s][i];
            double mhat = rm[i] / (1 - pow(b1, t)), vhat = rv[i] / (1 - pow(b2, t));
            rp[i] -= lr * mhat / (sqrt(vhat) + eps);
            worst = fmax(worst, fabs(p[i] - rp[i]));
            cr_expect(fabs(p[i] - rp[i]) <= 1e-6 * fmax(1.0, fabs(rp[i])),
                      "step %d elem %d: %.9g want %.9g", t, i, p[i], rp[i]);
        }
        if (s == 0) {
            /* step 1 by hand: m_hat = g, v_hat = g^2, so the update is lr * sign(g):
             * 0.5 * (1 - 0.01) - 0.1 = 0.395;  elem 3 (g = 0) only decays: 0 */
            cr_expect_float_eq(p[0], 0.395f, 1e-6f);
            cr_expect_float_eq(p[1], -1.25f * 0.99f + 0.1f, 1e-6f);
            cr_expect_eq(p[3], 0.0f);
        }
    }
    fprintf(stderr, "adamw: 3 steps vs double formula: max |p - ref| = %.2e\n", worst);
    cr_expect_eq(qrl_adamw_steps(o), 3);
    qrl_adamw_destroy(o);
}

/* ---- clipping and the norm ------------------------------------------------------------------------ */

Test(adamw, grad_norm_values_and_thread_independence) {
    const float g[3] = {3.0f, 0.0f, -4.0f};
    cr_expect_eq(qrl_adamw_grad_norm(g, 3), 5.0);
    enum { N = 100003 };
    float *big = malloc(N * sizeof *big);
    fill_grads(big, N, 1);
    omp_set_num_threads(1);
    double one = qrl_adamw_grad_norm(big, N);
    omp_set_num_threads(3);
    double three = qrl_adamw_grad_norm(big, N);
    cr_expect_eq(one, three, "norm depends on the thread count: %.17g vs %.17g", one, three);
    double ref = 0.0;
    for (int i = 0; i < N; i++) ref += (double)big[i] * big[i];
    cr_expect(fabs(one - sqrt(ref)) <= 1e-12 * sqrt(ref));
    free(big);
}

Test(adamw, clipping_scales_the_gradient_by_max_over_norm) {
    /* g = [3, 4] has norm 5 > 1: the step must equal an unclipped step on g * 1/(5+1e-6)
     * (torch clip_grad_norm_), bit for bit.  eps = 0.1 makes the update depend on |g|. */
    qrl_adamw_config clip = {.beta1 = 0.9f, .beta2 = 0.99f, .eps = 0.1f, .weight_decay = 0.0f,
                             .max_grad_norm = 1.0f};
    qrl_adamw_config noclip = clip;
    noclip.max_grad_norm = 0.0f;
    float g[2] = {3.0f, 4.0f}, pa[2] = {1.0f, -1.0f}, pb[2] = {1.0f, -1.0f}, pc[2] = {1.0f, -1.0f};
    qrl_adamw_t *a = make(2, clip), *b = make(2, noclip), *c = make(2, noclip);
    qrl_adamw_step_info info;
    cr_assert_eq(qrl_adamw_step(a, pa, g, 0.01, &info, NULL), QRL_OK);
    cr_expect_eq(info.grad_norm, 5.0);
    float scale = (float)(1.0 / (5.0 + 1e-6));
    cr_expect_eq(info.clip_scale, scale);
    float gs[2] = {g[0] * scale, g[1] * scale};
    cr_assert_eq(qrl_adamw_step(b, pb, gs, 0.01, NULL, NULL), QRL_OK);
    cr_assert_eq(qrl_adamw_step(c, pc, g, 0.01, NULL, NULL), QRL_OK);
    cr_expect(memcmp(pa, pb, sizeof pa) == 0, "clipped step != step on scaled gradient");
    cr_expect(pa[0] != pc[0], "clipping changed nothing");
    /* below the threshold: untouched */
    float small[2] = {0.3f, 0.4f};
    cr_assert_eq(qrl_adamw_step(a, pa, small, 0.01, &info, NULL), QRL_OK);
    cr_expect_float_eq(info.grad_norm, 0.5, 1e-7);
    cr_expect_eq(info.clip_scale, 1.0f);
    qrl_adamw_destroy(a), qrl_adamw_destroy(b), qrl_adamw_destroy(c);
}

/* ---- non-finite gradients and bad arguments ----------------------------------------------------- */

Test(adamw, non_finite_gradient_is_refused_and_changes_nothing) {
    enum { N = 37 };
    qrl_adamw_config cfg = qrl_adamw_config_default();
    qrl_adamw_t *a = make(N, cfg), *b = make(N, cfg);
    float pa[N], pb[N], g[N], keep[N];
    for (int i = 0; i < N; i++) pa[i] = pb[i] = 0.01f * (float)i - 0.2f;
    fill_grads(g, N, 0);
    cr_assert_eq(qrl_adamw_step(a, pa, g, 1e-3, NULL, NULL), QRL_OK);
    cr_assert_eq(qrl_adamw_step(b, pb, g, 1e-3, NULL, NULL), QRL_OK);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float gb[N];
        fill_grads(gb, N, 1);
        gb[11 + k] = bad[k];
        memcpy(keep, pa, sizeof pa);
        qrl_error err;
        qrl_adamw_step_info info;
        cr_assert_eq(qrl_adamw_step(a, pa, gb, 1e-3, &info, &err), QRL_STATUS_OUT_OF_RANGE);
        char want[32];
        snprintf(want, sizeof want, "index %d", 11 + k);
        cr_expect_not_null(strstr(err.msg, want), "%s", err.msg);
        cr_expect(!isfinite(info.grad_norm));
        cr_expect(memcmp(keep, pa, sizeof pa) == 0, "parameters changed");
        cr_expect_eq(qrl_adamw_steps(a), 1);
    }
    /* m and v untouched too: the next good step matches an optimizer that never saw them */
    fill_grads(g, N, 2);
    cr_assert_eq(qrl_adamw_step(a, pa, g, 1e-3, NULL, NULL), QRL_OK);
    cr_assert_eq(qrl_adamw_step(b, pb, g, 1e-3, NULL, NULL), QRL_OK);
    cr_expect(memcmp(pa, pb, sizeof pa) == 0);
    qrl_adamw_destroy(a), qrl_adamw_destroy(b);
}

Test(adamw, bad_config_and_learning_rate) {
    qrl_adamw_t *o = NULL;
    qrl_error err;
    qrl_adamw_config c = qrl_adamw_config_default();
    cr_expect_eq(qrl_adamw_new(0, &c, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    c.beta1 = 1.0f;
    cr_expect_eq(qrl_adamw_new(4, &c, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "beta1"), "%s", err.msg);
    c = qrl_adamw_config_default(), c.eps = 0.0f;
    cr_expect_eq(qrl_adamw_new(4, &c, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "eps"), "%s", err.msg);
    c = qrl_adamw_config_default(), c.weight_decay = -1.0f;
    cr_expect_eq(qrl_adamw_new(4, &c, &o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_null(o);
    o = make(2, qrl_adamw_config_default());
    float p[2] = {1, 2}, g[2] = {0.1f, 0.1f};
    cr_expect_eq(qrl_adamw_step(o, p, g, NAN, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_eq(qrl_adamw_step(o, p, g, -1e-3, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(p[0] == 1.0f && qrl_adamw_steps(o) == 0);
    qrl_adamw_destroy(o);
}

/* ---- state file ------------------------------------------------------------------------------------ */

enum { RN = 1001 };

/* Run steps [from, to) of the fixed gradient sequence. */
static void run_steps(qrl_adamw_t *o, float *p, int from, int to) {
    float g[RN];
    for (int s = from; s < to; s++) {
        fill_grads(g, RN, s);
        if (s == 1) g[5] = 2.0f; /* one step with clipping active */
        cr_assert_eq(qrl_adamw_step(o, p, g, 1e-2 * (1.0 + s), NULL, NULL), QRL_OK);
    }
}

static void init_params(float *p) {
    for (int i = 0; i < RN; i++) p[i] = (float)sin(0.1 * i);
}

Test(adamw, save_reload_continue_is_bit_identical) {
    char dir[64], path[512];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/opt.bin", dir);
    qrl_adamw_config cfg = qrl_adamw_config_default();
    static float full[RN], part[RN];
    init_params(full), init_params(part);
    qrl_adamw_t *a = make(RN, cfg);
    run_steps(a, full, 0, 5);

    qrl_adamw_t *b = make(RN, cfg);
    run_steps(b, part, 0, 4);
    qrl_error err;
    cr_assert_eq(qrl_adamw_save(b, path, &err), QRL_OK, "%s", err.msg);
    qrl_adamw_destroy(b);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_expect_neq(access(tmp, F_OK), 0, "temp file left behind");
    size_t len;
    uint8_t *bytes = read_file(path, &len);
    cr_expect_eq(len, 64 + 8 * RN + 4);
    cr_expect(memcmp(bytes, "QRLADAMW", 8) == 0);
    cr_expect_eq(crc32_bitwise(bytes, len - 4), (uint32_t)bytes[len - 4] |
                 (uint32_t)bytes[len - 3] << 8 | (uint32_t)bytes[len - 2] << 16 |
                 (uint32_t)bytes[len - 1] << 24);
    free(bytes);

    qrl_adamw_t *c = make(RN, cfg);
    cr_assert_eq(qrl_adamw_load(c, path, &err), QRL_OK, "%s", err.msg);
    cr_expect_eq(qrl_adamw_steps(c), 4);
    run_steps(c, part, 4, 5);
    cr_expect(memcmp(full, part, sizeof full) == 0, "resumed run differs from uninterrupted");
    qrl_adamw_destroy(a), qrl_adamw_destroy(c);
    qrl_test_rmtree(dir);
}

/* Write `bytes` (len) as dir/name, try to load it into a fresh 3-step optimizer, and
 * check the status, the message and that the optimizer still continues like an
 * untouched one. */
static void expect_refused(const char *dir, const char *name, const uint8_t *bytes, size_t len,
                           size_t n, qrl_status want, const char *msg_part) {
    char path[512];
    qrl_test_write(dir, name, bytes, len, path);
    qrl_adamw_config cfg = qrl_adamw_config_default();
    qrl_adamw_t *o = make(n, cfg);
    static float p[RN], ref[RN];
    init_params(p), init_params(ref);
    if (n == RN) run_steps(o, p, 0, 3);
    qrl_error err;
    qrl_error_clear(&err);
    cr_expect_eq(qrl_adamw_load(o, path, &err), want, "%s: status %s (%s)", name,
                 qrl_status_name(err.status), err.msg);
    cr_expect_not_null(strstr(err.msg, msg_part), "%s: message '%s' lacks '%s'", name, err.msg,
                       msg_part);
    cr_expect_not_null(strstr(err.msg, name), "%s: message '%s' lacks the path", name, err.msg);
    if (n == RN) {
        cr_expect_eq(qrl_adamw_steps(o), 3, "%s: step count changed", name);
        qrl_adamw_t *r = make(RN, cfg);
        run_steps(r, ref, 0, 4);
        run_steps(o, p, 3, 4);
        cr_expect(memcmp(p, ref, sizeof p) == 0, "%s: state changed by a refused load", name);
        qrl_adamw_destroy(r);
    }
    qrl_adamw_destroy(o);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

Test(adamw, corrupt_truncated_or_mismatched_state_is_refused) {
    char dir[64], path[512];
    qrl_test_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/good.bin", dir);
    qrl_adamw_t *o = make(RN, qrl_adamw_config_default());
    static float p[RN];
    init_params(p);
    run_steps(o, p, 0, 2);
    qrl_error err;
    cr_assert_eq(qrl_adamw_save(o, path, &err), QRL_OK, "%s", err.msg);
    qrl_adamw_destroy(o);
    size_t len;
    uint8_t *good = read_file(path, &len), *b = malloc(len + 16);

    memcpy(b, good, len), b[64 + 4 * 500] ^= 0x01;
    expect_refused(dir, "flipped.bin", b, len, RN, QRL_STATUS_CORRUPT, "crc32 mismatch");
    expect_refused(dir, "short.bin", good, len - 10, RN, QRL_STATUS_CORRUPT, "truncated");
    expect_refused(dir, "header.bin", good, 20, RN, QRL_STATUS_CORRUPT, "truncated");
    memcpy(b, good, len), memset(b + len, 0, 3);
    expect_refused(dir, "long.bin", b, len + 3, RN, QRL_STATUS_CORRUPT, "trailing bytes");
    memcpy(b, good, len), b[0] = 'X';
    expect_refused(dir, "magic.bin", b, len, RN, QRL_STATUS_CORRUPT, "bad magic");
    memcpy(b, good, len), put32(b + 8, 2);
    expect_refused(dir, "version.bin", b, len, RN, QRL_STATUS_UNSUPPORTED, "version 2");
    memcpy(b, good, len), b[60] = 1;
    expect_refused(dir, "reserved.bin", b, len, RN, QRL_STATUS_CORRUPT, "offset 60");
    expect_refused(dir, "good.bin", good, len, RN + 1, QRL_STATUS_INVALID_ARGUMENT,
                   "holds n=1001");
    /* a NaN in v under a valid checksum: caught by the value check, offset named */
    memcpy(b, good, len);
    const float nan = NAN;
    memcpy(b + 64 + 4 * (RN + 7), &nan, 4);
    put32(b + len - 4, crc32_bitwise(b, len - 4));
    char want[64];
    snprintf(want, sizeof want, "offset %d", 64 + 4 * (RN + 7));
    expect_refused(dir, "nan.bin", b, len, RN, QRL_STATUS_CORRUPT, want);

    o = make(RN, qrl_adamw_config_default());
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    cr_expect_eq(qrl_adamw_load(o, path, &err), QRL_STATUS_NOT_FOUND);
    cr_expect_not_null(strstr(err.msg, "missing.bin"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/no/such/dir/opt.bin", dir);
    cr_expect_eq(qrl_adamw_save(o, path, &err), QRL_STATUS_IO);
    cr_expect_not_null(strstr(err.msg, "no/such/dir"), "%s", err.msg);
    qrl_adamw_destroy(o);
    free(good), free(b);
    qrl_test_rmtree(dir);
}

/* ---- learning-rate schedule ---------------------------------------------------------------------- */

Test(lr_schedule, warmup_then_cosine_to_floor) {
    qrl_lr_schedule s = {.decay = QRL_LR_DECAY_COSINE, .lr = 1e-3, .min_lr = 1e-4,
                         .warmup_steps = 10, .total_steps = 110};
    cr_assert_eq(qrl_lr_schedule_check(&s, NULL), QRL_OK);
    const struct { int64_t step; double lr; } v[] = {
        {0, 1e-4},   {4, 5e-4},    {9, 1e-3},  /* warmup: lr (step+1)/10 */
        {10, 1e-3},                            /* cosine start */
        {35, 1e-4 + 0.9e-3 * 0.5 * (1 + 0.70710678118654752)}, /* a quarter: cos(pi/4) */
        {60, 5.5e-4},                          /* half way: the mean of peak and floor */
        {110, 1e-4}, {1000, 1e-4},             /* floor from total_steps on */
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        double got = qrl_lr_schedule_at(&s, v[i].step);
        cr_expect(fabs(got - v[i].lr) <= 1e-15, "step %lld: %.17g want %.17g",
                  (long long)v[i].step, got, v[i].lr);
    }
}

Test(lr_schedule, constant_and_no_warmup) {
    qrl_lr_schedule s = {.decay = QRL_LR_DECAY_CONSTANT, .lr = 2e-5, .warmup_steps = 4};
    cr_assert_eq(qrl_lr_schedule_check(&s, NULL), QRL_OK);
    cr_expect_eq(qrl_lr_schedule_at(&s, 0), 2e-5 / 4);
    cr_expect_eq(qrl_lr_schedule_at(&s, 3), 2e-5);
    cr_expect_eq(qrl_lr_schedule_at(&s, 1000000), 2e-5);
    s.warmup_steps = 0;
    cr_expect_eq(qrl_lr_schedule_at(&s, 0), 2e-5);
    cr_expect_eq(qrl_lr_decay_parse("cosine"), QRL_LR_DECAY_COSINE);
    cr_expect_eq(qrl_lr_decay_parse("constant"), QRL_LR_DECAY_CONSTANT);
    cr_expect_eq(qrl_lr_decay_parse("linear"), -1);
    cr_expect_str_eq(qrl_lr_decay_name(QRL_LR_DECAY_COSINE), "cosine");
}

Test(lr_schedule, bad_schedules_are_refused) {
    qrl_error err;
    qrl_lr_schedule s = {.decay = QRL_LR_DECAY_COSINE, .lr = 1e-3, .min_lr = 2e-3,
                         .warmup_steps = 0, .total_steps = 10};
    cr_expect_eq(qrl_lr_schedule_check(&s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "min_lr"), "%s", err.msg);
    s.min_lr = 0, s.total_steps = 0;
    cr_expect_eq(qrl_lr_schedule_check(&s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "total_steps"), "%s", err.msg);
    s.total_steps = 10, s.lr = 0;
    cr_expect_eq(qrl_lr_schedule_check(&s, &err), QRL_STATUS_INVALID_ARGUMENT);
    s.lr = 1e-3, s.warmup_steps = -1;
    cr_expect_eq(qrl_lr_schedule_check(&s, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(err.msg, "warmup_steps"), "%s", err.msg);
}
