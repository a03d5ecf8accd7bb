/* QAT in the CUDA training engine (kernels/cuda/train_qat.cuh, train/model_train_cuda.h)
 * against the CPU (kernels/cpu/quant.h, kernels/cpu/trace.h, train/model_train.h):
 *   - the row kernel with nearest rounding is qrl_nvfp4_quantize_row /
 *     qrl_nvfp4_fake_quantize_row bit for bit (codes and values; zeros, NaN/Inf blocks,
 *     huge and tiny rows, partial blocks), from F32 and from BF16 inputs;
 *   - the weight kernel is qrl_model_train_qat_weight bit for bit, also on the BF16-rounded
 *     master (set_bf16: a replica on the BF16 weight stream), and the BF16 rounding kernel
 *     is qrl_f32_to_bf16's;
 *   - issue 19's acceptance: at every site a w4a4-nvfp4 + fp4-KV CPU rollout recorded, the
 *     CUDA guided quantization of the rollout's own vector gives the rollout's codes, and of
 *     the vector as a learner sees it (BF16-rounded; UAQ-scaled by 1.5) the CPU learner's
 *     guided codes (qrl_model_train_qat_quantize_row) bit for bit, with equal disagree
 *     counts; rows without guidance (NONE) round to nearest and are counted apart;
 *   - a whole QAT training step (guided by that rollout's records, K/V too) CUDA vs CPU:
 *     log-probs and gradients within test_cuda_train.c's bounds, the element counters
 *     equal; recomputation gives the same bits; after an AdamW step the weights are
 *     re-quantized (the next forward still matches the CPU);
 *   - set_bf16 on F32 masters computes exactly what the engine computes on the masters
 *     rounded to BF16 (log-probs bit for bit: every parameter the forward reads rounded),
 *     matches the CPU engine's set_bf16 forward, follows a toggle and an AdamW step;
 *   - version 0 under UAQ (cf94b40, docs/uaq.md) on BF16-valued qwen3 fixtures: the weight
 *     kernel is model_train.c's qat_weights recipe (nvfp4((W/s)*s)/s) bit for bit, which at
 *     s = 1.5 and 1.25 is the replica's nvfp4(W)/s exactly (0 values differ; nvfp4(W/s), the
 *     old recipe, differs from the replica in 0.05-0.2% of the codes); the QAT engine's forward
 *     against the plain engine on those fake-quantized masters: bit-equal on an H200, 3.6e-2
 *     apart on an H100, so asserted only within the CUDA-vs-CPU bound (too loose to catch
 *     the old recipe inside the engine: the weight checks call the kernel directly). */
#include "cuda_test_util.h"

#include <cuda_runtime.h>

#include "core/tensor.h"
#include "cpu/quant.h"
#include "cpu/trace.h"
#include "cuda/train_qat.cuh"
#include "model/model.h"
#include "train/adamw.h"
#include "train/model_train.h"
#include "train/model_train_cuda.h"
#include "support/trace_rollout.h"
#include "unit/sched_test_util.h"

/* Whole-model CUDA vs CPU bounds under NVFP4 QAT with K/V (H100, 6 Dec 2026: log-probs
 * 0.076 and 0.108 of max|logit|, gradient relative L2 0.36).  The CUDA engine computes in
 * BF16 where the CPU computes in F32, and FP4 turns those 2^-8 differences into code flips
 * that compound over the layers: on stories260K a 2^-8 perturbation of the embedding moves
 * the w4a4 + fp4 KV logits by 0.62 of max|logit| (bench/fp4_sensitivity), so
 * test_cuda_train.c's bounds (2e-2 of max|logit|, 5e-2 relative L2) cannot hold; these bounds still catch a wrong kernel (a transposed or missing
 * gradient is ~1.4, a wrong quantizer fails the bit-exact site tests above). */
#define LOGP_FP4 0.25
#define GRAD_FP4 0.6

