/* CUDA forward pass, BF16, W8A8 (INT8, FP8) or W4A16 (NVFP4, MXFP4) weights (SPEC §2, §3, §10): the same computation
 * as model/forward.h on the GPU, with the weights and a paged KV cache (BF16 or quantized)
 * in device memory and F32 accumulation.  Compiled only when QRL_HAVE_CUDA is defined.
 *
 * Precision: weights BF16 (desc.precision f32 or bf16), or, for w8a8-int8 and w8a8-fp8,
 * the seven projections of every layer as the model's INT8 or E4M3 codes and F32
 * per-channel scales (model/linear.h) run through kernels/cuda/gemm_w8a8.cuh (per-token
 * INT8 / E4M3 activations from the BF16 GEMM inputs; INT8: exact INT32 sums; FP8: F32 sums
 * on the tensor cores; biases F32 after the epilogue) while embedding, norms and LM head
 * stay BF16 (the CPU keeps them unquantized too); for w4a16-nvfp4 and w4a16-mxfp4 the
 * projections' packed E2M1 codes and block scales as the model stores them, decoded in
 * registers by kernels/cuda/gemm_fp4.cuh (BF16 activations, F32 sums); the KV cache BF16 or a quantized format (desc.kv_format: the
 * CPU encoders' codes, kernels/cuda/kv_quant.cuh); GEMM inputs (normed activations, attention
 * output, SwiGLU output) BF16; GEMM outputs, the residual stream, q, softmax state and
 * logits F32.  Logits therefore differ from the CPU reference by BF16 rounding (relative
 * ~1e-2 of their spread), not bit for bit.
 *
 * The engine owns its KV cache (block pool + per-sequence block tables, as
 * model/kv_cache.h, with the tables mirrored on the device).  Everything is allocated in
 * qrl_cuda_forward_new (STYLE 6); a step allocates nothing.  Not thread-safe. */
#ifndef QRL_MODEL_FORWARD_CUDA_H
#define QRL_MODEL_FORWARD_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"

typedef struct qrl_cuda_forward qrl_cuda_forward; /* opaque */

typedef struct qrl_cuda_forward_desc {
    int max_rows;    /* rows per pass: prefill chunk length = largest decode batch */
    int max_ctx;     /* longest sequence (clamped to cfg.max_seq_len) */
    int block_size;  /* KV positions per block */
    int n_blocks;    /* KV blocks in the pool (shared by all sequences) */
    int max_seqs;    /* sequence slots */
    /* KV cache format, as the CPU path's qrl_kv_cache_desc.format: bf16, fp8, int8, int4,
     * fp4, int4-protected (kernels/cuda/kv_quant.cuh); f32 (0, what a zeroed desc holds)
     * means bf16, the GPU keeps no f32 cache. */
    qrl_kv_format kv_format;
    int protected_sink, protected_recent; /* int4-protected, as qrl_kv_cache_desc */
    /* Weight precision: f32 (0) or bf16 run BF16 weights; w8a8-int8 / w8a8-fp8 run INT8 /
     * E4M3 projections, w4a16-nvfp4 / w4a16-mxfp4 FP4 projections, w4a4-nvfp4 FP4
     * projections whose inputs are NVFP4-quantized per token as the CPU's linear does
     * (the model given to _upload must be quantized to it). */
    qrl_precision precision;
    /* Decode steps run their kernels one launch at a time (vLLM's enforce_eager) instead of
     * replaying a CUDA graph captured per (padded batch, context bucket); false (what a
     * zeroed desc holds) uses graphs.  See qrl_cuda_forward_decode. */
    bool eager;
} qrl_cuda_forward_desc;

/* Allocate weights (uninitialized), KV pool, tables and activations on the current device
 * for `cfg`.  Fill the weights with qrl_cuda_forward_upload or _init_random.  *out owned
 * by the caller (qrl_cuda_forward_free).  Errors: OUT_OF_RANGE (non-positive desc field),
 * UNSUPPORTED (head_dim or GQA group outside what the attention kernel handles), CUDA
 * (out of device memory: names the bytes), NOMEM. */
qrl_status qrl_cuda_forward_new(const qrl_model_config *cfg, const qrl_cuda_forward_desc *d,
                                qrl_cuda_forward **out, qrl_error *err);
void qrl_cuda_forward_free(qrl_cuda_forward *f);

/* Copy m's F32 weights as BF16 (round to nearest even) and its rope_inv_freq tables; for a
 * w8a8 or w4a16 engine the projections' codes, scales and F32 biases from m->linears
 * (m->precision must be the engine's).  m's config must equal the one given to _new (dim,
 * layers, heads, ...).  Errors: INVALID_ARGUMENT (config or precision mismatch), CUDA. */
