/* NVFP4 per-row quantization: the standalone kernel (nvfp4_quant.cuh). */
#include "cuda/nvfp4_quant.cuh"

#include "cuda/nvfp4_dev.cuh"
#include "cuda/launch.cuh"

/* Value i of a row, F32 or BF16 source. */
template <bool BF16> struct row_src {
    const void *x;
    __device__ __forceinline__ float operator()(int i, bool) const {
        return BF16 ? qrl_bf16_ld_(((const uint16_t *)x)[i]) : ((const float *)x)[i];
    }
};

template <bool BF16, int JB, int NT>
static __global__ void __launch_bounds__(NT) nvfp4_rows_kernel(qrl_cuda_nvfp4_act a, const void *x,
                                                               int n) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    const void *xr = BF16 ? (const void *)((const uint16_t *)x + r * n)
                          : (const void *)((const float *)x + r * n);
    row_src<BF16> src = {xr};
    qrl_nvfp4_quantize_row_<JB>(src, n, NT, qrl_nvfp4_row_out_of_(a, r, n), sh);
}

template <bool BF16>
static void launch_rows(const qrl_cuda_nvfp4_act &a, const void *x, int rows, int n, cudaStream_t s) {
    /* blocks of 16 per thread in registers up to 2 per thread (32 floats); longer rows
     * read their values twice */
    if (n <= 128 * 16) nvfp4_rows_kernel<BF16, 1, 128><<<rows, 128, 0, s>>>(a, x, n);
    else if (n <= 256 * 16 * 2) nvfp4_rows_kernel<BF16, 2, 256><<<rows, 256, 0, s>>>(a, x, n);
    else if (n <= 1024 * 16 * 2) nvfp4_rows_kernel<BF16, 2, 1024><<<rows, 1024, 0, s>>>(a, x, n);
    else nvfp4_rows_kernel<BF16, 0, 1024><<<rows, 1024, 0, s>>>(a, x, n);
}

extern "C" qrl_status qrl_cuda_nvfp4_quantize_rows(const qrl_cuda_nvfp4_act *out, const void *x,
                                                   bool x_bf16, int rows, int n, void *stream,
                                                   qrl_error *err) {
    if (rows <= 0 || n <= 0 || !x || !out)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "nvfp4 quantize rows: rows=%d n=%d x=%p (need rows, n > 0 and x)",
                             rows, n, x);
    if (!out->codes && !out->scales && !out->s_enc && !out->xq && !out->s_dec && !out->x_out &&
        !out->trace_ctl)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nvfp4 quantize rows: no output");
    if (out->trace_ctl && !out->trace_dst)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "nvfp4 quantize rows: a TRACE sink without its row map");
    cudaStream_t s = (cudaStream_t)stream;
    if (x_bf16) launch_rows<true>(*out, x, rows, n, s);
    else launch_rows<false>(*out, x, rows, n, s);
    return qrl_cuda_launch_status_("nvfp4 quantize rows", err);
}
