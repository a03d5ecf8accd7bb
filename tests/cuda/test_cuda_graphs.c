/* CUDA graphs for the decode step (model/forward_cuda.h): an engine replaying captured
 * graphs against the same engine launching eagerly (desc.eager), same weights, same
 * prompts, same tokens fed to both.
 *
 * Rules:
 *   - a batch that is already a captured row count (1, 2, 4, 8k): logits memcmp-equal to
 *     eager (the same kernels with the same arguments; the attention's split plan uses the
 *     same context bucket in both modes);
 *   - a batch the graph pads (e.g. 5 -> 8): the real rows within 1e-3 x max|logit| of eager
 *     (cuBLAS may pick another algorithm for 8 rows than for 5) and the same greedy token
 *     where eager's top-1 margin exceeds twice that;
 *   - the padding rows never change a caller's sequence: later steps still match;
 *   - graphs are captured once per (rows, context bucket) and replayed otherwise; more keys
 *     than QRL_CUDA_GRAPH_SLOTS evict the least recently used;
 *   - an fp8 step that calibrates a new sequence's scales runs eagerly (no capture). */
#include "cuda_cpu_ref.h"
#include "cuda_test_util.h"
#include "model/forward_cuda.h"

#define PAD_TOL 1e-3

static qrl_cuda_forward *engine(const qrl_model *m, qrl_kv_format fmt, bool eager, int max_rows) {
    qrl_cuda_forward_desc d = {.max_rows = max_rows, .max_ctx = m->cfg.max_seq_len,
                               .block_size = 16, .n_blocks = 8 * (m->cfg.max_seq_len / 16 + 1),
                               .max_seqs = 8, .kv_format = fmt, .protected_sink = 4,
                               .protected_recent = 32, .eager = eager};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    return f;
}

/* max|a - b| / max|b| over a [rows, V] block; NaN fails. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double mx = 0, md = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(!isnan(a[i]) && !isnan(b[i]), "NaN logit at %zu", i);
        mx = fmax(mx, fabs(b[i]));
        md = fmax(md, fabs((double)a[i] - b[i]));
    }
    return md / mx;
}

typedef struct pair { qrl_cuda_forward *g, *e; int seq[8]; } pair;

/* One decode step of rows `sel` (indices into p->seq) on both engines with the same tokens;
 * compares as the rules say and returns eager's greedy tokens in next[]. */
static void step(pair *p, const int *sel, int rows, int32_t *tok, const char *what, int V,
                 double *worst_pad) {
    int seqs[8];
    int32_t in[8], gt[8], et[8];
    float *gl = malloc((size_t)rows * V * 4), *el = malloc((size_t)rows * V * 4), glp[8], elp[8];
    qrl_error err;
    for (int r = 0; r < rows; r++) seqs[r] = p->seq[sel[r]], in[r] = tok[sel[r]];
    cr_assert_eq(qrl_cuda_forward_decode(p->g, seqs, in, rows, gl, gt, glp, &err), QRL_OK, "%s: %s",
                 what, err.msg);
    cr_assert_eq(qrl_cuda_forward_decode(p->e, seqs, in, rows, el, et, elp, &err), QRL_OK, "%s: %s",
                 what, err.msg);
    bool exact = rows == 1 || rows == 2 || rows == 4 || rows % 8 == 0;
    if (exact) {
        cr_assert_eq(memcmp(gl, el, (size_t)rows * V * 4), 0, "%s: %d rows: graph logits differ "
                     "from eager (rel %.3e)", what, rows, rel_diff(gl, el, (size_t)rows * V));
        cr_assert_eq(memcmp(gt, et, (size_t)rows * 4), 0, "%s: greedy tokens differ", what);
    } else {
        for (int r = 0; r < rows; r++) {
            const float *a = gl + (size_t)r * V, *b = el + (size_t)r * V;
            double d = rel_diff(a, b, (size_t)V);
            *worst_pad = fmax(*worst_pad, d);
            cr_assert(d <= PAD_TOL, "%s: %d rows (padded), row %d: rel diff %.3e > %.0e", what,
                      rows, r, d, PAD_TOL);
            float top = -INFINITY, second = -INFINITY, mx = 0;
            for (int i = 0; i < V; i++) {
                mx = fmaxf(mx, fabsf(b[i]));
                if (b[i] > top) second = top, top = b[i];
                else if (b[i] > second) second = b[i];
            }
            if (top - second > 2 * PAD_TOL * mx)
                cr_assert_eq(gt[r], et[r], "%s: row %d greedy token %d, eager %d", what, r, gt[r],
                             et[r]);
        }
    }
    for (int r = 0; r < rows; r++) tok[sel[r]] = et[r];
    free(gl); free(el);
}

/* 8 sequences prefilled to different lengths, decoded with batches 8, 5, 4, 3, 2, 1 (rows
 * leaving as in a rollout) across several context buckets. */
