/* TensorBoard event files (common/metrics/tfevents.h).  The file is read back with a
 * decoder written here from the TFRecord and protobuf wire-format specs (a bitwise
 * CRC-32C, not the library's table/SSE4.2 one); TensorBoard itself is not installed on
 * the build machine, so this is verification by format reading. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "metrics/tfevents.h"

/* ---- independent reference ----------------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected 0x82F63B78), one bit at a time. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}
static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

Test(tfrecord, bitwise_crc32c_matches_published_vectors) {
    /* the catalogue check value and RFC 3720 appendix B.4 */
    cr_expect_eq(crc32c_bitwise((const uint8_t *)"123456789", 9), 0xE3069283u);
    uint8_t z[32] = {0}, f[32], inc[32];
    memset(f, 0xFF, sizeof f);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    cr_expect_eq(crc32c_bitwise(z, 32), 0x8A9136AAu);
    cr_expect_eq(crc32c_bitwise(f, 32), 0x62A8AB43u);
    cr_expect_eq(crc32c_bitwise(inc, 32), 0x46DD794Eu);
}

Test(tfrecord, masked_crc_matches_the_spec_formula) {
    /* 0xE3069283 rotated right by 15 is 0x2507C60D; + 0xa282ead8 = 0xC78AB0E5 (by hand) */
    cr_expect_eq(qrl_tfrecord_masked_crc("123456789", 9), 0xC78AB0E5u);
    cr_expect_eq(mask(0xE3069283u), 0xC78AB0E5u);
    uint8_t buf[777];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 151u + 3u);
    for (size_t n = 0; n <= sizeof buf; n += 37)
        cr_expect_eq(qrl_tfrecord_masked_crc(buf, n), mask(crc32c_bitwise(buf, n)), "n=%zu", n);
}

/* ---- reader -------------------------------------------------------------------------- */

typedef struct rd_value {
    char tag[64];
    float value;
} rd_value;

typedef struct rd_event {
    double wall_time;
    int64_t step;
    char file_version[32];
    rd_value v[32];
    int n;
} rd_event;

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Read a varint at *p (< end); fails the test on truncation. */
static uint64_t varint(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        cr_assert(*p < end, "truncated varint");
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    cr_assert_fail("varint over 10 bytes");
    return 0;
}

static void decode_value(const uint8_t *p, const uint8_t *end, rd_value *v) {
    memset(v, 0, sizeof *v);
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            cr_assert(n < sizeof v->tag && p + n <= end);
            memcpy(v->tag, p, n);
            p += n;
        } else if (key == (2 << 3 | 5)) {
            cr_assert(p + 4 <= end);
            uint32_t b = (uint32_t)le(p, 4);
            memcpy(&v->value, &b, 4);
            p += 4;
        } else {
            cr_assert_fail("Summary.Value: unexpected key %llu", (unsigned long long)key);
        }
    }
}

static void decode_event(const uint8_t *p, const uint8_t *end, rd_event *e) {
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = varint(&p, end);
        switch (key) {
        case 1 << 3 | 1: { /* wall_time */
            cr_assert(p + 8 <= end);
            uint64_t b = le(p, 8);
            memcpy(&e->wall_time, &b, 8);
            p += 8;
            break;
        }
        case 2 << 3 | 0: e->step = (int64_t)varint(&p, end); break;
        case 3 << 3 | 2: {
            uint64_t n = varint(&p, end);
            cr_assert(n < sizeof e->file_version && p + n <= end);
            memcpy(e->file_version, p, n);
            p += n;
            break;
        }
        case 5 << 3 | 2: { /* Summary */
            uint64_t n = varint(&p, end);
            cr_assert(p + n <= end);
            const uint8_t *s = p, *se = p + n;
            while (s < se) {
                cr_assert_eq(varint(&s, se), 1 << 3 | 2, "Summary: expected field 1 (value)");
                uint64_t vn = varint(&s, se);
                cr_assert(s + vn <= se && e->n < 32);
                decode_value(s, s + vn, &e->v[e->n++]);
                s += vn;
            }
            p = se;
            break;
        }
        default: cr_assert_fail("Event: unexpected key %llu", (unsigned long long)key);
        }
    }
}

