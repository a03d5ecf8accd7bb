/* KV-cache formats and the KV4-RL INT4 + INT8-protected attention reference (SPEC §3). */
#include <math.h>
#include <string.h>

#include "cpu/quant.h"

/* ---- fp8 (per-head scale) ----------------------------------------------------------- */

float qrl_kv_fp8_head_scale(const float *x, int64_t n_vec, int head_dim, float headroom) {
    float amax = qrl_quant_absmax(x, n_vec * head_dim, NULL);
    if (amax == 0.0f) return 1.0f;
    return headroom * amax / QRL_E4M3_MAX;
}

void qrl_kv_fp8_quantize(const float *x, int head_dim, float scale, uint8_t *codes) {
    for (int d = 0; d < head_dim; d++) codes[d] = qrl_e4m3_encode(x[d] / scale);
}

void qrl_kv_fp8_dequantize(const uint8_t *codes, int head_dim, float scale, float *x) {
    for (int d = 0; d < head_dim; d++) x[d] = qrl_e4m3_decode(codes[d]) * scale;
}

/* ---- int4 group-wise ---------------------------------------------------------------- */

static void int4_group_sym(const float *x, int n, uint8_t *q, float *scale) {
    float s = qrl_quant_absmax(x, n, NULL) / 7.0f;
    *scale = s;
    for (int i = 0; i < n; i++) {
        float v = (isnan(x[i]) || s == 0.0f) ? 0.0f : qrl_quant_round_half_even(x[i] / s);
        v = v > 7.0f ? 7.0f : (v < -7.0f ? -7.0f : v);
        q[i] = (uint8_t)((int)v & 0xF);
    }
}

static void int4_group_asym(const float *x, int n, uint8_t *q, float *scale, float *zero) {
    float mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i])) continue;
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    if (mn > mx) mn = mx = 0.0f; /* no finite element */
    float s = (float)(((double)mx - mn) / 15.0);
    *scale = s;
    *zero = mn;
    for (int i = 0; i < n; i++) {
        double v = 0.0;
        if (!isnan(x[i]) && s != 0.0f) {
            v = ((double)x[i] - mn) / s;
            v = v > 15.0 ? 15.0 : (v < 0.0 ? 0.0 : v); /* clamp first: Inf -> 15 */
            v = qrl_quant_round_half_even((float)v);
        }
        q[i] = (uint8_t)v;
    }
}

void qrl_kv_int4_quantize(const float *x, int head_dim, int group, qrl_int4_mode mode,
                          uint8_t *codes, float *scales, float *zeros) {
    QRL_CHECK(group > 0 && head_dim >= 0 && head_dim <= QRL_KV_MAX_HEAD_DIM);
    uint8_t q[QRL_KV_MAX_HEAD_DIM];
    for (int g = 0; g * group < head_dim; g++) {
        int j0 = g * group, n = head_dim - j0 < group ? head_dim - j0 : group;
        if (mode == QRL_INT4_SYMMETRIC) int4_group_sym(x + j0, n, q + j0, &scales[g]);
        else int4_group_asym(x + j0, n, q + j0, &scales[g], &zeros[g]);
    }
    qrl_nibble_pack(q, head_dim, codes);
}

void qrl_kv_int4_dequantize(const uint8_t *codes, const float *scales, const float *zeros,
                            int head_dim, int group, qrl_int4_mode mode, float *x) {
    for (int d = 0; d < head_dim; d++) {
        int c = qrl_nibble_get(codes, d), g = d / group;
        if (mode == QRL_INT4_SYMMETRIC) x[d] = (float)(c >= 8 ? c - 16 : c) * scales[g];
        else x[d] = fmaf((float)c, scales[g], zeros[g]);
    }
}

static void int4_store_row(const qrl_kv_int4_store *s, int64_t p, float *x) {
    int ng = qrl_kv_int4_groups(s->head_dim, s->group);
    qrl_kv_int4_dequantize(s->codes + p * qrl_nibble_row_bytes(s->head_dim),
                           s->scales + p * ng, s->zeros ? s->zeros + p * ng : NULL,
                           s->head_dim, s->group, s->mode, x);
}

