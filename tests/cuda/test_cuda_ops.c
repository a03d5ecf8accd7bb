/* CUDA decode ops against the CPU reference (STYLE 8): fresh random inputs, odd sizes,
 * guard regions around every output (and poison inside it: every element must be
 * written).  Bounds, by normalized error ||gpu - cpu|| / ||cpu||:
 *   BF16 outputs (rmsnorm, attention, swiglu, KV cache):  1e-2 (one BF16 rounding is
 *     <= 2^-9 = 2e-3 relative per element; F32 math otherwise)
 *   F32 outputs of F32 math on equal BF16 inputs (GEMM, q after rope, residual): 1e-4
 *   embedding: exact; greedy: argmax exact, log-prob within 1e-4 absolute. */
#include "cuda_test_util.h"

#include "cuda/attention.cuh"
#include "cuda/gemm.cuh"
#include "cuda/norm.cuh"
#include "cuda/pointwise.cuh"
#include "cuda/rope_kv.cuh"

#define BF16_TOL 1e-2
#define F32_TOL 1e-4

/* ---- RMSNorm (+ fused residual add) ------------------------------------------------ */

static void rmsnorm_case(int rows, int d, int with_add, uint64_t seed) {
    size_t n = (size_t)rows * d;
    float *x = malloc(n * 4), *add = malloc(n * 4), *bias = malloc(d * 4), *w = malloc(d * 4);
    uint16_t *bias16 = malloc(d * 2), *w16 = malloc(d * 2), *out16 = malloc(n * 2);
    float *got = malloc(n * 4), *want = malloc(n * 4), *xgot = malloc(n * 4);
    rand_f32(x, n, 3.0f, &seed);
    rand_f32(add, n, 1.0f, &seed);
    rand_bf16(bias16, bias, d, 0.0f, 0.5f, &seed);
    rand_bf16(w16, w, d, 1.0f, 0.3f, &seed);
    float *dx = dev_from(x, n * 4), *dadd = dev_from(add, n * 4);
    uint16_t *dbias = dev_from(bias16, d * 2), *dw = dev_from(w16, d * 2);
    guarded go = guarded_new(n, 2);
    qrl_error err;
    cr_assert_eq(qrl_cuda_rmsnorm(guarded_ptr(go), dx, with_add ? dadd : NULL,
                                  with_add ? dbias : NULL, dw, rows, d, 1e-5f, NULL, &err),
                 QRL_OK, "%s", err.msg);
    guarded_fetch(go, out16, "rmsnorm");
    cr_assert_eq(qrl_cuda_copy_to_host(xgot, dx, n * 4, NULL), QRL_OK);
    if (with_add)
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < d; i++) x[(size_t)r * d + i] += add[(size_t)r * d + i] + bias[i];
    qrl_cpu_rmsnorm(want, x, w, rows, d, 1e-5f);
    bf16_to_f32_host(out16, got, n);
    double e = rel_err(got, want, n), ex = rel_err(xgot, x, n);
    fprintf(stderr, "rmsnorm rows=%d d=%d add=%d: out err %.2e, residual err %.2e\n", rows, d,
            with_add, e, ex);
    cr_assert(e <= BF16_TOL, "rmsnorm rows=%d d=%d: err %g", rows, d, e);
    cr_assert(ex <= F32_TOL, "rmsnorm residual rows=%d d=%d: err %g", rows, d, ex);
    qrl_cuda_free(dx); qrl_cuda_free(dadd); qrl_cuda_free(dbias); qrl_cuda_free(dw);
    free(x); free(add); free(bias); free(w); free(bias16); free(w16); free(out16); free(got);
    free(want); free(xgot);
}

Test(cuda_ops, rmsnorm) {
    require_gpu();
    const int shapes[][2] = {{1, 7}, {3, 64}, {7, 1000}, {33, 2560}, {2, 4099}};
    for (int i = 0; i < 5; i++)
        for (int a = 0; a < 2; a++) rmsnorm_case(shapes[i][0], shapes[i][1], a, 100 + i * 2 + a);
}

