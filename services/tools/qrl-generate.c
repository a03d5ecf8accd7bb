/* qrl-generate: one-shot offline generation with the CPU reference engine (SPEC §1
 * tools, §4 item 2), or with --device cuda the rollout scheduler's CUDA engine.  One JSON
 * line per response on stdout (--output text: the prompt and its continuation as plain
 * text); errors, usage errors included, are one line "qrl-generate: error: ..." on stderr
 * and exit status 1.
 *
 *   qrl-generate --model PATH [--tokenizer PATH]
 *                (--prompt TEXT | --prompts FILE.jsonl | --prompt-ids 1,2,3)
 *                [--chat-template NAME] [--system TEXT] [--max-new-tokens N]
 *                [--temperature T] [--top-p P] [--top-k K] [--seed S] [--n N] [--stop TEXT]
 *                [--stop-token-ids 1,2] [--stop-at-bos auto|true|false] [--output json|text]
 *                [--precision f32|bf16] [--kv-cache f32|bf16] [--dump-logits FILE.npy]
 *                [--threads N] [--device cuda [--device-id N] [--gpu-memory-utilization F]]
 *
 * Responses of one prompt form a group (group id = prompt index, response index 0..n-1)
 * and draw from the keyed sampler, so output is reproducible for a seed.  --device cuda
 * submits every prompt to the scheduler (common/rollout/scheduler.h, device >= 0: BF16
 * activations, sampling on the GPU with the same keyed draws) and prints the same lines,
 * in prompt order; --dump-logits is CPU only. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <utf8proc.h>

#include "core/config.h"
#include "core/log.h"
#include "core/program.h"
#include "io/npy.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/load.h"
#include "model/model.h"
#include "model/sampler.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "qrl-generate/generate.h"

/* The program's config table (STYLE 10): drives --help, --help-markdown
 * (docs/config-qrl-generate.md), --config FILE.yaml and the --key=value options.
 * A '-' in an option reads as '_', so --max-new-tokens and --max_new_tokens are one key. */
#define O_ opts
static const qrl_config_entry CONFIG[] = {
    QRL_CFG_STRING("model", O_, model, "", false,
                   "HuggingFace folder (config.json + safetensors) or llama2.c .bin (required)"),
    QRL_CFG_STRING("tokenizer", O_, tokenizer, "", false,
                   "tokenizer path; default: the model folder, or tokenizer.bin / tok<vocab>.bin beside the .bin"),
    QRL_CFG_STRING("prompt", O_, prompt, "", false, "one prompt"),
    QRL_CFG_STRING("prompts", O_, prompts_file, "", false,
                   "JSONL file, one object per line with a \"prompt\" string"),
    QRL_CFG_STRING("prompt_ids", O_, prompt_ids, "", false, "token ids, comma-separated (no BOS added)"),
    QRL_CFG_STRING("chat_template", O_, chat_template, "", false,
                   "plain | chatml | llama3: wrap each prompt as a user turn"),
    QRL_CFG_STRING("system", O_, system, "", false, "system message for chat_template"),
    QRL_CFG_INT("max_new_tokens", O_, max_new, "128", 1, 1 << 24, false, "tokens to generate at most"),
    QRL_CFG_DOUBLE("temperature", O_, temperature, "1.0", 0, 1e4, false, "sampling temperature; 0 = greedy"),
    QRL_CFG_DOUBLE("top_p", O_, top_p, "1.0", 1e-6, 1, false, "nucleus sampling mass (1 = off)"),
    QRL_CFG_INT("top_k", O_, top_k, "0", 0, 1 << 30, false, "keep the k most likely tokens (0 = off)"),
    QRL_CFG_INT("seed", O_, seed, "0", 0, INFINITY, false, "sampler seed (SPEC §3 Determinism)"),
    QRL_CFG_INT("n", O_, n, "1", 1, 4096, false, "responses per prompt"),
    QRL_CFG_LIST("stop", O_, stop, "", false, "stop strings, comma-separated (up to 8)"),
    QRL_CFG_LIST("stop_token_ids", O_, stop_id_text, "", false,
                 "token ids that end a response besides EOS (finish_reason stop; up to 16), as qrl-eval's"),
    QRL_CFG_ENUM("stop_at_bos", O_, stop_at_bos, "auto", "auto|true|false", false,
                 "end a response when the model samples BOS (finish_reason stop); auto = for llama2.c "
                 "tokenizers (.bin), whose story models start the next story with BOS"),
    QRL_CFG_ENUM("output", O_, output, "json", "json|text", false,
                 "json: one JSON line per response; text: each prompt followed by its response as plain "
                 "text, responses separated by a blank line"),
    QRL_CFG_ENUM("precision", O_, precision, "f32",
                 "f32|bf16|w8a8-int8|w8a8-fp8|w4a16-nvfp4|w4a16-mxfp4|w4a4-nvfp4", false,
                 "weight/activation format (SPEC §3)"),
    QRL_CFG_ENUM("kv_cache", O_, kv_cache, "f32", "f32|bf16|fp8|int8|int4|fp4|int4-protected", false,
                 "KV-cache format (SPEC §3)"),
    QRL_CFG_INT("kv_sink", O_, kv_sink, "16", 0, 1 << 20, false,
                "int4-protected: first positions kept in INT8 (attention sink)"),
    QRL_CFG_INT("kv_recent", O_, kv_recent, "128", 0, 1 << 20, false,
                "int4-protected: most recent positions kept in INT8"),
    QRL_CFG_STRING("dump_logits", O_, dump_logits, "", false,
                   "write the prompt's per-position logits [positions, vocab] as float32 .npy (one prompt only)"),
    QRL_CFG_INT("threads", O_, threads, "0", 0, 1024, false, "OpenMP threads (0 = all cores)"),
    QRL_CFG_ENUM("device", O_, device_kind, "cpu", "cpu|cuda", false,
                 "engine: cpu (the CPU reference forward) or cuda (the rollout scheduler's CUDA engine: "
                 "f32 runs as bf16; refused in a build without CUDA or where "
                 "the GPU is missing)"),
    QRL_CFG_INT("device_id", O_, device_id, "0", 0, 64, false, "CUDA device ordinal with --device cuda"),
    QRL_CFG_DOUBLE("gpu_memory_utilization", O_, gpu_mem, "0", 0, 1, false,
                   "--device cuda: fraction of the device's memory to use, sizing the KV pool (as "
                   "rollout.gpu_memory_utilization; 0 = off)"),
};
#undef O_

