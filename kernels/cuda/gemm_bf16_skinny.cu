/* BF16 GEMM for decode batches (gemm_bf16_skinny.cuh): mma.sync m16n8k16 with the weights
 * as the A operand (16 outputs) and the tokens as B (8 per tile), weights and tokens
 * through a cp.async shared-memory pipeline, split-K over blocks when the weight has few
 * row tiles. */
#include "cuda/gemm_bf16_skinny.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/launch.cuh"
#include "cuda/ptx.cuh"

/* Shared-memory layout.  K goes in planes of 32 elements (64 bytes per row); a stage holds
 * SK_KS planes of the block's 128 weight rows and of its tokens, each plane row-major with
 * 64-byte rows.  A lane (g = lane / 4, c = lane % 4) reads the 16 bytes [16c, 16c + 16) of
 * its rows: a quarter warp reads two whole rows, 128 contiguous bytes, free of bank
 * conflicts, and global -> shared copies are the same 16-byte pieces.
 *
 * Fragments with a permuted K (as gemm_w8a8.cu's mma_chunk): of the lane's 8 elements
 * (words x, y, z, w = element pairs), x and y feed the k slots 2c and 8 + 2c of one
 * m16n8k16 and z, w those of a second; A (weights) and B (tokens) load the same bytes of
 * their rows, so both see the same permutation and each k of the plane is summed once. */
#define SK_BM 128      /* weight rows per block */
#define SK_THREADS 256 /* 8 warps */
#define SK_KS 2        /* planes per stage */
#define SK_MAX_SPLIT 16
#define SK_TARGET_BLOCKS 132
#define SK_MIN_SPLIT_K 512

/* Per tokens-per-block (8 NT): warps as WM (rows) x WN (tokens), each MW m16 x NW n8
 * tiles; 4 stages (3 for 96 tokens, keeping two blocks per SM). */
template <int NT> struct sk_cfg {
    static constexpr int NTOK = 8 * NT;
    static constexpr int STAGES = NT <= 8 ? 4 : 3;
    static constexpr int WN = NT <= 4 ? 1 : 2;
    static constexpr int WM = 8 / WN;
    static constexpr int MW = SK_BM / 16 / WM;
    static constexpr int NW = NT / WN;
    static constexpr int W_BYTES = SK_KS * SK_BM * 64;
    static constexpr int STAGE = W_BYTES + SK_KS * NTOK * 64;
    static constexpr int SMEM = STAGES * STAGE;
    static constexpr int MIN_BLOCKS = NT <= 2 ? 3 : 2; /* as many as the shared memory allows */
};

typedef struct sk_params {
    float *y, *work;
    unsigned *counters;
    const uint8_t *x, *w;
    int n, k, m;
    int planes, cps; /* K planes in all, per split */
    int hint;
} sk_params;

