/* qrl-rollout control thread: registration with the learner, heartbeats, and the
 * WatchVersions stream that announces sync boundaries (SPEC §4.4, §8).  The rpc client
 * blocks, so this lives on its own thread, never the loop (STYLE 14).  A NEW_VERSION
 * event goes to the weights thread (a copy; the newest not yet started wins), which reads
 * the weights (TCP: weights.c, NCCL: rd_nccl.c), quantizes them and hands the new model
 * to the engine, which swaps at its next step boundary: a transfer of any length never
 * delays a heartbeat, so the learner never takes the replica for lost.  SHUTDOWN asks the
 * loop to drain. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "rollout.h"
#include "rpc/rpc.h"

#define CALL_TIMEOUT_MS 5000

static uint64_t unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t have_version(rd_control *c) {
    rd_engine_stats es;
    rd_engine_get_stats(c->engine, &es);
    return es.sched.version;
}

typedef struct session {
    uint32_t hb_interval_ms;
} session;

static qrl_status do_register(rd_control *c, qrl_rpc_client_t *cl, session *s, qrl_error *err) {
    Qrl__RegisterRequest req = QRL__REGISTER_REQUEST__INIT;
    req.replica = &c->info;
    req.have_version = have_version(c);
    ProtobufCMessage *resp = NULL;
    QRL_TRY(qrl_rpc_client_call(cl, QRL_RPC_LEARNER_REGISTER, &req.base, CALL_TIMEOUT_MS, &resp, err));
    const Qrl__RegisterResponse *r = (const Qrl__RegisterResponse *)resp;
    s->hb_interval_ms = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 1000;
    QRL_LOG_INFO("control", "registered with learner=%s as=%s run_id=%" PRIu64 " current_version=%" PRIu64
                 " heartbeat_ms=%u mode=%s", c->learner, r->replica_id, r->run_id,
                 r->current_version, s->hb_interval_ms, r->mode);
    /* A late joiner (weights older than the learner's) decodes nothing until it has them:
     * in alternate mode an update trains only its version's tokens, and in overlap mode
     * tokens more than max_staleness versions old would only be dropped.  The swap that
     * brings the version ends the hold (the weights thread fetches what WatchVersions
     * announces). */
    bool alternate = r->mode && strcmp(r->mode, "alternate") == 0;
    uint64_t need = r->current_version;
    if (!alternate) need = need > r->max_staleness ? need - r->max_staleness : 0;
    if (need > req.have_version) {
        QRL_LOG_INFO("control", "late join: weights version=%" PRIu64 " behind the learner's %" PRIu64
                     " (mode=%s): holding until version=%" PRIu64, req.have_version, r->current_version, r->mode,
                     need);
        rd_engine_hold_until(c->engine, need);
    }
    qrl_wire_free(resp);
    return QRL_OK;
}

/* Heartbeat; *known false when the learner forgot us. */
static qrl_status do_heartbeat(rd_control *c, qrl_rpc_client_t *cl, bool *known, qrl_error *err) {
    rd_engine_stats es;
    rd_engine_get_stats(c->engine, &es);
    Qrl__RolloutStatus st = QRL__ROLLOUT_STATUS__INIT;
    st.replica_id = c->info.id;
    st.state = (Qrl__ServiceState)c->state; /* the loop's: paused, draining */
    st.max_concurrency = c->max_concurrency;
    st.version = es.sched.version;
    st.slots_total = c->info.slots;
    st.slots_in_use = (uint32_t)es.sched.running;
    st.active_groups = (uint32_t)es.groups_in_engine;
    st.tokens_per_s = es.tokens_per_s;
    st.staleness_restarts = es.sched.restarts;
    st.groups_produced = es.sched.groups_emitted;
    st.tokens_generated = es.sched.tokens_generated;
    st.precision = c->info.precision;
    st.kv_format = c->info.kv_format;
    Qrl__HeartbeatRequest req = QRL__HEARTBEAT_REQUEST__INIT;
    req.replica_id = c->info.id;
    req.status = &st;
    req.sent_unix_ms = unix_ms();
    ProtobufCMessage *resp = NULL;
    QRL_TRY(qrl_rpc_client_call(cl, QRL_RPC_LEARNER_HEARTBEAT, &req.base, CALL_TIMEOUT_MS, &resp, err));
    *known = ((const Qrl__HeartbeatResponse *)resp)->known;
    qrl_wire_free(resp);
    return QRL_OK;
}

