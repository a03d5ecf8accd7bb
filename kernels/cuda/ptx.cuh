/* Internal to the kernels/cuda sources (C++ only): the inline-PTX building blocks the
 * tensor-core kernels share (decode attention, quantized-KV attention, training
 * attention): cp.async into shared memory, ldmatrix, mma.sync m16n8k16 with F32
 * accumulation, packed-half arithmetic on raw 32-bit registers.  PTX ISA references:
 * cp.async, ldmatrix, mma (m16n8k16 fragment layouts), add/mul/fma.f16x2. */
#ifndef QRL_CUDA_PTX_CUH
#define QRL_CUDA_PTX_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* Shared-memory address of a generic pointer into shared memory (for PTX operands). */
static __device__ __forceinline__ uint32_t qrl_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 (or 4) bytes global -> shared; zero-filled when !ok (src must still be mapped). */
static __device__ __forceinline__ void qrl_cp_async16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
}
static __device__ __forceinline__ void qrl_cp_async4(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 4 : 0));
}
/* An L2 policy that evicts the lines it tags first (data read once: streamed weights), and
 * qrl_cp_async16 with that policy, so the stream does not push reused data out of L2. */
static __device__ __forceinline__ uint64_t qrl_l2_evict_first(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
static __device__ __forceinline__ void qrl_cp_async16_hint(uint32_t dst, const void *src, bool ok,
                                                           uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(ok ? 16 : 0), "l"(policy));
}
/* Close the current cp.async group / wait until at most N groups are in flight. */
static __device__ __forceinline__ void qrl_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
static __device__ __forceinline__ void qrl_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 b16 matrices from shared memory into a warp's fragments (lanes 8i..8i+7 give
 * the row addresses of matrix i); _t transposes each matrix. */
static __device__ __forceinline__ void qrl_ldsm_x4(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void qrl_ldsm_x4_t(uint32_t addr, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c += A(16x16) * B(16x8), F16 in, F32 accumulate. */
static __device__ __forceinline__ void qrl_mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* As qrl_mma_f16 with A's rows 8..15 zero (a1 = a3 = 0). */
static __device__ __forceinline__ void qrl_mma_f16_top(float c[4], uint32_t a0, uint32_t a2,
                                                       uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

/* c += A(16x16) * B(16x8), BF16 in, F32 accumulate. */
static __device__ __forceinline__ void qrl_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                                    uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* As qrl_mma_bf16 with A's rows 8..15 zero (a1 = a3 = 0). */
static __device__ __forceinline__ void qrl_mma_bf16_top(float c[4], uint32_t a0, uint32_t a2,
                                                        uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

/* Two floats as one f16x2 register (round to nearest even; lo in the low half), and
 * f16x2 subtract / multiply / fused multiply-add on raw registers. */
static __device__ __forceinline__ uint32_t qrl_pack_h2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}
static __device__ __forceinline__ uint32_t qrl_hsub2(uint32_t a, uint32_t b) {
    __half2 r = __hsub2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&r;
}
static __device__ __forceinline__ uint32_t qrl_hmul2(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&r;
}
static __device__ __forceinline__ uint32_t qrl_hfma2(uint32_t a, uint32_t b, uint32_t c) {
    __half2 r = __hfma2(*(__half2 *)&a, *(__half2 *)&b, *(__half2 *)&c);
    return *(uint32_t *)&r;
}

/* Two E4M3 values as an f16x2 (cvt.rn.f16x2.e4m3x2, exact): the low or the high 16 bits of
 * x.  The half is picked by the conversion's operand selector (F2FP ... R.H1 in SASS), so
 * the high pair costs no shift. */
static __device__ __forceinline__ uint32_t qrl_e4m3x2_lo(uint32_t x) {
    uint32_t d;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(x));
    return d;
}
static __device__ __forceinline__ uint32_t qrl_e4m3x2_hi(uint32_t x) {
    uint32_t d;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(x));
    return d;
}

#endif
