/* Weight sync, transport-independent part (wsync.h; docs/weight-sync.md). */
#include "weights/wsync.h"

#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

uint32_t qrl_wsync_bucket_count(uint64_t total, uint64_t bucket_bytes) {
    QRL_CHECK(bucket_bytes >= 1);
    return (uint32_t)(total / bucket_bytes + (total % bucket_bytes != 0));
}

void qrl_wsync_bucket_range(uint64_t total, uint64_t bucket_bytes, uint32_t i, uint64_t *off,
                            uint64_t *size) {
    QRL_CHECK(i < qrl_wsync_bucket_count(total, bucket_bytes));
    *off = (uint64_t)i * bucket_bytes;
    *size = total - *off < bucket_bytes ? total - *off : bucket_bytes;
}

void qrl_wsync_bucket_crcs(const uint8_t *stream, uint64_t total, uint64_t bucket_bytes, uint32_t *crc) {
    uint32_t n = qrl_wsync_bucket_count(total, bucket_bytes);
#pragma omp parallel for schedule(static)
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off, size;
        qrl_wsync_bucket_range(total, bucket_bytes, i, &off, &size);
        crc[i] = qrl_wire_crc32c(0, stream + off, size);
    }
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

void qrl_wsync_header_encode(const qrl_wsync_header *h, uint8_t out[QRL_WSYNC_HEADER_BYTES]) {
    memset(out, 0, QRL_WSYNC_HEADER_BYTES);
    put32(out, QRL_WSYNC_MAGIC);
    put32(out + 4, QRL_WSYNC_FORMAT);
    put64(out + 8, h->sync_epoch);
    put64(out + 16, h->version);
    put64(out + 24, h->total_bytes);
    put64(out + 32, h->bucket_bytes);
    put32(out + 40, h->bucket_count);
    put32(out + 44, h->manifest_len);
    put32(out + 48, h->preamble_crc);
    put32(out + 60, qrl_wire_crc32c(0, out, 60));
}

qrl_status qrl_wsync_header_decode(const uint8_t in[QRL_WSYNC_HEADER_BYTES], uint64_t max_total,
                                   qrl_wsync_header *h, qrl_error *err) {
    if (get32(in) != QRL_WSYNC_MAGIC)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync header: magic 0x%08x at offset 0, "
                             "expected 0x%08x", get32(in), QRL_WSYNC_MAGIC);
    if (get32(in + 60) != qrl_wire_crc32c(0, in, 60))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync header: CRC-32C mismatch (offset 60)");
    if (get32(in + 4) != QRL_WSYNC_FORMAT)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "weight sync header: format %u (offset 4), "
                             "this build reads %u", get32(in + 4), QRL_WSYNC_FORMAT);
    *h = (qrl_wsync_header){
        .sync_epoch = get64(in + 8),
        .version = get64(in + 16),
        .total_bytes = get64(in + 24),
        .bucket_bytes = get64(in + 32),
        .bucket_count = get32(in + 40),
        .manifest_len = get32(in + 44),
        .preamble_crc = get32(in + 48),
    };
    if (h->bucket_bytes == 0 || h->bucket_bytes > ((uint64_t)1 << 32))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync header: bucket_bytes %llu (offset 32)",
                             (unsigned long long)h->bucket_bytes);
    if (h->total_bytes > max_total)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "weight sync header: total_bytes %llu "
                             "(offset 24) above the receiver's limit %llu",
                             (unsigned long long)h->total_bytes, (unsigned long long)max_total);
    if ((uint64_t)h->bucket_count != h->total_bytes / h->bucket_bytes + (h->total_bytes % h->bucket_bytes != 0))
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync header: bucket_count %u (offset 40) "
                             "for %llu bytes in %llu-byte buckets", h->bucket_count,
                             (unsigned long long)h->total_bytes, (unsigned long long)h->bucket_bytes);
    if (h->manifest_len == 0 || h->manifest_len > QRL_WSYNC_MAX_MANIFEST)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "weight sync header: manifest_len %u "
                             "(offset 44) outside 1..%zu", h->manifest_len, QRL_WSYNC_MAX_MANIFEST);
    return QRL_OK;
}

size_t qrl_wsync_preamble_len(const qrl_wsync_header *h) {
    return (size_t)h->manifest_len + 4 * (size_t)h->bucket_count;
}

