/* TRACE recording in the CUDA forward: the device record store, per-pass row maps and the
 * batched copies into the host buffers (trace_rec_cuda.h). */
#ifdef QRL_HAVE_CUDA
#include "model/trace_rec_cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "cpu/quant.h"
#include "cuda/kv_quant.cuh"
#include "cuda/trace_capture.cuh"
#include "model/trace_rec_internal.h"

/* One capture launch: (layer, kind)'s head vectors (k with v merged when both are
 * captured: the V sites follow the K sites in the slab, and V follows K in the source). */
typedef struct plan {
    int n_vec, len;                 /* n_vec 0: nothing to launch */
    int64_t slab_off, slab_step, tap_off;
} plan;

typedef struct target {
    int row;
    qrl_trace_buf *buf;
    uint32_t token;
} target;

/* An engine sequence's buffer and its records that are only on the device. */
typedef struct bind {
    qrl_trace_buf *buf;             /* NULL: none */
    uint32_t lo, hi;                /* tokens [lo, hi) not yet copied to buf */
    qrl_trace_buf *st_buf;          /* a copy queued into the staging area, NULL: none */
    uint32_t st_lo, st_hi;
    uint64_t st_gen;                /* the copy batch it went in */
    bool st_taps, st_final;         /* st_final: queued by a release (sync brings it in) */
    long pass;                      /* last pass that targeted the sequence */
} bind;

/* Copies to the host run on their own stream in batches (the stagings of one pass, or of
 * the releases between two passes), each closed by an event; a ring of N_BATCH events. */
#define N_BATCH 64

struct qrl_cuda_trace_recorder {
    const qrl_trace_layout *l;
    int n_layers, max_seqs, max_rows, W, max_targets, n_targets;
    cudaStream_t stream, cstream;   /* the forward's; the copies' */
    cudaEvent_t ev_ready, ev_batch[N_BATCH];
    int batch_pending[N_BATCH];     /* binds of the batch not yet in their buffers */
    uint64_t gen;                   /* batches opened so far (the open / last one's number) */
    bool batch_open;
    bool sync_harvest;              /* QRL_TRACE_SYNC_HARVEST=1: the previous harvest, for A/B */
    int n_pending;                  /* binds with a queued copy */
    size_t slab, tap_floats, entries;
    plan *plans;                    /* [n_layers][KIND_COUNT] */
    uint32_t *tap_off;              /* [n_sites] float offset of each site in a tap entry */
    unsigned kinds;                 /* mask of captured kinds */
    uint8_t *d_store, *h_stage;     /* [entries][slab]: device store, pinned staging */
    float *d_taps, *h_taps;         /* [entries][tap_floats] or NULL */
    unsigned char *d_ctl, *h_ctl;   /* qrl_cuda_trace_ctl then int64 dst[max_rows] */
    uint8_t *d_kv4;                 /* fp4 KV: the pass's K/V records, [max_rows][2][kvh][kv4_bytes] */
    int64_t kv4_bytes;
    int n_kv_heads;
    bind *binds;                    /* [max_seqs] */
    target *t;                      /* [max_targets] */
    long pass_id;
    qrl_trace_tap_fn tap;
    void *tap_ctx;
    uint64_t host_ns;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static qrl_status cst(cudaError_t e, const char *what, qrl_error *err) {
    if (e == cudaSuccess) return QRL_OK;
    return qrl_error_set(err, QRL_STATUS_CUDA, "cuda trace recorder: %s: %s", what,
                         cudaGetErrorString(e));
}

static int64_t site_bytes(uint32_t len) { return 4 + qrl_nvfp4_blocks(len) + (len + 7) / 8; }

static qrl_status make_plans(qrl_cuda_trace_recorder *r, const qrl_model_config *cfg,
                             qrl_error *err) {
    const qrl_trace_layout *l = r->l;
    uint32_t ns = qrl_trace_layout_n_sites(l);
    const uint32_t *lens = qrl_trace_layout_site_lens(l);
    size_t off = 0;
    for (uint32_t s = 0; s < ns; s++) r->tap_off[s] = (uint32_t)off, off += lens[s];
    r->tap_floats = off;
    for (int ly = 0; ly < r->n_layers; ly++)
        for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++) {
            plan *p = &r->plans[ly * QRL_TRACE_SITE_KIND_COUNT_ + k];
            memset(p, 0, sizeof *p);
            int s0 = qrl_trace_layout_find(l, ly, (qrl_trace_site_kind)k, 0);
            if (s0 < 0) continue;
            r->kinds |= 1u << k;
            bool kv = k == QRL_TRACE_SITE_K || k == QRL_TRACE_SITE_V;
            if (k == QRL_TRACE_SITE_V && qrl_trace_layout_find(l, ly, QRL_TRACE_SITE_K, 0) >= 0)
                continue; /* captured with k */
            int n_vec = kv ? cfg->n_kv_heads : 1;
            if (k == QRL_TRACE_SITE_K && qrl_trace_layout_find(l, ly, QRL_TRACE_SITE_V, 0) >= 0)
                n_vec *= 2;
            p->n_vec = n_vec;
            p->len = (int)lens[s0];
            p->slab_off = qrl_trace_layout_offset_(l, (uint32_t)s0);
            p->slab_step = site_bytes(lens[s0]);
            p->tap_off = r->tap_off[s0];
            for (int v = 1; v < n_vec; v++) /* the vectors' sites are consecutive and equal */
                if (lens[s0 + v] != lens[s0] ||
                    qrl_trace_layout_offset_(l, (uint32_t)(s0 + v)) !=
                        (uint32_t)(p->slab_off + v * p->slab_step))
                    return qrl_error_set(err, QRL_STATUS_INTERNAL,
                                         "cuda trace recorder: layer %d kind %d: sites not "
                                         "contiguous", ly, k);
        }
    return QRL_OK;
}

