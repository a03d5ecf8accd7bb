/* qrl-rollout NCCL weight transport (docs/weight-sync.md): joins the sync group's
 * communicator of the epoch a VersionEvent names (a new epoch replaces the old one) and
 * receives the version from rank 0 (common/weights/nccl_bcast.h).  Runs on the control
 * thread, like the TCP receiver; every wait is bounded by rollout.nccl_timeout_ms. */
#include <inttypes.h>
#include <stdio.h>

#include "core/log.h"
#include "rollout.h"
#include "weights/nccl_bcast.h"
#include "wire/wire.h"
#ifdef QRL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <time.h>

bool rd_nccl_capable(void) { return qrl_nccl_available(); }

static qrl_status join_epoch(rd_nccl *n, const Qrl__VersionEvent *ev, qrl_error *err) {
    if (n->epoch == ev->sync_epoch && n->comm && qrl_nccl_comm_ok(n->comm)) return QRL_OK;
    if (n->epoch == ev->sync_epoch && n->epoch) /* failed here: its unique id is spent */
        return qrl_error_set(err, QRL_STATUS_NETWORK, "nccl epoch %" PRIu64 " failed on this replica; waiting "
                             "for the learner's next epoch (this version comes over TCP)", ev->sync_epoch);
    if (ev->nccl_unique_id.len != QRL_NCCL_ID_BYTES || ev->world_size < 2 || ev->rank == 0 ||
        ev->rank >= ev->world_size)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "VersionEvent of epoch %" PRIu64 ": unique id of "
                             "%zu bytes (want %d), rank %u of %u", ev->sync_epoch, ev->nccl_unique_id.len,
                             QRL_NCCL_ID_BYTES, ev->rank, ev->world_size);
    if (n->comm) {
        QRL_LOG_INFO("weights", "leaving nccl epoch=%" PRIu64 " for epoch=%" PRIu64, n->epoch, ev->sync_epoch);
        qrl_nccl_comm_destroy(n->comm);
        n->comm = NULL;
    }
    n->epoch = ev->sync_epoch; /* a failed join spends the epoch too */
    return qrl_nccl_comm_init(ev->nccl_unique_id.data, ev->sync_epoch, (int)ev->rank, (int)ev->world_size,
                              n->device, n->timeout_ms, &n->comm, err);
}

qrl_status rd_nccl_receive(rd_nccl *n, const Qrl__VersionEvent *ev, const qrl_model *like, qrl_model **out,
                           qrl_error *err) {
    *out = NULL;
    QRL_TRY(join_epoch(n, ev, err));
    qrl_nccl_version v;
    uint64_t max_total = (uint64_t)like->arena_floats * 4 + 4096;
    QRL_TRY(qrl_nccl_bcast_recv(n->comm, ev->version, max_total, n->timeout_ms, &v, err));
    char from[64];
    snprintf(from, sizeof from, "nccl epoch %" PRIu64, n->epoch);
    qrl_status st = rd_weights_from_stream(v.manifest, v.stream, like, ev->version, from, out, err);
    QRL_LOG_INFO("weights", "nccl version=%" PRIu64 " epoch=%" PRIu64 " bytes=%" PRIu64 " wait_ms=%.1f "
                 "xfer_ms=%.1f verify_ms=%.1f", v.version, n->epoch, v.total, v.wait_s * 1e3, v.xfer_s * 1e3,
                 v.verify_s * 1e3);
    qrl_nccl_version_recycle(n->comm, &v);
    return st;
}

bool rd_nccl_device_path(const rd_control *c) {
    return c->ipc.device >= 0 && c->ipc.device == c->nccl.device && rd_engine_takes_stream(c->engine);
}

qrl_status rd_nccl_fetch_apply_device(rd_control *c, const Qrl__VersionEvent *ev, qrl_error *err) {
    rd_nccl *n = &c->nccl;
    QRL_TRY(join_epoch(n, ev, err));
    uint64_t cap = (uint64_t)c->model->arena_floats * 2 + 4096; /* every weight as BF16 */
    if (!n->dbuf) {
#ifdef QRL_HAVE_CUDA
        if (cudaSetDevice(n->device) != cudaSuccess || cudaMalloc((void **)&n->dbuf, cap) != cudaSuccess) {
            cudaGetLastError();
            n->dbuf = NULL;
            return qrl_error_set(err, QRL_STATUS_CUDA, "nccl weights: %llu-byte device buffer on cuda:%d",
                                 (unsigned long long)cap, n->device);
        }
        n->dcap = cap;
#else
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "nccl weights: this build has no CUDA");
#endif
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Qrl__WeightManifest *mf;
    QRL_TRY(qrl_nccl_bcast_recv_device(n->comm, ev->version, cap, n->dbuf, n->dcap, n->timeout_ms, &mf, err));
    double swap_s = 0;
    qrl_status st = rd_apply_device_stream(c, mf, n->dbuf, ev->version, &swap_s, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st == QRL_OK)
        QRL_LOG_INFO("control", "weights received version=%" PRIu64 " from=nccl-device epoch=%" PRIu64 " ms=%.1f "
                     "swap_ms=%.2f", ev->version, n->epoch, (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                     (double)(t1.tv_nsec - t0.tv_nsec) / 1e6, swap_s * 1e3);
    qrl_wire_free(&mf->base);
    return st;
}

void rd_nccl_close(rd_nccl *n) {
    qrl_nccl_comm_destroy(n->comm);
    n->comm = NULL;
#ifdef QRL_HAVE_CUDA
    if (n->dbuf) cudaFree(n->dbuf);
#endif
    n->dbuf = NULL;
}

void rd_nccl_configure(rd_control *c, const rd_settings *s) {
    c->info.nccl = rd_nccl_capable();
    c->nccl = (rd_nccl){.device = s->nccl_device, .timeout_ms = s->nccl_timeout_ms};
}
