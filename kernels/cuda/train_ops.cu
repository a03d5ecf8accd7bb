/* CUDA layers of the training engine (train_ops.cuh).  Row-wise ops take one block (norms,
 * log-softmax) or one warp (q/k heads) per row; parameter gradients are summed per block
 * in shared memory and added to the F32 gradient with one atomicAdd per element and
 * block, so atomics stay few even when thousands of rows feed one gain vector. */
#include "cuda/train_ops.cuh"

#include <cuda_bf16.h>
#include <math.h>

#include "cuda/launch.cuh"

#define CHECK_POS(name, ...)                                                                 \
    do {                                                                                     \
        long long v_[] = {__VA_ARGS__};                                                      \
        for (size_t i_ = 0; i_ < sizeof v_ / sizeof v_[0]; i_++)                             \
            if (v_[i_] <= 0)                                                                 \
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,                       \
                                     "%s: size argument %zu is %lld", name, i_, v_[i_]);     \
    } while (0)

static inline int grid_for(int64_t n, int threads, int cap) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < cap ? (b > 0 ? b : 1) : cap);
}

/* ---- embedding ------------------------------------------------------------------------- */

static __global__ void embed_fwd_kernel(float *x, const int32_t *tokens, const float *table,
                                        int D) {
    size_t t = blockIdx.x;
    const float *row = table + (size_t)tokens[t] * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) x[t * D + j] = row[j];
}

qrl_status qrl_cuda_train_embedding_forward(float *x, const int32_t *tokens, const float *table,
                                            int T, int D, void *stream, qrl_error *err) {
    CHECK_POS("train embedding forward", T, D);
    embed_fwd_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(x, tokens, table, D);
    return qrl_cuda_launch_status_("train embedding forward", err);
}

static __global__ void embed_bwd_kernel(float *dtable, const float *dx, const int32_t *tokens,
                                        int D) {
    size_t t = blockIdx.x;
    float *row = dtable + (size_t)tokens[t] * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) atomicAdd(row + j, dx[t * D + j]);
}

qrl_status qrl_cuda_train_embedding_backward(float *dtable, const float *dx,
                                             const int32_t *tokens, int T, int D, void *stream,
                                             qrl_error *err) {
    CHECK_POS("train embedding backward", T, D);
    embed_bwd_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(dtable, dx, tokens, D);
    return qrl_cuda_launch_status_("train embedding backward", err);
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

static __global__ void rmsnorm_fwd_kernel(uint16_t *y, float *rstd, float *x_out,
                                          const float *x_in, const float *add,
                                          const float *bias, const float *g, int d, float eps) {
    __shared__ float sh[32];
    size_t r = blockIdx.x;
    const float *xi = x_in + r * d;
    float *xo = x_out + r * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = xi[j];
        if (add) v += add[r * d + j] + (bias ? bias[j] : 0.0f);
        if (add || xo != xi) xo[j] = v;
        ss += v * v;
    }
    float rs = rsqrtf(qrl_block_sum_(ss, sh) / (float)d + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int j = threadIdx.x; j < d; j += blockDim.x) y[r * d + j] = qrl_bf16_st_(xo[j] * rs * g[j]);
}

qrl_status qrl_cuda_train_rmsnorm_forward(uint16_t *y, float *rstd, float *x_out,
                                          const float *x_in, const float *add, const float *bias,
                                          const float *g, int n, int d, float eps, void *stream,
                                          qrl_error *err) {
    CHECK_POS("train rmsnorm forward", n, d);
    rmsnorm_fwd_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(y, rstd, x_out, x_in, add, bias, g,
                                                             d, eps);
    return qrl_cuda_launch_status_("train rmsnorm forward", err);
}

#define NORM_BWD_ROWS 16 /* rows per block: dg partials reused across them */

