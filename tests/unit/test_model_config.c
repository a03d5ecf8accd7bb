/* Model config parsing: transformers 4.x and 5.x layouts of each supported family,
 * llama2.c headers, and errors that name the file and the field. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "model/config.h"

static qrl_status parse(const char *json, qrl_model_config *c, qrl_error *err) {
    return qrl_model_config_parse_hf(json, strlen(json), "dir/config.json", c, err);
}

/* Llama 3.1 8B's config.json (transformers 4.43 layout). */
static const char *LLAMA31 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"mlp_bias\": false,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"vocab_size\": 128256}";

Test(model_config, llama31_transformers4) {
    qrl_model_config c;
    qrl_error err;
    cr_assert_eq(parse(LLAMA31, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.arch, QRL_MODEL_ARCH_LLAMA);
    cr_assert_eq(c.dim, 4096);
    cr_assert_eq(c.n_kv_heads, 8);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.max_seq_len, 131072);
    cr_assert_eq(c.rope.scaling, QRL_ROPE_SCALING_LLAMA3);
    cr_assert_eq(c.rope.theta, 500000.0);
    cr_assert_eq(c.rope.factor, 8.0);
    cr_assert_eq(c.rope.original_max_position, 8192);
    cr_assert_eq(c.rope.layout, QRL_ROPE_LAYOUT_HALF);
    cr_assert_eq(c.dtype, QRL_DTYPE_BF16);
    cr_assert_eq(c.norm_eps, 1e-5f);
    cr_assert_not(c.tie_embeddings);
    cr_assert_not(c.qkv_bias);
    cr_assert_eq(c.bos_id, 128000);
    cr_assert_eq(c.n_eos, 3);
    cr_assert_eq(c.eos_ids[2], 128009);
    cr_assert_eq(qrl_model_config_n_params(&c), 8030261248ll); /* Llama-3.1-8B */
}

