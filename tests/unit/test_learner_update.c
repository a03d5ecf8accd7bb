/* The learner's update step (common/learner/update.h) on a tiny random Llama model:
 *  - behavior log-probs equal to the proximal ones: the first minibatch's ratios are
 *    exactly 1, w = 1, no TIS truncation, no clipping;
 *  - policy-gradient direction: the rewarded response's log-prob rises, the others fall;
 *  - zero-variance groups dropped and counted, singleton groups, all-dropped updates;
 *  - a non-finite behavior log-prob refuses the whole update, parameters untouched;
 *  - a non-finite gradient skips the optimizer step, parameters untouched;
 *  - determinism (same seed: bit-identical parameters) and the seed's effect; the same
 *    with activation recomputation (learner.activation_recompute);
 *  - micro-batch accumulation equals one big batch (token- and sequence-mean);
 *  - loss modes naive / prox / decoupled on perturbed behavior log-probs: statistics
 *    against direct counts;
 *  - config errors and UAQ. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "learner/update.h"
#include "model/model.h"

#define TINY_JSON                                                                              \
    "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64,"              \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"       \
    " \"vocab_size\": 16, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"            \
    " \"tie_word_embeddings\": false}"

enum { V = 16, MAXG = 8, MAXR = 12 };

static qrl_model *tiny_model(uint64_t seed) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(TINY_JSON, strlen(TINY_JSON), "cfg", &cfg, &err),
                 QRL_OK, "%s", err.msg);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, seed);
    return m;
}

/* A group with its own storage. */
typedef struct tgroup {
    int32_t prompt[8];
    int32_t tok[MAXG][MAXR];
    float lp[MAXG][MAXR];
    uint64_t ver[MAXG][MAXR];
    qrl_learner_response r[MAXG];
    qrl_learner_group g;
} tgroup;

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* G responses of lengths len[i] with random tokens, rewards rew[i], behavior lp -1. */
static void make_group(tgroup *t, uint64_t id, int np, int G, const int *len, const float *rew,
                       uint64_t seed) {
    memset(t, 0, sizeof *t);
    uint64_t s = seed * 2654435761u + 7;
    for (int p = 0; p < np; p++) t->prompt[p] = (int32_t)(rng_next(&s) % V);
    for (int i = 0; i < G; i++) {
        for (int j = 0; j < len[i]; j++) {
            t->tok[i][j] = (int32_t)(rng_next(&s) % V);
            t->lp[i][j] = -1.0f;
            t->ver[i][j] = 3;
        }
        t->r[i] = (qrl_learner_response){.tokens = t->tok[i], .logprobs = t->lp[i],
                                         .versions = t->ver[i], .n_tokens = len[i],
                                         .reward = rew[i]};
    }
    t->g = (qrl_learner_group){.group_id = id, .prompt = t->prompt, .n_prompt = np,
                               .responses = t->r, .n_responses = (uint32_t)G};
}

/* lp_behav := the current model's log-probs (= lp_prox of the next update). */
static void behav_from_model(qrl_learner_t *l, tgroup *t) {
    qrl_error err;
    for (uint32_t i = 0; i < t->g.n_responses; i++)
        cr_assert_eq(qrl_learner_response_logprobs(l, &t->g, i, t->lp[i], &err), QRL_OK, "%s",
                     err.msg);
}

static double seq_logprob(qrl_learner_t *l, const tgroup *t, uint32_t i) {
    float lp[MAXR];
    qrl_error err;
    cr_assert_eq(qrl_learner_response_logprobs(l, &t->g, i, lp, &err), QRL_OK, "%s", err.msg);
    double s = 0;
    for (int j = 0; j < t->r[i].n_tokens; j++) s += lp[j];
    return s;
}

static qrl_learner_t *learner(qrl_model *m, const qrl_learner_config *c) {
    qrl_learner_t *l;
    qrl_error err;
    cr_assert_eq(qrl_learner_new(m, c, &l, &err), QRL_OK, "%s", err.msg);
    return l;
}

static float *params_copy(const qrl_model *m) {
    float *p = malloc(m->arena_floats * sizeof(float));
    memcpy(p, m->arena, m->arena_floats * sizeof(float));
    return p;
}