template <int NT>
static __global__ void __launch_bounds__(SK_THREADS, sk_cfg<NT>::MIN_BLOCKS)
skinny_kernel(sk_params p) {
    typedef sk_cfg<NT> C;
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ unsigned is_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    const int c16 = (lane & 3) * 16, wm = warp % C::WM, wn = warp / C::WM;
    const int m0 = blockIdx.x * SK_BM, t0 = blockIdx.z * C::NTOK;
    const int p0 = blockIdx.y * p.cps, pend = min(p0 + p.cps, p.planes);
    const int nst = (pend - p0 + SK_KS - 1) / SK_KS;
    const size_t ldb = (size_t)p.k * 2;
    const uint64_t pol = qrl_l2_evict_first();
    const uint32_t sbase = qrl_smem_u32(smem);

    /* Loader: thread tid copies the 16-byte piece q = tid % 4 of weight rows tid / 4 and
     * tid / 4 + 64 in each plane of a stage, and token pieces i = tid + 256 u; pieces past
     * the split, the rows or K are zero-filled (from a mapped address). */
    const int q16 = (tid & 3) * 16, r0 = tid >> 2;
    const bool wok0 = m0 + r0 < p.m, wok1 = m0 + r0 + 64 < p.m;
    const uint8_t *w0 = p.w + (size_t)(wok0 ? m0 + r0 : 0) * ldb + q16;
    const uint8_t *w1 = p.w + (size_t)(wok1 ? m0 + r0 + 64 : 0) * ldb + q16;
    constexpr int NX = SK_KS * C::NTOK * 4, UX = (NX + SK_THREADS - 1) / SK_THREADS;
    const uint8_t *xs[UX];
    uint32_t xdst[UX];
    int xpl[UX];
    bool xok[UX];
#pragma unroll
    for (int u = 0; u < UX; u++) {
        int i = tid + SK_THREADS * u, pl = i / (C::NTOK * 4), r = (i >> 2) % C::NTOK;
        xok[u] = i < NX && t0 + r < p.n;
        xs[u] = p.x + (size_t)(xok[u] ? t0 + r : 0) * ldb + q16;
        xpl[u] = pl;
        xdst[u] = C::W_BYTES + (pl * C::NTOK + r) * 64 + q16;
    }
    auto load = [&](int buf, int s) {
        uint32_t st = sbase + buf * C::STAGE;
        int pb = p0 + s * SK_KS;
#pragma unroll
        for (int pl = 0; pl < SK_KS; pl++) {
            size_t kb = (size_t)(pb + pl) * 64;
            bool kok = pb + pl < pend && kb + q16 < ldb;
            uint32_t d = st + (pl * SK_BM + r0) * 64 + q16;
            const uint8_t *s0 = kok && wok0 ? w0 + kb : p.w, *s1 = kok && wok1 ? w1 + kb : p.w;
            if (p.hint) {
                qrl_cp_async16_hint(d, s0, kok && wok0, pol);
                qrl_cp_async16_hint(d + 64 * 64, s1, kok && wok1, pol);
            } else {
                qrl_cp_async16(d, s0, kok && wok0);
                qrl_cp_async16(d + 64 * 64, s1, kok && wok1);
            }
        }
#pragma unroll
        for (int u = 0; u < UX; u++) {
            if (NX % SK_THREADS && tid + SK_THREADS * u >= NX) break; /* no such piece */
            size_t kb = (size_t)(pb + xpl[u]) * 64;
            bool ok = xok[u] && pb + xpl[u] < pend && kb + q16 < ldb;
            qrl_cp_async16(st + xdst[u], ok ? xs[u] + kb : p.x, ok);
        }
    };

    float acc[C::MW][C::NW][4];
#pragma unroll
    for (int a = 0; a < C::MW; a++)
#pragma unroll
        for (int j = 0; j < C::NW; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[a][j][r] = 0.0f;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < nst) load(s, s);
        qrl_cp_async_commit();
    }
    for (int i = 0; i < nst; i++) {
        qrl_cp_async_wait<C::STAGES - 2>();
        __syncthreads(); /* stage i landed; every warp is done with stage i - 1's buffer */
        int nx = i + C::STAGES - 1;
        if (nx < nst) load(nx % C::STAGES, nx);
        qrl_cp_async_commit();
        const uint8_t *st = smem + (i % C::STAGES) * C::STAGE;
#pragma unroll
        for (int pl = 0; pl < SK_KS; pl++) {
            const uint8_t *A = st + (pl * SK_BM + wm * C::MW * 16 + g) * 64 + c16;
            const uint8_t *B = st + C::W_BYTES + (pl * C::NTOK + wn * C::NW * 8 + g) * 64 + c16;
            int4 lo[C::MW], hi[C::MW];
#pragma unroll
            for (int a = 0; a < C::MW; a++) {
                lo[a] = *(const int4 *)(A + a * 16 * 64);
                hi[a] = *(const int4 *)(A + (a * 16 + 8) * 64);
            }
#pragma unroll
            for (int j = 0; j < C::NW; j++) {
                int4 b = *(const int4 *)(B + j * 8 * 64);
#pragma unroll
                for (int a = 0; a < C::MW; a++) {
                    const uint32_t f0[4] = {(uint32_t)lo[a].x, (uint32_t)hi[a].x,
                                            (uint32_t)lo[a].y, (uint32_t)hi[a].y};
                    const uint32_t f1[4] = {(uint32_t)lo[a].z, (uint32_t)hi[a].z,
                                            (uint32_t)lo[a].w, (uint32_t)hi[a].w};
                    qrl_mma_bf16(acc[a][j], f0, (uint32_t)b.x, (uint32_t)b.y);
                    qrl_mma_bf16(acc[a][j], f1, (uint32_t)b.z, (uint32_t)b.w);
                }
            }
        }
    }
    qrl_cp_async_wait<0>();

    /* Accumulator r of tile (a, j): row g (+ 8 for r >= 2), token 2c (+ 1 for odd r). */
    const bool split = gridDim.y > 1;
    float *dst = split ? p.work + (size_t)blockIdx.y * p.n * p.m : p.y;
