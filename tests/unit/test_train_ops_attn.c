/* RoPE and causal grouped-query attention over packed sequences (train_ops.h): frequency
 * tables against the HF formulas, finite-difference checks against double references
 * written here (HF apply_rotary_pos_emb / eager_attention_forward with a block-diagonal
 * causal mask), and packed == separate sequences.  Method and bound: gradcheck.h. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu/train_ops.h"
#include "gradcheck.h"

/* ---- RoPE frequencies --------------------------------------------------------------------- */

static const qrl_train_rope_config llama3_cfg = {
    .theta = 500000.0, .scaling = QRL_TRAIN_ROPE_SCALING_LLAMA3, .factor = 8.0,
    .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_position = 8192};

Test(train_rope, inv_freq_default_linear_llama3) {
    enum { HD = 8 };
    float f[HD / 2];
    double base[HD / 2];
    for (int j = 0; j < HD / 2; j++) base[j] = 1.0 / pow(500000.0, 2.0 * j / HD);

    qrl_train_rope_config cfg = {.theta = 500000.0};
    qrl_train_rope_inv_freq(f, HD, &cfg);
    for (int j = 0; j < HD / 2; j++) cr_expect(fabs(f[j] / base[j] - 1) < 1e-6, "default j=%d", j);

    cfg.scaling = QRL_TRAIN_ROPE_SCALING_LINEAR, cfg.factor = 4.0;
    qrl_train_rope_inv_freq(f, HD, &cfg);
    for (int j = 0; j < HD / 2; j++)
        cr_expect(fabs(f[j] / (base[j] / 4.0) - 1) < 1e-6, "linear j=%d", j);

    /* llama3 (factor 8, low 1, high 4, original context 8192): wavelengths 2 pi / f are
     * 6.3 and 167 (< 8192/4: kept), 4443 (between: smoothed), 118000 (> 8192: / 8) */
    qrl_train_rope_inv_freq(f, HD, &llama3_cfg);
    double want[HD / 2];
    for (int j = 0; j < HD / 2; j++) {
        double wl = 2 * M_PI / base[j];
        if (wl < 2048.0) want[j] = base[j];
        else if (wl > 8192.0) want[j] = base[j] / 8.0;
        else {
            double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            want[j] = (1 - sm) * base[j] / 8.0 + sm * base[j];
        }
        cr_expect(fabs(f[j] / want[j] - 1) < 1e-6, "llama3 j=%d: %.9g want %.9g", j, f[j], want[j]);
    }
    /* the three branches are all exercised */
    cr_expect_eq(want[1], base[1]);
    cr_expect(want[2] > base[2] / 8.0 * 1.5 && want[2] < base[2] * 0.5, "j=2 smoothed");
    cr_expect_eq(want[3], base[3] / 8.0);
}

Test(train_rope, cos_sin_use_explicit_positions) {
    enum { T = 7, HD = 8 };
    const int32_t pos[T] = {0, 1, 2, 0, 1, 1000, 70000};
    float f[HD / 2], c[T * HD / 2], s[T * HD / 2];
    qrl_train_rope_inv_freq(f, HD, &llama3_cfg);
    qrl_train_rope_cos_sin(c, s, pos, f, T, HD);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < HD / 2; j++) {
            double a = (double)((float)pos[t] * f[j]); /* HF: float32 product */
            cr_expect(fabs(c[t * HD / 2 + j] - cos(a)) <= 6e-8, "cos t=%d j=%d", t, j);
            cr_expect(fabs(s[t * HD / 2 + j] - sin(a)) <= 6e-8, "sin t=%d j=%d", t, j);
        }
    /* a segment restarting at position 0 gets the identity rotation */
    for (int j = 0; j < HD / 2; j++)
        cr_expect(c[3 * HD / 2 + j] == 1.0f && s[3 * HD / 2 + j] == 0.0f);
}

/* ---- RoPE gradient ------------------------------------------------------------------------------ */

typedef struct { const double *cos_t, *sin_t; int T, nh, hd; } rope_ctx;

/* HF: q * cos + rotate_half(q) * sin with cos = cat(freqs, freqs).cos() and
 * rotate_half(x) = cat(-x[hd/2:], x[:hd/2]). */
static void rope_ref(const gc_case *c, double *y) {
    const rope_ctx *x = c->ctx;
    int half = x->hd / 2;
    for (int t = 0; t < x->T; t++)
        for (int h = 0; h < x->nh; h++) {
            const double *xh = c->in[0] + (t * x->nh + h) * x->hd;
            double *yh = y + (t * x->nh + h) * x->hd;
            for (int i = 0; i < x->hd; i++) {
                double cf = x->cos_t[t * half + i % half], sf = x->sin_t[t * half + i % half];
                double rot = i < half ? -xh[i + half] : xh[i - half];
                yh[i] = xh[i] * cf + rot * sf;
            }
        }
}

