/* How far a tiny perturbation of the activations moves a quantized forward's logits, on
 * the CPU engine alone: the yardstick for the CUDA-vs-CPU logit bounds of the FP4
 * activation formats (tests/cuda/test_cuda_w4a4.c).  The GPU keeps its activations in
 * BF16 where the CPU keeps F32, so every site's input differs by up to 2^-8 relative; a
 * weight-only or 8-bit format turns that into a logit change of the same order, while
 * w4a4-nvfp4 re-quantizes every linear input to E2M1 (8 magnitudes), and an input that
 * lands near a rounding midpoint changes code, a step of up to a third of its value.
 * Here the perturbation is the token embedding multiplied by (1 + u 2^-8), u uniform in
 * [-1, 1] (fixed seed): it reaches every layer through the residual stream and changes no
 * weight code.  Prints, per precision and KV format, the worst max|logit - logit'| /
 * max|logit| over the rows of a prompt (the statistic quant_forward_check.h bounds).
 *   build/bench/fp4_sensitivity [MODEL]   (default QRL_DATA_DIR or ../shared/data
 *                                          llama2c_stories260K/stories260K.bin) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

static void die(const char *what, const qrl_error *e) {
    fprintf(stderr, "fp4_sensitivity: %s: %s\n", what, e->msg);
    exit(1);
}

static void logits_all(const qrl_model *m, qrl_kv_format fmt, const int32_t *ids, int n, float *out) {
    qrl_error err;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = 16, .n_blocks = n / 16 + 2,
                           .max_seqs = 1, .max_seq_len = n, .format = fmt};
    qrl_kv_cache *kv;
    qrl_forward *f;
    int seq;
    if (qrl_kv_cache_new(&d, &kv, &err) != QRL_OK) die("kv cache", &err);
    if (qrl_forward_new(m, 64, n, &f, &err) != QRL_OK) die("forward", &err);
    if (qrl_kv_cache_seq_new(kv, &seq, &err) != QRL_OK) die("seq", &err);
    if (qrl_forward_prefill(f, kv, seq, ids, n, out, true, &err) != QRL_OK) die("prefill", &err);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

static qrl_model *load(const char *path, qrl_precision p, int perturb) {
    qrl_model *m;
    qrl_error err;
    if (qrl_model_load(path, &m, &err) != QRL_OK) die(path, &err);
    if (perturb) {
        uint64_t s = 0x9E3779B97F4A7C15ull;
        size_t n = (size_t)m->cfg.vocab_size * m->cfg.dim;
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            double u = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
            m->tok_embedding[i] *= (float)(1.0 + u / 256.0);
        }
    }
    if (p != QRL_PRECISION_F32 && qrl_model_quantize(m, p, &err) != QRL_OK) die("quantize", &err);
    return m;
}

int main(int argc, char **argv) {
    char def[4096];
    const char *dir = getenv("QRL_DATA_DIR");
    snprintf(def, sizeof def, "%s/llama2c_stories260K/stories260K.bin", dir ? dir : "../shared/data");
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fp4_sensitivity [MODEL]  (default %s): the CPU engine's logit change per\n"
               "precision / KV format when the token embedding is scaled by 1 + 2^-8 u\n", def);
        return 0;
    }
    const char *path = argc > 1 ? argv[1] : def;
    const struct { qrl_precision p; qrl_kv_format kv; const char *name; } runs[] = {
        {QRL_PRECISION_F32, QRL_KV_FORMAT_F32, "f32 / f32 KV"},
        {QRL_PRECISION_W8A8_INT8, QRL_KV_FORMAT_F32, "w8a8-int8 / f32 KV"},
        {QRL_PRECISION_W4A16_NVFP4, QRL_KV_FORMAT_F32, "w4a16-nvfp4 / f32 KV"},
        {QRL_PRECISION_F32, QRL_KV_FORMAT_INT4, "f32 / int4 KV"},
        {QRL_PRECISION_F32, QRL_KV_FORMAT_FP4, "f32 / fp4 KV"},
        {QRL_PRECISION_W4A4_NVFP4, QRL_KV_FORMAT_F32, "w4a4-nvfp4 / f32 KV"},
        {QRL_PRECISION_W4A4_NVFP4, QRL_KV_FORMAT_FP4, "w4a4-nvfp4 / fp4 KV"},
    };
    enum { N = 120 };
    int32_t ids[N];
    uint64_t s = 7;
    qrl_model *probe = load(path, QRL_PRECISION_F32, 0);
    int V = probe->cfg.vocab_size;
    qrl_model_free(probe);
    for (int i = 0; i < N; i++) s = s * 6364136223846793005ull + 1442695040888963407ull, ids[i] = (int32_t)(s >> 33) % V;
    float *a = malloc((size_t)N * V * 4), *b = malloc((size_t)N * V * 4);
    printf("%s, %d tokens; token embedding scaled by 1 + 2^-8 u (the GPU's BF16 rounding; tied\n"
           "models move their LM head too); worst / mean over rows of max|dlogit| / max|logit|\n", path, N);
    printf("%-24s %12s %12s\n", "precision / KV", "worst_rel", "mean_rel");
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        qrl_model *m0 = load(path, runs[r].p, 0), *m1 = load(path, runs[r].p, 1);
        logits_all(m0, runs[r].kv, ids, N, a);
        logits_all(m1, runs[r].kv, ids, N, b);
        double worst = 0, mean = 0;
        for (int t = 0; t < N; t++) {
            double zmax = 0, d = 0;
            for (int v = 0; v < V; v++) {
                zmax = fmax(zmax, fabs(a[(size_t)t * V + v]));
                d = fmax(d, fabs(a[(size_t)t * V + v] - b[(size_t)t * V + v]));
            }
            worst = fmax(worst, d / zmax), mean += d / zmax / N;
        }
        printf("%-24s %12.3e %12.3e\n", runs[r].name, worst, mean);
        qrl_model_free(m0), qrl_model_free(m1);
    }
    free(a), free(b);
    return 0;
}
