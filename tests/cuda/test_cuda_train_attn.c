/* Training attention on the GPU (kernels/cuda/train_attention.cu) against the CPU reference
 * qrl_train_attention_forward/backward on the same BF16-rounded inputs, compared in F32:
 * fresh random inputs, T not a multiple of the 64-token tiles, packed segments of very
 * different lengths (1-token ones too, and boundaries on and off tile edges), GQA ratios
 * 1, 2, 6, 7, head_dim 8/16/32/256 (CUDA-core path) and 64/128 (tensor cores), guard
 * regions around every output.  Bounds:
 *   out (BF16):  relative L2 <= 1e-2 (one BF16 rounding of the output is <= 2^-9 per
 *                element, plus P rounded to BF16 for P V on the tensor-core path)
 *   lse (F32):   max abs <= 1e-4 (F32 online softmax; the scores are F32 dot products of
 *                the same BF16 values; measured <= 3e-6 at T = 2048)
 *   dq/dk/dv:    relative L2 <= 1e-2 (P and dS rounded to BF16 before the products, as
 *                FlashAttention-2, and out is BF16 in D = rowsum(dout * out): measured
 *                ~2e-3 on the tensor-core path, ~1e-3 on the CUDA-core one)
 * (measured out error ~2e-3: the bounds keep a 5x margin over run-to-run variation)
 * The CPU backward runs on its own F32 out and lse (the exact gradient of the BF16
 * inputs), the GPU backward on the GPU forward's: the bounds cover the whole chain. */
#include "cuda_test_util.h"

#include "cpu/train_ops.h"
#include "cuda/train_attention.cuh"

#define OUT_TOL 1e-2
#define LSE_TOL 1e-4
#define GRAD_TOL 1e-2

/* zero-filled interior (the backward accumulates), poisoned guards */
static guarded guarded_zero(size_t n) {
    guarded g = guarded_new(n, 4);
    float *z = calloc(n, 4);
    cr_assert_eq(qrl_cuda_copy_to_device(guarded_ptr(g), z, n * 4, NULL), QRL_OK);
    free(z);
    return g;
}

/* One case: segment lengths lens[0..nseg) summing to T.  twice: run the backward twice
 * and expect twice the gradients (the += contract). */
