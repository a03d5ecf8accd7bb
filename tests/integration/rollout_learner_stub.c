/* A stand-in learner for tests/integration/rollout_daemon.sh: the Learner service's
 * Register / Heartbeat / WatchVersions on a libuv loop, and a TCP weight stream server
 * (framing in services/rollout/weights.c) serving one version of a model as BF16.
 *
 *   rollout_learner_stub --port-file F --token-file F --model PATH --stats-file F
 *                        [--version V] [--push-after-ms N] [--corrupt-first] [--lifetime S]
 *                        [--announce-ipc]
 *
 * Writes "127.0.0.1:PORT" to the port file once serving.  Each WatchVersions stream gets
 * a NEW_VERSION event for V (default 1) over TCP N ms (default 500) after it opens; with
 * --corrupt-first the first weight stream has a flipped byte in bucket 0 (the replica must
 * refuse it) and the event is repeated 1 s later.  With --announce-ipc every event says
 * CUDA_IPC with a handle no process can map (the TCP address still set): a replica must
 * fall back to the TCP stream.  After every call the stats file holds
 * {"registers":N,"heartbeats":N,"last_status_version":V,"weight_sends":N,"replica":"..."}.
 * Stops on SIGTERM/SIGINT or after --lifetime seconds (default 120). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "core/tensor.h"
#include "model/model.h"
#include "rpc/rpc.h"
#include "wire/wire.h"

#define BUCKET_BYTES (64u << 10)

static uv_loop_t loop;
static uv_timer_t lifetime, push_timer;
static uv_signal_t sigterm, sigint;
static qrl_rpc_server_t *server;
static qrl_rpc_call_t *watch; /* the one stream we serve */
static const char *stats_path;
static int registers, heartbeats, pushes;
static _Atomic int weight_sends;
static uint64_t last_status_version, version = 1;
static bool corrupt_first, announce_ipc;
static char replica[128] = "", weight_addr[64];
static int push_after_ms = 500;
/* the stream */
static uint8_t *manifest_buf, *stream;
static size_t manifest_len, total;

static void write_stats(void) {
    FILE *f = fopen(stats_path, "w");
    if (!f) return;
    fprintf(f, "{\"registers\":%d,\"heartbeats\":%d,\"last_status_version\":%llu,"
               "\"weight_sends\":%d,\"pushes\":%d,\"replica\":\"%s\"}\n", registers, heartbeats,
            (unsigned long long)last_status_version, (int)weight_sends, pushes, replica);
    fclose(f);
}

/* Returns false when the replica hung up (it closes the stream as soon as it sees a bad
 * checksum); the caller then drops this connection and waits for the retry. */
static bool put_frame(int fd, const uint8_t *buf, size_t len) {
    uint8_t l[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    if (write(fd, l, 4) != 4 || write(fd, buf, len) != (ssize_t)len) {
        perror("stub: write");
        return false;
    }
    return true;
}

static void *weight_server(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        int n = ++weight_sends;
        if (!put_frame(fd, manifest_buf, manifest_len)) {
            close(fd);
            continue;
        }
        uint32_t count = (uint32_t)((total + BUCKET_BYTES - 1) / BUCKET_BYTES);
        for (uint32_t i = 0; i < count; i++) {
            size_t off = (size_t)i * BUCKET_BYTES, size = total - off < BUCKET_BYTES ? total - off : BUCKET_BYTES;
            Qrl__WeightBucketHeader h = QRL__WEIGHT_BUCKET_HEADER__INIT;
            h.version = version;
            h.bucket_index = i;
            h.bucket_count = count;
            h.byte_offset = off;
            h.byte_size = size;
            h.checksum = qrl_wire_crc32c(0, stream + off, size);
            uint8_t hb[256];
            size_t hl;
            qrl_error err;
            if (qrl_wire_encode(&h.base, hb, sizeof hb, &hl, &err) != QRL_OK) abort();
            if (!put_frame(fd, hb, hl)) break;
            if (corrupt_first && n == 1 && i == 0) stream[off] ^= 0x40;
            bool ok = write(fd, stream + off, size) == (ssize_t)size;
            if (corrupt_first && n == 1 && i == 0) stream[off] ^= 0x40;
            if (!ok) {
                perror("stub: write bucket");
                break;
            }
        }
        close(fd);
    }
    return NULL;
}

