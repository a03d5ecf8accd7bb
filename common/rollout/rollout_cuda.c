/* Everything of common/rollout that calls the CUDA runtime: the scheduler's CUDA engine
 * backend (sched_internal.h), its device check (scheduler.h) and the device probe of
 * gpu_memory.h.  The only file of common/rollout that uses QRL_HAVE_CUDA: without CUDA
 * each function refuses with UNSUPPORTED. */
#include "rollout/sched_internal.h"

#include <stdio.h>

#include "core/log.h"
#include "rollout/gpu_memory.h"

#ifdef QRL_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/runtime.cuh"
#include "model/forward_cuda.h"
#include "model/trace_rec_cuda.h"


static qrl_status gpu_seq_new(qrl_scheduler *s, int *seq, qrl_error *err) {
    return qrl_cuda_forward_seq_new(s->gpu, seq, err);
}
static void gpu_seq_free(qrl_scheduler *s, int seq) {
    if (s->gpu_trace) qrl_cuda_trace_recorder_release(s->gpu_trace, seq); /* its records follow */
    qrl_cuda_forward_seq_free(s->gpu, seq);
}
static qrl_status gpu_reserve(qrl_scheduler *s, int seq, int n, qrl_error *err) {
    return qrl_cuda_forward_seq_reserve(s->gpu, seq, n, err);
}
static void gpu_clear(qrl_scheduler *s, int seq) { qrl_cuda_forward_seq_clear(s->gpu, seq); }
static int gpu_free_blocks(const qrl_scheduler *s) { return qrl_cuda_forward_free_blocks(s->gpu); }
static qrl_status gpu_prefill(qrl_scheduler *s, int seq, const int32_t *ids, int n,
                              float *logits, qrl_error *err) {
    return qrl_cuda_forward_prefill(s->gpu, seq, ids, n, logits, false, err);
}
static qrl_status gpu_decode(qrl_scheduler *s, int b, qrl_error *err) {
    return qrl_cuda_forward_decode(s->gpu, s->dec_seqs, s->dec_tokens, b, s->dec_logits, NULL,
                                   NULL, err);
}
static qrl_status gpu_decode_sample(qrl_scheduler *s, int b, qrl_error *err) {
    return qrl_cuda_forward_decode_sample(s->gpu, s->dec_seqs, s->dec_tokens, b, s->dec_draws,
                                          s->dec_samples, s->dec_errs, err);
}
/* The GPU forward runs every weight precision (model/forward_cuda.h: BF16, W8A8 INT8 and
 * FP8, W4A16 NVFP4 and MXFP4, W4A4 NVFP4); the model's F32 master weights are rounded to
 * BF16 on upload, which is what f32 and bf16 precision mean for it.  A precision the
 * engine does not know is refused by qrl_cuda_forward_new. */
static qrl_status gpu_check_precision(qrl_precision precision, qrl_error *err) {
    (void)precision;
    (void)err;
    return QRL_OK;
}
qrl_status qrl_scheduler_check_device(const qrl_scheduler_config *cfg, qrl_precision precision,
                                      qrl_error *err) {
    if (cfg->device < 0) return QRL_OK;
    return gpu_check_precision(precision, err); /* every kv format runs (kv_quant.cuh) */
}
static qrl_status gpu_load(qrl_scheduler *s, const qrl_model *model, qrl_error *err) {
    QRL_TRY(gpu_check_precision(model->precision, err));
    return qrl_cuda_forward_upload(s->gpu, model, err);
}
static qrl_status gpu_load_stream(qrl_scheduler *s, const struct qrl_cuda_stream_tensor *t, size_t n,
                                  qrl_error *err) {
    return qrl_cuda_forward_upload_stream(s->gpu, s->model, t, n, err);
}
static void gpu_close(qrl_scheduler *s) { qrl_cuda_forward_free(s->gpu); }
/* The device recorder on the engine's stream: targets of at most n_slots rows per call
 * (one per sequence), passes of the engine's max_rows. */
