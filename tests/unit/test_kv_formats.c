/* KV-cache formats and the KV4-RL INT4 + INT8-protected attention (quant.h, SPEC §3). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "quant_testdata.h"

/* ---- INT4 group formats -------------------------------------------------------------- */

Test(kv_int4, symmetric_hand_checked) {
    float x[48], y[48], sc[2];
    uint8_t codes[24];
    for (int j = 0; j < 32; j++) x[j] = (float)((j % 15) - 7); /* -7..7, absmax 7 -> scale 1 */
    for (int j = 32; j < 48; j++) x[j] = 0.5f * (float)(j - 40); /* ragged group: absmax 4 */
    qrl_kv_int4_quantize(x, 48, 32, QRL_INT4_SYMMETRIC, codes, sc, NULL);
    cr_assert_eq(sc[0], 1.0f);
    cr_assert_eq(sc[1], 4.0f / 7.0f);
    cr_assert_eq(qrl_nibble_get(codes, 0), 0x9); /* -7 two's complement */
    cr_assert_eq(qrl_nibble_get(codes, 14), 0x7);
    qrl_kv_int4_dequantize(codes, sc, NULL, 48, 32, QRL_INT4_SYMMETRIC, y);
    for (int j = 0; j < 32; j++) cr_assert_eq(y[j], x[j], "elem %d", j);
    for (int j = 32; j < 48; j++) cr_assert_leq(fabsf(y[j] - x[j]), 0.5f * sc[1] * 1.0001f);
    /* NaN -> 0, Inf saturates, the group of a lone Inf has scale from finite elements */
    x[1] = NAN; x[2] = INFINITY; x[3] = -INFINITY;
    qrl_kv_int4_quantize(x, 32, 32, QRL_INT4_SYMMETRIC, codes, sc, NULL);
    cr_assert_eq(qrl_nibble_get(codes, 1), 0x0);
    cr_assert_eq(qrl_nibble_get(codes, 2), 0x7);
    cr_assert_eq(qrl_nibble_get(codes, 3), 0x9);
}

Test(kv_int4, asymmetric_hand_checked) {
    float x[32], y[32], sc[1], zr[1];
    uint8_t codes[16];
    for (int j = 0; j < 32; j++) x[j] = 100.0f + (float)(j % 16); /* min 100, max 115 */
    qrl_kv_int4_quantize(x, 32, 32, QRL_INT4_ASYMMETRIC, codes, sc, zr);
    cr_assert_eq(sc[0], 1.0f);
    cr_assert_eq(zr[0], 100.0f);
    for (int j = 0; j < 32; j++) cr_assert_eq(qrl_nibble_get(codes, j), j % 16);
    qrl_kv_int4_dequantize(codes, sc, zr, 32, 32, QRL_INT4_ASYMMETRIC, y);
    for (int j = 0; j < 32; j++) cr_assert_eq(y[j], x[j]);
    /* a constant group is exact: scale 0, codes 0, x_hat = zero point */
    for (int j = 0; j < 32; j++) x[j] = -3.25f;
    qrl_kv_int4_quantize(x, 32, 32, QRL_INT4_ASYMMETRIC, codes, sc, zr);
    qrl_kv_int4_dequantize(codes, sc, zr, 32, 32, QRL_INT4_ASYMMETRIC, y);
    cr_assert_eq(sc[0], 0.0f);
    for (int j = 0; j < 32; j++) cr_assert_eq(y[j], -3.25f);
    /* extreme range: no overflow to Inf/NaN */
    x[0] = -3e38f; x[1] = 3e38f; x[2] = NAN; x[3] = INFINITY;
    qrl_kv_int4_quantize(x, 32, 32, QRL_INT4_ASYMMETRIC, codes, sc, zr);
    qrl_kv_int4_dequantize(codes, sc, zr, 32, 32, QRL_INT4_ASYMMETRIC, y);
    for (int j = 0; j < 32; j++) cr_assert(isfinite(y[j]), "elem %d = %g", j, y[j]);
    cr_assert_eq(qrl_nibble_get(codes, 3), 15);
    cr_assert_eq(qrl_nibble_get(codes, 2), 0);
}

#define D 128
#define NV 1024

