/* QAT state of the CUDA training engine (internal to model_train_cuda.c; the public API is
 * model_train_cuda.h's qrl_model_train_cuda_qat_*).  Mirrors the CPU engine's QAT
 * (model_train.h): the records attached per packed position, the device copy of their
 * block scales and code LSBs, the counters, and the fake quantization of one site.
 *
 * Records on the device: the forward after attaches uploads, for every attached token, the
 * entry of every quantized site (layer, kind, head) as ceil(n/16) scale bytes then ceil(n/8)
 * bit bytes into one blob, and a table [T][n_layers * slots] of their byte offsets
 * (QRL_CUDA_QAT_NONE: nearest rounding), slots per layer: attn_in, attn_out, mlp_in,
 * mlp_down, then with qat_kv k heads 0..Hkv-1 and v heads 0..Hkv-1.  One host-to-device
 * copy of each per packed batch; later forwards (another epoch over the same batch) reuse
 * it until the next clear or attach, or a forward of more tokens than were uploaded. */
#ifndef QRL_TRAIN_MODEL_TRAIN_CUDA_QAT_H
#define QRL_TRAIN_MODEL_TRAIN_CUDA_QAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "train/model_train.h"

typedef struct qrl_train_cuda_qat qrl_train_cuda_qat;

/* QAT state for a model of config c, packed rows of up to max_T tokens; act: activations
 * (the linear inputs) quantized, kv: K and V too, guidance: records are used.  Device
 * memory on the current device.  Errors: NOMEM, CUDA. */
qrl_status qrl_train_cuda_qat_new(const qrl_model_config *c, int max_T, bool act, bool kv,
                                  bool guidance, qrl_train_cuda_qat **out, qrl_error *err);
void qrl_train_cuda_qat_free(qrl_train_cuda_qat *q);
/* Device bytes held (counters, scratch, record blob and table at their current size). */
size_t qrl_train_cuda_qat_bytes(const qrl_train_cuda_qat *q);

/* As qrl_model_train_qat_clear / _attach (same checks, counting and messages). */
void qrl_train_cuda_qat_clear(qrl_train_cuda_qat *q);
qrl_status qrl_train_cuda_qat_attach(qrl_train_cuda_qat *q, int seq_begin, int n_prompt,
                                     int n_response, const qrl_trace_response *rec,
                                     qrl_error *err);
/* Before a forward of T tokens: upload the attached records if they changed (queued on
 * stream; the host staging is reused only after the forward synchronized).  Errors: CUDA,
 * NOMEM (growing the blob), OUT_OF_RANGE (a blob past 4 GiB). */
qrl_status qrl_train_cuda_qat_upload(qrl_train_cuda_qat *q, int T, void *stream, qrl_error *err);

/* Fake-quantize site (layer l, kind) of T tokens: x [T, width] -> y (BF16 both; y may be
 * x), `heads` vectors per token (1, or n_kv_heads for k and v), guided where the uploaded
 * records have the entry; count: add to the counters (the forward, not the backward's
 * recomputation).  Errors: CUDA. */
qrl_status qrl_train_cuda_qat_site(qrl_train_cuda_qat *q, int l, qrl_trace_site_kind kind,
                                   const uint16_t *x, uint16_t *y, int T, int width, int heads,
                                   bool count, void *stream, qrl_error *err);
/* Fake-quantize one projection weight w [rows, cols] (F32 master; bf16: rounded to BF16
 * first, qrl_model_train_qat_set_bf16) into y (BF16, the GEMM operand); scale: quantize
 * w * scale and divide by it (the UAQ s of a scaled projection at version 0, else 1;
 * cuda/train_qat.cuh).  Errors: CUDA, INVALID_ARGUMENT (scale not finite > 0). */
qrl_status qrl_train_cuda_qat_weight(qrl_train_cuda_qat *q, const float *w, bool bf16,
                                     float scale, int rows, int cols, uint16_t *y, void *stream,
                                     qrl_error *err);

/* set_bf16's other parameters: keep BF16-rounded copies (device F32, one buffer) of n F32
 * parameter vectors the forward reads as they are (norms, biases): *v[i] (a device pointer,
 * NULL for an absent one; len[i] floats) is replaced by its copy's address.  Once per
 * state.  qrl_train_cuda_qat_round_vecs refills every copy from its vector (after the
 * masters changed; queued on stream).  Errors: INVALID_ARGUMENT (twice), NOMEM, CUDA. */
qrl_status qrl_train_cuda_qat_vecs(qrl_train_cuda_qat *q, const float **const *v, const int *len,
                                   int n, qrl_error *err);
qrl_status qrl_train_cuda_qat_round_vecs(qrl_train_cuda_qat *q, void *stream, qrl_error *err);

/* The counters (downloads the device part: synchronizes stream), optionally reset.
 * Errors: CUDA. */
qrl_status qrl_train_cuda_qat_stats(qrl_train_cuda_qat *q, qrl_qat_stats *out, bool reset,
                                    void *stream, qrl_error *err);

#endif
