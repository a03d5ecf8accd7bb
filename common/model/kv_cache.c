/* Paged KV cache: block pool with a free stack, per-sequence block tables, the format
 * codecs of one token-head vector, fp8 per-head scales and the int4-protected side cache. */
#include "model/kv_cache.h"

#include <math.h>
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
    size_t vec_bytes;      /* one token-head vector record in the pool */
    size_t slot_bytes;     /* one position: n_kv_heads * vec_bytes */
    size_t block_bytes;    /* block_size * slot_bytes */
    size_t layer_bytes;    /* n_blocks * block_bytes */
    unsigned char *k, *v;  /* [n_layers][n_blocks][block_size][n_kv_heads] records */
    int32_t *free_stack;   /* ids of free blocks; top at n_free - 1 */
    int n_free;
    int max_blocks_per_seq;
    kv_seq *seqs;
    int32_t *tables;       /* backing store of every seqs[i].table */
    /* fp8: [max_seqs][n_layers][n_kv_heads][2] scales (K, V); ready [max_seqs][n_layers] */
    float *fp8_scale;
    bool *fp8_ready;
    /* int4-protected side cache: [max_seqs][n_layers][side_slots][n_kv_heads] records of
     * side_vec bytes (F32 scale, INT8 codes), K and V; side_pos [max_seqs][n_layers]
     * [side_slots] = the position a slot holds, -1 when empty. */
    int side_slots;
    size_t side_vec;
    unsigned char *side_k, *side_v;
    int32_t *side_pos;
    float e4m3[256], e2m1[16]; /* decoded codes (the reference decoders' values) */
};

static const char *const format_names[QRL_KV_FORMAT_COUNT_] = {
    "f32", "bf16", "fp8", "int8", "int4", "fp4", "int4-protected",
};

#define INT4_GROUP QRL_KV_INT4_DEFAULT_GROUP
#define INT4_MODE QRL_KV_INT4_DEFAULT_MODE

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

bool qrl_kv_format_implemented(qrl_kv_format f) { return (unsigned)f < QRL_KV_FORMAT_COUNT_; }

static size_t round4(size_t n) { return (n + 3) & ~(size_t)3; }

static int int4_groups(int hd) { return qrl_kv_int4_groups(hd, INT4_GROUP); }

size_t qrl_kv_cache_vector_bytes(qrl_kv_format f, int d) {
    size_t hd = (size_t)d, nib = (size_t)qrl_nibble_row_bytes(d);
    switch (f) {
    case QRL_KV_FORMAT_F32: return 4 * hd;
    case QRL_KV_FORMAT_BF16: return 2 * hd;
    case QRL_KV_FORMAT_FP8: return round4(hd);
    case QRL_KV_FORMAT_INT8: return round4(4 + hd);
    case QRL_KV_FORMAT_INT4:
    case QRL_KV_FORMAT_INT4_PROTECTED:
        return round4((INT4_MODE == QRL_INT4_ASYMMETRIC ? 8 : 4) * (size_t)int4_groups(d) + nib);
    case QRL_KV_FORMAT_FP4: return round4(4 + (size_t)qrl_nvfp4_blocks(d) + nib);
    default: return 0;
    }
}

static bool is_quantized(qrl_kv_format f) {
    return f != QRL_KV_FORMAT_F32 && f != QRL_KV_FORMAT_BF16;
}

/* ---- one token-head vector ----------------------------------------------------------- */

/* Records keep their F32 fields first (4-byte aligned: records are multiples of 4 bytes
 * in 64-byte aligned pools).  fp8_scale is the head's scale (fp8 only). */
static void encode_vec(qrl_kv_format f, int hd, const float *x, unsigned char *rec,
                       float fp8_scale) {
    switch (f) {
    case QRL_KV_FORMAT_F32: memcpy(rec, x, (size_t)hd * sizeof(float)); break;
    case QRL_KV_FORMAT_BF16: {
        uint16_t *o = (uint16_t *)rec;
        for (int i = 0; i < hd; i++) o[i] = qrl_cpu_bf16_store(x[i]);
        break;
    }
    case QRL_KV_FORMAT_FP8: qrl_kv_fp8_quantize(x, hd, fp8_scale, rec); break;
    case QRL_KV_FORMAT_INT8: qrl_int8_quantize_rows(x, 1, hd, (int8_t *)(rec + 4), (float *)rec); break;
    case QRL_KV_FORMAT_INT4:
    case QRL_KV_FORMAT_INT4_PROTECTED: {
        int ng = int4_groups(hd);
        float *scales = (float *)rec, *zeros = INT4_MODE == QRL_INT4_ASYMMETRIC ? scales + ng : NULL;
        unsigned char *codes = rec + (zeros ? 8 : 4) * (size_t)ng;
        qrl_kv_int4_quantize(x, hd, INT4_GROUP, INT4_MODE, codes, scales, zeros);
        break;
    }
    case QRL_KV_FORMAT_FP4:
        qrl_nvfp4_quantize_row(x, hd, rec + 4 + qrl_nvfp4_blocks(hd), rec + 4, (float *)rec);
        break;
    default: QRL_CHECK(!"encode_vec: bad format");
    }
}

