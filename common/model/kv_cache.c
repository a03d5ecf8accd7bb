/* Paged KV cache: block pool with a free stack, per-sequence block tables. */
#include "model/kv_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct kv_seq {
    bool used;
    int len;        /* committed positions */
    int n_blocks;   /* blocks held (capacity = n_blocks * block_size) */
    int32_t *table; /* [max_blocks_per_seq] */
} kv_seq;

struct qrl_kv_cache {
    qrl_kv_cache_desc d;
    size_t elem_size;      /* bytes per stored element */
    size_t block_elems;    /* block_size * n_kv_heads * head_dim */
    size_t layer_elems;    /* n_blocks * block_elems */
    unsigned char *k, *v;  /* [n_layers][n_blocks][block_size][n_kv_heads][head_dim] */
    int32_t *free_stack;   /* ids of free blocks; top at n_free - 1 */
    int n_free;
    int max_blocks_per_seq;
    kv_seq *seqs;
    int32_t *tables;       /* backing store of every seqs[i].table */
};

static const char *const format_names[QRL_KV_FORMAT_COUNT_] = {
    "f32", "bf16", "fp8", "int8", "int4", "fp4", "int4-protected",
};

const char *qrl_kv_format_name(qrl_kv_format f) {
    return (unsigned)f < QRL_KV_FORMAT_COUNT_ ? format_names[f] : "?";
}

qrl_status qrl_kv_format_parse(const char *name, qrl_kv_format *out, qrl_error *err) {
    for (int i = 0; i < QRL_KV_FORMAT_COUNT_; i++)
        if (strcmp(name, format_names[i]) == 0) {
            *out = (qrl_kv_format)i;
            return QRL_OK;
        }
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                         "unknown kv cache format '%s' (f32, bf16, fp8, int8, int4, fp4, "
                         "int4-protected)",
                         name);
}

bool qrl_kv_format_implemented(qrl_kv_format f) {
    return f == QRL_KV_FORMAT_F32 || f == QRL_KV_FORMAT_BF16;
}

qrl_status qrl_kv_cache_new(const qrl_kv_cache_desc *d, qrl_kv_cache **out, qrl_error *err) {
    *out = NULL;
    if (d->n_layers <= 0 || d->n_kv_heads <= 0 || d->head_dim <= 0 || d->block_size <= 0 ||
        d->n_blocks <= 0 || d->max_seqs <= 0 || d->max_seq_len <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kv cache: every size must be > 0 (layers=%d kv_heads=%d head_dim=%d "
                             "block_size=%d n_blocks=%d max_seqs=%d max_seq_len=%d)",
                             d->n_layers, d->n_kv_heads, d->head_dim, d->block_size, d->n_blocks,
                             d->max_seqs, d->max_seq_len);
    if ((unsigned)d->format >= QRL_KV_FORMAT_COUNT_)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kv cache: bad format %d",
                             (int)d->format);
    if (!qrl_kv_format_implemented(d->format))
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "kv cache '%s' arrives with the formats module",
                             qrl_kv_format_name(d->format));
    qrl_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return qrl_error_set(err, QRL_STATUS_NOMEM, "kv cache: out of memory");
    kv->d = *d;
    kv->elem_size = d->format == QRL_KV_FORMAT_F32 ? 4 : 2;
    kv->block_elems = (size_t)d->block_size * d->n_kv_heads * d->head_dim;
    kv->layer_elems = (size_t)d->n_blocks * kv->block_elems;
    kv->max_blocks_per_seq = (d->max_seq_len + d->block_size - 1) / d->block_size;
    size_t bytes = (size_t)d->n_layers * kv->layer_elems * kv->elem_size;
    kv->k = malloc(bytes);
    kv->v = malloc(bytes);
    kv->free_stack = malloc((size_t)d->n_blocks * sizeof *kv->free_stack);
    kv->seqs = calloc((size_t)d->max_seqs, sizeof *kv->seqs);
    kv->tables = malloc((size_t)d->max_seqs * kv->max_blocks_per_seq * sizeof *kv->tables);
    if (!kv->k || !kv->v || !kv->free_stack || !kv->seqs || !kv->tables) {
        qrl_kv_cache_free(kv);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "kv cache: cannot allocate %zu MiB",
                             2 * bytes >> 20);
    }
    /* Zero the pool so a stray read of an unwritten slot is finite, never garbage. */
    memset(kv->k, 0, bytes);
    memset(kv->v, 0, bytes);
    /* Lowest ids pop first. */
    for (int i = 0; i < d->n_blocks; i++) kv->free_stack[i] = d->n_blocks - 1 - i;
    kv->n_free = d->n_blocks;
    for (int s = 0; s < d->max_seqs; s++)
        kv->seqs[s].table = kv->tables + (size_t)s * kv->max_blocks_per_seq;
    *out = kv;
    return QRL_OK;
}

