/* The learner's CUDA training engine backend (engine.h): the policy and the reference on
 * train/model_train_cuda.h, AdamW on the device with the host optimizer keeping the step
 * count and, at checkpoints, the moments.  The only file of common/learner that knows
 * whether this build has CUDA. */
#include "learner/engine.h"

#include <string.h>

#ifdef QRL_HAVE_CUDA
#include "train/model_train_cuda.h"

/* Prefix a failure of the CUDA engine with the keys that chose it. */
static qrl_status keyed(qrl_status st, int device, qrl_error *err) {
    if (st != QRL_OK && err) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        qrl_error_set(err, st, "learner.device cuda (learner.cuda_device %d): %s", device, msg);
    }
    return st;
}

static qrl_status gpu_open(qrl_learner_engine *e, const qrl_learner_config *cfg,
                           qrl_error *err) {
    /* QAT as the CPU backend's (engine.c): the policy only, one spare token of capacity
     * for attaching the last sequence of a full row */
    qrl_model_train_cuda_opts go = {.max_tokens = cfg->max_tokens + (cfg->qat != QRL_QAT_OFF),
                                    .device = cfg->device,
                                    .recompute_activations = cfg->activation_recompute,
                                    .optimizer_state = true, .qat = cfg->qat,
                                    .qat_kv = cfg->qat_kv,
                                    .trace_guidance = cfg->qat != QRL_QAT_OFF &&
                                                      cfg->trace_guidance};
    qrl_model_train_cuda_t *tr = NULL;
    qrl_status st = keyed(qrl_model_train_cuda_new(e->m, &go, &tr, err), cfg->device, err);
    e->policy = tr;
    return st;
}
static qrl_status gpu_open_ref(qrl_learner_engine *e, const qrl_learner_config *cfg,
                               qrl_error *err) {
    qrl_model_train_cuda_opts ro = {.max_tokens = cfg->max_tokens, .device = cfg->device,
                                    .recompute_activations = true};
    qrl_model_train_cuda_t *tr = NULL;
    qrl_status st = keyed(qrl_model_train_cuda_new(e->ref, &ro, &tr, err), cfg->device, err);
    e->reference = tr;
    if (st != QRL_OK) return st;
    qrl_model_free(e->ref); /* uploaded: the host copy is not needed */
    e->ref = NULL;
    return QRL_OK;
}
static void gpu_destroy(void *engine) { qrl_model_train_cuda_destroy(engine); }
static size_t gpu_bytes(void *engine, size_t *activation_bytes) {
    return qrl_model_train_cuda_bytes(engine, activation_bytes);
}
static qrl_status gpu_forward(void *engine, const int32_t *tok, const int32_t *tgt,
                              const int32_t *pos, const int32_t *seg, int T, float *logp,
                              float *ent, qrl_error *err) {
    return qrl_model_train_cuda_forward(engine, tok, tgt, pos, seg, T, logp, ent, err);
}
static qrl_status gpu_backward(qrl_learner_engine *e, const float *dlogp, qrl_error *err) {
    return qrl_model_train_cuda_backward(e->policy, dlogp, NULL, false, err);
}
static void gpu_zero_grad(qrl_learner_engine *e) { qrl_model_train_cuda_zero_grad(e->policy); }
static qrl_status gpu_step(qrl_learner_engine *e, const qrl_adamw_config *cfg, double lr,
                           qrl_adamw_step_info *info, qrl_error *err) {
    QRL_TRY(qrl_model_train_cuda_adamw_step(e->policy, cfg, lr, info, err));
    qrl_adamw_set_steps(e->opt, info->step);
    e->dirty = true;
    return QRL_OK;
}
static qrl_status gpu_flush(qrl_learner_engine *e, qrl_error *err) {
    if (e->dirty) {
        QRL_TRY(qrl_model_train_cuda_get_params(e->policy, e->m->arena, err));
        e->dirty = false;
    }
    return QRL_OK;
}
static const float *gpu_device_params(qrl_learner_engine *e, int *device) {
    return qrl_model_train_cuda_params_device(e->policy, device);
}
static qrl_status gpu_sync_host(qrl_learner_engine *e, qrl_error *err) {
    QRL_TRY(gpu_flush(e, err));
    float *m, *v;
    int64_t steps;
    qrl_adamw_moments(e->opt, &m, &v);
    QRL_TRY(qrl_model_train_cuda_adamw_state(e->policy, m, v, &steps, true, err));
    qrl_adamw_set_steps(e->opt, steps);
    return QRL_OK;
}
static qrl_status gpu_sync_device(qrl_learner_engine *e, qrl_error *err) {
    float *m, *v;
    int64_t steps = qrl_adamw_steps(e->opt);
    qrl_adamw_moments(e->opt, &m, &v);
    QRL_TRY(qrl_model_train_cuda_set_params(e->policy, e->m->arena, err));
    QRL_TRY(qrl_model_train_cuda_adamw_state(e->policy, m, v, &steps, false, err));
    e->dirty = false;
    return QRL_OK;
}
static void gpu_qat_set_bf16(qrl_learner_engine *e, bool on) {
    qrl_model_train_cuda_qat_set_bf16(e->policy, on);
}
static void gpu_qat_clear(qrl_learner_engine *e) { qrl_model_train_cuda_qat_clear(e->policy); }
static qrl_status gpu_qat_attach(qrl_learner_engine *e, int seq_begin, int n_prompt,
                                 int n_response, const qrl_trace_response *rec, qrl_error *err) {
    return qrl_model_train_cuda_qat_attach(e->policy, seq_begin, n_prompt, n_response, rec, err);
}
static qrl_status gpu_qat_stats(qrl_learner_engine *e, qrl_qat_stats *out, bool reset,
                                qrl_error *err) {
    return qrl_model_train_cuda_qat_stats(e->policy, out, reset, err);
}

const qrl_learner_engine_backend qrl_learner_engine_cuda = {
    .name = "cuda", .open = gpu_open, .open_ref = gpu_open_ref, .destroy = gpu_destroy,
    .bytes = gpu_bytes, .forward = gpu_forward, .backward = gpu_backward,
    .zero_grad = gpu_zero_grad, .step = gpu_step, .flush = gpu_flush,
    .device_params = gpu_device_params, .sync_host = gpu_sync_host,
    .sync_device = gpu_sync_device, .qat_set_bf16 = gpu_qat_set_bf16,
    .qat_clear = gpu_qat_clear, .qat_attach = gpu_qat_attach, .qat_stats = gpu_qat_stats};

#else /* !QRL_HAVE_CUDA: init fails here, so nothing else of the table is reached */
static qrl_status gpu_open(qrl_learner_engine *e, const qrl_learner_config *cfg,
                           qrl_error *err) {
    (void)e, (void)cfg;
    return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "learner.device cuda: this build has "
                         "no CUDA (nvcc was not found when it was built)");
}
static void gpu_destroy(void *engine) { (void)engine; }
const qrl_learner_engine_backend qrl_learner_engine_cuda = {
    .name = "cuda", .open = gpu_open, .destroy = gpu_destroy};
#endif
