/* Causal attention of one query head over a paged KV store (GQA: the caller maps query
 * head h to kv head h / (n_heads / n_kv_heads)).  Two passes (scores, then softmax and
 * the weighted sum of V): the reference form; the CUDA kernels use the online form and
 * are checked against this. */
#include <math.h>

#include "cpu/ops.h"

static inline size_t kv_index(const qrl_kv_view *kv, int pos, int kv_head) {
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim;
    size_t block_elems = (size_t)kv->block_size * row;
    return (size_t)kv->block_table[pos / kv->block_size] * block_elems +
           (size_t)(pos % kv->block_size) * row + (size_t)kv_head * kv->head_dim;
}

void qrl_cpu_attention_head(float *out, const float *q, const qrl_kv_view *kv, int kv_head,
                            int n_ctx, float scale, float *scratch) {
    int hd = kv->head_dim;
    float mx = -INFINITY;
    for (int t = 0; t < n_ctx; t++) {
        size_t idx = kv_index(kv, t, kv_head);
        float s;
        if (kv->dtype == QRL_DTYPE_F32) {
            s = qrl_cpu_dot(q, (const float *)kv->k + idx, hd);
        } else {
            const uint16_t *k = (const uint16_t *)kv->k + idx;
            float acc = 0;
            for (int d = 0; d < hd; d++) acc += q[d] * qrl_cpu_bf16_load(k[d]);
            s = acc;
        }
        s *= scale;
        scratch[t] = s;
        if (s > mx) mx = s;
    }
    double sum = 0;
    for (int t = 0; t < n_ctx; t++) {
        scratch[t] = expf(scratch[t] - mx);
        sum += scratch[t];
    }
    float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++) out[d] = 0;
    for (int t = 0; t < n_ctx; t++) {
        float p = scratch[t] * inv;
        size_t idx = kv_index(kv, t, kv_head);
        if (kv->dtype == QRL_DTYPE_F32) {
            const float *v = (const float *)kv->v + idx;
            for (int d = 0; d < hd; d++) out[d] += p * v[d];
        } else {
            const uint16_t *v = (const uint16_t *)kv->v + idx;
            for (int d = 0; d < hd; d++) out[d] += p * qrl_cpu_bf16_load(v[d]);
        }
    }
}
