/* bench/train_step: training throughput of the CUDA engine (common/train/model_train_cuda.h)
 * on Qwen2.5-shaped models (0.5B: 24 layers, D 896, 14/2 heads of 64, F 4864; 1.5B: 28
 * layers, D 1536, 12/2 heads of 128, F 8960; vocab 151936, tied head), one packed
 * sequence of S tokens per GPU per step (S = 2048 and 8192), on 1 and 2 GPUs (data
 * parallel: gradients all-reduced over NCCL during the backward).  A step is zero_grad,
 * forward, backward, AdamW.
 *
 * MFU = 6 N tokens / time / (gpus x the BF16 GEMM rate measured in the same run: cuBLAS,
 * 8192^3, BF16 in, F32 accumulate), N = the parameters every token multiplies (all
 * linear layers incl. the LM head; the embedding gather is not a matmul).  The column
 * "MFU+attn" adds the causal attention FLOPs (6 L S Q per token: QK^T and PV forward,
 * twice that backward, half masked).  Weights are random (a fast uniform fill with the
 * std of qrl_model_init_random): speed does not depend on their values.
 * QAT (--qat off,nvfp4,kv; model_train_cuda.h's opts.qat): nvfp4 fake-quantizes the
 * weights (once per step, after AdamW) and the linear inputs, kv also K and V, both with
 * trace_guidance on and no records attached (nearest rounding; the record table is still
 * uploaded and read); the table then prints each mode's tokens/s against off's.  Model
 * qwen3-0.6b: 28 layers, D 1024, 16/8 heads of 128, F 3072, q/k norms, tied head.
 * Usage: train_step [--models 0.5b,1.5b,qwen3-0.6b] [--seqs 2048,8192] [--gpus 1,2]
 *                   [--steps N] [--recompute] [--qat off,nvfp4,kv] [--out FILE]
 *                   (JSON, default bench/results/train_step-h200.json) */
#include <stdio.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "train_step: built without CUDA\n");
    return 77;
}
#else
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/gemm.cuh"
#include "cuda/runtime.cuh"
#include "model/model.h"
#include "train/model_train_cuda.h"

