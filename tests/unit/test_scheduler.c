/* Rollout scheduler (SPEC §4) on the real stories260K model: groups complete, behavior
 * log-probs against a fresh prefill, bit-identical output whatever D / prefill chunk /
 * submission order, batch invariance of the forward, the sync boundary (re-prefill keeps
 * old tokens' log-probs and versions, new tokens follow the new weights), staleness
 * restarts, PROMPT_TOO_LONG, finish reasons, KV leak check, verifier rewards, and
 * bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "model/forward.h"
#include "rollout/scheduler.h"
#include "unit/sched_test_util.h"

/* |scheduler log-prob - double recomputation|: the logits are bit-identical (batch
 * invariance); what remains is float vs double in the log-softmax. */
#define LP_TOL 2e-5

static const char *const PROMPTS[] = {"Once upon a time", "One day, Lily", "The cat",
                                      "Tom had 3 apples. He ate 1", "Ben and Mia went"};
#define N_PROMPTS 5

typedef struct fixture {
    qrl_model *m;
    qrl_tokenizer *tok;
    int32_t *prompt[N_PROMPTS];
    int np[N_PROMPTS];
    st_collect col;
} fixture;

static void fx_init(fixture *fx) {
    memset(fx, 0, sizeof *fx);
    fx->m = st_load_model();
    fx->tok = st_load_tok();
    for (int i = 0; i < N_PROMPTS; i++) fx->prompt[i] = st_encode(fx->tok, PROMPTS[i], &fx->np[i]);
}

static void fx_free(fixture *fx) {
    for (int i = 0; i < N_PROMPTS; i++) free(fx->prompt[i]);
    st_collect_free(&fx->col);
    qrl_tokenizer_free(fx->tok);
    qrl_model_free(fx->m);
}

static qrl_scheduler *fx_sched(fixture *fx, const qrl_scheduler_config *cfg) {
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(fx->m, fx->tok, cfg, st_on_group, &fx->col, &s, &err), QRL_OK,
                 "%s", err.msg);
    return s;
}

static qrl_scheduler_group_desc desc_for(fixture *fx, uint64_t id, int prompt, uint32_t G,
                                         float T, int max_new) {
    qrl_scheduler_group_desc d = {.group_id = id, .group_size = G, .prompt = fx->prompt[prompt],
                                  .n_prompt = fx->np[prompt], .max_new_tokens = max_new};
    d.sampling = (qrl_sampling_params){.temperature = T, .top_k = 0, .top_p = 1.0f, .seed = 1234};
    return d;
}

static void submit(qrl_scheduler *s, const qrl_scheduler_group_desc *d) {
    qrl_error err;
    cr_assert_eq(qrl_scheduler_submit(s, d, &err), QRL_OK, "%s", err.msg);
}

static void assert_no_leak(qrl_scheduler *s, int slots) {
    qrl_scheduler_stats st;
    qrl_scheduler_get_stats(s, &st);
    cr_assert_eq(st.kv_free_blocks, st.kv_total_blocks, "KV leak: %d of %d blocks free",
                 st.kv_free_blocks, st.kv_total_blocks);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.queued_responses, 0);
    (void)slots;
}

/* ---- forward batch invariance: the determinism claim rests on it ------------------- */

