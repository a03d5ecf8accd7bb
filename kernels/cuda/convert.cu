#include "cuda/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

static __global__ void bf16_to_f32_kernel(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

static __global__ void f32_to_bf16_kernel(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

static qrl_status launch_status(const char *what, qrl_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "%s launch: %s", what, cudaGetErrorString(e));
}

static unsigned grid_for(size_t n) {
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 65535 ? 65535 : (blocks ? blocks : 1));
}

qrl_status qrl_cuda_bf16_to_f32(const uint16_t *src, float *dst, size_t n, void *stream,
                                qrl_error *err) {
    bf16_to_f32_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(src, dst, n);
    return launch_status("bf16_to_f32", err);
}

qrl_status qrl_cuda_f32_to_bf16(const float *src, uint16_t *dst, size_t n, void *stream,
                                qrl_error *err) {
    f32_to_bf16_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(src, dst, n);
    return launch_status("f32_to_bf16", err);
}
