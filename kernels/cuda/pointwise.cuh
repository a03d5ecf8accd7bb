/* Embedding lookup, SwiGLU (optionally with the W8A8 quantization of its output), greedy
 * token choice (host launchers only, STYLE 7).  References: memcpy of a table row,
 * qrl_cpu_silu_mul (then qrl_cuda_{int8,fp8}_quantize_rows), qrl_cpu_argmax + log-softmax. */
#ifndef QRL_CUDA_POINTWISE_CUH
#define QRL_CUDA_POINTWISE_CUH

#include <stdint.h>

#include "base/status.h"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/nvfp4_quant.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* x[r, :] = float(table[tokens[r], :]) for r in [0, n), rows of d (device pointers; token
 * ids already validated by the caller).  Errors: CUDA (launch). */
qrl_status qrl_cuda_embed(float *x, const uint16_t *table, const int32_t *tokens, int n, int d,
                          void *stream, qrl_error *err);

/* out[r, j] = bf16(silu(gu[r, j]) * gu[r, f + j]) for j in [0, f): gu holds the gate
 * projection then the up projection per row ([n, 2f] F32); out [n, f] BF16. */
qrl_status qrl_cuda_swiglu(uint16_t *out, const float *gu, int n, int f, void *stream,
                           qrl_error *err);

/* qrl_cuda_swiglu (out may be NULL when q != NULL), and when q != NULL the per-token codes
 * of its BF16 outputs into q->q [n, q->ld] and q->scales [n]: byte for byte what
 * qrl_cuda_{int8,fp8}_quantize_rows(x_bf16 = 1) writes on qrl_cuda_swiglu's output (the
 * W8A8 quantization before the down projection, fused).  q == NULL is qrl_cuda_swiglu.
 * Errors: INVALID_ARGUMENT (n or f <= 0, q->ld < f or not a multiple of 16, both out and q
 * NULL), CUDA (launch). */
qrl_status qrl_cuda_swiglu_w8a8(uint16_t *out, const float *gu, int n, int f,
                                const qrl_cuda_w8a8_act *q, void *stream, qrl_error *err);

/* qrl_cuda_swiglu (out may be NULL), and the per-token NVFP4 quantization of its F32
 * outputs, before their BF16 rounding, into *q (w4a4-nvfp4, before the down projection):
 * byte for byte what qrl_cuda_nvfp4_quantize_rows writes for those values (q->x_out, when
 * given; qrl_cuda_rmsnorm_nvfp4 says why F32), one block per row (the outputs stay in
 * registers between the absmax and the codes up to f = 32768).
 * Errors: INVALID_ARGUMENT (n or f <= 0, q NULL), CUDA (launch). */
qrl_status qrl_cuda_swiglu_nvfp4(uint16_t *out, const float *gu, int n, int f,
                                 const qrl_cuda_nvfp4_act *q, void *stream, qrl_error *err);

/* Greedy choice at T = 1 over logits [n, vocab] F32: tokens[r] = argmax (first index on
 * ties, NaN never wins) and logprob[r] = logits[r, tok] - logsumexp(logits[r, :]) (the
 * sum of exponentials in F32).  A full sampler (temperature, top-k/top-p, Philox) is a
 * later step.  Errors: CUDA (launch). */
qrl_status qrl_cuda_greedy(const float *logits, int n, int vocab, int32_t *tokens,
                           float *logprob, void *stream, qrl_error *err);

/* p[i] = bf16(mean + std * u), u uniform on [-sqrt 3, sqrt 3) (unit variance) from a hash
 * of (seed, i): deterministic random fill for benchmarks (weights, KV pool). */
qrl_status qrl_cuda_fill_random_bf16(uint16_t *p, size_t n, uint64_t seed, float mean, float std,
                                     void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
