/* Weight sync without a GPU (common/weights/wsync.h, nccl_bcast.h): bucket plan, the NCCL
 * transfer header and preamble, the stream checks the TCP and NCCL receivers share, the
 * transport choice, and the UNSUPPORTED answer of the NCCL calls without CUDA or a GPU. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "weights/nccl_bcast.h"
#include "weights/sync_group.h"
#include "weights/wsync.h"
#include "wire/wire.h"

Test(wsync, bucket_plan) {
    cr_assert_eq(qrl_wsync_bucket_count(0, 4096), 0);
    cr_assert_eq(qrl_wsync_bucket_count(1, 4096), 1);
    cr_assert_eq(qrl_wsync_bucket_count(4096, 4096), 1);
    cr_assert_eq(qrl_wsync_bucket_count(4097, 4096), 2);
    cr_assert_eq(qrl_wsync_bucket_count(10000, 3000), 4);
    uint64_t off, size, sum = 0;
    for (uint32_t i = 0; i < 4; i++) {
        qrl_wsync_bucket_range(10000, 3000, i, &off, &size);
        cr_assert_eq(off, (uint64_t)i * 3000);
        cr_assert_eq(size, i < 3 ? 3000u : 1000u);
        sum += size;
    }
    cr_assert_eq(sum, 10000);
    uint8_t data[10];
    for (int i = 0; i < 10; i++) data[i] = (uint8_t)('a' + i);
    uint32_t crc[4];
    qrl_wsync_bucket_crcs(data, 10, 3, crc);
    /* "abc", "def", "ghi", "j": each bucket's CRC-32C on its own */
    cr_assert_eq(crc[0], qrl_wire_crc32c_sw(0, "abc", 3));
    cr_assert_eq(crc[2], qrl_wire_crc32c_sw(0, "ghi", 3));
    cr_assert_eq(crc[3], qrl_wire_crc32c_sw(0, "j", 1));
    /* the RFC 3720 check value of CRC-32C: "123456789" -> 0xE3069283 */
    qrl_wsync_bucket_crcs((const uint8_t *)"123456789", 9, 64, crc);
    cr_assert_eq(crc[0], 0xE3069283u);
}

Test(wsync, crc32c_combine) {
    uint8_t buf[3000];
    for (int i = 0; i < 3000; i++) buf[i] = (uint8_t)(i * 7 + (i >> 3));
    const size_t cuts[] = {0, 1, 5, 1000, 2999, 3000};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        size_t c = cuts[k];
        uint32_t a = qrl_wire_crc32c_sw(0, buf, c), b = qrl_wire_crc32c_sw(0, buf + c, 3000 - c);
        cr_assert_eq(qrl_wsync_crc32c_combine(a, b, 3000 - c), qrl_wire_crc32c_sw(0, buf, 3000), "cut %zu", c);
    }
}

static qrl_wsync_header sample_header(void) {
    return (qrl_wsync_header){.sync_epoch = 7, .version = 42, .total_bytes = 10000, .bucket_bytes = 3000,
                              .bucket_count = 4, .manifest_len = 123, .preamble_crc = 0xdeadbeef};
}

Test(wsync, header_layout_and_round_trip) {
    qrl_wsync_header h = sample_header(), g;
    uint8_t b[QRL_WSYNC_HEADER_BYTES];
    qrl_wsync_header_encode(&h, b);
    /* the layout is the wire contract: spot-check fixed offsets */
    cr_assert_eq(memcmp(b, "QRLW", 4), 0);
    cr_assert_eq(b[4], 1);
    cr_assert_eq(b[8], 7);
    cr_assert_eq(b[16], 42);
    cr_assert_eq(b[24] | b[25] << 8, 10000);
    cr_assert_eq(b[40], 4);
    cr_assert_eq(b[44], 123);
    cr_assert_eq(b[48], 0xef);
    cr_assert_eq(b[51], 0xde);
    qrl_error err;
    cr_assert_eq(qrl_wsync_header_decode(b, 1 << 20, &g, &err), QRL_OK, "%s", err.msg);
    cr_assert(g.sync_epoch == 7 && g.version == 42 && g.total_bytes == 10000 && g.bucket_bytes == 3000 &&
              g.bucket_count == 4 && g.manifest_len == 123 && g.preamble_crc == 0xdeadbeef);
}

