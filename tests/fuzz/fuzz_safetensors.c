/* libFuzzer target: the safetensors header parser must refuse any garbage with a status
 * and a one-line message, and every tensor it accepts must lie inside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qrl_safetensors *st = NULL;
    qrl_error err;
    qrl_error_clear(&err);
    if (qrl_safetensors_open_memory(data, size, "fuzz.safetensors", &st, &err) != QRL_OK) {
        QRL_CHECK(err.status != QRL_OK && err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        return 0;
    }
    const uint8_t *end = data + size;
    for (size_t i = 0; i < qrl_safetensors_count(st); i++) {
        const char *name = qrl_safetensors_name(st, i);
        qrl_tensor t;
        QRL_CHECK(qrl_safetensors_get(st, name, &t, &err) == QRL_OK);
        QRL_CHECK(qrl_tensor_is_contiguous(&t));
        size_t nbytes = qrl_tensor_nbytes(&t);
        const uint8_t *p = t.data;
        QRL_CHECK(nbytes == 0 || (p >= data && nbytes <= (size_t)(end - p)));
        /* read every byte (ASan catches a range outside the input) */
        uint8_t acc = 0;
        for (size_t k = 0; k < nbytes; k++) acc ^= p[k];
        (void)acc;
        size_t n = (size_t)qrl_tensor_numel(&t);
        if (n > 0 && n <= (1u << 20) &&
            (t.dtype == QRL_DTYPE_F32 || t.dtype == QRL_DTYPE_BF16 || t.dtype == QRL_DTYPE_F16)) {
            float *f = malloc(n * sizeof *f);
            if (f) QRL_CHECK(qrl_convert_to_f32(t.dtype, t.data, f, n) == QRL_OK);
            free(f);
        }
    }
    qrl_tensor t;
    qrl_status s = qrl_safetensors_get(st, "model.norm.weight", &t, &err);
    QRL_CHECK(s == QRL_OK || s == QRL_STATUS_NOT_FOUND);
    (void)qrl_safetensors_metadata(st, "format");
    qrl_safetensors_close(st);
    return 0;
}
