/* Training layers that mix positions: RoPE (HF rotate_half) and causal grouped-query
 * attention over packed sequences (forward saving the row log-sum-exp, backward
 * recomputing the probabilities); see train_ops.h. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "cpu/ops.h"
#include "cpu/train_ops.h"
#include "cpu/train_internal.h"

/* ---- rotary position embedding ------------------------------------------------------------ */

void qrl_train_rope_inv_freq(float *inv_freq, int hd, const qrl_train_rope_config *cfg) {
    QRL_CHECK(hd > 0 && hd % 2 == 0 && cfg->theta > 0.0);
    qrl_rope_params p = {.theta = cfg->theta, .scaling = QRL_ROPE_SCALING_NONE};
    switch (cfg->scaling) {
    case QRL_TRAIN_ROPE_SCALING_NONE: break;
    case QRL_TRAIN_ROPE_SCALING_LINEAR:
        QRL_CHECK(cfg->factor > 0.0);
        p.scaling = QRL_ROPE_SCALING_LINEAR;
        p.factor = cfg->factor;
        break;
    case QRL_TRAIN_ROPE_SCALING_LLAMA3:
        QRL_CHECK(cfg->factor > 0.0 && cfg->high_freq_factor > cfg->low_freq_factor &&
                  cfg->original_max_position > 0);
        p = (qrl_rope_params){.theta = cfg->theta, .scaling = QRL_ROPE_SCALING_LLAMA3,
                              .factor = cfg->factor, .low_freq_factor = cfg->low_freq_factor,
                              .high_freq_factor = cfg->high_freq_factor,
                              .original_max_position = cfg->original_max_position};
        break;
    }
    /* the inference model's frequencies: one formula, so training and rollout agree */
    qrl_cpu_rope_inv_freq(inv_freq, hd, &p);
}

void qrl_train_rope_cos_sin(float *cos_t, float *sin_t, const int32_t *pos,
                            const float *inv_freq, int T, int hd) {
    QRL_CHECK(T > 0 && hd > 0 && hd % 2 == 0);
    int half = hd / 2;
#pragma omp parallel for schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * hd * 8))
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            float angle = (float)pos[t] * inv_freq[j];
            cos_t[(size_t)t * half + j] = (float)cos((double)angle);
            sin_t[(size_t)t * half + j] = (float)sin((double)angle);
        }
}

void qrl_train_rope_forward(float *y, const float *x, const float *cos_t, const float *sin_t,
                            int T, int nh, int hd) {
    QRL_CHECK(T > 0 && nh > 0 && hd > 0 && hd % 2 == 0);
    int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * nh * hd))
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
            const float *xh = x + ((size_t)t * nh + h) * hd;
            float *yh = y + ((size_t)t * nh + h) * hd;
            for (int j = 0; j < half; j++) {
                float x0 = xh[j], x1 = xh[j + half]; /* read both first: y may alias x */
                yh[j] = x0 * c[j] - x1 * s[j];
                yh[j + half] = x1 * c[j] + x0 * s[j];
            }
        }
}

void qrl_train_rope_backward(float *dx, const float *dy, const float *cos_t, const float *sin_t,
                             int T, int nh, int hd) {
    QRL_CHECK(T > 0 && nh > 0 && hd > 0 && hd % 2 == 0);
    int half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL((int64_t)T * nh * hd))
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
            const float *dyh = dy + ((size_t)t * nh + h) * hd;
            float *dxh = dx + ((size_t)t * nh + h) * hd;
            for (int j = 0; j < half; j++) {
                float d0 = dyh[j], d1 = dyh[j + half];
                dxh[j] += d0 * c[j] + d1 * s[j];
                dxh[j + half] += d1 * c[j] - d0 * s[j];
            }
        }
}

/* ---- attention ------------------------------------------------------------------------------ */

#define dot qrl_train_dot_

/* HF: scaling = head_dim ** -0.5 (a Python float), applied to q k^T in float32. */
static inline float attn_scale(int hd) { return (float)(1.0 / sqrt((double)hd)); }

/* A segment is a maximal run of equal consecutive ids (train_ops.h): the keys of query t
 * are [seg_start(t), t], the queries of key s are [s, seg_end(s)).  Finding the bounds
 * costs what the loop over them costs, and the loops never touch other segments, so a
 * packed row of many short sequences costs O(T * length), not O(T^2). */
