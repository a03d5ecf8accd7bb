/* Quantized KV-cache formats in the paged cache (common/model/kv_cache.c) and in the
 * forward pass: gathered rows equal the quant_kv.c codecs' round trip exactly;
 * int4-protected splits positions into the INT4 and INT8 regions as
 * qrl_kv_protected_slot says, protected rows round-trip at INT8 precision, attention
 * through the cache equals qrl_attention_int4_protected bit for bit, sink = recent = 0
 * equals int4; fp8 calibration, forks, shrinking; decode equals prefill bit for bit for
 * every format (the ring written and read row by row). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

#define HD 40 /* int4 groups 32 + 8, NVFP4 blocks 16 + 16 + 8 */
#define KVH 2
#define NPOS 40
#define SINK 4
#define RECENT 8

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static qrl_kv_cache *cache(qrl_kv_format f, int sink, int recent) {
    qrl_kv_cache_desc d = {.n_layers = 2, .n_kv_heads = KVH, .head_dim = HD, .block_size = 3,
                           .n_blocks = 60, .max_seqs = 3, .max_seq_len = 64, .format = f,
                           .protected_sink = sink, .protected_recent = recent};
    qrl_kv_cache *kv;
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    return kv;
}

/* K, V [NPOS][KVH][HD]: K with outlier channels, V Gaussian-ish. */
static float K[NPOS][KVH * HD], V[NPOS][KVH * HD];
static void fill(void) {
    for (int p = 0; p < NPOS; p++)
        for (int i = 0; i < KVH * HD; i++) {
            K[p][i] = frand() + (i % HD == 3 ? 6.0f : 0.0f);
            V[p][i] = frand() * 0.7f;
        }
}

static int write_all(qrl_kv_cache *kv, int layer) {
    qrl_error err;
    int seq;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv, seq, NPOS, &err), QRL_OK);
    qrl_kv_cache_calibrate(kv, seq, layer, K[0], V[0], 5); /* fp8: first 5 rows */
    for (int p = 0; p < NPOS; p++) qrl_kv_cache_write(kv, seq, layer, p, K[p], V[p]);
    qrl_kv_cache_set_len(kv, seq, NPOS);
    return seq;
}

/* The reference round trip of one vector in format f. */
static void round_trip(qrl_kv_format f, const float *x, float fp8_scale, float *out) {
    uint8_t codes[HD];
    float sc[4], z[4], g;
    int8_t q8[HD];
    uint8_t s4[4];
    switch (f) {
    case QRL_KV_FORMAT_F32: memcpy(out, x, sizeof(float) * HD); break;
    case QRL_KV_FORMAT_BF16:
        for (int i = 0; i < HD; i++) out[i] = qrl_bf16_decode(qrl_bf16_encode(x[i]));
        break;
    case QRL_KV_FORMAT_FP8:
        qrl_kv_fp8_quantize(x, HD, fp8_scale, codes);
        qrl_kv_fp8_dequantize(codes, HD, fp8_scale, out);
        break;
    case QRL_KV_FORMAT_INT8:
        qrl_int8_quantize_rows(x, 1, HD, q8, sc);
        qrl_int8_dequantize_rows(q8, sc, 1, HD, out);
        break;
    case QRL_KV_FORMAT_FP4:
        qrl_nvfp4_quantize_row(x, HD, codes, s4, &g);
        qrl_nvfp4_dequantize_row(codes, s4, g, HD, out);
        break;
    default:
        qrl_kv_int4_quantize(x, HD, 32, QRL_INT4_ASYMMETRIC, codes, sc, z);
        qrl_kv_int4_dequantize(codes, sc, z, HD, 32, QRL_INT4_ASYMMETRIC, out);
    }
}

static float fp8_scale_ref(const float (*x)[KVH * HD], int rows, int h) {
    float amax = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < HD; i++) amax = fmaxf(amax, fabsf(x[r][h * HD + i]));
    int e; /* headroom 4 x amax / 448, rounded up to a power of two */
    float m = frexpf(QRL_KV_FP8_DEFAULT_HEADROOM * amax / 448.0f, &e);
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

