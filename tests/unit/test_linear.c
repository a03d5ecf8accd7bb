/* The precision-tagged linear layer (common/model/linear.h): bit-identical to the
 * reference GEMMs of kernels/cpu/quant_gemm.c for every quantized precision, on odd
 * shapes (short NVFP4/MXFP4 blocks, T not a multiple of the 4-row kernel), for 1 and 2
 * threads; f32 is qrl_cpu_matmul; storage sizes hand-checked; errors.  Also
 * qrl_model_quantize: which tensors are quantized, and going back to f32. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/quant.h"
#include "model/forward.h"
#include "model/linear.h"
#include "model/model.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* xorshift64, uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void *storage_for(qrl_precision p, int N, int K) {
    void *s = NULL;
    size_t b = qrl_linear_storage_bytes(p, N, K);
    if (b) cr_assert_eq(posix_memalign(&s, 64, b), 0);
    return s;
}

/* y_ref = the quant_gemm.c reference for precision p (no bias). */
static void reference(qrl_precision p, const float *x, int T, const float *w, int N, int K,
                      float *y) {
    qrl_error err;
    size_t nk = (size_t)N * K, tk = (size_t)T * K;
    float *wf = malloc(nk * sizeof(float)), *xf = malloc(tk * sizeof(float));
    float *sw = malloc((size_t)N * sizeof(float)), *sx = malloc((size_t)T * sizeof(float));
    uint8_t *wq = malloc(nk), *xq = malloc(tk);
    uint8_t *codes = malloc((size_t)N * qrl_nibble_row_bytes(K));
    uint8_t *bs = malloc((size_t)N * qrl_nvfp4_blocks(K));
    float g;
    qrl_nvfp4 nv = {.rows = N, .cols = K, .codes = codes, .scales = bs, .global_enc = &g};
    switch (p) {
    case QRL_PRECISION_W8A8_INT8:
        qrl_int8_quantize_rows(w, N, K, (int8_t *)wq, sw);
        cr_assert_eq(qrl_linear_w8a8_int8(x, T, K, (int8_t *)wq, sw, N, (int8_t *)xq, sx, y, &err),
                     QRL_OK);
        break;
    case QRL_PRECISION_W8A8_FP8:
        qrl_fp8_quantize_rows(w, N, K, wq, sw);
        qrl_linear_w8a8_fp8(x, T, K, wq, sw, N, xq, sx, y);
        break;
    case QRL_PRECISION_W4A16_NVFP4:
        cr_assert_eq(qrl_nvfp4_quantize(w, &nv, &err), QRL_OK);
        cr_assert_eq(qrl_linear_w4a16_nvfp4(x, T, &nv, wf, y, &err), QRL_OK);
        break;
    case QRL_PRECISION_W4A4_NVFP4:
        cr_assert_eq(qrl_nvfp4_quantize(w, &nv, &err), QRL_OK);
        cr_assert_eq(qrl_linear_w4a4_nvfp4(x, T, &nv, wf, xf, y, &err), QRL_OK);
        break;
    case QRL_PRECISION_W4A16_MXFP4:
        qrl_mxfp4_quantize(w, N, K, codes, bs);
        qrl_linear_w4a16_mxfp4(x, T, codes, bs, N, K, wf, y);
        break;
    case QRL_PRECISION_BF16:
        for (size_t i = 0; i < tk; i++) xf[i] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(x[i]));
        qrl_cpu_matmul(y, xf, w, NULL, T, K, N);
        break;
    default:
        qrl_cpu_matmul(y, x, w, NULL, T, K, N);
    }
    free(wf), free(xf), free(sw), free(sx), free(wq), free(xq), free(codes), free(bs);
}