/* The reference dequantizers' operations (qrl_kv_fp8_dequantize: decode(c) * scale;
 * qrl_nvfp4_dequantize_row: decode(c) * qrl_nvfp4_block_dequant_scale), with table
 * lookups and the block factor hoisted: the same floats, faster. */
static void decode_vec(const qrl_kv_cache *kv, qrl_kv_format f, int hd, const unsigned char *rec,
                       float *x, float fp8_scale) {
    switch (f) {
    case QRL_KV_FORMAT_F32: memcpy(x, rec, (size_t)hd * sizeof(float)); break;
    case QRL_KV_FORMAT_BF16: {
        const uint16_t *h = (const uint16_t *)rec;
        for (int i = 0; i < hd; i++) x[i] = qrl_cpu_bf16_load(h[i]);
        break;
    }
    case QRL_KV_FORMAT_FP8:
        for (int i = 0; i < hd; i++) x[i] = kv->e4m3[rec[i]] * fp8_scale;
        break;
    case QRL_KV_FORMAT_INT8:
        qrl_int8_dequantize_rows((const int8_t *)(rec + 4), (const float *)rec, 1, hd, x);
        break;
    case QRL_KV_FORMAT_INT4:
    case QRL_KV_FORMAT_INT4_PROTECTED: {
        int ng = int4_groups(hd);
        const float *scales = (const float *)rec;
        const float *zeros = INT4_MODE == QRL_INT4_ASYMMETRIC ? scales + ng : NULL;
        const unsigned char *codes = rec + (zeros ? 8 : 4) * (size_t)ng;
        qrl_kv_int4_dequantize(codes, scales, zeros, hd, INT4_GROUP, INT4_MODE, x);
        break;
    }
    case QRL_KV_FORMAT_FP4: {
        const unsigned char *scales = rec + 4, *codes = scales + qrl_nvfp4_blocks(hd);
        float g = *(const float *)rec;
        for (int i0 = 0; i0 < hd; i0 += QRL_NVFP4_BLOCK) {
            float ds = qrl_nvfp4_block_dequant_scale(scales[i0 / QRL_NVFP4_BLOCK], g);
            int i1 = i0 + QRL_NVFP4_BLOCK < hd ? i0 + QRL_NVFP4_BLOCK : hd;
            for (int i = i0; i < i1; i++) x[i] = kv->e2m1[qrl_nibble_get(codes, i)] * ds;
        }
        break;
    }
    default: QRL_CHECK(!"decode_vec: bad format");
    }
}

/* ---- creation ------------------------------------------------------------------------ */