static double kv_int4_err(const float *x, int group, qrl_int4_mode m) {
    float *y = malloc(sizeof(float) * NV * D), sc[D], zr[D];
    uint8_t codes[D / 2];
    for (int t = 0; t < NV; t++) {
        qrl_kv_int4_quantize(x + t * D, D, group, m, codes, sc, zr);
        qrl_kv_int4_dequantize(codes, sc, zr, D, group, m, y + t * D);
    }
    double e = td_rel_err(x, y, NV * D);
    free(y);
    return e;
}

Test(kv_int4, symmetric_vs_asymmetric_measured_on_gaussian_and_k_like) {
    float *g = malloc(sizeof(float) * NV * D), *k = malloc(sizeof(float) * NV * D);
    td_rng r = {71};
    td_fill_gauss(&r, g, NV * D, 1.0);
    td_fill_klike(&r, k, NV, D);
    /* measured (docs/formats.md): gauss sym32 0.097 asym32 0.078 sym64 0.107 asym64 0.090;
     * K-like sym32 0.195 asym32 0.109 sym64 0.236 asym64 0.174 */
    const struct { const float *x; int g; qrl_int4_mode m; double bound; } c[] = {
        {g, 32, QRL_INT4_SYMMETRIC, 0.145}, {g, 32, QRL_INT4_ASYMMETRIC, 0.117},
        {g, 64, QRL_INT4_SYMMETRIC, 0.16},  {g, 64, QRL_INT4_ASYMMETRIC, 0.135},
        {k, 32, QRL_INT4_SYMMETRIC, 0.29},  {k, 32, QRL_INT4_ASYMMETRIC, 0.165},
        {k, 64, QRL_INT4_SYMMETRIC, 0.35},  {k, 64, QRL_INT4_ASYMMETRIC, 0.26},
    };
    double e[8];
    for (int i = 0; i < 8; i++) {
        e[i] = kv_int4_err(c[i].x, c[i].g, c[i].m);
        cr_assert_lt(e[i], c[i].bound, "case %d: %g", i, e[i]);
        cr_assert_gt(e[i], c[i].bound / 3, "case %d: %g", i, e[i]);
    }
    /* the documented choice: asymmetric wins on both, by far on K-like data */
    cr_assert_lt(e[1], e[0]);
    cr_assert_lt(e[5], 0.7 * e[4]);
    free(g); free(k);
}

Test(kv_formats, fp8_int8_fp4_error_bounds) {
    float *x = malloc(sizeof(float) * NV * D), *y = malloc(sizeof(float) * NV * D);
    td_rng r = {72};
    td_fill_gauss(&r, x, NV * D, 2.0);
    /* fp8: per-head scale from the first 64 vectors; later vectors may exceed it */
    float s = qrl_kv_fp8_head_scale(x, 64, D, 4.0f);
    cr_assert_eq(s, 4.0f * qrl_quant_absmax(x, 64 * D, NULL) / 448.0f);
    cr_assert_eq(qrl_kv_fp8_head_scale(x, 0, D, 4.0f), 1.0f);
    uint8_t codes[D];
    for (int t = 0; t < NV; t++) {
        qrl_kv_fp8_quantize(x + t * D, D, s, codes);
        qrl_kv_fp8_dequantize(codes, D, s, y + t * D);
    }
    double e = td_rel_err(x, y, NV * D); /* measured 0.026 */
    cr_assert_lt(e, 0.04, "kv fp8 %g", e);
    /* saturation beyond 448 * scale */
    float big[D] = {0};
    big[0] = 1000.0f * 448.0f * s;
    qrl_kv_fp8_quantize(big, D, s, codes);
    cr_assert_eq(codes[0], 0x7E);
    /* int8 per token-head */
    int8_t q8[NV * D];
    float s8[NV];
    qrl_int8_quantize_rows(x, NV, D, q8, s8);
    qrl_int8_dequantize_rows(q8, s8, NV, D, y);
    e = td_rel_err(x, y, NV * D); /* measured 0.0064 */
    cr_assert_lt(e, 0.0096, "kv int8 %g", e);
    /* fp4: NVFP4 per token-head vector */
    for (int t = 0; t < NV; t++) qrl_nvfp4_fake_quantize_row(x + t * D, D, y + t * D);
    e = td_rel_err(x, y, NV * D); /* measured 0.095 */
    cr_assert_lt(e, 0.14, "kv fp4 %g", e);
    free(x); free(y);
}

