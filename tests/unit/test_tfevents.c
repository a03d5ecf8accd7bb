/* TensorBoard event files (common/metrics/tfevents.h).  The file is read back with the
 * decoder of tests/support/tfevents_reader.h, written from the TFRecord and protobuf
 * wire-format specs (a bitwise CRC-32C, not the library's table/SSE4.2 one); TensorBoard
 * itself is not installed on the build machine, so this is verification by format reading. */
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
#include "support/tfevents_reader.h"

Test(tfrecord, bitwise_crc32c_matches_published_vectors) {
    /* the catalogue check value and RFC 3720 appendix B.4 */
    cr_expect_eq(tfr_crc32c_bitwise((const uint8_t *)"123456789", 9), 0xE3069283u);
    uint8_t z[32] = {0}, f[32], inc[32];
    memset(f, 0xFF, sizeof f);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    cr_expect_eq(tfr_crc32c_bitwise(z, 32), 0x8A9136AAu);
    cr_expect_eq(tfr_crc32c_bitwise(f, 32), 0x62A8AB43u);
    cr_expect_eq(tfr_crc32c_bitwise(inc, 32), 0x46DD794Eu);
}

Test(tfrecord, masked_crc_matches_the_spec_formula) {
    /* 0xE3069283 rotated right by 15 is 0x2507C60D; + 0xa282ead8 = 0xC78AB0E5 (by hand) */
    cr_expect_eq(qrl_tfrecord_masked_crc("123456789", 9), 0xC78AB0E5u);
    cr_expect_eq(tfr_mask(0xE3069283u), 0xC78AB0E5u);
    uint8_t buf[777];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 151u + 3u);
    for (size_t n = 0; n <= sizeof buf; n += 37)
        cr_expect_eq(qrl_tfrecord_masked_crc(buf, n), tfr_mask(tfr_crc32c_bitwise(buf, n)), "n=%zu", n);
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
    tfr_event ev[8];
    int n;
    char why[64];
    cr_assert(tfr_read_events(path, ev, 8, &n, why), "%s", why);
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

    cr_assert(tfr_read_events(path, ev, 8, &n, why), "%s", why);
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
    cr_expect_not(tfr_read_events(path, ev, 8, &n, why));
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
    cr_expect_eq(tfr_le(b, 8), 24u);
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
