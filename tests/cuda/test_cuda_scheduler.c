/* The rollout scheduler on the CUDA engine (qrl_scheduler_config.device = 0) against the
 * CPU forward.
 *
 * Reference: the CPU forward over the same model with its weights rounded to BF16
 * (qrl_model_round_bf16: what the GPU engine uploads) and a CPU KV cache of the same
 * format, teacher-forced on prompt + response (one prefill with all logits).  The
 * remaining differences are the GPU's BF16 activations and summation order, and the KV
 * codes they move across a rounding boundary now and then, so the bounds are the forward
 * tests' (tests/cuda/test_cuda_forward.c, test_cuda_forward_kv.c), per token:
 *   eps = TOL[format] * max_i |cpu logit_i| of the row that predicted the token
 *   |scheduler behavior log-prob - cpu log_softmax(logits / T)[token]| <= 2 eps
 * with TOL bf16 0.03, int8 0.08, int4-protected 0.25 (sink 4, recent 16 so the INT4
 * region is most of the context).  Max and mean |diff| per format are printed.
 *
 * Tests:
 *   - sampled groups (T = 1, seeded) on stories260K and the tests/fixtures/hf/qwen3
 *     model, KV bf16 / int8 / int4-protected, 4 slots and 8-token prefill chunks so that
 *     prefill is chunked and decode batches mix lengths: every group is emitted once,
 *     every response runs to its length, token ids in the vocabulary, log-probs within
 *     the bound, no KV block leaked;
 *   - greedy (T = 0) on stories260K, weights bf16, w8a8-int8 and w8a8-fp8 (bound 0.05 for
 *     the INT8 / E4M3 codes the GPU's BF16 GEMM inputs can move by one step): the GPU scheduler's tokens equal the CPU
 *     scheduler's until the first position where they differ, which must have a CPU top-1
 *     margin <= 2 eps (a flip the bound allows; the continuations differ after it); at
 *     least MIN_GREEDY tokens compared, MIN_GREEDY / 4 of them at a margin > 2 eps;
 *   - a weight swap mid-run (as tests/unit/test_scheduler.c): every response is
 *     re-prefilled once, its version-0 tokens match the old weights and its version-1
 *     tokens the new ones within the bound, and the new weights are told apart: the mean
 *     |lp(new) - lp(old)| of the version-1 tokens is > 3x their mean |gpu - cpu(new)|;
 *   - device sampling (the default: kernels/cuda/sample.cuh on the decode logits) against
 *     host sampling (host_sampling: logits copied, qrl_sampler_sample) on the same GPU
 *     engine, greedy, T = 1 and T = 0.8 top-k 40 top-p 0.9 on stories260K: the same
 *     tokens, finish reasons and truncated counts, log-probs within 1e-4 (the engine's
 *     logits are the same in both runs as long as the tokens are). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_cpu_ref.h"
#include "cuda_test_util.h"
#include "model/forward.h"
#include "rollout/scheduler.h"
#include "unit/sched_test_util.h"

#define N_FMT 3
static const qrl_kv_format FMTS[N_FMT] = {QRL_KV_FORMAT_BF16, QRL_KV_FORMAT_INT8,
                                          QRL_KV_FORMAT_INT4_PROTECTED};
static const double TOL[N_FMT] = {0.03, 0.08, 0.25};
#define SINK 4
#define RECENT 16
#define N_GROUPS 3
#define G 3
#define MAX_NEW 40
#define MIN_GREEDY 20

static qrl_scheduler_config gpu_cfg(qrl_kv_format fmt) {
    qrl_scheduler_config c;
    qrl_scheduler_config_default(&c);
    c.max_slots = 4;
    c.prefill_chunk = 8;
    c.kv_format = fmt;
    c.kv_sink = SINK;
    c.kv_recent = RECENT;
    c.device = 0;
    return c;
}

/* CPU teacher-forced logits of ids[0..n) (all positions) with KV format fmt. */
static float *cpu_logits(const qrl_model *m, qrl_kv_format fmt, const int32_t *ids, int n) {
    float *out = malloc((size_t)n * m->cfg.vocab_size * 4);
    cpu_logits_all(m, fmt, SINK, RECENT, ids, n, out);
    return out;
}

