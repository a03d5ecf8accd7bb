/* qrl-rollout CUDA IPC weight transport (weights/wipc.h, docs/weight-sync.md "CUDA IPC"):
 * a learner on this node publishes each version in a device slot; the replica maps it,
 * copies and verifies the stream on its own GPU into a staging buffer (while the engine
 * keeps decoding the old version), then the engine swaps it in at a step boundary: BF16
 * weights are copied and W8A8 projections quantized on the device, so the swap is the
 * only pause.  Engines that quantize on the host (w4a16) take a host copy instead.  Runs
 * on the control side's weights thread, never the loop or the engine. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "rollout.h"
#include "weights/wipc.h"
#include "wire/wire.h"
#include "model/forward_cuda.h" /* qrl_cuda_stream_tensor: a plain struct, any build */

static uint64_t unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void rd_ipc_configure(rd_control *c, const rd_settings *s) {
    c->ipc.device = -1;
    c->ipc.rx = NULL;
    c->ipc.node_id[0] = 0;
    if (s->device != RD_DEVICE_CUDA) return;
    c->ipc.device = s->cuda_device;
    qrl_wipc_node_id(c->ipc.node_id);
    if (c->ipc.node_id[0]) c->info.node_id = c->ipc.node_id;
}

void rd_ipc_close(rd_control *c) {
    qrl_wipc_receiver_free(c->ipc.rx);
    c->ipc.rx = NULL;
}

/* The host path: a model from the verified stream, quantized on the CPU, swapped in. */
static qrl_status apply_host(rd_control *c, const qrl_wipc_received *rx, uint64_t version, qrl_error *err) {
    uint8_t *host = malloc(rx->total ? rx->total : 1);
    if (!host) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc: %" PRIu64 " bytes", rx->total);
    qrl_model *m = NULL;
    qrl_status st = qrl_wipc_receiver_download(c->ipc.rx, host, rx->total, err);
    if (st == QRL_OK) st = rd_weights_from_stream(rx->mf, host, c->model, version, "cuda ipc", &m, err);
    free(host);
    if (st == QRL_OK) st = qrl_model_quantize(m, c->model->precision, err);
    if (st != QRL_OK) {
        qrl_model_free(m);
        return st;
    }
    rd_engine_swap(c->engine, m, version);
    return QRL_OK;
}

qrl_status rd_apply_device_stream(rd_control *c, const Qrl__WeightManifest *mf, const uint8_t *d_stream,
                                  uint64_t version, double *swap_s, qrl_error *err) {
    /* only reached with a CUDA engine (rd_engine_takes_stream); a CPU one refuses the swap */
    size_t n = mf->n_tensors;
    qrl_cuda_stream_tensor *t = calloc(n ? n : 1, sizeof *t);
    if (!t) return qrl_error_set(err, QRL_STATUS_NOMEM, "cuda ipc: %zu tensors", n);
    qrl_status st = QRL_OK;
    for (size_t i = 0; i < n && st == QRL_OK; i++) {
        const Qrl__TensorMeta *m = mf->tensors[i];
        if (strcmp(m->dtype, "BF16") != 0)
            st = qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "device weights: tensor '%s' is %s (BF16 expected)",
                               m->name, m->dtype);
        t[i] = (qrl_cuda_stream_tensor){m->name, (const uint16_t *)(d_stream + m->byte_offset), m->byte_size / 2};
    }
    if (st == QRL_OK) st = rd_engine_swap_stream(c->engine, t, n, version, swap_s, err);
    free(t);
    return st;
}

qrl_status rd_ipc_fetch_apply(rd_control *c, const Qrl__VersionEvent *ev, qrl_error *err) {
    if (c->ipc.device < 0)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "cuda ipc: this replica has no CUDA engine");
    double t0 = mono_ms();
    if (!c->ipc.rx) QRL_TRY(qrl_wipc_receiver_new(c->ipc.device, &c->ipc.rx, err));
    qrl_wipc_received rx;
    uint64_t max_total = (uint64_t)c->model->arena_floats * 4 + 4096;
    QRL_TRY(qrl_wipc_receive(c->ipc.rx, ev->ipc_handle.data, ev->ipc_handle.len, ev->version, max_total, &rx, err));
    double swap_s = 0, t1 = mono_ms();
    qrl_status st;
    bool device = rd_engine_takes_stream(c->engine);
    st = device ? rd_apply_device_stream(c, rx.mf, rx.stream, ev->version, &swap_s, err)
                : apply_host(c, &rx, ev->version, err);
    if (st == QRL_OK)
        QRL_LOG_INFO("control", "weights received version=%" PRIu64 " from=cuda-ipc ms=%.1f map_ms=%.2f copy_ms=%.2f "
                     "verify_ms=%.2f apply_ms=%.1f swap_ms=%.2f path=%s since_announce_ms=%" PRId64, ev->version,
                     mono_ms() - t0, rx.map_s * 1e3, rx.copy_s * 1e3, rx.verify_s * 1e3, mono_ms() - t1,
                     swap_s * 1e3, device ? "device" : "host", (int64_t)(unix_ms() - ev->sent_unix_ms));
    qrl_wire_free(&rx.mf->base);
    return st;
}