Test(scheduler, forward_batched_decode_equals_prefill_bitwise) {
    fixture fx;
    fx_init(&fx);
    const qrl_model_config *c = &fx.m->cfg;
    int V = c->vocab_size;
    qrl_kv_cache_desc kd = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                            .head_dim = c->head_dim, .block_size = 4, .n_blocks = 64,
                            .max_seqs = 4, .max_seq_len = 64, .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f, *f3;
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_new(&kd, &kv, &err), QRL_OK);
    cr_assert_eq(qrl_forward_new(fx.m, 64, 64, &f, &err), QRL_OK);
    cr_assert_eq(qrl_forward_new(fx.m, 3, 64, &f3, &err), QRL_OK); /* prefill in 3-row chunks */
    int a, b, r;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &a, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &b, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &r, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, a, fx.prompt[0], fx.np[0], NULL, false, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, b, fx.prompt[3], fx.np[3], NULL, false, &err), QRL_OK);
    int seqs[2] = {a, b};
    int32_t toks[2] = {42, 77};
    float *dec = malloc(sizeof(float) * 2 * V);
    cr_assert_eq(qrl_forward_decode(f, kv, seqs, toks, 2, dec, &err), QRL_OK, "%s", err.msg);
    /* Reference: prompt 3 + 77 prefilled alone in 3-row chunks, last-position logits. */
    int n = fx.np[3] + 1;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    memcpy(ids, fx.prompt[3], sizeof(int32_t) * fx.np[3]);
    ids[n - 1] = 77;
    float *ref = malloc(sizeof(float) * (size_t)n * V);
    cr_assert_eq(qrl_forward_prefill(f3, kv, r, ids, n, ref, true, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(memcmp(dec + V, ref + (size_t)(n - 1) * V, sizeof(float) * V), 0,
                 "batched decode row differs from a chunked prefill of the same sequence");
    free(dec);
    free(ref);
    free(ids);
    qrl_forward_free(f);
    qrl_forward_free(f3);
    qrl_kv_cache_free(kv);
    fx_free(&fx);
}

/* ---- groups complete, log-probs recomputed ----------------------------------------- */

Test(scheduler, groups_complete_with_g_responses_and_logprobs_match_fresh_prefill) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cfg.max_slots = 5;
    cfg.eos_token_id = 2;
    qrl_scheduler *s = fx_sched(&fx, &cfg);
    int32_t stop_ids[1] = {1}; /* llama2.c stories end with BOS */
    for (int i = 0; i < 3; i++) {
        qrl_scheduler_group_desc d = desc_for(&fx, 100 + i, i, 4, 1.0f, 32);
        d.stop_token_ids = stop_ids;
        d.n_stop_token_ids = 1;
        submit(s, &d);
    }
    st_run(s);
    cr_assert_eq(fx.col.n, 3);
    int total = 0;
    for (int i = 0; i < 3; i++) {
        st_group *g = st_find(&fx.col, 100 + i);
        cr_assert_not_null(g);
        cr_assert_eq(g->emitted, 1);
        cr_assert_eq(g->G, 4);
        for (int j = 0; j < 4; j++) {
            st_resp *r = &g->r[j];
            cr_assert(r->n >= 1 && r->n <= 32, "n=%d", r->n);
            if (r->finish == QRL_FINISH_LENGTH) cr_assert_eq(r->n, 32);
            else if (r->finish == QRL_FINISH_STOP) cr_assert_eq(r->tok[r->n - 1], 1);
            else {
                cr_assert_eq(r->finish, QRL_FINISH_EOS);
                cr_assert_eq(r->tok[r->n - 1], 2);
            }
            double *ref = malloc(sizeof(double) * r->n);
            st_recompute(fx.m, fx.prompt[i], fx.np[i], r->tok, r->n, 1.0f, ref);
            for (int k = 0; k < r->n; k++) {
                cr_assert_eq(r->ver[k], 0);
                cr_assert_eq(r->lp[k], r->lpf[k], "no masking: behavior == full-vocab log-prob");
                cr_assert(fabs(r->lp[k] - ref[k]) <= LP_TOL, "group %d resp %d tok %d: %g vs %g",
                          i, j, k, r->lp[k], ref[k]);
            }
            free(ref);
            total += r->n;
        }
        /* sampled, not greedy: the 4 responses are not all the same */
        cr_assert(g->r[0].n != g->r[1].n || memcmp(g->r[0].tok, g->r[1].tok, 4 * g->r[0].n) ||
                  g->r[0].n != g->r[2].n || memcmp(g->r[0].tok, g->r[2].tok, 4 * g->r[0].n));
    }
    qrl_scheduler_stats st;
    qrl_scheduler_get_stats(s, &st);
    cr_assert_eq(st.tokens_generated, (uint64_t)total);
    cr_assert_eq(st.groups_emitted, 3);
    assert_no_leak(s, 5);
    qrl_scheduler_free(s);
    fx_free(&fx);
}

