/* The engine alone: the rollout scheduler (common/rollout/scheduler.h) answering one
 * update's worth of prompt groups with nothing else running, the anchor of bench/e2e.sh's
 * loop efficiency (end-to-end rollout tokens/s over this).  Same scheduler settings as a
 * qrl-rollout replica (services/rollout/loop.c): slots, prefill chunk, staleness, KV
 * format and int4-protected widths, EOS from the model, the CUDA engine on device N with
 * the KV pool sized by gpu_memory_utilization; the same prompts as the learner sends
 * (GSM8K JSONL rendered with the tokenizer's chat template and tokenized as
 * the learner does: tasks/prompts.h), G responses per group at the learner's sampling
 * defaults (T = 1, top-p 1, top-k 0), the group's verifier run on every response.
 *
 *   build/bench/e2e_engine --model DIR --dataset FILE.jsonl
 *       [--runs PREC:KV:MAXNEW[:trace][,...]]   (default bf16:bf16:512)
 *       [--groups 16] [--updates 1] [--in-flight G (default --groups)]
 *       [--group-size 8] [--slots 128] [--device N (-1 = CPU; default 0)]
 *       [--gpu-memory-utilization F (0 = off)] [--prefill-chunk 256] [--max-staleness 1]
 *       [--kv-sink 16] [--kv-recent 128] [--prompt-field question] [--answer-field answer]
 *       [--task gsm8k] [--chat-template auto] [--seed 1] [--threads 0] [--warmup 1]
 *       [--max-s 0 (per run; 0 = no limit)] [--label TEXT] [--json FILE]
 *
 * Each run: quantize the model to PREC (from its F32 master copy), make the scheduler,
 * a warm-up group (1 group of G x 16 tokens: cuBLAS handles, first graphs) when --warmup,
 * then submit the U x T groups (--updates U, --groups T) keeping at most F of them in flight
 * (--in-flight F: submitted, not yet emitted; a replica's rollout.max_concurrency) and step
 * until every group is emitted; tokens/s = sampled tokens / wall seconds of that loop
 * (prefill, decode, sampling, verification: what a replica does for the loop's work).  The
 * defaults (U = 1, F = T) are one quota submitted at once, whose batch shrinks in its tail;
 * bench/e2e.sh passes the loop's updates and max_concurrency, so the anchor keeps its slots
 * as full as the overlapping loop can.  With --max-s the loop stops there and the run is
 * marked truncated (tokens/s of the part done).  A run ending in `:trace` turns the TRACE
 * recorder on (default sites, as rollout.trace true: SPEC §6; w4a4-nvfp4 and/or fp4 KV) and
 * reports its record bytes per token and its share of the forward time (the scheduler's
 * trace_capture_us / forward_us); packing the records into TraceChunks and producing them
 * are the daemon's, not counted here.  Prints a table; --json writes
 * {"bench": "e2e_engine", ..., "runs": [...]}. */
#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "model/kv_cache.h"
#include "model/load.h"
#include "model/model.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "tasks/prompts.h"
#include "tokenizer/tokenizer.h"

typedef struct run_spec {
    char precision[32], kv[32];
    int max_new;
    bool trace; /* the TRACE recorder on (":trace") */
} run_spec;

typedef struct tally {
    long long responses, tokens, eos, groups; /* groups emitted */
} tally;

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("e2e_engine: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void on_group(const qrl_scheduler_group_result *r, void *ctx) {
    tally *t = ctx;
    t->groups++;
    for (uint32_t j = 0; j < r->group_size; j++) {
        t->responses++;
        t->tokens += r->responses[j].n_tokens;
        t->eos += r->responses[j].finish == QRL_FINISH_EOS || r->responses[j].finish == QRL_FINISH_STOP;
    }
}

static int parse_runs(const char *s, run_spec *out, int cap) {
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *tokn = strtok_r(dup, ",", &save); tokn; tokn = strtok_r(NULL, ",", &save)) {
        if (n == cap) die("--runs: at most %d runs", cap);
        char p[32], k[32], x[16] = "";
        int mn, got = sscanf(tokn, "%31[^:]:%31[^:]:%d:%15s", p, k, &mn, x);
        if (got < 3 || mn < 1 || (got == 4 && strcmp(x, "trace") != 0))
            die("--runs: '%s' is not PRECISION:KV:MAX_NEW_TOKENS[:trace]", tokn);
        out[n].trace = got == 4;
        snprintf(out[n].precision, sizeof out[n].precision, "%s", p);
        snprintf(out[n].kv, sizeof out[n].kv, "%s", k);
        out[n].max_new = mn;
        n++;
    }
    free(dup);
    if (n == 0) die("--runs: empty");
    return n;
}

