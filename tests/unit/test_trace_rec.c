/* TRACE recorder (model/trace_rec.h): site spec parsing, layouts, records taken inside the
 * scheduler's CPU decode equal re-quantizing the same inputs, alignment with the response
 * tokens (also across a weight swap), nothing allocated when off, packing and chunking
 * round trips (wire/trace_chunk.c) with missing, duplicated and reordered chunks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "model/trace_rec_internal.h"
#include "cpu/ops.h"
#include "cpu/quant.h"
#include "sched_test_util.h"
#include "wire/wire.h"

/* ---- spec parsing --------------------------------------------------------------------- */

static void bad_spec(const char *spec, const char *msg) {
    qrl_trace_sites s;
    qrl_error e;
    cr_assert_eq(qrl_trace_sites_parse(spec, &s, &e), QRL_STATUS_INVALID_ARGUMENT, "%s", spec);
    cr_assert_str_eq(e.msg, msg);
}

Test(trace_sites, parse_default_and_specs) {
    qrl_trace_sites s, d;
    qrl_error e;
    qrl_trace_sites_default(&d);
    cr_assert_eq(qrl_trace_sites_parse("default", &s, &e), QRL_OK);
    cr_assert_eq(memcmp(&s, &d, sizeof s), 0);
    cr_assert_eq(qrl_trace_sites_parse("layers=all,sites=attn_in,attn_out,mlp_in,mlp_down;"
                                       "layers=deep,sites=k,v", &s, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(memcmp(&s, &d, sizeof s), 0);
    cr_assert_eq(qrl_trace_sites_parse("layers=14-27,sites=attn_in,attn_out,mlp_in,mlp_down,k,v",
                                       &s, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(s.n_clauses, 1);
    cr_assert_eq(s.clause[0].first, 14);
    cr_assert_eq(s.clause[0].last, 27);
    cr_assert_eq(s.clause[0].kinds, QRL_TRACE_KINDS_ALL);
    cr_assert_eq(qrl_trace_sites_parse("sites=k;layers=3", &s, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(s.clause[0].first, QRL_TRACE_LAYERS_ALL);
    cr_assert_eq(s.clause[0].kinds, 1u << QRL_TRACE_SITE_K);
    cr_assert_eq(s.clause[1].first, 3);
    cr_assert_eq(s.clause[1].last, 3);
    cr_assert_eq(s.clause[1].kinds, QRL_TRACE_KINDS_ALL);
    /* spaces around clauses, items, keys and values are not part of them */
    qrl_trace_sites t;
    cr_assert_eq(qrl_trace_sites_parse("layers=deep,sites=mlp_in,k;layers=0,sites=attn_in", &t, &e),
                 QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_trace_sites_parse(" layers = deep , sites = mlp_in , k ; layers=0,sites=attn_in ",
                                       &s, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(memcmp(&s, &t, sizeof s), 0);
    cr_assert_eq(s.clause[0].first, QRL_TRACE_LAYERS_DEEP);
    cr_assert_eq(s.clause[0].kinds, 1u << QRL_TRACE_SITE_MLP_IN | 1u << QRL_TRACE_SITE_K);
    cr_assert_eq(s.clause[1].first, 0);
    cr_assert_eq(s.clause[1].kinds, 1u << QRL_TRACE_SITE_ATTN_IN);
}

Test(trace_sites, parse_errors_name_the_field) {
    bad_spec("layers=9-x", "trace sites clause 1: layers='9-x': expected A, A-B, all or deep");
    bad_spec("layers=5-2", "trace sites clause 1: layers='5-2': end below start");
    bad_spec("sites=k;sites=q", "trace sites clause 2: sites: unknown site 'q' (attn_in, k, v, "
                                "attn_out, mlp_in, mlp_down)");
    bad_spec("layer=3", "trace sites clause 1: unknown key 'layer' (layers, sites)");
    bad_spec("sites=", "trace sites clause 1: sites: empty list");
    bad_spec("sites=k,", "trace sites clause 1: trailing comma");
    bad_spec("layers=1;;sites=v", "trace sites clause 2: empty");
    bad_spec("layers=1,layers=2", "trace sites clause 1: layers given twice");
    bad_spec("k,v", "trace sites clause 1: 'k' is not key=value (layers=..., sites=...)");
    bad_spec("layers=1; ", "trace sites clause 2: empty");
    bad_spec("layers=1, ,sites=v", "trace sites clause 1: empty item");
    bad_spec(" layer =3", "trace sites clause 1: unknown key 'layer' (layers, sites)");
    bad_spec("sites= ", "trace sites clause 1: sites: empty list");
    bad_spec("layers=1 2", "trace sites clause 1: layers='1 2': expected A, A-B, all or deep");
}

Test(trace_sites, layouts_against_a_model) {
    qrl_model_config c = {.dim = 64, .hidden_dim = 172, .n_layers = 5, .n_heads = 8,
                          .n_kv_heads = 4, .head_dim = 8};
    qrl_trace_sites s;
    qrl_trace_layout *l = NULL;
    qrl_error e;
    qrl_trace_sites_default(&s);
    cr_assert_eq(qrl_trace_layout_new(&s, &c, true, true, &l, &e), QRL_OK, "%s", e.msg);
    /* 5 layers x 4 linear inputs + layers 2..4 x (4 K + 4 V heads) */
    cr_assert_eq(qrl_trace_layout_n_sites(l), 5 * 4 + 3 * 8);
    cr_assert_eq(qrl_trace_layout_find(l, 1, QRL_TRACE_SITE_K, 0), -1);
    int k3 = qrl_trace_layout_find(l, 3, QRL_TRACE_SITE_K, 2);
    cr_assert_geq(k3, 0);
    cr_assert_eq(qrl_trace_layout_site_ids(l)[k3], qrl_trace_site_id(3, QRL_TRACE_SITE_K, 2));
    cr_assert_eq(qrl_trace_layout_site_lens(l)[k3], 8);
    int md = qrl_trace_layout_find(l, 0, QRL_TRACE_SITE_MLP_DOWN, 0);
    cr_assert_eq(qrl_trace_layout_site_lens(l)[md], 172);
    /* per token: sum over sites of 4 + ceil(n/16) + ceil(n/8) */
    size_t want = 5 * ((4 + 4 + 8) * 3 + (4 + 11 + 22)) + 24 * (4 + 1 + 1);
    cr_assert_eq(qrl_trace_layout_record_bytes_per_token(l), want);
    /* the learner's view from the ids is the same layout */
    qrl_trace_layout *l2 = NULL;
    cr_assert_eq(qrl_trace_layout_from_ids(&c, qrl_trace_layout_site_ids(l),
                                           qrl_trace_layout_n_sites(l), &l2, &e), QRL_OK, "%s",
                 e.msg);
    cr_assert_eq(memcmp(qrl_trace_layout_site_lens(l2), qrl_trace_layout_site_lens(l),
                        qrl_trace_layout_n_sites(l) * 4), 0);
    uint32_t bad[2] = {qrl_trace_site_id(0, 0, 0), qrl_trace_site_id(7, 0, 0)};
    cr_assert_eq(qrl_trace_layout_from_ids(&c, bad, 2, &l2 /* unchanged on error */, &e),
                 QRL_STATUS_CORRUPT);
    qrl_trace_layout_free(l);
    /* w4a16 (no FP4 activations) with an f32 cache: nothing to record */
    cr_assert_eq(qrl_trace_layout_new(&s, &c, false, false, &l, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(qrl_trace_sites_parse("layers=3-9", &s, &e), QRL_OK);
    cr_assert_eq(qrl_trace_layout_new(&s, &c, true, true, &l, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(e.msg, "trace sites clause 1: layers=3-9: the model has 5 layers (0-4)");
    qrl_trace_sites_default(&s);
    cr_assert_eq(qrl_trace_layout_new(&s, &c, true, false, &l, &e), QRL_OK);
    cr_assert_eq(qrl_trace_layout_n_sites(l), 20); /* no fp4 KV: no k/v sites */
    qrl_trace_layout_free(l);
    /* ... and they are named as dropped, with the reason (the rollout's start WARN) */
    char why[256];
    cr_assert_eq(qrl_trace_sites_dropped(&s, &c, true, false, why, sizeof why), 3 * 2); /* layers 2-4 x k, v */
    cr_assert_str_eq(why, "k layers 2-4, v layers 2-4 (k/v are FP4 only with the fp4 KV cache)");
    cr_assert_eq(qrl_trace_sites_dropped(&s, &c, true, true, why, sizeof why), 0);
    cr_assert_str_eq(why, "");
    cr_assert_eq(qrl_trace_sites_parse("layers=0,sites=mlp_in,k", &s, &e), QRL_OK);
    cr_assert_eq(qrl_trace_sites_dropped(&s, &c, false, false, why, sizeof why), 2);
    cr_assert_str_eq(why, "mlp_in layers 0 (linear inputs are FP4 only with precision w4a4-nvfp4); "
                          "k layers 0 (k/v are FP4 only with the fp4 KV cache)");
    cr_assert_eq(qrl_trace_sites_dropped(&s, &c, true, false, why, 12), 1); /* truncated, terminated */
    cr_assert_eq(strlen(why), 11);
    cr_assert_eq(qrl_trace_metric_disagree_share(3, 12), 0.25);
    cr_assert_eq(qrl_trace_metric_disagree_share(3, 0), 0.0);
    cr_assert_eq(qrl_trace_metric_bytes_per_token(1000, 8), 125.0);
    cr_assert_eq(qrl_trace_metric_bytes_per_token(1000, 0), 0.0);
}

/* ---- recording inside the scheduler ---------------------------------------------------- */

#define MAX_TAPS 200000

/* Every captured input, by (buffer, token, site): the last write wins (rewrites). */
typedef struct tap_rec {
    const qrl_trace_buf *buf;
    uint32_t token, site, n;
    float *x;
} tap_rec;

typedef struct tap_log {
    tap_rec *r;
    size_t n;
} tap_log;

static void on_tap(void *ctx, const qrl_trace_buf *buf, uint32_t token, uint32_t site,
                   const float *x, uint32_t n) {
    tap_log *t = ctx;
    cr_assert_lt(t->n, MAX_TAPS);
    tap_rec *r = &t->r[t->n++];
    *r = (tap_rec){buf, token, site, n, st_dup(x, n * sizeof *x)};
}

/* Per response checks done inside the callback, while the records are valid. */
typedef struct check_ctx {
    tap_log *taps;
    const qrl_model *m[4];      /* model of policy version v (st_perturb chain) */
    int checked_tokens, checked_entries, responses;
    qrl_trace_pack pack[8];     /* response 0's pack per group (copied for later tests) */
    int n_pack;
} check_ctx;

/* Re-quantize the tapped input of (buf, token, site): identical scales, global scale and
 * LSBs; and its FP4 codes dequantize to what the w4a4 linear computes with. */
static void check_entry(check_ctx *cc, const qrl_trace_buf *buf, uint32_t k, uint32_t s) {
    const tap_rec *hit = NULL;
    for (size_t i = cc->taps->n; i-- > 0;) {
        const tap_rec *r = &cc->taps->r[i];
        if (r->buf == buf && r->token == k && r->site == s) { hit = r; break; }
    }
    cr_assert_not_null(hit, "no input tapped for token %u site %u", k, s);
    qrl_trace_entry e;
    qrl_error err;
    cr_assert_eq(qrl_trace_buf_entry(buf, k, s, &e, &err), QRL_OK, "%s", err.msg);
    uint32_t n = e.len;
    uint8_t codes[1024], sc[128], bits[256];
    float genc, y[2048], yq[2048];
    qrl_nvfp4_quantize_row(hit->x, n, codes, sc, &genc);
    qrl_trace_bits_from_codes(codes, n, bits);
    cr_assert_eq(memcmp(&genc, &e.global_enc, 4), 0);
    cr_assert_eq(memcmp(sc, e.scales, qrl_nvfp4_blocks(n)), 0, "token %u site %u scales", k, s);
    cr_assert_eq(memcmp(bits, e.bits, (n + 7) / 8), 0, "token %u site %u bits", k, s);
    qrl_nvfp4_dequantize_row(codes, sc, genc, n, y);
    qrl_nvfp4_fake_quantize_row(hit->x, n, yq); /* the linear's w4a4 activation path */
    cr_assert_eq(memcmp(y, yq, n * sizeof *y), 0);
    cc->checked_entries++;
}

/* Record k's layer-0 attn_in is rmsnorm(embedding of the token fed at position
 * n_prompt - 1 + k) under the weights that sampled token k: independent of the tap. */
static void check_alignment(check_ctx *cc, const qrl_scheduler_group_result *res,
                            const qrl_scheduler_response *o) {
    const qrl_trace_buf *b = o->trace;
    int s0 = qrl_trace_layout_find(qrl_trace_buf_layout(b), 0, QRL_TRACE_SITE_ATTN_IN, 0);
    cr_assert_geq(s0, 0);
    for (int k = 0; k < o->n_tokens; k++) {
        const qrl_model *m = cc->m[o->versions[k]];
        int D = m->cfg.dim;
        int32_t fed = k == 0 ? res->prompt[res->n_prompt - 1] : o->tokens[k - 1];
        float h[512];
        qrl_cpu_rmsnorm(h, m->tok_embedding + (size_t)fed * D, m->layers[0].attn_norm, 1, D,
                        m->cfg.norm_eps);
        uint8_t codes[256], sc[32], bits[64];
        float genc;
        qrl_trace_capture(h, (uint32_t)D, codes, sc, bits, &genc);
        qrl_trace_entry e;
        cr_assert_eq(qrl_trace_buf_entry(b, (uint32_t)k, (uint32_t)s0, &e, NULL), QRL_OK);
        cr_assert_eq(memcmp(sc, e.scales, qrl_nvfp4_blocks(D)), 0, "record %d misaligned", k);
        cr_assert_eq(memcmp(bits, e.bits, (D + 7) / 8), 0, "record %d misaligned", k);
        cc->checked_tokens++;
    }
}

static void on_group_check(const qrl_scheduler_group_result *res, void *ctx) {
    check_ctx *cc = ctx;
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        cr_assert_not_null(o->trace);
        cr_assert_eq(qrl_trace_buf_n_tokens(o->trace), (uint32_t)o->n_tokens);
        check_alignment(cc, res, o);
        uint32_t ns = qrl_trace_layout_n_sites(qrl_trace_buf_layout(o->trace));
        for (int k = 0; k < o->n_tokens; k += 3)
            for (uint32_t s = 0; s < ns; s++) check_entry(cc, o->trace, (uint32_t)k, s);
        if (r == 0 && cc->n_pack < 8) {
            qrl_error e;
            cr_assert_eq(qrl_trace_buf_pack(o->trace, (uint32_t)o->n_tokens, 4096,
                                            &cc->pack[cc->n_pack++], &e), QRL_OK, "%s", e.msg);
        }
        cc->responses++;
    }
}

static qrl_scheduler *make_sched(const qrl_model *m, bool trace, qrl_scheduler_group_fn fn,
                                 void *ctx) {
    qrl_scheduler_config c;
    qrl_scheduler_config_default(&c);
    c.max_slots = 3;
    c.kv_format = QRL_KV_FORMAT_FP4;
    c.prefill_chunk = 5; /* prompts in several chunks: the record is the last row's */
    c.trace_record = trace;
    c.max_staleness = 4;
    qrl_scheduler *s = NULL;
    qrl_error e;
    cr_assert_eq(qrl_scheduler_new(m, NULL, &c, fn, ctx, &s, &e), QRL_OK, "%s", e.msg);
    return s;
}

static void submit(qrl_scheduler *s, uint64_t id, const int32_t *prompt, int n, int max_new) {
    qrl_scheduler_group_desc g = {.group_id = id, .group_size = 2, .prompt = prompt,
                                  .n_prompt = n, .max_new_tokens = max_new,
                                  .sampling = {.temperature = 1.0f, .top_p = 1.0f, .seed = 7}};
    qrl_error e;
    cr_assert_eq(qrl_scheduler_submit(s, &g, &e), QRL_OK, "%s", e.msg);
}

static const int32_t P1[] = {1, 403, 407, 261, 378, 1000 % 512, 34, 90};
static const int32_t P2[] = {1, 22};

Test(trace_rec, scheduler_records_equal_requantized_inputs_and_stay_aligned) {
    qrl_model *m = st_load_model(), *m2 = st_load_model();
    qrl_error e;
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    st_perturb(m2, 0.02);
    cr_assert_eq(qrl_model_quantize(m2, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    tap_log taps = {calloc(MAX_TAPS, sizeof(tap_rec)), 0};
    check_ctx cc = {.taps = &taps, .m = {m, m2}};
    qrl_scheduler *s = make_sched(m, true, on_group_check, &cc);
    qrl_scheduler_trace_set_tap(s, on_tap, &taps);
    const qrl_trace_layout *l = qrl_scheduler_trace_layout(s);
    cr_assert_not_null(l);
    cr_assert_eq(qrl_trace_layout_n_sites(l), 5 * 4 + 3 * 8);
    submit(s, 1, P1, 8, 12);
    submit(s, 2, P2, 2, 20);
    st_step(s, 6);
    qrl_scheduler_stats stats;
    qrl_scheduler_get_stats(s, &stats);
    cr_assert_gt(stats.trace_buf_bytes, 0);
    /* sync boundary mid-response: kept tokens keep their records, the rest are new */
    cr_assert_eq(qrl_scheduler_swap_weights(s, m2, 1, &e), QRL_OK, "%s", e.msg);
    st_run(s);
    cr_assert_eq(cc.responses, 4);
    cr_assert_gt(cc.checked_tokens, 20);
    cr_assert_gt(cc.checked_entries, 200);
    /* the packs round-trip: decoded entries equal the packed records */
    for (int i = 0; i < cc.n_pack; i++) {
        qrl_trace_pack *p = &cc.pack[i];
        cr_assert_gt(p->count, 1, "4096-byte records: several chunks");
        uint32_t crc = 0;
        for (size_t c = 0; c < p->count; c++) {
            cr_assert_leq(p->len[c], 4096);
            crc = qrl_crc32(crc, p->record[c], p->len[c]);
        }
        cr_assert_eq(crc, p->crc32);
        qrl_trace_response *rsp = NULL;
        cr_assert_eq(qrl_trace_response_decode(&m->cfg, qrl_trace_layout_site_ids(l),
                                               qrl_trace_layout_n_sites(l),
                                               (const uint8_t *const *)p->record, p->len,
                                               p->token_begin, p->count, p->n_tokens, &rsp, &e),
                     QRL_OK, "%s", e.msg);
        qrl_trace_entry a;
        cr_assert(qrl_trace_response_entry(rsp, p->n_tokens - 1, 4, QRL_TRACE_SITE_V, 3, &a));
        cr_assert_not(qrl_trace_response_entry(rsp, p->n_tokens, 4, QRL_TRACE_SITE_V, 3, &a));
        cr_assert_not(qrl_trace_response_entry(rsp, 0, 1, QRL_TRACE_SITE_V, 3, &a));
        /* a gap in the ranges is refused */
        if (p->count > 2) {
            uint32_t tb[64];
            memcpy(tb, p->token_begin, p->count * 4);
            tb[2]++;
            qrl_trace_response *bad = NULL;
            cr_assert_eq(qrl_trace_response_decode(&m->cfg, qrl_trace_layout_site_ids(l),
                                                   qrl_trace_layout_n_sites(l),
                                                   (const uint8_t *const *)p->record, p->len, tb,
                                                   p->count, p->n_tokens, &bad, &e),
                         QRL_STATUS_CORRUPT);
        }
        qrl_trace_response_free(rsp);
        qrl_trace_pack_free(p);
    }
    qrl_scheduler_free(s);
    for (size_t i = 0; i < taps.n; i++) free(taps.r[i].x);
    free(taps.r);
    qrl_model_free(m);
    qrl_model_free(m2);
}

typedef struct off_ctx {
    int responses;
    const qrl_trace_buf *seen;
    int32_t tok[4][64];
    float lp[4][64];
    int n[4];
} off_ctx;

static void on_group_off(const qrl_scheduler_group_result *res, void *ctx) {
    off_ctx *oc = ctx;
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        int i = (int)((res->group_id - 1) * 2 + r);
        if (o->trace) oc->seen = o->trace;
        oc->n[i] = o->n_tokens;
        memcpy(oc->tok[i], o->tokens, (size_t)o->n_tokens * 4);
        memcpy(oc->lp[i], o->logprobs, (size_t)o->n_tokens * 4);
        oc->responses++;
    }
}

Test(trace_rec, off_allocates_nothing_and_recording_changes_no_token) {
    qrl_model *m = st_load_model();
    qrl_error e;
    cr_assert_eq(qrl_model_quantize(m, QRL_PRECISION_W4A4_NVFP4, &e), QRL_OK, "%s", e.msg);
    off_ctx off = {0}, on = {0};
    qrl_scheduler *s = make_sched(m, false, on_group_off, &off);
    cr_assert_null(qrl_scheduler_trace_layout(s));
    submit(s, 1, P1, 8, 12);
    submit(s, 2, P2, 2, 20);
    st_step(s, 4);
    qrl_scheduler_stats stats;
    qrl_scheduler_get_stats(s, &stats);
    cr_assert_eq(stats.trace_buf_bytes, 0);
    st_run(s);
    qrl_scheduler_free(s);
    cr_assert_null(off.seen);
    s = make_sched(m, true, on_group_off, &on);
    submit(s, 1, P1, 8, 12);
    submit(s, 2, P2, 2, 20);
    st_run(s);
    qrl_scheduler_free(s);
    cr_assert_not_null(on.seen);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(on.n[i], off.n[i]);
        cr_assert_eq(memcmp(on.tok[i], off.tok[i], (size_t)on.n[i] * 4), 0);
        cr_assert_eq(memcmp(on.lp[i], off.lp[i], (size_t)on.n[i] * 4), 0);
    }
    /* recording needs FP4 sites and the CPU engine */
    qrl_model *f32 = st_load_model();
    qrl_scheduler_config c;
    qrl_scheduler_config_default(&c);
    c.trace_record = true;
    cr_assert_eq(qrl_scheduler_new(f32, NULL, &c, NULL, NULL, &s, &e), QRL_STATUS_INVALID_ARGUMENT);
    qrl_model_free(f32);
    qrl_model_free(m);
}

/* ---- chunks on the wire ---------------------------------------------------------------- */

/* A small synthetic buffer of `nt` tokens on a 2-layer model, filled by the recorder. */
static void synth_pack_cap(qrl_trace_layout **l, qrl_trace_buf **b, qrl_trace_pack *p,
                           uint32_t nt, uint32_t cap, size_t limit) {
    qrl_model_config c = {.dim = 48, .hidden_dim = 96, .n_layers = 2, .n_heads = 4,
                          .n_kv_heads = 2, .head_dim = 12};
    qrl_trace_sites s;
    qrl_error e;
    qrl_trace_sites_default(&s);
    cr_assert_eq(qrl_trace_layout_new(&s, &c, true, true, l, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_trace_buf_new(*l, cap, b, &e), QRL_OK);
    qrl_trace_recorder *r = NULL;
    cr_assert_eq(qrl_trace_recorder_new(*l, 1, &r, &e), QRL_OK);
    float x[96];
    for (uint32_t t = 0; t < nt; t++) {
        qrl_trace_recorder_clear(r);
        qrl_trace_recorder_target(r, 0, *b, t);
        cr_assert(qrl_trace_recorder_begin_pass(r, 0, 1));
        for (int ly = 0; ly < 2; ly++)
            for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++) {
                for (int i = 0; i < 96; i++) x[i] = sinf((float)(t * 131 + ly * 17 + k * 7 + i));
                qrl_trace_recorder_capture(r, 0, ly, k, x);
            }
    }
    cr_assert_eq(qrl_trace_buf_n_tokens(*b), nt);
    cr_assert_eq(qrl_trace_buf_pack(*b, nt, limit, p, &e), QRL_OK, "%s", e.msg);
    qrl_trace_recorder_free(r);
}

static void synth_pack(qrl_trace_layout **l, qrl_trace_buf **b, qrl_trace_pack *p, uint32_t nt,
                       size_t limit) {
    synth_pack_cap(l, b, p, nt, nt, limit);
}

/* A record that passes every CRC but cannot guide (the newcomer's proxy: an E4M3 NaN block
 * scale, or an S_enc whose reciprocal overflows) is refused when the learner decodes the
 * response, naming chunk, response token, site id and offset; the rollout never packs one. */
Test(trace_rec, records_that_cannot_guide_are_refused_by_name) {
    qrl_trace_layout *l;
    qrl_trace_buf *b;
    qrl_trace_pack p;
    qrl_error e;
    synth_pack(&l, &b, &p, 40, 2048);
    cr_assert_gt(p.count, 2);
    qrl_model_config c = {.dim = 48, .hidden_dim = 96, .n_layers = 2, .n_heads = 4,
                          .n_kv_heads = 2, .head_dim = 12};
    const uint32_t *ids = qrl_trace_layout_site_ids(l);
    uint32_t ns = qrl_trace_layout_n_sites(l);
    qrl_trace_response *rsp = NULL;
    cr_assert_eq(qrl_trace_response_decode(&c, ids, ns, (const uint8_t *const *)p.record, p.len,
                                           p.token_begin, p.count, p.n_tokens, &rsp, &e),
                 QRL_OK, "%s", e.msg);
    qrl_trace_response_free(rsp);
    /* chunk 1, its first token, site 0: the first scale byte after the S_enc section */
    uint8_t *r1 = p.record[1];
    uint32_t nt1 = p.token_count[1];
    size_t off_g = 16 + 4 * (size_t)ns, off_s = off_g + 4 * (size_t)nt1 * ns;
    uint8_t saved_s = r1[off_s];
    uint8_t saved_g[4];
    memcpy(saved_g, r1 + off_g + 4, 4); /* S_enc of (token 0, site 1) */
    char want[256];
    for (int k = 0; k < 5; k++) {
        r1[off_s] = saved_s;
        memcpy(r1 + off_g + 4, saved_g, 4);
        const float g[4] = {NAN, INFINITY, 0.0f, -2.0f};
        if (k == 0) {
            r1[off_s] = 0x7F;
            snprintf(want, sizeof want, "trace response: chunk 1: trace record: block scale 0 of "
                     "[token %u][site 0 (id 0x%x)] at offset %zu = 0x7f is NaN", p.token_begin[1],
                     ids[0], off_s);
        } else {
            memcpy(r1 + off_g + 4, &g[k - 1], 4);
            snprintf(want, sizeof want, "trace response: chunk 1: trace record: global_enc[token "
                     "%u][site 1 (id 0x%x)] at offset %zu = ", p.token_begin[1], ids[1], off_g + 4);
        }
        uint32_t crc = qrl_crc32(0, r1, p.len[1] - 4);
        memcpy(r1 + p.len[1] - 4, &crc, 4); /* little-endian host, as the record */
        rsp = (qrl_trace_response *)1;
        qrl_error_clear(&e);
        cr_assert_eq(qrl_trace_response_decode(&c, ids, ns, (const uint8_t *const *)p.record, p.len,
                                               p.token_begin, p.count, p.n_tokens, &rsp, &e),
                     QRL_STATUS_CORRUPT, "case %d", k);
        cr_assert_null(rsp);
        cr_assert(strncmp(e.msg, want, strlen(want)) == 0, "case %d: '%s' does not start with '%s'",
                  k, e.msg, want);
    }
    qrl_trace_pack_free(&p);
    /* the rollout's side: a response whose activations went non-finite is not packed (the
     * replica logs it and sends no records; the learner trains it unguided, counted) */
    qrl_trace_recorder *r = NULL;
    cr_assert_eq(qrl_trace_recorder_new(l, 1, &r, &e), QRL_OK);
    qrl_trace_recorder_clear(r);
    qrl_trace_recorder_target(r, 0, b, 5);
    cr_assert(qrl_trace_recorder_begin_pass(r, 0, 1));
    float x[96];
    for (int i = 0; i < 96; i++) x[i] = (float)i;
    x[40] = INFINITY;
    for (int ly = 0; ly < 2; ly++)
        for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++) qrl_trace_recorder_capture(r, 0, ly, k, x);
    cr_assert_eq(qrl_trace_buf_pack(b, 40, 2048, &p, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "response tokens ") && strstr(e.msg, "site 0): block scale 2 = 0x7f is NaN"),
              "%s", e.msg);
    cr_assert_eq(p.count, 0u);
    qrl_trace_recorder_free(r);
    qrl_trace_buf_free(b);
    qrl_trace_layout_free(l);
}

/* A buffer of >= 4 MiB takes the mmap (transparent huge page) storage: zeroed, and the same
 * records as a small one. */
Test(trace_rec, a_large_buffer_holds_the_same_records) {
    qrl_trace_layout *l1, *l2;
    qrl_trace_buf *small, *large;
    qrl_trace_pack p1, p2;
    synth_pack_cap(&l1, &small, &p1, 24, 24, 1 << 20);
    uint32_t cap = (uint32_t)((8u << 20) / qrl_trace_layout_slab_bytes_(l1)) + 1;
    synth_pack_cap(&l2, &large, &p2, 24, cap, 1 << 20);
    cr_assert_geq(qrl_trace_buf_bytes(large), (size_t)8 << 20);
    cr_assert_eq(p1.count, p2.count);
    for (size_t i = 0; i < p1.count; i++) {
        cr_assert_eq(p1.len[i], p2.len[i]);
        cr_assert_eq(memcmp(p1.record[i], p2.record[i], p1.len[i]), 0, "record %zu", i);
    }
    const uint8_t *last = qrl_trace_buf_slab_(large, cap - 1); /* never written: zero */
    for (size_t k = 0; k < qrl_trace_layout_slab_bytes_(l2); k++) cr_assert_eq(last[k], 0);
    qrl_trace_pack_free(&p1), qrl_trace_pack_free(&p2);
    qrl_trace_buf_free(small), qrl_trace_buf_free(large);
    qrl_trace_layout_free(l1), qrl_trace_layout_free(l2);
}

static Qrl__TraceChunk *decode_chunk(const qrl_wire_chunks *w, size_t i) {
    ProtobufCMessage *m = NULL;
    qrl_error e;
    cr_assert_eq(qrl_wire_decode(&qrl__trace_chunk__descriptor, w->data[i], w->len[i], 0, &m, &e),
                 QRL_OK, "%s", e.msg);
    return (Qrl__TraceChunk *)m;
}

Test(trace_rec, chunks_round_trip_and_detect_loss_duplication_reordering) {
    qrl_trace_layout *l;
    qrl_trace_buf *b;
    qrl_trace_pack p;
    qrl_error e;
    const size_t limit = 2048;
    const char *replica = "replica-7";
    size_t budget = qrl_wire_trace_record_budget(limit, 12, replica);
    synth_pack(&l, &b, &p, 40, budget);
    cr_assert_gt(p.count, 3);
    qrl_wire_trace_ident id = {.group_id = 99, .run_id = 5, .replica_id = replica,
                               .response_index = 1};
    qrl_wire_trace_pieces pc = {p.count, p.record, p.len, p.token_begin, p.token_count,
                                p.n_tokens, p.crc32};
    qrl_wire_chunks w;
    cr_assert_eq(qrl_wire_trace_chunks_encode(&id, qrl_trace_layout_site_ids(l),
                                              qrl_trace_layout_n_sites(l), &pc, limit, &w, &e),
                 QRL_OK, "%s", e.msg);
    cr_assert_eq(w.count, p.count);
    size_t n = w.count;
    Qrl__TraceChunk *ch[64], *in[64];
    for (size_t i = 0; i < n; i++) {
        cr_assert_leq(w.len[i], limit);
        ch[i] = decode_chunk(&w, i);
    }
    const Qrl__TraceChunk *ord[64];
    size_t cnt;
    /* reordered, with a duplicate: complete */
    for (size_t i = 0; i < n; i++) in[i] = ch[n - 1 - i];
    in[n] = ch[1];
    cr_assert_eq(qrl_wire_trace_join(in, n + 1, ord, &cnt, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(cnt, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ord[i], ch[i]);
    /* the joined records decode to the buffer's entries */
    const uint8_t *recs[64];
    size_t lens[64];
    uint32_t tb[64];
    for (size_t i = 0; i < n; i++)
        recs[i] = ord[i]->record.data, lens[i] = ord[i]->record.len, tb[i] = ord[i]->token_begin;
    qrl_model_config c = {.dim = 48, .hidden_dim = 96, .n_layers = 2, .n_heads = 4,
                          .n_kv_heads = 2, .head_dim = 12};
    qrl_trace_response *rsp = NULL;
    cr_assert_eq(qrl_trace_response_decode(&c, ord[0]->site_ids, ord[0]->n_site_ids, recs, lens,
                                           tb, n, ord[0]->response_tokens, &rsp, &e), QRL_OK,
                 "%s", e.msg);
    for (uint32_t t = 0; t < 40; t++)
        for (uint32_t s = 0; s < qrl_trace_layout_n_sites(l); s++) {
            qrl_trace_entry a, want;
            uint32_t sid = qrl_trace_layout_site_ids(l)[s];
            cr_assert(qrl_trace_response_entry(rsp, t, (int)(sid >> 16), (sid >> 12) & 0xF,
                                               (int)(sid & 0xFFF), &a));
            cr_assert_eq(qrl_trace_buf_entry(b, t, s, &want, NULL), QRL_OK);
            cr_assert_eq(a.len, want.len);
            cr_assert_eq(a.global_enc, want.global_enc);
            cr_assert_eq(memcmp(a.scales, want.scales, qrl_nvfp4_blocks(a.len)), 0);
            cr_assert_eq(memcmp(a.bits, want.bits, (a.len + 7) / 8), 0);
        }
    qrl_trace_response_free(rsp);
    /* lost chunks: incomplete, naming them */
    for (size_t i = 0; i < n; i++) in[i] = ch[i];
    in[2] = ch[0];
    cr_assert_eq(qrl_wire_trace_join(in, n - 1, ord, &cnt, &e), QRL_STATUS_NOT_FOUND);
    char want[128];
    snprintf(want, sizeof want, "TraceChunk group 99 response 1: incomplete, %zu of %zu chunks "
             "(missing 2, %zu)", n - 2, n, n - 1);
    cr_assert_str_eq(e.msg, want);
    /* a duplicate with other contents, a chunk of another response, a bad CRC */
    for (size_t i = 0; i < n; i++) in[i] = ch[i];
    Qrl__TraceChunk dup = *ch[1];
    uint8_t flip[4096];
    memcpy(flip, dup.record.data, dup.record.len);
    flip[20] ^= 1;
    dup.record.data = flip;
    in[n] = &dup;
    cr_assert_eq(qrl_wire_trace_join(in, n + 1, ord, &cnt, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 99 response 1: chunk 1 given twice with different contents");
    in[n] = NULL;
    in[1] = &dup;
    cr_assert_eq(qrl_wire_trace_join(in, n, ord, &cnt, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "CRC-32 of the records"), "%s", e.msg);
    Qrl__TraceChunk other = *ch[1];
    other.response_index = 0;
    in[1] = &other;
    cr_assert_eq(qrl_wire_trace_join(in, n, ord, &cnt, &e), QRL_STATUS_CORRUPT);
    for (size_t i = 0; i < n; i++) qrl_wire_free(&ch[i]->base);
    qrl_wire_chunks_free(&w);
    /* a limit below one token's record is refused with both sizes */
    qrl_trace_pack small;
    cr_assert_eq(qrl_trace_buf_pack(b, 40, 64, &small, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(e.msg, "over the limit of 64"), "%s", e.msg);
    cr_assert_eq(qrl_trace_buf_pack(b, 41, budget, &small, &e), QRL_STATUS_OUT_OF_RANGE);
    qrl_trace_pack_free(&p);
    qrl_trace_buf_free(b);
    qrl_trace_layout_free(l);
}