qrl_status qrl_cuda_forward_upload(qrl_cuda_forward *f, const qrl_model *m, qrl_error *err);

/* One tensor of a BF16 weight stream already in device memory (the CUDA IPC weight path,
 * weights/wipc.h): its manifest name and numel BF16 values (device pointer). */
typedef struct qrl_cuda_stream_tensor {
    const char *name;
    const uint16_t *bf16;
    uint64_t numel;
} qrl_cuda_stream_tensor;

/* Replace the engine's weights with a device BF16 stream's (issue 18): BF16 weights copied
 * device to device; a w8a8 engine's projections quantized on the device per output
 * channel (qrl_cuda_{int8,fp8}_quantize_rows on the BF16 values: the codes and scales
 * qrl_model_quantize gives for those values on the CPU, bit for bit), biases widened to
 * F32.  The result equals qrl_cuda_forward_upload of a host model holding the stream's
 * values.  `like` (the engine's model, any precision) names each weight: every tensor of
 * like->tensors must appear in t[n] with its element count.  The rope tables are kept.
 * Runs on the engine's stream and waits for it.  Errors: INVALID_ARGUMENT (a tensor missing
 * or of another size, config mismatch), UNSUPPORTED (w4a16 engines: use _upload), CUDA. */
qrl_status qrl_cuda_forward_upload_stream(qrl_cuda_forward *f, const qrl_model *like,
                                          const qrl_cuda_stream_tensor *t, size_t n, qrl_error *err);

/* Benchmarks: deterministic random weights (as qrl_model_init_random's scales) and random
 * KV pool contents, generated on the device; rope tables from cfg.rope. */
qrl_status qrl_cuda_forward_init_random(qrl_cuda_forward *f, uint64_t seed, qrl_error *err);

/* Sequence slots (as qrl_kv_cache_seq_*): BUSY when all slots are taken. */
qrl_status qrl_cuda_forward_seq_new(qrl_cuda_forward *f, int *seq, qrl_error *err);
void qrl_cuda_forward_seq_free(qrl_cuda_forward *f, int seq);
int qrl_cuda_forward_seq_len(const qrl_cuda_forward *f, int seq);
/* Blocks for positions [0, n) of `seq` taken from the pool now (as qrl_kv_cache_reserve),
 * so later passes up to n positions cannot run out.  Errors: OUT_OF_RANGE (n beyond the
 * context), NOMEM (pool exhausted; the blocks already held are kept), CUDA. */
qrl_status qrl_cuda_forward_seq_reserve(qrl_cuda_forward *f, int seq, int n, qrl_error *err);
/* Drop every position of `seq` and return its blocks to the pool; the slot stays taken
 * (length 0, as qrl_kv_cache_set_len(kv, seq, 0)): a re-prefill rewrites everything,
 * fp8 scales included.  No-op for a free slot. */
void qrl_cuda_forward_seq_clear(qrl_cuda_forward *f, int seq);
/* Blocks of the pool not held by any sequence. */
int qrl_cuda_forward_free_blocks(const qrl_cuda_forward *f);
/* Benchmarks: set the length to `len`, reserving blocks, without writing K/V (the pool
 * holds whatever was there: random after _init_random).  Errors: OUT_OF_RANGE, NOMEM. */
qrl_status qrl_cuda_forward_seq_set_len_unwritten(qrl_cuda_forward *f, int seq, int len,
                                                  qrl_error *err);

/* Prefill, as qrl_forward_prefill: logits are host F32 ([n, vocab] when all_logits, else
 * [vocab]), or NULL.  Errors as qrl_forward_prefill, plus CUDA. */
qrl_status qrl_cuda_forward_prefill(qrl_cuda_forward *f, int seq, const int32_t *tokens, int n,
                                    float *logits, bool all_logits, qrl_error *err);