static const char USAGE_HEAD[] =
    "qrl-generate --model PATH [--tokenizer PATH]\n"
    "             (--prompt TEXT | --prompts FILE.jsonl | --prompt-ids 1,2,3) [options]\n"
    "Output: one JSON line per response: prompt, prompt_index, response_index, text,\n"
    "token_ids, logprobs (log softmax(logits/T) over the full vocabulary; T=1 when\n"
    "greedy), finish_reason (eos|length|stop: a --stop string or a stop token id, BOS of\n"
    "llama2.c models by default), prompt_tokens, tokens_per_s.  --output text: plain text.\n"
    "\n";

/* ---- argument parsing --------------------------------------------------------------- */

static const qrl_program PROGRAM = {
    .name = "qrl-generate",
    .usage = USAGE_HEAD,
    .table = CONFIG,
    .n = sizeof CONFIG / sizeof CONFIG[0],
    .quiet = true, /* stdout is the output: logs from WARN up unless QRL_LOG_LEVEL says */
};

/* An optional string option is NULL when it was never given (an explicit "" is a value:
 * an empty prompt is valid). */
static void unless_given(const qrl_config_t *cfg, const char *key, const char **field) {
    if (strcmp(qrl_config_origin(cfg, key), "default") == 0) *field = NULL;
}

/* The settings into *o, then the checks that need no model.  A one-shot tool: *o is a
 * snapshot (bound once, then unbound), so its optional strings may be set to NULL; the
 * strings point into cfg, which the caller keeps until the end. */