/* ---- GEMM ---------------------------------------------------------------------------- */

Test(cuda_ops, gemm_bf16) {
    require_gpu();
    const int shapes[][3] = {{1, 64, 96}, {3, 33, 17}, {5, 2560, 301}, {64, 512, 1024}};
    qrl_cuda_gemm *g;
    qrl_error err;
    cr_assert_eq(qrl_cuda_gemm_new(&g, &err), QRL_OK, "%s", err.msg);
    uint64_t seed = 7;
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
        uint16_t *x16 = malloc((size_t)n * k * 2), *w16 = malloc((size_t)m * k * 2);
        float *x = malloc((size_t)n * k * 4), *w = malloc((size_t)m * k * 4);
        float *got = malloc((size_t)n * m * 4), *want = malloc((size_t)n * m * 4);
        rand_bf16(x16, x, (size_t)n * k, 0.0f, 1.0f, &seed);
        rand_bf16(w16, w, (size_t)m * k, 0.0f, 0.1f, &seed);
        uint16_t *dx = dev_from(x16, (size_t)n * k * 2), *dw = dev_from(w16, (size_t)m * k * 2);
        guarded gy = guarded_new((size_t)n * m, 4);
        cr_assert_eq(qrl_cuda_gemm_bf16(g, guarded_ptr(gy), dx, dw, n, k, m, NULL, &err), QRL_OK,
                     "%s", err.msg);
        guarded_fetch(gy, got, "gemm");
        qrl_cpu_matmul(want, x, w, NULL, n, k, m);
        double e = rel_err(got, want, (size_t)n * m);
        fprintf(stderr, "gemm n=%d k=%d m=%d: err %.2e\n", n, k, m, e);
        cr_assert(e <= F32_TOL, "gemm n=%d k=%d m=%d: err %g", n, k, m, e);
        qrl_cuda_free(dx); qrl_cuda_free(dw);
        free(x16); free(w16); free(x); free(w); free(got); free(want);
    }
    cr_assert_eq(qrl_cuda_gemm_bf16(g, NULL, NULL, NULL, 0, 4, 4, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_gemm_free(g);
}

/* ---- SwiGLU, embedding, greedy ------------------------------------------------------ */

Test(cuda_ops, swiglu) {
    require_gpu();
    uint64_t seed = 11;
    const int shapes[][2] = {{1, 1}, {3, 1001}, {17, 9728}};
    for (int s = 0; s < 3; s++) {
        int n = shapes[s][0], f = shapes[s][1];
        float *gu = malloc((size_t)n * 2 * f * 4), *want = malloc((size_t)n * f * 4),
              *got = malloc((size_t)n * f * 4);
        uint16_t *o16 = malloc((size_t)n * f * 2);
        rand_f32(gu, (size_t)n * 2 * f, 6.0f, &seed);
        for (int r = 0; r < n; r++)
            qrl_cpu_silu_mul(want + (size_t)r * f, gu + (size_t)r * 2 * f, gu + (size_t)r * 2 * f + f, f);
        float *dgu = dev_from(gu, (size_t)n * 2 * f * 4);
        guarded go = guarded_new((size_t)n * f, 2);
        qrl_error err;
        cr_assert_eq(qrl_cuda_swiglu(guarded_ptr(go), dgu, n, f, NULL, &err), QRL_OK, "%s", err.msg);
        guarded_fetch(go, o16, "swiglu");
        bf16_to_f32_host(o16, got, (size_t)n * f);
        double e = rel_err(got, want, (size_t)n * f);
        fprintf(stderr, "swiglu n=%d f=%d: err %.2e\n", n, f, e);
        cr_assert(e <= BF16_TOL, "swiglu n=%d f=%d: err %g", n, f, e);
        qrl_cuda_free(dgu);
        free(gu); free(want); free(got); free(o16);
    }
}

Test(cuda_ops, embed_exact) {
    require_gpu();
    uint64_t seed = 13;
    int V = 37, d = 45, n = 6;
    int32_t tok[6] = {0, 36, 5, 5, 17, 1};
    uint16_t *t16 = malloc((size_t)V * d * 2);
    rand_bf16(t16, NULL, (size_t)V * d, 0.0f, 2.0f, &seed);
    uint16_t *dt = dev_from(t16, (size_t)V * d * 2);
    int32_t *dtok = dev_from(tok, sizeof tok);
    guarded gx = guarded_new((size_t)n * d, 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_embed(guarded_ptr(gx), dt, dtok, n, d, NULL, &err), QRL_OK, "%s", err.msg);
    float *got = malloc((size_t)n * d * 4);
    guarded_fetch(gx, got, "embed");
    for (int r = 0; r < n; r++)
        for (int i = 0; i < d; i++)
            cr_assert_eq(got[r * d + i], qrl_cpu_bf16_load(t16[tok[r] * d + i]), "row %d col %d", r, i);
    qrl_cuda_free(dt); qrl_cuda_free(dtok); free(t16); free(got);
}

Test(cuda_ops, greedy_argmax_logprob) {
    require_gpu();
    uint64_t seed = 17;
    /* V % 4 != 0 or an odd row of 1001: the scalar loads; the others float4 */
    const int shapes[][2] = {{1, 5}, {4, 1000}, {3, 151936}, {3, 1001}};
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], V = shapes[s][1];
        float *lg = malloc((size_t)n * V * 4);
        rand_f32(lg, (size_t)n * V, 8.0f, &seed);
        if (V > 100) { /* tie at the max (lower index wins), and a NaN that must not win */
            lg[10] = 50.0f; lg[77] = 50.0f; lg[3] = NAN;
        }
        float *dl = dev_from(lg, (size_t)n * V * 4);
        guarded gt = guarded_new(n, 4), gl = guarded_new(n, 4);
        qrl_error err;
        cr_assert_eq(qrl_cuda_greedy(dl, n, V, guarded_ptr(gt), guarded_ptr(gl), NULL, &err), QRL_OK,
                     "%s", err.msg);
        int32_t tok[4];
        float lp[4];
        guarded_fetch(gt, tok, "greedy tokens");
        guarded_fetch(gl, lp, "greedy logprob");
        for (int r = 0; r < n; r++) {
            const float *row = lg + (size_t)r * V;
            int want = qrl_cpu_argmax(row, V);
            cr_assert_eq(tok[r], want, "V=%d row %d: gpu %d cpu %d", V, r, tok[r], want);
            double mx = row[want], sum = 0;
            for (int i = 0; i < V; i++) if (!isnan(row[i])) sum += exp((double)row[i] - mx);
            if (r > 0 || V <= 100) { /* row 0 of the large cases holds the NaN */
                double wl = -log(sum);
                cr_assert(fabs(lp[r] - wl) <= 1e-4, "V=%d row %d: logprob %g want %g", V, r, lp[r], wl);
            }
        }
        qrl_cuda_free(dl);
        free(lg);
    }
}

