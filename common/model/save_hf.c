/* HuggingFace checkpoint writer: the inverse of load_hf.c.  config.json in the
 * transformers 4.x layout (which 5.x also reads) and one model.safetensors; llama2.c
 * weights (interleaved RoPE pairs) are permuted to HF's rotate_half row order, the
 * inverse of transformers' convert_llama_weights_to_hf permute(). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/model.h"

static const char *arch_class(qrl_model_arch a) {
    switch (a) {
    case QRL_MODEL_ARCH_MISTRAL: return "MistralForCausalLM";
    case QRL_MODEL_ARCH_QWEN2: return "Qwen2ForCausalLM";
    case QRL_MODEL_ARCH_QWEN3: return "Qwen3ForCausalLM";
    default: return "LlamaForCausalLM";
    }
}

static json_t *config_json(const qrl_model_config *c, qrl_dtype dt) {
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", arch_class(c->arch)));
    json_object_set_new(o, "model_type", json_string(c->model_type));
    json_object_set_new(o, "hidden_size", json_integer(c->dim));
    json_object_set_new(o, "intermediate_size", json_integer(c->hidden_dim));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_seq_len));
    json_object_set_new(o, "rms_norm_eps", json_real(c->norm_eps));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    if (c->arch == QRL_MODEL_ARCH_LLAMA || c->arch == QRL_MODEL_ARCH_QWEN3)
        json_object_set_new(o, "attention_bias", json_boolean(c->qkv_bias));
    json_object_set_new(o, "rope_theta", json_real(c->rope.theta));
    if (c->rope.scaling == QRL_ROPE_SCALING_LINEAR)
        json_object_set_new(o, "rope_scaling",
                            json_pack("{s:s, s:f}", "rope_type", "linear", "factor", c->rope.factor));
    else if (c->rope.scaling == QRL_ROPE_SCALING_LLAMA3)
        json_object_set_new(o, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      c->rope.factor, "low_freq_factor", c->rope.low_freq_factor,
                                      "high_freq_factor", c->rope.high_freq_factor,
                                      "original_max_position_embeddings",
                                      c->rope.original_max_position));
    if (c->sliding_window > 0)
        json_object_set_new(o, "sliding_window", json_integer(c->sliding_window));
    if (c->bos_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_id));
    if (c->n_eos == 1) {
        json_object_set_new(o, "eos_token_id", json_integer(c->eos_ids[0]));
    } else if (c->n_eos > 1) {
        json_t *a = json_array();
        for (int i = 0; i < c->n_eos; i++) json_array_append_new(a, json_integer(c->eos_ids[i]));
        json_object_set_new(o, "eos_token_id", a);
    }
    json_object_set_new(o, "torch_dtype", json_string(dt == QRL_DTYPE_BF16 ? "bfloat16" : "float32"));
    return o;
}

/* Row r of a q/k projection in HF order comes from row src_row(r) of the interleaved
 * (llama2.c) layout: per head, HF row i (first half) and i + hd/2 (second half) are the
 * pair (2i, 2i + 1). */
static int src_row(int r, int hd) {
    int h = r / hd, j = r % hd, half = hd / 2;
    return h * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
}

static bool is_qk(const char *name) {
    size_t n = strlen(name);
    const char *sfx[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                         "self_attn.q_proj.bias", "self_attn.k_proj.bias"};
    for (size_t i = 0; i < 4; i++) {
        size_t m = strlen(sfx[i]);
        if (n >= m && strcmp(name + n - m, sfx[i]) == 0) return true;
    }
    return false;
}

qrl_status qrl_model_save_hf(const qrl_model *m, const char *dir, qrl_dtype dtype,
                             qrl_error *err) {
    if (dtype != QRL_DTYPE_F32 && dtype != QRL_DTYPE_BF16)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "save_hf: dtype %s is not supported (F32, BF16)", qrl_dtype_name(dtype));
    if (m->uaq_scale != 1.0f)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "save_hf: UAQ scale %g is applied; undo it first (qrl_model_undo_uaq)",
                             (double)m->uaq_scale);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot create directory: %s", dir,
                             strerror(errno));
    qrl_model_config cfg = m->cfg;
    bool permute = cfg.rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED;
    cfg.rope.layout = QRL_ROPE_LAYOUT_HALF;
    qrl_status st = QRL_OK;
    char path[4096];

    /* Weights: converted copies (a permuted or narrowed tensor cannot alias the arena). */
    size_t esz = qrl_dtype_size(dtype), total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        total += (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
    }
    size_t nt = m->n_tensors > 0 ? (size_t)m->n_tensors : 1;
    uint8_t *buf = malloc(total * esz);
    qrl_safetensors_entry *ent = calloc(nt, sizeof *ent);
    qrl_tensor *tens = calloc(nt, sizeof *tens);
    if (!buf || !ent || !tens) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "save_hf: %zu bytes", total * esz);
        goto done;
    }
    size_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 1;
        bool perm = permute && is_qk(t->name);
        uint8_t *dst = buf + off * esz;
        for (int64_t r = 0; r < rows; r++) {
            const float *src = t->data + (size_t)(perm ? src_row((int)r, cfg.head_dim) : r) * cols;
            for (int64_t c = 0; c < cols; c++) {
                size_t k = (size_t)(r * cols + c);
                if (dtype == QRL_DTYPE_F32) ((float *)dst)[k] = src[c];
                else ((uint16_t *)dst)[k] = qrl_f32_to_bf16(src[c]);
            }
        }
        qrl_tensor_init(&tens[i], dtype, t->ndim, t->shape, dst);
        ent[i].name = t->name;
        ent[i].tensor = &tens[i];
        off += (size_t)(rows * cols);
    }
    const char *meta[] = {"format", "pt"};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    QRL_TRY_GOTO(qrl_safetensors_write(path, ent, (size_t)m->n_tensors, meta, 1, err), done);

    json_t *cj = config_json(&cfg, dtype);
    char *text = json_dumps(cj, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(cj);
    if (!text) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "save_hf: config.json");
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    qrl_atomic_file af;
    st = qrl_atomic_file_open(path, &af, err);
    if (st == QRL_OK) st = qrl_atomic_file_write(&af, text, strlen(text), err);
    if (st == QRL_OK) st = qrl_atomic_file_write(&af, "\n", 1, err);
    if (st == QRL_OK) st = qrl_atomic_file_commit(&af, err);
    else qrl_atomic_file_abort(&af);
    free(text);
done:
    free(buf);
    free(ent);
    free(tens);
    return st;
}
