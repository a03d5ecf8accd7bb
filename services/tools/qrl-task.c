/* qrl-task: data and starting models of the built-in tasks (common/tasks/tasks.h;
 * docs/tasks.md).
 *
 *   qrl-task gen --task arith|story-name --split train|test --n N --seed S --out FILE.jsonl
 *                [--digits MIN-MAX] [--max-chars C]
 *   qrl-task init-model --task arith --out DIR [--dim 128] [--layers 4] [--heads 4]
 *                [--hidden 0 (= 4 x dim)] [--ctx 128] --seed S
 *   qrl-task init-model --shape qwen3-0.6b|qwen3-1.7b|qwen3-4b|qwen3-8b|qwen3-tiny
 *                --tokenizer DIR --out DIR --seed S
 *
 * gen writes one JSON object per line: {"prompt": ..., "answer": ..., "solution": ...}
 * (story-name has no solution).  init-model writes a randomly initialized Llama-style
 * model as a HuggingFace folder (config.json, model.safetensors F32) with the
 * character tokenizer (tokenizer.json, tokenizer_config.json).  init-model --shape writes
 * a random-weight model of a Qwen3 shape (transformers' config of that model) in BF16 with
 * the tokenizer files of DIR copied beside it (benchmarks: bench/e2e.sh).
 * Errors, usage errors included: one line "qrl-task: error: ..." on stderr and exit status 1
 * (the convention of every qrl program, docs/config.md "Exit status"). */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model.h"
#include "tasks/tasks.h"
#include "task_shapes.h"

static void usage(FILE *f) {
    fputs("usage:\n"
          "  qrl-task gen --task arith|story-name --split train|test --n N --seed S --out FILE.jsonl\n"
          "               [--digits MIN-MAX (arith, default 3-3)] [--max-chars C (story-name, default 600)]\n"
          "  qrl-task init-model --task arith --out DIR --seed S [--dim 128] [--layers 4] [--heads 4]\n"
          "               [--hidden H (default 4 x dim)] [--ctx 128]\n"
          "  qrl-task init-model --shape qwen3-0.6b|qwen3-1.7b|qwen3-4b|qwen3-8b|qwen3-tiny\n"
          "               --tokenizer DIR --out DIR --seed S\n"
          "\n"
          "gen: JSONL lines {\"prompt\", \"answer\", \"solution\"}; the test split is disjoint from\n"
          "train for any seeds (a hash of each problem decides its split).\n"
          "init-model: random Llama-style model + character tokenizer as a HuggingFace folder;\n"
          "with --shape: random BF16 weights of that Qwen3 shape (transformers' config.json) with\n"
          "the tokenizer files of --tokenizer DIR (vocab.json + merges.txt or tokenizer.json).\n"
          "See docs/tasks.md.\n",
          f);
}

static _Noreturn void die(int code, const char *msg) {
    fprintf(stderr, "qrl-task: error: %s\n", msg);
    exit(code);
}

static long long int_arg(const char *name, const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char m[256];
        snprintf(m, sizeof m, "%s: '%s' is not an integer in [%lld, %lld]", name, v, lo, hi);
        die(1, m);
    }
    return x;
}

typedef struct opts {
    const char *task, *split, *out, *shape, *tokenizer;
    long long n, seed, max_chars, dim, layers, heads, hidden, ctx;
    int dmin, dmax;
    int have_seed;
} opts;

/* Options the commands take (each with a value); an unknown one is refused as such, not as
 * "needs a value". */
static bool known_option(const char *a) {
    static const char *const names[] = {"--task", "--split", "--n", "--seed", "--out", "--digits",
                                        "--max-chars", "--dim", "--layers", "--heads", "--hidden",
                                        "--ctx", "--shape", "--tokenizer"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(a, names[i]) == 0) return true;
    return false;
}

static void parse(int argc, char **argv, opts *o) {
    *o = (opts){.n = -1, .max_chars = 600, .dim = 128, .layers = 4, .heads = 4, .ctx = 128};
    qrl_task_arith_params ap = qrl_task_arith_default();
    o->dmin = ap.min_digits, o->dmax = ap.max_digits;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0) usage(stdout), exit(0);
        if (!known_option(a)) {
            char m[128];
            snprintf(m, sizeof m, "unknown option '%.60s' (see --help)", a);
            die(1, m);
        }
        if (i + 1 >= argc) {
            char m[128];
            snprintf(m, sizeof m, "%s needs a value (see --help)", a);
            die(1, m);
        }
        const char *v = argv[++i];
        if (strcmp(a, "--task") == 0) o->task = v;
        else if (strcmp(a, "--split") == 0) o->split = v;
        else if (strcmp(a, "--out") == 0) o->out = v;
        else if (strcmp(a, "--shape") == 0) o->shape = v;
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = v;
        else if (strcmp(a, "--n") == 0) o->n = int_arg(a, v, 1, 100000000); /* 0 would write an empty file */
        else if (strcmp(a, "--seed") == 0) o->seed = int_arg(a, v, 0, (long long)1e15), o->have_seed = 1;
        else if (strcmp(a, "--max-chars") == 0) o->max_chars = int_arg(a, v, 1, 1 << 20);
        else if (strcmp(a, "--dim") == 0) o->dim = int_arg(a, v, 8, 8192);
        else if (strcmp(a, "--layers") == 0) o->layers = int_arg(a, v, 1, 128);
        else if (strcmp(a, "--heads") == 0) o->heads = int_arg(a, v, 1, 256);
        else if (strcmp(a, "--hidden") == 0) o->hidden = int_arg(a, v, 0, 1 << 20);
        else if (strcmp(a, "--ctx") == 0) o->ctx = int_arg(a, v, 8, 1 << 16);
        else if (strcmp(a, "--digits") == 0) {
            if (sscanf(v, "%d-%d", &o->dmin, &o->dmax) != 2) {
                char *e;
                o->dmin = o->dmax = (int)strtol(v, &e, 10);
                if (*e || e == v) die(1, "--digits: expected MIN-MAX or N");
            }
        } else {
            char m[128];
            snprintf(m, sizeof m, "unknown option '%s' (see --help)", a);
            die(1, m);
        }
    }
    if (!o->task && !o->shape) die(1, "--task is required (arith | story-name)");
    if (!o->out) die(1, "--out is required");
    if (!o->have_seed) die(1, "--seed is required");
}

