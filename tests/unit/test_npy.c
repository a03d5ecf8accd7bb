#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "io/npy.h"
#include "support/test_files.h"

static char dir[64];
static void setup(void) { qrl_test_mkdtemp(dir); }
static void teardown(void) { qrl_test_rmtree(dir); }
TestSuite(npy, .init = setup, .fini = teardown);

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* Writes a version 1.0 file with the given dict text (padded as numpy does) and data. */
static void write_npy_raw(const char *name, const char *dict, const void *data, size_t n,
                          char *path) {
    unsigned char buf[1024];
    size_t dl = strlen(dict), hl = dl + 1;
    size_t pad = 64 - (10 + hl) % 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((hl + pad) & 0xff);
    buf[9] = (unsigned char)((hl + pad) >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', pad);
    buf[10 + dl + pad] = '\n';
    size_t at = 10 + hl + pad;
    if (n) memcpy(buf + at, data, n);
    qrl_test_write(dir, name, buf, at + n, path);
}

static void expect_error(const char *path, qrl_status want, const char *field, const char *word) {
    qrl_tensor t;
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status got = qrl_npy_read(path, &t, &err);
    cr_assert_eq(got, want, "status %s, want %s: %s", qrl_status_name(got),
                 qrl_status_name(want), err.msg);
    cr_assert_not_null(strstr(err.msg, path), "names the file: %s", err.msg);
    cr_assert_not_null(strstr(err.msg, field), "names '%s': %s", field, err.msg);
    if (word) cr_assert_not_null(strstr(err.msg, word), "says '%s': %s", word, err.msg);
}

Test(npy, writes_exactly_what_numpy_writes) {
    /* numpy.save(np.arange(6, dtype='<f4').reshape(2, 3)) byte for byte (numpy >= 1.23:
     * the dict, 20 spare spaces for the growth axis, padding to 64, '\n') */
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    unsigned char want[128 + 24];
    memcpy(want, "\x93NUMPY\x01\x00\x76\x00", 10);
    memcpy(want + 10, dict, 59);
    memset(want + 69, ' ', 58);
    want[127] = '\n';
    float v[6] = {0, 1, 2, 3, 4, 5};
    memcpy(want + 128, v, sizeof v);

    char path[512];
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    qrl_error err;
    cr_assert_eq(qrl_npy_write_f32(path, v, 2, (int64_t[]){2, 3}, &err), QRL_OK, "%s", err.msg);
    unsigned char got[512];
    cr_assert_eq(slurp(path, got, sizeof got), sizeof want);
    cr_assert_eq(memcmp(got, want, sizeof want), 0);
}

Test(npy, round_trip_shapes) {
    float v[7] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-38f, 3e38f};
    const int64_t shapes[3][2] = {{7, 0}, {0, 0}, {1, 7}};
    const int ndims[3] = {1, 0, 2};
    const char *text[3] = {"(7,)", "()", "(1, 7)"};
    for (int k = 0; k < 3; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/r%d.npy", dir, k);
        qrl_error err;
        cr_assert_eq(qrl_npy_write_f32(path, v, ndims[k], shapes[k], &err), QRL_OK, "%s", err.msg);
        unsigned char raw[512];
        size_t n = slurp(path, raw, sizeof raw);
        cr_assert_eq((raw[8] | raw[9] << 8) % 64, 54, "10 + header length is a multiple of 64");
        raw[10 + (raw[8] | raw[9] << 8) - 1] = 0;
        cr_assert_not_null(strstr((char *)raw + 10, text[k]), "%s", raw + 10);
        qrl_tensor t;
        cr_assert_eq(qrl_npy_read(path, &t, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(t.dtype, QRL_DTYPE_F32);
        cr_assert_eq(t.ndim, ndims[k]);
        size_t numel = (size_t)qrl_tensor_numel(&t);
        cr_assert_eq(numel, k == 1 ? 1u : 7u);
        cr_assert_eq(n, 128 + numel * 4);
        cr_assert_eq(memcmp(t.data, v, numel * 4), 0);
        cr_assert_eq((uintptr_t)t.data % 64, 0);
        qrl_npy_free(&t);
        cr_assert_null(t.data);
    }
}

Test(npy, reads_int32_int64_and_version_2) {
    char path[512];
    int32_t a[3] = {-7, 0, 2147483647};
    write_npy_raw("i4.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", a,
                  sizeof a, path);
    qrl_tensor t;
    qrl_error err;
    cr_assert_eq(qrl_npy_read(path, &t, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(t.dtype, QRL_DTYPE_I32);
    cr_assert_eq(t.ndim, 1);
    cr_assert_eq(t.shape[0], 3);
    cr_assert_eq(((int32_t *)t.data)[0], -7);
    cr_assert_eq(((int32_t *)t.data)[2], 2147483647);
    qrl_npy_free(&t);

    /* version 2.0: 4-byte header length; key order and spacing need not be numpy's */
    int64_t b[4] = {1, -2, 3, INT64_MIN};
    const char *dict = "{\"shape\":(2,2),\"fortran_order\":False,\"descr\":\"<i8\"}";
    unsigned char buf[256];
    size_t dl = strlen(dict);
    memcpy(buf, "\x93NUMPY\x02\x00", 8);
    uint32_t hl = (uint32_t)(dl + 1);
    memcpy(buf + 8, &hl, 4);
    memcpy(buf + 12, dict, dl);
    buf[12 + dl] = '\n';
    memcpy(buf + 12 + hl, b, sizeof b);
    qrl_test_write(dir, "i8.npy", buf, 12 + hl + sizeof b, path);
    cr_assert_eq(qrl_npy_read(path, &t, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(t.dtype, QRL_DTYPE_I64);
    cr_assert_eq(t.ndim, 2);
    cr_assert_eq(t.shape[1], 2);
    cr_assert_eq(((int64_t *)t.data)[3], INT64_MIN);
    qrl_npy_free(&t);
}

Test(npy, bad_magic_version_and_truncation) {
    char path[512];
    qrl_test_write(dir, "short.npy", "\x93NUM", 4, path);
    expect_error(path, QRL_STATUS_PARSE, "field magic", "4 bytes");
    qrl_test_write(dir, "magic.npy", "PK\x03\x04 this is a zip file", 24, path);
    expect_error(path, QRL_STATUS_PARSE, "field magic", NULL);
    qrl_test_write(dir, "ver.npy", "\x93NUMPY\x04\x00\x10\x00{}", 12, path);
    expect_error(path, QRL_STATUS_UNSUPPORTED, "field version", "4.0");
    qrl_test_write(dir, "hlen.npy", "\x93NUMPY\x01\x00\xff\x00{'descr'", 18, path);
    expect_error(path, QRL_STATUS_PARSE, "field header_len", "255");
}

Test(npy, bad_header_fields) {
    char path[512];
    float x[2] = {0};
    write_npy_raw("be.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", x, 8,
                  path);
    expect_error(path, QRL_STATUS_UNSUPPORTED, "field descr", "'>f4'");
    write_npy_raw("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", x, 8,
                  path);
    expect_error(path, QRL_STATUS_UNSUPPORTED, "field descr", "'<f8'");
    write_npy_raw("fo.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", x, 8,
                  path);
    expect_error(path, QRL_STATUS_UNSUPPORTED, "field fortran_order", NULL);
    write_npy_raw("noshape.npy", "{'descr': '<f4', 'fortran_order': False, }", x, 8, path);
    expect_error(path, QRL_STATUS_PARSE, "field shape", "missing");
    write_npy_raw("neg.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", x, 8,
                  path);
    expect_error(path, QRL_STATUS_PARSE, "field shape", "non-negative");
    write_npy_raw("fo2.npy", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", x, 8, path);
    expect_error(path, QRL_STATUS_PARSE, "field fortran_order", NULL);
    write_npy_raw("key.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
                  x, 8, path);
    expect_error(path, QRL_STATUS_PARSE, "field header", "'x'");
    write_npy_raw("junk.npy", "not a dict", x, 8, path);
    expect_error(path, QRL_STATUS_PARSE, "field header", NULL);
    write_npy_raw("size.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", x, 8,
                  path);
    expect_error(path, QRL_STATUS_CORRUPT, "field shape", "holds 8 data bytes");
    write_npy_raw("big.npy",
                  "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                  x, 8, path);
    expect_error(path, QRL_STATUS_CORRUPT, "field shape", "more than");
    snprintf(path, sizeof path, "%s/none.npy", dir);
    expect_error(path, QRL_STATUS_IO, "cannot open", NULL);
}

Test(npy, writer_errors) {
    char path[512];
    float v[1] = {0};
    qrl_error err;
    snprintf(path, sizeof path, "%s/no/such/dir.npy", dir);
    cr_assert_eq(qrl_npy_write_f32(path, v, 1, (int64_t[]){1}, &err), QRL_STATUS_IO);
    cr_assert_not_null(strstr(err.msg, "no/such/dir.npy"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/x.npy", dir);
    cr_assert_eq(qrl_npy_write_f32(path, v, 1, (int64_t[]){-1}, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "field shape"), "%s", err.msg);
    cr_assert_eq(qrl_npy_write_f32(path, v, 9, (int64_t[9]){0}, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
}