Test(train_rope, grad_is_inverse_rotation) {
    gc_rng r = {21};
    enum { T = 5, NH = 3, HD = 8, N = T * NH * HD };
    const int32_t pos[T] = {0, 1, 2, 0, 1}; /* two packed segments */
    float f[HD / 2], c32[T * HD / 2], s32[T * HD / 2];
    qrl_train_rope_inv_freq(f, HD, &llama3_cfg);
    qrl_train_rope_cos_sin(c32, s32, pos, f, T, HD);
    double cd[T * HD / 2], sd[T * HD / 2];
    for (int i = 0; i < T * HD / 2; i++) cd[i] = c32[i], sd[i] = s32[i];
    rope_ctx cx = {cd, sd, T, NH, HD};
    gc_case c = {.name = "rope", .n_in = 1, .in_name = {"x"}, .in = {gc_rand(&r, N, -1, 1)},
                 .in_len = {N}, .out_len = N, .fwd = rope_ref, .ctx = &cx};
    double *cot = gc_rand(&r, N, -1, 1);
    float *x = gc_to_f32(c.in[0], N), *dy = gc_to_f32(cot, N), *y = gc_zeros(N);
    float *dx = gc_prefilled(N);
    qrl_train_rope_forward(y, x, c32, s32, T, NH, HD);
    qrl_train_rope_backward(dx, dy, c32, s32, T, NH, HD);
    gc_check(&c, y, cot, (float *[GC_MAX_IN]){dx});
    /* in place gives the same bits */
    qrl_train_rope_forward(x, x, c32, s32, T, NH, HD);
    cr_expect(memcmp(x, y, sizeof(float) * N) == 0, "in-place rope differs");
    gc_free(&c);
    free(cot), free(x), free(dy), free(y), free(dx);
}

/* ---- attention ------------------------------------------------------------------------------------ */

typedef struct { const int32_t *seg; int T, H, Hkv, hd; } attn_ctx;

/* Eager attention, one query row at a time: scores with the mask as -inf, softmax,
 * weighted values; kv head of query head h = h / (H / Hkv) (HF repeat_kv).  The mask:
 * number the runs of equal consecutive segment ids; s is visible to t iff s <= t and
 * both lie in the same run. */
static void attn_ref(const gc_case *c, double *y) {
    const attn_ctx *x = c->ctx;
    const double *q = c->in[0], *k = c->in[1], *v = c->in[2];
    double sc[64];
    int run[64];
    cr_assert(x->T <= 64);
    for (int t = 0; t < x->T; t++) run[t] = t == 0 ? 0 : run[t - 1] + (x->seg[t] != x->seg[t - 1]);
    for (int t = 0; t < x->T; t++)
        for (int h = 0; h < x->H; h++) {
            int kh = h / (x->H / x->Hkv);
            double m = -INFINITY, sum = 0.0;
            for (int s = 0; s < x->T; s++) {
                if (s > t || run[s] != run[t]) { sc[s] = -INFINITY; continue; }
                double d = 0.0;
                for (int i = 0; i < x->hd; i++)
                    d += q[(t * x->H + h) * x->hd + i] * k[(s * x->Hkv + kh) * x->hd + i];
                sc[s] = d / sqrt((double)x->hd);
                m = fmax(m, sc[s]);
            }
            for (int s = 0; s < x->T; s++) sum += exp(sc[s] - m);
            for (int i = 0; i < x->hd; i++) {
                double o = 0.0;
                for (int s = 0; s < x->T; s++)
                    o += exp(sc[s] - m) / sum * v[(s * x->Hkv + kh) * x->hd + i];
                y[(t * x->H + h) * x->hd + i] = o;
            }
        }
}

static void run_attention(const char *name, int T, int H, int Hkv, int hd, const int32_t *seg,
                          uint64_t seed) {
    gc_rng r = {seed};
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * Hkv * hd;
    attn_ctx cx = {seg, T, H, Hkv, hd};
    gc_case c = {.name = name, .n_in = 3, .in_name = {"q", "k", "v"},
                 .in = {gc_rand(&r, nq, -1.5, 1.5), gc_rand(&r, nk, -1.5, 1.5),
                        gc_rand(&r, nk, -1, 1)},
                 .in_len = {nq, nk, nk}, .out_len = nq, .fwd = attn_ref, .ctx = &cx};
    double *cot = gc_rand(&r, nq, -1, 1);
    float *q = gc_to_f32(c.in[0], nq), *k = gc_to_f32(c.in[1], nk), *v = gc_to_f32(c.in[2], nk);
    float *dout = gc_to_f32(cot, nq), *out = gc_zeros(nq), *lse = gc_zeros((size_t)H * T);
    float *dq = gc_prefilled(nq), *dk = gc_prefilled(nk), *dv = gc_prefilled(nk);
    qrl_train_attention_forward(out, lse, q, k, v, seg, T, H, Hkv, hd);
    qrl_train_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, T, H, Hkv, hd);
    gc_check(&c, out, cot, (float *[GC_MAX_IN]){dq, dk, dv});
    gc_free(&c);
    free(cot), free(q), free(k), free(v), free(dout), free(out), free(lse);
    free(dq), free(dk), free(dv);
}