static void int8_store_row(const qrl_kv_int8_store *s, int64_t slot, float *x) {
    for (int d = 0; d < s->head_dim; d++)
        x[d] = qrl_int8_decode(s->codes[slot * s->head_dim + d], s->scales[slot]);
}

int64_t qrl_kv_protected_slot(int64_t pos, int64_t n_pos, int sink, int recent) {
    if (pos < 0 || pos >= n_pos) return -1;
    if (pos < sink) return pos;
    if (recent > 0 && pos >= n_pos - recent) return sink + (pos - sink) % recent;
    return -1;
}

/* ---- partial softmax-attention and merge -------------------------------------------- */

static float score(const float *q, const float *k, int head_dim, float scale) {
    double dot = 0.0;
    for (int d = 0; d < head_dim; d++) dot += (double)q[d] * k[d];
    return (float)(dot * scale);
}

/* Partial over the positions i in [0, n) that `row` accepts (it returns false for the
 * others), in increasing order; two passes: the max first, then weights expf(s - max). */
typedef bool (*row_fn)(const void *ctx, int64_t i, float *k, float *v);

static void partial_generic(const float *q, int64_t n, int head_dim, float scale, row_fn row,
                            const void *ctx, qrl_attention_partial *out) {
    float k[QRL_KV_MAX_HEAD_DIM], v[QRL_KV_MAX_HEAD_DIM];
    double acc[QRL_KV_MAX_HEAD_DIM] = {0}, sum = 0.0;
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (!row(ctx, i, k, NULL)) continue;
        float s = score(q, k, head_dim, scale);
        if (s > m) m = s;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!row(ctx, i, k, v)) continue;
        float w = expf(score(q, k, head_dim, scale) - m);
        sum += w;
        for (int d = 0; d < head_dim; d++) acc[d] += (double)w * v[d];
    }
    out->max = m;
    out->sum = (float)sum;
    for (int d = 0; d < head_dim; d++) out->acc[d] = (float)acc[d];
}

typedef struct { const float *k, *v; int head_dim; } f32_ctx;

static bool f32_row(const void *ctx, int64_t i, float *k, float *v) {
    const f32_ctx *c = ctx;
    memcpy(k, c->k + i * c->head_dim, sizeof(float) * (size_t)c->head_dim);
    if (v) memcpy(v, c->v + i * c->head_dim, sizeof(float) * (size_t)c->head_dim);
    return true;
}

void qrl_attention_partial_f32(const float *q, const float *k, const float *v, int64_t n,
                               int head_dim, float scale, qrl_attention_partial *out) {
    QRL_CHECK(head_dim > 0 && head_dim <= QRL_KV_MAX_HEAD_DIM);
    f32_ctx c = {k, v, head_dim};
    partial_generic(q, n, head_dim, scale, f32_row, &c, out);
}

void qrl_attention_merge(const qrl_attention_partial *parts, int n_parts, int head_dim,
                         float *out) {
    float m = -INFINITY;
    for (int i = 0; i < n_parts; i++)
        if (parts[i].sum > 0.0f && parts[i].max > m) m = parts[i].max;
    float l = 0.0f;
    bool any = false;
    for (int i = 0; i < n_parts; i++) {
        if (!(parts[i].sum > 0.0f)) continue;
        float f = expf(parts[i].max - m);
        if (!any) {
            /* first term is assigned, not added to 0, so one partial passes through
             * bit-exactly (f == 1) whatever the sign of its zeros */
            l = parts[i].sum * f;
            for (int d = 0; d < head_dim; d++) out[d] = parts[i].acc[d] * f;
            any = true;
        } else {
            l += parts[i].sum * f;
            for (int d = 0; d < head_dim; d++) out[d] += parts[i].acc[d] * f;
        }
    }
    if (!any) {
        for (int d = 0; d < head_dim; d++) out[d] = 0.0f;
        return;
    }
    for (int d = 0; d < head_dim; d++) out[d] /= l;
}

/* ---- INT4 and INT4 + INT8-protected attention --------------------------------------- */

/* Rows of one region: the INT4 region (positions without a side-cache slot; all of
 * them for plain INT4) or the protected region (read from the INT8 side cache). */
