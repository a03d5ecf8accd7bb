/* qrl-sft: supervised warm start of a policy before RL (docs/qrl-sft.md; issue 8 item 5).
 *
 *   qrl-sft --learner.model PATH --dataset.path FILE.jsonl --sft.out HF_DIR [--config FILE.yaml] [--key=value ...]
 *
 * No Kafka, no replicas: next-token cross-entropy on the completion tokens of a JSONL
 * dataset, then an HF folder (model + the tokenizer files).  `qrl-learner --mode sft ...`
 * runs this program with the same arguments (the older spelling, kept for the launcher
 * and the scripts that use it; errors then read "qrl-learner: error: ...").
 *
 * Each JSONL line gives a prompt (dataset.prompt_field) and a completion
 * (dataset.solution_field).  The prompt is rendered exactly as the RL dataset renders it
 * (dataset.chat_template; "plain" adds BOS), so the warm-started policy sees the prompts
 * of the RL run; the sequence is prompt ids + completion ids + EOS and the loss is the
 * mean -log p over the completion tokens and the EOS only.
 *
 * Batches pack whole sequences (segment ids keep them apart) in a seeded shuffled order
 * per epoch (qrl_epoch_order) up to sft.batch_tokens tokens; AdamW with linear warmup
 * and cosine decay (common/train).  Everything depends only on the seed and the data:
 * the training engine's results do not depend on the thread count. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "core/program.h"
#include "core/log.h"
#include "core/shuffle.h"
#include "model/load.h"
#include "tokenizer/tokenizer.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"
#include "train/model_train.h"

/* The typed settings the table at the end fills (qrl_config_bind, by core/program.h). */
typedef struct sft_settings {
    struct {
        const char *model, *tokenizer;
        int64_t seed;
        const char *device; /* cpu|cuda: the value's text */
        bool activation_recompute;
        int threads;
    } learner;
    struct {
        double beta1, beta2, eps, weight_decay, max_grad_norm;
    } adamw;
    struct {
        const char *path, *prompt_field, *solution_field;
        const char *chat_template; /* the value's text: "auto", "none", ... */
    } dataset;
    struct {
        int64_t steps, warmup_steps, log_every;
        int batch_tokens;
        double lr, min_lr;
        const char *out;
    } sft;
    struct {
        const char *jsonl;
    } metrics;
} sft_settings;

typedef struct sft_seq {
    int32_t *ids; /* prompt + completion + EOS */
    int len, n_prompt;
} sft_seq;

typedef struct sft_data {
    sft_seq *s;
    size_t n, cap;
} sft_data;

static void data_free(sft_data *d) {
    for (size_t i = 0; i < d->n; i++) free(d->s[i].ids);
    free(d->s);
    memset(d, 0, sizeof *d);
}

/* Render + tokenize one example (as services/learner/dataset.c renders the RL prompts). */
static qrl_status add_example(sft_data *d, const char *path, size_t line, const char *user,
                              const char *completion, const char *tmpl, const qrl_tokenizer *tok,
                              int max_len, qrl_error *err) {
    char *text = NULL;
    bool add_bos = true;
    qrl_error e2;
    if (strcmp(tmpl, "none") != 0) {
        const char *name = strcmp(tmpl, "auto") == 0 ? qrl_tokenizer_chat_template_name(tok) : tmpl;
        if (qrl_chat_template_apply(name, NULL, user, &text, &e2) != QRL_OK)
            return qrl_error_set(err, e2.status, "%s:%zu: dataset.chat_template: %s", path, line, e2.msg);
        add_bos = strcmp(name, "plain") == 0; /* chatml/llama3 carry their own start */
    } else if (!(text = strdup(user))) {
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    }
    int32_t *p = NULL, *c = NULL;
    size_t np = 0, nc = 0;
    qrl_status st = qrl_tokenizer_encode(tok, text, strlen(text), add_bos, !add_bos, &p, &np, &e2);
    if (st == QRL_OK) st = qrl_tokenizer_encode(tok, completion, strlen(completion), false, false, &c, &nc, &e2);
    free(text);
    if (st != QRL_OK) {
        free(p);
        return qrl_error_set(err, e2.status, "%s:%zu: tokenizing: %s", path, line, e2.msg);
    }
    int32_t eos = qrl_tokenizer_eos(tok);
    size_t len = np + nc + 1;
    if (np == 0 || (int64_t)len > max_len) {
        free(p), free(c);
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s:%zu: prompt + completion + EOS is %zu tokens (allowed 2..%d: the "
                             "smaller of the model's max_seq_len and sft.batch_tokens)", path,
                             line, len, max_len);
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 256;
        sft_seq *ns = realloc(d->s, cap * sizeof *ns);
        if (!ns) return free(p), free(c), qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        d->s = ns, d->cap = cap;
    }
    int32_t *ids = realloc(p, len * sizeof *ids);
    if (!ids) return free(p), free(c), qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
    memcpy(ids + np, c, nc * sizeof *ids);
    ids[len - 1] = eos;
    free(c);
    d->s[d->n++] = (sft_seq){.ids = ids, .len = (int)len, .n_prompt = (int)np};
    return QRL_OK;
}

