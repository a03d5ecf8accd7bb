/* CRC-32 (common/core/crc32.h).  Expected values are zlib's (python3 -c "import zlib;
 * print(hex(zlib.crc32(b'...')))"), never computed by the code under test. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/crc32.h"

Test(crc32, check_value_and_zlib_vectors) {
    cr_expect_eq(qrl_crc32(0, "123456789", 9), 0xCBF43926u); /* the catalogue check value */
    cr_expect_eq(qrl_crc32(0, "a", 1), 0xE8B7BE43u);
    const char *fox = "The quick brown fox jumps over the lazy dog";
    cr_expect_eq(qrl_crc32(0, fox, strlen(fox)), 0x414FA339u);
    uint8_t zeros[32] = {0}, ones[32], all[256];
    memset(ones, 0xFF, sizeof ones);
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    cr_expect_eq(qrl_crc32(0, zeros, sizeof zeros), 0x190A55ADu);
    cr_expect_eq(qrl_crc32(0, ones, sizeof ones), 0xFF6CAB0Bu);
    cr_expect_eq(qrl_crc32(0, all, sizeof all), 0x29058C73u);
}

Test(crc32, empty_input_returns_the_running_value) {
    cr_expect_eq(qrl_crc32(0, NULL, 0), 0u);
    cr_expect_eq(qrl_crc32(0, "", 0), 0u);
    cr_expect_eq(qrl_crc32(0xCBF43926u, NULL, 0), 0xCBF43926u);
}

Test(crc32, incremental_equals_one_shot_at_every_split) {
    uint8_t buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 131u + 7u);
    const uint32_t whole = qrl_crc32(0, buf, sizeof buf);
    for (size_t cut = 0; cut <= sizeof buf; cut++) {
        uint32_t c = qrl_crc32(qrl_crc32(0, buf, cut), buf + cut, sizeof buf - cut);
        cr_assert_eq(c, whole, "split at %zu: 0x%08x != 0x%08x", cut, c, whole);
    }
    /* three pieces, one of them empty */
    uint32_t c = qrl_crc32(0, "1234", 4);
    c = qrl_crc32(c, NULL, 0);
    c = qrl_crc32(c, "56789", 5);
    cr_expect_eq(c, 0xCBF43926u);
}
