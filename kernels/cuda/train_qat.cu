/* NVFP4 fake quantization for QAT (train_qat.cuh).  Rows: one thread block per row (the
 * row's amax is a block reduction), one thread per 16-element NVFP4 block.  Weights: an
 * amax pass over the tensor (atomicMax on the bits of a non-negative float: exact and
 * order-free), then one thread per NVFP4 block.
 *
 * Bit-exactness with kernels/cpu/quant_rows.c and trace.c: S_enc, the E4M3 block scales,
 * the element multiplier and nearest E2M1 rounding are the shared device quantizer's
 * (nvfp4_dev.cuh, the decode engine's and the TRACE recorder's); only the guided rounding
 * (a record's scale and code LSBs) and the dequantization x_hat = e2m1 * (s_b * (1/S_enc))
 * are QAT's own, written with the _rn intrinsics (no FMA contraction, no fast division). */
#include "cuda/train_qat.cuh"

#include <cuda_bf16.h>
#include <float.h>
#include <math.h>

#include "cuda/launch.cuh"
#include "cuda/nvfp4_dev.cuh"

#define NVB QRL_NVFP4_BLOCK

/* qrl_trace_guided_round: on a codeword -> it; between two -> the one whose LSB is bit. */
static __device__ __forceinline__ uint32_t guided_round(float x, unsigned bit) {
    float a = fabsf(x);
    if (!(a <= 6.0f)) return qrl_e2m1_enc_(x);
    unsigned sign = signbit(x) ? 0x8u : 0u;
    unsigned k = 0;
    while (k < 7 && qrl_e2m1_dec_(k + 1) <= a) k++;
    if (a == qrl_e2m1_dec_(k)) return sign | k;
    return sign | ((k & 1u) == (bit & 1u) ? k : k + 1);
}

/* qrl_nvfp4_block_dequant_scale: decode(s_b) * (1 / S_enc). */
static __device__ __forceinline__ float dequant_scale(uint8_t s_code, float g) {
    return __fmul_rn(qrl_e4m3_dec_(s_code), __fdiv_rn(1.0f, g));
}

/* x as the replicas receive it over the BF16 weight stream: round to nearest even. */
static __device__ __forceinline__ float bf16_round(float x) {
    return qrl_bf16_ld_(qrl_bf16_st_(x));
}

template <bool BF> struct io;
template <> struct io<true> {
    static __device__ __forceinline__ float ld(const void *p, size_t i) {
        return qrl_bf16_ld_(((const uint16_t *)p)[i]);
    }
    static __device__ __forceinline__ void st(void *p, size_t i, float v) {
        ((uint16_t *)p)[i] = qrl_bf16_st_(v);
    }
};
template <> struct io<false> {
    static __device__ __forceinline__ float ld(const void *p, size_t i) {
        return ((const float *)p)[i];
    }
    static __device__ __forceinline__ void st(void *p, size_t i, float v) {
        ((float *)p)[i] = v;
    }
};

/* One NVFP4 block v[0..len) under S_enc g: nearest (sc NULL: nvfp4_dev.cuh's block) or
 * guided by the record's scale code *sc and LSB bits (bit j of `bits` for element j).
 * Returns the packed codes (element j in bits [4j, 4j + 4)) and in *ds the dequantization
 * factor; *dis: the guided codes that differ from nearest. */
static __device__ __forceinline__ uint64_t quant_block(const float *v, int len, float g,
                                                       const uint8_t *sc, uint32_t bits,
                                                       float *ds, unsigned *dis) {
    uint64_t c = 0;
    if (!sc) {
        *ds = dequant_scale(qrl_nvfp4_quantize_block_(v, len, g, &c), g);
        return c;
    }
    const float r = qrl_nvfp4_block_rcp_(*sc, g);
    *ds = dequant_scale(*sc, g);
    if (r == 0.0f) return 0;
    for (int j = 0; j < len; j++) {
        float q = __fmul_rn(v[j], r);
        uint32_t k = guided_round(q, (bits >> j) & 1u);
        *dis += k != qrl_e2m1_enc_(q);
        c |= (uint64_t)k << (4 * j);
    }
    return c;
}

