/* CUDA decode step against the HBM floor (SPEC §10), per KV cache format: a random-weight
 * Qwen3-4B-shaped model (hidden 2560, 36 layers, 32 q / 8 kv heads, head_dim 128,
 * intermediate 9728, vocab 151936, tied LM head, QK-norm; --model qwen3-8b: hidden 4096,
 * intermediate 12288, separate LM head, the rest equal), BF16 weights, paged KV (block
 * 16) in bf16, int8, fp8, int4 and int4-protected (sink 16, recent 128) with random
 * contents, at KV4-RL's replay shapes for Qwen3-4B (early / mid / late, 5 phases each)
 * and batch 1/8/64 x context 1K/8K/32K.  A shape whose BF16 cache does not fit the GPU
 * has its batch halved until it does (the same batch for every format; printed).
 *
 * Per shape and format: 3 warm-up steps, then REPEATS steps, each timed with CUDA events
 * around qrl_cuda_forward_decode (greedy tokens back to the host); the median is reported.
 * Bytes per step = weight bytes (all layers + norms + LM head) + the KV bytes the
 * attention reads (qrl_cuda_forward_kv_bytes_read: codes and scales; int4-protected reads
 * its protected positions from the INT8 side cache).  Floor = bytes / the device-to-device
 * copy bandwidth measured in the same run (cudaMemcpy of 2 GiB, read + write counted).
 * Speedup = BF16 ms / format ms at the same shape in the same run; stage means are the
 * equal-weighted means over the 5 phases (as KV4-RL reports).
 *
 *   build/bench/decode [--out FILE] [--formats bf16,int8,...] [--grid 0|1] [--breakdown]
 *                      [--from N]  (skip the first N replay shapes: --from 10 --grid 0 = late only,
 *                                   --from 15 = the grid only)
 *                      [--shape BxC]  (that shape alone, e.g. under a profiler)
 *                      [--weights bf16|w8a8-int8|w8a8-fp8]  (weight precision of every engine;
 *                        the JSON names it; compare runs with bench/w8a8_decode_table.py)
 *                      [--grid-shapes BxC,BxC,...]  (up to 9 shapes in place of the grid)
 *   (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "decode: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "cuda/attention.cuh"
#include "cuda/gemm.cuh"
#include "cuda/pointwise.cuh"
#include "model/forward_cuda.h"

#include "cuda_bench.h"

#define REPEATS 10 /* the most; QRL_DECODE_REPEATS=N (1..10) times fewer (under a profiler) */
#define WARMUP 3
static int repeats = REPEATS;
#define BS 16

typedef struct shape { const char *stage; int batch, ctx; } shape;
static shape SHAPES[] = {
    {"early", 608, 621}, {"early", 576, 798}, {"early", 448, 1033}, {"early", 304, 1384},
    {"early", 168, 1963}, {"mid", 640, 874}, {"mid", 576, 1170}, {"mid", 464, 1506},
    {"mid", 336, 1968}, {"mid", 200, 2627}, {"late", 640, 1463}, {"late", 544, 1895},
    {"late", 400, 2568}, {"late", 272, 3518}, {"late", 176, 4767}, {"grid", 1, 1024},
    {"grid", 8, 1024}, {"grid", 64, 1024}, {"grid", 1, 8192}, {"grid", 8, 8192},
    {"grid", 64, 8192}, {"grid", 1, 32768}, {"grid", 8, 32768}, {"grid", 64, 32768}};
#define N_SHAPES (int)(sizeof SHAPES / sizeof *SHAPES)
#define N_REPLAY 15
static int n_shapes = N_SHAPES; /* --grid-shapes shortens the grid */
static qrl_precision WEIGHTS = QRL_PRECISION_BF16; /* --weights */
static const char *const FMT_NAMES[] = {"bf16", "int8", "fp8", "int4", "int4-protected"};
#define N_FMTS 5

/* Where the step time goes: the step's GEMMs alone (same shapes, back to back) and the
 * attention launcher alone (one layer's K/V of `batch` x `ctx` positions, run n_layers
 * times), each timed with events, median of 5. */
