/* Quantized KV writes: fp8 calibration and the quantize-and-store kernel (kv_quant.cuh).
 * Every encoder is the CPU one's exact operation sequence (kernels/cpu/quant_kv.c,
 * quant_rows.c, quant_scalar.c; model/kv_cache.c fp8_pow2_scale): IEEE division (nvcc's
 * default -prec-div), rintf = round half to even, double where the CPU uses double, and no
 * contractible a*b+c anywhere, so the codes are bit-identical. */
#include "cuda/kv_quant.cuh"

#include <math.h>

#include "cuda/kv_quant_dev.cuh"
#include "cuda/kv_store_dev.cuh"
#include "cuda/launch.cuh"
#include "cuda/nvfp4_dev.cuh"

int qrl_cuda_kvq_code_bytes(int format, int hd) {
    if (hd <= 0 || hd > 256 || hd % 2) return 0;
    switch (format) {
    case QRL_CUDA_KVQ_FP8:
    case QRL_CUDA_KVQ_INT8: return hd;
    case QRL_CUDA_KVQ_INT4:
    case QRL_CUDA_KVQ_INT4_PROTECTED:
    case QRL_CUDA_KVQ_FP4: return hd / 2;
    default: return 0;
    }
}

/* fp4: S_enc, 1/S_enc, then the block scale bytes, in whole 16-byte pieces */
static __host__ __device__ int fp4_fields(int hd) { return 4 * ((8 + (hd + 15) / 16 + 15) / 16); }

int qrl_cuda_kvq_scale_floats(int format, int hd) {
    switch (format) {
    case QRL_CUDA_KVQ_INT8: return 1;
    case QRL_CUDA_KVQ_INT4:
    case QRL_CUDA_KVQ_INT4_PROTECTED: return 2 * ((hd + 31) / 32);
    case QRL_CUDA_KVQ_FP4: return fp4_fields(hd);
    default: return 0;
    }
}

size_t qrl_cuda_kvq_fp4_copy_bytes(int hd) {
    return ((size_t)4 + (size_t)(hd + 15) / 16 + (size_t)(hd + 1) / 2 + 3) & ~(size_t)3;
}

static __device__ size_t qrl_cuda_kvq_fp4_copy_bytes_d(int hd) {
    return ((size_t)4 + (size_t)(hd + 15) / 16 + (size_t)(hd + 1) / 2 + 3) & ~(size_t)3;
}

static __device__ int qrl_cuda_kvq_code_bytes_d(int format, int hd) {
    return format == QRL_CUDA_KVQ_FP8 || format == QRL_CUDA_KVQ_INT8 ? hd : hd / 2;
}

/* fp4: lane l < ceil(hd/16) quantizes block l (qrl_nvfp4_quantize_block_ under the warp's
 * S_enc: the CPU's qrl_nvfp4_quantize_row, one block per lane); lane 0 the F32 fields.
 * copy: the CPU record of this vector (kv_quant.cuh qrl_cuda_kv_store_copy). */
static __device__ void store_fp4(const float *src, int hd, int lane, uint8_t *codes, float *fields,
                                 uint8_t *copy) {
    constexpr int B = QRL_NVFP4_BLOCK;
    int nb = (hd + B - 1) / B, len = hd - B * lane < B ? hd - B * lane : B;
    float x[B];
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < B; e++) {
        x[e] = lane < nb && e < len ? src[B * lane + e] : 0.0f;
        a = fmaxf(a, fin_abs(x[e]));
    }
    a = warp_max(a);
    float s_enc = qrl_nvfp4_s_enc_(a);
    uint8_t *sb = (uint8_t *)(fields + 2);
    if (lane < nb) {
        uint64_t cw;
        uint8_t s = qrl_nvfp4_quantize_block_(x, len, s_enc, &cw);
        uint8_t *cp = codes + 8 * lane;
        if (len == B && ((uintptr_t)cp & 7) == 0) *(uint64_t *)cp = cw;
        else for (int i = 0; i < len / 2; i++) cp[i] = (uint8_t)(cw >> (8 * i));
        sb[lane] = s;
        if (copy) {
            copy[4 + lane] = s;
            for (int i = 0; i < len / 2; i++) copy[4 + nb + 8 * lane + i] = (uint8_t)(cw >> (8 * i));
        }
    } else if (lane < 4 * fp4_fields(hd) - 8) {
        sb[lane] = 0; /* padding of the fields */
    }
    if (lane == 0) {
        fields[0] = s_enc;
        fields[1] = a == 0.0f ? 0.0f : __fdiv_rn(1.0f, s_enc);
        if (copy) {
            *(float *)copy = s_enc;
            for (size_t i = 4 + nb + hd / 2; i < qrl_cuda_kvq_fp4_copy_bytes_d(hd); i++) copy[i] = 0;
        }
    }
}