/* log softmax(x / T)[t] in double (T <= 0: 1); *amax = max_i |x_i|. */
static double lsm(const float *x, int V, int t, float T, double *amax) {
    double tt = T > 0 ? T : 1.0, mx = -INFINITY, s = 0, am = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, x[i] / tt), am = fmax(am, fabs(x[i]));
    for (int i = 0; i < V; i++) s += exp(x[i] / tt - mx);
    if (amax) *amax = am;
    return x[t] / tt - mx - log(s);
}

typedef struct diff_stats { double max, sum; int n; } diff_stats;

/* Check every token of r (of a group with prompt p[np]) whose version is `ver` (all when
 * ver is UINT64_MAX) against the CPU re-score under m; *lp_ref (may be NULL) receives
 * the CPU log-probs. */
static void check_resp(const char *label, const qrl_model *m, qrl_kv_format fmt, double tol,
                       const int32_t *p, int np, const st_resp *r, float T, uint64_t ver,
                       diff_stats *ds, double *lp_ref) {
    int V = m->cfg.vocab_size, n = np + r->n;
    int32_t *ids = malloc((size_t)n * 4);
    memcpy(ids, p, (size_t)np * 4);
    memcpy(ids + np, r->tok, (size_t)r->n * 4);
    float *lg = cpu_logits(m, fmt, ids, n);
    for (int i = 0; i < r->n; i++) {
        cr_assert(r->tok[i] >= 0 && r->tok[i] < V, "%s: token %d at %d outside [0, %d)", label,
                  r->tok[i], i, V);
        double amax, want = lsm(lg + (size_t)(np + i - 1) * V, V, r->tok[i], T, &amax);
        if (lp_ref) lp_ref[i] = want;
        if (ver != UINT64_MAX && r->ver[i] != ver) continue;
        double d = fabs(r->lpf[i] - want);
        cr_assert(!isnan(d), "%s: NaN log-prob at token %d", label, i);
        cr_assert(d <= 2 * tol * amax, "%s: token %d (id %d): log-prob %g, cpu %g, |diff| %g > "
                  "2 eps = %g", label, i, r->tok[i], r->lpf[i], want, d, 2 * tol * amax);
        ds->max = fmax(ds->max, d);
        ds->sum += d;
        ds->n++;
    }
    free(lg);
    free(ids);
}

static void assert_no_leak(qrl_scheduler *s) {
    qrl_scheduler_stats st;
    qrl_scheduler_get_stats(s, &st);
    cr_assert_eq(st.kv_free_blocks, st.kv_total_blocks, "KV leak: %d of %d blocks free",
                 st.kv_free_blocks, st.kv_total_blocks);
    cr_assert_eq(st.running, 0);
}

typedef struct prompts { int32_t *ids[N_GROUPS]; int n[N_GROUPS]; } prompts;

