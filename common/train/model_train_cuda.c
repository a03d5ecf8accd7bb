/* CUDA training engine (model_train_cuda.h): the composition of common/train/model_train.c
 * with the device layers of kernels/cuda/train_ops.cuh, train_attention.cuh and cuBLAS.
 *   x = embed(tokens)
 *   per layer: h1 = rmsnorm(x); q,k,v = h1 W^T (+b); [head rmsnorm on q, k]; rope(q, k);
 *              a = attention; x_mid = x + a Wo^T (+bo); h2 = rmsnorm(x_mid);
 *              x_out = x_mid + (silu(h2 Wg^T) * (h2 Wu^T)) Wd^T
 *   logits = rmsnorm(x) lm_head^T (F32);  logp, entropy = one online log-softmax pass. */
#ifdef QRL_HAVE_CUDA
#include "train/model_train_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/train_ops.h"
#include "cuda/convert.cuh"
#include "cuda/gemm.cuh"
#include "cuda/train_attention.cuh"
#include "cuda/train_ops.cuh"
#include "cuda/train_qat.cuh"
#include "train/model_train_cuda_qat.h"

/* Saved activations of one layer (device).  With recompute only x_in is per layer. */
typedef struct act {
    float *x_in, *x_mid, *rstd1, *rstd2, *rstd_q, *rstd_k, *lse;
    uint16_t *h1, *qp, *kp, *v, *qr, *kr, *att, *h2, *gate, *up, *hm;
    /* QAT: the fake-quantized attention output (O's input; attention's backward reads the
     * unquantized att); == att without activation QAT.  The other sites are quantized in
     * place: h1, h2, hm feed only their GEMMs, kr and v only attention. */
    uint16_t *attq;
} act;

/* One layer's weights: F32 master pointers (norms, biases), BF16 matrices, F32 gradients
 * (same offsets as the master). */
typedef struct layer_ptrs {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv, *bo;
    const uint16_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *g_attn_norm, *g_ffn_norm, *g_q_norm, *g_k_norm, *g_bq, *g_bk, *g_bv, *g_bo;
    float *g_wq, *g_wk, *g_wv, *g_wo, *g_wg, *g_wu, *g_wd;
    size_t off_begin, off_end; /* the layer's range in the parameter arena */
} layer_ptrs;

struct qrl_model_train_cuda {
    qrl_model_config cfg;
    qrl_model_train_cuda_opts o;
    size_t n_params, head_off; /* head_off: offset of final_norm (head range to the end) */
    cudaStream_t s, cs;        /* compute, communication */
    cudaEvent_t *ev;           /* [n_layers + 1] */
    qrl_cuda_gemm *gemm;
    void *comm;                /* ncclComm_t or NULL */
    float *params, *grads, *adam_m, *adam_v;
    uint16_t *pbf;
    const float *emb, *final_norm, *final_norm_r;
    const uint16_t *lm_head;
    float *g_emb, *g_final_norm, *g_lm_head;
    layer_ptrs *lw, *lw_r;     /* lw_r: QAT set_bf16 (norms, biases rounded to BF16) */
    act *layers, shared;       /* shared: the recompute buffers (== layers[l] otherwise) */
    float *x_final, *rstdf, *logits, *lse_v, *ent, *logp, *cos_t, *sin_t;
    uint16_t *hf;
    float *ao, *dres, *dh, *dhm, *dq, *dk, *dv, *attn_work, *dlogp, *dent;
    uint16_t *dres_b, *dgate, *dup, *datt, *dqb, *dkb, *dvb, *dlog;
    int32_t *tokens, *targets, *seg_start;
    double *norm_part;
    int64_t *bad;
    size_t act_bytes, total_bytes;
    void *block;               /* every activation and scratch buffer, one allocation */
    /* host */
    float *h_cos, *h_sin, *h_inv_freq;
    int32_t *h_seg_start, *h_targets;
    int T;                     /* tokens of the forward not yet consumed by a backward */
    bool has_dent;
    int64_t adam_step;
    /* QAT (opts.qat): the records and counters; the BF16 projection weights (and with
     * set_bf16 the rounded vectors) must be re-made from the master before the next
     * forward; fw_bf16: the last forward's set_bf16 (its backward reads the same values) */
    qrl_train_cuda_qat *qat;
    bool qat_act, wq_stale, qat_bf16, fw_bf16;
    float uaq_scale;           /* the model's SPEC §3 UAQ s at creation (1 = none) */
};

static qrl_status cu(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "cuda train: %s: %s", what, cudaGetErrorString(e));
}

static qrl_status nc(ncclResult_t r, const char *what, qrl_error *err) {
    if (r == ncclSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_INTERNAL, "cuda train: %s: %s", what,
                         ncclGetErrorString(r));
}

/* ---- memory plan ------------------------------------------------------------------------- */

/* Carve `bytes` (256-aligned) from the block at *off; counts only when base is NULL. */
static void *carve(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 255) / 256 * 256;
    return p;
}

static void plan_act(act *a, char *b, size_t *off, size_t T, const qrl_model_config *c,
                     bool x_in_only, bool attq) {
    size_t D = c->dim, F = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads,
           Q = H * c->head_dim, KV = Hkv * c->head_dim;
    if (x_in_only) {
        a->x_in = carve(b, off, T * D * 4);
        return;
    }
    a->x_mid = carve(b, off, T * D * 4);
    a->rstd1 = carve(b, off, T * 4), a->rstd2 = carve(b, off, T * 4);
    a->rstd_q = c->qk_norm ? carve(b, off, T * H * 4) : NULL;
    a->rstd_k = c->qk_norm ? carve(b, off, T * Hkv * 4) : NULL;
    a->lse = carve(b, off, H * T * 4);
    a->h1 = carve(b, off, T * D * 2), a->h2 = carve(b, off, T * D * 2);
    a->qp = carve(b, off, T * Q * 2), a->kp = carve(b, off, T * KV * 2);
    a->v = carve(b, off, T * KV * 2);
    a->qr = carve(b, off, T * Q * 2), a->kr = carve(b, off, T * KV * 2);
    a->att = carve(b, off, T * Q * 2);
    a->gate = carve(b, off, T * F * 2), a->up = carve(b, off, T * F * 2);
    a->hm = carve(b, off, T * F * 2);
    a->attq = attq ? carve(b, off, T * Q * 2) : a->att;
}

