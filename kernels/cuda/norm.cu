#include "cuda/norm.cuh"

#include <cuda_bf16.h>

#include "cuda/launch.cuh"

/* One block per row; the row is read twice (sum of squares, then scale) from L1/L2. */
static __global__ void rmsnorm_kernel(uint16_t *out, float *x, const float *add,
                                      const uint16_t *bias, const uint16_t *weight, int d,
                                      float eps) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    float *xr = x + r * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += add[r * d + i];
            if (bias) v += qrl_bf16_ld_(bias[i]);
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = qrl_block_sum_(ss, sh);
    float inv = rsqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        out[r * d + i] = qrl_bf16_st_(xr[i] * inv * qrl_bf16_ld_(weight[i]));
}

qrl_status qrl_cuda_rmsnorm(uint16_t *out, float *x, const float *add, const uint16_t *bias,
                            const uint16_t *weight, int rows, int d, float eps, void *stream,
                            qrl_error *err) {
    if (rows <= 0 || d <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "rmsnorm: rows=%d d=%d", rows, d);
    int threads = d >= 1024 ? 1024 : ((d + 31) / 32) * 32;
    rmsnorm_kernel<<<rows, threads, 0, (cudaStream_t)stream>>>(out, x, add, bias, weight, d, eps);
    return qrl_cuda_launch_status_("rmsnorm", err);
}
