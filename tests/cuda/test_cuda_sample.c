/* The device sampler (kernels/cuda/sample.cuh) against the CPU sampler qrl_sampler_sample.
 *
 *   - Philox-4x32-10 and the 53-bit uniform: device == CPU bit for bit (Random123's known
 *     answers and 65536 random counters/keys, high group bits included);
 *   - fresh random logits (tests/cuda/sample_cases.h: spread, peaked, tie grids with -0/+0,
 *     a quarter -inf, three finite logits, near-flat), V in {7, 1000, 151936}, T in {0
 *     (greedy), 0.5, 1, 1.5}, top_k in {0, 1, 20, V}, top_p in {1, 0.9, 0.5}, each row its
 *     own key: the device token equals the CPU's for >= 99.9% of the draws, and every
 *     mismatch is a draw within 1e-6 of a cumulative boundary of the CPU walk, recomputed
 *     in double by sc_boundary_dist; logprob and logprob_truncated within 1e-4 and the
 *     truncated flag equal, except logprob_truncated on rows whose top-p cut lies within
 *     1e-6 of p (a tie group whose mass reaches p exactly: the two summation orders may
 *     keep one token more or less); the counts are printed;
 *   - edge cases: top_p 1e-30, T = 0.01 (weights underflow), one finite logit with top-k
 *     past it, and refusals: a NaN or +inf logit and all -inf give the CPU's message;
 *   - launcher argument errors;
 *   - qrl_cuda_forward_decode_sample on stories260K: the same tokens as the host-logits
 *     decode + qrl_sampler_sample, and bad params refused before anything runs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sample.cuh"
#include "cuda_test_util.h"
#include "model/forward_cuda.h"
#include "model/sampler.h"
#include "sample_cases.h"
#include "unit/sched_test_util.h"

#define BOUNDARY 1e-6
#define LP_TOL 1e-4

Test(cuda_sample, philox_and_uniform_bit_exact) {
    require_gpu();
    enum { N = 65536 };
    static const uint32_t kat[3][6] = {
        {0, 0, 0, 0, 0, 0},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0}};
    uint32_t *in = malloc(N * 6 * 4), *want = malloc(N * 4 * 4), *got = malloc(N * 4 * 4);
    uint64_t *keys = malloc(N * 4 * 8), s = 42;
    double *uw = malloc(N * 8), *ug = malloc(N * 8);
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 6; k++) in[6 * i + k] = i < 3 ? kat[i][k] : (uint32_t)sc_next(&s);
        qrl_philox4x32_10(in + 6 * i, in + 6 * i + 4, want + 4 * i);
        keys[4 * i] = sc_next(&s);
        keys[4 * i + 1] = i & 1 ? sc_next(&s) : sc_next(&s) & 0xffffffffu;
        keys[4 * i + 2] = (uint32_t)sc_next(&s);
        keys[4 * i + 3] = (uint32_t)sc_next(&s);
        uw[i] = qrl_sampler_uniform(keys[4 * i], keys[4 * i + 1], (uint32_t)keys[4 * i + 2],
                                    (uint32_t)keys[4 * i + 3]);
    }
    cr_assert_eq(want[0], 0x6627e8d5u); /* the CPU side is Random123's */
    void *din = dev_from(in, N * 6 * 4), *dkeys = dev_from(keys, N * 4 * 8);
    guarded go = guarded_new(N * 4, 4), gu = guarded_new(N * 2, 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_philox4x32_10(din, guarded_ptr(go), N, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_sample_uniform(dkeys, guarded_ptr(gu), N, NULL, &err), QRL_OK, "%s", err.msg);
    guarded_fetch(go, got, "philox");
    guarded_fetch(gu, ug, "uniform");
    for (int i = 0; i < N; i++) {
        cr_assert(memcmp(got + 4 * i, want + 4 * i, 16) == 0, "philox %d: %08x vs %08x", i,
                  got[4 * i], want[4 * i]);
        cr_assert(memcmp(&ug[i], &uw[i], 8) == 0, "uniform %d: %.17g vs %.17g", i, ug[i], uw[i]);
    }
    fprintf(stderr, "philox: %d blocks and %d uniforms bit-identical to the CPU\n", N, N);
    qrl_cuda_free(din);
    qrl_cuda_free(dkeys);
    free(in), free(want), free(got), free(keys), free(uw), free(ug);
}