qrl_status qrl_cuda_trace_recorder_new(const qrl_trace_layout *l, const qrl_model_config *cfg,
                                       int max_seqs, int max_rows, int window, void *stream,
                                       qrl_cuda_trace_recorder **out, qrl_error *err) {
    *out = NULL;
    if (max_seqs < 1 || max_rows < 1 || window < 2)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "cuda trace recorder: max_seqs=%d max_rows=%d window=%d (need >= 1, "
                             ">= 1, >= 2)", max_seqs, max_rows, window);
    qrl_cuda_trace_recorder *r = calloc(1, sizeof *r);
    if (!r) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda trace recorder: out of memory");
    r->l = l;
    r->n_layers = cfg->n_layers;
    r->max_seqs = max_seqs;
    r->max_rows = max_rows;
    r->W = window;
    r->max_targets = max_rows > max_seqs ? max_rows : max_seqs;
    r->stream = (cudaStream_t)stream;
    r->slab = qrl_trace_layout_slab_bytes_(l);
    const char *sh = getenv("QRL_TRACE_SYNC_HARVEST");
    r->sync_harvest = sh && sh[0] == '1';
    r->entries = (size_t)max_seqs * (size_t)window;
    r->n_kv_heads = cfg->n_kv_heads;
    r->kv4_bytes = (int64_t)qrl_cuda_kvq_fp4_copy_bytes(cfg->head_dim);
    r->plans = calloc((size_t)cfg->n_layers * QRL_TRACE_SITE_KIND_COUNT_, sizeof *r->plans);
    r->tap_off = calloc(qrl_trace_layout_n_sites(l) + 1, sizeof *r->tap_off);
    r->binds = calloc((size_t)max_seqs, sizeof *r->binds);
    r->t = calloc((size_t)r->max_targets, sizeof *r->t);
    qrl_status st = QRL_OK;
    if (!r->plans || !r->tap_off || !r->binds || !r->t) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "cuda trace recorder: out of memory");
        goto fail;
    }
    for (int i = 0; i < max_seqs; i++) r->binds[i].pass = -1;
    QRL_TRY_GOTO(make_plans(r, cfg, err), fail);
    size_t bytes = r->entries * r->slab, ctl = sizeof(qrl_cuda_trace_ctl) + 8 * (size_t)max_rows;
    if (cudaMalloc((void **)&r->d_store, bytes) != cudaSuccess ||
        cudaMallocHost((void **)&r->h_stage, bytes) != cudaSuccess ||
        cudaMalloc((void **)&r->d_ctl, ctl) != cudaSuccess ||
        cudaMallocHost((void **)&r->h_ctl, ctl) != cudaSuccess) {
        cudaGetLastError();
        st = qrl_error_set(err, QRL_STATUS_CUDA, "cuda trace recorder: cannot allocate %zu bytes "
                           "of device store and as many pinned (%d sequences x %d tokens x %zu "
                           "bytes)", bytes, max_seqs, window, r->slab);
        goto fail;
    }
    if (r->kinds >> QRL_TRACE_SITE_K & 1u || r->kinds >> QRL_TRACE_SITE_V & 1u) {
        size_t kb = (size_t)max_rows * 2 * cfg->n_kv_heads * (size_t)r->kv4_bytes;
        if (cudaMalloc((void **)&r->d_kv4, kb) != cudaSuccess) {
            cudaGetLastError();
            st = qrl_error_set(err, QRL_STATUS_CUDA, "cuda trace recorder: cannot allocate %zu "
                               "bytes of fp4 KV record copies", kb);
            goto fail;
        }
    }
    QRL_TRY_GOTO(cst(cudaStreamCreateWithFlags(&r->cstream, cudaStreamNonBlocking), "copy stream",
                     err), fail);
    for (int i = -1; i < N_BATCH; i++)
        QRL_TRY_GOTO(cst(cudaEventCreateWithFlags(i < 0 ? &r->ev_ready : &r->ev_batch[i],
                                                  cudaEventDisableTiming), "event", err), fail);
    QRL_TRY_GOTO(cst(cudaMemsetAsync(r->d_store, 0, bytes, r->stream), "store clear", err), fail);
    memset(r->h_ctl, 0, ctl);
    *out = r;
    return QRL_OK;
