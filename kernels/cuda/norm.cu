#include "cuda/norm.cuh"

#include <cuda_bf16.h>

#include "cuda/launch.cuh"
#include "cuda/nvfp4_dev.cuh"
#include "cuda/w8a8_dev.cuh"

/* How rms_inv reads add: as final F32 values (EPI_NONE), or as a W8A8 GEMM's raw sums whose
 * epilogue was deferred to this read (qrl_cuda_w8a8_epi): INT32 bits (EPI_INT8) or F32
 * (EPI_FP8), finished by the epilogue pass's own body (w8a8_dev.cuh). */
enum { EPI_NONE, EPI_INT8, EPI_FP8 };

/* A deferred epilogue as a kernel argument; row_sx: sx of the block's row. */
struct add_epi {
    const float *sx, *sw, *bias;
    __device__ __forceinline__ float row_sx(size_t r) const { return sx ? sx[r] : 0.0f; }
};

template <int E>
static __device__ __forceinline__ float add_value(const float *addr, int i, const add_epi &e,
                                                  float sx) {
    if constexpr (E == EPI_INT8) return qrl_w8a8_epilogue_(__float_as_int(addr[i]), sx, e.sw[i], e.bias, i);
    else if constexpr (E == EPI_FP8) return qrl_w8a8_epilogue_(addr[i], sx, e.sw[i], e.bias, i);
    else return addr[i];
}

/* The residual add (in place, when add != NULL) and 1 / rms of row xr; every thread gets
 * it.  The thread count and each thread's order of the sum of squares fix the result, so
 * both kernels below run it with the same blockDim for a given d.  sx: the row's activation
 * scale of a deferred epilogue (E != EPI_NONE), read by the caller before anything else
 * (rmsnorm_q_kernel overwrites the scales after the block sums: the same array when the
 * forward reuses it). */
template <int E = EPI_NONE>
static __device__ __forceinline__ float rms_inv(float *xr, const float *addr, const uint16_t *bias,
                                                int d, float eps, float *sh,
                                                const add_epi &e = add_epi{}, float sx = 0.0f) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i];
        if (addr) {
            v += add_value<E>(addr, i, e, sx);
            if (bias) v += qrl_bf16_ld_(bias[i]);
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = qrl_block_sum_(ss, sh);
    return rsqrtf(ss / (float)d + eps);
}

static __device__ __forceinline__ float normed_f32(float x, float inv, uint16_t w) {
    return __fmul_rn(__fmul_rn(x, inv), qrl_bf16_ld_(w));
}
static __device__ __forceinline__ uint16_t normed(float x, float inv, uint16_t w) {
    return qrl_bf16_st_(normed_f32(x, inv, w));
}

/* One block per row; the row is read twice (sum of squares, then scale) from L1/L2. */
template <int E>
static __global__ void rmsnorm_kernel(uint16_t *out, float *x, const float *add,
                                      const uint16_t *bias, const uint16_t *weight, int d,
                                      float eps, add_epi e) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    float *xr = x + r * d, sx = E != EPI_NONE ? e.row_sx(r) : 0.0f;
    float inv = rms_inv<E>(xr, add ? add + r * d : NULL, bias, d, eps, sh, e, sx);
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[r * d + i] = normed(xr[i], inv, weight[i]);
}

/* The normed BF16 value i of a row as qrl_w8a8_quantize_row_'s source; stores it in outr
 * (when given) on the first call.  Each thread reads back only the xr[i] it wrote. */
struct norm_src {
    const float *xr;
    const uint16_t *weight;
    uint16_t *outr;
    float inv;
    __device__ __forceinline__ float operator()(int i, bool first) const {
        uint16_t h = normed(xr[i], inv, weight[i]);
        if (first && outr) outr[i] = h;
        return qrl_bf16_ld_(h);
    }
};

/* rmsnorm_kernel, then the per-token quantization of its BF16 outputs by the same block:
 * the row is read a third time for the codes (J = 0; it is in L1). */
template <bool FP8, int E>
static __global__ void rmsnorm_q_kernel(uint16_t *out, float *x, const float *add,
                                        const uint16_t *bias, const uint16_t *weight, int d,
                                        float eps, uint8_t *q, float *scales, int ld, add_epi e) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    float *xr = x + r * d, sx = E != EPI_NONE ? e.row_sx(r) : 0.0f;
    float inv = rms_inv<E>(xr, add ? add + r * d : NULL, bias, d, eps, sh, e, sx);
    norm_src src = {xr, weight, out ? out + r * d : NULL, inv};
    qrl_w8a8_quantize_row_<FP8, 0>(src, d, ld, blockDim.x, q + r * ld, scales + r, sh);
}

/* The normed value i of a row in F32 (before the BF16 rounding) as qrl_nvfp4_quantize_row_'s
 * source; stores its BF16 rounding in outr (when given) on the first call. */
struct norm_src_f32 {
    const float *xr;
    const uint16_t *weight;
    uint16_t *outr;
    float inv;
    __device__ __forceinline__ float operator()(int i, bool first) const {
        float v = normed_f32(xr[i], inv, weight[i]);
        if (first && outr) outr[i] = qrl_bf16_st_(v);
        return v;
    }
};

