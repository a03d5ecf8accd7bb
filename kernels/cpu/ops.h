/* CPU reference ops (STYLE 7): the numerical oracle for the CUDA kernels and the CPU
 * backend of the rollout.  Plain C11 + OpenMP.
 *
 * All tensors are row-major F32 unless stated.  Determinism: no op reduces across
 * threads; every output element is computed by one thread in a fixed order, so results
 * are bit-identical for any thread count, and one row of a batched call equals the same
 * row computed alone (batched decode == per-sequence prefill, bit for bit).
 *
 * Functions here never fail on valid shapes; shapes are the caller's invariant. */
#ifndef QRL_KERNELS_CPU_OPS_H
#define QRL_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"

/* ---- linear algebra --------------------------------------------------------------- */

/* out[n, m] = x[n, k] · w[m, k]^T (+ bias[m] when bias != NULL).  Each dot product is
 * accumulated in F32 with 8 interleaved partial sums in a fixed order.  out must not
 * alias x or w.  Parallel over output rows of w. */
void qrl_cpu_matmul(float *out, const float *x, const float *w, const float *bias, int n, int k,
                    int m);

/* F32 dot product of a[k] and b[k] in the same order as qrl_cpu_matmul. */
float qrl_cpu_dot(const float *a, const float *b, int k);

/* ---- normalization and pointwise -------------------------------------------------- */

/* RMSNorm over rows: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]
 * for r in [0, n); rows of length d.  Mean accumulated in double.  out may equal x. */
void qrl_cpu_rmsnorm(float *out, const float *x, const float *weight, int n, int d, float eps);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)), i in [0, n).  out may
 * equal gate or up. */
void qrl_cpu_silu_mul(float *out, const float *gate, const float *up, size_t n);

/* x[i] += y[i] (residual add), i in [0, n). */
void qrl_cpu_add(float *x, const float *y, size_t n);

/* In-place softmax of x[n] (max-subtracted; sum accumulated in double). */
void qrl_cpu_softmax(float *x, int n);

/* Index of the largest x[i] (the first one on ties, like llama2.c and torch.argmax);
 * NaN never wins.  n >= 1. */
int qrl_cpu_argmax(const float *x, int n);

/* ---- rotary position embedding ---------------------------------------------------- */

/* Which element pairs a rotation acts on.
 *   HALF:        (i, i + head_dim/2)  — HuggingFace rotate_half on permuted q/k weights
 *   INTERLEAVED: (2i, 2i + 1)        — GPT-J / Meta / llama2.c run.c */
typedef enum qrl_rope_layout {
    QRL_ROPE_LAYOUT_HALF = 0,
    QRL_ROPE_LAYOUT_INTERLEAVED = 1,
} qrl_rope_layout;

/* Frequency scaling (HF rope_type): NONE = "default", LINEAR = "linear" (inv_freq /
 * factor), LLAMA3 = "llama3" (Llama 3.1 smooth interpolation between low and high
 * frequency bands). */
typedef enum qrl_rope_scaling {
    QRL_ROPE_SCALING_NONE = 0,
    QRL_ROPE_SCALING_LINEAR = 1,
    QRL_ROPE_SCALING_LLAMA3 = 2,
} qrl_rope_scaling;

typedef struct qrl_rope_params {
    double theta;               /* base, e.g. 10000 or 500000 */
    qrl_rope_scaling scaling;
    double factor;              /* LINEAR, LLAMA3 */
    double low_freq_factor;     /* LLAMA3 */
    double high_freq_factor;    /* LLAMA3 */
    int original_max_position;  /* LLAMA3: original_max_position_embeddings */
    qrl_rope_layout layout;
} qrl_rope_params;

/* inv_freq[j] for j in [0, head_dim/2): 1 / theta^(2j/head_dim), rounded to F32 as the
 * sources do (llama2.c powf; HF float32 tensors), then scaled per p->scaling following
 * transformers' _compute_llama3_parameters / _compute_linear_scaling_rope_parameters.
 * head_dim even. */
void qrl_cpu_rope_inv_freq(float *inv_freq, int head_dim, const qrl_rope_params *p);

/* cos/sin of angle = (float)pos * inv_freq[j] (the product in F32, as both sources do),
 * j in [0, half). */
void qrl_cpu_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int half,
                          int pos);

/* Rotate x[n_heads, head_dim] in place with cos/sin[head_dim/2] in `layout`. */
void qrl_cpu_rope_apply(float *x, int n_heads, int head_dim, const float *cos_v,
                        const float *sin_v, qrl_rope_layout layout);

/* ---- attention over a paged KV cache ---------------------------------------------- */

/* Read-only view of one layer of a paged KV store: element (pos, kv_head, d) lives at
 * index block_table[pos / block_size] * block_elems + (pos % block_size) * n_kv_heads *
 * head_dim + kv_head * head_dim + d of `k` / `v`, block_elems = block_size * n_kv_heads *
 * head_dim.  dtype F32 or BF16. */
typedef struct qrl_kv_view {
    const void *k;
    const void *v;
    qrl_dtype dtype;
    const int32_t *block_table;
    int block_size;
    int n_kv_heads;
    int head_dim;
} qrl_kv_view;

/* Causal attention of one query head over positions [0, n_ctx) of kv_head:
 * out[head_dim] = softmax(q·K^T * scale) · V.  scratch holds n_ctx floats.  Serial
 * (callers parallelize over heads and rows). */
void qrl_cpu_attention_head(float *out, const float *q, const qrl_kv_view *kv, int kv_head,
                            int n_ctx, float scale, float *scratch);

/* ---- BF16 helpers (inline: the KV cache converts per element) ---------------------- */

static inline float qrl_cpu_bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t qrl_cpu_bf16_store(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