/* One walk for counting and pointing.  Returns the bytes; *act_bytes the saved part. */
static size_t plan(qrl_model_train_cuda_t *tr, char *b, size_t *act_bytes) {
    const qrl_model_config *c = &tr->cfg;
    size_t T = (size_t)tr->o.max_tokens, D = c->dim, F = c->hidden_dim, H = c->n_heads,
           Hkv = c->n_kv_heads, hd = c->head_dim, V = c->vocab_size, Q = H * hd,
           KV = Hkv * hd, off = 0, chunk = (size_t)tr->o.lm_head_chunk;
    for (int l = 0; l < c->n_layers; l++) {
        act tmp, *a = b ? &tr->layers[l] : &tmp;
        plan_act(a, b, &off, T, c, true, false);
        if (!tr->o.recompute_activations) plan_act(a, b, &off, T, c, false, tr->qat_act);
    }
    if (tr->o.recompute_activations) {
        act tmp, *a = b ? &tr->shared : &tmp;
        plan_act(a, b, &off, T, c, false, tr->qat_act);
    }
    tr->x_final = carve(b, &off, T * D * 4), tr->hf = carve(b, &off, T * D * 2);
    tr->rstdf = carve(b, &off, T * 4), tr->logits = carve(b, &off, T * V * 4);
    tr->lse_v = carve(b, &off, T * 4), tr->ent = carve(b, &off, T * 4);
    tr->logp = carve(b, &off, T * 4);
    *act_bytes = off;
    tr->cos_t = carve(b, &off, T * hd / 2 * 4), tr->sin_t = carve(b, &off, T * hd / 2 * 4);
    tr->ao = carve(b, &off, T * D * 4), tr->dres = carve(b, &off, T * D * 4);
    tr->dh = carve(b, &off, T * D * 4), tr->dhm = carve(b, &off, T * F * 4);
    tr->dq = carve(b, &off, T * Q * 4), tr->dk = carve(b, &off, T * KV * 4);
    tr->dv = carve(b, &off, T * KV * 4);
    tr->attn_work = carve(b, &off, qrl_cuda_train_attention_work_floats((int)T, (int)H) * 4);
    tr->dlogp = carve(b, &off, T * 4), tr->dent = carve(b, &off, T * 4);
    tr->dres_b = carve(b, &off, T * D * 2);
    tr->dgate = carve(b, &off, T * F * 2), tr->dup = carve(b, &off, T * F * 2);
    tr->datt = carve(b, &off, T * Q * 2), tr->dqb = carve(b, &off, T * Q * 2);
    tr->dkb = carve(b, &off, T * KV * 2), tr->dvb = carve(b, &off, T * KV * 2);
    tr->dlog = carve(b, &off, chunk * V * 2);
    tr->tokens = carve(b, &off, T * 4), tr->targets = carve(b, &off, T * 4);
    tr->seg_start = carve(b, &off, T * 4);
    tr->norm_part = carve(b, &off, (size_t)qrl_cuda_train_norm_parts() * 8);
    tr->bad = carve(b, &off, 8);
    return off;
}

/* ---- creation ---------------------------------------------------------------------------- */

static void point_weights(qrl_model_train_cuda_t *tr, const qrl_model *m) {
#define OFF(w) ((size_t)((w) - m->arena))
#define MF(w) ((w) ? tr->params + OFF(w) : NULL)
#define MB(w) ((w) ? tr->pbf + OFF(w) : NULL)
#define MG(w) ((w) ? tr->grads + OFF(w) : NULL)
    tr->emb = MF(m->tok_embedding), tr->g_emb = MG(m->tok_embedding);
    tr->final_norm = MF(m->final_norm), tr->g_final_norm = MG(m->final_norm);
    tr->lm_head = MB(m->lm_head), tr->g_lm_head = MG(m->lm_head);
    tr->head_off = OFF(m->final_norm);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const qrl_layer_weights *w = &m->layers[l];
        layer_ptrs *p = &tr->lw[l];
        p->attn_norm = MF(w->attn_norm), p->ffn_norm = MF(w->ffn_norm);
        p->q_norm = MF(w->q_norm), p->k_norm = MF(w->k_norm);
        p->bq = MF(w->bq), p->bk = MF(w->bk), p->bv = MF(w->bv), p->bo = MF(w->bo);
        p->wq = MB(w->wq), p->wk = MB(w->wk), p->wv = MB(w->wv), p->wo = MB(w->wo);
        p->wg = MB(w->w_gate), p->wu = MB(w->w_up), p->wd = MB(w->w_down);
        p->g_attn_norm = MG(w->attn_norm), p->g_ffn_norm = MG(w->ffn_norm);
        p->g_q_norm = MG(w->q_norm), p->g_k_norm = MG(w->k_norm);
        p->g_bq = MG(w->bq), p->g_bk = MG(w->bk), p->g_bv = MG(w->bv), p->g_bo = MG(w->bo);
        p->g_wq = MG(w->wq), p->g_wk = MG(w->wk), p->g_wv = MG(w->wv), p->g_wo = MG(w->wo);
        p->g_wg = MG(w->w_gate), p->g_wu = MG(w->w_up), p->g_wd = MG(w->w_down);
        p->off_begin = OFF(w->attn_norm);
        p->off_end = l + 1 < m->cfg.n_layers ? OFF(m->layers[l + 1].attn_norm) : tr->head_off;
    }
#undef OFF
#undef MF
#undef MB
#undef MG
}

/* Device AdamW state, created zeroed on first use. */
static qrl_status adam_alloc(qrl_model_train_cuda_t *tr, qrl_error *err) {
    if (tr->adam_m) return QRL_OK;
    size_t n = tr->n_params;
    if (cudaMalloc((void **)&tr->adam_m, n * 8) != cudaSuccess) {
        cudaGetLastError();
        tr->adam_m = NULL;
        return qrl_error_set(err, QRL_STATUS_CUDA, "cuda train: out of device memory for the "
                             "AdamW state (%zu bytes)", n * 8);
    }
    tr->adam_v = tr->adam_m + n;
    return cu(cudaMemsetAsync(tr->adam_m, 0, n * 8, tr->s), "memset", err);
}

/* QAT set_bf16: lw_r = lw with the F32 vectors (norms, biases; and final_norm_r) at
 * BF16-rounded copies (the CPU's set_bf16 rounds every parameter; the matrices and lm_head
 * are already BF16 in pbf, the embedding is rounded after its gather). */