static qrl_status data_load(const char *path, const char *pf, const char *sf, const char *tmpl,
                            const qrl_tokenizer *tok, int max_len, sft_data *d, qrl_error *err) {
    memset(d, 0, sizeof *d);
    if (qrl_tokenizer_eos(tok) < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sft: the tokenizer has no EOS token");
    FILE *f = fopen(path, "r");
    if (!f) return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "dataset.path: cannot open %s", path);
    char *line = NULL;
    size_t lcap = 0, lineno = 0;
    ssize_t len;
    qrl_status st = QRL_OK;
    while (st == QRL_OK && (len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && strchr("\r\n ", line[k - 1])) k--;
        if (k == 0) continue;
        json_error_t je;
        json_t *o = json_loadb(line, k, 0, &je);
        if (!o) {
            st = qrl_error_set(err, QRL_STATUS_PARSE, "%s:%zu: column %d: %s", path, lineno, je.column, je.text);
            break;
        }
        json_t *p = json_object_get(o, pf), *s = json_object_get(o, sf);
        if (!json_is_object(o))
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: not a JSON object", path, lineno);
        else if (!json_is_string(p))
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: field \"%s\" (dataset.prompt_field)"
                               " missing or not a string", path, lineno, pf);
        else if (!json_is_string(s))
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s:%zu: field \"%s\" (dataset.solution_field)"
                               " missing or not a string", path, lineno, sf);
        else
            st = add_example(d, path, lineno, json_string_value(p), json_string_value(s), tmpl, tok,
                             max_len, err);
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (st == QRL_OK && d->n == 0) st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s: no examples", path);
    if (st != QRL_OK) data_free(d);
    return st;
}

/* The packing cursor: position in the epoch's order. */
typedef struct sft_cursor {
    uint32_t *perm;
    size_t pos;
    uint32_t epoch;
    uint64_t seed;
} sft_cursor;

/* Fill one packed batch of at most `cap` tokens; returns T (> 0: every sequence fits). */
static int make_batch(const sft_data *d, sft_cursor *c, int cap, int32_t *tok, int32_t *tgt,
                      int32_t *seg, int32_t *pos, int *n_seqs) {
    int T = 0, k = 0;
    for (;;) {
        if (c->pos == d->n) qrl_epoch_order(d->n, c->seed, ++c->epoch, c->perm), c->pos = 0;
        const sft_seq *s = &d->s[c->perm[c->pos]];
        if (T + s->len > cap) break;
        for (int t = 0; t < s->len; t++) {
            tok[T + t] = s->ids[t];
            seg[T + t] = k;
            /* position t predicts t + 1: completion tokens and the EOS only */
            tgt[T + t] = t + 1 >= s->n_prompt && t + 1 < s->len ? s->ids[t + 1] : -1;
        }
        T += s->len, k++, c->pos++;
    }
    qrl_model_train_positions(pos, seg, T);
    *n_seqs = k;
    return T;
}

/* Copy the tokenizer files the model's folder needs so qrl_tokenizer_find_default(out)
 * finds the same tokenizer. */
static qrl_status copy_file(const char *src, const char *dir, const char *name, qrl_error *err) {
    char dst[4200];
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb");
    if (!in) return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) ok &= fwrite(buf, 1, n, out) == n;
    ok &= !ferror(in);
    fclose(in);
    ok &= fclose(out) == 0;
    return ok ? QRL_OK : qrl_error_set(err, QRL_STATUS_IO, "%s: copy to %s failed", src, dst);
}