/* BF16 stream and manifest of every tensor of the model, in table order. */
static void build_stream(const qrl_model *m) {
    Qrl__TensorMeta *metas = calloc((size_t)m->n_tensors, sizeof *metas);
    Qrl__TensorMeta **ptrs = calloc((size_t)m->n_tensors, sizeof *ptrs);
    uint64_t *shapes = calloc((size_t)m->n_tensors * 2, sizeof *shapes);
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        total += (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1) * 2;
    }
    stream = malloc(total);
    size_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t numel = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        for (size_t k = 0; k < numel; k++) {
            uint16_t b = qrl_f32_to_bf16(t->data[k]);
            stream[off + 2 * k] = (uint8_t)b;
            stream[off + 2 * k + 1] = (uint8_t)(b >> 8);
        }
        qrl__tensor_meta__init(&metas[i]);
        metas[i].name = (char *)t->name;
        metas[i].dtype = "BF16";
        shapes[2 * i] = (uint64_t)t->shape[0];
        shapes[2 * i + 1] = (uint64_t)(t->ndim == 2 ? t->shape[1] : 0);
        metas[i].shape = &shapes[2 * i];
        metas[i].n_shape = (size_t)t->ndim;
        metas[i].byte_offset = off;
        metas[i].byte_size = numel * 2;
        metas[i].checksum = qrl_wire_crc32c(0, stream + off, numel * 2);
        ptrs[i] = &metas[i];
        off += numel * 2;
    }
    Qrl__WeightManifest mf = QRL__WEIGHT_MANIFEST__INIT;
    mf.version = version;
    mf.step = version;
    mf.tensors = ptrs;
    mf.n_tensors = (size_t)m->n_tensors;
    mf.bucket_bytes = BUCKET_BYTES;
    mf.total_bytes = total;
    mf.bucket_count = (uint32_t)((total + BUCKET_BYTES - 1) / BUCKET_BYTES);
    mf.checksum_algorithm = QRL__CHECKSUM_ALGORITHM__CHECKSUM_ALGORITHM_CRC32C;
    mf.checksum = qrl_wire_crc32c(0, stream, total);
    mf.uaq_scale = 1.0f;
    qrl_error err;
    if (qrl_wire_weight_manifest_validate(&mf, &err) != QRL_OK ||
        qrl_wire_encode_alloc(&mf.base, &manifest_buf, &manifest_len, &err) != QRL_OK) {
        fprintf(stderr, "stub: manifest: %s\n", err.msg);
        exit(1);
    }
    free(metas);
    free(ptrs);
    free(shapes);
}

static void push_version(uv_timer_t *t) {
    if (!watch) return;
    Qrl__VersionEvent ev = QRL__VERSION_EVENT__INIT;
    ev.kind = QRL__VERSION_EVENT_KIND__VERSION_EVENT_KIND_NEW_VERSION;
    ev.version = version;
    ev.step = version;
    ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_TCP;
    ev.weight_addr = weight_addr;
    static uint8_t bogus[64];
    if (announce_ipc) {
        memset(bogus, 0xab, sizeof bogus);
        ev.transport = QRL__WEIGHT_TRANSPORT__WEIGHT_TRANSPORT_CUDA_IPC;
        ev.ipc_handle.data = bogus;
        ev.ipc_handle.len = sizeof bogus;
    }
    qrl_error err;
    if (qrl_rpc_call_push(watch, &ev.base, &err) != QRL_OK) {
        fprintf(stderr, "stub: push: %s\n", err.msg);
        return;
    }
    pushes++;
    write_stats();
    if (corrupt_first && pushes == 1) uv_timer_start(&push_timer, push_version, 1000, 0);
}

static void on_watch_close(qrl_rpc_call_t *call, void *user) {
    if (call == watch) watch = NULL;
    qrl_rpc_call_finish(call, QRL_STATUS_CANCELLED, "client went away");
}

static void h_register(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__RegisterRequest *r = (const Qrl__RegisterRequest *)req;
    registers++;
    if (r->replica && r->replica->id) snprintf(replica, sizeof replica, "%s", r->replica->id);
    Qrl__RegisterResponse resp = QRL__REGISTER_RESPONSE__INIT;
    resp.replica_id = replica;
    resp.run_id = 7;
    resp.heartbeat_interval_ms = 300;
    resp.heartbeat_timeout_ms = 3000;
    resp.mode = "overlap";
    qrl_rpc_call_reply(call, &resp.base);
    write_stats();
}