static long long int_opt(const char *name, const char *v, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) die("%s: '%s' is not an integer in [%lld, %lld]", name, v, lo, hi);
    return x;
}

int main(int argc, char **argv) {
    const char *model = NULL, *dataset = NULL, *runs_s = "bf16:bf16:512", *pf = "question", *af = "answer";
    const char *task = "gsm8k", *tmpl = "auto", *json_path = NULL, *label = "";
    int groups = 16, updates = 1, in_flight = 0, gsize = 8, slots = 128, device = 0, prefill_chunk = 256, max_stale = 1, sink = 16,
        recent = 128, threads = 0, warmup = 1;
    long long seed = 1;
    double gmu = 0, max_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: e2e_engine --model DIR --dataset FILE.jsonl [--runs PREC:KV:MAXNEW[:trace],...] [--groups 16]\n"
                 "  [--updates 1] [--in-flight GROUPS] [--group-size 8] [--slots 128] [--device N|-1] [--gpu-memory-utilization F] [--prefill-chunk 256]\n"
                 "  [--max-staleness 1] [--kv-sink 16] [--kv-recent 128] [--prompt-field question]\n"
                 "  [--answer-field answer] [--task gsm8k] [--chat-template auto] [--seed 1] [--threads 0]\n"
                 "  [--warmup 0|1] [--max-s S] [--label TEXT] [--json FILE]\n"
                 "The rollout engine alone on one update's prompt groups (bench/e2e.sh's anchor).");
            return 0;
        }
        if (i + 1 >= argc) die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--dataset")) dataset = v;
        else if (!strcmp(a, "--runs")) runs_s = v;
        else if (!strcmp(a, "--groups")) groups = (int)int_opt(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--updates")) updates = (int)int_opt(a, v, 1, 1 << 16);
        else if (!strcmp(a, "--in-flight")) in_flight = (int)int_opt(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--group-size")) gsize = (int)int_opt(a, v, 1, 4096);
        else if (!strcmp(a, "--slots")) slots = (int)int_opt(a, v, 1, 4096);
        else if (!strcmp(a, "--device")) device = (int)int_opt(a, v, -1, 64);
        else if (!strcmp(a, "--gpu-memory-utilization")) gmu = atof(v);
        else if (!strcmp(a, "--prefill-chunk")) prefill_chunk = (int)int_opt(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--max-staleness")) max_stale = (int)int_opt(a, v, -1, 1 << 20);
        else if (!strcmp(a, "--kv-sink")) sink = (int)int_opt(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--kv-recent")) recent = (int)int_opt(a, v, 0, 1 << 20);
        else if (!strcmp(a, "--prompt-field")) pf = v;
        else if (!strcmp(a, "--answer-field")) af = v;
        else if (!strcmp(a, "--task")) task = v;
        else if (!strcmp(a, "--chat-template")) tmpl = v;
        else if (!strcmp(a, "--seed")) seed = int_opt(a, v, 0, (long long)1e15);
        else if (!strcmp(a, "--threads")) threads = (int)int_opt(a, v, 0, 1024);
        else if (!strcmp(a, "--warmup")) warmup = (int)int_opt(a, v, 0, 1);
        else if (!strcmp(a, "--max-s")) max_s = atof(v);
        else if (!strcmp(a, "--label")) label = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else die("unknown option '%s' (see --help)", a);
    }
    if (!model || !dataset) die("--model and --dataset are required (see --help)");
    if (!in_flight) in_flight = groups;
    const int total = groups * updates;
    if (gmu < 0 || gmu > 1) die("--gpu-memory-utilization: %g is outside [0, 1]", gmu);
    if (threads > 0) omp_set_num_threads(threads);
    run_spec runs[64];
    int n_runs = parse_runs(runs_s, runs, 64);

    qrl_error err;
    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    double t_load = now_s();
    qrl_model_load_opts lo = {.tokenizer = NULL, .tokenizer_option = "--model's folder"};
    if (qrl_model_load_with_tokenizer(model, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK) die("%s", err.msg);
    t_load = now_s() - t_load;
    /* the first U x T prompts, rendered and tokenized as the learner's dispatcher does */
    qrl_prompt_set ps;
    qrl_prompts_opts po = {.prompt_field = pf, .answer_field = af, .chat_template = tmpl, .tok = tok,
                           .max_tokens = (size_t)m->cfg.max_seq_len - 1, .limit = (size_t)total};
    if (qrl_prompts_load(dataset, &po, &ps, &err) != QRL_OK) die("%s", err.msg);
    const qrl_prompt *items = ps.items;
    size_t n_items = ps.n;
    double prompt_mean = 0;
    for (size_t i = 0; i < n_items; i++) prompt_mean += (double)items[i].n_ids / (double)n_items;
    if ((int)n_items < total) fprintf(stderr, "e2e_engine: %s has %zu prompts: using them for %d groups\n", dataset, n_items, total);
    size_t params = 0;
    for (int i = 0; i < m->n_tensors; i++)
        params += (size_t)m->tensors[i].shape[0] * (size_t)(m->tensors[i].ndim == 2 ? m->tensors[i].shape[1] : 1);
    printf("e2e_engine: %s (%.2fB parameters, loaded in %.1f s), %d x %d groups x %d, %d in flight, %d slots, "
           "device %d%s, mean prompt %.0f tokens\n", model, (double)params / 1e9, t_load, updates, groups, gsize,
           in_flight, slots, device,
           gmu > 0 ? " (gpu_memory_utilization set)" : "", prompt_mean);

    json_t *jruns = json_array();
    printf("%-12s %-15s %7s %9s %8s %9s %9s %8s %8s %6s %s\n", "precision", "kv", "max_new", "tokens", "seconds",
           "tokens/s", "kv_blocks", "batch", "setup_s", "trunc", "trace B/token, share");
    for (int r = 0; r < n_runs; r++) {
        const run_spec *rs = &runs[r];
        qrl_precision prec;
        qrl_kv_format kvf;
        if (qrl_precision_parse(rs->precision, &prec, &err) != QRL_OK ||
            qrl_kv_format_parse(rs->kv, &kvf, &err) != QRL_OK)
            die("run %d: %s", r, err.msg);
        double t_setup = now_s();
        if (qrl_model_quantize(m, prec, &err) != QRL_OK) die("run %s: %s", rs->precision, err.msg);
        qrl_scheduler_config sc; /* as rd_daemon_run (services/rollout/loop.c) */
        qrl_scheduler_config_default(&sc);
        sc.max_slots = slots;
        sc.prefill_chunk = prefill_chunk;
        sc.max_staleness = max_stale;
        sc.kv_format = kvf;
        sc.kv_sink = sink;
        sc.kv_recent = recent;
        sc.eos_token_id = m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : qrl_tokenizer_eos(tok);
        sc.device = device;
        sc.trace_record = rs->trace; /* default sites (n_clauses 0); before the fit: it counts the recorder */
        if (device >= 0 && gmu > 0 && qrl_scheduler_config_fit_gpu(&sc, m, gmu, &err) != QRL_OK)
            die("run %s/%s: %s", rs->precision, rs->kv, err.msg);
        tally t = {0};
        qrl_scheduler *s;
        if (qrl_scheduler_new(m, tok, &sc, on_group, &t, &s, &err) != QRL_OK)
            die("run %s/%s: %s", rs->precision, rs->kv, err.msg);
        qrl_sampling_params sp = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .seed = (uint64_t)seed};
        uint64_t gid = 1000000;
        if (warmup) {
            qrl_scheduler_group_desc g = {.group_id = gid++, .group_size = (uint32_t)gsize, .prompt = items[0].ids,
                                          .n_prompt = (int)items[0].n_ids, .sampling = sp,
                                          .max_new_tokens = rs->max_new < 16 ? rs->max_new : 16, .task = task,
                                          .reference = items[0].answer};
            if (qrl_scheduler_submit(s, &g, &err) != QRL_OK) die("warm-up: %s", err.msg);
            while (!qrl_scheduler_idle(s))
                if (qrl_scheduler_step(s, NULL, &err) != QRL_OK) die("warm-up: %s", err.msg);
        }
        t_setup = now_s() - t_setup;
        t = (tally){0};
        qrl_scheduler_stats st0, st;
        qrl_scheduler_get_stats(s, &st0);
        double t0 = now_s();
        int submitted = 0;
        bool truncated = false;
        int max_running = 0;
        for (;;) {
            /* keep F groups in flight, as a replica whose max_concurrency is F */
            for (; submitted < total && submitted - t.groups < in_flight; submitted++) {
                const qrl_prompt *it = &items[(size_t)submitted % n_items];
                qrl_scheduler_group_desc g = {.group_id = (uint64_t)submitted, .group_size = (uint32_t)gsize,
                                              .prompt = it->ids, .n_prompt = (int)it->n_ids, .sampling = sp,
                                              .max_new_tokens = rs->max_new, .task = task, .reference = it->answer};
                if (qrl_scheduler_submit(s, &g, &err) != QRL_OK) die("group %d: %s", submitted, err.msg);
            }
            if (submitted == total && qrl_scheduler_idle(s)) break;
            if (qrl_scheduler_step(s, NULL, &err) != QRL_OK) die("step: %s", err.msg);
            qrl_scheduler_get_stats(s, &st);
            if (st.running > max_running) max_running = st.running;
            if (max_s > 0 && now_s() - t0 > max_s) {
                truncated = true;
                break;
            }
        }
        double secs = now_s() - t0;
        qrl_scheduler_get_stats(s, &st);
        uint64_t gen = st.tokens_generated - st0.tokens_generated, steps = st.steps - st0.steps,
                 rows = st.decode_rows - st0.decode_rows, pre = st.prefill_tokens - st0.prefill_tokens;
        double tps = secs > 0 ? (double)gen / secs : 0, batch = steps ? (double)rows / (double)steps : 0;
        /* TRACE: the recorder's host time inside the forward calls (CUDA: not its device work) */
        uint64_t fwd_us = st.forward_us - st0.forward_us, cap_us = st.trace_capture_us - st0.trace_capture_us;
        double share = fwd_us ? (double)cap_us / (double)fwd_us : 0;
        size_t bpt = rs->trace ? qrl_trace_layout_record_bytes_per_token(qrl_scheduler_trace_layout(s)) : 0;
        char tr[64] = "-";
        if (rs->trace) snprintf(tr, sizeof tr, "%zu, %.3f", bpt, share);
        printf("%-12s %-15s %7d %9llu %8.2f %9.0f %9d %8.1f %8.1f %6s %s\n", rs->precision, rs->kv, rs->max_new,
               (unsigned long long)gen, secs, tps, st.kv_total_blocks, batch, t_setup, truncated ? "yes" : "no", tr);
        fflush(stdout);
        json_t *j = json_object();
        json_object_set_new(j, "precision", json_string(rs->precision));
        json_object_set_new(j, "kv_cache", json_string(rs->kv));
        json_object_set_new(j, "max_new_tokens", json_integer(rs->max_new));
        json_object_set_new(j, "groups", json_integer(total));
        json_object_set_new(j, "quota", json_integer(groups));
        json_object_set_new(j, "updates", json_integer(updates));
        json_object_set_new(j, "in_flight", json_integer(in_flight));
        json_object_set_new(j, "group_size", json_integer(gsize));
        json_object_set_new(j, "slots", json_integer(slots));
        json_object_set_new(j, "kv_blocks", json_integer(st.kv_total_blocks));
        json_object_set_new(j, "tokens", json_integer((json_int_t)gen));
        json_object_set_new(j, "prefill_tokens", json_integer((json_int_t)pre));
        json_object_set_new(j, "steps", json_integer((json_int_t)steps));
        json_object_set_new(j, "mean_batch", json_real(batch));
        json_object_set_new(j, "max_running", json_integer(max_running));
        json_object_set_new(j, "responses", json_integer(t.responses));
        json_object_set_new(j, "ended_fraction", json_real(t.responses ? (double)t.eos / (double)t.responses : 0));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "tokens_per_s", json_real(tps));
        json_object_set_new(j, "setup_s", json_real(t_setup));
        json_object_set_new(j, "truncated", json_boolean(truncated));
        json_object_set_new(j, "trace", json_boolean(rs->trace));
        if (rs->trace) {
            json_object_set_new(j, "trace_record_bytes_per_token", json_integer((json_int_t)bpt));
            json_object_set_new(j, "trace_capture_share", json_real(share));
        }
        json_array_append_new(jruns, j);
        qrl_scheduler_free(s);
    }
    if (json_path) {
        json_t *o = json_object();
        json_object_set_new(o, "bench", json_string("e2e_engine"));
        json_object_set_new(o, "label", json_string(label));
        json_object_set_new(o, "model", json_string(model));
        json_object_set_new(o, "params", json_integer((json_int_t)params));
        json_object_set_new(o, "device", json_integer(device));
        json_object_set_new(o, "gpu_memory_utilization", json_real(gmu));
        json_object_set_new(o, "prompt_mean_tokens", json_real(prompt_mean));
        json_object_set_new(o, "load_s", json_real(t_load));
        json_object_set_new(o, "runs", jruns);
        if (json_dump_file(o, json_path, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) != 0)
            die("%s: cannot write", json_path);
        json_decref(o);
    } else {
        json_decref(jruns);
    }
    qrl_prompts_free(&ps);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    return 0;
}