static void resolve_opts(qrl_config_t *cfg, opts *o) {
    *o = (opts){0};
    qrl_config_bind(cfg, o);
    qrl_config_bind(cfg, NULL);
    unless_given(cfg, "model", &o->model);
    unless_given(cfg, "tokenizer", &o->tokenizer);
    unless_given(cfg, "prompt", &o->prompt);
    unless_given(cfg, "prompts", &o->prompts_file);
    unless_given(cfg, "prompt_ids", &o->prompt_ids);
    unless_given(cfg, "chat_template", &o->chat_template);
    unless_given(cfg, "system", &o->system);
    unless_given(cfg, "dump_logits", &o->dump_logits);
    o->device = o->device_kind == DEVICE_CUDA ? o->device_id : -1;
    if (o->stop_id_text.n > MAX_STOP_IDS) qrl_die("--stop-token-ids: at most %d ids", MAX_STOP_IDS);
    if (o->device < 0 && o->gpu_mem > 0) qrl_die("--gpu-memory-utilization applies to --device cuda only");
    if (o->stop.n > MAX_STOPS) qrl_die("--stop: at most %d stop strings", MAX_STOPS);
    for (size_t i = 0; i < o->stop.n; i++) {
        if (!*o->stop.items[i]) qrl_die("--stop: empty stop string");
        o->stops[o->n_stops++] = o->stop.items[i];
    }
    if (!o->model) qrl_die("--model is required (see --help)");
    if (!!o->prompt + !!o->prompts_file + !!o->prompt_ids != 1)
        qrl_die("give exactly one of --prompt, --prompts, --prompt-ids");
    if (o->prompt_ids && o->chat_template) qrl_die("--chat-template does not apply to --prompt-ids");
    if (o->system && !o->chat_template) qrl_die("--system needs --chat-template");
    if (o->device >= 0 && o->dump_logits)
        qrl_die("--dump-logits runs on the CPU engine only (not with --device cuda)");
    if (o->device >= 0) { /* refused before anything is loaded */
        qrl_error err;
        if (qrl_rollout_gpu_check(o->device, NULL, 0, NULL, &err) != QRL_OK)
            qrl_die("--device cuda (--device-id %d): %s", o->device, err.msg);
    }
}

/* Precision of SPEC §3 (every row of the table runs on the CPU engine). */
static qrl_precision check_precision(const char *p) {
    qrl_precision prec;
    qrl_error err;
    if (qrl_precision_parse(p, &prec, &err) != QRL_OK) qrl_die_err(&err);
    return prec;
}

/* ---- generation ----------------------------------------------------------------------- */

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

bool is_eos(const qrl_model *m, const qrl_tokenizer *tok, int32_t t) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_ids[i] == t) return true;
    return tok && qrl_tokenizer_eos(tok) == t;
}

bool is_stop_id(const opts *o, int32_t t) {
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] == t) return true;
    return false;
}

/* --stop-token-ids checked against the vocabulary, then BOS when --stop-at-bos says so
 * (auto: a llama2.c tokenizer, tokenizer.bin / tok<V>.bin: its story models sample BOS
 * to start the next story, as llama2.c's run.c stops there). */
static void resolve_stop_ids(opts *o, const qrl_model *m, const qrl_tokenizer *tok, const char *tpath) {
    for (size_t i = 0; i < o->stop_id_text.n; i++) {
        const char *t = o->stop_id_text.items[i];
        char *end;
        errno = 0;
        long v = strtol(t, &end, 10);
        if (errno || end == t || *end || v < 0 || v >= m->cfg.vocab_size)
            qrl_die("--stop-token-ids: '%s' is not a token id in [0, %d)", t, m->cfg.vocab_size);
        o->stop_ids[o->n_stop_ids++] = (int32_t)v;
    }
    size_t tl = strlen(tpath);
    bool llama2c = tl > 4 && strcmp(tpath + tl - 4, ".bin") == 0;
    int32_t bos = tok ? qrl_tokenizer_bos(tok) : -1;
    if (bos >= 0 && (o->stop_at_bos == STOP_AT_BOS_TRUE || (o->stop_at_bos == STOP_AT_BOS_AUTO && llama2c)) && !is_stop_id(o, bos) &&
        !is_eos(m, tok, bos))
        o->stop_ids[o->n_stop_ids++] = bos;
}


/* Record a sampled token; decide whether the response is finished. */
static void take(engine *e, const prompt *p, response *r, const qrl_sample *s, int pos) {
    r->tokens[r->n] = s->token;
    r->logprobs[r->n] = s->logprob;
    r->n++;
    if (is_eos(e->m, e->tok, s->token)) r->finish = "eos";
    else if (is_stop_id(e->o, s->token)) r->finish = "stop";
    else if (r->n >= e->o->max_new || pos >= e->ctx) r->finish = "length";
    else if (e->o->n_stops && e->tok) {
        char *text = response_text(e->tok, p, r);
        for (int i = 0; i < e->o->n_stops; i++)
            if (strstr(text, e->o->stops[i])) r->finish = "stop";
        free(text);
    }
}

