/* The learner's training engine (private to common/learner): the policy on the CPU
 * reference engine (train/model_train.h) or on the CUDA engine (train/model_train_cuda.h,
 * qrl_learner_config.device >= 0), the frozen reference policy when loss.beta > 0, and
 * AdamW.  update.c calls only these functions, so the update does not depend on where it
 * runs.
 *
 * GPU: the parameters live on the device; qrl_learner_engine_flush copies them into the
 * model's F32 arena (the weight broadcast and checkpoints read them there) once per
 * update, not per optimizer step (6 GB for 1.5B parameters).  The host AdamW object keeps
 * the step count (the LR schedule reads it) and, at checkpoints, the moments. */
#ifndef QRL_LEARNER_ENGINE_H
#define QRL_LEARNER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "learner/update.h"
#include "train/model_train.h"

struct qrl_learner_engine_backend;

typedef struct qrl_learner_engine {
    qrl_model *m;                        /* the policy's weights (borrowed) */
    qrl_model *ref;                      /* frozen initial weights (beta > 0) while the host
                                            needs them (the CPU engine), else NULL */
    const struct qrl_learner_engine_backend *be; /* CPU or CUDA, chosen once by init */
    void *policy, *reference;            /* the backend's engines (reference: beta > 0) */
    qrl_adamw_t *opt;
    float *params, *grads;               /* CPU: the flat F32 blocks AdamW updates */
    size_t n_params;
    int device;                          /* -1 CPU */
    bool dirty;                          /* GPU parameters newer than m's arena */
    bool qat;                            /* the policy engine fake-quantizes (cfg->qat) */
} qrl_learner_engine;

/* Build the engines for m (and a reference copy of m's current weights when
 * cfg->loss.beta > 0) and the optimizer; logs one line with the activation memory.
 * Errors: UNSUPPORTED (device >= 0 without CUDA in this build), CUDA (no such device, out
 * of device memory; the message starts with the config keys), NOMEM.  On error *e holds
 * nothing (qrl_learner_engine_free is still safe). */
qrl_status qrl_learner_engine_init(qrl_learner_engine *e, qrl_model *m,
                                   const qrl_learner_config *cfg, qrl_error *err);
void qrl_learner_engine_free(qrl_learner_engine *e);

/* Forward of a packed batch (int32 arrays [T], model_train.h's format) through the policy
 * (ref false) or the reference policy: logp[T], ent[T] (either may be NULL). */
qrl_status qrl_learner_engine_forward(qrl_learner_engine *e, bool ref, const int32_t *tok,
                                      const int32_t *tgt, const int32_t *pos,
                                      const int32_t *seg, int T, float *logp, float *ent,
                                      qrl_error *err);
/* Backward of the last policy forward with d loss / d logp [T]: adds into the gradients. */
qrl_status qrl_learner_engine_backward(qrl_learner_engine *e, const float *dlogp,
                                       qrl_error *err);
void qrl_learner_engine_zero_grad(qrl_learner_engine *e);
/* Clip + AdamW step (train/adamw.h): OUT_OF_RANGE on a non-finite gradient with nothing
 * changed; CUDA errors leave the device state unknown (the caller stops). */
qrl_status qrl_learner_engine_step(qrl_learner_engine *e, const qrl_adamw_config *cfg,
                                   double lr, qrl_adamw_step_info *info, qrl_error *err);
/* GPU: copy the parameters into m's arena if a step changed them.  Errors: CUDA. */
qrl_status qrl_learner_engine_flush(qrl_learner_engine *e, qrl_error *err);
/* GPU: the device F32 parameters (arena layout) and their device; NULL on the CPU. */
const float *qrl_learner_engine_device_params(qrl_learner_engine *e, int *device);
/* QAT (cfg->qat; no-ops on an engine without it): forget the attached records; attach
 * one sequence's (packed at seq_begin: n_prompt + n_response - 1 tokens, the engine has
 * one token of capacity beyond cfg->max_tokens for the uncounted last one; rec NULL =
 * nearest rounding, counted) to the next policy forward; the counters and their reset
 * (train/model_train.h's qrl_model_train_qat_*).  Errors: OUT_OF_RANGE (positions). */
void qrl_learner_engine_qat_clear(qrl_learner_engine *e);
/* QAT: the next policy forwards' sequences came from a broadcast (BF16) version, not the
 * F32 checkpoint (qrl_model_train_qat_set_bf16). */
void qrl_learner_engine_qat_set_bf16(qrl_learner_engine *e, bool on);
qrl_status qrl_learner_engine_qat_attach(qrl_learner_engine *e, int seq_begin, int n_prompt, int n_response,
                                         const qrl_trace_response *rec, qrl_error *err);
void qrl_learner_engine_qat_stats(qrl_learner_engine *e, qrl_qat_stats *out, bool reset);
/* GPU: flush, and copy the AdamW state into the host optimizer (before a checkpoint). */
qrl_status qrl_learner_engine_sync_host(qrl_learner_engine *e, qrl_error *err);
/* GPU: upload m's weights and the host optimizer state (after a checkpoint was loaded). */
qrl_status qrl_learner_engine_sync_device(qrl_learner_engine *e, qrl_error *err);

/* ---- backends (engine.c: the CPU one; engine_cuda.c: the CUDA one) --------------------
 * One table per place the engine runs, chosen once by qrl_learner_engine_init from
 * cfg->device, like the rollout scheduler's engine backend.  `policy` / `reference` are
 * the backend's own engine objects.  Only engine_cuda.c knows whether this build has
 * CUDA: without it, its open() fails UNSUPPORTED and nothing else of it is reached. */
typedef struct qrl_learner_engine_backend {
    const char *name; /* the log line's device= */
    /* e->policy for e->m (cfg: max_tokens, device, activation_recompute); the CPU one also
     * sets e->params, e->grads and e->n_params */
    qrl_status (*open)(qrl_learner_engine *e, const qrl_learner_config *cfg, qrl_error *err);
    /* e->reference, forward-only, for e->ref (may free e->ref and set it NULL once it was
     * uploaded) */
    qrl_status (*open_ref)(qrl_learner_engine *e, const qrl_learner_config *cfg,
                           qrl_error *err);
    void (*destroy)(void *engine); /* NULL-safe */
    /* device bytes held by engine (0 on the CPU); *activation_bytes its activation bytes */
    size_t (*bytes)(void *engine, size_t *activation_bytes);
    qrl_status (*forward)(void *engine, const int32_t *tok, const int32_t *tgt,
                          const int32_t *pos, const int32_t *seg, int T, float *logp,
                          float *ent, qrl_error *err);
    qrl_status (*backward)(qrl_learner_engine *e, const float *dlogp, qrl_error *err);
    void (*zero_grad)(qrl_learner_engine *e);
    qrl_status (*step)(qrl_learner_engine *e, const qrl_adamw_config *cfg, double lr,
                       qrl_adamw_step_info *info, qrl_error *err);
    /* the rest have the meaning of the public functions of the same name */
    qrl_status (*flush)(qrl_learner_engine *e, qrl_error *err);
    const float *(*device_params)(qrl_learner_engine *e, int *device);
    qrl_status (*sync_host)(qrl_learner_engine *e, qrl_error *err);
    qrl_status (*sync_device)(qrl_learner_engine *e, qrl_error *err);
} qrl_learner_engine_backend;

/* The CUDA backend (engine_cuda.c; its open() fails UNSUPPORTED in a build without CUDA). */
extern const qrl_learner_engine_backend qrl_learner_engine_cuda;

#endif