static qrl_status gpu_trace_open(qrl_scheduler *s, qrl_error *err) {
    QRL_TRY(qrl_cuda_trace_recorder_new(s->trace_layout, &s->model->cfg, s->n_slots,
                                        s->gpu_rows, QRL_GPU_TRACE_WINDOW, qrl_cuda_forward_stream(s->gpu),
                                        &s->gpu_trace, err));
    QRL_TRY(qrl_cuda_forward_set_recorder(s->gpu, s->gpu_trace, err));
    char what[512];
    qrl_sched_trace_sites_text(s, what, sizeof what);
    QRL_LOG_INFO("sched", "trace recorder device=cuda:%d sites=%u bytes_per_token=%zu device_bytes=%zu recorded=%s",
                 s->cfg.device, qrl_trace_layout_n_sites(s->trace_layout),
                 qrl_trace_layout_record_bytes_per_token(s->trace_layout),
                 qrl_cuda_trace_recorder_device_bytes(s->gpu_trace), what);
    return QRL_OK;
}
static void gpu_trace_clear(qrl_scheduler *s) { qrl_cuda_trace_recorder_clear(s->gpu_trace); }
static void gpu_trace_target(qrl_scheduler *s, int row, qrl_trace_buf *buf, uint32_t token) {
    qrl_cuda_trace_recorder_target(s->gpu_trace, row, buf, token);
}
static qrl_status gpu_trace_sync(qrl_scheduler *s, qrl_error *err) {
    return qrl_cuda_trace_recorder_sync(s->gpu_trace, err);
}
static qrl_status gpu_trace_set_tap(qrl_scheduler *s, qrl_trace_tap_fn fn, void *ctx,
                                    qrl_error *err) {
    return qrl_cuda_trace_recorder_set_tap(s->gpu_trace, fn, ctx, err);
}
static uint64_t gpu_trace_capture_ns(const qrl_scheduler *s) {
    return s->gpu_trace ? qrl_cuda_trace_recorder_host_ns(s->gpu_trace) : 0;
}
static void gpu_trace_close(qrl_scheduler *s) {
    if (s->gpu) qrl_cuda_forward_set_recorder(s->gpu, NULL, NULL);
    qrl_cuda_trace_recorder_free(s->gpu_trace);
    s->gpu_trace = NULL;
}
static const qrl_sched_backend GPU_BACKEND = {
    .seq_new = gpu_seq_new, .seq_free = gpu_seq_free, .reserve = gpu_reserve,
    .clear = gpu_clear, .free_blocks = gpu_free_blocks, .prefill = gpu_prefill,
    .decode = gpu_decode, .decode_sample = gpu_decode_sample, .load = gpu_load,
    .load_stream = gpu_load_stream, .close = gpu_close, .trace_open = gpu_trace_open,
    .trace_clear = gpu_trace_clear, .trace_target = gpu_trace_target,
    .trace_sync = gpu_trace_sync, .trace_set_tap = gpu_trace_set_tap,
    .trace_capture_ns = gpu_trace_capture_ns, .trace_close = gpu_trace_close};

int qrl_sched_dev_enter(const qrl_scheduler *s) {
    if (!s->gpu && s->cfg.device < 0) return -1;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != s->cfg.device) cudaSetDevice(s->cfg.device);
    return prev;
}
void qrl_sched_dev_leave(const qrl_scheduler *s, int prev) {
    if (prev >= 0 && prev != s->cfg.device) cudaSetDevice(prev);
}

