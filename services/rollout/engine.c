/* qrl-rollout engine thread: owns the scheduler, takes groups from the input queue, runs
 * step() while work exists and it is not paused, and hands finished groups (with their
 * GroupResult built here, since the scheduler's struct is only valid in the callback)
 * back to the loop through a uv_async_t.  See rollout.h. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "rollout/gpu_memory.h"
#include "rollout.h"
#include "rollout/result.h"

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rd_group_free(rd_group *g) {
    if (!g) return;
    qrl_wire_free(g->pg ? &g->pg->base : NULL);
    if (g->result) qrl__group_result__free_unpacked(g->result, NULL);
    qrl_wire_chunks_free(&g->chunks);
    qrl_wire_chunks_free(&g->trace);
    free(g);
}

/* ---- settings ------------------------------------------------------------------------ */

qrl_status rd_engine_config(const rd_settings *s, const qrl_model *model, const qrl_tokenizer *tok,
                            qrl_scheduler_config *sc, char *device, size_t device_size, char *device_name,
                            size_t name_size, qrl_error *err) {
    qrl_scheduler_config_default(sc);
    sc->max_slots = s->slots;
    sc->prefill_chunk = s->prefill_chunk;
    sc->max_staleness = s->max_staleness;
    QRL_CHECK(qrl_kv_format_parse(s->kv_cache, &sc->kv_format, err) == QRL_OK);
    sc->kv_sink = s->kv_sink;
    sc->kv_recent = s->kv_recent;
    sc->eos_token_id = model->cfg.n_eos > 0 ? model->cfg.eos_ids[0] : qrl_tokenizer_eos(tok);
    if (s->trace) {
        sc->trace_record = true;
        qrl_status st = qrl_trace_sites_parse(s->trace_sites, &sc->trace_sites, err);
        if (st != QRL_OK) {
            qrl_error inner = *err;
            return qrl_error_set(err, st, "rollout.trace_sites: %s", inner.msg);
        }
    }
    snprintf(device, device_size, "cpu");
    snprintf(device_name, name_size, "cpu");
    if (s->device != RD_DEVICE_CUDA) return QRL_OK;
    sc->device = s->cuda_device;
    sc->eager = s->enforce_eager;
    if (s->gpu_memory_utilization > 0) {
        qrl_status st = qrl_scheduler_config_fit_gpu(sc, model, s->gpu_memory_utilization, err);
        if (st != QRL_OK) {
            qrl_error inner = *err;
            return qrl_error_set(err, st, "rollout.%s", inner.msg);
        }
    }
    snprintf(device, device_size, "cuda:%d", sc->device);
    qrl_rollout_device_name(sc->device, device_name, name_size);
    return QRL_OK;
}

/* ---- thread ------------------------------------------------------------------------- */

static void push_done(rd_engine *e, rd_group *g) {
    g->next = NULL;
    pthread_mutex_lock(&e->mu);
    if (e->out_tail) e->out_tail->next = g;
    else e->out_head = g;
    e->out_tail = g;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(e->done_async);
}

/* Append src's messages to dst (ownership of the buffers moves; src is left empty). */
static void chunks_append(qrl_wire_chunks *dst, qrl_wire_chunks *src) {
    size_t n = dst->count + src->count;
    uint8_t **data = realloc(dst->data, n * sizeof *data);
    QRL_CHECK(data != NULL);
    dst->data = data;
    size_t *len = realloc(dst->len, n * sizeof *len);
    QRL_CHECK(len != NULL);
    dst->len = len;
    memcpy(dst->data + dst->count, src->data, src->count * sizeof *data);
    memcpy(dst->len + dst->count, src->len, src->count * sizeof *len);
    dst->count = n;
    free(src->data);
    free(src->len);
    memset(src, 0, sizeof *src);
}

/* TRACE: every response's records packed (model/trace_rec.h) and encoded as TraceChunks
 * of at most trace_max_bytes (wire.h) into g->trace.  A response that cannot be encoded is
 * logged and left out: the learner trains it unguided (and counts it). */
