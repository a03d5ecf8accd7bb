/* CUDA fake quantization for quantization-aware training (SPEC §6, TRACE; the CPU
 * reference is common/train/model_train.h's QAT, built from kernels/cpu/quant.h and
 * kernels/cpu/trace.h).  Host launchers only (STYLE 7).
 *
 * Numerics: the NVFP4 recipe of quant.h step for step (S_enc = 2688 / amax, E4M3 block
 * scale of block_amax * (S_enc * (1/6)), element multiplier min(1 / (s_b * (1 / S_enc)),
 * FLT_MAX), E2M1 ties to even: nvfp4_dev.cuh's device quantizer; x_hat = e2m1 * (s_b *
 * (1 / S_enc))) with IEEE-rounded F32 operations and no contraction, so F32 in -> F32 out
 * is bit-identical to the CPU:
 *   rows      qrl_nvfp4_fake_quantize_row (nearest) and, for a row with guidance,
 *             qrl_model_train_qat_quantize_row's guided path: S_enc from the row's own
 *             amax, the record's E4M3 block scales and code LSBs (qrl_trace_guided_round);
 *   weights   qrl_model_train_qat_weight (one S_enc per tensor, qrl_nvfp4_quantize).
 * A BF16 input is read exactly (its F32 value); a BF16 output is the F32 result rounded to
 * nearest even (the training GEMMs' operand).
 *
 * All pointers are device pointers; `stream` is a cudaStream_t (NULL = default).  Errors:
 * INVALID_ARGUMENT for non-positive sizes, a missing output or a bad scale, CUDA for a
 * failed launch. */
#ifndef QRL_CUDA_TRAIN_QAT_CUH
#define QRL_CUDA_TRAIN_QAT_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A row without guidance (guide table entry): nearest rounding. */
#define QRL_CUDA_QAT_NONE 0xFFFFFFFFu

/* Counters the row kernel adds to (device uint64 [3], zeroed by the caller):
 * [0] elements of guided rows, [1] elements of nearest rows, [2] guided elements whose
 * code differs from nearest rounding under the same scales (trace.h's n_guided). */
#define QRL_CUDA_QAT_COUNTERS 3

/* Fake-quantize `rows` rows of n elements each, x [rows, n] -> y [rows, n] (y may alias x
 * when both have the same dtype).  x_bf16 / y_bf16: 1 = BF16 (uint16), 0 = F32.
 * Row r is head r % heads of token r / heads (a [T, heads * n] activation; heads >= 1).
 * guide (may be NULL: every row nearest): the row's entry is guide[(r / heads) * stride +
 * r % heads], QRL_CUDA_QAT_NONE or the byte offset into blob of its record entry:
 * ceil(n/16) E4M3 block scales followed by ceil(n/8) bytes of code LSBs (element j at bit
 * j%8 of byte j/8), as trace.h's qrl_trace_entry.  codes (may be NULL) [rows,
 * ceil(n/2)]: the packed E2M1 codes (element 2i in the low nibble; an odd row's last high
 * nibble 0).  counters (may be NULL) as above: one atomic add per row and counter. */
qrl_status qrl_cuda_qat_rows(void *y, int y_bf16, const void *x, int x_bf16, int rows, int n,
                             int heads, const uint32_t *guide, int stride, const uint8_t *blob,
                             uint8_t *codes, unsigned long long *counters, void *stream,
                             qrl_error *err);

/* Fake-quantize a weight w [rows, cols] (F32) with one S_enc for the tensor: y_f32 and/or
 * y_bf16 [rows, cols] (either may be NULL, not both; neither may alias w).  w_bf16: quantize
 * every element rounded to BF16 first (nearest even, core/tensor.h's qrl_f32_to_bf16: amax
 * and codes from the rounded values; a replica that received the BF16 weight stream),
 * as the CPU's qrl_model_train_qat_set_bf16.  scale (finite, > 0; 1 = plain): quantize
 * fl(w * scale) and divide each dequantized value by scale (IEEE-rounded F32 both), as
 * model_train.c's qat_weights does for a UAQ-scaled projection at version 0 (docs/uaq.md:
 * the replica quantizes the unscaled W).  amax: device scratch of one float (overwritten). */
qrl_status qrl_cuda_qat_weight(const float *w, int w_bf16, float scale, int rows, int cols,
                               float *y_f32, uint16_t *y_bf16, float *amax, void *stream,
                               qrl_error *err);

/* y [n] = x rounded to BF16 (nearest even), as F32 (y may be x; n 0: nothing). */
qrl_status qrl_cuda_bf16_round(float *y, const float *x, size_t n, void *stream,
                               qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