/* ---- side-cache slots ---------------------------------------------------------------- */

Test(kv_protected, slot_map_hand_checked) {
    /* sink 2, recent 3, 10 positions: 0,1 -> 0,1; 7,8,9 -> ring 2 + (p-2)%3 */
    const int64_t want[10] = {0, 1, -1, -1, -1, -1, -1, 4, 2, 3};
    for (int p = 0; p < 10; p++) cr_assert_eq(qrl_kv_protected_slot(p, 10, 2, 3), want[p], "pos %d", p);
    cr_assert_eq(qrl_kv_protected_slot(10, 10, 2, 3), -1);
    cr_assert_eq(qrl_kv_protected_slot(-1, 10, 2, 3), -1);
    /* short sequence: everything protected, slots distinct */
    cr_assert_eq(qrl_kv_protected_slot(3, 4, 2, 3), 3);
    cr_assert_eq(qrl_kv_protected_slot(5, 6, 0, 0), -1);
}

/* ---- attention ----------------------------------------------------------------------- */

#define NP 300
#define HD 64
#define SINK 16
#define RECENT 128

typedef struct {
    float k[NP * HD], v[NP * HD];                  /* original F32 */
    uint8_t kc[NP * HD / 2], vc[NP * HD / 2];      /* INT4 of every position */
    float ks[NP * 2], vs[NP * 2], kz[NP * 2], vz[NP * 2];
    int8_t k8[(SINK + RECENT) * HD], v8[(SINK + RECENT) * HD];
    float k8s[SINK + RECENT], v8s[SINK + RECENT];
    qrl_kv_int4_store K4, V4;
    qrl_kv_int8_store K8, V8;
} cache;

/* Append positions 0..n_pos-1 one by one, as a rollout would: INT4 always, INT8 into the
 * slot the position gets when it is the newest token (overwriting the ring). */
static void cache_build_n(cache *c, qrl_int4_mode mode, uint64_t seed, int n_pos) {
    td_rng r = {seed};
    td_fill_klike(&r, c->k, NP, HD);
    td_fill_gauss(&r, c->v, NP * HD, 1.0);
    for (int p = 0; p < n_pos; p++) {
        qrl_kv_int4_quantize(c->k + p * HD, HD, 32, mode, c->kc + p * HD / 2, c->ks + p * 2, c->kz + p * 2);
        qrl_kv_int4_quantize(c->v + p * HD, HD, 32, mode, c->vc + p * HD / 2, c->vs + p * 2, c->vz + p * 2);
        int64_t slot = qrl_kv_protected_slot(p, p + 1, SINK, RECENT);
        cr_assert_geq(slot, 0);
        qrl_int8_quantize_rows(c->k + p * HD, 1, HD, c->k8 + slot * HD, c->k8s + slot);
        qrl_int8_quantize_rows(c->v + p * HD, 1, HD, c->v8 + slot * HD, c->v8s + slot);
    }
    c->K4 = (qrl_kv_int4_store){HD, 32, mode, c->kc, c->ks, c->kz};
    c->V4 = (qrl_kv_int4_store){HD, 32, mode, c->vc, c->vs, c->vz};
    c->K8 = (qrl_kv_int8_store){HD, c->k8, c->k8s};
    c->V8 = (qrl_kv_int8_store){HD, c->v8, c->v8s};
}

static void cache_build(cache *c, qrl_int4_mode mode, uint64_t seed) {
    cache_build_n(c, mode, seed, NP);
}

/* Direct softmax attention in double over the dequantized cache (INT8 where a slot
 * exists for (sink, recent), INT4 elsewhere). */
