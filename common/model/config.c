/* Model config parsing: HuggingFace config.json (transformers 4.x / 5.x) and llama2.c
 * headers.  Defaults follow the transformers config classes of each model_type. */
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"

/* ---- typed field readers (each names the file and the field on error) ------------- */

static qrl_status get_int(json_t *obj, const char *name, const char *key, bool required,
                          int def, int *out, qrl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return qrl_error_set(err, QRL_STATUS_PARSE, "%s: missing field '%s'", name, key);
        *out = def;
        return QRL_OK;
    }
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < INT32_MIN || x > INT32_MAX)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: field '%s' = %lld is out of range",
                                 name, key, (long long)x);
        *out = (int)x;
        return QRL_OK;
    }
    return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field '%s' must be an integer", name, key);
}

static qrl_status get_num(json_t *obj, const char *name, const char *key, double def,
                          double *out, qrl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return QRL_OK;
    }
    if (!json_is_number(v))
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field '%s' must be a number", name, key);
    *out = json_number_value(v);
    return QRL_OK;
}

static qrl_status get_bool(json_t *obj, const char *name, const char *key, bool def, bool *out,
                           qrl_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return QRL_OK;
    }
    if (!json_is_boolean(v))
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field '%s' must be true or false", name,
                             key);
    *out = json_is_true(v);
    return QRL_OK;
}

/* String field or NULL when absent/null. */
static qrl_status get_str(json_t *obj, const char *name, const char *key, const char **out,
                          qrl_error *err) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return QRL_OK;
    if (!json_is_string(v))
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field '%s' must be a string", name, key);
    *out = json_string_value(v);
    return QRL_OK;
}

/* rope_scaling (4.x) or rope_parameters (5.x) object → cfg->rope.  `field` names it. */
static qrl_status parse_rope_obj(json_t *ro, const char *name, const char *field,
                                 qrl_model_config *cfg, qrl_error *err) {
    char key[96];
    const char *type = NULL;
    snprintf(key, sizeof key, "%s.rope_type", field);
    QRL_TRY(get_str(ro, key, "rope_type", &type, err));
    if (!type) QRL_TRY(get_str(ro, key, "type", &type, err)); /* older 4.x spelling */
    if (json_object_get(ro, "rope_theta"))
        QRL_TRY(get_num(ro, name, "rope_theta", cfg->rope.theta, &cfg->rope.theta, err));
    if (!type || strcmp(type, "default") == 0) {
        cfg->rope.scaling = QRL_ROPE_SCALING_NONE;
        return QRL_OK;
    }
    double factor = 0;
    QRL_TRY(get_num(ro, name, "factor", 0, &factor, err));
    if (strcmp(type, "linear") == 0) {
        if (!(factor > 0))
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: %s.factor must be > 0", name,
                                 field);
        cfg->rope.scaling = QRL_ROPE_SCALING_LINEAR;
        cfg->rope.factor = factor;
        return QRL_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        cfg->rope.scaling = QRL_ROPE_SCALING_LLAMA3;
        cfg->rope.factor = factor;
        QRL_TRY(get_num(ro, name, "low_freq_factor", 0, &cfg->rope.low_freq_factor, err));
        QRL_TRY(get_num(ro, name, "high_freq_factor", 0, &cfg->rope.high_freq_factor, err));
        QRL_TRY(get_int(ro, name, "original_max_position_embeddings", true, 0,
                        &cfg->rope.original_max_position, err));
        if (!(factor > 0) || !(cfg->rope.low_freq_factor > 0) ||
            !(cfg->rope.high_freq_factor > cfg->rope.low_freq_factor) ||
            cfg->rope.original_max_position <= 0)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "%s: %s (llama3) needs factor > 0, 0 < low_freq_factor < "
                                 "high_freq_factor and original_max_position_embeddings > 0",
                                 name, field);
        return QRL_OK;
    }
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                         "%s: %s.rope_type '%s' is not supported (default, linear, llama3)", name,
                         field, type);
}

static qrl_status parse_dtype(const char *s, qrl_dtype *out) {
    if (!s || strcmp(s, "float32") == 0) *out = QRL_DTYPE_F32;
    else if (strcmp(s, "bfloat16") == 0) *out = QRL_DTYPE_BF16;
    else if (strcmp(s, "float16") == 0) *out = QRL_DTYPE_F16;
    else return QRL_STATUS_UNSUPPORTED;
    return QRL_OK;
}

static qrl_status parse_token_ids(json_t *root, const char *name, qrl_model_config *cfg,
                                  qrl_error *err) {
    QRL_TRY(get_int(root, name, "bos_token_id", false, -1, &cfg->bos_id, err));
    json_t *e = json_object_get(root, "eos_token_id");
    cfg->n_eos = 0;
    if (json_is_integer(e)) {
        cfg->eos_ids[cfg->n_eos++] = (int)json_integer_value(e);
    } else if (json_is_array(e)) {
        size_t i;
        json_t *x;
        json_array_foreach(e, i, x) {
            if (!json_is_integer(x))
                return qrl_error_set(err, QRL_STATUS_PARSE,
                                     "%s: field 'eos_token_id[%zu]' must be an integer", name, i);
            if (cfg->n_eos < QRL_MODEL_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int)json_integer_value(x);
        }
    } else if (e && !json_is_null(e)) {
        return qrl_error_set(err, QRL_STATUS_PARSE,
                             "%s: field 'eos_token_id' must be an integer or a list", name);
    }
    return QRL_OK;
}

