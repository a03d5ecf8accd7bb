/* Quantized paged KV cache on the GPU (kernels/cuda/kv_quant.cuh) against the CPU reference.
 *
 * Store: every record the GPU writes equals the CPU encoder's bytes (qrl_int8_quantize_rows,
 * qrl_kv_fp8_quantize with the sequence's head scale, qrl_kv_int4_quantize, fp4:
 * qrl_nvfp4_quantize_row as qrl_kv_cache_write (S_enc, block scales, codes; the stored
 * 1/S_enc is the IEEE reciprocal, 0 for a vector without a finite nonzero element) and the
 * recorder's copy (qrl_cuda_kv_store_copy) the CPU cache record byte for byte; the int4-
 * protected side records by the INT8 encoder), the fp8 head scales equal the CPU cache's
 * calibration (checked through qrl_kv_cache_gather: decoded GPU records == the CPU cache's
 * rows bit for bit), and every record of a block no sequence owns keeps its poison.
 * Attention: oracle = the CPU's partial softmax-attention (double sums) over the decoded
 * records, main positions and protected positions as two partials merged by
 * qrl_attention_merge (SPEC §3 KV4-RL).  Bound: ||gpu - cpu|| / ||cpu|| <= 1e-2 (BF16
 * output; the tensor-core path also rounds dequantized K/V to BF16: 2^-9 relative). */
#include "cuda_test_util.h"

#include "cuda/kv_quant.cuh"
#include "model/kv_cache.h"

#define ATT_TOL 1e-2
#define POISON 0xA5
#define PASS_ROWS 32 /* positions per sequence per store pass (<= RING_SLACK + 1) */

typedef struct gpu_layer {
    qrl_cuda_kvq_layer c;
    size_t recs, side_recs;
    int cb, sf;
} gpu_layer;

static void *dev_poisoned(size_t bytes) {
    unsigned char *h = malloc(bytes ? bytes : 1);
    memset(h, POISON, bytes ? bytes : 1);
    void *d = dev_from(h, bytes ? bytes : 1);
    free(h);
    return d;
}

static void *host_of(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    cr_assert_eq(qrl_cuda_copy_to_host(h, d, bytes, NULL), QRL_OK);
    return h;
}

/* x for (seq, pos, K|V, head): varied magnitudes per vector, optional specials */
static void fill_rows(float *x, int n, int KV, int hd, uint64_t *rng, int specials) {
    for (int i = 0; i < n * 2 * KV / hd; i++) {
        float mag = 0.05f + 4.0f * (float)((rng_next(rng) >> 40) % 1000) / 1000.0f;
        float *v = x + (size_t)i * hd;
        rand_f32(v, hd, mag, rng);
        if (!specials) continue;
        switch (i % 7) {
        case 1: v[0] = NAN; break;
        case 2: v[hd - 1] = INFINITY; v[0] = -INFINITY; break;
        case 3: for (int d = 0; d < hd; d++) v[d] = 0.0f; break;
        case 4: for (int d = 0; d < hd && d < 32; d++) v[d] = 1.25f; break; /* constant group */
        case 5: v[1] = 1e30f; break;
        default: break;
        }
    }
}

