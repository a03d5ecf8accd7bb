/* Token sampler (SPEC §3 Determinism, §4 items 2 and 7): greedy, temperature, top-k,
 * top-p, drawing from a counter-based RNG so that a draw depends only on
 * (seed, group, response, position) — never on batch composition, thread count, the
 * replica, or how many draws came before.  Partial rollout across a weight update and
 * re-delivery to another replica therefore reproduce the same draws.
 *
 * RNG: Philox-4x32-10 (Salmon et al., SC'11; Random123), key = seed (low word, high
 * word), counter = (position, response, group low word, group high word).  One block
 * per draw; the uniform is the top 53 bits of (out[0] << 32 | out[1]) scaled to [0, 1).
 *
 * Procedure for temperature T > 0:
 *   z = logits / T
 *   top-k (k > 0, k < vocab): keep z >= the k-th largest z (ties at the boundary kept,
 *       as HF TopKLogitsWarper)
 *   top-p (p < 1): over the top-k survivors renormalized, in descending order (ties by
 *       lower id), keep each token whose preceding cumulative probability is < p (the
 *       smallest prefix reaching p, as HF TopPLogitsWarper)
 *   draw u; walk the kept tokens (id order when nothing was cut, else descending
 *       order) and return the first whose cumulative renormalized probability exceeds u.
 * Greedy (T <= 0): argmax (first on ties); no draw is made. */
#ifndef QRL_MODEL_SAMPLER_H
#define QRL_MODEL_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct qrl_sampling_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0 or >= vocab: off */
    float top_p;       /* in (0, 1]; 1: off */
    uint64_t seed;
} qrl_sampling_params;

/* One sampled token and its behavior log-probabilities (SPEC §4 item 2). */
typedef struct qrl_sample {
    int32_t token;
    /* log softmax(logits / T)[token] over the FULL vocabulary: the quantity the learner
     * recomputes.  Greedy uses T = 1 here (a point mass has no useful log-prob). */
    float logprob;
    /* log-prob under the distribution actually sampled from (after top-k/top-p
     * renormalization); equals `logprob` when nothing was cut; 0 for greedy. */
    float logprob_truncated;
    /* true when top-k/top-p removed at least one token (always true for greedy with
     * vocab > 1: the sampled distribution is a point mass). */
    bool truncated;
} qrl_sample;

/* One draw's params and key (qrl_sampler_sample's arguments), for samplers that take a
 * batch of rows at once (qrl_cuda_forward_decode_sample). */
typedef struct qrl_sample_draw {
    qrl_sampling_params params;
    uint64_t group;
    uint32_t response, position;
} qrl_sample_draw;

typedef struct qrl_sampler qrl_sampler; /* opaque: scratch for one vocabulary size */

/* Scratch for vocabularies of `vocab` tokens.  *out owned by the caller
 * (qrl_sampler_free).  Errors: OUT_OF_RANGE (vocab <= 0), NOMEM. */
qrl_status qrl_sampler_new(int vocab, qrl_sampler **out, qrl_error *err);
void qrl_sampler_free(qrl_sampler *s);

/* Check params: INVALID_ARGUMENT for a NaN temperature, top_k < 0, top_p outside (0, 1]. */
qrl_status qrl_sampling_params_validate(const qrl_sampling_params *p, qrl_error *err);

/* Sample one token from logits[vocab] (F32, caller-owned, not modified) with draw key
 * (p->seed, group, response, position); `position` is the token's absolute index in
 * its sequence (prompt + response).  Deterministic: same inputs, same output, on any
 * thread.  Errors: INVALID_ARGUMENT (bad params, a NaN or +inf logit, all logits -inf). */
qrl_status qrl_sampler_sample(qrl_sampler *s, const float *logits, const qrl_sampling_params *p,
                              uint64_t group, uint32_t response, uint32_t position,
                              qrl_sample *out, qrl_error *err);

/* Philox-4x32-10 block function: out = philox(ctr, key). */
void qrl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The uniform in [0, 1) that qrl_sampler_sample draws for this key (53-bit resolution). */
double qrl_sampler_uniform(uint64_t seed, uint64_t group, uint32_t response, uint32_t position);

#endif