static qrl_status qat_vecs(qrl_model_train_cuda_t *tr, qrl_error *err) {
    const qrl_model_config *c = &tr->cfg;
    const int L = c->n_layers, D = c->dim, hd = c->head_dim, Q = c->n_heads * hd,
              KV = c->n_kv_heads * hd, n = 8 * L + 1;
    const int len8[8] = {D, D, hd, hd, Q, KV, KV, D};
    tr->lw_r = malloc((size_t)(L + 1) * sizeof *tr->lw_r);
    const float ***v = malloc((size_t)n * sizeof *v);
    int *len = malloc((size_t)n * sizeof *len);
    qrl_status st = QRL_OK;
    if (!tr->lw_r || !v || !len) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train: qat vectors");
        goto done;
    }
    for (int l = 0; l < L; l++) {
        layer_ptrs *p = &tr->lw_r[l];
        *p = tr->lw[l];
        const float **f[8] = {&p->attn_norm, &p->ffn_norm, &p->q_norm, &p->k_norm,
                              &p->bq,        &p->bk,       &p->bv,     &p->bo};
        for (int i = 0; i < 8; i++) v[8 * l + i] = f[i], len[8 * l + i] = len8[i];
    }
    tr->final_norm_r = tr->final_norm;
    v[n - 1] = &tr->final_norm_r, len[n - 1] = D;
    st = qrl_train_cuda_qat_vecs(tr->qat, (const float **const *)v, len, n, err);
done:
    free(v), free(len);
    return st;
}

qrl_status qrl_model_train_cuda_new(const qrl_model *m, const qrl_model_train_cuda_opts *opts,
                                    qrl_model_train_cuda_t **out, qrl_error *err) {
    *out = NULL;
    const qrl_model_config *c = &m->cfg;
    if (opts->max_tokens <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "cuda train: max_tokens %d <= 0",
                             opts->max_tokens);
    if (c->head_dim % 2 || c->head_dim > 256)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda train: head_dim %d (even, "
                             "<= 256 supported)", c->head_dim);
    if ((unsigned)opts->qat > QRL_QAT_NVFP4 ||
        (opts->qat == QRL_QAT_OFF &&
         (opts->trace_guidance || opts->qat_kv || opts->qat_weights_only)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "cuda train: qat %d with trace_guidance=%d qat_kv=%d "
                             "qat_weights_only=%d (those need qat nvfp4)", (int)opts->qat,
                             opts->trace_guidance, opts->qat_kv, opts->qat_weights_only);
    qrl_model_train_cuda_t *tr = calloc(1, sizeof *tr);
    if (!tr) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train: engine struct");
    qrl_status st = QRL_OK;
    tr->cfg = *c;
    tr->o = *opts;
    tr->uaq_scale = m->uaq_scale;
    if (tr->o.lm_head_chunk <= 0) tr->o.lm_head_chunk = 1024;
    if (tr->o.lm_head_chunk > tr->o.max_tokens) tr->o.lm_head_chunk = tr->o.max_tokens;
    tr->n_params = qrl_model_param_count(m);
    tr->qat_act = opts->qat != QRL_QAT_OFF && !opts->qat_weights_only;
    tr->wq_stale = opts->qat != QRL_QAT_OFF;
    size_t T = (size_t)opts->max_tokens, half = (size_t)c->head_dim / 2;
    tr->lw = calloc((size_t)c->n_layers + 1, sizeof *tr->lw);
    tr->layers = calloc((size_t)c->n_layers + 1, sizeof *tr->layers);
    tr->ev = calloc((size_t)c->n_layers + 1, sizeof *tr->ev);
    tr->h_cos = malloc(T * half * sizeof(float));
    tr->h_sin = malloc(T * half * sizeof(float));
    tr->h_inv_freq = malloc(half * sizeof(float));
    tr->h_seg_start = malloc(T * sizeof(int32_t));
    tr->h_targets = malloc(T * sizeof(int32_t));
    if (!tr->lw || !tr->layers || !tr->ev || !tr->h_cos || !tr->h_sin || !tr->h_inv_freq ||
        !tr->h_seg_start || !tr->h_targets) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "cuda train: host tables");
        goto fail;
    }
    memcpy(tr->h_inv_freq, m->rope_inv_freq, half * sizeof(float));
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || opts->device < 0 || opts->device >= ndev) {
        st = qrl_error_set(err, QRL_STATUS_CUDA, "cuda train: CUDA device %d does not exist "
                           "(%d visible%s%s)", opts->device, ce == cudaSuccess ? ndev : 0,
                           ce == cudaSuccess ? "" : ": ", ce == cudaSuccess ? "" : cudaGetErrorString(ce));
        cudaGetLastError();
        goto fail;
    }
    QRL_TRY_GOTO(cu(cudaSetDevice(opts->device), "cudaSetDevice", err), fail);
    QRL_TRY_GOTO(cu(cudaStreamCreateWithFlags(&tr->s, cudaStreamNonBlocking), "stream", err), fail);
    QRL_TRY_GOTO(cu(cudaStreamCreateWithFlags(&tr->cs, cudaStreamNonBlocking), "stream", err), fail);
    for (int l = 0; l <= c->n_layers; l++)
        QRL_TRY_GOTO(cu(cudaEventCreateWithFlags(&tr->ev[l], cudaEventDisableTiming), "event",
                        err), fail);
    QRL_TRY_GOTO(qrl_cuda_gemm_new(&tr->gemm, err), fail);

    size_t np = tr->n_params, act_bytes;
    size_t bytes = plan(tr, NULL, &act_bytes);
    tr->total_bytes = bytes + np * 10;
    tr->act_bytes = act_bytes;
    if (cudaMalloc((void **)&tr->params, np * 4) != cudaSuccess ||
        cudaMalloc((void **)&tr->grads, np * 4) != cudaSuccess ||
        cudaMalloc((void **)&tr->pbf, np * 2) != cudaSuccess ||
        cudaMalloc(&tr->block, bytes) != cudaSuccess) {
        cudaGetLastError();
        st = qrl_error_set(err, QRL_STATUS_CUDA, "cuda train: out of device memory for %zu "
                           "parameters and %zu bytes of activations/scratch (max_tokens %d)",
                           np, bytes, opts->max_tokens);
        goto fail;
    }
    plan(tr, tr->block, &act_bytes);
    if (!tr->o.recompute_activations)
        tr->shared = tr->layers[c->n_layers > 0 ? c->n_layers - 1 : 0];
    point_weights(tr, m);
    QRL_TRY_GOTO(cu(cudaMemcpy(tr->params, m->arena, np * 4, cudaMemcpyHostToDevice), "upload",
                    err), fail);
    QRL_TRY_GOTO(qrl_cuda_f32_to_bf16(tr->params, tr->pbf, np, tr->s, err), fail);
    QRL_TRY_GOTO(cu(cudaMemsetAsync(tr->grads, 0, np * 4, tr->s), "memset", err), fail);
    if (opts->optimizer_state) QRL_TRY_GOTO(adam_alloc(tr, err), fail);
    if (opts->qat != QRL_QAT_OFF)
        QRL_TRY_GOTO(qrl_train_cuda_qat_new(c, opts->max_tokens, tr->qat_act, opts->qat_kv,
                                            opts->trace_guidance, &tr->qat, err), fail);
    if (tr->qat) QRL_TRY_GOTO(qat_vecs(tr, err), fail);
    QRL_TRY_GOTO(cu(cudaStreamSynchronize(tr->s), "init", err), fail);
    *out = tr;
    return QRL_OK;
