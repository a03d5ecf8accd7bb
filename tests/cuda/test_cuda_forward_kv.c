/* CUDA forward pass with each KV format (bf16, int8, fp8, int4, int4-protected, fp4) against the
 * CPU path with the same format, and decode vs prefill re-scoring on the GPU.
 *
 * Both sides run the model with BF16-rounded weights; the CPU stores its F32 K/V through
 * the format's encoders, the GPU its K/V (from BF16 GEMM inputs) through the same encoders
 * bit for bit, so the differences are the BF16 activations, moved to the other side of a
 * rounding boundary of the format now and then (one quantization step of that element).
 * Rules per logits row (as test_cuda_forward.c), eps_row = TOL[format] * max_i |cpu_i|:
 *   max_i |gpu_i - cpu_i| <= eps_row; the greedy token equals the CPU argmax where the CPU
 *   margin > 2 eps_row; the greedy log-prob is within 2 eps_row.
 * Stated bounds TOL: bf16 0.03 (test_cuda_forward.c), int8 0.08, fp8 0.25, int4 0.40,
 * fp4 0.40 (the other 4-bit format's; a flipped E2M1 code moves an element by up to a
 * third of its value), int4-protected 0.25 (a flipped 4-bit code moves an element by 1/15 of its group range,
 * a flipped E4M3 code by 1/8 of its value; stories260K's head_dim 8 makes each flip
 * count: measured 0.36 for int4, 0.18 for fp8, 0.05 for int8 there).
 * The greedy-token check needs a CPU margin > 2 eps_row, which the int4 bounds leave to
 * almost no position: asserted to have run for the bounds < 0.1 only.
 * Both sides prefill in passes of 16 rows and every GPU sequence's first pass has 16
 * rows, so fp8 calibrates its head scales on the same rows on both sides.
 * int4-protected runs with sink 4, recent 16 so the INT4 region is most of the context.
 *
 * Decode vs prefill: prefill a prompt, greedy-decode STEPS tokens keeping each step's
 * log-prob, prefill prompt + tokens into a fresh sequence with all logits, and compare
 * the log-prob of each decoded token under both (printed: max and mean |diff| per
 * format; bound: max <= RESCORE_MAX nats, mean <= RESCORE_MEAN). */
#include <jansson.h>

#include "cuda_cpu_ref.h"
#include "cuda_test_util.h"
#include "forward_run.h"
#include "model/forward.h"
#include "model/forward_cuda.h"
#include "support/test_files.h"

#define N_FMT 6
static const qrl_kv_format FMTS[N_FMT] = {QRL_KV_FORMAT_BF16, QRL_KV_FORMAT_INT8, QRL_KV_FORMAT_FP8,
                                          QRL_KV_FORMAT_INT4, QRL_KV_FORMAT_INT4_PROTECTED,
                                          QRL_KV_FORMAT_FP4};
static const double TOL[N_FMT] = {0.03, 0.08, 0.25, 0.40, 0.25, 0.40};
#define SINK 4
#define RECENT 16
#define STEPS 48
#define RESCORE_MAX 0.25
#define RESCORE_MEAN 0.02

typedef struct stats { double worst; int checked, skipped, over; } stats;

static void top2(const float *x, int n, int *best, float *margin) {
    int b = qrl_cpu_argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++) if (i != b && x[i] > second) second = x[i];
    *best = b;
    *margin = x[b] - second;
}

static double log_softmax_at(const float *x, int n, int t) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return x[t] - mx - log(s);
}

static void check_row(const char *name, int pos, const float *gpu, const float *cpu, int V, double tol,
                      const int32_t *tok, const float *lp, stats *st) {
    double mx = 0, md = 0;
    for (int i = 0; i < V; i++) {
        mx = fmax(mx, fabs(cpu[i]));
        double d = fabs((double)gpu[i] - cpu[i]);
        cr_assert(!isnan(d), "%s pos %d: NaN logit at %d", name, pos, i);
        md = fmax(md, d);
    }
    double eps = tol * mx;
    st->worst = fmax(st->worst, md / mx);
    if (md > eps) { /* asserted once every format has printed its worst */
        st->over++;
        return;
    }
    if (!tok) return;
    int best;
    float margin;
    top2(cpu, V, &best, &margin);
    if (margin > 2 * eps) {
        cr_assert_eq(*tok, best, "%s pos %d: gpu token %d, cpu %d (margin %g)", name, pos, *tok, best, margin);
        st->checked++;
    } else {
        st->skipped++;
    }
    double want = log_softmax_at(cpu, V, *tok);
    cr_assert(fabs(*lp - want) <= 2 * eps, "%s pos %d: logprob %g, cpu %g", name, pos, *lp, want);
}

