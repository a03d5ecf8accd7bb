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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/config.h"
#include "core/program.h"
#include "model/load.h"
#include "model/model.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "tasks/prompts.h"
#include "tokenizer/tokenizer.h"
#include "verify/verify.h"

enum { DEVICE_CPU, DEVICE_CUDA }; /* order of the device key's choices */

/* The resolved settings: every key of CONFIG, filled by qrl_config_bind (program.h). */
typedef struct eval_settings {
    const char *model, *tokenizer, *dataset, *task, *prompt_field, *answer_field;
    const char *chat_template; /* the value's name: "auto", "none", ... */
    int n, k, top_k, max_tokens, slots, show, threads, device, device_id;
    bool greedy, json, check_device;
    double temperature, top_p, progress_s, gpu_memory_utilization;
    int64_t seed;
    qrl_config_list stop_token_ids;
    const char *precision, *kv_cache;
} eval_settings;

#define S_ eval_settings
static const qrl_config_entry CONFIG[] = {
    QRL_CFG_STRING("model", S_, model, "", false, "HuggingFace folder or llama2.c .bin (required)"),
    QRL_CFG_STRING("tokenizer", S_, tokenizer, "", false,
                   "tokenizer path; default: the model's (qrl_tokenizer_find_default)"),
    QRL_CFG_STRING("dataset", S_, dataset, "", false, "JSONL test split (required)"),
    QRL_CFG_STRING("task", S_, task, "", false, "verifier name (required; qrl-verify --help)"),
    QRL_CFG_STRING("prompt_field", S_, prompt_field, "prompt", false, "prompt text field"),
    QRL_CFG_STRING("answer_field", S_, answer_field, "answer", false, "reference answer field"),
    QRL_CFG_ENUM("chat_template", S_, chat_template, "auto", "auto|none|plain|chatml|llama3", false,
                 "prompt rendering, as the learner's dataset.chat_template"),
    QRL_CFG_INT("n", S_, n, "200", 1, 1 << 24, false, "prompts scored (the first n lines)"),
    QRL_CFG_INT("k", S_, k, "4", 0, 4096, false, "sampled responses per prompt (0 = greedy only)"),
    QRL_CFG_BOOL("greedy", S_, greedy, "true", false, "also one greedy response per prompt"),
    QRL_CFG_DOUBLE("temperature", S_, temperature, "1.0", 1e-6, 1e4, false, "sampling temperature"),
    QRL_CFG_DOUBLE("top_p", S_, top_p, "1.0", 1e-6, 1, false, "nucleus mass (1 = off)"),
    QRL_CFG_INT("top_k", S_, top_k, "0", 0, 1 << 30, false, "top-k (0 = off)"),
    QRL_CFG_INT("seed", S_, seed, "0", 0, INFINITY, false, "sampler seed"),
    QRL_CFG_INT("max_tokens", S_, max_tokens, "128", 1, 1 << 20, false, "response length limit"),
    QRL_CFG_LIST("stop_token_ids", S_, stop_token_ids, "", false,
                 "token ids that end a response besides EOS, comma-separated (stories260K: 1, its BOS)"),
    QRL_CFG_STRING("precision", S_, precision, "f32", false,
                   "rollout weight format (SPEC §3): f32, bf16 (the weights the replicas receive), w8a8-int8, ..."),
    QRL_CFG_STRING("kv_cache", S_, kv_cache, "f32", false, "KV-cache format (f32, bf16, ...)"),
    QRL_CFG_INT("slots", S_, slots, "64", 1, 4096, false, "sequences decoded together"),
    QRL_CFG_BOOL("json", S_, json, "false", false, "print only the JSON line"),
    QRL_CFG_INT("show", S_, show, "0", 0, 1 << 20, false,
                "print the first N greedy (else sampled) responses to stderr"),
    QRL_CFG_INT("threads", S_, threads, "0", 0, 1024, false, "OpenMP threads (0 = all cores)"),
    QRL_CFG_DOUBLE("progress_s", S_, progress_s, "10", 0, 86400, false,
                   "a progress line on stderr every this many seconds (groups done of all, rate, ETA; 0 = off)"),
    QRL_CFG_ENUM("device", S_, device, "cpu", "cpu|cuda", false,
                 "engine: cpu (the CPU forward) or cuda (the rollout scheduler's CUDA engine, as a replica "
                 "with rollout.device cuda: f32 runs as bf16; refused in a build without CUDA or where "
                 "the GPU is missing)"),
    QRL_CFG_INT("device_id", S_, device_id, "0", 0, 64, false, "CUDA device ordinal with --device cuda"),
    QRL_CFG_DOUBLE("gpu_memory_utilization", S_, gpu_memory_utilization, "0", 0, 1, false,
                   "--device cuda: fraction of the device's memory to use, sizing the KV pool (as "
                   "rollout.gpu_memory_utilization; 0 = off: --slots full contexts)"),
    QRL_CFG_BOOL("check_device", S_, check_device, "false", false,
                 "with --device cuda: print the device (name, memory) and exit 0, or exit 1 naming why it "
                 "cannot be used; nothing else is needed (deploy/local/launch.sh checks its GPUs so)"),
};
#undef S_