fail:
    qrl_model_train_cuda_destroy(tr);
    return st;
}

void qrl_model_train_cuda_destroy(qrl_model_train_cuda_t *tr) {
    if (!tr) return;
    if (cudaSetDevice(tr->o.device) != cudaSuccess) cudaGetLastError(); /* nothing was made */
    if (tr->s) cudaStreamSynchronize(tr->s);
    if (tr->cs) cudaStreamSynchronize(tr->cs);
    cudaFree(tr->params), cudaFree(tr->grads), cudaFree(tr->pbf), cudaFree(tr->block);
    cudaFree(tr->adam_m);
    qrl_train_cuda_qat_free(tr->qat);
    qrl_cuda_gemm_free(tr->gemm);
    if (tr->ev)
        for (int l = 0; l <= tr->cfg.n_layers; l++)
            if (tr->ev[l]) cudaEventDestroy(tr->ev[l]);
    if (tr->s) cudaStreamDestroy(tr->s);
    if (tr->cs) cudaStreamDestroy(tr->cs);
    free(tr->ev), free(tr->lw), free(tr->lw_r), free(tr->layers);
    free(tr->h_cos), free(tr->h_sin), free(tr->h_inv_freq), free(tr->h_seg_start);
    free(tr->h_targets);
    free(tr);
}

size_t qrl_model_train_cuda_bytes(const qrl_model_train_cuda_t *tr, size_t *activation_bytes) {
    if (activation_bytes) *activation_bytes = tr->act_bytes;
    return tr->total_bytes + (tr->adam_m ? tr->n_params * 8 : 0) +
           (tr->qat ? qrl_train_cuda_qat_bytes(tr->qat) : 0);
}

void qrl_model_train_cuda_zero_grad(qrl_model_train_cuda_t *tr) {
    cudaSetDevice(tr->o.device);
    cudaMemsetAsync(tr->grads, 0, tr->n_params * 4, tr->s);
}

void qrl_model_train_cuda_set_comm(qrl_model_train_cuda_t *tr, void *nccl_comm) {
    tr->comm = nccl_comm;
}

/* ---- forward ----------------------------------------------------------------------------- */

/* QAT: fake-quantize site (l, kind) of T rows x -> y in place or into y (BF16), when that
 * site is quantized (act: the linear inputs; else K and V with qat_kv); count in the
 * forward, not in the backward's recomputation. */
static qrl_status fq(qrl_model_train_cuda_t *tr, int l, qrl_trace_site_kind kind, bool act,
                     const uint16_t *x, uint16_t *y, int T, int width, int heads, bool count,
                     qrl_error *err) {
    if (!tr->qat || !(act ? tr->qat_act : tr->o.qat_kv)) return QRL_OK;
    return qrl_train_cuda_qat_site(tr->qat, l, kind, x, y, T, width, heads, count, tr->s, err);
}

/* Layer l's forward from a->x_in into a's buffers; x_out (next layer's input) when not NULL. */
static qrl_status layer_forward(qrl_model_train_cuda_t *tr, int l, act *a, float *x_out, int T,
                                qrl_error *err) {
    const qrl_model_config *c = &tr->cfg;
    const layer_ptrs *w = tr->fw_bf16 ? &tr->lw_r[l] : &tr->lw[l];
    const int D = c->dim, F = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads,
              hd = c->head_dim, Q = H * hd, KV = Hkv * hd;
    const int il = c->rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED;
    qrl_cuda_gemm *g = tr->gemm;
    void *s = tr->s;
    const bool cnt = x_out != NULL;
    QRL_TRY(qrl_cuda_train_rmsnorm_forward(a->h1, a->rstd1, a->x_in, a->x_in, NULL, NULL,
                                           w->attn_norm, T, D, c->norm_eps, s, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_ATTN_IN, true, a->h1, a->h1, T, D, 1, cnt, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, a->qp, 0, a->h1, w->wq, T, D, Q, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, a->kp, 0, a->h1, w->wk, T, D, KV, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, a->v, 0, a->h1, w->wv, T, D, KV, 0.0f, s, err));
    QRL_TRY(qrl_cuda_train_qk_forward(a->qr, a->qp, a->rstd_q, w->bq, w->q_norm, tr->cos_t,
                                      tr->sin_t, T, H, hd, il, c->norm_eps, s, err));
    QRL_TRY(qrl_cuda_train_qk_forward(a->kr, a->kp, a->rstd_k, w->bk, w->k_norm, tr->cos_t,
                                      tr->sin_t, T, Hkv, hd, il, c->norm_eps, s, err));
    if (w->bv) QRL_TRY(qrl_cuda_train_bias_add(a->v, w->bv, T, KV, s, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_K, false, a->kr, a->kr, T, KV, Hkv, cnt, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_V, false, a->v, a->v, T, KV, Hkv, cnt, err));
    QRL_TRY(qrl_cuda_train_attention_forward(a->att, a->lse, a->qr, a->kr, a->v, tr->seg_start,
                                             T, H, Hkv, hd, s, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_ATTN_OUT, true, a->att, a->attq, T, Q, 1, cnt, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, tr->ao, 1, a->attq, w->wo, T, Q, D, 0.0f, s, err));
    QRL_TRY(qrl_cuda_train_rmsnorm_forward(a->h2, a->rstd2, a->x_mid, a->x_in, tr->ao, w->bo,
                                           w->ffn_norm, T, D, c->norm_eps, s, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_MLP_IN, true, a->h2, a->h2, T, D, 1, cnt, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, a->gate, 0, a->h2, w->wg, T, D, F, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, a->up, 0, a->h2, w->wu, T, D, F, 0.0f, s, err));
    QRL_TRY(qrl_cuda_train_swiglu_forward(a->hm, a->gate, a->up, (int64_t)T * F, s, err));
    QRL_TRY(fq(tr, l, QRL_TRACE_SITE_MLP_DOWN, true, a->hm, a->hm, T, F, 1, cnt, err));
    if (x_out) { /* x_out = x_mid + hm Wd^T: the GEMM accumulates onto a copy of x_mid */
        QRL_TRY(cu(cudaMemcpyAsync(x_out, a->x_mid, (size_t)T * D * 4, cudaMemcpyDeviceToDevice,
                                   tr->s), "residual copy", err));
        QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_FWD, x_out, 1, a->hm, w->wd, T, F, D, 1.0f, s, err));
    }
    return QRL_OK;
}

