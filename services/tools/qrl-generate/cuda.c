/* qrl-generate --device cuda: every prompt through the rollout scheduler's CUDA engine, printed in
 * prompt order as the CPU path prints them. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/log.h"
#include "core/program.h"
#include "rollout/gpu_memory.h"
#include "rollout/scheduler.h"
#include "generate.h"

/* ---- --device cuda: the rollout scheduler's CUDA engine ------------------------------- */

typedef struct gpu_run {
    engine *e;
    prompt *ps;
    int n_prompts, next;  /* next prompt to print */
    response **done;      /* [n_prompts]: the group's n responses once finished, else NULL */
    double *secs;         /* [n_prompts] submit -> finished */
} gpu_run;

static void on_gpu_group(const qrl_scheduler_group_result *g, void *ctx) {
    gpu_run *r = ctx;
    const engine *e = r->e;
    int pi = (int)g->group_id;
    response *rs = calloc(g->group_size, sizeof *rs);
    if (!rs) qrl_die("out of memory");
    for (uint32_t i = 0; i < g->group_size; i++) {
        const qrl_scheduler_response *x = &g->responses[i];
        response *y = &rs[i];
        y->n = x->n_tokens;
        y->tokens = malloc(((size_t)x->n_tokens + 1) * sizeof *y->tokens);
        y->logprobs = malloc(((size_t)x->n_tokens + 1) * sizeof *y->logprobs);
        if (!y->tokens || !y->logprobs) qrl_die("out of memory");
        memcpy(y->tokens, x->tokens, (size_t)x->n_tokens * sizeof *y->tokens);
        memcpy(y->logprobs, x->logprobs_full, (size_t)x->n_tokens * sizeof *y->logprobs); /* as qrl_sample.logprob */
        /* every EOS id the CPU path knows ends with "eos" (the scheduler takes one EOS id,
         * the others come in as stop ids) */
        bool eos = x->n_tokens > 0 && is_eos(e->m, e->tok, x->tokens[x->n_tokens - 1]);
        y->finish = x->finish == QRL_FINISH_EOS || (x->finish == QRL_FINISH_STOP && eos) ? "eos"
                                                                                         : qrl_finish_reason_name(x->finish);
    }
    r->done[pi] = rs;
    r->secs[pi] = (double)g->total_us * 1e-6;
}

/* Print the finished prompts at the head of the order (the CPU path's output order). */
static void gpu_flush(gpu_run *r) {
    const opts *o = r->e->o;
    while (r->next < r->n_prompts && r->done[r->next]) {
        int pi = r->next++;
        response *rs = r->done[pi];
        for (int i = 0; i < o->n; i++) {
            char *text = response_text(r->e->tok, &r->ps[pi], &rs[i]);
            if (text && strcmp(rs[i].finish, "stop") == 0) /* cut at the earliest stop string */
                for (int k = 0; k < o->n_stops; k++) {
                    char *at = strstr(text, o->stops[k]);
                    if (at) *at = '\0';
                }
            emit(o, &r->ps[pi], pi, i, &rs[i], text, r->secs[pi]);
            free(text);
            free(rs[i].tokens);
            free(rs[i].logprobs);
        }
        free(rs);
        r->done[pi] = NULL;
    }
}

void generate_cuda(engine *e, prompt *ps, int n_prompts) {
    const opts *o = e->o;
    const qrl_model *m = e->m;
    qrl_error err;
    qrl_kv_format kvf;
    if (qrl_kv_format_parse(o->kv_cache, &kvf, &err) != QRL_OK) qrl_die_err(&err);
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    long long want = (long long)o->n * n_prompts;
    sc.max_slots = (int)(want < 256 ? want : o->n > 256 ? o->n : 256);
    sc.kv_format = kvf;
    sc.kv_sink = o->kv_sink < e->ctx ? o->kv_sink : e->ctx;
    sc.kv_recent = o->kv_recent < e->ctx ? o->kv_recent : e->ctx;
    sc.max_ctx = e->ctx;
    sc.device = o->device;
    /* EOS: the model's first id (else the tokenizer's); the others as stop ids */
    int32_t stops[QRL_MODEL_MAX_EOS + 1 + MAX_STOP_IDS + 1];
    int n_stop_ids = 0;
    sc.eos_token_id = m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : e->tok ? qrl_tokenizer_eos(e->tok) : -1;
    for (int i = 1; i < m->cfg.n_eos; i++) stops[n_stop_ids++] = m->cfg.eos_ids[i];
    if (e->tok && qrl_tokenizer_eos(e->tok) >= 0 && qrl_tokenizer_eos(e->tok) != sc.eos_token_id)
        stops[n_stop_ids++] = qrl_tokenizer_eos(e->tok);
    for (int i = 0; i < o->n_stop_ids; i++) stops[n_stop_ids++] = o->stop_ids[i]; /* finish "stop" */
    if (o->gpu_mem > 0 && qrl_scheduler_config_fit_gpu(&sc, m, o->gpu_mem, &err) != QRL_OK)
        qrl_die("--%s", err.msg);
    gpu_run r = {.e = e, .ps = ps, .n_prompts = n_prompts,
                 .done = calloc((size_t)n_prompts, sizeof *r.done),
                 .secs = calloc((size_t)n_prompts, sizeof *r.secs)};
    if (!r.done || !r.secs) qrl_die("out of memory");
    qrl_scheduler *s;
    if (qrl_scheduler_new(m, e->tok, &sc, on_gpu_group, &r, &s, &err) != QRL_OK)
        qrl_die("--device cuda: %s", err.msg);
    for (int i = 0; i < n_prompts; i++) {
        qrl_scheduler_group_desc g = {
            .group_id = (uint64_t)i, .group_size = (uint32_t)o->n, .prompt = ps[i].ids,
            .n_prompt = (int)ps[i].n_ids,
            .sampling = {.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p,
                         .seed = (uint64_t)o->seed},
            .max_new_tokens = o->max_new, .stop_token_ids = stops, .n_stop_token_ids = n_stop_ids,
            .stop_strings = o->n_stops ? o->stops : NULL, .n_stop_strings = o->n_stops};
        if (qrl_scheduler_submit(s, &g, &err) != QRL_OK) qrl_die("prompt %d: %s", i, err.msg);
    }
    while (!qrl_scheduler_idle(s)) {
        if (qrl_scheduler_step(s, NULL, &err) != QRL_OK) qrl_die_err(&err);
        gpu_flush(&r);
    }
    gpu_flush(&r);
    qrl_scheduler_free(s);
    free(r.done);
    free(r.secs);
}