/* Sample N_GROUPS groups of G responses on the GPU for each format and check them. */
static void sampled_groups(const char *name, qrl_model *m, const qrl_tokenizer *tok,
                           const prompts *pr) {
    for (int fi = 0; fi < N_FMT; fi++) {
        qrl_scheduler_config cfg = gpu_cfg(FMTS[fi]);
        st_collect col;
        memset(&col, 0, sizeof col);
        qrl_scheduler *s = NULL;
        qrl_error err;
        cr_assert_eq(qrl_scheduler_new(m, tok, &cfg, st_on_group, &col, &s, &err), QRL_OK, "%s",
                     err.msg);
        for (int g = 0; g < N_GROUPS; g++) {
            qrl_scheduler_group_desc d = {.group_id = 100 + g, .group_size = G,
                                          .prompt = pr->ids[g], .n_prompt = pr->n[g],
                                          .max_new_tokens = MAX_NEW};
            d.sampling = (qrl_sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = 99};
            cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_OK, "%s", err.msg);
        }
        int steps = st_run(s);
        assert_no_leak(s);
        qrl_scheduler_free(s);
        cr_assert_eq(col.n, N_GROUPS);
        diff_stats ds = {0};
        char label[128];
        for (int g = 0; g < N_GROUPS; g++) {
            st_group *sg = st_find(&col, 100 + g);
            cr_assert_not_null(sg);
            cr_assert_eq(sg->emitted, 1);
            for (int j = 0; j < G; j++) {
                st_resp *r = &sg->r[j];
                snprintf(label, sizeof label, "%s kv=%s group %d response %d", name,
                         qrl_kv_format_name(FMTS[fi]), g, j);
                cr_assert_eq(r->finish, QRL_FINISH_LENGTH, "%s: finish %s", label,
                             qrl_finish_reason_name(r->finish));
                cr_assert_eq(r->n, MAX_NEW, "%s", label);
                check_resp(label, m, FMTS[fi], TOL[fi], pr->ids[g], pr->n[g], r, 1.0f,
                           UINT64_MAX, &ds, NULL);
            }
        }
        fprintf(stderr, "sampled %s kv=%s: %d groups x %d responses x %d tokens in %d steps; "
                "|gpu - cpu| behavior log-prob max %.3e mean %.3e nats (bound 2 x %.2f x "
                "max|logit| per token)\n", name, qrl_kv_format_name(FMTS[fi]), N_GROUPS, G,
                MAX_NEW, steps, ds.max, ds.sum / ds.n, TOL[fi]);
        st_collect_free(&col);
    }
}

static const char *const TEXTS[N_GROUPS] = {"Once upon a time", "One day, Lily",
                                            "Tom had 3 apples. He ate 1"};

Test(cuda_scheduler, sampled_stories260k) {
    require_gpu();
    qrl_model *m = st_load_model();
    qrl_tokenizer *tok = st_load_tok();
    qrl_model_round_bf16(m);
    prompts pr;
    for (int g = 0; g < N_GROUPS; g++) pr.ids[g] = st_encode(tok, TEXTS[g], &pr.n[g]);
    sampled_groups("stories260K", m, tok, &pr);
    for (int g = 0; g < N_GROUPS; g++) free(pr.ids[g]);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
}

Test(cuda_scheduler, sampled_qwen3_fixture) {
    require_gpu();
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load_hf("tests/fixtures/hf/qwen3", &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    prompts pr;
    for (int g = 0; g < N_GROUPS; g++) {
        pr.n[g] = 5 + 7 * g;
        pr.ids[g] = malloc((size_t)pr.n[g] * 4);
        for (int i = 0; i < pr.n[g]; i++)
            pr.ids[g][i] = (int32_t)((i * 37 + 11 * g + 3) % m->cfg.vocab_size);
    }
    sampled_groups("qwen3-fixture", m, NULL, &pr);
    for (int g = 0; g < N_GROUPS; g++) free(pr.ids[g]);
    qrl_model_free(m);
}

/* ---- greedy: GPU scheduler vs CPU scheduler ---------------------------------------- */

static void run_greedy_kv(qrl_model *m, const qrl_tokenizer *tok, const prompts *pr, int device,
                          qrl_kv_format fmt, st_collect *col) {
    qrl_scheduler_config cfg = gpu_cfg(fmt);
    cfg.device = device;
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(m, tok, &cfg, st_on_group, col, &s, &err), QRL_OK, "%s",
                 err.msg);
    for (int g = 0; g < N_GROUPS; g++) {
        qrl_scheduler_group_desc d = {.group_id = 200 + g, .group_size = 1,
                                      .prompt = pr->ids[g], .n_prompt = pr->n[g],
                                      .max_new_tokens = MAX_NEW};
        d.sampling = (qrl_sampling_params){.temperature = 0.0f, .top_p = 1.0f, .seed = 5};
        cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_OK, "%s", err.msg);
    }
    st_run(s);
    assert_no_leak(s);
    qrl_scheduler_free(s);
}

