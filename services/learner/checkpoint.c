/* qrl-learner checkpoints (docs/learner-daemon.md "Checkpoints", "Resume", "Export"):
 * the trainer-thread half of writing one (tensors, optimizer, manifest; the loop copies
 * its own state into the job), resolving and restoring one at start, and the
 * `qrl-learner export` subcommand (checkpoint -> HuggingFace folder, UAQ undone). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "io/atomic_file.h"
#include "learner.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ld_ckpt_run(ld_trainer *t, ld_job *j) {
    ld_ckpt_job *c = j->ckpt;
    qrl_error err;
    double t0 = now_s();
    c->state.learner_updates = qrl_learner_updates(t->l);
    j->st = qrl_ckpt_write(c->root, t->m, qrl_learner_optimizer(t->l), &c->state, c->keep, c->dir, &c->bytes,
                           &err);
    c->seconds = now_s() - t0;
    if (j->st != QRL_OK) snprintf(j->error, sizeof j->error, "%s", err.msg);
}

qrl_status ld_ckpt_resolve(const char *resume, const char *root, bool *found, char *dir, qrl_ckpt_state *s,
                           qrl_error *err) {
    *found = false;
    memset(s, 0, sizeof *s);
    if (!*resume || strcmp(resume, "none") == 0) return QRL_OK;
    const char *path = resume;
    if (strcmp(resume, "auto") == 0) {
        if (!*root)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "learner.resume=auto needs learner.checkpoint_dir");
        struct stat sb;
        if (stat(root, &sb) != 0) {
            QRL_LOG_INFO("learner", "resume=auto: %s does not exist yet: starting fresh", root);
            return QRL_OK;
        }
        path = root;
        qrl_error e2;
        qrl_status st = qrl_ckpt_find(path, dir, &e2);
        if (st == QRL_STATUS_NOT_FOUND) {
            QRL_LOG_INFO("learner", "resume=auto: %s (starting fresh)", e2.msg);
            return QRL_OK;
        }
        if (st != QRL_OK) return qrl_error_set(err, st, "learner.resume: %s", e2.msg);
    } else {
        qrl_error e2;
        if (qrl_ckpt_find(path, dir, &e2) != QRL_OK)
            return qrl_error_set(err, e2.status, "learner.resume: %s", e2.msg);
    }
    QRL_TRY(qrl_ckpt_read(dir, s, err));
    *found = true;
    return QRL_OK;
}

qrl_status ld_ckpt_restore_trainer(ld_trainer *t, const char *dir, const qrl_ckpt_state *s, qrl_error *err) {
    QRL_TRY(qrl_ckpt_load_params(dir, t->m, err));
    QRL_TRY(qrl_ckpt_load_optimizer(dir, qrl_learner_optimizer(t->l), err));
    qrl_learner_set_updates(t->l, s->learner_updates);
    return QRL_OK;
}

/* ---- export ------------------------------------------------------------------------------ */

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

static _Noreturn void export_die(const char *what, const char *msg) {
    fprintf(stderr, "qrl-learner export: error: %s%s%s\n", what, *what ? ": " : "", msg);
    exit(1);
}

int ld_export_main(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *model = NULL, *tokenizer = NULL, *dtype = "f32";
    for (int i = 1; i < argc; i++) {
        const char **dst = strcmp(argv[i], "--checkpoint") == 0  ? &ckpt
                           : strcmp(argv[i], "--out") == 0       ? &out
                           : strcmp(argv[i], "--model") == 0     ? &model
                           : strcmp(argv[i], "--tokenizer") == 0 ? &tokenizer
                           : strcmp(argv[i], "--dtype") == 0     ? &dtype
                                                                 : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            puts("qrl-learner export --checkpoint DIR --out HF_DIR [--model PATH] [--tokenizer PATH] [--dtype f32|bf16]\n"
                 "Write a learner checkpoint as a HuggingFace folder (config.json, model.safetensors, tokenizer\n"
                 "files), UAQ undone.  DIR: a checkpoint root (its newest complete checkpoint) or one step-*\n"
                 "folder.  --model / --tokenizer override the base model and tokenizer paths the manifest\n"
                 "records (the base model gives the config; its weights are replaced by the checkpoint's).");
            return 0;
        }
        if (!dst || i + 1 >= argc) export_die("", "usage: qrl-learner export --checkpoint DIR --out HF_DIR "
                                                  "[--model PATH] [--tokenizer PATH] [--dtype f32|bf16]");
        *dst = argv[++i];
    }
    if (!ckpt || !out) export_die("", "--checkpoint and --out are required (see export --help)");
    qrl_dtype dt = strcmp(dtype, "f32") == 0 ? QRL_DTYPE_F32 : strcmp(dtype, "bf16") == 0 ? QRL_DTYPE_BF16 : (qrl_dtype)-1;
    if ((int)dt < 0) export_die("--dtype", "expected f32 or bf16");
    char dir[QRL_CKPT_PATH_MAX];
    qrl_error err;
    qrl_ckpt_state s;
    if (qrl_ckpt_find(ckpt, dir, &err) != QRL_OK) export_die("", err.msg);
    if (qrl_ckpt_read(dir, &s, &err) != QRL_OK) export_die("", err.msg);
    if (!model) model = s.model;
    qrl_model *m;
    if (qrl_model_load(model, &m, &err) != QRL_OK) export_die("base model", err.msg);
    m->uaq_scale = s.uaq_scale; /* the stored parameters are the scaled ones */
    if (qrl_ckpt_load_params(dir, m, &err) != QRL_OK) export_die("", err.msg);
    if (qrl_model_undo_uaq(m, &err) != QRL_OK) export_die("undo UAQ", err.msg);
    if (qrl_model_save_hf(m, out, dt, &err) != QRL_OK) export_die("", err.msg);
    char tbuf[QRL_CKPT_PATH_MAX];
    if (!tokenizer) tokenizer = *s.tokenizer ? s.tokenizer
                                             : qrl_tokenizer_find_default(model, m->cfg.vocab_size, tbuf, sizeof tbuf);
    int copied = 0;
    if (!tokenizer) QRL_LOG_WARN("learner", "export: no tokenizer known for %s (give --tokenizer)", model);
    else if (copy_tokenizer(tokenizer, out, &copied, &err) != QRL_OK) export_die("", err.msg);
    QRL_LOG_INFO("learner", "exported %s (step=%llu version=%llu uaq_scale=%g undone) to %s: config.json, "
                 "model.safetensors (%s), %d tokenizer file(s)", dir, (unsigned long long)s.step,
                 (unsigned long long)s.version, (double)s.uaq_scale, out, dtype, copied);
    qrl_model_free(m);
    qrl_ckpt_state_free(&s);
    return 0;
}
