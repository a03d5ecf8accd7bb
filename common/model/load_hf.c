/* HuggingFace checkpoint loader: config.json + model.safetensors (or the sharded
 * index), every tensor validated against the config and converted to F32 into the
 * model arena. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "io/safetensors.h"
#include "model/model.h"

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Copy `src` (any float dtype) into the arena slot of `t` after checking its shape. */
static qrl_status fill(const char *file, const char *src_name, const qrl_tensor *src,
                       qrl_model_tensor *t, qrl_error *err) {
    bool same = src->ndim == t->ndim;
    for (int i = 0; same && i < t->ndim; i++) same = src->shape[i] == t->shape[i];
    if (!same) {
        char want[64], got[128];
        shape_str(want, sizeof want, t->ndim, t->shape);
        shape_str(got, sizeof got, src->ndim, src->shape);
        return qrl_error_set(err, QRL_STATUS_CORRUPT,
                             "%s: tensor '%s' has shape %s, config.json implies %s", file,
                             src_name, got, want);
    }
    size_t n = (size_t)qrl_tensor_numel(src);
    if (qrl_convert_to_f32(src->dtype, src->data, t->data, n) != QRL_OK)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)", file,
                             src_name, qrl_dtype_name(src->dtype));
    return QRL_OK;
}

static bool file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

qrl_status qrl_model_load_hf(const char *dir, qrl_model **out, qrl_error *err) {
    *out = NULL;
    qrl_status st = QRL_OK;
    qrl_model *m = NULL;
    qrl_safetensors *sf = NULL;
    char cfg_path[4096], w_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    qrl_model_config cfg;
    QRL_TRY(qrl_model_config_load_hf(cfg_path, &cfg, err));

    snprintf(w_path, sizeof w_path, "%s/model.safetensors", dir);
    if (!file_exists(w_path)) {
        snprintf(w_path, sizeof w_path, "%s/model.safetensors.index.json", dir);
        if (!file_exists(w_path))
            return qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                                 "%s: neither model.safetensors nor model.safetensors.index.json",
                                 dir);
    }
    QRL_TRY_GOTO(qrl_safetensors_open(w_path, &sf, err), done);
    QRL_TRY_GOTO(qrl_model_new(&cfg, &m, err), done);
    m->source = QRL_MODEL_SOURCE_HF;

    int used = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        qrl_model_tensor *t = &m->tensors[i];
        const char *name = t->name;
        qrl_tensor src;
        qrl_error e2;
        st = qrl_safetensors_get(sf, name, &src, &e2);
        if (st == QRL_STATUS_NOT_FOUND && cfg.tie_embeddings &&
            strcmp(name, "model.embed_tokens.weight") == 0) {
            /* Tied checkpoints saved with only the lm_head alias (TinyStories-656K F32). */
            name = "lm_head.weight";
            st = qrl_safetensors_get(sf, name, &src, &e2);
        }
        if (st == QRL_STATUS_NOT_FOUND) {
            st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: missing tensor '%s'", w_path, t->name);
            goto done;
        }
        if (st != QRL_OK) {
            if (err) *err = e2;
            qrl_error_trace(err, __FILE__, __LINE__);
            goto done;
        }
        QRL_TRY_GOTO(fill(w_path, name, &src, t, err), done);
        used++;
    }
    /* Tensors we did not read: a hint that the checkpoint has parts this model lacks. */
    size_t n_file = qrl_safetensors_count(sf);
    int unused = 0;
    const char *first_unused = NULL;
    for (size_t i = 0; i < n_file; i++) {
        const char *nm = qrl_safetensors_name(sf, i);
        if (qrl_model_find_tensor(m, nm) || strstr(nm, "rotary_emb.inv_freq")) continue;
        if (cfg.tie_embeddings && (strcmp(nm, "lm_head.weight") == 0 ||
                                   strcmp(nm, "model.embed_tokens.weight") == 0))
            continue;
        if (!first_unused) first_unused = nm;
        unused++;
    }
    if (unused)
        QRL_LOG_WARN("model", "unused tensors in checkpoint file=%s count=%d first=%s", w_path,
                     unused, first_unused);
    QRL_LOG_INFO("model", "loaded HF checkpoint dir=%s model_type=%s dim=%d layers=%d heads=%d "
                          "kv_heads=%d head_dim=%d vocab=%d tensors=%d tied=%d",
                 dir, cfg.model_type, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                 cfg.head_dim, cfg.vocab_size, used, cfg.tie_embeddings);
    *out = m;
    m = NULL;
    st = QRL_OK;
done:
    qrl_model_free(m);
    if (sf) qrl_safetensors_close(sf);
    return st;
}