static const int LEN4[4] = {5, 7, 4, 6};
static const float REW_MIXED[4] = {1, 0, 0.5f, 0};

/* Three groups of 4 with varied rewards, behavior = the model. */
static void three_groups(qrl_learner_t *l, tgroup t[3]) {
    static const float r2[4] = {0, 1, 1, 0}, r3[4] = {1, 1, 0, 1};
    make_group(&t[0], 10, 3, 4, LEN4, REW_MIXED, 1);
    make_group(&t[1], 11, 4, 4, LEN4, r2, 2);
    make_group(&t[2], 12, 2, 4, LEN4, r3, 3);
    for (int i = 0; i < 3; i++) behav_from_model(l, &t[i]);
}

static void run_update(qrl_learner_t *l, const tgroup *t, int n, qrl_learner_stats *s) {
    qrl_learner_group g[8];
    qrl_error err;
    for (int i = 0; i < n; i++) g[i] = t[i].g;
    cr_assert_eq(qrl_learner_update(l, g, (size_t)n, s, &err), QRL_OK, "%s", err.msg);
}

Test(learner_update, behav_equal_prox_gives_unit_ratios) {
    qrl_model *m = tiny_model(1);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.minibatch_seqs = 5; /* the first minibatch packs differently from the prox pass */
    c.lr.lr = 1e-3;
    qrl_learner_t *l = learner(m, &c);
    tgroup t[3];
    three_groups(l, t);
    qrl_learner_stats s;
    run_update(l, t, 3, &s);
    cr_assert_eq(s.groups_used, 3);
    cr_assert_eq(s.seqs_trained, 12);
    cr_assert_eq(s.tokens_trained, 3 * (5 + 7 + 4 + 6));
    cr_assert_eq(s.minibatches, 3); /* ceil(12 / 5) */
    cr_assert_eq(s.steps_taken, 3);
    cr_assert_eq(s.kl_behav_prox, 0.0);
    cr_assert_eq(s.max_w, 1.0);
    cr_assert_eq(s.first_mb_max_dlp, 0.0, "max |lp - lp_prox| = %g", s.first_mb_max_dlp);
    cr_assert_eq(s.first_mb.ratio_mean, 1.0);
    cr_assert_eq(s.first_mb.max_w, 1.0);
    cr_assert_eq(s.first_mb.tis_frac, 0.0);
    cr_assert_eq(s.first_mb.acr_frac, 0.0);
    cr_assert_eq(s.first_mb.clip_frac_low, 0.0);
    cr_assert_eq(s.first_mb.clip_frac_high, 0.0);
    cr_assert_eq(s.tis_tokens, 0);
    cr_assert(s.has_ref);
    cr_assert_eq(s.first_mb.k3_mean, 0.0); /* reference = initial = current */
    cr_assert(s.entropy_mean > 0 && s.entropy_mean <= log(V) + 1e-6, "%g", s.entropy_mean);
    cr_assert(s.grad_norm_max > 0 && isfinite(s.grad_norm_max));
    cr_assert_eq(s.lr, 1e-3);
    cr_assert_eq(s.version_min, 3);
    cr_assert_eq(s.version_max, 3);
    /* rollout statistics over the 12 responses: rewards {1,0,.5,0, 0,1,1,0, 1,1,0,1} */
    cr_assert_float_eq(s.reward_mean, 6.5 / 12, 1e-12);
    cr_assert_float_eq(s.accuracy, 6.0 / 12, 1e-12);
    double var = (6 * 1 + 0.25) / 12 - (6.5 / 12) * (6.5 / 12);
    cr_assert_float_eq(s.reward_std, sqrt(var), 1e-12);
    cr_assert_float_eq(s.response_len_mean, 22.0 / 4, 1e-12);
    cr_assert(s.time_train_s > 0 && s.train_tokens_per_s > 0);
    cr_assert_eq(qrl_learner_updates(l), 1);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}

