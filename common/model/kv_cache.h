/* Paged KV cache (SPEC §3 KV cache precisions, §4 decode slots).
 *
 * Storage is a pool of fixed-size blocks of `block_size` token positions; a block id
 * addresses the same slot in every layer (as in vLLM), so one block table per sequence
 * serves all layers.  Per layer, K and V each hold
 *     [n_blocks][block_size][n_kv_heads] records of one token-head vector
 * in the format's storage (qrl_kv_cache_vector_bytes).  A sequence owns a block table
 * (block ids in position order), a reserved capacity (n_blocks * block_size) and a length
 * (positions written and committed).  The forward pass reserves capacity, writes K/V for
 * new positions layer by layer, attends through the block table, then commits the length.
 *
 * Formats (docs/formats.md "KV-cache formats" has the rules and measured errors; the
 * codecs are kernels/cpu/quant_kv.c's):
 *   f32, bf16        [head_dim] F32 / BF16 (read in place through qrl_kv_cache_view)
 *   fp8              E4M3 codes; one F32 scale per (sequence, layer, KV head) for K and one
 *                    for V, set by the sequence's first qrl_kv_cache_calibrate (the
 *                    prompt's prefill): headroom 4 x absmax / 448 rounded up to a power
 *                    of two
 *   int8             F32 scale + INT8 codes per token-head
 *   int4             asymmetric, group 32: F32 scales and zeros per group + packed codes
 *   fp4              NVFP4 with a per-vector S_enc: F32 S_enc, E4M3 block scales, codes
 *   int4-protected   KV4-RL: int4 for every position, plus per sequence an INT8 side
 *                    cache of protected_sink + protected_recent slots: position p < sink
 *                    in slot p, the last `recent` positions in a ring (qrl_kv_protected_slot)
 * The quantized formats are read through qrl_kv_cache_gather (dequantized F32 rows).
 *
 * Not thread-safe: one owner (the decode loop) drives a cache; qrl_kv_cache_gather and
 * qrl_kv_cache_view may run on several threads at once between writes.  Nothing
 * allocates after qrl_kv_cache_new (STYLE 6). */
#ifndef QRL_MODEL_KV_CACHE_H
#define QRL_MODEL_KV_CACHE_H

#include <stdint.h>

#include "core/status.h"
#include "cpu/ops.h"
#include "cpu/quant.h"

typedef enum qrl_kv_format {
    QRL_KV_FORMAT_F32 = 0,
    QRL_KV_FORMAT_BF16,
    QRL_KV_FORMAT_FP8,            /* E4M3, per-head scale */
    QRL_KV_FORMAT_INT8,           /* per token-head scale */
    QRL_KV_FORMAT_INT4,           /* group-wise along head_dim */
    QRL_KV_FORMAT_FP4,            /* NVFP4 blocks */
    QRL_KV_FORMAT_INT4_PROTECTED, /* KV4-RL: INT4 + INT8 sink/recent side cache */
    QRL_KV_FORMAT_COUNT_
} qrl_kv_format;

/* Names as used on command lines and in configs: "f32", "bf16", "fp8", "int8", "int4",
 * "fp4", "int4-protected".  Static strings; "?" for an unknown value. */
const char *qrl_kv_format_name(qrl_kv_format f);
/* Parse a name above.  INVALID_ARGUMENT for an unknown name (the message lists them). */
qrl_status qrl_kv_format_parse(const char *name, qrl_kv_format *out, qrl_error *err);
/* True for every format of the enum (kept for callers that probe a format by value). */
bool qrl_kv_format_implemented(qrl_kv_format f);
/* Bytes of the block pool per token-head vector (K or V) for head_dim elements: f32 4d,
 * bf16 2d; the quantized records rounded up to 4 bytes: fp8 d, int8 4 + d, int4 and
 * int4-protected 8*ceil(d/32) + ceil(d/2), fp4 4 + ceil(d/16) + ceil(d/2).  The
 * int4-protected side cache adds (sink + recent) * (4 + d) per sequence, layer, head. */
size_t qrl_kv_cache_vector_bytes(qrl_kv_format f, int head_dim);

/* KV4-RL defaults (SPEC §3): the first 16 positions (attention sinks) and the last 128. */
#define QRL_KV_PROTECTED_DEFAULT_SINK 16
#define QRL_KV_PROTECTED_DEFAULT_RECENT 128

typedef struct qrl_kv_cache_desc {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;   /* token positions per block, >= 1 (16 is typical) */
    int n_blocks;     /* blocks in the pool */
    int max_seqs;     /* sequence slots */
    int max_seq_len;  /* longest sequence (block table length = ceil(max_seq_len/block_size)) */
    qrl_kv_format format;
    /* int4-protected only (ignored otherwise): side-cache widths, >= 0.  0 and 0 (what a
     * zero-initialized desc holds) make the cache exactly plain int4; callers normally
     * pass QRL_KV_PROTECTED_DEFAULT_SINK / _RECENT. */
    int protected_sink;
    int protected_recent;
} qrl_kv_cache_desc;

typedef struct qrl_kv_cache qrl_kv_cache; /* opaque */

/* Allocate the pool, the per-sequence tables, the fp8 scales and the int4-protected side
 * cache.  *out owned by the caller (qrl_kv_cache_free).  Errors: OUT_OF_RANGE
 * (non-positive sizes, negative protected widths, head_dim above QRL_KV_MAX_HEAD_DIM for
 * a quantized format), INVALID_ARGUMENT (bad format), NOMEM. */
