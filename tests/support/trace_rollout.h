/* Test helper (header-only) for the QAT tests, tests/unit/test_model_train_qat.c and
 * tests/cuda/test_cuda_train_qat.c: a CPU rollout recording TRACE (SPEC §6) at every site
 * of every layer, w4a4-nvfp4 weights and activations and the fp4 KV cache, that keeps each
 * vector the recorder quantized (the scheduler's tap) so a test can run the learner's
 * quantizer on the rollout's own inputs, and decodes each response's records as the
 * learner does. */
#ifndef QRL_TESTS_SUPPORT_TRACE_ROLLOUT_H
#define QRL_TESTS_SUPPORT_TRACE_ROLLOUT_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/trace_rec.h"
#include "rollout/scheduler.h"

#define TRACE_ROLLOUT_MAX_TAPS 100000

/* One recorded vector: the tap's arguments, labelled when its group ends. */
typedef struct trace_tap {
    const qrl_trace_buf *buf; /* the response's record buffer (compared only: freed after
                                 the group's callback) */
    uint32_t token, site, n;  /* response token, index into the layout's sites, length */
    uint32_t id;              /* the site id (layer << 16 | kind << 12 | head); set with resp */
    int resp;                 /* response index in its group; -1 until the group ends, and for
                                 a tap past the response's last token */
    float *x;                 /* the vector [n] F32 (owned) */
} trace_tap;

/* The taps of one rollout, in the order the recorder quantized them, and the test's group
 * callback (called after the group's taps are labelled). */
typedef struct trace_rollout {
    trace_tap *t; /* [n], room for TRACE_ROLLOUT_MAX_TAPS */
    size_t n;
    const qrl_model *m; /* the rollout's model (borrowed) */
    qrl_scheduler_group_fn on_group;
    void *ctx;
} trace_rollout;

static inline void trace_rollout_on_tap_(void *ctx, const qrl_trace_buf *buf, uint32_t token,
                                         uint32_t site, const float *x, uint32_t n) {
    trace_rollout *tr = ctx;
    cr_assert_lt(tr->n, TRACE_ROLLOUT_MAX_TAPS);
    float *copy = malloc((size_t)n * sizeof *x);
    cr_assert_not_null(copy);
    memcpy(copy, x, (size_t)n * sizeof *x);
    tr->t[tr->n++] = (trace_tap){.buf = buf, .token = token, .site = site, .n = n, .resp = -1,
                                 .x = copy};
}

static inline void trace_rollout_on_group_(const qrl_scheduler_group_result *res, void *ctx) {
    trace_rollout *tr = ctx;
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        const uint32_t *ids = qrl_trace_layout_site_ids(qrl_trace_buf_layout(o->trace));
        for (size_t i = 0; i < tr->n; i++)
            if (tr->t[i].buf == o->trace && tr->t[i].token < (uint32_t)o->n_tokens) {
                tr->t[i].resp = (int)r;
                tr->t[i].id = ids[tr->t[i].site];
            }
    }
    tr->on_group(res, tr->ctx);
}

/* The records of one response (its first n_tokens) packed as the rollout sends them and
 * decoded against m's config as the learner does.  Owned by the caller
 * (qrl_trace_response_free).  Call within the group's callback (b is freed after it). */
static inline qrl_trace_response *trace_rollout_decode(const qrl_model *m, const qrl_trace_buf *b,
                                                       uint32_t n_tokens) {
    qrl_trace_pack p;
    qrl_error e;
    cr_assert_eq(qrl_trace_buf_pack(b, n_tokens, 3000, &p, &e), QRL_OK, "%s", e.msg);
    const qrl_trace_layout *l = qrl_trace_buf_layout(b);
    qrl_trace_response *r = NULL;
    cr_assert_eq(qrl_trace_response_decode(&m->cfg, qrl_trace_layout_site_ids(l),
                                           qrl_trace_layout_n_sites(l),
                                           (const uint8_t *const *)p.record, p.len,
                                           p.token_begin, p.count, p.n_tokens, &r, &e),
                 QRL_OK, "%s", e.msg);
    qrl_trace_pack_free(&p);
    return r;
}

/* Quantize m in place to w4a4-nvfp4 and decode one group of 2 (group id 1, `prompt`
 * [n_prompt], up to 24 new tokens, temperature 1, seed 3) on the CPU scheduler with the
 * fp4 KV cache, recording every site of every layer ("layers=all"); every tap goes to *tr
 * (free with trace_rollout_free), and on_group(result, ctx) runs when the group ends. */
static inline void trace_rollout_record(trace_rollout *tr, qrl_model *m, const int32_t *prompt,
                                        int n_prompt, qrl_scheduler_group_fn on_group,
                                        void *ctx) {
    qrl_error e;
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    *tr = (trace_rollout){.t = calloc(TRACE_ROLLOUT_MAX_TAPS, sizeof(trace_tap)), .m = m,
                          .on_group = on_group, .ctx = ctx};
    cr_assert_not_null(tr->t);
    qrl_scheduler_config c;
    qrl_scheduler_config_default(&c);
    c.max_slots = 2;
    c.kv_format = QRL_KV_FORMAT_FP4;
    c.trace_record = true;
    cr_assert_eq(qrl_trace_sites_parse("layers=all", &c.trace_sites, &e), QRL_OK);
    qrl_scheduler *s = NULL;
    cr_assert_eq(qrl_scheduler_new(m, NULL, &c, trace_rollout_on_group_, tr, &s, &e), QRL_OK,
                 "%s", e.msg);
    qrl_scheduler_trace_set_tap(s, trace_rollout_on_tap_, tr);
    qrl_scheduler_group_desc g = {.group_id = 1, .group_size = 2, .prompt = prompt,
                                  .n_prompt = n_prompt, .max_new_tokens = 24,
                                  .sampling = {.temperature = 1.0f, .top_p = 1.0f, .seed = 3}};
    cr_assert_eq(qrl_scheduler_submit(s, &g, &e), QRL_OK, "%s", e.msg);
    for (int steps = 0; !qrl_scheduler_idle(s); steps++) {
        cr_assert_lt(steps, 100000, "scheduler does not finish");
        cr_assert_eq(qrl_scheduler_step(s, NULL, &e), QRL_OK, "step: %s", e.msg);
    }
    qrl_scheduler_free(s);
}

/* The taps' vectors and table (not the model). */
static inline void trace_rollout_free(trace_rollout *tr) {
    for (size_t i = 0; i < tr->n; i++) free(tr->t[i].x);
    free(tr->t);
    *tr = (trace_rollout){0};
}

#endif
