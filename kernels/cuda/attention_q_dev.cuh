/* Internal to kernels/cuda (C++ only): what the quantized-KV attention kernels share
 * (attention_q.cu: CUDA-core path, merge and launcher; attention_q_tc.cu: tensor-core
 * path): the launch arguments, the row's region map (main store / int4-protected side
 * cache) and record addressing, and the per-split result layout. */
#ifndef QRL_CUDA_ATTENTION_Q_DEV_CUH
#define QRL_CUDA_ATTENTION_Q_DEV_CUH

#include <cuda_runtime.h>

#include "cuda/kv_quant_dev.cuh"

#define WARPS 4
#define TILE_MIN 64
#define TQ 16 /* positions per tensor-core tile */

enum { F_INT8 = 0, F_FP8 = 1, F_INT4 = 2, F_FP4 = 3 };

/* Code bytes and F32 fields per main-store record (qrl_cuda_kvq_code_bytes / _scale_floats). */
template <int HD, int FMT>
struct kvq_geom {
    static constexpr int CB = FMT == F_INT4 || FMT == F_FP4 ? HD / 2 : HD;
    static constexpr int SF = FMT == F_INT8 ? 1 : FMT == F_INT4 ? 2 * ((HD + 31) / 32)
                            : FMT == F_FP4 ? 4 * ((8 + (HD + 15) / 16 + 15) / 16) : 0;
};

typedef struct qargs {
    qrl_cuda_kvq_layer c;
    uint16_t *out;
    const float *q;
    const int32_t *row_seq, *row_pos;
    int n, n_heads;
    float *work;
} qargs;

/* Per block: the row's region (0 main, 1 protected), its length, and the position of its
 * i-th element. */
struct region_map {
    int a, b, len, region;
    __device__ int pos(int i) const { return region ? (i < a ? i : b + (i - a)) : a + i; }
};

static __device__ __forceinline__ region_map make_map(const qrl_cuda_kvq_layer &c, int n, int region) {
    region_map m;
    kvq_regions(c, n, &m.a, &m.b);
    m.region = region;
    m.len = region ? m.a + (n - m.b) : m.b - m.a;
    return m;
}

/* Record pointers of logical element i (K or V plane w). */
template <int FMT, int HD>
static __device__ __forceinline__ void rec_ptr(const qargs &a, const region_map &m, const int32_t *table,
                                               int seq, int kvh, int bs_shift, int i, int w,
                                               const uint8_t **codes, const float **sc) {
    int p = m.pos(i);
    if (m.region) {
        size_t s = kvq_side_rec(a.c, seq, kvq_side_slot(a.c, p), kvh);
        *codes = (const uint8_t *)a.c.side_codes[w] + s * HD;
        *sc = a.c.side_scales[w] + s;
    } else {
        constexpr int CB = kvq_geom<HD, FMT>::CB, SF = kvq_geom<HD, FMT>::SF;
        size_t r = kvq_rec(a.c, table, p, kvh, bs_shift);
        *codes = a.c.codes[w] + r * CB;
        *sc = SF ? a.c.scales[w] + r * SF : nullptr;
    }
}

/* Block result (already merged over its warps) into the split scratch. */
static __device__ __forceinline__ void put_split(const qargs &a, int r, int h, int split, int n_splits,
                                                 int hd, int d, float A, float M, float L) {
    size_t base = ((size_t)r * a.n_heads + h) * n_splits + split;
    a.work[base * hd + d] = A;
    if (d == 0) {
        float *ml = a.work + (size_t)a.n * a.n_heads * n_splits * hd;
        ml[2 * base] = M;
        ml[2 * base + 1] = L;
    }
}


/* Tensor-core path (head_dim 64 / 128; attention_q_tc.cu): grid (n_main + (prot_len > 0),
 * kv heads, rows); block x < n_main is main-store chunk x of format fmt (F_*), block x =
 * n_main the protected positions (prot_len = sink + recent) of an int4-protected cache. */
void qrl_attnq_tc_launch(const qargs &a, int fmt, int hd, dim3 grid, float sl2, int chunk,
                         int n_splits, int bs_shift, int n_main, int prot_len, cudaStream_t st);

#endif
