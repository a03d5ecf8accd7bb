/* Quantized paged KV cache on the GPU (host launchers only, STYLE 7): the write of K/V in
 * the fp8, int8, int4, fp4 (NVFP4) and int4-protected formats (SPEC §3 "KV cache precisions") and
 * decode/prefill attention that dequantizes in registers.  References: the codecs of
 * kernels/cpu/quant_kv.c and qrl_kv_cache_write / qrl_kv_cache_gather (model/kv_cache.h),
 * and the two-partial merge of qrl_attention_merge (int4-protected).
 *
 * Device layout of one layer (the values are the CPU records', the arrangement is the
 * GPU's: codes and F32 fields in separate arrays so code rows stay 16-byte aligned):
 *   codes[kv]   [n_blocks * n_kv_heads * block_size][cb]  (record rec = (blk*KVH + h)*bs + off:
 *               a block holds each head's positions contiguously, so a 16-position tile of
 *               one head is one run of 16 records, not 16 records KVH apart)
 *               cb = head_dim (int8: INT8 codes; fp8: E4M3 codes), head_dim/2 (int4: packed
 *               nibbles, element 2i in the low nibble)
 *   scales[kv]  [records][sf] F32: int8 sf = 1 (absmax/127); int4 sf = 2*ceil(hd/32): the
 *               group scales then the group zeros (asymmetric, group 32); fp8 none
 *               fp4: sf = 4 * ceil((8 + ceil(hd/16)) / 16) (4 for head_dim <= 128): float 0 =
 *               S_enc (the CPU record's F32, bit-identical), float 1 = the dequantization
 *               factor 1 / S_enc (IEEE division, qrl_nvfp4_block_dequant_scale's; 0 for a
 *               vector with no finite nonzero element, whose codes and scales are 0 or
 *               NaN anyway), bytes [8, 8 + ceil(hd/16)) the E4M3 block scales (block b =
 *               elements [16b, 16b + 16)), the rest zero.  fp4 codes: cb = head_dim/2
 *               packed E2M1 (element 2i in the low nibble), the CPU record's code bytes.
 *   fp8_scale   [max_seqs][n_kv_heads][2] F32 (K, V): power-of-two per-head scale set by the
 *               sequence's first pass (qrl_cuda_kv_fp8_calibrate), as qrl_kv_cache_calibrate
 *   int4-protected side cache: side_codes[kv] [max_seqs][sink + ring][n_kv_heads][head_dim]
 *               INT8, side_scales[kv] [max_seqs][sink + ring][n_kv_heads]; position p < sink
 *               in slot p, p >= sink in slot sink + (p - sink) % ring.  ring = recent +
 *               QRL_CUDA_KV_RING_SLACK, so a pass of up to QRL_CUDA_KV_RING_SLACK + 1 rows of
 *               one sequence writes its ring slots before attending without evicting a
 *               position any of its rows still reads (the CPU attends row by row instead).
 * A row at position p attends over n = p + 1 positions: the protected ones (p' < sink or
 * p' >= n - recent) from the side cache at INT8, the others from the INT4 store; the two
 * regions are separate flash-decoding splits merged by their softmax max and sum. */
#ifndef QRL_CUDA_KV_QUANT_CUH
#define QRL_CUDA_KV_QUANT_CUH

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Format codes: the qrl_kv_format values (model/kv_cache.h) the GPU supports here. */
#define QRL_CUDA_KVQ_FP8 2
#define QRL_CUDA_KVQ_INT8 3
#define QRL_CUDA_KVQ_INT4 4
#define QRL_CUDA_KVQ_FP4 5
#define QRL_CUDA_KVQ_INT4_PROTECTED 6
#define QRL_CUDA_KV_RING_SLACK 64

/* One layer of a quantized cache (device pointers) and its geometry. */
typedef struct qrl_cuda_kvq_layer {
    int format;                 /* QRL_CUDA_KVQ_* */
    uint8_t *codes[2];          /* K, V */
    float *scales[2];           /* int8 / int4; NULL for fp8 */
    float *fp8_scale;           /* fp8: [max_seqs][n_kv_heads][2] */
    int8_t *side_codes[2];      /* int4-protected */
    float *side_scales[2];
    int sink, recent, ring;     /* int4-protected (sink = recent = 0: plain int4) */
    const int32_t *block_tables; /* [max_seqs, max_blocks_per_seq] */
    int max_blocks_per_seq, block_size, n_kv_heads, head_dim;
} qrl_cuda_kvq_layer;

/* Bytes of codes (cb) and F32 fields (sf) per record for a format; 0 for an unsupported
 * format or head_dim (odd, or > 256). */
int qrl_cuda_kvq_code_bytes(int format, int head_dim);
int qrl_cuda_kvq_scale_floats(int format, int head_dim);

/* fp8 calibration of n_runs sequences from their rows in this pass: run i covers rows
 * [run_first[i], run_first[i] + run_len[i]) of kv (all of sequence run_seq[i]); sets
 * fp8_scale[seq][h][K|V] = pow2-rounded 4 * absmax / 448 (1 when absmax is 0), as
 * qrl_kv_cache_calibrate.  kv: [n, 2 * n_kv_heads * head_dim] F32 rows (K heads, then V
 * heads).  runs: device [3][n_runs] (first, len, seq).  Errors: INVALID_ARGUMENT, CUDA. */