static void check_shape(qrl_precision p, int N, int K, int T, int threads) {
    size_t nk = (size_t)N * K, tk = (size_t)T * K, tn = (size_t)T * N;
    float *w = malloc(nk * sizeof(float)), *x = malloc(tk * sizeof(float));
    float *b = malloc((size_t)N * sizeof(float));
    for (size_t i = 0; i < nk; i++) w[i] = 0.05f * frand();
    for (size_t i = 0; i < tk; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f); /* outliers */
    for (int i = 0; i < N; i++) b[i] = 0.1f * frand();
    if (p == QRL_PRECISION_BF16)
        for (size_t i = 0; i < nk; i++) w[i] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(w[i]));
    float *ref = malloc(tn * sizeof(float)), *y = malloc((tn + 2) * sizeof(float));
    reference(p, x, T, w, N, K, ref);
    qrl_linear l;
    qrl_linear_scratch *s;
    qrl_error err;
    void *st = storage_for(p, N, K);
    omp_set_num_threads(threads);
    cr_assert_eq(qrl_linear_scratch_new(T + 1, K, &s, &err), QRL_OK);
    cr_assert_eq(qrl_linear_init(&l, p, w, NULL, N, K, st, &err), QRL_OK, "%s", err.msg);
    y[tn] = y[tn + 1] = 12345.0f; /* guard past the output */
    qrl_linear_forward(&l, x, T, y, s);
    cr_assert_eq(memcmp(y, ref, tn * sizeof(float)), 0, "%s N=%d K=%d T=%d threads=%d differs",
                 qrl_precision_name(p), N, K, T, threads);
    cr_assert(y[tn] == 12345.0f && y[tn + 1] == 12345.0f, "write past the output");
    /* with a bias: the epilogue value plus bias[n] */
    cr_assert_eq(qrl_linear_init(&l, p, w, b, N, K, st, &err), QRL_OK);
    qrl_linear_forward(&l, x, T, y, s);
    for (size_t i = 0; i < tn; i++) {
        float want = ref[i] + b[i % N];
        cr_assert(y[i] == want, "%s bias at %zu: %g vs %g", qrl_precision_name(p), i, y[i], want);
    }
    omp_set_num_threads(2);
    qrl_linear_scratch_free(s);
    free(st), free(w), free(x), free(b), free(ref), free(y);
}

Test(linear, bit_identical_to_reference_gemms) {
    /* the last two are large enough to run on two threads */
    static const int shapes[][3] = {{37, 83, 1}, {37, 83, 7}, {64, 128, 9}, {5, 16, 4},
                                    {300, 40, 3}, {130, 200, 9}, {520, 260, 1}};
    for (int p = 0; p < QRL_PRECISION_COUNT_; p++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int th = 1; th <= 2; th++)
                check_shape((qrl_precision)p, shapes[i][0], shapes[i][1], shapes[i][2], th);
}

Test(linear, names_storage_and_errors) {
    qrl_precision p;
    qrl_error err;
    for (int i = 0; i < QRL_PRECISION_COUNT_; i++) {
        cr_assert_eq(qrl_precision_parse(qrl_precision_name((qrl_precision)i), &p, &err), QRL_OK);
        cr_assert_eq((int)p, i);
    }
    cr_assert_str_eq(qrl_precision_name(QRL_PRECISION_W4A4_NVFP4), "w4a4-nvfp4");
    cr_assert_eq(qrl_precision_parse("fp16", &p, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "unknown precision 'fp16' (f32, bf16, w8a8-int8, w8a8-fp8, "
                              "w4a16-nvfp4, w4a16-mxfp4, w4a4-nvfp4)");
    cr_assert(!qrl_precision_is_quantized(QRL_PRECISION_BF16));
    cr_assert(qrl_precision_is_quantized(QRL_PRECISION_W8A8_INT8));
    /* N=3, K=33: int8 3*4 + 99; nvfp4 4 + 3*3 blocks + 3*17 codes; mxfp4 3*2 + 3*17 */
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_F32, 3, 33), 0);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_BF16, 3, 33), 0);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_W8A8_INT8, 3, 33), 111);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_W8A8_FP8, 3, 33), 111);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_W4A16_NVFP4, 3, 33), 64);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_W4A4_NVFP4, 3, 33), 64);
    cr_assert_eq(qrl_linear_storage_bytes(QRL_PRECISION_W4A16_MXFP4, 3, 33), 57);
    float w[4] = {1, 2, 3, 4};
    qrl_linear l;
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_W8A8_INT8, w, NULL, 2, 2, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "linear w8a8-int8 [2, 2]: no storage for 12 bytes");
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_F32, w, NULL, 0, 2, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_F32, NULL, NULL, 2, 2, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_COUNT_, w, NULL, 2, 2, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    unsigned char big[8];
    cr_assert_eq(qrl_linear_init(&l, QRL_PRECISION_W8A8_INT8, w, NULL, 1, QRL_INT8_GEMM_MAX_K + 1,
                                 big, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "K=133144 exceeds 133143"), "%s", err.msg);
    qrl_linear_scratch *s;
    cr_assert_eq(qrl_linear_scratch_new(0, 4, &s, &err), QRL_STATUS_OUT_OF_RANGE);
}

