/* Whole-model training engine on one CUDA device (issue #7; the CPU reference is
 * model_train.h, whose batch format, results and gradient layout this engine shares).
 *
 * Numerics: F32 master weights on the device with a BF16 copy for compute; GEMMs BF16 x
 * BF16 with F32 accumulation (cuBLAS); the residual stream, every gradient, the logits
 * and the softmax statistics in F32; activations that feed a GEMM in BF16.  So results
 * match the CPU engine within BF16 bounds, not bit for bit (atomics in the embedding,
 * norm-gain and attention dq gradients also leave the summation order open).
 *
 * Memory: parameters 4 + 2 bytes, gradients 4 bytes, AdamW state 8 bytes per parameter;
 * activations per token and layer about 4 (2 D) + 2 (2 D + 3 Q + 3 KV + 3 F) bytes kept
 * for the backward; with recompute_activations only the F32 layer input stays and the
 * layer's forward is re-run just before its backward (one layer's buffers shared by all).
 * The LM head keeps F32 logits [T, V] and writes BF16 dlogits in chunks of rows.
 *
 * Data parallel: qrl_model_train_cuda_set_comm attaches an NCCL communicator; a backward
 * called with sync_grads all-reduces (sums) each layer's gradient range on a second
 * stream as soon as that layer's backward is done, overlapping the rest of the backward;
 * the head and embedding are reduced at the end.  Every rank must run the same number of
 * backward calls with sync_grads set (the last micro-batch of a step).
 *
 * Threads: one thread at a time per engine.  Every call makes the engine's device the
 * calling thread's current CUDA device and leaves it so. */
#ifndef QRL_TRAIN_MODEL_TRAIN_CUDA_H
#define QRL_TRAIN_MODEL_TRAIN_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "train/adamw.h"
#include "train/model_train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_model_train_cuda qrl_model_train_cuda_t; /* opaque */

typedef struct qrl_model_train_cuda_opts {
    int max_tokens;             /* tokens of the largest packed batch (> 0) */
    bool recompute_activations; /* keep only each layer's input; re-run its forward */
    int device;                 /* CUDA device ordinal */
    int lm_head_chunk;          /* rows of BF16 dlogits at a time; <= 0: 1024 */
    bool optimizer_state;       /* allocate the AdamW state (8 bytes per parameter) now,
                                   not at the first step (a trainer: fail at start) */
    /* QAT, as qrl_model_train_opts (model_train.h) and at the same sites: weights
     * fake-quantized from the F32 master into the BF16 GEMM copy at the first forward after
     * creation, an AdamW step or set_params; the linear inputs (and with qat_kv K after
     * RoPE and V) per row from their BF16 values, guided by the attached records' block
     * scales and bits with S_enc from the row itself, else nearest; straight-through
     * gradients into the F32 master.  Kernels: cuda/train_qat.cuh (bit-identical to the
     * CPU's quantizer on the same F32 input). */
    qrl_qat_mode qat;
    bool qat_kv, qat_weights_only, trace_guidance;
} qrl_model_train_cuda_opts;

/* Create the engine on opts->device and upload m's F32 weights (m is read only here and
 * not kept).  *out is owned by the caller (qrl_model_train_cuda_destroy).
 * Errors: OUT_OF_RANGE (max_tokens <= 0), INVALID_ARGUMENT (a QAT option without qat
 * nvfp4, as the CPU engine), UNSUPPORTED (head_dim odd or > 256), CUDA (no
 * such device: names the ordinal and how many are visible; out of device memory: the
 * message says how many bytes), NOMEM. */
qrl_status qrl_model_train_cuda_new(const qrl_model *m, const qrl_model_train_cuda_opts *opts,
                                    qrl_model_train_cuda_t **out, qrl_error *err);
/* Free every device buffer and stream; NULL is a no-op. */
void qrl_model_train_cuda_destroy(qrl_model_train_cuda_t *tr);

/* Bytes of device memory the engine holds, and the part that is activations. */
size_t qrl_model_train_cuda_bytes(const qrl_model_train_cuda_t *tr, size_t *activation_bytes);

/* Set the gradients to zero (queued on the engine's stream; an asynchronous failure is
 * reported by the next call that synchronizes). */
void qrl_model_train_cuda_zero_grad(qrl_model_train_cuda_t *tr);

/* As qrl_model_train_forward (host arrays [T]; logp and ent host outputs, either may be
 * NULL).  Errors: as the CPU engine (OUT_OF_RANGE for T or a position, INVALID_ARGUMENT
 * for a token or target id: names t), CUDA. */