static void generate_group(engine *e, prompt *p, int pi) {
    const opts *o = e->o;
    int V = e->m->cfg.vocab_size, np = (int)p->n_ids;
    qrl_error err;
    qrl_sampling_params sp = {.temperature = o->temperature, .top_k = o->top_k,
                              .top_p = o->top_p, .seed = (uint64_t)o->seed};
    response *rs = calloc((size_t)o->n, sizeof *rs);
    double t0 = now_s();
    if (qrl_kv_cache_seq_new(e->kv, &rs[0].seq, &err) != QRL_OK) qrl_die_err(&err);
    bool dump = o->dump_logits != NULL;
    if (qrl_forward_prefill(e->fwd, e->kv, rs[0].seq, p->ids, np, e->logits, dump, &err) != QRL_OK)
        qrl_die_err(&err);
    if (dump) {
        int64_t shape[2] = {np, V};
        if (qrl_npy_write_f32(o->dump_logits, e->logits, 2, shape, &err) != QRL_OK) qrl_die_err(&err);
        memmove(e->logits, e->logits + (size_t)(np - 1) * V, (size_t)V * sizeof(float));
    }
    for (int i = 0; i < o->n; i++) {
        if (i > 0 && qrl_kv_cache_seq_fork(e->kv, rs[0].seq, &rs[i].seq, &err) != QRL_OK)
            qrl_die_err(&err);
        rs[i].tokens = malloc((size_t)o->max_new * sizeof(int32_t));
        rs[i].logprobs = malloc((size_t)o->max_new * sizeof(float));
        qrl_sample s;
        if (qrl_sampler_sample(e->sampler, e->logits, &sp, (uint64_t)pi, (uint32_t)i,
                               (uint32_t)np, &s, &err) != QRL_OK)
            qrl_die_err(&err);
        take(e, p, &rs[i], &s, np);
    }
    int *seqs = malloc((size_t)o->n * sizeof(int)), *who = malloc((size_t)o->n * sizeof(int));
    int32_t *toks = malloc((size_t)o->n * sizeof(int32_t));
    for (;;) {
        int b = 0;
        for (int i = 0; i < o->n; i++) {
            if (rs[i].finish) continue;
            seqs[b] = rs[i].seq;
            toks[b] = rs[i].tokens[rs[i].n - 1];
            who[b++] = i;
        }
        if (b == 0) break;
        if (qrl_forward_decode(e->fwd, e->kv, seqs, toks, b, e->logits, &err) != QRL_OK)
            qrl_die_err(&err);
        for (int j = 0; j < b; j++) {
            response *r = &rs[who[j]];
            int pos = np + r->n; /* position of the token being sampled */
            qrl_sample s;
            if (qrl_sampler_sample(e->sampler, e->logits + (size_t)j * V, &sp, (uint64_t)pi,
                                   (uint32_t)who[j], (uint32_t)pos, &s, &err) != QRL_OK)
                qrl_die_err(&err);
            take(e, p, r, &s, pos);
        }
    }
    double secs = now_s() - t0;
    for (int i = 0; i < o->n; i++) {
        char *text = response_text(e->tok, p, &rs[i]);
        if (text && strcmp(rs[i].finish, "stop") == 0) /* cut at the earliest stop string */
            for (int k = 0; k < o->n_stops; k++) {
                char *at = strstr(text, o->stops[k]);
                if (at) *at = '\0';
            }
        emit(o, p, pi, i, &rs[i], text, secs);
        free(text);
        qrl_kv_cache_seq_free(e->kv, rs[i].seq);
        free(rs[i].tokens);
        free(rs[i].logprobs);
    }
    free(seqs);
    free(who);
    free(toks);
    free(rs);
}