static eval_settings S;
static const qrl_program PROGRAM = {
    .name = "qrl-eval",
    .usage = "qrl-eval --model DIR --dataset FILE.jsonl --task NAME [--k 4] [--n 200] [options]\n"
             "Scores avg@k, pass@k (>= 1 correct of k) and greedy accuracy; prints a summary line\n"
             "and a JSON line (docs/tasks.md).\n\n",
    .table = CONFIG,
    .n = sizeof CONFIG / sizeof CONFIG[0],
    .settings = &S,
};

typedef struct tally {
    int k, n, show, shown;
    bool greedy;
    double *sum;       /* [n] sampled reward sum per prompt */
    int *hits;         /* [n] correct samples */
    double *greedy_r;  /* [n] */
    const qrl_prompt *items;
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
                    i, rp->reward, qrl_finish_reason_name(rp->finish), t->items[i].user, rp->text);
        }
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    qrl_config_t *cfg;
    qrl_error err;
    int rc = qrl_program_start(&PROGRAM, argc, argv, &cfg, NULL);
    if (rc != QRL_PROGRAM_RUN) return rc;
    /* the device first: a GPU that is missing is refused before any loading */
    const bool cuda = S.device == DEVICE_CUDA;
    const int device_id = S.device_id;
    const double gmu = S.gpu_memory_utilization;
    if (!cuda && (S.check_device || gmu > 0))
        qrl_die("--%s applies to --device cuda only", S.check_device ? "check-device" : "gpu-memory-utilization");
    if (cuda) {
        char desc[256];
        if (qrl_rollout_gpu_check(device_id, desc, sizeof desc, NULL, &err) != QRL_OK)
            qrl_die("--device cuda (--device-id %d): %s", device_id, err.msg);
        if (S.check_device) {
            printf("%s\n", desc);
            qrl_config_destroy(cfg);
            return 0;
        }
    }
    const char *mpath = S.model, *ds = S.dataset, *task = S.task;
    if (!*mpath) qrl_die("--model is required");
    if (!*ds) qrl_die("--dataset is required");
    if (!qrl_verifier_find(task)) qrl_die("--task: unknown verifier '%s' (qrl-verify --help lists them)", task);
    if (S.threads > 0) omp_set_num_threads(S.threads);
    const int k = S.k, max_new = S.max_tokens;
    const bool greedy = S.greedy, json_only = S.json;
    if (k == 0 && !greedy) qrl_die("--k 0 with --greedy false scores nothing");

    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = S.tokenizer,
                              .tokenizer_option = "--tokenizer"};
    if (qrl_model_load_with_tokenizer(mpath, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        qrl_die_err(&err);
    qrl_precision prec;
    qrl_kv_format kvf;
    if (qrl_precision_parse(S.precision, &prec, &err) != QRL_OK ||
        qrl_kv_format_parse(S.kv_cache, &kvf, &err) != QRL_OK ||
        qrl_model_quantize(m, prec, &err) != QRL_OK)
        qrl_die_err(&err);
    /* the first --n prompts, rendered and tokenized as the learner's dispatcher does */
    qrl_prompt_set ps;
    qrl_prompts_opts po = {.prompt_field = S.prompt_field, .answer_field = S.answer_field,
                           .chat_template = S.chat_template, .tok = tok,
                           .max_tokens = (size_t)m->cfg.max_seq_len - 1, .limit = (size_t)S.n};
    if (qrl_prompts_load(ds, &po, &ps, &err) != QRL_OK) qrl_die_err(&err);
    const qrl_prompt *items = ps.items;
    size_t n = ps.n;

    tally t = {.k = k, .n = (int)n, .greedy = greedy, .items = items,
               .show = S.show};
    t.sum = calloc(n, sizeof *t.sum), t.hits = calloc(n, sizeof *t.hits), t.greedy_r = calloc(n, sizeof *t.greedy_r);
    if (!t.sum || !t.hits || !t.greedy_r) qrl_die("out of memory");
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.max_slots = S.slots;
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
            qrl_die("--%s", err.msg);
    }
    qrl_scheduler *s;
    if (qrl_scheduler_new(m, tok, &sc, on_group, &t, &s, &err) != QRL_OK) qrl_die_err(&err);
    qrl_sampling_params sp = {.temperature = (float)S.temperature, .top_p = (float)S.top_p,
                              .top_k = S.top_k, .seed = (uint64_t)S.seed};
    size_t n_stop_s = S.stop_token_ids.n;
    const char *const *stop_s = S.stop_token_ids.items;
    int32_t stops[16];
    if (n_stop_s > 16) qrl_die("--stop-token-ids: at most 16");
    for (size_t i = 0; i < n_stop_s; i++) {
        char *end;
        long v = strtol(stop_s[i], &end, 10);
        if (end == stop_s[i] || *end || v < 0 || v >= m->cfg.vocab_size)
            qrl_die("--stop-token-ids: '%s' is not a token id in [0, %d)", stop_s[i], m->cfg.vocab_size);
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
            if (qrl_scheduler_submit(s, &g, &err) != QRL_OK) qrl_die("prompt %zu: %s", i, err.msg);
        }
    }
    /* groups submitted: greedy (1 response each) and sampled (k each) */
    const long long groups_all = (long long)n * ((greedy ? 1 : 0) + (k ? 1 : 0));
    const double every = S.progress_s;
    double last = t0;
    while (!qrl_scheduler_idle(s)) {
        if (qrl_scheduler_step(s, NULL, &err) != QRL_OK) qrl_die_err(&err);
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
    qrl_prompts_free(&ps);
    free(t.sum), free(t.hits), free(t.greedy_r);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return 0;
}