qrl_status qrl_model_train_cuda_forward(qrl_model_train_cuda_t *tr, const int32_t *tokens,
                                        const int32_t *targets, const int32_t *pos,
                                        const int32_t *seg, int T, float *logp, float *ent,
                                        qrl_error *err);

/* As qrl_model_train_backward (host dlogp[T], dent[T] or NULL): ADDS into the device
 * gradients.  sync_grads: all-reduce the gradients over the attached communicator
 * (no-op without one).  Errors: INVALID_ARGUMENT (no forward), CUDA, INTERNAL (NCCL). */
qrl_status qrl_model_train_cuda_backward(qrl_model_train_cuda_t *tr, const float *dlogp,
                                         const float *dent, bool sync_grads, qrl_error *err);

/* Attach an NCCL communicator (ncclComm_t, created by the caller on this engine's device;
 * NULL detaches).  The engine does not own it. */
void qrl_model_train_cuda_set_comm(qrl_model_train_cuda_t *tr, void *nccl_comm);

/* AdamW step on the device (formulas and errors of qrl_adamw_step: OUT_OF_RANGE on a
 * non-finite gradient, naming the index, with nothing changed).  The state is created on
 * the first call with cfg; info may be NULL. */
qrl_status qrl_model_train_cuda_adamw_step(qrl_model_train_cuda_t *tr,
                                           const qrl_adamw_config *cfg, double lr,
                                           qrl_adamw_step_info *info, qrl_error *err);

/* Copy the F32 gradients / master parameters (n_params floats in the layout of m->arena,
 * n_params = rope_inv_freq - arena) to host memory.  Errors: CUDA. */
qrl_status qrl_model_train_cuda_get_grads(qrl_model_train_cuda_t *tr, float *host,
                                          qrl_error *err);
qrl_status qrl_model_train_cuda_get_params(qrl_model_train_cuda_t *tr, float *host,
                                           qrl_error *err);
/* The F32 master parameters on the device (n_params floats in the layout of m->arena),
 * borrowed: valid until the engine is destroyed, changed in place by every AdamW step.
 * The engine's stream is synchronized first, so the values are those of the last step. */
const float *qrl_model_train_cuda_params_device(qrl_model_train_cuda_t *tr, int *device);
/* Replace the master parameters with host[n_params] (F32, the layout of m->arena) and
 * refresh the BF16 copy, e.g. after a checkpoint was loaded into the model.  Errors: CUDA. */
qrl_status qrl_model_train_cuda_set_params(qrl_model_train_cuda_t *tr, const float *host,
                                           qrl_error *err);
/* Copy the AdamW state between the device and host arrays m[n_params], v[n_params] and
 * *steps: to_host true downloads (zeros and 0 before the first step), false uploads
 * (creating the device state if needed).  Errors: CUDA. */
qrl_status qrl_model_train_cuda_adamw_state(qrl_model_train_cuda_t *tr, float *m, float *v,
                                            int64_t *steps, bool to_host, qrl_error *err);

/* QAT with TRACE guidance (opts.qat; no-ops returning OK on an engine without it):
 * as qrl_model_train_qat_clear / _attach (rec borrowed until the next forward, which
 * copies its scales and bits to the device; same ranges and errors) and _stats (the
 * counters since creation or the last reset; downloads them: synchronizes).  Errors of
 * stats: CUDA. */
void qrl_model_train_cuda_qat_clear(qrl_model_train_cuda_t *tr);
/* As qrl_model_train_qat_set_bf16 (from the next forward on: every parameter the forward
 * reads rounded to BF16 as the replicas received it, projections fake-quantized from
 * that; gradients straight through to the F32 masters). */
void qrl_model_train_cuda_qat_set_bf16(qrl_model_train_cuda_t *tr, bool on);
qrl_status qrl_model_train_cuda_qat_attach(qrl_model_train_cuda_t *tr, int seq_begin,
                                           int n_prompt, int n_response,
                                           const qrl_trace_response *rec, qrl_error *err);
qrl_status qrl_model_train_cuda_qat_stats(qrl_model_train_cuda_t *tr, qrl_qat_stats *out,
                                          bool reset, qrl_error *err);

/* Wait for the device; reports an asynchronous error.  Errors: CUDA. */
qrl_status qrl_model_train_cuda_sync(qrl_model_train_cuda_t *tr, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