static void breakdown(int layers, int B, int ctx, double *gemm_ms, double *attn_ms) {
    qrl_error err;
    const int D = 2560, F = 9728, Q = 4096, KV = 1024, V = 151936, H = 32, KVH = 8, HD = 128;
    size_t wmax = (size_t)V * D;
    uint16_t *w, *x, *kc;
    float *y, *q, *work;
    int32_t *tab, *rseq, *rpos;
    int mb = (ctx + BS) / BS;
    size_t kvn = (size_t)B * mb * BS * KV;
    size_t wf = qrl_cuda_attention_work_floats(B, H, HD, ctx + 1);
    CK(cudaMalloc((void **)&w, wmax * 2));
    CK(cudaMalloc((void **)&x, (size_t)B * F * 2));
    CK(cudaMalloc((void **)&y, (size_t)B * V * 4));
    CK(cudaMalloc((void **)&kc, 2 * kvn * 2));
    CK(cudaMalloc((void **)&q, (size_t)B * Q * 4));
    CK(cudaMalloc((void **)&work, wf * 4));
    CK(cudaMalloc((void **)&tab, (size_t)B * mb * 4 + 2 * (size_t)B * 4));
    rseq = tab + (size_t)B * mb;
    rpos = rseq + B;
    int32_t *h = malloc(((size_t)B * mb + 2 * (size_t)B) * 4);
    for (size_t i = 0; i < (size_t)B * mb; i++) h[i] = (int32_t)i;
    for (int i = 0; i < B; i++) h[(size_t)B * mb + i] = i, h[(size_t)B * mb + B + i] = ctx;
    CK(cudaMemcpy(tab, h, ((size_t)B * mb + 2 * (size_t)B) * 4, cudaMemcpyHostToDevice));
    free(h);
    QK(qrl_cuda_fill_random_bf16(w, wmax, 5, 0, 0.02f, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(x, (size_t)B * F, 6, 0, 1, NULL, &err));
    QK(qrl_cuda_fill_random_bf16(kc, 2 * kvn, 7, 0, 1, NULL, &err));
    qrl_cuda_gemm *g;
    QK(qrl_cuda_gemm_new(&g, &err));
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    float tg[5], ta[5];
    qrl_cuda_attention_args a = {.out = x, .q = q, .k_cache = kc, .v_cache = kc + kvn,
                                 .block_tables = tab, .max_blocks_per_seq = mb, .block_size = BS,
                                 .row_seq = rseq, .row_pos = rpos, .n = B, .n_heads = H,
                                 .n_kv_heads = KVH, .head_dim = HD, .scale = 0.088f,
                                 .max_len = ctx + 1, .work = work, .work_floats = wf};
    const size_t M = (size_t)1 << 20;
    for (int it = -1; it < 5; it++) {
        /* one 200 MB weight region reused per layer: 36 x 200 MB >> L2, no cache reuse */
        CK(cudaEventRecord(e0, 0));
        for (int l = 0; l < layers; l++) {
            QK(qrl_cuda_gemm_bf16(g, y, x, w, B, D, Q + 2 * KV, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 16 * M, B, Q, D, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 40 * M, B, D, 2 * F, NULL, &err));
            QK(qrl_cuda_gemm_bf16(g, y, x, w + 100 * M, B, F, D, NULL, &err));
        }
        QK(qrl_cuda_gemm_bf16(g, y, x, w, B, D, V, NULL, &err));
        CK(cudaEventRecord(e1, 0));
        for (int l = 0; l < layers; l++) QK(qrl_cuda_attention(&a, NULL, &err));
        CK(cudaEventRecord(e2, 0));
        CK(cudaEventSynchronize(e2));
        if (it >= 0) {
            CK(cudaEventElapsedTime(&tg[it], e0, e1));
            CK(cudaEventElapsedTime(&ta[it], e1, e2));
        }
    }
    qsort(tg, 5, sizeof *tg, cmp_f);
    qsort(ta, 5, sizeof *ta, cmp_f);
    *gemm_ms = tg[2];
    *attn_ms = ta[2];
    qrl_cuda_gemm_free(g);
    cudaFree(w); cudaFree(x); cudaFree(y); cudaFree(kc); cudaFree(q); cudaFree(work); cudaFree(tab);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
}

typedef struct result { double ms, tok_s, gb, gbps, floor_ms, floor_frac, speedup; bool done; } result;

static long shape_blocks(const shape *s) {
    return (long)s->batch * ((s->ctx + WARMUP + REPEATS + 1 + BS - 1) / BS);
}

static qrl_model_config (*MODEL)(void) = qwen3_4b; /* --model */

/* Time shapes [s0, s1) with one engine of format fmt; res[s] filled. */
static void run_format(qrl_kv_format fmt, int s0, int s1, double bw, result *res) {
    qrl_error err;
    qrl_model_config cfg = MODEL();
    int max_rows = 0, max_ctx = 0;
    long blocks = 0;
    for (int s = s0; s < s1; s++) {
        if (shape_blocks(&SHAPES[s]) > blocks) blocks = shape_blocks(&SHAPES[s]);
        if (SHAPES[s].batch > max_rows) max_rows = SHAPES[s].batch;
        if (SHAPES[s].ctx + WARMUP + REPEATS + 1 > max_ctx) max_ctx = SHAPES[s].ctx + WARMUP + REPEATS + 1;
    }
    qrl_cuda_forward_desc d = {.max_rows = max_rows, .max_ctx = max_ctx, .block_size = BS,
                               .n_blocks = (int)blocks, .max_seqs = max_rows, .kv_format = fmt,
                               .protected_sink = QRL_KV_PROTECTED_DEFAULT_SINK,
                               .protected_recent = QRL_KV_PROTECTED_DEFAULT_RECENT,
                               .precision = WEIGHTS};
    qrl_cuda_forward *f;
    QK(qrl_cuda_forward_new(&cfg, &d, &f, &err));
    QK(qrl_cuda_forward_init_random(f, 1234, &err));
    cudaStream_t st = (cudaStream_t)qrl_cuda_forward_stream(f);
    size_t wbytes = qrl_cuda_forward_weight_bytes(f);
    int *seqs = malloc(max_rows * sizeof(int));
    int32_t *tok = malloc(max_rows * 4), *gt = malloc(max_rows * 4);
    float *lp = malloc(max_rows * 4);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int s = s0; s < s1; s++) {
        int B = SHAPES[s].batch, ctx = SHAPES[s].ctx;
        for (int i = 0; i < B; i++) {
            QK(qrl_cuda_forward_seq_new(f, &seqs[i], &err));
            QK(qrl_cuda_forward_seq_set_len_unwritten(f, seqs[i], ctx, &err));
            tok[i] = (int32_t)((i * 7919 + 13) % cfg.vocab_size);
        }
        float ms[REPEATS];
        double bytes[REPEATS];
        for (int it = -WARMUP; it < repeats; it++) {
            double b = (double)wbytes;
            for (int i = 0; i < B; i++)
                b += (double)qrl_cuda_forward_kv_bytes_read(f, qrl_cuda_forward_seq_len(f, seqs[i]) + 1);
            CK(cudaEventRecord(e0, st));
            QK(qrl_cuda_forward_decode(f, seqs, tok, B, NULL, gt, lp, &err));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (it >= 0) {
                CK(cudaEventElapsedTime(&ms[it], e0, e1));
                bytes[it] = b;
            }
            memcpy(tok, gt, B * 4);
        }
        double bmed = bytes[repeats / 2];
        qsort(ms, repeats, sizeof *ms, cmp_f);
        result *r = &res[s];
        r->ms = ms[repeats / 2];
        r->tok_s = B / (r->ms * 1e-3);
        r->gb = bmed / 1e9;
        r->gbps = r->gb / (r->ms * 1e-3);
        r->floor_ms = bmed / bw * 1e3;
        r->floor_frac = r->floor_ms / r->ms;
        r->done = true;
        fprintf(stderr, "%s %s %dx%d: min %.3f median %.3f max %.3f ms\n", qrl_kv_format_name(fmt),
                SHAPES[s].stage, B, ctx, ms[0], r->ms, ms[repeats - 1]);
        for (int i = 0; i < B; i++) qrl_cuda_forward_seq_free(f, seqs[i]);
    }
    qrl_cuda_forward_free(f);
    free(seqs); free(tok); free(gt); free(lp);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/decode-h200.json", *fmts = "bf16,int8,fp8,int4,int4-protected";
    int grid = 1, bd = 0, from = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) fmts = argv[++i];
        else if (!strcmp(argv[i], "--grid") && i + 1 < argc) grid = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--breakdown")) bd = 1; /* Qwen3-4B GEMM/attention split */
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "qwen3-4b")) MODEL = qwen3_4b;
            else if (!strcmp(m, "qwen3-8b")) MODEL = qwen3_8b;
            else {
                fprintf(stderr, "decode: --model: '%s' is not qwen3-4b or qwen3-8b\n", m);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--from") && i + 1 < argc) from = atoi(argv[++i]); /* first replay shape */
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc) {
            qrl_error perr;
            if (qrl_precision_parse(argv[++i], &WEIGHTS, &perr) != QRL_OK ||
                (WEIGHTS != QRL_PRECISION_BF16 && WEIGHTS != QRL_PRECISION_W8A8_INT8 &&
                 WEIGHTS != QRL_PRECISION_W8A8_FP8)) {
                fprintf(stderr, "decode: --weights: '%s' is not bf16, w8a8-int8 or w8a8-fp8\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--grid-shapes") && i + 1 < argc) { /* BxC,BxC,... as the grid */
            const char *p = argv[++i];
            int k = 0;
            while (*p) {
                int b = 0, c = 0, n = 0;
                if (k == N_SHAPES - N_REPLAY || sscanf(p, "%9dx%9d%n", &b, &c, &n) != 2 || b < 1 ||
                    c < 1 || (p[n] && p[n] != ',')) {
                    fprintf(stderr, "decode: --grid-shapes wants up to %d BATCHxCONTEXT, comma-separated, "
                            "got '%s'\n", N_SHAPES - N_REPLAY, argv[i]);
                    return 2;
                }
                SHAPES[N_REPLAY + k++] = (shape){"grid", b, c};
                p += n + (p[n] == ',');
            }
            if (k == 0) {
                fprintf(stderr, "decode: --grid-shapes is empty\n");
                return 2;
            }
            n_shapes = N_REPLAY + k;
        }
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) { /* one BxC shape only (profiling) */
            int b = 0, c = 0, n = 0;
            if (sscanf(argv[++i], "%9dx%9d%n", &b, &c, &n) != 2 || argv[i][n] || b < 1 || c < 1) {
                fprintf(stderr, "decode: --shape wants BATCHxCONTEXT (positive, < 1e9), got '%s'\n", argv[i]);
                return 2;
            }
            SHAPES[N_REPLAY - 1] = (shape){"custom", b, c};
            from = N_REPLAY - 1, grid = 0;
        } else {
            fprintf(stderr, "decode: unknown or incomplete argument '%s'\nusage: decode [--out FILE] "
                    "[--formats bf16,int8,fp8,int4,int4-protected] [--grid 0|1] [--breakdown] [--from N] "
                    "[--shape BxC] [--model qwen3-4b|qwen3-8b] [--weights bf16|w8a8-int8|w8a8-fp8] "
                    "[--grid-shapes BxC,...]\n", argv[i]);
            return 2;
        }
    }
    int n_on = 0;
    for (const char *p = fmts; *p;) { /* every listed format must be known */
        size_t len = strcspn(p, ",");
        bool known = false;
        for (int k = 0; k < N_FMTS; k++) known |= strlen(FMT_NAMES[k]) == len && !strncmp(p, FMT_NAMES[k], len);
        if (!known) {
            fprintf(stderr, "decode: --formats: '%.*s' is not one of bf16, int8, fp8, int4, int4-protected\n",
                    (int)len, p);
            return 2;
        }
        n_on++;
        p += len + (p[len] == ',');
    }
    if (n_on == 0 || from < 0 || from > N_REPLAY || (from == N_REPLAY && !grid)) {
        fprintf(stderr, "decode: nothing to run (--formats empty, --from outside 0..%d, or %d "
                "without the grid)\n", N_REPLAY - 1, N_REPLAY);
        return 2;
    }
    const char *rep = getenv("QRL_DECODE_REPEATS");
    if (rep) {
        char *end;
        long v = strtol(rep, &end, 10);
        repeats = *rep && !*end && v >= 1 && v <= REPEATS ? (int)v : 0;
        if (!repeats) {
            fprintf(stderr, "decode: QRL_DECODE_REPEATS must be 1..%d, got '%s'\n", REPEATS, rep);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "decode: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth();
    printf("model: %s shapes, random %s weights\n", MODEL == qwen3_8b ? "Qwen3-8B" : "Qwen3-4B",
           qrl_precision_name(WEIGHTS));
    printf("device: %s, %d SMs, %.1f GiB; copy bandwidth (read+write) %.0f GB/s\n", prop.name,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, bw / 1e9);
    /* halve a shape's batch until its BF16 cache fits next to the weights and activations */
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));
    int requested[N_SHAPES];
    for (int s = 0; s < n_shapes; s++) {
        requested[s] = SHAPES[s].batch;
        for (;;) {
            qrl_model_config mc = MODEL();
            double kv = (double)shape_blocks(&SHAPES[s]) * BS * mc.n_layers * 2 * mc.n_kv_heads * mc.head_dim * 2;
            double rows = SHAPES[s].batch, ctx = SHAPES[s].ctx + 16;
            double wgt = 2.0 * ((double)mc.vocab_size * mc.dim * (mc.tie_embeddings ? 1 : 2) +
                                (double)mc.n_layers * mc.dim *
                                    (3.0 * mc.hidden_dim + 2.0 * mc.n_heads * mc.head_dim +
                                     2.0 * mc.n_kv_heads * mc.head_dim));
            double act = wgt + rows * (mc.vocab_size * 4.0 + mc.n_heads * 130 * 4 * (ctx / 64 + 2)) + 1.0e9;
            if (kv + act + 3.0 * (1 << 30) < (double)free_b || SHAPES[s].batch == 1) break;
            SHAPES[s].batch /= 2;
        }
        if (SHAPES[s].batch != requested[s])
            printf("NOTE: %s %dx%d runs at batch %d (the BF16 cache of batch %d does not fit)\n",
                   SHAPES[s].stage, requested[s], SHAPES[s].ctx, SHAPES[s].batch, requested[s]);
    }
    static result res[N_FMTS][N_SHAPES];
    bool on[N_FMTS] = {0};
    for (int k = 0; k < N_FMTS; k++) {
        const char *p = strstr(fmts, FMT_NAMES[k]);
        /* "int4" must not match inside "int4-protected" */
        while (p && ((p != fmts && p[-1] != ',') || (p[strlen(FMT_NAMES[k])] && p[strlen(FMT_NAMES[k])] != ',')))
            p = strstr(p + 1, FMT_NAMES[k]);
        on[k] = p != NULL;
    }
    qrl_error err;
    for (int k = 0; k < N_FMTS; k++) {
        if (!on[k]) continue;
        qrl_kv_format fmt;
        QK(qrl_kv_format_parse(FMT_NAMES[k], &fmt, &err));
        if (from < N_REPLAY) run_format(fmt, from, N_REPLAY, bw, res[k]);
        if (grid) run_format(fmt, N_REPLAY, n_shapes, bw, res[k]);
    }
    for (int k = 0; k < N_FMTS; k++)
        for (int s = 0; s < N_SHAPES; s++)
            if (res[k][s].done && res[0][s].done) res[k][s].speedup = res[0][s].ms / res[k][s].ms;
    /* stage means (equal weight per phase) */
    static const char *const STAGES[] = {"early", "mid", "late"};
    double mean[3][N_FMTS][3] = {{{0}}}; /* ms, tok/s, speedup */
    for (int g = 0; g < 3; g++)
        for (int k = 0; k < N_FMTS; k++)
            for (int s = g * 5; s < g * 5 + 5; s++) {
                mean[g][k][0] += res[k][s].ms / 5;
                mean[g][k][1] += res[k][s].tok_s / 5;
                mean[g][k][2] += res[k][s].speedup / 5;
            }
    FILE *jf = fopen(out, "w");
    if (jf) {
        qrl_model_config cfg = MODEL();
        fprintf(jf, "{\n  \"device\": \"%s\",\n  \"model\": \"%s\",\n  \"weights\": \"%s\",\n  \"copy_bandwidth_gbps\": %.1f,\n  \"layers\": %d,\n"
                "  \"repeats\": %d,\n  \"block_size\": %d,\n  \"protected_sink\": %d,\n  \"protected_recent\": %d,\n"
                "  \"shapes\": [\n", prop.name, MODEL == qwen3_8b ? "qwen3-8b" : "qwen3-4b",
                qrl_precision_name(WEIGHTS), bw / 1e9, cfg.n_layers, repeats, BS,
                QRL_KV_PROTECTED_DEFAULT_SINK, QRL_KV_PROTECTED_DEFAULT_RECENT);
        bool first = true;
        for (int s = 0; s < N_SHAPES; s++) {
            bool any = false;
            for (int k = 0; k < N_FMTS; k++) any |= res[k][s].done;
            if (!any) continue;
            fprintf(jf, "%s    {\"stage\": \"%s\", \"batch\": %d, \"batch_requested\": %d, \"context\": %d, \"formats\": {",
                    first ? "" : ",\n", SHAPES[s].stage, SHAPES[s].batch, requested[s], SHAPES[s].ctx);
            first = false;
            bool f1 = true;
            for (int k = 0; k < N_FMTS; k++) {
                const result *r = &res[k][s];
                if (!r->done) continue;
                fprintf(jf, "%s\n      \"%s\": {\"ms_per_step\": %.4f, \"tokens_per_s\": %.1f, \"gb_per_step\": %.3f, "
                        "\"achieved_gbps\": %.1f, \"floor_ms\": %.4f, \"fraction_of_floor_speed\": %.3f, "
                        "\"speedup_vs_bf16\": %.3f}", f1 ? "" : ",", FMT_NAMES[k], r->ms, r->tok_s, r->gb,
                        r->gbps, r->floor_ms, r->floor_frac, r->speedup);
                f1 = false;
            }
            fprintf(jf, "}}");
        }
        fprintf(jf, "\n  ],\n  \"stage_means\": {");
        for (int g = 0; g < 3; g++) {
            fprintf(jf, "%s\n    \"%s\": {", g ? "," : "", STAGES[g]);
            bool f1 = true;
            for (int k = 0; k < N_FMTS; k++) {
                if (!res[k][g * 5].done) continue;
                fprintf(jf, "%s\"%s\": {\"ms_per_step\": %.4f, \"tokens_per_s\": %.1f, \"speedup_vs_bf16\": %.3f}",
                        f1 ? "" : ", ", FMT_NAMES[k], mean[g][k][0], mean[g][k][1], mean[g][k][2]);
                f1 = false;
            }
            fprintf(jf, "}");
        }
        fprintf(jf, "\n  }\n}\n");
        fclose(jf);
    } else {
        fprintf(stderr, "cannot write %s\n", out);
    }
    for (int k = 0; k < N_FMTS; k++) {
        if (!on[k]) continue;
        printf("\nkv %s\n%-6s %-11s %9s %9s %8s %7s %9s %7s %8s\n", FMT_NAMES[k], "stage", "batch×ctx",
               "ms/step", "tok/s", "GB/step", "GB/s", "floor ms", "floor/t", "vs bf16");
        for (int s = 0; s < N_SHAPES; s++) {
            const result *r = &res[k][s];
            if (!r->done) continue;
            char name[32];
            snprintf(name, sizeof name, "%dx%d", SHAPES[s].batch, SHAPES[s].ctx);
            printf("%-6s %-11s %9.3f %9.0f %8.2f %7.0f %9.3f %6.1f%% %7.2fx\n", SHAPES[s].stage, name,
                   r->ms, r->tok_s, r->gb, r->gbps, r->floor_ms, 100 * r->floor_frac, r->speedup);
        }
    }
    if (bd) { /* BF16 breakdown: the GEMMs alone and the attention alone, per replay shape */
        for (int s = 0; s < N_REPLAY; s++) {
            double g, a;
            breakdown(36, SHAPES[s].batch, SHAPES[s].ctx, &g, &a);
            printf("breakdown %dx%d: gemm %.3f ms, bf16 attention %.3f ms\n", SHAPES[s].batch, SHAPES[s].ctx, g, a);
        }
    }
    printf("\nstage means (5 phases, equal weight): ms/step | tokens/s | speedup over bf16\n%-6s", "stage");
    for (int k = 0; k < N_FMTS; k++) if (on[k]) printf(" %26s", FMT_NAMES[k]);
    printf("\n");
    for (int g = 0; g < 3; g++) {
        printf("%-6s", STAGES[g]);
        for (int k = 0; k < N_FMTS; k++)
            if (on[k]) printf(" %8.2f %9.0f %6.2fx", mean[g][k][0], mean[g][k][1], mean[g][k][2]);
        printf("\n");
    }
    if (on[0]) {
        if (on[4]) printf("target int4-protected >= 2.0x bf16 at late shapes: %.2fx %s\n", mean[2][4][2],
                          mean[2][4][2] >= 2.0 ? "MET" : "MISSED");
        if (on[1]) printf("target int8 >= 1.6x bf16 at late shapes: %.2fx %s\n", mean[2][1][2],
                          mean[2][1][2] >= 1.6 ? "MET" : "MISSED");
        if (on[2]) printf("target fp8 >= 1.6x bf16 at late shapes: %.2fx %s\n", mean[2][2][2],
                          mean[2][2][2] >= 1.6 ? "MET" : "MISSED");
    }
    return 0;
}
#endif
