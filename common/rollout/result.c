/* Scheduler group -> GroupResult (result.h). */
#include "rollout/result.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static char *dupstr(const char *s) { return strdup(s ? s : ""); }

static Qrl__Timings *timings_new(uint64_t queue, uint64_t prefill, uint64_t decode,
                                 uint64_t verify, uint64_t total, uint64_t t0, uint64_t t1) {
    Qrl__Timings *t = malloc(sizeof *t);
    if (!t) return NULL;
    qrl__timings__init(t);
    t->queue_us = queue;
    t->prefill_us = prefill;
    t->decode_us = decode;
    t->verify_us = verify;
    t->total_us = total;
    t->started_unix_ms = t0;
    t->finished_unix_ms = t1;
    return t;
}

static bool response_fill(Qrl__Response *o, const qrl_scheduler_response *r, bool emit_text) {
    qrl__response__init(o);
    size_t n = (size_t)r->n_tokens;
    o->n_token_ids = o->n_behavior_logprobs = o->n_token_versions = n;
    if (n) {
        o->token_ids = malloc(n * sizeof *o->token_ids);
        o->behavior_logprobs = malloc(n * sizeof *o->behavior_logprobs);
        o->token_versions = malloc(n * sizeof *o->token_versions);
        if (!o->token_ids || !o->behavior_logprobs || !o->token_versions) return false;
        for (size_t i = 0; i < n; i++) {
            o->token_ids[i] = (uint32_t)r->tokens[i];
            o->behavior_logprobs[i] = r->logprobs[i];
            o->token_versions[i] = r->versions[i];
        }
    }
    o->finish_reason = (Qrl__FinishReason)r->finish; /* same values (scheduler.h) */
    o->reward = (float)r->reward;
    o->correct = r->correct;
    o->extracted_answer = dupstr(r->extracted);
    o->text = dupstr(emit_text ? r->text : "");
    o->sampling_truncated = r->sampling_truncated;
    o->truncated_tokens = r->truncated_tokens;
    o->reprefills = r->reprefills;
    o->restarts = r->restarts;
    o->timings = timings_new(r->queue_us, r->prefill_us, r->decode_us, r->verify_us,
                             0, r->started_unix_ms, r->finished_unix_ms);
    return o->extracted_answer && o->text && o->timings;
}

qrl_status qrl_scheduler_result_to_wire(const qrl_scheduler_group_result *r, const Qrl__PromptGroup *pg,
                                        const char *replica_id, bool emit_text, Qrl__GroupResult **out,
                                        qrl_error *err) {
    *out = NULL;
    Qrl__GroupResult *o = malloc(sizeof *o);
    if (!o) return qrl_error_set(err, QRL_STATUS_NOMEM, "GroupResult %" PRIu64 ": out of memory", r->group_id);
    qrl__group_result__init(o);
    o->group_id = r->group_id;
    o->run_id = pg->run_id;
    o->replica_id = dupstr(replica_id);
    o->group_size = r->group_size;
    o->dispatch_version = pg->dispatch_version;
    o->task = dupstr(r->task);
    o->chunk_count = 1;
    bool ok = o->replica_id && o->task;
    o->n_prompt_token_ids = (size_t)r->n_prompt;
    o->prompt_token_ids = malloc((size_t)r->n_prompt * sizeof *o->prompt_token_ids);
    ok = ok && o->prompt_token_ids;
    for (int i = 0; ok && i < r->n_prompt; i++) o->prompt_token_ids[i] = (uint32_t)r->prompt[i];
    o->responses = calloc(r->group_size, sizeof *o->responses);
    ok = ok && o->responses;
    uint64_t t0 = UINT64_MAX, t1 = 0, q = 0, pf = 0, dc = 0, vf = 0;
    for (uint32_t i = 0; ok && i < r->group_size; i++) {
        o->responses[i] = malloc(sizeof *o->responses[i]);
        if (!o->responses[i]) { ok = false; break; }
        o->n_responses = i + 1;
        ok = response_fill(o->responses[i], &r->responses[i], emit_text);
        const qrl_scheduler_response *s = &r->responses[i];
        if (s->started_unix_ms && s->started_unix_ms < t0) t0 = s->started_unix_ms;
        if (s->finished_unix_ms > t1) t1 = s->finished_unix_ms;
        q += s->queue_us, pf += s->prefill_us, dc += s->decode_us, vf += s->verify_us;
    }
    if (ok) {
        o->timings = timings_new(q / r->group_size, pf, dc, vf, r->total_us,
                                 t0 == UINT64_MAX ? 0 : t0, t1);
        ok = o->timings != NULL;
    }
    if (ok && pg->position) {
        o->position = malloc(sizeof *o->position);
        ok = o->position != NULL;
        if (ok) {
            qrl__dataset_position__init(o->position);
            o->position->epoch = pg->position->epoch;
            o->position->index = pg->position->index;
            o->position->source = dupstr(pg->position->source);
            ok = o->position->source != NULL;
        }
    }
    if (!ok) {
        qrl__group_result__free_unpacked(o, NULL);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "GroupResult %" PRIu64 ": out of memory", r->group_id);
    }
    *out = o;
    return QRL_OK;
}

