/* qrl_trace_sites_coverage (model/trace_rec.h): the learner's check of a record's site
 * list against what its QAT forward fake-quantizes.  The layouts come from the rollout's
 * own resolution (qrl_trace_layout_new) of the default spec under each precision. */
#include <criterion/criterion.h>
#include <string.h>

#include "model/trace_rec.h"

static const qrl_model_config CFG = {.dim = 48, .hidden_dim = 96, .n_layers = 4, .n_heads = 4,
                                     .n_kv_heads = 2, .head_dim = 12};

static qrl_trace_layout *layout(const char *spec, bool act_fp4, bool kv_fp4) {
    qrl_trace_sites s;
    qrl_trace_layout *l = NULL;
    qrl_error e;
    cr_assert_eq(qrl_trace_sites_parse(spec, &s, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_trace_layout_new(&s, &CFG, act_fp4, kv_fp4, &l, &e), QRL_OK, "%s", e.msg);
    return l;
}

static void cover(const qrl_trace_layout *l, unsigned want, size_t *cov, size_t *wanted, char *miss, char *rec) {
    qrl_trace_sites_coverage(&CFG, qrl_trace_layout_site_ids(l), qrl_trace_layout_n_sites(l), want, cov, wanted,
                             miss, 256, rec, 256);
}

/* The newcomer's case: w4a16-nvfp4 with the fp4 KV cache records K and V only (the deep
 * half by default); a learner with qat nvfp4 and qat_kv false quantizes none of them. */
Test(trace_coverage, kv_only_records_cover_nothing_of_a_linear_qat_learner) {
    qrl_trace_layout *l = layout("default", false, true);
    size_t cov = 99, wanted = 0;
    char miss[256], rec[256];
    cover(l, QRL_TRACE_KINDS_LINEAR, &cov, &wanted, miss, rec);
    cr_assert_eq(cov, 0);
    cr_assert_eq(wanted, 16); /* 4 kinds x 4 layers */
    cr_assert_str_eq(rec, "k layers 2-3, v layers 2-3");
    cr_assert_str_eq(miss, "attn_in all layers, attn_out all layers, mlp_in all layers, mlp_down all layers");
    /* with qat_kv the same records cover the deep half of K and V: partial */
    cover(l, QRL_TRACE_KINDS_LINEAR | QRL_TRACE_KINDS_KV, &cov, &wanted, miss, rec);
    cr_assert_eq(cov, 4);
    cr_assert_eq(wanted, 24);
    cr_assert(strstr(miss, "k layers 0-1, v layers 0-1"), "%s", miss);
    qrl_trace_layout_free(l);
}

Test(trace_coverage, default_w4a4_records_cover_the_linear_learner_fully_and_kv_partly) {
    qrl_trace_layout *l = layout("default", true, true);
    size_t cov = 0, wanted = 0;
    char miss[256], rec[256];
    cover(l, QRL_TRACE_KINDS_LINEAR, &cov, &wanted, miss, rec);
    cr_assert_eq(cov, 16);
    cr_assert_eq(wanted, 16);
    cr_assert_str_eq(miss, "");
    cr_assert_str_eq(rec, "attn_in all layers, k layers 2-3, v layers 2-3, attn_out all layers, mlp_in all layers, "
                          "mlp_down all layers");
    cover(l, QRL_TRACE_KINDS_LINEAR | QRL_TRACE_KINDS_KV, &cov, &wanted, miss, rec);
    cr_assert_eq(cov, 20);
    cr_assert_eq(wanted, 24);
    cr_assert_str_eq(miss, "k layers 0-1, v layers 0-1");
    qrl_trace_layout_free(l);
}

Test(trace_coverage, layer_gaps_are_named_as_ranges_and_texts_truncate) {
    qrl_trace_layout *l = layout("layers=0,sites=attn_in,mlp_down;layers=2-3,sites=attn_in", true, false);
    size_t cov = 0, wanted = 0;
    char miss[256], rec[256];
    cover(l, 1u << QRL_TRACE_SITE_ATTN_IN | 1u << QRL_TRACE_SITE_MLP_DOWN, &cov, &wanted, miss, rec);
    cr_assert_eq(cov, 4);
    cr_assert_eq(wanted, 8);
    cr_assert_str_eq(rec, "attn_in layers 0+2-3, mlp_down layers 0");
    cr_assert_str_eq(miss, "attn_in layers 1, mlp_down layers 1-3");
    char small[12];
    qrl_trace_sites_coverage(&CFG, qrl_trace_layout_site_ids(l), qrl_trace_layout_n_sites(l),
                             QRL_TRACE_KINDS_LINEAR, &cov, &wanted, small, sizeof small, NULL, 0);
    cr_assert_eq(strlen(small), sizeof small - 1);
    cr_assert_eq(strncmp(small, "attn_in lay", sizeof small - 1), 0, "%s", small);
    qrl_trace_layout_free(l);
}