Test(kv_quant, gathered_rows_equal_the_codec_round_trip) {
    fill();
    static float k[NPOS * HD], v[NPOS * HD], want[HD];
    for (int f = 0; f < QRL_KV_FORMAT_COUNT_; f++) {
        qrl_kv_format fmt = (qrl_kv_format)f;
        qrl_kv_cache *kv = cache(fmt, 0, 0);
        int seq = write_all(kv, 1);
        for (int h = 0; h < KVH; h++) {
            int n4;
            qrl_kv_cache_gather(kv, seq, 1, h, NPOS, k, v, &n4);
            cr_assert_eq(n4, NPOS);
            for (int p = 0; p < NPOS; p++) {
                round_trip(fmt, K[p] + h * HD, fp8_scale_ref(K, 5, h), want);
                cr_assert_eq(memcmp(k + p * HD, want, sizeof want), 0, "%s K pos %d head %d",
                             qrl_kv_format_name(fmt), p, h);
                round_trip(fmt, V[p] + h * HD, fp8_scale_ref(V, 5, h), want);
                cr_assert_eq(memcmp(v + p * HD, want, sizeof want), 0, "%s V pos %d",
                             qrl_kv_format_name(fmt), p);
            }
        }
        cr_assert(qrl_kv_cache_vector_bytes(fmt, HD) > 0);
        qrl_kv_cache_free(kv);
    }
    cr_assert_eq(qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_INT4, 128), 64 + 32);
    cr_assert_eq(qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_FP4, 128), 4 + 8 + 64);
    cr_assert_eq(qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_INT8, 128), 132);
    cr_assert_eq(qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_FP8, 128), 128);
}

Test(kv_quant, protected_regions_and_int8_round_trip) {
    fill();
    static float k[NPOS * HD], v[NPOS * HD], want[HD];
    qrl_kv_cache *kv = cache(QRL_KV_FORMAT_INT4_PROTECTED, SINK, RECENT);
    int seq = write_all(kv, 0);
    int n4;
    qrl_kv_cache_gather(kv, seq, 0, 1, NPOS, k, v, &n4);
    cr_assert_eq(n4, NPOS - SINK - RECENT);
    int row = 0; /* INT4 region: positions 4..31 in order */
    for (int p = SINK; p < NPOS - RECENT; p++, row++) {
        round_trip(QRL_KV_FORMAT_INT4, K[p] + HD, 0, want);
        cr_assert_eq(memcmp(k + row * HD, want, sizeof want), 0, "int4 row %d (pos %d)", row, p);
    }
    double worst = 0; /* protected: 0..3, then 32..39, at INT8 precision */
    for (int p = 0; p < NPOS; p++) {
        if (p >= SINK && p < NPOS - RECENT) continue;
        round_trip(QRL_KV_FORMAT_INT8, V[p] + HD, 0, want);
        cr_assert_eq(memcmp(v + row * HD, want, sizeof want), 0, "int8 row %d (pos %d)", row, p);
        float step = qrl_quant_absmax(K[p] + HD, HD, NULL) / 127.0f;
        for (int i = 0; i < HD; i++) {
            double e = fabs(k[row * HD + i] - K[p][HD + i]);
            cr_assert(e <= 0.5 * step * (1 + 1e-6), "pos %d elem %d: error %g > half step %g",
                      p, i, e, 0.5 * step);
            worst = fmax(worst, e / step);
        }
        row++;
    }
    cr_assert_eq(row, NPOS);
    fprintf(stderr, "protected positions: worst error %.3f INT8 steps\n", worst);
    /* a window ending earlier (attention of position 20): ring slots hold 32..39, so
     * only the sink is protected */
    qrl_kv_cache_gather(kv, seq, 0, 1, 21, k, v, &n4);
    cr_assert_eq(n4, 21 - SINK);
    /* shrink to 30: ring entries past the length are dropped; 22..29 read at INT4 */
    qrl_kv_cache_set_len(kv, seq, 30);
    qrl_kv_cache_gather(kv, seq, 0, 1, 30, k, v, &n4);
    cr_assert_eq(n4, 30 - SINK);
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_reserve(kv, seq, 31, &err), QRL_OK);
    qrl_kv_cache_write(kv, seq, 0, 30, K[30], V[30]);
    qrl_kv_cache_gather(kv, seq, 0, 1, 31, k, v, &n4);
    cr_assert_eq(n4, 31 - SINK - 1, "the rewritten position is protected again");
    qrl_kv_cache_free(kv);
}

/* The KV4-RL attention through the cache (gather + two partials + merge, as the forward
 * pass computes it) against qrl_attention_int4_protected on contiguous stores. */
