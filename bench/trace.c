/* TRACE recorder cost in the CUDA decode step (SPEC §6; model/trace_rec_cuda.h): a
 * random-weight Qwen3-1.7B-shaped model (hidden 2048, 28 layers, 16 q / 8 kv heads,
 * head_dim 128, intermediate 6144, vocab 151936, tied LM head, QK-norm), w4a4-nvfp4 weights
 * and activations (the linear sites' records written by the engine's own activation
 * quantizers) and the fp4 KV cache (K / V records copied from the cache's own), the default
 * sites: every linear input, K / V of layers 14-27.  Should the CUDA engine refuse fp4 KV
 * (qrl_scheduler_check_device), an int8 KV cache records the same K / V sites from its F32
 * rows (one capture launch per layer as with fp4; the JSON and the table name the KV format
 * that ran).
 *
 * Per batch (context 1024, CUDA graphs on): STEPS decode steps without a recorder, then the
 * same steps with one (every row a target, a new token each step, the default 64-token
 * device window, so records go to the host in batches as in the scheduler), and the final
 * release + sync of every response counted in the recorded time.  Reported: median step
 * time of each (CUDA events around qrl_cuda_forward_decode), the mean including drains,
 * the recorder's share of the recorded step = (on - off) / on, its host time per step, and
 * record bytes per token (all sites; per captured layer: mean, a layer without K / V and
 * one with).  Anchor: the TRACE paper reports ~6% of rollout time for recording.
 *
 *   build/bench/trace [--out FILE] [--steps N] [--batches 1,8,32,64]   (GPU only) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef QRL_HAVE_CUDA
int main(void) {
    fprintf(stderr, "trace: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <time.h>

#include "model/forward_cuda.h"
#include "model/trace_rec_cuda.h"
#include "rollout/scheduler.h"

#include "cuda_bench.h"

#define CTX 1024
#define WINDOW 64
#define MAX_B 256

static qrl_model_config qwen3_1_7b(void) {
    qrl_model_config c = qwen3_4b();
    c.dim = 2048, c.hidden_dim = 6144, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8;
    return c;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct row { int batch; double off_ms, on_ms, off_mean, on_mean, share, host_us; } row;

/* STEPS decode steps of B rows at CTX; rec NULL: no recorder.  Median and mean ms. */
static void run(qrl_cuda_forward *f, qrl_cuda_trace_recorder *rec, const qrl_trace_layout *l,
                int B, int steps, const qrl_model_config *c, double *med, double *mean) {
    qrl_error err;
    int seqs[MAX_B];
    int32_t tok[MAX_B], gt[MAX_B];
    qrl_trace_buf *buf[MAX_B];
    for (int i = 0; i < B; i++) {
        QK(qrl_cuda_forward_seq_new(f, &seqs[i], &err));
        QK(qrl_cuda_forward_seq_set_len_unwritten(f, seqs[i], CTX, &err));
        tok[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
        buf[i] = NULL;
        if (rec) QK(qrl_trace_buf_new(l, (uint32_t)steps + 8, &buf[i], &err));
    }
    cudaStream_t st = (cudaStream_t)qrl_cuda_forward_stream(f);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *ms = malloc(steps * sizeof *ms);
    double t0 = 0;
    for (int it = -3; it < steps; it++) {
        if (it == 0) t0 = now_s();
        if (rec) {
            qrl_cuda_trace_recorder_clear(rec);
            for (int i = 0; i < B; i++)
                qrl_cuda_trace_recorder_target(rec, i, buf[i], qrl_trace_buf_n_tokens(buf[i]));
        }
        CK(cudaEventRecord(e0, st));
        QK(qrl_cuda_forward_decode(f, seqs, tok, B, NULL, gt, NULL, &err));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (it >= 0) CK(cudaEventElapsedTime(&ms[it], e0, e1));
        memcpy(tok, gt, B * 4);
    }
    if (rec) { /* the responses end: their last records come over */
        for (int i = 0; i < B; i++) qrl_cuda_trace_recorder_release(rec, seqs[i]);
        QK(qrl_cuda_trace_recorder_sync(rec, &err));
    }
    *mean = (now_s() - t0) * 1e3 / steps;
    qsort(ms, steps, sizeof *ms, cmp_f);
    *med = ms[steps / 2];
    for (int i = 0; i < B; i++) {
        qrl_cuda_forward_seq_free(f, seqs[i]);
        qrl_trace_buf_free(buf[i]);
    }
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    const char *out = "bench/results/trace-h200.json", *bl = "1,8,32,64";
    int steps = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) bl = argv[++i];
        else {
            fprintf(stderr, "usage: trace [--out FILE] [--steps N] [--batches 1,8,32,64]\n");
            return 2;
        }
    }
    int batches[16], nb = 0, max_b = 0;
    for (const char *p = bl; *p && nb < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) {
        batches[nb] = atoi(p);
        if (batches[nb] < 1 || batches[nb] > MAX_B) { fprintf(stderr, "trace: bad batch\n"); return 2; }
        if (batches[nb] > max_b) max_b = batches[nb];
        nb++;
    }
    if (steps < 8) steps = 8;
    qrl_error err;
    qrl_model_config cfg = qwen3_1_7b();
    int max_ctx = CTX + steps + 8;
    qrl_cuda_forward_desc d = {.max_rows = max_b < 32 ? 32 : max_b, .max_ctx = max_ctx,
                               .block_size = 16, .n_blocks = max_b * ((max_ctx + 15) / 16),
                               .max_seqs = max_b, .kv_format = QRL_KV_FORMAT_FP4,
                               .precision = QRL_PRECISION_W4A4_NVFP4};
    qrl_scheduler_config probe;
    qrl_scheduler_config_default(&probe);
    probe.device = 0;
    probe.kv_format = QRL_KV_FORMAT_FP4;
    if (qrl_scheduler_check_device(&probe, d.precision, &err) != QRL_OK) {
        printf("fp4 KV refused by the CUDA engine (%s): int8 KV, recording the same K / V sites\n",
               err.msg);
        d.kv_format = QRL_KV_FORMAT_INT8;
    }
    qrl_cuda_forward *f = NULL;
    QK(qrl_cuda_forward_new(&cfg, &d, &f, &err));
    QK(qrl_cuda_forward_init_random(f, 1234, &err));
    qrl_trace_sites sites;
    qrl_trace_sites_default(&sites);
    qrl_trace_layout *l;
    QK(qrl_trace_layout_new(&sites, &cfg, true, true, &l, &err));
    size_t bpt = qrl_trace_layout_record_bytes_per_token(l), shallow = 0, deep = 0;
    for (uint32_t s = 0; s < qrl_trace_layout_n_sites(l); s++) {
        uint32_t id = qrl_trace_layout_site_ids(l)[s], len = qrl_trace_layout_site_lens(l)[s];
        size_t b = 4 + (len + 15) / 16 + (len + 7) / 8;
        if ((int)(id >> 16) == 0) shallow += b;
        if ((int)(id >> 16) == cfg.n_layers - 1) deep += b;
    }
    qrl_cuda_trace_recorder *rec;
    QK(qrl_cuda_trace_recorder_new(l, &cfg, max_b, d.max_rows, WINDOW, qrl_cuda_forward_stream(f),
                                   &rec, &err));
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s; Qwen3-1.7B shapes, random %s weights, kv %s, context %d, %d steps, "
           "%u sites, %zu record bytes per token, recorder device memory %.1f MiB\n", prop.name,
           qrl_precision_name(d.precision), qrl_kv_format_name(d.kv_format), CTX, steps,
           qrl_trace_layout_n_sites(l), bpt, qrl_cuda_trace_recorder_device_bytes(rec) / 1048576.0);
    row rows[16];
    for (int b = 0; b < nb; b++) {
        row *r = &rows[b];
        r->batch = batches[b];
        QK(qrl_cuda_forward_set_recorder(f, NULL, &err));
        run(f, NULL, l, r->batch, steps, &cfg, &r->off_ms, &r->off_mean);
        QK(qrl_cuda_forward_set_recorder(f, rec, &err));
        uint64_t h0 = qrl_cuda_trace_recorder_host_ns(rec);
        run(f, rec, l, r->batch, steps, &cfg, &r->on_ms, &r->on_mean);
        r->host_us = (qrl_cuda_trace_recorder_host_ns(rec) - h0) / 1e3 / steps;
        r->share = (r->on_mean - r->off_mean) / r->on_mean;
        fprintf(stderr, "batch %d: off %.3f ms (mean %.3f), on %.3f ms (mean %.3f)\n", r->batch,
                r->off_ms, r->off_mean, r->on_ms, r->on_mean);
    }
    FILE *jf = fopen(out, "w");
    if (jf) {
        fprintf(jf, "{\n  \"device\": \"%s\",\n  \"model\": \"qwen3-1.7b-shapes\",\n  \"precision\": \"%s\",\n"
                "  \"kv\": \"%s\",\n  \"context\": %d,\n  \"steps\": %d,\n  \"window\": %d,\n"
                "  \"sites\": %u,\n  \"record_bytes_per_token\": %zu,\n"
                "  \"record_bytes_per_token_per_layer\": {\"mean\": %.1f, \"without_kv\": %zu, \"with_kv\": %zu},\n"
                "  \"paper_share\": 0.06,\n  \"rows\": [\n", prop.name, qrl_precision_name(d.precision),
                qrl_kv_format_name(d.kv_format), CTX, steps, WINDOW, qrl_trace_layout_n_sites(l), bpt,
                (double)bpt / cfg.n_layers, shallow, deep);
        for (int b = 0; b < nb; b++)
            fprintf(jf, "    {\"batch\": %d, \"off_ms\": %.4f, \"on_ms\": %.4f, \"off_mean_ms\": %.4f, "
                    "\"on_mean_ms\": %.4f, \"share\": %.4f, \"host_us_per_step\": %.1f}%s\n",
                    rows[b].batch, rows[b].off_ms, rows[b].on_ms, rows[b].off_mean, rows[b].on_mean,
                    rows[b].share, rows[b].host_us, b + 1 < nb ? "," : "");
        fprintf(jf, "  ]\n}\n");
        fclose(jf);
    }
    printf("record bytes per token: %zu (per captured layer: mean %.0f, without k/v %zu, with k/v %zu)\n",
           bpt, (double)bpt / cfg.n_layers, shallow, deep);
    printf("%6s %10s %10s %12s %12s %8s %10s   (anchor: TRACE paper ~6%% of rollout time)\n", "batch",
           "off_ms", "on_ms", "off_mean_ms", "on_mean_ms", "share", "host_us");
    for (int b = 0; b < nb; b++)
        printf("%6d %10.3f %10.3f %12.3f %12.3f %7.2f%% %10.1f\n", rows[b].batch, rows[b].off_ms,
               rows[b].on_ms, rows[b].off_mean, rows[b].on_mean, 100 * rows[b].share, rows[b].host_us);
    QK(qrl_cuda_forward_set_recorder(f, NULL, &err));
    qrl_cuda_trace_recorder_free(rec);
    qrl_trace_layout_free(l);
    qrl_cuda_forward_free(f);
    return 0;
}
#endif
