/* End-to-end RL on a tiny random model: the rollout scheduler samples G = 8 responses per
 * prompt at T = 1 from the model being trained, the reward is 1 when a response contains
 * token GOAL, qrl_learner_update trains on the groups (copied with
 * qrl_learner_group_from_scheduler).  Checks:
 *  - the copied groups hold the scheduler's tokens / behavior log-probs / versions;
 *  - behavior (inference engine, KV cache) vs proximal (training engine) log-probs agree to
 *    float rounding: |KL(behav || prox)| and max_w - 1 tiny;
 *  - the mean reward rises over the updates (numbers in docs/learner-update.md). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "learner/update.h"
#include "model/model.h"
#include "rollout/scheduler.h"
#include "support/learner_group.h"

#define TINY_JSON                                                                              \
    "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64,"              \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"       \
    " \"vocab_size\": 16, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"            \
    " \"tie_word_embeddings\": false}"

enum { GOAL = 5, G = 8, GROUPS = 8, NEW = 6, ROUNDS = 12 };

typedef struct collect {
    qrl_learner_group *g[GROUPS];
    int n;
    int checked; /* responses compared with the scheduler's arrays */
} collect;

static void on_group(const qrl_scheduler_group_result *res, void *ctx) {
    collect *c = ctx;
    qrl_error err;
    cr_assert_lt(c->n, GROUPS);
    qrl_learner_group *g;
    cr_assert_eq(qrl_learner_group_from_scheduler(res, &g, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(g->group_id, res->group_id);
    cr_assert_eq(g->n_prompt, res->n_prompt);
    cr_assert_eq(memcmp(g->prompt, res->prompt, (size_t)res->n_prompt * 4), 0);
    qrl_learner_response *rs = (qrl_learner_response *)g->responses; /* owned block */
    for (uint32_t i = 0; i < g->n_responses; i++) {
        const qrl_scheduler_response *s = &res->responses[i];
        cr_assert_eq(rs[i].n_tokens, s->n_tokens);
        cr_assert_eq(memcmp(rs[i].tokens, s->tokens, (size_t)s->n_tokens * 4), 0);
        cr_assert_eq(memcmp(rs[i].logprobs, s->logprobs, (size_t)s->n_tokens * 4), 0);
        cr_assert_eq(memcmp(rs[i].versions, s->versions, (size_t)s->n_tokens * 8), 0);
        c->checked++;
        float r = 0;
        for (int t = 0; t < rs[i].n_tokens; t++) r = rs[i].tokens[t] == GOAL ? 1.0f : r;
        rs[i].reward = r; /* the custom verifier */
    }
    c->g[c->n++] = g;
}

Test(learner_rl, reward_rises_with_scheduler_rollouts, .timeout = 120) {
    qrl_model_config mc;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(TINY_JSON, strlen(TINY_JSON), "cfg", &mc, &err),
                 QRL_OK);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&mc, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 2024);
    qrl_learner_config lc;
    qrl_learner_config_default(&lc);
    lc.lr.lr = 3e-3;
    lc.minibatch_seqs = 16; /* 4 optimizer steps per update of 64 responses */
    lc.seed = 1;
    qrl_learner_t *l;
    cr_assert_eq(qrl_learner_new(m, &lc, &l, &err), QRL_OK, "%s", err.msg);

    double reward[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        qrl_scheduler_config sc;
        qrl_scheduler_config_default(&sc);
        sc.max_slots = 16;
        sc.version = (uint64_t)round;
        collect col = {0};
        qrl_scheduler *s;
        cr_assert_eq(qrl_scheduler_new(m, NULL, &sc, on_group, &col, &s, &err), QRL_OK, "%s",
                     err.msg);
        for (int gi = 0; gi < GROUPS; gi++) {
            int32_t prompt[3] = {1, (int32_t)(2 + gi % 4), 3};
            qrl_scheduler_group_desc d = {
                .group_id = (uint64_t)(round * 100 + gi), .group_size = G, .prompt = prompt,
                .n_prompt = 3, .max_new_tokens = NEW,
                .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                             .seed = (uint64_t)round}};
            cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_OK, "%s", err.msg);
        }
        for (int steps = 0; !qrl_scheduler_idle(s); steps++) {
            cr_assert_eq(qrl_scheduler_step(s, NULL, &err), QRL_OK, "%s", err.msg);
            cr_assert_lt(steps, 10000);
        }
        qrl_scheduler_free(s);
        cr_assert_eq(col.n, GROUPS);
        cr_assert_eq(col.checked, GROUPS * G);
        qrl_learner_group groups[GROUPS];
        for (int i = 0; i < GROUPS; i++) groups[i] = *col.g[i];
        qrl_learner_stats st;
        cr_assert_eq(qrl_learner_update(l, groups, GROUPS, &st, &err), QRL_OK, "%s", err.msg);
        reward[round] = st.reward_mean;
        cr_log_info("round %d: reward %.3f used %zu dropped %zu steps %d kl_bp %.2e max_w-1 "
                    "%.2e entropy %.3f clip %.3f/%.3f k3 %.2e",
                    round, st.reward_mean, st.groups_used, st.groups_dropped, st.steps_taken,
                    st.kl_behav_prox, st.max_w - 1, st.entropy_mean, st.clip_frac_low,
                    st.clip_frac_high, st.k3_mean);
        cr_assert_eq(st.version_min, (uint64_t)round);
        cr_assert_eq(st.version_max, (uint64_t)round);
        if (st.groups_used > 0) {
            /* same weights, T = 1: behavior = proximal up to float rounding */
            cr_assert_lt(fabs(st.kl_behav_prox), 1e-5, "%g", st.kl_behav_prox);
            cr_assert_lt(st.max_w, 1 + 1e-4, "%g", st.max_w);
        }
        for (int i = 0; i < GROUPS; i++) qrl_learner_group_free(col.g[i]);
    }
    double first = (reward[0] + reward[1]) / 2, last = (reward[ROUNDS - 2] + reward[ROUNDS - 1]) / 2;
    cr_log_info("mean reward first 2 rounds %.3f, last 2 rounds %.3f", first, last);
    cr_assert_gt(last, first + 0.2);
    qrl_learner_destroy(l);
    qrl_model_free(m);
}