fail:
    qrl_cuda_trace_recorder_free(r);
    return st;
}

void qrl_cuda_trace_recorder_free(qrl_cuda_trace_recorder *r) {
    if (!r) return;
    if (r->cstream) { /* copies in flight land in h_stage */
        cudaStreamSynchronize(r->cstream);
        cudaStreamDestroy(r->cstream);
    }
    if (r->ev_ready) cudaEventDestroy(r->ev_ready);
    for (int i = 0; i < N_BATCH; i++)
        if (r->ev_batch[i]) cudaEventDestroy(r->ev_batch[i]);
    cudaFree(r->d_store);
    cudaFreeHost(r->h_stage);
    cudaFree(r->d_taps);
    cudaFreeHost(r->h_taps);
    cudaFree(r->d_ctl);
    cudaFreeHost(r->h_ctl);
    cudaFree(r->d_kv4);
    free(r->plans);
    free(r->tap_off);
    free(r->binds);
    free(r->t);
    free(r);
}

const qrl_trace_layout *qrl_cuda_trace_recorder_layout(const qrl_cuda_trace_recorder *r) {
    return r->l;
}

uint64_t qrl_cuda_trace_recorder_host_ns(const qrl_cuda_trace_recorder *r) { return r->host_ns; }

size_t qrl_cuda_trace_recorder_store_bytes(const qrl_cuda_trace_recorder *r) {
    return r->entries * r->slab + (r->d_taps ? r->entries * r->tap_floats * 4 : 0);
}

size_t qrl_cuda_trace_recorder_device_bytes(const qrl_cuda_trace_recorder *r) {
    return qrl_cuda_trace_recorder_store_bytes(r) + sizeof(qrl_cuda_trace_ctl) + 8 * (size_t)r->max_rows +
           (r->d_kv4 ? (size_t)r->max_rows * 2 * r->n_kv_heads * (size_t)r->kv4_bytes : 0);
}

qrl_status qrl_cuda_trace_recorder_set_tap(qrl_cuda_trace_recorder *r, qrl_trace_tap_fn fn,
                                           void *ctx, qrl_error *err) {
    if (fn && !r->d_taps) {
        size_t bytes = r->entries * r->tap_floats * sizeof(float);
        if (cudaMalloc((void **)&r->d_taps, bytes) != cudaSuccess ||
            cudaMallocHost((void **)&r->h_taps, bytes) != cudaSuccess) {
            cudaGetLastError();
            cudaFree(r->d_taps);
            r->d_taps = NULL;
            return qrl_error_set(err, QRL_STATUS_CUDA, "cuda trace recorder: cannot allocate "
                                 "%zu bytes of tap store", bytes);
        }
    }
    r->tap = fn;
    r->tap_ctx = ctx;
    return QRL_OK;
}

