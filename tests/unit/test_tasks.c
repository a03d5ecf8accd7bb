/* Built-in tasks (common/tasks/tasks.h): generator determinism, disjoint splits, every
 * worked solution verifying with reward 1 (a corrupted one with 0), the name-twice
 * verifier, and the character tokenizer's round trip. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tasks/tasks.h"
#include "tokenizer/tokenizer.h"
#include "verify/verify.h"

static double score(const char *task, const char *response, const char *reference) {
    qrl_verify_result r;
    qrl_error err;
    cr_assert_eq(qrl_verifier_find(task)->score(response, reference, &r, &err), QRL_OK, "%s", err.msg);
    return r.reward;
}

Test(tasks, arith_worked_example_by_hand) {
    qrl_task_item it;
    qrl_task_arith_format(4173, 2958, &it);
    cr_assert_str_eq(it.prompt, "4173+2958=");
    cr_assert_str_eq(it.answer, "7131");
    /* 3+8=11 carry; 7+5+1=13 carry; 1+9+1=11 carry; 4+2+1=7 */
    cr_assert_str_eq(it.solution, "3+8=11\n7+5+1=13\n1+9+1=11\n4+2+1=7\n#### 7131");
    qrl_task_arith_format(999, 1, &it); /* operands of different lengths, carry out */
    cr_assert_str_eq(it.solution, "9+1=10\n9+0+1=10\n9+0+1=10\n#### 1000");
}

Test(tasks, arith_deterministic_and_seed_dependent) {
    qrl_task_arith_params p = {.min_digits = 2, .max_digits = 4};
    qrl_task_item a, b;
    qrl_error err;
    int differ = 0;
    for (uint64_t i = 0; i < 200; i++) {
        cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 7, i, &a, &err), QRL_OK);
        cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 7, i, &b, &err), QRL_OK);
        cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "item %llu differs between calls", (unsigned long long)i);
        cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 8, i, &b, &err), QRL_OK);
        differ += strcmp(a.prompt, b.prompt) != 0;
        /* digits within [2, 4] for both operands */
        unsigned x, y;
        cr_assert_eq(sscanf(a.prompt, "%u+%u=", &x, &y), 2);
        cr_assert(x >= 10 && x <= 9999 && y >= 10 && y <= 9999, "%s", a.prompt);
        cr_assert_eq((x >= 100) + (x >= 1000), (y >= 100) + (y >= 1000), "same digit count: %s", a.prompt);
    }
    cr_assert_gt(differ, 190, "seeds 7 and 8 gave %d/200 different prompts", differ);
    p.max_digits = 10;
    cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 7, 0, &a, &err), QRL_STATUS_INVALID_ARGUMENT);
    p = (qrl_task_arith_params){.min_digits = 3, .max_digits = 2};
    cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 7, 0, &a, &err), QRL_STATUS_INVALID_ARGUMENT);
}

/* Splits are disjoint across seeds, and the test split is ~10% of all pairs. */
Test(tasks, arith_splits_disjoint) {
    qrl_task_arith_params p = {.min_digits = 2, .max_digits = 2};
    qrl_error err;
    static char seen[100][100];
    qrl_task_item it;
    for (uint64_t i = 0; i < 3000; i++) {
        cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TRAIN, 1, i, &it, &err), QRL_OK);
        unsigned a, b;
        cr_assert_eq(sscanf(it.prompt, "%u+%u=", &a, &b), 2);
        seen[a][b] |= 1;
        cr_assert_eq(qrl_task_arith_item(&p, QRL_TASK_SPLIT_TEST, 2, i, &it, &err), QRL_OK);
        cr_assert_eq(sscanf(it.prompt, "%u+%u=", &a, &b), 2);
        seen[a][b] |= 2;
    }
    int test = 0, train = 0;
    for (int a = 10; a < 100; a++)
        for (int b = 10; b < 100; b++) {
            cr_assert_neq(seen[a][b], 3, "%d+%d in both splits", a, b);
            int t = qrl_task_arith_split_of((uint64_t)a, (uint64_t)b) == QRL_TASK_SPLIT_TEST;
            test += t, train += !t;
            if (seen[a][b]) cr_assert_eq(seen[a][b], t ? 2 : 1, "%d+%d generated in the wrong split", a, b);
        }
    double frac = (double)test / (test + train);
    cr_assert(frac > 0.07 && frac < 0.13, "test fraction %.3f of 8100 pairs", frac);
}