/* Element j of a block's codes, dequantized. */
static __device__ __forceinline__ float dq(uint64_t c, int j, float ds) {
    return __fmul_rn(qrl_e2m1_dec_((uint32_t)(c >> (4 * j))), ds);
}

/* Max over a block of blockDim.x threads (multiple of 32, <= 1024) of values >= 0. */
static __device__ __forceinline__ float block_max(float v, float *sh32) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh32[w] = v;
    __syncthreads();
    v = l < nw ? sh32[l] : 0.0f;
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- rows ------------------------------------------------------------------------------- */

template <bool XB, bool YB>
static __global__ void qat_rows_kernel(void *y, const void *x, int n, int heads,
                                       const uint32_t *guide, int stride, const uint8_t *blob,
                                       uint8_t *codes, unsigned long long *cnt) {
    __shared__ float sh32[32];
    __shared__ unsigned sh_dis;
    const size_t r = blockIdx.x, base = r * (size_t)n;
    float m = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float a = fabsf(io<XB>::ld(x, base + j));
        if (isfinite(a) && a > m) m = a;
    }
    if (threadIdx.x == 0) sh_dis = 0;
    const float g = qrl_nvfp4_s_enc_(block_max(m, sh32)); /* synchronizes: reads end before writes */
    uint32_t off = QRL_CUDA_QAT_NONE;
    if (guide) off = guide[(size_t)(r / heads) * stride + r % heads];
    const int nb = (n + NVB - 1) / NVB;
    const uint8_t *scales = off != QRL_CUDA_QAT_NONE ? blob + off : NULL;
    const uint8_t *bits = scales ? scales + nb : NULL;
    qrl_nvfp4_row_out_ o = {};
    o.codes = codes ? codes + r * (size_t)((n + 1) / 2) : NULL;
    unsigned dis = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const int j0 = b * NVB, len = n - j0 < NVB ? n - j0 : NVB;
        float v[NVB], ds;
        for (int j = 0; j < len; j++) v[j] = io<XB>::ld(x, base + j0 + j);
        uint32_t bb = 0;
        if (bits) bb = (uint32_t)bits[j0 / 8] | (len > 8 ? (uint32_t)bits[j0 / 8 + 1] << 8 : 0u);
        uint64_t c = quant_block(v, len, g, scales ? scales + b : NULL, bb, &ds, &dis);
        for (int j = 0; j < len; j++) io<YB>::st(y, base + j0 + j, dq(c, j, ds));
        qrl_nvfp4_store_block_(o, b, len, nb, 0, c); /* the codes only */
    }
    if (!cnt) return;
    if (dis) atomicAdd(&sh_dis, dis);
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(cnt + (scales ? 0 : 1), (unsigned long long)n);
        if (sh_dis) atomicAdd(cnt + 2, (unsigned long long)sh_dis);
    }
}

qrl_status qrl_cuda_qat_rows(void *y, int y_bf16, const void *x, int x_bf16, int rows, int n,
                             int heads, const uint32_t *guide, int stride, const uint8_t *blob,
                             uint8_t *codes, unsigned long long *counters, void *stream,
                             qrl_error *err) {
    if (rows <= 0 || n <= 0 || heads <= 0 || rows % heads || (guide && (!blob || stride <= 0)) ||
        !x || !y)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "qat rows: rows %d, n %d, heads %d, stride %d (guide %s, blob %s)",
                             rows, n, heads, stride, guide ? "set" : "NULL", blob ? "set" : "NULL");
    int nb = (n + NVB - 1) / NVB, threads = (nb + 31) / 32 * 32;
    if (threads > 256) threads = 256;
    cudaStream_t s = (cudaStream_t)stream;
#define QAT_ROWS(XB, YB)                                                                      \
    qat_rows_kernel<XB, YB><<<rows, threads, 0, s>>>(y, x, n, heads, guide, stride, blob, codes, \
                                                     counters)
    if (x_bf16 && y_bf16) QAT_ROWS(true, true);
    else if (x_bf16) QAT_ROWS(true, false);
    else if (y_bf16) QAT_ROWS(false, true);
    else QAT_ROWS(false, false);
#undef QAT_ROWS
    return qrl_cuda_launch_status_("qat rows", err);
}

/* ---- weights ---------------------------------------------------------------------------- */