void qrl_cuda_trace_recorder_clear(qrl_cuda_trace_recorder *r) { r->n_targets = 0; }

void qrl_cuda_trace_recorder_target(qrl_cuda_trace_recorder *r, int row, qrl_trace_buf *buf,
                                    uint32_t token) {
    QRL_CHECK(r->n_targets < r->max_targets && qrl_trace_buf_layout(buf) == r->l && row >= 0 &&
              token <= qrl_trace_buf_n_tokens(buf) && token < qrl_trace_buf_cap_(buf));
    r->t[r->n_targets++] = (target){row, buf, token};
}

bool qrl_cuda_trace_recorder_has_kind(const qrl_cuda_trace_recorder *r, qrl_trace_site_kind kind) {
    return r->kinds >> kind & 1u;
}

/* ---- copies to the host ------------------------------------------------------------- */

static void close_batch(qrl_cuda_trace_recorder *r) {
    if (!r->batch_open) return;
    cudaEventRecord(r->ev_batch[r->gen % N_BATCH], r->cstream);
    r->batch_open = false;
}

static qrl_status commit_bind(qrl_cuda_trace_recorder *r, int seq, bool wait, bool *done,
                              qrl_error *err);

/* Open a copy batch: its copies wait for everything queued on the forward's stream so far
 * (the passes that wrote the records).  A ring slot still holding uncommitted binds (64
 * batches ago) has them brought in first. */
static qrl_status open_batch(qrl_cuda_trace_recorder *r, qrl_error *err) {
    if (r->batch_open) return QRL_OK;
    r->gen++;
    int slot = (int)(r->gen % N_BATCH);
    for (int seq = 0; seq < r->max_seqs && r->batch_pending[slot] > 0; seq++) {
        bind *b = &r->binds[seq];
        if (b->st_buf && b->st_gen % N_BATCH == (uint64_t)slot)
            QRL_TRY(commit_bind(r, seq, true, NULL, err));
    }
    QRL_TRY(cst(cudaEventRecord(r->ev_ready, r->stream), "record", err));
    QRL_TRY(cst(cudaStreamWaitEvent(r->cstream, r->ev_ready, 0), "copy wait", err));
    r->batch_open = true;
    return QRL_OK;
}

/* Bring seq's queued copy into its buffer: wait for its batch when `wait`, else only if
 * the batch has landed (*done says whether it was brought in). */
static qrl_status commit_bind(qrl_cuda_trace_recorder *r, int seq, bool wait, bool *done,
                              qrl_error *err) {
    bind *b = &r->binds[seq];
    if (done) *done = false;
    if (!b->st_buf) return QRL_OK;
    if (r->batch_open && b->st_gen == r->gen) close_batch(r);
    cudaEvent_t ev = r->ev_batch[b->st_gen % N_BATCH];
    if (wait) {
        QRL_TRY(cst(cudaEventSynchronize(ev), "copy wait", err));
    } else {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady) return QRL_OK;
        QRL_TRY(cst(e, "copy query", err));
    }
    uint32_t ns = qrl_trace_layout_n_sites(r->l);
    const uint32_t *lens = qrl_trace_layout_site_lens(r->l);
    uint32_t held = qrl_trace_buf_n_tokens(b->st_buf);
    uint32_t hi = b->st_hi < held ? b->st_hi : held; /* a truncation drops the rest */
    for (uint32_t t = b->st_lo; t < hi; t++) {
        size_t e = (size_t)seq * r->W + t % r->W;
        memcpy(qrl_trace_buf_slab_(b->st_buf, t), r->h_stage + e * r->slab, r->slab);
        if (b->st_taps && r->tap)
            for (uint32_t s = 0; s < ns; s++)
                r->tap(r->tap_ctx, b->st_buf, t, s, r->h_taps + e * r->tap_floats + r->tap_off[s],
                       lens[s]);
    }
    b->st_buf = NULL;
    r->batch_pending[b->st_gen % N_BATCH]--;
    r->n_pending--;
    if (done) *done = true;
    return QRL_OK;
}

