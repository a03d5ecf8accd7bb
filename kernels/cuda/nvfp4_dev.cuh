/* NVFP4 per-row quantization on the device (C++ only): the device half of nvfp4_quant.cuh,
 * shared by the standalone quantizer (nvfp4_quant.cu), the producers that fuse it (the
 * RMSNorm in norm.cu, the SwiGLU in pointwise.cu), the fp4 KV write (kv_quant.cu) and the
 * TRACE recorder.  One body for all of them, so every path's S_enc, block scales and codes
 * are bit-identical to the CPU reference on the same F32 values: kernels/cpu/quant.h
 * (qrl_nvfp4_global_enc, qrl_nvfp4_block_scale, qrl_nvfp4_block_rcp, qrl_e2m1_encode,
 * quant_rows.c's nvfp4_row), docs/formats.md.
 *
 * Exactness: nvcc contracts a * b + c into an FMA and --use_fast_math would flush and
 * approximate; every operation below is a single IEEE operation (__fmul_rn, __fdiv_rn:
 * never contracted, never approximated, subnormals kept), in the CPU's order, and E4M3
 * encoding is the saturating hardware conversion quant.h names as identical.  Hopper has
 * no E2M1 conversion instruction (cvt.rn.satfinite.e2m1x2 is sm_100+), so E2M1 is encoded
 * by comparisons against the rounding boundaries of its grid (ties to the even code). */
#ifndef QRL_CUDA_NVFP4_DEV_CUH
#define QRL_CUDA_NVFP4_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <float.h>
#include <stdint.h>

#include "cpu/quant.h"
#include "cuda/nvfp4_quant.cuh"
#include "cuda/trace_capture.cuh"

/* qrl_nvfp4_global_enc: S_enc = 2688 / amax, FLT_MAX if that overflows, 1 if amax is 0. */
static __device__ __forceinline__ float qrl_nvfp4_s_enc_(float amax) {
    float s = fminf(__fdiv_rn(QRL_E4M3_MAX * QRL_E2M1_MAX, amax), FLT_MAX);
    return amax == 0.0f || s == 0.0f ? 1.0f : s;
}

