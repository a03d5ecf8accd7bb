/* The transport-independent parts of the device weight path (issue 18), on the CPU:
 * the CRC-32C piece/fold algorithm the device runs (kernels/cpu/crc32c.h) against
 * qrl_wire_crc32c, the manifest built from precomputed checksums, the receiver's checks on
 * device-computed checksums (qrl_wsync_check_crcs: which bucket/tensor is named), the IPC
 * slot layout, and the UNSUPPORTED answers of a build or machine without CUDA. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/crc32c.h"
#ifdef QRL_HAVE_CUDA
#include "cuda/runtime.cuh"
#endif
#include "model/model.h"
#include "weights/wipc.h"
#include "weights/wsync.h"
#include "wire/wire.h"

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

Test(wipc_host, crc32c_pieces_equal_wire_crc) {
    uint64_t s = 3;
    size_t n = 3 * QRL_CRC32C_PIECE * QRL_CRC32C_GROUP + 12345;
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rng(&s);
    size_t lens[] = {0, 1, 7, QRL_CRC32C_PIECE - 1, QRL_CRC32C_PIECE, QRL_CRC32C_PIECE + 1,
                     QRL_CRC32C_PIECE * QRL_CRC32C_GROUP, QRL_CRC32C_PIECE * QRL_CRC32C_GROUP + 3, n - 5};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        for (size_t o = 0; o < 5; o++)
            cr_assert_eq(qrl_crc32c_pieces(b + o, lens[i]), qrl_wire_crc32c(0, b + o, lens[i]),
                         "length %zu offset %zu", lens[i], o);
    /* the shift tables: processing L zero bytes from c */
    uint32_t t[4][256];
    uint8_t z[777] = {0};
    qrl_crc32c_shift_tables(sizeof z, t);
    for (int k = 0; k < 50; k++) {
        uint32_t c = (uint32_t)rng(&s);
        cr_assert_eq(qrl_crc32c_shift_apply((const uint32_t (*)[256])t, c), qrl_crc32c_raw(c, z, sizeof z));
    }
    free(b);
}

/* A three-tensor stream with its per-bucket and per-tensor CRCs. */
typedef struct fixture {
    qrl_wsync_tensor t[3];
    uint8_t stream[6000];
    uint64_t total, bucket;
    uint32_t bcrc[8], tcrc[3];
    Qrl__WeightManifest *mf;
} fixture;

static void fixture_make(fixture *f) {
    memset(f, 0, sizeof *f);
    f->t[0] = (qrl_wsync_tensor){"a.weight", "BF16", {40, 30}, 2};
    f->t[1] = (qrl_wsync_tensor){"b.bias", "BF16", {17, 0}, 1};
    f->t[2] = (qrl_wsync_tensor){"c.weight", "BF16", {30, 40}, 2};
    f->total = (1200 + 17 + 1200) * 2;
    f->bucket = 1024;
    uint64_t s = 9;
    for (uint64_t i = 0; i < f->total; i++) f->stream[i] = (uint8_t)rng(&s);
    qrl_wsync_bucket_crcs(f->stream, f->total, f->bucket, f->bcrc);
    uint64_t off = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t len = f->t[i].shape[0] * (f->t[i].ndim == 2 ? f->t[i].shape[1] : 1) * 2;
        f->tcrc[i] = qrl_wire_crc32c(0, f->stream + off, len);
        off += len;
    }
    uint8_t *enc;
    size_t len;
    qrl_error err;
    cr_assert_eq(qrl_wsync_manifest_encode_crcs(f->t, 3, NULL, f->tcrc, qrl_wsync_whole_crc(f->total, f->bucket, f->bcrc),
                                                f->total, 5, 0, f->bucket, &enc, &len, &err), QRL_OK, "%s", err.msg);
    uint8_t *enc2;
    size_t len2;
    cr_assert_eq(qrl_wsync_manifest_encode(f->t, 3, f->stream, f->total, 5, 0, f->bucket, &enc2, &len2, &err), QRL_OK);
    /* the manifest from device-side checksums is the one the host would write */
    cr_assert_eq(len, len2);
    cr_assert(memcmp(enc, enc2, len) == 0);
    cr_assert_eq(qrl_wire_decode(&qrl__weight_manifest__descriptor, enc, len, len, (ProtobufCMessage **)&f->mf,
                                 &err), QRL_OK, "%s", err.msg);
    free(enc), free(enc2);
}

