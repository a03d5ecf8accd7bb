/* Internal to common/model/trace_rec*.c and trace_sites.c: the buffer's slab geometry and
 * raw access, for recorders that fill a buffer other than through qrl_trace_capture (the
 * CUDA recorder, trace_rec_cuda.h, copies whole device slabs in).  Not a public header. */
#ifndef QRL_MODEL_TRACE_REC_INTERNAL_H
#define QRL_MODEL_TRACE_REC_INTERNAL_H

#include "model/trace_rec.h"

/* Bytes of one token's slab: per site in site order, F32 S_enc (unaligned), the E4M3 block
 * scales, the LSB bytes; the total rounded up to 4. */
size_t qrl_trace_layout_slab_bytes_(const qrl_trace_layout *l);
/* Byte offset of site `site` in a slab. */
uint32_t qrl_trace_layout_offset_(const qrl_trace_layout *l, uint32_t site);
/* Token capacity of b (max_tokens given to qrl_trace_buf_new). */
uint32_t qrl_trace_buf_cap_(const qrl_trace_buf *b);
/* The slab of record `token` (< capacity), writable. */
uint8_t *qrl_trace_buf_slab_(qrl_trace_buf *b, uint32_t token);
/* Record `token` is being written by a pass: held from now on (token == held count: the
 * count grows by one; token < held: a rewrite).  Aborts on token > held or >= capacity. */
void qrl_trace_buf_hold_(qrl_trace_buf *b, uint32_t token);

#endif
