/* TRACE capture kernel (trace_capture.cuh). */
#include "cuda/trace_capture.cuh"

#include <cuda_bf16.h>
#include <float.h>

#include "cuda/launch.cuh"
#include "cuda/nvfp4_dev.cuh"

/* The quantizer is the engine's (nvfp4_dev.cuh: the w4a4 activations and the fp4 KV write
 * run the same device functions), so a record's S_enc, scales and LSBs are those of the
 * codes the engine computes with for the same vector. */

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

/* The record the engine made of the vector (fp4 KV): S_enc and the scales copied, the LSBs
 * taken from the packed codes (element j: bit 4 (j % 2) of byte j / 2). */
template <bool BF16>
static __device__ void copy_record(const qrl_cuda_trace_capture_args &a, const uint8_t *rec,
                                   uint8_t *out, float *tap, int64_t x0, int lane) {
    const int len = a.len, nb = (len + 15) / 16, nbits = (len + 7) / 8;
    const uint8_t *codes = rec + 4 + nb;
    if (lane < 4) out[lane] = rec[lane];
    for (int b = lane; b < nb; b += 32) out[4 + b] = rec[4 + b];
    for (int k = lane; k < nbits; k += 32) { /* LSB byte k: elements [8k, 8k + 8) */
        unsigned lsb = 0;
        for (int j = 0; j < 8 && 8 * k + j < len; j++)
            lsb |= (unsigned)(codes[4 * k + j / 2] >> (4 * (j & 1)) & 1u) << j;
        out[4 + nb + k] = (uint8_t)lsb;
    }
    if (tap)
        for (int j = lane; j < len; j += 32) tap[j] = ld_elem<BF16>(a.src, x0 + j);
}

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
    if (a.fp4_rec) {
        const uint8_t *rec = a.fp4_rec + ((int64_t)row * a.fp4_row_vecs + a.fp4_vec0 + v) * a.fp4_rec_bytes;
        copy_record<BF16>(a, rec, c.store + entry * c.slab + a.slab_off + (int64_t)v * a.slab_step,
                          c.taps ? c.taps + entry * c.tap_floats + a.tap_off + (int64_t)v * len : NULL,
                          x0, lane);
        return;
    }
    /* per-vector S_enc from the finite absmax (qrl_quant_absmax skips NaN / Inf) */
    float m = 0.0f;
    for (int j = lane; j < len; j += 32) {
        float t = fabsf(ld_elem<BF16>(a.src, x0 + j));
        if (t <= FLT_MAX) m = fmaxf(m, t);
    }
    float genc = qrl_nvfp4_s_enc_(warp_max(m));
    uint8_t *out = c.store + entry * c.slab + a.slab_off + (int64_t)v * a.slab_step;
    int nb = (len + 15) / 16, nbits = (len + 7) / 8;
    if (lane < 4) out[lane] = (uint8_t)(__float_as_uint(genc) >> (8 * lane));
    uint8_t *scales = out + 4, *bits = out + 4 + nb;
    float *tap = c.taps ? c.taps + entry * c.tap_floats + a.tap_off + (int64_t)v * len : NULL;
    for (int b = lane; b < nb; b += 32) {
        int j0 = b * 16, bl = len - j0 < 16 ? len - j0 : 16;
        float x[16];
#pragma unroll
        for (int j = 0; j < 16; j++) x[j] = j < bl ? ld_elem<BF16>(a.src, x0 + j0 + j) : 0.0f;
        uint64_t codes;
        uint8_t sc = qrl_nvfp4_quantize_block_(x, bl, genc, &codes);
        unsigned lsb = 0; /* element j's code LSB is bit 4j of codes */
#pragma unroll
        for (int j = 0; j < 16; j++) lsb |= (unsigned)(codes >> (4 * j) & 1u) << j;
        scales[b] = sc;
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
    if (a->fp4_rec && (a->fp4_rec_bytes < 4 + (a->len + 15) / 16 + (a->len + 1) / 2 || a->fp4_vec0 < 0 ||
                       a->fp4_vec0 + a->n_vec > a->fp4_row_vecs))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "trace capture: fp4 records of %lld bytes, vectors [%d, %d) of %d "
                             "(len %d)", (long long)a->fp4_rec_bytes, a->fp4_vec0,
                             a->fp4_vec0 + a->n_vec, a->fp4_row_vecs, a->len);
    int64_t items = (int64_t)a->n_rows * a->n_vec;
    if (items == 0) return QRL_OK;
    dim3 grid((unsigned)((items + WARPS - 1) / WARPS));
    cudaStream_t s = (cudaStream_t)stream;
    if (a->src_bf16) capture_kernel<true><<<grid, WARPS * 32, 0, s>>>(*a);
    else capture_kernel<false><<<grid, WARPS * 32, 0, s>>>(*a);
    return qrl_cuda_launch_status_("trace capture", err);
}
