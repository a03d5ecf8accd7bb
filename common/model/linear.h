/* Linear layers in the rollout precisions of SPEC §3 (the precision table).
 *
 * A qrl_linear is one projection y[T, N] = x[T, K] · W[N, K]^T (+ bias[N]) with a format
 * tag and the format's storage: the unit a backend implements.  This file is the CPU
 * backend; a CUDA backend uploads the same storage (codes, scales) and runs its kernels
 * on the tag, so the model and the forward pass never look inside a format.
 *
 *   precision     weights (storage)                         activations (per call)
 *   f32           F32 [N, K] (the model's master weights)   F32
 *   bf16          BF16-valued F32 [N, K] (rounded in place)  rounded to BF16; F32 accumulate
 *   w8a8-int8     INT8 [N, K] + F32 scale per output channel INT8 per token, INT32 accumulate
 *   w8a8-fp8      E4M3 [N, K] + F32 scale per output channel E4M3 per token, exact products
 *   w4a16-nvfp4   packed E2M1 [N, ceil(K/2)], E4M3 scale per  F32 (weight-only)
 *                 16-block [N, ceil(K/16)], F32 tensor S_enc
 *   w4a16-mxfp4   packed E2M1 [N, ceil(K/2)], E8M0 scale per  F32 (weight-only)
 *                 32-block [N, ceil(K/32)]
 *   w4a4-nvfp4    as w4a16-nvfp4                              NVFP4 fake-quantized per token
 *
 * The CPU forward is bit-identical to kernels/cpu/quant_gemm.c's reference GEMMs
 * (qrl_linear_w8a8_int8, qrl_linear_w8a8_fp8, qrl_linear_w4a16_nvfp4,
 * qrl_linear_w4a16_mxfp4, qrl_linear_w4a4_nvfp4; tests/unit/test_linear.c checks it):
 * the same per-element operations in the same order, parallel over output channels and
 * four token rows at a time (independent accumulators), weight rows dequantized on the
 * fly from the stored codes.  f32 is qrl_cpu_matmul itself.  Biases stay F32 and are
 * added after the epilogue.  Every output element is computed by one thread, so results
 * do not depend on the thread count. */
#ifndef QRL_MODEL_LINEAR_H
#define QRL_MODEL_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/quant.h"

typedef enum qrl_precision {
    QRL_PRECISION_F32 = 0,
    QRL_PRECISION_BF16,
    QRL_PRECISION_W8A8_INT8,
    QRL_PRECISION_W8A8_FP8,
    QRL_PRECISION_W4A16_NVFP4,
    QRL_PRECISION_W4A16_MXFP4,
    QRL_PRECISION_W4A4_NVFP4,
    QRL_PRECISION_COUNT_
} qrl_precision;

/* Names as on command lines and in configs: "f32", "bf16", "w8a8-int8", "w8a8-fp8",
 * "w4a16-nvfp4", "w4a16-mxfp4", "w4a4-nvfp4".  Static strings; "?" for a bad value. */
const char *qrl_precision_name(qrl_precision p);
/* Parse a name above.  INVALID_ARGUMENT for an unknown name ("unknown precision 'x'
 * (f32, bf16, ...)"). */
qrl_status qrl_precision_parse(const char *name, qrl_precision *out, qrl_error *err);
/* True for the formats with quantized weight storage (w8a8-*, w4a*). */
bool qrl_precision_is_quantized(qrl_precision p);

typedef struct qrl_linear {
    qrl_precision fmt;
    int n_out, n_in;      /* N, K */
    const float *w;       /* [N, K] F32 master weights (read by f32 and bf16 only) */
    const float *bias;    /* [N] F32 or NULL */
    /* Quantized storage (NULL for f32/bf16), inside the block given to qrl_linear_init: */
    void *codes;          /* INT8 or E4M3 [N, K]; packed E2M1 [N, ceil(K/2)] */
    float *scales;        /* w8a8: [N] per-channel decode scale */
    uint8_t *block_scales;/* NVFP4: E4M3 [N, ceil(K/16)]; MXFP4: E8M0 [N, ceil(K/32)] */
    float *global_enc;    /* NVFP4: [1] per-tensor S_enc */
} qrl_linear;

/* Bytes of quantized storage a linear of this format and shape needs (0 for f32/bf16);
 * qrl_linear_init places its arrays in a block this large, aligned to 64 bytes. */
size_t qrl_linear_storage_bytes(qrl_precision fmt, int n_out, int n_in);

/* Describe W [n_out, n_in] (F32, borrowed: must outlive *l) in format `fmt`, quantizing
 * it into `storage` (qrl_linear_storage_bytes(fmt, ...) bytes, 64-byte aligned,
 * caller-owned; NULL allowed when that is 0).  The rules are quant.h's: INT8 and FP8 per
 * output channel (qrl_int8_quantize_rows, qrl_fp8_quantize_rows), NVFP4 with one global
 * scale for the tensor (qrl_nvfp4_quantize, per_row false), MXFP4 (qrl_mxfp4_quantize).
 * For bf16 the caller has already rounded W to BF16 values (qrl_model_round_bf16).
 * Errors: INVALID_ARGUMENT (non-positive shape, NULL weights or storage, n_in above
 * QRL_INT8_GEMM_MAX_K for w8a8-int8, bad fmt). */
qrl_status qrl_linear_init(qrl_linear *l, qrl_precision fmt, const float *w, const float *bias,
                           int n_out, int n_in, void *storage, qrl_error *err);

/* Per-call scratch for up to max_rows token rows of up to max_in inputs, and one
 * dequantized weight row per OpenMP thread (omp_get_max_threads() at creation; the
 * forward never uses more).  Allocated once; *out owned by the caller
 * (qrl_linear_scratch_free).  Errors: OUT_OF_RANGE (non-positive sizes), NOMEM. */
typedef struct qrl_linear_scratch qrl_linear_scratch;
qrl_status qrl_linear_scratch_new(int max_rows, int max_in, qrl_linear_scratch **out,
                                  qrl_error *err);
void qrl_linear_scratch_free(qrl_linear_scratch *s);

/* y [T, n_out] = linear(x [T, n_in]) in l's format (F32 in and out; y must not alias x).
 * T <= the scratch's max_rows and n_in <= its max_in (checked: a caller bug aborts). */
void qrl_linear_forward(const qrl_linear *l, const float *x, int T, float *y,
                        qrl_linear_scratch *s);

#endif