static qrl_cuda_forward *engine(const qrl_model *m, qrl_kv_format fmt, int max_ctx, int bs) {
    qrl_cuda_forward_desc d = {.max_rows = 16, .max_ctx = max_ctx, .block_size = bs,
                               .n_blocks = 3 * (max_ctx / bs + 2), .max_seqs = 4, .kv_format = fmt,
                               .protected_sink = SINK, .protected_recent = RECENT};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_kv_format(f), fmt);
    return f;
}

/* Teacher-forced: three sequences prefilled to different lengths (chunks of 16 rows), then
 * decoded together until each reaches n. */
static stats check_model(qrl_model *m, const char *name, const int32_t *ids, int n, int bs, int fi) {
    int V = m->cfg.vocab_size;
    float *cpu = malloc((size_t)n * V * 4), *gl = malloc((size_t)3 * V * 4), *pl = malloc((size_t)n * V * 4);
    cpu_logits_all(m, FMTS[fi], SINK, RECENT, ids, n, cpu);
    qrl_cuda_forward *f = engine(m, FMTS[fi], n, bs);
    qrl_error err;
    int seq[3], len[3] = {n / 2, n / 3, 16};
    stats st = {0};
    char label[128];
    snprintf(label, sizeof label, "%s kv=%s", name, qrl_kv_format_name(FMTS[fi]));
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(qrl_cuda_forward_seq_new(f, &seq[j], &err), QRL_OK);
        cr_assert_eq(qrl_cuda_forward_prefill(f, seq[j], ids, len[j], pl, true, &err), QRL_OK, "%s", err.msg);
        for (int p = 0; p < len[j]; p++)
            check_row(label, p, pl + (size_t)p * V, cpu + (size_t)p * V, V, TOL[fi], NULL, NULL, &st);
    }
    for (;;) {
        int bseq[3], rows = 0, pos[3];
        int32_t btok[3], gt[3];
        float glp[3];
        for (int j = 0; j < 3; j++)
            if (len[j] < n) bseq[rows] = seq[j], pos[rows] = len[j], btok[rows++] = ids[len[j]];
        if (rows == 0) break;
        cr_assert_eq(qrl_cuda_forward_decode(f, bseq, btok, rows, gl, gt, glp, &err), QRL_OK, "%s", err.msg);
        for (int r = 0; r < rows; r++)
            check_row(label, pos[r], gl + (size_t)r * V, cpu + (size_t)pos[r] * V, V, TOL[fi], &gt[r], &glp[r], &st);
        for (int j = 0; j < 3; j++) if (len[j] < n) len[j]++;
    }
    fprintf(stderr, "%s: n=%d worst max|diff|/max|cpu| = %.3e (bound %.2f, %d rows over); greedy tokens "
            "checked %d, skipped (margin <= 2 eps) %d\n", label, n, st.worst, TOL[fi], st.over, st.checked,
            st.skipped);
    qrl_cuda_forward_free(f);
    free(cpu); free(gl); free(pl);
    return st;
}

/* stories260K (head_dim 8: one partial 16-block per fp4 vector) with the fp4 KV cache:
 * 0.8.  bench/fp4_sensitivity shows the CPU engine alone moving its fp4-KV logits by 0.26
 * of max |logit| (int4: 0.15) when only the token embedding is perturbed by 2^-8; the GPU's
 * BF16 rounding perturbs every layer's K/V, measured 0.686 on an H100 (int4 0.36 against
 * its 0.40).  random-hd128 keeps 0.40 (measured 0.080). */
#define TOL_STORIES_FP4 0.8

static void assert_stats(const char *name, const stats *st) {
    for (int fi = 0; fi < N_FMT; fi++) {
        double tol = FMTS[fi] == QRL_KV_FORMAT_FP4 && strcmp(name, "stories260K") == 0
                         ? TOL_STORIES_FP4 : TOL[fi];
        cr_assert(st[fi].worst <= tol, "%s kv=%s: worst max|diff|/max|cpu| %g > %g", name,
                  qrl_kv_format_name(FMTS[fi]), st[fi].worst, tol);
        cr_assert(TOL[fi] >= 0.1 || st[fi].checked > 0, "%s kv=%s: no position had a margin above the budget",
                  name, qrl_kv_format_name(FMTS[fi]));
    }
}

