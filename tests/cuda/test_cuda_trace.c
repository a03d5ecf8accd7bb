/* TRACE recording on the GPU (model/trace_rec_cuda.h, kernels/cuda/trace_capture.cuh)
 * against the CPU recorder's reference, qrl_trace_capture (kernels/cpu/trace.h).
 *
 * Tests:
 *   - the capture kernel on fresh random vectors of the sites' lengths (stories260K's 8,
 *     64, 172, Qwen3-1.7B's 128, 2048, 6144, and odd ones), F32 and BF16 sources, several
 *     vectors per row (k / v heads), rows that are not targets, ordinary values, wide
 *     block spreads, zeros, a NaN / Inf block, subnormal and huge rows: S_enc, every block
 *     scale and every LSB bit for bit, the tap copy equal to the input, nothing else written;
 *   - k / v with the fp4 KV cache: the store's TRACE copy (kv_quant.cuh) captured with the
 *     recorder's plans (K+V, K, V; head_dim 8, 64, 72, 128): records equal qrl_trace_capture
 *     of the F32 vectors the store quantized, bit for bit;
 *   - the w4a4 activation quantizers' TRACE sink (fused RMSNorm, fused SwiGLU, the row
 *     quantizer on F32 and BF16 rows; widths of both launch shapes, registers and two
 *     passes): each target row's record equals qrl_trace_capture of the F32 values the
 *     producer quantized (its x_out) bit for bit, and is the record of the codes, scales and
 *     S_enc it wrote; the tap is x_out; no other byte of the store changes; the producer's
 *     outputs do not change with the sink; a sink without its row map is refused;
 *   - the recorder in the CUDA forward (stories260K, int8 KV so K / V pass through F32
 *     rows; every site of the default spec), BF16 weights and w4a4-nvfp4 (there the linear
 *     sites' records are written by the engine's own quantizers), decode steps replayed as
 *     CUDA graphs and eager, a 4-token device window so records go to the host in many
 *     batches: every record equals qrl_trace_capture of the vector the tap saw, records
 *     number the targeted tokens (prefill's last row, one per decode row), a truncation and
 *     re-prefill mid-response keeps the kept tokens' records, and record k's layer-0 attn_in
 *     is rmsnorm(embedding of the token fed) (alignment: within BF16 rounding for BF16;
 *     within 1e-5 of the max for w4a4, i.e. the F32 vector the engine quantized, not xb);
 *     w4a4 with fp4 KV too (k / v records copied from the cache's own);
 *   - the scheduler on the CPU engine with the CPU recorder and on the CUDA engine with the
 *     CUDA recorder (w4a4-nvfp4, kv fp4: linear and K / V sites), with
 *     a weight swap mid-run (re-prefill): the same layout and token counts, every record
 *     equal to quantizing its own engine's tapped vector; the share of equal scales / LSBs
 *     between the engines over the tokens both decoded alike is printed (their activations
 *     differ in rounding, so it is an observation, not a bound). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "cpu/trace.h"
#include "cuda/kv_quant.cuh"
#include "cuda/norm.cuh"
#include "cuda/nvfp4_quant.cuh"
#include "cuda/pointwise.cuh"
#include "cuda/trace_capture.cuh"
#include "cuda_test_util.h"
#include "model/forward_cuda.h"
#include "model/trace_rec_cuda.h"
#include "rollout/scheduler.h"
#include "unit/sched_test_util.h"

/* ---- the capture kernel ----------------------------------------------------------------- */

static int64_t site_bytes(int len) { return 4 + (len + 15) / 16 + (len + 7) / 8; }

/* Value j of a vector under pattern `mode` (0 ordinary, 1 wide spread across blocks,
 * 2 zeros and a non-finite block, 3 subnormal, 4 huge). */
static float pattern(int mode, int v, int j, uint64_t *s) {
    float u = rng_unif(s);
    switch (mode) {
    case 1: return u * ldexpf(1.0f, (int)((j / 16 * 7 + v * 3) % 41) - 20);
    case 2:
        if (v % 3 == 0) return 0.0f;
        if (v % 3 == 1 && j == 5) return v % 2 ? NAN : -INFINITY;
        return u;
    case 3: return u * 1e-39f;
    case 4: return u * 3e38f;
    default: return u * 3.0f;
    }
}