Test(scheduler, top_k_records_truncated_behavior_logprob) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    qrl_scheduler *s = fx_sched(&fx, &cfg);
    qrl_scheduler_group_desc d = desc_for(&fx, 7, 0, 2, 0.8f, 24);
    d.sampling.top_k = 5;
    submit(s, &d);
    st_run(s);
    st_group *g = st_find(&fx.col, 7);
    cr_assert_not_null(g);
    for (int j = 0; j < 2; j++) {
        st_resp *r = &g->r[j];
        double *ref = malloc(sizeof(double) * r->n);
        st_recompute(fx.m, fx.prompt[0], fx.np[0], r->tok, r->n, 0.8f, ref);
        cr_assert_gt(r->truncated, 0);
        for (int k = 0; k < r->n; k++) {
            cr_assert(fabs(r->lpf[k] - ref[k]) <= LP_TOL, "%g vs %g", r->lpf[k], ref[k]);
            cr_assert_geq(r->lp[k], r->lpf[k], "renormalized over the top 5: not less likely");
        }
        free(ref);
    }
    qrl_scheduler_free(s);
    fx_free(&fx);
}

/* ---- determinism ------------------------------------------------------------------- */

static void run_variant(fixture *fx, int slots, int chunk, bool reverse, st_collect *out) {
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cfg.max_slots = slots;
    cfg.prefill_chunk = chunk;
    cfg.kv_block_size = slots == 3 ? 5 : 16;
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(fx->m, fx->tok, &cfg, st_on_group, out, &s, &err), QRL_OK);
    for (int k = 0; k < N_PROMPTS; k++) {
        int i = reverse ? N_PROMPTS - 1 - k : k;
        qrl_scheduler_group_desc d = desc_for(fx, 500 + i, i, 3, 1.0f, 40);
        submit(s, &d);
    }
    st_run(s);
    assert_no_leak(s, slots);
    qrl_scheduler_free(s);
}

Test(scheduler, bit_identical_across_slots_chunking_and_submission_order) {
    fixture fx;
    fx_init(&fx);
    st_collect ref, other[3];
    memset(&ref, 0, sizeof ref);
    memset(other, 0, sizeof other);
    run_variant(&fx, 1, 0, false, &ref);
    run_variant(&fx, 3, 5, true, &other[0]);
    run_variant(&fx, 16, 256, false, &other[1]);
    run_variant(&fx, 16, 2, true, &other[2]);
    cr_assert_eq(ref.n, N_PROMPTS);
    for (int v = 0; v < 3; v++) {
        cr_assert_eq(other[v].n, N_PROMPTS);
        for (int i = 0; i < N_PROMPTS; i++) {
            st_group *a = st_find(&ref, 500 + i), *b = st_find(&other[v], 500 + i);
            cr_assert(a && b);
            for (int j = 0; j < 3; j++) {
                cr_assert_eq(a->r[j].n, b->r[j].n, "variant %d group %d resp %d", v, i, j);
                cr_assert_eq(memcmp(a->r[j].tok, b->r[j].tok, 4 * a->r[j].n), 0);
                cr_assert_eq(memcmp(a->r[j].lp, b->r[j].lp, 4 * a->r[j].n), 0);
                cr_assert_eq(a->r[j].finish, b->r[j].finish);
            }
        }
        st_collect_free(&other[v]);
    }
    st_collect_free(&ref);
    fx_free(&fx);
}

/* ---- sync boundary ----------------------------------------------------------------- */

