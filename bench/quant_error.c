/* Measured quantization error of every qrl format (the table in docs/formats.md).
 *   build/bench/quant_error            markdown table on stdout
 * Data: fixed-seed Gaussian N(0,1) and outlier-heavy K-like rows (tests/unit/quant_testdata.h);
 * metric: relative Frobenius error ||x - deq(q(x))|| / ||x||. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/unit/quant_testdata.h"
#include "cpu/quant.h"

#define ROWS 256
#define COLS 4096
#define N (ROWS * COLS)

static float *xalloc(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

static double err_int8(const float *x, int64_t rows, int64_t cols, float *y) {
    int8_t *q = malloc((size_t)(rows * cols));
    float *s = xalloc((size_t)rows);
    qrl_int8_quantize_rows(x, rows, cols, q, s);
    qrl_int8_dequantize_rows(q, s, rows, cols, y);
    free(q); free(s);
    return td_rel_err(x, y, rows * cols);
}

static double err_fp8(const float *x, int64_t rows, int64_t cols, float *y) {
    uint8_t *q = malloc((size_t)(rows * cols));
    float *s = xalloc((size_t)rows);
    qrl_fp8_quantize_rows(x, rows, cols, q, s);
    qrl_fp8_dequantize_rows(q, s, rows, cols, y);
    free(q); free(s);
    return td_rel_err(x, y, rows * cols);
}

static double err_nvfp4(const float *x, int64_t rows, int64_t cols, bool per_row, float *y) {
    qrl_nvfp4 q = {rows, cols, malloc((size_t)(rows * qrl_nibble_row_bytes(cols))),
                   malloc((size_t)(rows * qrl_nvfp4_blocks(cols))), xalloc((size_t)rows), per_row};
    qrl_nvfp4_quantize(x, &q, NULL);
    qrl_nvfp4_dequantize(&q, y);
    free(q.codes); free(q.scales); free(q.global_enc);
    return td_rel_err(x, y, rows * cols);
}

static double err_mxfp4(const float *x, int64_t rows, int64_t cols, float *y) {
    uint8_t *c = malloc((size_t)(rows * qrl_nibble_row_bytes(cols)));
    uint8_t *s = malloc((size_t)(rows * qrl_mxfp4_blocks(cols)));
    qrl_mxfp4_quantize(x, rows, cols, c, s);
    qrl_mxfp4_dequantize(c, s, rows, cols, y);
    free(c); free(s);
    return td_rel_err(x, y, rows * cols);
}

static double err_bf16(const float *x, int64_t n, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = qrl_bf16_decode(qrl_bf16_encode(x[i]));
    return td_rel_err(x, y, n);
}

static double err_kv_int4(const float *x, int64_t n_vec, int D, int group, qrl_int4_mode m,
                          float *y) {
    uint8_t codes[QRL_KV_MAX_HEAD_DIM / 2];
    float sc[QRL_KV_MAX_HEAD_DIM], zr[QRL_KV_MAX_HEAD_DIM];
    for (int64_t t = 0; t < n_vec; t++) {
        qrl_kv_int4_quantize(x + t * D, D, group, m, codes, sc, zr);
        qrl_kv_int4_dequantize(codes, sc, zr, D, group, m, y + t * D);
    }
    return td_rel_err(x, y, n_vec * D);
}

static double err_kv_fp8(const float *x, int64_t n_vec, int D, float headroom, float *y) {
    /* per-head scale from the first 64 vectors (a prefill), applied to all */
    float s = qrl_kv_fp8_head_scale(x, 64, D, headroom);
    uint8_t codes[QRL_KV_MAX_HEAD_DIM];
    for (int64_t t = 0; t < n_vec; t++) {
        qrl_kv_fp8_quantize(x + t * D, D, s, codes);
        qrl_kv_fp8_dequantize(codes, D, s, y + t * D);
    }
    return td_rel_err(x, y, n_vec * D);
}

static double err_kv_fp4(const float *x, int64_t n_vec, int D, float *y) {
    for (int64_t t = 0; t < n_vec; t++) qrl_nvfp4_fake_quantize_row(x + t * D, D, y + t * D);
    return td_rel_err(x, y, n_vec * D);
}