qrl_status qrl_sched_gpu_open(qrl_scheduler *s, const qrl_model *model, int n_blocks,
                              qrl_error *err) {
    const qrl_scheduler_config *cfg = &s->cfg;
    QRL_TRY(qrl_scheduler_check_device(cfg, model->precision, err));
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    if (cfg->device >= n_dev)
        return qrl_error_set(err, QRL_STATUS_CUDA,
                             "scheduler: CUDA device %d does not exist (%d visible)", cfg->device,
                             n_dev);
    cudaError_t ce = cudaSetDevice(cfg->device);
    if (ce != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "scheduler: cudaSetDevice(%d): %s",
                             cfg->device, cudaGetErrorString(ce));
    /* prefill passes of up to prefill_chunk rows (256 when unlimited): a re-prefill after a
     * weight update reads the weights once per pass, so 32-row passes cost 8x the bytes */
    int rows = cfg->prefill_chunk > 0 ? cfg->prefill_chunk : 256;
    if (rows > s->ctx_len) rows = s->ctx_len;
    if (rows < s->max_rows) rows = s->max_rows;
    qrl_cuda_forward_desc d = {
        .max_rows = rows, .max_ctx = s->ctx_len, .block_size = cfg->kv_block_size,
        .n_blocks = n_blocks, .max_seqs = cfg->max_slots, .kv_format = cfg->kv_format,
        .protected_sink = cfg->kv_sink, .protected_recent = cfg->kv_recent,
        .precision = model->precision, .eager = cfg->eager};
    s->gpu_rows = rows;
    QRL_TRY(qrl_cuda_forward_new(&model->cfg, &d, &s->gpu, err));
    s->be = &GPU_BACKEND;
    QRL_TRY(qrl_cuda_forward_upload(s->gpu, model, err));
    QRL_LOG_INFO("sched", "engine device=cuda:%d weights=%s kv=%s blocks=%d weight_bytes=%zu "
                 "kv_bytes_per_pos=%zu cuda_graphs=%s", cfg->device,
                 qrl_precision_name(qrl_cuda_forward_precision(s->gpu)),
                 qrl_kv_format_name(qrl_cuda_forward_kv_format(s->gpu)), n_blocks,
                 qrl_cuda_forward_weight_bytes(s->gpu), qrl_cuda_forward_kv_bytes_per_pos(s->gpu),
                 cfg->eager ? "off" : "on");
    return QRL_OK;
}

qrl_status qrl_rollout_gpu_check(int device, char *desc, size_t desc_size, size_t *total_bytes,
                                 qrl_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) n = 0;
    if (device < 0 || device >= n)
        return qrl_error_set(err, QRL_STATUS_CUDA,
                             "CUDA device %d does not exist (%d visible%s%s)", device, n,
                             e != cudaSuccess ? "; no GPU or no driver, the CUDA runtime says: " : "",
                             e != cudaSuccess ? cudaGetErrorString(e) : "");
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess)
        return qrl_error_set(err, QRL_STATUS_CUDA, "CUDA device %d: %s", device,
                             cudaGetErrorString(e));
    if (total_bytes) *total_bytes = prop.totalGlobalMem;
    if (desc && desc_size)
        snprintf(desc, desc_size, "cuda:%d %s, %d SMs, %.1f GiB, compute capability %d.%d", device,
                 prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30),
                 prop.major, prop.minor);
    return QRL_OK;
}

void qrl_rollout_device_name(int device, char *out, size_t cap) {
    qrl_error ignored;
    if (qrl_cuda_device_describe(device, out, cap, &ignored) != QRL_OK) snprintf(out, cap, "cuda:%d", device);
}

#else /* !QRL_HAVE_CUDA */
qrl_status qrl_scheduler_check_device(const qrl_scheduler_config *cfg, qrl_precision precision,
                                      qrl_error *err) {
    (void)precision;
    if (cfg->device < 0) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                         "scheduler: device %d (CUDA): this build has no CUDA (nvcc was not "
                         "found when it was built)", cfg->device);
}
int qrl_sched_dev_enter(const qrl_scheduler *s) { (void)s; return -1; }
void qrl_sched_dev_leave(const qrl_scheduler *s, int prev) { (void)s, (void)prev; }
qrl_status qrl_sched_gpu_open(qrl_scheduler *s, const qrl_model *model, int n_blocks,
                              qrl_error *err) {
    (void)n_blocks;
    return qrl_scheduler_check_device(&s->cfg, model->precision, err);
}

qrl_status qrl_rollout_gpu_check(int device, char *desc, size_t desc_size, size_t *total_bytes,
                                 qrl_error *err) {
    (void)desc, (void)desc_size, (void)total_bytes;
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                         "CUDA device %d: UNSUPPORTED: this build has no CUDA (nvcc was not found "
                         "when it was built)", device);
}

void qrl_rollout_device_name(int device, char *out, size_t cap) { snprintf(out, cap, "cuda:%d", device); }
#endif
