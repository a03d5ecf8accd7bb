/* Token sampling on the device (host launchers only, STYLE 7; SPEC §3 Determinism, §4
 * items 2 and 7).  Reference: qrl_sampler_sample (common/model/sampler.h), whose procedure
 * this follows draw for draw: the same Philox-4x32-10 key and 53-bit uniform, z =
 * logits / T in double, top-k keeping boundary ties, top-p over the top-k survivors in
 * descending order (ties by lower id), the walk in id order when nothing is cut and in
 * descending order otherwise, greedy = argmax (first on ties) with its log-prob at T = 1.
 *
 * How (one block per row, no global scratch): the order (z desc, id asc) is the order of
 * a 64-bit key (order-preserving float bits of the logit, inverted, then the id), so every
 * "first token where a running sum reaches a target" (the k-th largest logit, the top-p
 * cut, the draw) is a radix select over that key: 11-bit digits, a shared-memory histogram
 * of counts and of the weights exp(z - lse) per digit, the digit where the running sum
 * crosses the target, then the next digit inside it; a digit holding one token ends it.
 * Weights are summed as 62-bit fixed point (integer atomics: the result does not depend on
 * thread timing, and 2^-62 per token is finer than the double sums of the CPU walk), and
 * log-sum-exps are block reductions in double in a fixed order.  Token choices therefore
 * equal the CPU's except where the draw lies close to a cumulative boundary (measured:
 * within 1.1e-16; tests/cuda/test_cuda_sample.c allows 1e-6), where the two summation
 * orders may round to different sides; log-probs agree to ~1 float ulp.
 * Cost: 2 passes over the row when nothing is cut, up to ~12 with top-k and top-p (each
 * later digit pass touches only the tokens that share the digits so far).  H200, vocab
 * 151936, batch 256 (bench/sample.c): greedy 0.21 ms, T = 1 0.47 ms, top-p 0.9 1.7 ms,
 * top-k 50 + top-p 0.95 1.4 ms, results copied back included. */
#ifndef QRL_CUDA_SAMPLE_CUH
#define QRL_CUDA_SAMPLE_CUH

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest vocabulary the key holds (22 id bits). */
#define QRL_CUDA_SAMPLE_MAX_VOCAB (1 << 22)

/* One row's draw: the sampling params (already validated as qrl_sampling_params_validate
 * does: temperature not NaN, top_k >= 0, top_p in (0, 1]) and the key (seed, group,
 * response, position) of qrl_sampler_sample. */
typedef struct qrl_cuda_sample_req {
    uint64_t seed, group;
    uint32_t response, position;
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* <= 0 or >= vocab: off */
    float top_p;       /* 1: off */
    uint32_t pad_;
} qrl_cuda_sample_req;

/* Why a row was refused (the CPU sampler's INVALID_ARGUMENT cases). */
typedef enum qrl_cuda_sample_fail {
    QRL_CUDA_SAMPLE_OK = 0,
    QRL_CUDA_SAMPLE_NAN = 1,        /* logits[fail_index] is NaN (the first bad index) */
    QRL_CUDA_SAMPLE_POSINF = 2,     /* logits[fail_index] is +inf */
    QRL_CUDA_SAMPLE_ALL_NEGINF = 3, /* every logit is -inf */
} qrl_cuda_sample_fail;

/* One row's result: qrl_sample's fields (token, logprob, logprob_truncated, truncated as
 * 0/1), valid when fail == QRL_CUDA_SAMPLE_OK. */
typedef struct qrl_cuda_sample_out {
    int32_t token;
    float logprob, logprob_truncated;
    int32_t truncated;
    int32_t fail, fail_index;
} qrl_cuda_sample_out;

/* Sample row r of logits [n, vocab] F32 with req[r] into out[r] for r in [0, n) (device
 * pointers; logits not modified).  Errors (nothing launched): INVALID_ARGUMENT (n < 1,
 * vocab < 1), OUT_OF_RANGE (vocab > QRL_CUDA_SAMPLE_MAX_VOCAB); CUDA (launch).  A row with
 * bad logits is not an error here: its out[r].fail says why (qrl_cuda_sample_check). */
qrl_status qrl_cuda_sample(const float *logits, int n, int vocab, const qrl_cuda_sample_req *req,
                           qrl_cuda_sample_out *out, void *stream, qrl_error *err);

/* Host: QRL_OK for a sampled row, else INVALID_ARGUMENT with the CPU sampler's message
 * ("sampling: logits[17] is NaN", "... is +inf", "sampling: all logits are -inf"). */
qrl_status qrl_cuda_sample_check(const qrl_cuda_sample_out *o, qrl_error *err);

/* Tests: out[4 i..] = Philox-4x32-10 of ctr in[6 i .. 6 i + 3], key in[6 i + 4, 6 i + 5]
 * (as qrl_philox4x32_10), i in [0, n); device pointers.  Errors: CUDA (launch). */
qrl_status qrl_cuda_philox4x32_10(const uint32_t *in, uint32_t *out, int n, void *stream,
                                  qrl_error *err);

/* Tests: u[i] = qrl_sampler_uniform(keys[4 i] (seed), keys[4 i + 1] (group),
 * (uint32_t)keys[4 i + 2] (response), (uint32_t)keys[4 i + 3] (position)); device
 * pointers.  Errors: CUDA (launch). */
qrl_status qrl_cuda_sample_uniform(const uint64_t *keys, double *u, int n, void *stream,
                                   qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