typedef struct {
    const qrl_kv_int4_store *k4, *v4;
    const qrl_kv_int8_store *k8, *v8;
    int64_t n_pos;
    int sink, recent;
    bool protected_region;
} region_ctx;

static bool region_row(const void *ctx, int64_t p, float *k, float *v) {
    const region_ctx *c = ctx;
    int64_t slot = qrl_kv_protected_slot(p, c->n_pos, c->sink, c->recent);
    if (c->protected_region) {
        if (slot < 0) return false;
        int8_store_row(c->k8, slot, k);
        if (v) int8_store_row(c->v8, slot, v);
    } else {
        if (slot >= 0) return false;
        int4_store_row(c->k4, p, k);
        if (v) int4_store_row(c->v4, p, v);
    }
    return true;
}

static qrl_status check_int4(const char *what, const qrl_kv_int4_store *s, int head_dim,
                             qrl_error *err) {
    if (!s || !s->codes || !s->scales)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: NULL INT4 store", what);
    if (s->head_dim != head_dim || head_dim <= 0 || head_dim > QRL_KV_MAX_HEAD_DIM ||
        s->group <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: head_dim=%d group=%d (expected head_dim %d <= %d)", what,
                             s->head_dim, s->group, head_dim, QRL_KV_MAX_HEAD_DIM);
    if (s->mode == QRL_INT4_ASYMMETRIC && !s->zeros)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: asymmetric INT4 store without zeros", what);
    return QRL_OK;
}

/* n_parts 1: plain INT4 (sink/recent ignored); 2: INT4 region + protected region. */
static qrl_status attention_regions(const float *q, int64_t n_pos,
                                    const qrl_kv_int4_store *k4, const qrl_kv_int4_store *v4,
                                    const qrl_kv_int8_store *k8, const qrl_kv_int8_store *v8,
                                    int sink, int recent, float scale, float *out,
                                    int n_parts, qrl_error *err) {
    if (n_pos < 0 || sink < 0 || recent < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention: n_pos=%lld sink=%d recent=%d must be >= 0",
                             (long long)n_pos, sink, recent);
    int D = k4 ? k4->head_dim : 0;
    QRL_TRY(check_int4("attention k", k4, D, err));
    QRL_TRY(check_int4("attention v", v4, D, err));
    if (n_parts == 2 && (sink > 0 || recent > 0) &&
        (!k8 || !v8 || !k8->codes || !v8->codes || !k8->scales || !v8->scales ||
         k8->head_dim != D || v8->head_dim != D))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "attention: INT8 side cache missing or head_dim != %d", D);
    float acc[2][QRL_KV_MAX_HEAD_DIM];
    qrl_attention_partial parts[2] = {{0, 0, acc[0]}, {0, 0, acc[1]}};
    region_ctx c4 = {k4, v4, k8, v8, n_pos, sink, recent, false};
    partial_generic(q, n_pos, D, scale, region_row, &c4, &parts[0]);
    if (n_parts == 2) {
        region_ctx c8 = {k4, v4, k8, v8, n_pos, sink, recent, true};
        partial_generic(q, n_pos, D, scale, region_row, &c8, &parts[1]);
    }
    qrl_attention_merge(parts, n_parts, D, out);
    return QRL_OK;
}

qrl_status qrl_attention_int4(const float *q, int64_t n_pos, const qrl_kv_int4_store *k,
                              const qrl_kv_int4_store *v, float scale, float *out,
                              qrl_error *err) {
    return attention_regions(q, n_pos, k, v, NULL, NULL, 0, 0, scale, out, 1, err);
}

qrl_status qrl_attention_int4_protected(const float *q, int64_t n_pos,
                                        const qrl_kv_int4_store *k4,
                                        const qrl_kv_int4_store *v4,
                                        const qrl_kv_int8_store *k8,
                                        const qrl_kv_int8_store *v8, int sink, int recent,
                                        float scale, float *out, qrl_error *err) {
    return attention_regions(q, n_pos, k4, v4, k8, v8, sink, recent, scale, out, 2, err);
}
