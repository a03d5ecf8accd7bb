/* qrl wire helpers (SPEC §8, docs/wire.md) over the protobuf-c code generated from
 * proto/qrl.proto: encoding with schema-version stamping, decoding with a size limit, a
 * structural pre-scan and a schema-version check, validators for the topic messages,
 * chunking of large results, Kafka keys and CRC-32C.
 *
 * Messages are passed as ProtobufCMessage* (the `base` member of every generated struct);
 * decoded messages are owned by the caller and freed with qrl_wire_free.
 *
 * Error statuses:
 *   PARSE        malformed bytes; the message names the type, the byte offset and the
 *                field path ("GroupResult: byte 57 (responses[2].token_ids): ...").
 *   UNSUPPORTED  schema_version outside [QRL_WIRE_SCHEMA_VERSION_MIN, QRL_WIRE_SCHEMA_VERSION]
 *                ("GroupResult.responses[1]: schema_version got 2, expected 1").
 *   OUT_OF_RANGE input over the caller's size limit, or an output buffer too small.
 *   CORRUPT      a decoded message that breaks a rule of its type (validators, chunk joins);
 *                the message names the group, the response index and the field. */
#ifndef QRL_WIRE_WIRE_H
#define QRL_WIRE_WIRE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "core/crc32.h"
#include "core/status.h"
#include "qrl.pb-c.h"

/* Version encoders write, and the oldest one decoders accept (policy: docs/wire.md). */
#define QRL_WIRE_SCHEMA_VERSION 1u
#define QRL_WIRE_SCHEMA_VERSION_MIN 1u

/* Hard cap on one encoded message, whatever limit a caller passes. */
#define QRL_WIRE_MAX_MESSAGE_BYTES ((size_t)64 << 20)
/* Default chunk size for results: below Kafka's default message.max.bytes (1 MB) with
 * room for the record overhead. */
#define QRL_WIRE_DEFAULT_CHUNK_BYTES ((size_t)900 << 10)
/* Validator bounds: responses per group, tokens per prompt or response. */
#define QRL_WIRE_MAX_GROUP_SIZE 4096u
#define QRL_WIRE_MAX_TOKENS (1u << 20)
/* Largest behavior log-prob accepted: log-probs are <= 0; the slack absorbs float rounding
 * of a log-softmax whose top token has probability ~1. */
#define QRL_WIRE_LOGPROB_MAX 1e-4f
/* Buffer size for a Kafka key (decimal uint64 and NUL). */
#define QRL_WIRE_KEY_MAX 21

/* ---- message table ------------------------------------------------------------------ */

/* Every message type of qrl.proto, in file order (the fuzz target and tests walk it). */
size_t qrl_wire_message_count(void);
/* i-th descriptor, i < qrl_wire_message_count(). */
const ProtobufCMessageDescriptor *qrl_wire_message_at(size_t i);
/* Descriptor by short name ("GroupResult"), or NULL. */
const ProtobufCMessageDescriptor *qrl_wire_message_find(const char *name);

/* ---- encode / decode ---------------------------------------------------------------- */

/* Set schema_version = QRL_WIRE_SCHEMA_VERSION in `msg` and every nested message. */
void qrl_wire_stamp(ProtobufCMessage *msg);

/* Encoded size of `msg` after stamping it. */
size_t qrl_wire_encoded_size(ProtobufCMessage *msg);

/* Stamp and encode `msg` into buf[0..cap); *len = bytes written.
 * OUT_OF_RANGE when cap is too small (the message says how much is needed) or the
 * encoding exceeds QRL_WIRE_MAX_MESSAGE_BYTES.  `msg` stays owned by the caller. */
qrl_status qrl_wire_encode(ProtobufCMessage *msg, uint8_t *buf, size_t cap, size_t *len,
                           qrl_error *err);

/* Stamp and encode `msg` into a malloc'd buffer: *buf (free with free()), *len bytes.
 * OUT_OF_RANGE over QRL_WIRE_MAX_MESSAGE_BYTES, NOMEM. */
qrl_status qrl_wire_encode_alloc(ProtobufCMessage *msg, uint8_t **buf, size_t *len,
                                 qrl_error *err);

/* Decode `len` bytes as a `desc` message.  max_len is the caller's limit (0 or anything
 * above QRL_WIRE_MAX_MESSAGE_BYTES means that cap).  Checks, in order: len <= max_len
 * (OUT_OF_RANGE); non-empty and well-formed wire structure, every known field with its
 * declared wire type, unpacked size bounded (PARSE, naming byte offset and field path);
 * protobuf-c unpack (PARSE); schema_version of the message and of every nested message
 * (UNSUPPORTED).  Unknown fields are accepted (newer writers, same version).
 * On success *out is owned by the caller (qrl_wire_free); on failure *out = NULL. */