qrl_status qrl_kv_cache_new(const qrl_kv_cache_desc *d, qrl_kv_cache **out, qrl_error *err) {
    *out = NULL;
    if (d->n_layers <= 0 || d->n_kv_heads <= 0 || d->head_dim <= 0 || d->block_size <= 0 ||
        d->n_blocks <= 0 || d->max_seqs <= 0 || d->max_seq_len <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kv cache: every size must be > 0 (layers=%d kv_heads=%d head_dim=%d "
                             "block_size=%d n_blocks=%d max_seqs=%d max_seq_len=%d)",
                             d->n_layers, d->n_kv_heads, d->head_dim, d->block_size, d->n_blocks,
                             d->max_seqs, d->max_seq_len);
    if (!qrl_kv_format_implemented(d->format))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "kv cache: bad format %d",
                             (int)d->format);
    if (is_quantized(d->format) && d->head_dim > QRL_KV_MAX_HEAD_DIM)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kv cache '%s': head_dim %d exceeds %d", qrl_kv_format_name(d->format),
                             d->head_dim, QRL_KV_MAX_HEAD_DIM);
    bool prot = d->format == QRL_KV_FORMAT_INT4_PROTECTED;
    if (prot && (d->protected_sink < 0 || d->protected_recent < 0 ||
                 d->protected_sink > d->max_seq_len || d->protected_recent > d->max_seq_len))
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "kv cache int4-protected: sink=%d and recent=%d must be in [0, %d] "
                             "(max_seq_len)",
                             d->protected_sink, d->protected_recent, d->max_seq_len);
    qrl_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return qrl_error_set(err, QRL_STATUS_NOMEM, "kv cache: out of memory");
    kv->d = *d;
    if (!prot) kv->d.protected_sink = kv->d.protected_recent = 0;
    kv->vec_bytes = qrl_kv_cache_vector_bytes(d->format, d->head_dim);
    kv->slot_bytes = (size_t)d->n_kv_heads * kv->vec_bytes;
    kv->block_bytes = (size_t)d->block_size * kv->slot_bytes;
    kv->layer_bytes = (size_t)d->n_blocks * kv->block_bytes;
    kv->max_blocks_per_seq = (d->max_seq_len + d->block_size - 1) / d->block_size;
    size_t bytes = (size_t)d->n_layers * kv->layer_bytes;
    size_t seq_layers = (size_t)d->max_seqs * d->n_layers;
    kv->k = malloc(bytes);
    kv->v = malloc(bytes);
    kv->free_stack = malloc((size_t)d->n_blocks * sizeof *kv->free_stack);
    kv->seqs = calloc((size_t)d->max_seqs, sizeof *kv->seqs);
    kv->tables = malloc((size_t)d->max_seqs * kv->max_blocks_per_seq * sizeof *kv->tables);
    kv->fp8_scale = calloc(seq_layers * d->n_kv_heads * 2, sizeof(float));
    kv->fp8_ready = calloc(seq_layers, sizeof(bool));
    kv->side_slots = kv->d.protected_sink + kv->d.protected_recent;
    kv->side_vec = round4(4 + (size_t)d->head_dim);
    size_t side_bytes = seq_layers * kv->side_slots * d->n_kv_heads * kv->side_vec;
    kv->side_k = malloc(side_bytes ? side_bytes : 1);
    kv->side_v = malloc(side_bytes ? side_bytes : 1);
    kv->side_pos = malloc((seq_layers * kv->side_slots + 1) * sizeof(int32_t));
    if (!kv->k || !kv->v || !kv->free_stack || !kv->seqs || !kv->tables || !kv->fp8_scale ||
        !kv->fp8_ready || !kv->side_k || !kv->side_v || !kv->side_pos) {
        qrl_kv_cache_free(kv);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "kv cache: cannot allocate %zu MiB",
                             (2 * bytes + 2 * side_bytes) >> 20);
    }
    /* Zero the pool so a stray read of an unwritten slot is finite, never garbage. */
    memset(kv->k, 0, bytes);
    memset(kv->v, 0, bytes);
    memset(kv->side_k, 0, side_bytes);
    memset(kv->side_v, 0, side_bytes);
    for (size_t i = 0; i < seq_layers * kv->side_slots; i++) kv->side_pos[i] = -1;
    for (int i = 0; i < 256; i++) kv->e4m3[i] = qrl_e4m3_decode((uint8_t)i);
    for (int i = 0; i < 16; i++) kv->e2m1[i] = qrl_e2m1_decode((uint8_t)i);
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
    free(kv->fp8_scale);
    free(kv->fp8_ready);
    free(kv->side_k);
    free(kv->side_v);
    free(kv->side_pos);
    free(kv);
}

const qrl_kv_cache_desc *qrl_kv_cache_describe(const qrl_kv_cache *kv) { return &kv->d; }

/* ---- per-sequence state ------------------------------------------------------------- */

static kv_seq *seq_get(const qrl_kv_cache *kv, int seq) {
    QRL_CHECK(seq >= 0 && seq < kv->d.max_seqs && kv->seqs[seq].used);
    return &kv->seqs[seq];
}

static size_t seq_layer(const qrl_kv_cache *kv, int seq, int layer) {
    return (size_t)seq * kv->d.n_layers + layer;
}

static float *fp8_scales(const qrl_kv_cache *kv, int seq, int layer) {
    return kv->fp8_scale + seq_layer(kv, seq, layer) * kv->d.n_kv_heads * 2;
}

static int32_t *side_pos(const qrl_kv_cache *kv, int seq, int layer) {
    return kv->side_pos + seq_layer(kv, seq, layer) * kv->side_slots;
}

static size_t side_off(const qrl_kv_cache *kv, int seq, int layer, int slot, int head) {
    return ((seq_layer(kv, seq, layer) * kv->side_slots + slot) * kv->d.n_kv_heads + head) *
           kv->side_vec;
}