/* Queue the copy of seq's device-only records [lo, hi) into the staging area (the same
 * entries) on the copy stream; commit_bind brings them into the buffer.  One queued copy
 * per sequence: an earlier one is brought in first (its staging entries are reused). */
static qrl_status stage(qrl_cuda_trace_recorder *r, int seq, bind *b, bool final,
                        qrl_error *err) {
    if (b->hi <= b->lo) return QRL_OK;
    QRL_CHECK(b->hi - b->lo <= (uint32_t)r->W);
    QRL_TRY(commit_bind(r, seq, true, NULL, err));
    QRL_TRY(open_batch(r, err));
    size_t base = (size_t)seq * r->W, p0 = b->lo % r->W, cnt = b->hi - b->lo;
    bool taps = r->tap && r->d_taps;
    for (int part = 0; part < 2 && cnt; part++) {
        size_t c = p0 + cnt > (size_t)r->W ? r->W - p0 : cnt, e = base + p0;
        QRL_TRY(cst(cudaMemcpyAsync(r->h_stage + e * r->slab, r->d_store + e * r->slab,
                                    c * r->slab, cudaMemcpyDeviceToHost, r->cstream),
                    "record copy", err));
        if (taps)
            QRL_TRY(cst(cudaMemcpyAsync(r->h_taps + e * r->tap_floats,
                                        r->d_taps + e * r->tap_floats,
                                        c * r->tap_floats * sizeof(float),
                                        cudaMemcpyDeviceToHost, r->cstream), "tap copy", err));
        cnt -= c;
        p0 = 0;
    }
    b->st_buf = b->buf;
    b->st_lo = b->lo;
    b->st_hi = b->hi;
    b->st_gen = r->gen;
    b->st_taps = taps;
    b->st_final = final;
    b->lo = b->hi;
    r->batch_pending[r->gen % N_BATCH]++;
    r->n_pending++;
    return QRL_OK;
}

/* Whether the forward writing store entry `e` of seq must wait for the queued copy that
 * reads it (the copy runs on the other stream). */
static bool entry_staged(const qrl_cuda_trace_recorder *r, const bind *b, uint32_t e) {
    if (!b->st_buf) return false;
    uint32_t W = (uint32_t)r->W, first = b->st_lo % W;
    return (e + W - first) % W < b->st_hi - b->st_lo;
}

qrl_status qrl_cuda_trace_recorder_sync(qrl_cuda_trace_recorder *r, qrl_error *err) {
    if (r->n_pending == 0) return QRL_OK;
    uint64_t t0 = now_ns();
    qrl_status st = QRL_OK;
    for (int seq = 0; seq < r->max_seqs && st == QRL_OK; seq++)
        if (r->binds[seq].st_buf && r->binds[seq].st_final) st = commit_bind(r, seq, true, NULL, err);
    r->host_ns += now_ns() - t0;
    return st;
}

void qrl_cuda_trace_recorder_poll(qrl_cuda_trace_recorder *r) {
    if (r->sync_harvest || (r->n_pending == 0 && !r->batch_open)) return;
    uint64_t t0 = now_ns();
    close_batch(r);
    /* a quarter window's passes to clear the backlog: well before a sequence stages again
     * (half a window on), so the forced wait in stage() is rare */
    int quarter = r->W / 4 > 1 ? r->W / 4 : 1, budget = (r->n_pending + quarter - 1) / quarter;
    qrl_error e;
    for (int seq = 0; seq < r->max_seqs && budget > 0 && r->n_pending > 0; seq++) {
        bool done;
        if (!r->binds[seq].st_buf) continue;
        if (commit_bind(r, seq, false, &done, &e) != QRL_OK) {
            QRL_LOG_ERROR("trace", "sequence %d: %s", seq, e.msg);
            break;
        }
        budget -= done;
    }
    r->host_ns += now_ns() - t0;
}

/* b's view of its buffer after the scheduler truncated it (restart, re-prefill, an
 * aborted response): records past the held count are gone. */
static void reconcile(bind *b) {
    uint32_t held = qrl_trace_buf_n_tokens(b->buf);
    if (b->hi > held) b->hi = held;
    if (b->lo > b->hi) b->lo = b->hi;
}