qrl_status qrl_wire_decode(const ProtobufCMessageDescriptor *desc, const void *data, size_t len,
                           size_t max_len, ProtobufCMessage **out, qrl_error *err);

/* Schema-version check alone (decode runs it): UNSUPPORTED naming the path, got, expected. */
qrl_status qrl_wire_check_versions(const ProtobufCMessage *msg, qrl_error *err);

/* Free a message from qrl_wire_decode (NULL is a no-op). */
void qrl_wire_free(ProtobufCMessage *msg);

/* ---- validators (CORRUPT naming group, response index and field) -------------------- */

/* PromptGroup: group_id >= 1; 1 <= group_size <= QRL_WIRE_MAX_GROUP_SIZE; prompt tokens
 * non-empty (<= QRL_WIRE_MAX_TOKENS) and < vocab_size; sampling present with a finite
 * temperature >= 0, top_p in [0, 1], 1 <= max_new_tokens <= QRL_WIRE_MAX_TOKENS, stop
 * token ids < vocab_size, non-empty stop strings.  vocab_size 0 skips the id checks. */
qrl_status qrl_wire_prompt_group_validate(const Qrl__PromptGroup *pg, uint32_t vocab_size,
                                          qrl_error *err);

/* GroupResult.  A chunk message (chunk_count > 1) is checked as a chunk only (index in
 * range, data present, no content fields).  A whole result: group_id >= 1; chunk_index 0
 * and chunk_count 1; group_size == expected_g (the dispatched G; 0 skips) and == the
 * number of responses; prompt tokens non-empty; per response: token_ids,
 * behavior_logprobs and token_versions of equal length (<= QRL_WIRE_MAX_TOKENS), log-probs
 * finite and <= QRL_WIRE_LOGPROB_MAX, versions non-decreasing, a known finish reason,
 * tokens present unless PROMPT_TOO_LONG (none allowed) or ABORTED, finite reward,
 * truncated_tokens <= tokens; token ids < vocab_size (0 skips). */
qrl_status qrl_wire_group_result_validate(const Qrl__GroupResult *r, uint32_t expected_g,
                                          uint32_t vocab_size, qrl_error *err);

/* TraceChunk: group_id >= 1; chunk_index < chunk_count; format_version 1 or 2 (else
 * UNSUPPORTED); block_size a positive multiple of 8; token_count >= 1; site ids strictly
 * increasing and non-empty; version 1: scales a whole number of bytes per token,
 * bits.len * 8 == scales.len * block_size; version 2: a non-empty record, no scales or
 * bits, token_begin + token_count <= response_tokens. */
qrl_status qrl_wire_trace_chunk_validate(const Qrl__TraceChunk *t, qrl_error *err);

/* WeightManifest: known checksum algorithm; bucket_bytes >= 1; bucket_count ==
 * ceil(total_bytes / bucket_bytes); tensors with non-empty unique names, dtype BF16, F16
 * or F32 (else UNSUPPORTED), byte_size == numel * dtype size, sorted by byte_offset,
 * non-overlapping and inside total_bytes. */
qrl_status qrl_wire_weight_manifest_validate(const Qrl__WeightManifest *m, qrl_error *err);

/* ---- chunking of results (docs/wire.md, "Chunking") --------------------------------- */

/* Encoded Kafka values, owned by the struct: free with qrl_wire_chunks_free. */
typedef struct qrl_wire_chunks {
    size_t count;
    uint8_t **data; /* count buffers */
    size_t *len;    /* their sizes */
} qrl_wire_chunks;

/* Encode `r` (a whole result: chunk fields are set here) as one message when it fits in
 * max_bytes, else as chunk messages of at most max_bytes each.  max_bytes >= 256 plus the
 * replica id length (INVALID_ARGUMENT otherwise).  *out is overwritten; on failure it is
 * empty.  Errors: INVALID_ARGUMENT, OUT_OF_RANGE (whole encoding over the cap), NOMEM. */
qrl_status qrl_wire_result_encode_chunked(Qrl__GroupResult *r, size_t max_bytes,
                                          qrl_wire_chunks *out, qrl_error *err);
void qrl_wire_chunks_free(qrl_wire_chunks *c);

/* Reassemble the whole result from all `n` chunk messages of one group, in any order
 * (the caller collects them by (group_id, replica_id, whole_crc32c)).  Checks: n ==
 * chunk_count >= 2; identical group_id, run_id, replica_id, whole_bytes, whole_crc32c;
 * each index once; sizes add up to whole_bytes <= max_whole (0 = the cap); the CRC
 * matches; the whole decodes (qrl_wire_decode) as an unchunked result of the same group.
 * Errors: CORRUPT (naming the chunk index), OUT_OF_RANGE, PARSE, UNSUPPORTED, NOMEM.
 * *out is owned by the caller (qrl_wire_free on its base). */