static void graph_vs_eager(qrl_kv_format fmt) {
    qrl_model *m = ref_model_hd128(31, 512);
    int V = m->cfg.vocab_size;
    pair p = {.g = engine(m, fmt, false, 16), .e = engine(m, fmt, true, 16)};
    qrl_error err;
    uint64_t rs = 1234 + fmt;
    int plen[8] = {3, 17, 40, 63, 64, 100, 130, 200};
    int32_t tok[8], *prompt = malloc(256 * 4);
    float *pl = malloc((size_t)V * 4);
    for (int j = 0; j < 8; j++) {
        for (int i = 0; i < plen[j]; i++) prompt[i] = (int32_t)(rng_next(&rs) % (uint64_t)V);
        cr_assert_eq(qrl_cuda_forward_seq_new(p.g, &p.seq[j], &err), QRL_OK);
        int s2;
        cr_assert_eq(qrl_cuda_forward_seq_new(p.e, &s2, &err), QRL_OK);
        cr_assert_eq(s2, p.seq[j]);
        cr_assert_eq(qrl_cuda_forward_prefill(p.g, p.seq[j], prompt, plen[j], NULL, false, &err),
                     QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_forward_prefill(p.e, p.seq[j], prompt, plen[j], pl, false, &err),
                     QRL_OK, "%s", err.msg);
        tok[j] = qrl_cpu_argmax(pl, V);
    }
    const char *name = qrl_kv_format_name(fmt);
    int all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int batches[] = {8, 5, 4, 3, 2, 1}, steps[] = {70, 30, 20, 20, 20, 40};
    double worst_pad = 0;
    int n_steps = 0;
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++)
        for (int s = 0; s < steps[b]; s++, n_steps++) step(&p, all, batches[b], tok, name, V, &worst_pad);
    long cap, rep, ecap, erep;
    qrl_cuda_forward_graph_stats(p.g, &cap, &rep);
    qrl_cuda_forward_graph_stats(p.e, &ecap, &erep);
    fprintf(stderr, "graphs %s: %d steps, %ld captures, %ld replays; padded batches worst rel "
            "diff %.3e (tol %.0e)\n", name, n_steps, cap, rep, worst_pad, PAD_TOL);
    cr_assert_eq(ecap + erep, 0, "the eager engine captured graphs");
    cr_assert_eq(cap + rep, n_steps, "every step of the graph engine used a graph");
    /* keys: (8 rows, buckets 256 and 320), then a few per batch size */
    cr_assert(cap >= 3 && cap <= 20, "%ld captures", cap);
    for (int j = 0; j < 8; j++)
        cr_assert_eq(qrl_cuda_forward_seq_len(p.g, p.seq[j]), qrl_cuda_forward_seq_len(p.e, p.seq[j]));
    qrl_cuda_forward_free(p.g);
    qrl_cuda_forward_free(p.e);
    free(prompt); free(pl);
    qrl_model_free(m);
}

Test(cuda_graphs, bf16_kv_equals_eager) { require_gpu(); graph_vs_eager(QRL_KV_FORMAT_BF16); }
Test(cuda_graphs, int8_kv_equals_eager) { require_gpu(); graph_vs_eager(QRL_KV_FORMAT_INT8); }
Test(cuda_graphs, fp8_kv_equals_eager) { require_gpu(); graph_vs_eager(QRL_KV_FORMAT_FP8); }
Test(cuda_graphs, int4_kv_equals_eager) { require_gpu(); graph_vs_eager(QRL_KV_FORMAT_INT4); }
Test(cuda_graphs, int4_protected_kv_equals_eager) {
    require_gpu();
    graph_vs_eager(QRL_KV_FORMAT_INT4_PROTECTED);
}

/* A sequence whose first pass is a decode step calibrates its fp8 scales: that step runs
 * eagerly; the next one replays. */
Test(cuda_graphs, fp8_calibrating_step_runs_eagerly) {
    require_gpu();
    qrl_model *m = ref_model_hd128(32, 128);
    int V = m->cfg.vocab_size;
    pair p = {.g = engine(m, QRL_KV_FORMAT_FP8, false, 4), .e = engine(m, QRL_KV_FORMAT_FP8, true, 4)};
    qrl_error err;
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(qrl_cuda_forward_seq_new(p.g, &p.seq[j], &err), QRL_OK);
        cr_assert_eq(qrl_cuda_forward_seq_new(p.e, &p.seq[j], &err), QRL_OK);
    }
    int32_t tok[2] = {5, 9};
    int sel[2] = {0, 1};
    double w = 0;
    long cap, rep;
    step(&p, sel, 2, tok, "fp8 first pass", V, &w);
    qrl_cuda_forward_graph_stats(p.g, &cap, &rep);
    cr_assert_eq(cap + rep, 0, "the calibrating step used a graph (%ld captures)", cap);
    for (int s = 0; s < 3; s++) step(&p, sel, 2, tok, "fp8 after calibration", V, &w);
    qrl_cuda_forward_graph_stats(p.g, &cap, &rep);
    cr_assert_eq(cap, 1);
    cr_assert_eq(rep, 2);
    qrl_cuda_forward_free(p.g);
    qrl_cuda_forward_free(p.e);
    qrl_model_free(m);
}

