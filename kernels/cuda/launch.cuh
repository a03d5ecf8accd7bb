/* Internal to the kernels/cuda sources (C++ only): map the last launch error to a qrl_status. */
#ifndef QRL_CUDA_LAUNCH_CUH
#define QRL_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include "base/status.h"

static inline qrl_status qrl_cuda_launch_status_(const char *what, qrl_error *err) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "%s launch: %s", what, cudaGetErrorString(e));
}

static __device__ __forceinline__ float qrl_bf16_ld_(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even through the intrinsic (NaN stays NaN), as qrl_cpu_bf16_store. */
static __device__ __forceinline__ uint16_t qrl_bf16_st_(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

static __device__ __forceinline__ float qrl_warp_sum_(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of blockDim.x threads (multiple of 32, <= 1024); every thread gets it. */
static __device__ __forceinline__ float qrl_block_sum_(float v, float *sh32) {
    v = qrl_warp_sum_(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh32[w] = v;
    __syncthreads();
    v = l < nw ? sh32[l] : 0.0f;
    return qrl_warp_sum_(v);
}

#endif
