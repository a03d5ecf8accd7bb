/* Wire helpers: validators (each rule's error names the group, response and field),
 * chunking of large results, Kafka keys, CRC-32C. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

/* ---- a valid result to break, one rule at a time ------------------------------------ */

#define G 4
#define T 5

typedef struct fixture {
    uint32_t tok[G][T];
    float lp[G][T];
    uint64_t ver[G][T];
    uint32_t prompt[3];
    Qrl__Response r[G];
    Qrl__Response *rp[G];
    Qrl__GroupResult g;
} fixture;

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < G; i++) {
        for (int t = 0; t < T; t++) {
            f->tok[i][t] = (uint32_t)(10 * i + t);
            f->lp[i][t] = -0.25f * (float)(t + 1);
            f->ver[i][t] = 7 + (uint64_t)(t >= 3); /* a sync boundary after token 2 */
        }
        Qrl__Response init = QRL__RESPONSE__INIT;
        f->r[i] = init;
        f->r[i].n_token_ids = f->r[i].n_behavior_logprobs = f->r[i].n_token_versions = T;
        f->r[i].token_ids = f->tok[i];
        f->r[i].behavior_logprobs = f->lp[i];
        f->r[i].token_versions = f->ver[i];
        f->r[i].finish_reason = QRL__FINISH_REASON__FINISH_REASON_EOS;
        f->r[i].reward = (float)(i % 2);
        f->rp[i] = &f->r[i];
    }
    f->prompt[0] = 1; f->prompt[1] = 50; f->prompt[2] = 99;
    Qrl__GroupResult init = QRL__GROUP_RESULT__INIT;
    f->g = init;
    f->g.group_id = 42;
    f->g.replica_id = "rollout-1";
    f->g.group_size = G;
    f->g.n_prompt_token_ids = 3;
    f->g.prompt_token_ids = f->prompt;
    f->g.n_responses = G;
    f->g.responses = f->rp;
    f->g.chunk_count = 1;
}

/* Validates and expects CORRUPT with exactly `msg`. */
static void expect_bad(const fixture *f, uint32_t expected_g, const char *msg) {
    qrl_error e;
    qrl_status st = qrl_wire_group_result_validate(&f->g, expected_g, 100, &e);
    cr_assert_eq(st, QRL_STATUS_CORRUPT, "accepted; wanted: %s", msg);
    cr_assert_str_eq(e.msg, msg);
}