static inline int seg_start(const int32_t *seg, int t) {
    int s = t;
    while (s > 0 && seg[s - 1] == seg[t]) s--;
    return s;
}
static inline int seg_end(const int32_t *seg, int T, int s) {
    int e = s + 1;
    while (e < T && seg[e] == seg[s]) e++;
    return e;
}
/* Unmasked (query, key) pairs times H * hd: the multiply-adds of one pass. */
static int64_t attn_work(const int32_t *seg, int T, int H, int hd) {
    int64_t pairs = 0;
    for (int t = 0, run = 0; t < T; t++) {
        run = (t > 0 && seg[t - 1] == seg[t]) ? run + 1 : 1;
        pairs += run;
    }
    return pairs * H * hd;
}

void qrl_train_attention_forward(float *out, float *lse, const float *q, const float *k,
                                 const float *v, const int32_t *seg, int T, int H, int Hkv,
                                 int hd) {
    QRL_CHECK(T > 0 && H > 0 && Hkv > 0 && hd > 0 && H % Hkv == 0);
    const int rep = H / Hkv;
    const float scale = attn_scale(hd);
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL(attn_work(seg, T, H, hd)))
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *qt = q + ((size_t)t * H + h) * hd;
            const int kh = h / rep;
            float *o = out + ((size_t)t * H + h) * hd;
            /* two passes over the keys (max, then exp-sum and weighted values): no
             * per-row scratch buffer, nothing allocated */
            const int s0 = seg_start(seg, t);
            float m = -INFINITY;
            for (int s = s0; s <= t; s++) {
                float sc = scale * dot(qt, k + ((size_t)s * Hkv + kh) * hd, hd);
                if (sc > m) m = sc;
            }
            memset(o, 0, (size_t)hd * sizeof *o);
            float sum = 0.0f;
            for (int s = s0; s <= t; s++) {
                float e = expf(scale * dot(qt, k + ((size_t)s * Hkv + kh) * hd, hd) - m);
                sum += e;
                const float *vs = v + ((size_t)s * Hkv + kh) * hd;
                for (int i = 0; i < hd; i++) o[i] += e * vs[i];
            }
            /* sum >= 1: the row's max contributes exp(0) */
            float inv = 1.0f / sum;
            for (int i = 0; i < hd; i++) o[i] *= inv;
            lse[(size_t)h * T + t] = m + logf(sum);
        }
}

void qrl_train_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const int32_t *seg,
                                  int T, int H, int Hkv, int hd) {
    QRL_CHECK(T > 0 && H > 0 && Hkv > 0 && hd > 0 && H % Hkv == 0);
    const int rep = H / Hkv;
    const float scale = attn_scale(hd);
    /* Two passes so that each gradient row has one writer (no atomics, thread-count
     * independent sums): dq by query row, then dk/dv by key row. */
    const int64_t work = attn_work(seg, T, H, hd);
    if (dq) {
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL(work))
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t th = (size_t)t * H + h;
                const float *qt = q + th * hd, *dot_ = dout + th * hd;
                const int kh = h / rep;
                const float l = lse[(size_t)h * T + t];
                const float Dt = dot(dot_, out + th * hd, hd); /* = sum_s P_s dP_s */
                float *dqt = dq + th * hd;
                for (int s = seg_start(seg, t); s <= t; s++) {
                    const float *ks = k + ((size_t)s * Hkv + kh) * hd;
                    const float *vs = v + ((size_t)s * Hkv + kh) * hd;
                    float p = expf(scale * dot(qt, ks, hd) - l);
                    float ds = p * (dot(dot_, vs, hd) - Dt);
                    for (int i = 0; i < hd; i++) dqt[i] += scale * ds * ks[i];
                }
            }
    }
    if (dk || dv) {
#pragma omp parallel for collapse(2) schedule(static) if (QRL_TRAIN_PARALLEL(work))
        for (int s = 0; s < T; s++)
            for (int kh = 0; kh < Hkv; kh++) {
                size_t sk = (size_t)s * Hkv + kh;
                const float *ks = k + sk * hd, *vs = v + sk * hd;
                const int t1 = seg_end(seg, T, s);
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t = s; t < t1; t++) {
                        size_t th = (size_t)t * H + h;
                        const float *qt = q + th * hd, *dot_ = dout + th * hd;
                        float p = expf(scale * dot(qt, ks, hd) - lse[(size_t)h * T + t]);
                        if (dv)
                            for (int i = 0; i < hd; i++) dv[sk * hd + i] += p * dot_[i];
                        if (dk) {
                            float Dt = dot(dot_, out + th * hd, hd);
                            float ds = p * (dot(dot_, vs, hd) - Dt);
                            for (int i = 0; i < hd; i++) dk[sk * hd + i] += scale * ds * qt[i];
                        }
                    }
            }
    }
}