static void *dmalloc(size_t n) {
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, n ? n : 1), cudaSuccess);
    return p;
}
static void *dup_to_dev(const void *h, size_t n) {
    void *p = dmalloc(n);
    if (n) cr_assert_eq(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}
static void to_host(void *h, const void *d, size_t n) {
    cr_assert_eq(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
}
static bool same_f32(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

/* GPU rows: x [rows, n] F32 -> y F32, codes [rows, ceil(n/2)], counters[3]. */
static void gpu_rows(const float *x, int rows, int n, int heads, const uint32_t *guide,
                     size_t guide_len, int stride, const uint8_t *blob, size_t blob_len,
                     float *y, uint8_t *codes, unsigned long long *cnt) {
    size_t cb = (size_t)rows * ((n + 1) / 2);
    float *dx = dup_to_dev(x, (size_t)rows * n * 4), *dy = dmalloc((size_t)rows * n * 4);
    uint8_t *dc = dmalloc(cb), *db = blob ? dup_to_dev(blob, blob_len) : NULL;
    uint32_t *dg = guide ? dup_to_dev(guide, guide_len * 4) : NULL;
    unsigned long long *dn = dmalloc(24);
    cr_assert_eq(cudaMemset(dn, 0, 24), cudaSuccess);
    qrl_error err;
    cr_assert_eq(qrl_cuda_qat_rows(dy, 0, dx, 0, rows, n, heads, dg, stride, db, dc, dn, NULL,
                                   &err), QRL_OK, "%s", err.msg);
    to_host(y, dy, (size_t)rows * n * 4);
    to_host(codes, dc, cb);
    to_host(cnt, dn, 24);
    cudaFree(dx), cudaFree(dy), cudaFree(dc), cudaFree(db), cudaFree(dg), cudaFree(dn);
}

/* ---- nearest rounding and weights: bit for bit on fresh random inputs -------------------- */

static void fill_row(float *x, int n, int kind, uint64_t *s) {
    static const float scale[6] = {1.0f, 1e-30f, 1e30f, 0.0f, 3.0f, 0.01f};
    for (int j = 0; j < n; j++) {
        float u = rng_unif(s);
        x[j] = kind == 4 ? 0.25f * (float)(int)(24.0f * u) : scale[kind] * u; /* 4: on a grid */
    }
    if (kind == 5 && n > 3) x[1] = NAN, x[n - 1] = INFINITY; /* a NaN and an Inf block */
    if (kind == 0) x[0] = -0.0f;
}

Test(cuda_train_qat, nearest_rows_match_the_cpu_bit_for_bit) {
    require_gpu();
    static const int lens[] = {8, 16, 24, 64, 172, 1000, 4096};
    uint64_t seed = 7;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int n = lens[li], rows = 37, cb = (n + 1) / 2;
        float *x = malloc((size_t)rows * n * 4), *y = malloc((size_t)rows * n * 4),
              *yw = malloc((size_t)n * 4);
        uint8_t *codes = malloc((size_t)rows * cb), want[2048], sc[512];
        unsigned long long cnt[3];
        for (int r = 0; r < rows; r++) fill_row(x + (size_t)r * n, n, r % 6, &seed);
        gpu_rows(x, rows, n, 1, NULL, 0, 0, NULL, 0, y, codes, cnt);
        for (int r = 0; r < rows; r++) {
            float g;
            const float *xr = x + (size_t)r * n;
            qrl_nvfp4_quantize_row(xr, n, want, sc, &g);
            qrl_nvfp4_fake_quantize_row(xr, n, yw);
            cr_assert_eq(memcmp(codes + (size_t)r * cb, want, cb), 0, "n %d row %d codes", n, r);
            for (int j = 0; j < n; j++)
                cr_assert(same_f32(y[(size_t)r * n + j], yw[j]), "n %d row %d [%d]: %a vs %a", n,
                          r, j, y[(size_t)r * n + j], yw[j]);
        }
        cr_assert_eq(cnt[0], 0);
        cr_assert_eq(cnt[1], (unsigned long long)rows * n);
        cr_assert_eq(cnt[2], 0);
        /* BF16 in and out: the CPU on the BF16 values, rounded to BF16 */
        uint16_t *xb = malloc((size_t)rows * n * 2), *yb = malloc((size_t)rows * n * 2);
        float *xf = malloc((size_t)rows * n * 4);
        for (size_t i = 0; i < (size_t)rows * n; i++)
            xb[i] = qrl_bf16_encode(x[i]), xf[i] = qrl_bf16_decode(xb[i]);
        void *dx = dup_to_dev(xb, (size_t)rows * n * 2);
        qrl_error err;
        cr_assert_eq(qrl_cuda_qat_rows(dx, 1, dx, 1, rows, n, 1, NULL, 0, NULL, NULL, NULL, NULL,
                                       &err), QRL_OK, "%s", err.msg); /* in place */
        to_host(yb, dx, (size_t)rows * n * 2);
        for (int r = 0; r < rows; r++) {
            qrl_nvfp4_fake_quantize_row(xf + (size_t)r * n, n, yw);
            for (int j = 0; j < n; j++) {
                float got = qrl_bf16_decode(yb[(size_t)r * n + j]);
                float w = qrl_bf16_decode(qrl_bf16_encode(yw[j]));
                cr_assert(same_f32(got, w), "bf16 n %d row %d [%d]: %a vs %a", n, r, j, got, w);
            }
        }
        cudaFree(dx);
        free(x), free(y), free(yw), free(codes), free(xb), free(yb), free(xf);
    }
}

Test(cuda_train_qat, weights_match_qrl_model_train_qat_weight_bit_for_bit) {
    require_gpu();
    static const int shapes[][2] = {{64, 64}, {64, 172}, {172, 64}, {96, 40}, {512, 1024}};
    uint64_t seed = 11;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int R = shapes[si][0], C = shapes[si][1];
        size_t n = (size_t)R * C;
        float *w = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
        uint16_t *gb = malloc(n * 2);
        uint8_t *codes = malloc(n), *scales = malloc(n);
        rand_f32(w, n, 0.05f, &seed);
        w[n / 3] = 0.9f; /* an outlier sets the tensor scale */
        qrl_model_train_qat_weight(w, R, C, codes, scales, want);
        float *dw = dup_to_dev(w, n * 4), *dy = dmalloc(n * 4), *da = dmalloc(4);
        uint16_t *dyb = dmalloc(n * 2);
        qrl_error err;
        cr_assert_eq(qrl_cuda_qat_weight(dw, 0, 1.0f, R, C, dy, dyb, da, NULL, &err), QRL_OK, "%s", err.msg);
        to_host(got, dy, n * 4);
        to_host(gb, dyb, n * 2);
        for (size_t i = 0; i < n; i++) {
            cr_assert(same_f32(got[i], want[i]), "%dx%d [%zu]: %a vs %a", R, C, i, got[i], want[i]);
            cr_assert_eq(gb[i], qrl_bf16_encode(want[i]));
        }
        /* set_bf16: from the same F32 master, the CPU's recipe on bf16(w) (amax too: the
         * outlier 0.9 + 2^-10 rounds to 0.90234375) */
        w[n / 3] = 0.9f + 0x1p-10f;
        cr_assert_eq(cudaMemcpy(dw, w, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        float *wr = malloc(n * 4);
        size_t moved = 0;
        for (size_t i = 0; i < n; i++) wr[i] = qrl_bf16_to_f32(qrl_f32_to_bf16(w[i]));
        qrl_model_train_qat_weight(wr, R, C, codes, scales, want);
        cr_assert_eq(qrl_cuda_qat_weight(dw, 1, 1.0f, R, C, dy, dyb, da, NULL, &err), QRL_OK, "%s", err.msg);
        to_host(got, dy, n * 4);
        to_host(gb, dyb, n * 2);
        qrl_model_train_qat_weight(w, R, C, codes, scales, wr); /* unrounded, to count */
        for (size_t i = 0; i < n; i++) {
            cr_assert(same_f32(got[i], want[i]), "bf16 %dx%d [%zu]: %a vs %a", R, C, i, got[i],
                      want[i]);
            cr_assert_eq(gb[i], qrl_bf16_encode(want[i]));
            moved += !same_f32(want[i], wr[i]);
        }
        cr_assert_gt(moved, 0, "%dx%d: the BF16 rounding changed no fake-quantized value", R, C);
        free(wr);
        cudaFree(dw), cudaFree(dy), cudaFree(da), cudaFree(dyb);
        free(w), free(want), free(got), free(gb), free(codes), free(scales);
    }
}

/* ---- a recorded CPU rollout ------------------------------------------------------------- */

typedef struct rollout {
    trace_rollout tr; /* the recorded vectors, labelled with their response and site id */
    const qrl_model *m;
    int32_t prompt[16], resp[64];
    int n_prompt, n_resp;
    float lp[64];
    qrl_trace_response *rec[2]; /* both responses, decoded */
} rollout;

static void on_group(const qrl_scheduler_group_result *res, void *ctx) {
    rollout *rc = ctx;
    for (uint32_t r = 0; r < res->group_size && r < 2; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        rc->rec[r] = trace_rollout_decode(rc->m, o->trace, (uint32_t)o->n_tokens);
        if (r == 0) {
            rc->n_prompt = res->n_prompt;
            memcpy(rc->prompt, res->prompt, (size_t)res->n_prompt * 4);
            rc->n_resp = o->n_tokens;
            memcpy(rc->resp, o->tokens, (size_t)o->n_tokens * 4);
            memcpy(rc->lp, o->logprobs_full, (size_t)o->n_tokens * 4);
        }
    }
}

/* w4a4-nvfp4 + fp4-KV CPU rollout of stories260K, one group of 2, every site recorded
 * (tests/support/trace_rollout.h). */
static void record_rollout(rollout *rc) {
    qrl_model *m = st_load_model();
    qrl_model_round_bf16(m); /* the masters the QAT engines below hold (a broadcast version) */
    static const int32_t prompt[] = {1, 403, 407, 261, 378, 34, 90};
    *rc = (rollout){.m = m};
    trace_rollout_record(&rc->tr, m, prompt, 7, on_group, rc);
}

static void rollout_free(rollout *rc) {
    trace_rollout_free(&rc->tr);
    qrl_trace_response_free(rc->rec[0]), qrl_trace_response_free(rc->rec[1]);
    qrl_model_free((qrl_model *)rc->m);
}

/* ---- acceptance: guided codes at every captured site ------------------------------------ */

/* The taps of length n (variant 0: the rollout's vector, 1: BF16-rounded, 2: 1.5 x BF16)
 * through the CPU learner's quantizer and the CUDA kernel, rows laid out as 2 heads per
 * token with a table stride of 3 (the third slot poisoned); every 7th row without guidance.
 * Returns the elements whose code equals the rollout's. */
static uint64_t check_sites(const rollout *rc, uint32_t n, int variant, uint64_t *elements) {
    size_t *idx = malloc(rc->tr.n * sizeof *idx), rows = 0;
    for (size_t i = 0; i < rc->tr.n; i++)
        if (rc->tr.t[i].resp >= 0 && rc->tr.t[i].n == n) idx[rows++] = i;
    if (rows % 2) rows--; /* whole tokens of 2 heads */
    cr_assert_gt(rows, 0);
    const int cb = (int)(n + 1) / 2, ns = (int)(n + 15) / 16, nb = (int)(n + 7) / 8;
    float *x = malloc(rows * n * 4), *y = malloc(rows * n * 4), *yc = malloc(n * 4);
    uint8_t *codes = malloc(rows * cb), *blob = malloc(rows * (ns + nb)), cc[2048], want[2048],
            sc[512];
    uint32_t *guide = malloc(rows / 2 * 3 * 4);
    memset(guide, 0xEE, rows / 2 * 3 * 4);
    uint64_t dis_cpu = 0, same = 0, guided_el = 0;
    for (size_t r = 0; r < rows; r++) {
        const trace_tap *t = &rc->tr.t[idx[r]];
        for (uint32_t j = 0; j < n; j++) {
            float v = t->x[j];
            if (variant >= 1) v = qrl_bf16_decode(qrl_bf16_encode(v));
            if (variant == 2) v *= 1.5f;
            x[r * n + j] = v;
        }
        qrl_trace_entry e;
        cr_assert(qrl_trace_response_entry(rc->rec[t->resp], t->token, (int)(t->id >> 16),
                                           (qrl_trace_site_kind)((t->id >> 12) & 0xF),
                                           (int)(t->id & 0xFFF), &e));
        memcpy(blob + r * (ns + nb), e.scales, ns);
        memcpy(blob + r * (ns + nb) + ns, e.bits, nb);
        guide[(r / 2) * 3 + r % 2] = r % 7 == 3 ? QRL_CUDA_QAT_NONE : (uint32_t)(r * (ns + nb));
    }
    unsigned long long cnt[3];
    gpu_rows(x, (int)rows, (int)n, 2, guide, rows / 2 * 3, 3, blob, rows * (ns + nb), y, codes,
             cnt);
    for (size_t r = 0; r < rows; r++) {
        const trace_tap *t = &rc->tr.t[idx[r]];
        const float *xr = x + r * n;
        bool g = r % 7 != 3;
        if (g) {
            uint64_t d = 0;
            cr_assert(qrl_model_train_qat_quantize_row(
                rc->rec[t->resp], t->token, (int)(t->id >> 16),
                (qrl_trace_site_kind)((t->id >> 12) & 0xF), (int)(t->id & 0xFFF), xr, n, yc, cc,
                &d));
            dis_cpu += d;
            guided_el += n;
        } else {
            float genc;
            qrl_nvfp4_quantize_row(xr, n, cc, sc, &genc);
            qrl_nvfp4_fake_quantize_row(xr, n, yc);
        }
        cr_assert_eq(memcmp(codes + r * cb, cc, cb), 0, "variant %d site 0x%x token %u: codes",
                     variant, t->id, t->token);
        for (uint32_t j = 0; j < n; j++)
            cr_assert(same_f32(y[r * n + j], yc[j]), "variant %d site 0x%x [%u]", variant, t->id, j);
        if (!g) continue;
        float genc;
        qrl_nvfp4_quantize_row(t->x, n, want, sc, &genc); /* the rollout's codes */
        for (uint32_t j = 0; j < n; j++) same += qrl_nibble_get(cc, j) == qrl_nibble_get(want, j);
        if (variant == 0)
            cr_assert_eq(memcmp(cc, want, cb), 0, "site 0x%x token %u: not the rollout's codes",
                         t->id, t->token);
    }
    cr_assert_eq(cnt[0], guided_el);
    cr_assert_eq(cnt[1], (unsigned long long)rows * n - guided_el);
    cr_assert_eq(cnt[2], dis_cpu, "disagree: cuda %llu, cpu %llu", cnt[2],
                 (unsigned long long)dis_cpu);
    if (variant == 0) cr_assert_eq(dis_cpu, 0);
    *elements += guided_el;
    free(idx), free(x), free(y), free(yc), free(codes), free(blob), free(guide);
    return same;
}

Test(cuda_train_qat, guided_codes_are_the_rollouts_at_every_site, .timeout = 300) {
    require_gpu();
    rollout rc;
    record_rollout(&rc);
    const qrl_model_config *c = &rc.m->cfg;
    uint32_t lens[3] = {(uint32_t)c->dim, (uint32_t)c->hidden_dim, (uint32_t)c->head_dim};
    cr_assert_eq(c->dim, c->n_heads * c->head_dim); /* attn_out has dim's length here */
    for (int v = 0; v < 3; v++) {
        uint64_t el = 0, same = 0;
        for (int i = 0; i < 3; i++) same += check_sites(&rc, lens[i], v, &el);
        printf("guided sites, %s: %llu elements, %.5f of the codes are the rollout's\n",
               v == 0 ? "rollout's vectors" : v == 1 ? "BF16-rounded" : "1.5 x BF16 (UAQ)",
               (unsigned long long)el, (double)same / (double)el);
        cr_assert_gt(el, 10000);
        cr_assert_geq((double)same / (double)el, v == 0 ? 1.0 : 0.99);
    }
    rollout_free(&rc);
}

/* ---- a whole QAT training step, CUDA vs CPU --------------------------------------------- */

typedef struct seqb {
    int T;
    int32_t tok[96], tgt[96], pos[96], seg[96];
    float dlogp[96];
} seqb;

/* Response 0 of the rollout as one packed row (the learner's layout); the loss weights
 * the response log-probs. */
static seqb seq_of(const rollout *rc) {
    seqb b = {.T = rc->n_prompt + rc->n_resp};
    memcpy(b.tok, rc->prompt, (size_t)rc->n_prompt * 4);
    memcpy(b.tok + rc->n_prompt, rc->resp, (size_t)rc->n_resp * 4);
    for (int t = 0; t < b.T; t++) {
        b.seg[t] = 0;
        b.tgt[t] = t + 1 < b.T ? b.tok[t + 1] : -1;
        b.dlogp[t] = t >= rc->n_prompt - 1 && b.tgt[t] >= 0 ? -1.0f / rc->n_resp : 0.0f;
    }
    qrl_model_train_positions(b.pos, b.seg, b.T);
    return b;
}

Test(cuda_train_qat, qat_step_matches_the_cpu_engine, .timeout = 300) {
    require_gpu();
    rollout rc;
    record_rollout(&rc);
    qrl_model *m = st_load_model();
    qrl_model_round_bf16(m); /* both engines hold the same master values */
    seqb b = seq_of(&rc);
    const int T = b.T, V = m->cfg.vocab_size;
    const size_t np = (size_t)(m->rope_inv_freq - m->arena);
    qrl_error err;
    /* CPU: guided QAT with K/V, forward + backward */
    qrl_model_train_opts co = {.max_tokens = 96, .qat = QRL_QAT_NVFP4, .qat_kv = true,
                               .trace_guidance = true};
    qrl_model_train_t *cpu;
    cr_assert_eq(qrl_model_train_new_opts(m, &co, &cpu, &err), QRL_OK, "%s", err.msg);
    qrl_model_train_qat_clear(cpu);
    cr_assert_eq(qrl_model_train_qat_attach(cpu, 0, rc.n_prompt, rc.n_resp, rc.rec[0], &err),
                 QRL_OK);
    float lp[96], glp[96], glp2[96];
    cr_assert_eq(qrl_model_train_forward(cpu, b.tok, b.tgt, b.pos, b.seg, T, lp, NULL, &err),
                 QRL_OK, "%s", err.msg);
    double zmax = 0;
    const float *z = qrl_model_train_logits(cpu);
    for (size_t i = 0; i < (size_t)T * V; i++) zmax = fmax(zmax, fabs(z[i]));
    cr_assert_eq(qrl_model_train_backward(cpu, b.dlogp, NULL, &err), QRL_OK, "%s", err.msg);
    float *gr = st_dup(qrl_model_train_grads(cpu, NULL), np * 4), *ggr = malloc(np * 4);
    qrl_qat_stats cs, gs, gs2;
    qrl_model_train_qat_stats(cpu, &cs);
    /* CUDA, the same, with and without recomputation */
    for (int rec = 0; rec < 2; rec++) {
        qrl_model_train_cuda_opts go = {.max_tokens = 96, .recompute_activations = rec,
                                        .lm_head_chunk = 64, .qat = QRL_QAT_NVFP4,
                                        .qat_kv = true, .trace_guidance = true};
        qrl_model_train_cuda_t *g;
        cr_assert_eq(qrl_model_train_cuda_new(m, &go, &g, &err), QRL_OK, "%s", err.msg);
        qrl_model_train_cuda_qat_clear(g);
        cr_assert_eq(qrl_model_train_cuda_qat_attach(g, 0, rc.n_prompt, rc.n_resp, rc.rec[0],
                                                     &err), QRL_OK);
        float *out = rec ? glp2 : glp;
        cr_assert_eq(qrl_model_train_cuda_forward(g, b.tok, b.tgt, b.pos, b.seg, T, out, NULL,
                                                  &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_model_train_cuda_backward(g, b.dlogp, NULL, false, &err), QRL_OK, "%s",
                     err.msg);
        cr_assert_eq(qrl_model_train_cuda_qat_stats(g, rec ? &gs2 : &gs, false, &err), QRL_OK);
        if (!rec) cr_assert_eq(qrl_model_train_cuda_get_grads(g, ggr, &err), QRL_OK);
        if (rec) {
            /* an AdamW step on both: the next forward re-quantizes the new weights */
            qrl_adamw_config ac = qrl_adamw_config_default();
            qrl_adamw_t *opt;
            qrl_adamw_step_info info;
            cr_assert_eq(qrl_adamw_new(np, &ac, &opt, &err), QRL_OK);
            cr_assert_eq(qrl_adamw_step(opt, m->arena, gr, 1e-2, &info, &err), QRL_OK);
            cr_assert_eq(qrl_model_train_cuda_adamw_step(g, &ac, 1e-2, &info, &err), QRL_OK);
            float lq[96], glq[96];
            cr_assert_eq(qrl_model_train_forward(cpu, b.tok, b.tgt, b.pos, b.seg, T, lq, NULL,
                                                 &err), QRL_OK);
            cr_assert_eq(qrl_model_train_cuda_forward(g, b.tok, b.tgt, b.pos, b.seg, T, glq,
                                                      NULL, &err), QRL_OK, "%s", err.msg);
            double d = 0, moved = 0, moved_g = 0;
            for (int t = 0; t < T; t++) {
                d = fmax(d, fabs(glq[t] - lq[t]));
                moved = fmax(moved, fabs(lq[t] - lp[t]));
                moved_g = fmax(moved_g, fabs(glq[t] - glp2[t]));
            }
            /* the records describe the weights before the step, so the two engines' codes
             * part (FP4 amplifies their BF16-vs-F32 differences: bench/fp4_sensitivity):
             * printed, not bounded; what must hold is that the CUDA engine re-quantized */
            printf("qat after a step: max|dlogp| cuda-cpu %.2e (the step moved cpu %.2e, "
                   "cuda %.2e)\n", d, moved, moved_g);
            cr_expect(moved_g > 1e-2, "the step moved the CUDA log-probs by %.3e only: weights "
                      "not re-quantized", moved_g);
            qrl_adamw_destroy(opt);
        }
        qrl_model_train_cuda_destroy(g);
    }
    double dlp = 0, drb = 0, dcpu_roll = 0, dgpu_roll = 0;
    for (int t = 0; t < T; t++) {
        dlp = fmax(dlp, fabs(glp[t] - lp[t]));
        drb = fmax(drb, fabs(glp2[t] - glp[t]));
    }
    for (int k = 0; k < rc.n_resp; k++) {
        dcpu_roll = fmax(dcpu_roll, fabs(lp[rc.n_prompt - 1 + k] - rc.lp[k]));
        dgpu_roll = fmax(dgpu_roll, fabs(glp[rc.n_prompt - 1 + k] - rc.lp[k]));
    }
    double grel = rel_err(ggr, gr, np);
    double share_c = qrl_trace_metric_disagree_share(cs.disagree, cs.elements_guided);
    double share_g = qrl_trace_metric_disagree_share(gs.disagree, gs.elements_guided);
    printf("qat step stories260K T=%d: max|dlogp| cuda-cpu %.2e (max|logit| %.1f), grad rel "
           "%.2e; vs the rollout's log-probs: cpu %.2e, cuda %.2e; guided elements %llu, "
           "disagree share cpu %.5f cuda %.5f\n", T, dlp, zmax, grel, dcpu_roll, dgpu_roll,
           (unsigned long long)gs.elements_guided, share_c, share_g);
    cr_expect(dlp <= LOGP_FP4 * zmax, "logp max|diff| %.3e", dlp);
    cr_expect(grel <= GRAD_FP4, "gradient relative L2 %.3e", grel);
    cr_expect_eq(drb, 0.0, "recomputation changed the log-probs by %.3e", drb);
    cr_expect_eq(gs.rows_guided, cs.rows_guided);
    cr_expect_eq(gs.rows_unguided, cs.rows_unguided);
    cr_expect_eq(gs.elements_guided, cs.elements_guided);
    cr_expect_eq(gs.elements_nearest, cs.elements_nearest);
    cr_expect_eq(gs2.elements_guided, cs.elements_guided, "recomputation counted again");
    /* TRACE's claim on the CUDA engine: guidance brings the training log-probs closer to
     * the rollout's than nearest rounding does (the codes the rollout used, where the
     * BF16-computed vectors still lie between the same two grid points).  The CPU engine
     * reproduces the rollout exactly (share_c 0 above); the CUDA engine's share_g is the
     * fraction of elements whose nearest code differs from the rollout's (printed). */
    {
        qrl_model_train_cuda_opts go = {.max_tokens = 96, .lm_head_chunk = 64,
                                        .qat = QRL_QAT_NVFP4, .qat_kv = true};
        qrl_model_train_cuda_t *g;
        float nlp[96];
        cr_assert_eq(qrl_model_train_cuda_new(m, &go, &g, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_model_train_cuda_forward(g, b.tok, b.tgt, b.pos, b.seg, T, nlp, NULL,
                                                  &err), QRL_OK, "%s", err.msg);
        double mg = 0, mn = 0, mc = 0;
        for (int k = 0; k < rc.n_resp; k++) {
            mg += fabs(glp[rc.n_prompt - 1 + k] - rc.lp[k]) / rc.n_resp;
            mn += fabs(nlp[rc.n_prompt - 1 + k] - rc.lp[k]) / rc.n_resp;
            mc += fabs(lp[rc.n_prompt - 1 + k] - rc.lp[k]) / rc.n_resp;
        }
        printf("qat vs the rollout's log-probs, mean |diff| over %d tokens: cpu guided %.2e, "
               "cuda guided %.2e, cuda nearest %.2e\n", rc.n_resp, mc, mg, mn);
        cr_expect(mg < mn, "cuda: guidance (%.3e) not closer to the rollout than nearest (%.3e)",
                  mg, mn);
        qrl_model_train_cuda_destroy(g);
    }
    qrl_model_train_destroy(cpu);
    free(gr), free(ggr);
    qrl_model_free(m);
    rollout_free(&rc);
}

Test(cuda_train_qat, bf16_round_is_qrl_f32_to_bf16) {
    require_gpu();
    const size_t n = 100003; /* not a multiple of the block */
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint64_t seed = 5;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(rng_next(&seed) >> 32); /* any bit pattern */
        memcpy(&x[i], &u, 4);
    }
    x[0] = INFINITY, x[1] = -INFINITY, x[2] = NAN, x[3] = 0x1.fffffep127f; /* rounds to Inf */
    x[4] = 1.0f + 0x1p-8f, x[5] = 1.0f + 0x1p-8f + 0x1p-23f, x[6] = -0.0f; /* tie, above it */
    float *dx = dup_to_dev(x, n * 4);
    qrl_error err;
    cr_assert_eq(qrl_cuda_bf16_round(dx, dx, n, NULL, &err), QRL_OK, "%s", err.msg);
    to_host(y, dx, n * 4);
    for (size_t i = 0; i < n; i++) {
        float w = qrl_bf16_to_f32(qrl_f32_to_bf16(x[i]));
        cr_assert(same_f32(y[i], w), "[%zu] %a: %a vs %a", i, x[i], y[i], w);
    }
    cr_assert_eq(qrl_cuda_bf16_round(NULL, dx, 4, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cudaFree(dx);
    free(x), free(y);
}

/* One forward (+ backward when g) of the fixed sequence b on the CUDA engine: log-probs. */
static void cuda_fwd(qrl_model_train_cuda_t *e, const seqb *b, float *lp, float *g) {
    qrl_error err;
    cr_assert_eq(qrl_model_train_cuda_forward(e, b->tok, b->tgt, b->pos, b->seg, b->T, lp, NULL,
                                              &err), QRL_OK, "%s", err.msg);
    if (!g) return;
    qrl_model_train_cuda_zero_grad(e);
    cr_assert_eq(qrl_model_train_cuda_backward(e, b->dlogp, NULL, false, &err), QRL_OK, "%s",
                 err.msg);
    cr_assert_eq(qrl_model_train_cuda_get_grads(e, g, &err), QRL_OK, "%s", err.msg);
}

static double max_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* set_bf16 (a broadcast version: the replicas hold bf16(master)) on masters that are not
 * BF16 values, as after any optimizer step. */
Test(cuda_train_qat, set_bf16_computes_with_the_bf16_rounded_parameters, .timeout = 300) {
    require_gpu();
    qrl_model *m = st_load_model(), *mr = st_load_model();
    const size_t np = qrl_model_param_count(m);
    uint64_t seed = 21;
    for (size_t k = 0; k < np; k++) { /* off the BF16 grid, by up to ~1 BF16 ulp */
        float e = m->arena[k] * 0x1p-8f * rng_unif(&seed);
        m->arena[k] += e, mr->arena[k] += e;
    }
    qrl_model_round_bf16(mr);
    size_t off_grid = 0;
    for (size_t k = 0; k < np; k++) off_grid += m->arena[k] != mr->arena[k];
    cr_assert_gt(off_grid, np / 2);
    seqb b = {.T = 48};
    for (int t = 0; t < b.T; t++) {
        b.tok[t] = (int32_t)((7 + 131 * t) % m->cfg.vocab_size), b.seg[t] = t >= 30;
        b.tgt[t] = t + 1 < b.T && b.seg[t + 1] == b.seg[t] ? (int32_t)((7 + 131 * (t + 1)) %
                                                             m->cfg.vocab_size) : -1;
        b.dlogp[t] = b.tgt[t] >= 0 ? -1.0f / b.T : 0.0f;
    }
    qrl_model_train_positions(b.pos, b.seg, b.T);
    qrl_model_train_cuda_opts go = {.max_tokens = 64, .lm_head_chunk = 32, .optimizer_state = true,
                                    .qat = QRL_QAT_NVFP4, .qat_kv = true};
    qrl_model_train_cuda_t *a, *r;
    qrl_error err;
    cr_assert_eq(qrl_model_train_cuda_new(m, &go, &a, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_train_cuda_new(mr, &go, &r, &err), QRL_OK, "%s", err.msg);
    float lp_off[64], lp_on[64], lp_r[64], lp_on2[64], lp_off2[64];
    float *ga = malloc(np * 4), *gr = malloc(np * 4);
    cuda_fwd(a, &b, lp_off, NULL);           /* F32 masters, plain */
    qrl_model_train_cuda_qat_set_bf16(a, true);
    cuda_fwd(a, &b, lp_on, ga);              /* F32 masters, rounded by set_bf16 */
    cuda_fwd(r, &b, lp_r, gr);               /* BF16-valued masters, plain */
    /* the same parameters everywhere the forward reads them: the same bits */
    cr_assert_eq(memcmp(lp_on, lp_r, (size_t)b.T * 4), 0, "set_bf16 vs rounded masters: max "
                 "|dlogp| %.3e", max_diff(lp_on, lp_r, b.T));
    double gd = rel_err(ga, gr, np), moved = max_diff(lp_on, lp_off, b.T);
    cr_expect(gd <= 1e-5, "gradients: relative L2 %.3e (only the summation order may differ)", gd);
    cr_assert_gt(moved, 0.0, "set_bf16 changed nothing");
    /* a toggle re-makes the copies both ways */
    qrl_model_train_cuda_qat_set_bf16(a, false);
    cuda_fwd(a, &b, lp_off2, NULL);
    cr_assert_eq(memcmp(lp_off2, lp_off, (size_t)b.T * 4), 0, "set_bf16 off again");
    qrl_model_train_cuda_qat_set_bf16(a, true);
    cuda_fwd(a, &b, lp_on2, NULL);
    cr_assert_eq(memcmp(lp_on2, lp_on, (size_t)b.T * 4), 0, "set_bf16 on again");
    /* the CPU engine with set_bf16 on the same F32 masters */
    qrl_model_train_opts co = {.max_tokens = 64, .qat = QRL_QAT_NVFP4, .qat_kv = true};
    qrl_model_train_t *cpu;
    cr_assert_eq(qrl_model_train_new_opts(m, &co, &cpu, &err), QRL_OK, "%s", err.msg);
    qrl_model_train_qat_set_bf16(cpu, true);
    float lc[64];
    cr_assert_eq(qrl_model_train_forward(cpu, b.tok, b.tgt, b.pos, b.seg, b.T, lc, NULL, &err),
                 QRL_OK, "%s", err.msg);
    double zmax = 0;
    const float *z = qrl_model_train_logits(cpu);
    for (size_t i = 0; i < (size_t)b.T * m->cfg.vocab_size; i++) zmax = fmax(zmax, fabs(z[i]));
    double dc = max_diff(lp_on, lc, b.T);
    /* an AdamW step moves the masters off the grid again: the next forward re-rounds */
    qrl_adamw_config ac = qrl_adamw_config_default();
    qrl_adamw_step_info info;
    float lp_step[64], lr_step[64];
    cr_assert_eq(qrl_model_train_cuda_adamw_step(a, &ac, 1e-3, &info, &err), QRL_OK, "%s", err.msg);
    cuda_fwd(a, &b, lp_step, NULL);
    cr_assert_eq(qrl_model_train_cuda_get_params(a, m->arena, &err), QRL_OK, "%s", err.msg);
    qrl_model_round_bf16(m);
    cr_assert_eq(qrl_model_train_cuda_set_params(r, m->arena, &err), QRL_OK, "%s", err.msg);
    cuda_fwd(r, &b, lr_step, NULL);
    printf("qat set_bf16 stories260K T=%d: vs rounded masters 0 (bit for bit), gradients rel "
           "%.2e; vs off %.2e; cuda-cpu %.2e (max|logit| %.1f); after a step vs rounded %.2e\n",
           b.T, gd, moved, dc, zmax, max_diff(lp_step, lr_step, b.T));
    cr_expect(dc <= LOGP_FP4 * zmax, "cuda vs cpu set_bf16: logp max|diff| %.3e", dc);
    cr_assert_eq(memcmp(lp_step, lr_step, (size_t)b.T * 4), 0, "after a step: max |dlogp| %.3e",
                 max_diff(lp_step, lr_step, b.T));
    qrl_model_train_destroy(cpu);
    qrl_model_train_cuda_destroy(a), qrl_model_train_cuda_destroy(r);
    free(ga), free(gr);
    qrl_model_free(m), qrl_model_free(mr);
}

Test(cuda_train_qat, options_are_checked) {
    require_gpu();
    qrl_model *m = st_load_model();
    qrl_model_train_cuda_t *g = NULL;
    qrl_error err;
    qrl_model_train_cuda_opts bad = {.max_tokens = 8, .qat_kv = true};
    cr_assert_eq(qrl_model_train_cuda_new(m, &bad, &g, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "need qat nvfp4"), "%s", err.msg);
    qrl_model_train_cuda_opts ok = {.max_tokens = 8, .qat = QRL_QAT_NVFP4, .trace_guidance = true};
    cr_assert_eq(qrl_model_train_cuda_new(m, &ok, &g, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_train_cuda_qat_attach(g, 4, 3, 2, NULL, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_model_train_cuda_qat_attach(g, 0, 3, 5, NULL, &err), QRL_OK);
    qrl_qat_stats st;
    cr_assert_eq(qrl_model_train_cuda_qat_stats(g, &st, true, &err), QRL_OK);
    cr_assert_eq(st.rows_unguided, 1);
    cr_assert_eq(qrl_model_train_cuda_qat_stats(g, &st, false, &err), QRL_OK);
    cr_assert_eq(st.rows_unguided, 0);
    qrl_model_train_cuda_destroy(g);
    qrl_model_free(m);
}

/* ---- version 0 under UAQ (cf94b40; docs/uaq.md, "QAT at version 0") --------------------- */

/* A BF16-valued qwen3 fixture (k 0: qwen3_bf16, untied; 1: qwen3 rounded to BF16, tied, a
 * checkpoint stored in BF16), UAQ-scaled by s unless s is 1 (the replica's copy). */
static qrl_model *bf16_fixture(int k, float s) {
    qrl_model *m = NULL;
    qrl_error err;
    cr_assert_eq(qrl_model_load(k ? "tests/fixtures/hf/qwen3" : "tests/fixtures/hf/qwen3_bf16",
                                &m, &err), QRL_OK, "%s", err.msg);
    if (k) qrl_model_round_bf16(m);
    if (s != 1.0f) cr_assert_eq(qrl_model_apply_uaq(m, s, &err), QRL_OK, "%s", err.msg);
    return m;
}

/* Layer l's projections in qat_weights' order and shapes; UAQ divides q, k, o, gate, down by
 * s (v and up are unscaled). */
static const bool uaq_scaled[7] = {true, true, false, true, true, false, true};
static void projections(qrl_model *m, int l, float *w[7], int rows[7], int cols[7]) {
    const qrl_model_config *c = &m->cfg;
    int D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim,
        KV = c->n_kv_heads * c->head_dim;
    qrl_layer_weights *x = &m->layers[l];
    float *ws[7] = {x->wq, x->wk, x->wv, x->wo, x->w_gate, x->w_up, x->w_down};
    int r[7] = {Q, KV, KV, D, F, F, D}, k[7] = {D, D, D, Q, D, D, F};
    memcpy(w, ws, sizeof ws), memcpy(rows, r, sizeof r), memcpy(cols, k, sizeof k);
}

/* The replica at version 0 quantizes the checkpoint W; the learner's masters hold W/s.  On
 * BF16-valued W many weights sit exactly on an FP4 rounding midpoint, where nvfp4(W/s) (the
 * CUDA engine before this test) and nvfp4(W) round to different sides, so update 1 trained
 * against another policy.  At s = 1.5 and 1.25, (W/s)*s is W for every BF16 value, so the
 * fixed recipe gives the replica's values exactly; at 1.7 it does not for every W (the CPU
 * engine's known limit): there only CUDA = CPU is asserted. */
Test(cuda_train_qat, uaq_version_0_quantizes_as_the_replica, .timeout = 120) {
    require_gpu();
    static const float scales[3] = {1.5f, 1.25f, 1.7f};
    {
        float *d = dmalloc(64 * 4), *da = dmalloc(4);
        qrl_error err;
        cr_assert_eq(cudaMemset(d, 0, 64 * 4), cudaSuccess);
        cr_assert_eq(qrl_cuda_qat_weight(d, 0, 0.0f, 4, 16, d, NULL, da, NULL, &err),
                     QRL_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(err.msg, "scale 0"), "%s", err.msg);
        cr_assert_eq(qrl_cuda_qat_weight(d, 0, NAN, 4, 16, d, NULL, da, NULL, &err),
                     QRL_STATUS_INVALID_ARGUMENT);
        cudaFree(d), cudaFree(da);
    }
    for (int k = 0; k < 2; k++)
        for (int si = 0; si < 3; si++) {
            const float s = scales[si];
            qrl_model *rep = bf16_fixture(k, 1.0f), *m = bf16_fixture(k, s),
                      *sub = bf16_fixture(k, s); /* m's masters, projections fake-quantized */
            qrl_error err;
            size_t scaled_n = 0, differ = 0, old_codes = 0;
            for (int l = 0; l < m->cfg.n_layers; l++) {
                float *w[7], *wr[7], *wsub[7];
                int rows[7], cols[7];
                projections(m, l, w, rows, cols);
                projections(rep, l, wr, rows, cols);
                projections(sub, l, wsub, rows, cols);
                for (int i = 0; i < 7; i++) {
                    const int R = rows[i], C = cols[i];
                    const size_t n = (size_t)R * C;
                    const float f = uaq_scaled[i] ? s : 1.0f;
                    float *want = malloc(n * 4), *got = malloc(n * 4), *ref = malloc(n * 4);
                    uint8_t *codes = malloc(n), *sc = malloc(n), *oc = malloc(n);
                    /* the CPU engine's qat_weights at version 0 */
                    for (size_t j = 0; j < n; j++) want[j] = w[i][j] * f;
                    qrl_model_train_qat_weight(want, R, C, codes, sc, want);
                    for (size_t j = 0; j < n; j++) want[j] /= f;
                    float *dw = dup_to_dev(w[i], n * 4), *dy = dmalloc(n * 4), *da = dmalloc(4);
                    cr_assert_eq(qrl_cuda_qat_weight(dw, 0, f, R, C, dy, NULL, da, NULL, &err),
                                 QRL_OK, "%s", err.msg);
                    to_host(got, dy, n * 4);
                    for (size_t j = 0; j < n; j++)
                        cr_assert(same_f32(got[j], want[j]), "k %d s %g layer %d proj %d [%zu]: "
                                  "%a vs %a", k, s, l, i, j, got[j], want[j]);
                    /* the replica's nvfp4(W), divided by s; the old recipe's codes nvfp4(W/s) */
                    qrl_model_train_qat_weight(w[i], R, C, oc, sc, ref);
                    qrl_model_train_qat_weight(wr[i], R, C, codes, sc, ref);
                    for (size_t j = 0; j < n; j++) {
                        float r = ref[j] / f;
                        differ += !same_f32(want[j], r);
                        old_codes += qrl_nibble_get(oc, (int64_t)j) != qrl_nibble_get(codes, (int64_t)j);
                    }
                    scaled_n += uaq_scaled[i] ? n : 0;
                    memcpy(wsub[i], want, n * 4);
                    cudaFree(dw), cudaFree(dy), cudaFree(da);
                    free(want), free(got), free(ref), free(codes), free(sc), free(oc);
                }
            }
            /* the engines on a fixed sequence: CUDA QAT (weights only) at version 0 = the plain
             * CUDA engine on the fake-quantized masters (the same BF16 GEMM operands) */
            const int V = m->cfg.vocab_size;
            seqb b = {.T = 32};
            for (int t = 0; t < b.T; t++) {
                b.tok[t] = (int32_t)((7 + 131 * t) % V), b.seg[t] = 0;
                b.tgt[t] = t + 1 < b.T ? (int32_t)((7 + 131 * (t + 1)) % V) : -1;
            }
            qrl_model_train_positions(b.pos, b.seg, b.T);
            qrl_model_train_cuda_opts qo = {.max_tokens = 32, .lm_head_chunk = 32,
                                            .qat = QRL_QAT_NVFP4, .qat_weights_only = true},
                                      po = {.max_tokens = 32, .lm_head_chunk = 32};
            qrl_model_train_cuda_t *gq, *gp;
            cr_assert_eq(qrl_model_train_cuda_new(m, &qo, &gq, &err), QRL_OK, "%s", err.msg);
            cr_assert_eq(qrl_model_train_cuda_new(sub, &po, &gp, &err), QRL_OK, "%s", err.msg);
            float lq[32], lp[32], lb[32], lq2[32], lc[32];
            cuda_fwd(gq, &b, lq, NULL);
            cuda_fwd(gp, &b, lp, NULL);
            /* a broadcast version (set_bf16) quantizes bf16(W/s) as it is; back to version 0 */
            qrl_model_train_cuda_qat_set_bf16(gq, true);
            cuda_fwd(gq, &b, lb, NULL);
            qrl_model_train_cuda_qat_set_bf16(gq, false);
            cuda_fwd(gq, &b, lq2, NULL);
            /* the CPU engine, the same options */
            qrl_model_train_opts co = {.max_tokens = 32, .qat = QRL_QAT_NVFP4,
                                       .qat_weights_only = true};
            qrl_model_train_t *cpu;
            cr_assert_eq(qrl_model_train_new_opts(m, &co, &cpu, &err), QRL_OK, "%s", err.msg);
            cr_assert_eq(qrl_model_train_forward(cpu, b.tok, b.tgt, b.pos, b.seg, b.T, lc, NULL,
                                                 &err), QRL_OK, "%s", err.msg);
            double zmax = 0;
            const float *z = qrl_model_train_logits(cpu);
            for (size_t i = 0; i < (size_t)b.T * V; i++) zmax = fmax(zmax, fabs(z[i]));
            double dp = max_diff(lq, lp, b.T), dc = max_diff(lq, lc, b.T),
                   db = max_diff(lb, lq, b.T);
            printf("qat uaq v0 %s s=%g: values != nvfp4(W)/s %zu, old nvfp4(W/s) codes differ "
                   "%zu of %zu (%.5f); cuda qat vs plain on quantized masters %.2e; vs cpu %.2e "
                   "(max|logit| %.1f); set_bf16 moved %.2e\n", k ? "qwen3-in-bf16" : "qwen3_bf16",
                   s, differ, old_codes, scaled_n, (double)old_codes / (double)scaled_n, dp, dc,
                   zmax, db);
            if (s != 1.7f) cr_assert_eq(differ, 0, "s %g: not the replica's codes", s);
            cr_assert_gt(old_codes, 0, "the fixture has no FP4 midpoint ties at s %g", s);
            /* bit-equal on an H200, 3.6e-2 apart on an H100 (why is not established: the two
             * engines may pick different cuBLAS algorithms there): within the CUDA-vs-CPU
             * bound */
            cr_assert(dp <= LOGP_FP4 * zmax, "qat vs plain on the quantized masters: "
                      "max |dlogp| %.3e", dp);
            cr_assert_eq(memcmp(lq2, lq, sizeof lq), 0, "set_bf16 off again: %.3e",
                         max_diff(lq2, lq, b.T));
            cr_assert_gt(db, 0.0, "set_bf16 changed nothing");
            cr_expect(dc <= LOGP_FP4 * zmax, "cuda vs cpu: logp max|diff| %.3e", dc);
            qrl_model_train_destroy(cpu);
            qrl_model_train_cuda_destroy(gq), qrl_model_train_cuda_destroy(gp);
            qrl_model_free(rep), qrl_model_free(m), qrl_model_free(sub);
        }
}