static qrl_status copy_tokenizer(const char *tok_path, const char *out, qrl_error *err) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json",
                                        "merges.txt", "special_tokens_map.json"};
    struct stat sb;
    char src[8400], dir[4200];
    bool is_dir = stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode);
    const char *base = strrchr(tok_path, '/');
    base = base ? base + 1 : tok_path;
    if (!is_dir && strcmp(base, "tokenizer.json") != 0) /* llama2.c tokenizer.bin / tokNNN.bin */
        return copy_file(tok_path, out, "tokenizer.bin", err);
    if (is_dir) snprintf(dir, sizeof dir, "%s", tok_path);
    else snprintf(dir, sizeof dir, "%.*s", base == tok_path ? 1 : (int)(base - tok_path - 1),
                  base == tok_path ? "." : tok_path);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", dir, files[i]);
        if (access(src, R_OK) == 0) QRL_TRY(copy_file(src, out, files[i], err));
    }
    return QRL_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Train `m` in place with the sft.* / dataset.* / adamw.* settings, write sft.out (model +
 * a copy of the tokenizer files at `tok_path`).  Returns the exit status (0 done, 1 error,
 * reported as one line on stderr). */
static int sft_run(const sft_settings *S, qrl_model *m, const qrl_tokenizer *tok, const char *tok_path) {
    qrl_error e, *err = &e;
    const char *out = S->sft.out;
    const int steps = (int)S->sft.steps;
    const int cap = S->sft.batch_tokens;
    const int every = (int)S->sft.log_every;
    const char *mpath = S->metrics.jsonl;
    if (!*out) {
        qrl_die("--sft.out is required in --mode sft");
    }
    if (strcmp(S->learner.device, "cpu") != 0)
        QRL_LOG_WARN("sft", "learner.device %s applies to RL updates only: --mode sft trains "
                     "on the CPU engine", S->learner.device);
    int max_len = m->cfg.max_seq_len < cap ? m->cfg.max_seq_len : cap;
    sft_data d;
    qrl_model_train_t *tr = NULL;
    qrl_adamw_t *opt = NULL;
    int32_t *buf = NULL;
    float *lp = NULL, *dlp = NULL;
    FILE *mf = NULL;
    sft_cursor cur = {.seed = (uint64_t)S->learner.seed};
    qrl_status st = data_load(S->dataset.path,
                              S->dataset.prompt_field,
                              S->dataset.solution_field,
                              S->dataset.chat_template, tok, max_len, &d, err);
    if (st != QRL_OK) goto done;
    size_t n;
    qrl_model_train_opts to = {
        .max_tokens = cap,
        .recompute_activations = S->learner.activation_recompute};
    QRL_TRY_GOTO(qrl_model_train_new_opts(m, &to, &tr, err), done);
    float *params = qrl_model_train_params(tr, &n), *grads = qrl_model_train_grads(tr, NULL);
    qrl_adamw_config ac = {.beta1 = (float)S->adamw.beta1,
                           .beta2 = (float)S->adamw.beta2,
                           .eps = (float)S->adamw.eps,
                           .weight_decay = (float)S->adamw.weight_decay,
                           .max_grad_norm = (float)S->adamw.max_grad_norm};
    QRL_TRY_GOTO(qrl_adamw_new(n, &ac, &opt, err), done);
    qrl_lr_schedule sched = {.decay = QRL_LR_DECAY_COSINE, .lr = S->sft.lr,
                             .min_lr = S->sft.min_lr,
                             .warmup_steps = S->sft.warmup_steps,
                             .total_steps = steps};
    if (sched.warmup_steps >= steps) sched.warmup_steps = steps - 1;
    if (sched.min_lr > sched.lr) sched.min_lr = sched.lr;
    QRL_TRY_GOTO(qrl_lr_schedule_check(&sched, err), done);
    buf = malloc(sizeof *buf * 4 * (size_t)cap);
    lp = malloc(sizeof *lp * (size_t)cap);
    dlp = malloc(sizeof *dlp * (size_t)cap);
    cur.perm = malloc(sizeof *cur.perm * d.n);
    if (!buf || !lp || !dlp || !cur.perm) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "sft: out of memory");
        goto done;
    }
    if (*mpath && !(mf = fopen(mpath, "a"))) {
        st = qrl_error_set(err, QRL_STATUS_IO, "metrics.jsonl: cannot open %s: %s", mpath, strerror(errno));
        goto done;
    }
    qrl_epoch_order(d.n, cur.seed, 0, cur.perm);
    int32_t *tk = buf, *tg = buf + cap, *sg = buf + 2 * cap, *ps = buf + 3 * cap;
    QRL_LOG_INFO("sft", "start examples=%zu params=%zu steps=%d batch_tokens=%d lr=%g out=%s "
                 "activation_recompute=%d activation_bytes=%zu", d.n, n, steps, cap, sched.lr, out,
                 (int)to.recompute_activations, qrl_model_train_activation_bytes(tr));
    double t0 = now_s(), tw = t0, loss_sum = 0, first = NAN, last = NAN;
    long long tok_win = 0, tok_all = 0, loss_n = 0, skipped = 0;
    for (int step = 0; step < steps; step++) {
        int nseq, T = make_batch(&d, &cur, cap, tk, tg, sg, ps, &nseq), nt = 0;
        QRL_TRY_GOTO(qrl_model_train_forward(tr, tk, tg, ps, sg, T, lp, NULL, err), done);
        for (int t = 0; t < T; t++) nt += tg[t] >= 0;
        double loss = 0;
        for (int t = 0; t < T; t++) {
            loss -= lp[t] / nt;
            dlp[t] = tg[t] >= 0 ? -1.0f / (float)nt : 0.0f;
        }
        qrl_model_train_zero_grad(tr);
        QRL_TRY_GOTO(qrl_model_train_backward(tr, dlp, NULL, err), done);
        qrl_adamw_step_info info;
        double lr = qrl_lr_schedule_at(&sched, step);
        qrl_error se;
        if (qrl_adamw_step(opt, params, grads, lr, &info, &se) != QRL_OK) {
            skipped++; /* non-finite gradient: parameters untouched */
            QRL_LOG_WARN("sft", "step skipped step=%d: %s", step, se.msg);
            continue;
        }
        tok_win += T, tok_all += T, loss_sum += loss, loss_n++;
        if (step == 0) first = loss;
        last = loss;
        if ((step + 1) % every == 0 || step + 1 == steps) {
            double t = now_s(), mean = loss_sum / (double)loss_n;
            QRL_LOG_INFO("sft", "step=%d loss=%.4f lr=%.3e grad_norm=%.3f seqs=%d tokens_per_s=%.0f "
                         "elapsed_s=%.1f of=%d eta_s=%.0f", step + 1, mean, lr, info.grad_norm, nseq,
                         (double)tok_win / (t - tw), t - t0, steps, (t - t0) / (step + 1) * (steps - step - 1));
            if (mf) {
                fprintf(mf, "{\"mode\": \"sft\", \"step\": %d, \"loss\": %.6f, \"lr\": %.6e, "
                        "\"grad_norm\": %.6f, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f}\n",
                        step + 1, mean, lr, info.grad_norm, (double)tok_win / (t - tw), t - t0);
                fflush(mf);
            }
            tw = t, tok_win = 0, loss_sum = 0, loss_n = 0;
        }
    }
    double secs = now_s() - t0;
    QRL_TRY_GOTO(qrl_model_save_hf(m, out, QRL_DTYPE_F32, err), done);
    QRL_TRY_GOTO(copy_tokenizer(tok_path, out, err), done);
    QRL_LOG_INFO("sft", "done steps=%d skipped=%lld loss_first=%.4f loss_last=%.4f tokens=%lld "
                 "seconds=%.1f tokens_per_s=%.0f out=%s", steps, skipped, first, last, tok_all, secs,
                 (double)tok_all / secs, out);
