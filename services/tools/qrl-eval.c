/* qrl-eval: score a checkpoint on a task's test split (issue 10 item 5; docs/tasks.md
 * "Evaluation").
 *
 *   qrl-eval --model DIR --dataset test.jsonl --task arith [--k 4] [--n 200]
 *            [--temperature 1.0] [--seed S] [--max-tokens M] [--json]
 *            [--device cuda [--device-id N] [--gpu-memory-utilization F]]
 *   qrl-eval --device cuda [--device-id N] --check-device
 *
 * For each of the first n prompts: k sampled responses (temperature, top-p/top-k) and
 * one greedy response (--greedy, on by default), generated with the rollout scheduler
 * (common/rollout/scheduler.h: batched decode over up to --slots sequences, the
 * rollout's EOS rule and keyed sampler, so numbers equal what the replicas would see)
 * and scored with the task's verifier; --device cuda runs the scheduler's CUDA engine
 * (qrl_scheduler_config.device: BF16 activations, so numbers differ from the CPU's by
 * rounding; docs/rollout.md).  Prompts are rendered as the learner renders them
 * (--chat-template, default auto: the tokenizer's family; "plain" adds BOS).
 *
 * Reported:
 *   avg@k     mean reward over the n x k samples
 *   pass@k    fraction of prompts with at least one correct sample among its k (the
 *             unbiased estimator of Chen et al. 2021 with as many samples as k)
 *   greedy    mean reward of the greedy responses (temperature 0)
 * plus the fraction of responses that ended (EOS or a stop token, not the length
 * limit), mean response length and generation speed.  Output: one summary
 * line and one JSON line on stdout (--json: the JSON line only).
 * Errors: one line "qrl-eval: error: ..." on stderr, exit status 1. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/config.h"
#include "model/load.h"
#include "model/model.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "verify/verify.h"

static const qrl_config_entry CONFIG[] = {
    {"model", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "HuggingFace folder or llama2.c .bin (required)"},
    {"tokenizer", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false,
     "tokenizer path; default: the model's (qrl_tokenizer_find_default)"},
    {"dataset", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false, "JSONL test split (required)"},
    {"task", QRL_CONFIG_TYPE_STRING, "", 0, 0, NULL, false, "verifier name (required; qrl-verify --help)"},
    {"prompt_field", QRL_CONFIG_TYPE_STRING, "prompt", 0, 0, NULL, false, "prompt text field"},
    {"answer_field", QRL_CONFIG_TYPE_STRING, "answer", 0, 0, NULL, false, "reference answer field"},
    {"chat_template", QRL_CONFIG_TYPE_ENUM, "auto", 0, 0, "auto|none|plain|chatml|llama3", false,
     "prompt rendering, as the learner's dataset.chat_template"},
    {"n", QRL_CONFIG_TYPE_INT, "200", 1, 1 << 24, NULL, false, "prompts scored (the first n lines)"},
    {"k", QRL_CONFIG_TYPE_INT, "4", 0, 4096, NULL, false, "sampled responses per prompt (0 = greedy only)"},
    {"greedy", QRL_CONFIG_TYPE_BOOL, "true", 0, 0, NULL, false, "also one greedy response per prompt"},
    {"temperature", QRL_CONFIG_TYPE_DOUBLE, "1.0", 1e-6, 1e4, NULL, false, "sampling temperature"},
    {"top_p", QRL_CONFIG_TYPE_DOUBLE, "1.0", 1e-6, 1, NULL, false, "nucleus mass (1 = off)"},
    {"top_k", QRL_CONFIG_TYPE_INT, "0", 0, 1 << 30, NULL, false, "top-k (0 = off)"},
    {"seed", QRL_CONFIG_TYPE_INT, "0", 0, INFINITY, NULL, false, "sampler seed"},
    {"max_tokens", QRL_CONFIG_TYPE_INT, "128", 1, 1 << 20, NULL, false, "response length limit"},
    {"stop_token_ids", QRL_CONFIG_TYPE_LIST, "", 0, 0, NULL, false,
     "token ids that end a response besides EOS, comma-separated (stories260K: 1, its BOS)"},
    {"precision", QRL_CONFIG_TYPE_STRING, "f32", 0, 0, NULL, false,
     "rollout weight format (SPEC §3): f32, bf16 (the weights the replicas receive), w8a8-int8, ..."},
    {"kv_cache", QRL_CONFIG_TYPE_STRING, "f32", 0, 0, NULL, false, "KV-cache format (f32, bf16, ...)"},
    {"slots", QRL_CONFIG_TYPE_INT, "64", 1, 4096, NULL, false, "sequences decoded together"},
    {"json", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false, "print only the JSON line"},
    {"show", QRL_CONFIG_TYPE_INT, "0", 0, 1 << 20, NULL, false,
     "print the first N greedy (else sampled) responses to stderr"},
    {"threads", QRL_CONFIG_TYPE_INT, "0", 0, 1024, NULL, false, "OpenMP threads (0 = all cores)"},
    {"progress_s", QRL_CONFIG_TYPE_DOUBLE, "10", 0, 86400, NULL, false,
     "a progress line on stderr every this many seconds (groups done of all, rate, ETA; 0 = off)"},
    {"device", QRL_CONFIG_TYPE_ENUM, "cpu", 0, 0, "cpu|cuda", false,
     "engine: cpu (the CPU forward) or cuda (the rollout scheduler's CUDA engine, as a replica "
     "with rollout.device cuda: f32 runs as bf16; refused in a build without CUDA or where "
     "the GPU is missing)"},
    {"device_id", QRL_CONFIG_TYPE_INT, "0", 0, 64, NULL, false, "CUDA device ordinal with --device cuda"},
    {"gpu_memory_utilization", QRL_CONFIG_TYPE_DOUBLE, "0", 0, 1, NULL, false,
     "--device cuda: fraction of the device's memory to use, sizing the KV pool (as "
     "rollout.gpu_memory_utilization; 0 = off: --slots full contexts)"},
    {"check_device", QRL_CONFIG_TYPE_BOOL, "false", 0, 0, NULL, false,
     "with --device cuda: print the device (name, memory) and exit 0, or exit 1 naming why it "
     "cannot be used; nothing else is needed (deploy/local/launch.sh checks its GPUs so)"},
};
#define N_CONFIG (sizeof CONFIG / sizeof CONFIG[0])

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("qrl-eval: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

typedef struct item {
    char *prompt, *answer;
    int32_t *ids;
    size_t n_ids;
} item;

typedef struct tally {
    int k, n, show, shown;
    bool greedy;
    double *sum;       /* [n] sampled reward sum per prompt */
    int *hits;         /* [n] correct samples */
    double *greedy_r;  /* [n] */
    const item *items;
    long long responses, eos, tokens, verify_failed;
    long long groups_done;
} tally;

