/* W8A8 linear layers on the GPU, INT8 and FP8 E4M3 (host launchers only, STYLE 7).
 * Reference: kernels/cpu/quant.h (qrl_int8_quantize_rows, qrl_fp8_quantize_rows,
 * qrl_gemm_int8, qrl_gemm_fp8) and model/linear.h's w8a8 storage; SPEC §3.
 *
 * Rows of codes (activations and weights) are stored with a leading dimension
 * ld = qrl_cuda_w8a8_ld(K) (K rounded up to 16) and zero bytes in [K, ld) (INT8 0 and E4M3
 * +0): the GEMMs then read 16-byte vectors for any K, and the padding adds 0 to every sum.
 *
 * INT8: INT32 accumulation (exact for K <= QRL_INT8_GEMM_MAX_K, in any order) and the
 * epilogue's operations done in the CPU's order with round-to-nearest intrinsics (no FMA
 * contraction): every kernel's outputs are bit-identical to qrl_gemm_int8 on the same codes.
 * FP8: products of E4M3 values are exact; the mma kernels sum 64 at a time on the tensor
 * cores and add those sums into an F32 accumulator, the CPU sums in double: outputs differ
 * by F32 rounding (measured <= 5e-8 of sx sw sum|x w|); cuBLASLt (wgmma) keeps fewer
 * accumulator bits (<= 1.4e-4).  Bounds in tests/cuda/test_cuda_w8a8_tc.c; deterministic
 * for a given shape and kernel.
 *
 * Kernels (qrl_cuda_w8a8_kernel): AUTO picks by T (rows), weight size and K, from
 * measurements on an H200 (bench/w8a8.c, bench/results/w8a8-h200.json and
 * w8a8-gemm-qwen3-4b-h200.json).  INT8 is bit-identical on every kernel. */
#ifndef QRL_CUDA_GEMM_W8A8_CUH
#define QRL_CUDA_GEMM_W8A8_CUH

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda/gemm.cuh"

