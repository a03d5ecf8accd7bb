/* Internal to kernels/cuda (C++ only): record addressing of the quantized paged KV cache
 * (layout in kv_quant.cuh) and the per-row split of positions into the main store and the
 * int4-protected side cache. */
#ifndef QRL_CUDA_KV_QUANT_DEV_CUH
#define QRL_CUDA_KV_QUANT_DEV_CUH

#include <cuda_fp8.h>

#include "cuda/kv_quant.cuh"

/* Protected positions of a row attending over n positions: [0, a) and [b, n) (a =
 * min(sink, n), b = max(a, n - recent)); the main store holds [a, b).  With sink = recent
 * = 0 (every format but int4-protected) the main store holds everything. */
static __device__ __forceinline__ void kvq_regions(const qrl_cuda_kvq_layer &c, int n, int *a,
                                                   int *b) {
    int aa = c.sink < n ? c.sink : n;
    int bb = n - c.recent;
    *a = aa;
    *b = bb > aa ? bb : aa;
}

/* Side-cache slot of position p (p < sink, or p in the recent window). */
static __device__ __forceinline__ int kvq_side_slot(const qrl_cuda_kvq_layer &c, int p) {
    return p < c.sink ? p : c.sink + (p - c.sink) % c.ring;
}

/* Main-store record index of position p of the sequence with block table `table`. */
static __device__ __forceinline__ size_t kvq_rec(const qrl_cuda_kvq_layer &c, const int32_t *table,
                                                 int p, int kvh, int bs_shift) {
    int bi = bs_shift >= 0 ? p >> bs_shift : p / c.block_size;
    int bo = bs_shift >= 0 ? p & (c.block_size - 1) : p % c.block_size;
    return ((size_t)table[bi] * c.n_kv_heads + kvh) * c.block_size + bo;
}

static __device__ __forceinline__ size_t kvq_side_rec(const qrl_cuda_kvq_layer &c, int seq,
                                                      int slot, int kvh) {
    return ((size_t)seq * (c.sink + c.ring) + slot) * c.n_kv_heads + kvh;
}

/* Exact small-integer conversions without I2F (full-rate FADD): a byte b as a float is
 * 2^23 + b - 2^23; an INT8 code c is the byte c ^ 0x80 minus 128. */
static __device__ __forceinline__ float kvq_i8f(uint32_t w, int i) {
    return __uint_as_float(0x4B000000u | (((w ^ 0x80808080u) >> (8 * i)) & 0xFFu)) - 8388736.0f;
}
static __device__ __forceinline__ float kvq_u4f(uint32_t w, int i) {
    return __uint_as_float(0x4B000000u | ((w >> (4 * i)) & 0xFu)) - 8388608.0f;
}
static __device__ __forceinline__ float kvq_e4m3f(uint32_t w, int i) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)((w >> (8 * i)) & 0xFFu), __NV_E4M3);
    return __half2float(__half(h));
}

#endif