static void h_heartbeat(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    const Qrl__HeartbeatRequest *r = (const Qrl__HeartbeatRequest *)req;
    heartbeats++;
    if (r->status) last_status_version = r->status->version;
    Qrl__HeartbeatResponse resp = QRL__HEARTBEAT_RESPONSE__INIT;
    resp.known = true;
    resp.current_version = version;
    qrl_rpc_call_reply(call, &resp.base);
    write_stats();
}

static void h_watch(qrl_rpc_call_t *call, const ProtobufCMessage *req, void *user) {
    if (watch) qrl_rpc_call_finish(watch, QRL_STATUS_CANCELLED, "replaced by a newer stream");
    watch = call;
    qrl_rpc_call_on_close(call, on_watch_close, NULL);
    uv_timer_start(&push_timer, push_version, (uint64_t)push_after_ms, 0);
}

static void on_closed(qrl_rpc_server_t *s, void *user) {
    uv_close((uv_handle_t *)&lifetime, NULL);
    uv_close((uv_handle_t *)&push_timer, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
}
static void stop(void) {
    if (!server) return;
    watch = NULL; /* the server cancels it */
    qrl_rpc_server_close(server, on_closed, NULL);
    server = NULL;
}
static void on_lifetime(uv_timer_t *t) { stop(); }
static void on_signal(uv_signal_t *h, int sig) { stop(); }

int main(int argc, char **argv) {
    /* a replica that hangs up mid-stream must cost a write error, not the process */
    signal(SIGPIPE, SIG_IGN);
    const char *port_file = NULL, *token_file = NULL, *model_path = NULL;
    double life_s = 120;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--corrupt-first") == 0) { corrupt_first = true; continue; }
        if (strcmp(argv[i], "--announce-ipc") == 0) { announce_ipc = true; continue; }
        if (strcmp(argv[i], "--port-file") == 0) port_file = v;
        else if (strcmp(argv[i], "--token-file") == 0) token_file = v;
        else if (strcmp(argv[i], "--model") == 0) model_path = v;
        else if (strcmp(argv[i], "--stats-file") == 0) stats_path = v;
        else if (strcmp(argv[i], "--version") == 0) version = strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--push-after-ms") == 0) push_after_ms = atoi(v);
        else if (strcmp(argv[i], "--lifetime") == 0) life_s = atof(v);
        else { fprintf(stderr, "stub: unknown option %s\n", argv[i]); return 2; }
        i++;
    }
    if (!port_file || !token_file || !model_path || !stats_path) {
        fprintf(stderr, "usage: see the file comment\n");
        return 2;
    }
    qrl_error err;
    qrl_model *m;
    char token[QRL_RPC_TOKEN_MAX + 1];
    if (qrl_model_load(model_path, &m, &err) != QRL_OK || qrl_rpc_token_read(token_file, token, &err) != QRL_OK) {
        fprintf(stderr, "stub: %s\n", err.msg);
        return 1;
    }
    build_stream(m);
    qrl_model_free(m);

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 8) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        perror("stub: weight socket");
        return 1;
    }
    snprintf(weight_addr, sizeof weight_addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    pthread_t th;
    pthread_create(&th, NULL, weight_server, (void *)(intptr_t)lfd);
    pthread_detach(th);

    uv_loop_init(&loop);
    qrl_rpc_server_opts o = {.token = token};
    if (qrl_rpc_server_new(&loop, &o, &server, &err) != QRL_OK) {
        fprintf(stderr, "stub: %s\n", err.msg);
        return 1;
    }
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_REGISTER, h_register, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_HEARTBEAT, h_heartbeat, NULL);
    qrl_rpc_server_handle(server, QRL_RPC_LEARNER_WATCH_VERSIONS, h_watch, NULL);
    if (qrl_rpc_server_start(server, &err) != QRL_OK) {
        fprintf(stderr, "stub: %s\n", err.msg);
        return 1;
    }
    uv_timer_init(&loop, &lifetime);
    uv_timer_init(&loop, &push_timer);
    uv_timer_start(&lifetime, on_lifetime, (uint64_t)(life_s * 1000), 0);
    uv_signal_init(&loop, &sigterm);
    uv_signal_init(&loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    write_stats();
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f) return 1;
    fprintf(f, "127.0.0.1:%d\n", qrl_rpc_server_port(server));
    fclose(f);
    rename(tmp, port_file);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(manifest_buf);
    free(stream);
    return 0;
}