Test(validate, group_result_valid) {
    fixture f;
    fixture_init(&f);
    qrl_error e;
    cr_assert_eq(qrl_wire_group_result_validate(&f.g, G, 100, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_wire_group_result_validate(&f.g, 0, 0, &e), QRL_OK, "%s", e.msg);
    /* edge cases that are legal */
    f.lp[1][0] = 0.0f;                                /* a certain token */
    f.r[2].n_token_ids = f.r[2].n_behavior_logprobs = f.r[2].n_token_versions = 0;
    f.r[2].finish_reason = QRL__FINISH_REASON__FINISH_REASON_PROMPT_TOO_LONG;
    f.r[3].finish_reason = QRL__FINISH_REASON__FINISH_REASON_ABORTED;
    f.r[3].n_token_ids = f.r[3].n_behavior_logprobs = f.r[3].n_token_versions = 0;
    f.r[0].sampling_truncated = 1; f.r[0].truncated_tokens = T;
    cr_assert_eq(qrl_wire_group_result_validate(&f.g, G, 100, &e), QRL_OK, "%s", e.msg);
}

Test(validate, group_result_lengths_named) {
    fixture f;
    fixture_init(&f);
    f.r[2].n_behavior_logprobs = T - 1;
    expect_bad(&f, G, "GroupResult group 42 response 2: behavior_logprobs has 4 entries but token_ids has 5");
    fixture_init(&f);
    f.r[3].n_token_versions = T + 1;
    expect_bad(&f, G, "GroupResult group 42 response 3: token_versions has 6 entries but token_ids has 5");
    fixture_init(&f);
    f.r[0].n_token_ids = T - 2;
    expect_bad(&f, G, "GroupResult group 42 response 0: behavior_logprobs has 5 entries but token_ids has 3");
}

Test(validate, group_result_logprobs_named) {
    fixture f;
    fixture_init(&f);
    f.lp[1][3] = NAN;
    expect_bad(&f, G, "GroupResult group 42 response 1: behavior_logprobs[3] is nan");
    fixture_init(&f);
    f.lp[2][0] = -INFINITY;
    expect_bad(&f, G, "GroupResult group 42 response 2: behavior_logprobs[0] is -inf");
    fixture_init(&f);
    f.lp[0][4] = INFINITY;
    expect_bad(&f, G, "GroupResult group 42 response 0: behavior_logprobs[4] is inf");
    fixture_init(&f);
    f.lp[3][2] = 0.5f;
    expect_bad(&f, G, "GroupResult group 42 response 3: behavior_logprobs[2] = 0.5 is positive (log-probs are <= 0)");
    fixture_init(&f);
    f.lp[3][2] = 5e-5f; /* float rounding of a log-softmax: within the slack */
    qrl_error e;
    cr_assert_eq(qrl_wire_group_result_validate(&f.g, G, 100, &e), QRL_OK, "%s", e.msg);
}

Test(validate, group_result_group_size_named) {
    fixture f;
    fixture_init(&f);
    expect_bad(&f, 8, "GroupResult group 42: group_size 4 does not match the dispatched G 8");
    fixture_init(&f);
    f.g.n_responses = G - 1;
    expect_bad(&f, G, "GroupResult group 42: has 3 responses, group_size is 4");
    fixture_init(&f);
    f.g.group_size = 0;
    expect_bad(&f, 0, "GroupResult group 42: group_size 0 is outside [1, 4096]");
}

Test(validate, group_result_other_rules_named) {
    fixture f;
    fixture_init(&f);
    f.ver[1][4] = 6;
    expect_bad(&f, G, "GroupResult group 42 response 1: token_versions[4] = 6 is below token_versions[3] = 8 (versions never decrease)");
    fixture_init(&f);
    f.tok[2][1] = 100;
    expect_bad(&f, G, "GroupResult group 42 response 2: token_ids[1] = 100 is outside the vocabulary (100 tokens)");
    fixture_init(&f);
    f.prompt[2] = 4000;
    expect_bad(&f, G, "GroupResult group 42: prompt_token_ids[2] = 4000 is outside the vocabulary (100 tokens)");
    fixture_init(&f);
    f.r[0].finish_reason = 0;
    expect_bad(&f, G, "GroupResult group 42 response 0: finish_reason 0 is not a known reason");
    fixture_init(&f);
    f.r[0].finish_reason = 99;
    expect_bad(&f, G, "GroupResult group 42 response 0: finish_reason 99 is not a known reason");
    fixture_init(&f);
    f.r[1].finish_reason = QRL__FINISH_REASON__FINISH_REASON_PROMPT_TOO_LONG;
    expect_bad(&f, G, "GroupResult group 42 response 1: finish_reason PROMPT_TOO_LONG with 5 tokens (expected none)");
    fixture_init(&f);
    f.r[1].n_token_ids = f.r[1].n_behavior_logprobs = f.r[1].n_token_versions = 0;
    expect_bad(&f, G, "GroupResult group 42 response 1: token_ids is empty (finish_reason 1 needs at least one token)");
    fixture_init(&f);
    f.r[3].reward = NAN;
    expect_bad(&f, G, "GroupResult group 42 response 3: reward nan is not finite");
    fixture_init(&f);
    f.r[3].truncated_tokens = 2;
    expect_bad(&f, G, "GroupResult group 42 response 3: truncated_tokens 2 but sampling_truncated is false");
    f.r[3].sampling_truncated = 1; f.r[3].truncated_tokens = T + 1;
    expect_bad(&f, G, "GroupResult group 42 response 3: truncated_tokens 6 exceeds the 5 tokens");
    fixture_init(&f);
    f.g.n_prompt_token_ids = 0;
    expect_bad(&f, G, "GroupResult group 42: prompt_token_ids is empty");
    fixture_init(&f);
    f.rp[2] = NULL;
    expect_bad(&f, G, "GroupResult group 42 response 2: missing");
    fixture_init(&f);
    f.g.group_id = 0;
    expect_bad(&f, G, "GroupResult group 0: group_id is 0 (unset)");
}

Test(validate, group_result_chunk_fields) {
    fixture f;
    fixture_init(&f);
    f.g.chunk_count = 0;
    expect_bad(&f, G, "GroupResult group 42: chunk_count is 0 (a whole result carries 1)");
    f.g.chunk_count = 1; f.g.chunk_index = 1;
    expect_bad(&f, G, "GroupResult group 42: chunk_index 1 in a whole result (chunk_count 1)");
    f.g.chunk_index = 0; f.g.whole_crc32c = 5;
    expect_bad(&f, G, "GroupResult group 42: a whole result carries chunk_data/whole_bytes/whole_crc32c");
    /* a chunk message */
    uint8_t piece[10] = {0};
    Qrl__GroupResult c = QRL__GROUP_RESULT__INIT;
    c.group_id = 42; c.chunk_index = 2; c.chunk_count = 3; c.whole_bytes = 25; c.whole_crc32c = 1;
    c.chunk_data.data = piece; c.chunk_data.len = 10;
    qrl_error e;
    cr_assert_eq(qrl_wire_group_result_validate(&c, 8, 100, &e), QRL_OK, "%s", e.msg);
    c.chunk_index = 3;
    cr_assert_eq(qrl_wire_group_result_validate(&c, 8, 100, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "GroupResult group 42: chunk_index 3 is not below chunk_count 3");
    c.chunk_index = 1; c.group_size = 8;
    cr_assert_eq(qrl_wire_group_result_validate(&c, 8, 100, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "GroupResult group 42 chunk 1: a chunk message carries content fields (responses, prompt_token_ids or group_size)");
    c.group_size = 0; c.chunk_data.len = 0;
    cr_assert_eq(qrl_wire_group_result_validate(&c, 8, 100, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "GroupResult group 42 chunk 1: chunk_data is empty");
}

/* A truncated whole result decodes only at field boundaries; validation refuses those,
 * because chunk_count (1) is the last field a whole result writes. */
Test(validate, every_prefix_of_a_result_is_refused) {
    fixture f;
    fixture_init(&f);
    uint8_t *b;
    size_t n;
    qrl_error e;
    cr_assert_eq(qrl_wire_encode_alloc(&f.g.base, &b, &n, &e), QRL_OK);
    for (size_t cut = 1; cut < n; cut++) {
        ProtobufCMessage *m;
        if (qrl_wire_decode(&qrl__group_result__descriptor, b, cut, 0, &m, &e) != QRL_OK) continue;
        cr_assert_neq(qrl_wire_group_result_validate((Qrl__GroupResult *)m, G, 100, &e), QRL_OK,
                      "prefix of %zu / %zu bytes validated", cut, n);
        qrl_wire_free(m);
    }
    free(b);
}

/* ---- PromptGroup -------------------------------------------------------------------- */

Test(validate, prompt_group_rules_named) {
    Qrl__SamplingParams sp = QRL__SAMPLING_PARAMS__INIT;
    sp.temperature = 1.0f; sp.max_new_tokens = 128;
    uint32_t stop_ids[] = {2};
    char *stops[] = {"####", ""};
    uint32_t prompt[] = {5, 6, 7};
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.group_id = 9; pg.group_size = 8; pg.n_prompt_token_ids = 3; pg.prompt_token_ids = prompt;
    pg.sampling = &sp;
    qrl_error e;
    cr_assert_eq(qrl_wire_prompt_group_validate(&pg, 100, &e), QRL_OK, "%s", e.msg);
    sp.temperature = 0; sp.top_p = 1; sp.n_stop_token_ids = 1; sp.stop_token_ids = stop_ids;
    sp.n_stop_strings = 1; sp.stop_strings = stops;
    cr_assert_eq(qrl_wire_prompt_group_validate(&pg, 100, &e), QRL_OK, "%s", e.msg); /* greedy */
#define BAD_PG(want)                                                                   \
    do {                                                                              \
        cr_assert_eq(qrl_wire_prompt_group_validate(&pg, 100, &e), QRL_STATUS_CORRUPT); \
        cr_assert_str_eq(e.msg, want);                                                \
    } while (0)
    sp.n_stop_strings = 2;
    BAD_PG("PromptGroup group 9: sampling.stop_strings[1] is empty");
    sp.n_stop_strings = 1; stop_ids[0] = 100;
    BAD_PG("PromptGroup group 9: sampling.stop_token_ids[0] = 100 is outside the vocabulary (100 tokens)");
    stop_ids[0] = 2; sp.temperature = NAN;
    BAD_PG("PromptGroup group 9: sampling.temperature nan is not a finite value >= 0");
    sp.temperature = -0.5f;
    BAD_PG("PromptGroup group 9: sampling.temperature -0.5 is not a finite value >= 0");
    sp.temperature = 1; sp.top_p = 1.5f;
    BAD_PG("PromptGroup group 9: sampling.top_p 1.5 is outside [0, 1]");
    sp.top_p = 0.9f; sp.max_new_tokens = 0;
    BAD_PG("PromptGroup group 9: sampling.max_new_tokens 0 is outside [1, 1048576]");
    sp.max_new_tokens = 16; pg.sampling = NULL;
    BAD_PG("PromptGroup group 9: sampling is missing");
    pg.sampling = &sp; prompt[1] = 1000;
    BAD_PG("PromptGroup group 9: prompt_token_ids[1] = 1000 is outside the vocabulary (100 tokens)");
    prompt[1] = 6; pg.n_prompt_token_ids = 0;
    BAD_PG("PromptGroup group 9: prompt_token_ids is empty");
    pg.n_prompt_token_ids = 3; pg.group_size = 0;
    BAD_PG("PromptGroup group 9: group_size 0 is outside [1, 4096]");
    pg.group_size = 5000;
    BAD_PG("PromptGroup group 9: group_size 5000 is outside [1, 4096]");
    pg.group_size = 8; pg.group_id = 0;
    BAD_PG("PromptGroup group 0: group_id is 0 (unset)");
#undef BAD_PG
}

/* ---- TraceChunk and WeightManifest -------------------------------------------------- */

Test(validate, trace_chunk_rules) {
    uint32_t sites[] = {3, 8, 20};
    uint8_t scales[12] = {0}, bits[24] = {0};
    Qrl__TraceChunk t = QRL__TRACE_CHUNK__INIT;
    t.group_id = 42; t.response_index = 1; t.chunk_index = 0; t.chunk_count = 2;
    t.token_begin = 64; t.token_count = 2; t.n_site_ids = 3; t.site_ids = sites;
    t.scales.data = scales; t.scales.len = 12; t.bits.data = bits; t.bits.len = 24;
    t.format_version = 1; t.block_size = 16;
    qrl_error e;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_OK, "%s", e.msg);
    t.bits.len = 23;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: bits has 23 bytes, expected 24 (12 scales x 16 bits)");
    t.bits.len = 24; t.scales.len = 11;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: scales has 11 bytes, not a positive multiple of token_count 2");
    t.scales.len = 12; sites[2] = 8;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: site_ids[2] = 8 is not above site_ids[1] = 8");
    sites[2] = 20; t.format_version = 3;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_UNSUPPORTED);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: format_version got 3, expected 1 or 2");
    t.format_version = 2; /* the record layout: scales and bits travel inside the record */
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: record is empty");
    t.format_version = 1; t.chunk_index = 2;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 2: chunk_index 2 is not below chunk_count 2");
    t.chunk_index = 0; t.block_size = 12;
    cr_assert_eq(qrl_wire_trace_chunk_validate(&t, &e), QRL_STATUS_CORRUPT);
    cr_assert_str_eq(e.msg, "TraceChunk group 42 response 1 chunk 0: block_size 12 is not a positive multiple of 8");
}

Test(validate, weight_manifest_rules) {
    uint64_t s0[] = {4, 8}, s1[] = {8};
    Qrl__TensorMeta a = QRL__TENSOR_META__INIT, b = QRL__TENSOR_META__INIT;
    a.name = "model.embed_tokens.weight"; a.dtype = "BF16"; a.n_shape = 2; a.shape = s0;
    a.byte_offset = 0; a.byte_size = 64;
    b.name = "model.norm.weight"; b.dtype = "F32"; b.n_shape = 1; b.shape = s1;
    b.byte_offset = 64; b.byte_size = 32;
    Qrl__TensorMeta *ts[] = {&a, &b};
    Qrl__WeightManifest m = QRL__WEIGHT_MANIFEST__INIT;
    m.version = 3; m.n_tensors = 2; m.tensors = ts; m.bucket_bytes = 40; m.total_bytes = 96;
    m.bucket_count = 3; m.checksum_algorithm = QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C;
    qrl_error e;
    cr_assert_eq(qrl_wire_weight_manifest_validate(&m, &e), QRL_OK, "%s", e.msg);
#define BAD_WM(code, want)                                                    \
    do {                                                                     \
        cr_assert_eq(qrl_wire_weight_manifest_validate(&m, &e), code);      \
        cr_assert_str_eq(e.msg, want);                                       \
    } while (0)
    m.bucket_count = 2;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: bucket_count 2, expected 3 for 96 bytes in 40-byte buckets");
    m.bucket_count = 3; b.byte_size = 16;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: tensor 'model.norm.weight' byte_size 16, expected 32 (numel 8 x 4)");
    b.byte_size = 32; b.byte_offset = 60;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: tensor 'model.norm.weight' byte_offset 60 overlaps or precedes the previous tensor (ends at 64)");
    b.byte_offset = 72;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: tensor 'model.norm.weight' [72, +32) runs past total_bytes 96");
    b.byte_offset = 64; b.dtype = "I8";
    BAD_WM(QRL_STATUS_UNSUPPORTED, "WeightManifest version 3: tensor 'model.norm.weight' dtype 'I8' (expected BF16, F16 or F32)");
    b.dtype = "F32"; b.name = "model.embed_tokens.weight";
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: tensor 'model.embed_tokens.weight' is listed twice");
    b.name = "model.norm.weight"; m.checksum_algorithm = 0;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: checksum_algorithm 0 is not known");
    m.checksum_algorithm = QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_NONE; m.bucket_bytes = 0;
    BAD_WM(QRL_STATUS_CORRUPT, "WeightManifest version 3: bucket_bytes is 0");
#undef BAD_WM
}

/* ---- chunking ----------------------------------------------------------------------- */

/* A result of G responses of `len` tokens (heap), for chunking. */
static Qrl__GroupResult *big_result(size_t g, size_t len) {
    Qrl__GroupResult *r = calloc(1, sizeof *r);
    qrl__group_result__init(r);
    r->group_id = 77; r->run_id = 5; r->replica_id = strdup("rollout-9");
    r->group_size = (uint32_t)g; r->chunk_count = 1;
    r->n_prompt_token_ids = 4;
    r->prompt_token_ids = malloc(4 * sizeof(uint32_t));
    for (int i = 0; i < 4; i++) r->prompt_token_ids[i] = (uint32_t)(100 + i);
    r->n_responses = g;
    r->responses = calloc(g, sizeof *r->responses);
    for (size_t i = 0; i < g; i++) {
        Qrl__Response *x = calloc(1, sizeof *x);
        qrl__response__init(x);
        x->n_token_ids = x->n_behavior_logprobs = x->n_token_versions = len;
        x->token_ids = malloc(len * sizeof(uint32_t));
        x->behavior_logprobs = malloc(len * sizeof(float));
        x->token_versions = malloc(len * sizeof(uint64_t));
        for (size_t t = 0; t < len; t++) {
            x->token_ids[t] = (uint32_t)((i * 7919 + t * 104729) % 151000);
            x->behavior_logprobs[t] = -(float)((t * 37 + i) % 1000) / 97.0f;
            x->token_versions[t] = 1000 + t / 100;
        }
        x->finish_reason = QRL__FINISH_REASON__FINISH_REASON_LENGTH;
        x->reward = (float)i;
        r->responses[i] = x;
    }
    return r;
}

static Qrl__GroupResult *decode_chunk(const qrl_wire_chunks *ch, size_t i) {
    ProtobufCMessage *m;
    qrl_error e;
    cr_assert_eq(qrl_wire_decode(&qrl__group_result__descriptor, ch->data[i], ch->len[i],
                                 QRL_WIRE_DEFAULT_CHUNK_BYTES, &m, &e), QRL_OK, "%s", e.msg);
    return (Qrl__GroupResult *)m;
}

Test(chunk, small_result_is_one_plain_message) {
    Qrl__GroupResult *r = big_result(2, 10);
    qrl_wire_chunks ch;
    qrl_error e;
    cr_assert_eq(qrl_wire_result_encode_chunked(r, QRL_WIRE_DEFAULT_CHUNK_BYTES, &ch, &e), QRL_OK);
    cr_assert_eq(ch.count, 1);
    uint8_t *plain;
    size_t n;
    cr_assert_eq(qrl_wire_encode_alloc(&r->base, &plain, &n, &e), QRL_OK);
    cr_assert_eq(ch.len[0], n);
    cr_assert_arr_eq(ch.data[0], plain, n);
    free(plain);
    qrl_wire_chunks_free(&ch);
    cr_assert_eq(qrl_wire_result_encode_chunked(r, 200, &ch, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(e.msg, "GroupResult group 77: chunk limit 200 is below 265 bytes");
    cr_assert_eq(ch.count, 0);
    qrl_wire_free(&r->base);
}

Test(chunk, split_and_join_any_order) {
    Qrl__GroupResult *r = big_result(8, 4000); /* ~300 KB */
    const size_t limit = 16 << 10;
    qrl_wire_chunks ch;
    qrl_error e;
    cr_assert_eq(qrl_wire_result_encode_chunked(r, limit, &ch, &e), QRL_OK, "%s", e.msg);
    uint8_t *whole;
    size_t n;
    cr_assert_eq(qrl_wire_encode_alloc(&r->base, &whole, &n, &e), QRL_OK);
    size_t piece = limit - 96 - strlen("rollout-9");
    cr_assert_eq(ch.count, (n + piece - 1) / piece);
    cr_assert_gt(ch.count, 10);
    Qrl__GroupResult **parts = calloc(ch.count, sizeof *parts);
    for (size_t i = 0; i < ch.count; i++) {
        cr_assert_leq(ch.len[i], limit);
        /* reverse order, as a consumer may see them after a rebalance */
        parts[ch.count - 1 - i] = decode_chunk(&ch, i);
        Qrl__GroupResult *c = parts[ch.count - 1 - i];
        cr_assert_eq(c->chunk_index, i);
        cr_assert_eq(c->chunk_count, ch.count);
        cr_assert_eq(c->group_id, 77);
        cr_assert_str_eq(c->replica_id, "rollout-9");
        cr_assert_eq(c->whole_bytes, n);
        cr_assert_eq(c->whole_crc32c, qrl_wire_crc32c(0, whole, n));
        cr_assert_eq(qrl_wire_group_result_validate(c, 8, 0, &e), QRL_OK, "%s", e.msg);
    }
    Qrl__GroupResult *j;
    cr_assert_eq(qrl_wire_result_join(parts, ch.count, 0, &j, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(qrl_wire_group_result_validate(j, 8, 151000, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(j->n_responses, 8);
    cr_assert_eq(j->responses[5]->n_token_ids, 4000);
    cr_assert_eq(j->responses[5]->token_ids[3999], (5 * 7919 + 3999 * 104729) % 151000);
    cr_assert_eq(j->responses[7]->behavior_logprobs[123], -(float)((123 * 37 + 7) % 1000) / 97.0f);
    cr_assert_eq(j->responses[2]->token_versions[3999], 1039);
    uint8_t *again;
    size_t n2;
    cr_assert_eq(qrl_wire_encode_alloc(&j->base, &again, &n2, &e), QRL_OK);
    cr_assert_eq(n2, n);
    cr_assert_arr_eq(again, whole, n);

    /* failures, each named */
    Qrl__GroupResult *bad;
    cr_assert_eq(qrl_wire_result_join(parts, ch.count - 1, 0, &bad, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "chunks given, chunk_count is"), "%s", e.msg);
    Qrl__GroupResult *saved = parts[3];
    parts[3] = parts[4];
    cr_assert_eq(qrl_wire_result_join(parts, ch.count, 0, &bad, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "given twice"), "%s", e.msg);
    parts[3] = saved;
    parts[2]->chunk_data.data[17] ^= 0x40;
    cr_assert_eq(qrl_wire_result_join(parts, ch.count, 0, &bad, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "CRC-32C of the joined"), "%s", e.msg);
    parts[2]->chunk_data.data[17] ^= 0x40;
    parts[6]->whole_crc32c ^= 1; /* a chunk of another production of the same group */
    cr_assert_eq(qrl_wire_result_join(parts, ch.count, 0, &bad, &e), QRL_STATUS_CORRUPT);
    cr_assert(strstr(e.msg, "differ from chunk"), "%s", e.msg);
    parts[6]->whole_crc32c ^= 1;
    cr_assert_eq(qrl_wire_result_join(parts, ch.count, 1000, &bad, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(e.msg, "exceeds 1000"), "%s", e.msg);
    cr_assert_null(bad);

    for (size_t i = 0; i < ch.count; i++) qrl_wire_free(&parts[i]->base);
    free(parts);
    free(again);
    free(whole);
    qrl_wire_free(&j->base);
    qrl_wire_chunks_free(&ch);
    qrl_wire_free(&r->base);
}

/* ---- keys and CRC ------------------------------------------------------------------- */

Test(keys, format_and_parse) {
    char k[QRL_WIRE_KEY_MAX];
    cr_assert_eq(qrl_wire_group_key(42, k), 2);
    cr_assert_str_eq(k, "42");
    cr_assert_eq(qrl_wire_group_key(UINT64_MAX, k), 20);
    cr_assert_str_eq(k, "18446744073709551615");
    uint64_t id;
    qrl_error e;
    cr_assert_eq(qrl_wire_group_key_parse("18446744073709551615", 20, &id, &e), QRL_OK);
    cr_assert_eq(id, UINT64_MAX);
    cr_assert_eq(qrl_wire_group_key_parse("1234xyz", 4, &id, &e), QRL_OK); /* length-bounded */
    cr_assert_eq(id, 1234);
    cr_assert_eq(qrl_wire_group_key_parse("18446744073709551616", 20, &id, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "group key: value overflows uint64 at byte 19");
    cr_assert_eq(qrl_wire_group_key_parse("12a4", 4, &id, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "group key: byte 2 (0x61) is not a digit");
    cr_assert_eq(qrl_wire_group_key_parse("0", 1, &id, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "group key: byte 0 is a leading '0'");
    cr_assert_eq(qrl_wire_group_key_parse("", 0, &id, &e), QRL_STATUS_PARSE);
    cr_assert_eq(qrl_wire_group_key_parse("123456789012345678901", 21, &id, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "group key: length 21 is not 1..20");
}

Test(crc, known_vectors_and_reference) {
    /* RFC 3720 (iSCSI) B.4 test vectors and the common check value */
    uint8_t buf[32];
    cr_assert_eq(qrl_wire_crc32c(0, "123456789", 9), 0xe3069283u);
    memset(buf, 0, 32);
    cr_assert_eq(qrl_wire_crc32c(0, buf, 32), 0x8a9136aau);
    memset(buf, 0xff, 32);
    cr_assert_eq(qrl_wire_crc32c(0, buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    cr_assert_eq(qrl_wire_crc32c(0, buf, 32), 0x46dd794eu);
    cr_assert_eq(qrl_wire_crc32c_sw(0, buf, 32), 0x46dd794eu);
    cr_assert_eq(qrl_wire_crc32c(0, buf, 0), 0);
    /* hardware path == reference at every alignment and length, and incremental == one-shot */
    uint8_t data[300];
    for (int i = 0; i < 300; i++) data[i] = (uint8_t)(i * 131 + 7);
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= 300; len += 13) {
            uint32_t a = qrl_wire_crc32c(0, data + off, len);
            cr_assert_eq(a, qrl_wire_crc32c_sw(0, data + off, len), "off %zu len %zu", off, len);
            uint32_t half = qrl_wire_crc32c(0, data + off, len / 3);
            cr_assert_eq(qrl_wire_crc32c(half, data + off + len / 3, len - len / 3), a);
        }
}