typedef struct tally {
    int draws, mismatches, topp_cut, refused;
    double worst_lp;
} tally;

/* Sample rows x [n, V] with params sp[r] and key (group[r], r, pos = 1000 + r) on the device
 * and the CPU, and compare them (file comment). */
static void compare_rows(const float *x, int n, int V, const qrl_sampling_params *sp,
                         const uint64_t *group, const char *label, tally *t) {
    qrl_cuda_sample_req *req = calloc((size_t)n, sizeof *req);
    for (int r = 0; r < n; r++)
        req[r] = (qrl_cuda_sample_req){.seed = sp[r].seed, .group = group[r], .response = (uint32_t)r,
                                       .position = 1000u + (uint32_t)r,
                                       .temperature = sp[r].temperature, .top_k = sp[r].top_k,
                                       .top_p = sp[r].top_p};
    void *dx = dev_from(x, (size_t)n * V * 4), *dreq = dev_from(req, (size_t)n * sizeof *req);
    size_t words = sizeof(qrl_cuda_sample_out) / 4;
    guarded go = guarded_new((size_t)n * words, 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_sample(dx, n, V, dreq, guarded_ptr(go), NULL, &err), QRL_OK, "%s", err.msg);
    qrl_cuda_sample_out *got = malloc((size_t)n * sizeof *got);
    guarded_fetch(go, got, label);
    qrl_cuda_free(dx);
    qrl_cuda_free(dreq);

    qrl_sample *want = calloc((size_t)n, sizeof *want);
    qrl_status *st = calloc((size_t)n, sizeof *st);
    char(*msg)[96] = calloc((size_t)n, sizeof *msg);
#pragma omp parallel
    {
        qrl_sampler *s = NULL;
        qrl_error e;
        QRL_CHECK(qrl_sampler_new(V, &s, &e) == QRL_OK);
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < n; r++) {
            st[r] = qrl_sampler_sample(s, x + (size_t)r * V, &sp[r], group[r], (uint32_t)r,
                                       1000u + (uint32_t)r, &want[r], &e);
            if (st[r] != QRL_OK) snprintf(msg[r], sizeof msg[r], "%.90s", e.msg);
        }
        qrl_sampler_free(s);
    }
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * V;
        const qrl_cuda_sample_out *o = &got[r];
        qrl_error ge;
        qrl_status gs = qrl_cuda_sample_check(o, &ge);
        t->draws++;
        if (st[r] != QRL_OK || gs != QRL_OK) {
            cr_assert(st[r] != QRL_OK && gs == st[r] && strcmp(ge.msg, msg[r]) == 0,
                      "%s row %d: cpu %s '%s', device %s '%s'", label, r, qrl_status_name(st[r]),
                      msg[r], qrl_status_name(gs), gs != QRL_OK ? ge.msg : "");
            t->refused++;
            continue;
        }
        double u = qrl_sampler_uniform(sp[r].seed, group[r], (uint32_t)r, 1000u + (uint32_t)r);
        if (o->token != want[r].token) {
            double d = sc_boundary_dist(xr, V, &sp[r], u, want[r].token, o->token);
            cr_assert(d <= BOUNDARY, "%s row %d (T=%g k=%d p=%g): token cpu %d device %d, draw "
                      "%.3g from the nearest boundary", label, r, sp[r].temperature, sp[r].top_k,
                      sp[r].top_p, want[r].token, o->token, d);
            t->mismatches++;
            continue;
        }
        cr_assert_eq(o->truncated, (int)want[r].truncated, "%s row %d: truncated", label, r);
        cr_assert(fabs(o->logprob - want[r].logprob) <= LP_TOL, "%s row %d: logprob %g vs %g",
                  label, r, o->logprob, want[r].logprob);
        double dt = fabs(o->logprob_truncated - want[r].logprob_truncated);
        if (dt > LP_TOL) {
            double d = sc_boundary_dist(xr, V, &sp[r], u, o->token, o->token);
            cr_assert(d <= BOUNDARY, "%s row %d (T=%g k=%d p=%g): logprob_truncated %g vs %g",
                      label, r, sp[r].temperature, sp[r].top_k, sp[r].top_p,
                      o->logprob_truncated, want[r].logprob_truncated);
            t->topp_cut++;
            continue;
        }
        t->worst_lp = fmax(t->worst_lp, fmax(dt, fabs(o->logprob - want[r].logprob)));
    }
    free(req), free(got), free(want), free(st), free(msg);
}