/* QAT: re-quantize every projection's BF16 GEMM copy from its F32 master (set_bf16: from
 * bf16(master), and round the vectors) when a step, set_params, creation or a set_bf16
 * change made the copy stale.  Version 0 under UAQ (set_bf16 off): the replicas quantize
 * the unscaled checkpoint W, the masters of q, k, o, gate and down hold W/s, and
 * nvfp4(W/s) is not nvfp4(W)/s on the FP4 midpoints of BF16-valued checkpoints; so, as
 * model_train.c's qat_weights (cf94b40, docs/uaq.md), quantize (W/s)*s and divide by s. */
static qrl_status qat_weights(qrl_model_train_cuda_t *tr, qrl_error *err) {
    tr->fw_bf16 = tr->qat_bf16;
    if (!tr->wq_stale) return QRL_OK;
    const qrl_model_config *c = &tr->cfg;
    int D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim,
        KV = c->n_kv_heads * c->head_dim;
    float us = tr->qat_bf16 ? 1.0f : tr->uaq_scale;
    static const bool scaled[7] = {true, true, false, true, true, false, true};
    for (int l = 0; l < c->n_layers; l++) {
        const layer_ptrs *w = &tr->lw[l];
        const uint16_t *ws[7] = {w->wq, w->wk, w->wv, w->wo, w->wg, w->wu, w->wd};
        int rows[7] = {Q, KV, KV, D, F, F, D}, cols[7] = {D, D, D, Q, D, D, F};
        for (int i = 0; i < 7; i++) {
            size_t off = (size_t)(ws[i] - tr->pbf);
            QRL_TRY(qrl_train_cuda_qat_weight(tr->qat, tr->params + off, tr->qat_bf16,
                                              scaled[i] ? us : 1.0f, rows[i], cols[i],
                                              tr->pbf + off, tr->s, err));
        }
    }
    if (tr->qat_bf16) QRL_TRY(qrl_train_cuda_qat_round_vecs(tr->qat, tr->s, err));
    tr->wq_stale = false;
    return QRL_OK;
}

/* The working set of layer l: its own buffers, or the shared ones with its x_in. */
static act *layer_act(qrl_model_train_cuda_t *tr, int l) {
    if (!tr->o.recompute_activations) return &tr->layers[l];
    tr->shared.x_in = tr->layers[l].x_in;
    return &tr->shared;
}

qrl_status qrl_model_train_cuda_forward(qrl_model_train_cuda_t *tr, const int32_t *tokens,
                                        const int32_t *targets, const int32_t *pos,
                                        const int32_t *seg, int T, float *logp, float *ent,
                                        qrl_error *err) {
    const qrl_model_config *c = &tr->cfg;
    const int D = c->dim, V = c->vocab_size, hd = c->head_dim, L = c->n_layers;
    tr->T = 0;
    if (T <= 0 || T > tr->o.max_tokens)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda train: batch of %d tokens outside [1, max_tokens %d]", T,
                             tr->o.max_tokens);
    for (int t = 0; t < T; t++) {
        if (pos[t] < 0 || pos[t] >= c->max_seq_len)
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "cuda train: position id %d at t=%d outside [0, %d)", pos[t],
                                 t, c->max_seq_len);
        if (tokens[t] < 0 || tokens[t] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "cuda train: token id %d at t=%d outside [0, %d)", tokens[t], t,
                                 V);
        if (targets[t] < QRL_TRAIN_TARGET_IGNORE || targets[t] >= V)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "cuda train: target id %d at t=%d outside [0, %d) and not -1",
                                 targets[t], t, V);
        tr->h_seg_start[t] = (t > 0 && seg[t] == seg[t - 1]) ? tr->h_seg_start[t - 1] : t;
    }
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    qrl_train_rope_cos_sin(tr->h_cos, tr->h_sin, pos, tr->h_inv_freq, T, hd);
    memcpy(tr->h_targets, targets, (size_t)T * 4);
    size_t cs = (size_t)T * hd / 2 * 4;
    QRL_TRY(cu(cudaMemcpyAsync(tr->tokens, tokens, (size_t)T * 4, cudaMemcpyHostToDevice, tr->s),
               "upload", err));
    QRL_TRY(cu(cudaMemcpyAsync(tr->targets, targets, (size_t)T * 4, cudaMemcpyHostToDevice,
                               tr->s), "upload", err));
    QRL_TRY(cu(cudaMemcpyAsync(tr->seg_start, tr->h_seg_start, (size_t)T * 4,
                               cudaMemcpyHostToDevice, tr->s), "upload", err));
    QRL_TRY(cu(cudaMemcpyAsync(tr->cos_t, tr->h_cos, cs, cudaMemcpyHostToDevice, tr->s), "upload",
               err));
    QRL_TRY(cu(cudaMemcpyAsync(tr->sin_t, tr->h_sin, cs, cudaMemcpyHostToDevice, tr->s), "upload",
               err));
    if (tr->qat) {
        QRL_TRY(qat_weights(tr, err));
        QRL_TRY(qrl_train_cuda_qat_upload(tr->qat, T, tr->s, err));
    }
    float *x0 = L > 0 ? tr->layers[0].x_in : tr->x_final;
    QRL_TRY(qrl_cuda_train_embedding_forward(x0, tr->tokens, tr->emb, T, D, tr->s, err));
    if (tr->fw_bf16) QRL_TRY(qrl_cuda_bf16_round(x0, x0, (size_t)T * D, tr->s, err));
    for (int l = 0; l < L; l++)
        QRL_TRY(layer_forward(tr, l, layer_act(tr, l), l + 1 < L ? tr->layers[l + 1].x_in
                                                                 : tr->x_final, T, err));
    QRL_TRY(qrl_cuda_train_rmsnorm_forward(tr->hf, tr->rstdf, tr->x_final, tr->x_final, NULL,
                                           NULL, tr->fw_bf16 ? tr->final_norm_r : tr->final_norm,
                                           T, D, c->norm_eps, tr->s, err));
    QRL_TRY(qrl_cuda_gemm_rm(tr->gemm, QRL_GEMM_FWD, tr->logits, 1, tr->hf, tr->lm_head, T, D, V,
                             0.0f, tr->s, err));
    QRL_TRY(qrl_cuda_train_logprob_forward(tr->logp, tr->ent, tr->lse_v, tr->logits, tr->targets,
                                           T, V, tr->s, err));
    if (logp)
        QRL_TRY(cu(cudaMemcpyAsync(logp, tr->logp, (size_t)T * 4, cudaMemcpyDeviceToHost, tr->s),
                   "download", err));
    if (ent)
        QRL_TRY(cu(cudaMemcpyAsync(ent, tr->ent, (size_t)T * 4, cudaMemcpyDeviceToHost, tr->s),
                   "download", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "forward", err));
    tr->T = T;
    return QRL_OK;
}

