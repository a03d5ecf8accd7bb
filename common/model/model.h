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
} qrl_model;

/* Allocate a zero-filled model for `cfg` (validated first): one arena for all weights,
 * the tensor table, and rope_inv_freq computed from cfg.rope.  *out owned by the caller
 * (qrl_model_free).  Errors: OUT_OF_RANGE (bad config), NOMEM. */
qrl_status qrl_model_new(const qrl_model_config *cfg, qrl_model **out, qrl_error *err);
void qrl_model_free(qrl_model *m);

/* Load a checkpoint: a directory is a HuggingFace folder, a file a llama2.c .bin.
 * Errors: see the two loaders. */
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

/* Find a tensor by HF name; NULL when the model has none of that name. */
const qrl_model_tensor *qrl_model_find_tensor(const qrl_model *m, const char *name);

/* Fill every weight with deterministic values from (seed): N(0, std) for matrices
 * (std = 0.02 * sqrt(768 / D) so activations stay O(1)), 1 + N(0, 0.1) for norm gains,
 * N(0, 0.02) for biases.  For tests and benchmarks. */
void qrl_model_init_random(qrl_model *m, uint64_t seed);

/* Round every weight to the nearest BF16 value (round-to-nearest-even), in place: the
 * weight side of --precision bf16. */
void qrl_model_round_bf16(qrl_model *m);

#endif
