/* The learner's per-update rollout-correction statistics (common/learner/update.h) on a
 * tiny random Llama: behavior log-probs are the model's own minus known offsets, so
 * d = lp_prox - lp_behav is known per token (to float rounding) and every number below
 * is worked out by hand from the offsets:
 *  - the train-rollout discrepancy |d|: mean, p99 (nearest rank), max;
 *  - the masked-IS dropped token / sequence fractions and the sequence-level TIS
 *    fraction, aggregated over the per-sequence loss calls and over 2 epochs;
 *  - the defaults (token TIS, no mask) report none of them. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "learner/update.h"
#include "model/model.h"

#define TINY_JSON                                                                              \
    "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64,"              \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"       \
    " \"vocab_size\": 16, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"            \
    " \"tie_word_embeddings\": false}"

enum { V = 16, G = 4, L = 25, NT = G * L };

static qrl_model *tiny_model(void) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(TINY_JSON, strlen(TINY_JSON), "cfg", &cfg, &err),
                 QRL_OK, "%s", err.msg);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 7);
    return m;
}

/* One group of G responses of L tokens, rewards (1, 0, 0.5, 0); behavior log-probs
 * lp_model - off[i][j]: then d = lp_prox - lp_behav = off[i][j]. */
typedef struct tgroup {
    int32_t prompt[3], tok[G][L];
    float lp[G][L];
    qrl_learner_response r[G];
    qrl_learner_group g;
} tgroup;

static void make_group(qrl_learner_t *l, tgroup *t, const double off[G][L]) {
    static const float rew[G] = {1, 0, 0.5f, 0};
    memset(t, 0, sizeof *t);
    uint64_t s = 12345;
    for (int p = 0; p < 3; p++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t->prompt[p] = (int32_t)((s >> 33) % V);
    }
    for (int i = 0; i < G; i++) {
        for (int j = 0; j < L; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            t->tok[i][j] = (int32_t)((s >> 33) % V);
            t->lp[i][j] = -1.0f; /* placeholder, replaced below */
        }
        t->r[i] = (qrl_learner_response){.tokens = t->tok[i], .logprobs = t->lp[i],
                                         .n_tokens = L, .reward = rew[i]};
    }
    t->g = (qrl_learner_group){.group_id = 1, .prompt = t->prompt, .n_prompt = 3,
                               .responses = t->r, .n_responses = G};
    qrl_error err;
    for (int i = 0; i < G; i++) {
        cr_assert_eq(qrl_learner_response_logprobs(l, &t->g, (uint32_t)i, t->lp[i], &err),
                     QRL_OK, "%s", err.msg);
        for (int j = 0; j < L; j++) t->lp[i][j] = (float)((double)t->lp[i][j] - off[i][j]);
    }
}

static qrl_learner_stats update(const qrl_learner_config *c, const double off[G][L]) {
    qrl_model *m = tiny_model();
    qrl_learner_t *l;
    qrl_error err;
    cr_assert_eq(qrl_learner_new(m, c, &l, &err), QRL_OK, "%s", err.msg);
    tgroup t;
    make_group(l, &t, off);
    qrl_learner_stats s;
    cr_assert_eq(qrl_learner_update(l, &t.g, 1, &s, &err), QRL_OK, "%s", err.msg);
    qrl_learner_destroy(l);
    qrl_model_free(m);
    return s;
}

static qrl_learner_config base_config(void) {
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.loss.beta = 0;
    c.lr.lr = 1e-3;
    return c;
}

/* |d| takes each value 0.01, 0.02, ..., 1.00 once (token k of the 100 gets
 * ((37 k) mod 100 + 1) / 100, a permutation), sign alternating with k.
 *   mean = (0.01 + ... + 1.00) / 100 = 0.505
 *   p99  = the ceil(0.99 * 100) = 99th smallest = 0.99 (not the max)
 *   max  = 1.00
 * Token MIS with band [0.5, 2]: w = e^{+-|d|} leaves the band iff |d| > ln 2 = 0.693:
 * the 31 values 0.70 .. 1.00 are dropped -> mis_frac 0.31. */