/* qrl_e4m3_encode (RNE, saturating, NaN -> 0x7F) and qrl_e4m3_decode (exact via half). */
static __device__ __forceinline__ uint8_t qrl_e4m3_enc_(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
static __device__ __forceinline__ float qrl_e4m3_dec_(uint8_t c) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

/* qrl_e2m1_encode: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; a value on a midpoint takes the
 * code with mantissa bit 0 (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
 * 5 -> 4); > 5 and +-Inf saturate to 6; NaN -> 0x7; the sign of a zero result is kept. */
static __device__ __forceinline__ uint32_t qrl_e2m1_enc_(float x) {
    if (isnan(x)) return 0x7u;
    float a = fabsf(x);
    uint32_t m = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
               : a <= 2.5f  ? 4u : a < 3.5f  ? 5u : a <= 5.0f  ? 6u : 7u;
    return (signbit(x) ? 0x8u : 0u) | m;
}

/* qrl_e2m1_decode of the low 4 bits. */
static __device__ __forceinline__ float qrl_e2m1_dec_(uint32_t c) {
    float m = 0.5f * (float)((0xC8643210u >> ((c & 7u) << 2)) & 15u);
    return (c & 8u) ? -m : m;
}

/* qrl_nvfp4_block_scale: E4M3(block_amax * (S_enc * (1/6))). */
static __device__ __forceinline__ uint8_t qrl_nvfp4_block_scale_(float block_amax, float s_enc) {
    const float inv6 = 1.0f / QRL_E2M1_MAX;
    return qrl_e4m3_enc_(__fmul_rn(block_amax, __fmul_rn(s_enc, inv6)));
}

/* qrl_nvfp4_block_rcp: min(1 / (decode(s_b) * (1 / S_enc)), FLT_MAX); 0 for a zero or NaN
 * scale (the block's codes are 0). */
static __device__ __forceinline__ float qrl_nvfp4_block_rcp_(uint8_t scale, float s_enc) {
    float s = qrl_e4m3_dec_(scale);
    if (!(s > 0.0f)) return 0.0f;
    float s_dec = __fdiv_rn(1.0f, s_enc);
    return fminf(__fdiv_rn(1.0f, __fmul_rn(s, s_dec)), FLT_MAX);
}

/* One NVFP4 block under S_enc: x[0, len) (len in 1..16; x[len..16) are ignored and coded 0).
 * Returns the E4M3 block scale code and *codes the 16 E2M1 codes, element j in bits
 * [4j, 4j + 4): stored little-endian these are the CPU's packed bytes (element 2i in the
 * low nibble of byte i).  A block holding a NaN or +-Inf gets scale 0x7F (NaN) and codes 0,
 * a block whose scale encodes to 0 codes 0: as nvfp4_row in quant_rows.c. */
static __device__ __forceinline__ uint8_t qrl_nvfp4_quantize_block_(const float *x, int len,
                                                                     float s_enc, uint64_t *codes) {
    float amax = 0.0f;
    bool bad = false;
#pragma unroll
    for (int j = 0; j < QRL_NVFP4_BLOCK; j++) {
        if (j >= len) break;
        float a = fabsf(x[j]);
        if (!isfinite(a)) bad = true;
        else amax = fmaxf(amax, a);
    }
    uint8_t s = bad ? (uint8_t)QRL_E4M3_NAN : qrl_nvfp4_block_scale_(amax, s_enc);
    float r = bad ? 0.0f : qrl_nvfp4_block_rcp_(s, s_enc);
    uint64_t c = 0;
    if (r != 0.0f) {
#pragma unroll
        for (int j = 0; j < QRL_NVFP4_BLOCK; j++)
            if (j < len) c |= (uint64_t)qrl_e2m1_enc_(__fmul_rn(x[j], r)) << (4 * j);
    }
    *codes = c;
    return s;
}

/* The block's values e2m1(code) * decode(scale) as 8 BF16 pairs (element 2i low half of
 * word i): exact (at most 2 + 4 significant bits, magnitudes 2^-10 .. 2688), so a BF16 GEMM
 * on them times 1 / S_enc per row is the CPU's dequantization up to F32 rounding.  A NaN
 * scale gives NaN (0 * NaN), as qrl_nvfp4_dequantize_row. */
static __device__ __forceinline__ void qrl_nvfp4_block_bf16_(uint64_t codes, uint8_t scale,
                                                             uint32_t out[8]) {
    float s = qrl_e4m3_dec_(scale);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float lo = __fmul_rn(qrl_e2m1_dec_((uint32_t)(codes >> (8 * i))), s),
              hi = __fmul_rn(qrl_e2m1_dec_((uint32_t)(codes >> (8 * i + 4))), s);
        out[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
                 (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
    }
}

/* Where one row's results go (any pointer NULL: not written).  codes: ceil(n/2) bytes;
 * scales: ceil(n/16) bytes; xq: n BF16 values e2m1 * decode(scale); s_enc, s_dec: one F32
 * (S_enc and 1 / S_enc, IEEE division, as qrl_nvfp4_block_dequant_scale's factor); x_out:
 * the n F32 values quantized (what src gave).  rec: the row's TRACE record (4 bytes S_enc,
 * ceil(n/16) scales, ceil(n/8) bytes of code LSBs: trace_capture.cuh); tap: the n F32
 * values for the recorder's tap. */
struct qrl_nvfp4_row_out_ {
    uint8_t *codes, *scales;
    uint16_t *xq;
    float *s_enc, *s_dec, *x_out;
    uint8_t *rec;
    float *tap;
};

/* Row r's slice of the outputs a of rows of n values. */
static __device__ __forceinline__ qrl_nvfp4_row_out_ qrl_nvfp4_row_out_of_(const qrl_cuda_nvfp4_act &a,
                                                                          size_t r, int n) {
    qrl_nvfp4_row_out_ o;
    o.codes = a.codes ? a.codes + r * ((n + 1) / 2) : NULL;
    o.scales = a.scales ? a.scales + r * ((n + 15) / 16) : NULL;
    o.xq = a.xq ? a.xq + r * n : NULL;
    o.s_enc = a.s_enc ? a.s_enc + r : NULL;
    o.s_dec = a.s_dec ? a.s_dec + r : NULL;
    o.x_out = a.x_out ? a.x_out + r * n : NULL;
    o.rec = NULL;
    o.tap = NULL;
    if (a.trace_ctl) { /* the pass's row map and store, as the host left them for this pass */
        int64_t e = a.trace_dst[r];
        if (e >= 0) {
            const qrl_cuda_trace_ctl *c = a.trace_ctl;
            o.rec = c->store + e * c->slab + a.trace_off;
            float *taps = c->taps;
            if (taps) o.tap = taps + e * c->tap_floats + a.trace_tap_off;
        }
    }
    return o;
}

/* Store block b (elements [16b, 16b + len)) of a row of nb blocks. */
static __device__ __forceinline__ void qrl_nvfp4_store_block_(const qrl_nvfp4_row_out_ &o, int b,
                                                              int len, int nb, uint8_t s, uint64_t c) {
    if (o.scales) o.scales[b] = s;
    if (o.rec) { /* the record: the scale, and the LSB of each code (bit 4j of c) */
        o.rec[4 + b] = s;
        unsigned lsb = 0;
#pragma unroll
        for (int j = 0; j < QRL_NVFP4_BLOCK; j++) lsb |= (unsigned)(c >> (4 * j) & 1u) << j;
        uint8_t *bits = o.rec + 4 + nb;
        bits[2 * b] = (uint8_t)lsb;
        if (len > 8) bits[2 * b + 1] = (uint8_t)(lsb >> 8);
    }
    if (o.codes) {
        uint8_t *cp = o.codes + 8 * b;
        if (len == QRL_NVFP4_BLOCK && ((uintptr_t)cp & 7) == 0) {
            *(uint64_t *)cp = c;
        } else {
            for (int i = 0; i < (len + 1) / 2; i++) cp[i] = (uint8_t)(c >> (8 * i));
        }
    }
    if (o.xq) {
        uint32_t w[8];
        qrl_nvfp4_block_bf16_(c, s, w);
        uint16_t *xp = o.xq + 16 * b;
        if (len == QRL_NVFP4_BLOCK && ((uintptr_t)xp & 15) == 0) {
            ((uint4 *)xp)[0] = make_uint4(w[0], w[1], w[2], w[3]);
            ((uint4 *)xp)[1] = make_uint4(w[4], w[5], w[6], w[7]);
        } else {
#pragma unroll /* static indices: w stays in registers */
            for (int j = 0; j < QRL_NVFP4_BLOCK; j++)
                if (j < len) xp[j] = (uint16_t)(w[j >> 1] >> (16 * (j & 1)));
        }
    }
}

/* Quantize one row of n values with the nt threads of a block (nt a multiple of 32, <=
 * 1024; every thread must call).  Thread t owns the 16-blocks t, t + nt, ...; src(i, first)
 * gives value i (first: the first call for i, where a producer stores its own output).
 * JB > 0: the thread keeps its JB blocks in registers (needs nt * 16 * JB >= n), src called
 * once per value; JB = 0: src called twice per value (absmax, then codes), and it must
 * return the same value both times.  The row absmax (over finite values) is a maximum, so
 * any nt and JB give the CPU's sequential one.  sh32: 32 floats of shared memory (may have
 * just been used by another block reduction). */
template <int JB, typename Src>
static __device__ __forceinline__ void qrl_nvfp4_quantize_row_(const Src &src, int n, int nt,
                                                               const qrl_nvfp4_row_out_ &o,
                                                               float *sh32) {
    constexpr int B = QRL_NVFP4_BLOCK;
    int tid = threadIdx.x, nb = (n + B - 1) / B;
    float v[JB > 0 ? JB : 1][B];
    float m = 0.0f;
    if (JB > 0) {
#pragma unroll
        for (int j = 0; j < (JB > 0 ? JB : 1); j++) {
            int b = tid + nt * j;
#pragma unroll
            for (int e = 0; e < B; e++) {
                int i = B * b + e;
                v[j][e] = b < nb && i < n ? src(i, true) : 0.0f;
                if (o.x_out && b < nb && i < n) o.x_out[i] = v[j][e];
                if (o.tap && b < nb && i < n) o.tap[i] = v[j][e];
                if (isfinite(v[j][e])) m = fmaxf(m, fabsf(v[j][e]));
            }
        }
    } else {
        for (int b = tid; b < nb; b += nt)
            for (int i = B * b; i < B * b + B && i < n; i++) {
                float xi = src(i, true), a = fabsf(xi);
                if (o.x_out) o.x_out[i] = xi;
                if (isfinite(a)) m = fmaxf(m, a);
            }
    }
    for (int off = 16; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    int w = tid >> 5, l = tid & 31;
    __syncthreads(); /* sh32 may still be read by a previous reduction */
    if (l == 0) sh32[w] = m;
    __syncthreads();
    m = l < nt / 32 ? sh32[l] : 0.0f;
    for (int off = 16; off; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s_enc = qrl_nvfp4_s_enc_(m);
    if (tid == 0) {
        if (o.s_enc) *o.s_enc = s_enc;
        if (o.s_dec) *o.s_dec = __fdiv_rn(1.0f, s_enc);
        if (o.rec) { /* the record's S_enc: 4 bytes little-endian, not aligned */
            uint32_t u = __float_as_uint(s_enc);
            o.rec[0] = (uint8_t)u, o.rec[1] = (uint8_t)(u >> 8);
            o.rec[2] = (uint8_t)(u >> 16), o.rec[3] = (uint8_t)(u >> 24);
        }
    }
    if (JB > 0) {
#pragma unroll
        for (int j = 0; j < (JB > 0 ? JB : 1); j++) {
            int b = tid + nt * j;
            if (b >= nb) continue;
            int len = n - B * b < B ? n - B * b : B;
            uint64_t c;
            uint8_t s = qrl_nvfp4_quantize_block_(v[j], len, s_enc, &c);
            qrl_nvfp4_store_block_(o, b, len, nb, s, c);
        }
    } else {
        for (int b = tid; b < nb; b += nt) {
            int len = n - B * b < B ? n - B * b : B;
            float x[B];
#pragma unroll
            for (int e = 0; e < B; e++) x[e] = e < len ? src(B * b + e, false) : 0.0f;
            if (o.tap) /* here, not in the first pass: fewer live registers there */
                for (int e = 0; e < len; e++) o.tap[B * b + e] = x[e];
            uint64_t c;
            uint8_t s = qrl_nvfp4_quantize_block_(x, len, s_enc, &c);
            qrl_nvfp4_store_block_(o, b, len, nb, s, c);
        }
    }
}

#endif