/* More (rows, bucket) keys than graph slots: 11 row counts x 5 context buckets = 55 > 48
 * captures, each step equal to eager; then the first key (evicted) is captured again and
 * the last one replayed. */
Test(cuda_graphs, lru_eviction) {
    require_gpu();
    qrl_model *m = ref_model_hd128(33, 2048);
    int V = m->cfg.vocab_size;
    qrl_cuda_forward_desc d = {.max_rows = 64, .max_ctx = 2048, .block_size = 16,
                               .n_blocks = 64 * 2048 / 16, .max_seqs = 64};
    pair p;
    qrl_cuda_forward *eng[2];
    qrl_error err;
    for (int k = 0; k < 2; k++) {
        d.eager = k == 1;
        cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &eng[k], &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_forward_init_random(eng[k], 5, &err), QRL_OK, "%s", err.msg);
    }
    p.g = eng[0], p.e = eng[1];
    int seqs[64];
    int32_t toks[64];
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(qrl_cuda_forward_seq_new(p.g, &seqs[i], &err), QRL_OK);
        int s2;
        cr_assert_eq(qrl_cuda_forward_seq_new(p.e, &s2, &err), QRL_OK);
        toks[i] = (int32_t)(i * 7 % V);
    }
    int rows_list[11] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
    int lens[5] = {100, 300, 600, 1000, 1500}; /* buckets 128, 320, 640, 1024, 1536 */
    float *gl = malloc((size_t)64 * V * 4), *el = malloc((size_t)64 * V * 4);
    long cap = 0, rep = 0;
    for (int li = 0; li <= 5; li++)
        for (int ri = 0; ri < 11; ri++) {
            int L = li < 5 ? lens[li] : lens[0], rows = li < 5 ? rows_list[ri] : rows_list[0];
            if (li == 5 && ri > 0) break; /* the 56th step: the first key again */
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < 2; k++)
                    cr_assert_eq(qrl_cuda_forward_seq_set_len_unwritten(eng[k], seqs[r], L, &err),
                                 QRL_OK, "%s", err.msg);
            cr_assert_eq(qrl_cuda_forward_decode(p.g, seqs, toks, rows, gl, NULL, NULL, &err), QRL_OK,
                         "%s", err.msg);
            cr_assert_eq(qrl_cuda_forward_decode(p.e, seqs, toks, rows, el, NULL, NULL, &err), QRL_OK,
                         "%s", err.msg);
            cr_assert_eq(memcmp(gl, el, (size_t)rows * V * 4), 0, "rows %d len %d: graph != eager "
                         "(rel %.3e)", rows, L, rel_diff(gl, el, (size_t)rows * V));
        }
    qrl_cuda_forward_graph_stats(p.g, &cap, &rep);
    cr_assert_eq(cap, 56, "%ld captures (55 keys, then the evicted first key again)", cap);
    cr_assert_eq(rep, 0);
    /* the most recent key (64 rows, bucket 1536) is still kept */
    for (int r = 0; r < 64; r++)
        cr_assert_eq(qrl_cuda_forward_seq_set_len_unwritten(p.g, seqs[r], 1500, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_decode(p.g, seqs, toks, 64, gl, NULL, NULL, &err), QRL_OK, "%s",
                 err.msg);
    qrl_cuda_forward_graph_stats(p.g, &cap, &rep);
    cr_assert_eq(cap, 56);
    cr_assert_eq(rep, 1);
    qrl_cuda_forward_free(p.g);
    qrl_cuda_forward_free(p.e);
    free(gl); free(el);
    qrl_model_free(m);
}

/* The internal padding sequence (id max_seqs) and unused ids are refused by the public
 * sequence calls, not taken as a caller's. */
Test(cuda_graphs, padding_sequence_not_public) {
    require_gpu();
    qrl_model *m = ref_model_hd128(34, 64);
    qrl_cuda_forward *f = engine(m, QRL_KV_FORMAT_BF16, false, 4);
    qrl_error err;
    int free0 = qrl_cuda_forward_free_blocks(f);
    cr_assert_eq(free0, 8 * (64 / 16 + 1), "the padding block is not a caller's (%d free)", free0);
    int bad[] = {8, -1, 3};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(qrl_cuda_forward_seq_reserve(f, bad[i], 16, &err), QRL_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(err.msg, "not in use"), "%s", err.msg);
        cr_assert_eq(qrl_cuda_forward_seq_set_len_unwritten(f, bad[i], 16, &err),
                     QRL_STATUS_INVALID_ARGUMENT);
    }
    cr_assert_eq(qrl_cuda_forward_free_blocks(f), free0);
    qrl_cuda_forward_free(f);
    qrl_model_free(m);
}
