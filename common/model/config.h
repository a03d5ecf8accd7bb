/* Model hyper-parameters of the Llama family (SPEC §2): read from a HuggingFace
 * config.json (transformers 4.x and 5.x layouts) or from a llama2.c .bin header. */
#ifndef QRL_MODEL_CONFIG_H
#define QRL_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "cpu/ops.h"

typedef enum qrl_model_arch {
    QRL_MODEL_ARCH_LLAMA = 0,   /* model_type "llama" (Llama-2/3), and llama2.c checkpoints */
    QRL_MODEL_ARCH_MISTRAL,     /* "mistral" */
    QRL_MODEL_ARCH_QWEN2,       /* "qwen2" (Qwen2, Qwen2.5): q/k/v bias */
    QRL_MODEL_ARCH_QWEN3,       /* "qwen3": per-head RMSNorm on q and k, explicit head_dim */
} qrl_model_arch;

#define QRL_MODEL_MAX_EOS 8

typedef struct qrl_model_config {
    qrl_model_arch arch;
    char model_type[32];      /* as written in config.json ("llama" for llama2.c) */
    int dim;                  /* hidden_size */
    int hidden_dim;           /* intermediate_size (SwiGLU width) */
    int n_layers;             /* num_hidden_layers */
    int n_heads;              /* num_attention_heads */
    int n_kv_heads;           /* num_key_value_heads (defaults to n_heads) */
    int head_dim;             /* head_dim if given (Qwen3), else dim / n_heads */
    int vocab_size;
    int max_seq_len;          /* max_position_embeddings (llama2.c: seq_len) */
    float norm_eps;           /* rms_norm_eps (llama2.c: 1e-5, as run.c) */
    qrl_rope_params rope;     /* theta, scaling, rotation layout */
    bool qkv_bias;            /* bias on q/k/v projections (Qwen2 always; attention_bias) */
    bool o_bias;              /* bias on o_proj (attention_bias on llama/qwen3) */
    bool qk_norm;             /* Qwen3 q_norm / k_norm, weights [head_dim] */
    bool tie_embeddings;      /* lm_head shares the token embedding */
    int sliding_window;       /* 0 = none; recorded but IGNORED: exact only while the
                                 sequence is <= sliding_window tokens */
    qrl_dtype dtype;          /* torch_dtype / dtype of the checkpoint (informational) */
    int bos_id;               /* -1 when absent */
    int n_eos;
    int eos_ids[QRL_MODEL_MAX_EOS];
} qrl_model_config;

/* Parse a HuggingFace config.json at `path` into *cfg.  Accepts transformers 4.x
 * (rope_theta, rope_scaling{rope_type|type, factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}, torch_dtype) and 5.x (rope_parameters{rope_theta,
 * rope_type, ...}, dtype).  The rotation layout is HALF (HF checkpoints store q/k
 * permuted for rotate_half).
 * Errors: IO (unreadable), PARSE (bad JSON, wrong field type; names file and field),
 * UNSUPPORTED (model_type outside {llama, mistral, qwen2, qwen3}, hidden_act not silu,
 * mlp_bias, unknown rope_type; names file and field), OUT_OF_RANGE (non-positive sizes,
 * heads not dividing). */
qrl_status qrl_model_config_load_hf(const char *path, qrl_model_config *cfg, qrl_error *err);

/* Same from an in-memory JSON text (`name` used in messages). */
qrl_status qrl_model_config_parse_hf(const char *json, size_t len, const char *name,
                                     qrl_model_config *cfg, qrl_error *err);

/* Fill *cfg from the 7 int32 of a llama2.c header: dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size (negative = untied classifier stored after the weights),
 * seq_len.  Layout INTERLEAVED, theta 10000, eps 1e-5, bos 1, eos 2 (run.c).
 * Errors: OUT_OF_RANGE naming `name` and the field. */
qrl_status qrl_model_config_from_llama2c(const int32_t hdr[7], const char *name,
                                         qrl_model_config *cfg, qrl_error *err);

/* Check the invariants every loader relies on (sizes positive, n_heads % n_kv_heads ==
 * 0, head_dim even).  OUT_OF_RANGE naming `name` and the field. */
qrl_status qrl_model_config_validate(const qrl_model_config *cfg, const char *name,
                                     qrl_error *err);

/* Number of parameters implied by the config (lm_head counted once when tied). */
int64_t qrl_model_config_n_params(const qrl_model_config *cfg);

#endif