static void on_group(const qrl_scheduler_group_result *r, void *ctx) {
    tally *t = ctx;
    bool g = r->group_id >= (uint64_t)t->n;
    int i = (int)(r->group_id % (uint64_t)t->n);
    t->groups_done++;
    for (uint32_t j = 0; j < r->group_size; j++) {
        const qrl_scheduler_response *rp = &r->responses[j];
        t->responses++, t->tokens += rp->n_tokens;
        t->eos += rp->finish == QRL_FINISH_EOS || rp->finish == QRL_FINISH_STOP;
        t->verify_failed += rp->verify_status != QRL_OK;
        if (g) t->greedy_r[i] = rp->reward;
        else t->sum[i] += rp->reward, t->hits[i] += rp->correct;
        if (t->shown < t->show && (g || !t->greedy)) {
            t->shown++;
            fprintf(stderr, "--- %s prompt %d reward %.2f finish %s: %s\n%s\n", g ? "greedy" : "sample",
                    i, rp->reward, qrl_finish_reason_name(rp->finish), t->items[i].prompt, rp->text);
        }
    }
}

static size_t load_items(const char *path, const char *pf, const char *af, const char *tmpl,
                         const qrl_tokenizer *tok, int max_prompt, size_t limit, item **out) {
    FILE *f = fopen(path, "r");
    if (!f) die("%s: cannot open", path);
    item *it = calloc(limit, sizeof *it);
    if (!it) die("out of memory");
    char *line = NULL;
    size_t cap = 0, n = 0, lineno = 0;
    ssize_t len;
    qrl_error err;
    while (n < limit && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && strchr("\r\n ", line[len - 1])) len--;
        if (len == 0) continue;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)len, 0, &je);
        if (!o) die("%s:%zu: column %d: %s", path, lineno, je.column, je.text);
        json_t *p = json_object_get(o, pf), *a = json_object_get(o, af);
        if (!json_is_string(p)) die("%s:%zu: field \"%s\" missing or not a string", path, lineno, pf);
        char num[64];
        if (json_is_string(a)) it[n].answer = strdup(json_string_value(a));
        else if (json_is_integer(a)) snprintf(num, sizeof num, "%lld", (long long)json_integer_value(a)), it[n].answer = strdup(num);
        else if (json_is_real(a)) snprintf(num, sizeof num, "%.17g", json_real_value(a)), it[n].answer = strdup(num);
        else die("%s:%zu: field \"%s\" missing or not a string/number", path, lineno, af);
        it[n].prompt = strdup(json_string_value(p));
        json_decref(o);
        /* the learner's rendering (services/learner/dataset.c) */
        char *text = NULL;
        bool add_bos = true;
        if (strcmp(tmpl, "none") != 0) {
            const char *name = strcmp(tmpl, "auto") == 0 ? qrl_tokenizer_chat_template_name(tok) : tmpl;
            if (qrl_chat_template_apply(name, NULL, it[n].prompt, &text, &err) != QRL_OK)
                die("%s:%zu: chat template: %s", path, lineno, err.msg);
            add_bos = strcmp(name, "plain") == 0;
        } else {
            text = strdup(it[n].prompt);
        }
        if (!text || !it[n].prompt || !it[n].answer) die("out of memory");
        if (qrl_tokenizer_encode(tok, text, strlen(text), add_bos, !add_bos, &it[n].ids, &it[n].n_ids, &err) != QRL_OK)
            die("%s:%zu: tokenizing the prompt: %s", path, lineno, err.msg);
        free(text);
        if (it[n].n_ids == 0 || (int)it[n].n_ids > max_prompt)
            die("%s:%zu: prompt has %zu tokens (allowed 1..%d)", path, lineno, it[n].n_ids, max_prompt);
        n++;
    }
    free(line);
    fclose(f);
    if (n == 0) die("%s: no prompts", path);
    *out = it;
    return n;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    qrl_config_t *cfg;
    qrl_config_action action;
    int npos;
    qrl_error err;
    if (qrl_config_parse_args(CONFIG, N_CONFIG, argc, argv, &cfg, &action, &npos, &err) != QRL_OK)
        die("%s", err.msg);
    if (action == QRL_CONFIG_ACTION_HELP) {
        fputs("qrl-eval --model DIR --dataset FILE.jsonl --task NAME [--k 4] [--n 200] [options]\n"
              "Scores avg@k, pass@k (>= 1 correct of k) and greedy accuracy; prints a summary line\n"
              "and a JSON line (docs/tasks.md).\n\n", stdout);
        qrl_config_help(CONFIG, N_CONFIG, "qrl-eval", stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_HELP_MARKDOWN) {
        qrl_config_help_markdown(CONFIG, N_CONFIG, "qrl-eval", stdout);
        return 0;
    }
    if (action == QRL_CONFIG_ACTION_PRINT_CONFIG) { /* the resolved config as YAML, nothing run */
        qrl_config_write(cfg, stdout);
        qrl_config_destroy(cfg);
        return 0;
    }
    if (npos > 0) die("unexpected argument '%s' (see --help)", argv[1]);
    /* the device first: a GPU that is missing is refused before any loading */
    const bool cuda = qrl_config_get_enum(cfg, "device") == 1;
    const int device_id = (int)qrl_config_get_int(cfg, "device_id");
    const double gmu = qrl_config_get_double(cfg, "gpu_memory_utilization");
    if (!cuda && (qrl_config_get_bool(cfg, "check_device") || gmu > 0))
        die("--%s applies to --device cuda only",
            qrl_config_get_bool(cfg, "check_device") ? "check-device" : "gpu-memory-utilization");
    if (cuda) {
        char desc[256];
        if (qrl_rollout_gpu_check(device_id, desc, sizeof desc, NULL, &err) != QRL_OK)
            die("--device cuda (--device-id %d): %s", device_id, err.msg);
        if (qrl_config_get_bool(cfg, "check_device")) {
            printf("%s\n", desc);
            qrl_config_destroy(cfg);
            return 0;
        }
    }
    const char *mpath = qrl_config_get_string(cfg, "model"), *ds = qrl_config_get_string(cfg, "dataset");
    const char *task = qrl_config_get_string(cfg, "task");
    if (!*mpath) die("--model is required");
    if (!*ds) die("--dataset is required");
    if (!qrl_verifier_find(task)) die("--task: unknown verifier '%s' (qrl-verify --help lists them)", task);
    int threads = (int)qrl_config_get_int(cfg, "threads");
    if (threads > 0) omp_set_num_threads(threads);
    const int k = (int)qrl_config_get_int(cfg, "k"), max_new = (int)qrl_config_get_int(cfg, "max_tokens");
    const bool greedy = qrl_config_get_bool(cfg, "greedy"), json_only = qrl_config_get_bool(cfg, "json");
    if (k == 0 && !greedy) die("--k 0 with --greedy false scores nothing");

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = qrl_config_get_string(cfg, "tokenizer"),
                              .tokenizer_option = "--tokenizer"};
    if (qrl_model_load_with_tokenizer(mpath, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        die("%s", err.msg);
    qrl_precision prec;
    qrl_kv_format kvf;
    if (qrl_precision_parse(qrl_config_get_string(cfg, "precision"), &prec, &err) != QRL_OK ||
        qrl_kv_format_parse(qrl_config_get_string(cfg, "kv_cache"), &kvf, &err) != QRL_OK ||
        qrl_model_quantize(m, prec, &err) != QRL_OK)
        die("%s", err.msg);
    item *items;
    size_t n = load_items(ds, qrl_config_get_string(cfg, "prompt_field"),
                          qrl_config_get_string(cfg, "answer_field"),
                          qrl_config_get_string(cfg, "chat_template"), tok, m->cfg.max_seq_len - 1,
                          (size_t)qrl_config_get_int(cfg, "n"), &items);

    tally t = {.k = k, .n = (int)n, .greedy = greedy, .items = items,
               .show = (int)qrl_config_get_int(cfg, "show")};
    t.sum = calloc(n, sizeof *t.sum), t.hits = calloc(n, sizeof *t.hits), t.greedy_r = calloc(n, sizeof *t.greedy_r);
    if (!t.sum || !t.hits || !t.greedy_r) die("out of memory");
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.max_slots = (int)qrl_config_get_int(cfg, "slots");
    sc.kv_format = kvf;
    sc.eos_token_id = m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : qrl_tokenizer_eos(tok); /* as the rollout */
    if (cuda) {
        sc.device = device_id;
        /* the longest prompt + max_tokens bounds every sequence: a smaller KV pool and
         * attention scratch than the model's full context (the CPU path keeps its sizes) */
        size_t longest = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].n_ids > longest) longest = items[i].n_ids;
        if ((long long)longest + max_new < m->cfg.max_seq_len) sc.max_ctx = (int)longest + max_new;
        if (gmu > 0 && qrl_scheduler_config_fit_gpu(&sc, m, gmu, &err) != QRL_OK)
            die("--%s", err.msg);
    }
    qrl_scheduler *s;
    if (qrl_scheduler_new(m, tok, &sc, on_group, &t, &s, &err) != QRL_OK) die("%s", err.msg);
    qrl_sampling_params sp = {.temperature = (float)qrl_config_get_double(cfg, "temperature"),
                              .top_p = (float)qrl_config_get_double(cfg, "top_p"),
                              .top_k = (int)qrl_config_get_int(cfg, "top_k"),
                              .seed = (uint64_t)qrl_config_get_int(cfg, "seed")};
    size_t n_stop_s;
    const char *const *stop_s = qrl_config_get_list(cfg, "stop_token_ids", &n_stop_s);
    int32_t stops[16];
    if (n_stop_s > 16) die("--stop-token-ids: at most 16");
    for (size_t i = 0; i < n_stop_s; i++) {
        char *end;
        long v = strtol(stop_s[i], &end, 10);
        if (end == stop_s[i] || *end || v < 0 || v >= m->cfg.vocab_size)
            die("--stop-token-ids: '%s' is not a token id in [0, %d)", stop_s[i], m->cfg.vocab_size);
        stops[i] = (int32_t)v;
    }
    double t0 = now_s();
    /* greedy groups first (ids n..2n-1) so --show prints them; sampled groups ids 0..n-1 */
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0 && !greedy) || (pass == 1 && k == 0)) continue;
        for (size_t i = 0; i < n; i++) {
            qrl_scheduler_group_desc g = {.group_id = pass == 0 ? n + i : i,
                                          .group_size = pass == 0 ? 1 : (uint32_t)k,
                                          .prompt = items[i].ids, .n_prompt = (int)items[i].n_ids,
                                          .sampling = sp, .max_new_tokens = max_new, .task = task,
                                          .reference = items[i].answer, .stop_token_ids = stops,
                                          .n_stop_token_ids = (int)n_stop_s};
            if (pass == 0) g.sampling.temperature = 0;
            if (qrl_scheduler_submit(s, &g, &err) != QRL_OK) die("prompt %zu: %s", i, err.msg);
        }
    }
    /* groups submitted: greedy (1 response each) and sampled (k each) */
    const long long groups_all = (long long)n * ((greedy ? 1 : 0) + (k ? 1 : 0));
    const double every = qrl_config_get_double(cfg, "progress_s");
    double last = t0;
    while (!qrl_scheduler_idle(s)) {
        if (qrl_scheduler_step(s, NULL, &err) != QRL_OK) die("%s", err.msg);
        double now = now_s();
        if (every > 0 && now - last >= every && t.groups_done < groups_all) {
            double el = now - t0, rate = (double)t.groups_done / el;
            char eta[32] = "unknown";
            if (rate > 0) snprintf(eta, sizeof eta, "%.0f s", (double)(groups_all - t.groups_done) / rate);
            fprintf(stderr, "qrl-eval: progress %lld/%lld groups (%.0f%%), %.2f groups/s, %.0f tokens/s, "
                    "elapsed %.0f s, ETA %s\n", t.groups_done, groups_all,
                    100.0 * (double)t.groups_done / (double)groups_all, rate, (double)t.tokens / el, el, eta);
            last = now;
        }
    }
    double secs = now_s() - t0;

    double avg = 0, pass = 0, gr = 0;
    for (size_t i = 0; i < n; i++) {
        avg += k ? t.sum[i] / k / (double)n : 0;
        pass += t.hits[i] > 0 ? 1.0 / (double)n : 0;
        gr += t.greedy_r[i] / (double)n;
    }
    char gbuf[32] = "n/a", abuf[32] = "n/a", pbuf[32] = "n/a"; /* k = 0: no sampled responses */
    if (greedy) snprintf(gbuf, sizeof gbuf, "%.3f", gr);
    if (k) snprintf(abuf, sizeof abuf, "%.3f", avg), snprintf(pbuf, sizeof pbuf, "%.3f", pass);
    if (!json_only)
        printf("qrl-eval: %s on %s: n=%zu k=%d T=%.2f avg@%d=%s pass@%d=%s greedy=%s ended=%.2f "
               "mean_tokens=%.1f %.1fs (%.0f tokens/s)\n", mpath, ds, n, k, sp.temperature, k,
               abuf, k, pbuf, gbuf, t.responses ? (double)t.eos / (double)t.responses : 0,
               t.responses ? (double)t.tokens / (double)t.responses : 0, secs, (double)t.tokens / secs);
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:I, s:f, s:f, s:f, s:f, s:i, s:f, s:f}",
                          "model", mpath, "dataset", ds, "task", task, "n", (int)n, "k", k,
                          "temperature", (double)sp.temperature, "seed", (json_int_t)sp.seed, "avg_at_k", avg,
                          "pass_at_k", pass, "ended_fraction", t.responses ? (double)t.eos / (double)t.responses : 0.0,
                          "mean_response_tokens", t.responses ? (double)t.tokens / (double)t.responses : 0.0,
                          "verify_failed", (int)t.verify_failed, "seconds", secs, "tokens_per_s",
                          (double)t.tokens / secs);
    if (!k) { /* no sampled responses: no avg@k / pass@k (null, not 0) */
        json_object_set_new(j, "avg_at_k", json_null());
        json_object_set_new(j, "pass_at_k", json_null());
    }
    if (greedy) json_object_set_new(j, "greedy_accuracy", json_real(gr));
    else json_object_set_new(j, "greedy_accuracy", json_null());
    char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    printf("%s\n", line);
    free(line);
    json_decref(j);
    qrl_scheduler_free(s);
    for (size_t i = 0; i < n; i++) free(items[i].prompt), free(items[i].answer), free(items[i].ids);
    free(items), free(t.sum), free(t.hits), free(t.greedy_r);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return 0;
}