/* Decode STEPS greedy tokens after the prompt, then re-score prompt + tokens by prefill. */
static void rescore(qrl_model *m, const char *name, const int32_t *prompt, int np, int fi) {
    int V = m->cfg.vocab_size, n = np + STEPS;
    qrl_cuda_forward *f = engine(m, FMTS[fi], n + 1, 16);
    qrl_error err;
    int a, b;
    float *lg = malloc((size_t)V * 4), *all = malloc((size_t)n * V * 4), lp[STEPS];
    int32_t *ids = malloc((size_t)n * 4);
    memcpy(ids, prompt, (size_t)np * 4);
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &a, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, a, prompt, np, lg, false, &err), QRL_OK, "%s", err.msg);
    ids[np] = qrl_cpu_argmax(lg, V);
    for (int t = 0; t + 1 < STEPS; t++) /* token np + t in, token np + t + 1 out */
        cr_assert_eq(qrl_cuda_forward_decode(f, &a, &ids[np + t], 1, NULL, &ids[np + t + 1], &lp[t + 1], &err),
                     QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_seq_new(f, &b, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, b, ids, n, all, true, &err), QRL_OK, "%s", err.msg);
    double mx = 0, sum = 0;
    int at = 0, over_1e4 = 0;
    for (int t = 1; t < STEPS; t++) {
        double want = log_softmax_at(all + (size_t)(np + t - 1) * V, V, ids[np + t]);
        double dd = fabs(lp[t] - want);
        cr_assert(!isnan(dd), "%s: NaN log-prob at step %d", name, t);
        if (dd > mx) mx = dd, at = t;
        over_1e4 += dd > 1e-4;
        sum += dd;
    }
    double mean = sum / (STEPS - 1);
    fprintf(stderr, "rescore %s kv=%s: %d decoded tokens after a %d-token prompt, |decode - prefill| "
            "log-prob max %.3e (step %d) mean %.3e, %d steps > 1e-4 (bound max %.2f mean %.2f)\n", name,
            qrl_kv_format_name(FMTS[fi]), STEPS - 1, np, mx, at, mean, over_1e4, RESCORE_MAX, RESCORE_MEAN);
    cr_assert(mx <= RESCORE_MAX && mean <= RESCORE_MEAN, "%s kv=%s: rescore max %g mean %g", name,
              qrl_kv_format_name(FMTS[fi]), mx, mean);
    qrl_cuda_forward_free(f);
    free(lg); free(all); free(ids);
}

static int32_t *json_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)*n * 4);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

/* stories260K (head_dim 8: the CUDA-core attention path); NULL when absent. */
static qrl_model *stories(int32_t **ids, int *n, int *np) {
    char bin[1024], ref[1024];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin) ||
        !qrl_test_data_path("llama2c_stories260K/greedy_reference.json", ref, sizeof ref))
        return NULL;
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    json_error_t je;
    json_t *root = json_load_file(ref, 0, &je);
    cr_assert_not_null(root, "%s", je.text);
    json_t *c0 = json_array_get(json_object_get(root, "cases"), 0);
    int ng;
    int32_t *prompt = json_ids(json_object_get(c0, "prompt_token_ids"), np);
    int32_t *gen = json_ids(json_object_get(c0, "generated_token_ids"), &ng);
    *n = *np + ng;
    *ids = malloc((size_t)*n * 4);
    memcpy(*ids, prompt, (size_t)*np * 4);
    memcpy(*ids + *np, gen, (size_t)ng * 4);
    free(prompt); free(gen);
    json_decref(root);
    return m;
}

Test(cuda_forward_kv, stories260k_each_format) {
    require_gpu();
    int32_t *ids;
    int n, np;
    qrl_model *m = stories(&ids, &n, &np);
    if (!m) cr_skip_test("no stories260K under the data folder");
    stats st[N_FMT];
    for (int fi = 0; fi < N_FMT; fi++) st[fi] = check_model(m, "stories260K", ids, n, 16, fi);
    assert_stats("stories260K", st);
    free(ids);
    qrl_model_free(m);
}

Test(cuda_forward_kv, random_hd128_each_format) {
    require_gpu();
    qrl_model *m = ref_model_hd128(77, 512);
    int n = 200;
    int32_t *ids = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    stats st[N_FMT];
    for (int fi = 0; fi < N_FMT; fi++) st[fi] = check_model(m, "random-hd128", ids, n, 5, fi);
    assert_stats("random-hd128", st);
    free(ids);
    qrl_model_free(m);
}

Test(cuda_forward_kv, decode_vs_prefill_rescore) {
    require_gpu();
    int32_t *ids;
    int n, np;
    qrl_model *m = stories(&ids, &n, &np);
    if (m) {
        for (int fi = 0; fi < N_FMT; fi++) rescore(m, "stories260K", ids, np, fi);
        free(ids);
        qrl_model_free(m);
    }
    m = ref_model_hd128(77, 512);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    for (int fi = 0; fi < N_FMT; fi++) rescore(m, "random-hd128", prompt, 40, fi);
    qrl_model_free(m);
}

