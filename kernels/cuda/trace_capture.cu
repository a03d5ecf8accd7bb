/* TRACE capture kernel (trace_capture.cuh). */
#include "cuda/trace_capture.cuh"

#include <cuda_bf16.h>
#include <float.h>

#include "cuda/launch.cuh"

/* ---- NVFP4 quantizer (the seam) -------------------------------------------------------
 * kernels/cpu/quant.h's recipe step by step, with explicitly rounded F32 operations (no
 * contraction can change a result):
 *   S_enc = 2688 / amax (FLT_MAX if that overflows; 1 if amax is 0)
 *   s_b   = E4M3(block_amax * (S_enc * (1/6)))
 *   r_b   = min(1 / (decode(s_b) * (1 / S_enc)), FLT_MAX), 0 for s_b = 0
 *   code  = E2M1(x * r_b); a block with a non-finite element: s_b = NaN (0x7F), codes 0.
 * To be replaced by the engine's shared NVFP4 device quantizer once it exists, so the
 * engine and the recorder run one quantizer. */

/* E4M3 magnitude code of a >= 0 (not NaN): quant_scalar.c's minifloat_mag_code(a, -6, 3,
 * 0x7E, 448): the grid step of a's binade, round half to even, saturate at 448. */
static __device__ __forceinline__ unsigned trace_e4m3_mag(float a) {
    if (!(a < 448.0f)) return 0x7Eu;
    int e = a >= 0.015625f ? ilogbf(a) : -6;
    unsigned q = (unsigned)rintf(ldexpf(a, 3 - e));
    unsigned code = ((unsigned)(e + 7) << 3) + q - 8u;
    return code > 0x7Eu ? 0x7Eu : code;
}

static __device__ __forceinline__ float trace_e4m3_decode(unsigned code) {
    unsigned e = (code >> 3) & 0xF, m = code & 0x7;
    if (e == 0xF && m == 0x7) return __int_as_float(0x7fc00000);
    return e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), (int)e - 10);
}

/* E2M1 magnitude code of a >= 0 (not NaN): the grid 0, .5, 1, 1.5, 2, 3, 4, 6 with ties
 * to the even code (minifloat_mag_code(a, 0, 1, 7, 6)): each threshold is a midpoint,
 * '>' where the lower neighbour is even, '>=' where the upper one is. */