static void kv_rows(const char *data, const float *x, int64_t n_vec, int D, float *y) {
    printf("| %s | fp8 (per-head, headroom 1) | %.4f |\n", data, err_kv_fp8(x, n_vec, D, 1.0f, y));
    printf("| %s | fp8 (per-head, headroom 4) | %.4f |\n", data, err_kv_fp8(x, n_vec, D, 4.0f, y));
    printf("| %s | int8 (per token-head) | %.4f |\n", data, err_int8(x, n_vec, D, y));
    for (int g = 32; g <= 64; g *= 2) {
        printf("| %s | int4 sym g%d | %.4f |\n", data, g,
               err_kv_int4(x, n_vec, D, g, QRL_INT4_SYMMETRIC, y));
        printf("| %s | int4 asym g%d | %.4f |\n", data, g,
               err_kv_int4(x, n_vec, D, g, QRL_INT4_ASYMMETRIC, y));
    }
    printf("| %s | fp4 (NVFP4, per token-head) | %.4f |\n", data, err_kv_fp4(x, n_vec, D, y));
}

static void gemm_rows(void) {
    enum { T = 64, K = 1024, NO = 256 };
    td_rng r = {7};
    float *x = xalloc(T * K), *w = xalloc(NO * K), *ref = xalloc(T * NO), *y = xalloc(T * NO);
    float *wf = xalloc(NO * K), *xf = xalloc(T * K), sx[T], sw[NO], g;
    td_fill_gauss(&r, x, T * K, 1.0);
    td_fill_gauss(&r, w, NO * K, 0.02);
    qrl_gemm_f32(x, w, T, NO, K, ref);
    int8_t *wq = malloc(NO * K), *xq = malloc(T * K);
    qrl_int8_quantize_rows(w, NO, K, wq, sw);
    qrl_linear_w8a8_int8(x, T, K, wq, sw, NO, xq, sx, y, NULL);
    printf("| GEMM %dx%dx%d | w8a8-int8 | %.4f |\n", T, K, NO, td_rel_err(ref, y, T * NO));
    uint8_t *wq8 = malloc(NO * K), *xq8 = malloc(T * K);
    qrl_fp8_quantize_rows(w, NO, K, wq8, sw);
    qrl_linear_w8a8_fp8(x, T, K, wq8, sw, NO, xq8, sx, y);
    printf("| GEMM %dx%dx%d | w8a8-fp8 | %.4f |\n", T, K, NO, td_rel_err(ref, y, T * NO));
    qrl_nvfp4 q = {NO, K, malloc(NO * K / 2), malloc(NO * K / 16), &g, false};
    qrl_nvfp4_quantize(w, &q, NULL);
    qrl_linear_w4a16_nvfp4(x, T, &q, wf, y, NULL);
    printf("| GEMM %dx%dx%d | w4a16-nvfp4 | %.4f |\n", T, K, NO, td_rel_err(ref, y, T * NO));
    qrl_linear_w4a4_nvfp4(x, T, &q, wf, xf, y, NULL);
    printf("| GEMM %dx%dx%d | w4a4-nvfp4 | %.4f |\n", T, K, NO, td_rel_err(ref, y, T * NO));
    uint8_t *mc = malloc(NO * K / 2), *ms = malloc(NO * K / 32);
    qrl_mxfp4_quantize(w, NO, K, mc, ms);
    qrl_linear_w4a16_mxfp4(x, T, mc, ms, NO, K, wf, y);
    printf("| GEMM %dx%dx%d | w4a16-mxfp4 | %.4f |\n", T, K, NO, td_rel_err(ref, y, T * NO));
    free(x); free(w); free(ref); free(y); free(wf); free(xf); free(wq); free(xq);
    free(wq8); free(xq8); free(q.codes); free(q.scales); free(mc); free(ms);
}

/* Attention output error of one query over 1024 K-like/Gaussian positions (d 128),
 * against F32 attention, averaged over 64 queries. */