static __global__ void rmsnorm_bwd_kernel(float *dx, uint16_t *dx_bf16, float *dg,
                                          const float *dy, const float *x, const float *g,
                                          const float *rstd, int n, int d) {
    extern __shared__ float dg_s[]; /* [d] */
    __shared__ float sh[32];
    for (int j = threadIdx.x; j < d; j += blockDim.x) dg_s[j] = 0.0f;
    int r0 = blockIdx.x * NORM_BWD_ROWS, r1 = min(r0 + NORM_BWD_ROWS, n);
    for (int r = r0; r < r1; r++) {
        const float *dyr = dy + (size_t)r * d, *xr = x + (size_t)r * d;
        float rs = rstd[r], dot = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float xh = xr[j] * rs;
            dot += dyr[j] * g[j] * xh;
            dg_s[j] += dyr[j] * xh;
        }
        float mean = qrl_block_sum_(dot, sh) / (float)d;
        float *dxr = dx + (size_t)r * d;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float xh = xr[j] * rs;
            float v = dxr[j] + rs * (dyr[j] * g[j] - xh * mean);
            dxr[j] = v;
            if (dx_bf16) dx_bf16[(size_t)r * d + j] = qrl_bf16_st_(v);
        }
    }
    if (dg)
        for (int j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(dg + j, dg_s[j]);
}

qrl_status qrl_cuda_train_rmsnorm_backward(float *dx, uint16_t *dx_bf16, float *dg,
                                           const float *dy, const float *x, const float *g,
                                           const float *rstd, int n, int d, void *stream,
                                           qrl_error *err) {
    CHECK_POS("train rmsnorm backward", n, d);
    if (d > 12288)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "train rmsnorm backward: d=%d > 12288", d);
    int blocks = (n + NORM_BWD_ROWS - 1) / NORM_BWD_ROWS;
    size_t sm = (size_t)d * sizeof(float);
    if (sm > 48 * 1024)
        cudaFuncSetAttribute(rmsnorm_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    rmsnorm_bwd_kernel<<<blocks, 256, sm, (cudaStream_t)stream>>>(dx, dx_bf16, dg, dy, x, g,
                                                                   rstd, n, d);
    return qrl_cuda_launch_status_("train rmsnorm backward", err);
}

/* ---- q/k: bias, head norm, rope --------------------------------------------------------- */

#define QK_MAX_PAIRS 4 /* hd <= 256: 128 pairs over 32 lanes */
#define QK_WARPS 8

/* Element indices (a, b) of pair p and its rope frequency index. */
static __device__ __forceinline__ void qk_pair(int p, int hd, int interleaved, int *a, int *b) {
    if (interleaved) *a = 2 * p, *b = 2 * p + 1;
    else *a = p, *b = p + hd / 2;
}

static __global__ void qk_fwd_kernel(uint16_t *y, uint16_t *x, float *rstd, const float *bias,
                                     const float *g, const float *cos_t, const float *sin_t,
                                     int T, int nh, int hd, int interleaved, float eps) {
    int lane = threadIdx.x & 31, half = hd / 2;
    int64_t rows = (int64_t)T * nh;
    for (int64_t row = (int64_t)blockIdx.x * QK_WARPS + (threadIdx.x >> 5); row < rows;
         row += (int64_t)gridDim.x * QK_WARPS) {
        int t = (int)(row / nh), h = (int)(row % nh);
        uint16_t *xr = x + row * hd;
        uint16_t *yr = y + row * hd;
        float va[QK_MAX_PAIRS], vb[QK_MAX_PAIRS], ss = 0.0f;
#pragma unroll
        for (int i = 0; i < QK_MAX_PAIRS; i++) {
            int p = lane + 32 * i, a, b;
            va[i] = vb[i] = 0.0f;
            if (p >= half) continue;
            qk_pair(p, hd, interleaved, &a, &b);
            float xa = qrl_bf16_ld_(xr[a]), xb = qrl_bf16_ld_(xr[b]);
            if (bias) {
                xa = qrl_bf16_ld_(qrl_bf16_st_(xa + bias[h * hd + a]));
                xb = qrl_bf16_ld_(qrl_bf16_st_(xb + bias[h * hd + b]));
                xr[a] = qrl_bf16_st_(xa), xr[b] = qrl_bf16_st_(xb);
            }
            va[i] = xa, vb[i] = xb;
            ss += xa * xa + xb * xb;
        }
        float rs = 1.0f;
        if (g) {
            rs = rsqrtf(qrl_warp_sum_(ss) / (float)hd + eps);
            if (lane == 0) rstd[row] = rs;
        }
#pragma unroll
        for (int i = 0; i < QK_MAX_PAIRS; i++) {
            int p = lane + 32 * i, a, b;
            if (p >= half) continue;
            qk_pair(p, hd, interleaved, &a, &b);
            float xa = va[i], xb = vb[i];
            if (g) xa = xa * rs * g[a], xb = xb * rs * g[b];
            float c = cos_t[(size_t)t * half + p], s = sin_t[(size_t)t * half + p];
            yr[a] = qrl_bf16_st_(xa * c - xb * s);
            yr[b] = qrl_bf16_st_(xb * c + xa * s);
        }
    }
}