static __device__ __forceinline__ unsigned trace_e2m1_mag(float a) {
    return (unsigned)(a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
           (a >= 3.5f) + (a > 5.0f);
}

static __device__ __forceinline__ float trace_nvfp4_global_enc(float amax) {
    float s = fminf(__fdiv_rn(2688.0f, amax), FLT_MAX);
    return amax == 0.0f || s == 0.0f ? 1.0f : s;
}

/* Block scale code of a block whose finite absmax is amax (bad: a non-finite element). */
static __device__ __forceinline__ unsigned trace_nvfp4_block_scale(float amax, bool bad,
                                                                   float genc) {
    if (bad) return 0x7Fu;
    const float inv6 = 1.0f / 6.0f;
    return trace_e4m3_mag(__fmul_rn(amax, __fmul_rn(genc, inv6)));
}

/* Element multiplier r_b of a block scale code (0: codes are 0). */
static __device__ __forceinline__ float trace_nvfp4_block_rcp(unsigned code, float genc) {
    float s = trace_e4m3_decode(code);
    if (!(s > 0.0f)) return 0.0f;
    float s_dec = __fdiv_rn(1.0f, genc);
    return fminf(__fdiv_rn(1.0f, __fmul_rn(s, s_dec)), FLT_MAX);
}

/* ---- capture ------------------------------------------------------------------------- */

template <bool BF16>
static __device__ __forceinline__ float ld_elem(const void *p, int64_t i) {
    if (BF16) return qrl_bf16_ld_(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#define WARPS 4

template <bool BF16>
static __global__ void __launch_bounds__(WARPS * 32)
    capture_kernel(qrl_cuda_trace_capture_args a) {
    int item = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (item >= a.n_rows * a.n_vec) return;
    int row = item / a.n_vec, v = item % a.n_vec;
    int64_t entry = a.dst[row];
    if (entry < 0) return;
    const qrl_cuda_trace_ctl c = *a.ctl;
    const int len = a.len;
    const int64_t x0 = (int64_t)row * a.row_stride + (int64_t)v * len;
    /* per-vector S_enc from the finite absmax (qrl_quant_absmax skips NaN / Inf) */
    float m = 0.0f;
    for (int j = lane; j < len; j += 32) {
        float t = fabsf(ld_elem<BF16>(a.src, x0 + j));
        if (t <= FLT_MAX) m = fmaxf(m, t);
    }
    float genc = trace_nvfp4_global_enc(warp_max(m));
    uint8_t *out = c.store + entry * c.slab + a.slab_off + (int64_t)v * a.slab_step;
    int nb = (len + 15) / 16, nbits = (len + 7) / 8;
    if (lane < 4) out[lane] = (uint8_t)(__float_as_uint(genc) >> (8 * lane));
    uint8_t *scales = out + 4, *bits = out + 4 + nb;
    float *tap = c.taps ? c.taps + entry * c.tap_floats + a.tap_off + (int64_t)v * len : NULL;
    for (int b = lane; b < nb; b += 32) {
        int j0 = b * 16, bl = len - j0 < 16 ? len - j0 : 16;
        float x[16];
        float bm = 0.0f;
        bool bad = false;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            x[j] = j < bl ? ld_elem<BF16>(a.src, x0 + j0 + j) : 0.0f;
            float t = fabsf(x[j]);
            if (t <= FLT_MAX) bm = fmaxf(bm, t);
            else bad = true;
        }
        unsigned sc = trace_nvfp4_block_scale(bm, bad, genc);
        float r = bad ? 0.0f : trace_nvfp4_block_rcp(sc, genc);
        unsigned lsb = 0;
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (j < bl && r != 0.0f) lsb |= (trace_e2m1_mag(fabsf(__fmul_rn(x[j], r))) & 1u) << j;
        scales[b] = (uint8_t)sc;
        bits[2 * b] = (uint8_t)lsb;
        if (2 * b + 1 < nbits) bits[2 * b + 1] = (uint8_t)(lsb >> 8);
        if (tap)
            for (int j = 0; j < bl; j++) tap[j0 + j] = x[j];
    }
}

extern "C" qrl_status qrl_cuda_trace_capture(const qrl_cuda_trace_capture_args *a, void *stream,
                                             qrl_error *err) {
    if (a->n_rows < 0 || a->n_vec < 1 || a->len < 1 || a->len > (1 << 24) ||
        a->slab_step != 4 + (a->len + 15) / 16 + (a->len + 7) / 8)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "trace capture: n_rows=%d n_vec=%d len=%d slab_step=%lld", a->n_rows,
                             a->n_vec, a->len, (long long)a->slab_step);
    int64_t items = (int64_t)a->n_rows * a->n_vec;
    if (items == 0) return QRL_OK;
    dim3 grid((unsigned)((items + WARPS - 1) / WARPS));
    cudaStream_t s = (cudaStream_t)stream;
    if (a->src_bf16) capture_kernel<true><<<grid, WARPS * 32, 0, s>>>(*a);
    else capture_kernel<false><<<grid, WARPS * 32, 0, s>>>(*a);
    return qrl_cuda_launch_status_("trace capture", err);
}

static __global__ void codecs_kernel(const float *x, int n, uint8_t *e2m1, uint8_t *e4m3) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = fabsf(x[i]);
    e2m1[i] = (uint8_t)trace_e2m1_mag(a);
    e4m3[i] = (uint8_t)trace_e4m3_mag(a);
}

extern "C" qrl_status qrl_cuda_trace_codecs(const float *x, int n, uint8_t *e2m1, uint8_t *e4m3,
                                            void *stream, qrl_error *err) {
    if (n <= 0) return QRL_OK;
    codecs_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x, n, e2m1, e4m3);
    return qrl_cuda_launch_status_("trace codecs", err);
}