void qrl_cuda_trace_recorder_release(qrl_cuda_trace_recorder *r, int seq) {
    if (seq < 0 || seq >= r->max_seqs || !r->binds[seq].buf) return;
    uint64_t t0 = now_ns();
    bind *b = &r->binds[seq];
    reconcile(b);
    qrl_error e;
    if (b->hi > b->lo) {
        if (stage(r, seq, b, true, &e) != QRL_OK)
            QRL_LOG_ERROR("trace", "sequence %d: %s", seq, e.msg);
    } else if (b->st_buf) {
        b->st_final = true; /* its last records are the queued copy's */
    }
    b->buf = NULL;
    b->lo = b->hi = 0;
    r->host_ns += now_ns() - t0;
}

/* ---- forward side ------------------------------------------------------------------- */

qrl_status qrl_cuda_trace_recorder_begin_pass(qrl_cuda_trace_recorder *r, int row0, int n,
                                              const int32_t *row_seq, qrl_error *err) {
    uint64_t t0 = now_ns();
    QRL_CHECK(n >= 1 && n <= r->max_rows);
    qrl_cuda_trace_ctl *ctl = (qrl_cuda_trace_ctl *)r->h_ctl;
    int64_t *dst = (int64_t *)(r->h_ctl + sizeof *ctl);
    for (int i = 0; i < n; i++) dst[i] = -1;
    r->pass_id++;
    for (int k = 0; k < r->n_targets; k++) {
        const target *tg = &r->t[k];
        int row = tg->row - row0;
        if (row < 0 || row >= n) continue;
        int seq = row_seq[row];
        QRL_CHECK(seq >= 0 && seq < r->max_seqs);
        bind *b = &r->binds[seq];
        QRL_CHECK(b->pass != r->pass_id); /* one target per sequence per pass */
        b->pass = r->pass_id;
        if (b->buf != tg->buf) { /* a new response on the sequence: the old one's go first */
            if (b->buf) {
                reconcile(b);
                QRL_TRY(stage(r, seq, b, true, err));
            }
            b->buf = tg->buf;
            b->lo = b->hi = qrl_trace_buf_n_tokens(tg->buf);
        }
        reconcile(b);
        uint32_t tok = tg->token, held = qrl_trace_buf_n_tokens(b->buf);
        if (b->hi < held) { /* records appended by someone else: already on the host */
            QRL_TRY(stage(r, seq, b, false, err));
            b->lo = b->hi = held;
        }
        /* a rewrite must still be in the window: tokens [tok, hi) all on the device */
        QRL_CHECK(tok <= held && tok + (uint32_t)r->W >= b->hi);
        /* half a window on the device goes to the host (copy stream), so the copy has the
         * other half's passes to land before the forward writes its entries again */
        if (tok == b->hi && b->hi - b->lo >= (uint32_t)(r->sync_harvest ? r->W : r->W / 2))
            QRL_TRY(stage(r, seq, b, false, err));
        if (tok < b->lo) b->lo = tok;
        if (tok == b->hi) b->hi++;
        qrl_trace_buf_hold_(b->buf, tok);
        uint32_t e = tok % (uint32_t)r->W;
        if (entry_staged(r, b, e)) { /* the forward waits for the copy still reading it */
            if (r->batch_open && b->st_gen == r->gen) close_batch(r);
            QRL_TRY(cst(cudaStreamWaitEvent(r->stream, r->ev_batch[b->st_gen % N_BATCH], 0),
                        "forward wait", err));
        }
        dst[row] = (int64_t)seq * r->W + e;
    }
    close_batch(r);
    *ctl = (qrl_cuda_trace_ctl){.store = r->d_store, .taps = r->tap ? r->d_taps : NULL,
                                .slab = (int64_t)r->slab, .tap_floats = (int64_t)r->tap_floats};
    qrl_status st = cst(cudaMemcpyAsync(r->d_ctl, r->h_ctl, sizeof *ctl + 8 * (size_t)n,
                                        cudaMemcpyHostToDevice, r->stream), "row map upload", err);
    r->host_ns += now_ns() - t0;
    return st;
}