static void direct_attention(const cache *c, const float *q, int n_pos, int sink, int recent,
                             float scale, double *out) {
    static float k[NP][HD], v[NP][HD];
    double s[NP], m = -INFINITY, l = 0;
    for (int p = 0; p < n_pos; p++) {
        int64_t slot = qrl_kv_protected_slot(p, n_pos, sink, recent);
        if (slot >= 0) {
            qrl_int8_dequantize_rows(c->k8 + slot * HD, c->k8s + slot, 1, HD, k[p]);
            qrl_int8_dequantize_rows(c->v8 + slot * HD, c->v8s + slot, 1, HD, v[p]);
        } else {
            qrl_kv_int4_dequantize(c->kc + p * HD / 2, c->ks + p * 2, c->kz + p * 2, HD, 32, c->K4.mode, k[p]);
            qrl_kv_int4_dequantize(c->vc + p * HD / 2, c->vs + p * 2, c->vz + p * 2, HD, 32, c->V4.mode, v[p]);
        }
        s[p] = 0;
        for (int d = 0; d < HD; d++) s[p] += (double)q[d] * k[p][d];
        s[p] *= scale;
        if (s[p] > m) m = s[p];
    }
    for (int d = 0; d < HD; d++) out[d] = 0;
    for (int p = 0; p < n_pos; p++) {
        double w = exp(s[p] - m);
        l += w;
        for (int d = 0; d < HD; d++) out[d] += w * v[p][d];
    }
    for (int d = 0; d < HD; d++) out[d] /= l;
}