static void kv_case(qrl_kv_format fmt, int H, int KVH, int hd, int bs, int n_seqs, const int *lens,
                    int sink, int recent, int specials, uint64_t seed) {
    qrl_error err;
    int KV = KVH * hd, max_len = 0, total_blocks = 3;
    for (int s = 0; s < n_seqs; s++) {
        if (lens[s] > max_len) max_len = lens[s];
        total_blocks += (lens[s] + bs - 1) / bs;
    }
    int mb = (max_len + bs - 1) / bs;
    bool prot = fmt == QRL_KV_FORMAT_INT4_PROTECTED;
    qrl_kv_cache_desc d = {.n_layers = 1, .n_kv_heads = KVH, .head_dim = hd, .block_size = bs,
                           .n_blocks = total_blocks, .max_seqs = n_seqs, .max_seq_len = max_len,
                           .format = fmt, .protected_sink = sink, .protected_recent = recent};
    qrl_kv_cache *kv;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    /* the CPU's block tables serve the GPU too (same block ids); a table hole stays 0 */
    int32_t *tables = calloc((size_t)n_seqs * mb, 4);
    bool *owned = calloc(total_blocks, 1);
    for (int s = 0; s < n_seqs; s++) {
        int seq, nb;
        cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
        cr_assert_eq(seq, s);
        cr_assert_eq(qrl_kv_cache_reserve(kv, s, lens[s], &err), QRL_OK, "%s", err.msg);
        const int32_t *t = qrl_kv_cache_block_table(kv, s, &nb);
        for (int b = 0; b < nb; b++) tables[(size_t)s * mb + b] = t[b], owned[t[b]] = true;
    }
    gpu_layer g = {.cb = qrl_cuda_kvq_code_bytes(fmt, hd), .sf = qrl_cuda_kvq_scale_floats(fmt, hd)};
    int ring = prot && recent > 0 ? recent + QRL_CUDA_KV_RING_SLACK : 0;
    g.recs = (size_t)total_blocks * bs * KVH;
    g.side_recs = prot ? (size_t)n_seqs * (sink + ring) * KVH : 0;
    qrl_cuda_kvq_layer *c = &g.c;
    c->format = fmt;
    for (int w = 0; w < 2; w++) {
        c->codes[w] = dev_poisoned(g.recs * g.cb);
        c->scales[w] = g.sf ? dev_poisoned(g.recs * g.sf * 4) : NULL;
        c->side_codes[w] = dev_poisoned(g.side_recs * hd);
        c->side_scales[w] = dev_poisoned(g.side_recs * 4);
    }
    c->fp8_scale = dev_poisoned((size_t)n_seqs * KVH * 2 * 4);
    c->sink = prot ? sink : 0;
    c->recent = prot ? recent : 0;
    c->ring = ring;
    c->block_tables = dev_from(tables, (size_t)n_seqs * mb * 4);
    c->max_blocks_per_seq = mb;
    c->block_size = bs;
    c->n_kv_heads = KVH;
    c->head_dim = hd;

    /* data[s][p][2 KV] and the writes, PASS_ROWS positions of every sequence per pass */
    float **data = malloc(n_seqs * sizeof *data);
    for (int s = 0; s < n_seqs; s++) {
        data[s] = malloc((size_t)lens[s] * 2 * KV * 4);
        fill_rows(data[s], lens[s], KV, hd, &seed, specials);
    }
    float *rows = malloc((size_t)n_seqs * PASS_ROWS * 2 * KV * 4), *kc = malloc((size_t)PASS_ROWS * KV * 4),
          *vc = malloc((size_t)PASS_ROWS * KV * 4);
    int32_t *rseq = malloc((size_t)n_seqs * PASS_ROWS * 4), *rpos = malloc((size_t)n_seqs * PASS_ROWS * 4),
            *runs = malloc((size_t)3 * n_seqs * 4);
    for (int p0 = 0; p0 < max_len; p0 += PASS_ROWS) {
        int n = 0, nr = 0;
        for (int s = 0; s < n_seqs; s++) {
            int first = n;
            for (int p = p0; p < lens[s] && p < p0 + PASS_ROWS; p++) {
                memcpy(rows + (size_t)n * 2 * KV, data[s] + (size_t)p * 2 * KV, (size_t)2 * KV * 4);
                memcpy(kc + (size_t)(n - first) * KV, data[s] + (size_t)p * 2 * KV, (size_t)KV * 4);
                memcpy(vc + (size_t)(n - first) * KV, data[s] + (size_t)p * 2 * KV + KV, (size_t)KV * 4);
                rseq[n] = s, rpos[n++] = p;
            }
            if (n == first) continue;
            if (p0 == 0) runs[nr] = first, runs[n_seqs + nr] = n - first, runs[2 * n_seqs + nr++] = s;
            qrl_kv_cache_calibrate(kv, s, 0, kc, vc, n - first); /* no-op after the first pass */
            for (int i = first; i < n; i++)
                qrl_kv_cache_write(kv, s, 0, rpos[i], rows + (size_t)i * 2 * KV,
                                   rows + (size_t)i * 2 * KV + KV);
        }
        if (n == 0) continue;
        float *drows = dev_from(rows, (size_t)n * 2 * KV * 4);
        int32_t *ds = dev_from(rseq, (size_t)n * 4), *dp = dev_from(rpos, (size_t)n * 4), *dr = NULL;
        if (nr) { /* compact [3][nr] */
            int32_t tmp[3 * 64];
            cr_assert(nr <= 64);
            for (int i = 0; i < nr; i++)
                tmp[i] = runs[i], tmp[nr + i] = runs[n_seqs + i], tmp[2 * nr + i] = runs[2 * n_seqs + i];
            dr = dev_from(tmp, (size_t)3 * nr * 4);
            if (fmt == QRL_KV_FORMAT_FP8)
                cr_assert_eq(qrl_cuda_kv_fp8_calibrate(c, drows, dr, nr, NULL, &err), QRL_OK, "%s", err.msg);
        }
        size_t vb = qrl_cuda_kvq_fp4_copy_bytes(hd), cbytes = (size_t)n * 2 * KVH * vb;
        uint8_t *dcopy = fmt == QRL_KV_FORMAT_FP4 ? dev_poisoned(cbytes) : NULL;
        cr_assert_eq(qrl_cuda_kv_store_copy(c, drows, ds, dp, n, dcopy, NULL, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_cuda_synchronize(&err), QRL_OK, "%s", err.msg);
        if (dcopy) { /* the recorder's copy: the CPU cache record of each vector */
            cr_assert_eq(vb, qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_FP4, hd));
            uint8_t *hcopy = host_of(dcopy, cbytes), want[4 + 16 + 128 + 4];
            for (int i = 0; i < n; i++)
                for (int w = 0; w < 2; w++)
                    for (int h = 0; h < KVH; h++) {
                        memset(want, 0, sizeof want);
                        const float *x = rows + (size_t)i * 2 * KV + (size_t)w * KV + (size_t)h * hd;
                        int nb = (hd + 15) / 16;
                        qrl_nvfp4_quantize_row(x, hd, want + 4 + nb, want + 4, (float *)want);
                        cr_assert(memcmp(hcopy + (((size_t)i * 2 + w) * KVH + h) * vb, want, vb) == 0,
                                  "fp4 copy row %d %s head %d differs from the CPU record", i, w ? "V" : "K", h);
                    }
            free(hcopy);
            qrl_cuda_free(dcopy);
        }
        qrl_cuda_free(drows); qrl_cuda_free(ds); qrl_cuda_free(dp); qrl_cuda_free(dr);
    }
    for (int s = 0; s < n_seqs; s++) qrl_kv_cache_set_len(kv, s, lens[s]);

    /* ---- records ---- */
    unsigned char *hc[2], *hside[2];
    float *hs[2], *hss[2], *hfp8 = host_of(c->fp8_scale, (size_t)n_seqs * KVH * 2 * 4);
    for (int w = 0; w < 2; w++) {
        hc[w] = host_of(c->codes[w], g.recs * g.cb);
        hs[w] = g.sf ? host_of(c->scales[w], g.recs * g.sf * 4) : NULL;
        hside[w] = host_of(c->side_codes[w], g.side_recs * hd);
        hss[w] = host_of(c->side_scales[w], g.side_recs * 4);
    }
    int ng = (hd + 31) / 32;
    uint8_t want_c[256];
    float want_s[16];
    float *gk = malloc((size_t)max_len * hd * 4), *gv = malloc((size_t)max_len * hd * 4);
    /* decoded main and side rows per (seq, head, w): [n_seqs][KVH][2][max_len][hd] */
    float *mainrow = malloc((size_t)n_seqs * KVH * 2 * max_len * hd * 4);
    float *siderow = malloc((size_t)n_seqs * KVH * 2 * max_len * hd * 4);
    long checked = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int h = 0; h < KVH; h++) {
            int n4;
            qrl_kv_cache_gather(kv, s, 0, h, lens[s], gk, gv, &n4);
            int row = 0;
            for (int p = 0; p < lens[s]; p++) {
                int blk = tables[(size_t)s * mb + p / bs];
                size_t rec = ((size_t)blk * KVH + h) * bs + p % bs;
                int64_t slot = prot ? qrl_kv_protected_slot(p, lens[s], sink, recent) : -1;
                for (int w = 0; w < 2; w++) {
                    const float *x = data[s] + (size_t)p * 2 * KV + (size_t)w * KV + (size_t)h * hd;
                    const unsigned char *gc = hc[w] + rec * g.cb;
                    const float *gs = g.sf ? hs[w] + rec * g.sf : NULL;
                    float *mr = mainrow + ((((size_t)s * KVH + h) * 2 + w) * max_len + p) * hd;
                    if (fmt == QRL_KV_FORMAT_INT8) {
                        qrl_int8_quantize_rows(x, 1, hd, (int8_t *)want_c, want_s);
                        cr_assert(memcmp(gs, want_s, 4) == 0, "int8 scale s%d p%d h%d w%d: %a vs %a", s, p, h, w, *gs, want_s[0]);
                        qrl_int8_dequantize_rows((const int8_t *)gc, gs, 1, hd, mr);
                    } else if (fmt == QRL_KV_FORMAT_FP4) {
                        int nb = (hd + 15) / 16;
                        uint8_t rec[4 + 16 + 128 + 4] = {0};
                        qrl_nvfp4_quantize_row(x, hd, rec + 4 + nb, rec + 4, (float *)rec);
                        float se, am = qrl_quant_absmax(x, hd, NULL);
                        memcpy(&se, rec, 4);
                        cr_assert(memcmp(&gs[0], &se, 4) == 0, "fp4 S_enc s%d p%d h%d w%d: %a vs %a", s, p, h, w, gs[0], se);
                        cr_assert(am == 0.0f ? gs[1] == 0.0f : gs[1] == 1.0f / se, "fp4 1/S_enc %a (S_enc %a)", gs[1], se);
                        const uint8_t *gsb = (const uint8_t *)(gs + 2);
                        cr_assert(memcmp(gsb, rec + 4, nb) == 0, "fp4 block scales s%d p%d h%d w%d", s, p, h, w);
                        for (int i = 8 + nb; i < 4 * g.sf; i++) cr_assert_eq(((const uint8_t *)gs)[i], 0, "fp4 field padding");
                        memcpy(want_c, rec + 4 + nb, (size_t)hd / 2);
                        qrl_nvfp4_dequantize_row(gc, gsb, gs[0], hd, mr);
                    } else if (fmt == QRL_KV_FORMAT_FP8) {
                        float sc = hfp8[((size_t)s * KVH + h) * 2 + w];
                        qrl_kv_fp8_quantize(x, hd, sc, want_c);
                        qrl_kv_fp8_dequantize(gc, hd, sc, mr);
                    } else {
                        qrl_kv_int4_quantize(x, hd, 32, QRL_INT4_ASYMMETRIC, want_c, want_s, want_s + ng);
                        cr_assert(memcmp(gs, want_s, (size_t)2 * ng * 4) == 0, "int4 scales s%d p%d h%d w%d", s, p, h, w);
                        qrl_kv_int4_dequantize(gc, gs, gs + ng, hd, 32, QRL_INT4_ASYMMETRIC, mr);
                    }
                    cr_assert(memcmp(gc, want_c, g.cb) == 0, "%s codes differ: seq %d pos %d head %d %s",
                              qrl_kv_format_name(fmt), s, p, h, w ? "V" : "K");
                    if (slot < 0) { /* the CPU cache's row of this main position */
                        const float *cpu = (w ? gv : gk) + (size_t)row * hd;
                        for (int e = 0; e < hd; e++)
                            cr_assert(memcmp(&mr[e], &cpu[e], 4) == 0 || (isnan(mr[e]) && isnan(cpu[e])),
                                      "%s seq %d pos %d head %d: decoded %a, cpu cache %a", qrl_kv_format_name(fmt),
                                      s, p, h, mr[e], cpu[e]);
                    }
                    /* every position the GPU side cache still holds (the sink, the last
                     * `ring` positions): its INT8 record */
                    if (prot && (p < sink || (ring > 0 && p >= lens[s] - ring))) {
                        int gslot = p < sink ? p : sink + (p - sink) % ring;
                        size_t sr = ((size_t)s * (sink + ring) + gslot) * KVH + h;
                        qrl_int8_quantize_rows(x, 1, hd, (int8_t *)want_c, want_s);
                        cr_assert(memcmp(hside[w] + sr * hd, want_c, hd) == 0 && memcmp(&hss[w][sr], want_s, 4) == 0,
                                  "side record seq %d pos %d head %d", s, p, h);
                        float *sd = siderow + ((((size_t)s * KVH + h) * 2 + w) * max_len + p) * hd;
                        qrl_int8_dequantize_rows((const int8_t *)(hside[w] + sr * hd), &hss[w][sr], 1, hd, sd);
                    }
                    checked++;
                }
                if (slot < 0) row++;
            }
            cr_assert_eq(row, n4);
        }
    }
    /* poison intact outside the owned blocks */
    for (int b = 0; b < total_blocks; b++) {
        if (owned[b]) continue;
        size_t r0 = (size_t)b * bs * KVH, nr = (size_t)bs * KVH;
        for (int w = 0; w < 2; w++) {
            for (size_t i = r0 * g.cb; i < (r0 + nr) * g.cb; i++)
                cr_assert_eq(hc[w][i], POISON, "block %d (not owned) written", b);
            for (size_t i = r0 * g.sf * 4; g.sf && i < (r0 + nr) * g.sf * 4; i++)
                cr_assert_eq(((unsigned char *)hs[w])[i], POISON, "block %d scales written", b);
        }
    }
    fprintf(stderr, "kv store %s KVH=%d hd=%d bs=%d seqs=%d max_len=%d sink=%d recent=%d: %ld records bit-identical\n",
            qrl_kv_format_name(fmt), KVH, hd, bs, n_seqs, max_len, sink, recent, checked);

    /* ---- attention: the last position of every sequence, plus up to 40 earlier rows of
     * sequence 0 (a prefill chunk's rows) ---- */
    if (!specials) {
        int extra = lens[0] - 1 < 40 ? lens[0] - 1 : 40, n = n_seqs + extra, Q = H * hd, G = H / KVH;
        int32_t *as = malloc(n * 4), *ap = malloc(n * 4);
        for (int s = 0; s < n_seqs; s++) as[s] = s, ap[s] = lens[s] - 1;
        for (int i = 0; i < extra; i++) as[n_seqs + i] = 0, ap[n_seqs + i] = lens[0] - 2 - i;
        float *q = malloc((size_t)n * Q * 4), *want = malloc((size_t)n * Q * 4), *got = malloc((size_t)n * Q * 4);
        rand_f32(q, (size_t)n * Q, 1.5f, &seed);
        size_t wf = qrl_cuda_attention_q_work_floats(n, H, hd, max_len);
        float *work;
        cr_assert_eq(qrl_cuda_malloc((void **)&work, wf * 4, NULL), QRL_OK);
        guarded go = guarded_new((size_t)n * Q, 2);
        float *dq = dev_from(q, (size_t)n * Q * 4);
        int32_t *das = dev_from(as, n * 4), *dap = dev_from(ap, n * 4);
        cr_assert_eq(qrl_cuda_attention_q(c, guarded_ptr(go), dq, das, dap, n, H, 1.0f / sqrtf((float)hd),
                                          max_len, work, wf, NULL, &err), QRL_OK, "%s", err.msg);
        uint16_t *o16 = malloc((size_t)n * Q * 2);
        guarded_fetch(go, o16, "attention_q");
        bf16_to_f32_host(o16, got, (size_t)n * Q);
        float *km = malloc((size_t)max_len * hd * 4), *vm = malloc((size_t)max_len * hd * 4),
              *kp = malloc((size_t)max_len * hd * 4), *vp = malloc((size_t)max_len * hd * 4), acc[2][256];
        for (int r = 0; r < n; r++) {
            int s = as[r], nctx = ap[r] + 1;
            for (int h = 0; h < KVH; h++) {
                int nm = 0, np = 0;
                for (int p = 0; p < nctx; p++) {
                    bool pr = prot && qrl_kv_protected_slot(p, nctx, sink, recent) >= 0;
                    const float *src = pr ? siderow : mainrow;
                    size_t o0 = ((((size_t)s * KVH + h) * 2 + 0) * max_len + p) * hd;
                    size_t o1 = ((((size_t)s * KVH + h) * 2 + 1) * max_len + p) * hd;
                    memcpy((pr ? kp : km) + (size_t)(pr ? np : nm) * hd, src + o0, (size_t)hd * 4);
                    memcpy((pr ? vp : vm) + (size_t)(pr ? np : nm) * hd, src + o1, (size_t)hd * 4);
                    if (pr) np++; else nm++;
                }
                for (int gq = 0; gq < G; gq++) {
                    int hq = h * G + gq;
                    const float *qq = q + (size_t)r * Q + (size_t)hq * hd;
                    qrl_attention_partial parts[2] = {{0, 0, acc[0]}, {0, 0, acc[1]}};
                    qrl_attention_partial_f32(qq, km, vm, nm, hd, 1.0f / sqrtf((float)hd), &parts[0]);
                    qrl_attention_partial_f32(qq, kp, vp, np, hd, 1.0f / sqrtf((float)hd), &parts[1]);
                    qrl_attention_merge(parts, 2, hd, want + (size_t)r * Q + (size_t)hq * hd);
                }
            }
        }
        double e = rel_err(got, want, (size_t)n * Q);
        fprintf(stderr, "attention_q %s H=%d KVH=%d hd=%d bs=%d rows=%d max_len=%d sink=%d recent=%d: err %.2e\n",
                qrl_kv_format_name(fmt), H, KVH, hd, bs, n, max_len, sink, recent, e);
        cr_assert(e <= ATT_TOL, "attention_q %s hd=%d err %g", qrl_kv_format_name(fmt), hd, e);
        qrl_cuda_free(work); qrl_cuda_free(dq); qrl_cuda_free(das); qrl_cuda_free(dap);
        free(as); free(ap); free(q); free(want); free(got); free(o16); free(km); free(vm); free(kp); free(vp);
    }
    for (int w = 0; w < 2; w++) {
        qrl_cuda_free(c->codes[w]); qrl_cuda_free(c->scales[w]);
        qrl_cuda_free(c->side_codes[w]); qrl_cuda_free(c->side_scales[w]);
        free(hc[w]); free(hs[w]); free(hside[w]); free(hss[w]);
    }
    qrl_cuda_free(c->fp8_scale); qrl_cuda_free((void *)c->block_tables);
    for (int s = 0; s < n_seqs; s++) free(data[s]);
    free(data); free(rows); free(kc); free(vc); free(rseq); free(rpos); free(runs); free(tables);
    free(owned); free(hfp8); free(gk); free(gv); free(mainrow); free(siderow);
    qrl_kv_cache_free(kv);
}

