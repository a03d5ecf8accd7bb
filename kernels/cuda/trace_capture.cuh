/* TRACE capture on the GPU (SPEC §6; the record's fields are kernels/cpu/trace.h's): for the
 * target rows of one forward pass, NVFP4-quantize a site's vectors with a per-vector S_enc
 * and write what a record keeps, (S_enc, E4M3 block scales, code LSBs), into a device
 * record store (host launchers only, STYLE 7).
 *
 * Reference: qrl_trace_capture (kernels/cpu/trace.h) on the same F32 vector, bit for bit:
 * S_enc, every block scale and every LSB (tests/cuda/test_cuda_trace.c).  The quantizer is
 * the engine's shared one (nvfp4_dev.cuh).  BF16 sources are
 * widened exactly, so the reference input is the BF16 value as F32.
 *
 * Graph safety: the store, the optional tap store and the pass's row -> entry map are read
 * from device memory (ctl, dst) that the host rewrites with an async copy before each pass,
 * so a decode step captured as a CUDA graph records whatever rows the next replay targets.
 * Rows whose dst is -1 (not targets, graph padding) exit at once.
 *
 * Store entry layout (one "slab" per (sequence, token), model/trace_rec.h's buffer layout):
 * per captured site, in site order, 4 bytes S_enc (F32, little-endian, not aligned), then
 * ceil(len/16) E4M3 scale codes, then ceil(len/8) bytes of LSBs (element j at bit j%8 of
 * byte j/8; padding bits 0). */
#ifndef QRL_CUDA_TRACE_CAPTURE_CUH
#define QRL_CUDA_TRACE_CAPTURE_CUH

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device-resident control block (rewritten by the host before each pass). */
typedef struct qrl_cuda_trace_ctl {
    uint8_t *store;     /* [entries][slab] record slabs */
    float *taps;        /* NULL, or [entries][tap_floats]: the F32 inputs as quantized */
    int64_t slab;       /* bytes per entry */
    int64_t tap_floats; /* floats per tap entry */
} qrl_cuda_trace_ctl;

typedef struct qrl_cuda_trace_capture_args {
    const qrl_cuda_trace_ctl *ctl; /* device */
    const int64_t *dst;            /* device [n_rows]: store entry of each pass row, -1 = none */
    const void *src;               /* device: row r's vectors start at src + r * row_stride */
    bool src_bf16;                 /* BF16 elements (else F32) */
    int64_t row_stride;            /* elements between rows */
    int n_rows;                    /* rows of the pass */
    int n_vec;                     /* vectors per row, contiguous, len elements each */
    int len;                       /* elements per vector (site length), 1..2^24 */
    int64_t slab_off;              /* byte offset of vector 0's fields in a slab */
    int64_t slab_step;             /* bytes per vector: 4 + ceil(len/16) + ceil(len/8) */
    int64_t tap_off;               /* float offset of vector 0 in a tap entry (vector v at + v*len) */
    /* NULL, or device: the NVFP4 records the engine already made of these vectors (the fp4
     * KV cache's, kv_quant.cuh qrl_cuda_kv_store_copy: F32 S_enc, ceil(len/16) E4M3 block
     * scales, ceil(len/2) packed E2M1 codes); row r's vector v at fp4_rec + (r * fp4_row_vecs +
     * fp4_vec0 + v) * fp4_rec_bytes.  Given: the record is copied from there (S_enc, scales,
     * the codes' LSBs) instead of quantizing src, which then only feeds the tap. */
    const uint8_t *fp4_rec;
    int fp4_row_vecs, fp4_vec0;
    int64_t fp4_rec_bytes;
} qrl_cuda_trace_capture_args;

/* Capture every (target row, vector) of a->src (or a->fp4_rec) into the store (one warp
 * per vector).  Errors: INVALID_ARGUMENT (n_rows, n_vec or len out of range, slab_step not
 * matching len, fp4 records smaller than 4 + ceil(len/16) + ceil(len/2) bytes or past
 * fp4_row_vecs), CUDA (launch). */
qrl_status qrl_cuda_trace_capture(const qrl_cuda_trace_capture_args *a, void *stream,
                                  qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
