/* AdamW on FP32 master weights, global-norm clipping, non-finite detection and an atomic,
 * checksummed state file (see adamw.h). */
#include "train/adamw.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/crc32.h"
#include "core/log.h"
#include "io/atomic_file.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the AdamW state file stores m and v as little-endian F32 arrays");

struct qrl_adamw {
    size_t n;
    int64_t step;
    qrl_adamw_config cfg;
    float *m; /* one block of 2n floats: m = block, v = block + n */
    float *v;
};

qrl_adamw_config qrl_adamw_config_default(void) {
    return (qrl_adamw_config){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.01f, .max_grad_norm = 1.0f};
}

static qrl_status check_config(const qrl_adamw_config *c, qrl_error *err) {
    const char *bad = NULL;
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f)) bad = "beta1 (want [0, 1))";
    else if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f)) bad = "beta2 (want [0, 1))";
    else if (!(c->eps > 0.0f && isfinite(c->eps))) bad = "eps (want > 0)";
    else if (!(c->weight_decay >= 0.0f && isfinite(c->weight_decay)))
        bad = "weight_decay (want >= 0)";
    else if (!isfinite(c->max_grad_norm)) bad = "max_grad_norm (want finite; <= 0 disables)";
    if (bad)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "adamw config: bad %s", bad);
    return QRL_OK;
}

qrl_status qrl_adamw_new(size_t n, const qrl_adamw_config *cfg, qrl_adamw_t **out,
                         qrl_error *err) {
    *out = NULL;
    if (n == 0 || n > SIZE_MAX / (2 * sizeof(float)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "adamw: parameter count %zu not in [1, SIZE_MAX / 8]", n);
    QRL_TRY(check_config(cfg, err));
    qrl_adamw_t *o = calloc(1, sizeof *o);
    if (!o) return qrl_error_set(err, QRL_STATUS_NOMEM, "adamw: no memory for the state");
    void *block;
    qrl_status st = qrl_alloc_aligned(2 * n * sizeof(float), 0, &block, err);
    if (st != QRL_OK) {
        free(o);
        return st;
    }
    memset(block, 0, 2 * n * sizeof(float));
    o->n = n;
    o->cfg = *cfg;
    o->m = block;
    o->v = o->m + n;
    *out = o;
    return QRL_OK;
}

void qrl_adamw_destroy(qrl_adamw_t *opt) {
    if (!opt) return;
    qrl_free_aligned(opt->m);
    free(opt);
}

size_t qrl_adamw_size(const qrl_adamw_t *opt) { return opt->n; }
int64_t qrl_adamw_steps(const qrl_adamw_t *opt) { return opt->step; }
qrl_adamw_config qrl_adamw_get_config(const qrl_adamw_t *opt) { return opt->cfg; }
void qrl_adamw_moments(qrl_adamw_t *opt, float **m, float **v) { *m = opt->m, *v = opt->v; }
void qrl_adamw_set_steps(qrl_adamw_t *opt, int64_t steps) { opt->step = steps; }

/* ---- the step ------------------------------------------------------------------------ */

/* The norm is summed over NORM_PARTS contiguous parts whose bounds depend only on n; the
 * parts run in parallel and are added in order, so the result does not depend on the
 * thread count and nothing is allocated. */
#define NORM_PARTS 256

double qrl_adamw_grad_norm(const float *g, size_t n) {
    double part[NORM_PARTS];
#pragma omp parallel for schedule(static) if (n >= (1u << 20))
    for (int p = 0; p < NORM_PARTS; p++) {
        size_t lo = n / NORM_PARTS * p + (n % NORM_PARTS < (size_t)p ? n % NORM_PARTS : (size_t)p);
        size_t len = n / NORM_PARTS + ((size_t)p < n % NORM_PARTS ? 1 : 0);
        double s = 0.0;
        for (size_t i = lo; i < lo + len; i++) s += (double)g[i] * (double)g[i];
        part[p] = s;
    }
    double s = 0.0;
    for (int p = 0; p < NORM_PARTS; p++) s += part[p];
    return sqrt(s); /* a float squared is < 1.2e77: only a NaN/Inf element makes this non-finite */
}

qrl_status qrl_adamw_step(qrl_adamw_t *opt, float *params, const float *grads, double lr,
                          qrl_adamw_step_info *info, qrl_error *err) {
    const qrl_adamw_config *c = &opt->cfg;
    const size_t n = opt->n;
    if (!(lr >= 0.0 && isfinite(lr)))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "adamw step %lld: learning rate %g is not a finite value >= 0",
                             (long long)opt->step + 1, lr);
    double norm = qrl_adamw_grad_norm(grads, n);
    if (info) *info = (qrl_adamw_step_info){.grad_norm = norm, .clip_scale = 1.0f,
                                           .step = opt->step};
    if (!isfinite(norm)) {
        size_t bad = 0;
        while (bad < n && isfinite(grads[bad])) bad++;
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "adamw step %lld: non-finite gradient at index %zu (%g); "
                             "parameters and optimizer state left unchanged",
                             (long long)opt->step + 1, bad, bad < n ? (double)grads[bad] : norm);
    }
    /* torch clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1 */
    float scale = 1.0f;
    if (c->max_grad_norm > 0.0f && norm > c->max_grad_norm)
        scale = (float)(c->max_grad_norm / (norm + 1e-6));

    const int64_t t = opt->step + 1;
    /* scalars in double (Python floats in torch's _single_tensor_adamw), then F32 */
    const double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - lr * c->weight_decay);
    const float b1 = c->beta1, b2 = c->beta2, omb1 = (float)(1.0 - c->beta1),
                omb2 = (float)(1.0 - c->beta2), eps = c->eps;
    float *m = opt->m, *v = opt->v;