int main(int argc, char **argv) {
    qrl_config_t *cfg;
    int rc = qrl_program_start(&PROGRAM, argc, argv, &cfg, NULL);
    if (rc != QRL_PROGRAM_RUN) return rc;
    opts o;
    resolve_opts(cfg, &o);
    qrl_precision prec = check_precision(o.precision);
    qrl_error err;
    qrl_kv_format kvf;
    if (qrl_kv_format_parse(o.kv_cache, &kvf, &err) != QRL_OK) qrl_die_err(&err);
    if (o.kv_sink < 0 || o.kv_recent < 0)
        qrl_die("--kv-sink %d and --kv-recent %d must be >= 0", o.kv_sink, o.kv_recent);
    if (o.threads > 0) omp_set_num_threads(o.threads);

    /* default tokenizer: the HF folder itself; next to a .bin: tokenizer.bin or tok<V>.bin;
     * none is fine with --prompt-ids (ids in, ids out) */
    qrl_model *m;
    qrl_tokenizer *tok;
    char tpath[4096];
    qrl_model_load_opts lo = {.tokenizer = o.tokenizer, .tokenizer_optional = true};
    if (qrl_model_load_with_tokenizer(o.model, &lo, &m, &tok, tpath, sizeof tpath, &err) != QRL_OK)
        qrl_die_err(&err);
    int V = m->cfg.vocab_size;
    if (!tok && !o.prompt_ids)
        qrl_die("no tokenizer found for %s (tokenizer.json, vocab.json, tokenizer.bin or tok%d.bin); "
            "give --tokenizer", o.model, V);
    /* linear layers quantized at load; LM head and embedding stay F32 (bf16: BF16) */
    if (qrl_model_quantize(m, prec, &err) != QRL_OK) qrl_die_err(&err);
    /* a tokenizer may be smaller than the embedding (padded vocabularies), never larger */
    if (tok && qrl_tokenizer_vocab_size(tok) > V)
        qrl_die("%s: tokenizer vocabulary %d is larger than the model's %d: wrong tokenizer for %s?",
            tpath, qrl_tokenizer_vocab_size(tok), V, o.model);
    if (o.n_stops && !tok) qrl_die("--stop needs a tokenizer");
    resolve_stop_ids(&o, m, tok, tpath);

    int n_prompts = 1;
    prompt *ps;
    if (o.prompts_file) {
        ps = read_prompts_file(o.prompts_file, &n_prompts);
    } else {
        ps = calloc(1, sizeof *ps);
        if (o.prompt) ps[0].text = strdup(o.prompt);
        else ps[0].ids = parse_id_list(o.prompt_ids, &ps[0].n_ids, V);
    }
    if (o.dump_logits && n_prompts != 1) qrl_die("--dump-logits needs a single prompt");
    size_t max_prompt = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (ps[i].text) encode_prompt(&o, tok, &ps[i]);
        if (ps[i].n_ids > (size_t)m->cfg.max_seq_len)
            qrl_die("prompt %d has %zu tokens; the model's context is %d positions", i, ps[i].n_ids,
                m->cfg.max_seq_len);
        if (ps[i].n_ids > max_prompt) max_prompt = ps[i].n_ids;
    }

    engine e = {.o = &o, .m = m, .tok = tok};
    int64_t want = (int64_t)max_prompt + o.max_new;
    e.ctx = want < m->cfg.max_seq_len ? (int)want : m->cfg.max_seq_len;
    if (o.device >= 0) {
        generate_cuda(&e, ps, n_prompts);
        free_prompts(ps, n_prompts);
        qrl_tokenizer_free(tok);
        qrl_model_free(m);
        qrl_config_destroy(cfg);
        return 0;
    }
    int blocks_per_seq = (e.ctx + BLOCK_SIZE - 1) / BLOCK_SIZE;
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = BLOCK_SIZE,
                           .n_blocks = blocks_per_seq * o.n, .max_seqs = o.n,
                           .max_seq_len = e.ctx, .format = kvf,
                           /* a window wider than the context protects all of it */
                           .protected_sink = o.kv_sink < e.ctx ? o.kv_sink : e.ctx,
                           .protected_recent = o.kv_recent < e.ctx ? o.kv_recent : e.ctx};
    if (qrl_kv_cache_new(&d, &e.kv, &err) != QRL_OK) qrl_die_err(&err);
    int rows = o.n > PREFILL_ROWS ? o.n : PREFILL_ROWS;
    if (qrl_forward_new(m, rows, e.ctx, &e.fwd, &err) != QRL_OK) qrl_die_err(&err);
    if (qrl_sampler_new(V, &e.sampler, &err) != QRL_OK) qrl_die_err(&err);
    size_t lrows = o.dump_logits ? (max_prompt > (size_t)o.n ? max_prompt : (size_t)o.n) : (size_t)o.n;
    e.logits = malloc(lrows * V * sizeof(float));
    if (!e.logits) qrl_die("out of memory for logits");

    for (int i = 0; i < n_prompts; i++) generate_group(&e, &ps[i], i);

    free_prompts(ps, n_prompts);
    free(e.logits);
    qrl_sampler_free(e.sampler);
    qrl_forward_free(e.fwd);
    qrl_kv_cache_free(e.kv);
    qrl_tokenizer_free(tok);
    qrl_model_free(m);
    qrl_config_destroy(cfg);
    return 0;
}
