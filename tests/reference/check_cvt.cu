// Exhaustive check of the CPU scalar encoders (kernels/cpu/quant_scalar.c) against CUDA's
// own conversions, over all 2^32 F32 bit patterns:
//   E4M3  qrl_e4m3_encode            vs __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
//   E2M1  qrl_e2m1_encode            vs __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
//   BF16  qrl_bf16_encode            vs __float2bfloat16_rn (NaN: NaN-ness only)
//   RNE   qrl_quant_round_half_even  vs rintf
// plus every E4M3 / E2M1 decode against CUDA's fp8/fp4 -> half conversions.
// Run on a GPU machine (sm_89+ for the hardware E4M3 path), from the repo root:
//   nvcc -O2 -arch=sm_90 -Xcompiler -fopenmp -Icommon -Ikernels tests/reference/check_cvt.cu \
//        kernels/cpu/quant_scalar.c common/core/status.c -o /tmp/check_cvt -lgomp && /tmp/check_cvt
// Prints mismatch counts per conversion and exits 1 on any mismatch.
// `check_cvt --host` runs NVIDIA's conversions on the CPU instead (the headers' host
// paths, NVIDIA's software reference of the same conversions): no GPU needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static __host__ __device__ void convert_one(uint32_t u, uint8_t *e4m3, uint8_t *e2m1,
                                            uint16_t *bf16, float *rne) {
    float x;
    memcpy(&x, &u, 4);
    *e4m3 = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    *e2m1 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    __nv_bfloat16_raw r = __nv_bfloat16(__float2bfloat16_rn(x));
    *bf16 = r.x;
    *rne = rintf(x);
}

static __global__ void convert(uint32_t base, uint32_t n, uint8_t *e4m3, uint8_t *e2m1,
                               uint16_t *bf16, float *rne) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        convert_one(base + i, &e4m3[i], &e2m1[i], &bf16[i], &rne[i]);
}

static __host__ __device__ void decode_one(int c, float *e4m3, float *e2m1) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    e4m3[c] = __half2float(__half(h));
    if (c < 16) {
        __half_raw g = __nv_cvt_fp4_to_halfraw((__nv_fp4_storage_t)c, __NV_E2M1);
        e2m1[c] = __half2float(__half(g));
    }
}

static __global__ void decode(float *e4m3, float *e2m1) { decode_one(threadIdx.x, e4m3, e2m1); }

static bool same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0;
}

int main(int argc, char **argv) {
    const bool host = argc > 1 && strcmp(argv[1], "--host") == 0;
    const uint32_t chunk = 1u << 28;
    uint8_t *d8, *d4, *h8 = (uint8_t *)malloc(chunk), *h4 = (uint8_t *)malloc(chunk);
    uint16_t *d16, *h16 = (uint16_t *)malloc(2ull * chunk);
    float *dr, *hr = (float *)malloc(4ull * chunk);
    if (!host) {
        CK(cudaMalloc(&d8, chunk));
        CK(cudaMalloc(&d4, chunk));
        CK(cudaMalloc(&d16, 2ull * chunk));
        CK(cudaMalloc(&dr, 4ull * chunk));
    }
    printf("NVIDIA conversions on the %s\n", host ? "host (software reference)" : "GPU");
    unsigned long long bad[4] = {0, 0, 0, 0};
    for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
        if (host) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < (int64_t)chunk; i++)
                convert_one((uint32_t)(base + (uint64_t)i), &h8[i], &h4[i], &h16[i], &hr[i]);
        } else {
            convert<<<4096, 256>>>((uint32_t)base, chunk, d8, d4, d16, dr);
            CK(cudaGetLastError());
            CK(cudaMemcpy(h8, d8, chunk, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h4, d4, chunk, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h16, d16, 2ull * chunk, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hr, dr, 4ull * chunk, cudaMemcpyDeviceToHost));
        }
        unsigned long long b0 = 0, b1 = 0, b2 = 0, b3 = 0;
#pragma omp parallel for reduction(+ : b0, b1, b2, b3) schedule(static)
        for (int64_t i = 0; i < (int64_t)chunk; i++) {
            uint32_t u = (uint32_t)(base + (uint64_t)i);
            float x;
            memcpy(&x, &u, 4);
            uint8_t c8 = qrl_e4m3_encode(x), c4 = qrl_e2m1_encode(x);
            uint16_t c16 = qrl_bf16_encode(x);
            bool nan = isnan(x);
            if (c8 != h8[i]) {
                if (b0 < 5) printf("e4m3 x=%a (0x%08x): cpu 0x%02x cuda 0x%02x\n", x, u, c8, h8[i]);
                b0++;
            }
            if (c4 != (h4[i] & 0xF)) {
                if (b1 < 5) printf("e2m1 x=%a (0x%08x): cpu 0x%x cuda 0x%x\n", x, u, c4, h4[i]);
                b1++;
            }
            if (nan ? !isnan(qrl_bf16_decode(h16[i])) : c16 != h16[i]) {
                if (b2 < 5) printf("bf16 x=%a (0x%08x): cpu 0x%04x cuda 0x%04x\n", x, u, c16, h16[i]);
                b2++;
            }
            if (!same_float(qrl_quant_round_half_even(x), hr[i])) {
                if (b3 < 5) printf("rne x=%a: cpu %a cuda %a\n", x, qrl_quant_round_half_even(x), hr[i]);
                b3++;
            }
        }
        bad[0] += b0; bad[1] += b1; bad[2] += b2; bad[3] += b3;
    }
    printf("all 2^32 inputs: e4m3 %llu, e2m1 %llu, bf16 %llu, rne %llu mismatches\n", bad[0],
           bad[1], bad[2], bad[3]);
    float *dd8, *dd4, hd8[256], hd4[16];
    if (host) {
        for (int c = 0; c < 256; c++) decode_one(c, hd8, hd4);
    } else {
        CK(cudaMalloc(&dd8, sizeof hd8));
        CK(cudaMalloc(&dd4, sizeof hd4));
        decode<<<1, 256>>>(dd8, dd4);
        CK(cudaMemcpy(hd8, dd8, sizeof hd8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hd4, dd4, sizeof hd4, cudaMemcpyDeviceToHost));
    }
    int dbad = 0;
    for (int c = 0; c < 256; c++)
        if (!same_float(qrl_e4m3_decode((uint8_t)c), hd8[c])) {
            printf("e4m3 decode 0x%02x: cpu %a cuda %a\n", c, qrl_e4m3_decode((uint8_t)c), hd8[c]);
            dbad++;
        }
    for (int c = 0; c < 16; c++)
        if (!same_float(qrl_e2m1_decode((uint8_t)c), hd4[c])) {
            printf("e2m1 decode 0x%x: cpu %a cuda %a\n", c, qrl_e2m1_decode((uint8_t)c), hd4[c]);
            dbad++;
        }
    printf("decode: %d mismatches over 256 E4M3 + 16 E2M1 codes\n", dbad);
    return (bad[0] || bad[1] || bad[2] || bad[3] || dbad) ? 1 : 0;
}