qrl_status qrl_wsync_preamble_build(qrl_wsync_header *h, const uint8_t *manifest, size_t manifest_len,
                                    const uint32_t *crc, uint8_t **out, size_t *out_len, qrl_error *err) {
    *out = NULL;
    if (manifest_len == 0 || manifest_len > QRL_WSYNC_MAX_MANIFEST)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "weight sync: manifest of %zu bytes (1..%zu)",
                             manifest_len, QRL_WSYNC_MAX_MANIFEST);
    h->manifest_len = (uint32_t)manifest_len;
    size_t len = qrl_wsync_preamble_len(h);
    uint8_t *p = malloc(len);
    if (!p) return qrl_error_set(err, QRL_STATUS_NOMEM, "weight sync preamble: %zu bytes", len);
    memcpy(p, manifest, manifest_len);
    for (uint32_t i = 0; i < h->bucket_count; i++) put32(p + manifest_len + 4 * (size_t)i, crc[i]);
    h->preamble_crc = qrl_wire_crc32c(0, p, len);
    *out = p;
    *out_len = len;
    return QRL_OK;
}

qrl_status qrl_wsync_preamble_parse(const qrl_wsync_header *h, const uint8_t *pre,
                                    Qrl__WeightManifest **mf_out, uint32_t *crc, qrl_error *err) {
    *mf_out = NULL;
    size_t len = qrl_wsync_preamble_len(h);
    if (qrl_wire_crc32c(0, pre, len) != h->preamble_crc)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync of version %llu: preamble (manifest "
                             "and bucket CRCs, %zu bytes) CRC-32C mismatch", (unsigned long long)h->version, len);
    Qrl__WeightManifest *mf = NULL;
    QRL_TRY(qrl_wire_decode(&qrl__weight_manifest__descriptor, pre, h->manifest_len, QRL_WSYNC_MAX_MANIFEST,
                            (ProtobufCMessage **)&mf, err));
    qrl_status st = qrl_wire_weight_manifest_validate(mf, err);
    const char *field = NULL;
    if (st == QRL_OK) {
        if (mf->version != h->version) field = "version";
        else if (mf->total_bytes != h->total_bytes) field = "total_bytes";
        else if (mf->bucket_bytes != h->bucket_bytes) field = "bucket_bytes";
        else if (mf->bucket_count != h->bucket_count) field = "bucket_count";
        if (field)
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "weight sync of version %llu: manifest %s "
                               "differs from the header's", (unsigned long long)h->version, field);
    }
    if (st != QRL_OK) {
        qrl_wire_free(&mf->base);
        return st;
    }
    for (uint32_t i = 0; i < h->bucket_count; i++) crc[i] = get32(pre + h->manifest_len + 4 * (size_t)i);
    *mf_out = mf;
    return QRL_OK;
}

/* GF(2) arithmetic modulo the reflected CRC-32C polynomial (zlib crc32.c, multmodp/x2nmodp). */
#define CRC32C_POLY 0x82f63b78u
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return p;
}

/* x^(n * 2^k) mod p(x) */
static uint32_t x2nmodp(uint64_t n, unsigned k) {
    static uint32_t table[32];
    static bool ready;
    if (!ready) { /* idempotent: racing threads write the same values */
        uint32_t p = (uint32_t)1 << 30; /* x^1 */
        table[0] = p;
        for (int i = 1; i < 32; i++) table[i] = p = multmodp(p, p);
        __atomic_store_n(&ready, true, __ATOMIC_RELEASE);
    }
    uint32_t p = (uint32_t)1 << 31; /* x^0 */
    while (n) {
        if (n & 1) p = multmodp(table[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

uint32_t qrl_wsync_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}

/* The manifest's stream length is `total` and every tensor lies inside it (CORRUPT). */
static qrl_status tensors_inside(const Qrl__WeightManifest *mf, uint64_t total, qrl_error *err) {
    if (mf->total_bytes != total)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "stream of %llu bytes, manifest says %llu",
                             (unsigned long long)total, (unsigned long long)mf->total_bytes);
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const Qrl__TensorMeta *t = mf->tensors[i];
        if (t->byte_offset > total || t->byte_size > total - t->byte_offset)
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "tensor '%s' [%llu, +%llu) runs past the "
                                 "stream's %llu bytes", t->name, (unsigned long long)t->byte_offset,
                                 (unsigned long long)t->byte_size, (unsigned long long)total);
    }
    return QRL_OK;
}