static void encode_trace(rd_engine *e, const qrl_scheduler_group_result *res, rd_group *g) {
    const qrl_trace_layout *l = qrl_scheduler_trace_layout(e->sched);
    if (!l) return;
    uint32_t n_sites = qrl_trace_layout_n_sites(l);
    size_t budget = qrl_wire_trace_record_budget(e->trace_max_bytes, n_sites, e->replica_id);
    for (uint32_t r = 0; r < res->group_size; r++) {
        const qrl_scheduler_response *o = &res->responses[r];
        if (!o->trace || o->n_tokens <= 0) continue;
        qrl_trace_pack p = {0};
        qrl_wire_chunks w = {0};
        qrl_error err;
        qrl_status st = qrl_trace_buf_pack(o->trace, (uint32_t)o->n_tokens, budget, &p, &err);
        if (st == QRL_OK && p.count) {
            qrl_wire_trace_pieces pc = {p.count, p.record, p.len, p.token_begin, p.token_count, p.n_tokens, p.crc32};
            qrl_wire_trace_ident id = {g->group_id, g->pg->run_id, e->replica_id, r};
            st = qrl_wire_trace_chunks_encode(&id, qrl_trace_layout_site_ids(l), n_sites, &pc, e->trace_max_bytes,
                                              &w, &err);
            for (size_t i = 0; st == QRL_OK && i < p.count; i++) g->trace_record_bytes += p.len[i];
            if (st == QRL_OK) g->trace_tokens += p.n_tokens;
        }
        if (st != QRL_OK)
            QRL_LOG_WARN("engine", "group=%llu response=%u: TRACE records not sent (%s: %s)",
                         (unsigned long long)g->group_id, r, qrl_status_name(st), err.msg);
        else
            chunks_append(&g->trace, &w);
        qrl_wire_chunks_free(&w);
        qrl_trace_pack_free(&p);
    }
}

static void on_group(const qrl_scheduler_group_result *res, void *ctx) {
    rd_engine *e = ctx;
    rd_group *g = res->user;
    if (g->eprev) g->eprev->enext = g->enext;
    else e->active = g->enext;
    if (g->enext) g->enext->eprev = g->eprev;
    g->eprev = g->enext = NULL;
    qrl_error err;
    if (qrl_scheduler_result_to_wire(res, g->pg, e->replica_id, e->emit_text, &g->result, &err) != QRL_OK) {
        g->rejected = true;
        snprintf(g->error, sizeof g->error, "group %llu: out of memory building its result",
                 (unsigned long long)g->group_id);
    } else if (e->trace_max_bytes) {
        encode_trace(e, res, g);
    }
    e->running_groups--;
    push_done(e, g);
}

static void submit_one(rd_engine *e, rd_group *g) {
    const Qrl__PromptGroup *pg = g->pg;
    const Qrl__SamplingParams *sp = pg->sampling;
    int32_t *prompt = malloc(pg->n_prompt_token_ids * sizeof *prompt);
    int32_t *stops = malloc((sp->n_stop_token_ids + 1) * sizeof *stops);
    qrl_error err;
    qrl_status st = QRL_STATUS_NOMEM;
    if (prompt && stops) {
        for (size_t i = 0; i < pg->n_prompt_token_ids; i++) prompt[i] = (int32_t)pg->prompt_token_ids[i];
        for (size_t i = 0; i < sp->n_stop_token_ids; i++) stops[i] = (int32_t)sp->stop_token_ids[i];
        qrl_scheduler_group_desc d = {
            .group_id = pg->group_id,
            .group_size = pg->group_size,
            .prompt = prompt,
            .n_prompt = (int)pg->n_prompt_token_ids,
            .sampling = {.temperature = sp->temperature,
                         .top_k = (int)sp->top_k,
                         .top_p = sp->top_p > 0 ? sp->top_p : 1.0f,
                         .seed = sp->seed},
            .max_new_tokens = (int)sp->max_new_tokens,
            .stop_token_ids = stops,
            .n_stop_token_ids = (int)sp->n_stop_token_ids,
            .stop_strings = (const char *const *)sp->stop_strings,
            .n_stop_strings = (int)sp->n_stop_strings,
            .task = pg->task,
            .reference = pg->reference_answer,
            .user = g,
        };
        st = qrl_scheduler_submit(e->sched, &d, &err);
        if (st == QRL_OK) { /* tracked so that a join can free it (a drain that times out) */
            g->eprev = NULL;
            g->enext = e->active;
            if (e->active) e->active->eprev = g;
            e->active = g;
        }
    } else {
        snprintf(err.msg, sizeof err.msg, "out of memory");
    }
    free(prompt);
    free(stops);
    if (st == QRL_OK) {
        e->running_groups++;
        return;
    }
    g->rejected = true;
    snprintf(g->error, sizeof g->error, "%s", err.msg);
    QRL_LOG_WARN("engine", "group=%llu refused by the scheduler: %s",
                 (unsigned long long)g->group_id, err.msg);
    push_done(e, g);
}

