/* Prompt groups in the scheduler: submission (validation, copies, PROMPT_TOO_LONG),
 * stop strings, staleness restarts, scoring with the verifier and emission. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "rollout/sched_internal.h"

int qrl_sched_response_cap(const qrl_scheduler *s, const qrl_sched_group *g) {
    int room = s->ctx_len - g->n_prompt;
    return g->max_new < room ? g->max_new : room;
}

void qrl_sched_group_free(qrl_sched_group *g) {
    if (!g) return;
    for (uint32_t r = 0; g->resp && r < g->G; r++) {
        qrl_sched_resp *rp = &g->resp[r];
        free(rp->ids);
        free(rp->lp);
        free(rp->lp_full);
        free(rp->ver);
        free(rp->text);
        qrl_trace_buf_free(rp->trace);
    }
    for (int k = 0; k < g->n_stop_strings; k++) free(g->stop_strings[k]);
    free(g->stop_strings);
    free(g->stop_ids);
    free(g->task);
    free(g->reference);
    free(g->resp);
    free(g->out);
    free(g);
}

static char *dup_str(const char *s) { return strdup(s ? s : ""); }

static qrl_status validate(const qrl_scheduler *s, const qrl_scheduler_group_desc *d,
                           qrl_error *err) {
    if (d->group_size < 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "submit: group %llu: group_size is 0",
                             (unsigned long long)d->group_id);
    if (d->n_prompt < 1 || !d->prompt)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "submit: group %llu: empty prompt",
                             (unsigned long long)d->group_id);
    for (int i = 0; i < d->n_prompt; i++)
        if (d->prompt[i] < 0 || d->prompt[i] >= s->vocab)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "submit: group %llu: prompt token %d (index %d) is outside the "
                                 "vocabulary [0, %d)",
                                 (unsigned long long)d->group_id, d->prompt[i], i, s->vocab);
    if (d->max_new_tokens < 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "submit: group %llu: max_new_tokens %d (need >= 1)",
                             (unsigned long long)d->group_id, d->max_new_tokens);
    QRL_TRY(qrl_sampling_params_validate(&d->sampling, err));
    if (d->n_stop_token_ids < 0 || d->n_stop_strings < 0 ||
        (d->n_stop_token_ids > 0 && !d->stop_token_ids) ||
        (d->n_stop_strings > 0 && !d->stop_strings))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "submit: group %llu: stop lists: negative count or NULL array",
                             (unsigned long long)d->group_id);
    for (int k = 0; k < d->n_stop_strings; k++)
        if (!d->stop_strings[k] || !d->stop_strings[k][0])
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "submit: group %llu: stop_strings[%d] is empty",
                                 (unsigned long long)d->group_id, k);
    if (d->n_stop_strings > 0 && !s->tok)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "submit: group %llu: stop strings need a tokenizer (scheduler has "
                             "none)",
                             (unsigned long long)d->group_id);
    for (const qrl_sched_group *g = s->head; g; g = g->next)
        if (g->group_id == d->group_id)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "submit: group %llu is already queued or running",
                                 (unsigned long long)d->group_id);
    if (d->task && d->task[0] && !qrl_verifier_find(d->task))
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "submit: group %llu: unknown task '%s'",
                             (unsigned long long)d->group_id, d->task);
    return QRL_OK;
}

qrl_status qrl_scheduler_submit(qrl_scheduler *s, const qrl_scheduler_group_desc *d,
                                qrl_error *err) {
    QRL_TRY(validate(s, d, err));
    qrl_sched_group *g = calloc(1, sizeof *g);
    if (!g) return qrl_error_set(err, QRL_STATUS_NOMEM, "submit: out of memory");
    g->group_id = d->group_id;
    g->G = d->group_size;
    g->n_prompt = d->n_prompt;
    g->max_new = d->max_new_tokens;
    g->sampling = d->sampling;
    g->user = d->user;
    g->submit_us = qrl_sched_now_us();
    g->too_long = d->n_prompt >= s->ctx_len; /* no room for one generated token */
    g->task = dup_str(d->task);
    g->reference = dup_str(d->reference);
    g->verifier = d->task && d->task[0] ? qrl_verifier_find(d->task) : NULL;
    g->resp = calloc(g->G, sizeof *g->resp);
    g->out = calloc(g->G, sizeof *g->out);
    bool ok = g->task && g->reference && g->resp && g->out;
    if (ok && d->n_stop_token_ids > 0) {
        g->stop_ids = malloc(sizeof(int32_t) * (size_t)d->n_stop_token_ids);
        ok = g->stop_ids != NULL;
        if (ok) memcpy(g->stop_ids, d->stop_token_ids, sizeof(int32_t) * (size_t)d->n_stop_token_ids);
        g->n_stop_ids = d->n_stop_token_ids;
    }
    if (ok && d->n_stop_strings > 0) {
        g->stop_strings = calloc((size_t)d->n_stop_strings, sizeof(char *));
        ok = g->stop_strings != NULL;
        for (int k = 0; ok && k < d->n_stop_strings; k++) {
            g->stop_strings[k] = strdup(d->stop_strings[k]);
            g->n_stop_strings = k + 1;
            ok = g->stop_strings[k] != NULL;
        }
    }
    /* Per-response buffers sized for the worst case now, so steps do not allocate. */
    int cap = g->too_long ? 0 : qrl_sched_response_cap(s, g);
    for (uint32_t r = 0; ok && r < g->G; r++) {
        qrl_sched_resp *rp = &g->resp[r];
        rp->stop_end = -1;
        rp->ids = malloc(sizeof(int32_t) * (size_t)(g->n_prompt + cap));
        rp->lp = malloc(sizeof(float) * (size_t)(cap + 1));
        rp->lp_full = malloc(sizeof(float) * (size_t)(cap + 1));
        rp->ver = malloc(sizeof(uint64_t) * (size_t)(cap + 1));
        ok = rp->ids && rp->lp && rp->lp_full && rp->ver;
        if (ok && s->trace_layout && cap > 0) /* one record per token (trace_rec.h) */
            ok = qrl_trace_buf_new(s->trace_layout, (uint32_t)cap, &rp->trace, NULL) == QRL_OK;
        if (ok) memcpy(rp->ids, d->prompt, sizeof(int32_t) * (size_t)g->n_prompt);
        if (g->too_long) rp->finish = QRL_FINISH_PROMPT_TOO_LONG;
    }
    if (!ok) {
        qrl_sched_group_free(g);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "submit: group %llu: out of memory",
                             (unsigned long long)d->group_id);
    }
    if (g->too_long) {
        g->n_done = g->G;
        QRL_LOG_WARN("sched", "group=%llu prompt_tokens=%d context=%d: prompt too long",
                     (unsigned long long)g->group_id, g->n_prompt, s->ctx_len);
    }
    if (s->tail) s->tail->next = g;
    else s->head = g;
    s->tail = g;
    s->stats.groups_submitted++;
    return QRL_OK;
}