/* ---- fused QKV post-processing: bias, QK-norm, RoPE, paged KV write ---------------- */

static void rope_kv_case(int H, int KVH, int hd, int with_bias, int qk_norm, qrl_rope_params rp,
                         uint64_t seed) {
    const int bs = 3, n_blocks = 13, mb = 6, n = 5, max_pos = mb * bs;
    int row_seq[5] = {0, 1, 0, 1, 0}, row_pos[5] = {0, 4, 7, 17, 16};
    int32_t tables[2 * 6];
    for (int i = 0; i < 12; i++) tables[i] = (i * 5 + 3) % n_blocks; /* scattered, distinct */
    int Q = H * hd, KV = KVH * hd, W = Q + 2 * KV, half = hd / 2;
    float *qkv = malloc((size_t)n * W * 4), *bias = malloc(W * 4), *qn = malloc(hd * 4),
          *kn = malloc(hd * 4);
    uint16_t *bias16 = malloc(W * 2), *qn16 = malloc(hd * 2), *kn16 = malloc(hd * 2);
    rand_f32(qkv, (size_t)n * W, 2.0f, &seed);
    rand_bf16(bias16, bias, W, 0.0f, 0.5f, &seed);
    rand_bf16(qn16, qn, hd, 1.0f, 0.3f, &seed);
    rand_bf16(kn16, kn, hd, 1.0f, 0.3f, &seed);
    float *inv = malloc(half * 4), *cs = malloc((size_t)max_pos * half * 4),
          *sn = malloc((size_t)max_pos * half * 4);
    qrl_cpu_rope_inv_freq(inv, hd, &rp);
    for (int p = 0; p < max_pos; p++)
        qrl_cpu_rope_cos_sin(cs + (size_t)p * half, sn + (size_t)p * half, inv, half, p);
    size_t cache_n = (size_t)n_blocks * bs * KV;
    guarded gq = guarded_new((size_t)n * Q, 4), gk = guarded_new(cache_n, 2),
            gv = guarded_new(cache_n, 2);
    qrl_cuda_rope_kv_args a = {
        .qkv = dev_from(qkv, (size_t)n * W * 4), .bias = with_bias ? dev_from(bias16, W * 2) : NULL,
        .q_norm = qk_norm ? dev_from(qn16, hd * 2) : NULL,
        .k_norm = qk_norm ? dev_from(kn16, hd * 2) : NULL, .eps = 1e-6f,
        .cos_tab = dev_from(cs, (size_t)max_pos * half * 4),
        .sin_tab = dev_from(sn, (size_t)max_pos * half * 4),
        .interleaved = rp.layout == QRL_ROPE_LAYOUT_INTERLEAVED,
        .row_seq = dev_from(row_seq, sizeof row_seq), .row_pos = dev_from(row_pos, sizeof row_pos),
        .block_tables = dev_from(tables, sizeof tables), .max_blocks_per_seq = mb,
        .block_size = bs, .k_cache = guarded_ptr(gk), .v_cache = guarded_ptr(gv),
        .q_out = guarded_ptr(gq), .n = n, .n_heads = H, .n_kv_heads = KVH, .head_dim = hd};
    qrl_error err;
    cr_assert_eq(qrl_cuda_rope_kv(&a, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_synchronize(&err), QRL_OK, "%s", err.msg);
    /* The caches are written only at the rows' slots: fetch them raw (guards checked
     * here, poison outside the slots checked below). */
    uint16_t *kc = malloc((cache_n + 2 * GUARD) * 2), *vc = malloc((cache_n + 2 * GUARD) * 2);
    cr_assert_eq(qrl_cuda_copy_to_host(kc, gk.base, (cache_n + 2 * GUARD) * 2, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(vc, gv.base, (cache_n + 2 * GUARD) * 2, NULL), QRL_OK);
    float *qgot = malloc((size_t)n * Q * 4);
    guarded_fetch(gq, qgot, "rope q");
    unsigned char *written = calloc(cache_n, 1);
    float *ref = malloc((size_t)W * 4), *kw = malloc(KV * 4), *kg = malloc(KV * 4),
          *vw = malloc(KV * 4), *vg = malloc(KV * 4), *qw = malloc((size_t)n * Q * 4);
    double ek = 0, ev = 0;
    for (int r = 0; r < n; r++) {
        memcpy(ref, qkv + (size_t)r * W, W * 4);
        if (with_bias) for (int i = 0; i < W; i++) ref[i] += bias[i];
        if (qk_norm) {
            qrl_cpu_rmsnorm(ref, ref, qn, H, hd, 1e-6f);
            qrl_cpu_rmsnorm(ref + Q, ref + Q, kn, KVH, hd, 1e-6f);
        }
        const float *c = cs + (size_t)row_pos[r] * half, *s = sn + (size_t)row_pos[r] * half;
        qrl_cpu_rope_apply(ref, H, hd, c, s, rp.layout);
        qrl_cpu_rope_apply(ref + Q, KVH, hd, c, s, rp.layout);
        memcpy(qw + (size_t)r * Q, ref, Q * 4);
        int p = row_pos[r];
        size_t slot = ((size_t)tables[row_seq[r] * mb + p / bs] * bs + p % bs) * KV;
        for (int i = 0; i < KV; i++) {
            written[slot + i] = 1;
            kw[i] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(ref[Q + i]));
            vw[i] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(ref[Q + KV + i]));
            kg[i] = qrl_cpu_bf16_load(kc[GUARD + slot + i]);
            vg[i] = qrl_cpu_bf16_load(vc[GUARD + slot + i]);
        }
        ek = fmax(ek, rel_err(kg, kw, KV));
        ev = fmax(ev, rel_err(vg, vw, KV));
    }
    for (size_t i = 0; i < cache_n + 2 * GUARD; i++) {
        int w = i >= GUARD && i < GUARD + cache_n && written[i - GUARD];
        if (!w) cr_assert(kc[i] == GUARD_BF16 && vc[i] == GUARD_BF16, "stray cache write at %zu", i);
    }
    double eq = rel_err(qgot, qw, (size_t)n * Q);
    fprintf(stderr, "rope_kv H=%d KVH=%d hd=%d bias=%d qk_norm=%d layout=%d: q %.2e k %.2e v %.2e\n",
            H, KVH, hd, with_bias, qk_norm, rp.layout, eq, ek, ev);
    cr_assert(eq <= F32_TOL, "rope q err %g", eq);
    cr_assert(ek <= BF16_TOL && ev <= BF16_TOL, "kv err %g %g", ek, ev);
    qrl_cuda_free((void *)a.qkv); qrl_cuda_free((void *)a.bias); qrl_cuda_free((void *)a.q_norm);
    qrl_cuda_free((void *)a.k_norm); qrl_cuda_free((void *)a.cos_tab); qrl_cuda_free((void *)a.sin_tab);
    qrl_cuda_free((void *)a.row_seq); qrl_cuda_free((void *)a.row_pos);
    qrl_cuda_free((void *)a.block_tables); qrl_cuda_free(gk.base); qrl_cuda_free(gv.base);
    free(qkv); free(bias); free(qn); free(kn); free(bias16); free(qn16); free(kn16); free(inv);
    free(cs); free(sn); free(kc); free(vc); free(qgot); free(written); free(ref); free(kw);
    free(kg); free(vw); free(vg); free(qw);
}

