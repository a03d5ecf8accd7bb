/* libFuzzer target: decode bytes as a qrl message and run its validator.
 *
 * Input: byte 0 selects the message type (index into the wire message table, modulo its
 * size); the rest is decoded.  A value of 0xff exercises the Kafka key parser instead.
 * Properties checked (abort = finding):
 *   - decode never crashes and never leaks (ASan), whatever the bytes;
 *   - a decoded message re-encodes to bytes that decode again and re-encode identically
 *     (the encoding of a decoded message is canonical);
 *   - validators accept or refuse with a message, never crash;
 *   - a valid GroupResult split into chunks joins back to the same encoding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

static void die(const char *what, const qrl_error *e) {
    fprintf(stderr, "fuzz_proto: %s: %s\n", what, e ? e->msg : "");
    abort();
}

static void validate(const ProtobufCMessage *m) {
    qrl_error e;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    qrl_status st = QRL_OK;
    if (d == &qrl__prompt_group__descriptor)
        st = qrl_wire_prompt_group_validate((const Qrl__PromptGroup *)m, 1000, &e);
    else if (d == &qrl__group_result__descriptor)
        st = qrl_wire_group_result_validate((const Qrl__GroupResult *)m, 0, 1000, &e);
    else if (d == &qrl__trace_chunk__descriptor)
        st = qrl_wire_trace_chunk_validate((const Qrl__TraceChunk *)m, &e);
    else if (d == &qrl__weight_manifest__descriptor)
        st = qrl_wire_weight_manifest_validate((const Qrl__WeightManifest *)m, &e);
    if (st != QRL_OK && e.msg[0] == '\0') die("validator failed without a message", NULL);
}

/* A valid whole result: chunk it small and join it back. */
static void chunk_round_trip(Qrl__GroupResult *r, const uint8_t *enc, size_t len) {
    qrl_error e;
    if (qrl_wire_group_result_validate(r, 0, 0, &e) != QRL_OK || r->chunk_count != 1) return;
    qrl_wire_chunks ch;
    if (len > (64u << 10)) return; /* keep executions fast */
    if (qrl_wire_result_encode_chunked(r, 256 + strlen(r->replica_id), &ch, &e) != QRL_OK) return;
    Qrl__GroupResult **parts = calloc(ch.count, sizeof *parts);
    if (!parts) abort();
    for (size_t i = 0; i < ch.count; i++) {
        ProtobufCMessage *m;
        if (qrl_wire_decode(&qrl__group_result__descriptor, ch.data[i], ch.len[i], 0, &m, &e))
            die("chunk does not decode", &e);
        parts[i] = (Qrl__GroupResult *)m;
    }
    if (ch.count > 1) {
        Qrl__GroupResult *joined;
        if (qrl_wire_result_join(parts, ch.count, 0, &joined, &e)) die("join failed", &e);
        uint8_t *again;
        size_t n;
        if (qrl_wire_encode_alloc(&joined->base, &again, &n, &e)) die("re-encode", &e);
        if (n != len || memcmp(again, enc, len)) die("joined result differs", NULL);
        free(again);
        qrl_wire_free(&joined->base);
    }
    for (size_t i = 0; i < ch.count; i++) qrl_wire_free(&parts[i]->base);
    free(parts);
    qrl_wire_chunks_free(&ch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    qrl_error e;
    if (data[0] == 0xff) {
        uint64_t id;
        if (qrl_wire_group_key_parse(data + 1, size - 1, &id, &e) == QRL_OK) {
            char key[QRL_WIRE_KEY_MAX];
            size_t n = qrl_wire_group_key(id, key);
            if (n != size - 1 || memcmp(key, data + 1, n)) die("key does not round-trip", NULL);
        }
        return 0;
    }
    const ProtobufCMessageDescriptor *d = qrl_wire_message_at(data[0] % qrl_wire_message_count());
    ProtobufCMessage *m;
    if (qrl_wire_decode(d, data + 1, size - 1, 1u << 20, &m, &e) != QRL_OK) {
        if (e.msg[0] == '\0') die("decode failed without a message", NULL);
        return 0;
    }
    validate(m);

    uint8_t *enc1, *enc2;
    size_t n1, n2;
    if (qrl_wire_encode_alloc(m, &enc1, &n1, &e)) die("encode of a decoded message", &e);
    ProtobufCMessage *m2;
    if (qrl_wire_decode(d, enc1, n1, 0, &m2, &e)) die("re-decode of a re-encoding", &e);
    if (qrl_wire_encode_alloc(m2, &enc2, &n2, &e)) die("second encode", &e);
    if (n1 != n2 || memcmp(enc1, enc2, n1)) die("re-encoding is not stable", NULL);
    if (d == &qrl__group_result__descriptor) chunk_round_trip((Qrl__GroupResult *)m2, enc2, n2);

    free(enc1);
    free(enc2);
    qrl_wire_free(m2);
    qrl_wire_free(m);
    return 0;
}