static void cache_attention(const qrl_kv_cache *kv, int seq, int n_ctx, const float *q,
                            float scale, float *out) {
    static float k[NPOS * HD], v[NPOS * HD];
    float acc[2][HD];
    int n4;
    qrl_kv_cache_gather(kv, seq, 0, 0, n_ctx, k, v, &n4);
    qrl_attention_partial parts[2] = {{0, 0, acc[0]}, {0, 0, acc[1]}};
    qrl_attention_partial_f32(q, k, v, n4, HD, scale, &parts[0]);
    qrl_attention_partial_f32(q, k + n4 * HD, v + n4 * HD, n_ctx - n4, HD, scale, &parts[1]);
    qrl_attention_merge(parts, 2, HD, out);
}

Test(kv_quant, cache_attention_equals_the_kv4rl_reference) {
    fill();
    int ng = qrl_kv_int4_groups(HD, 32), nb = (HD + 1) / 2;
    static uint8_t c4k[NPOS][(HD + 1) / 2], c4v[NPOS][(HD + 1) / 2];
    static float s4k[NPOS][2], z4k[NPOS][2], s4v[NPOS][2], z4v[NPOS][2];
    static int8_t c8k[SINK + RECENT][HD], c8v[SINK + RECENT][HD];
    static float s8k[SINK + RECENT], s8v[SINK + RECENT];
    float q[HD], want[HD], got[HD], scale = 1.0f / sqrtf(HD);
    for (int i = 0; i < HD; i++) q[i] = frand();
    int sinks[] = {0, SINK, 0, SINK}, recents[] = {0, 0, RECENT, RECENT};
    for (int c = 0; c < 4; c++) {
        int sink = sinks[c], recent = recents[c];
        qrl_kv_cache *kv = cache(QRL_KV_FORMAT_INT4_PROTECTED, sink, recent);
        qrl_error err;
        int seq;
        cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
        cr_assert_eq(qrl_kv_cache_reserve(kv, seq, NPOS, &err), QRL_OK);
        for (int p = 0; p < NPOS; p++) {
            qrl_kv_cache_write(kv, seq, 0, p, K[p], V[p]);
            qrl_kv_int4_quantize(K[p], HD, 32, QRL_INT4_ASYMMETRIC, c4k[p], s4k[p], z4k[p]);
            qrl_kv_int4_quantize(V[p], HD, 32, QRL_INT4_ASYMMETRIC, c4v[p], s4v[p], z4v[p]);
            int64_t slot = qrl_kv_protected_slot(p, p + 1, sink, recent);
            if (slot >= 0) {
                qrl_int8_quantize_rows(K[p], 1, HD, c8k[slot], &s8k[slot]);
                qrl_int8_quantize_rows(V[p], 1, HD, c8v[slot], &s8v[slot]);
            }
            /* attention of position p right after its write, as the forward does */
            qrl_kv_int4_store k4 = {HD, 32, QRL_INT4_ASYMMETRIC, c4k[0], s4k[0], z4k[0]};
            qrl_kv_int4_store v4 = {HD, 32, QRL_INT4_ASYMMETRIC, c4v[0], s4v[0], z4v[0]};
            qrl_kv_int8_store k8 = {HD, c8k[0], s8k}, v8 = {HD, c8v[0], s8v};
            cr_assert_eq(qrl_attention_int4_protected(q, p + 1, &k4, &v4, &k8, &v8, sink, recent,
                                                      scale, want, &err),
                         QRL_OK, "%s", err.msg);
            cache_attention(kv, seq, p + 1, q, scale, got);
            cr_assert_eq(memcmp(got, want, sizeof got), 0, "sink %d recent %d pos %d", sink,
                         recent, p);
            if (sink == 0 && recent == 0) {
                cr_assert_eq(qrl_attention_int4(q, p + 1, &k4, &v4, scale, want, &err), QRL_OK);
                cr_assert_eq(memcmp(got, want, sizeof got), 0, "sink=recent=0 is int4 (pos %d)", p);
            }
        }
        (void)ng, (void)nb;
        qrl_kv_cache_free(kv);
    }
}