/* ---- weights thread ------------------------------------------------------------------ */

/* The whole fetch of the version `ev` announces (weights thread): pick the transport,
 * receive, quantize to the replica's format, hand the model to the engine.  Only a version
 * handed to the engine counts as fetched (c->fetched); on any failure it does not, so a
 * repeated announcement of it (the learner's TCP re-announcement after a failed NCCL
 * broadcast, a reopened WatchVersions) tries again.  Every wait is bounded: TCP reads by
 * their socket timeout, NCCL by rollout.nccl_timeout_ms. */
static void mark_fetched(rd_control *c, uint64_t version) {
    pthread_mutex_lock(&c->weights_mu);
    if (version > c->fetched) c->fetched = version;
    pthread_mutex_unlock(&c->weights_mu);
}

static void fetch_apply(rd_control *c, const Qrl__VersionEvent *ev) {
    bool nccl = ev->transport == QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_NCCL; /* rd_nccl.c */
    if (ev->transport == QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_CUDA_IPC) { /* rd_ipc.c */
        qrl_error err;
        if (rd_ipc_fetch_apply(c, ev, &err) == QRL_OK) {
            mark_fetched(c, ev->version);
            return;
        }
        if (c->stop || !*ev->weight_addr) {
            QRL_LOG_ERROR("control", "weights version=%" PRIu64 " not received by cuda ipc: %s", ev->version,
                          err.msg);
            return;
        }
        QRL_LOG_WARN("control", "weights version=%" PRIu64 ": %s; falling back to TCP %s", ev->version,
                     err.msg, ev->weight_addr);
        nccl = false; /* the same version from the learner's TCP stream */
    } else if (nccl && rd_nccl_device_path(c)) { /* into device memory, swapped there */
        qrl_error err;
        if (rd_nccl_fetch_apply_device(c, ev, &err) == QRL_OK) mark_fetched(c, ev->version);
        else QRL_LOG_ERROR("control", "weights version=%" PRIu64 " not received: %s", ev->version, err.msg);
        return; /* not fetched: the learner re-announces a failed NCCL version over TCP */
    } else if (!nccl && (ev->transport != QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP || !*ev->weight_addr)) {
        QRL_LOG_WARN("control", "version=%" PRIu64 ": unknown weight transport %d or no weight_addr",
                     ev->version, (int)ev->transport);
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    qrl_model *m;
    qrl_error err;
    if ((nccl ? rd_nccl_receive(&c->nccl, ev, c->model, &m, &err)
              : rd_weights_receive(ev->weight_addr, c->model, ev->version, &m, &err)) != QRL_OK) {
        QRL_LOG_ERROR("control", "weights version=%" PRIu64 " not received: %s", ev->version, err.msg);
        return; /* not fetched: a repeated announcement may try again */
    }
    if (c->stop) { /* the daemon is stopping: no quantization, no swap */
        qrl_model_free(m);
        return;
    }
    /* the replica's format (SPEC §3): the learner sends full-precision weights */
    if (qrl_model_quantize(m, c->model->precision, &err) != QRL_OK) {
        QRL_LOG_ERROR("control", "weights version=%" PRIu64 " not quantized: %s", ev->version, err.msg);
        qrl_model_free(m);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    QRL_LOG_INFO("control", "weights received version=%" PRIu64 " from=%s ms=%.1f since_announce_ms=%" PRId64,
                 ev->version, nccl ? "nccl" : ev->weight_addr, (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                 (double)(t1.tv_nsec - t0.tv_nsec) / 1e6, (int64_t)(unix_ms() - ev->sent_unix_ms));
    rd_engine_swap(c->engine, m, ev->version);
    mark_fetched(c, ev->version);
}

static void *weights_main(void *arg) {
    rd_control *c = arg;
    pthread_mutex_lock(&c->weights_mu);
    while (!c->stop) {
        Qrl__VersionEvent *ev = c->pending;
        if (!ev) {
            pthread_cond_wait(&c->weights_cv, &c->weights_mu);
            continue;
        }
        c->pending = NULL;
        bool stale = ev->version <= c->fetched; /* a repeat of the version just fetched */
        pthread_mutex_unlock(&c->weights_mu);
        if (!stale && ev->version > have_version(c)) fetch_apply(c, ev);
        qrl_wire_free(&ev->base);
        pthread_mutex_lock(&c->weights_mu);
    }
    pthread_mutex_unlock(&c->weights_mu);
    return NULL;
}

/* Control thread: hand a NEW_VERSION to the weights thread and return at once.  Latest
 * wins: a newer announcement replaces one not started yet; a repeat of the version being
 * fetched waits as its retry (dropped if that fetch succeeds). */
static void hand_off(rd_control *c, const Qrl__VersionEvent *ev) {
    uint64_t have = have_version(c); /* the engine's lock, not under weights_mu */
    pthread_mutex_lock(&c->weights_mu);
    if (ev->version > have && ev->version > c->fetched &&
        (!c->pending || ev->version >= c->pending->version)) {
        ProtobufCMessage *copy = NULL;
        size_t n = protobuf_c_message_get_packed_size(&ev->base);
        uint8_t *buf = malloc(n ? n : 1);
        if (buf) {
            protobuf_c_message_pack(&ev->base, buf);
            copy = protobuf_c_message_unpack(ev->base.descriptor, NULL, n, buf);
            free(buf);
        }
        if (!copy) {
            QRL_LOG_ERROR("control", "weights version=%" PRIu64 ": no memory for the event", ev->version);
        } else {
            if (c->pending && c->pending->version < ev->version)
                QRL_LOG_INFO("control", "weights version=%" PRIu64 " replaces version=%" PRIu64
                             " not fetched yet", ev->version, c->pending->version);
            qrl_wire_free(c->pending ? &c->pending->base : NULL);
            c->pending = (Qrl__VersionEvent *)copy;
            pthread_cond_signal(&c->weights_cv);
        }
    }
    pthread_mutex_unlock(&c->weights_mu);
}

/* ---- control thread ------------------------------------------------------------------ */

static void on_event(rd_control *c, const Qrl__VersionEvent *ev) {
    switch (ev->kind) {
    case QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION:
        hand_off(c, ev);
        return;
    case QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_SHUTDOWN:
        QRL_LOG_INFO("control", "learner announced shutdown: draining");
        uv_async_send(c->drain_async);
        return;
    case QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_PAUSE:
        /* alternate mode: the learner trains on version ev->version's results; decode
         * nothing until its successor is swapped in (the hold ends in swap_now) */
        QRL_LOG_INFO("control", "learner PAUSE (alternate mode): holding until version=%" PRIu64,
                     ev->version + 1);
        rd_engine_hold_until(c->engine, ev->version + 1);
        return;
    default:
        return;
    }
}

static void *control_main(void *arg) {
    rd_control *c = arg;
    qrl_rpc_client_t *cl = c->client;
    qrl_error err;
    session s = {0};
    bool registered = false;
    qrl_rpc_client_stream_t *watch = NULL;
    struct timespec last_hb = {0};
    while (!c->stop) {
        if (!registered) {
            if (do_register(c, cl, &s, &err) != QRL_OK) {
                QRL_LOG_WARN("control", "register: %s (retrying)", err.msg);
                nap_ms(1000);
                continue;
            }
            registered = true;
        }
        if (!watch) {
            Qrl__WatchVersionsRequest w = QRL__WATCH_VERSIONS_REQUEST__INIT;
            w.replica_id = c->info.id;
            w.have_version = have_version(c);
            if (qrl_rpc_client_stream_open(cl, QRL_RPC_LEARNER_WATCH_VERSIONS, &w.base, 0, &watch,
                                           &err) != QRL_OK) {
                QRL_LOG_WARN("control", "WatchVersions: %s (retrying)", err.msg);
                watch = NULL;
                nap_ms(1000);
                continue;
            }
        }
        ProtobufCMessage *msg = NULL;
        qrl_status st = qrl_rpc_client_stream_next(watch, 200, &msg, &err);
        if (st == QRL_OK && msg) {
            on_event(c, (const Qrl__VersionEvent *)msg);
            qrl_wire_free(msg);
        } else if (st != QRL_STATUS_TIMEOUT || qrl_rpc_client_stream_ended(watch)) {
            if (!c->stop) QRL_LOG_WARN("control", "WatchVersions ended: %s", st == QRL_OK ? "OK" : err.msg);
            qrl_rpc_client_stream_close(watch);
            watch = NULL;
            nap_ms(500);
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double since = (double)(now.tv_sec - last_hb.tv_sec) * 1e3 + (double)(now.tv_nsec - last_hb.tv_nsec) / 1e6;
        if (since >= s.hb_interval_ms) {
            last_hb = now;
            bool known = true;
            if (do_heartbeat(c, cl, &known, &err) != QRL_OK) {
                QRL_LOG_WARN("control", "heartbeat: %s", err.msg);
            } else if (!known) {
                QRL_LOG_WARN("control", "the learner forgot this replica: registering again");
                registered = false;
            }
        }
    }
    qrl_rpc_client_stream_close(watch);
    return NULL;
}

qrl_status rd_control_start(rd_control *c, qrl_error *err) {
    /* made here, not on the thread: a bad learner.tls_* file stops the daemon at start */
    qrl_rpc_client_opts o = {.target = c->learner, .token = c->have_token ? c->token : NULL,
                             .tls_ca_file = c->tls_ca, .tls_cert_file = c->tls_cert,
                             .tls_key_file = c->tls_key};
    QRL_TRY(qrl_rpc_client_new(&o, &c->client, err));
    pthread_mutex_init(&c->weights_mu, NULL);
    pthread_cond_init(&c->weights_cv, NULL);
    c->pending = NULL;
    c->fetched = 0;
    c->stop = 0;
    bool weights = pthread_create(&c->weights_thread, NULL, weights_main, c) == 0;
    if (!weights || pthread_create(&c->thread, NULL, control_main, c) != 0) {
        if (weights) {
            pthread_mutex_lock(&c->weights_mu);
            c->stop = 1;
            pthread_cond_signal(&c->weights_cv);
            pthread_mutex_unlock(&c->weights_mu);
            pthread_join(c->weights_thread, NULL);
        }
        pthread_cond_destroy(&c->weights_cv);
        pthread_mutex_destroy(&c->weights_mu);
        qrl_rpc_client_destroy(c->client);
        c->client = NULL;
        return qrl_error_set(err, QRL_STATUS_INTERNAL, "control: cannot create the threads");
    }
    c->started = true;
    return QRL_OK;
}

void rd_control_stop(rd_control *c) {
    if (!c->started) return;
    pthread_mutex_lock(&c->weights_mu); /* under the mutex: the weights thread cannot miss it */
    c->stop = 1;
    pthread_cond_signal(&c->weights_cv);
    pthread_mutex_unlock(&c->weights_mu);
    pthread_join(c->thread, NULL); /* at most one gRPC call's timeout */
    /* a fetch in progress ends first: a TCP read waits at most its socket timeout (a live
     * learner streams to the end), NCCL at most rollout.nccl_timeout_ms; the quantization
     * and swap are skipped once stopping */
    pthread_join(c->weights_thread, NULL);
    qrl_wire_free(c->pending ? &c->pending->base : NULL);
    c->pending = NULL;
    pthread_cond_destroy(&c->weights_cv);
    pthread_mutex_destroy(&c->weights_mu);
    rd_nccl_close(&c->nccl);
    rd_ipc_close(c);
    c->started = false;
    qrl_rpc_client_destroy(c->client);
    c->client = NULL;
}