#pragma omp parallel for schedule(static) if (n >= (1u << 20))
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * scale;
        float p = params[i] * decay;
        float mi = b1 * m[i] + omb1 * g;
        float vi = b2 * v[i] + omb2 * (g * g);
        m[i] = mi;
        v[i] = vi;
        params[i] = p - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
    opt->step = t;
    if (info) info->clip_scale = scale, info->step = t;
    return QRL_OK;
}

/* ---- state file ------------------------------------------------------------------------ */

#define STATE_MAGIC "QRLADAMW"
#define STATE_VERSION 1u
#define STATE_HEADER 64u

static void st32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void st64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t ld32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static float ldf(const uint8_t *p) {
    uint32_t u = ld32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void stf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    st32(p, u);
}

/* Re-set an atomic-file error with the "adamw state" prefix the loader's messages carry. */
static qrl_status state_error(qrl_error *err, qrl_status st) {
    if (err && st != QRL_OK) {
        char msg[sizeof err->msg], trace[sizeof err->trace];
        memcpy(msg, err->msg, sizeof msg);
        memcpy(trace, err->trace, sizeof trace);
        qrl_error_set(err, st, "adamw state: %s", msg);
        memcpy(err->trace, trace, sizeof trace);
    }
    return st;
}

qrl_status qrl_adamw_save(const qrl_adamw_t *opt, const char *path, qrl_error *err) {
    uint8_t h[STATE_HEADER] = {0};
    memcpy(h, STATE_MAGIC, 8);
    st32(h + 8, STATE_VERSION);
    st32(h + 12, STATE_HEADER);
    st64(h + 16, (uint64_t)opt->step);
    st64(h + 24, (uint64_t)opt->n);
    const float cf[5] = {opt->cfg.beta1, opt->cfg.beta2, opt->cfg.eps, opt->cfg.weight_decay,
                         opt->cfg.max_grad_norm};
    for (int i = 0; i < 5; i++) stf(h + 32 + 4 * i, cf[i]);
    size_t block = 2 * opt->n * sizeof(float);
    uint8_t tail[4];
    st32(tail, qrl_crc32(qrl_crc32(0, h, sizeof h), opt->m, block));

    qrl_status st;
    qrl_atomic_file af;
    if ((st = qrl_atomic_file_open(path, &af, err)) != QRL_OK) return state_error(err, st);
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, h, sizeof h, err), fail);
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, opt->m, block, err), fail);
    QRL_TRY_GOTO(qrl_atomic_file_write(&af, tail, 4, err), fail);
    return state_error(err, qrl_atomic_file_commit(&af, err));
fail:
    qrl_atomic_file_abort(&af);
    return state_error(err, st);
}

static qrl_status corrupt(qrl_error *err, const char *path, uint64_t off, const char *what) {
    return qrl_error_set(err, QRL_STATUS_CORRUPT, "adamw state %s: %s at offset %llu", path,
                         what, (unsigned long long)off);
}

static qrl_status read_all(FILE *f, void *buf, size_t len, const char *path, uint64_t off,
                           qrl_error *err) {
    if (fread(buf, 1, len, f) != len)
        return ferror(f) ? qrl_error_set(err, QRL_STATUS_IO, "adamw state %s: read error at "
                                         "offset %llu", path, (unsigned long long)off)
                         : corrupt(err, path, off, "unexpected end of file");
    return QRL_OK;
}