/* ---- backward ---------------------------------------------------------------------------- */

/* Sum a gradient range over the ranks on the communication stream once the compute stream
 * has reached event ev. */
static qrl_status allreduce_range(qrl_model_train_cuda_t *tr, size_t b, size_t e,
                                  cudaEvent_t ev, qrl_error *err) {
    if (e <= b) return QRL_OK;
    QRL_TRY(cu(cudaEventRecord(ev, tr->s), "event", err));
    QRL_TRY(cu(cudaStreamWaitEvent(tr->cs, ev, 0), "wait", err));
    return nc(ncclAllReduce(tr->grads + b, tr->grads + b, e - b, ncclFloat, ncclSum,
                            (ncclComm_t)tr->comm, tr->cs), "ncclAllReduce", err);
}

static qrl_status layer_backward(qrl_model_train_cuda_t *tr, int l, const act *a, int T,
                                 qrl_error *err) {
    const qrl_model_config *c = &tr->cfg;
    const layer_ptrs *w = tr->fw_bf16 ? &tr->lw_r[l] : &tr->lw[l];
    const int D = c->dim, F = c->hidden_dim, H = c->n_heads, Hkv = c->n_kv_heads,
              hd = c->head_dim, Q = H * hd, KV = Hkv * hd;
    const int il = c->rope.layout == QRL_ROPE_LAYOUT_INTERLEAVED;
    qrl_cuda_gemm *g = tr->gemm;
    void *s = tr->s;
    /* MLP: dres (d loss / d x_out) passes to x_mid unchanged, plus the norm branch */
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dhm, 1, tr->dres_b, w->wd, T, F, D, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wd, 1, tr->dres_b, a->hm, T, F, D, 1.0f, s, err));
    QRL_TRY(qrl_cuda_train_swiglu_backward(tr->dgate, tr->dup, tr->dhm, a->gate, a->up,
                                           (int64_t)T * F, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dh, 1, tr->dgate, w->wg, T, D, F, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dh, 1, tr->dup, w->wu, T, D, F, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wg, 1, tr->dgate, a->h2, T, D, F, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wu, 1, tr->dup, a->h2, T, D, F, 1.0f, s, err));
    QRL_TRY(qrl_cuda_train_rmsnorm_backward(tr->dres, tr->dres_b, w->g_ffn_norm, tr->dh,
                                            a->x_mid, w->ffn_norm, a->rstd2, T, D, s, err));
    /* attention: x_mid = x_in + o(attn(rope(norm(q)), rope(norm(k)), v)) (+ bo) */
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->datt, 0, tr->dres_b, w->wo, T, Q, D, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wo, 1, tr->dres_b, a->attq, T, Q, D, 1.0f, s, err));
    if (w->g_bo) QRL_TRY(qrl_cuda_train_colsum(w->g_bo, tr->dres, 1, T, D, s, err));
    QRL_TRY(cu(cudaMemsetAsync(tr->dq, 0, (size_t)T * Q * 4, tr->s), "memset", err));
    QRL_TRY(cu(cudaMemsetAsync(tr->dk, 0, (size_t)T * KV * 4, tr->s), "memset", err));
    QRL_TRY(cu(cudaMemsetAsync(tr->dv, 0, (size_t)T * KV * 4, tr->s), "memset", err));
    QRL_TRY(qrl_cuda_train_attention_backward(tr->dq, tr->dk, tr->dv, tr->datt, a->qr, a->kr,
                                              a->v, a->att, a->lse, tr->seg_start, T, H, Hkv, hd,
                                              tr->attn_work, s, err));
    QRL_TRY(qrl_cuda_train_qk_backward(tr->dqb, w->g_q_norm, w->g_bq, tr->dq, a->qp, w->q_norm,
                                       a->rstd_q, tr->cos_t, tr->sin_t, T, H, hd, il, s, err));
    QRL_TRY(qrl_cuda_train_qk_backward(tr->dkb, w->g_k_norm, w->g_bk, tr->dk, a->kp, w->k_norm,
                                       a->rstd_k, tr->cos_t, tr->sin_t, T, Hkv, hd, il, s, err));
    QRL_TRY(qrl_cuda_f32_to_bf16(tr->dv, tr->dvb, (size_t)T * KV, s, err));
    if (w->g_bv) QRL_TRY(qrl_cuda_train_colsum(w->g_bv, tr->dv, 1, T, KV, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dh, 1, tr->dqb, w->wq, T, D, Q, 0.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dh, 1, tr->dkb, w->wk, T, D, KV, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DX, tr->dh, 1, tr->dvb, w->wv, T, D, KV, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wq, 1, tr->dqb, a->h1, T, D, Q, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wk, 1, tr->dkb, a->h1, T, D, KV, 1.0f, s, err));
    QRL_TRY(qrl_cuda_gemm_rm(g, QRL_GEMM_DW, w->g_wv, 1, tr->dvb, a->h1, T, D, KV, 1.0f, s, err));
    return qrl_cuda_train_rmsnorm_backward(tr->dres, tr->dres_b, w->g_attn_norm, tr->dh, a->x_in,
                                           w->attn_norm, a->rstd1, T, D, s, err);
}