Test(cuda_ops, rope_kv) {
    require_gpu();
    qrl_rope_params llama3 = {.theta = 500000, .scaling = QRL_ROPE_SCALING_LLAMA3, .factor = 8,
                              .low_freq_factor = 1, .high_freq_factor = 4,
                              .original_max_position = 8, .layout = QRL_ROPE_LAYOUT_HALF};
    qrl_rope_params plain = {.theta = 10000, .layout = QRL_ROPE_LAYOUT_INTERLEAVED};
    rope_kv_case(4, 2, 16, 0, 0, llama3, 1);
    rope_kv_case(4, 2, 16, 1, 0, plain, 2);
    rope_kv_case(32, 8, 128, 0, 1, llama3, 3);  /* Qwen3-4B head shape, QK-norm */
    rope_kv_case(6, 3, 8, 1, 1, plain, 4);
    rope_kv_case(2, 1, 256, 1, 1, llama3, 5);
    rope_kv_case(3, 1, 10, 0, 1, plain, 6);     /* hd not a power of two */
}

/* Storing K/V codes from the RoPE kernel: refused for fp4 and for a layer of another shape
 * (checked before any launch; the values are test_cuda_forward_kv's
 * rope_store_equals_separate_store). */
Test(cuda_ops, rope_kv_store_errors) {
    require_gpu();
    qrl_error err;
    qrl_cuda_rope_kv_args a = {.n = 1, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .kvq_store = 1,
                               .kvq = {.format = QRL_CUDA_KVQ_FP4, .head_dim = 16, .n_kv_heads = 2}};
    cr_assert_eq(qrl_cuda_rope_kv(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "kvq_store into kv format"), "%s", err.msg);
    a.kvq.format = QRL_CUDA_KVQ_INT4;
    a.kvq.head_dim = 32;
    cr_assert_eq(qrl_cuda_rope_kv(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "head_dim 32"), "%s", err.msg);
    a.kvq = (qrl_cuda_kvq_layer){.format = QRL_CUDA_KVQ_INT4_PROTECTED, .head_dim = 16, .n_kv_heads = 2,
                                 .block_size = 16, .sink = 4, .recent = 8, .ring = 0};
    cr_assert_eq(qrl_cuda_rope_kv(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "ring=0"), "%s", err.msg);
}