#define N_FMTS 5
static const qrl_kv_format FMTS[N_FMTS] = {QRL_KV_FORMAT_INT8, QRL_KV_FORMAT_FP8, QRL_KV_FORMAT_INT4,
                                           QRL_KV_FORMAT_INT4_PROTECTED, QRL_KV_FORMAT_FP4};

/* Qwen3-4B heads (tensor-core path), ragged decode batch incl. odd lengths. */
Test(cuda_kv, tensor_core_hd128) {
    require_gpu();
    const int lens[] = {1, 17, 300, 1025, 64, 2, 145, 160};
    for (int f = 0; f < N_FMTS; f++) kv_case(FMTS[f], 32, 8, 128, 16, 8, lens, 16, 128, 0, 100 + f);
}

/* head_dim 64, odd block size, G = 3 (padded rows), small protected window. */
Test(cuda_kv, tensor_core_hd64_odd_blocks) {
    require_gpu();
    const int lens[] = {150, 7, 33, 1};
    for (int f = 0; f < N_FMTS; f++) kv_case(FMTS[f], 12, 4, 64, 5, 4, lens, 4, 8, 0, 200 + f);
    kv_case(QRL_KV_FORMAT_INT4_PROTECTED, 12, 4, 64, 5, 4, lens, 0, 0, 0, 210); /* = plain int4 */
    kv_case(QRL_KV_FORMAT_INT4_PROTECTED, 12, 4, 64, 5, 4, lens, 3, 0, 0, 211); /* sink only */
}