static void run_greedy(qrl_model *m, const qrl_tokenizer *tok, const prompts *pr, int device,
                       st_collect *col) {
    run_greedy_kv(m, tok, pr, device, QRL_KV_FORMAT_BF16, col);
}

/* Greedy GPU vs CPU scheduler with the model in precision `prec` (after the BF16 rounding
 * both sides share) and the bound tol. */
static void greedy_case(qrl_precision prec, double eps_tol) {
    qrl_model *m = st_load_model();
    qrl_tokenizer *tok = st_load_tok();
    qrl_model_round_bf16(m);
    qrl_error qerr;
    cr_assert_eq(qrl_model_quantize(m, prec, &qerr), QRL_OK, "%s", qerr.msg);
    prompts pr;
    for (int g = 0; g < N_GROUPS; g++) pr.ids[g] = st_encode(tok, TEXTS[g], &pr.n[g]);
    st_collect cpu, gpu;
    memset(&cpu, 0, sizeof cpu);
    memset(&gpu, 0, sizeof gpu);
    run_greedy(m, tok, &pr, -1, &cpu);
    run_greedy(m, tok, &pr, 0, &gpu);
    int V = m->cfg.vocab_size, compared = 0, large = 0, flips = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        st_resp *c = &st_find(&cpu, 200 + g)->r[0], *q = &st_find(&gpu, 200 + g)->r[0];
        int n = pr.n[g] + c->n;
        int32_t *ids = malloc((size_t)n * 4);
        memcpy(ids, pr.ids[g], (size_t)pr.n[g] * 4);
        memcpy(ids + pr.n[g], c->tok, (size_t)c->n * 4);
        float *lg = cpu_logits(m, QRL_KV_FORMAT_BF16, ids, n);
        for (int i = 0; i < c->n && i < q->n; i++) {
            const float *row = lg + (size_t)(pr.n[g] + i - 1) * V;
            int best = qrl_cpu_argmax(row, V);
            float second = -INFINITY, amax = 0;
            for (int v = 0; v < V; v++) {
                if (v != best && row[v] > second) second = row[v];
                amax = fmaxf(amax, fabsf(row[v]));
            }
            double margin = row[best] - second, eps = eps_tol * amax;
            cr_assert_eq(c->tok[i], best, "CPU scheduler greedy token is not the argmax");
            if (q->tok[i] != c->tok[i]) { /* only where the CPU margin allows it; the
                                           * continuations differ from here on */
                cr_assert(margin <= 2 * eps, "group %d token %d: gpu %d, cpu %d with margin %g "
                          "> 2 eps = %g", g, i, q->tok[i], c->tok[i], margin, 2 * eps);
                flips++;
                break;
            }
            cr_assert(fabsf(q->lpf[i] - c->lpf[i]) <= 2 * eps,
                      "group %d token %d: greedy log-prob gpu %g cpu %g", g, i, q->lpf[i],
                      c->lpf[i]);
            compared++;
            large += margin > 2 * eps;
        }
        free(lg);
        free(ids);
    }
    fprintf(stderr, "greedy stories260K weights=%s kv=bf16: %d tokens equal to the CPU "
            "scheduler's (%d of them at a CPU margin > 2 eps); %d of %d responses flipped at a "
            "margin <= 2 eps\n", qrl_precision_name(prec), compared, large, flips, N_GROUPS);
    cr_assert_geq(large, MIN_GREEDY / 4);
    cr_assert_geq(compared, MIN_GREEDY);
    st_collect_free(&cpu);
    st_collect_free(&gpu);
    for (int g = 0; g < N_GROUPS; g++) free(pr.ids[g]);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
}

