/* QAT state of the CUDA training engine (model_train_cuda_qat.h): the CPU engine's
 * attach bookkeeping (model_train.c) plus the device copy of the attached records. */
#ifdef QRL_HAVE_CUDA
#include "train/model_train_cuda_qat.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/train_qat.cuh"

#define SLOT_K 4 /* slots 0..3: attn_in, attn_out, mlp_in, mlp_down; then k, v heads */

struct qrl_train_cuda_qat {
    qrl_model_config c;
    int max_T, slots; /* slots per layer */
    bool act, kv, guidance;
    /* attached records per packed position (host, borrowed), as model_train.c's */
    const qrl_trace_response **g_rec;
    uint32_t *g_tok;
    bool dirty;       /* attached records changed since the last upload */
    int uploaded_T;   /* tokens of the table on the device */
    /* device: counters [3], weight amax scratch, offset table [max_T][L * slots], blob */
    unsigned long long *d_cnt;
    float *d_amax;
    uint32_t *d_table, *h_table;
    uint8_t *d_blob, *h_blob;
    size_t blob_cap;
    /* set_bf16: the registered F32 vectors (device, borrowed) and their rounded copies */
    const float **v_src;
    float **v_dst, *d_vec;
    int *v_len, n_vec;
    size_t vec_floats;
    qrl_qat_stats host; /* rows_guided / rows_unguided (the rest lives on the device) */
};

static qrl_status cu(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "cuda train qat: %s: %s", what,
                         cudaGetErrorString(e));
}

/* Elements of a site vector of `kind`. */
static int site_len(const qrl_model_config *c, qrl_trace_site_kind kind) {
    switch (kind) {
    case QRL_TRACE_SITE_ATTN_IN: case QRL_TRACE_SITE_MLP_IN: return c->dim;
    case QRL_TRACE_SITE_ATTN_OUT: return c->n_heads * c->head_dim;
    case QRL_TRACE_SITE_MLP_DOWN: return c->hidden_dim;
    default: return c->head_dim;
    }
}

static const qrl_trace_site_kind SLOT_KIND[SLOT_K] = {
    QRL_TRACE_SITE_ATTN_IN, QRL_TRACE_SITE_ATTN_OUT, QRL_TRACE_SITE_MLP_IN,
    QRL_TRACE_SITE_MLP_DOWN};

/* Slot of (kind, head 0) within a layer. */
static int slot_of(const qrl_train_cuda_qat *q, qrl_trace_site_kind kind) {
    switch (kind) {
    case QRL_TRACE_SITE_ATTN_IN: return 0;
    case QRL_TRACE_SITE_ATTN_OUT: return 1;
    case QRL_TRACE_SITE_MLP_IN: return 2;
    case QRL_TRACE_SITE_MLP_DOWN: return 3;
    case QRL_TRACE_SITE_K: return SLOT_K;
    default: return SLOT_K + q->c.n_kv_heads;
    }
}

qrl_status qrl_train_cuda_qat_new(const qrl_model_config *c, int max_T, bool act, bool kv,
                                  bool guidance, qrl_train_cuda_qat **out, qrl_error *err) {
    *out = NULL;
    qrl_train_cuda_qat *q = calloc(1, sizeof *q);
    if (!q) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train qat: state");
    q->c = *c, q->max_T = max_T, q->act = act, q->kv = kv, q->guidance = guidance;
    q->slots = SLOT_K + (kv ? 2 * c->n_kv_heads : 0);
    q->dirty = true; /* the first forward writes the table (all nearest) */
    q->g_rec = calloc((size_t)max_T, sizeof *q->g_rec);
    q->g_tok = calloc((size_t)max_T, sizeof *q->g_tok);
    qrl_status st = QRL_OK;
    if (!q->g_rec || !q->g_tok) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train qat: attach tables");
        goto fail;
    }
    QRL_TRY_GOTO(cu(cudaMalloc((void **)&q->d_cnt, QRL_CUDA_QAT_COUNTERS * 8), "counters", err),
                 fail);
    QRL_TRY_GOTO(cu(cudaMemset(q->d_cnt, 0, QRL_CUDA_QAT_COUNTERS * 8), "memset", err), fail);
    QRL_TRY_GOTO(cu(cudaMalloc((void **)&q->d_amax, 4), "amax", err), fail);
    if (guidance && (act || kv)) {
        size_t n = (size_t)max_T * c->n_layers * q->slots;
        QRL_TRY_GOTO(cu(cudaMalloc((void **)&q->d_table, n * 4), "record table", err), fail);
        QRL_TRY_GOTO(cu(cudaMallocHost((void **)&q->h_table, n * 4), "record table", err), fail);
    }
    *out = q;
    return QRL_OK;
fail:
    qrl_train_cuda_qat_free(q);
    return st;
}