#pragma unroll
    for (int a = 0; a < C::MW; a++)
#pragma unroll
        for (int j = 0; j < C::NW; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int row = m0 + (wm * C::MW + a) * 16 + g + (r >> 1) * 8;
                int t = t0 + (wn * C::NW + j) * 8 + (lane & 3) * 2 + (r & 1);
                if (row < p.m && t < p.n) dst[(size_t)t * p.m + row] = acc[a][j][r];
            }
    if (!split) return;
    /* The last split of this tile to finish adds the partials in split order (the same
     * sum whichever block arrives last). */
    unsigned tile = blockIdx.z * gridDim.x + blockIdx.x;
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(&p.counters[tile], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    /* 4 outputs per thread and round, their S loads each independent (latency, not
     * bandwidth, bounds this tail) */
    const int ne = min(C::NTOK, p.n - t0) * SK_BM, nr = min(SK_BM, p.m - m0);
    const size_t zs = (size_t)p.n * p.m;
    for (int e0 = tid; e0 < ne; e0 += 4 * SK_THREADS) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        size_t o[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int e = e0 + u * SK_THREADS;
            ok[u] = e < ne && e % SK_BM < nr;
            o[u] = ok[u] ? (size_t)(t0 + e / SK_BM) * p.m + m0 + e % SK_BM : 0;
        }
        for (unsigned z = 0; z < gridDim.y; z++)
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (ok[u]) sum[u] += __ldcg(p.work + z * zs + o[u]);
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (ok[u]) p.y[o[u]] = sum[u];
    }
    if (tid == 0) p.counters[tile] = 0; /* ready for the next launch */
}

/* ---- host ------------------------------------------------------------------------------ */

static int cdiv(int a, int b) { return (a + b - 1) / b; }

/* Splits of K (>= 1) and planes per split for an m x k weight. */
static int pick_splits(int k, int m, int target, int min_k, int *cps) {
    int planes = cdiv(k, 32), tiles = cdiv(m, SK_BM);
    int s = tiles >= target ? 1 : cdiv(target, tiles);
    if (s > SK_MAX_SPLIT) s = SK_MAX_SPLIT;
    if (s > k / min_k) s = k / min_k;
    if (s < 1) s = 1;
    int c = cdiv(cdiv(planes, s), SK_KS) * SK_KS; /* whole stages per split */
    *cps = c;
    return cdiv(planes, c); /* no empty split */
}

int qrl_cuda_gemm_bf16_skinny_splits(int k, int m) {
    int cps;
    return k > 0 && m > 0 ? pick_splits(k, m, SK_TARGET_BLOCKS, SK_MIN_SPLIT_K, &cps) : 1;
}

int qrl_cuda_gemm_bf16_skinny_blocks(int n, int k, int m) {
    if (n <= 0 || k <= 0 || m <= 0) return 0;
    int tok = n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : n <= 64 || n > 96 ? 64 : 96;
    return cdiv(m, SK_BM) * qrl_cuda_gemm_bf16_skinny_splits(k, m) * cdiv(n, tok);
}