qrl_status qrl_cuda_train_qk_forward(uint16_t *y, uint16_t *x, float *rstd, const float *bias,
                                     const float *g, const float *cos_t, const float *sin_t,
                                     int T, int nh, int hd, int interleaved, float eps,
                                     void *stream, qrl_error *err) {
    CHECK_POS("train qk forward", T, nh, hd);
    if (hd % 2 || hd > 256)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "train qk forward: head_dim %d", hd);
    int blocks = grid_for((int64_t)T * nh, QK_WARPS, 4096);
    qk_fwd_kernel<<<blocks, 32 * QK_WARPS, 0, (cudaStream_t)stream>>>(
        y, x, rstd, bias, g, cos_t, sin_t, T, nh, hd, interleaved, eps);
    return qrl_cuda_launch_status_("train qk forward", err);
}

static __global__ void qk_bwd_kernel(uint16_t *dx, float *dg, float *dbias, const float *dy,
                                     const uint16_t *x, const float *g, const float *rstd,
                                     const float *cos_t, const float *sin_t, int T, int nh,
                                     int hd, int interleaved) {
    extern __shared__ float part[]; /* dg [hd], dbias [nh * hd] */
    float *dg_s = part, *db_s = part + hd;
    for (int j = threadIdx.x; j < hd + nh * hd; j += blockDim.x) part[j] = 0.0f;
    __syncthreads();
    int lane = threadIdx.x & 31, half = hd / 2;
    int64_t rows = (int64_t)T * nh;
    for (int64_t row = (int64_t)blockIdx.x * QK_WARPS + (threadIdx.x >> 5); row < rows;
         row += (int64_t)gridDim.x * QK_WARPS) {
        int t = (int)(row / nh), h = (int)(row % nh);
        const float *dyr = dy + row * hd;
        const uint16_t *xr = x + row * hd;
        float da[QK_MAX_PAIRS], db[QK_MAX_PAIRS], xa[QK_MAX_PAIRS], xb[QK_MAX_PAIRS];
        float dot = 0.0f, rs = g ? rstd[row] : 1.0f;
#pragma unroll
        for (int i = 0; i < QK_MAX_PAIRS; i++) {
            int p = lane + 32 * i, a, b;
            da[i] = db[i] = xa[i] = xb[i] = 0.0f;
            if (p >= half) continue;
            qk_pair(p, hd, interleaved, &a, &b);
            float c = cos_t[(size_t)t * half + p], s = sin_t[(size_t)t * half + p];
            /* the transpose of the rotation: R(-angle) */
            float ga = dyr[a] * c + dyr[b] * s, gb = dyr[b] * c - dyr[a] * s;
            da[i] = ga, db[i] = gb;
            if (g) {
                xa[i] = qrl_bf16_ld_(xr[a]) * rs, xb[i] = qrl_bf16_ld_(xr[b]) * rs;
                atomicAdd(dg_s + a, ga * xa[i]);
                atomicAdd(dg_s + b, gb * xb[i]);
                dot += ga * g[a] * xa[i] + gb * g[b] * xb[i];
            }
        }
        float mean = g ? qrl_warp_sum_(dot) / (float)hd : 0.0f;
#pragma unroll
        for (int i = 0; i < QK_MAX_PAIRS; i++) {
            int p = lane + 32 * i, a, b;
            if (p >= half) continue;
            qk_pair(p, hd, interleaved, &a, &b);
            float va = da[i], vb = db[i];
            if (g) {
                va = rs * (va * g[a] - xa[i] * mean);
                vb = rs * (vb * g[b] - xb[i] * mean);
            }
            dx[row * hd + a] = qrl_bf16_st_(va);
            dx[row * hd + b] = qrl_bf16_st_(vb);
            if (dbias) {
                atomicAdd(db_s + h * hd + a, va);
                atomicAdd(db_s + h * hd + b, vb);
            }
        }
    }
    __syncthreads();
    if (dg && g)
        for (int j = threadIdx.x; j < hd; j += blockDim.x) atomicAdd(dg + j, dg_s[j]);
    if (dbias)
        for (int j = threadIdx.x; j < nh * hd; j += blockDim.x) atomicAdd(dbias + j, db_s[j]);
}

