/* The model -> publish table of the device weight path (wipc.h); plain C, no CUDA, so the
 * learner, bench/wipc and the CUDA tests build the same table one way. */
#include <stdlib.h>

#include "model/model.h"
#include "weights/wipc.h"

qrl_status qrl_wipc_model_table(const qrl_model *m, const float *params, qrl_wsync_tensor **t,
                                const float ***src, qrl_error *err) {
    size_t n = m->n_tensors > 0 ? (size_t)m->n_tensors : 0;
    *t = calloc(n ? n : 1, sizeof **t);
    *src = calloc(n ? n : 1, sizeof **src);
    if (!*t || !*src) {
        free(*t), free(*src);
        *t = NULL, *src = NULL;
        return qrl_error_set(err, QRL_STATUS_NOMEM, "weight publish: a table of %zu tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        const qrl_model_tensor *mt = &m->tensors[i];
        (*t)[i] = (qrl_wsync_tensor){.name = mt->name, .dtype = "BF16", .ndim = mt->ndim,
                                     .shape = {(uint64_t)mt->shape[0], mt->ndim == 2 ? (uint64_t)mt->shape[1] : 0}};
        (*src)[i] = params + (mt->data - m->arena); /* the device copy keeps the arena's layout */
    }
    return QRL_OK;
}
