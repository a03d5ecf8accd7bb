/* TRACE record buffers, the forward's recorder, packing into records and their decoded
 * form (trace_rec.h). */
#include "model/trace_rec.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/crc32.h"
#include "cpu/quant.h"
#include "model/trace_rec_internal.h"

/* ---- buffer -------------------------------------------------------------------------- */

struct qrl_trace_buf {
    const qrl_trace_layout *l;
    uint32_t cap, n;
    size_t slab;
    uint8_t *data; /* [cap][slab]: per site F32 S_enc (unaligned), scales, bits */
    size_t mapped; /* data is an mmap of this many bytes (0: calloc) */
};

/* Zeroed storage for a buffer.  A large one (a 512-token response of a 1.7B model is ~36
 * MB) is filled a window at a time by the CUDA recorder, and with 4 KiB pages its first
 * touch was most of the recorder's host time (one fault per 4 KiB: ~1.3 GB/s on the H100
 * machine); transparent huge pages fault 2 MiB at once.  Where the kernel has them off,
 * madvise fails and the pages stay small. */
#define HUGE_MIN (4u << 20)

static uint8_t *data_alloc(size_t bytes, size_t *mapped) {
    *mapped = 0;
    if (bytes < HUGE_MIN) return calloc(1, bytes);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    *mapped = bytes;
    return p;
}

qrl_status qrl_trace_buf_new(const qrl_trace_layout *l, uint32_t max_tokens,
                             qrl_trace_buf **out, qrl_error *err) {
    *out = NULL;
    if (max_tokens == 0 || max_tokens > QRL_TRACE_MAX_TOKENS)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace buffer: max_tokens %u not in [1, %u]", max_tokens,
                             QRL_TRACE_MAX_TOKENS);
    qrl_trace_buf *b = calloc(1, sizeof *b);
    if (b) {
        b->l = l;
        b->cap = max_tokens;
        b->slab = qrl_trace_layout_slab_bytes_(l);
        b->data = data_alloc((size_t)max_tokens * b->slab, &b->mapped);
    }
    if (!b || !b->data) {
        qrl_trace_buf_free(b);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "trace buffer: %u tokens x %zu bytes",
                             max_tokens, qrl_trace_layout_slab_bytes_(l));
    }
    *out = b;
    return QRL_OK;
}

void qrl_trace_buf_free(qrl_trace_buf *b) {
    if (!b) return;
    if (b->mapped) munmap(b->data, b->mapped);
    else free(b->data);
    free(b);
}

uint32_t qrl_trace_buf_n_tokens(const qrl_trace_buf *b) { return b->n; }
const qrl_trace_layout *qrl_trace_buf_layout(const qrl_trace_buf *b) { return b->l; }
size_t qrl_trace_buf_bytes(const qrl_trace_buf *b) { return (size_t)b->cap * b->slab; }

uint32_t qrl_trace_buf_cap_(const qrl_trace_buf *b) { return b->cap; }

uint8_t *qrl_trace_buf_slab_(qrl_trace_buf *b, uint32_t token) {
    QRL_CHECK(token < b->cap);
    return b->data + (size_t)token * b->slab;
}

void qrl_trace_buf_hold_(qrl_trace_buf *b, uint32_t token) {
    QRL_CHECK(token <= b->n && token < b->cap);
    if (token == b->n) b->n++;
}

void qrl_trace_buf_truncate(qrl_trace_buf *b, uint32_t n) {
    QRL_CHECK(n <= b->n);
    b->n = n;
}

/* Entry of (token, site) inside the slab (no bounds check). */
static void slab_entry(const qrl_trace_buf *b, uint32_t token, uint32_t site,
                       qrl_trace_entry *e) {
    const uint8_t *p = b->data + (size_t)token * b->slab + qrl_trace_layout_offset_(b->l, site);
    uint32_t len = qrl_trace_layout_site_lens(b->l)[site];
    e->len = len;
    memcpy(&e->global_enc, p, 4);
    e->scales = p + 4;
    e->bits = p + 4 + qrl_nvfp4_blocks(len);
}

qrl_status qrl_trace_buf_entry(const qrl_trace_buf *b, uint32_t token, uint32_t site,
                               qrl_trace_entry *out, qrl_error *err) {
    if (token >= b->n || site >= qrl_trace_layout_n_sites(b->l))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace buffer: entry (token %u, site %u) outside %u tokens x %u "
                             "sites", token, site, b->n, qrl_trace_layout_n_sites(b->l));
    slab_entry(b, token, site, out);
    return QRL_OK;
}