Test(cuda_scheduler, greedy_equals_cpu_scheduler) {
    require_gpu();
    greedy_case(QRL_PRECISION_BF16, TOL[0]);
}

/* w8a8-int8 on both sides (the same codes and scales; the GPU quantizes its BF16 GEMM
 * inputs, so a code can land one step away): the bf16 bound plus a margin. */
Test(cuda_scheduler, greedy_w8a8_int8_equals_cpu_scheduler) {
    require_gpu();
    greedy_case(QRL_PRECISION_W8A8_INT8, 0.05);
}

/* w4a16-nvfp4: the same codes and scales on both sides; the GPU's GEMM inputs are BF16
 * (the CPU's F32) and its sums F32 in another order. */
Test(cuda_scheduler, greedy_w4a16_nvfp4_equals_cpu_scheduler) {
    require_gpu();
    greedy_case(QRL_PRECISION_W4A16_NVFP4, 0.05);
}

Test(cuda_scheduler, greedy_w8a8_fp8_equals_cpu_scheduler) {
    require_gpu();
    greedy_case(QRL_PRECISION_W8A8_FP8, 0.05);
}

/* ---- sync boundary on the GPU ------------------------------------------------------ */

Test(cuda_scheduler, swap_weights_reprefills_under_new_weights) {
    require_gpu();
    qrl_model *a = st_load_model(), *b = st_load_model();
    qrl_tokenizer *tok = st_load_tok();
    st_perturb(b, 0.25);
    qrl_model_round_bf16(a);
    qrl_model_round_bf16(b);
    prompts pr;
    for (int g = 0; g < 2; g++) pr.ids[g] = st_encode(tok, TEXTS[g], &pr.n[g]);
    qrl_scheduler_config cfg = gpu_cfg(QRL_KV_FORMAT_BF16);
    st_collect col;
    memset(&col, 0, sizeof col);
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(a, tok, &cfg, st_on_group, &col, &s, &err), QRL_OK, "%s",
                 err.msg);
    for (int g = 0; g < 2; g++) {
        qrl_scheduler_group_desc d = {.group_id = 300 + g, .group_size = 2, .prompt = pr.ids[g],
                                      .n_prompt = pr.n[g], .max_new_tokens = 60};
        d.sampling = (qrl_sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = 1234};
        cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_OK, "%s", err.msg);
    }
    st_step(s, 20);
    cr_assert_eq(qrl_scheduler_swap_weights(s, b, 0, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_scheduler_swap_weights(s, b, 1, &err), QRL_OK, "%s", err.msg);
    st_run(s);
    assert_no_leak(s);
    qrl_scheduler_free(s);
    cr_assert_eq(col.n, 2);
    diff_stats d0 = {0}, d1 = {0};
    double moved = 0;
    int n_moved = 0;
    double *lp_a = malloc(60 * sizeof(double));
    for (int g = 0; g < 2; g++) {
        st_group *sg = st_find(&col, 300 + g);
        for (int j = 0; j < 2; j++) {
            st_resp *r = &sg->r[j];
            char label[96];
            snprintf(label, sizeof label, "swap group %d response %d", g, j);
            cr_assert_eq(r->n, 60, "%s", label);
            cr_assert_eq(r->reprefills, 1, "%s", label);
            cr_assert_eq(r->restarts, 0, "%s", label);
            int k0 = 0;
            for (int i = 0; i < r->n; i++) {
                cr_assert(r->ver[i] <= 1 && (i == 0 || r->ver[i] >= r->ver[i - 1]), "%s", label);
                k0 += r->ver[i] == 0;
            }
            cr_assert(k0 > 0 && k0 < r->n, "%s: %d of %d tokens at version 0", label, k0, r->n);
            check_resp(label, a, QRL_KV_FORMAT_BF16, TOL[0], pr.ids[g], pr.n[g], r, 1.0f, 0, &d0,
                       lp_a);
            check_resp(label, b, QRL_KV_FORMAT_BF16, TOL[0], pr.ids[g], pr.n[g], r, 1.0f, 1, &d1,
                       NULL);
            for (int i = k0; i < r->n; i++) moved += fabs(r->lpf[i] - lp_a[i]), n_moved++;
        }
    }
    double mean1 = d1.sum / d1.n, mean_moved = moved / n_moved;
    fprintf(stderr, "swap stories260K kv=bf16: version-0 tokens %d |gpu - cpu(old)| max %.3e mean "
            "%.3e; version-1 tokens %d |gpu - cpu(new)| max %.3e mean %.3e; |lp - cpu(old)| of "
            "version-1 tokens mean %.3e\n", d0.n, d0.max, d0.sum / d0.n, d1.n, d1.max, mean1,
            mean_moved);
    cr_assert(mean_moved > 3 * mean1, "new weights not told apart: %g vs %g", mean_moved, mean1);
    free(lp_a);
    st_collect_free(&col);
    for (int g = 0; g < 2; g++) free(pr.ids[g]);
    qrl_tokenizer_free(tok);
    qrl_model_free(a);
    qrl_model_free(b);
}

