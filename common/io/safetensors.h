/* safetensors reader (mmap, validated) and writer (temp file, fsync, rename).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data region; offsets are relative to the start of the data region.
 * Validation (every failure names the file, the tensor and the offending field):
 *   header length within the file; valid JSON object; known dtype names; shape a list of
 *   non-negative integers; begin <= end; [begin, end) inside the data region;
 *   end - begin == numel * dtype size; no two tensors overlap. */
#ifndef QRL_IO_SAFETENSORS_H
#define QRL_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct qrl_safetensors qrl_safetensors; /* opaque */

/* Open and validate one file, or a sharded checkpoint through its
 * `*.safetensors.index.json` (every shard is opened and validated; a tensor named twice
 * is an error), or a folder holding model.safetensors or model.safetensors.index.json
 * (in that order, as HF does).  *out is owned by the caller: free with qrl_safetensors_close.
 * Errors: IO (cannot open/map), PARSE/CORRUPT (malformed header), UNSUPPORTED (dtype). */
qrl_status qrl_safetensors_open(const char *path, qrl_safetensors **out, qrl_error *err);
/* Parse an in-memory image (used by the fuzzer and tests); `data` must stay valid while
 * the handle lives; `name` is used in messages. */
qrl_status qrl_safetensors_open_memory(const void *data, size_t size, const char *name,
                                       qrl_safetensors **out, qrl_error *err);
void qrl_safetensors_close(qrl_safetensors *st);

/* Number of tensors, and the i-th name (sorted by name; valid while the handle lives). */
size_t qrl_safetensors_count(const qrl_safetensors *st);
const char *qrl_safetensors_name(const qrl_safetensors *st, size_t i);
/* Look a tensor up by name: fills *out (CPU, contiguous, data pointing into the mapping,
 * read-only, valid while the handle lives; aligned only as the file's offsets make it,
 * so load through memcpy or qrl_convert_to_f32). NOT_FOUND when absent. */
qrl_status qrl_safetensors_get(const qrl_safetensors *st, const char *name, qrl_tensor *out,
                               qrl_error *err);
/* A "__metadata__" string value, or NULL. */
const char *qrl_safetensors_metadata(const qrl_safetensors *st, const char *key);

/* Writer input: one named tensor (CPU, contiguous). */
typedef struct qrl_safetensors_entry {
    const char *name;
    const qrl_tensor *tensor;
} qrl_safetensors_entry;

/* Write `n` tensors (and optional metadata key/value pairs, `n_meta` of them) to `path`
 * atomically: write `path`.tmp, fsync, rename, fsync the directory.
 * Errors: INVALID_ARGUMENT (duplicate names, non-contiguous), IO. */
qrl_status qrl_safetensors_write(const char *path, const qrl_safetensors_entry *entries, size_t n,
                                 const char *const *meta_kv, size_t n_meta, qrl_error *err);

#endif
