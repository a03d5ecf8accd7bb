/* Internal to common/model/forward_cuda*.c: the CUDA forward's state (one struct shared by
 * the pass, forward_cuda.c, and the weight upload, forward_cuda_weights.c) and small
 * helpers.  Not a public header. */
#ifndef QRL_MODEL_FORWARD_CUDA_INTERNAL_H
#define QRL_MODEL_FORWARD_CUDA_INTERNAL_H
#ifdef QRL_HAVE_CUDA
#include "model/forward_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "cuda/attention.cuh"
#include "cuda/gemm.cuh"
#include "cuda/gemm_fp4.cuh"
#include "cuda/gemm_w8a8.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/norm.cuh"
#include "cuda/nvfp4_quant.cuh"
#include "cuda/pointwise.cuh"
#include "cuda/rope_kv.cuh"
#include "cuda/sample.cuh"
#include "model/trace_rec_cuda.h"

/* A quantized projection on the device.  w8a8: INT8 or E4M3 codes
 * [n_out, qrl_cuda_w8a8_ld(n_in)] zero-padded, per-channel scales [n_out].  w4a16: packed
 * E2M1 codes and block scales as the model stores them (gemm_fp4.cuh), scales [n_out] the
 * row factor (NVFP4: 1 / S_enc of the row's tensor; MXFP4: 1).  F32 bias [n_out] or NULL. */
typedef struct qlin_dev {
    uint8_t *codes, *bscales;
    float *scales, *bias;
} qlin_dev;

typedef struct layer_dev {
    uint16_t *attn_norm, *wqkv, *bqkv, *wo, *bo, *q_norm, *k_norm, *ffn_norm, *wgu, *wdown;
    qlin_dev qkv, o, gu, down; /* w8a8, w4a16 (the BF16 projections and biases are NULL) */
} layer_dev;

/* The projection path of a weight precision (project() in forward_cuda.c): the BF16 GEMM
 * on warena's weights; the W8A8 GEMM on qarena's codes, the activations quantized per
 * token into xq / sx (fused into the norms and SwiGLU unless the w8a8_unfused tuning knob
 * says otherwise) with a split-K workspace (gwork); or the FP4 GEMM on qarena's codes
 * with BF16 activations and, above 64 rows, a BF16 scratch for one projection (fp4_work). */
typedef enum proj_path { PROJ_BF16, PROJ_W8A8, PROJ_FP4 } proj_path;

/* How a weight precision runs on the device: one row per precision (forward_cuda_new.c). */
typedef struct cuda_precision {
    qrl_precision precision;        /* as the descriptor asks */
    qrl_precision runs_as;          /* what runs (f32 weights run as bf16) */
    proj_path proj;
    bool fp8;                       /* PROJ_W8A8: E4M3 codes and activations (else INT8) */
    bool mx;                        /* PROJ_FP4: MXFP4 block scales (else NVFP4) */
    bool a4;                        /* PROJ_FP4, w4a4-nvfp4: every projection's input is
                                     * NVFP4-quantized per token (xb holds its exact
                                     * e2m1 * E4M3 values, a4_sdec its 1 / S_enc) */
} cuda_precision;

/* One captured decode step (CUDA graph), for a padded row count and a context bucket. */
typedef struct graph_slot {
    int rows, len;                  /* rows = 0: empty */
    cudaGraphExec_t exec;
    unsigned long long used;        /* LRU clock */
} graph_slot;
#define QRL_CUDA_GRAPH_SLOTS 48