/* rmsnorm_kernel, then the NVFP4 quantization of its F32 outputs by the same block (the
 * residual writes of rms_inv are visible to every thread after its block reduction). */
template <int JB>
static __global__ void rmsnorm_nvfp4_kernel(uint16_t *out, float *x, const float *add,
                                            const uint16_t *bias, const uint16_t *weight, int d,
                                            float eps, qrl_cuda_nvfp4_act q) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    float *xr = x + r * d;
    float inv = rms_inv<EPI_NONE>(xr, add ? add + r * d : NULL, bias, d, eps, sh);
    norm_src_f32 src = {xr, weight, out ? out + r * d : NULL, inv};
    qrl_nvfp4_quantize_row_<JB>(src, d, blockDim.x, qrl_nvfp4_row_out_of_(q, r, d), sh);
}

static int norm_threads(int d) { return d >= 1024 ? 1024 : ((d + 31) / 32) * 32; }

template <int E>
static void launch_rmsnorm(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                           const uint16_t *weight, int rows, int d, float eps,
                           const qrl_cuda_w8a8_act *q, add_epi e, cudaStream_t s) {
    int nt = norm_threads(d);
    if (!q) {
        rmsnorm_kernel<E><<<rows, nt, 0, s>>>(out, x, add, bias, weight, d, eps, e);
        return;
    }
    uint8_t *qc = (uint8_t *)q->q;
    if (q->fp8)
        rmsnorm_q_kernel<true, E><<<rows, nt, 0, s>>>(out, x, add, bias, weight, d, eps, qc,
                                                      q->scales, q->ld, e);
    else
        rmsnorm_q_kernel<false, E><<<rows, nt, 0, s>>>(out, x, add, bias, weight, d, eps, qc,
                                                       q->scales, q->ld, e);
}

qrl_status qrl_cuda_rmsnorm(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                            const uint16_t *weight, int rows, int d, float eps, void *stream,
                            qrl_error *err) {
    if (rows <= 0 || d <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rmsnorm: rows=%d d=%d", rows, d);
    launch_rmsnorm<EPI_NONE>(out, x, add, bias, weight, rows, d, eps, NULL, add_epi{},
                             (cudaStream_t)stream);
    return qrl_cuda_launch_status_("rmsnorm", err);
}

qrl_status qrl_cuda_rmsnorm_w8a8(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                                 const uint16_t *weight, int rows, int d, float eps,
                                 const qrl_cuda_w8a8_act *q, const qrl_cuda_w8a8_epi *epi,
                                 void *stream, qrl_error *err) {
    if (!q && !out)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rmsnorm w8a8: neither a BF16 output nor codes");
    if (rows <= 0 || d <= 0 || (q && (q->ld < d || q->ld % 16)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rmsnorm w8a8: rows=%d d=%d ld=%d (need rows, d > 0, ld >= d, "
                             "ld %% 16 == 0)", rows, d, q ? q->ld : d);
    bool deferred = epi && epi->on;
    if (deferred && (!add || !epi->sx || !epi->sw || epi->N != d))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rmsnorm w8a8: a deferred epilogue needs add, sx and sw and N = d "
                             "(add %s, N=%d, d=%d)", add ? "given" : "NULL", epi->N, d);
    cudaStream_t s = (cudaStream_t)stream;
    add_epi e = {};
    if (deferred) e = add_epi{epi->sx, epi->sw, epi->bias};
    if (!deferred) launch_rmsnorm<EPI_NONE>(out, x, add, bias, weight, rows, d, eps, q, e, s);
    else if (epi->fp8) launch_rmsnorm<EPI_FP8>(out, x, add, bias, weight, rows, d, eps, q, e, s);
    else launch_rmsnorm<EPI_INT8>(out, x, add, bias, weight, rows, d, eps, q, e, s);
    return qrl_cuda_launch_status_("rmsnorm w8a8", err);
}

qrl_status qrl_cuda_rmsnorm_nvfp4(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                                  const uint16_t *weight, int rows, int d, float eps,
                                  const qrl_cuda_nvfp4_act *q, void *stream, qrl_error *err) {
    if (rows <= 0 || d <= 0 || !q)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rmsnorm nvfp4: rows=%d d=%d q=%p (need rows, d > 0 and q)", rows, d,
                             (const void *)q);
    if (q->trace_ctl && !q->trace_dst)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "rmsnorm nvfp4: a TRACE sink without its row map");
    int nt = norm_threads(d); /* rms_inv's sums depend on it: the same as qrl_cuda_rmsnorm */
    cudaStream_t s = (cudaStream_t)stream;
    if (nt * 16 >= d)
        rmsnorm_nvfp4_kernel<1><<<rows, nt, 0, s>>>(out, x, add, bias, weight, d, eps, *q);
    else
        rmsnorm_nvfp4_kernel<0><<<rows, nt, 0, s>>>(out, x, add, bias, weight, d, eps, *q);
    return qrl_cuda_launch_status_("rmsnorm nvfp4", err);
}
