/* qrl-generate's parts (services/tools/qrl-generate.c is the program; this folder holds the
 * rest): options and the types its parts share, the prompt readers (prompts.c), the JSON /
 * text output (output.c) and the --device cuda path on the rollout scheduler (cuda.c). */
#ifndef QRL_TOOLS_GENERATE_H
#define QRL_TOOLS_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "tokenizer/tokenizer.h"

#define BLOCK_SIZE 16
#define PREFILL_ROWS 64
#define MAX_STOPS 8
#define MAX_STOP_IDS 16

enum { STOP_AT_BOS_AUTO, STOP_AT_BOS_TRUE, STOP_AT_BOS_FALSE }; /* choices order */
enum { OUTPUT_JSON, OUTPUT_TEXT };
enum { DEVICE_CPU, DEVICE_CUDA };

typedef struct opts {
    /* the keys of CONFIG (qrl_config_bind); the string options marked optional are NULL
     * when never given (an explicit "" is a value: an empty prompt is valid) */
    const char *model, *tokenizer, *prompt, *prompts_file, *prompt_ids, *chat_template, *system; /* optional */
    const char *dump_logits;            /* optional */
    const char *precision, *kv_cache;   /* enum names */
    int max_new, top_k, n, threads;
    int stop_at_bos;                    /* STOP_AT_BOS_*: auto = for llama2.c tokenizers */
    int output;                         /* OUTPUT_* */
    int kv_sink, kv_recent;             /* int4-protected side-cache widths (SPEC §3 KV4-RL) */
    int device_kind, device_id;         /* DEVICE_*; the CUDA ordinal */
    double gpu_mem;                     /* --gpu-memory-utilization (0 = off) */
    float temperature, top_p;
    int64_t seed;
    qrl_config_list stop;               /* --stop strings */
    qrl_config_list stop_id_text;       /* --stop-token-ids as given, checked once the model loads */
    /* derived */
    const char *stops[MAX_STOPS];
    int n_stops;
    int32_t stop_ids[MAX_STOP_IDS + 1]; /* --stop-token-ids, and BOS (--stop-at-bos) */
    int n_stop_ids;
    int device;                         /* -1 = CPU; >= 0 = the scheduler's CUDA engine on that ordinal */
} opts;

typedef struct prompt {
    char *text;     /* NULL for --prompt-ids */
    int32_t *ids;
    size_t n_ids;
} prompt;

typedef struct response {
    int seq;
    int32_t *tokens;  /* [max_new] */
    float *logprobs;
    int n;
    const char *finish; /* NULL while running */
} response;

typedef struct engine {
    const opts *o;
    const qrl_model *m;
    const qrl_tokenizer *tok;
    qrl_forward *fwd;
    qrl_kv_cache *kv;
    qrl_sampler *sampler;
    int ctx;
    float *logits; /* [max(n, prompt_len if dumping), vocab] */
} engine;


/* prompts.c */
/* "1,2,3" as token ids (each < vocab); *n ids; malloc'd.  Dies (one error line) on bad text. */
int32_t *parse_id_list(const char *s, size_t *n, int vocab);
/* Free ps[0..n) and ps. */
void free_prompts(prompt *ps, int n);
/* One {"prompt": "..."} object per line of path (blank lines skipped); *n_out prompts; dies naming the line. */
prompt *read_prompts_file(const char *path, int *n_out);
/* p->ids from p->text with --chat-template / --system applied; dies when it encodes to nothing. */
void encode_prompt(const opts *o, const qrl_tokenizer *tok, prompt *p);

/* output.c */
/* The decoded text of r's tokens (malloc'd; NULL without a tokenizer). */
char *response_text(const qrl_tokenizer *tok, const prompt *p, const response *r);
/* s with every invalid UTF-8 sequence replaced by U+FFFD (malloc'd). */
char *utf8_lossy(const char *s);
/* Print response ri of prompt pi: one JSON line (ids, log-probs, finish_reason, text) or, with
 * --output text, the prompt and its continuation; a failed stdout write dies. */
void emit(const opts *op, const prompt *p, int pi, int ri, const response *r, char *text, double secs);

/* cuda.c */
/* Every prompt as one group of --n on the scheduler's CUDA engine (e->o->device), printed in prompt order. */
void generate_cuda(engine *e, prompt *ps, int n_prompts);

/* qrl-generate.c */
/* Monotonic seconds. */
double now_s(void);
/* Whether t is one of the model's EOS ids or the tokenizer's. */
bool is_eos(const qrl_model *m, const qrl_tokenizer *tok, int32_t t);
/* Whether t is a --stop-token-ids id (or BOS under --stop-at-bos). */
bool is_stop_id(const opts *o, int32_t t);

#endif
