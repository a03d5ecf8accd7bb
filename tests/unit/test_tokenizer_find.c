#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "support/test_files.h"
#include "tokenizer/tokenizer.h"

Test(tokenizer_find, default_beside_model) {
    char buf[4096], dir[64], bin[512], tok[512], empty[512];
    qrl_test_mkdtemp(dir);
    /* llama2.c: tokenizer.bin first, then tok<vocab>.bin, else none */
    snprintf(bin, sizeof bin, "%s/model.bin", dir);
    cr_assert_null(qrl_tokenizer_find_default(bin, 512, buf, sizeof buf));
    qrl_test_write(dir, "tok512.bin", "x", 1, tok);
    cr_assert_str_eq(qrl_tokenizer_find_default(bin, 512, buf, sizeof buf), tok);
    cr_assert_null(qrl_tokenizer_find_default(bin, 32000, buf, sizeof buf));
    qrl_test_write(dir, "tokenizer.bin", "x", 1, tok);
    cr_assert_str_eq(qrl_tokenizer_find_default(bin, 32000, buf, sizeof buf), tok);
    /* HF folder: itself when it holds tokenizer.json / vocab.json */
    snprintf(empty, sizeof empty, "%s/hf", dir);
    cr_assert_eq(mkdir(empty, 0755), 0);
    cr_assert_null(qrl_tokenizer_find_default(empty, 512, buf, sizeof buf));
    /* an exported llama2.c model: the folder's tokenizer.bin, until a tokenizer.json */
    qrl_test_write(empty, "tokenizer.bin", "x", 1, tok);
    cr_assert_str_eq(qrl_tokenizer_find_default(empty, 512, buf, sizeof buf), tok);
    qrl_test_write(empty, "vocab.json", "{}", 2, tok);
    cr_assert_eq(qrl_tokenizer_find_default(empty, 512, buf, sizeof buf), empty);
    qrl_test_rmtree(dir);
}