bool qrl_sched_stop_string_hit(qrl_scheduler *s, qrl_sched_group *g, qrl_sched_resp *rp) {
    char *text = NULL;
    qrl_error e;
    if (qrl_tokenizer_decode(s->tok, rp->ids + g->n_prompt, (size_t)rp->n_gen, true, &text, &e) !=
        QRL_OK)
        return false; /* ids come from the model's vocabulary; a gap id just never matches */
    size_t len = strlen(text);
    bool hit = false;
    long best = -1;
    for (int k = 0; k < g->n_stop_strings; k++) {
        size_t m = strlen(g->stop_strings[k]);
        /* Search only where a match can involve the new text (earlier text was checked). */
        size_t from = rp->text_checked >= m ? rp->text_checked - m + 1 : 0;
        if (from >= len) continue;
        const char *p = memmem(text + from, len - from, g->stop_strings[k], m);
        if (p) {
            long end = (long)(p - text) + (long)m;
            if (best < 0 || end < best) best = end; /* the earliest-ending stop wins */
            hit = true;
        }
    }
    rp->text_checked = len;
    if (hit) rp->stop_end = best;
    free(text);
    return hit;
}

void qrl_sched_resp_restart(qrl_sched_resp *rp) {
    rp->n_gen = 0;
    rp->text_checked = 0;
    rp->stop_end = -1;
    rp->truncated_tokens = 0;
    rp->reprefills = 0;
    rp->restarts++;
    if (rp->trace) qrl_trace_buf_truncate(rp->trace, 0); /* the records go with the tokens */
}

