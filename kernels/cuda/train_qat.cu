/* NVFP4 fake quantization for QAT (train_qat.cuh).  Rows: one thread block per row (the
 * row's amax is a block reduction), one thread per 16-element NVFP4 block.  Weights: an
 * amax pass over the tensor (atomicMax on the bits of a non-negative float: exact and
 * order-free), then one thread per NVFP4 block.
 *
 * Bit-exactness with kernels/cpu/quant_rows.c and trace.c: every step is one IEEE F32
 * operation written with the _rn intrinsics (no FMA contraction, no fast division), and
 * the codecs are the CPU's: E4M3 by the same binade arithmetic (ilogbf/ldexpf are exact),
 * E2M1 by its midpoints (ties to the even code: the CPU's round-half-even on the grid;
 * the equality is checked over every float in tests/cuda/test_cuda_train_qat.c). */
#include "cuda/train_qat.cuh"

#include <cuda_bf16.h>
#include <float.h>
#include <math.h>

#include "cuda/launch.cuh"

#define NVB 16 /* QRL_NVFP4_BLOCK */

/* ---- codecs (kernels/cpu/quant_scalar.c) ------------------------------------------------- */

/* E4M3 magnitude code of a >= 0, not NaN: minifloat_mag_code(a, -6, 3, 0x7E, 448). */
static __device__ __forceinline__ unsigned e4m3_mag(float a) {
    if (!(a < 448.0f)) return 0x7Eu;
    int e = a >= 0.015625f ? ilogbf(a) : -6;
    unsigned q = (unsigned)rintf(ldexpf(a, 3 - e));
    unsigned code = ((unsigned)(e + 7) << 3) + q - 8u;
    return code > 0x7Eu ? 0x7Eu : code;
}

static __device__ __forceinline__ uint8_t e4m3_encode(float x) {
    if (isnan(x)) return 0x7F;
    return (uint8_t)((signbit(x) ? 0x80u : 0u) | e4m3_mag(fabsf(x)));
}

static __device__ __forceinline__ float e4m3_decode(uint8_t code) {
    unsigned e = (code >> 3) & 0xFu, m = code & 0x7u;
    if (e == 0xF && m == 0x7) return __int_as_float(0x7fc00000);
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), (int)e - 10);
    return (code & 0x80) ? -v : v;
}

/* E2M1 magnitude code of a >= 0 (NaN excluded by the caller): nearest of {0, 0.5, 1, 1.5,
 * 2, 3, 4, 6}, a tie to the even code, above 6 saturating to 6. */
static __device__ __forceinline__ unsigned e2m1_mag(float a) {
    return a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
         : a <= 2.5f  ? 4u : a < 3.5f  ? 5u : a <= 5.0f  ? 6u : 7u;
}

static __device__ __forceinline__ uint8_t e2m1_encode(float x) {
    if (isnan(x)) return 0x7;
    return (uint8_t)((signbit(x) ? 0x8u : 0u) | e2m1_mag(fabsf(x)));
}

static __device__ __forceinline__ float e2m1_mag_value(unsigned k) {
    return k < 4 ? 0.5f * (float)k : k == 4 ? 2.0f : k == 5 ? 3.0f : k == 6 ? 4.0f : 6.0f;
}

static __device__ __forceinline__ float e2m1_decode(uint8_t code) {
    float v = e2m1_mag_value(code & 0x7u);
    return (code & 0x8) ? -v : v;
}

/* qrl_trace_guided_round: on a codeword -> it; between two -> the one whose LSB is bit. */
static __device__ __forceinline__ uint8_t guided_round(float x, unsigned bit) {
    float a = fabsf(x);
    if (!(a <= 6.0f)) return e2m1_encode(x);
    unsigned sign = signbit(x) ? 0x8u : 0u;
    unsigned k = 0;
    while (k < 7 && e2m1_mag_value(k + 1) <= a) k++;
    if (a == e2m1_mag_value(k)) return (uint8_t)(sign | k);
    return (uint8_t)(sign | ((k & 1u) == (bit & 1u) ? k : k + 1));
}

/* ---- NVFP4 scales (kernels/cpu/quant_rows.c) -------------------------------------------- */

static __device__ __forceinline__ float global_enc(float amax) {
    float s = fminf(__fdiv_rn(2688.0f, amax), FLT_MAX);
    if (amax == 0.0f || s == 0.0f) return 1.0f;
    return s;
}

static __device__ __forceinline__ uint8_t block_scale(float block_amax, float g) {
    return e4m3_encode(__fmul_rn(block_amax, __fmul_rn(g, 1.0f / 6.0f)));
}

static __device__ __forceinline__ float block_rcp(uint8_t s_code, float g) {
    float s = e4m3_decode(s_code);
    if (!(s > 0.0f)) return 0.0f;
    return fminf(__fdiv_rn(1.0f, __fmul_rn(s, __fdiv_rn(1.0f, g))), FLT_MAX);
}

