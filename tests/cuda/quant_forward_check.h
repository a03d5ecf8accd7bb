/* Shared by the quantized-weight GPU tests (test_cuda_w8a8.c, test_cuda_fp4.c): the CUDA
 * forward at a quantized precision against the CPU forward of the same quantized model
 * (tests/cuda/cuda_cpu_ref.h): three sequences, chunked prefill then a ragged decode
 * batch; every logits row within tol * max|cpu logit|, greedy tokens equal where the CPU
 * margin exceeds twice that; engines of the other precisions refuse the model.  Include
 * after cuda_test_util.h and cuda_cpu_ref.h. */
#ifndef QRL_TESTS_CUDA_QUANT_FORWARD_CHECK_H
#define QRL_TESTS_CUDA_QUANT_FORWARD_CHECK_H

#include "model/forward_cuda.h"
#include "support/test_files.h"

typedef struct qf_case {
    int max_rows;                 /* the engine's rows per pass */
    int first_back;               /* first sequence's prefill: n - first_back tokens (0: n / 2) */
    double tol;                   /* logits bound, relative to max |cpu logit| */
    const qrl_precision *others;  /* engines that must refuse the model */
    int n_others;
    qrl_kv_format kv;             /* both sides' KV cache (0 = f32: bf16, the default) */
} qf_case;

typedef struct qf_stats { double worst; int checked, skipped, bad_tok, bad_logit; } qf_stats;

static void qf_row_stats(const float *gpu, const float *cpu, int V, const int32_t *tok, double tol,
                      qf_stats *st) {
    double mx = 0, md = 0;
    for (int i = 0; i < V; i++) {
        mx = fmax(mx, fabs(cpu[i]));
        double d = fabs((double)gpu[i] - cpu[i]);
        md = isnan(d) ? INFINITY : fmax(md, d);
    }
    double eps = tol * mx;
    st->worst = fmax(st->worst, md / mx);
    st->bad_logit += !(md <= eps);
    if (!tok) return;
    int best = qrl_cpu_argmax(cpu, V);
    float second = -INFINITY;
    for (int i = 0; i < V; i++) if (i != best && cpu[i] > second) second = cpu[i];
    if (cpu[best] - second > 2 * eps) st->checked++, st->bad_tok += *tok != best;
    else st->skipped++;
}

static void qf_check(qrl_model *m, const char *name, const int32_t *ids, int n, int bs, const qf_case *c) {
    qrl_precision prec = m->precision;
    int V = m->cfg.vocab_size;
    qrl_error err;
    float *cpu = malloc((size_t)n * V * 4), *gl = malloc((size_t)3 * V * 4),
          *pl = malloc((size_t)n * V * 4);
    qrl_kv_format kv = c->kv ? c->kv : QRL_KV_FORMAT_BF16;
    cpu_logits_all(m, kv, 0, 0, ids, n, cpu);
    qrl_cuda_forward_desc d = {.max_rows = c->max_rows, .max_ctx = n, .block_size = bs,
                               .n_blocks = 3 * (n / bs + 2), .max_seqs = 4,
                               .precision = prec, .kv_format = kv};
    qrl_cuda_forward *f;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_precision(f), prec);
    int seq[3], len[3] = {c->first_back ? n - c->first_back : n / 2, n / 3 > 0 ? n / 3 : 1, 1};
    qf_stats st = {0};
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(qrl_cuda_forward_seq_new(f, &seq[j], &err), QRL_OK);
        cr_assert_eq(qrl_cuda_forward_prefill(f, seq[j], ids, len[j], pl, true, &err), QRL_OK,
                     "%s", err.msg);
        for (int p = 0; p < len[j]; p++)
            qf_row_stats(pl + (size_t)p * V, cpu + (size_t)p * V, V, NULL, c->tol, &st);
    }
    for (;;) {
        int bseq[3], rows = 0, pos[3];
        int32_t btok[3], gt[3];
        float glp[3];
        for (int j = 0; j < 3; j++)
            if (len[j] < n) bseq[rows] = seq[j], pos[rows] = len[j], btok[rows++] = ids[len[j]];
        if (rows == 0) break;
        cr_assert_eq(qrl_cuda_forward_decode(f, bseq, btok, rows, gl, gt, glp, &err), QRL_OK, "%s",
                     err.msg);
        for (int r = 0; r < rows; r++)
            qf_row_stats(gl + (size_t)r * V, cpu + (size_t)pos[r] * V, V, &gt[r], c->tol, &st);
        for (int j = 0; j < 3; j++) if (len[j] < n) len[j]++;
    }
    fprintf(stderr, "%s %s kv=%s: n=%d worst max|gpu-cpu|/max|cpu| = %.3e (tol %.3g, %d rows "
            "over); greedy tokens checked %d (%d differ), skipped (margin <= 2 eps) %d\n", name,
            qrl_precision_name(prec), qrl_kv_format_name(kv), n, st.worst, c->tol, st.bad_logit, st.checked,
            st.bad_tok, st.skipped);
    cr_assert_eq(st.bad_logit, 0, "%s: %d logits rows over the bound", name, st.bad_logit);
    cr_assert_eq(st.bad_tok, 0, "%s: %d greedy tokens differ at a large margin", name, st.bad_tok);
    /* bounds of 0.2 and more (4-bit KV) leave almost no position such a margin */
    cr_assert(c->tol >= 0.2 || st.checked > 0, "%s: no position had a margin above the budget", name);
    /* engines of the other precisions refuse the model */
    qrl_cuda_forward_free(f);
    for (int i = 0; i < c->n_others; i++) {
        if (c->others[i] == prec) continue;
        d.precision = c->others[i];
        cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(err.msg, qrl_precision_name(prec)), "%s", err.msg);
        qrl_cuda_forward_free(f);
    }
    free(cpu); free(gl); free(pl);
}

static void qf_stories260k(qrl_precision prec, const qf_case *c) {
    char bin[1024];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin))
        cr_skip_test("no stories260K under the data folder");
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    cr_assert_eq(qrl_model_quantize(m, prec, &err), QRL_OK, "%s", err.msg);
    int n = 120;
    int32_t *ids = malloc((size_t)n * 4);
    uint64_t s = 5;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(&s) % (uint64_t)m->cfg.vocab_size);
    ids[0] = 1; /* BOS */
    qf_check(m, "stories260K", ids, n, 16, c);
    free(ids);
    qrl_model_free(m);
}

static void qf_random_hd128(qrl_precision prec, int n, const qf_case *qc) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 256, .hidden_dim = 384, .n_layers = 2,
                          .n_heads = 8, .n_kv_heads = 2, .head_dim = 128, .vocab_size = 300,
                          .max_seq_len = 512, .norm_eps = 1e-6f, .qk_norm = true,
                          .rope = {.theta = 1000000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 77);
    qrl_model_round_bf16(m);
    cr_assert_eq(qrl_model_quantize(m, prec, &err), QRL_OK, "%s", err.msg);
    int32_t *ids = malloc((size_t)n * 4);
    uint64_t s = 9;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(&s) % 300);
    qf_check(m, "random-hd128", ids, n, 5, qc);
    free(ids);
    qrl_model_free(m);
}

#endif