void qrl_train_cuda_qat_free(qrl_train_cuda_qat *q) {
    if (!q) return;
    cudaFree(q->d_cnt), cudaFree(q->d_amax), cudaFree(q->d_table), cudaFree(q->d_blob);
    cudaFreeHost(q->h_table), cudaFreeHost(q->h_blob);
    cudaFree(q->d_vec);
    free(q->g_rec), free(q->g_tok), free(q->v_src), free(q->v_dst), free(q->v_len);
    free(q);
}

size_t qrl_train_cuda_qat_bytes(const qrl_train_cuda_qat *q) {
    size_t table = q->d_table ? (size_t)q->max_T * q->c.n_layers * q->slots * 4 : 0;
    return QRL_CUDA_QAT_COUNTERS * 8 + 4 + table + q->blob_cap + q->vec_floats * 4;
}

void qrl_train_cuda_qat_clear(qrl_train_cuda_qat *q) {
    memset(q->g_rec, 0, (size_t)q->max_T * sizeof *q->g_rec);
    q->dirty = true;
}

qrl_status qrl_train_cuda_qat_attach(qrl_train_cuda_qat *q, int seq_begin, int n_prompt,
                                     int n_response, const qrl_trace_response *rec,
                                     qrl_error *err) {
    int t0 = seq_begin + n_prompt - 1;
    if (seq_begin < 0 || n_prompt < 1 || n_response < 0 ||
        (int64_t)seq_begin + n_prompt + n_response > q->max_T)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda train: attach of a sequence at %d (prompt %d, response %d) "
                             "outside the row of %d tokens", seq_begin, n_prompt, n_response,
                             q->max_T);
    bool ok = q->guidance && rec && qrl_trace_response_n_tokens(rec) == (uint32_t)n_response;
    for (int k = 0; k < n_response; k++) {
        q->g_rec[t0 + k] = ok ? rec : NULL;
        q->g_tok[t0 + k] = (uint32_t)k;
    }
    *(ok ? &q->host.rows_guided : &q->host.rows_unguided) += 1;
    q->dirty = true;
    return QRL_OK;
}

/* (kind, head) of slot s of a layer. */
static qrl_trace_site_kind slot_site(const qrl_train_cuda_qat *q, int s, int *head) {
    *head = 0;
    if (s < SLOT_K) return SLOT_KIND[s];
    int h = s - SLOT_K, Hkv = q->c.n_kv_heads;
    *head = h % Hkv;
    return h < Hkv ? QRL_TRACE_SITE_K : QRL_TRACE_SITE_V;
}

/* Whether slot s is quantized in this configuration (a guided entry needs it). */
static bool slot_quantized(const qrl_train_cuda_qat *q, int s) {
    return s < SLOT_K ? q->act : q->kv;
}

/* The record entry of token t's slot s in layer l, when it guides (attached, quantized here,
 * of the site's length): its blob bytes (scales then bits), else 0. */
static size_t slot_entry(const qrl_train_cuda_qat *q, int t, int l, int s, qrl_trace_entry *e) {
    int head;
    qrl_trace_site_kind kind = slot_site(q, s, &head);
    int n = site_len(&q->c, kind);
    if (!q->g_rec[t] || !slot_quantized(q, s) ||
        !qrl_trace_response_entry(q->g_rec[t], q->g_tok[t], l, kind, head, e) ||
        e->len != (uint32_t)n)
        return 0;
    return (size_t)(n + 15) / 16 + (size_t)(n + 7) / 8;
}

qrl_status qrl_train_cuda_qat_upload(qrl_train_cuda_qat *q, int T, void *stream, qrl_error *err) {
    if (!q->h_table || (!q->dirty && T <= q->uploaded_T)) return QRL_OK;
    const int L = q->c.n_layers, S = L * q->slots;
    /* the blob's size first: every entry of every attached token */
    size_t need = 0;
    qrl_trace_entry e;
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L && q->g_rec[t]; l++)
            for (int s = 0; s < q->slots; s++) need += slot_entry(q, t, l, s, &e);
    if (need >= QRL_CUDA_QAT_NONE)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda train qat: %zu bytes of records in one packed batch (4 GiB "
                             "at most: lower learner.max_tokens)", need);
    if (need > q->blob_cap) {
        size_t cap = need + need / 4;
        cudaFree(q->d_blob), cudaFreeHost(q->h_blob);
        q->d_blob = NULL, q->h_blob = NULL, q->blob_cap = 0;
        QRL_TRY(cu(cudaMalloc((void **)&q->d_blob, cap), "record blob", err));
        QRL_TRY(cu(cudaMallocHost((void **)&q->h_blob, cap), "record blob", err));
        q->blob_cap = cap;
    }
    size_t off = 0;
    for (int t = 0; t < T; t++) {
        uint32_t *row = q->h_table + (size_t)t * S;
        for (int l = 0; l < L; l++)
            for (int s = 0; s < q->slots; s++) {
                size_t bytes = slot_entry(q, t, l, s, &e);
                row[l * q->slots + s] = bytes ? (uint32_t)off : QRL_CUDA_QAT_NONE;
                if (!bytes) continue;
                size_t ns = (e.len + 15) / 16;
                memcpy(q->h_blob + off, e.scales, ns);
                memcpy(q->h_blob + off + ns, e.bits, bytes - ns);
                off += bytes;
            }
    }
    cudaStream_t st = (cudaStream_t)stream;
    QRL_TRY(cu(cudaMemcpyAsync(q->d_table, q->h_table, (size_t)T * S * 4, cudaMemcpyHostToDevice,
                               st), "record table upload", err));
    if (off)
        QRL_TRY(cu(cudaMemcpyAsync(q->d_blob, q->h_blob, off, cudaMemcpyHostToDevice, st),
                   "record upload", err));
    q->dirty = false;
    q->uploaded_T = T;
    return QRL_OK;
}

