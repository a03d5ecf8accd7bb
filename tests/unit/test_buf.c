/* common/core/buf.h: appends grow the buffer and keep it NUL-terminated; a zero-length
 * append makes an empty string; free resets. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/buf.h"

Test(buf, grows_and_stays_terminated) {
    qrl_buf b = {0};
    qrl_buf_append(&b, "", 0);
    cr_assert_not_null(b.p);
    cr_assert_str_eq(b.p, "");
    char chunk[100];
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < 50; i++) qrl_buf_append(&b, chunk, sizeof chunk); /* past 256 x 2^4 */
    cr_assert_eq(b.len, 5000);
    cr_assert_geq(b.cap, 5001);
    cr_assert_eq(b.p[5000], 0);
    cr_assert_eq(strlen(b.p), 5000);
    const unsigned char bin[3] = {0, 1, 2}; /* binary bytes, a NUL among them */
    qrl_buf_append(&b, bin, 3);
    cr_assert_eq(b.len, 5003);
    cr_assert_eq(memcmp(b.p + 5000, bin, 3), 0);
    cr_assert(!b.oom);
    qrl_buf_free(&b);
    cr_assert_null(b.p);
    cr_assert_eq(b.len, 0);
}