Test(model_config, transformers5_rope_parameters_and_dtype) {
    const char *j =
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
        " \"max_position_embeddings\": 256, \"dtype\": \"float16\","
        " \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 50000.0, \"factor\": 32.0,"
        " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 128}}";
    qrl_model_config c;
    qrl_error err;
    cr_assert_eq(parse(j, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.rope.theta, 50000.0);
    cr_assert_eq(c.rope.scaling, QRL_ROPE_SCALING_LLAMA3);
    cr_assert_eq(c.rope.factor, 32.0);
    cr_assert_eq(c.dtype, QRL_DTYPE_F16);
    cr_assert_eq(c.n_kv_heads, 4); /* defaults to the query heads */
    cr_assert_eq(c.norm_eps, 1e-6f);
    cr_assert_eq(c.bos_id, -1);
    cr_assert_eq(c.n_eos, 0);
    /* default rope_type in 5.x, old "type" spelling in 4.x */
    const char *k =
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
        " \"max_position_embeddings\": 256, \"rope_parameters\": {\"rope_type\": \"default\","
        " \"rope_theta\": 1234.0}, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}";
    cr_assert_eq(parse(k, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.rope.theta, 1234.0);
    cr_assert_eq(c.rope.scaling, QRL_ROPE_SCALING_NONE); /* rope_parameters wins */
}

Test(model_config, qwen2_bias_qwen3_head_dim_mistral_window) {
    /* Qwen2.5-0.5B */
    const char *q2 =
        "{\"model_type\": \"qwen2\", \"hidden_size\": 896, \"intermediate_size\": 4864,"
        " \"num_hidden_layers\": 24, \"num_attention_heads\": 14, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 151936, \"max_position_embeddings\": 32768, \"rope_theta\": 1000000.0,"
        " \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": true, \"use_sliding_window\": false,"
        " \"sliding_window\": 32768, \"torch_dtype\": \"bfloat16\", \"eos_token_id\": 151643}";
    qrl_model_config c;
    qrl_error err;
    cr_assert_eq(parse(q2, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.arch, QRL_MODEL_ARCH_QWEN2);
    cr_assert(c.qkv_bias);
    cr_assert_not(c.o_bias);
    cr_assert_not(c.qk_norm);
    cr_assert(c.tie_embeddings);
    cr_assert_eq(c.head_dim, 64);
    cr_assert_eq(c.sliding_window, 0); /* use_sliding_window false */
    cr_assert_eq(qrl_model_config_n_params(&c), 494032768ll); /* Qwen2.5-0.5B */
    /* Qwen3-0.6B: head_dim 128 although hidden / heads = 64 */
    const char *q3 =
        "{\"model_type\": \"qwen3\", \"hidden_size\": 1024, \"intermediate_size\": 3072,"
        " \"num_hidden_layers\": 28, \"num_attention_heads\": 16, \"num_key_value_heads\": 8,"
        " \"head_dim\": 128, \"attention_bias\": false, \"vocab_size\": 151936,"
        " \"max_position_embeddings\": 40960, \"rope_theta\": 1000000, \"rope_scaling\": null,"
        " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\"}";
    cr_assert_eq(parse(q3, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.head_dim, 128);
    cr_assert(c.qk_norm);
    cr_assert_not(c.qkv_bias);
    cr_assert_eq(c.rope.theta, 1e6); /* integer-valued theta accepted */
    cr_assert_eq(qrl_model_config_n_params(&c), 596049920ll); /* Qwen3-0.6B (tied) */
    /* Mistral-7B-v0.1: window recorded, head_dim null */
    const char *mi =
        "{\"model_type\": \"mistral\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
        " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
        " \"head_dim\": null, \"vocab_size\": 32000, \"max_position_embeddings\": 32768,"
        " \"sliding_window\": 4096, \"rope_theta\": 10000.0}";
    cr_assert_eq(parse(mi, &c, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.sliding_window, 4096);
    cr_assert_not(c.qkv_bias);
}

Test(model_config, errors_name_file_and_field) {
    qrl_model_config c;
    qrl_error err;
    cr_assert_eq(parse("{\"model_type\": \"gpt_neox\"}", &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_str_eq(err.msg, "dir/config.json: model_type 'gpt_neox' is not supported (llama, "
                              "mistral, qwen2, qwen3)");
    cr_assert_eq(parse("{\"hidden_size\": 4}", &c, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "'model_type'"), "%s", err.msg);
    cr_assert_eq(parse("{\"model_type\": \"llama\", \"hidden_size\": 4}", &c, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "dir/config.json: missing field 'intermediate_size'"), "%s", err.msg);
    cr_assert_eq(parse("{\"model_type\": \"llama\", \"hidden_size\": \"4\"}", &c, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "'hidden_size' must be an integer"), "%s", err.msg);
    cr_assert_eq(parse("{\"model_type\": ", &c, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "dir/config.json: line 1"), "%s", err.msg);

    char buf[1024];
#define CFG(extra)                                                                             \
    (snprintf(buf, sizeof buf,                                                                 \
              "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"  \
              " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"   \
              " \"max_position_embeddings\": 256 %s}", extra), buf)
    cr_assert_eq(parse(CFG(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}"), &c, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "rope_scaling.rope_type 'yarn'"), "%s", err.msg);
    cr_assert_eq(parse(CFG(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}"), &c, &err),
                 QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "original_max_position_embeddings"), "%s", err.msg);
    cr_assert_eq(parse(CFG(", \"hidden_act\": \"gelu\""), &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "hidden_act 'gelu'"), "%s", err.msg);
    cr_assert_eq(parse(CFG(", \"mlp_bias\": true"), &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(parse(CFG(", \"num_key_value_heads\": 3"), &c, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "num_key_value_heads = 3"), "%s", err.msg);
    cr_assert_eq(parse(CFG(", \"head_dim\": 15"), &c, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(parse(CFG(", \"torch_dtype\": \"int8\""), &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(parse(CFG(", \"partial_rotary_factor\": 0.5"), &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(parse(CFG(", \"eos_token_id\": [1, \"x\"]"), &c, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "eos_token_id[1]"), "%s", err.msg);
#undef CFG
    cr_assert_eq(qrl_model_config_load_hf("/nonexistent/config.json", &c, &err), QRL_STATUS_IO);
    cr_assert(strstr(err.msg, "/nonexistent/config.json"), "%s", err.msg);
}

Test(model_config, llama2c_header) {
    qrl_model_config c;
    qrl_error err;
    const int32_t stories260k[7] = {64, 172, 5, 8, 4, 512, 512};
    cr_assert_eq(qrl_model_config_from_llama2c(stories260k, "s.bin", &c, &err), QRL_OK);
    cr_assert_eq(c.head_dim, 8);
    cr_assert(c.tie_embeddings);
    cr_assert_eq(c.rope.layout, QRL_ROPE_LAYOUT_INTERLEAVED);
    cr_assert_eq(c.norm_eps, 1e-5f);
    cr_assert_eq(c.bos_id, 1);
    cr_assert_eq(c.eos_ids[0], 2);
    const int32_t untied[7] = {64, 172, 5, 8, 4, -512, 512};
    cr_assert_eq(qrl_model_config_from_llama2c(untied, "s.bin", &c, &err), QRL_OK);
    cr_assert_not(c.tie_embeddings);
    cr_assert_eq(c.vocab_size, 512);
    const int32_t bad[7] = {64, 172, 0, 8, 4, 512, 512};
    cr_assert_eq(qrl_model_config_from_llama2c(bad, "s.bin", &c, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "s.bin") && strstr(err.msg, "num_hidden_layers"), "%s", err.msg);
}