qrl_status qrl_cuda_train_qk_backward(uint16_t *dx, float *dg, float *dbias, const float *dy,
                                      const uint16_t *x, const float *g, const float *rstd,
                                      const float *cos_t, const float *sin_t, int T, int nh,
                                      int hd, int interleaved, void *stream, qrl_error *err) {
    CHECK_POS("train qk backward", T, nh, hd);
    if (hd % 2 || hd > 256 || (size_t)(nh + 1) * hd > 12288)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "train qk backward: head_dim %d, "
                             "%d heads", hd, nh);
    size_t sm = (size_t)(nh + 1) * hd * sizeof(float);
    if (sm > 48 * 1024)
        cudaFuncSetAttribute(qk_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    int blocks = grid_for((int64_t)T * nh, QK_WARPS * 8, 1024); /* 8 rows per warp */
    qk_bwd_kernel<<<blocks, 32 * QK_WARPS, sm, (cudaStream_t)stream>>>(
        dx, dg, dbias, dy, x, g, rstd, cos_t, sin_t, T, nh, hd, interleaved);
    return qrl_cuda_launch_status_("train qk backward", err);
}

/* ---- bias, column sums, SwiGLU ------------------------------------------------------------ */

static __global__ void bias_add_kernel(uint16_t *x, const float *bias, int64_t n, int N) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = qrl_bf16_st_(qrl_bf16_ld_(x[i]) + bias[i % N]);
}

qrl_status qrl_cuda_train_bias_add(uint16_t *x, const float *bias, int T, int N, void *stream,
                                   qrl_error *err) {
    CHECK_POS("train bias add", T, N);
    int64_t n = (int64_t)T * N;
    bias_add_kernel<<<grid_for(n, 256, 4096), 256, 0, (cudaStream_t)stream>>>(x, bias, n, N);
    return qrl_cuda_launch_status_("train bias add", err);
}

#define COLSUM_ROWS 64

static __global__ void colsum_kernel(float *db, const void *dy, int f32, int T, int N) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int t0 = blockIdx.y * COLSUM_ROWS, t1 = min(t0 + COLSUM_ROWS, T);
    float s = 0.0f;
    for (int t = t0; t < t1; t++)
        s += f32 ? ((const float *)dy)[(size_t)t * N + n]
                 : qrl_bf16_ld_(((const uint16_t *)dy)[(size_t)t * N + n]);
    atomicAdd(db + n, s);
}

qrl_status qrl_cuda_train_colsum(float *db, const void *dy, int f32, int T, int N, void *stream,
                                 qrl_error *err) {
    CHECK_POS("train colsum", T, N);
    dim3 grid((N + 255) / 256, (T + COLSUM_ROWS - 1) / COLSUM_ROWS);
    colsum_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(db, dy, f32, T, N);
    return qrl_cuda_launch_status_("train colsum", err);
}