Test(cuda_forward_kv, errors) {
    require_gpu();
    qrl_model_config cfg = {.dim = 64, .hidden_dim = 96, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2,
                            .head_dim = 16, .vocab_size = 50, .max_seq_len = 32, .norm_eps = 1e-5f,
                            .rope = {.theta = 10000}};
    qrl_cuda_forward_desc d = {.max_rows = 4, .max_ctx = 32, .block_size = 8, .n_blocks = 4,
                               .max_seqs = 2, .kv_format = QRL_KV_FORMAT_FP4};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    /* fp4 record: 8 code bytes + 16 bytes of fields (S_enc, 1/S_enc, block scale, pad) */
    cr_assert_eq(qrl_cuda_forward_kv_bytes_per_pos(f), (size_t)2 * 2 * 24);
    qrl_cuda_forward_free(f);
    d.kv_format = QRL_KV_FORMAT_COUNT_; /* no such format */
    cr_assert_eq(qrl_cuda_forward_new(&cfg, &d, &f, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "kv format '?'"), "%s", err.msg);
    d.kv_format = QRL_KV_FORMAT_INT4_PROTECTED;
    d.protected_sink = -1;
    cr_assert_eq(qrl_cuda_forward_new(&cfg, &d, &f, &err), QRL_STATUS_OUT_OF_RANGE);
    d.protected_sink = 4;
    d.protected_recent = 8;
    cr_assert_eq(qrl_cuda_forward_new(&cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    /* bytes read over 20 positions: 12 protected at INT8 (16 + 4 B), 8 at INT4 (8 + 8 B) */
    cr_assert_eq(qrl_cuda_forward_kv_bytes_read(f, 20), (size_t)1 * 2 * 2 * (12 * 20 + 8 * 16));
    cr_assert_eq(qrl_cuda_forward_kv_bytes_per_pos(f), (size_t)2 * 2 * 16);
    qrl_cuda_forward_free(f);
}

/* ---- K/V stored by the RoPE kernel == the separate store (QRL_KV_STORE_UNFUSED=1) ----- */

#define DS_PROMPT0 100 /* 7 passes of 16 rows */
#define DS_PROMPT1 37
#define DS_STEPS 40    /* past the int4-protected ring (sink 4 + recent 16) */

/* Every logit of two prefills (all rows of sequence 0, the last of sequence 1) and
 * DS_STEPS batched decode steps of both: [(DS_PROMPT0 + 1 + 2 DS_STEPS), V], malloc'ed.
 * The decode steps read every position that the passes before stored. */
static float *store_path_logits(const qrl_model *m, qrl_kv_format fmt, int unfused) {
    if (unfused) setenv("QRL_KV_STORE_UNFUSED", "1", 1); /* read by qrl_cuda_forward_new */
    else unsetenv("QRL_KV_STORE_UNFUSED");
    int V = m->cfg.vocab_size;
    qrl_cuda_forward *f = engine(m, fmt, 256, 16);
    unsetenv("QRL_KV_STORE_UNFUSED");
    int32_t ids[DS_PROMPT0];
    for (int i = 0; i < DS_PROMPT0; i++) ids[i] = (int32_t)((i * 53 + 7) % V);
    float *lg = prefill_decode_logits(f, V, ids, DS_PROMPT0, 5, DS_PROMPT1, 50, DS_STEPS);
    qrl_cuda_forward_free(f);
    return lg;
}

Test(cuda_forward_kv, rope_store_equals_separate_store) {
    require_gpu();
    qrl_model *m = ref_model_hd128(91, 512);
    size_t n = (size_t)(DS_PROMPT0 + 1 + 2 * DS_STEPS) * m->cfg.vocab_size;
    for (int fi = 1; fi < N_FMT; fi++) { /* the quantized formats; fp4 always stores separately */
        float *direct = store_path_logits(m, FMTS[fi], 0), *sep = store_path_logits(m, FMTS[fi], 1);
        size_t diff = 0, first = 0, distinct = 0;
        for (size_t i = 0; i < n; i++) {
            if (memcmp(&direct[i], &sep[i], 4) && !diff++) first = i;
            if (direct[i] != direct[0]) distinct++;
        }
        cr_assert_eq(diff, 0, "%s: %zu of %zu logits differ (first %zu: RoPE store %.9g, separate %.9g)",
                     qrl_kv_format_name(FMTS[fi]), diff, n, first, direct[first], sep[first]);
        cr_assert_gt(distinct, n / 2, "%s: logits nearly constant", qrl_kv_format_name(FMTS[fi]));
        fprintf(stderr, "kv store %s: %zu logits bit-identical, RoPE store vs QRL_KV_STORE_UNFUSED=1\n",
                qrl_kv_format_name(FMTS[fi]), n);
        free(direct); free(sep);
    }
    qrl_model_free(m);
}