Test(wsync, header_errors) {
    qrl_wsync_header h = sample_header(), g;
    uint8_t b[QRL_WSYNC_HEADER_BYTES], c[QRL_WSYNC_HEADER_BYTES];
    qrl_error err;
    qrl_wsync_header_encode(&h, b);
    memcpy(c, b, sizeof c);
    c[0] = 'X';
    cr_assert_eq(qrl_wsync_header_decode(c, 1 << 20, &g, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "magic"), "%s", err.msg);
    memcpy(c, b, sizeof c);
    c[17] ^= 1; /* version flipped: the header CRC catches it */
    cr_assert_eq(qrl_wsync_header_decode(c, 1 << 20, &g, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "CRC-32C mismatch (offset 60)"), "%s", err.msg);
    cr_assert_eq(qrl_wsync_header_decode(b, 9999, &g, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "total_bytes 10000"), "%s", err.msg);
    h.bucket_count = 5;
    qrl_wsync_header_encode(&h, c);
    cr_assert_eq(qrl_wsync_header_decode(c, 1 << 20, &g, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "bucket_count 5"), "%s", err.msg);
    h = sample_header();
    h.manifest_len = 0;
    qrl_wsync_header_encode(&h, c);
    cr_assert_eq(qrl_wsync_header_decode(c, 1 << 20, &g, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "manifest_len 0"), "%s", err.msg);
    /* a later format: refused as UNSUPPORTED, not as corruption */
    h = sample_header();
    qrl_wsync_header_encode(&h, c);
    c[4] = 2;
    uint32_t crc = qrl_wire_crc32c(0, c, 60);
    for (int i = 0; i < 4; i++) c[60 + i] = (uint8_t)(crc >> (8 * i));
    cr_assert_eq(qrl_wsync_header_decode(c, 1 << 20, &g, &err), QRL_STATUS_UNSUPPORTED);
}

/* Two tensors, BF16 2x3 and F32 [5]: 12 + 20 = 32 bytes. */
static const qrl_wsync_tensor TENSORS[] = {
    {"model.a.weight", "BF16", {2, 3}, 2},
    {"model.norm.weight", "F32", {5, 0}, 1},
};

static void make_stream(uint8_t s[32]) {
    for (int i = 0; i < 32; i++) s[i] = (uint8_t)(i * 37 + 11);
}

