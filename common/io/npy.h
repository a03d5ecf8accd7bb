/* NumPy .npy files: a float32 writer (--dump-logits) and a reader for the float32 /
 * int32 / int64 arrays that tests compare against reference outputs.
 *
 * Format (numpy.lib.format): "\x93NUMPY", major, minor, header length (uint16 LE in
 * version 1.0, uint32 LE in 2.0/3.0), a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
 * final '\n' to a multiple of 64 bytes, then the raw little-endian C-order data. */
#ifndef QRL_IO_NPY_H
#define QRL_IO_NPY_H

#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

/* Write `data` (C order, shape[0..ndim), ndim in [0, QRL_TENSOR_MAX_DIMS]) as a version
 * 1.0 '<f4' file, atomically (path.tmp then rename).  Errors: INVALID_ARGUMENT (shape),
 * IO (names the path). */
qrl_status qrl_npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape,
                             qrl_error *err);

/* Read a '<f4', '<i4' or '<i8' C-order file (versions 1.0, 2.0, 3.0) into *out
 * (dtype F32/I32/I64, CPU, contiguous; out->data is a fresh 64-byte aligned block owned by
 * the caller: free with qrl_npy_free).  Errors: IO, PARSE (bad magic/header, naming the
 * field), UNSUPPORTED (other dtype, big-endian, fortran_order), CORRUPT (data size does
 * not match the shape), NOMEM. */
qrl_status qrl_npy_read(const char *path, qrl_tensor *out, qrl_error *err);
/* Free the data of a tensor filled by qrl_npy_read (sets out->data to NULL). */
void qrl_npy_free(qrl_tensor *t);

#endif