/* ---- recorder ------------------------------------------------------------------------ */

typedef struct target {
    int row;
    qrl_trace_buf *buf;
    uint32_t token;
} target;

struct qrl_trace_recorder {
    const qrl_trace_layout *l;
    int max_targets, n_targets;
    target *t;          /* [max_targets] */
    target *pass;       /* [max_targets] targets of the current pass, pass-row indexed below */
    int n_pass, row0;
    uint8_t *codes;     /* [max site len / 2 + 1] capture scratch */
    qrl_trace_tap_fn tap;
    void *tap_ctx;
    uint64_t capture_ns; /* time inside captures of target rows (the recorder's cost) */
};

qrl_status qrl_trace_recorder_new(const qrl_trace_layout *l, int max_targets,
                                  qrl_trace_recorder **out, qrl_error *err) {
    *out = NULL;
    if (max_targets < 1)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "trace recorder: max_targets %d < 1",
                             max_targets);
    uint32_t maxlen = 0;
    for (uint32_t s = 0; s < qrl_trace_layout_n_sites(l); s++)
        if (qrl_trace_layout_site_lens(l)[s] > maxlen) maxlen = qrl_trace_layout_site_lens(l)[s];
    qrl_trace_recorder *r = calloc(1, sizeof *r);
    if (r) {
        r->l = l;
        r->max_targets = max_targets;
        r->t = calloc((size_t)max_targets, sizeof *r->t);
        r->pass = calloc((size_t)max_targets, sizeof *r->pass);
        r->codes = malloc(maxlen / 2 + 1);
    }
    if (!r || !r->t || !r->pass || !r->codes) {
        qrl_trace_recorder_free(r);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "trace recorder: out of memory");
    }
    *out = r;
    return QRL_OK;
}

void qrl_trace_recorder_free(qrl_trace_recorder *r) {
    if (!r) return;
    free(r->t);
    free(r->pass);
    free(r->codes);
    free(r);
}

const qrl_trace_layout *qrl_trace_recorder_layout(const qrl_trace_recorder *r) { return r->l; }

void qrl_trace_recorder_set_tap(qrl_trace_recorder *r, qrl_trace_tap_fn fn, void *ctx) {
    r->tap = fn;
    r->tap_ctx = ctx;
}

void qrl_trace_recorder_clear(qrl_trace_recorder *r) { r->n_targets = 0; r->n_pass = 0; }

void qrl_trace_recorder_target(qrl_trace_recorder *r, int row, qrl_trace_buf *buf,
                               uint32_t token) {
    QRL_CHECK(r->n_targets < r->max_targets && buf->l == r->l && token <= buf->n &&
              token < buf->cap && row >= 0);
    r->t[r->n_targets++] = (target){row, buf, token};
}

bool qrl_trace_recorder_begin_pass(qrl_trace_recorder *r, int row0, int n) {
    r->n_pass = 0;
    r->row0 = row0;
    for (int i = 0; i < r->n_targets; i++)
        if (r->t[i].row >= row0 && r->t[i].row < row0 + n) {
            target *p = &r->pass[r->n_pass++];
            *p = r->t[i];
            p->row -= row0;
            /* the token counts as held from this pass on: a pass writes all its sites */
            qrl_trace_buf_hold_(p->buf, p->token);
        }
    return r->n_pass > 0;
}

