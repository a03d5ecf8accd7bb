/* Internal to the kernels/cuda sources (C++ only): per-token W8A8 activation quantization of
 * one row by one block, shared by the standalone quantizer (gemm_w8a8.cu) and the producers
 * that fuse it (the RMSNorm in norm.cu, the SwiGLU in pointwise.cu).  One body for all of
 * them, so a fused producer's codes and scales are bit-identical to the standalone
 * quantizer's on the same values.  Formulas: gemm_w8a8.cuh, reference kernels/cpu/quant.h. */
#ifndef QRL_CUDA_W8A8_DEV_CUH
#define QRL_CUDA_W8A8_DEV_CUH

#include <cuda_fp8.h>
#include <stdint.h>

#include "cpu/quant.h"

/* The GEMM epilogue of one output, bit for bit the CPU's (qrl_gemm_int8 / qrl_gemm_fp8,
 * then model/linear.c's F32 bias): (float)acc * sx * sw left to right, then + bias[n];
 * round-to-nearest intrinsics, no contraction.  Shared by the GEMM kernels (gemm_w8a8.cu)
 * and the norm that applies a deferred epilogue (norm.cu), so both give the same bits. */
static __device__ __forceinline__ float qrl_w8a8_acc_f_(int a) { return __int2float_rn(a); }
static __device__ __forceinline__ float qrl_w8a8_acc_f_(float a) { return a; }

template <typename A>
static __device__ __forceinline__ float qrl_w8a8_epilogue_(A acc, float sx, float sw,
                                                           const float *bias, int n) {
    float v = __fmul_rn(__fmul_rn(qrl_w8a8_acc_f_(acc), sx), sw);
    if (bias) v = __fadd_rn(v, bias[n]);
    return v;
}

/* qrl_int8_encode: RNE of the IEEE quotient, clamped; NaN or scale 0 -> 0. */
static __device__ __forceinline__ uint8_t qrl_w8a8_enc_int8_(float v, float scale) {
    int8_t c = 0;
    if (!isnan(v) && scale != 0.0f) {
        float qf = rintf(__fdiv_rn(v, scale)); /* RNE, as qrl_quant_round_half_even */
        c = (int8_t)fminf(fmaxf(qf, -127.0f), 127.0f);
    }
    return (uint8_t)c;
}

/* quant_rows.c's fp8_scaled: a zero scale keeps only the sign (NaN still encodes NaN). */
static __device__ __forceinline__ uint8_t qrl_w8a8_enc_fp8_(float v, float scale) {
    if (scale == 0.0f && !isnan(v)) return signbit(v) ? 0x80 : 0x00;
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

template <bool FP8>
static __device__ __forceinline__ uint8_t qrl_w8a8_enc_(float v, float scale) {
    return FP8 ? qrl_w8a8_enc_fp8_(v, scale) : qrl_w8a8_enc_int8_(v, scale);
}

/* Quantize one row of K values into qr[0, ld) (bytes [K, ld) written 0) and *scale, with
 * the nt threads of the block (a multiple of 32, <= 1024; every thread must call).  src(i,
 * first) gives value i (first: the first call for i, where a producer stores its own
 * output).  J > 0: thread t holds values t + nt j (j < J) in registers, src called once per
 * value, needs nt J >= ld.  J = 0: src called twice per value (absmax, then codes): it must
 * return the same value both times.  The maximum is order-independent, so any nt and J
 * give the CPU's sequential qrl_quant_absmax.  sh32: 32 floats of shared memory (may have
 * just been used by another block reduction). */
template <bool FP8, int J, typename Src>
static __device__ __forceinline__ void qrl_w8a8_quantize_row_(const Src &src, int K, int ld,
                                                              int nt, uint8_t *qr, float *scale_out,
                                                              float *sh32) {
    int tid = threadIdx.x;
    float v[J > 0 ? J : 1];
    float m = 0.0f;
    if (J > 0) {
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = tid + nt * j < K ? src(tid + nt * j, true) : 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++)
            if (isfinite(v[j])) m = fmaxf(m, fabsf(v[j]));
    } else {
        for (int i = tid; i < K; i += nt) {
            float a = fabsf(src(i, true));
            if (isfinite(a) && a > m) m = a;
        }
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    int w = tid >> 5, l = tid & 31;
    __syncthreads(); /* sh32 may still be read by a previous reduction */
    if (l == 0) sh32[w] = m;
    __syncthreads();
    m = l < nt / 32 ? sh32[l] : 0.0f;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float scale = __fdiv_rn(m, FP8 ? QRL_E4M3_MAX : 127.0f);
    if (tid == 0) *scale_out = scale;
    if (J > 0) {
#pragma unroll
        for (int j = 0; j < J; j++) {
            int i = tid + nt * j;
            if (i < ld) qr[i] = i < K ? qrl_w8a8_enc_<FP8>(v[j], scale) : 0;
        }
    } else {
        for (int i = tid; i < ld; i += nt) qr[i] = i < K ? qrl_w8a8_enc_<FP8>(src(i, false), scale) : 0;
    }
}

#endif
