/* The learner's training engine: CPU reference or CUDA (engine.h). */
#include "learner/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#ifdef QRL_HAVE_CUDA
#include "train/model_train_cuda.h"
#endif

#ifdef QRL_HAVE_CUDA
/* Prefix a failure of the CUDA engine with the keys that chose it. */
static qrl_status keyed(qrl_status st, int device, qrl_error *err) {
    if (st != QRL_OK && err) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        qrl_error_set(err, st, "learner.device cuda (learner.cuda_device %d): %s", device, msg);
    }
    return st;
}
#endif

qrl_status qrl_learner_engine_init(qrl_learner_engine *e, qrl_model *m,
                                   const qrl_learner_config *cfg, qrl_error *err) {
    memset(e, 0, sizeof *e);
    e->m = m;
    e->device = cfg->device;
    e->n_params = (size_t)(m->rope_inv_freq - m->arena);
    qrl_status st = QRL_OK;
    if (cfg->device >= 0) {
#ifdef QRL_HAVE_CUDA
        qrl_model_train_cuda_opts go = {.max_tokens = cfg->max_tokens, .device = cfg->device,
                                        .recompute_activations = cfg->activation_recompute,
                                        .optimizer_state = true};
        st = keyed(qrl_model_train_cuda_new(m, &go, &e->gtr, err), cfg->device, err);
        if (st != QRL_OK) goto fail;
#else
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "learner.device cuda: this build has "
                           "no CUDA (nvcc was not found when it was built)");
        goto fail;
#endif
    } else {
        qrl_model_train_opts to = {.max_tokens = cfg->max_tokens,
                                   .recompute_activations = cfg->activation_recompute};
        QRL_TRY_GOTO(qrl_model_train_new_opts(m, &to, &e->tr, err), fail);
        e->params = qrl_model_train_params(e->tr, &e->n_params);
        e->grads = qrl_model_train_grads(e->tr, &e->n_params);
    }
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
#ifdef QRL_HAVE_CUDA
        if (e->gtr) {
            qrl_model_train_cuda_opts ro = {.max_tokens = cfg->max_tokens,
                                            .device = cfg->device,
                                            .recompute_activations = true};
            st = keyed(qrl_model_train_cuda_new(e->ref, &ro, &e->gref, err), cfg->device, err);
            if (st != QRL_OK) goto fail;
            qrl_model_free(e->ref); /* uploaded: the host copy is not needed */
            e->ref = NULL;
        }
#endif
        if (!e->gtr) {
            qrl_model_train_opts ro = {.max_tokens = cfg->max_tokens,
                                       .recompute_activations = true};
            QRL_TRY_GOTO(qrl_model_train_new_opts(e->ref, &ro, &e->ref_tr, err), fail);
        }
    }
    size_t act = 0, ref_act = 0, dev_bytes = 0;
#ifdef QRL_HAVE_CUDA
    if (e->gtr) dev_bytes = qrl_model_train_cuda_bytes(e->gtr, &act);
    if (e->gref) dev_bytes += qrl_model_train_cuda_bytes(e->gref, &ref_act);
#endif
    if (e->tr) act = qrl_model_train_activation_bytes(e->tr);
    if (e->ref_tr) ref_act = qrl_model_train_activation_bytes(e->ref_tr);
    QRL_LOG_INFO("learner", "training engine device=%s max_tokens=%d activation_recompute=%d "
                 "activation_bytes=%zu ref_activation_bytes=%zu device_bytes=%zu",
                 e->gtr ? "cuda" : "cpu", cfg->max_tokens, (int)cfg->activation_recompute, act,
                 ref_act, dev_bytes);
    return QRL_OK;
fail:
    qrl_learner_engine_free(e);
    return st;
}

void qrl_learner_engine_free(qrl_learner_engine *e) {
    qrl_model_train_destroy(e->tr);
    qrl_model_train_destroy(e->ref_tr);
#ifdef QRL_HAVE_CUDA
    qrl_model_train_cuda_destroy(e->gtr);
    qrl_model_train_cuda_destroy(e->gref);
#endif
    qrl_model_free(e->ref);
    qrl_adamw_destroy(e->opt);
    qrl_model *m = e->m;
    int device = e->device;
    memset(e, 0, sizeof *e);
    e->m = m, e->device = device;
}

qrl_status qrl_learner_engine_forward(qrl_learner_engine *e, bool ref, const int32_t *tok,
                                      const int32_t *tgt, const int32_t *pos,
                                      const int32_t *seg, int T, float *logp, float *ent,
                                      qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr)
        return qrl_model_train_cuda_forward(ref ? e->gref : e->gtr, tok, tgt, pos, seg, T, logp,
                                            ent, err);
#endif
    return qrl_model_train_forward(ref ? e->ref_tr : e->tr, tok, tgt, pos, seg, T, logp, ent,
                                   err);
}

qrl_status qrl_learner_engine_backward(qrl_learner_engine *e, const float *dlogp,
                                       qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) return qrl_model_train_cuda_backward(e->gtr, dlogp, NULL, false, err);
#endif
    return qrl_model_train_backward(e->tr, dlogp, NULL, err);
}

void qrl_learner_engine_zero_grad(qrl_learner_engine *e) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) {
        qrl_model_train_cuda_zero_grad(e->gtr);
        return;
    }
#endif
    qrl_model_train_zero_grad(e->tr);
}

qrl_status qrl_learner_engine_step(qrl_learner_engine *e, const qrl_adamw_config *cfg,
                                   double lr, qrl_adamw_step_info *info, qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) {
        QRL_TRY(qrl_model_train_cuda_adamw_step(e->gtr, cfg, lr, info, err));
        qrl_adamw_set_steps(e->opt, info->step);
        e->dirty = true;
        return QRL_OK;
    }
#endif
    (void)cfg; /* the CPU optimizer was created with it */
    return qrl_adamw_step(e->opt, e->params, e->grads, lr, info, err);
}

qrl_status qrl_learner_engine_flush(qrl_learner_engine *e, qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr && e->dirty) {
        QRL_TRY(qrl_model_train_cuda_get_params(e->gtr, e->m->arena, err));
        e->dirty = false;
    }
#endif
    (void)e, (void)err;
    return QRL_OK;
}

const float *qrl_learner_engine_device_params(qrl_learner_engine *e, int *device) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) return qrl_model_train_cuda_params_device(e->gtr, device);
#endif
    (void)e;
    *device = -1;
    return NULL;
}

qrl_status qrl_learner_engine_sync_host(qrl_learner_engine *e, qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) {
        QRL_TRY(qrl_learner_engine_flush(e, err));
        float *m, *v;
        int64_t steps;
        qrl_adamw_moments(e->opt, &m, &v);
        QRL_TRY(qrl_model_train_cuda_adamw_state(e->gtr, m, v, &steps, true, err));
        qrl_adamw_set_steps(e->opt, steps);
    }
#endif
    (void)e, (void)err;
    return QRL_OK;
}

qrl_status qrl_learner_engine_sync_device(qrl_learner_engine *e, qrl_error *err) {
#ifdef QRL_HAVE_CUDA
    if (e->gtr) {
        float *m, *v;
        int64_t steps = qrl_adamw_steps(e->opt);
        qrl_adamw_moments(e->opt, &m, &v);
        QRL_TRY(qrl_model_train_cuda_set_params(e->gtr, e->m->arena, err));
        QRL_TRY(qrl_model_train_cuda_adamw_state(e->gtr, m, v, &steps, false, err));
        e->dirty = false;
    }
#endif
    (void)e, (void)err;
    return QRL_OK;
}