Test(kv_quant, fp8_calibration_forks_and_reset) {
    fill();
    static float k[(NPOS + 1) * HD], v[(NPOS + 1) * HD], k2[(NPOS + 1) * HD], v2[(NPOS + 1) * HD],
        want[HD];
    qrl_kv_cache *kv = cache(QRL_KV_FORMAT_FP8, 0, 0);
    qrl_error err;
    int a = write_all(kv, 0), b, n4;
    /* calibrating again does nothing: scales stay those of the first 5 rows */
    qrl_kv_cache_calibrate(kv, a, 0, K[10], V[10], 1);
    cr_assert_eq(qrl_kv_cache_seq_fork(kv, a, &b, &err), QRL_OK);
    qrl_kv_cache_gather(kv, a, 0, 0, NPOS, k, v, &n4);
    qrl_kv_cache_gather(kv, b, 0, 0, NPOS, k2, v2, &n4);
    cr_assert_eq(memcmp(k, k2, sizeof k), 0);
    cr_assert_eq(memcmp(v, v2, sizeof v), 0);
    /* a value 10x past the calibration saturates at 448 * scale */
    float big[KVH * HD];
    for (int i = 0; i < KVH * HD; i++) big[i] = 1000.0f;
    cr_assert_eq(qrl_kv_cache_reserve(kv, b, NPOS + 1, &err), QRL_OK);
    qrl_kv_cache_write(kv, b, 0, NPOS, big, big);
    qrl_kv_cache_gather(kv, b, 0, 0, NPOS + 1, k2, v2, &n4);
    cr_assert_float_eq(k2[NPOS * HD], 448.0f * fp8_scale_ref(K, 5, 0), 1e-3);
    /* power-of-two scales: calibrating on other rows (here 5x larger ones) changes the
     * stored values only where x / scale falls below the E4M3 normal range (2^-6) */
    qrl_kv_cache *kv2 = cache(QRL_KV_FORMAT_FP8, 0, 0);
    int e;
    cr_assert_eq(qrl_kv_cache_seq_new(kv2, &e, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv2, e, NPOS, &err), QRL_OK);
    static float K5[NPOS][KVH * HD];
    for (int p = 0; p < NPOS; p++)
        for (int i = 0; i < KVH * HD; i++) K5[p][i] = 5.0f * K[p][i];
    qrl_kv_cache_calibrate(kv2, e, 0, K5[0], K5[0], NPOS);
    for (int p = 0; p < NPOS; p++) qrl_kv_cache_write(kv2, e, 0, p, K[p], V[p]);
    qrl_kv_cache_gather(kv2, e, 0, 0, NPOS, k2, v2, &n4);
    float s_all = fp8_scale_ref(K5, NPOS, 0), s5 = fp8_scale_ref(K, 5, 0);
    cr_assert(s_all != s5, "the two calibrations should differ for this check to mean much");
    int differ = 0;
    for (int i = 0; i < NPOS * HD; i++)
        if (k[i] != k2[i]) {
            differ++;
            cr_assert(fabsf(K[i / HD][i % HD]) < 0x1p-6f * fmaxf(s_all, s5), "elem %d", i);
        }
    fprintf(stderr, "fp8 scales %g vs %g: %d of %d K values differ (all below 2^-6 scale)\n", s5,
            s_all, differ, NPOS * HD);
    qrl_kv_cache_free(kv2);
    /* a fresh sequence in the freed slot calibrates anew (from its first write) */
    qrl_kv_cache_seq_free(kv, a);
    int c;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &c, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv, c, 1, &err), QRL_OK);
    qrl_kv_cache_write(kv, c, 0, 0, K[7], V[7]);
    qrl_kv_cache_gather(kv, c, 0, 0, 1, k, v, &n4);
    round_trip(QRL_KV_FORMAT_FP8, K[7], fp8_scale_ref(K + 7, 1, 0), want);
    cr_assert_eq(memcmp(k, want, sizeof want), 0);
    qrl_kv_cache_free(kv);
}