done:
    if (mf) fclose(mf);
    free(cur.perm), free(buf), free(lp), free(dlp);
    qrl_adamw_destroy(opt);
    qrl_model_train_destroy(tr);
    data_free(&d);
    if (st != QRL_OK) qrl_die_err(&e);
    return st == QRL_OK ? 0 : 1;
}


/* The program's config table (STYLE 10; docs/config-qrl-sft.md via `make docs`): the keys
 * keep the names they had as qrl-learner --mode sft keys, so both spellings take the same
 * arguments. */
#define S_ sft_settings
static const qrl_config_entry CONFIG[] = {
    QRL_CFG_STRING("learner.model", S_, learner.model, "", false,
     "HuggingFace folder or llama2.c .bin: the policy to warm-start (required)"),
    QRL_CFG_STRING("learner.tokenizer", S_, learner.tokenizer, "", false,
     "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"),
    QRL_CFG_INT("learner.seed", S_, learner.seed, "0", 0, 1e15, false, "batch order (the epochs' shuffles)"),
    QRL_CFG_ENUM("learner.device", S_, learner.device, "cpu", "cpu|cuda", false,
     "accepted for qrl-learner's sake: SFT trains on the CPU engine (cuda only logs a warning)"),
    QRL_CFG_BOOL("learner.activation_recompute", S_, learner.activation_recompute, "false", false,
     "keep only each layer's input and recompute the layer in the backward (same results)"),
    QRL_CFG_INT("learner.threads", S_, learner.threads, "0", 0, 1024, false, "OpenMP threads (0 = all cores)"),
    QRL_CFG_DOUBLE("adamw.beta1", S_, adamw.beta1, "0.9", 0, 0.999999, false, "AdamW beta1"),
    QRL_CFG_DOUBLE("adamw.beta2", S_, adamw.beta2, "0.999", 0, 0.999999999, false, "AdamW beta2"),
    QRL_CFG_DOUBLE("adamw.eps", S_, adamw.eps, "1e-8", 1e-30, 1, false, "AdamW epsilon"),
    QRL_CFG_DOUBLE("adamw.weight_decay", S_, adamw.weight_decay, "0.01", 0, 10, false, "decoupled weight decay"),
    QRL_CFG_DOUBLE("adamw.max_grad_norm", S_, adamw.max_grad_norm, "1.0", 0, 1e9, false, "gradient clip (0 = off)"),
    QRL_CFG_STRING("dataset.path", S_, dataset.path, "", false,
     "JSONL examples, one object per line (required; a bad line refuses the file)"),
    QRL_CFG_STRING("dataset.prompt_field", S_, dataset.prompt_field, "prompt", false, "prompt text field"),
    QRL_CFG_STRING("dataset.solution_field", S_, dataset.solution_field, "solution", false,
     "completion text field (worked solution)"),
    QRL_CFG_ENUM("dataset.chat_template", S_, dataset.chat_template, "auto", "auto|none|plain|chatml|llama3", false,
     "prompt rendering, as the RL run renders it: auto = the tokenizer's family; none = raw text with BOS"),
    QRL_CFG_INT("sft.steps", S_, sft.steps, "300", 1, 1e12, false, "optimizer steps"),
    QRL_CFG_INT("sft.batch_tokens", S_, sft.batch_tokens, "2048", 2, 1 << 24, false,
     "packed tokens per step (whole sequences)"),
    QRL_CFG_DOUBLE("sft.lr", S_, sft.lr, "3e-3", 1e-12, 1, false, "peak learning rate"),
    QRL_CFG_DOUBLE("sft.min_lr", S_, sft.min_lr, "3e-4", 0, 1, false, "cosine floor"),
    QRL_CFG_INT("sft.warmup_steps", S_, sft.warmup_steps, "20", 0, 1e12, false, "linear warmup steps"),
    QRL_CFG_INT("sft.log_every", S_, sft.log_every, "10", 1, 1e12, false, "steps per progress line"),
    QRL_CFG_STRING("sft.out", S_, sft.out, "", false,
     "output HuggingFace folder (model + tokenizer files; required)"),
    QRL_CFG_STRING("metrics.jsonl", S_, metrics.jsonl, "", false, "append one JSON line per progress line"),
};
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static sft_settings S;

