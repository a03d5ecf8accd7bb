/* AdamW on FP32 master weights (SPEC §5, optimizer paragraph).
 *
 * The parameters are one flat F32 buffer of n elements (llm.c's single parameter
 * block), the gradients another of the same size.  One step, with t = steps taken + 1
 * and g the (possibly clipped) gradient, is PyTorch's torch.optim.AdamW
 * (amsgrad=False, maximize=False), per element:
 *   p <- p * (1 - lr * weight_decay)                       decoupled weight decay
 *   m <- beta1 * m + (1 - beta1) * g
 *   v <- beta2 * v + (1 - beta2) * g^2
 *   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * Weight decay applies to every element (PyTorch's default of one parameter group).
 *
 * Clipping by global norm is torch.nn.utils.clip_grad_norm_: norm = ||g||_2 over all n
 * elements; when norm > max_grad_norm, g is used scaled by max_grad_norm / (norm + 1e-6).
 * The norm is summed in double over fixed chunks in a fixed order, so the step is
 * bit-reproducible whatever the OpenMP thread count. */
#ifndef QRL_TRAIN_ADAMW_H
#define QRL_TRAIN_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qrl_adamw_config {
    float beta1;         /* e.g. 0.9 */
    float beta2;         /* e.g. 0.999 */
    float eps;           /* e.g. 1e-8 */
    float weight_decay;  /* e.g. 0.01 (PyTorch's AdamW default) */
    float max_grad_norm; /* clip threshold; <= 0: no clipping (SPEC default 1.0) */
} qrl_adamw_config;

/* The PyTorch defaults above with max_grad_norm 1.0. */
qrl_adamw_config qrl_adamw_config_default(void);

/* Opaque optimizer state: m and v (n floats each), the step count, the config. */
typedef struct qrl_adamw qrl_adamw_t;

/* What one step did. */
typedef struct qrl_adamw_step_info {
    double grad_norm;  /* global L2 norm of the gradient before clipping (inf/nan when
                          the gradient was not finite) */
    float clip_scale;  /* factor applied to the gradient (1 when not clipped) */
    int64_t step;      /* steps taken after this call */
} qrl_adamw_step_info;

/* Create the state for n parameters, m = v = 0, step 0.  *out is owned by the caller:
 * free with qrl_adamw_destroy.  Errors: INVALID_ARGUMENT (n == 0, betas outside [0, 1),
 * eps <= 0, weight_decay < 0, a non-finite field; the message names the field), NOMEM. */
qrl_status qrl_adamw_new(size_t n, const qrl_adamw_config *cfg, qrl_adamw_t **out,
                         qrl_error *err);
/* Free the state; NULL is a no-op. */
void qrl_adamw_destroy(qrl_adamw_t *opt);

size_t qrl_adamw_size(const qrl_adamw_t *opt);
int64_t qrl_adamw_steps(const qrl_adamw_t *opt);
qrl_adamw_config qrl_adamw_get_config(const qrl_adamw_t *opt);

/* The moment buffers m[n] and v[n] (borrowed; for an engine that keeps its own copy, e.g.
 * on a GPU, to save or restore through qrl_adamw_save / load). */
void qrl_adamw_moments(qrl_adamw_t *opt, float **m, float **v);
/* Set the step count (with the moments copied in from such an engine). */
void qrl_adamw_set_steps(qrl_adamw_t *opt, int64_t steps);

/* Global L2 norm of g[n], summed in double over fixed chunks (thread-count independent);
 * inf or nan when an element is not finite. */
double qrl_adamw_grad_norm(const float *g, size_t n);

/* One AdamW step over params[n] with grads[n] (n = qrl_adamw_size) and learning rate lr.
 * grads is read only (clipping scales on the fly).  info may be NULL.
 * Errors: OUT_OF_RANGE when a gradient element is NaN or +-Inf: the message names the
 * first such index; params, m, v and the step count are left untouched, so the caller
 * can skip the batch (info->grad_norm is then the non-finite norm).  INVALID_ARGUMENT
 * when lr is negative or not finite (nothing touched either). */
qrl_status qrl_adamw_step(qrl_adamw_t *opt, float *params, const float *grads, double lr,
                          qrl_adamw_step_info *info, qrl_error *err);

/* Optimizer state file (little-endian; the parameters themselves are the model's and
 * are saved with it):
 *   0   char[8]  magic "QRLADAMW"
 *   8   u32      version (1)
 *   12  u32      header bytes (64)
 *   16  u64      step
 *   24  u64      n
 *   32  f32 x 5  beta1, beta2, eps, weight_decay, max_grad_norm (informative)
 *   52  u8 x 12  reserved, zero
 *   64  f32[n]   m
 *       f32[n]   v
 *       u32      crc32 (IEEE, as zlib) of every byte before it
 * Written atomically: path.tmp, fsync, rename over path, fsync of the folder; on error
 * the temp file is removed and path is untouched.  Errors: IO (names the path, the
 * operation and errno). */
qrl_status qrl_adamw_save(const qrl_adamw_t *opt, const char *path, qrl_error *err);

/* Replace the state (m, v, step) with the file's.  All or nothing: the file is checked
 * completely (magic, version, header size, reserved bytes, n, exact file size, CRC,
 * finite m, finite non-negative v) before anything changes.  The optimizer keeps its
 * own config (hyperparameters may change across a resume); a difference is logged.
 * Errors: NOT_FOUND / IO (cannot open or read; names the path), CORRUPT (bad magic,
 * truncated or trailing bytes, CRC mismatch, bad values: names the path and the
 * offset), UNSUPPORTED (other version), INVALID_ARGUMENT (the file holds a different
 * n than the optimizer), NOMEM. */
qrl_status qrl_adamw_load(qrl_adamw_t *opt, const char *path, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
