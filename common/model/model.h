/* Llama-family model weights in one F32 arena (SPEC §2; STYLE 6: sized from the config
 * and allocated once at load).  Loaders: HuggingFace checkpoint folders (safetensors,
 * F32/BF16/F16 converted to F32) and llama2.c .bin files.
 *
 * The struct is public so the forward pass, the CUDA uploader and the learner can read
 * the weights directly; treat every pointer as read-only borrowed memory owned by the
 * model (valid until qrl_model_free). */
#ifndef QRL_MODEL_MODEL_H
#define QRL_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "model/linear.h"

/* One decoder layer; shapes use D = dim, Q = n_heads * head_dim, KV = n_kv_heads *
 * head_dim, F = hidden_dim.  Weights are [out, in] (nn.Linear). */
typedef struct qrl_layer_weights {
    float *attn_norm;  /* [D]      input_layernorm */
    float *wq;         /* [Q, D]   q_proj */
    float *wk;         /* [KV, D]  k_proj */
    float *wv;         /* [KV, D]  v_proj */
    float *wo;         /* [D, Q]   o_proj */
    float *bq, *bk, *bv; /* [Q], [KV], [KV] or NULL (cfg.qkv_bias) */
    float *bo;         /* [D] or NULL (cfg.o_bias) */
    float *q_norm;     /* [head_dim] or NULL (cfg.qk_norm) */
    float *k_norm;     /* [head_dim] or NULL */
    float *ffn_norm;   /* [D]      post_attention_layernorm */
    float *w_gate;     /* [F, D]   gate_proj (llama2.c w1) */
    float *w_up;       /* [F, D]   up_proj   (llama2.c w3) */
    float *w_down;     /* [D, F]   down_proj (llama2.c w2) */
} qrl_layer_weights;

typedef enum qrl_model_source {
    QRL_MODEL_SOURCE_MEMORY = 0, /* qrl_model_new (tests, benchmarks) */
    QRL_MODEL_SOURCE_HF,
    QRL_MODEL_SOURCE_LLAMA2C,
} qrl_model_source;

/* A named weight inside the arena, with its HF name ("model.layers.3.mlp.up_proj.weight").
 * lm_head.weight appears only when untied. */
typedef struct qrl_model_tensor {
    char name[64];
    int ndim;           /* 1 or 2 */
    int64_t shape[2];
    float *data;        /* points into the arena */
} qrl_model_tensor;

/* The projections of one decoder layer, in qrl_model.linears order. */
typedef enum qrl_linear_slot {
    QRL_LINEAR_Q = 0, /* q_proj    [Q, D]  reads input_layernorm's output */
    QRL_LINEAR_K,     /* k_proj    [KV, D] reads input_layernorm's output */
    QRL_LINEAR_V,     /* v_proj    [KV, D] reads input_layernorm's output */
    QRL_LINEAR_O,     /* o_proj    [D, Q]  reads the attention output */
    QRL_LINEAR_GATE,  /* gate_proj [F, D]  reads post_attention_layernorm's output */
    QRL_LINEAR_UP,    /* up_proj   [F, D]  reads post_attention_layernorm's output */
    QRL_LINEAR_DOWN,  /* down_proj [D, F]  reads silu(gate) * up */
    QRL_LINEAR_SLOTS
} qrl_linear_slot;

typedef struct qrl_model {
    qrl_model_config cfg;      /* cfg.rope.layout records the rotation the source needs */
    qrl_model_source source;
    float *arena;              /* every weight below, plus rope_inv_freq */
    size_t arena_floats;
    float *tok_embedding;      /* [vocab, D] */
    float *final_norm;         /* [D] */
    float *lm_head;            /* [vocab, D]; == tok_embedding when cfg.tie_embeddings */
    qrl_layer_weights *layers; /* [n_layers] */
    float *rope_inv_freq;      /* [head_dim / 2], scaling applied (qrl_cpu_rope_inv_freq) */
    qrl_model_tensor *tensors; /* [n_tensors] in HF order */
    int n_tensors;
    /* Rollout precision (SPEC §3).  The F32 master weights above stay the source of
     * truth (learner, export, UAQ); `linears` are what the forward pass runs. */
    qrl_precision precision;   /* QRL_PRECISION_F32 until qrl_model_quantize */
    qrl_linear *linears;       /* [n_layers * QRL_LINEAR_SLOTS] (qrl_model_linear) */
    qrl_linear lm_head_linear; /* [vocab, D]; never quantized: F32 (BF16 under bf16) */
    void *quant_storage;       /* one block holding every quantized linear's codes */
    float uaq_scale;           /* 1 = no UAQ; s after qrl_model_apply_uaq */
} qrl_model;

/* Linear `slot` of layer `layer` (borrowed, valid until the next quantize/UAQ/free). */
static inline const qrl_linear *qrl_model_linear(const qrl_model *m, int layer,
                                                 qrl_linear_slot slot) {
    return &m->linears[(size_t)layer * QRL_LINEAR_SLOTS + slot];
}

/* Trainable parameters: the F32 floats of the arena before rope_inv_freq, which the
 * arena keeps last (qrl_model_new): the flat block AdamW and the training engines
 * update. */
static inline size_t qrl_model_param_count(const qrl_model *m) {
    return (size_t)(m->rope_inv_freq - m->arena);
}

/* Allocate a zero-filled model for `cfg` (validated first): one arena for all weights,
 * the tensor table, and rope_inv_freq computed from cfg.rope.  *out owned by the caller
 * (qrl_model_free).  Errors: OUT_OF_RANGE (bad config), NOMEM. */
qrl_status qrl_model_new(const qrl_model_config *cfg, qrl_model **out, qrl_error *err);
void qrl_model_free(qrl_model *m);

