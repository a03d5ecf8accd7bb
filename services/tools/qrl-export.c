/* qrl-export: a learner checkpoint as a HuggingFace folder (docs/qrl-export.md;
 * docs/learner-daemon.md "Export").
 *
 *   qrl-export --checkpoint DIR --out HF_DIR [--model PATH] [--tokenizer PATH] [--dtype f32|bf16]
 *
 * The base model gives the config; its weights are replaced by the checkpoint's, UAQ is
 * undone (the learner trains the scaled form), and the tokenizer files are copied.
 * `qrl-learner export ...` runs this program (the older spelling, kept for the launcher and
 * the scripts that use it).  Errors are one line "qrl-export: error: ..." and exit status 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "io/atomic_file.h"
#include "learner/checkpoint.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static qrl_status copy_file(const char *src, const char *dst, qrl_error *err) {
    FILE *f = fopen(src, "rb");
    if (!f) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", src, strerror(errno));
    qrl_atomic_file af;
    qrl_status st = qrl_atomic_file_open(dst, &af, err);
    char buf[1 << 16];
    size_t k;
    while (st == QRL_OK && (k = fread(buf, 1, sizeof buf, f)) > 0) st = qrl_atomic_file_write(&af, buf, k, err);
    if (st == QRL_OK && ferror(f)) st = qrl_error_set(err, QRL_STATUS_IO, "%s: read error", src);
    fclose(f);
    if (st == QRL_OK) return qrl_atomic_file_commit(&af, err);
    qrl_atomic_file_abort(&af);
    return st;
}

/* The tokenizer files of `tpath` into out: an HF folder's (or tokenizer.json's folder's)
 * tokenizer files, or a llama2.c tokenizer.bin as out/tokenizer.bin. */
static qrl_status copy_tokenizer(const char *tpath, const char *out, int *copied, qrl_error *err) {
    static const char *HF[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                               "special_tokens_map.json", "generation_config.json"};
    char src[QRL_CKPT_PATH_MAX], dst[QRL_CKPT_PATH_MAX], folder[QRL_CKPT_PATH_MAX];
    struct stat sb;
    *copied = 0;
    if (stat(tpath, &sb) != 0) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "tokenizer %s: %s", tpath, strerror(errno));
    size_t n = strlen(tpath);
    bool json = n > 5 && strcmp(tpath + n - 5, ".json") == 0;
    if (!S_ISDIR(sb.st_mode) && !json) {
        if (snprintf(dst, sizeof dst, "%s/tokenizer.bin", out) >= (int)sizeof dst)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: path too long", out);
        QRL_TRY(copy_file(tpath, dst, err));
        *copied = 1;
        return QRL_OK;
    }
    snprintf(folder, sizeof folder, "%s", tpath);
    if (json) {
        char *slash = strrchr(folder, '/');
        if (slash) *slash = 0;
        else snprintf(folder, sizeof folder, ".");
    }
    for (size_t i = 0; i < sizeof HF / sizeof HF[0]; i++) {
        if (snprintf(src, sizeof src, "%s/%s", folder, HF[i]) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s/%s", out, HF[i]) >= (int)sizeof dst)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: path too long", folder);
        if (access(src, F_OK) != 0) continue;
        QRL_TRY(copy_file(src, dst, err));
        ++*copied;
    }
    if (!*copied) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "tokenizer %s: no tokenizer files", tpath);
    return QRL_OK;
}

static const char *prog = "qrl-export"; /* "qrl-learner export" when called by that name */

static _Noreturn void die(const char *what, const char *msg) {
    fprintf(stderr, "%s: error: %s%s%s\n", prog, what, *what ? ": " : "", msg);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc > 0 && strncmp(argv[0], "qrl-learner", 11) == 0) prog = "qrl-learner export";
    const char *ckpt = NULL, *out = NULL, *model = NULL, *tokenizer = NULL, *dtype = "f32";
    for (int i = 1; i < argc; i++) {
        const char **dst = strcmp(argv[i], "--checkpoint") == 0  ? &ckpt
                           : strcmp(argv[i], "--out") == 0       ? &out
                           : strcmp(argv[i], "--model") == 0     ? &model
                           : strcmp(argv[i], "--tokenizer") == 0 ? &tokenizer
                           : strcmp(argv[i], "--dtype") == 0     ? &dtype
                                                                 : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s --checkpoint DIR --out HF_DIR [--model PATH] [--tokenizer PATH] [--dtype f32|bf16]\n"
                 "Write a learner checkpoint as a HuggingFace folder (config.json, model.safetensors, tokenizer\n"
                 "files), UAQ undone.  DIR: a checkpoint root (its newest complete checkpoint) or one step-*\n"
                 "folder.  --model / --tokenizer override the base model and tokenizer paths the manifest\n"
                 "records (the base model gives the config; its weights are replaced by the checkpoint's).\n"
                 "docs/qrl-export.md; `qrl-learner export ...` is the same command.\n", prog);
            return 0;
        }
        if (!dst || i + 1 >= argc)
            die("", "usage: --checkpoint DIR --out HF_DIR [--model PATH] [--tokenizer PATH] [--dtype f32|bf16] "
                    "(see --help)");
        *dst = argv[++i];
    }
    if (!ckpt || !out) die("", "--checkpoint and --out are required (see --help)");
    qrl_dtype dt = strcmp(dtype, "f32") == 0 ? QRL_DTYPE_F32 : strcmp(dtype, "bf16") == 0 ? QRL_DTYPE_BF16 : (qrl_dtype)-1;
    if ((int)dt < 0) die("--dtype", "expected f32 or bf16");
    char dir[QRL_CKPT_PATH_MAX];
    qrl_error err;
    qrl_ckpt_state s;
    if (qrl_ckpt_find(ckpt, dir, &err) != QRL_OK) die("", err.msg);
    if (qrl_ckpt_read(dir, &s, &err) != QRL_OK) die("", err.msg);
    if (!model) model = s.model;
    qrl_model *m;
    if (qrl_model_load(model, &m, &err) != QRL_OK) die("base model", err.msg);
    m->uaq_scale = s.uaq_scale; /* the stored parameters are the scaled ones */
    if (qrl_ckpt_load_params(dir, m, &err) != QRL_OK) die("", err.msg);
    if (qrl_model_undo_uaq(m, &err) != QRL_OK) die("undo UAQ", err.msg);
    if (qrl_model_save_hf(m, out, dt, &err) != QRL_OK) die("", err.msg);
    char tbuf[QRL_CKPT_PATH_MAX];
    if (!tokenizer) tokenizer = *s.tokenizer ? s.tokenizer
                                             : qrl_tokenizer_find_default(model, m->cfg.vocab_size, tbuf, sizeof tbuf);
    int copied = 0;
    if (!tokenizer) QRL_LOG_WARN("learner", "export: no tokenizer known for %s (give --tokenizer)", model);
    else if (copy_tokenizer(tokenizer, out, &copied, &err) != QRL_OK) die("", err.msg);
    QRL_LOG_INFO("learner", "exported %s (step=%llu version=%llu uaq_scale=%g undone) to %s: config.json, "
                 "model.safetensors (%s), %d tokenizer file(s)", dir, (unsigned long long)s.step,
                 (unsigned long long)s.version, (double)s.uaq_scale, out, dtype, copied);
    qrl_model_free(m);
    qrl_ckpt_state_free(&s);
    return 0;
}
