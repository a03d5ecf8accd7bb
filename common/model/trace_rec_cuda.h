/* TRACE recording in the CUDA forward (SPEC §6): the records of model/trace_rec.h, bit for
 * bit what the CPU recorder writes for the same vectors, taken on the device.  Compiled
 * only when QRL_HAVE_CUDA is defined.
 *
 * Same contract as qrl_trace_recorder (targets per forward call: row -> (buffer, token);
 * the alignment rules of trace_rec.h are the scheduler's and hold unchanged), with the
 * records kept on the device until they are needed on the host:
 *   - at each captured site the forward launches kernels/cuda/trace_capture.cuh's kernel,
 *     which quantizes the target rows' vectors and writes their (S_enc, scales, LSBs) into
 *     a device store of `window` token slabs per engine sequence (token t of a sequence at
 *     slot t % window); in w4a4-nvfp4 the linear sites' records come from the engine's own
 *     activation quantizers instead (qrl_cuda_trace_recorder_sink: the F32 values they
 *     quantize are never in memory, the BF16 GEMM input holds the codes' values);
 *   - per pass the host uploads the row -> store entry map with one async copy (no host
 *     round trip per token; CUDA-graph replays read it from the same device address);
 *   - a sequence's records come to its qrl_trace_buf in batches, off the decode step's
 *     critical path: when half its window is on the device, a copy to pinned staging is
 *     queued on the recorder's own stream (after the passes that wrote them; the forward
 *     waits for it only before writing those entries again, half a window later), and
 *     _poll, called by the forward while its pass runs on the GPU, brings landed copies
 *     into their buffers, a share of the backlog per call; when the sequence is released
 *     (qrl_cuda_trace_recorder_release) its last records are queued and _sync (once per
 *     scheduler step) brings every released sequence's in.
 * A buffer's held count (qrl_trace_buf_n_tokens) grows when a pass targets the token, as
 * on the CPU; the bytes arrive later, so read a buffer only after releasing its sequence
 * and syncing.
 * Rewrites (token < held) are limited to the last `window` tokens; at most one target per
 * sequence per pass.  The tap, when set, sees each captured F32 vector (BF16 inputs
 * widened) when its record reaches the host, not during the pass.
 *
 * Memory: max_seqs * window * slab bytes of device store and as many pinned host bytes
 * (slab = the layout's bytes per token, rounded to 4); with a tap as many F32 vectors too;
 * with k / v sites max_rows * 2 * n_kv_heads fp4 KV records (qrl_cuda_kvq_fp4_copy_bytes)
 * more on the device (qrl_cuda_trace_recorder_device_bytes counts them all). */
#ifndef QRL_MODEL_TRACE_REC_CUDA_H
#define QRL_MODEL_TRACE_REC_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "cuda/nvfp4_quant.cuh"
#include "model/config.h"
#include "model/trace_rec.h"

typedef struct qrl_cuda_trace_recorder qrl_cuda_trace_recorder;

/* A recorder for layout l (borrowed; model cfg) on the engine whose sequences are
 * [0, max_seqs), passes at most max_rows rows and whose work runs on `stream`
 * (cudaStream_t, borrowed); window >= 2 tokens per sequence on the device.  *out owned by
 * the caller (qrl_cuda_trace_recorder_free, after the engine stops using it).
 * Errors: OUT_OF_RANGE (a size < 1, window < 2), CUDA (device or pinned memory: names the
 * bytes), NOMEM. */
qrl_status qrl_cuda_trace_recorder_new(const qrl_trace_layout *l, const qrl_model_config *cfg,
                                       int max_seqs, int max_rows, int window, void *stream,
                                       qrl_cuda_trace_recorder **out, qrl_error *err);
void qrl_cuda_trace_recorder_free(qrl_cuda_trace_recorder *r);
const qrl_trace_layout *qrl_cuda_trace_recorder_layout(const qrl_cuda_trace_recorder *r);
/* Tap (trace_rec.h's qrl_trace_tap_fn; NULL removes it): allocates the device tap store on
 * the first call.  Errors: CUDA (memory). */
qrl_status qrl_cuda_trace_recorder_set_tap(qrl_cuda_trace_recorder *r, qrl_trace_tap_fn fn,
                                           void *ctx, qrl_error *err);
/* Targets of the next forward call, as qrl_trace_recorder_clear / _target. */
void qrl_cuda_trace_recorder_clear(qrl_cuda_trace_recorder *r);
void qrl_cuda_trace_recorder_target(qrl_cuda_trace_recorder *r, int row, qrl_trace_buf *buf,
                                    uint32_t token);