Test(train_attention, grad_gqa_two_segments) {
    const int32_t seg[5] = {0, 0, 0, 1, 1};
    run_attention("attn T5 H3 kv1 hd4", 5, 3, 1, 4, seg, 31);
}

Test(train_attention, grad_gqa_three_segments) {
    const int32_t seg[7] = {5, 5, 2, 2, 2, 9, 9};
    run_attention("attn T7 H4 kv2 hd6", 7, 4, 2, 6, seg, 32);
}

Test(train_attention, grad_segment_id_coming_back_starts_a_new_segment) {
    /* ids 3 3 1 1 3 3: three segments; tokens 4, 5 must not see tokens 0, 1 */
    const int32_t seg[6] = {3, 3, 1, 1, 3, 3};
    run_attention("attn T6 H2 kv1 hd3 ABA", 6, 2, 1, 3, seg, 35);
}

Test(train_attention, grad_mha_one_sequence) {
    const int32_t seg[6] = {0, 0, 0, 0, 0, 0};
    run_attention("attn T6 H2 kv2 hd5", 6, 2, 2, 5, seg, 33);
}

Test(train_attention, hand_values) {
    /* hd 1 (scale 1): token 1 scores [0, ln 2] -> p = [1/3, 2/3], out = 3/3 + 2*6/3 = 5,
     * lse = ln 3.  In its own segment, token 1 sees only itself: out = 6, lse = ln 2. */
    float q[2] = {1, 1}, k[2] = {0, logf(2.0f)}, v[2] = {3, 6}, out[2], lse[2];
    const int32_t one[2] = {0, 0}, two[2] = {0, 1};
    qrl_train_attention_forward(out, lse, q, k, v, one, 2, 1, 1, 1);
    cr_expect_float_eq(out[0], 3.0f, 1e-6f);
    cr_expect_float_eq(out[1], 5.0f, 1e-5f);
    cr_expect_float_eq(lse[1], logf(3.0f), 1e-6f);
    qrl_train_attention_forward(out, lse, q, k, v, two, 2, 1, 1, 1);
    cr_expect_float_eq(out[1], 6.0f, 1e-6f);
    cr_expect_float_eq(lse[1], logf(2.0f), 1e-6f);
}

Test(train_attention, packed_equals_separate_sequences) {
    /* Segments [0, 3) and [3, 7) packed in one batch give bit-identical outputs, lse and
     * gradients to the two sequences run alone. */
    gc_rng r = {34};
    enum { T = 7, H = 4, KV = 2, HD = 6, NQ = T * H * HD, NK = T * KV * HD };
    const int32_t seg[T] = {0, 0, 0, 1, 1, 1, 1}, zeros[T] = {0};
    double *dq_ = gc_rand(&r, NQ, -1, 1), *dk_ = gc_rand(&r, NK, -1, 1);
    double *dv_ = gc_rand(&r, NK, -1, 1), *dd_ = gc_rand(&r, NQ, -1, 1);
    float *q = gc_to_f32(dq_, NQ), *k = gc_to_f32(dk_, NK), *v = gc_to_f32(dv_, NK);
    float *dout = gc_to_f32(dd_, NQ);
    float out[NQ], lse[H * T], gq[NQ] = {0}, gk[NK] = {0}, gv[NK] = {0};
    qrl_train_attention_forward(out, lse, q, k, v, seg, T, H, KV, HD);
    qrl_train_attention_backward(gq, gk, gv, dout, q, k, v, out, lse, seg, T, H, KV, HD);
    const int start[2] = {0, 3}, len[2] = {3, 4};
    for (int p = 0; p < 2; p++) {
        int L = len[p], o = start[p];
        float so[NQ], sl[H * T], sq[NQ] = {0}, sk[NK] = {0}, sv[NK] = {0};
        const float *qq = q + o * H * HD, *kk = k + o * KV * HD, *vv = v + o * KV * HD;
        const float *dd = dout + o * H * HD;
        qrl_train_attention_forward(so, sl, qq, kk, vv, zeros, L, H, KV, HD);
        qrl_train_attention_backward(sq, sk, sv, dd, qq, kk, vv, so, sl, zeros, L, H, KV, HD);
        cr_expect(memcmp(so, out + o * H * HD, sizeof(float) * L * H * HD) == 0, "out %d", p);
        for (int h = 0; h < H; h++)
            cr_expect(memcmp(sl + h * L, lse + h * T + o, sizeof(float) * L) == 0, "lse %d", p);
        cr_expect(memcmp(sq, gq + o * H * HD, sizeof(float) * L * H * HD) == 0, "dq %d", p);
        cr_expect(memcmp(sk, gk + o * KV * HD, sizeof(float) * L * KV * HD) == 0, "dk %d", p);
        cr_expect(memcmp(sv, gv + o * KV * HD, sizeof(float) * L * KV * HD) == 0, "dv %d", p);
    }
    free(dq_), free(dk_), free(dv_), free(dd_), free(q), free(k), free(v), free(dout);
}