static __global__ void kv_store_kernel(qrl_cuda_kvq_layer c, const float *kv, const int32_t *row_seq,
                                       const int32_t *row_pos, uint8_t *fp4_copy) {
    int r = blockIdx.x, h = blockIdx.y, w = blockIdx.z, lane = threadIdx.x;
    int hd = c.head_dim, KVH = c.n_kv_heads;
    const float *src = kv + (size_t)r * 2 * KVH * hd + (size_t)(w * KVH + h) * hd;
    float x[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int j = lane + 32 * k;
        x[k] = j < hd ? src[j] : 0.0f;
    }
    int seq = row_seq[r], pos = row_pos[r];
    int blk = c.block_tables[(size_t)seq * c.max_blocks_per_seq + pos / c.block_size];
    size_t rec = ((size_t)blk * KVH + h) * c.block_size + pos % c.block_size;
    if (c.format == QRL_CUDA_KVQ_FP4) {
        size_t vb = qrl_cuda_kvq_fp4_copy_bytes_d(hd);
        store_fp4(src, hd, lane, c.codes[w] + rec * (hd / 2), c.scales[w] + rec * fp4_fields(hd),
                  fp4_copy ? fp4_copy + (((size_t)r * 2 + w) * KVH + h) * vb : NULL);
        return;
    }
    qrl_kvq_store_vec_(c, x, lane, seq, pos, rec, h, w);
}