qrl_status qrl_cuda_kv_fp8_calibrate(const qrl_cuda_kvq_layer *c, const float *kv,
                                     const int32_t *runs, int n_runs, void *stream,
                                     qrl_error *err);

/* Quantize and store K and V of n rows (kv as above; row r is sequence row_seq[r] at
 * position row_pos[r], capacity reserved) into the layer's store; int4-protected also
 * writes the INT8 side slot of each row.  Codes and scales equal the CPU encoders'
 * (quant.h) bit for bit (IEEE division, RNE, the int4 scale and ratio in double).
 * Errors: INVALID_ARGUMENT (format, head_dim, n), CUDA. */
qrl_status qrl_cuda_kv_store(const qrl_cuda_kvq_layer *c, const float *kv, const int32_t *row_seq,
                             const int32_t *row_pos, int n, void *stream, qrl_error *err);

/* fp4 KV store (NVFP4 per token-head vector, qrl_kv_cache_write's QRL_KV_FORMAT_FP4 record
 * bit for bit: S_enc = qrl_nvfp4_global_enc(absmax over finite elements), E4M3 block scales
 * over 16, E2M1 codes; a block with NaN/Inf gets scale 0x7F and codes 0) with an optional
 * copy for the TRACE recorder: as qrl_cuda_kv_store, and when fp4_copy is not NULL (device
 * memory, fp4 only) it also receives every vector written, as the CPU cache record:
 *   fp4_copy [n][2 (K, V)][n_kv_heads][qrl_cuda_kvq_fp4_copy_bytes(head_dim)] bytes,
 *   record = F32 S_enc (4 bytes), E4M3 block scales [ceil(hd/16)], packed E2M1 codes
 *   [hd/2] (element 2i low nibble), zero padding to a multiple of 4
 * (= model/kv_cache.h qrl_kv_cache_vector_bytes(QRL_KV_FORMAT_FP4, hd) and its layout), the
 * very bytes the store holds (the store's own arrangement is in the layout above: codes
 * at codes[w] + rec * hd/2, S_enc at scales[w][rec * sf], block scales from byte 8 of the
 * record's fields).  fp4_copy must be 4-byte aligned.  Errors: INVALID_ARGUMENT (as
 * qrl_cuda_kv_store; fp4_copy with another format), CUDA. */
size_t qrl_cuda_kvq_fp4_copy_bytes(int head_dim);
qrl_status qrl_cuda_kv_store_copy(const qrl_cuda_kvq_layer *c, const float *kv,
                                  const int32_t *row_seq, const int32_t *row_pos, int n,
                                  uint8_t *fp4_copy, void *stream, qrl_error *err);

/* Attention of n rows over the quantized cache: row r's n_heads query heads (q [n, n_heads *
 * head_dim] F32, rotated) over positions [0, row_pos[r]] of row_seq[r]; out [n, n_heads *
 * head_dim] BF16.  scale: usually 1/sqrt(head_dim); max_len: bound on row_pos + 1.
 * head_dim 64 and 128 run on mma.sync F16 tensor cores with F32 accumulation, the raw
 * codes read straight into the MMA fragments (attention_q_tc.cu): int8 K as exact codes
 * (the token-head scale applied to the score), int8 V as codes times scale rounded to F16
 * (2^-11 relative), fp8 K/V as exact E4M3 values (head scales on the score and the
 * output), int4 K/V dequantized to F16 (n * scale + zero, one rounding); Q is split into
 * F16 hi + lo (~2^-22 relative), P is F16.  Other head dims dequantize in registers on CUDA
 * cores (F32).  fp4 K/V: E2M1 x E4M3 block scale decoded in registers to exact F16 (<= 6
 * significant bits), 1 / S_enc of each K vector applied to its score, of each V vector to
 * P before P.V (scaled by a running power of two so P stays in F16's normal range); the
 * CUDA-core path dequantizes as qrl_nvfp4_dequantize_row, bit for bit.  int4-protected: the protected positions are one more split per row (the
 * same launch on the tensor-core path), merged with the others by softmax statistics.
 * work: qrl_cuda_attention_q_work_floats floats.  Errors: UNSUPPORTED (head_dim, GQA group
 * > 8), INVALID_ARGUMENT, CUDA. */
/* Benchmarks: fill a layer with valid random records (codes uniform; fp8 codes without
 * the NaN exponent; int8 scales 0.02, int4 scale 0.1 / zero -0.75, fp8 head scales 1/64,
 * fp4 S_enc 64 and block scales 1.0)
 * for n_recs main-store records and side_recs side records (per K/V), n_seqs fp8 rows. */
qrl_status qrl_cuda_kvq_fill_random(const qrl_cuda_kvq_layer *c, size_t n_recs, size_t side_recs,
                                    int n_seqs, uint64_t seed, void *stream, qrl_error *err);

size_t qrl_cuda_attention_q_work_floats(int n, int n_heads, int head_dim, int max_len);
qrl_status qrl_cuda_attention_q(const qrl_cuda_kvq_layer *c, uint16_t *out, const float *q,
                                const int32_t *row_seq, const int32_t *row_pos, int n,
                                int n_heads, float scale, int max_len, float *work,
                                size_t work_floats, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