static int cmd_gen(const opts *o) {
    bool arith = strcmp(o->task, "arith") == 0;
    if (!arith && strcmp(o->task, "story-name") != 0) die(1, "--task: expected arith or story-name");
    int split = qrl_task_split_parse(o->split);
    if (split < 0) die(1, "--split: expected train or test");
    if (o->n < 0) die(1, "--n is required");
    qrl_task_arith_params ap = {.min_digits = o->dmin, .max_digits = o->dmax};
    FILE *f = fopen(o->out, "w");
    if (!f) {
        char m[4200];
        snprintf(m, sizeof m, "%s: cannot open for writing: %s", o->out, strerror(errno));
        die(1, m);
    }
    qrl_error err;
    for (long long i = 0; i < o->n; i++) {
        qrl_task_item it;
        qrl_status st = arith ? qrl_task_arith_item(&ap, (qrl_task_split)split, (uint64_t)o->seed,
                                                    (uint64_t)i, &it, &err)
                              : qrl_task_story_item((qrl_task_split)split, (uint64_t)o->seed,
                                                    (uint64_t)i, (int)o->max_chars, &it, &err);
        if (st != QRL_OK) fclose(f), die(1, err.msg);
        json_t *j = json_pack("{s:s, s:s}", "prompt", it.prompt, "answer", it.answer);
        if (arith) json_object_set_new(j, "solution", json_string(it.solution));
        char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(j);
        if (!line || fprintf(f, "%s\n", line) < 0) fclose(f), die(1, "write failed");
        free(line);
    }
    if (fclose(f) != 0) die(1, "write failed");
    return 0;
}

static int cmd_init_model(const opts *o) {
    if (o->shape) return qrl_task_init_shape(o->shape, o->tokenizer, o->out, (uint64_t)o->seed);
    if (strcmp(o->task, "arith") != 0) die(1, "init-model: --task arith is the only one (story-name uses stories260K)");
    if (o->dim % o->heads || (o->dim / o->heads) % 2) die(1, "--dim must be a multiple of 2 x --heads");
    long long hidden = o->hidden ? o->hidden : 4 * o->dim;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"hidden_size\": %lld, \"intermediate_size\": %lld,"
             " \"num_hidden_layers\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld,"
             " \"vocab_size\": %d, \"max_position_embeddings\": %lld, \"rms_norm_eps\": 1e-5,"
             " \"rope_theta\": 10000.0, \"tie_word_embeddings\": true, \"bos_token_id\": %d,"
             " \"eos_token_id\": %d}",
             o->dim, hidden, o->layers, o->heads, o->heads, QRL_TASK_CHAR_VOCAB, o->ctx,
             QRL_TASK_CHAR_BOS, QRL_TASK_CHAR_EOS);
    qrl_error err;
    qrl_model_config cfg;
    qrl_model *m;
    if (qrl_model_config_parse_hf(json, strlen(json), "init-model", &cfg, &err) != QRL_OK) die(1, err.msg);
    if (qrl_model_new(&cfg, &m, &err) != QRL_OK) die(1, err.msg);
    qrl_model_init_random(m, (uint64_t)o->seed);
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        char msg[4200];
        snprintf(msg, sizeof msg, "%s: cannot create: %s", o->out, strerror(errno));
        die(1, msg);
    }
    if (qrl_model_save_hf(m, o->out, QRL_DTYPE_F32, &err) != QRL_OK ||
        qrl_task_write_char_tokenizer(o->out, &err) != QRL_OK)
        die(1, err.msg);
    printf("{\"out\": \"%s\", \"params\": %lld, \"dim\": %lld, \"layers\": %lld, \"heads\": %lld, "
           "\"hidden\": %lld, \"ctx\": %lld, \"vocab\": %d}\n",
           o->out, (long long)qrl_model_config_n_params(&cfg), o->dim, o->layers, o->heads, hidden,
           o->ctx, QRL_TASK_CHAR_VOCAB);
    qrl_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (argc < 2) {
            fputs("qrl-task: error: no command given (gen | init-model; see qrl-task --help)\n", stderr);
            return 1;
        }
        usage(stdout);
        return 0;
    }
    opts o;
    if (strcmp(argv[1], "gen") == 0) return parse(argc, argv, &o), cmd_gen(&o);
    if (strcmp(argv[1], "init-model") == 0) return parse(argc, argv, &o), cmd_init_model(&o);
    fprintf(stderr, "qrl-task: error: unknown command '%s' (gen | init-model; see qrl-task --help)\n", argv[1]);
    return 1;
}