/* Parse every TFRecord of `path`; returns false (and says why in `why`) on a bad CRC. */
static bool read_events(const char *path, rd_event *ev, int max, int *n, char *why) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)size + 1);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    bool ok = true;
    *n = 0;
    for (long off = 0; off < size;) {
        cr_assert(off + 12 <= size, "truncated header at %ld", off);
        uint64_t len = le(buf + off, 8);
        if ((uint32_t)le(buf + off + 8, 4) != mask(crc32c_bitwise(buf + off, 8))) {
            sprintf(why, "length crc at %ld", off);
            ok = false;
            break;
        }
        cr_assert(off + 12 + (long)len + 4 <= size, "truncated record at %ld", off);
        const uint8_t *data = buf + off + 12;
        if ((uint32_t)le(data + len, 4) != mask(crc32c_bitwise(data, len))) {
            sprintf(why, "data crc at %ld", off);
            ok = false;
            break;
        }
        cr_assert(*n < max);
        decode_event(data, data + len, &ev[(*n)++]);
        off += 12 + (long)len + 4;
    }
    free(buf);
    return ok;
}

static char tmpdir[64];

static void make_tmp(void) {
    strcpy(tmpdir, "/tmp/qrl_tfevents_XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}
static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tfevents, .init = make_tmp, .fini = rm_tmp);

Test(tfevents, scalars_read_back_through_an_independent_decoder) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/runs/a/b", tmpdir); /* missing parents are made */
    qrl_tfevents_t *w;
    qrl_error err;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    cr_assert_eq(qrl_tfevents_open(dir, &w, &err), QRL_OK, "%s", err.msg);
    qrl_tfevents_scalar s1[] = {{"reward_mean", 0.375f}, {"loss", -1.5e-3f}, {"learner/kl", 1e-7f}};
    qrl_tfevents_scalar s2[] = {{"reward_mean", 0.5f}};
    cr_assert_eq(qrl_tfevents_write_scalars(w, 1, 1700000000.25, s1, 3, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tfevents_write_scalars(w, 300, 1700000001.5, s2, 1, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tfevents_write_scalars(w, 5000000000LL, 0, NULL, 0, &err), QRL_OK, "%s", err.msg);
    char path[512];
    snprintf(path, sizeof path, "%s", qrl_tfevents_path(w));
    /* readable before close: each event is written through at once */
    rd_event ev[8];
    int n;
    char why[64];
    cr_assert(read_events(path, ev, 8, &n, why), "%s", why);
    cr_expect_eq(n, 4);
    qrl_tfevents_close(w);

    /* name: events.out.tfevents.<10-digit secs>.<host> in dir */
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char want[512];
    snprintf(want, sizeof want, "%s/events.out.tfevents.%010ld.%s", dir, (long)tv.tv_sec, host);
    if (strcmp(path, want) != 0) /* the second may have turned over since */
        snprintf(want, sizeof want, "%s/events.out.tfevents.%010ld.%s", dir, (long)tv.tv_sec + 1, host);
    cr_expect_str_eq(path, want);

    cr_assert(read_events(path, ev, 8, &n, why), "%s", why);
    cr_assert_eq(n, 4);
    cr_expect_str_eq(ev[0].file_version, "brain.Event:2");
    cr_expect(fabs(ev[0].wall_time - ((double)tv.tv_sec + tv.tv_usec / 1e6)) < 5, "wall_time %f", ev[0].wall_time);
    cr_expect_eq(ev[0].step, 0);
    cr_expect_eq(ev[0].n, 0);
    cr_expect_eq(ev[1].wall_time, 1700000000.25);
    cr_expect_eq(ev[1].step, 1);
    cr_expect_str_eq(ev[1].file_version, "");
    cr_assert_eq(ev[1].n, 3);
    cr_expect_str_eq(ev[1].v[0].tag, "reward_mean");
    cr_expect_eq(ev[1].v[0].value, 0.375f);
    cr_expect_str_eq(ev[1].v[1].tag, "loss");
    cr_expect_eq(ev[1].v[1].value, -1.5e-3f);
    cr_expect_str_eq(ev[1].v[2].tag, "learner/kl");
    cr_expect_eq(ev[1].v[2].value, 1e-7f);
    cr_expect_eq(ev[2].step, 300);
    cr_expect_eq(ev[2].wall_time, 1700000001.5);
    cr_assert_eq(ev[2].n, 1);
    cr_expect_eq(ev[2].v[0].value, 0.5f);
    cr_expect_eq(ev[3].step, 5000000000LL); /* a multi-byte varint */
    cr_expect(fabs(ev[3].wall_time - (double)tv.tv_sec) < 5); /* 0 = now */
    cr_expect_eq(ev[3].n, 0);

    /* the reader does fail: one flipped bit in the last record's payload */
    FILE *f = fopen(path, "r+b");
    fseek(f, -6, SEEK_END);
    int c = fgetc(f);
    fseek(f, -6, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
    cr_expect_not(read_events(path, ev, 8, &n, why));
    cr_expect(strstr(why, "data crc") != NULL, "%s", why);
}

Test(tfevents, first_record_bytes) {
    /* The file_version record of a file opened now: Event{1: wall_time, 3: "brain.Event:2"}
     * is 9 + 2 + 13 = 24 bytes of data, so the record is 8 + 4 + 24 + 4 bytes. */
    qrl_tfevents_t *w;
    qrl_error err;
    cr_assert_eq(qrl_tfevents_open(tmpdir, &w, &err), QRL_OK, "%s", err.msg);
    FILE *f = fopen(qrl_tfevents_path(w), "rb");
    uint8_t b[64];
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    cr_assert_eq(n, 40u);
    cr_expect_eq(le(b, 8), 24u);
    cr_expect_eq(b[12], 0x09); /* field 1, fixed64 */
    cr_expect_eq(b[21], 0x1a); /* field 3, length-delimited */
    cr_expect_eq(b[22], 13);
    cr_expect(memcmp(b + 23, "brain.Event:2", 13) == 0);
    qrl_tfevents_close(w);
    qrl_tfevents_close(NULL);
}

Test(tfevents, two_writers_in_one_dir_get_two_files) {
    qrl_tfevents_t *a, *b;
    qrl_error err;
    cr_assert_eq(qrl_tfevents_open(tmpdir, &a, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tfevents_open(tmpdir, &b, &err), QRL_OK, "%s", err.msg);
    cr_expect_str_neq(qrl_tfevents_path(a), qrl_tfevents_path(b));
    cr_expect(strstr(qrl_tfevents_path(b), "tfevents") != NULL);
    qrl_tfevents_close(a);
    qrl_tfevents_close(b);
}

Test(tfevents, errors) {
    qrl_tfevents_t *w;
    qrl_error err;
    char file[128], under[160];
    snprintf(file, sizeof file, "%s/plain", tmpdir);
    FILE *f = fopen(file, "w");
    fclose(f);
    cr_expect_eq(qrl_tfevents_open(file, &w, &err), QRL_STATUS_IO);
    cr_expect(strstr(err.msg, "plain") != NULL, "%s", err.msg);
    cr_expect_null(w);
    snprintf(under, sizeof under, "%s/sub", file); /* a parent that is a file */
    cr_expect_eq(qrl_tfevents_open(under, &w, &err), QRL_STATUS_IO);
    cr_expect(strstr(err.msg, "mkdir") != NULL, "%s", err.msg);
    cr_expect_eq(qrl_tfevents_open("", &w, &err), QRL_STATUS_INVALID_ARGUMENT);

    cr_assert_eq(qrl_tfevents_open(tmpdir, &w, &err), QRL_OK, "%s", err.msg);
    qrl_tfevents_scalar bad[] = {{"ok", 1}, {"", 2}};
    cr_expect_eq(qrl_tfevents_write_scalars(w, 1, 0, bad, 2, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strstr(err.msg, "scalar 1") != NULL, "%s", err.msg);
    bad[1].tag = NULL;
    cr_expect_eq(qrl_tfevents_write_scalars(w, 1, 0, bad, 2, &err), QRL_STATUS_INVALID_ARGUMENT);
    /* nothing of the refused events reached the file */
    struct stat sb;
    cr_assert_eq(stat(qrl_tfevents_path(w), &sb), 0);
    cr_expect_eq(sb.st_size, 40);
    qrl_tfevents_close(w);
}
