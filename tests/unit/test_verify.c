/* Reward verifiers (common/verify, SPEC §7): the required real cases, extraction and
 * normalization rules, the synthetic tasks, error paths, and sweeps over the real
 * GSM8K / MATH-500 / AIME / AMC files with the datasets' own answers. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify/verify.h"
#include "verify/verify_internal.h"

/* ---- helpers ------------------------------------------------------------------------ */

static qrl_verify_result score(const char *task, const char *response, const char *reference) {
    const qrl_verifier *v = qrl_verifier_find(task);
    cr_assert_not_null(v, "verifier %s", task);
    qrl_verify_result r;
    qrl_error err;
    qrl_error_clear(&err);
    qrl_status st = v->score(response, reference, &r, &err);
    cr_assert_eq(st, QRL_OK, "%s(%s | %s): %s", task, response, reference, err.msg);
    return r;
}

static double reward(const char *task, const char *response, const char *reference) {
    return score(task, response, reference).reward;
}

static bool equal(const char *a, const char *b) {
    bool eq = false;
    cr_assert_eq(qrl_verify_math_equal(a, b, &eq, NULL), QRL_OK);
    return eq;
}

static const char *normalized(const char *a) {
    static char buf[256];
    cr_assert_eq(qrl_verify_normalize(a, buf, sizeof buf, NULL), QRL_OK);
    return buf;
}

/* ---- registry ----------------------------------------------------------------------- */

Test(verify, registry_names_and_alias) {
    const char *names[] = {"gsm8k", "math", "boxed", "arith", "countdown", "name-twice", "contains"};
    cr_assert_eq(qrl_verifier_count(), 7);
    for (size_t i = 0; i < 7; i++) {
        const qrl_verifier *v = qrl_verifier_find(names[i]);
        cr_assert_not_null(v, "%s", names[i]);
        cr_assert_str_eq(v->name, names[i]);
        cr_assert_eq(qrl_verifier_at(i), v);
    }
    cr_assert_eq(qrl_verifier_find("boxed")->score, qrl_verifier_find("math")->score);
    cr_assert_null(qrl_verifier_find("MATH"));
    cr_assert_null(qrl_verifier_find("nope"));
    cr_assert_null(qrl_verifier_find(NULL));
    cr_assert_null(qrl_verifier_at(7));
}

/* ---- the required real cases -------------------------------------------------------- */

Test(verify, required_cases) {
    cr_assert_eq(reward("math", "so \\boxed{\\frac{1}{2}}", "0.5"), 1.0);
    cr_assert_eq(reward("gsm8k", "They pay 1,000 in total.", "1000"), 1.0);
    cr_assert_eq(reward("gsm8k", "The answer is $18.00", "18"), 1.0);
    cr_assert_eq(reward("math", "$18.00", "\\boxed{18}"), 0.0); /* no box: math gives nothing */
    cr_assert_eq(reward("math", "\\boxed{\\$18.00}", "18"), 1.0);

    /* last box wins, and a box with nested braces */
    qrl_verify_result r = score("math", "First try \\boxed{2}, wrong. Final: \\boxed{\\frac{3}{4}}.", "\\frac34");
    cr_assert_eq(r.reward, 1.0);
    cr_assert_str_eq(r.extracted, "\\frac{3}{4}");
    cr_assert_eq(reward("math", "First try \\boxed{2}, wrong. Final: \\boxed{\\frac{3}{4}}.", "2"), 0.0);

    /* a reference that holds a box */
    cr_assert_eq(reward("math", "so \\boxed{5}", "\\boxed{5}"), 1.0);
    cr_assert_str_eq(normalized("\\boxed{5}"), "5");

    /* no final answer */
    r = score("gsm8k", "I am not sure how to solve this.", "42");
    cr_assert_eq(r.reward, 0.0);
    cr_assert_not(r.found);
    cr_assert_str_eq(r.extracted, "");
    r = score("math", "no box here", "42");
    cr_assert_not(r.found);

    /* a stray number with the math task */
    r = score("math", "The answer is 42", "42");
    cr_assert_eq(r.reward, 0.0);
    cr_assert_not(r.found);
    /* ... while gsm8k takes it */
    cr_assert_eq(reward("gsm8k", "The answer is 42", "42"), 1.0);
}