static qrl_status parse_root(json_t *root, const char *name, qrl_model_config *cfg,
                             qrl_error *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root))
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: top level must be a JSON object", name);
    const char *mt = NULL;
    QRL_TRY(get_str(root, name, "model_type", &mt, err));
    if (!mt) return qrl_error_set(err, QRL_STATUS_PARSE, "%s: missing field 'model_type'", name);
    if (strcmp(mt, "llama") == 0) cfg->arch = QRL_MODEL_ARCH_LLAMA;
    else if (strcmp(mt, "mistral") == 0) cfg->arch = QRL_MODEL_ARCH_MISTRAL;
    else if (strcmp(mt, "qwen2") == 0) cfg->arch = QRL_MODEL_ARCH_QWEN2;
    else if (strcmp(mt, "qwen3") == 0) cfg->arch = QRL_MODEL_ARCH_QWEN3;
    else
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: model_type '%s' is not supported (llama, mistral, qwen2, qwen3)",
                             name, mt);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);

    QRL_TRY(get_int(root, name, "hidden_size", true, 0, &cfg->dim, err));
    QRL_TRY(get_int(root, name, "intermediate_size", true, 0, &cfg->hidden_dim, err));
    QRL_TRY(get_int(root, name, "num_hidden_layers", true, 0, &cfg->n_layers, err));
    QRL_TRY(get_int(root, name, "num_attention_heads", true, 0, &cfg->n_heads, err));
    QRL_TRY(get_int(root, name, "num_key_value_heads", false, cfg->n_heads, &cfg->n_kv_heads, err));
    QRL_TRY(get_int(root, name, "vocab_size", true, 0, &cfg->vocab_size, err));
    QRL_TRY(get_int(root, name, "max_position_embeddings", true, 0, &cfg->max_seq_len, err));
    if (cfg->n_heads <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: field 'num_attention_heads' must be > 0", name);
    QRL_TRY(get_int(root, name, "head_dim", false, cfg->dim / cfg->n_heads, &cfg->head_dim, err));

    double eps;
    QRL_TRY(get_num(root, name, "rms_norm_eps", 1e-6, &eps, err));
    cfg->norm_eps = (float)eps;
    QRL_TRY(get_bool(root, name, "tie_word_embeddings", false, &cfg->tie_embeddings, err));

    const char *act = NULL;
    QRL_TRY(get_str(root, name, "hidden_act", &act, err));
    if (act && strcmp(act, "silu") != 0)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: hidden_act '%s' is not supported (silu)", name, act);
    bool mlp_bias = false, attn_bias = false;
    QRL_TRY(get_bool(root, name, "mlp_bias", false, &mlp_bias, err));
    if (mlp_bias)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: mlp_bias = true is not supported",
                             name);
    QRL_TRY(get_bool(root, name, "attention_bias", false, &attn_bias, err));
    switch (cfg->arch) {
    case QRL_MODEL_ARCH_QWEN2: cfg->qkv_bias = true; cfg->o_bias = false; break;
    case QRL_MODEL_ARCH_MISTRAL: cfg->qkv_bias = cfg->o_bias = false; break;
    default: cfg->qkv_bias = cfg->o_bias = attn_bias; break;
    }
    cfg->qk_norm = cfg->arch == QRL_MODEL_ARCH_QWEN3;

    double prf = 1.0;
    QRL_TRY(get_num(root, name, "partial_rotary_factor", 1.0, &prf, err));
    if (prf != 1.0)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: partial_rotary_factor %g is not supported (1.0)", name, prf);

    /* RoPE: 4.x rope_theta + rope_scaling; 5.x rope_parameters (wins when present). */
    cfg->rope.layout = QRL_ROPE_LAYOUT_HALF;
    cfg->rope.scaling = QRL_ROPE_SCALING_NONE;
    QRL_TRY(get_num(root, name, "rope_theta", 10000.0, &cfg->rope.theta, err));
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs))
            return qrl_error_set(err, QRL_STATUS_PARSE, "%s: field 'rope_scaling' must be an object",
                                 name);
        QRL_TRY(parse_rope_obj(rs, name, "rope_scaling", cfg, err));
    }
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return qrl_error_set(err, QRL_STATUS_PARSE,
                                 "%s: field 'rope_parameters' must be an object", name);
        QRL_TRY(parse_rope_obj(rp, name, "rope_parameters", cfg, err));
    }
    if (!(cfg->rope.theta > 0))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: field 'rope_theta' must be > 0",
                             name);

    /* Sliding window: recorded, not applied (see config.h). */
    bool use_sw = cfg->arch == QRL_MODEL_ARCH_MISTRAL;
    if (cfg->arch == QRL_MODEL_ARCH_QWEN2 || cfg->arch == QRL_MODEL_ARCH_QWEN3)
        QRL_TRY(get_bool(root, name, "use_sliding_window", false, &use_sw, err));
    if (use_sw) QRL_TRY(get_int(root, name, "sliding_window", false, 0, &cfg->sliding_window, err));

    const char *dt = NULL;
    QRL_TRY(get_str(root, name, "dtype", &dt, err));
    if (!dt) QRL_TRY(get_str(root, name, "torch_dtype", &dt, err));
    if (parse_dtype(dt, &cfg->dtype) != QRL_OK)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: dtype '%s' is not supported (float32, bfloat16, float16)", name,
                             dt);
    QRL_TRY(parse_token_ids(root, name, cfg, err));
    return qrl_model_config_validate(cfg, name, err);
}