Test(learner_rollout_corr, discrepancy_mean_p99_max_and_token_mis) {
    double off[G][L];
    for (int k = 0; k < NT; k++)
        off[k / L][k % L] = (k % 2 ? -1 : 1) * (double)((37 * k) % 100 + 1) / 100.0;
    qrl_learner_config c = base_config();
    qrl_learner_stats s = update(&c, off);
    cr_assert_eq(s.tokens_trained, NT);
    cr_assert(fabs(s.discrepancy_mean - 0.505) < 1e-6, "mean %.9g", s.discrepancy_mean);
    cr_assert(fabs(s.discrepancy_p99 - 0.99) < 1e-6, "p99 %.9g", s.discrepancy_p99);
    cr_assert(fabs(s.discrepancy_max - 1.00) < 1e-6, "max %.9g", s.discrepancy_max);
    cr_assert_eq(s.mis_frac, 0.0, "defaults drop nothing");
    cr_assert_eq(s.mis_tokens, 0);
    cr_assert_eq(s.seq_tis_frac, 0.0);
    c.loss.mis = QRL_RL_MIS_TOKEN, c.loss.mis_low = 0.5, c.loss.mis_high = 2.0;
    s = update(&c, off);
    cr_assert(fabs(s.mis_frac - 0.31) < 1e-12, "mis_frac %.9g", s.mis_frac);
    cr_assert_eq(s.mis_tokens, 31);
    cr_assert_eq(s.mis_seq_frac, 0.0);
    cr_assert_eq(s.mis_seqs, 0);
    cr_assert_eq(s.steps_taken, 1);
    cr_assert(fabs(s.discrepancy_p99 - 0.99) < 1e-6, "discrepancy does not depend on the loss");
}

/* Constant d per response: 0.3, -0.3, 0.05, 0 (25 tokens each).
 *   discrepancy: mean (25 * (0.3 + 0.3 + 0.05 + 0)) / 100 = 0.1625; sorted |d| = 25 x 0,
 *     25 x 0.05, 50 x 0.3 -> p99 (99th smallest) 0.3, max 0.3
 *   w_seq = e^0.3 = 1.350, e^-0.3 = 0.741, e^0.05 = 1.051, 1
 *   Seq-MIS band [0.8, 1.25]: responses 0 and 1 dropped -> mis_seq_frac 0.5,
 *     mis_frac 50 / 100 = 0.5, mis_seqs 2, mis_tokens 50
 *   seq-TIS with C = 1.2 (is_level seq): response 0 truncated -> seq_tis_frac 0.25,
 *     tis_frac 25 / 100, tis_tokens 25
 * Two epochs of 2 minibatches each: fractions over every evaluation are the same,
 * counts are over the first epoch. */
Test(learner_rollout_corr, seq_mis_and_seq_tis_fractions) {
    static const double dseq[G] = {0.3, -0.3, 0.05, 0};
    double off[G][L];
    for (int i = 0; i < G; i++)
        for (int j = 0; j < L; j++) off[i][j] = dseq[i];
    qrl_learner_config c = base_config();
    c.ppo_epochs = 2, c.minibatch_seqs = 2;
    c.loss.mis = QRL_RL_MIS_SEQ, c.loss.mis_low = 0.8, c.loss.mis_high = 1.25;
    qrl_learner_stats s = update(&c, off);
    cr_assert(fabs(s.discrepancy_mean - 0.1625) < 1e-6, "mean %.9g", s.discrepancy_mean);
    cr_assert(fabs(s.discrepancy_p99 - 0.3) < 1e-6, "p99 %.9g", s.discrepancy_p99);
    cr_assert(fabs(s.discrepancy_max - 0.3) < 1e-6, "max %.9g", s.discrepancy_max);
    cr_assert_eq(s.minibatches, 4);
    cr_assert(fabs(s.mis_seq_frac - 0.5) < 1e-12, "mis_seq_frac %.9g", s.mis_seq_frac);
    cr_assert(fabs(s.mis_frac - 0.5) < 1e-12, "mis_frac %.9g", s.mis_frac);
    cr_assert_eq(s.mis_seqs, 2);
    cr_assert_eq(s.mis_tokens, 50);
    cr_assert_eq(s.seq_tis_frac, 0.0);
    c.loss.mis = QRL_RL_MIS_NONE, c.loss.is_level = QRL_RL_IS_SEQ, c.loss.tis_cap = 1.2;
    s = update(&c, off);
    cr_assert(fabs(s.seq_tis_frac - 0.25) < 1e-12, "seq_tis_frac %.9g", s.seq_tis_frac);
    cr_assert(fabs(s.tis_frac - 0.25) < 1e-12, "tis_frac %.9g", s.tis_frac);
    cr_assert_eq(s.tis_tokens, 25);
    cr_assert_eq(s.mis_frac, 0.0);
    /* token-level TIS at C = 1.2 on the same data: the tokens of response 0 too (w =
     * e^0.3 per token), the others (0.741, 1.051, 1) are below C */
    c.loss.is_level = QRL_RL_IS_TOKEN;
    s = update(&c, off);
    cr_assert(fabs(s.tis_frac - 0.25) < 1e-12, "token tis_frac %.9g", s.tis_frac);
    cr_assert_eq(s.seq_tis_frac, 0.0);
}
