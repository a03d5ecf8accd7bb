/* Helpers shared by the model tests (header-only; every function static inline). */
#ifndef QRL_TESTS_MODEL_TEST_UTIL_H
#define QRL_TESTS_MODEL_TEST_UTIL_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "support/test_files.h"

static inline void mt_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
}

/* Minimal safetensors writer (independent of the io module, so the loader tests do not
 * test the io code against itself).  dtype "F32" or "BF16"; data is F32 and converted
 * (BF16 by truncation-free RNE).  shapes[i] has ndims[i] entries. */
typedef struct mt_tensor {
    const char *name;
    int ndim;
    int64_t shape[2];
    const float *data;
} mt_tensor;

static inline uint16_t mt_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline void mt_write_safetensors(const char *path, const mt_tensor *t, int n,
                                        const char *dtype) {
    size_t esz = strcmp(dtype, "F32") == 0 ? 4 : 2;
    json_t *hdr = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].shape[0] * (size_t)(t[i].ndim == 2 ? t[i].shape[1] : 1);
        json_t *sh = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(sh, json_integer(t[i].shape[d]));
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(dtype));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets",
                            json_pack("[I, I]", (json_int_t)off, (json_int_t)(off + cnt * esz)));
        json_object_set_new(hdr, t[i].name, e);
        off += cnt * esz;
    }
    char *js = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t hl = strlen(js);
    size_t pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint64_t hl64 = hl + pad;
    fwrite(&hl64, 8, 1, f);
    fwrite(js, 1, hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    free(js);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)t[i].shape[0] * (size_t)(t[i].ndim == 2 ? t[i].shape[1] : 1);
        if (esz == 4) {
            fwrite(t[i].data, 4, cnt, f);
        } else {
            for (size_t j = 0; j < cnt; j++) {
                uint16_t h = mt_bf16(t[i].data[j]);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    fclose(f);
}

/* Write model m's tensors as an HF folder (config.json text given) in dir.  `skip`
 * names a tensor to leave out, `reshape` one whose first dim is written one larger
 * (NULL for none). */
static inline void mt_save_hf(const qrl_model *m, const char *dir, const char *config_json,
                              const char *dtype, const char *skip, const char *reshape) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    mt_write_text(p, config_json);
    mt_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    float *big = NULL;
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *s = &m->tensors[i];
        if (skip && strcmp(s->name, skip) == 0) continue;
        t[n].name = s->name;
        t[n].ndim = s->ndim;
        t[n].shape[0] = s->shape[0];
        t[n].shape[1] = s->shape[1];
        t[n].data = s->data;
        if (reshape && strcmp(s->name, reshape) == 0) {
            size_t row = (size_t)(s->ndim == 2 ? s->shape[1] : 1);
            big = calloc((size_t)(s->shape[0] + 1) * row, sizeof(float));
            t[n].shape[0]++;
            t[n].data = big;
        }
        n++;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    mt_write_safetensors(p, t, n, dtype);
    free(big);
    free(t);
}

/* max |a - b| and max |b| over n floats. */
static inline void mt_max_diff(const float *a, const float *b, size_t n, double *max_diff,
                               double *max_ref) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || d != d) md = d;
        if (fabs((double)b[i]) > mr) mr = fabs((double)b[i]);
    }
    *max_diff = md;
    *max_ref = mr;
}

/* A packed training batch (train/model_train.h's format) of up to 64 tokens, with the
 * coefficients of a test loss = sum_t c_t logp_t + e_t ent_t. */
typedef struct mt_batch {
    int32_t tok[64], tgt[64], pos[64], seg[64];
    float c[64], e[64];
    int T;
} mt_batch;

/* Sequences of lens[0..nseq) tokens packed into b (deterministic tokens from seed): each
 * token's target is the next token of its sequence (-1 at a sequence's end). */
static inline void mt_make_batch(mt_batch *b, const int *lens, int nseq, int V, uint64_t seed) {
    b->T = 0;
    for (int s = 0; s < nseq; s++)
        for (int i = 0; i < lens[s]; i++) {
            int t = b->T++;
            if (t >= 64) abort();
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            b->tok[t] = (int32_t)((seed >> 33) % (uint64_t)V);
            b->seg[t] = s;
        }
    for (int t = 0; t < b->T; t++) /* positions restart in every sequence */
        b->pos[t] = (t > 0 && b->seg[t] == b->seg[t - 1]) ? b->pos[t - 1] + 1 : 0;
    for (int t = 0; t < b->T; t++) {
        b->tgt[t] = (t + 1 < b->T && b->seg[t + 1] == b->seg[t]) ? b->tok[t + 1] : -1;
        b->c[t] = (float)((t * 7) % 5 - 2) / 3.0f;
        b->e[t] = (float)((t * 3) % 4 - 1.5) / 10.0f;
    }
}

#endif