static void attention_rows(void) {
    enum { NP = 1024, HD = 128, NG = HD / 32, SINK = 16, RECENT = 128, NQ = 64 };
    td_rng r = {9};
    float *k = xalloc(NP * HD), *v = xalloc(NP * HD);
    td_fill_klike(&r, k, NP, HD);
    td_fill_gauss(&r, v, NP * HD, 1.0);
    uint8_t *kc = malloc(NP * HD / 2), *vc = malloc(NP * HD / 2);
    float *ks = xalloc(NP * NG), *vs = xalloc(NP * NG), *kz = xalloc(NP * NG), *vz = xalloc(NP * NG);
    int8_t *k8 = malloc((SINK + RECENT) * HD), *v8 = malloc((SINK + RECENT) * HD);
    float k8s[SINK + RECENT], v8s[SINK + RECENT], q[HD], ref[HD], out[HD], acc[HD];
    for (int mode = 0; mode < 2; mode++) {
        for (int p = 0; p < NP; p++) {
            qrl_kv_int4_quantize(k + p * HD, HD, 32, mode, kc + p * HD / 2, ks + p * NG, kz + p * NG);
            qrl_kv_int4_quantize(v + p * HD, HD, 32, mode, vc + p * HD / 2, vs + p * NG, vz + p * NG);
            int64_t slot = qrl_kv_protected_slot(p, p + 1, SINK, RECENT);
            qrl_int8_quantize_rows(k + p * HD, 1, HD, k8 + slot * HD, k8s + slot);
            qrl_int8_quantize_rows(v + p * HD, 1, HD, v8 + slot * HD, v8s + slot);
        }
        qrl_kv_int4_store K4 = {HD, 32, mode, kc, ks, kz}, V4 = {HD, 32, mode, vc, vs, vz};
        qrl_kv_int8_store K8 = {HD, k8, k8s}, V8 = {HD, v8, v8s};
        double e4 = 0, ep = 0;
        td_rng rq = {10};
        for (int i = 0; i < NQ; i++) {
            td_fill_gauss(&rq, q, HD, 1.0);
            qrl_attention_partial part = {0, 0, acc};
            qrl_attention_partial_f32(q, k, v, NP, HD, 1.0f / sqrtf(HD), &part);
            qrl_attention_merge(&part, 1, HD, ref);
            qrl_attention_int4(q, NP, &K4, &V4, 1.0f / sqrtf(HD), out, NULL);
            e4 += td_rel_err(ref, out, HD) / NQ;
            qrl_attention_int4_protected(q, NP, &K4, &V4, &K8, &V8, SINK, RECENT, 1.0f / sqrtf(HD), out, NULL);
            ep += td_rel_err(ref, out, HD) / NQ;
        }
        const char *m = mode ? "asym" : "sym";
        printf("| attention, %d pos, K-like keys | int4 %s g32 | %.4f |\n", NP, m, e4);
        printf("| attention, %d pos, K-like keys | int4-protected %s g32, sink %d recent %d | %.4f |\n",
               NP, m, SINK, RECENT, ep);
    }
    free(k); free(v); free(kc); free(vc); free(ks); free(vs); free(kz); free(vz); free(k8); free(v8);
}

int main(void) {
    float *x = xalloc(N), *y = xalloc(N);
    td_rng r = {1};
    td_fill_gauss(&r, x, N, 1.0);
    printf("| data | format | rel. Frobenius error |\n| --- | --- | --- |\n");
    printf("| N(0,1) %dx%d | bf16 | %.4f |\n", ROWS, COLS, err_bf16(x, N, y));
    printf("| N(0,1) %dx%d | int8 per row | %.4f |\n", ROWS, COLS, err_int8(x, ROWS, COLS, y));
    printf("| N(0,1) %dx%d | fp8 e4m3 per row | %.4f |\n", ROWS, COLS, err_fp8(x, ROWS, COLS, y));
    printf("| N(0,1) %dx%d | nvfp4 (per-tensor global) | %.4f |\n", ROWS, COLS,
           err_nvfp4(x, ROWS, COLS, false, y));
    printf("| N(0,1) %dx%d | nvfp4 (per-row global) | %.4f |\n", ROWS, COLS,
           err_nvfp4(x, ROWS, COLS, true, y));
    printf("| N(0,1) %dx%d | mxfp4 | %.4f |\n", ROWS, COLS, err_mxfp4(x, ROWS, COLS, y));
    enum { D = 128, NV = 4096 };
    kv_rows("KV N(0,1) d128", x, NV, D, y);
    td_fill_klike(&r, x, NV, D);
    kv_rows("KV K-like d128", x, NV, D, y);
    gemm_rows();
    attention_rows();
    free(x); free(y);
    return 0;
}