Test(tasks, arith_solutions_verify_and_corruptions_fail) {
    qrl_task_arith_params p = {.min_digits = 1, .max_digits = 9};
    qrl_error err;
    qrl_task_item it;
    for (uint64_t i = 0; i < 500; i++) {
        cr_assert_eq(qrl_task_arith_item(&p, i % 2 ? QRL_TASK_SPLIT_TEST : QRL_TASK_SPLIT_TRAIN, 3, i, &it, &err), QRL_OK);
        unsigned long long a, b;
        cr_assert_eq(sscanf(it.prompt, "%llu+%llu=", &a, &b), 2);
        char want[32];
        snprintf(want, sizeof want, "%llu", a + b);
        cr_assert_str_eq(it.answer, want);
        cr_assert_eq(score("arith", it.solution, it.answer), 1.0, "%s -> %s", it.prompt, it.solution);
        /* change the last digit of the final answer */
        char bad[sizeof it.solution];
        strcpy(bad, it.solution);
        char *last = bad + strlen(bad) - 1;
        *last = *last == '9' ? '0' : (char)(*last + 1);
        cr_assert_eq(score("arith", bad, it.answer), 0.0, "%s", bad);
        /* the steps alone (no #### line) give no answer */
        strcpy(bad, it.solution);
        *strstr(bad, "####") = '\0';
        cr_assert_eq(score("arith", bad, it.answer), 0.0, "%s", bad);
    }
}

Test(tasks, story_items) {
    qrl_task_item a, b;
    qrl_error err;
    int seen_test = 0;
    for (uint64_t i = 0; i < 300; i++) {
        cr_assert_eq(qrl_task_story_item(QRL_TASK_SPLIT_TRAIN, 5, i, 300, &a, &err), QRL_OK);
        cr_assert_eq(qrl_task_story_item(QRL_TASK_SPLIT_TRAIN, 5, i, 300, &b, &err), QRL_OK);
        cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
        cr_assert(strncmp(a.prompt, "Once upon a time, there was a", 29) == 0, "%s", a.prompt);
        cr_assert_str_eq(a.solution, "");
        char name[32];
        cr_assert_eq(sscanf(a.answer, "{\"name\":\"%31[A-Za-z]\",\"max_chars\":300}", name), 1, "%s", a.answer);
        char tail[64];
        snprintf(tail, sizeof tail, " named %s.", name);
        cr_assert(strstr(a.prompt, tail) && strlen(strstr(a.prompt, tail)) == strlen(tail), "%s", a.prompt);
        cr_assert_eq(qrl_task_story_item(QRL_TASK_SPLIT_TEST, 5, i, 300, &b, &err), QRL_OK);
        cr_assert_str_neq(a.prompt, b.prompt, "a prompt in both splits");
        seen_test += strstr(b.prompt, "named") != NULL;
    }
    cr_assert_eq(seen_test, 300);
    cr_assert_eq(qrl_task_story_item(QRL_TASK_SPLIT_TRAIN, 5, 0, 0, &a, &err), QRL_STATUS_INVALID_ARGUMENT);
}