void qrl_trace_recorder_capture(qrl_trace_recorder *r, int row, int layer,
                                qrl_trace_site_kind kind, const float *x) {
    int s0 = qrl_trace_layout_find(r->l, layer, kind, 0);
    if (s0 < 0) return;
    const target *tg = NULL;
    for (int i = 0; i < r->n_pass; i++)
        if (r->pass[i].row == row) tg = &r->pass[i];
    if (!tg) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int heads = 1;
    while (qrl_trace_layout_find(r->l, layer, kind, heads) >= 0) heads++;
    for (int h = 0; h < heads; h++) {
        uint32_t site = (uint32_t)(s0 + h), len = qrl_trace_layout_site_lens(r->l)[site];
        const float *xh = x + (size_t)h * len;
        qrl_trace_entry e;
        slab_entry(tg->buf, tg->token, site, &e);
        uint8_t *p = (uint8_t *)e.scales - 4;
        float genc;
        qrl_trace_capture(xh, len, r->codes, (uint8_t *)e.scales, (uint8_t *)e.bits, &genc);
        memcpy(p, &genc, 4);
        if (r->tap) r->tap(r->tap_ctx, tg->buf, tg->token, site, xh, len);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->capture_ns += (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
}

uint64_t qrl_trace_recorder_capture_ns(const qrl_trace_recorder *r) { return r->capture_ns; }

/* ---- packing ------------------------------------------------------------------------- */

void qrl_trace_pack_free(qrl_trace_pack *p) {
    if (!p) return;
    for (size_t i = 0; i < p->count; i++) free(p->record ? p->record[i] : NULL);
    free(p->record);
    free(p->len);
    free(p->token_begin);
    free(p->token_count);
    memset(p, 0, sizeof *p);
}

qrl_status qrl_trace_buf_pack(const qrl_trace_buf *b, uint32_t n_tokens,
                              size_t max_record_bytes, qrl_trace_pack *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    if (n_tokens > b->n)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace pack: %u response tokens but %u records", n_tokens, b->n);
    if (n_tokens == 0) return QRL_OK;
    uint32_t ns = qrl_trace_layout_n_sites(b->l);
    const uint32_t *lens = qrl_trace_layout_site_lens(b->l);
    size_t one, fixed;
    QRL_TRY(qrl_trace_record_size(1, ns, lens, &one, err));
    QRL_TRY(qrl_trace_record_size(0, ns, lens, &fixed, err));
    if (one > max_record_bytes)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "trace pack: one token's record is %zu bytes, over the limit of %zu",
                             one, max_record_bytes);
    size_t per = one - fixed, tpc = (max_record_bytes - fixed) / per;
    if (tpc > QRL_TRACE_MAX_TOKENS) tpc = QRL_TRACE_MAX_TOKENS;
    size_t count = (n_tokens + tpc - 1) / tpc;
    out->record = calloc(count, sizeof *out->record);
    out->len = calloc(count, sizeof *out->len);
    out->token_begin = calloc(count, sizeof *out->token_begin);
    out->token_count = calloc(count, sizeof *out->token_count);
    qrl_trace_entry *ents = malloc((size_t)tpc * ns * sizeof *ents);
    qrl_status st = QRL_OK;
    if (!out->record || !out->len || !out->token_begin || !out->token_count || !ents) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "trace pack: out of memory");
        goto done;
    }
    out->count = count;
    uint32_t crc = 0;
    for (size_t c = 0; c < count; c++) {
        uint32_t t0 = (uint32_t)(c * tpc), nt = n_tokens - t0 < tpc ? n_tokens - t0 : (uint32_t)tpc;
        for (uint32_t t = 0; t < nt; t++)
            for (uint32_t s = 0; s < ns; s++) slab_entry(b, t0 + t, s, &ents[(size_t)t * ns + s]);
        size_t size;
        QRL_TRY_GOTO(qrl_trace_record_size(nt, ns, lens, &size, err), done);
        out->record[c] = malloc(size);
        if (!out->record[c]) {
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "trace pack: record of %zu bytes", size);
            goto done;
        }
        st = qrl_trace_record_encode(nt, ns, lens, ents, out->record[c], size, &out->len[c], err);
        if (st != QRL_OK) { /* a bad entry: say which response tokens the record held */
            if (err) {
                char why[QRL_ERROR_MSG_MAX];
                memcpy(why, err->msg, sizeof why);
                why[sizeof why - 1] = 0;
                qrl_error_set(err, st, "trace pack: record of response tokens %u..%u: %s", t0,
                              t0 + nt - 1, why);
            }
            goto done;
        }
        out->token_begin[c] = t0;
        out->token_count[c] = nt;
        crc = qrl_crc32(crc, out->record[c], out->len[c]);
    }
    out->n_tokens = n_tokens;
    out->crc32 = crc;
done:
    free(ents);
    if (st != QRL_OK) qrl_trace_pack_free(out);
    return st;
}

/* ---- decoded response ---------------------------------------------------------------- */

struct qrl_trace_response {
    qrl_trace_layout *l;
    uint32_t n_tokens;
    size_t n_chunks;
    uint8_t **bytes;            /* [n_chunks] owned copies */
    qrl_trace_record_t **rec;   /* [n_chunks] */
    uint32_t *begin;            /* [n_chunks] */
};

void qrl_trace_response_free(qrl_trace_response *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_chunks; i++) {
        if (r->rec) qrl_trace_record_free(r->rec[i]);
        if (r->bytes) free(r->bytes[i]);
    }
    free(r->rec);
    free(r->bytes);
    free(r->begin);
    qrl_trace_layout_free(r->l);
    free(r);
}