/* Sync boundary (between steps): the scheduler re-prefills or restarts unfinished
 * responses (SPEC §4.4-4.5).  The engine owns every model it swapped in. */
static void swap_now(rd_engine *e, qrl_model *m, uint64_t version) {
    qrl_error err;
    qrl_scheduler_stats before;
    qrl_scheduler_get_stats(e->sched, &before);
    double t0 = mono_s();
    qrl_status st = qrl_scheduler_swap_weights(e->sched, m, version, &err);
    double dt = mono_s() - t0;
    if (st == QRL_STATUS_CUDA) {
        /* a failed GPU upload may have replaced some tensors: decoding on mixed weights
         * would record wrong behavior log-probs.  Stop loudly, as a failed step does; the
         * groups held here were not committed and go to another replica. */
        QRL_LOG_ERROR("engine", "weights version=%llu: GPU upload failed: %s", (unsigned long long)version,
                      err.msg);
        abort();
    }
    if (st != QRL_OK) {
        QRL_LOG_ERROR("engine", "weights version=%llu refused: %s", (unsigned long long)version, err.msg);
        qrl_model_free(m);
        return;
    }
    qrl_model_free(e->owned_model);
    e->owned_model = m;
    e->model = m;
    pthread_mutex_lock(&e->mu);
    e->version = version;
    if (e->hold_until && e->hold_until <= version) {
        QRL_LOG_INFO("engine", "hold released at version=%llu", (unsigned long long)version);
        e->hold_until = 0;
    }
    pthread_mutex_unlock(&e->mu);
    qrl_scheduler_stats after;
    qrl_scheduler_get_stats(e->sched, &after);
    pthread_mutex_lock(&e->mu);
    e->stats.sched = after;
    double idle = e->stats.idle_s;
    pthread_mutex_unlock(&e->mu);
    QRL_LOG_INFO("engine", "weights swapped version=%llu running=%d restarts=%llu swap_ms=%.2f idle_s=%.3f",
                 (unsigned long long)version, after.running, (unsigned long long)(after.restarts - before.restarts),
                 dt * 1e3, idle);
}

/* A device-stream swap (rd_engine_swap_stream) on the engine thread. */
static void swap_stream_now(rd_engine *e) {
    pthread_mutex_lock(&e->mu);
    const struct qrl_cuda_stream_tensor *t = e->swap_t;
    size_t n = e->swap_n;
    uint64_t version = e->swap_t_version;
    pthread_mutex_unlock(&e->mu);
    qrl_error err;
    qrl_scheduler_stats before, after;
    qrl_scheduler_get_stats(e->sched, &before);
    double t0 = mono_s();
    qrl_status st = qrl_scheduler_swap_weights_stream(e->sched, t, n, version, &err);
    double dt = mono_s() - t0;
    if (st == QRL_STATUS_CUDA) { /* as swap_now: never decode on half-copied weights */
        QRL_LOG_ERROR("engine", "weights version=%llu: device swap failed: %s", (unsigned long long)version, err.msg);
        abort();
    }
    qrl_scheduler_get_stats(e->sched, &after);
    pthread_mutex_lock(&e->mu);
    e->swap_t = NULL;
    e->swap_t_s = dt;
    e->swap_t_state = st == QRL_OK ? 2 : 3;
    if (st != QRL_OK) snprintf(e->swap_t_error, sizeof e->swap_t_error, "%s", err.msg);
    if (st == QRL_OK) {
        e->version = version;
        if (e->hold_until && e->hold_until <= version) {
            QRL_LOG_INFO("engine", "hold released at version=%llu", (unsigned long long)version);
            e->hold_until = 0;
        }
        e->stats.sched = after;
    }
    double idle = e->stats.idle_s;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (st == QRL_OK)
        QRL_LOG_INFO("engine", "weights swapped version=%llu running=%d restarts=%llu swap_ms=%.2f (device) idle_s=%.3f",
                     (unsigned long long)version, after.running,
                     (unsigned long long)(after.restarts - before.restarts), dt * 1e3, idle);
    else
        QRL_LOG_ERROR("engine", "weights version=%llu refused: %s", (unsigned long long)version, err.msg);
}