static void die(const char *what, const qrl_error *err) {
    fprintf(stderr, "train_step: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* cuBLAS BF16 GEMM rate (TFLOP/s), best of 10 after warmup. */
static double gemm_peak(void) {
    const int n = 8192;
    qrl_error err;
    qrl_cuda_gemm *g;
    void *a, *b, *c;
    if (qrl_cuda_gemm_new(&g, &err) || qrl_cuda_malloc(&a, (size_t)n * n * 2, &err) ||
        qrl_cuda_malloc(&b, (size_t)n * n * 2, &err) || qrl_cuda_malloc(&c, (size_t)n * n * 4, &err))
        die("gemm peak setup", &err);
    double best = 0;
    for (int i = 0; i < 13; i++) {
        double t0 = now();
        if (qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, c, 1, a, b, n, n, n, 0.0f, NULL, &err) ||
            qrl_cuda_synchronize(&err))
            die("gemm peak", &err);
        double t = now() - t0;
        if (i >= 3 && 2.0 * n * n * (double)n / t / 1e12 > best) best = 2.0 * n * n * (double)n / t / 1e12;
    }
    qrl_cuda_free(a), qrl_cuda_free(b), qrl_cuda_free(c);
    qrl_cuda_gemm_free(g);
    return best;
}

static qrl_model *make_model(const char *name) {
    bool big = !strcmp(name, "1.5b"), q3 = !strcmp(name, "qwen3-0.6b");
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN2, .dim = big ? 1536 : 896,
                          .hidden_dim = big ? 8960 : 4864, .n_layers = big ? 28 : 24,
                          .n_heads = big ? 12 : 14, .n_kv_heads = 2, .head_dim = big ? 128 : 64,
                          .vocab_size = 151936, .max_seq_len = 32768, .norm_eps = 1e-6f,
                          .qkv_bias = true, .tie_embeddings = true,
                          .rope = {.theta = 1e6, .layout = QRL_ROPE_LAYOUT_HALF}};
    if (q3) {
        c.arch = QRL_MODEL_ARCH_LLAMA, c.dim = 1024, c.hidden_dim = 3072, c.n_layers = 28;
        c.n_heads = 16, c.n_kv_heads = 8, c.head_dim = 128, c.qkv_bias = false;
        c.qk_norm = true;
    }
    snprintf(c.model_type, sizeof c.model_type, "%s", q3 ? "qwen3" : "qwen2");
    qrl_model *m;
    qrl_error err;
    if (qrl_model_new(&c, &m, &err)) die("model", &err);
    float a = (float)(0.02 * sqrt(768.0 / c.dim) * sqrt(3.0)); /* uniform with that std */
    for (int i = 0; i < m->n_tensors; i++) {
        qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < cnt; j++) {
            uint64_t z = (j + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i << 40;
            z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
            float u = (float)((z >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
            t->data[j] = t->ndim == 2 ? a * u : 1.0f + 0.1f * u;
        }
    }
    return m;
}

/* Parameters each token multiplies: every linear layer and the LM head. */
static double matmul_params(const qrl_model_config *c) {
    double D = c->dim, Q = (double)c->n_heads * c->head_dim, KV = (double)c->n_kv_heads * c->head_dim;
    return c->n_layers * (D * Q + 2 * D * KV + Q * D + 3 * D * c->hidden_dim) +
           (double)c->vocab_size * D;
}

typedef struct rank {
    qrl_model_train_cuda_t *g;
    int S, steps, accum;
    double t_fwd, t_bwd, t_opt; /* seconds over the measured steps */
    int32_t *tok, *tgt, *pos, *seg;
    float *dlogp;
    qrl_adamw_config cfg;
    double t;
    qrl_error err;
    qrl_status st;
} rank;

static void *rank_main(void *p) {
    rank *r = p;
    double t0 = 0;
    for (int i = 0; i < r->steps + 2 && r->st == QRL_OK; i++) { /* 2 warmup steps */
        if (i == 2) {
            if ((r->st = qrl_model_train_cuda_sync(r->g, &r->err))) break;
            t0 = now();
        }
        qrl_model_train_cuda_zero_grad(r->g);
        /* every engine call ends with a stream sync: wall time between calls is the phase */
        for (int a = 0; a < r->accum && !r->st; a++) {
            double t1 = now();
            r->st = qrl_model_train_cuda_forward(r->g, r->tok, r->tgt, r->pos, r->seg, r->S, NULL,
                                                 NULL, &r->err);
            double t2 = now();
            if (!r->st)
                r->st = qrl_model_train_cuda_backward(r->g, r->dlogp, NULL, a + 1 == r->accum,
                                                      &r->err);
            if (i >= 2) r->t_fwd += t2 - t1, r->t_bwd += now() - t2;
        }
        double t3 = now();
        if (!r->st) r->st = qrl_model_train_cuda_adamw_step(r->g, &r->cfg, 1e-5, NULL, &r->err);
        if (i >= 2) r->t_opt += now() - t3;
    }
    if (!r->st) r->st = qrl_model_train_cuda_sync(r->g, &r->err);
    r->t = now() - t0;
    return NULL;
}

static const char *QAT_NAME[3] = {"off", "nvfp4", "kv"};

typedef struct result {
    char model[16];
    int qat; /* 0 off, 1 nvfp4, 2 nvfp4 + K/V */
    int S, gpus, accum;
    bool recompute;
    double step_s, tok_s, mfu, mfu_attn, mem_gib, fwd_ms, bwd_ms, opt_ms;
} result;

static bool run(qrl_model *m, const char *name, int S, int gpus, bool recompute, int steps,
                int accum, int qat, double peak, result *res) {
    rank r[2];
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    if (gpus > 1 && ncclCommInitAll(comms, gpus, devs) != ncclSuccess) die("ncclCommInitAll", NULL);
    size_t mem = 0;
    for (int k = 0; k < gpus; k++) {
        memset(&r[k], 0, sizeof r[k]);
        qrl_model_train_cuda_opts o = {.max_tokens = S, .recompute_activations = recompute,
                                       .device = k, .qat = qat ? QRL_QAT_NVFP4 : QRL_QAT_OFF,
                                       .qat_kv = qat == 2, .trace_guidance = qat > 0};
        if (qrl_model_train_cuda_new(m, &o, &r[k].g, &r[k].err)) {
            fprintf(stderr, "train_step: %s S=%d gpus=%d: %s\n", name, S, gpus, r[k].err.msg);
            for (int j = 0; j < k; j++) qrl_model_train_cuda_destroy(r[j].g);
            if (gpus > 1) for (int j = 0; j < gpus; j++) ncclCommDestroy(comms[j]);
            return false;
        }
        if (gpus > 1) qrl_model_train_cuda_set_comm(r[k].g, comms[k]);
        r[k].S = S, r[k].steps = steps, r[k].accum = accum, r[k].cfg = qrl_adamw_config_default();
        r[k].tok = malloc(S * 4), r[k].tgt = malloc(S * 4), r[k].pos = malloc(S * 4);
        r[k].seg = calloc(S, 4), r[k].dlogp = malloc(S * 4);
        for (int t = 0; t < S; t++) {
            r[k].tok[t] = (int32_t)(((uint64_t)(t + 1) * 2654435761u + k) % 151936);
            r[k].pos[t] = t;
            r[k].dlogp[t] = -1.0f / S;
        }
        for (int t = 0; t < S; t++) r[k].tgt[t] = t + 1 < S ? r[k].tok[t + 1] : -1;
    }
    pthread_t th[2];
    for (int k = 0; k < gpus; k++) pthread_create(&th[k], NULL, rank_main, &r[k]);
    for (int k = 0; k < gpus; k++) pthread_join(th[k], NULL);
    bool ok = true;
    double t = 0;
    for (int k = 0; k < gpus; k++) {
        if (r[k].st) {
            fprintf(stderr, "train_step: %s S=%d gpus=%d rank %d: %s\n", name, S, gpus, k,
                    r[k].err.msg);
            ok = false;
        }
        if (r[k].t > t) t = r[k].t;
        if (k == 0) mem = qrl_model_train_cuda_bytes(r[k].g, NULL);
        qrl_model_train_cuda_destroy(r[k].g);
        free(r[k].tok), free(r[k].tgt), free(r[k].pos), free(r[k].seg), free(r[k].dlogp);
    }
    if (gpus > 1) for (int k = 0; k < gpus; k++) ncclCommDestroy(comms[k]);
    if (!ok) return false;
    const qrl_model_config *c = &m->cfg;
    double tokens = (double)S * gpus * steps * accum, N = matmul_params(c);
    double attn = 6.0 * c->n_layers * (double)S * c->n_heads * c->head_dim; /* per token */
    snprintf(res->model, sizeof res->model, "%s", name);
    res->S = S, res->gpus = gpus, res->recompute = recompute, res->accum = accum, res->qat = qat;
    res->step_s = t / steps;
    res->fwd_ms = 1e3 * r[0].t_fwd / (steps * accum), res->bwd_ms = 1e3 * r[0].t_bwd / (steps * accum);
    res->opt_ms = 1e3 * r[0].t_opt / steps;
    res->tok_s = tokens / t;
    res->mfu = 6.0 * N * res->tok_s / (gpus * peak * 1e12);
    res->mfu_attn = (6.0 * N + attn) * res->tok_s / (gpus * peak * 1e12);
    res->mem_gib = mem / 1073741824.0;
    return true;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    for (const char *p = s; *p && n < max; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
        out[n++] = atoi(p);
    return n;
}

int main(int argc, char **argv) {
    const char *out = "bench/results/train_step-h200.json", *models = "0.5b,1.5b";
    int seqs[4] = {2048, 8192}, ns = 2, gl[2] = {1, 2}, ng = 2, steps = 5, accum = 1;
    int qats[3] = {0}, nq = 1;
    bool recompute = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) ns = parse_list(argv[++i], seqs, 4);
        else if (!strcmp(argv[i], "--gpus") && i + 1 < argc) ng = parse_list(argv[++i], gl, 2);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--accum") && i + 1 < argc) accum = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recompute")) recompute = true;
        else if (!strcmp(argv[i], "--qat") && i + 1 < argc) {
            nq = 0;
            char ql[64];
            snprintf(ql, sizeof ql, "%s", argv[++i]);
            for (char *q = strtok(ql, ","); q && nq < 3; q = strtok(NULL, ",")) {
                int k = !strcmp(q, "off") ? 0 : !strcmp(q, "nvfp4") ? 1 : !strcmp(q, "kv") ? 2 : -1;
                if (k < 0) {
                    fprintf(stderr, "train_step: --qat '%s': off, nvfp4 or kv\n", q);
                    return 2;
                }
                qats[nq++] = k;
            }
        } else {
            fprintf(stderr, "usage: %s [--models 0.5b,1.5b,qwen3-0.6b] [--seqs 2048,8192] "
                            "[--gpus 1,2] [--steps N] [--accum N] [--recompute] "
                            "[--qat off,nvfp4,kv] [--out FILE]\n", argv[0]);
            return 2;
        }
    }
    int ndev = 0;
    qrl_cuda_device_count(&ndev, NULL);
    if (accum < 1 || steps < 1) {
        fprintf(stderr, "train_step: --steps and --accum must be >= 1\n");
        return 2;
    }
    if (ndev == 0) {
        fprintf(stderr, "train_step: no CUDA device\n");
        return 77;
    }
    char desc[256] = "";
    qrl_cuda_device_describe(0, desc, sizeof desc, NULL);
    double peak = gemm_peak();
    printf("%s; cuBLAS BF16 GEMM 8192^3: %.1f TFLOP/s (the MFU denominator)\n", desc, peak);
    result res[32];
    int nr = 0;
    char mlist[64];
    snprintf(mlist, sizeof mlist, "%s", models);
    for (char *name = strtok(mlist, ","); name; name = strtok(NULL, ",")) {
        if (strcmp(name, "0.5b") != 0 && strcmp(name, "1.5b") != 0 &&
            strcmp(name, "qwen3-0.6b") != 0) {
            fprintf(stderr, "train_step: unknown model '%s' (0.5b, 1.5b or qwen3-0.6b)\n", name);
            return 2;
        }
        qrl_model *m = make_model(name);
        printf("model %s: %.3f B parameters (%.3f B in matmuls)\n", name,
               (double)(m->rope_inv_freq - m->arena) / 1e9, matmul_params(&m->cfg) / 1e9);
        for (int si = 0; si < ns; si++)
            for (int gi = 0; gi < ng; gi++) {
                for (int qi = 0; qi < nq; qi++) {
                    if (gl[gi] > ndev || gl[gi] < 1 || gl[gi] > 2 || nr == 32) continue;
                    if (run(m, name, seqs[si], gl[gi], recompute, steps, accum, qats[qi], peak,
                            &res[nr]))
                        nr++;
                }
            }
        qrl_model_free(m);
    }
    printf("\n%d micro-batch(es) of one sequence per GPU per optimizer step; fwd/bwd ms per "
           "micro-batch, opt ms per step (rank 0)\n", accum);
    printf("%-10s %6s %5s %7s %5s %9s %11s %7s %9s %8s %8s %8s %8s %7s\n", "model", "seq",
           "gpus", "recomp", "qat", "step s", "tokens/s", "MFU", "MFU+attn", "fwd ms", "bwd ms",
           "opt ms", "mem GiB", "vs off");
    for (int i = 0; i < nr; i++) {
        double base = 0; /* the same shape without QAT, when it ran */
        for (int j = 0; j < nr; j++)
            if (res[j].qat == 0 && !strcmp(res[j].model, res[i].model) && res[j].S == res[i].S &&
                res[j].gpus == res[i].gpus)
                base = res[j].tok_s;
        printf("%-10s %6d %5d %7s %5s %9.3f %11.0f %6.1f%% %8.1f%% %8.1f %8.1f %8.1f %8.1f %6.3fx\n",
               res[i].model, res[i].S, res[i].gpus, res[i].recompute ? "yes" : "no",
               QAT_NAME[res[i].qat], res[i].step_s, res[i].tok_s, 100 * res[i].mfu,
               100 * res[i].mfu_attn, res[i].fwd_ms, res[i].bwd_ms, res[i].opt_ms,
               res[i].mem_gib, base > 0 ? res[i].tok_s / base : 0.0);
    }
    FILE *f = fopen(out, "w");
    if (!f) die(out, NULL);
    fprintf(f, "{\n  \"bench\": \"train_step\",\n  \"device\": \"%s\",\n  \"gemm_bf16_tflops\": %.1f,\n"
               "  \"steps\": %d,\n  \"results\": [", desc, peak, steps);
    for (int i = 0; i < nr; i++)
        fprintf(f, "%s\n    {\"model\": \"%s\", \"qat\": \"%s\", \"seq\": %d, \"gpus\": %d, \"recompute\": %s, "
                   "\"accum\": %d, \"step_s\": %.4f, \"tokens_per_s\": %.0f, \"mfu\": %.4f, "
                   "\"mfu_with_attention\": %.4f, \"fwd_ms\": %.2f, \"bwd_ms\": %.2f, \"opt_ms\": %.2f, "
                   "\"device_mem_gib\": %.2f}",
                i ? "," : "", res[i].model, QAT_NAME[res[i].qat], res[i].S, res[i].gpus, res[i].recompute ? "true" : "false",
                res[i].accum, res[i].step_s, res[i].tok_s, res[i].mfu, res[i].mfu_attn, res[i].fwd_ms,
                res[i].bwd_ms, res[i].opt_ms, res[i].mem_gib);
    fprintf(f, "\n  ]\n}\n");
    fclose(f);
    printf("wrote %s\n", out);
    return 0;
}
#endif /* QRL_HAVE_CUDA */