static __device__ __forceinline__ float dequant_scale(uint8_t s_code, float g) {
    return __fmul_rn(e4m3_decode(s_code), __fdiv_rn(1.0f, g));
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

/* One NVFP4 block v[0..len) under S_enc g: nearest (sc NULL) or guided by the record's
 * scale code *sc and LSB bits (bit j of `bits` for element j).  Writes the codes c and the
 * dequantization factor; returns the guided codes that differ from nearest. */
static __device__ __forceinline__ unsigned quant_block(const float *v, int len, float g,
                                                       const uint8_t *sc, uint32_t bits,
                                                       uint8_t *c, float *ds) {
    uint8_t s;
    float r;
    unsigned dis = 0;
    if (sc) {
        s = *sc;
        r = block_rcp(s, g);
    } else {
        float amax = 0.0f;
        bool bad = false;
        for (int j = 0; j < len; j++) {
            float a = fabsf(v[j]);
            if (!isfinite(a)) bad = true;
            else if (a > amax) amax = a;
        }
        s = bad ? 0x7F : block_scale(amax, g);
        r = bad ? 0.0f : block_rcp(s, g);
    }
    *ds = dequant_scale(s, g);
    for (int j = 0; j < len; j++) {
        if (r == 0.0f) {
            c[j] = 0;
            continue;
        }
        float q = __fmul_rn(v[j], r);
        uint8_t n = e2m1_encode(q);
        if (sc) {
            c[j] = guided_round(q, (bits >> j) & 1u);
            dis += c[j] != n;
        } else {
            c[j] = n;
        }
    }
    return dis;
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
    const float g = global_enc(block_max(m, sh32)); /* synchronizes: reads end before writes */
    uint32_t off = QRL_CUDA_QAT_NONE;
    if (guide) off = guide[(size_t)(r / heads) * stride + r % heads];
    const int nb = (n + NVB - 1) / NVB;
    const uint8_t *scales = off != QRL_CUDA_QAT_NONE ? blob + off : NULL;
    const uint8_t *bits = scales ? scales + nb : NULL;
    unsigned dis = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const int j0 = b * NVB, len = n - j0 < NVB ? n - j0 : NVB;
        float v[NVB], ds;
        uint8_t c[NVB];
        for (int j = 0; j < len; j++) v[j] = io<XB>::ld(x, base + j0 + j);
        uint32_t bb = 0;
        if (bits) bb = (uint32_t)bits[j0 / 8] | (len > 8 ? (uint32_t)bits[j0 / 8 + 1] << 8 : 0u);
        dis += quant_block(v, len, g, scales ? scales + b : NULL, bb, c, &ds);
        for (int j = 0; j < len; j++) io<YB>::st(y, base + j0 + j, __fmul_rn(e2m1_decode(c[j]), ds));
        if (codes) {
            uint8_t *cr = codes + r * (size_t)((n + 1) / 2) + j0 / 2;
            for (int j = 0; j < len; j += 2)
                cr[j / 2] = (uint8_t)((c[j] & 0xF) | (j + 1 < len ? (c[j + 1] & 0xF) << 4 : 0));
        }
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

static __global__ void amax_kernel(float *amax, const float *w, size_t n) {
    __shared__ float sh32[32];
    float m = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float a = fabsf(w[i]);
        if (isfinite(a) && a > m) m = a;
    }
    m = block_max(m, sh32);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax((unsigned *)amax, __float_as_uint(m));
}

static __global__ void qat_weight_kernel(const float *w, int cols, size_t nblocks, int nbr,
                                         const float *amax, float *yf, uint16_t *yb) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    const float g = global_enc(*amax);
    const size_t row = i / nbr;
    const int j0 = (int)(i % nbr) * NVB, len = cols - j0 < NVB ? cols - j0 : NVB;
    const size_t base = row * (size_t)cols + j0;
    float v[NVB], ds;
    uint8_t c[NVB];
    for (int j = 0; j < len; j++) v[j] = w[base + j];
    quant_block(v, len, g, NULL, 0, c, &ds);
    for (int j = 0; j < len; j++) {
        float q = __fmul_rn(e2m1_decode(c[j]), ds);
        if (yf) yf[base + j] = q;
        if (yb) yb[base + j] = qrl_bf16_st_(q);
    }
}

qrl_status qrl_cuda_qat_weight(const float *w, int rows, int cols, float *y_f32,
                               uint16_t *y_bf16, float *amax, void *stream, qrl_error *err) {
    if (rows <= 0 || cols <= 0 || (!y_f32 && !y_bf16) || !w || !amax)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "qat weight: rows %d, cols %d, outputs %s/%s", rows, cols,
                             y_f32 ? "f32" : "-", y_bf16 ? "bf16" : "-");
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), s);
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "qat weight: memset: %s", cudaGetErrorString(e));
    size_t n = (size_t)rows * cols;
    size_t g = (n + 255) / 256;
    amax_kernel<<<(unsigned)(g < 1024 ? g : 1024), 256, 0, s>>>(amax, w, n);
    QRL_TRY(qrl_cuda_launch_status_("qat weight amax", err));
    int nbr = (cols + NVB - 1) / NVB;
    size_t nblocks = (size_t)rows * nbr;
    qat_weight_kernel<<<(unsigned)((nblocks + 127) / 128), 128, 0, s>>>(w, cols, nblocks, nbr,
                                                                       amax, y_f32, y_bf16);
    return qrl_cuda_launch_status_("qat weight", err);
}
