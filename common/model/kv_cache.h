/* Paged KV cache (SPEC §3 KV cache precisions, §4 decode slots).
 *
 * Storage is a pool of fixed-size blocks of `block_size` token positions; a block id
 * addresses the same slot in every layer (as in vLLM), so one block table per sequence
 * serves all layers.  Per layer, K and V each hold
 *     [n_blocks][block_size][n_kv_heads][head_dim]
 * elements of the format's storage type.  A sequence owns a block table (block ids in
 * position order), a reserved capacity (n_blocks * block_size) and a length (positions
 * written and committed).  The forward pass reserves capacity, writes K/V for new
 * positions layer by layer, attends through the block table, then commits the length.
 *
 * Formats: F32 and BF16 are implemented; the quantized ones (FP8, INT8, INT4, FP4,
 * INT4-protected) are named here so configs and tools can refer to them and arrive with
 * the formats module (their per-block scales will live beside the block pool).
 *
 * Not thread-safe: one owner (the decode loop) drives a cache.  Nothing allocates after
 * qrl_kv_cache_new (STYLE 6). */
#ifndef QRL_MODEL_KV_CACHE_H
#define QRL_MODEL_KV_CACHE_H

#include <stdint.h>

#include "core/status.h"
#include "cpu/ops.h"

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
/* True when this build stores the format (F32, BF16). */
bool qrl_kv_format_implemented(qrl_kv_format f);

typedef struct qrl_kv_cache_desc {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;   /* token positions per block, >= 1 (16 is typical) */
    int n_blocks;     /* blocks in the pool */
    int max_seqs;     /* sequence slots */
    int max_seq_len;  /* longest sequence (block table length = ceil(max_seq_len/block_size)) */
    qrl_kv_format format;
} qrl_kv_cache_desc;

typedef struct qrl_kv_cache qrl_kv_cache; /* opaque */

/* Allocate the pool and the per-sequence tables.  *out owned by the caller
 * (qrl_kv_cache_free).  Errors: OUT_OF_RANGE (non-positive sizes), UNSUPPORTED (a
 * format not implemented yet: "kv cache 'int4' arrives with the formats module"), NOMEM. */
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
 * converted to the storage format.  pos < capacity (checked: a caller bug aborts). */
void qrl_kv_cache_write(qrl_kv_cache *kv, int seq, int layer, int pos, const float *k,
                        const float *v);

/* Set the committed length: growing marks written positions valid (len <= capacity);
 * shrinking drops positions (blocks wholly past the new length return to the pool). */
void qrl_kv_cache_set_len(qrl_kv_cache *kv, int seq, int len);

/* Fill *view for attention of `layer` over `seq` through its block table (valid until
 * the next reserve/free on this sequence). */
void qrl_kv_cache_view(const qrl_kv_cache *kv, int seq, int layer, qrl_kv_view *view);

/* Block table of a sequence (n = number of blocks held); valid like the view. */
const int32_t *qrl_kv_cache_block_table(const qrl_kv_cache *kv, int seq, int *n);

/* Free blocks in the pool and free sequence slots (leak checks, admission control). */
int qrl_kv_cache_free_blocks(const qrl_kv_cache *kv);
int qrl_kv_cache_free_seqs(const qrl_kv_cache *kv);

#endif