struct qrl_cuda_forward {
    qrl_model_config cfg;
    qrl_cuda_forward_desc d;
    int max_blocks;                 /* per sequence */
    /* Internally one more sequence slot and one more KV block than d says: slot pad_seq
     * (= d.max_seqs) owns that block and is the sequence of the padding rows a CUDA-graph
     * decode step adds to reach its captured row count (their K/V land there, never in a
     * caller's sequence). */
    int slots, pool_blocks, pad_seq;
    graph_slot graphs[QRL_CUDA_GRAPH_SLOTS];
    unsigned long long graph_clock;
    bool graphs_off;                /* d.eager, or a capture failed (then eager for good) */
    long graph_captures, graph_replays;
    cudaStream_t stream;
    qrl_cuda_gemm *gemm;
    uint16_t *warena;               /* every weight, BF16 (not PROJ_BF16: all but the projections) */
    size_t warena_elems;
    const cuda_precision *prec;     /* the weight precision's row */
    bool fuse_kv;                   /* quantized KV (not fp4): RoPE stores K/V codes itself
                                     * (off with QRL_KV_STORE_UNFUSED=1, A/B) */
    bool fuse_q;                    /* PROJ_W8A8: the norms and SwiGLU write xq/sx (off with
                                     * the w8a8_unfused tuning knob: separate quantization, A/B) */
    bool defer_epi;                 /* PROJ_W8A8: the norm after o and down applies a deferred
                                     * GEMM epilogue (off with the w8a8_epilogue_pass knob: the
                                     * separate pass, A/B; off while TRACE records) */
    uint16_t *fp4_work;             /* fp4 prefill (> 64 rows): one projection as BF16 */
    size_t fp4_work_elems;
    unsigned char *qarena;          /* codes, scales, F32 biases; activation codes; split-K */
    size_t qarena_bytes, qweight_bytes;
    uint8_t *xq;                    /* [max_rows, ld of the widest input] activation codes */
    float *sx;                      /* [max_rows] activation scales */
    float *gwork;                   /* split-K partial sums (qrl_cuda_w8a8_work_floats) */
    float *a4_sdec;                 /* w4a4: [max_rows] the activations' 1 / S_enc */
    size_t gwork_floats;
    layer_dev *layers;
    uint16_t *embed, *final_norm, *lm_head;
    float *cos_tab, *sin_tab;       /* [max_ctx, head_dim / 2] */
    uint16_t *kv;                   /* bf16: [layers][2][pool_blocks, bs, KVH, hd]; quantized: the
                                     * arena of kvq's arrays */
    size_t kv_layer_elems;          /* bf16: one of K or V for one layer */
    bool quant;                     /* a quantized KV format (kvq, kv_quant.cuh) */
    qrl_cuda_kvq_layer *kvq;        /* [layers] */
    size_t kv_pool_bytes;
    float *kvf;                     /* [max_rows, 2 KV] F32 K/V rows before quantization */
    int32_t *d_runs;                /* [3, max_rows] fp8 calibration runs */
    unsigned char *fp8_ready;       /* [slots] host: the sequence's fp8 scales are set */
    int32_t *d_tables;              /* [slots, max_blocks] */
    int32_t *d_meta;                /* [3, max_rows]: tokens, row_seq, row_pos */
    int32_t *d_tok;                 /* [max_rows] greedy outputs */
    float *d_lp;
    qrl_cuda_sample_req *d_sreq, *h_sreq; /* [max_rows] device sampler rows and results */
    qrl_cuda_sample_out *d_sout, *h_sout;
    float *x, *proj, *q, *logits, *work;
    uint16_t *xb, *att;
    size_t work_floats;
    qrl_cuda_trace_recorder *rec;   /* TRACE recorder (borrowed), NULL = not recording */
    /* host bookkeeping */
    int32_t *h_tables, *h_meta, *seq_len, *seq_blocks, *free_blocks;
    unsigned char *seq_used;
    int n_free;
};

static inline qrl_status cuda_st(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "cuda forward: %s: %s", what, cudaGetErrorString(e));
}

static inline size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Sub-arrays of the quantized arena start 256-byte aligned (cp.async needs 16). */
static inline size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The four projections of a layer as (rows, inputs): qkv, o, gate+up, down. */
static inline void qlin_shapes(const qrl_model_config *c, int rows[4], int ins[4]) {
    int D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim,
        KV = c->n_kv_heads * c->head_dim;
    rows[0] = Q + 2 * KV, ins[0] = D;
    rows[1] = D, ins[1] = Q;
    rows[2] = 2 * F, ins[2] = D;
    rows[3] = D, ins[3] = F;
}

/* The padding rows' sequence (slot pad_seq, forward_cuda.c), once the arrays exist: its
 * block and fp8 head scales of 1.  Errors: CUDA. */
qrl_status qrl_cuda_forward_pad_seq_init(qrl_cuda_forward *f, qrl_error *err);

#endif
#endif