static double rel_err_d(const float *y, const double *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static cache C4;

Test(kv_protected, matches_direct_computation_and_plain_int4) {
    const float scale = 1.0f / 8.0f;
    for (int mode = 0; mode < 2; mode++) {
        td_rng r = {90};
        for (int trial = 0; trial < 8; trial++) {
            float q[HD], out[HD], out4[HD], out0[HD];
            double ref[HD];
            td_fill_gauss(&r, q, HD, 1.0);
            int n_pos = trial == 0 ? 100 : (trial == 1 ? SINK + RECENT + 1 : NP - trial);
            /* trial 0: 100 < sink + recent, all positions protected */
            cache_build_n(&C4, (qrl_int4_mode)mode, 80 + mode, n_pos);
            cr_assert_eq(qrl_attention_int4_protected(q, n_pos, &C4.K4, &C4.V4, &C4.K8, &C4.V8,
                                                      SINK, RECENT, scale, out, NULL), QRL_OK);
            direct_attention(&C4, q, n_pos, SINK, RECENT, scale, ref);
            double e = rel_err_d(out, ref, HD);
            cr_assert_lt(e, 1e-6, "mode %d trial %d: protected vs direct %g", mode, trial, e);
            /* plain INT4 vs its direct computation, and sink = recent = 0 is bitwise plain */
            cr_assert_eq(qrl_attention_int4(q, n_pos, &C4.K4, &C4.V4, scale, out4, NULL), QRL_OK);
            direct_attention(&C4, q, n_pos, 0, 0, scale, ref);
            e = rel_err_d(out4, ref, HD);
            cr_assert_lt(e, 1e-6, "mode %d trial %d: int4 vs direct %g", mode, trial, e);
            cr_assert_eq(qrl_attention_int4_protected(q, n_pos, &C4.K4, &C4.V4, &C4.K8, &C4.V8,
                                                      0, 0, scale, out0, NULL), QRL_OK);
            cr_assert_arr_eq(out0, out4, sizeof out4, "mode %d trial %d: sink=recent=0", mode, trial);
        }
    }
}

Test(kv_protected, protected_positions_round_trip_at_int8_precision) {
    cache_build(&C4, QRL_INT4_ASYMMETRIC, 81);
    for (int p = 0; p < NP; p++) {
        int64_t slot = qrl_kv_protected_slot(p, NP, SINK, RECENT);
        cr_assert_eq(slot >= 0, p < SINK || p >= NP - RECENT, "pos %d", p);
        if (slot < 0) continue;
        float k[HD];
        qrl_int8_dequantize_rows(C4.k8 + slot * HD, C4.k8s + slot, 1, HD, k);
        for (int d = 0; d < HD; d++)
            cr_assert_leq(fabsf(k[d] - C4.k[p * HD + d]), 0.5f * C4.k8s[slot] * 1.0001f,
                          "pos %d dim %d", p, d);
    }
}

Test(kv_protected, protection_reduces_error_against_f32_attention) {
    cache_build(&C4, QRL_INT4_ASYMMETRIC, 82);
    td_rng r = {91};
    double e4 = 0, ep = 0;
    float acc[HD];
    for (int trial = 0; trial < 32; trial++) {
        float q[HD], out[HD], ref[HD];
        td_fill_gauss(&r, q, HD, 1.0);
        qrl_attention_partial part = {0, 0, acc};
        qrl_attention_partial_f32(q, C4.k, C4.v, NP, HD, 0.125f, &part);
        qrl_attention_merge(&part, 1, HD, ref);
        qrl_attention_int4(q, NP, &C4.K4, &C4.V4, 0.125f, out, NULL);
        e4 += td_rel_err(ref, out, HD);
        qrl_attention_int4_protected(q, NP, &C4.K4, &C4.V4, &C4.K8, &C4.V8, SINK, RECENT,
                                     0.125f, out, NULL);
        ep += td_rel_err(ref, out, HD);
    }
    cr_assert_lt(ep, 0.8 * e4, "protected %g vs int4 %g (sums over 32 queries)", ep, e4);
}

Test(attention, merge_of_split_partials_equals_whole) {
    enum { N = 200 };
    static float k[N * HD], v[N * HD];
    float q[HD], whole[HD], merged[HD], acc[4][HD];
    td_rng r = {92};
    td_fill_gauss(&r, k, N * HD, 1.0);
    td_fill_gauss(&r, v, N * HD, 1.0);
    td_fill_gauss(&r, q, HD, 3.0); /* large scores: stresses the running-max rescale */
    qrl_attention_partial p[4];
    for (int i = 0; i < 4; i++) p[i] = (qrl_attention_partial){0, 0, acc[i]};
    qrl_attention_partial_f32(q, k, v, N, HD, 1.0f, &p[0]);
    qrl_attention_merge(p, 1, HD, whole);
    /* chunks [0,37), [37,37) empty, [37,200) split at 120 */
    qrl_attention_partial_f32(q, k, v, 37, HD, 1.0f, &p[0]);
    qrl_attention_partial_f32(q, k + 37 * HD, v + 37 * HD, 0, HD, 1.0f, &p[1]);
    qrl_attention_partial_f32(q, k + 37 * HD, v + 37 * HD, 83, HD, 1.0f, &p[2]);
    qrl_attention_partial_f32(q, k + 120 * HD, v + 120 * HD, 80, HD, 1.0f, &p[3]);
    cr_assert_eq(p[1].sum, 0.0f);
    cr_assert(isinf(p[1].max) && p[1].max < 0);
    qrl_attention_merge(p, 4, HD, merged);
    for (int d = 0; d < HD; d++) cr_assert(isfinite(merged[d]));
    double e = td_rel_err(whole, merged, HD);
    cr_assert_lt(e, 1e-6, "split vs whole %g", e);
    /* all empty -> zeros */
    p[0].sum = 0;
    p[0].max = -INFINITY;
    qrl_attention_merge(p, 2, HD, merged);
    for (int d = 0; d < HD; d++) cr_assert_eq(merged[d], 0.0f);
}

Test(attention, bad_arguments_are_refused) {
    cache_build(&C4, QRL_INT4_ASYMMETRIC, 83);
    float q[HD] = {0}, out[HD];
    qrl_error err;
    qrl_kv_int4_store bad = C4.V4;
    bad.head_dim = 32;
    cr_assert_eq(qrl_attention_int4(q, NP, &C4.K4, &bad, 1.0f, out, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "head_dim") != NULL, "%s", err.msg);
    cr_assert_eq(qrl_attention_int4(q, -1, &C4.K4, &C4.V4, 1.0f, out, &err), QRL_STATUS_INVALID_ARGUMENT);
    bad = C4.K4;
    bad.zeros = NULL;
    cr_assert_eq(qrl_attention_int4(q, NP, &bad, &C4.V4, 1.0f, out, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_attention_int4_protected(q, NP, &C4.K4, &C4.V4, NULL, &C4.V8, SINK, RECENT,
                                              1.0f, out, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "side cache") != NULL, "%s", err.msg);
    /* without protection the side cache is not needed */
    cr_assert_eq(qrl_attention_int4_protected(q, NP, &C4.K4, &C4.V4, NULL, NULL, 0, 0, 1.0f,
                                              out, &err), QRL_OK);
}