/* ---- extraction ---------------------------------------------------------------------- */

Test(verify, gsm8k_priority_hashes_then_box_then_last_number) {
    qrl_verify_result r = score("gsm8k", "\\boxed{5} and 7 later\n#### 6", "6");
    cr_assert_str_eq(r.extracted, "6");
    cr_assert_eq(r.reward, 1.0);
    r = score("gsm8k", "\\boxed{5} and then 7", "5");
    cr_assert_str_eq(r.extracted, "5");
    r = score("gsm8k", "3 apples and 4 pears make 7 fruits.", "7");
    cr_assert_str_eq(r.extracted, "7");
    cr_assert_eq(r.reward, 1.0);
    /* the line after ####: its first number, units and $ around it */
    r = score("gsm8k", "#### $1,250 dollars", "1250");
    cr_assert_str_eq(r.extracted, "1,250");
    cr_assert_eq(r.reward, 1.0);
    /* the reference may be a whole GSM8K answer text */
    cr_assert_eq(reward("gsm8k", "#### 70000", "He made 70,000.\n#### 70,000"), 1.0);
}

Test(verify, last_number_forms) {
    struct { const char *text, *want; } cases[] = {
        {"it is -12.", "-12"}, {"pay 1,000,000 now", "1,000,000"}, {"x = 3.75 m", "3.75"},
        {"about .5", ".5"},    {"ratio 3/4", "3/4"},                {"so \\frac{3}{4}", "\\frac{3}{4}"},
        {"5-3", "3"},          {"1,23", "23"},                      {"no digits", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qrl_vbuf b = {0};
        bool found = qrl_verify_extract_last_number(cases[i].text, &b);
        if (!cases[i].want) cr_assert_not(found, "%s", cases[i].text);
        else cr_assert_str_eq(qrl_vbuf_str(&b), cases[i].want, "%s", cases[i].text);
        qrl_vbuf_free(&b);
    }
}

Test(verify, boxed_forms) {
    struct { const char *text, *want; } cases[] = {
        {"\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"},
        {"\\boxed 5 is it", "5"},
        {"$\\boxed 42$", "42"},
        {"\\fbox{7}", "7"},
        {"\\boxed{3} then \\boxed{4", "3"},        /* unclosed last box does not count */
        {"\\boxed{} and \\boxed{ }", NULL},        /* empty boxes do not count */
        {"\\boxedx{3}", NULL},                     /* another command */
        {"\\boxed{\\{1,2\\}}", "\\{1,2\\}"},       /* escaped braces inside */
        {"\\boxed{a \\\\ b}", "a \\\\ b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qrl_vbuf b = {0};
        bool found = qrl_verify_extract_boxed(cases[i].text, &b);
        if (!cases[i].want) cr_assert_not(found, "%s", cases[i].text);
        else cr_assert_str_eq(qrl_vbuf_str(&b), cases[i].want, "%s", cases[i].text);
        qrl_vbuf_free(&b);
    }
}

/* ---- normalization and comparison ---------------------------------------------------- */

Test(verify, normalized_forms) {
    struct { const char *in, *want; } cases[] = {
        {"$\\dfrac{1}{2}$", "\\frac{1}{2}"},  {"\\tfrac12", "\\frac{1}{2}"},
        {"\\frac 34", "\\frac{3}{4}"},        {"\\frac9{19}", "\\frac{9}{19}"},
        {"\\sqrt2", "\\sqrt{2}"},             {"x = 5", "5"},
        {"\\theta=\\pi", "\\pi"},             {"1,000", "1000"},
        {"11,\\! 111,\\! 100", "11111100"},   {"(12,102)", "(12,102)"},
        {"3, 500", "3,500"},                  {"50\\%", "50"},
        {"90^\\circ", "90"},                  {"\\left( 1, 2 \\right)", "(1,2)"},
        {"5.4 \\text{ cents}", "5.4"},        {"15\\mbox{ cm}^2", "15"},
        {"\\text{(B)}", "B"},                 {"\\text{Evelyn}", "Evelyn"},
        {"18 dollars.", "18"},                {"2k", "2k"},
        {"2\\sqrt{3} square units", "2\\sqrt{3}"}, {"x + 1 apples", "x+1apples"},
        {"\\cot x", "\\cot x"},               {"4210_{5}", "4210_5"},
        {"\\!\\,\\;", ""},                    {"{{7}}", "7"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_str_eq(normalized(cases[i].in), cases[i].want, "normalize(%s)", cases[i].in);
}

Test(verify, equivalent_answers) {
    const char *pairs[][2] = {
        {"\\frac{1}{2}", "0.5"},      {"18.00", "18"},          {"1,000", "1000"},
        {"\\$18.90", "18.9"},         {"025", "25"},            {"27.0", "27"},
        {"\\sqrt{2}", "\\sqrt2"},     {"11\\sqrt2", "\\sqrt{242}"}, {"2\\sqrt{5}", "\\sqrt{20}"},
        {"\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt3}"}, {"12\\pi", "12 \\pi"},
        {"137 \\frac{1}{2}", "137.5"}, {"1\\frac{4}{5}", "\\frac95"}, {"-\\frac{3}{8}", "-0.375"},
        {"2k+2", "2(k+1)"},           {"x^2+2x+1", "(x+1)^2"},  {"y = 2x + 3", "3+2x"},
        {"50\\%", "50"},              {"106^\\circ", "106"},    {"\\text{(C)}", "C"},
        {"(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"},
        {"(-\\infty, 2) \\cup (3, \\infty)", "(-\\infty,2)\\cup(3,\\infty)"},
        {"[-2,7]", "x \\in [-2, 7]"}, {"1,-2", "-2, 1"},        {"\\{1,2\\}", "\\{2,1\\}"},
        {"\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix} 0.2 \\\\ -3.6 \\end{pmatrix}"},
        {"\\text{East}", "east"},   {"10^{3}", "1000"},           {"5!", "120"},            {"\\binom{5}{2}", "10"},
        {"-0", "0"},                  {"+7", "007"},
        {"123456789012345678901234567890", "123456789012345678901234567890"},
        {"1.0000001", "1"},           {"0.333333333", "\\frac13"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        cr_assert(equal(pairs[i][0], pairs[i][1]), "expected %s == %s", pairs[i][0], pairs[i][1]);
}

Test(verify, different_answers) {
    const char *pairs[][2] = {
        {"2k", "2"},            {"0.5", "50\\%"},        {"1.00001", "1"},       {"(1,2)", "(2,1)"},
        {"[1,2)", "[1,2]"},     {"Evelyn", "Nevely"},    {"\\frac{1}{3}", "0.33"}, {"3,5,7", "(3,5,7)"},
        {"x^2", "x^3"},         {"2x+3", "2y+3"},        {"(a+5)(b+2)", "(a+2)(b+5)"}, {"0", "1e-9"},
        {"204_5", "204"},       {"1\\pm\\sqrt{19}", "1+\\sqrt{19}"}, {"", "5"},    {"-1", "1"},
        {"1,2", "1,2,3"},       {"1000", "1,0000"},
        {"1000001", "1000000"}, {"109200001", "109,200,000"}, /* integers: exact */
        {"123456789012345678901234567891", "123456789012345678901234567890"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        cr_assert_not(equal(pairs[i][0], pairs[i][1]), "expected %s != %s", pairs[i][0], pairs[i][1]);
}

Test(verify, wrong_answers_score_zero) {
    cr_assert_eq(reward("gsm8k", "#### 17", "18"), 0.0);
    cr_assert_eq(reward("math", "\\boxed{\\frac{1}{3}}", "0.5"), 0.0);
    cr_assert_eq(reward("math", "\\boxed{1}, so the answer is 5", "5"), 0.0);
    qrl_verify_result r = score("math", "\\boxed{7}", "8");
    cr_assert(r.found);
    cr_assert_not(r.correct);
}

Test(verify, shaped_reward) {
    qrl_verify_result r = score("math", "\\boxed{7}", "8");
    cr_assert_eq(qrl_verify_shaped_reward(&r, 0.1), 0.1);
    r = score("math", "seven", "8");
    cr_assert_eq(qrl_verify_shaped_reward(&r, 0.1), 0.0);
    r = score("math", "\\boxed{8}", "8");
    cr_assert_eq(qrl_verify_shaped_reward(&r, 0.1), 1.0);
    cr_assert_eq(qrl_verify_shaped_reward(&r, 0.0), r.reward);
}

Test(verify, reference_errors) {
    qrl_verify_result r;
    qrl_error err;
    const qrl_verifier *m = qrl_verifier_find("math");
    cr_assert_eq(m->score("\\boxed{1}", "   ", &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "reference") != NULL, "%s", err.msg);
    cr_assert_eq(r.reward, 0.0);
    cr_assert_eq(m->score("\\boxed{1}", NULL, &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(m->score(NULL, "1", &r, &err), QRL_OK); /* a NULL response is an empty one */
    cr_assert_not(r.found);

    const qrl_verifier *a = qrl_verifier_find("arith");
    cr_assert_eq(a->score("Answer: 1", "twelve", &r, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "offset 0") != NULL, "%s", err.msg);
    cr_assert_eq(a->score("Answer: 1", "12 apples", &r, &err), QRL_STATUS_PARSE);

    const qrl_verifier *c = qrl_verifier_find("countdown");
    cr_assert_eq(c->score("<answer>1</answer>", "{\"numbers\":[1],", &r, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "offset") != NULL, "%s", err.msg);
    cr_assert_eq(c->score("x", "{\"target\":3}", &r, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "\"numbers\"") != NULL, "%s", err.msg);
    cr_assert_eq(c->score("x", "{\"numbers\":[1,\"2\"],\"target\":3}", &r, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "[1]") != NULL, "%s", err.msg);
    cr_assert_eq(c->score("x", "{\"numbers\":[1,2]}", &r, &err), QRL_STATUS_PARSE);
    cr_assert(strstr(err.msg, "\"target\"") != NULL, "%s", err.msg);
    cr_assert_eq(c->score("x", "{\"numbers\":[],\"target\":3}", &r, &err), QRL_STATUS_PARSE);
    cr_assert_eq(c->score("x", "[1,2,3]", &r, &err), QRL_STATUS_PARSE);
}

/* ---- synthetic tasks ---------------------------------------------------------------- */

Test(verify, arith) {
    cr_assert_eq(reward("arith", "  345\n+ 678\n= 1023\nAnswer: 1023", "1023"), 1.0);
    cr_assert_eq(reward("arith", "work...\n#### 1023", "1023"), 1.0);
    cr_assert_eq(reward("arith", "answer: -56.", "-56"), 1.0);
    cr_assert_eq(reward("arith", "Answer: 0123", "123"), 1.0);
    cr_assert_eq(reward("arith", "Answer: -0", "0"), 1.0);
    cr_assert_eq(reward("arith", "Answer: +7", "7"), 1.0);
    cr_assert_eq(reward("arith", "Answer: 123456789012345678901234567890",
                        "123456789012345678901234567890"), 1.0);
    cr_assert_eq(reward("arith", "Answer: 123456789012345678901234567891",
                        "123456789012345678901234567890"), 0.0);
    /* the reference may be a worked solution with a marker */
    cr_assert_eq(reward("arith", "Answer: 42", "6*7 = 42\nAnswer: 42"), 1.0);
    /* the last marker counts */
    cr_assert_eq(reward("arith", "Answer: 5\nno wait\nAnswer: 6", "6"), 1.0);
    cr_assert_eq(reward("arith", "Answer: 5\nno wait\nAnswer: 6", "5"), 0.0);
    /* exact integers only */
    qrl_verify_result r = score("arith", "Answer: 12.5", "12");
    cr_assert_not(r.found);
    r = score("arith", "Answer: 1,000", "1000");
    cr_assert_not(r.found);
    r = score("arith", "the result is 1023", "1023"); /* no marker */
    cr_assert_not(r.found);
    cr_assert_eq(r.reward, 0.0);
    r = score("arith", "Answer: 1024", "1023");
    cr_assert(r.found);
    cr_assert_eq(r.reward, 0.0);
    cr_assert_str_eq(r.extracted, "1024");
}

static const char *CD = "{\"numbers\":[25,5,4,3],\"target\":98}"; /* 25*4+3-5 */

Test(verify, countdown_true) {
    cr_assert_eq(reward("countdown", "<answer>25 * 4 + 3 - 5</answer>", CD), 1.0);
    cr_assert_eq(reward("countdown", "Let me think. <answer>25*4 - 3</answer>", "{\"numbers\":[25,4,3],\"target\":97}"), 1.0);
    cr_assert_eq(reward("countdown", "<answer> (25 + 5) * 3 + 4 + 3 </answer>", "{\"numbers\":[25,5,3,4,3],\"target\":97}"), 1.0);
    cr_assert_eq(reward("countdown", "<answer>(25 - 5 + 4) * 3</answer>", "{\"nums\":[25,5,4,3],\"target\":72}"), 1.0);
    /* exact rationals: 6 / (1 - 3/4) = 24 */
    cr_assert_eq(reward("countdown", "<answer>6/(1-3/4)</answer>", "{\"numbers\":[1,3,4,6],\"target\":24}"), 1.0);
    /* other places and spellings */
    cr_assert_eq(reward("countdown", "so \\boxed{(25 - 5) \\times 4 - 3}", "{\"numbers\":[25,5,4,3],\"target\":77}"), 1.0);
    cr_assert_eq(reward("countdown", "Answer: (25-5)*4-3 = 77.", "{\"numbers\":[25,5,4,3],\"target\":77}"), 1.0);
    cr_assert_eq(reward("countdown", "<answer>(25-5)*4-3 = 78</answer>", "{\"numbers\":[25,5,4,3],\"target\":77}"), 0.0);
    /* the last complete <answer> counts */
    cr_assert_eq(reward("countdown", "<answer>1+1</answer> <answer>25*4-3</answer> <answer>",
                        "{\"numbers\":[25,4,3],\"target\":97}"), 1.0);
}

Test(verify, countdown_false_and_malformed) {
    const char *ref = "{\"numbers\":[25,5,4,3],\"target\":77}";
    const char *bad[] = {
        "<answer>(25-5)*4-3+0</answer>",  /* a number not given */
        "<answer>(25-5)*4</answer>",      /* wrong value, 3 unused */
        "<answer>25*3+5-3</answer>",      /* 4 unused, 5.. value 77 but not all used */
        "<answer>(25-5)*4-3-3+3</answer>",/* 3 used three times */
        "<answer>25/(5-5)+4+3</answer>",  /* division by zero */
        "<answer>-(3-25*4)+5-5</answer>", /* unary minus */
        "<answer>(25-5)*4-3)</answer>",   /* unbalanced */
        "<answer>(25-5)*4-3x</answer>",   /* junk */
        "<answer>2**5</answer>",
        "<answer></answer>",
        "<answer>25 5 4 3</answer>",
        "(25-5)*4-3",                      /* no answer marker */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qrl_verify_result r = score("countdown", bad[i], ref);
        cr_assert_eq(r.reward, 0.0, "%s", bad[i]);
    }
    long long num, den, used[QRL_COUNTDOWN_NUMBERS_MAX];
    size_t n;
    cr_assert_eq(qrl_countdown_eval("25/(5-5)", &num, &den, used, &n), QRL_COUNTDOWN_DIV_ZERO);
    cr_assert_eq(qrl_countdown_eval("-3+4", &num, &den, used, &n), QRL_COUNTDOWN_SYNTAX);
    cr_assert_eq(qrl_countdown_eval("3+", &num, &den, used, &n), QRL_COUNTDOWN_SYNTAX);
    cr_assert_eq(qrl_countdown_eval("999999999999999999*999999999999999999", &num, &den, used, &n),
                 QRL_COUNTDOWN_OVERFLOW);
    cr_assert_eq(qrl_countdown_eval("1234567890123456789", &num, &den, used, &n), QRL_COUNTDOWN_OVERFLOW);
    char deep[400];
    memset(deep, '(', 200);
    deep[200] = '1';
    memset(deep + 201, ')', 198);
    deep[399] = '\0';
    cr_assert_eq(qrl_countdown_eval(deep, &num, &den, used, &n), QRL_COUNTDOWN_TOO_DEEP);
    cr_assert_eq(qrl_countdown_eval("3 * (4 - 1) / 6", &num, &den, used, &n), QRL_COUNTDOWN_OK);
    cr_assert_eq(num, 3);
    cr_assert_eq(den, 2);
    cr_assert_eq(n, 4);
    cr_assert_eq(used[0], 3);
    cr_assert_eq(used[3], 6);
}

/* ---- real datasets ------------------------------------------------------------------ */

static char *data_path(const char *rel) {
    const char *dir = getenv("QRL_DATA_DIR");
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir && *dir ? dir : "../shared/data", rel) < 0) return NULL;
    return p;
}

typedef char *(*make_response_fn)(json_t *row);      /* malloc'd response text */
typedef char *(*make_reference_fn)(json_t *row);     /* malloc'd reference text */

typedef struct {
    size_t lines, correct, found;
} sweep_stats;

/* Score every line (or the first `limit`), print up to `show` failures to the log. */
static sweep_stats sweep(const char *rel, const char *task, make_response_fn resp, make_reference_fn ref,
                         size_t limit, size_t show) {
    sweep_stats s = {0, 0, 0};
    char *path = data_path(rel);
    FILE *f = fopen(path, "r");
    if (!f) {
        free(path);
        cr_skip_test("dataset %s not found (set QRL_DATA_DIR)", rel);
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0 && (limit == 0 || s.lines < limit)) {
        json_error_t jerr;
        json_t *row = json_loads(line, 0, &jerr);
        cr_assert_not_null(row, "%s line %zu: %s", rel, s.lines + 1, jerr.text);
        char *response = resp(row), *reference = ref(row);
        qrl_verify_result r;
        qrl_error err;
        qrl_status st = qrl_verifier_find(task)->score(response, reference, &r, &err);
        cr_assert_eq(st, QRL_OK, "%s line %zu: %s", rel, s.lines + 1, err.msg);
        s.lines++;
        s.correct += r.reward == 1.0;
        s.found += r.found;
        if (r.reward != 1.0 && show) {
            show--;
            fprintf(stderr, "  %s line %zu: extracted '%s' vs reference '%.80s'\n", rel, s.lines, r.extracted,
                    reference);
        }
        free(response);
        free(reference);
        json_decref(row);
    }
    free(line);
    fclose(f);
    free(path);
    fprintf(stderr, "%s [%s]: %zu/%zu reward 1 (%.2f%%), %zu found\n", rel, task, s.correct, s.lines,
            s.lines ? 100.0 * (double)s.correct / (double)s.lines : 0.0, s.found);
    return s;
}

static char *field_text(json_t *row, const char *key) {
    json_t *v = json_object_get(row, key);
    char *out = NULL;
    if (json_is_string(v)) out = strdup(json_string_value(v));
    else if (json_is_number(v)) cr_assert(asprintf(&out, "%.17g", json_number_value(v)) > 0);
    cr_assert_not_null(out, "field '%s' missing", key);
    return out;
}

static char *gsm8k_answer(json_t *row) { return field_text(row, "answer"); }
static char *math_solution(json_t *row) { return field_text(row, "solution"); }
static char *math_answer(json_t *row) { return field_text(row, "answer"); }
static char *math_boxed_answer(json_t *row) {
    char *a = field_text(row, "answer"), *out = NULL;
    cr_assert(asprintf(&out, "The answer is \\boxed{%s}", a) > 0);
    free(a);
    return out;
}
static char *gsm8k_boxed_number(json_t *row) {
    char *a = field_text(row, "answer"), *out = NULL;
    cr_assert(asprintf(&out, "So the total is \\boxed{%s}.", strstr(a, "####") + 5) > 0);
    free(a);
    return out;
}

Test(verify, gsm8k_sample_of_20) {
    sweep_stats s = sweep("gsm8k/test.jsonl", "gsm8k", gsm8k_answer, gsm8k_answer, 20, 20);
    cr_assert_eq(s.lines, 20);
    cr_assert_eq(s.correct, 20);
}

Test(verify, math500_sample_of_20) {
    sweep_stats s = sweep("math500/test.jsonl", "math", math_boxed_answer, math_answer, 20, 20);
    cr_assert_eq(s.lines, 20);
    cr_assert_eq(s.correct, 20);
}

Test(verify, gsm8k_whole_test_set) {
    sweep_stats s = sweep("gsm8k/test.jsonl", "gsm8k", gsm8k_answer, gsm8k_answer, 0, 10);
    cr_assert_eq(s.lines, 1319);
    cr_assert_geq(s.correct * 100, s.lines * 99, "%zu/%zu", s.correct, s.lines);
    /* the number alone in a box, reference = the whole answer text */
    s = sweep("gsm8k/test.jsonl", "gsm8k", gsm8k_boxed_number, gsm8k_answer, 0, 10);
    cr_assert_geq(s.correct * 100, s.lines * 99, "%zu/%zu", s.correct, s.lines);
}

Test(verify, math500_whole_test_set) {
    sweep_stats s = sweep("math500/test.jsonl", "math", math_boxed_answer, math_answer, 0, 10);
    cr_assert_eq(s.lines, 500);
    cr_assert_geq(s.correct * 100, s.lines * 99, "%zu/%zu", s.correct, s.lines);
    /* the dataset's full worked solution as the response: its last box is the answer */
    s = sweep("math500/test.jsonl", "math", math_solution, math_answer, 0, 20);
    cr_assert_geq(s.correct * 100, s.lines * 97, "%zu/%zu", s.correct, s.lines);
}

Test(verify, aime_amc_answers) {
    sweep_stats s = sweep("aime2024/test.jsonl", "math", math_boxed_answer, math_answer, 0, 10);
    cr_assert_eq(s.correct, s.lines);
    s = sweep("amc2023/test.jsonl", "math", math_boxed_answer, math_answer, 0, 10);
    cr_assert_eq(s.correct, s.lines);
}

/* Each line's answer against the next line's reference: where the two answers differ
 * as strings they must (nearly always) score 0. */
Test(verify, datasets_shifted_answers_score_zero) {
    const char *files[] = {"math500/test.jsonl", "gsm8k/test.jsonl"};
    const char *tasks[] = {"math", "gsm8k"};
    for (int d = 0; d < 2; d++) {
        char *path = data_path(files[d]);
        FILE *f = fopen(path, "r");
        free(path);
        if (!f) cr_skip_test("dataset %s not found", files[d]);
        char *line = NULL, *prev = NULL;
        size_t cap = 0, pairs = 0, wrong_ones = 0;
        while (getline(&line, &cap, f) > 0) {
            json_t *row = json_loads(line, 0, NULL);
            cr_assert_not_null(row);
            char *ans = d == 0 ? math_answer(row) : field_text(row, "answer");
            if (d == 1) { char *n = strdup(strstr(ans, "####") + 4); free(ans); ans = n; }
            if (prev && strcmp(prev, ans) != 0) {
                char *resp = NULL;
                cr_assert(asprintf(&resp, "\\boxed{%s}", prev) > 0);
                pairs++;
                if (reward(tasks[d], resp, ans) != 0.0) {
                    wrong_ones++;
                    fprintf(stderr, "  shifted %s: '%s' scored 1 against '%s'\n", files[d], prev, ans);
                }
                free(resp);
            }
            free(prev);
            prev = ans;
            json_decref(row);
        }
        free(prev);
        free(line);
        fclose(f);
        fprintf(stderr, "%s shifted: %zu/%zu different answers scored 1\n", files[d], wrong_ones, pairs);
        cr_assert_leq(wrong_ones * 100, pairs, "%zu/%zu", wrong_ones, pairs);
    }
}

/* Off-by-one answers must score 0: every GSM8K test answer, and every MATH-500 answer
 * that is a plain integer, with 1 added. */
Test(verify, datasets_off_by_one_scores_zero) {
    const char *files[] = {"gsm8k/test.jsonl", "math500/test.jsonl"};
    for (int d = 0; d < 2; d++) {
        char *path = data_path(files[d]);
        FILE *f = fopen(path, "r");
        free(path);
        if (!f) cr_skip_test("dataset %s not found", files[d]);
        char *line = NULL;
        size_t cap = 0, tried = 0, credited = 0;
        while (getline(&line, &cap, f) > 0) {
            json_t *row = json_loads(line, 0, NULL);
            cr_assert_not_null(row);
            char *ref = field_text(row, "answer");
            const char *num = d == 0 ? strstr(ref, "####") + 4 : ref;
            char digits[64];
            size_t n = 0;
            for (const char *p = num; *p && n < sizeof digits - 1; p++)
                if (*p != ',' && *p != ' ') digits[n++] = *p;
            digits[n] = '\0';
            char *end;
            long long v = strtoll(digits, &end, 10);
            if (n > 0 && *end == '\0') {
                char resp[96];
                snprintf(resp, sizeof resp, d == 0 ? "#### %lld" : "\\boxed{%lld}", v + 1);
                tried++;
                if (reward(d == 0 ? "gsm8k" : "math", resp, ref) != 0.0) {
                    credited++;
                    fprintf(stderr, "  off by one credited: %s vs %s\n", resp, digits);
                }
            }
            free(ref);
            json_decref(row);
        }
        free(line);
        fclose(f);
        fprintf(stderr, "%s off by one: %zu/%zu credited\n", files[d], credited, tried);
        cr_assert_gt(tried, d == 0 ? 1300 : 250);
        cr_assert_eq(credited, 0);
    }
}

/* ---- robustness -------------------------------------------------------------------- */

Test(verify, contains_task) {
    const qrl_verifier *v = qrl_verifier_find("contains");
    cr_assert_not_null(v);
    qrl_verify_result r;
    qrl_error err;
    cr_assert_eq(v->score("Once upon a time Lily ran.", "Lily", &r, &err), QRL_OK);
    cr_assert(r.correct && r.reward == 1.0 && strcmp(r.extracted, "Lily") == 0);
    cr_assert_eq(v->score("Once upon a time Tom ran.", "Lily", &r, &err), QRL_OK);
    cr_assert(!r.correct && r.reward == 0.0 && !r.found);
    cr_assert_eq(v->score("anything", "", &r, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "empty reference") != NULL);
}

Test(verify, hostile_inputs_do_not_crash) {
    static char big[200000];
    const char *pieces[] = {"\\boxed{", "{", "}", "\\frac", "####", "1,", "(", "\\left(", "\\text{", "^"};
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        size_t k = strlen(pieces[p]), n = 0;
        while (n + k < sizeof big - 1) { memcpy(big + n, pieces[p], k); n += k; }
        big[n] = '\0';
        for (size_t v = 0; v < qrl_verifier_count(); v++) {
            qrl_verify_result r;
            const qrl_verifier *ver = qrl_verifier_at(v);
            const char *ref = strcmp(ver->name, "countdown") == 0 ? "{\"numbers\":[1],\"target\":1}" : "1";
            ver->score(big, ref, &r, NULL);
            cr_assert(r.reward == 0.0 || r.reward == 1.0);
            ver->score("\\boxed{1}", big, &r, NULL);
        }
    }
}
