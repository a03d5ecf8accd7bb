/* The GroupResult converters: a finished scheduler group packed into the wire message
 * (rollout/result.h), encoded, decoded, and viewed as the learner's update input
 * (learner/batch.h) comes back with the same tokens, log-probs, versions, rewards and
 * prompt; a malformed message (counts that disagree, a token id beyond int32, a missing
 * result) is refused with INVALID_ARGUMENT and leaves the batch empty. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "learner/batch.h"
#include "rollout/result.h"
#include "wire/wire.h"

static const int32_t PROMPT[] = {5, 6, 7};
static const int32_t TOK0[] = {11, 12, 13, 2};
static const float LP0[] = {-0.5f, -1.25f, -0.125f, -2.0f};
static const uint64_t VER0[] = {3, 3, 4, 4};

/* Two responses: one of four tokens, one empty (its arrays NULL, as the scheduler gives for a
 * prompt too long to answer). */
static void scheduler_group(qrl_scheduler_group_result *g, qrl_scheduler_response rs[2]) {
    memset(rs, 0, 2 * sizeof *rs);
    rs[0] = (qrl_scheduler_response){.tokens = TOK0, .logprobs = LP0, .versions = VER0, .n_tokens = 4,
                                     .finish = QRL_FINISH_EOS,
                                     .text = "forty two", .reward = 1.0, .correct = true, .extracted = "42",
                                     .queue_us = 10, .prefill_us = 20, .decode_us = 30, .verify_us = 4,
                                     .started_unix_ms = 1000, .finished_unix_ms = 1200};
    rs[1] = (qrl_scheduler_response){.n_tokens = 0, .finish = QRL_FINISH_PROMPT_TOO_LONG, .text = "",
                                     .reward = 0.0, .extracted = "",
                                     .queue_us = 30, .started_unix_ms = 900, .finished_unix_ms = 1100};
    *g = (qrl_scheduler_group_result){.group_id = 77, .group_size = 2, .prompt = PROMPT, .n_prompt = 3,
                                      .task = "arith", .responses = rs, .total_us = 5000};
}

/* r encoded and decoded again: what the learner receives. */
static Qrl__GroupResult *through_wire(Qrl__GroupResult *r) {
    uint8_t *buf;
    size_t len;
    qrl_error e;
    cr_assert_eq(qrl_wire_encode_alloc(&r->base, &buf, &len, &e), QRL_OK, "%s", e.msg);
    ProtobufCMessage *m;
    cr_assert_eq(qrl_wire_decode(&qrl__group_result__descriptor, buf, len, 1 << 20, &m, &e), QRL_OK, "%s", e.msg);
    free(buf);
    return (Qrl__GroupResult *)m;
}

Test(group_result, round_trip) {
    qrl_scheduler_group_result g;
    qrl_scheduler_response rs[2];
    scheduler_group(&g, rs);
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.run_id = 9;
    pg.dispatch_version = 3;
    Qrl__GroupResult *r;
    qrl_error e;
    cr_assert_eq(qrl_scheduler_result_to_wire(&g, &pg, "rep-1", true, &r, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(r->group_id, 77);
    cr_assert_eq(r->run_id, 9);
    cr_assert_eq(r->dispatch_version, 3);
    cr_assert_eq(r->chunk_count, 1);
    cr_assert_str_eq(r->replica_id, "rep-1");
    cr_assert_str_eq(r->task, "arith");
    cr_assert_str_eq(r->responses[0]->text, "forty two");
    cr_assert_str_eq(r->responses[0]->extracted_answer, "42");
    cr_assert(r->responses[0]->correct);
    cr_assert_eq(r->timings->total_us, 5000);
    cr_assert_eq(r->timings->queue_us, 20); /* the mean of 10 and 30 */
    cr_assert_eq(r->timings->started_unix_ms, 900);
    cr_assert_eq(r->timings->finished_unix_ms, 1200);
    cr_assert_eq(qrl_wire_group_result_validate(r, 2, 100, &e), QRL_OK, "%s", e.msg);

    Qrl__GroupResult *back = through_wire(r);
    const Qrl__GroupResult *list[] = {back, back};
    qrl_learner_batch b;
    cr_assert_eq(qrl_learner_batch_from_wire(list, 2, &b, &e), QRL_OK, "%s", e.msg);
    cr_assert_eq(b.n_groups, 2);
    for (size_t k = 0; k < 2; k++) {
        const qrl_learner_group *lg = &b.groups[k];
        cr_assert_eq(lg->group_id, 77);
        cr_assert_eq(lg->n_prompt, 3);
        cr_assert_arr_eq(lg->prompt, PROMPT, sizeof PROMPT);
        cr_assert_eq(lg->n_responses, 2);
        cr_assert_eq(lg->responses[0].n_tokens, 4);
        cr_assert_arr_eq(lg->responses[0].tokens, TOK0, sizeof TOK0);
        cr_assert_arr_eq(lg->responses[0].logprobs, LP0, sizeof LP0);
        cr_assert_arr_eq(lg->responses[0].versions, VER0, sizeof VER0);
        cr_assert_float_eq(lg->responses[0].reward, 1.0f, 0);
        cr_assert_eq(lg->responses[1].n_tokens, 0);
        cr_assert_float_eq(lg->responses[1].reward, 0.0f, 0);
    }
    qrl_learner_batch_free(&b);
    cr_assert_null(b.groups);
    qrl_wire_free(&back->base);
    qrl__group_result__free_unpacked(r, NULL);
}

Test(group_result, without_text) {
    qrl_scheduler_group_result g;
    qrl_scheduler_response rs[2];
    scheduler_group(&g, rs);
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    Qrl__GroupResult *r;
    qrl_error e;
    cr_assert_eq(qrl_scheduler_result_to_wire(&g, &pg, NULL, false, &r, &e), QRL_OK, "%s", e.msg);
    cr_assert_str_eq(r->responses[0]->text, "");
    cr_assert_str_eq(r->replica_id, "");
    cr_assert_null(r->position);
    qrl__group_result__free_unpacked(r, NULL);
}

Test(group_result, malformed) {
    qrl_scheduler_group_result g;
    qrl_scheduler_response rs[2];
    scheduler_group(&g, rs);
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    Qrl__GroupResult *r;
    qrl_error e;
    cr_assert_eq(qrl_scheduler_result_to_wire(&g, &pg, "rep", false, &r, &e), QRL_OK, "%s", e.msg);
    qrl_learner_batch b;
    const Qrl__GroupResult *list[] = {r};

    r->responses[0]->n_behavior_logprobs = 3; /* one log-prob short */
    cr_assert_eq(qrl_learner_batch_from_wire(list, 1, &b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "group 77 response 0") != NULL, "%s", e.msg);
    cr_assert_null(b.groups);
    r->responses[0]->n_behavior_logprobs = 4;

    r->responses[0]->token_ids[2] = 0x80000000u; /* not an int32 */
    cr_assert_eq(qrl_learner_batch_from_wire(list, 1, &b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "token 2") != NULL, "%s", e.msg);
    r->responses[0]->token_ids[2] = 13;

    const Qrl__GroupResult *missing[] = {r, NULL};
    cr_assert_eq(qrl_learner_batch_from_wire(missing, 2, &b, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "result 1") != NULL, "%s", e.msg);

    cr_assert_eq(qrl_learner_batch_from_wire(list, 1, &b, &e), QRL_OK, "%s", e.msg);
    qrl_learner_batch_free(&b);
    qrl__group_result__free_unpacked(r, NULL);
}