/* model/kv_cache.c fp8_pow2_scale */
static __device__ float fp8_pow2_scale(float amax) {
    if (amax == 0.0f) return 1.0f;
    int e;
    float m = frexpf(4.0f * amax / 448.0f, &e);
    return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

static __global__ void fp8_calibrate_kernel(qrl_cuda_kvq_layer c, const float *kv, const int32_t *runs,
                                            int n_runs) {
    int i = blockIdx.x, h = blockIdx.y, w = blockIdx.z, lane = threadIdx.x;
    int hd = c.head_dim, KVH = c.n_kv_heads;
    int first = runs[i], len = runs[n_runs + i], seq = runs[2 * n_runs + i];
    float a = 0.0f;
    for (int r = first; r < first + len; r++) {
        const float *src = kv + (size_t)r * 2 * KVH * hd + (size_t)(w * KVH + h) * hd;
        for (int j = lane; j < hd; j += 32) a = fmaxf(a, fin_abs(src[j]));
    }
    a = warp_max(a);
    if (lane == 0) c.fp8_scale[((size_t)seq * KVH + h) * 2 + w] = fp8_pow2_scale(a);
}

static qrl_status check(const qrl_cuda_kvq_layer *c, const char *what, qrl_error *err) {
    if (qrl_cuda_kvq_code_bytes(c->format, c->head_dim) == 0 || c->n_kv_heads <= 0 ||
        c->block_size <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: kv format %d with head_dim %d (fp8, int8, int4, fp4, int4-protected; "
                             "even head_dim <= 256)", what, c->format, c->head_dim);
    if (c->format == QRL_CUDA_KVQ_INT4_PROTECTED &&
        (c->sink < 0 || c->recent < 0 || (c->recent > 0 && c->ring < c->recent)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: sink=%d recent=%d ring=%d",
                             what, c->sink, c->recent, c->ring);
    return QRL_OK;
}

qrl_status qrl_cuda_kv_fp8_calibrate(const qrl_cuda_kvq_layer *c, const float *kv,
                                     const int32_t *runs, int n_runs, void *stream,
                                     qrl_error *err) {
    QRL_TRY(check(c, "kv fp8 calibrate", err));
    if (n_runs <= 0) return QRL_OK;
    fp8_calibrate_kernel<<<dim3(n_runs, c->n_kv_heads, 2), 32, 0, (cudaStream_t)stream>>>(
        *c, kv, runs, n_runs);
    return qrl_cuda_launch_status_("kv fp8 calibrate", err);
}

qrl_status qrl_cuda_kv_store_copy(const qrl_cuda_kvq_layer *c, const float *kv,
                                  const int32_t *row_seq, const int32_t *row_pos, int n,
                                  uint8_t *fp4_copy, void *stream, qrl_error *err) {
    QRL_TRY(check(c, "kv store", err));
    if (n <= 0 || n > 65535)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kv store: n=%d rows", n);
    if (fp4_copy && (c->format != QRL_CUDA_KVQ_FP4 || ((uintptr_t)fp4_copy & 3)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "kv store: fp4_copy needs the fp4 format (%d) and 4-byte alignment",
                             c->format);
    kv_store_kernel<<<dim3(n, c->n_kv_heads, 2), 32, 0, (cudaStream_t)stream>>>(*c, kv, row_seq,
                                                                                row_pos, fp4_copy);
    return qrl_cuda_launch_status_("kv store", err);
}

qrl_status qrl_cuda_kv_store(const qrl_cuda_kvq_layer *c, const float *kv, const int32_t *row_seq,
                             const int32_t *row_pos, int n, void *stream, qrl_error *err) {
    return qrl_cuda_kv_store_copy(c, kv, row_seq, row_pos, n, NULL, stream, err);
}

static __device__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(x >> 32);
}

static __global__ void fill_kernel(qrl_cuda_kvq_layer c, size_t n_recs, size_t side_recs, int n_seqs,
                                   uint64_t seed) {
    int cb = qrl_cuda_kvq_code_bytes_d(c.format, c.head_dim);
    bool fp4 = c.format == QRL_CUDA_KVQ_FP4;
    int sf = c.format == QRL_CUDA_KVQ_INT8 ? 1 : c.format == QRL_CUDA_KVQ_FP8 ? 0
           : fp4 ? fp4_fields(c.head_dim) : 2 * ((c.head_dim + 31) / 32);
    size_t stride = (size_t)gridDim.x * blockDim.x, t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int w = 0; w < 2; w++) {
        for (size_t i = t0; i < n_recs * cb; i += stride) {
            uint32_t b = hash32(seed * 0x9E3779B97F4A7C15ull + (2 * i + w)) & 0xFFu;
            c.codes[w][i] = (uint8_t)(c.format == QRL_CUDA_KVQ_FP8 ? b & 0xF7u : b);
        }
        for (size_t i = t0; sf && i < n_recs * sf; i += stride)
            c.scales[w][i] = fp4 ? (i % sf == 0 ? 64.0f : i % sf == 1 ? 1.0f / 64.0f
                                    : __uint_as_float(0x38383838u)) /* block scales 1.0 */
                           : sf == 1 ? 0.02f : (i % sf < (size_t)sf / 2 ? 0.1f : -0.75f);
        for (size_t i = t0; i < side_recs * c.head_dim; i += stride)
            c.side_codes[w][i] = (int8_t)(hash32(seed + 77 + 2 * i + w) & 0xFFu);
        for (size_t i = t0; i < side_recs; i += stride) c.side_scales[w][i] = 0.02f;
    }
    for (size_t i = t0; c.format == QRL_CUDA_KVQ_FP8 && i < (size_t)n_seqs * c.n_kv_heads * 2; i += stride)
        c.fp8_scale[i] = 1.0f / 64.0f;
}

qrl_status qrl_cuda_kvq_fill_random(const qrl_cuda_kvq_layer *c, size_t n_recs, size_t side_recs,
                                    int n_seqs, uint64_t seed, void *stream, qrl_error *err) {
    QRL_TRY(check(c, "kv fill", err));
    fill_kernel<<<1024, 256, 0, (cudaStream_t)stream>>>(*c, n_recs, side_recs, n_seqs, seed);
    return qrl_cuda_launch_status_("kv fill", err);
}