/* ---- attention over the paged cache (decode batch and causal prefill chunk) -------- */

static void attention_case(int H, int KVH, int hd, int bs, int n, const int *lens, int prefill,
                           uint64_t seed) {
    int max_len = 0;
    for (int r = 0; r < n; r++) if (lens[r] > max_len) max_len = lens[r];
    int mb = (max_len + bs - 1) / bs, n_seqs = prefill ? 1 : n, n_blocks = n_seqs * mb + 3;
    int KV = KVH * hd, Q = H * hd;
    size_t cache_n = (size_t)n_blocks * bs * KV;
    uint16_t *k16 = malloc(cache_n * 2), *v16 = malloc(cache_n * 2);
    rand_bf16(k16, NULL, cache_n, 0.0f, 1.0f, &seed);
    rand_bf16(v16, NULL, cache_n, 0.0f, 1.0f, &seed);
    int32_t *tables = malloc((size_t)n_seqs * mb * 4), *rseq = malloc(n * 4), *rpos = malloc(n * 4);
    for (int i = 0; i < n_seqs * mb; i++) tables[i] = (int32_t)((i * 7 + 2) % n_blocks);
    /* (i*7+2) mod n_blocks is a bijection when gcd(7, n_blocks) = 1 */
    cr_assert(n_blocks % 7 != 0);
    for (int r = 0; r < n; r++) rseq[r] = prefill ? 0 : r, rpos[r] = lens[r] - 1;
    float *q = malloc((size_t)n * Q * 4);
    rand_f32(q, (size_t)n * Q, 1.5f, &seed);
    size_t wf = qrl_cuda_attention_work_floats(n, H, hd, max_len);
    float *work;
    cr_assert_eq(qrl_cuda_malloc((void **)&work, wf * 4, NULL), QRL_OK);
    guarded go = guarded_new((size_t)n * Q, 2);
    qrl_cuda_attention_args a = {
        .out = guarded_ptr(go), .q = dev_from(q, (size_t)n * Q * 4), .k_cache = dev_from(k16, cache_n * 2),
        .v_cache = dev_from(v16, cache_n * 2), .block_tables = dev_from(tables, (size_t)n_seqs * mb * 4),
        .max_blocks_per_seq = mb, .block_size = bs, .row_seq = dev_from(rseq, n * 4),
        .row_pos = dev_from(rpos, n * 4), .n = n, .n_heads = H, .n_kv_heads = KVH, .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd), .max_len = max_len, .work = work, .work_floats = wf};
    qrl_error err;
    cr_assert_eq(qrl_cuda_attention(&a, NULL, &err), QRL_OK, "%s", err.msg);
    uint16_t *o16 = malloc((size_t)n * Q * 2);
    guarded_fetch(go, o16, "attention");
    float *got = malloc((size_t)n * Q * 4), *want = malloc((size_t)n * Q * 4),
          *scratch = malloc((size_t)max_len * 4);
    bf16_to_f32_host(o16, got, (size_t)n * Q);
    for (int r = 0; r < n; r++) {
        qrl_kv_view view = {.k = k16, .v = v16, .dtype = QRL_DTYPE_BF16,
                            .block_table = tables + (size_t)rseq[r] * mb, .block_size = bs,
                            .n_kv_heads = KVH, .head_dim = hd};
        for (int h = 0; h < H; h++)
            qrl_cpu_attention_head(want + (size_t)r * Q + h * hd, q + (size_t)r * Q + h * hd, &view,
                                   h / (H / KVH), lens[r], 1.0f / sqrtf((float)hd), scratch);
    }
    double e = rel_err(got, want, (size_t)n * Q);
    fprintf(stderr, "attention H=%d KVH=%d hd=%d bs=%d n=%d max_len=%d prefill=%d: err %.2e\n", H,
            KVH, hd, bs, n, max_len, prefill, e);
    cr_assert(e <= BF16_TOL, "attention err %g", e);
    qrl_cuda_free((void *)a.q); qrl_cuda_free((void *)a.k_cache); qrl_cuda_free((void *)a.v_cache);
    qrl_cuda_free((void *)a.block_tables); qrl_cuda_free((void *)a.row_seq);
    qrl_cuda_free((void *)a.row_pos); qrl_cuda_free(work);
    free(k16); free(v16); free(tables); free(rseq); free(rpos); free(q); free(o16); free(got);
    free(want); free(scratch);
}

