#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "support/test_files.h"

static char dir[64];
static void setup(void) { qrl_test_mkdtemp(dir); }
static void teardown(void) { qrl_test_rmtree(dir); }
TestSuite(safetensors, .init = setup, .fini = teardown);

/* Writes <8-byte LE length><header><data> by hand (no padding: as some writers do). */
static void write_st(const char *name, const char *header, const void *data, size_t n,
                     char *path) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (n) memcpy(buf + 8 + hl, data, n);
    qrl_test_write(dir, name, buf, 8 + hl + n, path);
    free(buf);
}

/* Opens `path`, expects status `want`, and a one-line message naming the file and each
 * of the NULL-terminated words (tensor name, field, detail). */
static void expect_error(const char *path, qrl_status want, ...) {
    qrl_safetensors *st = NULL;
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status got = qrl_safetensors_open(path, &st, &err);
    cr_assert_eq(got, want, "status %s, want %s: %s", qrl_status_name(got),
                 qrl_status_name(want), err.msg);
    cr_assert_null(st);
    cr_assert_eq(err.status, want);
    cr_assert_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    cr_assert_not_null(strstr(err.msg, base), "message names the file: %s", err.msg);
    va_list ap;
    va_start(ap, want);
    for (const char *w; (w = va_arg(ap, const char *));)
        cr_assert_not_null(strstr(err.msg, w), "message names '%s': %s", w, err.msg);
    va_end(ap);
}

/* ---- round trip -------------------------------------------------------------------------- */