void qrl_kv_cache_free(qrl_kv_cache *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->free_stack);
    free(kv->seqs);
    free(kv->tables);
    free(kv);
}

const qrl_kv_cache_desc *qrl_kv_cache_describe(const qrl_kv_cache *kv) { return &kv->d; }

static kv_seq *seq_get(const qrl_kv_cache *kv, int seq) {
    QRL_CHECK(seq >= 0 && seq < kv->d.max_seqs && kv->seqs[seq].used);
    return &kv->seqs[seq];
}

qrl_status qrl_kv_cache_seq_new(qrl_kv_cache *kv, int *seq, qrl_error *err) {
    for (int s = 0; s < kv->d.max_seqs; s++) {
        if (!kv->seqs[s].used) {
            kv->seqs[s].used = true;
            kv->seqs[s].len = 0;
            kv->seqs[s].n_blocks = 0;
            *seq = s;
            return QRL_OK;
        }
    }
    return qrl_error_set(err, QRL_STATUS_BUSY, "kv cache: all %d sequence slots are in use",
                         kv->d.max_seqs);
}

static void release_blocks(qrl_kv_cache *kv, kv_seq *s, int keep) {
    while (s->n_blocks > keep) {
        QRL_CHECK(kv->n_free < kv->d.n_blocks);
        kv->free_stack[kv->n_free++] = s->table[--s->n_blocks];
    }
}

void qrl_kv_cache_seq_free(qrl_kv_cache *kv, int seq) {
    QRL_CHECK(seq >= 0 && seq < kv->d.max_seqs);
    kv_seq *s = &kv->seqs[seq];
    if (!s->used) return;
    release_blocks(kv, s, 0);
    s->used = false;
    s->len = 0;
}

int qrl_kv_cache_seq_len(const qrl_kv_cache *kv, int seq) { return seq_get(kv, seq)->len; }

int qrl_kv_cache_seq_capacity(const qrl_kv_cache *kv, int seq) {
    return seq_get(kv, seq)->n_blocks * kv->d.block_size;
}

qrl_status qrl_kv_cache_reserve(qrl_kv_cache *kv, int seq, int n_tokens, qrl_error *err) {
    kv_seq *s = seq_get(kv, seq);
    if (n_tokens > kv->d.max_seq_len)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kv cache: %d positions exceed max_seq_len %d", n_tokens,
                             kv->d.max_seq_len);
    int need = (n_tokens + kv->d.block_size - 1) / kv->d.block_size;
    if (need - s->n_blocks > kv->n_free)
        return qrl_error_set(err, QRL_STATUS_NOMEM,
                             "kv cache: pool exhausted (%d blocks needed, %d free of %d)",
                             need - s->n_blocks, kv->n_free, kv->d.n_blocks);
    while (s->n_blocks < need) s->table[s->n_blocks++] = kv->free_stack[--kv->n_free];
    return QRL_OK;
}

