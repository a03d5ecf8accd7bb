/* Learner QAT on the CPU training engine (train/model_train.h, SPEC §6): weights
 * fake-quantized bit-identically to the rollout's quantizer, the learner's guided
 * quantization reproduces the rollout's FP4 codes bit for bit at every captured site
 * given the same inputs, straight-through gradients, rows without records counted. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "cpu/quant.h"
#include "sched_test_util.h"
#include "support/trace_rollout.h"
#include "train/model_train.h"

/* ---- weights ---------------------------------------------------------------------------- */

Test(model_train_qat, weights_match_the_rollout_quantizer_bit_for_bit) {
    qrl_model *m = st_load_model(), *r = st_load_model();
    qrl_error e;
    cr_assert_eq(qrl_model_quantize(r, QRL_PRECISION_W4A16_NVFP4, &e), QRL_OK, "%s", e.msg);
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, F = c->hidden_dim;
    /* layer 2's down projection [D, F] (F = 172: a partial last block) and q [Q, D] */
    struct { const float *w; int slot, rows, cols; } cases[] = {
        {m->layers[2].w_down, QRL_LINEAR_DOWN, D, F},
        {m->layers[4].wq, QRL_LINEAR_Q, c->n_heads * c->head_dim, D}};
    for (int ci = 0; ci < 2; ci++) {
        int N = cases[ci].rows, K = cases[ci].cols;
        float *y = malloc(sizeof(float) * (size_t)N * K), *eye = calloc((size_t)K * K, 4),
              *out = malloc(sizeof(float) * (size_t)K * N);
        uint8_t *codes = malloc((size_t)N * K), *scales = malloc((size_t)N * K);
        qrl_model_train_qat_weight(cases[ci].w, N, K, codes, scales, y);
        /* the rollout's linear applied to unit rows returns its dequantized weights */
        for (int k = 0; k < K; k++) eye[(size_t)k * K + k] = 1.0f;
        qrl_linear_scratch *s = NULL;
        cr_assert_eq(qrl_linear_scratch_new(K, K, &s, &e), QRL_OK);
        qrl_linear_forward(qrl_model_linear(r, ci == 0 ? 2 : 4, cases[ci].slot), eye, K, out, s);
        /* value equality: the unit-row trick returns +0 for a -0 weight (0.0 + -0.0) */
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                cr_assert(y[(size_t)n * K + k] == out[(size_t)k * N + n],
                             "case %d w[%d, %d]: %g vs %g", ci, n, k, y[(size_t)n * K + k],
                             out[(size_t)k * N + n]);
        qrl_linear_scratch_free(s);
        free(y), free(eye), free(out), free(codes), free(scales);
    }
    qrl_model_free(m);
    qrl_model_free(r);
}

/* ---- guided codes equal the rollout's --------------------------------------------------- */

typedef struct rollout_ctx {
    trace_rollout tr; /* the recorded vectors */
    int sites_checked, tokens_checked;
    /* group 1 response 0, kept for the training forward */
    int32_t prompt[16], resp[64];
    int n_prompt, n_resp;
    float lp[64];
    qrl_trace_response *rec;
} rollout_ctx;

/* For every record of every response: the learner's quantizer on the rollout's input
 * with the decoded record gives the rollout's codes (qrl_nvfp4_quantize_row, what the
 * linear / KV write used), and dequantizes to the same values. */
static void on_group(const qrl_scheduler_group_result *res, void *ctx) {
    rollout_ctx *rc = ctx;
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        qrl_trace_response *rec = trace_rollout_decode(rc->tr.m, o->trace, (uint32_t)o->n_tokens);
        for (size_t i = 0; i < rc->tr.n; i++) {
            const trace_tap *t = &rc->tr.t[i];
            if (t->resp != (int)r) continue;
            uint32_t id = t->id;
            uint8_t want[1024], got[1024], sc[128];
            float genc, y[2048], yw[2048];
            qrl_nvfp4_quantize_row(t->x, t->n, want, sc, &genc);
            qrl_nvfp4_dequantize_row(want, sc, genc, t->n, yw);
            memset(got, 0xAA, sizeof got);
            uint64_t dis = 0;
            cr_assert(qrl_model_train_qat_quantize_row(rec, t->token, (int)(id >> 16),
                                                       (id >> 12) & 0xF, (int)(id & 0xFFF),
                                                       t->x, t->n, y, got, &dis));
            cr_assert_eq(memcmp(got, want, (t->n + 1) / 2), 0, "token %u site 0x%x codes",
                         t->token, id);
            cr_assert_eq(memcmp(y, yw, t->n * sizeof *y), 0);
            cr_assert_eq(dis, 0); /* same inputs: the rollout rounded to nearest itself */
            rc->sites_checked++;
        }
        rc->tokens_checked += o->n_tokens;
        if (res->group_id == 1 && r == 0) {
            rc->n_prompt = res->n_prompt;
            memcpy(rc->prompt, res->prompt, (size_t)res->n_prompt * 4);
            rc->n_resp = o->n_tokens;
            memcpy(rc->resp, o->tokens, (size_t)o->n_tokens * 4);
            memcpy(rc->lp, o->logprobs_full, (size_t)o->n_tokens * 4);
            rc->rec = rec;
        } else {
            qrl_trace_response_free(rec);
        }
    }
}