/* ---- device sampling vs host sampling ------------------------------------------------ */

static void run_sampling(qrl_model *m, const qrl_tokenizer *tok, const prompts *pr,
                         qrl_sampling_params sp, bool host, st_collect *col) {
    qrl_scheduler_config cfg = gpu_cfg(QRL_KV_FORMAT_BF16);
    cfg.host_sampling = host;
    qrl_scheduler *s = NULL;
    qrl_error err;
    cr_assert_eq(qrl_scheduler_new(m, tok, &cfg, st_on_group, col, &s, &err), QRL_OK, "%s",
                 err.msg);
    for (int g = 0; g < N_GROUPS; g++) {
        qrl_scheduler_group_desc d = {.group_id = 400 + g, .group_size = G, .prompt = pr->ids[g],
                                      .n_prompt = pr->n[g], .max_new_tokens = MAX_NEW,
                                      .sampling = sp};
        cr_assert_eq(qrl_scheduler_submit(s, &d, &err), QRL_OK, "%s", err.msg);
    }
    st_run(s);
    assert_no_leak(s);
    qrl_scheduler_free(s);
}

Test(cuda_scheduler, device_sampling_equals_host_sampling) {
    require_gpu();
    qrl_model *m = st_load_model();
    qrl_tokenizer *tok = st_load_tok();
    qrl_model_round_bf16(m);
    prompts pr;
    for (int g = 0; g < N_GROUPS; g++) pr.ids[g] = st_encode(tok, TEXTS[g], &pr.n[g]);
    const qrl_sampling_params sps[3] = {
        {.temperature = 0.0f, .top_p = 1.0f, .seed = 5},
        {.temperature = 1.0f, .top_p = 1.0f, .seed = 99},
        {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 7}};
    const char *names[3] = {"greedy", "T=1", "T=0.8 k=40 p=0.9"};
    for (int c = 0; c < 3; c++) {
        st_collect host, dev;
        memset(&host, 0, sizeof host);
        memset(&dev, 0, sizeof dev);
        run_sampling(m, tok, &pr, sps[c], true, &host);
        run_sampling(m, tok, &pr, sps[c], false, &dev);
        int n = 0, trunc = 0;
        double worst = 0;
        for (int g = 0; g < N_GROUPS; g++)
            for (int j = 0; j < G; j++) {
                st_resp *h = &st_find(&host, 400 + g)->r[j], *d = &st_find(&dev, 400 + g)->r[j];
                cr_assert_eq(d->n, h->n, "%s group %d response %d: %d vs %d tokens", names[c], g,
                             j, d->n, h->n);
                cr_assert_eq(d->finish, h->finish);
                cr_assert_eq(d->truncated, h->truncated, "%s: truncated tokens", names[c]);
                for (int i = 0; i < h->n; i++) {
                    cr_assert_eq(d->tok[i], h->tok[i], "%s group %d response %d token %d: "
                                 "device %d, host %d", names[c], g, j, i, d->tok[i], h->tok[i]);
                    double e = fmax(fabs(d->lp[i] - h->lp[i]), fabs(d->lpf[i] - h->lpf[i]));
                    cr_assert(e <= 1e-4, "%s group %d response %d token %d: log-prob %g/%g vs "
                              "%g/%g", names[c], g, j, i, d->lp[i], d->lpf[i], h->lp[i], h->lpf[i]);
                    worst = fmax(worst, e);
                }
                n += h->n;
                trunc += (int)h->truncated;
            }
        fprintf(stderr, "scheduler %s: %d tokens (%d truncated) sampled on the device equal the "
                "host-sampled run's; max |dlogprob| %.2e\n", names[c], n, trunc, worst);
        st_collect_free(&host);
        st_collect_free(&dev);
    }
    for (int g = 0; g < N_GROUPS; g++) free(pr.ids[g]);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* The fp4 KV cache runs on the GPU (formerly refused): greedy decoding through the
 * scheduler with kv fp4 on both engines; every group decodes, log-probs finite, and over
 * the tokens both agree on the GPU's greedy log-probs are within 0.5 nats of the CPU's
 * (the forward itself against the CPU: test_cuda_forward_kv.c, TOL_STORIES_FP4). */
Test(cuda_scheduler, fp4_kv_greedy) {
    require_gpu();
    qrl_model *m = st_load_model();
    qrl_tokenizer *tok = st_load_tok();
    qrl_model_round_bf16(m);
    qrl_error err;
    qrl_scheduler_config cfg = gpu_cfg(QRL_KV_FORMAT_FP4);
    cr_assert_eq(qrl_scheduler_check_device(&cfg, m->precision, &err), QRL_OK, "%s", err.msg);
    prompts pr;
    for (int g = 0; g < N_GROUPS; g++) pr.ids[g] = st_encode(tok, TEXTS[g], &pr.n[g]);
    st_collect cpu, gpu;
    memset(&cpu, 0, sizeof cpu);
    memset(&gpu, 0, sizeof gpu);
    run_greedy_kv(m, tok, &pr, -1, QRL_KV_FORMAT_FP4, &cpu);
    run_greedy_kv(m, tok, &pr, 0, QRL_KV_FORMAT_FP4, &gpu);
    int same = 0;
    double worst = 0;
    for (int g = 0; g < N_GROUPS; g++) {
        st_resp *c = &st_find(&cpu, 200 + g)->r[0], *q = &st_find(&gpu, 200 + g)->r[0];
        cr_assert(q->n > 0, "group %d: no tokens on the GPU", g);
        for (int i = 0; i < q->n; i++) cr_assert(isfinite(q->lpf[i]), "group %d token %d: log-prob %g", g, i, q->lpf[i]);
        for (int i = 0; i < c->n && i < q->n && q->tok[i] == c->tok[i]; i++, same++)
            worst = fmax(worst, fabs((double)q->lpf[i] - c->lpf[i]));
    }
    fprintf(stderr, "scheduler kv fp4: %d greedy tokens agree with the CPU scheduler's, max |dlogprob| %.3e\n",
            same, worst);
    /* 0.5 nats: stories260K's head_dim 8 with fp4 K/V (measured 0.309 on an H100) */
    cr_assert(same > 0 && worst <= 0.5, "kv fp4: %d common tokens, max |dlogprob| %g", same, worst);
    st_collect_free(&cpu);
    st_collect_free(&gpu);
    for (int g = 0; g < N_GROUPS; g++) free(pr.ids[g]);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
}
