/* Helpers for the scheduler tests (header-only): the stories260K model and tokenizer,
 * a result collector that copies each emitted group, a driver and an independent
 * log-prob recomputation by fresh prefill. */
#ifndef QRL_TESTS_SCHED_TEST_UTIL_H
#define QRL_TESTS_SCHED_TEST_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "rollout/scheduler.h"
#include "support/test_files.h"

#define ST_MAX_GROUPS 32

typedef struct st_resp {
    int32_t *tok;
    float *lp, *lpf;
    uint64_t *ver;
    int n;
    qrl_finish_reason finish;
    char *text;
    double reward;
    bool correct;
    char extracted[QRL_VERIFY_EXTRACTED_MAX];
    qrl_status verify_status;
    uint32_t reprefills, restarts, truncated;
} st_resp;

typedef struct st_group {
    uint64_t id;
    uint32_t G;
    int n_prompt;
    int emitted; /* times emitted */
    st_resp *r;
} st_group;

typedef struct st_collect {
    st_group g[ST_MAX_GROUPS];
    int n;
} st_collect;

static inline st_group *st_find(st_collect *c, uint64_t id) {
    for (int i = 0; i < c->n; i++)
        if (c->g[i].id == id) return &c->g[i];
    return NULL;
}

static inline void *st_dup(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    cr_assert_not_null(q);
    if (n) memcpy(q, p, n);
    return q;
}

static inline void st_on_group(const qrl_scheduler_group_result *res, void *ctx) {
    st_collect *c = ctx;
    st_group *g = st_find(c, res->group_id);
    if (g) { /* emitted twice: recorded, the test asserts emitted == 1 */
        g->emitted++;
        return;
    }
    cr_assert_lt(c->n, ST_MAX_GROUPS);
    g = &c->g[c->n++];
    g->id = res->group_id;
    g->G = res->group_size;
    g->n_prompt = res->n_prompt;
    g->emitted = 1;
    g->r = calloc(res->group_size, sizeof *g->r);
    for (uint32_t i = 0; i < res->group_size; i++) {
        const qrl_scheduler_response *s = &res->responses[i];
        st_resp *d = &g->r[i];
        d->n = s->n_tokens;
        d->tok = st_dup(s->tokens, sizeof(int32_t) * (size_t)s->n_tokens);
        d->lp = st_dup(s->logprobs, sizeof(float) * (size_t)s->n_tokens);
        d->lpf = st_dup(s->logprobs_full, sizeof(float) * (size_t)s->n_tokens);
        d->ver = st_dup(s->versions, sizeof(uint64_t) * (size_t)s->n_tokens);
        d->finish = s->finish;
        d->text = strdup(s->text);
        d->reward = s->reward;
        d->correct = s->correct;
        snprintf(d->extracted, sizeof d->extracted, "%s", s->extracted);
        d->verify_status = s->verify_status;
        d->reprefills = s->reprefills;
        d->restarts = s->restarts;
        d->truncated = s->truncated_tokens;
    }
}

static inline void st_collect_free(st_collect *c) {
    for (int i = 0; i < c->n; i++) {
        for (uint32_t j = 0; j < c->g[i].G; j++) {
            st_resp *r = &c->g[i].r[j];
            free(r->tok);
            free(r->lp);
            free(r->lpf);
            free(r->ver);
            free(r->text);
        }
        free(c->g[i].r);
    }
    c->n = 0;
}

/* Step until idle (bounded); returns the number of steps. */
static inline int st_run(qrl_scheduler *s) {
    qrl_error err;
    int steps = 0;
    while (!qrl_scheduler_idle(s)) {
        cr_assert_eq(qrl_scheduler_step(s, NULL, &err), QRL_OK, "step: %s", err.msg);
        cr_assert_lt(++steps, 100000, "scheduler does not finish");
    }
    return steps;
}

static inline void st_step(qrl_scheduler *s, int n) {
    qrl_error err;
    for (int i = 0; i < n; i++)
        cr_assert_eq(qrl_scheduler_step(s, NULL, &err), QRL_OK, "step: %s", err.msg);
}

static inline qrl_model *st_load_model(void) {
    char bin[512];
    if (!qrl_test_data_path("llama2c_stories260K/stories260K.bin", bin, sizeof bin))
        cr_skip_test("stories260K data not found at %s", bin);
    qrl_model *m = NULL;
    qrl_error err;
    cr_assert_eq(qrl_model_load(bin, &m, &err), QRL_OK, "%s", err.msg);
    return m;
}

static inline qrl_tokenizer *st_load_tok(void) {
    char p[512];
    if (!qrl_test_data_path("llama2c_stories260K/tok512.bin", p, sizeof p))
        cr_skip_test("tok512.bin not found at %s", p);
    qrl_tokenizer *t = NULL;
    qrl_error err;
    cr_assert_eq(qrl_tokenizer_load(p, 512, &t, &err), QRL_OK, "%s", err.msg);
    return t;
}

/* Weights moved a little (deterministically): the "next policy" for swap tests. */
static inline void st_perturb(qrl_model *m, double amount) {
    for (size_t i = 0; i < m->arena_floats; i++)
        m->arena[i] *= (float)(1.0 + amount * sin((double)i * 0.7));
}

/* Encode text with BOS; *n set.  Caller frees. */
static inline int32_t *st_encode(const qrl_tokenizer *t, const char *text, int *n) {
    int32_t *ids = NULL;
    size_t nn = 0;
    qrl_error err;
    cr_assert_eq(qrl_tokenizer_encode(t, text, strlen(text), true, false, &ids, &nn, &err), QRL_OK,
                 "%s", err.msg);
    *n = (int)nn;
    return ids;
}

/* Independent reference: prefill prompt + tokens into a fresh cache and return, for each
 * generated token i, log softmax(logits / T)[tok[i]] computed in double (T <= 0: 1). */
static inline void st_recompute(const qrl_model *m, const int32_t *prompt, int np,
                                const int32_t *tok, int n, float T, double *out) {
    const qrl_model_config *c = &m->cfg;
    int L = np + n, V = c->vocab_size;
    qrl_kv_cache_desc kd = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                            .head_dim = c->head_dim, .block_size = 16,
                            .n_blocks = (L + 15) / 16, .max_seqs = 1, .max_seq_len = L,
                            .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv = NULL;
    qrl_forward *f = NULL;
    qrl_error err;
    int seq;
    cr_assert_eq(qrl_kv_cache_new(&kd, &kv, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_forward_new(m, 64, L, &f, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seq, &err), QRL_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
    float *logits = malloc(sizeof(float) * (size_t)L * (size_t)V);
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(ids + np, tok, sizeof(int32_t) * (size_t)n);
    cr_assert_eq(qrl_forward_prefill(f, kv, seq, ids, L, logits, true, &err), QRL_OK, "%s",
                 err.msg);
    double t = T > 0 ? T : 1.0;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)(np + i - 1) * V;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, row[v] / t);
        for (int v = 0; v < V; v++) sum += exp(row[v] / t - mx);
        out[i] = row[tok[i]] / t - mx - log(sum);
    }
    free(ids);
    free(logits);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
}

#endif
