/* llama2.c legacy checkpoint loader (karpathy/llama2.c run.c, "version 0" export).
 * Little-endian host assumed (as run.c does). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "model/model.h"

/* One contiguous run of the file: `count` floats for each of `n_dst` destinations. */
static qrl_status read_block(FILE *f, const char *path, float *const *dst, int n_dst, size_t count,
                             const char *what, qrl_error *err) {
    for (int i = 0; i < n_dst; i++) {
        long off = ftell(f);
        if (fread(dst[i], sizeof(float), count, f) != count)
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: short read of %s at offset %ld",
                                 path, what, off);
    }
    return QRL_OK;
}

qrl_status qrl_model_load_llama2c(const char *path, qrl_model **out, qrl_error *err) {
    *out = NULL;
    qrl_status st = QRL_OK;
    qrl_model *m = NULL;
    float **dst = NULL;
    struct stat sb;
    /* check before opening: fopen of a FIFO would wait for a writer */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fileno(f), &sb) != 0) {
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    int32_t hdr[7];
    if (sb.st_size < (off_t)sizeof hdr || fread(hdr, sizeof hdr, 1, f) != 1) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "%s: file too short: %lld bytes, a llama2.c header needs 28", path,
                           (long long)sb.st_size);
        goto done;
    }
    if (hdr[0] == 0x616b3432) { /* "ak42": export.py version 1/2 */
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                           "%s: llama2.c version-%d export (magic 'ak42') is not supported; "
                           "export with --version 0 (legacy)",
                           path, hdr[1]);
        goto done;
    }
    qrl_model_config cfg;
    QRL_TRY_GOTO(qrl_model_config_from_llama2c(hdr, path, &cfg, err), done);

    int64_t D = cfg.dim, L = cfg.n_layers, Q = (int64_t)cfg.n_heads * cfg.head_dim,
            KV = (int64_t)cfg.n_kv_heads * cfg.head_dim, F = cfg.hidden_dim, V = cfg.vocab_size;
    int64_t freq_cis = (int64_t)cfg.max_seq_len * cfg.head_dim / 2;
    int64_t n_floats = V * D + L * (2 * D + D * Q + 2 * D * KV + Q * D + 3 * D * F) + D +
                       2 * freq_cis + (cfg.tie_embeddings ? 0 : V * D);
    int64_t want = 28 + 4 * n_floats;
    if ((int64_t)sb.st_size != want) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "%s: file %s: %lld bytes, the header (dim=%d hidden_dim=%d n_layers=%d "
                           "n_heads=%d n_kv_heads=%d vocab_size=%d seq_len=%d) implies %lld",
                           path, (int64_t)sb.st_size < want ? "too short" : "too long",
                           (long long)sb.st_size, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], hdr[5],
                           hdr[6], (long long)want);
        goto done;
    }
    QRL_TRY_GOTO(qrl_model_new(&cfg, &m, err), done);
    m->source = QRL_MODEL_SOURCE_LLAMA2C;
    dst = calloc((size_t)L, sizeof *dst);
    if (!dst) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        goto done;
    }
    QRL_TRY_GOTO(read_block(f, path, &m->tok_embedding, 1, (size_t)(V * D), "token_embedding", err),
                 done);
    /* run.c order: each weight kind for all layers, then the next kind. */
#define LAYERS(field, count, what)                                                      \
    do {                                                                                \
        for (int l = 0; l < L; l++) dst[l] = m->layers[l].field;                        \
        QRL_TRY_GOTO(read_block(f, path, dst, (int)L, (size_t)(count), what, err), done); \
    } while (0)
    LAYERS(attn_norm, D, "rms_att_weight");
    LAYERS(wq, D * Q, "wq");
    LAYERS(wk, D * KV, "wk");
    LAYERS(wv, D * KV, "wv");
    LAYERS(wo, Q * D, "wo");
    LAYERS(ffn_norm, D, "rms_ffn_weight");
    LAYERS(w_gate, D * F, "w1");
    LAYERS(w_down, F * D, "w2");
    LAYERS(w_up, D * F, "w3");
#undef LAYERS
    QRL_TRY_GOTO(read_block(f, path, &m->final_norm, 1, (size_t)D, "rms_final_weight", err), done);
    if (fseek(f, (long)(2 * freq_cis * 4), SEEK_CUR) != 0) { /* legacy freq_cis tables */
        st = qrl_error_set(err, QRL_STATUS_IO, "%s: seek past freq_cis failed", path);
        goto done;
    }
    if (!cfg.tie_embeddings)
        QRL_TRY_GOTO(read_block(f, path, &m->lm_head, 1, (size_t)(V * D), "wcls", err), done);
    QRL_LOG_INFO("model", "loaded llama2.c checkpoint path=%s dim=%d layers=%d heads=%d kv_heads=%d "
                          "vocab=%d seq_len=%d tied=%d",
                 path, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size,
                 cfg.max_seq_len, cfg.tie_embeddings);
    *out = m;
    m = NULL;
done:
    free(dst);
    qrl_model_free(m);
    fclose(f);
    return st;
}