/* Batched decode, as qrl_forward_decode.  logits: host F32 [batch, vocab] or NULL.
 * greedy_tokens / greedy_logprob: host [batch] or NULL: argmax on the device and its
 * log-softmax at T = 1 (qrl_cuda_greedy).  Returns after the results are on the host.
 *
 * CUDA graphs (unless desc.eager): the step from the embedding to the LM head is captured
 * once per (rows, context bucket) and replayed.  rows is the batch padded up to 1, 2, 4,
 * then a multiple of 8 (at most max_rows; the padding rows decode an internal sequence,
 * as vLLM pads to its capture sizes); the attention plans its flash-decoding splits for
 * the longest row's length rounded up to a bucket (a multiple of 64 and of 1/16 of its
 * power of two), eager steps too, so a step's real rows get the same values with or
 * without graphs when batch is already a padded size.  At most QRL_CUDA_GRAPH_SLOTS
 * graphs are kept (least recently used evicted).  A step whose fp8 sequences still need
 * their scales calibrated runs eagerly; a capture that fails turns graphs off for the
 * engine (logged once) and the step runs eagerly. */
qrl_status qrl_cuda_forward_decode(qrl_cuda_forward *f, const int *seqs, const int32_t *tokens,
                                   int batch, float *logits, int32_t *greedy_tokens,
                                   float *greedy_logprob, qrl_error *err);

/* Batched decode with the sampler on the device (kernels/cuda/sample.cuh): the step of
 * qrl_cuda_forward_decode, then row i's token drawn from its logits as
 * qrl_sampler_sample(draws[i].params, group, response, position) draws it (the same
 * Philox key and procedure; a token differs only for a draw next to a cumulative boundary:
 * measured within 1.1e-16, tests allow 1e-6); only the samples come back to the host, not the [batch, vocab] logits.
 * out[i] and row_err[i] are caller-owned [batch]: row_err[i].status is QRL_OK, or
 * INVALID_ARGUMENT with the CPU sampler's message when row i's logits hold a NaN or +inf
 * or are all -inf (out[i] then undefined); the step has run for every row either way
 * (sequence lengths advance).  Errors (returned): INVALID_ARGUMENT for bad sampling params
 * (qrl_sampling_params_validate; names the row; checked before anything runs), else as
 * qrl_cuda_forward_decode.  Returns after the samples are on the host. */
qrl_status qrl_cuda_forward_decode_sample(qrl_cuda_forward *f, const int *seqs,
                                          const int32_t *tokens, int batch,
                                          const qrl_sample_draw *draws, qrl_sample *out,
                                          qrl_error *row_err, qrl_error *err);

/* TRACE (model/trace_rec_cuda.h): attach a recorder (borrowed; NULL detaches; it must
 * outlive its attachment and have been made with this engine's stream, qrl_cuda_forward_stream).
 * The rows it was given as targets before a prefill or decode call are captured at each
 * site of its layout from the vectors the engine quantizes there: the BF16 GEMM inputs
 * (attn_in, attn_out, mlp_in, mlp_down) and the F32 K / V rows after RoPE that the
 * quantized KV write encodes (k, v).  Drops the decode graphs (the next captures include the
 * recorder's kernels, which read their targets from device memory).  Errors: UNSUPPORTED
 * (linear sites on a fused w8a8 engine, which has no BF16 GEMM inputs; k / v sites on a
 * BF16 KV cache, which writes no F32 rows). */
struct qrl_cuda_trace_recorder;
qrl_status qrl_cuda_forward_set_recorder(qrl_cuda_forward *f, struct qrl_cuda_trace_recorder *rec,
                                         qrl_error *err);

/* Decode steps served by capturing a new CUDA graph, and by replaying a kept one. */
void qrl_cuda_forward_graph_stats(const qrl_cuda_forward *f, long *captures, long *replays);

/* The cudaStream_t all work runs on (benchmarks record events on it). */
void *qrl_cuda_forward_stream(const qrl_cuda_forward *f);
/* Weight bytes one decode step reads (all layers, final norm, LM head; not the embedding
 * table, of which only the batch's rows are read; w8a8: padded codes and scales; w4a16:
 * codes, block scales and one F32 row scale per output). */
size_t qrl_cuda_forward_weight_bytes(const qrl_cuda_forward *f);
/* KV cache bytes per position of the main store (all layers, K and V; quantized formats
 * with their scales). */
size_t qrl_cuda_forward_kv_bytes_per_pos(const qrl_cuda_forward *f);
/* Bytes the attention of one row reads over n_ctx positions, all layers (int4-protected:
 * the protected positions at the side cache's INT8 record size, the rest at INT4). */
size_t qrl_cuda_forward_kv_bytes_read(const qrl_cuda_forward *f, int n_ctx);
/* The engine's weight precision (bf16 when the desc said f32). */
qrl_precision qrl_cuda_forward_precision(const qrl_cuda_forward *f);
/* The engine's KV format (bf16 when the desc said f32). */
qrl_kv_format qrl_cuda_forward_kv_format(const qrl_cuda_forward *f);

#endif