Test(learner_update, rewarded_response_gains_probability) {
    qrl_model *m = tiny_model(2);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 3e-3;
    c.loss.beta = 0; /* no reference pull */
    qrl_learner_t *l = learner(m, &c);
    static const int len[4] = {6, 6, 6, 6};
    static const float rew[4] = {0, 1, 0, 0};
    tgroup t;
    make_group(&t, 1, 3, 4, len, rew, 42);
    behav_from_model(l, &t);
    double before[4], after[4];
    for (uint32_t i = 0; i < 4; i++) before[i] = seq_logprob(l, &t, i);
    qrl_learner_stats s;
    run_update(l, &t, 1, &s);
    cr_assert_eq(s.steps_taken, 1);
    cr_assert(!s.has_ref);
    for (uint32_t i = 0; i < 4; i++) after[i] = seq_logprob(l, &t, i);
    cr_log_info("log p before/after: %.4f->%.4f (rewarded) %.4f->%.4f %.4f->%.4f %.4f->%.4f",
                before[1], after[1], before[0], after[0], before[2], after[2], before[3],
                after[3]);
    cr_assert_gt(after[1], before[1] + 0.01);
    cr_assert_lt(after[0], before[0]);
    cr_assert_lt(after[2], before[2]);
    cr_assert_lt(after[3], before[3]);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}

Test(learner_update, zero_variance_and_singleton_groups) {
    qrl_model *m = tiny_model(3);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 1e-3;
    qrl_learner_t *l = learner(m, &c);
    static const float all1[4] = {1, 1, 1, 1}, one[1] = {1};
    static const int len1[1] = {5};
    tgroup t[3];
    make_group(&t[0], 1, 3, 4, LEN4, all1, 1);
    make_group(&t[1], 2, 3, 1, len1, one, 2);
    make_group(&t[2], 3, 3, 4, LEN4, REW_MIXED, 3);
    for (int i = 0; i < 3; i++) behav_from_model(l, &t[i]);
    qrl_learner_stats s;
    run_update(l, t, 3, &s);
    cr_assert_eq(s.groups_in, 3);
    cr_assert_eq(s.groups_dropped, 2);
    cr_assert_eq(s.groups_used, 1);
    cr_assert_eq(s.responses_in, 9);
    cr_assert_eq(s.seqs_trained, 4);
    cr_assert_eq(s.tokens_trained, 22);
    cr_assert_eq(s.steps_taken, 1);

    /* everything dropped: OK, no step, parameters bit-identical */
    float *p0 = params_copy(m);
    run_update(l, t, 2, &s);
    cr_assert_eq(s.groups_dropped, 2);
    cr_assert_eq(s.groups_used, 0);
    cr_assert_eq(s.steps_taken, 0);
    cr_assert_eq(s.minibatches, 0);
    cr_assert_eq(memcmp(p0, m->arena, m->arena_floats * sizeof(float)), 0);
    cr_assert_eq(qrl_learner_updates(l), 2);
    free(p0);
    qrl_learner_destroy(l);

    /* dynamic sampling off: the singleton trains with advantage 0 (only the KL term) */
    c.dynamic_sampling = false;
    l = learner(m, &c);
    behav_from_model(l, &t[1]);
    run_update(l, &t[1], 1, &s);
    cr_assert_eq(s.groups_used, 1);
    cr_assert_eq(s.groups_dropped, 0);
    cr_assert_eq(s.seqs_trained, 1);
    cr_assert_eq(s.pg_loss_mean, 0.0); /* A = 0 */
    cr_assert_eq(s.steps_taken, 1);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}