static __global__ void swiglu_fwd_kernel(uint16_t *h, const uint16_t *gate, const uint16_t *up,
                                         int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = qrl_bf16_ld_(gate[i]), u = qrl_bf16_ld_(up[i]);
        h[i] = qrl_bf16_st_(g / (1.0f + expf(-g)) * u);
    }
}

qrl_status qrl_cuda_train_swiglu_forward(uint16_t *h, const uint16_t *gate, const uint16_t *up,
                                         int64_t n, void *stream, qrl_error *err) {
    CHECK_POS("train swiglu forward", n);
    swiglu_fwd_kernel<<<grid_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(h, gate, up, n);
    return qrl_cuda_launch_status_("train swiglu forward", err);
}

static __global__ void swiglu_bwd_kernel(uint16_t *dgate, uint16_t *dup, const float *dh,
                                         const uint16_t *gate, const uint16_t *up, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = qrl_bf16_ld_(gate[i]), u = qrl_bf16_ld_(up[i]), d = dh[i];
        float s = 1.0f / (1.0f + expf(-g));
        dgate[i] = qrl_bf16_st_(d * u * s * (1.0f + g * (1.0f - s)));
        dup[i] = qrl_bf16_st_(d * g * s);
    }
}

qrl_status qrl_cuda_train_swiglu_backward(uint16_t *dgate, uint16_t *dup, const float *dh,
                                          const uint16_t *gate, const uint16_t *up, int64_t n,
                                          void *stream, qrl_error *err) {
    CHECK_POS("train swiglu backward", n);
    swiglu_bwd_kernel<<<grid_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(dgate, dup, dh,
                                                                                  gate, up, n);
    return qrl_cuda_launch_status_("train swiglu backward", err);
}

/* ---- log-probabilities and entropy --------------------------------------------------------- */

/* Online softmax state: max m, s = sum exp(z - m), w = sum exp(z - m) z. */
typedef struct lse_state { float m, s, w; } lse_state;

static __device__ __forceinline__ lse_state lse_merge(lse_state a, lse_state b) {
    if (b.s == 0.0f) return a;
    if (a.s == 0.0f) return b;
    float m = fmaxf(a.m, b.m), ea = expf(a.m - m), eb = expf(b.m - m);
    return {m, a.s * ea + b.s * eb, a.w * ea + b.w * eb};
}

#define LP_THREADS 512

static __global__ void logprob_fwd_kernel(float *logp, float *ent, float *lse, const float *logits,
                                          const int32_t *targets, int V) {
    __shared__ lse_state sh[LP_THREADS / 32];
    size_t r = blockIdx.x;
    const float *z = logits + r * V;
    lse_state st = {-INFINITY, 0.0f, 0.0f};
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = z[j];
        if (x > st.m) {
            float e = st.s > 0.0f ? expf(st.m - x) : 0.0f;
            st.s = st.s * e + 1.0f, st.w = st.w * e + x, st.m = x;
        } else {
            float e = expf(x - st.m);
            st.s += e, st.w += e * x;
        }
    }
    for (int o = 16; o; o >>= 1) {
        lse_state b = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                       __shfl_xor_sync(0xffffffffu, st.w, o)};
        st = lse_merge(st, b);
    }
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
        lse_state a = sh[0];
        for (int i = 1; i < LP_THREADS / 32; i++) a = lse_merge(a, sh[i]);
        float l = a.m + logf(a.s);
        lse[r] = l;
        ent[r] = l - a.w / a.s;
        int tg = targets[r];
        logp[r] = tg < 0 ? 0.0f : z[tg] - l;
    }
}

qrl_status qrl_cuda_train_logprob_forward(float *logp, float *ent, float *lse,
                                          const float *logits, const int32_t *targets, int T,
                                          int V, void *stream, qrl_error *err) {
    CHECK_POS("train logprob forward", T, V);
    logprob_fwd_kernel<<<T, LP_THREADS, 0, (cudaStream_t)stream>>>(logp, ent, lse, logits,
                                                                    targets, V);
    return qrl_cuda_launch_status_("train logprob forward", err);
}