/* Forget the sequence's fp8 calibration and side-cache slots. */
static void seq_reset(qrl_kv_cache *kv, int seq) {
    for (int l = 0; l < kv->d.n_layers; l++) {
        kv->fp8_ready[seq_layer(kv, seq, l)] = false;
        int32_t *sp = side_pos(kv, seq, l);
        for (int i = 0; i < kv->side_slots; i++) sp[i] = -1;
    }
}

qrl_status qrl_kv_cache_seq_new(qrl_kv_cache *kv, int *seq, qrl_error *err) {
    for (int s = 0; s < kv->d.max_seqs; s++) {
        if (!kv->seqs[s].used) {
            kv->seqs[s].used = true;
            kv->seqs[s].len = 0;
            kv->seqs[s].n_blocks = 0;
            seq_reset(kv, s);
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

/* ---- writes and reads ---------------------------------------------------------------- */

static size_t slot_offset(const qrl_kv_cache *kv, const kv_seq *s, int layer, int pos) {
    return (size_t)layer * kv->layer_bytes +
           (size_t)s->table[pos / kv->d.block_size] * kv->block_bytes +
           (size_t)(pos % kv->d.block_size) * kv->slot_bytes;
}

/* qrl_kv_fp8_head_scale's value (headroom 4 x amax / 448) rounded UP to a power of two:
 * E4M3(x / 2^e) * 2^e is then x rounded on the E4M3 grid itself, the same for every e
 * while x / 2^e is a normal, unsaturated value, so a re-score whose calibration rows
 * differ (another first chunk) stores the same values except for the tiniest elements. */
static float fp8_pow2_scale(float amax) {
    if (amax == 0.0f) return 1.0f;
    int e;
    float m = frexpf(QRL_KV_FP8_DEFAULT_HEADROOM * amax / QRL_E4M3_MAX, &e); /* m in [0.5, 1) */
    return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

void qrl_kv_cache_calibrate(qrl_kv_cache *kv, int seq, int layer, const float *k,
                            const float *v, int n_rows) {
    seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers && n_rows >= 1);
    size_t sl = seq_layer(kv, seq, layer);
    if (kv->d.format != QRL_KV_FORMAT_FP8 || kv->fp8_ready[sl]) return;
    int hd = kv->d.head_dim, H = kv->d.n_kv_heads;
    float *sc = fp8_scales(kv, seq, layer);
    for (int h = 0; h < H; h++)
        for (int which = 0; which < 2; which++) {
            const float *x = which ? v : k;
            float amax = 0.0f;
            for (int r = 0; r < n_rows; r++) {
                float a = qrl_quant_absmax(x + ((size_t)r * H + h) * hd, hd, NULL);
                if (a > amax) amax = a;
            }
            sc[2 * h + which] = fp8_pow2_scale(amax);
        }
    kv->fp8_ready[sl] = true;
}

void qrl_kv_cache_write(qrl_kv_cache *kv, int seq, int layer, int pos, const float *k,
                        const float *v) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers);
    QRL_CHECK(pos >= 0 && pos < s->n_blocks * kv->d.block_size);
    if (kv->d.format == QRL_KV_FORMAT_FP8) qrl_kv_cache_calibrate(kv, seq, layer, k, v, 1);
    size_t off = slot_offset(kv, s, layer, pos);
    int hd = kv->d.head_dim, H = kv->d.n_kv_heads;
    const float *sc = fp8_scales(kv, seq, layer);
    for (int h = 0; h < H; h++) {
        encode_vec(kv->d.format, hd, k + (size_t)h * hd, kv->k + off + h * kv->vec_bytes, sc[2 * h]);
        encode_vec(kv->d.format, hd, v + (size_t)h * hd, kv->v + off + h * kv->vec_bytes,
                   sc[2 * h + 1]);
    }
    if (kv->side_slots == 0) return;
    int64_t slot = qrl_kv_protected_slot(pos, (int64_t)pos + 1, kv->d.protected_sink,
                                         kv->d.protected_recent);
    if (slot < 0) return;
    for (int h = 0; h < H; h++) {
        unsigned char *rk = kv->side_k + side_off(kv, seq, layer, (int)slot, h);
        unsigned char *rv = kv->side_v + side_off(kv, seq, layer, (int)slot, h);
        encode_vec(QRL_KV_FORMAT_INT8, hd, k + (size_t)h * hd, rk, 0.0f);
        encode_vec(QRL_KV_FORMAT_INT8, hd, v + (size_t)h * hd, rv, 0.0f);
    }
    side_pos(kv, seq, layer)[slot] = pos;
}

/* The side-cache slot holding position p when attending over n_ctx positions, or -1. */
static int protected_slot(const qrl_kv_cache *kv, const int32_t *sp, int p, int n_ctx) {
    int64_t slot = qrl_kv_protected_slot(p, n_ctx, kv->d.protected_sink, kv->d.protected_recent);
    return slot >= 0 && sp[slot] == p ? (int)slot : -1;
}

void qrl_kv_cache_gather(const qrl_kv_cache *kv, int seq, int layer, int kv_head, int n_ctx,
                         float *k, float *v, int *n_int4) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers && kv_head >= 0 &&
              kv_head < kv->d.n_kv_heads);
    QRL_CHECK(n_ctx >= 0 && n_ctx <= s->n_blocks * kv->d.block_size);
    int hd = kv->d.head_dim;
    const float *sc = fp8_scales(kv, seq, layer) + 2 * kv_head;
    const int32_t *sp = kv->side_slots ? side_pos(kv, seq, layer) : NULL;
    size_t head = (size_t)kv_head * kv->vec_bytes;
    int row = 0;
    for (int p = 0; p < n_ctx; p++) {
        if (sp && protected_slot(kv, sp, p, n_ctx) >= 0) continue;
        size_t off = slot_offset(kv, s, layer, p) + head;
        decode_vec(kv, kv->d.format, hd, kv->k + off, k + (size_t)row * hd, sc[0]);
        decode_vec(kv, kv->d.format, hd, kv->v + off, v + (size_t)row * hd, sc[1]);
        row++;
    }
    *n_int4 = row;
    for (int p = 0; sp && p < n_ctx; p++) {
        int slot = protected_slot(kv, sp, p, n_ctx);
        if (slot < 0) continue;
        size_t off = side_off(kv, seq, layer, slot, kv_head);
        decode_vec(kv, QRL_KV_FORMAT_INT8, hd, kv->side_k + off, k + (size_t)row * hd, 0.0f);
        decode_vec(kv, QRL_KV_FORMAT_INT8, hd, kv->side_v + off, v + (size_t)row * hd, 0.0f);
        row++;
    }
}

