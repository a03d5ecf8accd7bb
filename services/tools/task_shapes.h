/* Random-weight models of real shapes for benchmarks (qrl-task init-model --shape;
 * bench/e2e.sh).  Linked into every tool (services/tools files not named qrl-NAME.c). */
#ifndef QRL_TOOLS_TASK_SHAPES_H
#define QRL_TOOLS_TASK_SHAPES_H

#include <stdint.h>

/* Write a HuggingFace folder `out` (created when missing) for the named shape:
 *   config.json        transformers' config.json of that model (Qwen3ForCausalLM keys and
 *                      values: hidden, layers, heads, kv heads, head_dim, intermediate,
 *                      vocab 151936, tie_word_embeddings, rope_theta 1e6, eps 1e-6, context
 *                      40960, bos 151643, eos 151645, torch_dtype bfloat16)
 *   model.safetensors  BF16, random weights with qrl_model_init_random's distribution
 *                      (N(0, 0.02 sqrt(768 / D)) matrices, 1 + N(0, 0.1) norm gains), drawn
 *                      in parallel (OpenMP) from (seed, tensor, 1M-element chunk) so the
 *                      result does not depend on the thread count
 *   tokenizer files    every one of tokenizer.json, tokenizer_config.json, vocab.json,
 *                      merges.txt, special_tokens_map.json, added_tokens.json present in
 *                      `tokenizer_dir` (tokenizer.json or vocab.json + merges.txt required);
 *                      the folder is then loaded back (model + tokenizer) as the daemons do.
 * Shapes: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, and qwen3-tiny (hidden 64, 2 layers,
 * Qwen3's vocabulary: CPU tests of the benchmark's plumbing).  Prints one JSON line
 * {"out", "shape", "params", "seconds"}.  Returns the exit status (0; 1 on an error, one
 * line "qrl-task: error: ..."; 2 on a usage error). */
int qrl_task_init_shape(const char *shape, const char *tokenizer_dir, const char *out, uint64_t seed);

#endif