qrl_status qrl_cuda_trace_recorder_capture(qrl_cuda_trace_recorder *r, int layer,
                                           qrl_trace_site_kind kind, const void *src, bool bf16,
                                           int64_t row_stride, int n, qrl_error *err) {
    const plan *p = &r->plans[layer * QRL_TRACE_SITE_KIND_COUNT_ + kind];
    if (p->n_vec == 0) return QRL_OK;
    qrl_cuda_trace_capture_args a = {
        .ctl = (const qrl_cuda_trace_ctl *)r->d_ctl,
        .dst = (const int64_t *)(r->d_ctl + sizeof(qrl_cuda_trace_ctl)), .src = src,
        .src_bf16 = bf16, .row_stride = row_stride, .n_rows = n, .n_vec = p->n_vec,
        .len = p->len, .slab_off = p->slab_off, .slab_step = p->slab_step, .tap_off = p->tap_off};
    return qrl_cuda_trace_capture(&a, r->stream, err);
}

void qrl_cuda_trace_recorder_sink(const qrl_cuda_trace_recorder *r, int layer,
                                  qrl_trace_site_kind kind, int n, qrl_cuda_nvfp4_act *q) {
    const plan *p = &r->plans[layer * QRL_TRACE_SITE_KIND_COUNT_ + kind];
    if (p->n_vec == 0) {
        q->trace_ctl = NULL;
        q->trace_dst = NULL;
        return;
    }
    QRL_CHECK(p->n_vec == 1 && p->len == n); /* a linear site: one vector, the whole row */
    q->trace_ctl = (const qrl_cuda_trace_ctl *)r->d_ctl;
    q->trace_dst = (const int64_t *)(r->d_ctl + sizeof(qrl_cuda_trace_ctl));
    q->trace_off = p->slab_off;
    q->trace_tap_off = p->tap_off;
}

uint8_t *qrl_cuda_trace_recorder_kv_copy(const qrl_cuda_trace_recorder *r, int layer) {
    const plan *k = &r->plans[layer * QRL_TRACE_SITE_KIND_COUNT_ + QRL_TRACE_SITE_K],
               *v = &r->plans[layer * QRL_TRACE_SITE_KIND_COUNT_ + QRL_TRACE_SITE_V];
    return k->n_vec || v->n_vec ? r->d_kv4 : NULL;
}

qrl_status qrl_cuda_trace_recorder_capture_kv_fp4(qrl_cuda_trace_recorder *r, int layer,
                                                  const float *kvf, int n, qrl_error *err) {
    int KVH = r->n_kv_heads;
    for (int k = QRL_TRACE_SITE_K; k <= QRL_TRACE_SITE_V; k++) {
        const plan *p = &r->plans[layer * QRL_TRACE_SITE_KIND_COUNT_ + k];
        if (p->n_vec == 0) continue; /* v with k: one launch (K then V heads in both layouts) */
        int vec0 = k == QRL_TRACE_SITE_V ? KVH : 0;
        qrl_cuda_trace_capture_args a = {
            .ctl = (const qrl_cuda_trace_ctl *)r->d_ctl,
            .dst = (const int64_t *)(r->d_ctl + sizeof(qrl_cuda_trace_ctl)),
            .src = kvf + (size_t)vec0 * p->len, .src_bf16 = false, .row_stride = 2 * (int64_t)KVH * p->len,
            .n_rows = n, .n_vec = p->n_vec, .len = p->len, .slab_off = p->slab_off,
            .slab_step = p->slab_step, .tap_off = p->tap_off, .fp4_rec = r->d_kv4,
            .fp4_row_vecs = 2 * KVH, .fp4_vec0 = vec0, .fp4_rec_bytes = r->kv4_bytes};
        QRL_TRY(qrl_cuda_trace_capture(&a, r->stream, err));
    }
    return QRL_OK;
}

void qrl_cuda_trace_recorder_end_call(qrl_cuda_trace_recorder *r) {
    r->n_targets = 0;
    if (!r->sync_harvest || r->n_pending == 0) return;
    uint64_t t0 = now_ns(); /* the previous harvest: every queued copy in, on the decode thread */
    qrl_error e;
    for (int seq = 0; seq < r->max_seqs && r->n_pending > 0; seq++)
        if (commit_bind(r, seq, true, NULL, &e) != QRL_OK) QRL_LOG_ERROR("trace", "%s", e.msg);
    r->host_ns += now_ns() - t0;
}
#else
typedef int qrl_trace_rec_cuda_unused_; /* ISO C forbids an empty translation unit */
#endif