qrl_status qrl_adamw_load(qrl_adamw_t *opt, const char *path, qrl_error *err) {
    qrl_status st = QRL_OK;
    float *block = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "adamw state %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        st = qrl_error_set(err, QRL_STATUS_IO, "adamw state %s: stat: %s", path, strerror(errno));
        goto done;
    }
    const uint64_t size = (uint64_t)sb.st_size;
    uint8_t h[STATE_HEADER];
    if (size < STATE_HEADER) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "adamw state %s: truncated: %llu bytes, "
                           "shorter than the %u-byte header", path, (unsigned long long)size,
                           STATE_HEADER);
        goto done;
    }
    QRL_TRY_GOTO(read_all(f, h, sizeof h, path, 0, err), done);
    if (memcmp(h, STATE_MAGIC, 8) != 0) {
        st = corrupt(err, path, 0, "bad magic (not a qrl AdamW state file)");
        goto done;
    }
    if (ld32(h + 8) != STATE_VERSION) {
        st = qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "adamw state %s: version %u at offset "
                           "8, this build reads version %u", path, ld32(h + 8), STATE_VERSION);
        goto done;
    }
    if (ld32(h + 12) != STATE_HEADER) {
        st = corrupt(err, path, 12, "header size is not 64");
        goto done;
    }
    for (int i = 52; i < (int)STATE_HEADER; i++)
        if (h[i] != 0) {
            st = corrupt(err, path, (uint64_t)i, "non-zero reserved byte");
            goto done;
        }
    const uint64_t step = ld64(h + 16), n = ld64(h + 24);
    if (step > (uint64_t)INT64_MAX) {
        st = corrupt(err, path, 16, "step count out of range");
        goto done;
    }
    if (n != (uint64_t)opt->n) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "adamw state %s: holds n=%llu "
                           "parameters (offset 24), the optimizer has %zu", path,
                           (unsigned long long)n, opt->n);
        goto done;
    }
    const uint64_t want = STATE_HEADER + 8 * n + 4; /* n == opt->n: cannot overflow */
    if (size != want) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "adamw state %s: %s: %llu bytes, expected "
                           "%llu for n=%llu", path, size < want ? "truncated" : "trailing bytes",
                           (unsigned long long)size, (unsigned long long)want,
                           (unsigned long long)n);
        goto done;
    }
    QRL_TRY_GOTO(qrl_alloc_aligned(2 * opt->n * sizeof(float), 0, (void **)&block, err), done);
    QRL_TRY_GOTO(read_all(f, block, 2 * opt->n * sizeof(float), path, STATE_HEADER, err), done);
    uint8_t tail[4];
    QRL_TRY_GOTO(read_all(f, tail, 4, path, want - 4, err), done);
    uint32_t crc = qrl_crc32(qrl_crc32(0, h, sizeof h), block, 2 * opt->n * sizeof(float));
    if (crc != ld32(tail)) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "adamw state %s: crc32 mismatch at offset "
                           "%llu (stored 0x%08x, computed 0x%08x)", path,
                           (unsigned long long)(want - 4), ld32(tail), crc);
        goto done;
    }
    for (size_t i = 0; i < 2 * opt->n; i++)
        if (!isfinite(block[i]) || (i >= opt->n && block[i] < 0.0f)) {
            st = corrupt(err, path, STATE_HEADER + 4 * (uint64_t)i,
                         i < opt->n ? "non-finite first moment m" : "bad second moment v");
            goto done;
        }
    for (int i = 0; i < 5; i++) {
        const float mine[5] = {opt->cfg.beta1, opt->cfg.beta2, opt->cfg.eps,
                               opt->cfg.weight_decay, opt->cfg.max_grad_norm};
        static const char *names[5] = {"beta1", "beta2", "eps", "weight_decay", "max_grad_norm"};
        float theirs = ldf(h + 32 + 4 * i);
        if (theirs != mine[i])
            QRL_LOG_WARN("adamw", "resuming with a changed hyperparameter path=%s name=%s "
                         "saved=%g now=%g", path, names[i], theirs, mine[i]);
    }
    /* everything checked: swap the state in */
    qrl_free_aligned(opt->m);
    opt->m = block;
    opt->v = block + opt->n;
    opt->step = (int64_t)step;
    block = NULL;
done:
    qrl_free_aligned(block);
    fclose(f);
    return st;
}
