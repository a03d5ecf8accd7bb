/* The learner's RL update on the CUDA training engine (learner.device cuda) against the
 * same update on the CPU engine: same model (the qwen2 HF fixture, weights rounded to BF16
 * so both start from the same values), same groups, same config.  Checked: the update's
 * statistics agree (proximal KL and entropy to 1e-2, loss and gradient norm to 5%), the
 * parameter change has cosine similarity >= 0.9 with the CPU one (AdamW's first steps are
 * sign-like, so BF16 noise on near-zero gradient entries is amplified: measured value
 * printed), the model's arena holds the GPU's parameters after each step, and the
 * optimizer state round-trips host <-> device for checkpoints. */
#include "cuda_test_util.h"

#include "learner/update.h"
#include "model/model.h"

#define G 4
#define NGROUPS 6

typedef struct groups {
    qrl_learner_group g[NGROUPS];
    qrl_learner_response r[NGROUPS][G];
    int32_t prompt[NGROUPS][6], tok[NGROUPS][G][12];
    float lp[NGROUPS][G][12];
} groups;

static void make_groups(groups *gs, int V) {
    uint64_t s = 77;
    for (int i = 0; i < NGROUPS; i++) {
        for (int p = 0; p < 6; p++) gs->prompt[i][p] = (int32_t)(rng_next(&s) % (uint64_t)V);
        for (int k = 0; k < G; k++) {
            int n = 6 + (int)(rng_next(&s) % 7);
            for (int j = 0; j < n; j++) {
                gs->tok[i][k][j] = (int32_t)(rng_next(&s) % (uint64_t)V);
                gs->lp[i][k][j] = -5.0f; /* replaced by the proximal log-probs below */
            }
            gs->r[i][k] = (qrl_learner_response){.tokens = gs->tok[i][k], .logprobs = gs->lp[i][k],
                                                 .n_tokens = n, .reward = (float)((i + k) % 2)};
        }
        gs->g[i] = (qrl_learner_group){.group_id = (uint64_t)i + 1, .prompt = gs->prompt[i],
                                       .n_prompt = 6, .responses = gs->r[i], .n_responses = G};
    }
}

static qrl_model *load(void) {
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load_hf("tests/fixtures/hf/qwen2", &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    return m;
}

Test(cuda_learner, update_matches_cpu_engine, .timeout = 300) {
    require_gpu();
    qrl_model *mc = load(), *mg = load();
    size_t np = (size_t)(mc->rope_inv_freq - mc->arena);
    float *p0 = malloc(np * 4);
    memcpy(p0, mc->arena, np * 4);
    qrl_learner_config cfg;
    qrl_learner_config_default(&cfg);
    cfg.lr.lr = 1e-3;
    cfg.max_tokens = 256;
    cfg.minibatch_seqs = 12; /* two optimizer steps per update */
    qrl_learner_t *lc, *lg;
    qrl_error err;
    cr_assert_eq(qrl_learner_new(mc, &cfg, &lc, &err), QRL_OK, "%s", err.msg);
    cfg.device = 0;
    cr_assert_eq(qrl_learner_new(mg, &cfg, &lg, &err), QRL_OK, "%s", err.msg);
    groups *gs = calloc(1, sizeof *gs);
    make_groups(gs, mc->cfg.vocab_size);
    for (int i = 0; i < NGROUPS; i++) /* behavior = proximal (on the CPU engine) */
        for (int k = 0; k < G; k++)
            cr_assert_eq(qrl_learner_response_logprobs(lc, &gs->g[i], (uint32_t)k, gs->lp[i][k],
                                                       &err), QRL_OK, "%s", err.msg);
    qrl_learner_stats sc, sg;
    cr_assert_eq(qrl_learner_update(lc, gs->g, NGROUPS, &sc, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_learner_update(lg, gs->g, NGROUPS, &sg, &err), QRL_OK, "%s", err.msg);
    printf("learner cpu vs cuda: steps %d/%d kl %.3e/%.3e entropy %.4f/%.4f loss %.4e/%.4e "
           "grad norm %.4e/%.4e\n", sc.steps_taken, sg.steps_taken, sc.kl_behav_prox,
           sg.kl_behav_prox, sc.entropy_mean, sg.entropy_mean, sc.loss_mean, sg.loss_mean,
           sc.grad_norm_mean, sg.grad_norm_mean);
    cr_expect_eq(sg.steps_taken, 2);
    cr_expect_eq(sc.steps_taken, sg.steps_taken);
    cr_expect(fabs(sg.kl_behav_prox - sc.kl_behav_prox) <= 1e-2, "kl");
    cr_expect(fabs(sg.entropy_mean - sc.entropy_mean) <= 1e-2 * fabs(sc.entropy_mean), "entropy");
    cr_expect(fabs(sg.loss_mean - sc.loss_mean) <= 5e-2 * fabs(sc.loss_mean) + 1e-4, "loss");
    cr_expect(fabs(sg.grad_norm_mean - sc.grad_norm_mean) <= 5e-2 * sc.grad_norm_mean,
              "grad norm");
    double dot = 0, nc = 0, ng = 0;
    for (size_t i = 0; i < np; i++) {
        double a = (double)mc->arena[i] - p0[i], b = (double)mg->arena[i] - p0[i];
        dot += a * b, nc += a * a, ng += b * b;
    }
    double cosv = dot / sqrt(nc * ng);
    printf("learner cpu vs cuda: parameter change cosine %.4f, |cuda| / |cpu| %.4f\n", cosv,
           sqrt(ng / nc));
    cr_expect(ng > 0, "the model's arena did not receive the GPU's parameters");
    cr_expect(cosv >= 0.9, "parameter change cosine %.4f", cosv);

    /* checkpoint path: state to the host and back; a further update still runs */
    cr_assert_eq(qrl_learner_sync_host(lg, &err), QRL_OK, "%s", err.msg);
    qrl_adamw_t *opt = qrl_learner_optimizer(lg);
    cr_expect_eq(qrl_adamw_steps(opt), 2);
    float *m, *v;
    qrl_adamw_moments(opt, &m, &v);
    double mm = 0;
    for (size_t i = 0; i < np; i++) mm += fabs(m[i]);
    cr_expect(mm > 0, "moments not downloaded");
    cr_assert_eq(qrl_learner_sync_device(lg, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_learner_update(lg, gs->g, NGROUPS, &sg, &err), QRL_OK, "%s", err.msg);
    cr_expect_eq(qrl_adamw_steps(opt), 4);
    qrl_learner_destroy(lc), qrl_learner_destroy(lg);
    qrl_model_free(mc), qrl_model_free(mg);
    free(gs), free(p0);
}