qrl_status qrl_trace_response_decode(const qrl_model_config *cfg, const uint32_t *site_ids,
                                     size_t n_sites, const uint8_t *const *records,
                                     const size_t *lens, const uint32_t *token_begin,
                                     size_t n_chunks, uint32_t n_tokens,
                                     qrl_trace_response **out, qrl_error *err) {
    *out = NULL;
    qrl_trace_response *r = calloc(1, sizeof *r);
    if (!r) return qrl_error_set(err, QRL_STATUS_NOMEM, "trace response: out of memory");
    qrl_status st = qrl_trace_layout_from_ids(cfg, site_ids, n_sites, &r->l, err);
    if (st != QRL_OK) goto fail;
    r->n_tokens = n_tokens;
    r->bytes = calloc(n_chunks + 1, sizeof *r->bytes);
    r->rec = calloc(n_chunks + 1, sizeof *r->rec);
    r->begin = calloc(n_chunks + 1, sizeof *r->begin);
    if (!r->bytes || !r->rec || !r->begin) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "trace response: out of memory");
        goto fail;
    }
    r->n_chunks = n_chunks;
    const uint32_t *want = qrl_trace_layout_site_lens(r->l);
    uint32_t next = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        r->bytes[c] = malloc(lens[c] ? lens[c] : 1);
        if (!r->bytes[c]) {
            st = qrl_error_set(err, QRL_STATUS_NOMEM, "trace response: chunk %zu", c);
            goto fail;
        }
        memcpy(r->bytes[c], records[c], lens[c]);
        /* the field checks here are what keeps a record that cannot guide (a NaN block
         * scale, an S_enc out of range) from the QAT engines: they read records only
         * through a decoded response */
        qrl_trace_names nm = {token_begin[c], site_ids, n_sites};
        st = qrl_trace_record_decode_named(r->bytes[c], lens[c], &nm, &r->rec[c], err);
        if (st != QRL_OK) {
            if (err) {
                char why[QRL_ERROR_MSG_MAX];
                memcpy(why, err->msg, sizeof why);
                why[sizeof why - 1] = 0;
                qrl_error_set(err, st, "trace response: chunk %zu: %s", c, why);
            }
            goto fail;
        }
        const qrl_trace_record_t *rc = r->rec[c];
        if (qrl_trace_record_n_sites(rc) != n_sites) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace response: chunk %zu has %u sites, "
                               "site_ids lists %zu", c, qrl_trace_record_n_sites(rc), n_sites);
            goto fail;
        }
        for (uint32_t s = 0; s < n_sites; s++)
            if (qrl_trace_record_site_len(rc, s) != want[s]) {
                st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace response: chunk %zu site %u "
                                   "(id 0x%x) has %u elements, the model's site has %u", c, s,
                                   site_ids[s], qrl_trace_record_site_len(rc, s), want[s]);
                goto fail;
            }
        if (token_begin[c] != next) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace response: chunk %zu starts at "
                               "token %u, expected %u", c, token_begin[c], next);
            goto fail;
        }
        r->begin[c] = next;
        next += qrl_trace_record_n_tokens(rc);
    }
    if (next != n_tokens) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace response: records cover %u tokens, "
                           "the response has %u", next, n_tokens);
        goto fail;
    }
    *out = r;
    return QRL_OK;
fail:
    qrl_trace_response_free(r);
    return st;
}

uint32_t qrl_trace_response_n_tokens(const qrl_trace_response *r) { return r->n_tokens; }
const qrl_trace_layout *qrl_trace_response_layout(const qrl_trace_response *r) { return r->l; }

bool qrl_trace_response_entry(const qrl_trace_response *r, uint32_t token, int layer,
                              qrl_trace_site_kind kind, int head, qrl_trace_entry *e) {
    if (!r || token >= r->n_tokens) return false;
    int site = qrl_trace_layout_find(r->l, layer, kind, head);
    if (site < 0) return false;
    size_t lo = 0, hi = r->n_chunks; /* last chunk with begin <= token */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (r->begin[mid] <= token) lo = mid;
        else hi = mid;
    }
    return qrl_trace_record_entry(r->rec[lo], token - r->begin[lo], (uint32_t)site, e, NULL) ==
           QRL_OK;
}

/* ---- metrics ------------------------------------------------------------------------- */

double qrl_trace_metric_disagree_share(uint64_t disagree, uint64_t elements) {
    return elements ? (double)disagree / (double)elements : 0.0;
}

double qrl_trace_metric_bytes_per_token(uint64_t bytes, uint64_t tokens) {
    return tokens ? (double)bytes / (double)tokens : 0.0;
}