Test(cuda_sample, matches_cpu_sampler) {
    require_gpu();
    const int Vs[3] = {7, 1000, 151936}, rows_per[3] = {256, 128, 8};
    tally all = {0};
    for (int vi = 0; vi < 3; vi++) {
        int V = Vs[vi], n = SC_GRID * rows_per[vi];
        float *x = malloc((size_t)n * V * 4);
        qrl_sampling_params *sp = malloc((size_t)n * sizeof *sp);
        uint64_t *group = malloc((size_t)n * 8);
        for (int r = 0; r < n; r++)
            sc_grid_row(V, rows_per[vi], r, x + (size_t)r * V, &sp[r], &group[r]);
        tally t = {0};
        char label[32];
        snprintf(label, sizeof label, "V=%d", V);
        compare_rows(x, n, V, sp, group, label, &t);
        fprintf(stderr, "sampler V=%d: %d draws, %d tokens differ (each within %g of a "
                "boundary), %d top-p cuts one token apart, max |dlogprob| %.2e\n", V, t.draws,
                t.mismatches, BOUNDARY, t.topp_cut, t.worst_lp);
        all.draws += t.draws, all.mismatches += t.mismatches, all.topp_cut += t.topp_cut;
        all.worst_lp = fmax(all.worst_lp, t.worst_lp);
        free(x), free(sp), free(group);
    }
    fprintf(stderr, "sampler: %d of %d device tokens equal the CPU's (%.4f%%)\n",
            all.draws - all.mismatches, all.draws,
            100.0 * (all.draws - all.mismatches) / all.draws);
    cr_assert_geq(all.draws - all.mismatches, 0.999 * all.draws);
}