Test(learner_update, non_finite_behavior_logprob_refuses_update) {
    qrl_model *m = tiny_model(4);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 1e-3;
    qrl_learner_t *l = learner(m, &c);
    tgroup t[3];
    three_groups(l, t);
    t[1].lp[2][3] = NAN;
    float *p0 = params_copy(m);
    qrl_learner_group g[3] = {t[0].g, t[1].g, t[2].g};
    qrl_error err;
    cr_assert_eq(qrl_learner_update(l, g, 3, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_log_info("%s", err.msg);
    cr_assert(strstr(err.msg, "group 1 (id 11) response 2 token 3"), "%s", err.msg);
    cr_assert(strstr(err.msg, "behavior log-prob"), "%s", err.msg);
    cr_assert_eq(memcmp(p0, m->arena, m->arena_floats * sizeof(float)), 0);
    cr_assert_eq(qrl_learner_updates(l), 0);
    cr_assert_eq(qrl_adamw_steps(qrl_learner_optimizer(l)), 0);
    /* the other input errors */
    t[1].lp[2][3] = -1;
    t[2].tok[1][4] = V;
    g[1] = t[1].g;
    cr_assert_eq(qrl_learner_update(l, g, 3, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "group 2 (id 12) response 1 token 4: id 16"), "%s", err.msg);
    t[2].tok[1][4] = 0;
    t[0].r[3].reward = INFINITY;
    cr_assert_eq(qrl_learner_update(l, g, 3, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "group 0 (id 10) response 3: non-finite reward"), "%s", err.msg);
    t[0].r[3].reward = 0;
    cr_assert_eq(qrl_learner_update(l, g, 0, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(memcmp(p0, m->arena, m->arena_floats * sizeof(float)), 0);
    free(p0);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}

Test(learner_update, too_long_sequence_is_out_of_range) {
    qrl_model *m = tiny_model(5);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.max_tokens = 8;
    qrl_learner_t *l = learner(m, &c);
    static const int len[2] = {5, 7};
    static const float rew[2] = {0, 1};
    tgroup t;
    make_group(&t, 77, 3, 2, len, rew, 5); /* 3 + 7 - 1 = 9 packed tokens > 8 */
    qrl_error err;
    cr_assert_eq(qrl_learner_update(l, &t.g, 1, NULL, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "group 0 (id 77) response 1: 9 packed tokens"), "%s", err.msg);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}

/* naive mode with a very stale behavior log-prob: R = exp(lp - lp_behav) ~ e^197 is finite
 * in double but d loss / d lp is not a float: the step is skipped, parameters untouched.
 * The decoupled objective truncates w instead and takes the step. */
Test(learner_update, non_finite_gradient_skips_step) {
    for (int mode = 0; mode < 3; mode += 2) {
        qrl_model *m = tiny_model(6);
        qrl_learner_config c;
        qrl_learner_config_default(&c);
        c.loss.mode = (qrl_rl_loss_mode)mode;
        c.lr.lr = 1e-3;
        qrl_learner_t *l = learner(m, &c);
        static const int len[2] = {6, 6};
        static const float rew[2] = {1, 0};
        tgroup t;
        make_group(&t, 5, 3, 2, len, rew, 9);
        behav_from_model(l, &t);
        t.lp[1][2] = -200; /* response 1 has A < 0: the unclipped branch R * A */
        float *p0 = params_copy(m);
        qrl_learner_stats s;
        run_update(l, &t, 1, &s);
        if (mode == QRL_RL_LOSS_NAIVE) {
            cr_assert_eq(s.steps_skipped, 1);
            cr_assert_eq(s.steps_taken, 0);
            cr_assert_eq(memcmp(p0, m->arena, m->arena_floats * sizeof(float)), 0);
            cr_assert_eq(qrl_adamw_steps(qrl_learner_optimizer(l)), 0);
        } else {
            cr_assert_eq(s.steps_skipped, 0);
            cr_assert_eq(s.steps_taken, 1);
            cr_assert_eq(s.tis_tokens, 1);
            cr_assert_neq(memcmp(p0, m->arena, m->arena_floats * sizeof(float)), 0);
        }
        free(p0);
        qrl_learner_destroy(l);
        qrl_model_free(m);
    }
}

/* Two updates of 2 epochs x minibatches of 5 from model seed 7; returns the parameters. */
static float *train_twice_rc(uint64_t seed, bool recompute, size_t *n) {
    qrl_model *m = tiny_model(7);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 1e-3;
    c.ppo_epochs = 2;
    c.minibatch_seqs = 5;
    c.seed = seed;
    c.max_tokens = 24; /* micro-batches: accumulation through the engine */
    c.activation_recompute = recompute;
    qrl_learner_t *l = learner(m, &c);
    tgroup t[3];
    three_groups(l, t);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) t[i].lp[j][1] -= 0.7f; /* some off-policy tokens */
    qrl_learner_stats s;
    run_update(l, t, 3, &s);
    cr_assert_eq(s.steps_taken, 6);
    run_update(l, t, 3, &s);
    float *p = params_copy(m);
    *n = m->arena_floats;
    qrl_learner_destroy(l);
    qrl_model_free(m);
    return p;
}

static float *train_twice(uint64_t seed, size_t *n) { return train_twice_rc(seed, false, n); }

Test(learner_update, same_seed_bit_identical) {
    size_t n;
    float *a = train_twice(11, &n), *b = train_twice(11, &n), *c = train_twice(12, &n);
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0);
    cr_assert_neq(memcmp(a, c, n * sizeof(float)), 0, "the seed should change the shuffle");
    free(a), free(b), free(c);
}

/* learner.activation_recompute: the same parameters, bit for bit (loss.beta > 0 by
 * default: the reference engine runs too). */
Test(learner_update, activation_recompute_bit_identical) {
    size_t n;
    float *a = train_twice_rc(11, false, &n), *b = train_twice_rc(11, true, &n);
    qrl_model *m0 = tiny_model(7);
    cr_assert_neq(memcmp(a, m0->arena, n * sizeof(float)), 0, "the updates changed nothing");
    cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0);
    qrl_model_free(m0);
    free(a), free(b);
}

/* One update with max_tokens `mt` (micro-batching when small). */
static float *train_mt(int mt, qrl_rl_loss_agg agg, size_t *n, int *micro) {
    qrl_model *m = tiny_model(8);
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 1e-3;
    c.adamw.max_grad_norm = 0; /* compare raw steps */
    c.adamw.eps = 1;           /* first Adam step ~ lr * g / (|g| + 1): not just sign(g) */
    c.loss.agg = agg;
    c.max_tokens = mt;
    qrl_learner_t *l = learner(m, &c);
    tgroup t[3];
    three_groups(l, t);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) t[i].lp[j][0] += 0.3f;
    qrl_learner_stats s;
    run_update(l, t, 3, &s);
    cr_assert_eq(s.steps_taken, 1);
    *micro = s.micro_batches;
    float *p = params_copy(m);
    *n = m->arena_floats;
    qrl_learner_destroy(l);
    qrl_model_free(m);
    return p;
}

