/* The CPU reference the CUDA model tests compare against: teacher-forced logits of every
 * position of a token sequence through the CPU forward (model/forward.h) with a given KV
 * format.  The CPU prefill is batch- and chunk-invariant, so one helper serves every test. */
#ifndef QRL_TESTS_CUDA_CPU_REF_H
#define QRL_TESTS_CUDA_CPU_REF_H

#include <criterion/criterion.h>

#include "model/forward.h"
#include "model/kv_cache.h"

/* out[n, vocab] = CPU logits of ids[0..n) (all positions), KV cache in `fmt` (sink and
 * recent: the int4-protected windows, ignored by the other formats). */
static inline void cpu_logits_all(const qrl_model *m, qrl_kv_format fmt, int sink, int recent,
                                  const int32_t *ids, int n, float *out) {
    qrl_error err;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16, .n_blocks = n / 16 + 2,
                           .max_seqs = 1, .max_seq_len = n, .format = fmt,
                           .protected_sink = sink, .protected_recent = recent};
    qrl_kv_cache *kv;
    qrl_forward *f;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 64, n, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, n, out, true, &err), QRL_OK, "%s", err.msg);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

/* A random Qwen3-style model with head_dim 128 (the tensor-core attention path), weights
 * rounded to BF16: dim 256, 2 layers, 8 q / 2 kv heads, vocab 300. */
static inline qrl_model *ref_model_hd128(uint64_t seed, int max_seq_len) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 256, .hidden_dim = 384, .n_layers = 2,
                          .n_heads = 8, .n_kv_heads = 2, .head_dim = 128, .vocab_size = 300,
                          .max_seq_len = max_seq_len, .norm_eps = 1e-6f, .qk_norm = true,
                          .rope = {.theta = 1000000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, seed);
    qrl_model_round_bf16(m);
    return m;
}

#endif