qrl_status qrl_wsync_verify_stream(const Qrl__WeightManifest *mf, const uint8_t *stream, uint64_t total,
                                   const uint32_t *bucket_crc, qrl_error *err) {
    QRL_TRY(tensors_inside(mf, total, err));
    if (mf->checksum_algorithm != QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C) return QRL_OK;
    uint32_t nb = bucket_crc ? qrl_wsync_bucket_count(total, mf->bucket_bytes) : 0;
    long bad_bucket = -1, bad_tensor = -1;
#pragma omp parallel for schedule(dynamic, 1)
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t off, size;
        qrl_wsync_bucket_range(total, mf->bucket_bytes, i, &off, &size);
        if (qrl_wire_crc32c(0, stream + off, size) != bucket_crc[i]) {
#pragma omp critical
            if (bad_bucket < 0 || (long)i < bad_bucket) bad_bucket = (long)i;
        }
    }
    if (bad_bucket >= 0)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "bucket %ld CRC-32C mismatch (version %llu)", bad_bucket,
                             (unsigned long long)mf->version);
    uint32_t whole = 0;
    if (bucket_crc) { /* the buckets matched: fold their CRCs instead of another pass */
        for (uint32_t i = 0; i < nb; i++) {
            uint64_t off, size;
            qrl_wsync_bucket_range(total, mf->bucket_bytes, i, &off, &size);
            whole = i ? qrl_wsync_crc32c_combine(whole, bucket_crc[i], size) : bucket_crc[0];
        }
    }
#pragma omp parallel
    {
        if (!bucket_crc) {
#pragma omp single nowait
            whole = qrl_wire_crc32c(0, stream, total);
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < mf->n_tensors; i++) {
            const Qrl__TensorMeta *t = mf->tensors[i];
            if (qrl_wire_crc32c(0, stream + t->byte_offset, t->byte_size) != (uint32_t)t->checksum) {
#pragma omp critical
                if (bad_tensor < 0 || (long)i < bad_tensor) bad_tensor = (long)i;
            }
        }
    }
    if (whole != (uint32_t)mf->checksum)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "whole-stream CRC-32C mismatch (version %llu)",
                             (unsigned long long)mf->version);
    if (bad_tensor >= 0)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "tensor '%s' CRC-32C mismatch",
                             mf->tensors[bad_tensor]->name);
    return QRL_OK;
}

uint32_t qrl_wsync_whole_crc(uint64_t total, uint64_t bucket_bytes, const uint32_t *bucket_crc) {
    uint32_t nb = qrl_wsync_bucket_count(total, bucket_bytes), whole = 0;
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t off, size;
        qrl_wsync_bucket_range(total, bucket_bytes, i, &off, &size);
        whole = i ? qrl_wsync_crc32c_combine(whole, bucket_crc[i], size) : bucket_crc[0];
    }
    return whole;
}

qrl_status qrl_wsync_check_crcs(const Qrl__WeightManifest *mf, uint64_t total, const uint32_t *bucket_sent,
                                const uint32_t *bucket_got, const uint32_t *tensor_got, qrl_error *err) {
    QRL_TRY(tensors_inside(mf, total, err));
    if (mf->checksum_algorithm != QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C) return QRL_OK;
    uint32_t nb = qrl_wsync_bucket_count(total, mf->bucket_bytes);
    for (uint32_t i = 0; i < nb; i++)
        if (bucket_got[i] != bucket_sent[i])
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "bucket %u CRC-32C mismatch (version %llu)", i,
                                 (unsigned long long)mf->version);
    if (qrl_wsync_whole_crc(total, mf->bucket_bytes, bucket_got) != (uint32_t)mf->checksum)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "whole-stream CRC-32C mismatch (version %llu)",
                             (unsigned long long)mf->version);
    for (size_t i = 0; i < mf->n_tensors; i++)
        if (tensor_got[i] != (uint32_t)mf->tensors[i]->checksum)
            return qrl_error_set(err, QRL_STATUS_CORRUPT, "tensor '%s' CRC-32C mismatch", mf->tensors[i]->name);
    return QRL_OK;
}

static size_t dtype_size(const char *d) {
    return !strcmp(d, "BF16") || !strcmp(d, "F16") ? 2 : !strcmp(d, "F32") ? 4 : 0;
}

