/* W8A8 INT8 linear layers on the GPU (host launchers only, STYLE 7).  Reference:
 * kernels/cpu/quant.h (qrl_int8_quantize_rows, qrl_gemm_int8, qrl_linear_w8a8_int8) and
 * model/linear.h's w8a8-int8 storage; SPEC §3.
 *
 * Rows of INT8 codes (activations and weights) are stored with a leading dimension
 * ld = qrl_cuda_int8_ld(K) (K rounded up to 16) and zero bytes in [K, ld): the GEMM then
 * reads 16-byte vectors for any K, and the padding adds 0 to every sum.  With INT32
 * accumulation (exact for K <= QRL_INT8_GEMM_MAX_K) and the epilogue's operations done
 * in the CPU's order with round-to-nearest intrinsics (no FMA contraction), the outputs
 * are bit-identical to the CPU reference for the same inputs. */
#ifndef QRL_CUDA_GEMM_INT8_CUH
#define QRL_CUDA_GEMM_INT8_CUH

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Padded row length (bytes) of INT8 codes for K inputs. */
static inline int qrl_cuda_int8_ld(int K) { return (K + 15) & ~15; }

/* Per-token INT8 quantization, bit-identical to qrl_int8_quantize_rows on the same F32
 * values: scale[t] = absmax(finite x[t, :]) / 127 (F32 division), q = clamp(RNE(x / scale),
 * -127, 127), NaN or scale 0 -> 0.  x [T, K] device, F32 (x_bf16 == 0) or BF16 (x_bf16 != 0,
 * its exact F32 values are quantized); q [T, ld] (bytes [K, ld) written 0), scales [T].
 * Runs on `stream`.  Errors: INVALID_ARGUMENT (non-positive T or K, ld < K or not a multiple
 * of 16), CUDA (launch). */
qrl_status qrl_cuda_int8_quantize_rows(int8_t *q, float *scales, const void *x, int x_bf16,
                                       int T, int K, int ld, void *stream, qrl_error *err);

/* y [T, N] F32 = (float)(xq [T, ld] . wq [N, ld]^T as INT32) * sx[t] * sw[n] (+ bias[n]),
 * left to right, as qrl_gemm_int8 followed by an F32 bias add (model/linear.c).  Codes
 * zero-padded to ld (a multiple of 16; K <= QRL_INT8_GEMM_MAX_K so INT32 cannot overflow);
 * bias F32 [N] or NULL.  Device pointers; xq and wq 16-byte aligned.  Runs on `stream`.
 * Errors: INVALID_ARGUMENT (non-positive sizes, ld not a multiple of 16 or above the
 * overflow bound, misaligned codes), CUDA (launch). */
qrl_status qrl_cuda_gemm_int8(float *y, const int8_t *xq, const float *sx, const int8_t *wq,
                              const float *sw, const float *bias, int T, int N, int ld,
                              void *stream, qrl_error *err);

/* Benchmarks: n deterministic pseudo-random codes uniform in [-127, 127] from `seed`.
 * Errors: CUDA (launch). */
qrl_status qrl_cuda_fill_random_int8(int8_t *q, size_t n, uint64_t seed, void *stream,
                                     qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