bool rd_engine_takes_stream(const rd_engine *e) { return e->sched && qrl_scheduler_takes_stream(e->sched); }

qrl_status rd_engine_swap_stream(rd_engine *e, const struct qrl_cuda_stream_tensor *t, size_t n,
                                 uint64_t version, double *swap_s, qrl_error *err) {
    pthread_mutex_lock(&e->mu);
    e->swap_t = t;
    e->swap_n = n;
    e->swap_t_version = version;
    e->swap_t_state = 1;
    pthread_cond_broadcast(&e->cv);
    while (e->swap_t_state == 1 && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
    int state = e->swap_t_state;
    e->swap_t_state = 0;
    e->swap_t = NULL;
    *swap_s = e->swap_t_s;
    qrl_status st = state == 2 ? QRL_OK
                  : state == 3 ? qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "%s", e->swap_t_error)
                               : qrl_error_set(err, QRL_STATUS_CANCELLED, "engine stopping");
    pthread_mutex_unlock(&e->mu);
    return st;
}

static void *engine_main(void *arg) {
    rd_engine *e = arg;
    /* OpenMP settings are per thread: this one runs the forward passes, so it takes the
     * count the scheduler's workspace was sized for (main's omp_set_num_threads). */
    omp_set_num_threads(e->omp_threads);
    double win_t = mono_s();
    uint64_t win_tokens = 0;
    double tps = 0, start_s = win_t;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        double w0 = mono_s(); /* idle: nothing to decode (no work, paused, held for weights) */
        bool waited = false;
        while (!e->stop && !e->in_head && !e->swap_model && e->swap_t_state != 1 &&
               (e->paused || e->hold_until > e->version || qrl_scheduler_idle(e->sched)))
            pthread_cond_wait(&e->cv, &e->mu), waited = true;
        if (waited) e->stats.idle_s += mono_s() - w0;
        bool stop = e->stop, paused = e->paused, swap_t = e->swap_t_state == 1;
        qrl_model *swap = e->swap_model;
        uint64_t swap_version = e->swap_version;
        e->swap_model = NULL;
        int delay = e->step_delay_ms;
        rd_group *in = e->in_head;
        e->in_head = e->in_tail = NULL;
        pthread_mutex_unlock(&e->mu);
        while (in) {
            rd_group *next = in->next;
            in->next = NULL;
            submit_one(e, in);
            in = next;
        }
        if (swap) swap_now(e, swap, swap_version);
        if (swap_t && !stop) swap_stream_now(e);
        if (stop) break;
        pthread_mutex_lock(&e->mu);
        bool held = e->hold_until > e->version; /* after a swap that may have ended it */
        pthread_mutex_unlock(&e->mu);
        if (paused || held || qrl_scheduler_idle(e->sched)) continue;
        qrl_error err;
        if (qrl_scheduler_step(e->sched, NULL, &err) != QRL_OK) {
            /* The scheduler says a caller-visible failure is a bug; stop serving loudly. */
            QRL_LOG_ERROR("engine", "step failed: %s", err.msg);
            abort();
        }
        if (delay > 0) {
            struct timespec ts = {delay / 1000, (long)(delay % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        qrl_scheduler_stats st;
        qrl_scheduler_get_stats(e->sched, &st);
        double now = mono_s();
        if (now - win_t >= 2.0) {
            tps = (double)(st.tokens_generated - win_tokens) / (now - win_t);
            win_tokens = st.tokens_generated;
            win_t = now;
        }
        pthread_mutex_lock(&e->mu);
        e->stats.sched = st;
        e->stats.tokens_per_s = tps;
        e->stats.groups_in_engine = e->running_groups;
        e->last_step_s = now;
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&e->mu);
    QRL_LOG_INFO("engine", "engine stopped run_s=%.3f idle_s=%.3f steps=%llu tokens=%llu", mono_s() - start_s,
                 e->stats.idle_s, (unsigned long long)e->stats.sched.steps,
                 (unsigned long long)e->stats.sched.tokens_generated);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

qrl_status rd_engine_start(rd_engine *e, const qrl_model *model, const qrl_tokenizer *tok,
                           const qrl_scheduler_config *sc, const char *replica_id,
                           bool emit_text, uv_async_t *done_async, qrl_error *err) {
    e->model = model;
    e->tok = tok;
    e->replica_id = replica_id;
    e->emit_text = emit_text;
    e->done_async = done_async;
    e->omp_threads = omp_get_max_threads();
    e->version = sc->version;
    qrl_status st = qrl_scheduler_new(model, tok, sc, on_group, e, &e->sched, err);
    if (st != QRL_OK && sc->device >= 0) { /* name the keys that chose the device */
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return qrl_error_set(err, st, "rollout.device cuda (rollout.cuda_device %d): %s",
                             sc->device, msg);
    }
    if (st != QRL_OK) return st;
    qrl_scheduler_get_stats(e->sched, &e->stats.sched);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        qrl_scheduler_free(e->sched);
        e->sched = NULL;
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "engine: cannot create the thread");
    }
    return QRL_OK;
}

void rd_engine_submit(rd_engine *e, rd_group *g) {
    g->next = NULL;
    pthread_mutex_lock(&e->mu);
    if (e->in_tail) e->in_tail->next = g;
    else e->in_head = g;
    e->in_tail = g;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void rd_engine_hold_until(rd_engine *e, uint64_t version) {
    pthread_mutex_lock(&e->mu);
    e->hold_until = version;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void rd_engine_set_paused(rd_engine *e, bool paused) {
    pthread_mutex_lock(&e->mu);
    e->paused = paused;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void rd_engine_swap(rd_engine *e, qrl_model *m, uint64_t version) {
    pthread_mutex_lock(&e->mu);
    qrl_model *old = e->swap_model; /* a newer version replaces one not yet applied */
    e->swap_model = m;
    e->swap_version = version;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    qrl_model_free(old);
}

void rd_engine_set_step_delay(rd_engine *e, int ms) {
    pthread_mutex_lock(&e->mu);
    e->step_delay_ms = ms;
    pthread_mutex_unlock(&e->mu);
}

rd_group *rd_engine_take_done(rd_engine *e) {
    pthread_mutex_lock(&e->mu);
    rd_group *g = e->out_head;
    e->out_head = e->out_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    return g;
}

void rd_engine_get_stats(rd_engine *e, rd_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    /* The rate is computed at steps only: a paused or idle engine would otherwise report
     * its last busy window forever.  No step for a window (plus the throttle): 0. */
    if (mono_s() - e->last_step_s > 2.0 + 2e-3 * e->step_delay_ms) out->tokens_per_s = 0;
    pthread_mutex_unlock(&e->mu);
}

void rd_engine_join(rd_engine *e) {
    if (!e->sched) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    /* Groups the loop never took back (a drain that timed out abandons them; their
     * prompts stay uncommitted): queued, inside the scheduler, or finished. */
    for (rd_group *lists[3] = {e->in_head, e->active, e->out_head}, **l = lists; l < lists + 3; l++)
        for (rd_group *g = *l, *next; g; g = next) {
            next = l == lists + 1 ? g->enext : g->next;
            rd_group_free(g);
        }
    e->in_head = e->in_tail = e->out_head = e->out_tail = e->active = NULL;
    qrl_scheduler_free(e->sched);
    e->sched = NULL;
    qrl_model_free(e->owned_model);
    qrl_model_free(e->swap_model);
    e->owned_model = e->swap_model = NULL;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
}