/* Tensor-core path with every GQA group width the output fragment serves: G = 8 (all
 * eight n columns live), G = 1 and G = 5 (most columns padding). */
Test(cuda_kv, tensor_core_gqa_groups) {
    require_gpu();
    const int lens[] = {513, 3, 96, 1};
    for (int f = 0; f < N_FMTS; f++) {
        kv_case(FMTS[f], 16, 2, 128, 16, 4, lens, 16, 128, 0, 500 + f);
        kv_case(FMTS[f], 3, 3, 64, 8, 4, lens, 4, 32, 0, 510 + f);
        kv_case(FMTS[f], 10, 2, 128, 32, 4, lens, 16, 64, 0, 520 + f);
    }
}

/* CUDA-core path: head dims 8, 16, 32, 256; G = 1, 2, 8. */
Test(cuda_kv, cuda_core_head_dims) {
    require_gpu();
    const int lens[] = {5, 1, 200, 97};
    for (int f = 0; f < N_FMTS; f++) {
        kv_case(FMTS[f], 8, 4, 8, 16, 4, lens, 16, 128, 0, 300 + f); /* stories260K heads */
        kv_case(FMTS[f], 4, 2, 16, 7, 4, lens, 2, 5, 0, 310 + f);
        kv_case(FMTS[f], 16, 2, 32, 16, 4, lens, 16, 128, 0, 320 + f);
        kv_case(FMTS[f], 2, 1, 256, 16, 2, lens + 2, 4, 16, 0, 330 + f);
    }
}