/* Queue the copy of sequence seq's records still on the device (async) and forget the
 * sequence's buffer; they reach the buffer at the next _sync. */
void qrl_cuda_trace_recorder_release(qrl_cuda_trace_recorder *r, int seq);
/* Wait for the copies of every released sequence and bring them into their buffers (taps
 * called); other sequences' copies stay with _poll.  Errors: CUDA. */
qrl_status qrl_cuda_trace_recorder_sync(qrl_cuda_trace_recorder *r, qrl_error *err);
/* Bring the copies that have landed into their buffers, at most a quarter window's share
 * of the backlog (a host memcpy per token); never waits.  The forward calls it after
 * launching a pass, so the host work overlaps the GPU's.  Errors are logged. */
void qrl_cuda_trace_recorder_poll(qrl_cuda_trace_recorder *r);
/* Host nanoseconds spent in the recorder (target maps, uploads, copies into buffers, taps);
 * the capture kernels run on the device inside the forward's time (bench/trace.c measures
 * them). */
uint64_t qrl_cuda_trace_recorder_host_ns(const qrl_cuda_trace_recorder *r);
/* Bytes of device store (and as many pinned host bytes). */
size_t qrl_cuda_trace_recorder_store_bytes(const qrl_cuda_trace_recorder *r);
/* All device bytes: the store, the taps, the row map, the fp4 KV record copies. */
size_t qrl_cuda_trace_recorder_device_bytes(const qrl_cuda_trace_recorder *r);

/* ---- forward side (model/forward_cuda.c) ---------------------------------------------- */

/* Whether any site of `kind` is captured at some layer. */
bool qrl_cuda_trace_recorder_has_kind(const qrl_cuda_trace_recorder *r, qrl_trace_site_kind kind);
/* Pass rows [row0, row0 + n) of the call are about to run; row_seq (host [n]) their
 * sequences.  Queues the window drains the pass needs, marks the targets held in their
 * buffers and uploads the row map (async, on the stream).  Errors: CUDA. */
qrl_status qrl_cuda_trace_recorder_begin_pass(qrl_cuda_trace_recorder *r, int row0, int n,
                                              const int32_t *row_seq, qrl_error *err);
/* Launch the capture of (layer, kind) for the pass's n rows: src (device) holds row r's
 * vectors at src + r * row_stride elements (BF16 when bf16, else F32); k and v: the
 * n_kv_heads head vectors of the kind, contiguous (the K heads immediately followed by the
 * V heads capture in one launch).  No-op when (layer, kind) is not captured.  Errors: CUDA. */
qrl_status qrl_cuda_trace_recorder_capture(qrl_cuda_trace_recorder *r, int layer,
                                           qrl_trace_site_kind kind, const void *src, bool bf16,
                                           int64_t row_stride, int n, qrl_error *err);
/* w4a4 linear site (layer, kind) of n elements: point q's TRACE sink (trace_ctl,
 * trace_dst, trace_off, trace_tap_off; nvfp4_quant.cuh) at this pass's row map and the
 * site's place in each record, so the quantizer that reads q writes the records of the
 * target rows itself; clears the sink when the site is not captured.  A captured site
 * whose length is not n is a caller bug (aborts).  Host only, nothing launched. */
void qrl_cuda_trace_recorder_sink(const qrl_cuda_trace_recorder *r, int layer,
                                  qrl_trace_site_kind kind, int n, qrl_cuda_nvfp4_act *q);
/* fp4 KV: the device buffer the KV store of layer `layer` writes the pass's K/V records
 * into (kv_quant.cuh qrl_cuda_kv_store_copy's fp4_copy, [max_rows][2][n_kv_heads] records),
 * NULL when the layer has no k / v site.  Then _capture_kv_fp4 turns the target rows' into
 * TRACE records: the S_enc, block scales and code LSBs the cache stores, not a second
 * quantization; kvf (device [n][2 KV] F32, what the store quantized) only feeds the tap.
 * Errors: CUDA. */
uint8_t *qrl_cuda_trace_recorder_kv_copy(const qrl_cuda_trace_recorder *r, int layer);
qrl_status qrl_cuda_trace_recorder_capture_kv_fp4(qrl_cuda_trace_recorder *r, int layer,
                                                  const float *kvf, int n, qrl_error *err);
/* The forward call has finished and synchronized: drop the call's targets. */
void qrl_cuda_trace_recorder_end_call(qrl_cuda_trace_recorder *r);

#endif