void qrl_kv_cache_set_len(qrl_kv_cache *kv, int seq, int len) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(len >= 0 && len <= s->n_blocks * kv->d.block_size);
    if (len < s->len) {
        release_blocks(kv, s, (len + kv->d.block_size - 1) / kv->d.block_size);
        for (int l = 0; l < kv->d.n_layers; l++) {
            int32_t *sp = side_pos(kv, seq, l);
            for (int i = 0; i < kv->side_slots; i++)
                if (sp[i] >= len) sp[i] = -1;
        }
        if (len == 0) seq_reset(kv, seq);
    }
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
    for (int l = 0; l < kv->d.n_layers; l++) {
        for (int b = 0; b < t->n_blocks; b++) {
            size_t from = (size_t)l * kv->layer_bytes + (size_t)s->table[b] * kv->block_bytes;
            size_t to = (size_t)l * kv->layer_bytes + (size_t)t->table[b] * kv->block_bytes;
            memcpy(kv->k + to, kv->k + from, kv->block_bytes);
            memcpy(kv->v + to, kv->v + from, kv->block_bytes);
        }
        kv->fp8_ready[seq_layer(kv, d, l)] = kv->fp8_ready[seq_layer(kv, src, l)];
        memcpy(fp8_scales(kv, d, l), fp8_scales(kv, src, l),
               (size_t)kv->d.n_kv_heads * 2 * sizeof(float));
        if (kv->side_slots) {
            size_t n = (size_t)kv->side_slots * kv->d.n_kv_heads * kv->side_vec;
            memcpy(kv->side_k + side_off(kv, d, l, 0, 0), kv->side_k + side_off(kv, src, l, 0, 0), n);
            memcpy(kv->side_v + side_off(kv, d, l, 0, 0), kv->side_v + side_off(kv, src, l, 0, 0), n);
            memcpy(side_pos(kv, d, l), side_pos(kv, src, l), kv->side_slots * sizeof(int32_t));
        }
    }
    t->len = s->len;
    *dst = d;
    return QRL_OK;
}

void qrl_kv_cache_view(const qrl_kv_cache *kv, int seq, int layer, qrl_kv_view *view) {
    kv_seq *s = seq_get(kv, seq);
    QRL_CHECK(layer >= 0 && layer < kv->d.n_layers && !is_quantized(kv->d.format));
    size_t off = (size_t)layer * kv->layer_bytes;
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