qrl_status qrl_kv_cache_new(const qrl_kv_cache_desc *desc, qrl_kv_cache **out, qrl_error *err);
void qrl_kv_cache_free(qrl_kv_cache *kv);
/* The descriptor the cache was made with (valid while the cache lives). */
const qrl_kv_cache_desc *qrl_kv_cache_describe(const qrl_kv_cache *kv);

/* Take a free sequence slot (length 0, no blocks) into *seq.  BUSY when all
 * max_seqs slots are taken. */
qrl_status qrl_kv_cache_seq_new(qrl_kv_cache *kv, int *seq, qrl_error *err);
/* Return the slot and all its blocks to the pool.  No-op for a free slot. */
void qrl_kv_cache_seq_free(qrl_kv_cache *kv, int seq);
/* New sequence holding a copy of src's positions [0, len(src)) (blocks copied; a
 * copy-on-write variant can replace this without changing callers).  Errors: BUSY (no
 * slot), NOMEM (pool exhausted; nothing is taken). */
qrl_status qrl_kv_cache_seq_fork(qrl_kv_cache *kv, int src, int *dst, qrl_error *err);

/* Committed length (positions written) and reserved capacity of a sequence. */
int qrl_kv_cache_seq_len(const qrl_kv_cache *kv, int seq);
int qrl_kv_cache_seq_capacity(const qrl_kv_cache *kv, int seq);

/* Make room for positions [0, n_tokens): allocate blocks from the pool as needed.
 * Errors: OUT_OF_RANGE (n_tokens > max_seq_len), NOMEM (pool exhausted — retriable once
 * other sequences free their blocks; the blocks already held are kept). */
qrl_status qrl_kv_cache_reserve(qrl_kv_cache *kv, int seq, int n_tokens, qrl_error *err);

/* Store K and V of one position for one layer: k, v are [n_kv_heads * head_dim] F32,
 * quantized to the storage format (one token-head vector at a time); int4-protected
 * also writes the INT8 side cache when the position has a slot (pos < sink, or the ring:
 * it is the newest position).  fp8: a layer not calibrated yet is calibrated from this
 * row.  pos < capacity (checked: a caller bug aborts). */
void qrl_kv_cache_write(qrl_kv_cache *kv, int seq, int layer, int pos, const float *k,
                        const float *v);

/* fp8: fix the per-KV-head scales of (seq, layer), K and V separately, from n_rows
 * vectors k, v [n_rows][n_kv_heads * head_dim] (the prompt's prefill chunk):
 * scale = qrl_kv_fp8_head_scale's QRL_KV_FP8_DEFAULT_HEADROOM * absmax / 448 rounded up
 * to a power of two (1 when absmax is 0).  A power of two makes the stored values
 * independent of the scale wherever x / scale is a normal E4M3 value, so a prefill
 * re-score that calibrates on other rows reproduces decode's K/V except for elements
 * below 2^-6 * scale (docs/formats.md).  No-op for other formats and when (seq, layer) already has its
 * scales (they last until the sequence is freed or shrunk to length 0; forks inherit). */
void qrl_kv_cache_calibrate(qrl_kv_cache *kv, int seq, int layer, const float *k,
                            const float *v, int n_rows);

/* Dequantize K and V of positions [0, n_ctx) of `kv_head` in (seq, layer) into k, v
 * [n_ctx, head_dim] F32 (caller-owned).  Rows [0, *n_int4) are the positions read from
 * the main store, in increasing order; for int4-protected, rows [*n_int4, n_ctx) are the
 * protected positions (a slot of the side cache that holds that very position; see
 * qrl_kv_protected_slot with n_pos = n_ctx) read at INT8 precision, in increasing order.
 * Other formats: *n_int4 = n_ctx.  Attention over the two row ranges as two partials
 * merged by qrl_attention_merge is the KV4-RL computation of SPEC §3.
 * n_ctx <= capacity (checked).  Works for every format (f32/bf16 rows are copied). */
void qrl_kv_cache_gather(const qrl_kv_cache *kv, int seq, int layer, int kv_head, int n_ctx,
                         float *k, float *v, int *n_int4);

/* Set the committed length: growing marks written positions valid (len <= capacity);
 * shrinking drops positions (blocks wholly past the new length return to the pool).
 * int4-protected: the ring only ever holds the newest `recent` positions written, so
 * after a shrink the window positions that newer writes had overwritten are read at
 * INT4 until rewritten (documented degradation; never stale INT8 data). */
void qrl_kv_cache_set_len(qrl_kv_cache *kv, int seq, int len);

/* Fill *view for attention of `layer` over `seq` through its block table (valid until
 * the next reserve/free on this sequence).  f32 and bf16 caches only (checked); the
 * quantized formats are read with qrl_kv_cache_gather. */
void qrl_kv_cache_view(const qrl_kv_cache *kv, int seq, int layer, qrl_kv_view *view);

/* Block table of a sequence (n = number of blocks held); valid like the view. */
const int32_t *qrl_kv_cache_block_table(const qrl_kv_cache *kv, int seq, int *n);

/* Free blocks in the pool and free sequence slots (leak checks, admission control). */
int qrl_kv_cache_free_blocks(const qrl_kv_cache *kv);
int qrl_kv_cache_free_seqs(const qrl_kv_cache *kv);

#endif