int qrl_cuda_gemm_bf16_skinny_ok(const uint16_t *x, const uint16_t *w, int k) {
    return k > 0 && k % 8 == 0 && !(((uintptr_t)x | (uintptr_t)w) & 15);
}

/* Dynamic shared memory above 48 KiB is opt-in per kernel and device: done once each, by
 * qrl_cuda_gemm_bf16_skinny_prepare or else at the first launch. */
#define SK_MAX_DEVICES 64
template <int NT> static cudaError_t sk_prepare(void) {
    static unsigned char done[SK_MAX_DEVICES];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < SK_MAX_DEVICES && done[dev]) return cudaSuccess;
    e = cudaFuncSetAttribute(skinny_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             sk_cfg<NT>::SMEM);
    if (e == cudaSuccess && dev >= 0 && dev < SK_MAX_DEVICES) done[dev] = 1;
    return e;
}

qrl_status qrl_cuda_gemm_bf16_skinny_prepare(qrl_error *err) {
    cudaError_t e = sk_prepare<1>();
    if (e == cudaSuccess) e = sk_prepare<2>();
    if (e == cudaSuccess) e = sk_prepare<4>();
    if (e == cudaSuccess) e = sk_prepare<8>();
    if (e == cudaSuccess) e = sk_prepare<12>();
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm bf16 skinny: shared memory opt-in: %s",
                             cudaGetErrorString(e));
    return QRL_OK;
}

template <int NT>
static qrl_status sk_launch(const sk_params &p, int splits, cudaStream_t s, qrl_error *err) {
    cudaError_t e = sk_prepare<NT>();
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "gemm bf16 skinny: shared memory opt-in: %s",
                             cudaGetErrorString(e));
    dim3 grid(cdiv(p.m, SK_BM), splits, cdiv(p.n, sk_cfg<NT>::NTOK));
    skinny_kernel<NT><<<grid, SK_THREADS, sk_cfg<NT>::SMEM, s>>>(p);
    return qrl_cuda_launch_status_("gemm bf16 skinny", err);
}

qrl_status qrl_cuda_gemm_bf16_skinny(const qrl_cuda_bf16_skinny_args *a, void *stream,
                                     qrl_error *err) {
    if (a->n <= 0 || a->k <= 0 || a->m <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "gemm bf16 skinny: n=%d k=%d m=%d", a->n, a->k, a->m);
    if (!qrl_cuda_gemm_bf16_skinny_ok(a->x, a->w, a->k))
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "gemm bf16 skinny: k=%d (need a multiple of 8) or x/w not 16-byte "
                             "aligned", a->k);
    /* tokens per block; above 96 rows blocks of 64 (each group reads the weights again) */
    int nt = a->n <= 8 ? 1 : a->n <= 16 ? 2 : a->n <= 32 ? 4 : a->n <= 64 || a->n > 96 ? 8 : 12;
    int cps, splits = pick_splits(a->k, a->m, a->target_blocks > 0 ? a->target_blocks : SK_TARGET_BLOCKS,
                                  a->min_split_k > 0 ? a->min_split_k : SK_MIN_SPLIT_K, &cps);
    size_t tiles = (size_t)cdiv(a->m, SK_BM) * cdiv(a->n, 8 * nt);
    if (splits > 1 && (!a->work || !a->counters || (size_t)splits * a->n * a->m > a->work_floats ||
                       tiles > (size_t)a->n_counters))
        splits = 1;
    sk_params p = {a->y, a->work, a->counters, (const uint8_t *)a->x, (const uint8_t *)a->w,
                   a->n, a->k, a->m, cdiv(a->k, 32), splits > 1 ? cps : cdiv(a->k, 32),
                   !a->no_l2_hint};
    cudaStream_t s = (cudaStream_t)stream;
    switch (nt) {
    case 1: return sk_launch<1>(p, splits, s, err);
    case 2: return sk_launch<2>(p, splits, s, err);
    case 4: return sk_launch<4>(p, splits, s, err);
    case 8: return sk_launch<8>(p, splits, s, err);
    default: return sk_launch<12>(p, splits, s, err);
    }
}
