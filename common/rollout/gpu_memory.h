/* GPU memory budget of the rollout scheduler's CUDA engine (rollout.gpu_memory_utilization,
 * qrl-eval / qrl-generate --gpu-memory-utilization; as vLLM's gpu_memory_utilization):
 * the fraction of a device's total memory one process may use, from which the KV block
 * pool (qrl_scheduler_config.kv_blocks) is sized, so that several processes (a learner
 * and replicas) can share one GPU.  docs/rollout.md "GPU memory budget".
 *
 * The arithmetic (qrl_gpu_budget_kv_blocks) and the engine's size estimate
 * (qrl_gpu_budget_estimate) are plain C and make no CUDA call (unit-tested on the CPU);
 * qrl_rollout_gpu_check (rollout_cuda.c) and qrl_scheduler_config_fit_gpu ask the CUDA
 * runtime. */
#ifndef QRL_ROLLOUT_GPU_MEMORY_H
#define QRL_ROLLOUT_GPU_MEMORY_H

#include <stddef.h>

#include "core/status.h"
#include "model/model.h"
#include "rollout/scheduler.h"

/* Kept out of the budget for what the estimate does not see: the CUDA context, cuBLAS
 * handles and workspace (32 MiB), instantiated CUDA graphs, allocation rounding. */
#define QRL_GPU_BUDGET_RESERVE_BYTES ((size_t)1 << 30)

/* TRACE records per sequence the CUDA recorder keeps on the device before a batch goes to
 * the host (model/trace_rec_cuda.h's window): a copy every 64 tokens, or at the end of the
 * response.  Counted per slot in slot_bytes when recording. */
#define QRL_GPU_TRACE_WINDOW 64

typedef struct qrl_gpu_budget {
    size_t device_bytes;     /* total memory of the device */
    double utilization;      /* fraction of device_bytes this process may use, (0, 1] */
    size_t fixed_bytes;      /* everything but the KV pool and the per-slot state: weights,
                                activations, workspaces, QRL_GPU_BUDGET_RESERVE_BYTES */
    size_t slot_bytes;       /* per decode slot besides its KV blocks (int4-protected side
                                cache, fp8 scales, block tables, the TRACE recorder's
                                device window) */
    size_t kv_bytes_per_pos; /* KV pool bytes per position, all layers, K and V */
    int block_size;          /* positions per KV block */
    int ctx_len;             /* positions of one full context */
    int max_slots;           /* D: concurrent sequences */
} qrl_gpu_budget;

/* KV blocks that fit the budget:
 *
 *   budget    = floor(utilization x device_bytes) - fixed_bytes - max_slots x slot_bytes
 *   kv_blocks = min(floor(budget / (block_size x kv_bytes_per_pos)),
 *                   max_slots x ceil(ctx_len / block_size))
 *
 * (the cap is what kv_blocks = 0 gives, D full contexts: more blocks could never be used).
 * Slots stay max_slots (the cap on concurrent sequences, as vLLM's max_num_seqs):
 * admission reserves each response's worst case, so a pool below the cap just admits
 * fewer at a time.  Errors: OUT_OF_RANGE when utilization is outside (0, 1] or a field
 * is non-positive, or the budget holds less than one full context
 * (ceil(ctx_len / block_size) blocks, the scheduler's minimum); the message names the
 * bytes. */
qrl_status qrl_gpu_budget_kv_blocks(const qrl_gpu_budget *b, int *kv_blocks, qrl_error *err);

/* Fill every field of *b but device_bytes and utilization for the CUDA engine the
 * scheduler would make for `model` (its precision) under `sc` (slots, KV format, sink and
 * recent widths, block size, max_ctx, prefill_chunk, trace_record and trace_sites): an
 * estimate, from above, of the allocations of qrl_cuda_forward_new (model/forward_cuda.c)
 * and, when recording, of qrl_cuda_trace_recorder_new, plus QRL_GPU_BUDGET_RESERVE_BYTES.
 * No CUDA call. */
void qrl_gpu_budget_estimate(const qrl_model *model, const qrl_scheduler_config *sc,
                             qrl_gpu_budget *b);

/* Whether CUDA device `device` can run the engine: *total_bytes (may be NULL) = its
 * memory, desc (may be NULL) = one line naming it.  Errors: UNSUPPORTED (a build without
 * CUDA), CUDA (no such device: none visible, no driver; names how many are visible). */
qrl_status qrl_rollout_gpu_check(int device, char *desc, size_t desc_size, size_t *total_bytes,
                                 qrl_error *err);

/* The name of CUDA device `device` as ReplicaInfo.device_name shows it (the CUDA runtime's
 * qrl_cuda_device_describe line), or "cuda:N" when it cannot be asked (no CUDA in this
 * build, no such device).  Writes at most cap bytes, NUL-terminated. */
void qrl_rollout_device_name(int device, char *out, size_t cap);

/* Size sc->kv_blocks for device sc->device (>= 0) so that the engine uses at most
 * utilization x the device's memory (qrl_gpu_budget_estimate, qrl_gpu_budget_kv_blocks);
 * logs the sizing.  Errors: as qrl_rollout_gpu_check and qrl_gpu_budget_kv_blocks
 * (prefixed "gpu_memory_utilization U:"). */
qrl_status qrl_scheduler_config_fit_gpu(qrl_scheduler_config *sc, const qrl_model *model,
                                        double utilization, qrl_error *err);

#endif