Test(safetensors, write_read_round_trip_several_dtypes) {
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
    uint16_t bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
    uint16_t f16[2] = {0x3c00, 0x7bff};
    int64_t i64 = -1234567890123ll;
    int8_t i8[5] = {-128, -1, 0, 1, 127};
    qrl_tensor t[6];
    qrl_tensor_init(&t[0], QRL_DTYPE_F32, 2, (int64_t[]){2, 3}, f32);
    qrl_tensor_init(&t[1], QRL_DTYPE_BF16, 1, (int64_t[]){4}, bf16);
    qrl_tensor_init(&t[2], QRL_DTYPE_F16, 3, (int64_t[]){1, 2, 1}, f16);
    qrl_tensor_init(&t[3], QRL_DTYPE_I64, 0, NULL, &i64);
    qrl_tensor_init(&t[4], QRL_DTYPE_U8, 1, (int64_t[]){0}, NULL);
    qrl_tensor_init(&t[5], QRL_DTYPE_I8, 1, (int64_t[]){5}, i8);
    qrl_safetensors_entry e[6] = {{"layer.w", &t[0]}, {"b16", &t[1]}, {"half", &t[2]},
                                  {"step", &t[3]},    {"empty", &t[4]}, {"bytes", &t[5]}};
    const char *meta[] = {"format", "pt", "note", "hi \"there\""};
    char path[512];
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    qrl_error err;
    cr_assert_eq(qrl_safetensors_write(path, e, 6, meta, 2, &err), QRL_OK, "%s", err.msg);

    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_neq(access(tmp, F_OK), 0, "the temp file is renamed away");

    /* layout: header length a multiple of 8, padded with spaces (HF's convention) */
    FILE *f = fopen(path, "rb");
    unsigned char head[8];
    cr_assert_eq(fread(head, 1, 8, f), 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | head[i];
    cr_assert_eq(hl % 8, 0);
    char *h = calloc(1, hl + 1);
    cr_assert_eq(fread(h, 1, hl, f), hl);
    fclose(f);
    cr_assert_eq(h[0], '{');
    size_t tl = strlen(h);
    while (tl > 0 && h[tl - 1] == ' ') tl--;
    cr_assert_eq(h[tl - 1], '}');
    cr_assert(hl - tl < 8);
    cr_assert_not_null(strstr(h, "\"__metadata__\":{\"format\":\"pt\""), "%s", h);
    free(h);

    qrl_safetensors *st;
    cr_assert_eq(qrl_safetensors_open(path, &st, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_count(st), 6);
    const char *sorted[] = {"b16", "bytes", "empty", "half", "layer.w", "step"};
    for (size_t i = 0; i < 6; i++) cr_assert_str_eq(qrl_safetensors_name(st, i), sorted[i]);
    for (size_t i = 0; i < 6; i++) {
        qrl_tensor r;
        cr_assert_eq(qrl_safetensors_get(st, e[i].name, &r, &err), QRL_OK, "%s", e[i].name);
        cr_assert_eq(r.dtype, t[i].dtype, "%s", e[i].name);
        cr_assert_eq(r.ndim, t[i].ndim, "%s", e[i].name);
        for (int d = 0; d < r.ndim; d++) cr_assert_eq(r.shape[d], t[i].shape[d]);
        cr_assert_eq(qrl_tensor_nbytes(&r), qrl_tensor_nbytes(&t[i]));
        cr_assert(qrl_tensor_is_contiguous(&r));
        if (qrl_tensor_nbytes(&r))
            cr_assert_eq(memcmp(r.data, t[i].data, qrl_tensor_nbytes(&r)), 0, "%s", e[i].name);
        /* larger dtypes first: each tensor is aligned to its element size in the file */
        cr_assert_eq((uintptr_t)r.data % qrl_dtype_size(r.dtype), 0, "%s", e[i].name);
    }
    cr_assert_str_eq(qrl_safetensors_metadata(st, "format"), "pt");
    cr_assert_str_eq(qrl_safetensors_metadata(st, "note"), "hi \"there\"");
    cr_assert_null(qrl_safetensors_metadata(st, "absent"));
    qrl_tensor r;
    cr_assert_eq(qrl_safetensors_get(st, "nope", &r, &err), QRL_STATUS_NOT_FOUND);
    cr_assert_not_null(strstr(err.msg, "'nope'"), "%s", err.msg);
    qrl_safetensors_close(st);

    /* writing again replaces the file atomically */
    cr_assert_eq(qrl_safetensors_write(path, e, 1, NULL, 0, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_open(path, &st, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_count(st), 1);
    cr_assert_null(qrl_safetensors_metadata(st, "format"));
    qrl_safetensors_close(st);
}

Test(safetensors, writer_rejects_bad_input) {
    float x[4] = {0};
    qrl_tensor t, nc;
    qrl_tensor_init(&t, QRL_DTYPE_F32, 1, (int64_t[]){4}, x);
    qrl_tensor_init(&nc, QRL_DTYPE_F32, 2, (int64_t[]){2, 2}, x);
    nc.strides[0] = 1, nc.strides[1] = 2; /* transposed view */
    char path[512];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    qrl_error err;
    qrl_safetensors_entry dup[2] = {{"a", &t}, {"a", &t}};
    cr_assert_eq(qrl_safetensors_write(path, dup, 2, NULL, 0, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "'a' field name"), "%s", err.msg);
    qrl_safetensors_entry bad[1] = {{"t", &nc}};
    cr_assert_eq(qrl_safetensors_write(path, bad, 1, NULL, 0, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_not_null(strstr(err.msg, "not contiguous"), "%s", err.msg);
    qrl_safetensors_entry meta_name[1] = {{"__metadata__", &t}};
    cr_assert_eq(qrl_safetensors_write(path, meta_name, 1, NULL, 0, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_neq(access(path, F_OK), 0, "nothing written on error");

    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/missing/w.safetensors", dir);
    qrl_safetensors_entry ok[1] = {{"t", &t}};
    cr_assert_eq(qrl_safetensors_write(nodir, ok, 1, NULL, 0, &err), QRL_STATUS_IO);
    cr_assert_not_null(strstr(err.msg, "missing/w.safetensors.tmp"), "%s", err.msg);
}

/* A file written by hand (not by our writer): an independent check of the reader. */
Test(safetensors, reads_hand_made_image_in_memory) {
    static const char img[] =
        "\x36\x00\x00\x00\x00\x00\x00\x00"
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"
        "\x00\x00\x80\x3f\x00\x00\x00\xc0"; /* 1.0f, -2.0f little-endian */
    cr_assert_eq(strlen("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"),
                 0x36);
    qrl_safetensors *st;
    qrl_error err;
    cr_assert_eq(qrl_safetensors_open_memory(img, sizeof img - 1, "mem", &st, &err), QRL_OK,
                 "%s", err.msg);
    qrl_tensor t;
    cr_assert_eq(qrl_safetensors_get(st, "x", &t, &err), QRL_OK);
    cr_assert_eq((const char *)t.data, img + 8 + 0x36);
    float v[2];
    cr_assert_eq(qrl_convert_to_f32(t.dtype, t.data, v, 2), QRL_OK);
    cr_assert_eq(v[0], 1.0f);
    cr_assert_eq(v[1], -2.0f);
    qrl_safetensors_close(st);
}

/* ---- the real checkpoint ------------------------------------------------------------------- */

Test(safetensors, reads_real_tinystories_checkpoint) {
    char path[512], f32path[512];
    if (!qrl_test_data_path("tinystories_656k/model.safetensors", path, sizeof path))
        cr_skip_test("no %s (set QRL_DATA_DIR)", path);
    qrl_safetensors *st;
    qrl_error err;
    cr_assert_eq(qrl_safetensors_open(path, &st, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_count(st), 20);
    cr_assert_str_eq(qrl_safetensors_name(st, 0), "model.embed_tokens.weight");
    cr_assert_str_eq(qrl_safetensors_metadata(st, "format"), "pt");
    qrl_tensor emb, norm, k;
    cr_assert_eq(qrl_safetensors_get(st, "model.embed_tokens.weight", &emb, &err), QRL_OK);
    cr_assert_eq(emb.dtype, QRL_DTYPE_BF16);
    cr_assert_eq(emb.ndim, 2);
    cr_assert_eq(emb.shape[0], 2048);
    cr_assert_eq(emb.shape[1], 128);
    cr_assert_eq(qrl_safetensors_get(st, "model.layers.1.self_attn.k_proj.weight", &k, &err),
                 QRL_OK);
    cr_assert_eq(k.shape[0], 64); /* GQA: 4 kv heads * 16 */
    cr_assert_eq(k.shape[1], 128);
    cr_assert_eq(qrl_safetensors_get(st, "model.norm.weight", &norm, &err), QRL_OK);
    float v[4];
    qrl_convert_to_f32(norm.dtype, norm.data, v, 4);
    /* decoded independently (Python struct) when the test was written */
    cr_assert_eq(v[0], 0.640625f);
    cr_assert_eq(v[1], 0.69921875f);
    cr_assert_eq(v[2], 0.68359375f);
    cr_assert_eq(v[3], 0.6484375f);

    /* the folder opens the same checkpoint */
    char folder[512];
    snprintf(folder, sizeof folder, "%.*s", (int)(strrchr(path, '/') - path), path);
    qrl_safetensors *st2;
    cr_assert_eq(qrl_safetensors_open(folder, &st2, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_count(st2), 20);
    qrl_safetensors_close(st2);

    /* the F32 copy of the model holds exactly the BF16 values widened */
    if (qrl_test_data_path("tinystories_656k_f32/model.safetensors", f32path, sizeof f32path)) {
        qrl_safetensors *s32;
        cr_assert_eq(qrl_safetensors_open(f32path, &s32, &err), QRL_OK, "%s", err.msg);
        qrl_tensor head;
        cr_assert_eq(qrl_safetensors_get(s32, "lm_head.weight", &head, &err), QRL_OK);
        cr_assert_eq(head.dtype, QRL_DTYPE_F32);
        size_t n = (size_t)qrl_tensor_numel(&emb);
        cr_assert_eq((size_t)qrl_tensor_numel(&head), n);
        float *a = malloc(n * 4), *b = malloc(n * 4);
        cr_assert_eq(qrl_convert_to_f32(emb.dtype, emb.data, a, n), QRL_OK);
        cr_assert_eq(qrl_convert_to_f32(head.dtype, head.data, b, n), QRL_OK);
        cr_assert_eq(memcmp(a, b, n * 4), 0);
        free(a);
        free(b);
        qrl_safetensors_close(s32);
    }
    qrl_safetensors_close(st);
}

/* ---- bad input: each names the file and the field ----------------------------------------- */

Test(safetensors, truncated_below_8_bytes) {
    char p[512];
    qrl_test_write(dir, "short.safetensors", "\x10\x00\x00", 3, p);
    expect_error(p, QRL_STATUS_CORRUPT, "header_length", "3 bytes", NULL);
    qrl_test_write(dir, "empty.safetensors", "", 0, p);
    expect_error(p, QRL_STATUS_CORRUPT, "header_length", "0 bytes", NULL);
}

Test(safetensors, header_cut_short) {
    /* the length promises 58 bytes of JSON; the file ends after 20 */
    char p[512];
    qrl_test_write(dir, "cut.safetensors",
                   "\x3a\x00\x00\x00\x00\x00\x00\x00{\"x\":{\"dtype\":\"F3", 24, p);
    expect_error(p, QRL_STATUS_CORRUPT, "header_length", "58 bytes", NULL);
    /* a length that stops inside the JSON text */
    write_st("cut2.safetensors", "{\"x\":{\"dtype\":", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "field header", "invalid JSON", NULL);
}

Test(safetensors, header_length_larger_than_file) {
    char p[512];
    qrl_test_write(dir, "huge.safetensors", "\x00\x00\x00\x00\x00\x01\x00\x00{}", 10, p);
    expect_error(p, QRL_STATUS_CORRUPT, "header_length", "1099511627776", NULL);
}

Test(safetensors, tensor_range_exceeds_file) {
    char p[512];
    write_st("range.safetensors",
             "{\"w1\":{\"dtype\":\"F32\",\"shape\":[50],\"data_offsets\":[100,300]}}",
             "0123456789abcdef", 16, p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'w1' field data_offsets",
                 "[100, 300) exceeds the data region (16 bytes)", NULL);
}

Test(safetensors, overlapping_tensors) {
    char p[512];
    write_st("overlap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"z\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[12,16]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             "0123456789abcdef", 16, p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'b' field data_offsets", "overlaps tensor 'a'",
                 NULL);
    /* touching ranges and an empty tensor inside another's range are fine */
    write_st("touch.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
             "0123456789abcdef", 16, p);
    qrl_safetensors *st;
    qrl_error err;
    cr_assert_eq(qrl_safetensors_open(p, &st, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_safetensors_count(st), 3);
    qrl_safetensors_close(st);
}

Test(safetensors, unknown_dtype) {
    char p[512];
    write_st("dtype.safetensors",
             "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,2]}}",
             "ab", 2, p);
    expect_error(p, QRL_STATUS_UNSUPPORTED, "tensor 'w' field dtype", "'Q4_K'", NULL);
    write_st("dtype2.safetensors",
             "{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}",
             "ab", 2, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field dtype", NULL);
    write_st("dtype3.safetensors", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,2]}}", "ab", 2, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field dtype", "missing", NULL);
}

Test(safetensors, shape_size_mismatch) {
    char p[512];
    write_st("size.safetensors",
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}",
             "01234567", 8, p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'w' field data_offsets", "holds 8 bytes",
                 "need 6", NULL);
}

Test(safetensors, invalid_json) {
    char p[512];
    write_st("json.safetensors", "{\"w\": [1, 2,, }", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "field header", "invalid JSON", NULL);
    write_st("array.safetensors", "[1, 2]", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "field header", "must be a JSON object", NULL);
    write_st("dupkey.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
             "ab", 2, p);
    expect_error(p, QRL_STATUS_PARSE, "field header", "duplicate", NULL);
    write_st("entry.safetensors", "{\"w\": 5}", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field entry", NULL);
}

Test(safetensors, negative_or_non_integer_shape) {
    char p[512];
    write_st("neg.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,0]}}",
             NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field shape", "element 1 is -1", NULL);
    write_st("real.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,0]}}",
             NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field shape", "element 0", NULL);
    write_st("str.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":\"2\",\"data_offsets\":[0,2]}}",
             "ab", 2, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field shape", NULL);
    write_st("dims.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", "a",
             1, p);
    expect_error(p, QRL_STATUS_UNSUPPORTED, "tensor 'w' field shape", "9 dimensions", NULL);
    write_st("ovf.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],"
             "\"data_offsets\":[0,0]}}",
             NULL, 0, p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'w' field shape", "overflows", NULL);
}

Test(safetensors, begin_after_end) {
    char p[512];
    write_st("order.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}",
             "abcd", 4, p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'w' field data_offsets", "begin 4 > end 2", NULL);
    write_st("three.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}",
             "abcd", 4, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field data_offsets", NULL);
    write_st("negoff.safetensors",
             "{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}",
             "abcd", 4, p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'w' field data_offsets", NULL);
}

Test(safetensors, metadata_must_be_strings) {
    char p[512];
    write_st("meta.safetensors", "{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "field __metadata__", "'step'", NULL);
    write_st("meta2.safetensors", "{\"__metadata__\":[1]}", NULL, 0, p);
    expect_error(p, QRL_STATUS_PARSE, "field __metadata__", NULL);
}

Test(safetensors, control_bytes_in_names_stay_on_one_line) {
    char p[512];
    write_st("nl.safetensors",
             "{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}",
             NULL, 0, p);
    expect_error(p, QRL_STATUS_UNSUPPORTED, "tensor 'a?b' field dtype", NULL);
}

Test(safetensors, missing_file_and_empty_folder) {
    char p[512];
    snprintf(p, sizeof p, "%s/none.safetensors", dir);
    expect_error(p, QRL_STATUS_IO, "cannot open", NULL);
    expect_error(dir, QRL_STATUS_NOT_FOUND, "model.safetensors.index.json", NULL);
}

/* ---- sharded checkpoints -------------------------------------------------------------------- */

static void write_shards(void) {
    char p[512];
    write_st("model-00001-of-00002.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
             "ABC", 3, p);
    write_st("model-00002-of-00002.safetensors",
             "{\"c\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", "wxyz", 4, p);
}

Test(safetensors, sharded_index_opens_every_shard) {
    write_shards();
    const char *index = "{\"metadata\":{\"total_size\":7},\"weight_map\":{"
                        "\"a\":\"model-00001-of-00002.safetensors\","
                        "\"b\":\"model-00001-of-00002.safetensors\","
                        "\"c\":\"model-00002-of-00002.safetensors\"}}";
    char p[512];
    qrl_test_write(dir, "model.safetensors.index.json", index, strlen(index), p);
    for (int via_dir = 0; via_dir < 2; via_dir++) {
        qrl_safetensors *st;
        qrl_error err;
        cr_assert_eq(qrl_safetensors_open(via_dir ? dir : p, &st, &err), QRL_OK, "%s", err.msg);
        cr_assert_eq(qrl_safetensors_count(st), 3);
        qrl_tensor t;
        cr_assert_eq(qrl_safetensors_get(st, "c", &t, &err), QRL_OK);
        cr_assert_eq(t.shape[0], 2);
        cr_assert_eq(memcmp(t.data, "wxyz", 4), 0);
        cr_assert_eq(qrl_safetensors_get(st, "b", &t, &err), QRL_OK);
        cr_assert_eq(memcmp(t.data, "C", 1), 0);
        cr_assert_str_eq(qrl_safetensors_metadata(st, "format"), "pt");
        qrl_safetensors_close(st);
    }
}

Test(safetensors, sharded_index_missing_shard) {
    write_shards();
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"d\":\"model-00003-of-00002.safetensors\"}}";
    char p[512];
    qrl_test_write(dir, "model.safetensors.index.json", index, strlen(index), p);
    expect_error(p, QRL_STATUS_IO, "tensor 'd' field weight_map",
                 "cannot open shard", "model-00003-of-00002.safetensors", NULL);
}

Test(safetensors, sharded_index_missing_tensor) {
    write_shards();
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"zz\":\"model-00002-of-00002.safetensors\"}}";
    char p[512];
    qrl_test_write(dir, "model.safetensors.index.json", index, strlen(index), p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'zz' field weight_map",
                 "not found in shard 'model-00002-of-00002.safetensors'", NULL);
    /* named in the wrong shard */
    const char *wrong = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"b\":\"model-00002-of-00002.safetensors\"}}";
    qrl_test_write(dir, "model.safetensors.index.json", wrong, strlen(wrong), p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'b' field weight_map", "it is in", NULL);
}

Test(safetensors, sharded_duplicate_tensor_across_shards) {
    write_shards();
    char p[512];
    write_st("model-00002-of-00002.safetensors",
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", "xy", 2, p);
    const char *index = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                        "\"b\":\"model-00002-of-00002.safetensors\"}}";
    qrl_test_write(dir, "model.safetensors.index.json", index, strlen(index), p);
    expect_error(p, QRL_STATUS_CORRUPT, "tensor 'a' field name", "present in both", NULL);
}

Test(safetensors, sharded_index_malformed) {
    char p[512];
    const char *nomap = "{\"metadata\":{}}";
    qrl_test_write(dir, "model.safetensors.index.json", nomap, strlen(nomap), p);
    expect_error(p, QRL_STATUS_NOT_FOUND, "field 'weight_map'", NULL);
    const char *badval = "{\"weight_map\":{\"a\":3}}";
    qrl_test_write(dir, "model.safetensors.index.json", badval, strlen(badval), p);
    expect_error(p, QRL_STATUS_PARSE, "tensor 'a' field weight_map", NULL);
    const char *badjson = "{\"weight_map\":\n{\"a\":}}";
    qrl_test_write(dir, "model.safetensors.index.json", badjson, strlen(badjson), p);
    expect_error(p, QRL_STATUS_PARSE, "index.json:2:", NULL);
    /* a broken shard is reported with the shard's own file name and field */
    write_st("s.safetensors",
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
             "ab", 2, p);
    const char *idx = "{\"weight_map\":{\"a\":\"s.safetensors\"}}";
    qrl_test_write(dir, "model.safetensors.index.json", idx, strlen(idx), p);
    qrl_safetensors *st;
    qrl_error err;
    cr_assert_eq(qrl_safetensors_open(p, &st, &err), QRL_STATUS_CORRUPT);
    cr_assert_not_null(strstr(err.msg, "s.safetensors: tensor 'a' field data_offsets"), "%s",
                       err.msg);
}