Test(scheduler, swap_weights_reprefills_and_keeps_old_tokens) {
    fixture fx;
    fx_init(&fx);
    qrl_model *b = st_load_model();
    st_perturb(b, 0.05);
    st_collect pure;
    memset(&pure, 0, sizeof pure);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cfg.max_slots = 4;
    cfg.prefill_chunk = 8;
    /* Reference: the same groups under the old weights only. */
    qrl_scheduler *s0 = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(fx.m, fx.tok, &cfg, st_on_group, &pure, &s0, &err), QRL_OK);
    for (int i = 0; i < 2; i++) {
        qrl_scheduler_group_desc d = desc_for(&fx, 10 + i, i, 2, 1.0f, 60);
        submit(s0, &d);
    }
    st_run(s0);
    qrl_scheduler_free(s0);

    qrl_scheduler *s = fx_sched(&fx, &cfg);
    for (int i = 0; i < 2; i++) {
        qrl_scheduler_group_desc d = desc_for(&fx, 10 + i, i, 2, 1.0f, 60);
        submit(s, &d);
    }
    st_step(s, 20);
    cr_assert_eq(qrl_scheduler_swap_weights(s, b, 0, &err), QRL_STATUS_INVALID_ARGUMENT,
                 "version must increase");
    cr_assert_eq(qrl_scheduler_swap_weights(s, b, 1, &err), QRL_OK, "%s", err.msg);
    qrl_model_free(fx.m); /* the old weights may go once swapped out */
    fx.m = NULL;
    st_run(s);
    cr_assert_eq(fx.col.n, 2);
    int discriminating = 0;
    qrl_model *a = st_load_model(); /* the old weights again, for recomputation */
    for (int i = 0; i < 2; i++) {
        st_group *g = st_find(&fx.col, 10 + i), *p = st_find(&pure, 10 + i);
        for (int j = 0; j < 2; j++) {
            st_resp *r = &g->r[j];
            cr_assert_eq(r->finish, QRL_FINISH_LENGTH);
            cr_assert_eq(r->n, 60);
            cr_assert_eq(r->reprefills, 1);
            int k0 = 0;
            while (k0 < r->n && r->ver[k0] == 0) k0++;
            cr_assert(k0 > 0 && k0 < r->n, "boundary inside the response (k0=%d)", k0);
            for (int k = k0; k < r->n; k++) cr_assert_eq(r->ver[k], 1);
            /* before the boundary: exactly the old-weights run (keyed draws) */
            cr_assert_eq(memcmp(r->tok, p->r[j].tok, 4 * k0), 0);
            cr_assert_eq(memcmp(r->lp, p->r[j].lp, 4 * k0), 0);
            double *la = malloc(sizeof(double) * r->n), *lb = malloc(sizeof(double) * r->n);
            st_recompute(a, fx.prompt[i], fx.np[i], r->tok, r->n, 1.0f, la);
            st_recompute(b, fx.prompt[i], fx.np[i], r->tok, r->n, 1.0f, lb);
            for (int k = 0; k < r->n; k++) {
                double want = k < k0 ? la[k] : lb[k];
                cr_assert(fabs(r->lp[k] - want) <= LP_TOL, "resp %d/%d tok %d (boundary %d): %g vs %g",
                          i, j, k, k0, r->lp[k], want);
                if (k >= k0 && fabs(la[k] - lb[k]) > 100 * LP_TOL) discriminating++;
            }
            free(la);
            free(lb);
        }
    }
    cr_assert_gt(discriminating, 10, "the perturbation must change log-probs visibly");
    qrl_scheduler_stats st;
    qrl_scheduler_get_stats(s, &st);
    cr_assert_eq(st.reprefills, 4);
    cr_assert_eq(st.restarts, 0);
    cr_assert_eq(st.version, 1);
    assert_no_leak(s, 4);
    qrl_scheduler_free(s);
    qrl_model_free(a);
    qrl_model_free(b);
    st_collect_free(&pure);
    fx_free(&fx);
}

static void staleness_run(fixture *fx, qrl_model *b, int max_staleness, st_collect *col,
                          qrl_scheduler_stats *st) {
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cfg.max_slots = 2;
    cfg.max_staleness = max_staleness;
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(fx->m, fx->tok, &cfg, st_on_group, col, &s, &err), QRL_OK);
    qrl_scheduler_group_desc d = desc_for(fx, 77, 2, 1, 1.0f, 200);
    submit(s, &d);
    st_step(s, 10);
    cr_assert_eq(qrl_scheduler_swap_weights(s, b, 1, &err), QRL_OK);
    st_step(s, 10);
    cr_assert_eq(qrl_scheduler_swap_weights(s, fx->m, 2, &err), QRL_OK);
    st_run(s);
    qrl_scheduler_get_stats(s, st);
    assert_no_leak(s, 2);
    qrl_scheduler_free(s);
}