static void check_capture(int len, int n_vec, int n_rows, bool bf16, int mode, uint64_t seed) {
    uint64_t s = seed;
    int64_t step = site_bytes(len), slab_off = 12, stride = (int64_t)n_vec * len + 3;
    int64_t slab = (slab_off + n_vec * step + 3) & ~3, entries = 2 * n_rows + 1;
    int64_t tap_floats = (int64_t)n_vec * len + 5, tap_off = 5;
    size_t nx = (size_t)n_rows * stride;
    float *xf = calloc(nx, sizeof *xf);
    uint16_t *xb = calloc(nx, sizeof *xb);
    for (int r = 0; r < n_rows; r++)
        for (int v = 0; v < n_vec; v++)
            for (int j = 0; j < len; j++) {
                size_t i = (size_t)r * stride + (size_t)v * len + j;
                xf[i] = pattern(mode, v + r, j, &s);
                if (bf16) xb[i] = qrl_cpu_bf16_store(xf[i]), xf[i] = qrl_cpu_bf16_load(xb[i]);
            }
    int64_t *dst = malloc((size_t)n_rows * sizeof *dst);
    for (int r = 0; r < n_rows; r++) dst[r] = r % 3 == 1 ? -1 : (r * 7 + 3) % entries;
    uint8_t *zero = calloc((size_t)(entries * slab), 1);
    float *tz = calloc((size_t)(entries * tap_floats), sizeof(float));
    qrl_cuda_trace_ctl ctl = {.store = dev_from(zero, entries * slab),
                              .taps = dev_from(tz, entries * tap_floats * 4), .slab = slab,
                              .tap_floats = tap_floats};
    qrl_cuda_trace_capture_args a = {
        .ctl = dev_from(&ctl, sizeof ctl), .dst = dev_from(dst, (size_t)n_rows * 8),
        .src = bf16 ? dev_from(xb, nx * 2) : dev_from(xf, nx * 4), .src_bf16 = bf16,
        .row_stride = stride, .n_rows = n_rows, .n_vec = n_vec, .len = len,
        .slab_off = slab_off, .slab_step = step, .tap_off = tap_off};
    qrl_error err;
    cr_assert_eq(qrl_cuda_trace_capture(&a, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_synchronize(&err), QRL_OK, "%s", err.msg);
    uint8_t *store = malloc((size_t)(entries * slab));
    float *taps = malloc((size_t)(entries * tap_floats) * 4);
    cr_assert_eq(qrl_cuda_copy_to_host(store, ctl.store, entries * slab, &err), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(taps, ctl.taps, entries * tap_floats * 4, &err), QRL_OK);
    uint8_t *written = calloc((size_t)entries, 1), codes[4096], sc[1024], bits[2048];
    for (int r = 0; r < n_rows; r++) {
        if (dst[r] < 0) continue;
        written[dst[r]] = 1;
        for (int v = 0; v < n_vec; v++) {
            const float *x = xf + (size_t)r * stride + (size_t)v * len;
            float genc;
            qrl_trace_capture(x, (uint32_t)len, codes, sc, bits, &genc);
            const uint8_t *e = store + dst[r] * slab + slab_off + v * step;
            const char *what = bf16 ? "bf16" : "f32";
            cr_assert_eq(memcmp(e, &genc, 4), 0, "len %d mode %d %s row %d vec %d: S_enc", len,
                         mode, what, r, v);
            cr_assert_eq(memcmp(e + 4, sc, (len + 15) / 16), 0,
                         "len %d mode %d %s row %d vec %d: block scales", len, mode, what, r, v);
            cr_assert_eq(memcmp(e + 4 + (len + 15) / 16, bits, (len + 7) / 8), 0,
                         "len %d mode %d %s row %d vec %d: LSBs", len, mode, what, r, v);
            cr_assert_eq(memcmp(taps + dst[r] * tap_floats + tap_off + (int64_t)v * len, x,
                                (size_t)len * 4), 0, "tap of row %d vec %d", r, v);
        }
        /* the slab's bytes outside the site stay as they were */
        const uint8_t *e = store + dst[r] * slab;
        for (int64_t b = 0; b < slab; b++)
            if (b < slab_off || b >= slab_off + n_vec * step)
                cr_assert_eq(e[b], 0, "byte %lld of entry %lld written", (long long)b,
                             (long long)dst[r]);
    }
    for (int64_t i = 0; i < entries; i++)
        if (!written[i])
            for (int64_t b = 0; b < slab; b++)
                cr_assert_eq(store[i * slab + b], 0, "entry %lld (no target) written", (long long)i);
    qrl_cuda_free(ctl.store); qrl_cuda_free(ctl.taps); qrl_cuda_free((void *)a.ctl);
    qrl_cuda_free((void *)a.dst); qrl_cuda_free((void *)a.src);
    free(xf); free(xb); free(dst); free(zero); free(tz); free(store); free(taps); free(written);
}

Test(cuda_trace, capture_kernel_equals_qrl_trace_capture) {
    require_gpu();
    static const int LENS[] = {8, 64, 172, 128, 2048, 6144, 5, 17, 33};
    uint64_t seed = 11;
    for (size_t i = 0; i < sizeof LENS / sizeof *LENS; i++)
        for (int mode = 0; mode < 5; mode++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                int len = LENS[i], n_vec = len <= 128 ? 4 : 1, rows = len >= 2048 ? 5 : 9;
                check_capture(len, n_vec, rows, bf16, mode, seed++);
            }
}

/* ---- k / v from the fp4 KV cache's own records ------------------------------------------- */

/* The fp4 KV store (kv_quant.cuh) with its TRACE copy on fresh K/V rows, then the capture
 * from that copy with the plans the recorder makes (K and V heads in one launch, K only,
 * V only): every target (row, head) record equals qrl_trace_capture of the F32 vector the
 * store quantized, the tap is that vector. */
static void check_kv_fp4(int hd, int kvh, int n, uint64_t seed) {
    uint64_t s = seed;
    int bs = 16, nblk = (n + bs - 1) / bs;
    size_t recs = (size_t)nblk * bs * kvh, sf = (size_t)qrl_cuda_kvq_scale_floats(QRL_CUDA_KVQ_FP4, hd);
    size_t nkv = (size_t)n * 2 * kvh * hd, vb = qrl_cuda_kvq_fp4_copy_bytes(hd);
    float *kv = malloc(nkv * 4);
    for (size_t i = 0; i < nkv; i++) kv[i] = pattern((int)(i / hd % 5 == 4 ? 2 : i / hd % 3), (int)(i / hd), (int)(i % hd), &s);
    int32_t *tables = malloc((size_t)nblk * 4), *rseq = calloc((size_t)n, 4), *rpos = malloc((size_t)n * 4);
    for (int b = 0; b < nblk; b++) tables[b] = nblk - 1 - b;
    for (int r = 0; r < n; r++) rpos[r] = r;
    uint8_t *z = calloc(recs * (hd / 2 + sf * 4) + (size_t)n * 2 * kvh * vb, 1);
    qrl_cuda_kvq_layer c = {.format = QRL_CUDA_KVQ_FP4, .block_tables = dev_from(tables, (size_t)nblk * 4),
                            .max_blocks_per_seq = nblk, .block_size = bs, .n_kv_heads = kvh, .head_dim = hd};
    for (int w = 0; w < 2; w++) {
        c.codes[w] = dev_from(z, recs * (size_t)hd / 2);
        c.scales[w] = dev_from(z, recs * sf * 4);
    }
    float *dkv = dev_from(kv, nkv * 4);
    uint8_t *copy = dev_from(z, (size_t)n * 2 * kvh * vb);
    qrl_error err;
    int32_t *drs = dev_from(rseq, (size_t)n * 4), *drp = dev_from(rpos, (size_t)n * 4);
    cr_assert_eq(qrl_cuda_kv_store_copy(&c, dkv, drs, drp, n, copy, NULL, &err), QRL_OK, "%s", err.msg);
    int64_t step = site_bytes(hd), off = 8, slab = (off + 2 * kvh * step + 3) & ~3;
    int64_t tap_floats = 2 * (int64_t)kvh * hd, entries = n + 2;
    int64_t *dst = malloc((size_t)n * 8);
    for (int r = 0; r < n; r++) dst[r] = r % 4 == 2 ? -1 : (r * 3 + 1) % entries;
    for (int plan = 0; plan < 3; plan++) { /* K and V, K only, V only */
        uint8_t *zs = calloc((size_t)(entries * slab), 1);
        float *zt = calloc((size_t)(entries * tap_floats), 4);
        qrl_cuda_trace_ctl ctl = {.store = dev_from(zs, entries * slab),
                                  .taps = dev_from(zt, entries * tap_floats * 4), .slab = slab,
                                  .tap_floats = tap_floats};
        int vec0 = plan == 2 ? kvh : 0, nvec = plan == 0 ? 2 * kvh : kvh;
        qrl_cuda_trace_capture_args a = {
            .ctl = dev_from(&ctl, sizeof ctl), .dst = dev_from(dst, (size_t)n * 8),
            .src = dkv + (size_t)vec0 * hd, .row_stride = 2 * (int64_t)kvh * hd, .n_rows = n,
            .n_vec = nvec, .len = hd, .slab_off = off + vec0 * step, .slab_step = step,
            .tap_off = (int64_t)vec0 * hd, .fp4_rec = copy, .fp4_row_vecs = 2 * kvh,
            .fp4_vec0 = vec0, .fp4_rec_bytes = (int64_t)vb};
        cr_assert_eq(qrl_cuda_trace_capture(&a, NULL, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_synchronize(&err), QRL_OK, "%s", err.msg);
        uint8_t *store = malloc((size_t)(entries * slab));
        float *taps = malloc((size_t)(entries * tap_floats) * 4);
        cr_assert_eq(qrl_cuda_copy_to_host(store, ctl.store, entries * slab, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_copy_to_host(taps, ctl.taps, entries * tap_floats * 4, NULL), QRL_OK);
        uint8_t codes[256], sc[32], bits[64];
        for (int r = 0; r < n; r++) {
            if (dst[r] < 0) continue;
            for (int v = vec0; v < vec0 + nvec; v++) {
                const float *x = kv + ((size_t)r * 2 * kvh + v) * hd;
                float genc;
                qrl_trace_capture(x, (uint32_t)hd, codes, sc, bits, &genc);
                const uint8_t *e = store + dst[r] * slab + off + v * step;
                cr_assert_eq(memcmp(e, &genc, 4), 0, "fp4 kv hd %d plan %d row %d vec %d: S_enc", hd, plan, r, v);
                cr_assert_eq(memcmp(e + 4, sc, (size_t)(hd + 15) / 16), 0, "fp4 kv hd %d plan %d row %d "
                             "vec %d: scales", hd, plan, r, v);
                cr_assert_eq(memcmp(e + 4 + (hd + 15) / 16, bits, (size_t)(hd + 7) / 8), 0,
                             "fp4 kv hd %d plan %d row %d vec %d: LSBs", hd, plan, r, v);
                cr_assert_eq(memcmp(taps + dst[r] * tap_floats + (int64_t)v * hd, x, (size_t)hd * 4), 0,
                             "fp4 kv tap row %d vec %d", r, v);
            }
            for (int64_t b = 0; b < slab; b++) /* other heads' and kinds' bytes untouched */
                if (b < off + vec0 * step || b >= off + (vec0 + nvec) * step)
                    cr_assert_eq(store[dst[r] * slab + b], 0, "fp4 kv plan %d: byte %lld written", plan,
                                 (long long)b);
        }
        qrl_cuda_free(ctl.store), qrl_cuda_free(ctl.taps), qrl_cuda_free((void *)a.ctl);
        qrl_cuda_free((void *)a.dst);
        free(zs), free(zt), free(store), free(taps);
    }
    for (int w = 0; w < 2; w++) qrl_cuda_free(c.codes[w]), qrl_cuda_free(c.scales[w]);
    qrl_cuda_free((void *)c.block_tables), qrl_cuda_free(dkv), qrl_cuda_free(copy);
    qrl_cuda_free(drs), qrl_cuda_free(drp);
    free(kv), free(tables), free(rseq), free(rpos), free(z), free(dst);
}

Test(cuda_trace, kv_fp4_records_are_the_caches_own) {
    require_gpu();
    check_kv_fp4(8, 4, 9, 401);    /* stories260K */
    check_kv_fp4(128, 8, 21, 402); /* Qwen3-1.7B */
    check_kv_fp4(72, 2, 17, 403);  /* a partial last block */
    check_kv_fp4(64, 1, 5, 404);
}

/* ---- the w4a4 quantizers' TRACE sink ----------------------------------------------------- */

/* The producers of the w4a4 forward's linear inputs: fused RMSNorm, fused SwiGLU, the
 * standalone quantizer on F32 and on BF16 rows (the attention output). */
enum { P_NORM, P_SWIGLU, P_ROWS_F32, P_ROWS_BF16, P_COUNT };
static const char *const P_NAME[] = {"rmsnorm_nvfp4", "swiglu_nvfp4", "quantize_rows f32",
                                     "quantize_rows bf16"};

/* Run producer p on fresh inputs (rows of n) into a (codes, scales, s_enc, x_out on the
 * device); the inputs are made from seed, so two runs see the same values. */
static void run_producer(int p, int rows, int n, uint64_t seed, const qrl_cuda_nvfp4_act *a) {
    uint64_t s = seed;
    size_t tot = (size_t)rows * n;
    qrl_error err;
    qrl_status st;
    if (p == P_NORM) {
        float *x = malloc(tot * 4), *add = malloc(tot * 4);
        uint16_t *w = malloc((size_t)n * 2);
        rand_f32(x, tot, 3.0f, &s);
        rand_f32(add, tot, 1.0f, &s);
        rand_bf16(w, NULL, (size_t)n, 1.0f, 0.5f, &s);
        for (size_t i = 0; i < tot; i += 97) x[i] *= 50.0f;
        float *dx = dev_from(x, tot * 4), *dadd = dev_from(add, tot * 4);
        uint16_t *dw = dev_from(w, (size_t)n * 2);
        st = qrl_cuda_rmsnorm_nvfp4(NULL, dx, dadd, NULL, dw, rows, n, 1e-5f, a, NULL, &err);
        cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
        qrl_cuda_free(dx), qrl_cuda_free(dadd), qrl_cuda_free(dw);
        free(x), free(add), free(w);
    } else if (p == P_SWIGLU) {
        float *gu = malloc(2 * tot * 4);
        rand_f32(gu, 2 * tot, 4.0f, &s);
        for (size_t i = 0; i < 2 * tot; i += 131) gu[i] *= 30.0f;
        float *dgu = dev_from(gu, 2 * tot * 4);
        st = qrl_cuda_swiglu_nvfp4(NULL, dgu, rows, n, a, NULL, &err);
        cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
        qrl_cuda_free(dgu), free(gu);
    } else {
        float *x = malloc(tot * 4);
        uint16_t *xb = malloc(tot * 2);
        rand_f32(x, tot, 2.0f, &s);
        for (size_t i = 0; i < tot; i += 61) x[i] *= 40.0f;
        for (size_t i = 0; i < tot; i++) xb[i] = qrl_cpu_bf16_store(x[i]);
        void *dx = p == P_ROWS_BF16 ? dev_from(xb, tot * 2) : dev_from(x, tot * 4);
        st = qrl_cuda_nvfp4_quantize_rows(a, dx, p == P_ROWS_BF16, rows, n, NULL, &err);
        cr_assert_eq(qrl_cuda_synchronize(NULL), QRL_OK);
        qrl_cuda_free(dx), free(x), free(xb);
    }
    cr_assert_eq(st, QRL_OK, "%s: %s", P_NAME[p], err.msg);
}

/* Producer p with a TRACE sink (targets: some rows, a record at an odd slab offset, taps):
 * each target's record equals qrl_trace_capture of the F32 values the producer quantized
 * (x_out), and is the record of the codes it wrote (S_enc, scales, code LSBs); the tap is
 * x_out; nothing else in the store is written; the producer's outputs are those of a run
 * without the sink. */
static void check_sink(int p, int rows, int n, uint64_t seed) {
    int cb = qrl_cuda_nvfp4_code_bytes(n), nb = qrl_cuda_nvfp4_blocks(n), nbits = (n + 7) / 8;
    int64_t step = site_bytes(n), off = 7, slab = (off + step + 5 + 3) & ~3, entries = 2 * rows + 1;
    int64_t tap_floats = n + 3, tap_off = 3;
    size_t tot = (size_t)rows * n;
    uint8_t *zero = calloc((size_t)(entries * slab), 1), *z = calloc(tot * 4, 1);
    float *tz = calloc((size_t)(entries * tap_floats), 4);
    int64_t *dst = malloc((size_t)rows * 8);
    for (int r = 0; r < rows; r++) dst[r] = r % 3 == 1 ? -1 : entries - 1 - 2 * r; /* distinct, out of order */
    qrl_cuda_trace_ctl ctl = {.store = dev_from(zero, entries * slab),
                              .taps = dev_from(tz, entries * tap_floats * 4), .slab = slab,
                              .tap_floats = tap_floats};
    qrl_cuda_nvfp4_act a[2];
    uint8_t *hc[2], *hs[2];
    float *he[2], *hx[2];
    for (int k = 0; k < 2; k++) {
        a[k] = (qrl_cuda_nvfp4_act){.codes = dev_from(z, (size_t)rows * cb),
                                    .scales = dev_from(z, (size_t)rows * nb),
                                    .s_enc = dev_from(z, (size_t)rows * 4), .x_out = dev_from(z, tot * 4)};
        if (k) {
            a[k].trace_ctl = dev_from(&ctl, sizeof ctl);
            a[k].trace_dst = dev_from(dst, (size_t)rows * 8);
            a[k].trace_off = off;
            a[k].trace_tap_off = tap_off;
        }
        run_producer(p, rows, n, seed, &a[k]);
        hc[k] = malloc((size_t)rows * cb), hs[k] = malloc((size_t)rows * nb);
        he[k] = malloc((size_t)rows * 4), hx[k] = malloc(tot * 4);
        cr_assert_eq(qrl_cuda_copy_to_host(hc[k], a[k].codes, (size_t)rows * cb, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_copy_to_host(hs[k], a[k].scales, (size_t)rows * nb, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_copy_to_host(he[k], a[k].s_enc, (size_t)rows * 4, NULL), QRL_OK);
        cr_assert_eq(qrl_cuda_copy_to_host(hx[k], a[k].x_out, tot * 4, NULL), QRL_OK);
    }
    const char *what = P_NAME[p];
    cr_assert(memcmp(hc[0], hc[1], (size_t)rows * cb) == 0 && memcmp(hs[0], hs[1], (size_t)rows * nb) == 0 &&
              memcmp(he[0], he[1], (size_t)rows * 4) == 0 && memcmp(hx[0], hx[1], tot * 4) == 0,
              "%s n=%d: outputs change with the TRACE sink", what, n);
    uint8_t *store = malloc((size_t)(entries * slab)), *written = calloc((size_t)entries, 1);
    float *taps = malloc((size_t)(entries * tap_floats) * 4);
    cr_assert_eq(qrl_cuda_copy_to_host(store, ctl.store, entries * slab, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_copy_to_host(taps, ctl.taps, entries * tap_floats * 4, NULL), QRL_OK);
    uint8_t *codes = malloc((size_t)cb), *sc = malloc((size_t)nb), *bits = malloc((size_t)nbits);
    for (int r = 0; r < rows; r++) {
        if (dst[r] < 0) continue;
        written[dst[r]] = 1;
        const float *x = hx[1] + (size_t)r * n;
        float genc;
        qrl_trace_capture(x, (uint32_t)n, codes, sc, bits, &genc);
        const uint8_t *e = store + dst[r] * slab + off;
        cr_assert_eq(memcmp(e, &genc, 4), 0, "%s n=%d row %d: S_enc", what, n, r);
        cr_assert_eq(memcmp(e + 4, sc, (size_t)nb), 0, "%s n=%d row %d: block scales", what, n, r);
        cr_assert_eq(memcmp(e + 4 + nb, bits, (size_t)nbits), 0, "%s n=%d row %d: LSBs", what, n, r);
        /* the record of the codes the producer wrote */
        cr_assert_eq(memcmp(e, &he[1][r], 4), 0, "%s row %d: S_enc not the engine's", what, r);
        cr_assert_eq(memcmp(e + 4, hs[1] + (size_t)r * nb, (size_t)nb), 0, "%s row %d: scales", what, r);
        for (int j = 0; j < n; j++)
            cr_assert_eq(e[4 + nb + j / 8] >> (j % 8) & 1,
                         qrl_nibble_get(hc[1] + (size_t)r * cb, j) & 1, "%s row %d: LSB %d not the "
                         "engine's code's", what, r, j);
        cr_assert_eq(memcmp(taps + dst[r] * tap_floats + tap_off, x, (size_t)n * 4), 0,
                     "%s row %d: tap", what, r);
        for (int64_t b = 0; b < slab; b++)
            if (b < off || b >= off + step)
                cr_assert_eq(store[dst[r] * slab + b], 0, "%s: byte %lld of entry %lld written", what,
                             (long long)b, (long long)dst[r]);
    }
    for (int64_t i = 0; i < entries; i++)
        if (!written[i])
            for (int64_t b = 0; b < slab; b++)
                cr_assert_eq(store[i * slab + b], 0, "%s: entry %lld (no target) written", what,
                             (long long)i);
    for (int k = 0; k < 2; k++) {
        qrl_cuda_free(a[k].codes), qrl_cuda_free(a[k].scales), qrl_cuda_free(a[k].s_enc);
        qrl_cuda_free(a[k].x_out);
        free(hc[k]), free(hs[k]), free(he[k]), free(hx[k]);
    }
    qrl_cuda_free((void *)a[1].trace_ctl), qrl_cuda_free((void *)a[1].trace_dst);
    qrl_cuda_free(ctl.store), qrl_cuda_free(ctl.taps);
    free(zero), free(z), free(tz), free(dst), free(store), free(written), free(taps), free(codes), free(sc),
        free(bits);
}

Test(cuda_trace, w4a4_quantizers_write_the_records_of_their_codes) {
    require_gpu();
    /* stories260K's 64 / 172, Qwen3-1.7B's 2048 / 6144, odd ones, and widths past every
     * launch shape's registers (two passes over the values) */
    static const int LENS[] = {64, 172, 2048, 6144, 100, 17, 9000, 40000};
    uint64_t seed = 301;
    for (int p = 0; p < P_COUNT; p++)
        for (size_t i = 0; i < sizeof LENS / sizeof *LENS; i++) {
            check_sink(p, LENS[i] >= 9000 ? 3 : 7, LENS[i], seed++);
        }
    qrl_error err;
    float *d = dev_from((float[4]){1, 2, 3, 4}, 16);
    qrl_cuda_nvfp4_act a = {.trace_ctl = (const qrl_cuda_trace_ctl *)d};
    cr_assert_eq(qrl_cuda_nvfp4_quantize_rows(&a, d, false, 1, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "row map") != NULL, "%s", err.msg);
    cr_assert_eq(qrl_cuda_rmsnorm_nvfp4(NULL, d, NULL, NULL, (uint16_t *)d, 1, 4, 1e-5f, &a, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_cuda_swiglu_nvfp4(NULL, d, 1, 2, &a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    qrl_cuda_free(d);
}

/* ---- the recorder in the CUDA forward ------------------------------------------------------ */

typedef struct tap_rec {
    const qrl_trace_buf *buf;
    uint32_t token, site, n;
    float *x;
} tap_rec;

typedef struct tap_log {
    tap_rec *r;
    size_t n, cap;
} tap_log;

static void on_tap(void *ctx, const qrl_trace_buf *buf, uint32_t token, uint32_t site,
                   const float *x, uint32_t n) {
    tap_log *t = ctx;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        t->r = realloc(t->r, t->cap * sizeof *t->r);
    }
    t->r[t->n++] = (tap_rec){buf, token, site, n, st_dup(x, n * sizeof *x)};
}

static void tap_log_free(tap_log *t) {
    for (size_t i = 0; i < t->n; i++) free(t->r[i].x);
    free(t->r);
    memset(t, 0, sizeof *t);
}

/* The vector last tapped for (buf, token, site) (a rewrite replaces the earlier one). */
static const tap_rec *tap_find(const tap_log *t, const qrl_trace_buf *buf, uint32_t k, uint32_t s) {
    for (size_t i = t->n; i-- > 0;)
        if (t->r[i].buf == buf && t->r[i].token == k && t->r[i].site == s) return &t->r[i];
    return NULL;
}

/* Every record of buf [0, n) equals qrl_trace_capture of its tapped vector; returns the
 * entries checked. */
static int check_buf(const tap_log *t, const qrl_trace_buf *buf, uint32_t n, const char *what) {
    cr_assert_eq(qrl_trace_buf_n_tokens(buf), n, "%s: %u records, expected %u", what,
                 qrl_trace_buf_n_tokens(buf), n);
    uint32_t ns = qrl_trace_layout_n_sites(qrl_trace_buf_layout(buf));
    int checked = 0;
    for (uint32_t k = 0; k < n; k++)
        for (uint32_t s = 0; s < ns; s++) {
            const tap_rec *h = tap_find(t, buf, k, s);
            cr_assert_not_null(h, "%s: no vector tapped for token %u site %u", what, k, s);
            qrl_trace_entry e;
            qrl_error err;
            cr_assert_eq(qrl_trace_buf_entry(buf, k, s, &e, &err), QRL_OK, "%s", err.msg);
            cr_assert_eq(e.len, h->n);
            uint8_t codes[4096], sc[1024], bits[2048];
            float genc;
            qrl_trace_capture(h->x, h->n, codes, sc, bits, &genc);
            cr_assert_eq(memcmp(&genc, &e.global_enc, 4), 0, "%s token %u site %u S_enc", what, k, s);
            cr_assert_eq(memcmp(sc, e.scales, qrl_nvfp4_blocks(h->n)), 0,
                         "%s token %u site %u scales", what, k, s);
            cr_assert_eq(memcmp(bits, e.bits, (h->n + 7) / 8), 0, "%s token %u site %u LSBs",
                         what, k, s);
            checked++;
        }
    return checked;
}

/* Record k's layer-0 attn_in is the rmsnorm of the embedding of `fed`: within BF16
 * rounding and the GPU's summation order (tol 0.02 of the max), or, for the F32 vector a
 * w4a4 engine quantizes, within F32 rounding (tol 1e-5: a BF16 rounding of it, or the
 * codes' values the GEMM reads, are 1e-3 .. 1e-1 away). */
static void check_aligned(const qrl_model *m, const tap_log *t, const qrl_trace_buf *buf,
                          uint32_t k, int32_t fed, double tol) {
    int s0 = qrl_trace_layout_find(qrl_trace_buf_layout(buf), 0, QRL_TRACE_SITE_ATTN_IN, 0);
    const tap_rec *h = tap_find(t, buf, k, (uint32_t)s0);
    cr_assert_not_null(h);
    int D = m->cfg.dim;
    float ref[1024];
    qrl_cpu_rmsnorm(ref, m->tok_embedding + (size_t)fed * D, m->layers[0].attn_norm, 1, D,
                    m->cfg.norm_eps);
    double md = 0, mx = 0;
    for (int i = 0; i < D; i++) md = fmax(md, fabs(h->x[i] - ref[i])), mx = fmax(mx, fabs(ref[i]));
    cr_assert_lt(md, tol * mx, "record %u is not the row fed token %d (diff %.3g of %.3g)", k,
                 fed, md, mx);
}

#define NSEQ 3
#define MAXTOK 40

static void forward_recording(bool eager, bool a4, qrl_kv_format kvf) {
    require_gpu();
    if (kvf == QRL_KV_FORMAT_FP4) {
        qrl_scheduler_config probe;
        qrl_scheduler_config_default(&probe);
        probe.device = 0;
        probe.kv_format = kvf;
        qrl_error e;
        if (qrl_scheduler_check_device(&probe, QRL_PRECISION_W4A4_NVFP4, &e) != QRL_OK)
            cr_skip_test("the CUDA engine has no fp4 KV yet: %s", e.msg);
    }
    qrl_model *m = st_load_model();
    const qrl_model_config *c = &m->cfg;
    qrl_error err;
    if (a4) {
        qrl_model_round_bf16(m);
        cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &err), QRL_OK, "%s", err.msg);
    }
    qrl_cuda_forward_desc d = {.max_rows = 16, .max_ctx = c->max_seq_len, .block_size = 16,
                               .n_blocks = 64, .max_seqs = 8, .kv_format = kvf, .eager = eager};
    if (a4) d.precision = QRL_PRECISION_W4A4_NVFP4;
    qrl_cuda_forward *f;
    cr_assert_eq(qrl_cuda_forward_new(c, &d, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_upload(f, m, &err), QRL_OK, "%s", err.msg);
    qrl_trace_sites sites;
    qrl_trace_sites_default(&sites);
    qrl_trace_layout *l;
    cr_assert_eq(qrl_trace_layout_new(&sites, c, true, true, &l, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_trace_layout_n_sites(l), 5 * 4 + 3 * 8);
    qrl_cuda_trace_recorder *rec;
    cr_assert_eq(qrl_cuda_trace_recorder_new(l, c, 8, 16, 4, qrl_cuda_forward_stream(f), &rec,
                                             &err), QRL_OK, "%s", err.msg);
    tap_log taps = {0};
    cr_assert_eq(qrl_cuda_trace_recorder_set_tap(rec, on_tap, &taps, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_set_recorder(f, rec, &err), QRL_OK, "%s", err.msg);

    int seq[NSEQ], n_ids[NSEQ];
    int32_t ids[NSEQ][64];
    qrl_trace_buf *buf[NSEQ];
    static const int PLEN[NSEQ] = {5, 20, 9}; /* 20 > max_rows: two prefill passes */
    for (int i = 0; i < NSEQ; i++) {
        cr_assert_eq(qrl_cuda_forward_seq_new(f, &seq[i], &err), QRL_OK);
        cr_assert_eq(qrl_trace_buf_new(l, MAXTOK, &buf[i], &err), QRL_OK);
        for (int j = 0; j < PLEN[i]; j++) ids[i][j] = 1 + (37 * j + 101 * i) % 500;
        n_ids[i] = PLEN[i];
        qrl_cuda_trace_recorder_clear(rec);
        qrl_cuda_trace_recorder_target(rec, PLEN[i] - 1, buf[i], 0);
        float *lg = malloc((size_t)c->vocab_size * 4);
        cr_assert_eq(qrl_cuda_forward_prefill(f, seq[i], ids[i], PLEN[i], lg, false, &err), QRL_OK,
                     "%s", err.msg);
        ids[i][n_ids[i]++] = qrl_cpu_argmax(lg, c->vocab_size);
        free(lg);
    }
    /* decode steps: row b records token n_gen of its sequence; sequence 1 joins late */
    for (int step = 0; step < 14; step++) {
        int seqs[NSEQ], rows = 0, which[NSEQ];
        int32_t in[NSEQ], out[NSEQ];
        qrl_cuda_trace_recorder_clear(rec);
        for (int i = 0; i < NSEQ; i++) {
            if (i == 1 && step < 3) continue;
            which[rows] = i;
            seqs[rows] = seq[i];
            in[rows] = ids[i][n_ids[i] - 1];
            qrl_cuda_trace_recorder_target(rec, rows, buf[i], (uint32_t)(n_ids[i] - PLEN[i]));
            rows++;
        }
        cr_assert_eq(qrl_cuda_forward_decode(f, seqs, in, rows, NULL, out, NULL, &err), QRL_OK,
                     "%s", err.msg);
        for (int r = 0; r < rows; r++) ids[which[r]][n_ids[which[r]]++] = out[r];
        if (step == 8) {
            /* sequence 2: keep 6 tokens and re-prefill (the sync-boundary rule): the kept
             * tokens keep their records (some still on the device), record 6 is the
             * re-prefill's last row */
            int keep = 6;
            n_ids[2] = PLEN[2] + keep;
            qrl_trace_buf_truncate(buf[2], (uint32_t)keep);
            qrl_cuda_forward_seq_clear(f, seq[2]);
            cr_assert_eq(qrl_cuda_forward_seq_reserve(f, seq[2], n_ids[2] + 20, &err), QRL_OK);
            qrl_cuda_trace_recorder_clear(rec);
            qrl_cuda_trace_recorder_target(rec, n_ids[2] - 1, buf[2], (uint32_t)keep);
            int32_t tok;
            float *lg = malloc((size_t)c->vocab_size * 4);
            cr_assert_eq(qrl_cuda_forward_prefill(f, seq[2], ids[2], n_ids[2], lg, false, &err),
                         QRL_OK, "%s", err.msg);
            tok = qrl_cpu_argmax(lg, c->vocab_size);
            ids[2][n_ids[2]++] = tok;
            free(lg);
        }
    }
    for (int i = 0; i < NSEQ; i++) qrl_cuda_trace_recorder_release(rec, seq[i]);
    cr_assert_eq(qrl_cuda_trace_recorder_sync(rec, &err), QRL_OK, "%s", err.msg);
    int checked = 0;
    for (int i = 0; i < NSEQ; i++) {
        uint32_t n = (uint32_t)(n_ids[i] - PLEN[i]); /* tokens generated = records */
        char what[32];
        snprintf(what, sizeof what, "sequence %d", i);
        checked += check_buf(&taps, buf[i], n, what);
        for (uint32_t k = 0; k < n; k++)
            check_aligned(m, &taps, buf[i], k, ids[i][PLEN[i] + k - 1], a4 ? 1e-5 : 0.02);
    }
    cr_assert_gt(checked, 30 * 44);
    long caps, reps;
    qrl_cuda_forward_graph_stats(f, &caps, &reps);
    if (!eager) cr_assert_gt(reps, 5, "decode steps replayed graphs (%ld)", reps);
    printf("cuda trace forward (%s, kv %s, %s): %d entries equal, graphs captured %ld replayed %ld, "
           "host %.0f us\n", a4 ? "w4a4-nvfp4" : "bf16", qrl_kv_format_name(kvf),
           eager ? "eager" : "graphs", checked, caps, reps,
           qrl_cuda_trace_recorder_host_ns(rec) / 1e3);
    qrl_cuda_forward_set_recorder(f, NULL, &err);
    qrl_cuda_trace_recorder_free(rec);
    for (int i = 0; i < NSEQ; i++) qrl_trace_buf_free(buf[i]);
    qrl_trace_layout_free(l);
    qrl_cuda_forward_free(f);
    tap_log_free(&taps);
    qrl_model_free(m);
}

#define KV_I8 QRL_KV_FORMAT_INT8
Test(cuda_trace, forward_records_equal_requantized_inputs_graphs) { forward_recording(false, false, KV_I8); }
Test(cuda_trace, forward_records_equal_requantized_inputs_eager) { forward_recording(true, false, KV_I8); }
/* w4a4-nvfp4: the linear sites' records come from the engine's quantizers; the tap is the
 * F32 vector they quantized (check_aligned's 1e-5 says it is the F32 norm output, not xb) */
Test(cuda_trace, forward_w4a4_records_are_the_engines_codes_graphs) { forward_recording(false, true, KV_I8); }
Test(cuda_trace, forward_w4a4_records_are_the_engines_codes_eager) { forward_recording(true, true, KV_I8); }
/* and k / v from the fp4 KV cache's own records */
Test(cuda_trace, forward_w4a4_kv_fp4_graphs) { forward_recording(false, true, QRL_KV_FORMAT_FP4); }
Test(cuda_trace, forward_w4a4_kv_fp4_eager) { forward_recording(true, true, QRL_KV_FORMAT_FP4); }

Test(cuda_trace, attach_refuses_sites_the_engine_has_no_vectors_for) {
    require_gpu();
    qrl_model *m = st_load_model();
    qrl_cuda_forward_desc d = {.max_rows = 8, .max_ctx = 64, .block_size = 16, .n_blocks = 8,
                               .max_seqs = 2, .kv_format = QRL_KV_FORMAT_BF16};
    qrl_cuda_forward *f;
    qrl_error err;
    cr_assert_eq(qrl_cuda_forward_new(&m->cfg, &d, &f, &err), QRL_OK, "%s", err.msg);
    qrl_trace_sites sites;
    cr_assert_eq(qrl_trace_sites_parse("layers=deep,sites=k,v", &sites, &err), QRL_OK);
    qrl_trace_layout *l;
    cr_assert_eq(qrl_trace_layout_new(&sites, &m->cfg, false, true, &l, &err), QRL_OK);
    qrl_cuda_trace_recorder *rec;
    cr_assert_eq(qrl_cuda_trace_recorder_new(l, &m->cfg, 2, 8, 4, qrl_cuda_forward_stream(f), &rec,
                                             &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_cuda_forward_set_recorder(f, rec, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "k / v sites") != NULL, "%s", err.msg);
    qrl_cuda_trace_recorder_free(rec);
    qrl_trace_layout_free(l);
    qrl_cuda_forward_free(f);
    qrl_model_free(m);
}

/* ---- the scheduler: CPU recorder vs CUDA recorder --------------------------------------- */

#define MAX_RESP 8

typedef struct sched_run {
    tap_log taps;
    int n_resp, checked;
    struct {
        uint64_t group;
        uint32_t r, n;
        int32_t tok[64];
        uint8_t *slabs; /* [n][record bytes per token]: S_enc, scales, bits per site */
    } resp[MAX_RESP];
} sched_run;

static void on_group(const qrl_scheduler_group_result *res, void *ctx) {
    sched_run *sr = ctx;
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        cr_assert_not_null(o->trace);
        sr->checked += check_buf(&sr->taps, o->trace, (uint32_t)o->n_tokens, "scheduler response");
        cr_assert_lt(sr->n_resp, MAX_RESP);
        const qrl_trace_layout *l = qrl_trace_buf_layout(o->trace);
        size_t per = qrl_trace_layout_record_bytes_per_token(l);
        int i = sr->n_resp++;
        sr->resp[i].group = res->group_id;
        sr->resp[i].r = r;
        sr->resp[i].n = (uint32_t)o->n_tokens;
        memcpy(sr->resp[i].tok, o->tokens, (size_t)o->n_tokens * 4);
        sr->resp[i].slabs = malloc(per * (size_t)o->n_tokens + 1);
        uint8_t *p = sr->resp[i].slabs;
        for (uint32_t k = 0; k < (uint32_t)o->n_tokens; k++)
            for (uint32_t s = 0; s < qrl_trace_layout_n_sites(l); s++) {
                qrl_trace_entry e;
                cr_assert_eq(qrl_trace_buf_entry(o->trace, k, s, &e, NULL), QRL_OK);
                memcpy(p, &e.global_enc, 4), p += 4;
                memcpy(p, e.scales, qrl_nvfp4_blocks(e.len)), p += qrl_nvfp4_blocks(e.len);
                memcpy(p, e.bits, (e.len + 7) / 8), p += (e.len + 7) / 8;
            }
        /* the records pack and decode as the daemon sends them */
        qrl_trace_pack pk;
        qrl_error err;
        cr_assert_eq(qrl_trace_buf_pack(o->trace, (uint32_t)o->n_tokens, 1 << 16, &pk, &err), QRL_OK,
                     "%s", err.msg);
        cr_assert_eq(pk.n_tokens, (uint32_t)o->n_tokens);
        qrl_trace_pack_free(&pk);
    }
}

static const int32_t P1[] = {1, 403, 407, 261, 378, 488, 34, 90};
static const int32_t P2[] = {1, 22};

static void run_sched(const qrl_model *m, const qrl_model *m2, qrl_kv_format kvf, int device,
                      sched_run *sr, uint32_t *n_sites) {
    qrl_scheduler_config c;
    qrl_scheduler_config_default(&c);
    c.max_slots = 3;
    c.kv_format = kvf;
    c.prefill_chunk = 5;
    c.trace_record = true;
    c.max_staleness = 4;
    c.device = device;
    qrl_scheduler *s = NULL;
    qrl_error e;
    cr_assert_eq(qrl_scheduler_new(m, NULL, &c, on_group, sr, &s, &e), QRL_OK, "%s", e.msg);
    qrl_scheduler_trace_set_tap(s, on_tap, &sr->taps);
    const qrl_trace_layout *l = qrl_scheduler_trace_layout(s);
    *n_sites = qrl_trace_layout_n_sites(l);
    static uint32_t ids[2][1024];
    memcpy(ids[device >= 0], qrl_trace_layout_site_ids(l), *n_sites * 4);
    for (uint64_t g = 1; g <= 2; g++) {
        qrl_scheduler_group_desc d = {.group_id = g, .group_size = 2, .prompt = g == 1 ? P1 : P2,
                                      .n_prompt = g == 1 ? 8 : 2, .max_new_tokens = g == 1 ? 14 : 22,
                                      .sampling = {.temperature = 0.0f, .top_p = 1.0f, .seed = 7}};
        cr_assert_eq(qrl_scheduler_submit(s, &d, &e), QRL_OK, "%s", e.msg);
    }
    st_step(s, 6);
    cr_assert_eq(qrl_scheduler_swap_weights(s, m2, 1, &e), QRL_OK, "%s", e.msg);
    st_run(s);
    qrl_scheduler_free(s);
    if (device >= 0)
        cr_assert_eq(memcmp(ids[0], ids[1], *n_sites * 4), 0, "CPU and CUDA layouts differ");
}

Test(cuda_trace, scheduler_cpu_and_cuda_recorders_agree_on_layout_counts_and_codes) {
    require_gpu();
    qrl_model *m = st_load_model(), *m2 = st_load_model();
    qrl_error e;
    st_perturb(m2, 0.02);
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_model_quantize(m2, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    /* fp4 KV (k / v sites too); int8 KV (linear sites only) where a build's CUDA engine
     * refuses fp4 KV */
    qrl_scheduler_config probe;
    qrl_scheduler_config_default(&probe);
    probe.device = 0;
    probe.kv_format = QRL_KV_FORMAT_FP4;
    qrl_kv_format kvf = QRL_KV_FORMAT_FP4;
    if (qrl_scheduler_check_device(&probe, QRL_PRECISION_W4A4_NVFP4, &e) != QRL_OK) {
        kvf = probe.kv_format = QRL_KV_FORMAT_INT8;
        cr_assert_eq(qrl_scheduler_check_device(&probe, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK,
                     "the CUDA engine refuses w4a4-nvfp4: %s", e.msg);
    }
    static sched_run cpu, gpu;
    uint32_t ns_cpu, ns_gpu;
    run_sched(m, m2, kvf, -1, &cpu, &ns_cpu);
    run_sched(m, m2, kvf, 0, &gpu, &ns_gpu);
    cr_assert_eq(ns_cpu, ns_gpu);
    cr_assert_eq(cpu.n_resp, 4);
    cr_assert_eq(gpu.n_resp, 4);
    /* same responses, same token counts; equal-history tokens compared field by field */
    uint64_t same_sc = 0, all_sc = 0, same_bits = 0, all_bits = 0, same_genc = 0, all_genc = 0;
    int common = 0;
    for (int i = 0; i < 4; i++) {
        int j = 0;
        while (j < 4 && (gpu.resp[j].group != cpu.resp[i].group || gpu.resp[j].r != cpu.resp[i].r)) j++;
        cr_assert_lt(j, 4, "response missing on the GPU");
        cr_assert_eq(cpu.resp[i].n, gpu.resp[j].n, "token counts differ");
        const uint8_t *a = cpu.resp[i].slabs, *b = gpu.resp[j].slabs;
        for (uint32_t k = 0; k < cpu.resp[i].n; k++) {
            if (k > 0 && cpu.resp[i].tok[k - 1] != gpu.resp[j].tok[k - 1]) break; /* histories part */
            common++;
            /* walk the sites of the default layout through the byte runs */
            qrl_trace_sites sites;
            qrl_trace_sites_default(&sites);
            qrl_trace_layout *l;
            cr_assert_eq(qrl_trace_layout_new(&sites, &m->cfg, true, kvf == QRL_KV_FORMAT_FP4, &l, &e),
                         QRL_OK);
            for (uint32_t s = 0; s < ns_cpu; s++) {
                uint32_t len = qrl_trace_layout_site_lens(l)[s];
                same_genc += memcmp(a, b, 4) == 0, all_genc++;
                a += 4, b += 4;
                for (int x = 0; x < qrl_nvfp4_blocks(len); x++) same_sc += a[x] == b[x], all_sc++;
                a += qrl_nvfp4_blocks(len), b += qrl_nvfp4_blocks(len);
                for (uint32_t x = 0; x < len; x++)
                    same_bits += ((a[x / 8] ^ b[x / 8]) >> (x % 8) & 1) == 0, all_bits++;
                a += (len + 7) / 8, b += (len + 7) / 8;
            }
            qrl_trace_layout_free(l);
        }
    }
    printf("cuda trace scheduler (w4a4-nvfp4, kv %s): CPU %d / CUDA %d entries equal to their own "
           "vectors; over %d tokens decoded alike: S_enc equal %.4f, block scales %.4f, LSBs %.4f\n",
           qrl_kv_format_name(kvf), cpu.checked, gpu.checked, common, (double)same_genc / fmax(1, all_genc),
           (double)same_sc / fmax(1, all_sc), (double)same_bits / fmax(1, all_bits));
    cr_assert_gt(common, 4);
    for (int i = 0; i < 4; i++) free(cpu.resp[i].slabs), free(gpu.resp[i].slabs);
    tap_log_free(&cpu.taps);
    tap_log_free(&gpu.taps);
    qrl_model_free(m);
    qrl_model_free(m2);
}