qrl_status qrl_model_train_cuda_backward(qrl_model_train_cuda_t *tr, const float *dlogp,
                                         const float *dent, bool sync_grads, qrl_error *err) {
    if (tr->T <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "cuda train: backward without a forward (each forward allows one "
                             "backward)");
    const qrl_model_config *c = &tr->cfg;
    const int T = tr->T, D = c->dim, V = c->vocab_size, L = c->n_layers;
    const int chunk = tr->o.lm_head_chunk;
    const bool comm = sync_grads && tr->comm;
    void *s = tr->s;
    tr->T = 0;
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(cu(cudaMemcpyAsync(tr->dlogp, dlogp, (size_t)T * 4, cudaMemcpyHostToDevice, tr->s),
               "upload", err));
    if (dent)
        QRL_TRY(cu(cudaMemcpyAsync(tr->dent, dent, (size_t)T * 4, cudaMemcpyHostToDevice, tr->s),
                   "upload", err));
    /* head, in chunks of rows: BF16 dlogits, then d hf and d lm_head */
    for (int r0 = 0; r0 < T; r0 += chunk) {
        int n = T - r0 < chunk ? T - r0 : chunk;
        QRL_TRY(qrl_cuda_train_logprob_backward(
            tr->dlog, tr->logits + (size_t)r0 * V, tr->targets + r0, tr->lse_v + r0,
            tr->ent + r0, tr->dlogp + r0, dent ? tr->dent + r0 : NULL, n, V, s, err));
        QRL_TRY(qrl_cuda_gemm_rm(tr->gemm, QRL_GEMM_DX, tr->dh + (size_t)r0 * D, 1, tr->dlog,
                                 tr->lm_head, n, D, V, 0.0f, s, err));
        QRL_TRY(qrl_cuda_gemm_rm(tr->gemm, QRL_GEMM_DW, tr->g_lm_head, 1, tr->dlog,
                                 tr->hf + (size_t)r0 * D, n, D, V, 1.0f, s, err));
    }
    QRL_TRY(cu(cudaMemsetAsync(tr->dres, 0, (size_t)T * D * 4, tr->s), "memset", err));
    QRL_TRY(qrl_cuda_train_rmsnorm_backward(tr->dres, tr->dres_b, tr->g_final_norm, tr->dh,
                                            tr->x_final, tr->fw_bf16 ? tr->final_norm_r
                                            : tr->final_norm, tr->rstdf, T, D, s, err));
    for (int l = L - 1; l >= 0; l--) {
        act *a = layer_act(tr, l);
        /* the top layer's buffers still hold its forward */
        if (tr->o.recompute_activations && l + 1 < L)
            QRL_TRY(layer_forward(tr, l, a, NULL, T, err));
        QRL_TRY(layer_backward(tr, l, a, T, err));
        if (comm)
            QRL_TRY(allreduce_range(tr, tr->lw[l].off_begin, tr->lw[l].off_end, tr->ev[l], err));
    }
    QRL_TRY(qrl_cuda_train_embedding_backward(tr->g_emb, tr->dres, tr->tokens, T, D, s, err));
    if (comm) {
        size_t first = L > 0 ? tr->lw[0].off_begin : tr->head_off;
        QRL_TRY(cu(cudaEventRecord(tr->ev[L], tr->s), "event", err));
        QRL_TRY(cu(cudaStreamWaitEvent(tr->cs, tr->ev[L], 0), "wait", err));
        QRL_TRY(nc(ncclGroupStart(), "ncclGroupStart", err));
        ncclResult_t r1 = ncclAllReduce(tr->grads, tr->grads, first, ncclFloat, ncclSum,
                                        (ncclComm_t)tr->comm, tr->cs);
        ncclResult_t r2 = ncclAllReduce(tr->grads + tr->head_off, tr->grads + tr->head_off,
                                        tr->n_params - tr->head_off, ncclFloat, ncclSum,
                                        (ncclComm_t)tr->comm, tr->cs);
        QRL_TRY(nc(ncclGroupEnd(), "ncclGroupEnd", err));
        QRL_TRY(nc(r1 != ncclSuccess ? r1 : r2, "ncclAllReduce", err));
        QRL_TRY(cu(cudaEventRecord(tr->ev[L], tr->cs), "event", err));
        QRL_TRY(cu(cudaStreamWaitEvent(tr->s, tr->ev[L], 0), "wait", err));
    }
    return cu(cudaStreamSynchronize(tr->s), "backward", err);
}

/* ---- optimizer and copies ---------------------------------------------------------------- */

