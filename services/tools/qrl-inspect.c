/* qrl-inspect: validate a safetensors checkpoint and list its tensors.
 *
 *   qrl-inspect FILE_OR_DIR
 *
 * FILE_OR_DIR is a .safetensors file, a sharded *.safetensors.index.json, or a folder
 * holding model.safetensors or model.safetensors.index.json.  Prints one line per tensor,
 * sorted by name:  <name> <dtype> [<d0>, <d1>, ...] <bytes>
 * On invalid input prints one line "qrl-inspect: error: <message>" to stderr and exits 1. */
#include <stdio.h>
#include <string.h>

#include "io/safetensors.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: qrl-inspect FILE_OR_DIR\n"
            "Validate a safetensors checkpoint (a .safetensors file, a sharded\n"
            "*.safetensors.index.json, or a folder holding model.safetensors or\n"
            "model.safetensors.index.json) and print one line per tensor:\n"
            "  name dtype [shape] bytes\n"
            "Exit status: 0 valid, 1 invalid or unreadable input, or a usage error.\n");
}

int main(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') { /* a usage error: 1, as in every qrl program */
        int opt = 1;
        while (opt < argc && argv[opt][0] != '-') opt++;
        if (opt < argc) fprintf(stderr, "qrl-inspect: error: unknown option '%s' (see --help)\n", argv[opt]);
        else fprintf(stderr, "qrl-inspect: error: expected one FILE_OR_DIR argument, got %d (see --help)\n", argc - 1);
        return 1;
    }
    qrl_error err;
    qrl_error_clear(&err);
    qrl_safetensors *st;
    if (qrl_safetensors_open(argv[1], &st, &err) != QRL_OK) {
        fprintf(stderr, "qrl-inspect: error: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < qrl_safetensors_count(st); i++) {
        const char *name = qrl_safetensors_name(st, i);
        qrl_tensor t;
        QRL_CHECK(qrl_safetensors_get(st, name, &t, &err) == QRL_OK);
        printf("%s %s [", name, qrl_dtype_name(t.dtype));
        for (int d = 0; d < t.ndim; d++) printf("%s%lld", d ? ", " : "", (long long)t.shape[d]);
        printf("] %zu\n", qrl_tensor_nbytes(&t));
    }
    qrl_safetensors_close(st);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "qrl-inspect: error: writing the listing failed\n");
        return 1;
    }
    return 0;
}