#ifdef __cplusplus
extern "C" {
#endif

/* Padded row length (bytes) of INT8 or E4M3 codes for K inputs. */
static inline int qrl_cuda_w8a8_ld(int K) { return (K + 15) & ~15; }

/* Per-token INT8 quantization, bit-identical to qrl_int8_quantize_rows on the same F32
 * values: scale[t] = absmax(finite x[t, :]) / 127 (F32 division), q = clamp(RNE(x / scale),
 * -127, 127), NaN or scale 0 -> 0.  x [T, K] device, F32 (x_bf16 == 0) or BF16 (x_bf16 != 0,
 * its exact F32 values are quantized); q [T, ld] (bytes [K, ld) written 0), scales [T].
 * Runs on `stream`.  Errors: INVALID_ARGUMENT (non-positive T or K, ld < K or not a multiple
 * of 16), CUDA (launch). */
qrl_status qrl_cuda_int8_quantize_rows(int8_t *q, float *scales, const void *x, int x_bf16,
                                       int T, int K, int ld, void *stream, qrl_error *err);

/* Per-token FP8 E4M3 quantization, bit-identical to qrl_fp8_quantize_rows: scale[t] =
 * absmax(finite x[t, :]) / 448 (F32 division), q = E4M3(x / scale) (RNE, saturating, as
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE), NaN -> 0x7F; a row with scale 0 writes +-0
 * (sign kept) for every non-NaN element.  Arguments and errors as
 * qrl_cuda_int8_quantize_rows (bytes [K, ld) written 0x00). */
qrl_status qrl_cuda_fp8_quantize_rows(uint8_t *q, float *scales, const void *x, int x_bf16,
                                      int T, int K, int ld, void *stream, qrl_error *err);

/* Per-token codes written by a producer with the quantization fused in
 * (qrl_cuda_rmsnorm_w8a8 in norm.cuh, qrl_cuda_swiglu_w8a8 in pointwise.cuh): for each of
 * its rows of K BF16 outputs, the bytes qrl_cuda_{int8,fp8}_quantize_rows (x_bf16 = 1)
 * writes for those BF16 values.  Device pointers: q [rows, ld] (INT8 or E4M3 codes, bytes
 * [K, ld) 0), scales [rows]; ld a multiple of 16, >= K. */
typedef struct qrl_cuda_w8a8_act {
    void *q;
    float *scales;
    int ld;
    bool fp8;
} qrl_cuda_w8a8_act;

typedef enum qrl_cuda_w8a8_kernel {
    QRL_CUDA_W8A8_AUTO = 0,     /* by T, N and the workspace (the measured thresholds) */
    QRL_CUDA_W8A8_DP4A,         /* INT8 only: __dp4a (one warp per weight row for T <= 64,
                                 * 32x64 shared-memory tiles above) */
    QRL_CUDA_W8A8_MMA_SKINNY,   /* mma.sync m16n8k32, weights streamed into registers, 16
                                 * outputs x up to 64 tokens per block, K split over its 8
                                 * (16 for K >= 6144) warps (decode batches) */
    QRL_CUDA_W8A8_MMA_TILED,    /* mma.sync m16n8k32, 64x128 tiles through a 3-stage cp.async
                                 * shared-memory pipeline, K split over blocks when the grid
                                 * is small and a workspace is given */
    QRL_CUDA_W8A8_CUBLAS,       /* cuBLAS; needs args.blas.  FP8: cuBLASLt with the per-token x
                                 * per-channel scales (and the bias) in its epilogue
                                 * (qrl_cuda_gemm_e4m3_scaled; AUTO only where that measured
                                 * faster), else the unit-scale GEMM and the epilogue in place
                                 * (one vectorized pass).  INT8:
                                 * cuBLASLt INT32 sums into y (qrl_cuda_gemm_s8_lt, else
                                 * cublasGemmEx), then the epilogue in place (one vectorized
                                 * pass; args.defer leaves the pass to y's reader).  Shapes
                                 * cuBLAS refuses (UNSUPPORTED) run MMA_TILED */
    QRL_CUDA_W8A8_CUBLAS_UNFUSED, /* the CUBLAS path before issue 22, for A/B (also what CUBLAS
                                 * and AUTO run when the environment has
                                 * QRL_W8A8_CUBLAS_UNFUSED=1 at the first GEMM): cublasGemmEx
                                 * INT8 / cuBLASLt unit-scale FP8 into y, then the epilogue as
                                 * a separate element-wise pass */
    QRL_CUDA_W8A8_KERNEL_COUNT_
} qrl_cuda_w8a8_kernel;

/* Name of a kernel choice ("auto", "dp4a", "mma-skinny", "mma-tiled", "cublas",
 * "cublas-unfused"); "?" if out of range. */
const char *qrl_cuda_w8a8_kernel_name(qrl_cuda_w8a8_kernel k);

/* A W8A8 GEMM's epilogue left to the kernel that reads y (args.defer; issue 22 item 3: no
 * separate pass over y).  on: y [T, N] holds the raw sums (INT32 bits for INT8, F32 for
 * FP8) and the GEMM's output at (t, n) is (float)y[t, n] * sx[t] * sw[n] (+ bias[n]), left
 * to right, round to nearest, no contraction: the epilogue pass's operations, so a reader
 * that applies them gets the bits the pass would have stored.  The pointers are the GEMM's
 * arguments (device), valid while those are.  !on: y holds the outputs. */
typedef struct qrl_cuda_w8a8_epi {
    const float *sx, *sw, *bias; /* [T], [N], [N] or NULL */
    int N;
    bool fp8;                    /* the sums are F32 (else INT32 bits) */
    bool on;
} qrl_cuda_w8a8_epi;

/* One W8A8 GEMM: y [T, N] F32 = (float)(xq [T, ld] . wq [N, ld]^T) * sx[t] * sw[n]
 * (+ bias[n]), left to right, as qrl_gemm_int8 / qrl_gemm_fp8 followed by model/linear.c's
 * F32 bias add.  Device pointers; codes 16-byte aligned, zero-padded to ld. */
typedef struct qrl_cuda_w8a8_gemm_args {
    float *y;
    const void *xq;        /* int8_t (INT8) or E4M3 bytes (fp8) [T, ld] */
    const float *sx;       /* [T] */
    const void *wq;        /* [N, ld], same format */
    const float *sw;       /* [N] */
    const float *bias;     /* [N] F32 or NULL */
    int T, N, ld;
    bool fp8;
    qrl_cuda_w8a8_kernel kernel;
    /* Split-K partial sums of MMA_TILED (optional: NULL runs without splitting); at least
     * qrl_cuda_w8a8_work_floats(T, N, ld) floats for the full split. */
    float *work;
    size_t work_floats;
    qrl_cuda_gemm *blas;             /* cuBLAS handle for CUBLAS (AUTO uses it when given) */
    qrl_cuda_w8a8_kernel *ran;       /* out, optional: the kernel that ran */
    /* out, optional: where the chosen kernel would finish with the separate epilogue pass
     * (CUBLAS's unit-scale GEMM; not CUBLAS_UNFUSED, the A/B "before"), the pass is skipped
     * and *defer says how to finish each value on read (on = true); every other kernel
     * applies the epilogue itself (on = false). */
    qrl_cuda_w8a8_epi *defer;
} qrl_cuda_w8a8_gemm_args;

/* Run a->kernel on `stream`.  Errors: INVALID_ARGUMENT (non-positive sizes, ld not a
 * multiple of 16, INT8 ld above the overflow bound, misaligned codes, DP4A with fp8, CUBLAS
 * without a handle, bad kernel), CUDA (launch, cuBLAS). */
qrl_status qrl_cuda_w8a8_gemm(const qrl_cuda_w8a8_gemm_args *a, void *stream, qrl_error *err);

/* Workspace floats MMA_TILED uses for this shape when it splits K (0 when it does not). */
size_t qrl_cuda_w8a8_work_floats(int T, int N, int ld);

/* qrl_cuda_w8a8_gemm with kernel AUTO and no workspace, INT8 and FP8 codes. */
qrl_status qrl_cuda_gemm_int8(float *y, const int8_t *xq, const float *sx, const int8_t *wq,
                              const float *sw, const float *bias, int T, int N, int ld,
                              void *stream, qrl_error *err);
qrl_status qrl_cuda_gemm_fp8(float *y, const uint8_t *xq, const float *sx, const uint8_t *wq,
                             const float *sw, const float *bias, int T, int N, int ld,
                             void *stream, qrl_error *err);

/* Benchmarks: n deterministic pseudo-random codes from `seed`: INT8 uniform in [-127, 127];
 * E4M3 codes of values uniform in [-448, 448] (no NaN code).  Errors: CUDA (launch). */
qrl_status qrl_cuda_fill_random_int8(int8_t *q, size_t n, uint64_t seed, void *stream,
                                     qrl_error *err);
qrl_status qrl_cuda_fill_random_fp8(uint8_t *q, size_t n, uint64_t seed, void *stream,
                                    qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
