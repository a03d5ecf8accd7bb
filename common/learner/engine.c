/* The learner's training engine (engine.h): what does not depend on where it runs, and
 * the CPU backend.  The CUDA backend is engine_cuda.c. */
#include "learner/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

/* ---- CPU backend: the reference engine (train/model_train.h) and host AdamW ---------- */
static qrl_status cpu_open(qrl_learner_engine *e, const qrl_learner_config *cfg,
                           qrl_error *err) {
    /* QAT is the policy's only (the reference policy stays F32).  qat_attach takes a
     * sequence as prompt + response tokens, one more than the packed row holds (its last
     * token predicts nothing): one spare token of capacity lets the last sequence of a
     * full row (cfg->max_tokens) be attached. */
    qrl_model_train_opts to = {.max_tokens = cfg->max_tokens + (cfg->qat != QRL_QAT_OFF),
                               .recompute_activations = cfg->activation_recompute,
                               .qat = cfg->qat, .qat_kv = cfg->qat_kv,
                               .trace_guidance = cfg->qat != QRL_QAT_OFF && cfg->trace_guidance};
    qrl_model_train_t *tr = NULL;
    QRL_TRY(qrl_model_train_new_opts(e->m, &to, &tr, err));
    e->policy = tr;
    e->params = qrl_model_train_params(tr, &e->n_params);
    e->grads = qrl_model_train_grads(tr, &e->n_params);
    return QRL_OK;
}
static qrl_status cpu_open_ref(qrl_learner_engine *e, const qrl_learner_config *cfg,
                               qrl_error *err) {
    qrl_model_train_opts ro = {.max_tokens = cfg->max_tokens, .recompute_activations = true};
    qrl_model_train_t *tr = NULL;
    QRL_TRY(qrl_model_train_new_opts(e->ref, &ro, &tr, err));
    e->reference = tr;
    return QRL_OK;
}
static void cpu_destroy(void *engine) { qrl_model_train_destroy(engine); }
static size_t cpu_bytes(void *engine, size_t *activation_bytes) {
    *activation_bytes = qrl_model_train_activation_bytes(engine);
    return 0;
}
static qrl_status cpu_forward(void *engine, const int32_t *tok, const int32_t *tgt,
                              const int32_t *pos, const int32_t *seg, int T, float *logp,
                              float *ent, qrl_error *err) {
    return qrl_model_train_forward(engine, tok, tgt, pos, seg, T, logp, ent, err);
}
static qrl_status cpu_backward(qrl_learner_engine *e, const float *dlogp, qrl_error *err) {
    return qrl_model_train_backward(e->policy, dlogp, NULL, err);
}
static void cpu_zero_grad(qrl_learner_engine *e) { qrl_model_train_zero_grad(e->policy); }
static qrl_status cpu_step(qrl_learner_engine *e, const qrl_adamw_config *cfg, double lr,
                           qrl_adamw_step_info *info, qrl_error *err) {
    (void)cfg; /* the CPU optimizer was created with it */
    return qrl_adamw_step(e->opt, e->params, e->grads, lr, info, err);
}
/* the parameters are m's arena itself and AdamW's state is the host optimizer's */
static qrl_status cpu_nothing(qrl_learner_engine *e, qrl_error *err) {
    (void)e, (void)err;
    return QRL_OK;
}
static const float *cpu_device_params(qrl_learner_engine *e, int *device) {
    (void)e;
    *device = -1;
    return NULL;
}
static const qrl_learner_engine_backend CPU_BACKEND = {
    .name = "cpu", .open = cpu_open, .open_ref = cpu_open_ref, .destroy = cpu_destroy,
    .bytes = cpu_bytes, .forward = cpu_forward, .backward = cpu_backward,
    .zero_grad = cpu_zero_grad, .step = cpu_step, .flush = cpu_nothing,
    .device_params = cpu_device_params, .sync_host = cpu_nothing, .sync_device = cpu_nothing};