Test(wsync, manifest_encode_and_verify) {
    uint8_t s[32], *mb;
    size_t ml;
    make_stream(s);
    qrl_error err;
    cr_assert_eq(qrl_wsync_manifest_encode(TENSORS, 2, s, 32, 9, 3, 10, &mb, &ml, &err), QRL_OK, "%s", err.msg);
    Qrl__WeightManifest *mf;
    cr_assert_eq(qrl_wire_decode(&qrl__weight_manifest__descriptor, mb, ml, 1 << 20, (ProtobufCMessage **)&mf, &err),
                 QRL_OK, "%s", err.msg);
    cr_assert_eq(mf->version, 9);
    cr_assert_eq(mf->sync_epoch, 3);
    cr_assert_eq(mf->bucket_count, 4);
    cr_assert_eq(mf->tensors[1]->byte_offset, 12);
    cr_assert_eq(mf->tensors[1]->byte_size, 20);
    cr_assert_eq((uint32_t)mf->checksum, qrl_wire_crc32c_sw(0, s, 32));
    cr_assert_eq((uint32_t)mf->tensors[1]->checksum, qrl_wire_crc32c_sw(0, s + 12, 20));
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, NULL, &err), QRL_OK, "%s", err.msg);
    s[20] ^= 0x10; /* inside the second tensor */
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, NULL, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "whole-stream CRC-32C mismatch"), "%s", err.msg);
    /* whole checksum right, a tensor's wrong: the tensor is named */
    s[20] ^= 0x10;
    mf->tensors[0]->checksum ^= 1;
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, NULL, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "tensor 'model.a.weight' CRC-32C mismatch"), "%s", err.msg);
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 31, NULL, &err), QRL_STATUS_CORRUPT);
    mf->tensors[0]->checksum ^= 1;
    /* with the sender's bucket CRCs (10-byte buckets): a flipped byte names its bucket, and
     * the whole-stream CRC folded from the bucket CRCs equals the one-pass CRC */
    uint32_t crc[4];
    qrl_wsync_bucket_crcs(s, 32, 10, crc);
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, crc, &err), QRL_OK, "%s", err.msg);
    s[25] ^= 1;
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, crc, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "bucket 2 CRC-32C mismatch"), "%s", err.msg);
    s[25] ^= 1;
    mf->checksum ^= 4; /* buckets fine, the manifest's whole CRC not */
    cr_assert_eq(qrl_wsync_verify_stream(mf, s, 32, crc, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "whole-stream"), "%s", err.msg);
    qrl_wire_free(&mf->base);
    free(mb);
    /* sizes that do not add up are refused */
    cr_assert_eq(qrl_wsync_manifest_encode(TENSORS, 2, s, 33, 9, 3, 10, &mb, &ml, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
}

Test(wsync, preamble_round_trip_and_errors) {
    uint8_t s[32], *mb, *pre;
    size_t ml, pl;
    make_stream(s);
    qrl_error err;
    cr_assert_eq(qrl_wsync_manifest_encode(TENSORS, 2, s, 32, 9, 3, 10, &mb, &ml, &err), QRL_OK, "%s", err.msg);
    uint32_t crc[4], got[4];
    qrl_wsync_bucket_crcs(s, 32, 10, crc);
    qrl_wsync_header h = {.sync_epoch = 3, .version = 9, .total_bytes = 32, .bucket_bytes = 10, .bucket_count = 4};
    cr_assert_eq(qrl_wsync_preamble_build(&h, mb, ml, crc, &pre, &pl, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(pl, ml + 16);
    cr_assert_eq(h.manifest_len, ml);
    cr_assert_eq(h.preamble_crc, qrl_wire_crc32c_sw(0, pre, pl));
    /* the header survives encoding, and the preamble parses back */
    uint8_t hb[QRL_WSYNC_HEADER_BYTES];
    qrl_wsync_header g;
    qrl_wsync_header_encode(&h, hb);
    cr_assert_eq(qrl_wsync_header_decode(hb, 1 << 20, &g, &err), QRL_OK, "%s", err.msg);
    Qrl__WeightManifest *mf;
    cr_assert_eq(qrl_wsync_preamble_parse(&g, pre, &mf, got, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(memcmp(got, crc, sizeof crc), 0);
    cr_assert_eq(mf->total_bytes, 32);
    qrl_wire_free(&mf->base);
    /* a flipped CRC-table byte */
    pre[ml + 5] ^= 1;
    cr_assert_eq(qrl_wsync_preamble_parse(&g, pre, &mf, got, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "preamble"), "%s", err.msg);
    cr_assert_null(mf);
    pre[ml + 5] ^= 1;
    /* a header that disagrees with the manifest (same preamble CRC) */
    g.version = 10;
    cr_assert_eq(qrl_wsync_preamble_parse(&g, pre, &mf, got, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "manifest version differs"), "%s", err.msg);
    free(pre);
    free(mb);
}

Test(wsync, transport_choice) {
    qrl_wsync_mode m;
    qrl_error err;
    cr_assert_eq(qrl_wsync_mode_parse("auto", &m, &err), QRL_OK);
    cr_assert_eq(m, QRL_WSYNC_MODE_AUTO);
    cr_assert_eq(qrl_wsync_mode_parse("nccl", &m, &err), QRL_OK);
    cr_assert_eq(m, QRL_WSYNC_MODE_NCCL);
    cr_assert_eq(qrl_wsync_mode_parse("tcp", &m, &err), QRL_OK);
    cr_assert_eq(m, QRL_WSYNC_MODE_TCP);
    cr_assert_eq(qrl_wsync_mode_parse("rdma", &m, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "weights.transport 'rdma'"), "%s", err.msg);
    bool all[3] = {true, true, true}, one_cpu[3] = {true, false, true};
    cr_assert(qrl_wsync_use_nccl(QRL_WSYNC_MODE_AUTO, true, all, 3));
    cr_assert_not(qrl_wsync_use_nccl(QRL_WSYNC_MODE_AUTO, true, one_cpu, 3));
    cr_assert_not(qrl_wsync_use_nccl(QRL_WSYNC_MODE_AUTO, false, all, 3));
    cr_assert_not(qrl_wsync_use_nccl(QRL_WSYNC_MODE_AUTO, true, all, 0));
    cr_assert_not(qrl_wsync_use_nccl(QRL_WSYNC_MODE_TCP, true, all, 3));
    cr_assert(qrl_wsync_use_nccl(QRL_WSYNC_MODE_NCCL, false, one_cpu, 3));
}

/* Without CUDA in the build (make sanitize) or without a GPU (this machine), NCCL calls say
 * UNSUPPORTED with a message, never crash. */
Test(wsync, nccl_unsupported_without_gpu) {
    if (qrl_nccl_available()) cr_skip_test("a GPU is visible: tests/cuda/test_nccl_bcast.c covers it");
    uint8_t id[QRL_NCCL_ID_BYTES];
    qrl_error err = {0};
    cr_assert_eq(qrl_nccl_unique_id(id, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert(strstr(err.msg, "nccl weight sync"), "%s", err.msg);
    qrl_nccl_comm_t *c = (qrl_nccl_comm_t *)1;
    memset(id, 0, sizeof id);
    cr_assert_eq(qrl_nccl_comm_init(id, 1, 0, 2, 0, 1000, &c, &err), QRL_STATUS_UNSUPPORTED);
    cr_assert_null(c);
    cr_assert_eq(qrl_nccl_bcast_send(NULL, NULL, 0, NULL, 0, NULL, 1000, &err) != QRL_OK, true);
    qrl_nccl_version v;
    cr_assert_neq(qrl_nccl_bcast_recv(NULL, 0, 1, 1000, &v, &err), QRL_OK);
    cr_assert_null(v.stream);
    /* bad arguments are caught before the device is looked for */
    cr_assert_eq(qrl_nccl_comm_init(id, 1, 2, 2, 0, 1000, &c, &err),
#if QRL_HAVE_CUDA
                 QRL_STATUS_INVALID_ARGUMENT
#else
                 QRL_STATUS_UNSUPPORTED
#endif
    );
    void *p = qrl_nccl_host_alloc(100);
    cr_assert_not_null(p);
    memset(p, 1, 100);
    qrl_nccl_host_free(p);
}

/* ---- sync-group membership (sync_group.h) --------------------------------------------- */

Test(wsync, sync_group_epochs_follow_membership) {
    qrl_sync_group g = {.mode = QRL_WSYNC_MODE_AUTO, .learner_nccl = true};
    qrl_sync_member ab[2] = {{"r-a", true}, {"r-b", true}}, ba[2] = {{"r-b", true}, {"r-a", true}};
    qrl_sync_member abc[3] = {{"r-a", true}, {"r-b", true}, {"r-c", true}};
    qrl_sync_member ab_cpu[3] = {{"r-a", true}, {"r-b", true}, {"r-cpu", false}};
    bool nccl, fresh;
    qrl_error err;
    cr_assert_eq(qrl_sync_group_plan(&g, ab, 2, &nccl, &fresh, &err), QRL_OK, "%s", err.msg);
    cr_assert(nccl && fresh);
    cr_assert_eq(g.epoch, 1);
    cr_assert_eq(qrl_sync_group_rank(&g, "r-a"), 1);
    cr_assert_eq(qrl_sync_group_rank(&g, "r-b"), 2);
    cr_assert_eq(qrl_sync_group_rank(&g, "r-c"), 0);
    /* same members in another order: same epoch, same ranks */
    cr_assert_eq(qrl_sync_group_plan(&g, ba, 2, &nccl, &fresh, &err), QRL_OK);
    cr_assert(nccl && !fresh);
    cr_assert_eq(g.epoch, 1);
    cr_assert_eq(qrl_sync_group_rank(&g, "r-b"), 2);
    /* a replica joins: new epoch, new ranks */
    cr_assert_eq(qrl_sync_group_plan(&g, abc, 3, &nccl, &fresh, &err), QRL_OK);
    cr_assert(nccl && fresh);
    cr_assert_eq(g.epoch, 2);
    cr_assert_eq(qrl_sync_group_rank(&g, "r-c"), 3);
    /* the epoch's communicator failed: the next plan starts another with the same members */
    g.failed = true;
    cr_assert_eq(qrl_sync_group_plan(&g, abc, 3, &nccl, &fresh, &err), QRL_OK);
    cr_assert(nccl && fresh && !g.failed);
    cr_assert_eq(g.epoch, 3);
    /* a CPU replica joins under auto: TCP for everyone, the epoch stays */
    cr_assert_eq(qrl_sync_group_plan(&g, ab_cpu, 3, &nccl, &fresh, &err), QRL_OK);
    cr_assert(!nccl && !fresh);
    cr_assert_eq(g.epoch, 3);
    Qrl__VersionEvent ev = QRL__VERSION_EVENT__INIT;
    qrl_sync_group_fill_event(&g, "r-a", &ev);
    cr_assert_eq(ev.transport, QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP);
    /* it leaves again: NCCL with a new epoch (members a, b) */
    cr_assert_eq(qrl_sync_group_plan(&g, ab, 2, &nccl, &fresh, &err), QRL_OK);
    cr_assert(nccl && fresh);
    cr_assert_eq(g.epoch, 4);
    memset(g.uid, 0xab, sizeof g.uid);
    qrl_sync_group_fill_event(&g, "r-b", &ev);
    cr_assert_eq(ev.transport, QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_NCCL);
    cr_assert_eq(ev.rank, 2);
    cr_assert_eq(ev.world_size, 3);
    cr_assert_eq(ev.sync_epoch, 4);
    cr_assert_eq(ev.nccl_unique_id.len, QRL_NCCL_ID_BYTES);
    cr_assert_eq(ev.nccl_unique_id.data[127], 0xab);
    /* a replica outside the epoch (joined after the plan) is told TCP */
    Qrl__VersionEvent ev2 = QRL__VERSION_EVENT__INIT;
    qrl_sync_group_fill_event(&g, "r-c", &ev2);
    cr_assert_eq(ev2.transport, QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP);
    /* bad ids are refused without changing the group */
    qrl_sync_member bad[1] = {{"", true}};
    cr_assert_eq(qrl_sync_group_plan(&g, bad, 1, &nccl, &fresh, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(g.epoch, 4);
    /* tcp mode: never NCCL; no replicas: TCP */
    g.mode = QRL_WSYNC_MODE_TCP;
    cr_assert_eq(qrl_sync_group_plan(&g, ab, 2, &nccl, &fresh, &err), QRL_OK);
    cr_assert(!nccl && !fresh);
    g.mode = QRL_WSYNC_MODE_AUTO;
    cr_assert_eq(qrl_sync_group_plan(&g, ab, 0, &nccl, &fresh, &err), QRL_OK);
    cr_assert(!nccl);
    qrl_sync_group_free(&g);
}
