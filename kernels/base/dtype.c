/* The dtype table's functions (dtype.h). */
#include "base/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
#define QRL_X_(name, st, size) {st, size},
    QRL_DTYPE_TABLE(QRL_X_)
#undef QRL_X_
};

size_t qrl_dtype_size(qrl_dtype dt) {
    return (unsigned)dt < QRL_DTYPE_COUNT_ ? dtype_table[dt].size : 0;
}

const char *qrl_dtype_name(qrl_dtype dt) {
    return (unsigned)dt < QRL_DTYPE_COUNT_ ? dtype_table[dt].name : "?";
}

qrl_status qrl_dtype_parse(const char *name, qrl_dtype *out) {
    for (int i = 0; i < QRL_DTYPE_COUNT_; i++) {
        if (name && strcmp(name, dtype_table[i].name) == 0) {
            *out = (qrl_dtype)i;
            return QRL_OK;
        }
    }
    return QRL_STATUS_UNSUPPORTED;
}
