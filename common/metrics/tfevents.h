/* TensorBoard event files, so `tensorboard --logdir runs/` plots the learner's scalars
 * (docs/metrics.md).
 *
 * A file `events.out.tfevents.<unix secs, 10 digits>.<host>` is a sequence of TFRecords:
 *   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data[length] |
 *   uint32 masked_crc32c(data)
 * with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C(x).  Each
 * record holds a protobuf `Event` (tensorflow/core/util/event.proto), hand-encoded:
 *   1 wall_time double, 2 step int64, 3 file_version string ("brain.Event:2", the first
 *   record only), 5 summary { repeated 1 value { 1 tag string, 2 simple_value float } }.
 *
 * Not thread-safe: one writer per thread (the learner writes from its loop thread). */
#ifndef QRL_METRICS_TFEVENTS_H
#define QRL_METRICS_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct qrl_tfevents qrl_tfevents_t;

/* One scalar of an event: `tag` (the chart's name; borrowed for the call) and its value. */
typedef struct qrl_tfevents_scalar {
    const char *tag;
    float value;
} qrl_tfevents_scalar;

/* The TFRecord checksum of `len` bytes: CRC-32C, rotated right by 15 and offset by
 * 0xa282ead8. */
uint32_t qrl_tfrecord_masked_crc(const void *data, size_t len);

/* Create `dir` (and missing parents) and a new event file in it; the file starts with the
 * file_version record, stamped with the current time.  Errors: IO naming the path
 * (mkdir, open, write), NOMEM.  Close with qrl_tfevents_close. */
qrl_status qrl_tfevents_open(const char *dir, qrl_tfevents_t **out, qrl_error *err);

/* Append one Event at `step` with wall_time `wall_time` (unix seconds; <= 0 = now)
 * carrying n scalars (n may be 0), and flush it to the file so a running TensorBoard sees
 * it.  Errors: INVALID_ARGUMENT (a NULL or empty tag, or an event over 16 MiB), IO. */
qrl_status qrl_tfevents_write_scalars(qrl_tfevents_t *w, int64_t step, double wall_time,
                                      const qrl_tfevents_scalar *v, size_t n, qrl_error *err);

/* Path of the file (owned by w; valid until close). */
const char *qrl_tfevents_path(const qrl_tfevents_t *w);

/* Close the file and free w; NULL is a no-op. */
void qrl_tfevents_close(qrl_tfevents_t *w);

#endif