Test(cuda_sample, edge_cases_and_refusals) {
    require_gpu();
    enum { V = 300, N = 9 };
    float *x = malloc((size_t)N * V * 4);
    qrl_sampling_params sp[N];
    uint64_t group[N];
    for (int r = 0; r < N; r++) sc_fill(x + (size_t)r * V, V, 1, 100 + r), group[r] = 5 + r;
    sp[0] = (qrl_sampling_params){1.0f, 0, 1e-30f, 1};   /* keeps only the top token */
    sp[1] = (qrl_sampling_params){0.01f, 0, 1.0f, 2};    /* most weights underflow to 0 */
    sp[2] = (qrl_sampling_params){0.01f, 50, 0.95f, 3};
    for (int r = 3; r < N; r++) sp[r] = (qrl_sampling_params){1.0f, 3, 0.9f, 10u + r};
    float *r3 = x + 3 * V, *r4 = x + 4 * V, *r5 = x + 5 * V, *r6 = x + 6 * V, *r7 = x + 7 * V;
    r3[17] = NAN, r3[40] = INFINITY;                        /* the first bad index: NaN */
    r4[40] = INFINITY, r4[41] = NAN;                        /* +inf */
    for (int i = 0; i < V; i++) r5[i] = r6[i] = r7[i] = -INFINITY;
    r6[V - 1] = 0.5f;                                       /* one finite: top-k past it */
    r7[0] = 2.0f, r7[V - 1] = 2.0f;                          /* two tied finite */
    sp[8].temperature = 0.0f;                               /* greedy, spread row */
    tally t = {0};
    compare_rows(x, N, V, sp, group, "edge", &t);
    cr_assert_eq(t.refused, 3, "refused %d rows", t.refused);
    cr_assert_eq(t.mismatches, 0);
    /* the messages themselves */
    qrl_cuda_sample_out o = {.fail = QRL_CUDA_SAMPLE_NAN, .fail_index = 17};
    qrl_error err;
    cr_assert_eq(qrl_cuda_sample_check(&o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "sampling: logits[17] is NaN");
    o.fail = QRL_CUDA_SAMPLE_ALL_NEGINF;
    cr_assert_eq(qrl_cuda_sample_check(&o, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "sampling: all logits are -inf");
    free(x);
}

Test(cuda_sample, launcher_argument_errors) {
    require_gpu();
    qrl_error err;
    cr_assert_eq(qrl_cuda_sample(NULL, 0, 10, NULL, NULL, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_sample(NULL, 1, QRL_CUDA_SAMPLE_MAX_VOCAB + 1, NULL, NULL, NULL, &err),
                 QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "vocab"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_philox4x32_10(NULL, NULL, 0, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
}

/* ---- the forward entry point ---------------------------------------------------------- */

/* Two sequences with the same prompt, decoded one row per call (the same GEMM shapes, so
 * the same logits): A through the host logits and qrl_sampler_sample, B through
 * qrl_cuda_forward_decode_sample with A's key; each is fed its own token. */
static int forward_pair(const qrl_sampling_params *p, int steps) {
    qrl_model *m = st_load_model();
    int V = m->cfg.vocab_size, same = 0;
    qrl_cuda_forward_desc d = {.max_rows = 4, .max_ctx = 128, .block_size = 16, .n_blocks = 32,
                               .max_seqs = 2};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    qrl_sampler *smp;
    cr_assert_eq(qrl_sampler_new(V, &smp, &err), QRL_OK);
    int32_t prompt[5] = {1, 20, 30, 40, 50};
    float *logits = malloc((size_t)V * 4);
    int sa, sb;
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &sa, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &sb, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, sa, prompt, 4, NULL, false, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_prefill(f, sb, prompt, 4, NULL, false, &err), QRL_OK, "%s", err.msg);
    int32_t ta = prompt[4], tb = prompt[4];
    for (int i = 0; i < steps; i++) {
        uint32_t pos = 5u + (uint32_t)i;
        qrl_sample a, b;
        qrl_error rerr;
        cr_assert_eq(qrl_cuda_forward_decode(f, &sa, &ta, 1, logits, NULL, NULL, &err), QRL_OK,
                     "%s", err.msg);
        cr_assert_eq(qrl_sampler_sample(smp, logits, p, 77, 3, pos, &a, &err), QRL_OK, "%s", err.msg);
        qrl_sample_draw dr = {.params = *p, .group = 77, .response = 3, .position = pos};
        cr_assert_eq(qrl_cuda_forward_decode_sample(f, &sb, &tb, 1, &dr, &b, &rerr, &err), QRL_OK,
                     "%s", err.msg);
        cr_assert_eq(rerr.status, QRL_OK, "%s", rerr.msg);
        cr_assert_eq(b.token, a.token, "step %d: device %d, host %d", i, b.token, a.token);
        cr_assert(fabsf(b.logprob - a.logprob) <= LP_TOL && b.truncated == a.truncated &&
                  fabsf(b.logprob_truncated - a.logprob_truncated) <= LP_TOL,
                  "step %d: logprob %g/%g vs %g/%g", i, b.logprob, b.logprob_truncated,
                  a.logprob, a.logprob_truncated);
        ta = a.token, tb = b.token;
        same++;
    }
    /* bad params: refused before the step runs (the length does not move) */
    int len = qrl_cuda_forward_seq_len(f, sb);
    qrl_sample_draw bad[2] = {{.params = *p}, {.params = *p}};
    bad[1].params.top_p = 0.0f;
    qrl_sample out[2];
    qrl_error rerr[2];
    int seqs[2] = {sa, sb};
    int32_t toks[2] = {ta, tb};
    cr_assert_eq(qrl_cuda_forward_decode_sample(f, seqs, toks, 2, bad, out, rerr, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "batch row 1") && strstr(err.msg, "top_p"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_seq_len(f, sb), len);
    free(logits);
    qrl_sampler_free(smp);
    qrl_cuda_forward_free(f);
    qrl_model_free(m);
    return same;
}

Test(cuda_sample, forward_decode_sample_equals_host_sampling) {
    require_gpu();
    qrl_sampling_params greedy = {0.0f, 0, 1.0f, 1}, plain = {1.0f, 0, 1.0f, 2},
                        cut = {0.8f, 40, 0.9f, 3};
    int n = forward_pair(&greedy, 24) + forward_pair(&plain, 24) + forward_pair(&cut, 24);
    fprintf(stderr, "forward decode_sample: %d steps (greedy, T=1, T=0.8 k=40 p=0.9) equal to "
            "the host-logits decode + CPU sampler\n", n);
}
