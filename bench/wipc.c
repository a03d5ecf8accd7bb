/* The device weight path alone (issue 18; common/weights/wipc.h): a learner process
 * publishes a Qwen3-shaped model's F32 device parameters as a BF16 CUDA IPC slot (cast and
 * CRC-32C on the GPU), a replica process on the same GPU maps it, copies and verifies it,
 * and swaps it into a CUDA decode engine (BF16 copy, or W8A8 INT8 / FP8 quantized on the
 * device).  Anchor in the same run: one cudaMemcpy of the same bytes device to device (the
 * floor of any path that moves the stream once).  sync_s = from the start of the publish to
 * the end of the swap (CLOCK_MONOTONIC is one clock for both processes); s_per_B = sync_s
 * per billion parameters (target 0.02).  Medians of 5 versions per precision.
 *
 *   build/bench/wipc [--model qwen3-1.7b|qwen3-4b] [--json PATH]
 * JSON: bench/results/wipc-h200.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef QRL_HAVE_CUDA
#include "cuda_bench.h"
#include "cuda/convert.cuh"
#include "cuda/pointwise.cuh"
#include "model/model.h"
#include "weights/wipc.h"
#include "wire/wire.h"

#define REPS 5
#define NPREC 3

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static qrl_model_config qwen3_1_7b(void) {
    qrl_model_config c = qwen3_4b();
    c.dim = 2048, c.hidden_dim = 6144, c.n_layers = 28, c.n_heads = 16;
    return c;
}

typedef struct msg {          /* learner -> replica, one per version */
    uint8_t handle[QRL_WIPC_HANDLE_BYTES];
    double t_start, cast_s, crc_s;
} msg;

typedef struct row {          /* replica -> parent, one per version */
    int prec;
    double cast_s, crc_s, map_s, copy_s, verify_s, swap_s, sync_s;
} row;

static int xfer(int fd, void *p, size_t n, int wr) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = wr ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

static void learner(const qrl_model_config *cfg, int to_rx, int from_rx) {
    qrl_error err;
    qrl_model *m;
    QK(qrl_model_new(cfg, &m, &err)); /* the tensor table (the arena stays untouched) */
    size_t np = (size_t)(m->rope_inv_freq - m->arena);
    float *d;
    uint16_t *tmp;
    CK(cudaMalloc((void **)&d, np * 4));
    CK(cudaMalloc((void **)&tmp, np * 2));
    QK(qrl_cuda_fill_random_bf16(tmp, np, 5, 0.0f, 0.02f, NULL, &err));
    QK(qrl_cuda_bf16_to_f32(tmp, d, np, NULL, &err));
    CK(cudaDeviceSynchronize());
    cudaFree(tmp);
    size_t n = (size_t)m->n_tensors;
    qrl_wsync_tensor *t;
    const float **src;
    QK(qrl_wipc_model_table(m, d, &t, &src, &err));
    qrl_wipc_sender *s;
    QK(qrl_wipc_sender_new(0, &s, &err));
    for (uint64_t v = 1; v <= (uint64_t)REPS * NPREC + 1; v++) {
        msg mm;
        mm.t_start = mono();
        qrl_wipc_published pub;
        QK(qrl_wipc_publish(s, t, src, n, v, (uint64_t)64 << 20, &pub, &err));
        memcpy(mm.handle, pub.handle, sizeof mm.handle);
        mm.cast_s = pub.cast_s, mm.crc_s = pub.crc_s;
        free(pub.manifest);
        free(pub.bucket_crc);
        char ack;
        if (xfer(to_rx, &mm, sizeof mm, 1) || xfer(from_rx, &ack, 1, 0)) exit(2);
    }
    qrl_wipc_sender_free(s);
    exit(0);
}