Test(wipc_host, check_crcs_names_what_differs) {
    fixture f;
    fixture_make(&f);
    qrl_error err;
    uint32_t nb = qrl_wsync_bucket_count(f.total, f.bucket);
    cr_assert_eq(nb, 5);
    cr_assert_eq(qrl_wsync_check_crcs(f.mf, f.total, f.bcrc, f.bcrc, f.tcrc, &err), QRL_OK, "%s", err.msg);
    uint32_t b[8], t[3];
    memcpy(b, f.bcrc, sizeof b), memcpy(t, f.tcrc, sizeof t);
    b[3] ^= 1;
    cr_assert_eq(qrl_wsync_check_crcs(f.mf, f.total, f.bcrc, b, t, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "bucket 3"), "%s", err.msg);
    /* a sender's table and the data agree on a wrong bucket: the whole-stream CRC catches it */
    cr_assert_eq(qrl_wsync_check_crcs(f.mf, f.total, b, b, t, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "whole-stream"), "%s", err.msg);
    memcpy(b, f.bcrc, sizeof b);
    t[1] ^= 0x80;
    cr_assert_eq(qrl_wsync_check_crcs(f.mf, f.total, b, b, t, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "b.bias"), "%s", err.msg);
    cr_assert_eq(qrl_wsync_check_crcs(f.mf, f.total - 2, b, b, f.tcrc, &err), QRL_STATUS_CORRUPT);
    qrl_wire_free(&f.mf->base);
}

Test(wipc_host, whole_crc_folds_buckets) {
    fixture f;
    fixture_make(&f);
    cr_assert_eq(qrl_wsync_whole_crc(f.total, f.bucket, f.bcrc), qrl_wire_crc32c(0, f.stream, f.total));
    qrl_wire_free(&f.mf->base);
}

Test(wipc_host, slot_layout) {
    cr_assert_eq(QRL_WIPC_STREAM_OFFSET % 256, 0);
    cr_assert_eq(qrl_wipc_preamble_offset(0), 256);
    cr_assert_eq(qrl_wipc_preamble_offset(1), 512);
    cr_assert_eq(qrl_wipc_preamble_offset(256), 512);
    cr_assert_eq(qrl_wipc_preamble_offset(257), 768);
}

Test(wipc_host, unsupported_without_cuda) {
#ifndef QRL_HAVE_CUDA
    qrl_wipc_sender *s = (void *)1;
    qrl_error err;
    cr_assert_eq(qrl_wipc_sender_new(0, &s, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_null(s);
    char id[QRL_WIPC_NODE_ID_MAX];
    qrl_wipc_node_id(id);
    cr_assert_str_eq(id, "", "no CUDA: no node id, so no learner offers CUDA IPC");
#else
    /* with CUDA in the build but no device (CI), no node id either */
    char id[QRL_WIPC_NODE_ID_MAX];
    qrl_wipc_node_id(id);
    int n = 0;
    qrl_error err;
    qrl_cuda_device_count(&n, &err);
    if (n == 0) {
        cr_assert_str_eq(id, "");
        qrl_wipc_receiver *r = (void *)1;
        cr_assert_eq(qrl_wipc_receiver_new(0, &r, &err), QRL_STATUS_CUDA);
        cr_assert_null(r);
    }
#endif
}

/* The publish table follows the model's tensor order, names and shapes, and points each
 * source into the device copy at the tensor's arena offset. */
Test(wipc_host, model_table_mirrors_arena_layout) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 40, .hidden_dim = 56, .n_layers = 2,
                          .n_heads = 4, .n_kv_heads = 2, .head_dim = 12, .vocab_size = 61,
                          .max_seq_len = 64, .norm_eps = 1e-6f, .qk_norm = true, .qkv_bias = true,
                          .rope = {.theta = 10000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    size_t np = (size_t)(m->rope_inv_freq - m->arena);
    float *dev = calloc(np, sizeof *dev); /* stands in for the device copy: only addresses matter */
    qrl_wsync_tensor *t;
    const float **src;
    cr_assert_eq(qrl_wipc_model_table(m, dev, &t, &src, &err), QRL_OK, "%s", err.msg);
    cr_assert_gt(m->n_tensors, 10);
    const float *end = dev; /* tensors lie in order, apart, inside the copy */
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *mt = &m->tensors[i];
        cr_assert_str_eq(t[i].name, mt->name);
        cr_assert_str_eq(t[i].dtype, "BF16");
        cr_assert_eq(t[i].ndim, mt->ndim);
        cr_assert_eq(t[i].shape[0], (uint64_t)mt->shape[0]);
        cr_assert_eq(t[i].shape[1], mt->ndim == 2 ? (uint64_t)mt->shape[1] : 0);
        cr_assert_eq(src[i] - dev, mt->data - m->arena, "tensor %s", mt->name);
        cr_assert_geq(src[i], end, "tensor %s overlaps the one before", mt->name);
        end = src[i] + t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1);
    }
    cr_assert_leq(end, dev + np);
    free(t);
    free(src);
    free(dev);
    qrl_model_free(m);
}
