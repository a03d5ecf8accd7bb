/* CRC-32C of device byte ranges (crc32c.cuh): three kernels over the pieces / groups /
 * ranges of kernels/cpu/crc32c.h's fold.  Pieces read 16-byte words where aligned, the
 * slice-by-8 tables sit in shared memory. */
#include "cuda/crc32c.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/crc32c.h"
#include "cuda/launch.cuh"

#define P QRL_CRC32C_PIECE
#define G QRL_CRC32C_GROUP

typedef struct range_dev {
    unsigned long long off, len, pbase, gbase; /* first piece / group index of the range */
} range_dev;

typedef qrl_crc32c_tables tables_dev; /* uploaded per call, then the ranges */

static __device__ __forceinline__ uint32_t shift_apply(const uint32_t (*t)[256], uint32_t c) {
    return t[0][c & 255] ^ t[1][(c >> 8) & 255] ^ t[2][(c >> 16) & 255] ^ t[3][c >> 24];
}

/* index of the range holding element idx of a prefix array base[r] (non-decreasing; the
 * last r with base[r] <= idx and a non-empty span) */
static __device__ __forceinline__ int find_range(const range_dev *r, int n, unsigned long long idx, bool group) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        unsigned long long b = group ? r[mid].gbase : r[mid].pbase;
        if (b <= idx) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static __device__ __forceinline__ uint32_t s8_word(const uint32_t (*t)[256], uint32_t c, uint32_t lo, uint32_t hi) {
    lo ^= c;
    return t[7][lo & 255] ^ t[6][(lo >> 8) & 255] ^ t[5][(lo >> 16) & 255] ^ t[4][lo >> 24] ^
           t[3][hi & 255] ^ t[2][(hi >> 8) & 255] ^ t[1][(hi >> 16) & 255] ^ t[0][hi >> 24];
}

static __global__ void __launch_bounds__(256) pieces_kernel(const uint8_t *buf, const range_dev *rg, int n,
                                                            const tables_dev *tab, unsigned long long np,
                                                            uint32_t *praw) {
    __shared__ uint32_t t[8][256];
    for (int i = threadIdx.x; i < 8 * 256; i += blockDim.x) t[i >> 8][i & 255] = tab->s8[i >> 8][i & 255];
    __syncthreads();
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; idx < np;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        int r = find_range(rg, n, idx, false);
        const uint8_t *p = buf + rg[r].off + (idx - rg[r].pbase) * P;
        uint32_t c = 0;
        unsigned head = (unsigned)((16 - ((uintptr_t)p & 15)) & 15), k = 0;
        for (; k < head; k++) c = (c >> 8) ^ t[0][(c ^ p[k]) & 0xff];
        const uint4 *w = (const uint4 *)(p + head);
        unsigned nw = (P - head) / 16;
        for (unsigned i = 0; i < nw; i++) {
            uint4 v = __ldcs(w + i); /* streamed once: keep it out of L2's way */
            c = s8_word(t, c, v.x, v.y);
            c = s8_word(t, c, v.z, v.w);
        }
        for (k = head + nw * 16; k < P; k++) c = (c >> 8) ^ t[0][(c ^ p[k]) & 0xff];
        praw[idx] = c;
    }
}

static __global__ void groups_kernel(const range_dev *rg, int n, const tables_dev *tab, unsigned long long ng,
                                     const uint32_t *praw, uint32_t *graw) {
    __shared__ uint32_t t[4][256];
    for (int i = threadIdx.x; i < 4 * 256; i += blockDim.x) t[i >> 8][i & 255] = tab->tp[i >> 8][i & 255];
    __syncthreads();
    for (unsigned long long idx = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; idx < ng;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        int r = find_range(rg, n, idx, true);
        const uint32_t *pr = praw + rg[r].pbase + (idx - rg[r].gbase) * G;
        uint32_t c = 0;
        for (unsigned k = 0; k < G; k++) c = shift_apply(t, c) ^ pr[k];
        graw[idx] = c;
    }
}

static __global__ void ranges_kernel(const uint8_t *buf, const range_dev *rg, int n, const tables_dev *tab,
                                     const uint32_t *praw, const uint32_t *graw, uint32_t *out) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    unsigned long long len = rg[r].len, np = len / P, ng = np / G;
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned long long g = 0; g < ng; g++) c = shift_apply(tab->tg, c) ^ graw[rg[r].gbase + g];
    for (unsigned long long k = ng * G; k < np; k++) c = shift_apply(tab->tp, c) ^ praw[rg[r].pbase + k];
    const uint8_t *p = buf + rg[r].off + np * P;
    for (unsigned long long k = 0; k < len - np * P; k++) c = (c >> 8) ^ tab->s8[0][(c ^ p[k]) & 0xff];
    out[r] = ~c;
}

static qrl_status cst(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "crc32c: %s: %s", what, cudaGetErrorString(e));
}

extern "C" qrl_status qrl_cuda_crc32c_ranges(const uint8_t *buf, const uint64_t *off, const uint64_t *len,
                                             int n, uint32_t *crc, const qrl_crc32c_tables *tables,
                                             void *stream, qrl_error *err) {
    if (n < 0) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "crc32c: %d ranges", n);
    if (n == 0) return QRL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    size_t hb = sizeof(tables_dev) + (size_t)n * sizeof(range_dev);
    unsigned char *h = (unsigned char *)malloc(hb);
    if (!h) return qrl_error_set(err, QRL_STATUS_NOMEM, "crc32c: %zu bytes", hb);
    memcpy(h, tables, sizeof *tables);
    range_dev *hr = (range_dev *)(h + sizeof(tables_dev));
    unsigned long long np = 0, ng = 0;
    for (int i = 0; i < n; i++) {
        hr[i] = (range_dev){off[i], len[i], np, ng};
        np += len[i] / P;
        ng += len[i] / P / G;
    }
    size_t dbytes = hb + (np + ng + (size_t)n) * 4 + 16;
    unsigned char *d = NULL;
    qrl_status st = cst(cudaMallocAsync((void **)&d, dbytes, s), "scratch", err);
    if (st == QRL_OK) {
        const tables_dev *dt = (const tables_dev *)d;
        const range_dev *dr = (const range_dev *)(d + sizeof(tables_dev));
        uint32_t *praw = (uint32_t *)(d + hb), *graw = praw + np, *dout = graw + ng;
        st = cst(cudaMemcpyAsync(d, h, hb, cudaMemcpyHostToDevice, s), "upload", err);
        if (st == QRL_OK && np) {
            unsigned long long blocks = (np + 255) / 256;
            pieces_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(buf, dr, n, dt, np, praw);
            st = qrl_cuda_launch_status_("crc32c pieces", err);
        }
        if (st == QRL_OK && ng) {
            unsigned long long blocks = (ng + 127) / 128;
            groups_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 128, 0, s>>>(dr, n, dt, ng, praw, graw);
            st = qrl_cuda_launch_status_("crc32c groups", err);
        }
        if (st == QRL_OK) {
            ranges_kernel<<<(n + 63) / 64, 64, 0, s>>>(buf, dr, n, dt, praw, graw, dout);
            st = qrl_cuda_launch_status_("crc32c ranges", err);
        }
        if (st == QRL_OK)
            st = cst(cudaMemcpyAsync(crc, dout, (size_t)n * 4, cudaMemcpyDeviceToHost, s), "download", err);
        cudaFreeAsync(d, s);
        cudaError_t e = cudaStreamSynchronize(s);
        if (st == QRL_OK) st = cst(e, "synchronize", err);
    }
    free(h);
    return st;
}