/* Decode and score one finished response; failures give reward 0 and are logged. */
static void finalize(qrl_scheduler *s, qrl_sched_group *g, uint32_t r) {
    qrl_sched_resp *rp = &g->resp[r];
    qrl_error e;
    memset(&rp->vr, 0, sizeof rp->vr);
    rp->verify_status = QRL_OK;
    if (s->tok && rp->n_gen > 0) {
        if (qrl_tokenizer_decode(s->tok, rp->ids + g->n_prompt, (size_t)rp->n_gen, true,
                                 &rp->text, &e) != QRL_OK)
            rp->text = NULL;
        else if (rp->stop_end >= 0 && (size_t)rp->stop_end < strlen(rp->text))
            rp->text[rp->stop_end] = '\0';
    }
    if (!rp->text) rp->text = strdup("");
    bool scored = rp->finish == QRL_FINISH_EOS || rp->finish == QRL_FINISH_STOP ||
                  rp->finish == QRL_FINISH_LENGTH;
    if (g->verifier && scored && rp->text) {
        uint64_t t0 = qrl_sched_now_us();
        rp->verify_status = g->verifier->score(rp->text, g->reference, &rp->vr, &e);
        rp->verify_us = qrl_sched_now_us() - t0;
        if (rp->verify_status != QRL_OK) {
            QRL_LOG_WARN("sched", "verify failed group=%llu response=%u task=%s: %s",
                         (unsigned long long)g->group_id, r, g->task, e.msg);
            rp->vr.reward = 0;
            rp->vr.correct = false;
        }
    }
    qrl_scheduler_response *o = &g->out[r];
    o->tokens = rp->ids + g->n_prompt;
    o->logprobs = rp->lp;
    o->logprobs_full = rp->lp_full;
    o->versions = rp->ver;
    o->n_tokens = rp->n_gen;
    o->finish = rp->finish;
    o->text = rp->text ? rp->text : "";
    o->reward = rp->vr.reward;
    o->correct = rp->vr.correct;
    o->extracted = rp->vr.extracted;
    o->verify_status = rp->verify_status;
    o->sampling_truncated =
        (g->sampling.top_k > 0 && g->sampling.top_k < s->vocab) || g->sampling.top_p < 1.0f;
    o->truncated_tokens = rp->truncated_tokens;
    o->reprefills = rp->reprefills;
    o->restarts = rp->restarts;
    o->queue_us = rp->admitted_us ? rp->admitted_us - g->submit_us : 0;
    o->prefill_us = rp->prefill_us;
    o->decode_us = rp->decode_us;
    o->verify_us = rp->verify_us;
    o->started_unix_ms = rp->started_unix_ms;
    o->finished_unix_ms = rp->finished_unix_ms;
    /* an ABORTED response may hold the record of the token it failed to sample */
    if (rp->trace && qrl_trace_buf_n_tokens(rp->trace) > (uint32_t)rp->n_gen)
        qrl_trace_buf_truncate(rp->trace, (uint32_t)rp->n_gen);
    o->trace = rp->trace;
}

int qrl_sched_emit_finished(qrl_scheduler *s) {
    int n = 0;
    qrl_sched_group *prev = NULL, *g = s->head;
    while (g) {
        qrl_sched_group *next = g->next;
        if (g->n_done < g->G) {
            prev = g;
            g = next;
            continue;
        }
        /* Unlink first: the callback may submit (append) new groups. */
        if (prev) prev->next = next;
        else s->head = next;
        if (s->tail == g) s->tail = prev;
        g->next = NULL;
        for (uint32_t r = 0; r < g->G; r++) finalize(s, g, r);
        qrl_scheduler_group_result res = {
            .group_id = g->group_id, .group_size = g->G, .prompt = g->resp[0].ids,
            .n_prompt = g->n_prompt, .task = g->task, .user = g->user, .responses = g->out,
            .total_us = qrl_sched_now_us() - g->submit_us};
        s->stats.groups_emitted++;
        if (s->on_group) s->on_group(&res, s->ctx);
        qrl_sched_group_free(g);
        n++;
        /* A group the callback appended after `prev` is found through prev->next. */
        g = prev ? prev->next : s->head;
    }
    return n;
}