qrl_status qrl_model_train_cuda_adamw_step(qrl_model_train_cuda_t *tr,
                                           const qrl_adamw_config *cfg, double lr,
                                           qrl_adamw_step_info *info, qrl_error *err) {
    const size_t n = tr->n_params;
    if (!(lr >= 0.0 && isfinite(lr)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "adamw step %lld: learning rate %g is not a finite value >= 0",
                             (long long)tr->adam_step + 1, lr);
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(adam_alloc(tr, err));
    int parts = qrl_cuda_train_norm_parts();
    double hpart[1024];
    QRL_CHECK(parts <= 1024);
    int64_t bad = (int64_t)n;
    QRL_TRY(cu(cudaMemcpyAsync(tr->bad, &bad, 8, cudaMemcpyHostToDevice, tr->s), "upload", err));
    QRL_TRY(qrl_cuda_train_sumsq(tr->norm_part, tr->bad, tr->grads, n, tr->s, err));
    QRL_TRY(cu(cudaMemcpyAsync(hpart, tr->norm_part, (size_t)parts * 8, cudaMemcpyDeviceToHost,
                               tr->s), "download", err));
    QRL_TRY(cu(cudaMemcpyAsync(&bad, tr->bad, 8, cudaMemcpyDeviceToHost, tr->s), "download", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "grad norm", err));
    double ss = 0.0;
    for (int i = 0; i < parts; i++) ss += hpart[i];
    double norm = bad < (int64_t)n ? NAN : sqrt(ss);
    if (info) *info = (qrl_adamw_step_info){.grad_norm = norm, .clip_scale = 1.0f,
                                           .step = tr->adam_step};
    if (!isfinite(norm))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "adamw step %lld: non-finite gradient at index %lld; parameters "
                             "and optimizer state left unchanged",
                             (long long)tr->adam_step + 1, (long long)bad);
    float scale = 1.0f;
    if (cfg->max_grad_norm > 0.0f && norm > cfg->max_grad_norm)
        scale = (float)(cfg->max_grad_norm / (norm + 1e-6));
    const int64_t t = tr->adam_step + 1;
    const double bc1 = 1.0 - pow(cfg->beta1, (double)t), bc2 = 1.0 - pow(cfg->beta2, (double)t);
    qrl_cuda_adamw_scalars sc = {
        .scale = scale, .decay = (float)(1.0 - lr * cfg->weight_decay), .b1 = cfg->beta1,
        .b2 = cfg->beta2, .omb1 = (float)(1.0 - cfg->beta1), .omb2 = (float)(1.0 - cfg->beta2),
        .step_size = (float)(lr / bc1), .bc2_sqrt = (float)sqrt(bc2), .eps = cfg->eps};
    QRL_TRY(qrl_cuda_train_adamw(tr->params, tr->pbf, tr->adam_m, tr->adam_v, tr->grads, n, &sc,
                                 tr->s, err));
    tr->wq_stale = tr->qat != NULL; /* the step wrote bf16(master) into the GEMM copy */
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "adamw", err));
    tr->adam_step = t;
    if (info) info->clip_scale = scale, info->step = t;
    return QRL_OK;
}

qrl_status qrl_model_train_cuda_get_grads(qrl_model_train_cuda_t *tr, float *host,
                                          qrl_error *err) {
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "sync", err));
    return cu(cudaMemcpy(host, tr->grads, tr->n_params * 4, cudaMemcpyDeviceToHost), "download",
              err);
}

qrl_status qrl_model_train_cuda_get_params(qrl_model_train_cuda_t *tr, float *host,
                                           qrl_error *err) {
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "sync", err));
    return cu(cudaMemcpy(host, tr->params, tr->n_params * 4, cudaMemcpyDeviceToHost), "download",
              err);
}

const float *qrl_model_train_cuda_params_device(qrl_model_train_cuda_t *tr, int *device) {
    cudaSetDevice(tr->o.device);
    cudaStreamSynchronize(tr->s);
    *device = tr->o.device;
    return tr->params;
}

qrl_status qrl_model_train_cuda_set_params(qrl_model_train_cuda_t *tr, const float *host,
                                           qrl_error *err) {
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "sync", err));
    QRL_TRY(cu(cudaMemcpy(tr->params, host, tr->n_params * 4, cudaMemcpyHostToDevice), "upload",
               err));
    QRL_TRY(qrl_cuda_f32_to_bf16(tr->params, tr->pbf, tr->n_params, tr->s, err));
    tr->wq_stale = tr->qat != NULL;
    return cu(cudaStreamSynchronize(tr->s), "set params", err);
}

qrl_status qrl_model_train_cuda_adamw_state(qrl_model_train_cuda_t *tr, float *m, float *v,
                                            int64_t *steps, bool to_host, qrl_error *err) {
    size_t bytes = tr->n_params * 4;
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "sync", err));
    if (to_host) {
        *steps = tr->adam_step;
        if (!tr->adam_m) {
            memset(m, 0, bytes), memset(v, 0, bytes);
            return QRL_OK;
        }
        QRL_TRY(cu(cudaMemcpy(m, tr->adam_m, bytes, cudaMemcpyDeviceToHost), "download", err));
        return cu(cudaMemcpy(v, tr->adam_v, bytes, cudaMemcpyDeviceToHost), "download", err);
    }
    QRL_TRY(adam_alloc(tr, err));
    QRL_TRY(cu(cudaStreamSynchronize(tr->s), "sync", err));
    QRL_TRY(cu(cudaMemcpy(tr->adam_m, m, bytes, cudaMemcpyHostToDevice), "upload", err));
    QRL_TRY(cu(cudaMemcpy(tr->adam_v, v, bytes, cudaMemcpyHostToDevice), "upload", err));
    tr->adam_step = *steps;
    return QRL_OK;
}

/* ---- QAT (model_train_cuda_qat.h) -------------------------------------------------------- */

void qrl_model_train_cuda_qat_set_bf16(qrl_model_train_cuda_t *tr, bool on) {
    if (!tr->qat || on == tr->qat_bf16) return;
    tr->qat_bf16 = on;
    tr->wq_stale = true; /* the projections' copy and the vectors follow at the next forward */
}

void qrl_model_train_cuda_qat_clear(qrl_model_train_cuda_t *tr) {
    if (tr->qat) qrl_train_cuda_qat_clear(tr->qat);
}

qrl_status qrl_model_train_cuda_qat_attach(qrl_model_train_cuda_t *tr, int seq_begin,
                                           int n_prompt, int n_response,
                                           const qrl_trace_response *rec, qrl_error *err) {
    if (!tr->qat) return QRL_OK;
    return qrl_train_cuda_qat_attach(tr->qat, seq_begin, n_prompt, n_response, rec, err);
}

qrl_status qrl_model_train_cuda_qat_stats(qrl_model_train_cuda_t *tr, qrl_qat_stats *out,
                                          bool reset, qrl_error *err) {
    memset(out, 0, sizeof *out);
    if (!tr->qat) return QRL_OK;
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    return qrl_train_cuda_qat_stats(tr->qat, out, reset, tr->s, err);
}

qrl_status qrl_model_train_cuda_sync(qrl_model_train_cuda_t *tr, qrl_error *err) {
    QRL_TRY(cu(cudaSetDevice(tr->o.device), "cudaSetDevice", err));
    return cu(cudaStreamSynchronize(tr->s), "sync", err);
}

#endif /* QRL_HAVE_CUDA */