/* The replica ran a broadcast version (BF16 weights): qrl_model_train_qat_set_bf16 */
static bool g_replica_bf16;

/* Training forward of prompt + response with the given options; lp [T]. */
static void train_forward(qrl_model *m, const qrl_model_train_opts *o, rollout_ctx *rc,
                          const qrl_trace_response *rec, float *lp, qrl_qat_stats *st) {
    int T = rc->n_prompt + rc->n_resp;
    int32_t tok[96], tgt[96], pos[96], seg[96] = {0};
    memcpy(tok, rc->prompt, (size_t)rc->n_prompt * 4);
    memcpy(tok + rc->n_prompt, rc->resp, (size_t)rc->n_resp * 4);
    for (int t = 0; t < T; t++) tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    qrl_model_train_positions(pos, seg, T);
    qrl_model_train_t *tr = NULL;
    qrl_error e;
    cr_assert_eq(qrl_model_train_new_opts(m, o, &tr, &e), QRL_OK, "%s", e.msg);
    qrl_model_train_qat_set_bf16(tr, g_replica_bf16);
    qrl_model_train_qat_clear(tr);
    cr_assert_eq(qrl_model_train_qat_attach(tr, 0, rc->n_prompt, rc->n_resp, rec, &e), QRL_OK);
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, T, lp, NULL, &e), QRL_OK, "%s",
                 e.msg);
    qrl_model_train_qat_stats(tr, st);
    qrl_model_train_destroy(tr);
}

/* A w4a4-nvfp4 + fp4-KV CPU rollout of one group of 2 recording every site of every layer
 * (on_group checks each record against the learner's quantizer), m quantized in place. */
static void record_rollout(qrl_model *m, const int32_t *prompt, int n_prompt, rollout_ctx *rc) {
    *rc = (rollout_ctx){0};
    trace_rollout_record(&rc->tr, m, prompt, n_prompt, on_group, rc);
}

/* max |lp_train - lp_behav| over rc's response 0 of a QAT forward of `master` with
 * (rec) or without records; *share: the guided disagree share. */
static double qat_gap(qrl_model *master, rollout_ctx *rc, const qrl_trace_response *rec,
                      double *share) {
    qrl_model_train_opts og = {.max_tokens = 96, .qat = QRL_QAT_NVFP4, .qat_kv = true,
                               .trace_guidance = true};
    float lp[96];
    qrl_qat_stats st;
    train_forward(master, &og, rc, rec, lp, &st);
    double d = 0;
    for (int k = 0; k < rc->n_resp; k++) d = fmax(d, fabs(lp[rc->n_prompt - 1 + k] - rc->lp[k]));
    if (share) *share = qrl_trace_metric_disagree_share(st.disagree, st.elements_guided);
    return d;
}

static void rollout_ctx_free(rollout_ctx *rc) {
    qrl_trace_response_free(rc->rec);
    trace_rollout_free(&rc->tr);
}

/* HF Qwen3 (HALF RoPE, q/k norms, untied head; tests/fixtures/hf/qwen3): every record is
 * the learner's quantizer's (on_group), and the guided QAT forward, F32 or UAQ-scaled, is
 * the rollout's to float rounding.  (A 2-4% guided share had been seen on HALF-RoPE models.) */