#define SFT_USAGE                                                                                     \
    "qrl-sft --learner.model PATH --dataset.path FILE.jsonl --sft.out HF_DIR [--config FILE.yaml] "   \
    "[--key=value ...]\n"                                                                             \
    "Supervised warm start: next-token cross-entropy on each example's completion (prompt rendered\n" \
    "as the RL run renders it), AdamW with warmup and cosine decay, on the CPU; writes a\n"          \
    "HuggingFace folder.  docs/qrl-sft.md; `qrl-learner --mode sft ...` is the same command.\n\n"
/* Two names: run as `qrl-learner --mode sft` (argv[0] "qrl-learner"), messages read as they did. */
static const qrl_program PROGRAM = {.name = "qrl-sft", .usage = SFT_USAGE, .table = CONFIG, .n = N_CONFIG,
                                    .settings = &S};
static const qrl_program AS_LEARNER = {.name = "qrl-learner", .usage = SFT_USAGE, .table = CONFIG,
                                       .n = N_CONFIG, .settings = &S};

int main(int argc, char **argv) {
    bool as_learner = argc > 0 && strcmp(argv[0], "qrl-learner") == 0;
    qrl_config_t *cfg;
    int rc = qrl_program_start(as_learner ? &AS_LEARNER : &PROGRAM, argc, argv, &cfg, NULL);
    if (rc != QRL_PROGRAM_RUN) return rc;
    if (!*S.learner.model) qrl_die("--learner.model is required (see --help)");
    if (!*S.dataset.path) qrl_die("--dataset.path is required (see --help)");
    qrl_config_log(cfg, "sft");
    if (S.learner.threads > 0) omp_set_num_threads(S.learner.threads);
    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_error err;
    qrl_model_load_opts lo = {.tokenizer = S.learner.tokenizer, .tokenizer_option = "--learner.tokenizer"};
    if (qrl_model_load_with_tokenizer(S.learner.model, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        qrl_die_err(&err);
    rc = sft_run(&S, m, tok, tpath);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return rc;
}