Test(kv_quant, fork_copies_the_side_cache) {
    fill();
    static float k[NPOS * HD], v[NPOS * HD], k2[NPOS * HD], v2[NPOS * HD];
    qrl_kv_cache *kv = cache(QRL_KV_FORMAT_INT4_PROTECTED, SINK, RECENT);
    qrl_error err;
    int a = write_all(kv, 1), b, n4, m4;
    cr_assert_eq(qrl_kv_cache_seq_fork(kv, a, &b, &err), QRL_OK);
    qrl_kv_cache_seq_free(kv, a); /* the copy must not depend on the source */
    int c = write_all(kv, 0);     /* reuses a's slot and blocks with other layer-0 data */
    (void)c;
    qrl_kv_cache_gather(kv, b, 1, 0, NPOS, k, v, &n4);
    int d = write_all(kv, 1);
    qrl_kv_cache_gather(kv, d, 1, 0, NPOS, k2, v2, &m4);
    cr_assert_eq(n4, m4);
    cr_assert_eq(memcmp(k, k2, sizeof k), 0);
    cr_assert_eq(memcmp(v, v2, sizeof v), 0);
    qrl_kv_cache_free(kv);
}

/* ---- forward pass over quantized caches -------------------------------------------- */

static qrl_model *tiny_model(void) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 48, .hidden_dim = 64, .n_layers = 2,
                          .n_heads = 4, .n_kv_heads = 2, .head_dim = 24, .vocab_size = 61,
                          .max_seq_len = 64, .norm_eps = 1e-6f, .qk_norm = true,
                          .rope = {.theta = 10000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 11);
    return m;
}

#define NP 6  /* prompt */
#define NG 30 /* continuation */

/* Logits [NP + NG - 1 .. ] of the continuation positions: prefill the prompt, then either
 * decode token by token (decode = true) or prefill the rest in one call. */
static void run(const qrl_model *m, qrl_kv_format fmt, int sink, int recent, bool decode,
                float *out) {
    qrl_kv_cache_desc d = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 24, .block_size = 5,
                           .n_blocks = 16, .max_seqs = 2, .max_seq_len = 64, .format = fmt,
                           .protected_sink = sink, .protected_recent = recent};
    qrl_kv_cache *kv;
    qrl_forward *f;
    qrl_error err;
    int seq, V = m->cfg.vocab_size;
    int32_t ids[NP + NG];
    for (int i = 0; i < NP + NG; i++) ids[i] = (i * 31 + 7) % V;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 8, 64, &f, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, NP, out, false, &err), QRL_OK);
    if (decode) {
        for (int i = 0; i < NG; i++)
            cr_assert_eq(qrl_forward_decode(f, kv, &seq, &ids[NP + i], 1, out + (size_t)(i + 1) * V,
                                            &err),
                         QRL_OK, "%s", err.msg);
    } else {
        cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids + NP, NG, out + V, true, &err), QRL_OK);
    }
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

Test(kv_quant, decode_equals_prefill_for_every_format) {
    qrl_model *m = tiny_model();
    size_t n = (size_t)(NG + 1) * m->cfg.vocab_size;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    float *i4 = malloc(n * sizeof(float)), *f32 = malloc(n * sizeof(float));
    run(m, QRL_KV_FORMAT_F32, 0, 0, false, f32);
    run(m, QRL_KV_FORMAT_INT4, 0, 0, true, i4);
    for (int f = 0; f < QRL_KV_FORMAT_COUNT_; f++) {
        int sink = f == QRL_KV_FORMAT_INT4_PROTECTED ? 3 : 0;
        int recent = f == QRL_KV_FORMAT_INT4_PROTECTED ? 5 : 0; /* the ring wraps 5 times */
        run(m, (qrl_kv_format)f, sink, recent, true, a);
        run(m, (qrl_kv_format)f, sink, recent, false, b);
        cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "%s: decode != prefill",
                     qrl_kv_format_name((qrl_kv_format)f));
        double md = 0;
        for (size_t i = 0; i < n; i++) md = fmax(md, fabs(a[i] - f32[i]));
        fprintf(stderr, "kv %-15s max |logit - f32| = %.3g\n", qrl_kv_format_name((qrl_kv_format)f), md);
        if (f != QRL_KV_FORMAT_F32) cr_assert(md > 0, "%s had no effect", qrl_kv_format_name((qrl_kv_format)f));
        if (f == QRL_KV_FORMAT_INT4_PROTECTED)
            cr_assert_neq(memcmp(a, i4, n * sizeof(float)), 0, "protection had no effect");
    }
    run(m, QRL_KV_FORMAT_INT4_PROTECTED, 0, 0, true, a);
    cr_assert_eq(memcmp(a, i4, n * sizeof(float)), 0, "sink=recent=0 must equal int4 bitwise");
    free(a), free(b), free(i4), free(f32);
    qrl_model_free(m);
}