Test(model_train_qat, guided_codes_on_an_hf_qwen3) {
    qrl_model *m = NULL, *master = NULL, *scaled = NULL;
    qrl_error e;
    const char *dir = "tests/fixtures/hf/qwen3";
    cr_assert_eq(qrl_model_load(dir, &m, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_model_load(dir, &master, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_model_load(dir, &scaled, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_model_apply_uaq(scaled, 1.5f, &e), QRL_OK, "%s", e.msg);
    static const int32_t prompt[] = {1, 40, 47, 26, 37, 34, 90};
    rollout_ctx rc;
    record_rollout(m, prompt, 7, &rc);
    cr_assert_gt(rc.sites_checked, 100);
    double sg, su, dg = qat_gap(master, &rc, rc.rec, &sg), du = qat_gap(scaled, &rc, rc.rec, &su),
                   dn = qat_gap(master, &rc, NULL, NULL);
    cr_log_info("qwen3: max |lp_train - lp_behav| guided %.3g (share %.4f), UAQ %.3g (%.4f), "
                "nearest %.3g", dg, sg, du, su, dn);
    cr_assert_lt(dg, 1e-3);
    cr_assert_lt(du, 1e-3);
    cr_assert_lt(dn, 1e-3);
    cr_assert_lt(sg, 0.001);
    cr_assert_lt(su, 0.01);
    rollout_ctx_free(&rc);
    qrl_model_free(m);
    qrl_model_free(master);
    qrl_model_free(scaled);
}

/* m's parameters as a replica receives them over the BF16 weight stream (the tensors:
 * not rope_inv_freq, which each side computes). */
static void round_bf16(qrl_model *m) {
    for (size_t k = 0; k < qrl_model_param_count(m); k++) m->arena[k] = qrl_bf16_to_f32(qrl_f32_to_bf16(m->arena[k]));
}

/* After a weight broadcast the replica decodes nvfp4(bf16(w)) while the learner's masters
 * stay F32: the QAT forward must round as the stream did (qat_set_bf16), plain and in the
 * UAQ parameterization.  Found in the daemon: from update 2 on (version >= 1) 25% of the
 * guided codes differed from nearest and |lp_prox - lp_behav| grew from 3e-8 to 0.03 per
 * token, also at lr 1e-12; here, unrounded, the gap is nats. */
Test(model_train_qat, guided_codes_after_a_bf16_broadcast) {
    static const int32_t prompt[] = {1, 403, 407, 261, 378, 34, 90};
    for (int uaq = 0; uaq < 2; uaq++) {
        qrl_model *replica = st_load_model(), *master = st_load_model();
        qrl_error e;
        if (uaq) {
            cr_assert_eq(qrl_model_apply_uaq(replica, 1.5f, &e), QRL_OK, "%s", e.msg);
            cr_assert_eq(qrl_model_apply_uaq(master, 1.5f, &e), QRL_OK, "%s", e.msg);
        }
        round_bf16(replica);
        rollout_ctx rc;
        record_rollout(replica, prompt, 7, &rc);
        double s_on, s_off, d_on, d_off, dn_on;
        g_replica_bf16 = true;
        d_on = qat_gap(master, &rc, rc.rec, &s_on);
        dn_on = qat_gap(master, &rc, NULL, NULL);
        g_replica_bf16 = false;
        d_off = qat_gap(master, &rc, rc.rec, &s_off);
        cr_log_info("bf16 broadcast%s: max |lp_train - lp_behav| guided %.3g (share %.5f), nearest "
                    "%.3g; without the BF16 rounding guided %.3g (share %.4f)", uaq ? " (UAQ 1.5)" : "",
                    d_on, s_on, dn_on, d_off, s_off);
        cr_assert_lt(d_on, 1e-3);
        cr_assert_lt(dn_on, 1e-3);
        cr_assert_lt(s_on, 0.001);
        cr_assert_gt(d_off, 100 * d_on, "the F32 masters' forward is not the replica's: %g vs %g", d_off, d_on);
        cr_assert_gt(s_off, 0.01);
        rollout_ctx_free(&rc);
        qrl_model_free(replica);
        qrl_model_free(master);
    }
}

/* Version 0 under UAQ with a BF16-valued checkpoint (real Qwen3 checkpoints, qrl-task
 * init-model's random ones): the replica quantizes the unscaled W, the learner's masters
 * are W/1.5.  Many BF16 weights sit exactly on an FP4 rounding midpoint, where round-half-
 * even on W and the F32-rounded W/1.5 fall on different sides: the learner must quantize
 * the weights as the replica does.  Found with bench/e2e.sh's qwen3-tiny/fp4+trace: update
 * 1 had a disagree share of 0.08 and |lp_prox - lp_behav| 0.04 (nearest rounding 0.1), both
 * 2e-7 after the first weight sync; here, before the fix, qwen3_bf16 gave 0.09 guided (share
 * 0.058) and 0.36 nearest. */
Test(model_train_qat, uaq_version_0_on_bf16_weights) {
    static const int32_t prompt[] = {1, 40, 47, 26, 37, 34, 90};
    for (int k = 0; k < 2; k++) {
        qrl_model *replica = NULL, *scaled = NULL;
        qrl_error e;
        if (k == 0) { /* the untied BF16 fixture */
            cr_assert_eq(qrl_model_load("tests/fixtures/hf/qwen3_bf16", &replica, &e), QRL_OK, "%s", e.msg);
            cr_assert_eq(qrl_model_load("tests/fixtures/hf/qwen3_bf16", &scaled, &e), QRL_OK, "%s", e.msg);
        } else { /* the tied F32 fixture, rounded to BF16 as a checkpoint stored in BF16 */
            cr_assert_eq(qrl_model_load("tests/fixtures/hf/qwen3", &replica, &e), QRL_OK, "%s", e.msg);
            cr_assert_eq(qrl_model_load("tests/fixtures/hf/qwen3", &scaled, &e), QRL_OK, "%s", e.msg);
            round_bf16(replica);
            round_bf16(scaled);
        }
        cr_assert_eq(qrl_model_apply_uaq(scaled, 1.5f, &e), QRL_OK, "%s", e.msg);
        rollout_ctx rc;
        record_rollout(replica, prompt, 7, &rc);
        g_replica_bf16 = false; /* version 0: the checkpoint the replica loaded */
        double su, du = qat_gap(scaled, &rc, rc.rec, &su), dn = qat_gap(scaled, &rc, NULL, NULL);
        cr_log_info("%s, UAQ 1.5, version 0: max |lp_train - lp_behav| guided %.3g (share %.5f), "
                    "nearest %.3g", k ? "qwen3 in BF16" : "qwen3_bf16", du, su, dn);
        cr_assert_lt(du, 1e-4);
        cr_assert_lt(dn, 1e-4);
        cr_assert_lt(su, 0.001);
        rollout_ctx_free(&rc);
        qrl_model_free(replica);
        qrl_model_free(scaled);
    }
}

Test(model_train_qat, guided_quantization_reproduces_rollout_codes_at_every_site) {
    qrl_model *m = st_load_model(), *master = st_load_model();
    qrl_error e;
    static const int32_t prompt[] = {1, 403, 407, 261, 378, 34, 90};
    rollout_ctx rc;
    record_rollout(m, prompt, 7, &rc);
    /* every site of every layer, every token of both responses */
    cr_assert_eq(rc.sites_checked, rc.tokens_checked * 5 * (4 + 2 * 4));
    cr_assert_gt(rc.tokens_checked, 10);

    /* the training forward over the same sequence (F32 master weights, QAT, K/V too) */
    float lp_g[96], lp_n[96], lp_f[96];
    qrl_qat_stats sg, sn, sf;
    qrl_model_train_opts og = {.max_tokens = 96, .qat = QRL_QAT_NVFP4, .qat_kv = true,
                               .trace_guidance = true};
    train_forward(master, &og, &rc, rc.rec, lp_g, &sg);
    cr_assert_eq(sg.rows_guided, 1);
    cr_assert_eq(sg.rows_unguided, 0);
    /* per response token: 5 layers x (64 + 64 + 64 + 172 + 2 x 4 x 8) elements */
    cr_assert_eq(sg.elements_guided, (uint64_t)rc.n_resp * 5 * (64 + 64 + 64 + 172 + 64));
    cr_assert_eq(sg.elements_nearest, (uint64_t)(rc.n_prompt - 1) * 5 * (64 + 64 + 64 + 172 + 64) +
                                          5 * (64 + 64 + 64 + 172 + 64)); /* + last token */
    /* without records: nearest rounding everywhere, counted */
    train_forward(master, &og, &rc, NULL, lp_n, &sn);
    cr_assert_eq(sn.rows_unguided, 1);
    cr_assert_eq(sn.elements_guided, 0);
    qrl_model_train_opts of = {.max_tokens = 96};
    train_forward(master, &of, &rc, NULL, lp_f, &sf);
    double dg = 0, dn = 0, df = 0;
    for (int k = 0; k < rc.n_resp; k++) {
        int t = rc.n_prompt - 1 + k;
        dg = fmax(dg, fabs(lp_g[t] - rc.lp[k]));
        dn = fmax(dn, fabs(lp_n[t] - rc.lp[k]));
        df = fmax(df, fabs(lp_f[t] - rc.lp[k]));
    }
    cr_log_info("max |lp_train - lp_behav|: guided %.3g, nearest %.3g, f32 %.3g; disagree share "
                "%.4f", dg, dn, df, qrl_trace_metric_disagree_share(sg.disagree, sg.elements_guided));
    /* the CPU twins compute the same quantized forward up to summation order: both tiny,
     * far below FP4's distance to F32 */
    cr_assert_lt(dg, 1e-3);
    cr_assert_lt(dn, 1e-3);
    cr_assert_gt(df, 100 * dg);

    /* the learner in the UAQ parameterization against this unscaled rollout (a replica's
     * version 0): the norm outputs and the o/down inputs are s times the recorded vectors,
     * so the recorded tensor scale does not fit them; the guided codes must still be the
     * rollout's (found in the daemon with s = 1.5: 44% of the guided codes differed from
     * nearest, and the guided mismatch was 10^4 times nearest's; here, with s = 2, a share
     * of 0.41 and 8.4 nats).  s = 2 because scaling by it is exact in F32: with s = 1.5 the
     * F32 rounding of s*x decides the exact FP4 ties at the unguided prompt positions (with
     * the fp4 KV cache, position 0's o_proj input is dequantized FP4 V), so the case passed
     * or failed (max gap 0.548, share 0.037) by luck with s = 1.1, 1.25, 1.5, 1.7, 2.5
     * according to the last ulp of the weights; uaq_version_0_on_bf16_weights runs 1.5 */
    qrl_model *scaled = st_load_model();
    cr_assert_eq(qrl_model_apply_uaq(scaled, 2.0f, &e), QRL_OK, "%s", e.msg);
    float lp_u[96];
    qrl_qat_stats su;
    train_forward(scaled, &og, &rc, rc.rec, lp_u, &su);
    double du = 0;
    for (int k = 0; k < rc.n_resp; k++)
        du = fmax(du, fabs(lp_u[rc.n_prompt - 1 + k] - rc.lp[k]));
    double share = qrl_trace_metric_disagree_share(su.disagree, su.elements_guided);
    cr_log_info("UAQ 2: max |lp_train - lp_behav| guided %.3g, disagree share %.5f", du, share);
    cr_assert_eq(su.elements_guided, sg.elements_guided);
    cr_assert_lt(share, 0.01, "UAQ-scaled guided codes differ from nearest at %.4f", share);
    cr_assert_lt(du, 1e-3);
    qrl_model_free(scaled);
    rollout_ctx_free(&rc);
    qrl_model_free(m);
    qrl_model_free(master);
}

/* ---- straight-through gradients --------------------------------------------------------- */

static void grads_of(qrl_model *m, const qrl_model_train_opts *o, float **g, size_t *n) {
    static const int32_t tok[] = {1, 403, 407, 261, 378, 34, 90, 12, 55, 301, 7, 88};
    const int T = 12;
    int32_t tgt[12], pos[12], seg[12] = {0};
    for (int t = 0; t < T; t++) tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    qrl_model_train_positions(pos, seg, T);
    qrl_model_train_t *tr = NULL;
    qrl_error e;
    cr_assert_eq(qrl_model_train_new_opts(m, o, &tr, &e), QRL_OK, "%s", e.msg);
    float lp[12], dl[12];
    cr_assert_eq(qrl_model_train_forward(tr, tok, tgt, pos, seg, T, lp, NULL, &e), QRL_OK);
    for (int t = 0; t < T; t++) dl[t] = tgt[t] >= 0 ? -1.0f / 11 : 0.0f;
    cr_assert_eq(qrl_model_train_backward(tr, dl, NULL, &e), QRL_OK);
    float *gr = qrl_model_train_grads(tr, n);
    *g = st_dup(gr, *n * sizeof *gr);
    qrl_model_train_destroy(tr);
}

/* Replace every projection of m by its fake-quantized value (the QAT forward's point). */
static void quantize_projections(qrl_model *m) {
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    uint8_t *codes = malloc((size_t)F * F), *sc = malloc((size_t)F * F);
    for (int l = 0; l < c->n_layers; l++) {
        qrl_layer_weights *w = &m->layers[l];
        float *ws[7] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down};
        int rows[7] = {Q, KV, KV, D, F, F, D}, cols[7] = {D, D, D, Q, D, D, F};
        for (int i = 0; i < 7; i++) qrl_model_train_qat_weight(ws[i], rows[i], cols[i], codes, sc, ws[i]);
    }
    free(codes), free(sc);
}

Test(model_train_qat, ste_gradient_equals_plain_gradient_at_the_quantized_point) {
    qrl_model *m = st_load_model(), *mq = st_load_model();
    quantize_projections(mq);
    size_t n, n2;
    float *g_qat, *g_plain, *g_act;
    qrl_model_train_opts ow = {.max_tokens = 16, .qat = QRL_QAT_NVFP4, .qat_weights_only = true};
    qrl_model_train_opts op = {.max_tokens = 16};
    grads_of(m, &ow, &g_qat, &n);
    grads_of(mq, &op, &g_plain, &n2);
    cr_assert_eq(n, n2);
    double num = 0, den = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g_qat[i] - g_plain[i]);
        worst = fmax(worst, d);
        den += (double)g_plain[i] * g_plain[i];
    }
    cr_assert_leq(worst, 1e-6 * sqrt(den / (double)n) + 1e-12, "weights-only STE: %g", worst);
    /* activations too (recomputation on: the same values): the STE gradient differs from
     * the plain gradient at the quantized weights by the activations' FP4 rounding only;
     * on this 64-wide model, FP4 at every site moves it by ~0.58 relative (cosine ~0.83,
     * measured), so the bound checks direction, not equality */
    qrl_model_train_opts oa = {.max_tokens = 16, .qat = QRL_QAT_NVFP4, .qat_kv = true,
                               .recompute_activations = true};
    grads_of(m, &oa, &g_act, &n2);
    num = 0;
    double dot = 0, na = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)g_act[i] - g_plain[i]) * ((double)g_act[i] - g_plain[i]);
        dot += (double)g_act[i] * g_plain[i];
        na += (double)g_act[i] * g_act[i];
    }
    double rel = sqrt(num / den), cosine = dot / sqrt(na * den);
    cr_log_info("STE with FP4 activations: relative gradient difference %.3f, cosine %.4f", rel,
                cosine);
    cr_assert_lt(rel, 0.8);
    cr_assert_gt(cosine, 0.7);
    /* the master weights were not touched by QAT */
    qrl_model *fresh = st_load_model();
    cr_assert_eq(memcmp(m->arena, fresh->arena, m->arena_floats * sizeof(float)), 0);
    qrl_model_free(fresh);
    free(g_qat), free(g_plain), free(g_act);
    qrl_model_free(m);
    qrl_model_free(mq);
}

Test(model_train_qat, options_are_checked_and_attach_ranges_too) {
    qrl_model *m = st_load_model();
    qrl_model_train_t *tr = NULL;
    qrl_error e;
    qrl_model_train_opts bad = {.max_tokens = 8, .trace_guidance = true};
    cr_assert_eq(qrl_model_train_new_opts(m, &bad, &tr, &e), QRL_STATUS_INVALID_ARGUMENT);
    qrl_model_train_opts ok = {.max_tokens = 8, .qat = QRL_QAT_NVFP4, .trace_guidance = true};
    cr_assert_eq(qrl_model_train_new_opts(m, &ok, &tr, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_model_train_qat_attach(tr, 4, 3, 2, NULL, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_model_train_qat_attach(tr, 0, 3, 5, NULL, &e), QRL_OK);
    qrl_qat_stats st;
    qrl_model_train_qat_stats(tr, &st);
    cr_assert_eq(st.rows_unguided, 1);
    qrl_model_train_qat_stats_reset(tr);
    qrl_model_train_qat_stats(tr, &st);
    cr_assert_eq(st.rows_unguided, 0);
    qrl_model_train_destroy(tr);
    qrl_model_free(m);
}