/* A ragged batch of 40 sequences of very different lengths (1..3001) on the chip. */
Test(cuda_kv, ragged_long_batch) {
    require_gpu();
    int lens[40];
    for (int i = 0; i < 40; i++) lens[i] = 1 + (i * 977) % 3001;
    lens[0] = 3001;
    kv_case(QRL_KV_FORMAT_INT8, 32, 8, 128, 16, 40, lens, 0, 0, 0, 400);
    kv_case(QRL_KV_FORMAT_INT4_PROTECTED, 32, 8, 128, 16, 40, lens, 16, 128, 0, 401);
}

/* NaN, +-Inf, huge, constant and zero vectors: codes still equal the CPU encoders'. */
Test(cuda_kv, store_specials) {
    require_gpu();
    const int lens[] = {70, 9};
    for (int f = 0; f < N_FMTS; f++) {
        kv_case(FMTS[f], 8, 4, 128, 16, 2, lens, 16, 32, 1, 500 + f);
        kv_case(FMTS[f], 4, 2, 40, 3, 2, lens, 2, 4, 1, 510 + f); /* hd 40: a short group */
    }
}

Test(cuda_kv, errors) {
    require_gpu();
    qrl_error err;
    qrl_cuda_kvq_layer c = {.format = QRL_CUDA_KVQ_INT8, .n_kv_heads = 2, .head_dim = 12, .block_size = 16};
    cr_assert_eq(qrl_cuda_attention_q(&c, NULL, NULL, NULL, NULL, 1, 4, 1.0f, 4, NULL, 0, NULL, &err),
                 QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "head_dim 12"), "%s", err.msg);
    c.head_dim = 16;
    cr_assert_eq(qrl_cuda_attention_q(&c, NULL, NULL, NULL, NULL, 1, 4, 1.0f, 4, NULL, 0, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "scratch"), "%s", err.msg);
    c.format = 1; /* bf16: not a quantized format */
    cr_assert_eq(qrl_cuda_kv_store(&c, NULL, NULL, NULL, 1, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "kv format 1"), "%s", err.msg);
    c.format = QRL_CUDA_KVQ_INT8; /* the recorder's copy is fp4's */
    cr_assert_eq(qrl_cuda_kv_store_copy(&c, NULL, NULL, NULL, 1, (uint8_t *)&c, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "fp4_copy"), "%s", err.msg);
    c.format = QRL_CUDA_KVQ_INT4_PROTECTED;
    c.recent = 8;
    c.ring = 4;
    cr_assert_eq(qrl_cuda_kv_store(&c, NULL, NULL, NULL, 1, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "ring=4"), "%s", err.msg);
}