/* ---- qrl_model_quantize ------------------------------------------------------------ */

static qrl_model *tiny(bool tied) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN2, .dim = 48, .hidden_dim = 80, .n_layers = 2,
                          .n_heads = 4, .n_kv_heads = 2, .head_dim = 12, .vocab_size = 53,
                          .max_seq_len = 32, .norm_eps = 1e-6f, .qkv_bias = true,
                          .tie_embeddings = tied,
                          .rope = {.theta = 10000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 5);
    return m;
}

static void logits_of(const qrl_model *m, float *out) {
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 4, .n_blocks = 8,
                           .max_seqs = 1, .max_seq_len = 32, .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_forward *f;
    qrl_error err;
    int seq;
    int32_t ids[9] = {1, 7, 22, 3, 50, 9, 9, 41, 0};
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK);
    cr_assert_eq(qrl_forward_new(m, 4, 32, &f, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, 9, out, true, &err), QRL_OK, "%s", err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

Test(model_quantize, quantizes_the_seven_projections_only) {
    qrl_model *m = tiny(false);
    size_t n = 9 * 53;
    float *f32 = malloc(n * sizeof(float)), *q = malloc(n * sizeof(float));
    logits_of(m, f32);
    float emb0 = m->tok_embedding[5], head0 = m->lm_head[7], wq0 = m->layers[1].wq[3];
    qrl_error err;
    for (int p = QRL_PRECISION_W8A8_INT8; p < QRL_PRECISION_COUNT_; p++) {
        cr_assert_eq(qrl_model_quantize(m, (qrl_precision)p, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(m->precision, (qrl_precision)p);
        for (int l = 0; l < 2; l++)
            for (int s = 0; s < QRL_LINEAR_SLOTS; s++) {
                const qrl_linear *lin = qrl_model_linear(m, l, (qrl_linear_slot)s);
                cr_assert_eq(lin->fmt, (qrl_precision)p);
                cr_assert_not_null(lin->codes);
            }
        cr_assert_eq(qrl_model_linear(m, 0, QRL_LINEAR_K)->bias, m->layers[0].bk);
        cr_assert_eq(qrl_model_linear(m, 1, QRL_LINEAR_DOWN)->n_in, 80);
        cr_assert_eq(m->lm_head_linear.fmt, QRL_PRECISION_F32, "LM head stays high precision");
        cr_assert(emb0 == m->tok_embedding[5] && head0 == m->lm_head[7] && wq0 == m->layers[1].wq[3],
                  "master weights untouched");
        logits_of(m, q);
        double md = 0;
        for (size_t i = 0; i < n; i++) md = fmax(md, fabs(q[i] - f32[i]));
        fprintf(stderr, "%s: max |logit diff| %g\n", qrl_precision_name(p), md);
        cr_assert(md > 0 && md < 2.0, "%s: max |logit diff| %g", qrl_precision_name(p), md);
    }
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_F32, &err), QRL_OK);
    cr_assert_null(m->quant_storage);
    logits_of(m, q);
    cr_assert_eq(memcmp(q, f32, n * sizeof(float)), 0, "back to f32 from the master weights");
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_BF16, &err), QRL_OK);
    cr_assert_eq(m->lm_head_linear.fmt, QRL_PRECISION_BF16);
    cr_assert_eq(m->tok_embedding[5], qrl_cpu_bf16_load(qrl_cpu_bf16_store(emb0)),
                 "bf16 rounds every weight in place");
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_COUNT_, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(m->precision, QRL_PRECISION_BF16, "a failed call keeps the precision");
    free(f32), free(q);
    qrl_model_free(m);
}

Test(model_quantize, int8_refuses_a_hidden_width_past_the_int32_limit) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_LLAMA, .dim = 8, .hidden_dim = QRL_INT8_GEMM_MAX_K + 1,
                          .n_layers = 1, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4,
                          .vocab_size = 4, .max_seq_len = 4, .norm_eps = 1e-5f,
                          .rope = {.theta = 10000.0}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W8A8_INT8, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(err.msg, "model: w8a8-int8 needs every linear's input width <= 133143; "
                              "layer 0 has 133144");
    cr_assert_eq(m->precision, QRL_PRECISION_F32);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W8A8_FP8, &err), QRL_OK, "%s", err.msg);
    qrl_model_free(m);
}