/* Load a checkpoint: a directory is a HuggingFace folder, a file a llama2.c .bin.
 * Errors: see the two loaders; INVALID_ARGUMENT naming what to do for a folder that is a
 * qrl-learner checkpoint (step folder or root: "export it first: qrl-learner export ...")
 * or a launch.sh run folder (its model is RUN/final). */
qrl_status qrl_model_load(const char *path, qrl_model **out, qrl_error *err);

/* HuggingFace folder: <dir>/config.json and <dir>/model.safetensors or
 * <dir>/model.safetensors.index.json.  Tied models may store the matrix under
 * lm_head.weight only (no model.embed_tokens.weight); that is accepted.
 * Errors: config errors (qrl_model_config_load_hf), NOT_FOUND (no weights file; missing
 * tensor, named), CORRUPT (tensor shape disagrees with config.json: name, expected and
 * found shapes), UNSUPPORTED (tensor dtype not F32/BF16/F16), IO, NOMEM. */
qrl_status qrl_model_load_hf(const char *dir, qrl_model **out, qrl_error *err);

/* llama2.c legacy (version 0) checkpoint: 7 int32 header, then F32 weights in run.c's
 * order (token embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the
 * unused freq_cis_real/imag tables, then wcls when vocab_size < 0).  RoPE layout
 * INTERLEAVED.  Errors: IO, CORRUPT (file shorter or longer than the header implies:
 * expected and actual bytes; ak42-magic exports), OUT_OF_RANGE (header fields). */
qrl_status qrl_model_load_llama2c(const char *path, qrl_model **out, qrl_error *err);

/* Write `m` as a HuggingFace folder `dir` (created when missing): config.json
 * (transformers 4.x keys) and model.safetensors in `dtype` (F32, or BF16 rounded to
 * nearest even), HF tensor names.  llama2.c models (interleaved RoPE) get their q/k rows
 * permuted to HF's rotate_half order, so qrl_model_load_hf(dir) computes the same
 * logits.  Files are replaced atomically.  The tokenizer is not written.
 * Errors: INVALID_ARGUMENT (other dtype; UAQ applied: export undoes it first), IO, NOMEM. */
qrl_status qrl_model_save_hf(const qrl_model *m, const char *dir, qrl_dtype dtype,
                             qrl_error *err);

/* Find a tensor by HF name; NULL when the model has none of that name. */
const qrl_model_tensor *qrl_model_find_tensor(const qrl_model *m, const char *name);

/* Fill every weight with deterministic values from (seed): N(0, std) for matrices
 * (std = 0.02 * sqrt(768 / D) so activations stay O(1)), 1 + N(0, 0.1) for norm gains,
 * N(0, 0.02) for biases.  For tests and benchmarks. */
void qrl_model_init_random(qrl_model *m, uint64_t seed);

/* Round every weight to the nearest BF16 value (round-to-nearest-even), in place: the
 * weight side of --precision bf16. */
void qrl_model_round_bf16(qrl_model *m);

/* Set the rollout precision (SPEC §3 table; common/model/linear.h for each format).
 *  - f32: the linears run the F32 master weights (the state after load).
 *  - bf16: every weight, embedding and norms included, is rounded to BF16 IN PLACE
 *    (qrl_model_round_bf16; irreversible: reload to get the F32 weights back) and the
 *    linears, LM head included, round their inputs to BF16 with F32 accumulation.
 *  - w8a8-int8, w8a8-fp8, w4a16-nvfp4, w4a16-mxfp4, w4a4-nvfp4: the seven projections of
 *    every layer (q, k, v, o, gate, up, down) are quantized from the F32 master weights
 *    into one storage block owned by the model; the token embedding, the norms, the
 *    biases and the LM head (tied or not) stay F32, as vLLM and QuRL keep lm_head and
 *    embeddings in the model's high precision by default.
 * Calling it again re-quantizes from the master weights (after UAQ, for one).
 * Errors: INVALID_ARGUMENT (bad precision; hidden_dim above the INT8 GEMM limit),
 * NOMEM.  On error the model keeps its previous precision. */
qrl_status qrl_model_quantize(qrl_model *m, qrl_precision p, qrl_error *err);

/* UAQ, update-aware quantization (SPEC §3; docs/uaq.md): rescale the F32 master weights
 * through W·x = (W/s)·(s·x), then re-quantize them at the model's precision:
 *   input_layernorm, post_attention_layernorm gains  × s
 *   q_proj, k_proj, gate_proj                        ÷ s  (they read a scaled norm)
 *   v_proj, up_proj                                  ÷ s · s = unchanged (they read a
 *       scaled norm, and absorb the input scale of o_proj / down_proj); v bias × s
 *   o_proj, down_proj                                ÷ s  (their input is scaled by s)
 *   final norm × s and lm_head ÷ s only when the LM head is untied.
 * The q_norm/k_norm gains (Qwen3) are untouched: they normalize q and k per head, which
 * q_proj/k_proj ÷ s leave as they were.  Logits are unchanged up to float rounding.
 * s must be finite and > 0; s = 1 is a no-op.  Errors: INVALID_ARGUMENT (bad s, UAQ
 * already applied: undo it first), re-quantization errors. */
qrl_status qrl_model_apply_uaq(qrl_model *m, float s, qrl_error *err);
/* The inverse (for export): multiply/divide back by m->uaq_scale and reset it to 1.
 * Each weight comes back within 2^-23 relative of its value before apply (x/s·s or
 * x·s/s: two correctly rounded operations; measured max 8.9e-8 for s = 1.5), exactly
 * when s is a power of two or the weights are BF16 values (x·1.5 is then exact).  No-op
 * when no UAQ is applied.  Errors: re-quantization errors. */
qrl_status qrl_model_undo_uaq(qrl_model *m, qrl_error *err);

#endif