static void attn_case(const int *lens, int nseg, int H, int Hkv, int hd, int twice, uint64_t seed) {
    int T = 0;
    for (int i = 0; i < nseg; i++) T += lens[i];
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * Hkv * hd, nl = (size_t)T * H;
    int32_t *seg = malloc(T * 4), *ss = malloc(T * 4);
    for (int i = 0, t = 0; i < nseg; i++)
        for (int j = 0; j < lens[i]; j++, t++) seg[t] = i, ss[t] = t - j;
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *do16 = malloc(nq * 2);
    uint16_t *o16 = malloc(nq * 2);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out_ref = malloc(nq * 4), *lse_ref = malloc(nl * 4), *out = malloc(nq * 4), *lse = malloc(nl * 4);
    float *dq_ref = calloc(nq, 4), *dk_ref = calloc(nk, 4), *dv_ref = calloc(nk, 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    /* q wider than k: peaked as well as flat attention rows */
    rand_bf16(q16, q, nq, 0.0f, 2.5f, &seed);
    rand_bf16(k16, k, nk, 0.0f, 1.0f, &seed);
    rand_bf16(v16, v, nk, 0.0f, 1.0f, &seed);
    rand_bf16(do16, dout, nq, 0.0f, 1.0f, &seed);

    uint16_t *dq16 = dev_from(q16, nq * 2), *dk16 = dev_from(k16, nk * 2), *dv16 = dev_from(v16, nk * 2);
    uint16_t *ddo = dev_from(do16, nq * 2);
    int32_t *dss = dev_from(ss, (size_t)T * 4);
    guarded go = guarded_new(nq, 2), gl = guarded_new(nl, 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_train_attention_forward(guarded_ptr(go), guarded_ptr(gl), dq16, dk16, dv16,
                                                  dss, T, H, Hkv, hd, NULL, &err),
                 QRL_OK, "%s", err.msg);
    guarded_fetch(go, o16, "out");
    guarded_fetch(gl, lse, "lse");
    bf16_to_f32_host(o16, out, nq);
    qrl_train_attention_forward(out_ref, lse_ref, q, k, v, seg, T, H, Hkv, hd);
    double eo = rel_err(out, out_ref, nq), el = 0;
    for (size_t i = 0; i < nl; i++) {
        double d = isnan(lse[i]) ? INFINITY : fabs((double)lse[i] - lse_ref[i]);
        if (d > el) el = d;
    }

    /* backward from the GPU's out and lse */
    uint16_t *dev_out = dev_from(o16, nq * 2);
    float *dlse = dev_from(lse, nl * 4), *work;
    size_t wf = qrl_cuda_train_attention_work_floats(T, H);
    cr_assert(wf >= nl);
    cr_assert_eq(qrl_cuda_malloc((void **)&work, wf * 4, NULL), QRL_OK);
    guarded gq = guarded_zero(nq), gk = guarded_zero(nk), gv = guarded_zero(nk);
    for (int rep = 0; rep <= twice; rep++)
        cr_assert_eq(qrl_cuda_train_attention_backward(guarded_ptr(gq), guarded_ptr(gk), guarded_ptr(gv),
                                                       ddo, dq16, dk16, dv16, dev_out, dlse, dss, T,
                                                       H, Hkv, hd, work, NULL, &err),
                     QRL_OK, "%s", err.msg);
    guarded_fetch(gq, dq, "dq");
    guarded_fetch(gk, dk, "dk");
    guarded_fetch(gv, dv, "dv");
    qrl_train_attention_backward(dq_ref, dk_ref, dv_ref, dout, q, k, v, out_ref, lse_ref, seg, T, H,
                                 Hkv, hd);
    if (twice) {
        for (size_t i = 0; i < nq; i++) dq_ref[i] *= 2.0f;
        for (size_t i = 0; i < nk; i++) dk_ref[i] *= 2.0f, dv_ref[i] *= 2.0f;
    }
    double eq = rel_err(dq, dq_ref, nq), ek = rel_err(dk, dk_ref, nk), ev = rel_err(dv, dv_ref, nk);
    fprintf(stderr,
            "train attn T=%d segs=%d H=%d Hkv=%d hd=%d%s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
            T, nseg, H, Hkv, hd, twice ? " (x2)" : "", eo, el, eq, ek, ev);
    cr_assert(eo <= OUT_TOL, "T=%d H=%d Hkv=%d hd=%d: out err %g", T, H, Hkv, hd, eo);
    cr_assert(el <= LSE_TOL, "T=%d H=%d Hkv=%d hd=%d: lse err %g", T, H, Hkv, hd, el);
    cr_assert(eq <= GRAD_TOL, "T=%d H=%d Hkv=%d hd=%d: dq err %g", T, H, Hkv, hd, eq);
    cr_assert(ek <= GRAD_TOL, "T=%d H=%d Hkv=%d hd=%d: dk err %g", T, H, Hkv, hd, ek);
    cr_assert(ev <= GRAD_TOL, "T=%d H=%d Hkv=%d hd=%d: dv err %g", T, H, Hkv, hd, ev);

    qrl_cuda_free(dq16); qrl_cuda_free(dk16); qrl_cuda_free(dv16); qrl_cuda_free(ddo);
    qrl_cuda_free(dss); qrl_cuda_free(dev_out); qrl_cuda_free(dlse); qrl_cuda_free(work);
    free(seg); free(ss); free(q16); free(k16); free(v16); free(do16); free(o16);
    free(q); free(k); free(v); free(dout); free(out_ref); free(lse_ref); free(out); free(lse);
    free(dq_ref); free(dk_ref); free(dv_ref); free(dq); free(dk); free(dv);
}

#define CASE(H, Hkv, hd, twice, seed, ...)                                                   \
    do {                                                                                     \
        const int lens_[] = {__VA_ARGS__};                                                   \
        attn_case(lens_, (int)(sizeof lens_ / sizeof *lens_), H, Hkv, hd, twice, seed);      \
    } while (0)

/* head_dim 8, 16, 32, 256: the CUDA-core path */
Test(cuda_train_attn, simple_path) {
    require_gpu();
    CASE(2, 1, 8, 0, 1, 1);
    CASE(4, 2, 32, 1, 2, 37);
    CASE(2, 2, 8, 0, 3, 3, 400, 1, 1, 595);        /* T=1000, ratio 1 */
    CASE(14, 2, 16, 0, 4, 120, 1, 79);             /* ratio 7 */
    CASE(6, 1, 32, 0, 5, 1, 50, 3, 146);           /* T=200, ratio 6 */
    CASE(4, 2, 256, 0, 6, 37, 26);
}

/* head_dim 64: tensor cores */
Test(cuda_train_attn, tc_hd64) {
    require_gpu();
    CASE(2, 1, 64, 0, 11, 1);
    CASE(4, 2, 64, 1, 12, 37);
    CASE(6, 1, 64, 0, 13, 1, 50, 3, 146);          /* T=200, ratio 6 */
    CASE(14, 2, 64, 0, 14, 64, 64, 1, 871);        /* T=1000, ratio 7, tile-aligned bounds */
    CASE(2, 2, 64, 0, 15, 5, 700, 17, 1, 277);     /* ratio 1 */
}

/* head_dim 128: tensor cores */
Test(cuda_train_attn, tc_hd128) {
    require_gpu();
    CASE(2, 2, 128, 0, 21, 1);
    CASE(4, 2, 128, 1, 22, 37);
    CASE(6, 1, 128, 0, 23, 130, 70);               /* T=200, ratio 6 */
    CASE(14, 2, 128, 0, 24, 333, 1, 2, 600, 64);   /* T=1000, ratio 7 */
    CASE(2, 1, 128, 0, 25, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 190); /* many 1-token segments */
}

/* one long sequence: every tile of the causal triangle, the full-tile fast path */
Test(cuda_train_attn, long_sequence) {
    require_gpu();
    CASE(4, 2, 128, 0, 31, 2048);
    CASE(4, 1, 64, 0, 32, 2048);
}

Test(cuda_train_attn, errors) {
    qrl_error err;
    uint16_t b16 = 0;
    float f = 0;
    int32_t s = 0;
    cr_assert_eq(qrl_cuda_train_attention_forward(&b16, &f, &b16, &b16, &b16, &s, 8, 6, 4, 64, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "H=6") && strstr(err.msg, "Hkv=4"), "%s", err.msg);
    cr_assert_eq(qrl_cuda_train_attention_backward(&f, &f, &f, &b16, &b16, &b16, &b16, &b16, &f, &s, 8,
                                                   6, 4, 64, &f, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_train_attention_forward(&b16, &f, &b16, &b16, &b16, &s, 0, 2, 1, 64, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_train_attention_forward(&b16, &f, &b16, &b16, &b16, &s, 8, 2, 1, 63, NULL, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert_eq(qrl_cuda_train_attention_backward(&f, &f, &f, &b16, &b16, &b16, &b16, &b16, &f, &s, 8,
                                                   2, 1, 258, &f, NULL, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "258"), "%s", err.msg);
    /* the tensor-core path moves 16-byte chunks */
    static uint16_t al[64] __attribute__((aligned(16)));
    cr_assert_eq(qrl_cuda_train_attention_forward(al, &f, al + 1, al, al, &s, 8, 2, 1, 64, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "aligned"), "%s", err.msg);
}
