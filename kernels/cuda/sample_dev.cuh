/* Internal to kernels/cuda (C++ only): the device side of sample.cuh (procedure and
 * reasoning there).  Kept apart from sample.cu's launchers so that the block code can be
 * built by the CPU harness tests/reference/sample_emu.cc, which runs it on simulated
 * threads against qrl_sampler_sample. */
#ifndef QRL_CUDA_SAMPLE_DEV_CUH
#define QRL_CUDA_SAMPLE_DEV_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/sample.cuh"

#ifndef QRL_SAMPLE_NT
#define QRL_SAMPLE_NT 512 /* threads per row */
#endif
#define SMP_NT QRL_SAMPLE_NT
#define SMP_NW (SMP_NT / 32)
#define SMP_NB 2048 /* buckets: the widest digit is 11 bits */
#define SMP_FULL 0xffffffffu
#define SMP_ALL (~0ull)

typedef unsigned long long smp_u64;

/* ---- Philox-4x32-10, as qrl_philox4x32_10 ------------------------------------------ */

static __device__ __forceinline__ void smp_philox(const uint32_t ctr[4], const uint32_t key[2],
                                                  uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        smp_u64 p0 = (smp_u64)0xD2511F53u * c0, p1 = (smp_u64)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The 53 random bits of qrl_sampler_uniform (u = bits * 2^-53). */
static __device__ __forceinline__ smp_u64 smp_uniform_bits(smp_u64 seed, smp_u64 group,
                                                           uint32_t response, uint32_t position) {
    uint32_t ctr[4] = {position, response, (uint32_t)group, (uint32_t)(group >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    smp_philox(ctr, key, o);
    return (((smp_u64)o[0] << 32) | o[1]) >> 11;
}

/* ---- block helpers (every thread gets the same result; fixed reduction order) ------- */

typedef struct smp_smem {
    unsigned cnt[SMP_NB], maxid[SMP_NB];
    smp_u64 wsum[SMP_NB];
    smp_u64 ru[SMP_NW];
    double rd[SMP_NW], rd2[SMP_NW];
    float rf[SMP_NW];
    int ri[SMP_NW], ri2[SMP_NW];
    /* the selected bucket of a digit pass, written by one thread */
    int sel_b;
    smp_u64 sel_v, sel_c;
} smp_smem;

template <typename T> static __device__ __forceinline__ T smp_warp_sum(T v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(SMP_FULL, v, o);
    return v;
}
template <typename T> static __device__ __forceinline__ T smp_warp_max(T v) {
    for (int o = 16; o; o >>= 1) {
        T u = __shfl_xor_sync(SMP_FULL, v, o);
        v = u > v ? u : v;
    }
    return v;
}

static __device__ double smp_block_sum_d(double v, smp_smem *sm) {
    v = smp_warp_sum(v);
    if ((threadIdx.x & 31) == 0) sm->rd[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < SMP_NW; w++) s += sm->rd[w];
    __syncthreads();
    return s;
}

static __device__ smp_u64 smp_block_max_u(smp_u64 v, smp_smem *sm) {
    v = smp_warp_max(v);
    if ((threadIdx.x & 31) == 0) sm->ru[threadIdx.x >> 5] = v;
    __syncthreads();
    smp_u64 m = 0;
    for (int w = 0; w < SMP_NW; w++) m = sm->ru[w] > m ? sm->ru[w] : m;
    __syncthreads();
    return m;
}

/* Exclusive prefix sum of v over the block in thread order; *total = the sum. */
static __device__ smp_u64 smp_block_excl_scan(smp_u64 v, smp_u64 *total, smp_smem *sm) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    smp_u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        smp_u64 y = __shfl_up_sync(SMP_FULL, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sm->ru[w] = x;
    __syncthreads();
    smp_u64 before = 0, all = 0;
    for (int k = 0; k < SMP_NW; k++) {
        if (k < w) before += sm->ru[k];
        all += sm->ru[k];
    }
    __syncthreads();
    *total = all;
    return before + x - v;
}

/* Online (max, sum of exp(z - max)) pairs: merge is symmetric, so a butterfly gives every
 * lane the same bits. */
static __device__ __forceinline__ void smp_ms_merge(double *m, double *s, double m2, double s2) {
    if (m2 == -INFINITY) return;
    if (*m == -INFINITY) {
        *m = m2, *s = s2;
        return;
    }
    double mm = *m > m2 ? *m : m2;
    *s = *s * exp(*m - mm) + s2 * exp(m2 - mm);
    *m = mm;
}

/* ---- keys and weights ----------------------------------------------------------------- */

/* Sort key of token i: by_value: (z desc, id asc) as one ascending 64-bit number (z / T
 * keeps the logits' order, -0 == +0 tie as in the CPU's double compare); else the id. */
static __device__ __forceinline__ smp_u64 smp_key(float x, int i, int by_value) {
    if (!by_value) return (smp_u64)i;
    if (x == 0.0f) x = 0.0f;
    unsigned b = __float_as_uint(x);
    unsigned ok = (b & 0x80000000u) ? ~b : (b | 0x80000000u); /* ascending with x */
    return ((smp_u64)(~ok) << 32) | (unsigned)i;
}

/* z = x / T in double as the CPU computes it (the FP64 division skipped when T = 1, where
 * it is exact). */
static __device__ __forceinline__ double smp_z(float x, double T) {
    return T == 1.0 ? (double)x : (double)x / T;
}

/* exp(x / T - L) in 62-bit fixed point (the CPU's pr = exp(z - lse) before rounding). */
static __device__ __forceinline__ smp_u64 smp_weight(float x, double T, double L) {
    return __double2ull_rn(exp(smp_z(x, T) - L) * 0x1p62);
}

/* ---- radix select ------------------------------------------------------------------- */

typedef struct smp_sel {
    const float *row;
    int V, by_value, weighted, value_only;
    smp_u64 bound;  /* the set: tokens whose key <= bound */
    double T, L;    /* weights exp(x / T - L) when weighted */
    smp_u64 target; /* >= 1: counts or fixed-point weight */
} smp_sel;

typedef struct smp_sel_res {
    int found;        /* 0: the set's total is below the target */
    smp_u64 key;      /* the token's key (value_only: its value's key, id bits 0) */
    unsigned before;  /* tokens of the set before it */
    unsigned n_last;  /* tokens in its last digit bucket (value_only: its value's ties) */
} smp_sel_res;

/* Digits from the top: by_value (z-key 32 bits, then 22 id bits); id order (22 bits). */
static __device__ __forceinline__ void smp_digit(int by_value, int p, int *shift, int *width) {
    if (!by_value) p += 3; /* the id digits are the last two of the value order's */
    *shift = p == 0 ? 53 : p == 1 ? 42 : p == 2 ? 32 : p == 3 ? 11 : 0;
    *width = p == 2 ? 10 : 11;
}

/* First token t of the set in key order whose running count/weight (t included) reaches
 * a->target. */
static __device__ smp_sel_res smp_select(const smp_sel *a, smp_smem *sm) {
    const int tid = threadIdx.x, lane = tid & 31;
    smp_sel_res res = {1, 0, 0, 0};
    smp_u64 prefix = 0, R = a->target;
    int lo = 0, hi = a->V, n_pass = a->by_value ? 5 : 2;
    for (int p = 0; p < n_pass; p++) {
        int shift, width;
        smp_digit(a->by_value, p, &shift, &width);
        if (a->value_only && shift < 32) break;
        int top = shift + width;
        unsigned dmask = (1u << width) - 1;
        for (int b = tid; b < SMP_NB; b += SMP_NT) sm->cnt[b] = 0, sm->maxid[b] = 0, sm->wsum[b] = 0;
        __syncthreads();
        /* id order above the last digit: a warp's 32 consecutive ids share a bucket, so
         * the warp adds once (no 32-way atomic conflicts) */
        bool agg = !a->by_value && shift > 0;
        for (int i0 = lo + (tid & ~31); i0 < hi; i0 += SMP_NT) { /* warp-uniform trip count */
            int i = i0 + lane;
            bool in = i < hi;
            float x = in ? a->row[i] : 0.0f;
            smp_u64 key = in ? smp_key(x, i, a->by_value) : 0;
            in = in && key <= a->bound && (top >= 64 || ((key ^ prefix) >> top) == 0);
            smp_u64 w = in && a->weighted ? smp_weight(x, a->T, a->L) : 0;
            if (agg) {
                unsigned m = __ballot_sync(SMP_FULL, in);
                smp_u64 ws = smp_warp_sum(w);
                int mx = smp_warp_max(in ? i : -1);
                if (lane == 0 && m) {
                    unsigned b = ((unsigned)mx >> shift) & dmask;
                    atomicAdd(&sm->cnt[b], (unsigned)__popc(m));
                    atomicMax(&sm->maxid[b], (unsigned)mx);
                    if (ws) atomicAdd(&sm->wsum[b], ws);
                }
            } else if (in) {
                unsigned b = (unsigned)(key >> shift) & dmask;
                atomicAdd(&sm->cnt[b], 1u);
                atomicMax(&sm->maxid[b], (unsigned)i);
                if (w) atomicAdd(&sm->wsum[b], w);
            }
        }
        __syncthreads();
        /* the bucket where the running sum reaches R: thread t holds buckets
         * [t * BPT, (t + 1) * BPT) */
        const int BPT = SMP_NB / SMP_NT;
        smp_u64 vt = 0, ct = 0, vtot, ctot;
        for (int k = 0; k < BPT; k++) {
            int b = tid * BPT + k;
            vt += a->weighted ? sm->wsum[b] : sm->cnt[b];
            ct += sm->cnt[b];
        }
        smp_u64 vex = smp_block_excl_scan(vt, &vtot, sm), cex = smp_block_excl_scan(ct, &ctot, sm);
        if (vtot < R) { /* only possible in the first pass (later R <= the bucket's sum) */
            res.found = 0;
            return res;
        }
        if (vex < R && R <= vex + vt) { /* exactly one thread */
            smp_u64 cv = vex, cc = cex;
            for (int k = 0; k < BPT; k++) {
                int b = tid * BPT + k;
                smp_u64 bv = a->weighted ? sm->wsum[b] : sm->cnt[b];
                if (R <= cv + bv) {
                    sm->sel_b = b, sm->sel_v = cv, sm->sel_c = cc;
                    break;
                }
                cv += bv;
                cc += sm->cnt[b];
            }
        }
        __syncthreads();
        int b = sm->sel_b;
        R -= sm->sel_v;
        res.before += (unsigned)sm->sel_c;
        prefix |= (smp_u64)b << shift;
        unsigned nb = sm->cnt[b], id1 = sm->maxid[b];
        __syncthreads(); /* everyone has read the histogram before the next pass clears it */
        res.n_last = nb;
        if (!a->by_value) {
            lo = (int)prefix;
            hi = prefix + (1ull << shift) < (smp_u64)a->V ? (int)(prefix + (1ull << shift)) : a->V;
        }
        if (nb == 1) {
            res.key = smp_key(a->row[id1], (int)id1, a->by_value);
            return res;
        }
    }
    res.key = prefix;
    return res;
}

/* zmax + log(sum over the set (key <= bound) of exp(x / T - zmax)): the CPU's
 * logsumexp_of over the kept tokens (the largest z is always kept). */
static __device__ double smp_set_lse(const float *row, int V, smp_u64 bound, double T,
                                     double zmax, smp_smem *sm) {
    double s = 0;
    for (int i = threadIdx.x; i < V; i += SMP_NT) {
        float x = row[i];
        if (smp_key(x, i, 1) <= bound) s += exp(smp_z(x, T) - zmax);
    }
    return zmax + log(smp_block_sum_d(s, sm));
}

/* The CPU walk's fallback when rounding leaves the draw above the last running sum: the
 * last token of the set (key order) with exp(z - L) > 0. */
static __device__ int smp_last_positive(const float *row, int V, int by_value, smp_u64 bound,
                                        double T, double L, smp_smem *sm) {
    smp_u64 best = 0;
    for (int i = threadIdx.x; i < V; i += SMP_NT) {
        float x = row[i];
        smp_u64 key = smp_key(x, i, by_value);
        if (key <= bound && exp(smp_z(x, T) - L) > 0 && key + 1 > best) best = key + 1;
    }
    best = smp_block_max_u(best, sm);
    return (int)(unsigned)(best - 1); /* the id is the key's low word either way */
}

/* ---- kernels ------------------------------------------------------------------------ */

static __global__ void __launch_bounds__(SMP_NT)
    smp_sample_kernel(const float *logits, int V, const qrl_cuda_sample_req *reqs,
                      qrl_cuda_sample_out *outs) {
    __shared__ smp_smem sm;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const float *row = logits + (size_t)blockIdx.x * V;
    const qrl_cuda_sample_req q = reqs[blockIdx.x];
    qrl_cuda_sample_out o = {0, 0.0f, 0.0f, 0, QRL_CUDA_SAMPLE_OK, 0};
    const double T = q.temperature > 0 ? (double)q.temperature : 1.0;

    /* pass 1: first bad index, argmax (first on ties), online (max z, sum exp(z - max)) */
    int bad = INT_MAX, bi = INT_MAX;
    float bv = -INFINITY;
    double m = -INFINITY, s = 0;
    for (int i = tid; i < V; i += SMP_NT) {
        float x = row[i];
        if (isnan(x) || x == INFINITY) {
            if (i < bad) bad = i;
            continue;
        }
        if (x > bv) bv = x, bi = i; /* ascending i: the first of equal maxima stays */
        if (x == -INFINITY) continue;
        double z = smp_z(x, T);
        if (z > m) s = s * exp(m - z) + 1.0, m = z;
        else s += exp(z - m);
    }
    for (int off = 16; off; off >>= 1) {
        int ob = __shfl_xor_sync(SMP_FULL, bad, off), oi = __shfl_xor_sync(SMP_FULL, bi, off);
        float ov = __shfl_xor_sync(SMP_FULL, bv, off);
        double om = __shfl_xor_sync(SMP_FULL, m, off), os = __shfl_xor_sync(SMP_FULL, s, off);
        bad = ob < bad ? ob : bad;
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        smp_ms_merge(&m, &s, om, os);
    }
    if (lane == 0) sm.ri[w] = bad, sm.ri2[w] = bi, sm.rf[w] = bv, sm.rd[w] = m, sm.rd2[w] = s;
    __syncthreads();
    bad = sm.ri[0], bi = sm.ri2[0], bv = sm.rf[0], m = sm.rd[0], s = sm.rd2[0];
    for (int k = 1; k < SMP_NW; k++) {
        bad = sm.ri[k] < bad ? sm.ri[k] : bad;
        if (sm.rf[k] > bv || (sm.rf[k] == bv && sm.ri2[k] < bi)) bv = sm.rf[k], bi = sm.ri2[k];
        smp_ms_merge(&m, &s, sm.rd[k], sm.rd2[k]);
    }
    __syncthreads();
    if (bad != INT_MAX || bv == -INFINITY) {
        o.fail = bad != INT_MAX ? (isnan(row[bad]) ? QRL_CUDA_SAMPLE_NAN : QRL_CUDA_SAMPLE_POSINF)
                                : QRL_CUDA_SAMPLE_ALL_NEGINF;
        o.fail_index = bad != INT_MAX ? bad : 0;
        if (tid == 0) outs[blockIdx.x] = o;
        return;
    }
    const double lse = m + log(s), zmax = m; /* over z = x / T (T = 1 for greedy) */
    if (q.temperature <= 0) {
        o.token = bi;
        o.logprob = (float)((double)bv - lse);
        o.truncated = V > 1;
        if (tid == 0) outs[blockIdx.x] = o;
        return;
    }

    const smp_u64 u_fx = smp_uniform_bits(q.seed, q.group, q.response, q.position) << 9;
    const bool use_k = q.top_k > 0 && q.top_k < V, use_p = q.top_p < 1.0f;
    smp_sel a = {row, V, 0, 1, 0, SMP_ALL, T, lse, u_fx + 1};
    double lse_kept = lse;
    unsigned n_kept = (unsigned)V;
    int tok;
    if (!use_k && !use_p) { /* the walk in id order over the whole vocabulary */
        smp_sel_res r = smp_select(&a, &sm);
        tok = r.found ? (int)r.key : smp_last_positive(row, V, 0, SMP_ALL, T, lse, &sm);
    } else {
        a.by_value = 1;
        if (use_k) { /* the k-th largest value; every token at least as large is kept */
            smp_sel c = {row, V, 1, 0, 1, SMP_ALL, T, 0.0, (smp_u64)q.top_k};
            smp_sel_res r = smp_select(&c, &sm);
            a.bound = r.key | 0xffffffffull;
            n_kept = r.before + r.n_last;
            lse_kept = smp_set_lse(row, V, a.bound, T, zmax, &sm);
        }
        if (use_p) { /* the shortest prefix whose renormalized mass reaches p */
            smp_u64 p_fx = (smp_u64)((double)q.top_p * 0x1p62); /* exact: p has 24 bits */
            smp_sel c = {row, V, 1, 1, 0, a.bound, T, lse_kept, p_fx > 0 ? p_fx : 1};
            smp_sel_res r = smp_select(&c, &sm);
            if (r.found) {
                a.bound = r.key;
                n_kept = r.before + 1;
                lse_kept = smp_set_lse(row, V, a.bound, T, zmax, &sm);
            }
        }
        a.L = lse_kept;
        smp_sel_res r = smp_select(&a, &sm);
        tok = r.found ? (int)(unsigned)r.key
                      : smp_last_positive(row, V, 1, a.bound, T, lse_kept, &sm);
    }
    double zt = smp_z(row[tok], T);
    o.token = tok;
    o.logprob = (float)(zt - lse);
    o.truncated = n_kept < (unsigned)V;
    o.logprob_truncated = o.truncated ? (float)(zt - lse_kept) : o.logprob;
    if (tid == 0) outs[blockIdx.x] = o;
}

static __global__ void smp_philox_kernel(const uint32_t *in, uint32_t *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    smp_philox(in + 6 * (size_t)i, in + 6 * (size_t)i + 4, out + 4 * (size_t)i);
}

static __global__ void smp_uniform_kernel(const uint64_t *keys, double *u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint64_t *k = keys + 4 * (size_t)i;
    u[i] = (double)smp_uniform_bits(k[0], k[1], (uint32_t)k[2], (uint32_t)k[3]) * 0x1p-53;
}

#endif