/* ---- the engine ------------------------------------------------------------------------ */
qrl_status qrl_learner_engine_init(qrl_learner_engine *e, qrl_model *m,
                                   const qrl_learner_config *cfg, qrl_error *err) {
    memset(e, 0, sizeof *e);
    e->m = m;
    e->device = cfg->device;
    e->n_params = qrl_model_param_count(m);
    e->be = cfg->device >= 0 ? &qrl_learner_engine_cuda : &CPU_BACKEND;
    qrl_status st = QRL_OK;
    if (cfg->qat != QRL_QAT_OFF && cfg->device >= 0)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "learner.qat with learner.device cuda: UNSUPPORTED (the QAT forward runs "
                             "in the CPU training engine; use learner.device cpu)");
    e->qat = cfg->qat != QRL_QAT_OFF;
    QRL_TRY_GOTO(e->be->open(e, cfg, err), fail);
    /* GPU: the host optimizer holds the step count and, at checkpoints, the moments */
    QRL_TRY_GOTO(qrl_adamw_new(e->n_params, &cfg->adamw, &e->opt, err), fail);
    if (cfg->loss.beta > 0) {
        QRL_TRY_GOTO(qrl_model_new(&m->cfg, &e->ref, err), fail);
        if (e->ref->arena_floats != m->arena_floats) {
            st = qrl_error_set(err, QRL_STATUS_INTERNAL,
                               "learner: reference model arena %zu floats, model %zu",
                               e->ref->arena_floats, m->arena_floats);
            goto fail;
        }
        memcpy(e->ref->arena, m->arena, e->n_params * sizeof(float));
        /* forward only (lp_ref): with recomputation it holds one layer's activations, and
         * its log-probs are the same bits */
        QRL_TRY_GOTO(e->be->open_ref(e, cfg, err), fail);
    }
    size_t act = 0, ref_act = 0, dev_bytes = e->be->bytes(e->policy, &act);
    if (e->reference) dev_bytes += e->be->bytes(e->reference, &ref_act);
    QRL_LOG_INFO("learner", "training engine device=%s max_tokens=%d activation_recompute=%d "
                 "activation_bytes=%zu ref_activation_bytes=%zu device_bytes=%zu qat=%s "
                 "qat_kv=%d trace_guidance=%d",
                 e->be->name, cfg->max_tokens, (int)cfg->activation_recompute, act, ref_act,
                 dev_bytes, e->qat ? "nvfp4" : "none", (int)cfg->qat_kv, (int)cfg->trace_guidance);
    return QRL_OK;
fail:
    qrl_learner_engine_free(e);
    return st;
}

void qrl_learner_engine_free(qrl_learner_engine *e) {
    if (e->be) {
        e->be->destroy(e->policy);
        e->be->destroy(e->reference);
    }
    qrl_model_free(e->ref);
    qrl_adamw_destroy(e->opt);
    qrl_model *m = e->m;
    int device = e->device;
    memset(e, 0, sizeof *e); /* qat too: a freed engine attaches nothing */
    e->m = m, e->device = device;
}

qrl_status qrl_learner_engine_forward(qrl_learner_engine *e, bool ref, const int32_t *tok,
                                      const int32_t *tgt, const int32_t *pos,
                                      const int32_t *seg, int T, float *logp, float *ent,
                                      qrl_error *err) {
    return e->be->forward(ref ? e->reference : e->policy, tok, tgt, pos, seg, T, logp, ent,
                          err);
}

qrl_status qrl_learner_engine_backward(qrl_learner_engine *e, const float *dlogp,
                                       qrl_error *err) {
    return e->be->backward(e, dlogp, err);
}

void qrl_learner_engine_zero_grad(qrl_learner_engine *e) { e->be->zero_grad(e); }

qrl_status qrl_learner_engine_step(qrl_learner_engine *e, const qrl_adamw_config *cfg,
                                   double lr, qrl_adamw_step_info *info, qrl_error *err) {
    return e->be->step(e, cfg, lr, info, err);
}

qrl_status qrl_learner_engine_flush(qrl_learner_engine *e, qrl_error *err) {
    return e->be ? e->be->flush(e, err) : QRL_OK; /* freed: nothing to copy */
}

const float *qrl_learner_engine_device_params(qrl_learner_engine *e, int *device) {
    if (!e->be) {
        *device = -1;
        return NULL;
    }
    return e->be->device_params(e, device);
}

qrl_status qrl_learner_engine_sync_host(qrl_learner_engine *e, qrl_error *err) {
    return e->be ? e->be->sync_host(e, err) : QRL_OK; /* freed: nothing to copy */
}

qrl_status qrl_learner_engine_sync_device(qrl_learner_engine *e, qrl_error *err) {
    return e->be ? e->be->sync_device(e, err) : QRL_OK; /* freed: nothing to copy */
}

/* QAT runs on the CPU engine only (init refuses it on the GPU), so these reach
 * model_train.h directly. */
void qrl_learner_engine_qat_set_bf16(qrl_learner_engine *e, bool on) {
    if (e->qat) qrl_model_train_qat_set_bf16(e->policy, on);
}

void qrl_learner_engine_qat_clear(qrl_learner_engine *e) {
    if (e->qat) qrl_model_train_qat_clear(e->policy);
}

qrl_status qrl_learner_engine_qat_attach(qrl_learner_engine *e, int seq_begin, int n_prompt, int n_response,
                                         const qrl_trace_response *rec, qrl_error *err) {
    return e->qat ? qrl_model_train_qat_attach(e->policy, seq_begin, n_prompt, n_response, rec, err) : QRL_OK;
}

void qrl_learner_engine_qat_stats(qrl_learner_engine *e, qrl_qat_stats *out, bool reset) {
    memset(out, 0, sizeof *out);
    if (!e->qat) return;
    qrl_model_train_qat_stats(e->policy, out);
    if (reset) qrl_model_train_qat_stats_reset(e->policy);
}
