#include "cuda/runtime.cuh"

#include <cuda_runtime.h>
#include <stdio.h>

static qrl_status cuda_fail(cudaError_t e, const char *what, qrl_error *err) {
    return qrl_error_set(err, QRL_STATUS_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

qrl_status qrl_cuda_device_count(int *count, qrl_error *err) {
    (void)err;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error; a CPU machine is not a failure */
        n = 0;
    }
    *count = n;
    return QRL_OK;
}

qrl_status qrl_cuda_device_describe(int index, char *buf, size_t buf_size, qrl_error *err) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceProperties", err);
    snprintf(buf, buf_size, "%s sm_%d%d SMs=%d mem=%.1fGiB", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
    return QRL_OK;
}

qrl_status qrl_cuda_malloc(void **ptr, size_t bytes, qrl_error *err) {
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
        *ptr = NULL;
        return qrl_error_set(err, QRL_STATUS_CUDA, "cudaMalloc of %zu bytes: %s", bytes,
                             cudaGetErrorString(e));
    }
    return QRL_OK;
}

void qrl_cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

qrl_status qrl_cuda_copy_to_device(void *dst, const void *src, size_t bytes, qrl_error *err) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? QRL_OK : cuda_fail(e, "cudaMemcpy host->device", err);
}

qrl_status qrl_cuda_copy_to_host(void *dst, const void *src, size_t bytes, qrl_error *err) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? QRL_OK : cuda_fail(e, "cudaMemcpy device->host", err);
}

qrl_status qrl_cuda_synchronize(qrl_error *err) {
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? QRL_OK : cuda_fail(e, "cudaDeviceSynchronize", err);
}
