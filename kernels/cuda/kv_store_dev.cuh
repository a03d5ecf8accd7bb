/* Internal to kernels/cuda (C++ only): the quantize-and-store of one token-head K or V
 * vector by one warp for the int8, fp8, int4 and int4-protected caches, shared by the
 * store kernel (kv_quant.cu) and the RoPE kernel that stores straight into the cache
 * (rope_kv.cu), so both write the same bytes.  Every encoder is the CPU one's exact
 * operation sequence (kernels/cpu/quant_kv.c, quant_rows.c, quant_scalar.c): IEEE
 * division, rintf = round half to even, double where the CPU uses double, no contractible
 * a*b+c. */
#ifndef QRL_CUDA_KV_STORE_DEV_CUH
#define QRL_CUDA_KV_STORE_DEV_CUH

#include <cuda_fp8.h>
#include <math.h>

#include "cuda/kv_quant_dev.cuh"

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float warp_min(float v) {
    for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* |x| over finite elements (qrl_quant_absmax): 0 for NaN/Inf and padding lanes. */
static __device__ __forceinline__ float fin_abs(float x) {
    float a = fabsf(x);
    return isfinite(a) ? a : 0.0f;
}

/* qrl_int8_encode */
static __device__ __forceinline__ int8_t enc_i8(float x, float s) {
    if (isnan(x) || s == 0.0f) return 0;
    float q = rintf(x / s);
    if (q > 127.0f) q = 127.0f;
    if (q < -127.0f) q = -127.0f;
    return (int8_t)q;
}

/* One token-head vector held as x[c] = element lane + 32c: INT8 codes + absmax/127 scale
 * (qrl_int8_quantize_rows with one row). */
static __device__ void store_int8(const float x[8], int hd, int lane, int8_t *codes, float *scale) {
    float a = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; c++) a = fmaxf(a, fin_abs(x[c]));
    float s = warp_max(a) / 127.0f;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        int j = lane + 32 * c;
        if (j < hd) codes[j] = enc_i8(x[c], s);
    }
    if (lane == 0) *scale = s;
}

/* Vector (w = 0: K, 1: V) of kv head h at position pos of sequence seq, held as x[k] =
 * element lane + 32k (head_dim <= 256), into main-store record rec (kv_quant.cuh layout)
 * and, int4-protected, the INT8 side cache when pos is a sink or recent position.  fp8
 * needs the sequence's head scales calibrated.  Not for the fp4 format. */
static __device__ __forceinline__ void qrl_kvq_store_vec_(const qrl_cuda_kvq_layer &c, const float x[8],
                                                          int lane, int seq, int pos, size_t rec,
                                                          int h, int w) {
    int hd = c.head_dim, KVH = c.n_kv_heads;
    if (c.format == QRL_CUDA_KVQ_INT8) {
        store_int8(x, hd, lane, (int8_t *)c.codes[w] + rec * hd, c.scales[w] + rec);
        return;
    }
    if (c.format == QRL_CUDA_KVQ_FP8) {
        float s = c.fp8_scale[((size_t)seq * KVH + h) * 2 + w];
        uint8_t *codes = c.codes[w] + rec * hd;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int j = lane + 32 * k;
            if (j < hd) codes[j] = (uint8_t)__nv_cvt_float_to_fp8(x[k] / s, __NV_SATFINITE, __NV_E4M3);
        }
        return;
    }
    /* int4 asymmetric, group 32 = the 32 lanes of one k (qrl_kv_int4_quantize) */
    int ng = (hd + 31) / 32;
    uint8_t *codes = c.codes[w] + rec * (hd / 2);
    float *sc = c.scales[w] + rec * 2 * ng;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (k >= ng) break;
        int j = lane + 32 * k;
        bool valid = j < hd && isfinite(x[k]);
        float mn = warp_min(valid ? x[k] : INFINITY), mx = warp_max(valid ? x[k] : -INFINITY);
        if (mn > mx) mn = mx = 0.0f;
        float s = (float)(((double)mx - mn) / 15.0);
        unsigned q = 0;
        if (!isnan(x[k]) && s != 0.0f) {
            double v = ((double)x[k] - mn) / s;
            v = v > 15.0 ? 15.0 : (v < 0.0 ? 0.0 : v);
            q = (unsigned)rintf((float)v);
        }
        unsigned hi = __shfl_down_sync(0xffffffffu, q, 1);
        if (!(lane & 1) && j < hd) codes[j >> 1] = (uint8_t)(q | (j + 1 < hd ? hi << 4 : 0u));
        if (lane == 0) sc[k] = s, sc[ng + k] = mn;
    }
    if (c.format != QRL_CUDA_KVQ_INT4_PROTECTED) return;
    int slot = pos < c.sink ? pos : c.recent > 0 ? kvq_side_slot(c, pos) : -1;
    if (slot < 0) return;
    size_t srec = kvq_side_rec(c, seq, slot, h);
    store_int8(x, hd, lane, c.side_codes[w] + srec * hd, c.side_scales[w] + srec);
}

#endif