Test(scheduler, staleness_restarts_a_long_response) {
    fixture fx;
    fx_init(&fx);
    qrl_model *b = st_load_model();
    st_perturb(b, 0.05);
    st_collect stale, loose, fresh;
    memset(&stale, 0, sizeof stale);
    memset(&loose, 0, sizeof loose);
    memset(&fresh, 0, sizeof fresh);
    qrl_scheduler_stats st;
    /* max_staleness 1: at version 2 the oldest token (version 0) is 2 behind: restart. */
    staleness_run(&fx, b, 1, &stale, &st);
    cr_assert_eq(st.restarts, 1);
    cr_assert_eq(st.reprefills, 1); /* the first boundary re-prefilled it */
    st_resp *r = &st_find(&stale, 77)->r[0];
    cr_assert_eq(r->restarts, 1);
    cr_assert_eq(r->reprefills, 0, "the final attempt crossed no boundary");
    cr_assert_eq(r->n, 200);
    for (int k = 0; k < r->n; k++) cr_assert_eq(r->ver[k], 2);
    /* The restart is a fresh attempt under the version-2 weights (= the original model):
     * keyed draws make it equal to a plain run. */
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    qrl_scheduler *s = fx_sched(&fx, &cfg);
    qrl_scheduler_group_desc d = desc_for(&fx, 77, 2, 1, 1.0f, 200);
    submit(s, &d);
    st_collect_free(&fx.col);
    st_run(s);
    qrl_scheduler_free(s);
    st_resp *f = &st_find(&fx.col, 77)->r[0];
    cr_assert_eq(f->n, r->n);
    cr_assert_eq(memcmp(f->tok, r->tok, 4 * r->n), 0);
    cr_assert_eq(memcmp(f->lp, r->lp, 4 * r->n), 0);
    /* No bound: two re-prefills, no restart, versions 0 then 1 then 2. */
    staleness_run(&fx, b, -1, &loose, &st);
    cr_assert_eq(st.restarts, 0);
    cr_assert_eq(st.reprefills, 2);
    r = &st_find(&loose, 77)->r[0];
    cr_assert_eq(r->reprefills, 2);
    cr_assert_eq(r->ver[0], 0);
    cr_assert_eq(r->ver[r->n - 1], 2);
    for (int k = 1; k < r->n; k++) cr_assert_geq(r->ver[k], r->ver[k - 1]);
    st_collect_free(&stale);
    st_collect_free(&loose);
    st_collect_free(&fresh);
    qrl_model_free(b);
    fx_free(&fx);
}

/* ---- finish reasons ---------------------------------------------------------------- */

Test(scheduler, prompt_too_long_and_context_limit) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cfg.max_ctx = 16;
    qrl_scheduler *s = fx_sched(&fx, &cfg);
    int32_t p16[16], p15[15];
    for (int i = 0; i < 16; i++) p16[i] = fx.prompt[3][i % fx.np[3]];
    memcpy(p15, p16, sizeof p15);
    qrl_scheduler_group_desc d = desc_for(&fx, 1, 0, 2, 1.0f, 10);
    d.prompt = p16;
    d.n_prompt = 16;
    d.task = "gsm8k";
    d.reference = "1";
    submit(s, &d);
    d.group_id = 2;
    d.prompt = p15;
    d.n_prompt = 15;
    submit(s, &d);
    qrl_scheduler_group_desc ok = desc_for(&fx, 3, 2, 1, 1.0f, 100);
    submit(s, &ok);
    st_run(s);
    st_group *g = st_find(&fx.col, 1);
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(g->r[j].finish, QRL_FINISH_PROMPT_TOO_LONG);
        cr_assert_eq(g->r[j].n, 0);
        cr_assert_eq(g->r[j].reward, 0.0);
    }
    g = st_find(&fx.col, 2);
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(g->r[j].n, 1);
        cr_assert_eq(g->r[j].finish, QRL_FINISH_LENGTH);
    }
    g = st_find(&fx.col, 3); /* context 16 ends it, not max_new_tokens 100 */
    cr_assert_eq(g->r[0].n, 16 - fx.np[2]);
    cr_assert_eq(g->r[0].finish, QRL_FINISH_LENGTH);
    assert_no_leak(s, cfg.max_slots);
    qrl_scheduler_free(s);
    fx_free(&fx);
}

/* Greedy reference run of prompt 0 (no stops): tokens and text. */
static st_resp *greedy_ref(fixture *fx, int max_new, qrl_scheduler_config *cfg_out) {
    qrl_scheduler_config_default(cfg_out);
    qrl_scheduler *s = fx_sched(fx, cfg_out);
    qrl_scheduler_group_desc d = desc_for(fx, 900, 0, 1, 0.0f, max_new);
    submit(s, &d);
    st_run(s);
    qrl_scheduler_free(s);
    return &st_find(&fx->col, 900)->r[0];
}