static void replica(const qrl_model_config *cfg, int from_tx, int to_tx, int to_parent) {
    qrl_error err;
    qrl_model *like;
    QK(qrl_model_new(cfg, &like, &err));
    qrl_precision ps[NPREC] = {QRL_PRECISION_BF16, QRL_PRECISION_W8A8_INT8, QRL_PRECISION_W8A8_FP8};
    qrl_cuda_forward *f[NPREC];
    for (int k = 0; k < NPREC; k++) {
        qrl_cuda_forward_desc dd = {.max_rows = 8, .max_ctx = 256, .block_size = 16, .n_blocks = 32,
                                    .max_seqs = 2, .precision = ps[k], .eager = true};
        QK(qrl_cuda_forward_new(cfg, &dd, &f[k], &err));
        QK(qrl_cuda_forward_init_random(f[k], 1, &err));
    }
    qrl_wipc_receiver *r;
    QK(qrl_wipc_receiver_new(0, &r, &err));
    for (int v = 1; v <= REPS * NPREC + 1; v++) {
        msg mm;
        if (xfer(from_tx, &mm, sizeof mm, 0)) exit(2);
        qrl_wipc_received rx;
        QK(qrl_wipc_receive(r, mm.handle, sizeof mm.handle, (uint64_t)v, (uint64_t)1 << 40, &rx, &err));
        int k = (v - 1) % NPREC;
        size_t n = rx.mf->n_tensors;
        qrl_cuda_stream_tensor *t = calloc(n, sizeof *t);
        for (size_t i = 0; i < n; i++)
            t[i] = (qrl_cuda_stream_tensor){rx.mf->tensors[i]->name,
                                            (const uint16_t *)(rx.stream + rx.mf->tensors[i]->byte_offset),
                                            rx.mf->tensors[i]->byte_size / 2};
        double t0 = mono();
        QK(qrl_cuda_forward_upload_stream(f[k], like, t, n, &err));
        double t1 = mono();
        free(t);
        qrl_wire_free(&rx.mf->base);
        row w = {k, mm.cast_s, mm.crc_s, rx.map_s, rx.copy_s, rx.verify_s, t1 - t0, t1 - mm.t_start};
        char ack = 'k';
        if (v > 1 && xfer(to_parent, &w, sizeof w, 1)) exit(3); /* v1 maps the slots: warm-up */
        if (xfer(to_tx, &ack, 1, 1)) exit(3);
    }
    exit(0);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double med(row *w, int nw, int k, size_t field) {
    double v[REPS * NPREC];
    int c = 0;
    for (int i = 0; i < nw; i++)
        if (w[i].prec == k) v[c++] = *(double *)((char *)&w[i] + field);
    qsort(v, (size_t)c, sizeof *v, cmp_d);
    return c ? v[c / 2] : 0;
}

int main(int argc, char **argv) {
    const char *json = "bench/results/wipc-h200.json", *model = "qwen3-1.7b";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
    }
    qrl_model_config cfg = !strcmp(model, "qwen3-4b") ? qwen3_4b() : qwen3_1_7b();
    cfg.max_seq_len = 4096;
    int a[2], b[2], c[2];
    if (pipe(a) || pipe(b) || pipe(c)) return 1;
    pid_t pl = fork();
    if (pl == 0) learner(&cfg, a[1], b[0]);
    pid_t pr = fork();
    if (pr == 0) replica(&cfg, a[0], b[1], c[1]);
    close(c[1]);
    row w[REPS * NPREC];
    int nw = 0;
    while (nw < REPS * NPREC && xfer(c[0], &w[nw], sizeof w[nw], 0) == 0) nw++;
    int s1 = 0, s2 = 0;
    waitpid(pr, &s1, 0);
    waitpid(pl, &s2, 0);
    if (nw < REPS * NPREC || s1 || s2) {
        fprintf(stderr, "wipc bench: %d of %d versions (replica status %d, learner %d)\n", nw, REPS * NPREC, s1, s2);
        return 1;
    }
    /* the anchor, here (the children are gone): one device-to-device copy of the stream */
    size_t params = 0;
    {
        qrl_model *m;
        qrl_error err;
        QK(qrl_model_new(&cfg, &m, &err));
        params = (size_t)(m->rope_inv_freq - m->arena);
        qrl_model_free(m);
    }
    size_t bytes = params * 2;
    void *x, *y;
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    double cp[5];
    for (int i = -1; i < 5; i++) {
        CK(cudaDeviceSynchronize());
        double t0 = mono();
        CK(cudaMemcpy(y, x, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
        if (i >= 0) cp[i] = mono() - t0;
    }
    qsort(cp, 5, sizeof *cp, cmp_d);
    double floor_s = cp[2];
    const char *names[NPREC] = {"bf16", "w8a8-int8", "w8a8-fp8"};
    printf("CUDA IPC weight path, %s (%.3f B params, %.2f GB BF16), one H200, medians of %d\n", model,
           params / 1e9, bytes / 1e9, REPS);
    printf("%-10s %8s %8s %8s %8s %8s %8s %9s %9s %10s %8s\n", "precision", "cast_ms", "crc_ms", "map_ms", "copy_ms",
           "verify", "swap_ms", "sync_ms", "s_per_B", "x_memcpy", "target");
    FILE *js = fopen(json, "w");
    if (js) fprintf(js, "{\"bench\":\"wipc\",\"model\":\"%s\",\"params\":%zu,\"bytes\":%zu,\"memcpy_d2d_s\":%.6g,"
                        "\"target_s_per_B\":0.02,\"rows\":[", model, params, bytes, floor_s);
    for (int k = 0; k < NPREC; k++) {
        double sync = med(w, nw, k, offsetof(row, sync_s)), spb = sync / (params / 1e9);
        printf("%-10s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.4f %10.1f %8s\n", names[k],
               med(w, nw, k, offsetof(row, cast_s)) * 1e3, med(w, nw, k, offsetof(row, crc_s)) * 1e3,
               med(w, nw, k, offsetof(row, map_s)) * 1e3, med(w, nw, k, offsetof(row, copy_s)) * 1e3,
               med(w, nw, k, offsetof(row, verify_s)) * 1e3, med(w, nw, k, offsetof(row, swap_s)) * 1e3, sync * 1e3,
               spb, sync / floor_s, spb <= 0.02 ? "met" : "missed");
        if (js)
            fprintf(js, "%s{\"precision\":\"%s\",\"cast_s\":%.6g,\"crc_s\":%.6g,\"map_s\":%.6g,\"copy_s\":%.6g,"
                        "\"verify_s\":%.6g,\"swap_s\":%.6g,\"sync_s\":%.6g,\"s_per_B\":%.6g,\"x_memcpy\":%.4g}",
                    k ? "," : "", names[k], med(w, nw, k, offsetof(row, cast_s)), med(w, nw, k, offsetof(row, crc_s)),
                    med(w, nw, k, offsetof(row, map_s)), med(w, nw, k, offsetof(row, copy_s)),
                    med(w, nw, k, offsetof(row, verify_s)), med(w, nw, k, offsetof(row, swap_s)), sync, spb,
                    sync / floor_s);
    }
    printf("anchor: cudaMemcpy D2D of the %.2f GB stream: %.2f ms (%.0f GB/s read+write)\n", bytes / 1e9,
           floor_s * 1e3, 2 * bytes / floor_s / 1e9);
    if (js) {
        fprintf(js, "]}\n");
        fclose(js);
    }
    return 0;
}
#else
int main(void) {
    fprintf(stderr, "wipc: built without CUDA\n");
    return 1;
}
#endif