qrl_status qrl_model_config_parse_hf(const char *json, size_t len, const char *name,
                                     qrl_model_config *cfg, qrl_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: line %d column %d: %s", name, je.line,
                             je.column, je.text);
    qrl_status st = parse_root(root, name, cfg, err);
    json_decref(root);
    return st;
}

qrl_status qrl_model_config_load_hf(const char *path, qrl_model_config *cfg, qrl_error *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open", path);
        fclose(f);
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: line %d column %d: %s", path, je.line,
                             je.column, je.text);
    }
    qrl_status st = parse_root(root, path, cfg, err);
    json_decref(root);
    if (st == QRL_OK && cfg->sliding_window > 0)
        QRL_LOG_WARN("model", "sliding window ignored file=%s sliding_window=%d "
                              "(exact only for sequences up to that length)",
                     path, cfg->sliding_window);
    return st;
}

qrl_status qrl_model_config_from_llama2c(const int32_t hdr[7], const char *name,
                                         qrl_model_config *cfg, qrl_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = QRL_MODEL_ARCH_LLAMA;
    snprintf(cfg->model_type, sizeof cfg->model_type, "llama");
    cfg->dim = hdr[0];
    cfg->hidden_dim = hdr[1];
    cfg->n_layers = hdr[2];
    cfg->n_heads = hdr[3];
    cfg->n_kv_heads = hdr[4];
    cfg->tie_embeddings = hdr[5] > 0;
    cfg->vocab_size = hdr[5] < 0 ? -hdr[5] : hdr[5];
    cfg->max_seq_len = hdr[6];
    if (cfg->n_heads <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: header field n_heads = %d must be > 0",
                             name, cfg->n_heads);
    cfg->head_dim = cfg->dim / cfg->n_heads;
    cfg->norm_eps = 1e-5f;
    cfg->rope.theta = 10000.0;
    cfg->rope.scaling = QRL_ROPE_SCALING_NONE;
    cfg->rope.layout = QRL_ROPE_LAYOUT_INTERLEAVED;
    cfg->dtype = QRL_DTYPE_F32;
    cfg->bos_id = 1;
    cfg->n_eos = 1;
    cfg->eos_ids[0] = 2;
    if (cfg->head_dim * cfg->n_heads != cfg->dim)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: header dim = %d is not a multiple of n_heads = %d", name, cfg->dim,
                             cfg->n_heads);
    return qrl_model_config_validate(cfg, name, err);
}

qrl_status qrl_model_config_validate(const qrl_model_config *cfg, const char *name,
                                     qrl_error *err) {
    const struct { const char *field; int v; } pos[] = {
        {"hidden_size", cfg->dim},          {"intermediate_size", cfg->hidden_dim},
        {"num_hidden_layers", cfg->n_layers}, {"num_attention_heads", cfg->n_heads},
        {"num_key_value_heads", cfg->n_kv_heads}, {"head_dim", cfg->head_dim},
        {"vocab_size", cfg->vocab_size},    {"max_position_embeddings", cfg->max_seq_len},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: field '%s' = %d must be > 0",
                                 name, pos[i].field, pos[i].v);
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "%s: num_attention_heads = %d is not a multiple of "
                             "num_key_value_heads = %d",
                             name, cfg->n_heads, cfg->n_kv_heads);
    if (cfg->head_dim % 2 != 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: head_dim = %d must be even", name,
                             cfg->head_dim);
    if (!(cfg->norm_eps >= 0) || !isfinite(cfg->norm_eps))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "%s: field 'rms_norm_eps' is invalid",
                             name);
    return QRL_OK;
}

int64_t qrl_model_config_n_params(const qrl_model_config *c) {
    int64_t d = c->dim, q = (int64_t)c->n_heads * c->head_dim,
            kv = (int64_t)c->n_kv_heads * c->head_dim, h = c->hidden_dim;
    int64_t layer = 2 * d + q * d + 2 * kv * d + d * q + 3 * h * d;
    if (c->qkv_bias) layer += q + 2 * kv;
    if (c->o_bias) layer += d;
    if (c->qk_norm) layer += 2 * c->head_dim;
    int64_t n = (int64_t)c->vocab_size * d + c->n_layers * layer + d;
    if (!c->tie_embeddings) n += (int64_t)c->vocab_size * d;
    return n;
}