static __global__ void logprob_bwd_kernel(uint16_t *dlogits, const float *logits,
                                          const int32_t *targets, const float *lse,
                                          const float *ent, const float *dlogp,
                                          const float *dent, int V) {
    size_t r = blockIdx.y;
    const float *z = logits + r * V;
    uint16_t *dz = dlogits + r * V;
    int tg = targets[r];
    float gl = tg < 0 ? 0.0f : dlogp[r], ge = dent ? dent[r] : 0.0f, l = lse[r];
    float H = dent ? ent[r] : 0.0f;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x) {
        float lp = z[j] - l, p = expf(lp);
        float dh = p > 0.0f ? -p * (lp + H) : 0.0f;
        dz[j] = qrl_bf16_st_(gl * ((j == tg ? 1.0f : 0.0f) - p) + ge * dh);
    }
}

qrl_status qrl_cuda_train_logprob_backward(uint16_t *dlogits, const float *logits,
                                           const int32_t *targets, const float *lse,
                                           const float *ent, const float *dlogp,
                                           const float *dent, int T, int V, void *stream,
                                           qrl_error *err) {
    CHECK_POS("train logprob backward", T, V);
    if (T > 65535)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "train logprob backward: %d rows in one call (> 65535)", T);
    dim3 grid(grid_for(V, 256, 32), T);
    logprob_bwd_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(dlogits, logits, targets, lse, ent,
                                                                dlogp, dent, V);
    return qrl_cuda_launch_status_("train logprob backward", err);
}

/* ---- AdamW ------------------------------------------------------------------------------ */

#define NORM_BLOCKS 1024

int qrl_cuda_train_norm_parts(void) { return NORM_BLOCKS; }

static __global__ void sumsq_kernel(double *part, unsigned long long *bad, const float *g,
                                    size_t n) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = g[i];
        if (!isfinite(v)) atomicMin(bad, (unsigned long long)i);
        s += (double)v * v;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

qrl_status qrl_cuda_train_sumsq(double *part, int64_t *bad, const float *g, size_t n,
                                void *stream, qrl_error *err) {
    CHECK_POS("train sumsq", (long long)n);
    sumsq_kernel<<<NORM_BLOCKS, 256, 0, (cudaStream_t)stream>>>(part, (unsigned long long *)bad,
                                                                 g, n);
    return qrl_cuda_launch_status_("train sumsq", err);
}

static __global__ void adamw_kernel(float *p, uint16_t *p_bf16, float *m, float *v,
                                    const float *grads, size_t n, qrl_cuda_adamw_scalars s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        /* the CPU's operation order, without FMA contraction */
        float g = __fmul_rn(grads[i], s.scale);
        float pi = __fmul_rn(p[i], s.decay);
        float mi = __fadd_rn(__fmul_rn(s.b1, m[i]), __fmul_rn(s.omb1, g));
        float vi = __fadd_rn(__fmul_rn(s.b2, v[i]), __fmul_rn(s.omb2, __fmul_rn(g, g)));
        m[i] = mi, v[i] = vi;
        float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
        pi = __fsub_rn(pi, __fmul_rn(s.step_size, __fdiv_rn(mi, den)));
        p[i] = pi;
        if (p_bf16) p_bf16[i] = qrl_bf16_st_(pi);
    }
}

qrl_status qrl_cuda_train_adamw(float *p, uint16_t *p_bf16, float *m, float *v, const float *g,
                                size_t n, const qrl_cuda_adamw_scalars *s, void *stream,
                                qrl_error *err) {
    CHECK_POS("train adamw", (long long)n);
    adamw_kernel<<<grid_for((int64_t)n, 256, 16384), 256, 0, (cudaStream_t)stream>>>(
        p, p_bf16, m, v, g, n, *s);
    return qrl_cuda_launch_status_("train adamw", err);
}