Test(learner_update, micro_batches_equal_one_batch) {
    for (int a = 0; a < 2; a++) {
        qrl_rl_loss_agg agg = a ? QRL_RL_AGG_SEQ_MEAN : QRL_RL_AGG_TOKEN_MEAN;
        size_t n;
        int mb_big, mb_small;
        float *big = train_mt(4096, agg, &n, &mb_big), *small = train_mt(12, agg, &n, &mb_small),
              *p0 = (float *)NULL;
        cr_assert_eq(mb_big, 1);
        cr_assert_eq(mb_small, 12); /* 12 sequences of 5..11 packed tokens, 12 per pass */
        qrl_model *m0 = tiny_model(8);
        p0 = m0->arena;
        /* step sizes agree: max |d_small - d_big| relative to max |d_big| */
        double md = 0, mr = 0;
        for (size_t i = 0; i < n; i++) {
            double db = (double)big[i] - p0[i], ds = (double)small[i] - p0[i];
            md = fmax(md, fabs(ds - db));
            mr = fmax(mr, fabs(db));
        }
        cr_log_info("agg %d: max step diff %.3g of max step %.3g", a, md, mr);
        cr_assert(mr > 0);
        cr_assert_lt(md / mr, 1e-4);
        free(big), free(small);
        qrl_model_free(m0);
    }
}

/* The loss modes on behavior log-probs behav = prox - 1 on every 3rd token (w = e > C =
 * 2: truncated) and prox - 0.5 elsewhere (w = 1.65: not truncated). */