Test(cuda_ops, attention_decode) {
    require_gpu();
    const int lens_a[] = {1, 17, 300, 1025, 64, 2};
    attention_case(32, 8, 128, 16, 6, lens_a, 0, 21);   /* Qwen3-4B heads, G = 4 */
    const int lens_b[] = {5, 1, 129};
    attention_case(4, 4, 8, 5, 3, lens_b, 0, 22);       /* G = 1, odd block size */
    attention_case(16, 2, 64, 16, 3, lens_b, 0, 23);    /* G = 8 */
    attention_case(6, 2, 32, 3, 3, lens_b, 0, 24);      /* G = 3 (padded group) */
    attention_case(2, 1, 256, 16, 3, lens_b, 0, 25);
    const int lens_c[] = {4000, 3999, 1};
    attention_case(8, 2, 16, 16, 3, lens_c, 0, 26);
}

/* The tensor-core path (head_dim 64 and 128): long contexts, odd lengths, partial tiles,
 * a ragged batch, odd block sizes (no shift/mask), every group size up to 8. */
Test(cuda_ops, attention_decode_tensor_core) {
    require_gpu();
    const int lens_a[] = {8192, 1, 8191, 333, 16, 15, 17, 4097};
    attention_case(32, 8, 128, 16, 8, lens_a, 0, 41);   /* Qwen3-4B heads, G = 4 */
    const int lens_b[] = {1000, 7, 2049};
    attention_case(64, 8, 128, 16, 3, lens_b, 0, 42);   /* G = 8 */
    attention_case(16, 16, 128, 5, 3, lens_b, 0, 43);   /* G = 1, block size 5 */
    attention_case(12, 4, 64, 16, 3, lens_b, 0, 44);    /* G = 3 (padded rows) */
    attention_case(4, 2, 64, 32, 3, lens_b, 0, 45);     /* G = 2, block size 32 */
    const int lens_c[] = {3, 12000};
    attention_case(8, 1, 128, 16, 2, lens_c, 0, 46);    /* G = 8, one kv head, 12K */
    int ragged[40];
    for (int i = 0; i < 40; i++) ragged[i] = 1 + (i * 977) % 1501;
    attention_case(32, 8, 128, 16, 40, ragged, 0, 47);  /* ragged batch filling the chip */
}

Test(cuda_ops, attention_prefill_causal) {
    require_gpu();
    int lens[70];
    for (int i = 0; i < 70; i++) lens[i] = 30 + i; /* a chunk at positions 29..98 of one sequence */
    attention_case(8, 2, 32, 16, 70, lens, 1, 31);
    attention_case(4, 2, 16, 7, 70, lens, 1, 32);
    attention_case(32, 8, 128, 16, 70, lens, 1, 33); /* tensor-core path */
    attention_case(8, 4, 64, 7, 70, lens, 1, 34);
}

Test(cuda_ops, attention_rejects_unsupported) {
    require_gpu();
    qrl_cuda_attention_args a = {.n = 1, .n_heads = 4, .n_kv_heads = 2, .head_dim = 12, .max_len = 4};
    qrl_error err;
    cr_assert_eq(qrl_cuda_attention(&a, NULL, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "head_dim 12"), "%s", err.msg);
    a.head_dim = 16;
    a.work_floats = 0;
    cr_assert_eq(qrl_cuda_attention(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "scratch"), "%s", err.msg);
}