qrl_status qrl_wsync_manifest_encode(const qrl_wsync_tensor *t, size_t n, const uint8_t *stream,
                                     uint64_t total, uint64_t version, uint64_t sync_epoch,
                                     uint64_t bucket_bytes, uint8_t **out, size_t *out_len,
                                     qrl_error *err) {
    return qrl_wsync_manifest_encode_crcs(t, n, stream, NULL, 0, total, version, sync_epoch, bucket_bytes,
                                          out, out_len, err);
}

qrl_status qrl_wsync_manifest_encode_crcs(const qrl_wsync_tensor *t, size_t n, const uint8_t *stream,
                                          const uint32_t *tensor_crc, uint32_t whole_crc, uint64_t total,
                                          uint64_t version, uint64_t sync_epoch, uint64_t bucket_bytes,
                                          uint8_t **out, size_t *out_len, qrl_error *err) {
    *out = NULL;
    if (bucket_bytes == 0) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "bucket_bytes is 0");
    Qrl__TensorMeta *metas = calloc(n ? n : 1, sizeof *metas);
    Qrl__TensorMeta **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    uint64_t *shapes = calloc(2 * (n ? n : 1), sizeof *shapes);
    qrl_status st = QRL_OK;
    if (!metas || !ptrs || !shapes) {
        st = qrl_error_set(err, QRL_STATUS_NOMEM, "manifest of %zu tensors", n);
        goto done;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t es = dtype_size(t[i].dtype);
        if (!es || t[i].ndim < 1 || t[i].ndim > 2) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tensor '%s': dtype '%s' ndim %d",
                               t[i].name, t[i].dtype, t[i].ndim);
            goto done;
        }
        uint64_t bytes = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1) * es;
        if (bytes > total - off) {
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tensor '%s' ends past the stream's "
                               "%llu bytes", t[i].name, (unsigned long long)total);
            goto done;
        }
        qrl__tensor_meta__init(&metas[i]);
        metas[i].name = (char *)t[i].name;
        metas[i].dtype = (char *)t[i].dtype;
        shapes[2 * i] = t[i].shape[0];
        shapes[2 * i + 1] = t[i].shape[1];
        metas[i].shape = &shapes[2 * i];
        metas[i].n_shape = (size_t)t[i].ndim;
        metas[i].byte_offset = off;
        metas[i].byte_size = bytes;
        metas[i].checksum = stream ? qrl_wire_crc32c(0, stream + off, bytes) : tensor_crc[i];
        ptrs[i] = &metas[i];
        off += bytes;
    }
    if (off != total) {
        st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "tensors hold %llu bytes, the stream %llu",
                           (unsigned long long)off, (unsigned long long)total);
        goto done;
    }
    Qrl__WeightManifest mf = QRL__WEIGHT_MANIFEST__INIT;
    mf.version = version;
    mf.step = version;
    mf.sync_epoch = sync_epoch;
    mf.tensors = ptrs;
    mf.n_tensors = n;
    mf.bucket_bytes = bucket_bytes;
    mf.total_bytes = total;
    mf.bucket_count = qrl_wsync_bucket_count(total, bucket_bytes);
    mf.checksum_algorithm = QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C;
    mf.checksum = stream ? qrl_wire_crc32c(0, stream, total) : whole_crc;
    mf.uaq_scale = 1.0f;
    QRL_TRY_GOTO(qrl_wire_weight_manifest_validate(&mf, err), done);
    QRL_TRY_GOTO(qrl_wire_encode_alloc(&mf.base, out, out_len, err), done);
done:
    free(metas);
    free(ptrs);
    free(shapes);
    return st;
}

qrl_status qrl_wsync_mode_parse(const char *s, qrl_wsync_mode *out, qrl_error *err) {
    if (s && !strcmp(s, "tcp")) *out = QRL_WSYNC_MODE_TCP;
    else if (s && !strcmp(s, "nccl")) *out = QRL_WSYNC_MODE_NCCL;
    else if (s && !strcmp(s, "auto")) *out = QRL_WSYNC_MODE_AUTO;
    else return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "weights.transport '%s': expected tcp, "
                              "nccl or auto", s ? s : "(null)");
    return QRL_OK;
}

bool qrl_wsync_use_nccl(qrl_wsync_mode mode, bool learner_nccl, const bool *replica_nccl, size_t n) {
    if (mode == QRL_WSYNC_MODE_TCP) return false;
    if (mode == QRL_WSYNC_MODE_NCCL) return true;
    if (!learner_nccl || n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!replica_nccl[i]) return false;
    return true;
}
