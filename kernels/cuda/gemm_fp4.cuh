/* W4A16 linear layers on the GPU: NVFP4 and MXFP4 weights, BF16 activations (host
 * launchers only, STYLE 7).  Hopper has no FP4 tensor cores, so the weights are decoded in
 * registers to BF16 and fed to mma.sync BF16 (F32 accumulation).  Reference:
 * kernels/cpu/quant.h (qrl_nvfp4_dequantize, qrl_mxfp4_dequantize) and model/linear.h's
 * w4a16 storage; SPEC §3.
 *
 * Weights are used exactly as the model stores them (no repacking): codes [N, ceil(K/2)]
 * packed E2M1, element 2i in the low nibble, each row starting on a byte; block scales
 * [N, ceil(K/16)] E4M3 (NVFP4) or [N, ceil(K/32)] E8M0 (MXFP4); plus a per-row F32 factor
 * (NVFP4: 1 / S_enc of the tensor the row came from, so fused q|k|v or gate|up rows keep
 * their own tensor scale; MXFP4: 1).
 *
 * Numerics: e2m1 * block scale is exact in BF16 (at most 5 significant bits; E8M0 scales
 * down to 2^-126 stay normal), so each kernel computes
 *   y[t, n] = (sum_k x[t, k] * (e2m1[n, k] * blockscale[n, k / B])) * row_scale[n]
 *             (* x_scale[t]) (+ bias[n])
 * with exact products and F32 sums; the CPU computes e2m1 * (blockscale * row_scale) per
 * element and sums in double: the two differ by F32 rounding of the sums (bound in
 * tests/cuda/test_cuda_fp4.c).  NaN block scales give NaN outputs on both sides. */
#ifndef QRL_CUDA_GEMM_FP4_CUH
#define QRL_CUDA_GEMM_FP4_CUH

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda/gemm.cuh"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qrl_cuda_fp4_kernel {
    QRL_CUDA_FP4_AUTO = 0,     /* DEQUANT for T > 64 with a workspace; else SPLITK where it
                                * applies (K % 64 == 0, 16-byte aligned x and codes, 2-byte
                                * aligned scales), else SKINNY.  Env QRL_FP4_NO_SPLITK=1: the
                                * SKINNY choice of before SPLITK existed (A/B) */
    QRL_CUDA_FP4_SKINNY,       /* 16 or 32 weight rows x up to 64 tokens per block, K split
                                * over 8 warps in 64-element chunks, codes decoded in
                                * registers into mma.sync m16n8k16 BF16 (any T: the grid's y
                                * covers 64-token tiles); the bit-trick decoder (gemm_fp4.cu
                                * fp4_pair: BF16 subnormal products, exact) */
    QRL_CUDA_FP4_DEQUANT,      /* decode W to BF16 into the workspace, cuBLAS BF16 GEMM, then
                                * the row-scale and bias epilogue (prefill) */
    QRL_CUDA_FP4_SKINNY_F32,   /* SKINNY with the reference decoder (each code through an F32
                                * table lookup and multiply: ~3x the ALU work per weight) */
    QRL_CUDA_FP4_AUTO_F32,     /* SKINNY_F32 for every T (no workspace needed) */
    QRL_CUDA_FP4_SPLITK,       /* 16 weight rows per warp, `warps` warps per block sharing
                                * 8-64 tokens staged in shared memory, K in 256-element steps
                                * split over `splits` blocks of a thread block cluster whose
                                * partial sums meet in distributed shared memory in rank order
                                * (deterministic, no workspace); the fp4_pair decoder.  Where
                                * it does not apply (see AUTO) SKINNY runs instead */
    QRL_CUDA_FP4_KERNEL_COUNT_
} qrl_cuda_fp4_kernel;

/* "auto", "skinny", "dequant", "skinny-f32", "auto-f32", "splitk"; "?" if out of range. */
const char *qrl_cuda_fp4_kernel_name(qrl_cuda_fp4_kernel k);

/* Bytes per row of the packed codes and block scales per row for K inputs. */
static inline int qrl_cuda_fp4_code_bytes(int K) { return (K + 1) / 2; }
static inline int qrl_cuda_fp4_scale_bytes(int K, bool mx) { return mx ? (K + 31) / 32 : (K + 15) / 16; }

/* y [T, N] F32 = x [T, K] (BF16) . W^T as above.  Device pointers. */
typedef struct qrl_cuda_fp4_gemm_args {
    float *y;
    const uint16_t *x;         /* [T, K] BF16 */
    const uint8_t *codes;      /* [N, qrl_cuda_fp4_code_bytes(K)] */
    const uint8_t *scales;     /* [N, qrl_cuda_fp4_scale_bytes(K, mx)] E4M3 or E8M0 */
    const float *row_scale;    /* [N] or NULL (1) */
    const float *x_scale;      /* [T] per-token factor or NULL (1): w4a4-nvfp4, where x holds
                                * the activations' exact e2m1 * E4M3 block scale values
                                * (nvfp4_quant.cuh's xq) and x_scale their 1 / S_enc */
    const float *bias;         /* [N] F32 or NULL */
    int T, N, K;
    bool mx;                   /* MXFP4 (E8M0 scales, 32-blocks); else NVFP4 */
    qrl_cuda_fp4_kernel kernel;
    uint16_t *work;            /* DEQUANT: BF16 scratch of at least N * K elements */
    size_t work_elems;
    qrl_cuda_gemm *blas;       /* DEQUANT: cuBLAS handle */
    qrl_cuda_fp4_kernel *ran;  /* out, optional: the kernel that ran */
    int warps, splits;         /* SPLITK tuning, 0 = qrl_cuda_fp4_splitk_plan's choice */
    int *ran_splits;           /* out, optional: SPLITK's splits (a cluster of more than 8
                                * blocks the device cannot place runs as 8) */
} qrl_cuda_fp4_gemm_args;

/* SPLITK's block shape for T x N x K: *warps (in: 0 or a request; out: 2, 4 or 8, 16 rows
 * each; 2 only up to 16 tokens) and *splits (in: 0 or a request; out: 1..16 blocks along K,
 * every split non-empty).  The automatic choice follows bench/fp4.c's sweep on an H200. */
void qrl_cuda_fp4_splitk_plan(int T, int N, int K, int *warps, int *splits);

/* Run a->kernel on `stream`.  Vector loads when K is a multiple of 64 and the pointers are
 * 16-byte aligned, byte loads otherwise.  Errors: INVALID_ARGUMENT (non-positive sizes,
 * DEQUANT without workspace or handle, bad kernel), CUDA (launch, cuBLAS). */
qrl_status qrl_cuda_fp4_gemm(const qrl_cuda_fp4_gemm_args *a, void *stream, qrl_error *err);

/* w [N, K] BF16 = e2m1 * block scale (exact; the row scale not applied).  Errors:
 * INVALID_ARGUMENT (sizes), CUDA (launch). */
qrl_status qrl_cuda_fp4_dequantize(uint16_t *w, const uint8_t *codes, const uint8_t *scales,
                                   int N, int K, bool mx, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