Test(scheduler, stop_strings_stop_ids_eos_and_max_tokens) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    st_resp *ref = greedy_ref(&fx, 60, &cfg);
    cr_assert_eq(ref->n, 60);
    cr_assert_eq(ref->finish, QRL_FINISH_LENGTH);
    cr_assert_gt(strlen(ref->text), 40);
    /* stop string: 5 bytes from the middle of the greedy text; expected cut = end of its
     * first occurrence. */
    char stop[6];
    memcpy(stop, ref->text + 30, 5);
    stop[5] = '\0';
    size_t cut = (size_t)(strstr(ref->text, stop) - ref->text) + 5;
    const char *stops[2] = {"zzzzqq", stop};
    int32_t stop_id = ref->tok[7];
    int first_id = 0;
    while (ref->tok[first_id] != stop_id) first_id++;

    qrl_scheduler *s = fx_sched(&fx, &cfg);
    qrl_scheduler_group_desc d = desc_for(&fx, 1, 0, 1, 0.0f, 60);
    d.stop_strings = stops;
    d.n_stop_strings = 2;
    submit(s, &d);
    d = desc_for(&fx, 2, 0, 1, 0.0f, 5);
    submit(s, &d);
    d = desc_for(&fx, 3, 0, 1, 0.0f, 60);
    d.stop_token_ids = &stop_id;
    d.n_stop_token_ids = 1;
    submit(s, &d);
    st_run(s);
    qrl_scheduler_free(s);
    cfg.eos_token_id = stop_id;
    s = fx_sched(&fx, &cfg);
    d = desc_for(&fx, 4, 0, 1, 0.0f, 60);
    submit(s, &d);
    st_run(s);
    assert_no_leak(s, cfg.max_slots);
    qrl_scheduler_free(s);

    st_resp *r = &st_find(&fx.col, 1)->r[0];
    cr_assert_eq(r->finish, QRL_FINISH_STOP);
    cr_assert_eq(strlen(r->text), cut, "text '%s' cut after '%s'", r->text, stop);
    cr_assert_eq(strncmp(r->text, ref->text, cut), 0);
    cr_assert(r->n < ref->n && memcmp(r->tok, ref->tok, 4 * r->n) == 0);
    char *before = NULL; /* one token fewer does not contain the stop string yet */
    qrl_error err;
    cr_assert_eq(qrl_tokenizer_decode(fx.tok, r->tok, r->n - 1, true, &before, &err), QRL_OK);
    cr_assert_null(strstr(before, stop));
    free(before);
    r = &st_find(&fx.col, 2)->r[0];
    cr_assert_eq(r->finish, QRL_FINISH_LENGTH);
    cr_assert_eq(r->n, 5);
    cr_assert_eq(memcmp(r->tok, ref->tok, 4 * 5), 0);
    r = &st_find(&fx.col, 3)->r[0];
    cr_assert_eq(r->finish, QRL_FINISH_STOP);
    cr_assert_eq(r->n, first_id + 1);
    r = &st_find(&fx.col, 4)->r[0];
    cr_assert_eq(r->finish, QRL_FINISH_EOS);
    cr_assert_eq(r->n, first_id + 1);
    fx_free(&fx);
}

/* ---- rewards ----------------------------------------------------------------------- */

Test(scheduler, rewards_come_from_the_verifier) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    qrl_scheduler *s = fx_sched(&fx, &cfg);
    /* Greedy stories260K continues "Tom had 3 apples. He ate 1" with "00 made ..."; the
     * gsm8k verifier falls back to the last number of the text. */
    const char *stops[1] = {" made"};
    const char *refs[4] = {"00", "100", "", "0"};
    for (int i = 0; i < 4; i++) {
        qrl_scheduler_group_desc d = desc_for(&fx, 40 + i, 3, 1, 0.0f, 30);
        d.stop_strings = stops;
        d.n_stop_strings = 1;
        d.task = "gsm8k";
        d.reference = refs[i];
        submit(s, &d);
    }
    st_run(s);
    st_resp *r = &st_find(&fx.col, 40)->r[0];
    cr_assert_eq(r->finish, QRL_FINISH_STOP);
    cr_assert_str_eq(r->text, "00 made");
    cr_assert_str_eq(r->extracted, "00");
    cr_assert_eq(r->verify_status, QRL_OK);
    cr_assert_eq(r->reward, 1.0);
    cr_assert(r->correct);
    r = &st_find(&fx.col, 41)->r[0];
    cr_assert_str_eq(r->extracted, "00");
    cr_assert_eq(r->reward, 0.0, "00 != 100");
    cr_assert(!r->correct);
    r = &st_find(&fx.col, 43)->r[0]; /* normalized comparison: 00 == 0 */
    cr_assert_eq(r->reward, 1.0);
    r = &st_find(&fx.col, 42)->r[0]; /* empty reference: verifier error, reward 0 */
    cr_assert_neq(r->verify_status, QRL_OK);
    cr_assert_eq(r->reward, 0.0);
    qrl_scheduler_free(s);
    fx_free(&fx);
}