qrl_status qrl_train_cuda_qat_site(qrl_train_cuda_qat *q, int l, qrl_trace_site_kind kind,
                                   const uint16_t *x, uint16_t *y, int T, int width, int heads,
                                   bool count, void *stream, qrl_error *err) {
    const uint32_t *guide = q->d_table ? q->d_table + (size_t)l * q->slots + slot_of(q, kind)
                                       : NULL;
    /* before any record was uploaded every entry is NONE: the blob is never read, but the
     * launcher wants one with a table */
    const uint8_t *blob = q->d_blob ? q->d_blob : (const uint8_t *)q->d_cnt;
    return qrl_cuda_qat_rows(y, 1, x, 1, T * heads, width / heads, heads, guide,
                             q->c.n_layers * q->slots, blob, NULL, count ? q->d_cnt : NULL,
                             stream, err);
}

qrl_status qrl_train_cuda_qat_weight(qrl_train_cuda_qat *q, const float *w, bool bf16,
                                     float scale, int rows, int cols, uint16_t *y, void *stream,
                                     qrl_error *err) {
    return qrl_cuda_qat_weight(w, bf16, scale, rows, cols, NULL, y, q->d_amax, stream, err);
}

qrl_status qrl_train_cuda_qat_vecs(qrl_train_cuda_qat *q, const float **const *v, const int *len,
                                   int n, qrl_error *err) {
    if (q->v_src || n <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "cuda train qat: vectors "
                             "registered twice or none (%d)", n);
    q->v_src = calloc((size_t)n, sizeof *q->v_src);
    q->v_dst = calloc((size_t)n, sizeof *q->v_dst);
    q->v_len = calloc((size_t)n, sizeof *q->v_len);
    if (!q->v_src || !q->v_dst || !q->v_len)
        return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train qat: %d vectors", n);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += *v[i] ? (size_t)len[i] : 0;
    if (total) QRL_TRY(cu(cudaMalloc((void **)&q->d_vec, total * 4), "bf16 vectors", err));
    q->n_vec = n, q->vec_floats = total;
    for (int i = 0, off = 0; i < n; i++) {
        if (!*v[i]) continue;
        q->v_src[i] = *v[i], q->v_len[i] = len[i], q->v_dst[i] = q->d_vec + off;
        *v[i] = q->v_dst[i];
        off += len[i];
    }
    return QRL_OK;
}

qrl_status qrl_train_cuda_qat_round_vecs(qrl_train_cuda_qat *q, void *stream, qrl_error *err) {
    for (int i = 0; i < q->n_vec; i++)
        if (q->v_src[i])
            QRL_TRY(qrl_cuda_bf16_round(q->v_dst[i], q->v_src[i], (size_t)q->v_len[i], stream,
                                        err));
    return QRL_OK;
}

qrl_status qrl_train_cuda_qat_stats(qrl_train_cuda_qat *q, qrl_qat_stats *out, bool reset,
                                    void *stream, qrl_error *err) {
    unsigned long long c[QRL_CUDA_QAT_COUNTERS];
    cudaStream_t st = (cudaStream_t)stream;
    QRL_TRY(cu(cudaMemcpyAsync(c, q->d_cnt, sizeof c, cudaMemcpyDeviceToHost, st), "counters",
               err));
    QRL_TRY(cu(cudaStreamSynchronize(st), "counters", err));
    *out = q->host;
    out->elements_guided = c[0], out->elements_nearest = c[1], out->disagree = c[2];
    if (reset) {
        memset(&q->host, 0, sizeof q->host);
        QRL_TRY(cu(cudaMemsetAsync(q->d_cnt, 0, sizeof c, st), "memset", err));
    }
    return QRL_OK;
}

#endif /* QRL_HAVE_CUDA */