/* Weight element i as quantized: the F32 master, or (RB) its BF16 rounding, times f (the
 * UAQ scale at version 0, else 1: untouched), rounded to F32 as model_train.c's y[k] *= f. */
template <bool RB> static __device__ __forceinline__ float wld(const float *w, size_t i, float f) {
    const float x = RB ? bf16_round(w[i]) : w[i];
    return f == 1.0f ? x : __fmul_rn(x, f);
}

template <bool RB>
static __global__ void amax_kernel(float *amax, const float *w, size_t n, float f) {
    __shared__ float sh32[32];
    float m = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float a = fabsf(wld<RB>(w, i, f));
        if (isfinite(a) && a > m) m = a;
    }
    m = block_max(m, sh32);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax((unsigned *)amax, __float_as_uint(m));
}

template <bool RB>
static __global__ void qat_weight_kernel(const float *w, float f, int cols, size_t nblocks,
                                         int nbr, const float *amax, float *yf, uint16_t *yb) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    const float g = qrl_nvfp4_s_enc_(*amax);
    const size_t row = i / nbr;
    const int j0 = (int)(i % nbr) * NVB, len = cols - j0 < NVB ? cols - j0 : NVB;
    const size_t base = row * (size_t)cols + j0;
    float v[NVB], ds;
    unsigned dis = 0;
    for (int j = 0; j < len; j++) v[j] = wld<RB>(w, base + j, f);
    uint64_t c = quant_block(v, len, g, NULL, 0, &ds, &dis);
    for (int j = 0; j < len; j++) {
        float q = dq(c, j, ds);
        if (f != 1.0f) q = __fdiv_rn(q, f); /* model_train.c's y[k] /= f (IEEE division) */
        if (yf) yf[base + j] = q;
        if (yb) yb[base + j] = qrl_bf16_st_(q);
    }
}

qrl_status qrl_cuda_qat_weight(const float *w, int w_bf16, float scale, int rows, int cols,
                               float *y_f32, uint16_t *y_bf16, float *amax, void *stream,
                               qrl_error *err) {
    if (rows <= 0 || cols <= 0 || (!y_f32 && !y_bf16) || !w || !amax ||
        !(isfinite(scale) && scale > 0.0f))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "qat weight: rows %d, cols %d, scale %g, outputs %s/%s", rows, cols,
                             (double)scale, y_f32 ? "f32" : "-", y_bf16 ? "bf16" : "-");
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), s);
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "qat weight: memset: %s", cudaGetErrorString(e));
    size_t n = (size_t)rows * cols;
    size_t g = (n + 255) / 256;
    unsigned ga = (unsigned)(g < 1024 ? g : 1024);
    if (w_bf16) amax_kernel<true><<<ga, 256, 0, s>>>(amax, w, n, scale);
    else amax_kernel<false><<<ga, 256, 0, s>>>(amax, w, n, scale);
    QRL_TRY(qrl_cuda_launch_status_("qat weight amax", err));
    int nbr = (cols + NVB - 1) / NVB;
    size_t nblocks = (size_t)rows * nbr;
    unsigned gb = (unsigned)((nblocks + 127) / 128);
    if (w_bf16)
        qat_weight_kernel<true><<<gb, 128, 0, s>>>(w, scale, cols, nblocks, nbr, amax, y_f32, y_bf16);
    else
        qat_weight_kernel<false><<<gb, 128, 0, s>>>(w, scale, cols, nblocks, nbr, amax, y_f32, y_bf16);
    return qrl_cuda_launch_status_("qat weight", err);
}

/* ---- BF16 rounding ---------------------------------------------------------------------- */

static __global__ void bf16_round_kernel(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = bf16_round(x[i]);
}

qrl_status qrl_cuda_bf16_round(float *y, const float *x, size_t n, void *stream,
                               qrl_error *err) {
    if (!n) return QRL_OK;
    if (!x || !y)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "bf16 round: x %s, y %s",
                             x ? "set" : "NULL", y ? "set" : "NULL");
    size_t g = (n + 255) / 256;
    bf16_round_kernel<<<(unsigned)(g < 4096 ? g : 4096), 256, 0, (cudaStream_t)stream>>>(y, x, n);
    return qrl_cuda_launch_status_("bf16 round", err);
}