Test(tasks, name_twice_verifier) {
    const char *ref = "{\"name\":\"Lily\",\"max_chars\":80}";
    cr_assert_eq(score("name-twice", " Lily liked to play. Lily was happy.", ref), 1.0);
    cr_assert_eq(score("name-twice", "Lily's ball was red. Lily smiled!\n", ref), 1.0);
    cr_assert_eq(score("name-twice", "Lily said \"hi\". Then Lily said \"bye.\"", ref), 1.0);
    cr_assert_eq(score("name-twice", "Lily liked to play. She was happy.", ref), 0.0);        /* once */
    cr_assert_eq(score("name-twice", "Lilyanne and Lily played.", ref), 0.0);                  /* not a word */
    cr_assert_eq(score("name-twice", "lily and LILY played.", ref), 0.0);                     /* case */
    cr_assert_eq(score("name-twice", "Lily liked to play. Lily ran to the", ref), 0.0);        /* unfinished */
    cr_assert_eq(score("name-twice", "Lily and Lily played in the big green park all day long with a ball.", ref),
                 1.0); /* 68 chars: fits */
    cr_assert_eq(score("name-twice", "Lily and Lily played in the big green park all day long with a ball and a dog too.", ref),
                 0.0); /* 82 > 80 */
    cr_assert_eq(score("name-twice", "", ref), 0.0);
    /* bare-name reference, default max_chars 400 */
    cr_assert_eq(score("name-twice", "Tom ran. Tom sat.", "Tom"), 1.0);
    qrl_verify_result r;
    qrl_error err;
    const qrl_verifier *v = qrl_verifier_find("name-twice");
    cr_assert_eq(v->score("x", "", &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(v->score("x", "{\"name\":\"\"}", &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(v->score("x", "{\"name\":\"A\",\"max_chars\":0}", &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(v->score("x", "{\"name\":", &r, &err), QRL_STATUS_PARSE);
    cr_assert_eq(r.reward, 0.0);
}

Test(tasks, char_tokenizer_round_trip) {
    char dir[] = "/tmp/qrl_test_tasks_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    qrl_error err;
    cr_assert_eq(qrl_task_write_char_tokenizer(dir, &err), QRL_OK, "%s", err.msg);
    char buf[4096];
    cr_assert_str_eq(qrl_tokenizer_find_default(dir, QRL_TASK_CHAR_VOCAB, buf, sizeof buf), dir);
    qrl_tokenizer *tok;
    cr_assert_eq(qrl_tokenizer_load(dir, QRL_TASK_CHAR_VOCAB, &tok, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_tokenizer_vocab_size(tok), QRL_TASK_CHAR_VOCAB);
    cr_assert_eq(qrl_tokenizer_bos(tok), QRL_TASK_CHAR_BOS);
    cr_assert_eq(qrl_tokenizer_eos(tok), QRL_TASK_CHAR_EOS);
    cr_assert_str_eq(qrl_tokenizer_chat_template_name(tok), "plain");
    const char *s = "4173+2958=3+8=11\n7+5+1=13\n#### 7131  Once upon a time, \"Lily\" ran {~}!";
    int32_t *ids;
    size_t n;
    cr_assert_eq(qrl_tokenizer_encode(tok, s, strlen(s), true, false, &ids, &n, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(n, strlen(s) + 1, "one id per character plus BOS");
    cr_assert_eq(ids[0], QRL_TASK_CHAR_BOS);
    for (size_t i = 0; i < strlen(s); i++)
        cr_assert_eq(ids[i + 1], s[i] == '\n' ? 3 : 4 + s[i] - 0x20, "char %zu '%c'", i, s[i]);
    char *text;
    cr_assert_eq(qrl_tokenizer_decode(tok, ids, n, true, &text, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(text, s);
    free(text);
    free(ids);
    /* a character outside the vocabulary is <unk> (0) */
    cr_assert_eq(qrl_tokenizer_encode(tok, "a\tb", 3, false, false, &ids, &n, &err), QRL_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[1], 0);
    free(ids);
    qrl_tokenizer_free(tok);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
    cr_assert_eq(qrl_task_write_char_tokenizer("/nonexistent/qrl", &err), QRL_STATUS_IO);
}