/* ---- bad input --------------------------------------------------------------------- */

Test(scheduler, bad_input_is_refused_with_a_clear_error) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    qrl_scheduler *s = NULL;
    qrl_error err;
    cfg.max_ctx = 64;
    cfg.kv_block_size = 16;
    cfg.kv_blocks = 3; /* 64 positions need 4 */
    cr_assert_eq(qrl_scheduler_new(fx.m, fx.tok, &cfg, NULL, NULL, &s, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert_not_null(strstr(err.msg, "kv_blocks=3"), "%s", err.msg);
    qrl_scheduler_config_default(&cfg);
    cfg.max_slots = 0;
    cr_assert_eq(qrl_scheduler_new(fx.m, fx.tok, &cfg, NULL, NULL, &s, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    qrl_scheduler_config_default(&cfg);
    cr_assert_eq(qrl_scheduler_new(fx.m, NULL, &cfg, st_on_group, &fx.col, &s, &err), QRL_OK);

    int32_t bad[3] = {1, 5, 9999};
    qrl_scheduler_group_desc d = desc_for(&fx, 1, 0, 2, 1.0f, 8);
    d.prompt = bad;
    d.n_prompt = 3;
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "index 2"), "%s", err.msg);
    d = desc_for(&fx, 1, 0, 0, 1.0f, 8);
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT);
    d = desc_for(&fx, 1, 0, 1, 1.0f, 0);
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT);
    d = desc_for(&fx, 1, 0, 1, 1.0f, 8);
    d.task = "no-such-task";
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_not_null(strstr(err.msg, "no-such-task"));
    d = desc_for(&fx, 1, 0, 1, 1.0f, 8);
    const char *stops[1] = {"x"};
    d.stop_strings = stops;
    d.n_stop_strings = 1;
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT, "no tokenizer");
    d = desc_for(&fx, 1, 0, 1, 1.0f, 8);
    d.sampling.top_p = 0.0f;
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT);
    d = desc_for(&fx, 1, 0, 1, 1.0f, 8);
    submit(s, &d);
    cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_STATUS_INVALID_ARGUMENT, "duplicate id");
    /* a model of another shape cannot be swapped in */
    qrl_model_config mc = fx.m->cfg;
    mc.n_layers += 1;
    qrl_model *other = NULL;
    cr_assert_eq(qrl_model_new(&mc, &other, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_scheduler_swap_weights(s, other, 5, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_model_free(other);
    st_run(s);
    cr_assert_eq(fx.col.n, 1);
    cr_assert_str_eq(fx.col.g[0].r[0].text, "", "no tokenizer, no text");
    qrl_scheduler_free(s);
    fx_free(&fx);
}

/* config.device >= 0 asks for the CUDA engine: without CUDA in the build, or without that
 * device, the scheduler refuses with one clear error (tests/cuda/test_cuda_scheduler.c
 * runs the engine itself). */
Test(scheduler, cuda_device_refused_without_cuda) {
    fixture fx;
    fx_init(&fx);
    qrl_scheduler_config cfg;
    qrl_scheduler_config_default(&cfg);
    cr_assert_eq(cfg.device, -1, "the CPU engine is the default");
    cfg.device = 63;
    qrl_scheduler *s = NULL;
    qrl_error err;
    qrl_status st = qrl_scheduler_new(fx.m, fx.tok, &cfg, st_on_group, &fx.col, &s, &err);
#ifdef QRL_HAVE_CUDA
    cr_assert_eq(st, QRL_STATUS_CUDA, "%s", err.msg);
    cr_assert(strstr(err.msg, "device 63"), "%s", err.msg);
#else
    cr_assert_eq(st, QRL_STATUS_UNSUPPORTED, "%s", err.msg);
    cr_assert(strstr(err.msg, "no CUDA"), "%s", err.msg);
#endif
    cr_assert_null(s);
    fx_free(&fx);
}