Test(learner_update, loss_modes_on_perturbed_behavior) {
    float *final[3];
    size_t n = 0;
    for (int mode = 0; mode < 3; mode++) {
        qrl_model *m = tiny_model(9);
        qrl_learner_config c;
        qrl_learner_config_default(&c);
        c.lr.lr = 1e-3;
        c.loss.mode = (qrl_rl_loss_mode)mode;
        qrl_learner_t *l = learner(m, &c);
        tgroup t[3];
        three_groups(l, t);
        size_t n_trunc = 0, n_tok = 0, n_high_naive = 0;
        double kl = 0;
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) {
                /* GRPO advantages of the group, to count naive's high clips directly */
                for (int k = 0; k < t[i].r[j].n_tokens; k++, n_tok++) {
                    float d = (k % 3 == 0) ? 1.0f : 0.5f;
                    t[i].lp[j][k] -= d;
                    kl -= d;
                    n_trunc += k % 3 == 0;
                }
            }
        /* naive: R = exp(lp - behav) >= e^0.5 > 1.28 on every token: every token with
         * A > 0 is clipped high */
        for (int i = 0; i < 3; i++) {
            double mean = 0;
            for (int j = 0; j < 4; j++) mean += t[i].r[j].reward / 4.0;
            for (int j = 0; j < 4; j++)
                if (t[i].r[j].reward > mean) n_high_naive += (size_t)t[i].r[j].n_tokens;
        }
        qrl_learner_stats s;
        run_update(l, t, 3, &s);
        cr_assert_eq(s.tokens_trained, n_tok);
        cr_assert_float_eq(s.kl_behav_prox, kl / (double)n_tok, 1e-6);
        cr_assert_float_eq(s.max_w, exp(1.0), 1e-5);
        if (mode == QRL_RL_LOSS_DECOUPLED) {
            cr_assert_eq(s.tis_tokens, n_trunc);
            cr_assert_eq(s.acr_tokens, n_trunc);
            cr_assert_float_eq(s.first_mb.tis_frac, (double)n_trunc / n_tok, 1e-12);
            cr_assert_eq(s.first_mb.ratio_mean, 1.0);
            cr_assert_eq(s.first_mb.clip_frac_high, 0.0);
        } else if (mode == QRL_RL_LOSS_PROX) {
            cr_assert_eq(s.tis_tokens, 0);
            cr_assert_eq(s.acr_tokens, 0);
            cr_assert_eq(s.first_mb.ratio_mean, 1.0);
        } else {
            cr_assert_eq(s.tis_tokens, 0);
            cr_assert_gt(s.first_mb.ratio_mean, exp(0.5) - 1e-6);
            cr_assert_float_eq(s.first_mb.clip_frac_high, (double)n_high_naive / n_tok, 1e-12);
        }
        cr_log_info("mode %d: tis %zu/%zu clip_high %.3f ratio_mean %.4f loss %.5f", mode,
                    s.tis_tokens, n_tok, s.first_mb.clip_frac_high, s.first_mb.ratio_mean,
                    s.loss_mean);
        final[mode] = params_copy(m);
        n = m->arena_floats;
        qrl_learner_destroy(l);
        qrl_model_free(m);
    }
    /* the three objectives give three different updates */
    cr_assert_neq(memcmp(final[0], final[1], n * sizeof(float)), 0);
    cr_assert_neq(memcmp(final[1], final[2], n * sizeof(float)), 0);
    cr_assert_neq(memcmp(final[0], final[2], n * sizeof(float)), 0);
    for (int i = 0; i < 3; i++) free(final[i]);
}

Test(learner_update, config_errors_and_uaq) {
    qrl_model *m = tiny_model(10);
    qrl_learner_config c;
    qrl_learner_t *l;
    qrl_error err;
    qrl_learner_config_default(&c);
    c.ppo_epochs = 0;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "ppo_epochs"), "%s", err.msg);
    qrl_learner_config_default(&c);
    c.max_tokens = 1;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "max_tokens"), "%s", err.msg);
    qrl_learner_config_default(&c);
    c.loss.eps_low = 1.5;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "eps_low"), "%s", err.msg);
    qrl_learner_config_default(&c);
    c.lr.lr = 0;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_learner_config_default(&c);
    /* UAQ: applied once by new (norm gains x s), accepted when already applied with the
     * same s (resume), refused when applied with another s */
    float g0 = m->layers[0].attn_norm[0];
    c.uaq_scale = 1.5f;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->uaq_scale, 1.5f);
    cr_assert_eq(m->layers[0].attn_norm[0], g0 * 1.5f);
    qrl_learner_destroy(l);
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(m->layers[0].attn_norm[0], g0 * 1.5f, "not applied twice");
    qrl_learner_destroy(l);
    c.uaq_scale = 2.0f;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "uaq_scale"), "%s", err.msg);
    qrl_model_free(m);
}