static size_t slot_offset(const qrl_kv_cache *kv, const kv_seq *s, int layer, int pos) {
    size_t row = (size_t)kv->d.n_kv_heads * kv->d.head_dim;
    return (size_t)layer * kv->layer_elems +
           (size_t)s->table[pos / kv->d.block_size] * kv->block_elems +
           (size_t)(pos % kv->d.block_size) * row;
}

void qrl_kv_cache_write(qrl_kv_cache *kv, int seq, int layer, int pos, const float *k,
                        const float *v) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers);
    QRL_CHECK(pos >= 0 && pos < s->n_blocks * kv->d.block_size);
    size_t off = slot_offset(kv, s, layer, pos);
    size_t row = (size_t)kv->d.n_kv_heads * kv->d.head_dim;
    if (kv->d.format == QRL_KV_FORMAT_F32) {
        memcpy((float *)kv->k + off, k, row * sizeof(float));
        memcpy((float *)kv->v + off, v, row * sizeof(float));
    } else {
        uint16_t *kd = (uint16_t *)kv->k + off, *vd = (uint16_t *)kv->v + off;
        for (size_t i = 0; i < row; i++) {
            kd[i] = qrl_cpu_bf16_store(k[i]);
            vd[i] = qrl_cpu_bf16_store(v[i]);
        }
    }
}

void qrl_kv_cache_set_len(qrl_kv_cache *kv, int seq, int len) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(len >= 0 && len <= s->n_blocks * kv->d.block_size);
    if (len < s->len) release_blocks(kv, s, (len + kv->d.block_size - 1) / kv->d.block_size);
    s->len = len;
}

qrl_status qrl_kv_cache_seq_fork(qrl_kv_cache *kv, int src, int *dst, qrl_error *err) {
    kv_seq *s = seq_get(kv, src);
    if (s->n_blocks > kv->n_free)
        return qrl_error_set(err, QRL_STATUS_NOMEM,
                             "kv cache: pool exhausted (fork needs %d blocks, %d free)",
                             s->n_blocks, kv->n_free);
    int d;
    QRL_TRY(qrl_kv_cache_seq_new(kv, &d, err));
    kv_seq *t = &kv->seqs[d];
    s = &kv->seqs[src];
    QRL_TRY(qrl_kv_cache_reserve(kv, d, s->len, err));
    size_t bytes = kv->block_elems * kv->elem_size;
    for (int l = 0; l < kv->d.n_layers; l++) {
        for (int b = 0; b < t->n_blocks; b++) {
            size_t from = ((size_t)l * kv->layer_elems + (size_t)s->table[b] * kv->block_elems) *
                          kv->elem_size;
            size_t to = ((size_t)l * kv->layer_elems + (size_t)t->table[b] * kv->block_elems) *
                        kv->elem_size;
            memcpy(kv->k + to, kv->k + from, bytes);
            memcpy(kv->v + to, kv->v + from, bytes);
        }
    }
    t->len = s->len;
    *dst = d;
    return QRL_OK;
}

void qrl_kv_cache_view(const qrl_kv_cache *kv, int seq, int layer, qrl_kv_view *view) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers);
    size_t off = (size_t)layer * kv->layer_elems * kv->elem_size;
    view->k = kv->k + off;
    view->v = kv->v + off;
    view->dtype = kv->d.format == QRL_KV_FORMAT_F32 ? QRL_DTYPE_F32 : QRL_DTYPE_BF16;
    view->block_table = s->table;
    view->block_size = kv->d.block_size;
    view->n_kv_heads = kv->d.n_kv_heads;
    view->head_dim = kv->d.head_dim;
}

const int32_t *qrl_kv_cache_block_table(const qrl_kv_cache *kv, int seq, int *n) {
    kv_seq *s = seq_get(kv, seq);
    *n = s->n_blocks;
    return s->table;
}

int qrl_kv_cache_free_blocks(const qrl_kv_cache *kv) { return kv->n_free; }

int qrl_kv_cache_free_seqs(const qrl_kv_cache *kv) {
    int n = 0;
    for (int s = 0; s < kv->d.max_seqs; s++) n += !kv->seqs[s].used;
    return n;
}
