/* Shared by the CUDA forward tests that compare two engine configurations logit for logit
 * (test_cuda_w8a8_fused.c, test_cuda_w8a8_epi.c, test_cuda_forward_kv.c): one fixed run of
 * two prefills and batched decode steps.  Include after cuda_test_util.h. */
#ifndef QRL_TESTS_CUDA_FORWARD_RUN_H
#define QRL_TESTS_CUDA_FORWARD_RUN_H

#include "model/forward_cuda.h"

/* Logits F32 [n0 + 1 + 2 steps, V] (caller frees) of one run on engine f: ids[0, n0)
 * prefilled into a new sequence (every row; chunked by the engine's max_rows), ids[off1,
 * off1 + n1) into a second one (its last row), then `steps` batched decode steps of both,
 * fed ids[t] and ids[dec1 + t] (rows n0 + 1 + 2t, + 1).  Every call asserts QRL_OK. */
static float *prefill_decode_logits(qrl_cuda_forward *f, int V, const int32_t *ids, int n0,
                                    int off1, int n1, int dec1, int steps) {
    float *lg = malloc((size_t)(n0 + 1 + 2 * steps) * V * 4);
    int seqs[2];
    qrl_error err;
    for (int i = 0; i < 2; i++) cr_assert_eq(qrl_cuda_forward_seq_new(f, &seqs[i], &err), QRL_OK);
    cr_assert_eq(qrl_cuda_forward_prefill(f, seqs[0], ids, n0, lg, true, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_prefill(f, seqs[1], ids + off1, n1, lg + (size_t)n0 * V, false, &err),
                 QRL_OK, "%s", err.msg);
    for (int t = 0; t < steps; t++) {
        int32_t tok[2] = {ids[t], ids[dec1 + t]};
        cr_assert_eq(qrl_cuda_forward_decode(f, seqs, tok, 2, lg + (n0 + 1 + 2 * (size_t)t) * V, NULL,
                                             NULL, &err), QRL_OK, "%s", err.msg);
    }
    return lg;
}

#endif