qrl_status qrl_wire_result_join(Qrl__GroupResult *const *chunks, size_t n, size_t max_whole,
                                Qrl__GroupResult **out, qrl_error *err);

/* ---- TRACE chunks (qrl.trace; wire/trace_chunk.c) ------------------------------------ */

/* TraceChunk.format_version of chunks that carry a whole TRACE record (proto/qrl.proto). */
#define QRL_WIRE_TRACE_FORMAT_RECORD 2u

/* Who a response's chunks belong to (copied into every chunk; replica_id borrowed). */
typedef struct qrl_wire_trace_ident {
    uint64_t group_id, run_id;
    const char *replica_id;
    uint32_t response_index;
} qrl_wire_trace_ident;

/* A response's records in chunk order (model/trace_rec.h qrl_trace_pack has these fields:
 * fill from it); all borrowed. */
typedef struct qrl_wire_trace_pieces {
    size_t count;
    uint8_t *const *record;
    const size_t *len;
    const uint32_t *token_begin, *token_count;
    uint32_t n_tokens; /* response tokens */
    uint32_t crc32;    /* CRC-32 (IEEE) of the records concatenated in order */
} qrl_wire_trace_pieces;

/* Largest record that fits one TraceChunk message of max_bytes with n_sites site ids and
 * this replica id (0 when nothing fits): pass it to qrl_trace_buf_pack. */
size_t qrl_wire_trace_record_budget(size_t max_bytes, size_t n_sites, const char *replica_id);

/* Encode one TraceChunk (format_version 2, block_size 16) per piece: chunk index i of
 * count, the ident, site_ids [n_sites], record i with its token range, the response's
 * tokens and CRC.  Every message is <= max_bytes.  *out overwritten, empty on failure.
 * Errors: INVALID_ARGUMENT (no pieces, no site ids, group_id 0), OUT_OF_RANGE (a message
 * over max_bytes: the record budget was not respected), NOMEM. */
qrl_status qrl_wire_trace_chunks_encode(const qrl_wire_trace_ident *id, const uint32_t *site_ids,
                                        size_t n_sites, const qrl_wire_trace_pieces *p,
                                        size_t max_bytes, qrl_wire_chunks *out, qrl_error *err);

/* Completeness check of the chunks a consumer holds for one response (decoded messages, in
 * any order, duplicates allowed): every chunk validates (qrl_wire_trace_chunk_validate) at
 * format_version 2; all agree on group, run, replica, response index, chunk_count,
 * response_tokens, response_crc32 and site_ids; a duplicated index carries the same record
 * and range (kept once); indices 0 .. chunk_count-1 are all present; their token ranges
 * tile [0, response_tokens); the CRC-32 of the records in index order is response_crc32.
 * On success ordered[0 .. *count) (caller array of n entries) are the chunks in index
 * order (borrowed from chunks).  Errors: NOT_FOUND (incomplete: names the missing
 * indices; more chunks may still come), CORRUPT (disagreeing fields, conflicting
 * duplicates, ranges or CRC; names the chunk), UNSUPPORTED (format version). */
qrl_status qrl_wire_trace_join(Qrl__TraceChunk *const *chunks, size_t n,
                               const Qrl__TraceChunk **ordered, size_t *count, qrl_error *err);

/* ---- keys and checksums ------------------------------------------------------------- */

/* Kafka key of a group: its id in decimal ASCII.  Writes a NUL-terminated string into
 * out[QRL_WIRE_KEY_MAX]; returns its length (without the NUL). */
size_t qrl_wire_group_key(uint64_t group_id, char out[QRL_WIRE_KEY_MAX]);
/* Parse a key (not NUL-terminated, `len` bytes): 1-20 decimal digits, no leading zero,
 * value 1..UINT64_MAX.  PARSE naming the offending byte otherwise. */
qrl_status qrl_wire_group_key_parse(const void *key, size_t len, uint64_t *group_id,
                                    qrl_error *err);

/* CRC-32C (Castagnoli), continuing from `crc` (start with 0): the wire's names for
 * qrl_crc32c and qrl_crc32c_sw (core/crc32.h), kept for its callers. */
static inline uint32_t qrl_wire_crc32c(uint32_t crc, const void *data, size_t len) {
    return qrl_crc32c(crc, data, len);
}
static inline uint32_t qrl_wire_crc32c_sw(uint32_t crc, const void *data, size_t len) {
    return qrl_crc32c_sw(crc, data, len);
}

#endif
