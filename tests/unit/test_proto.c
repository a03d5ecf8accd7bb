/* Wire formats: round trips of every message, decoding errors (truncation, bad structure,
 * size limits, schema versions), random and mutated bytes, the message and RPC tables.
 * Validators, chunking, keys and CRC-32C are in test_wire.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/rpc_paths.h"
#include "wire/wire.h"

/* ---- reflective fill and compare (test-side, independent of wire.c) ------------------ */

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    cr_assert(p);
    return p;
}

/* Fills one value of field type `f` at `dst` with a non-default value derived from k.
 * Allocations mirror protobuf-c's unpack, so protobuf_c_message_free_unpacked frees it. */
static ProtobufCMessage *fill_new(const ProtobufCMessageDescriptor *d, unsigned k);

static void fill_value(const ProtobufCFieldDescriptor *f, void *dst, unsigned k) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32: *(int32_t *)dst = -7 * (int32_t)(k + 1); break; /* 10-byte varint */
    case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32: *(int32_t *)dst = -3 - (int32_t)k; break;
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: *(uint32_t *)dst = 0x80000001u + k; break;
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)dst = -(int64_t)0x123456789abLL - k; break;
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)dst = 0xfedcba9876543210ull + k; break;
    case PROTOBUF_C_TYPE_FLOAT: *(float *)dst = -1.25f * (float)(k + 1) + 0.1f; break;
    case PROTOBUF_C_TYPE_DOUBLE: *(double *)dst = 3.5e-7 * (k + 1); break;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)dst = 1; break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        cr_assert(e->n_values >= 2 && e->values[0].value == 0, "%s: enum needs 0 first", e->name);
        *(int *)dst = e->values[1 + k % (e->n_values - 1)].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s = xmalloc(64);
        snprintf(s, 64, "%s-%u-\xc3\xa9", f->name, k); /* UTF-8 included */
        *(char **)dst = s;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = dst;
        b->len = 3 + k % 5;
        b->data = xmalloc(b->len);
        for (size_t i = 0; i < b->len; i++) b->data[i] = (uint8_t)(i == 0 ? 0 : 0xff - i - k);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: *(ProtobufCMessage **)dst = fill_new(f->descriptor, k + 1); break;
    }
}

static size_t elt_size(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    default: return 4;
    }
}

#define N_REPEATED 3

static ProtobufCMessage *fill_new(const ProtobufCMessageDescriptor *d, unsigned k) {
    ProtobufCMessage *m = xmalloc(d->sizeof_message);
    d->message_init(m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *dst = (char *)m + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t es = elt_size(f->type);
            char *arr = xmalloc(N_REPEATED * es);
            for (unsigned j = 0; j < N_REPEATED; j++) fill_value(f, arr + j * es, k * 10 + j + i);
            *(size_t *)((char *)m + f->quantifier_offset) = N_REPEATED;
            *(void **)dst = arr;
        } else {
            cr_assert_eq(f->label, PROTOBUF_C_LABEL_NONE, "%s.%s: proto3 plain fields only",
                         d->short_name, f->name);
            fill_value(f, dst, k + i);
        }
    }
    return m;
}

/* Compares a and b field by field; on the first difference writes its path to diff. */
static int msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b, char *diff, size_t cap);

static int value_equal(const ProtobufCFieldDescriptor *f, const void *x, const void *y, char *diff,
                       size_t cap) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: return !strcmp(*(char *const *)x, *(char *const *)y);
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *p = x, *q = y;
        return p->len == q->len && (!p->len || !memcmp(p->data, q->data, p->len));
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *p = *(ProtobufCMessage *const *)x, *q = *(ProtobufCMessage *const *)y;
        if (!p || !q) return p == q;
        return msg_equal(p, q, diff, cap);
    }
    case PROTOBUF_C_TYPE_BOOL: return !*(const protobuf_c_boolean *)x == !*(const protobuf_c_boolean *)y;
    default: return !memcmp(x, y, elt_size(f->type)); /* floats bitwise */
    }
}

static int msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b, char *diff, size_t cap) {
    const ProtobufCMessageDescriptor *d = a->descriptor;
    if (b->descriptor != d) { snprintf(diff, cap, "descriptor"); return 0; }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *x = (const char *)a + f->offset, *y = (const char *)b + f->offset;
        char sub[256] = "";
        int eq = 1;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t na = *(const size_t *)((const char *)a + f->quantifier_offset);
            size_t nb = *(const size_t *)((const char *)b + f->quantifier_offset);
            eq = na == nb;
            size_t es = elt_size(f->type);
            for (size_t j = 0; eq && j < na; j++)
                eq = value_equal(f, *(char *const *)x + j * es, *(char *const *)y + j * es, sub,
                                 sizeof sub);
        } else {
            eq = value_equal(f, x, y, sub, sizeof sub);
        }
        if (!eq) {
            snprintf(diff, cap, "%s.%s%s%s", d->short_name, f->name, sub[0] ? " > " : "", sub);
            return 0;
        }
    }
    return 1;
}

static uint8_t *encode(ProtobufCMessage *m, size_t *n) {
    uint8_t *b;
    qrl_error e;
    cr_assert_eq(qrl_wire_encode_alloc(m, &b, n, &e), QRL_OK, "%s", e.msg);
    return b;
}

static ProtobufCMessage *decode_ok(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n) {
    ProtobufCMessage *m;
    qrl_error e;
    qrl_status st = qrl_wire_decode(d, b, n, 0, &m, &e);
    cr_assert_eq(st, QRL_OK, "%s: %s", d->short_name, e.msg);
    return m;
}

/* Field numbers present at the top level of an encoding (test-side tag walk). */
static int has_field(const uint8_t *b, size_t n, unsigned want) {
    size_t off = 0;
    while (off < n) {
        uint64_t key = 0, v = 0;
        for (int s = 0; off < n; s += 7) { key |= (uint64_t)(b[off] & 0x7f) << s; if (!(b[off++] & 0x80)) break; }
        if ((key >> 3) == want) return 1;
        switch (key & 7) {
        case 0: while (off < n && (b[off++] & 0x80)) {} break;
        case 1: off += 8; break;
        case 5: off += 4; break;
        case 2:
            for (int s = 0; off < n; s += 7) { v |= (uint64_t)(b[off] & 0x7f) << s; if (!(b[off++] & 0x80)) break; }
            off += v;
            break;
        default: return 0;
        }
    }
    return 0;
}

/* ---- tables ------------------------------------------------------------------------- */

Test(proto, message_table_matches_proto_file) {
    FILE *f = fopen("proto/qrl.proto", "r");
    cr_assert(f, "run from the repo root");
    char line[512];
    size_t n = 0;
    while (fgets(line, sizeof line, f)) {
        char name[128];
        if (sscanf(line, "message %127[A-Za-z0-9_]", name) != 1) continue;
        n++;
        cr_assert(qrl_wire_message_find(name), "message %s missing from the wire table", name);
    }
    fclose(f);
    cr_assert_eq(n, qrl_wire_message_count(), "proto has %zu messages, table %zu", n,
                 qrl_wire_message_count());
    cr_assert_null(qrl_wire_message_find("NoSuchMessage"));
    /* every message: field 1 is uint32 schema_version */
    for (size_t i = 0; i < n; i++) {
        const ProtobufCMessageDescriptor *d = qrl_wire_message_at(i);
        const ProtobufCFieldDescriptor *v = protobuf_c_message_descriptor_get_field(d, 1);
        cr_assert(v && v->type == PROTOBUF_C_TYPE_UINT32 && !strcmp(v->name, "schema_version"),
                  "%s: field 1 is not uint32 schema_version", d->short_name);
    }
}

Test(proto, rpc_table_matches_services) {
    const ProtobufCServiceDescriptor *svcs[] = {&qrl__learner__descriptor, &qrl__rollout__descriptor};
    size_t total = 0;
    for (int s = 0; s < 2; s++) {
        for (unsigned i = 0; i < svcs[s]->n_methods; i++, total++) {
            const ProtobufCMethodDescriptor *m = &svcs[s]->methods[i];
            char path[128];
            snprintf(path, sizeof path, "/%s/%s", svcs[s]->name, m->name);
            const qrl_rpc_method *r = qrl_rpc_method_find(path, strlen(path));
            cr_assert(r, "%s missing from rpc_paths.h", path);
            cr_assert_str_eq(r->path, path);
            cr_assert_eq(r->request, m->input, "%s request type", path);
            cr_assert_eq(r->response, m->output, "%s response type", path);
            cr_assert_eq(qrl_rpc_method_get(r->id), r);
        }
    }
    cr_assert_eq(total, QRL_RPC_COUNT_);
    /* streaming flags against the proto text (protoc-c descriptors do not carry them) */
    FILE *f = fopen("proto/qrl.proto", "r");
    cr_assert(f);
    char line[512], svc[64] = "";
    size_t rpcs = 0;
    while (fgets(line, sizeof line, f)) {
        char meth[64];
        if (sscanf(line, "service %63[A-Za-z]", svc) == 1) continue;
        if (sscanf(line, " rpc %63[A-Za-z](", meth) != 1) continue;
        char path[160];
        snprintf(path, sizeof path, "/qrl.%s/%s", svc, meth);
        const qrl_rpc_method *r = qrl_rpc_method_find(path, strlen(path));
        cr_assert(r, "%s", path);
        cr_assert_eq(r->server_stream, strstr(line, "returns (stream ") != NULL, "%s stream", path);
        rpcs++;
    }
    fclose(f);
    cr_assert_eq(rpcs, QRL_RPC_COUNT_);
    /* literal spot checks */
    const char *p = "/qrl.Learner/Register";
    const qrl_rpc_method *reg = qrl_rpc_method_find(p, strlen(p));
    cr_assert(reg && reg->request == &qrl__register_request__descriptor && reg->needs_token);
    const qrl_rpc_method *w = qrl_rpc_method_get(QRL_RPC_LEARNER_WATCH_VERSIONS);
    cr_assert_str_eq(w->path, "/qrl.Learner/WatchVersions");
    cr_assert(w->server_stream && w->response == &qrl__version_event__descriptor);
    cr_assert_not(qrl_rpc_method_get(QRL_RPC_ROLLOUT_STATUS)->needs_token);
    cr_assert_not(qrl_rpc_method_get(QRL_RPC_LEARNER_LIST_REPLICAS)->needs_token);
    cr_assert(qrl_rpc_method_get(QRL_RPC_ROLLOUT_SET)->needs_token);
    cr_assert_str_eq(qrl_rpc_method_get(QRL_RPC_ROLLOUT_DRAIN)->path, "/qrl.Rollout/Drain");
    cr_assert_null(qrl_rpc_method_find("/qrl.Learner/Reg", 16));
    cr_assert_null(qrl_rpc_method_find("/qrl.Learner/RegisterX", 22));
    cr_assert_null(qrl_rpc_method_find("/qrl.Rollout/Checkpoint", 23));
}

/* ---- round trips -------------------------------------------------------------------- */

Test(proto, round_trip_every_message_every_field) {
    for (size_t i = 0; i < qrl_wire_message_count(); i++) {
        const ProtobufCMessageDescriptor *d = qrl_wire_message_at(i);
        ProtobufCMessage *a = fill_new(d, (unsigned)i);
        size_t n;
        uint8_t *b = encode(a, &n);
        /* every field is non-default: proto3 writes exactly those */
        for (unsigned k = 0; k < d->n_fields; k++)
            cr_assert(has_field(b, n, d->fields[k].id), "%s.%s missing from the encoding",
                      d->short_name, d->fields[k].name);
        ProtobufCMessage *c = decode_ok(d, b, n);
        char diff[512] = "";
        cr_assert(msg_equal(a, c, diff, sizeof diff), "%s differs at %s", d->short_name, diff);
        cr_assert_eq(protobuf_c_message_get_packed_size(c), n);
        free(b);
        protobuf_c_message_free_unpacked(c, NULL);
        protobuf_c_message_free_unpacked(a, NULL);
    }
}

/* Changes one field of a decoded message in place (first element when repeated). */
static void mutate(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    char *p = (char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) p = *(char **)p;
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: (*(char **)p)[0] ^= 1; break;
    case PROTOBUF_C_TYPE_BYTES: ((ProtobufCBinaryData *)p)->data[0] ^= 1; break;
    case PROTOBUF_C_TYPE_MESSAGE: { /* change the nested message's first field */
        ProtobufCMessage *sub = *(ProtobufCMessage **)p;
        mutate(sub, &sub->descriptor->fields[0]);
        break;
    }
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)p = 0; break;
    case PROTOBUF_C_TYPE_ENUM: *(int *)p += 1000; break;
    default: p[0] ^= 1; break;
    }
}

/* The comparer itself: it must notice a change in any single field. */
Test(proto, compare_notices_each_field) {
    for (size_t i = 0; i < qrl_wire_message_count(); i++) {
        const ProtobufCMessageDescriptor *d = qrl_wire_message_at(i);
        ProtobufCMessage *a = fill_new(d, 5);
        size_t n;
        uint8_t *b = encode(a, &n);
        for (unsigned k = 0; k < d->n_fields; k++) {
            ProtobufCMessage *c = decode_ok(d, b, n);
            mutate(c, &d->fields[k]);
            char diff[512] = "", want[160];
            cr_assert_not(msg_equal(a, c, diff, sizeof diff), "%s.%s change unnoticed",
                          d->short_name, d->fields[k].name);
            snprintf(want, sizeof want, "%s.%s", d->short_name, d->fields[k].name);
            cr_assert(!strncmp(diff, want, strlen(want)), "diff '%s' does not name %s", diff, want);
            protobuf_c_message_free_unpacked(c, NULL);
        }
        free(b);
        protobuf_c_message_free_unpacked(a, NULL);
    }
}

/* A hand-written PromptGroup checked against literals, not against the filler. */
Test(proto, prompt_group_literal_round_trip) {
    Qrl__SamplingParams sp = QRL__SAMPLING_PARAMS__INIT;
    sp.temperature = 0.7f; sp.top_p = 0.9f; sp.top_k = 40; sp.max_new_tokens = 256; sp.seed = 1234567890123ull;
    uint32_t stop_ids[] = {2, 151643};
    char *stops[] = {"</answer>", "\n\nQ:"};
    sp.n_stop_token_ids = 2; sp.stop_token_ids = stop_ids; sp.n_stop_strings = 2; sp.stop_strings = stops;
    Qrl__DatasetPosition pos = QRL__DATASET_POSITION__INIT;
    pos.epoch = 3; pos.index = 7473; pos.source = "gsm8k/train.jsonl";
    uint32_t prompt[] = {151644, 872, 198, 3838, 374, 220, 17, 10, 18, 30};
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.group_id = 9000000001ull; pg.run_id = 0xfeedfacecafebeefull; pg.group_size = 8;
    pg.n_prompt_token_ids = 10; pg.prompt_token_ids = prompt;
    pg.prompt_text = "What is 2+3?"; pg.reference_answer = "5"; pg.task = "gsm8k";
    pg.sampling = &sp; pg.position = &pos; pg.dispatch_version = 41; pg.dispatched_unix_ms = 1732900000123ull;
    size_t n;
    uint8_t *b = encode(&pg.base, &n);
    Qrl__PromptGroup *d = (Qrl__PromptGroup *)decode_ok(&qrl__prompt_group__descriptor, b, n);
    cr_assert_eq(d->schema_version, 1);
    cr_assert_eq(d->group_id, 9000000001ull);
    cr_assert_eq(d->run_id, 0xfeedfacecafebeefull);
    cr_assert_eq(d->group_size, 8);
    cr_assert_eq(d->n_prompt_token_ids, 10);
    cr_assert_eq(d->prompt_token_ids[0], 151644);
    cr_assert_eq(d->prompt_token_ids[9], 30);
    cr_assert_str_eq(d->prompt_text, "What is 2+3?");
    cr_assert_str_eq(d->reference_answer, "5");
    cr_assert_str_eq(d->task, "gsm8k");
    cr_assert_eq(d->sampling->schema_version, 1); /* nested messages stamped too */
    cr_assert_eq(d->sampling->temperature, 0.7f);
    cr_assert_eq(d->sampling->top_p, 0.9f);
    cr_assert_eq(d->sampling->top_k, 40);
    cr_assert_eq(d->sampling->max_new_tokens, 256);
    cr_assert_eq(d->sampling->seed, 1234567890123ull);
    cr_assert_eq(d->sampling->n_stop_token_ids, 2);
    cr_assert_eq(d->sampling->stop_token_ids[1], 151643);
    cr_assert_eq(d->sampling->n_stop_strings, 2);
    cr_assert_str_eq(d->sampling->stop_strings[0], "</answer>");
    cr_assert_str_eq(d->sampling->stop_strings[1], "\n\nQ:");
    cr_assert_eq(d->position->epoch, 3);
    cr_assert_eq(d->position->index, 7473);
    cr_assert_str_eq(d->position->source, "gsm8k/train.jsonl");
    cr_assert_eq(d->dispatch_version, 41);
    cr_assert_eq(d->dispatched_unix_ms, 1732900000123ull);
    qrl_error e;
    cr_assert_eq(qrl_wire_prompt_group_validate(d, 151936, &e), QRL_OK, "%s", e.msg);
    /* the first bytes are the known protobuf encoding: field 1 = 1, field 2 = 9000000001 */
    const uint8_t head[] = {0x08, 0x01, 0x10, 0x81, 0xb4, 0xc4, 0xc3, 0x21};
    cr_assert_arr_eq(b, head, sizeof head);
    qrl_wire_free(&d->base);
    free(b);
}

/* A two-response GroupResult checked against literals, including NaN-free float bits. */
Test(proto, group_result_literal_round_trip) {
    uint32_t t0[] = {11, 12, 2}, t1[] = {13};
    float l0[] = {-0.5f, -1e-6f, -12.25f}, l1[] = {-3.0f};
    uint64_t v0[] = {40, 41, 41}, v1[] = {41};
    Qrl__Timings tm = QRL__TIMINGS__INIT;
    tm.queue_us = 5; tm.prefill_us = 1500; tm.decode_us = 90000; tm.verify_us = 70; tm.total_us = 91600;
    tm.started_unix_ms = 1732900000000ull; tm.finished_unix_ms = 1732900000092ull;
    Qrl__Response r0 = QRL__RESPONSE__INIT, r1 = QRL__RESPONSE__INIT;
    r0.n_token_ids = r0.n_behavior_logprobs = r0.n_token_versions = 3;
    r0.token_ids = t0; r0.behavior_logprobs = l0; r0.token_versions = v0;
    r0.finish_reason = QRL__FINISH_REASON__FINISH_REASON_EOS; r0.reward = 1.0f; r0.correct = 1;
    r0.extracted_answer = "5"; r0.text = "The answer is 5."; r0.reprefills = 1; r0.timings = &tm;
    r1.n_token_ids = r1.n_behavior_logprobs = r1.n_token_versions = 1;
    r1.token_ids = t1; r1.behavior_logprobs = l1; r1.token_versions = v1;
    r1.finish_reason = QRL__FINISH_REASON__FINISH_REASON_LENGTH; r1.reward = -0.5f;
    r1.sampling_truncated = 1; r1.truncated_tokens = 1; r1.restarts = 2;
    Qrl__Response *rs[] = {&r0, &r1};
    uint32_t prompt[] = {1, 2, 3};
    Qrl__GroupResult g = QRL__GROUP_RESULT__INIT;
    g.group_id = 42; g.run_id = 7; g.replica_id = "rollout-3"; g.group_size = 2;
    g.n_prompt_token_ids = 3; g.prompt_token_ids = prompt; g.n_responses = 2; g.responses = rs;
    g.timings = &tm; g.dispatch_version = 40; g.task = "arith"; g.chunk_count = 1;
    size_t n;
    uint8_t *b = encode(&g.base, &n);
    Qrl__GroupResult *d = (Qrl__GroupResult *)decode_ok(&qrl__group_result__descriptor, b, n);
    cr_assert_eq(d->group_id, 42);
    cr_assert_str_eq(d->replica_id, "rollout-3");
    cr_assert_eq(d->n_responses, 2);
    const Qrl__Response *a = d->responses[0], *c = d->responses[1];
    cr_assert_eq(a->schema_version, 1);
    cr_assert_eq(a->n_token_ids, 3);
    cr_assert_eq(a->token_ids[2], 2);
    cr_assert_eq(a->behavior_logprobs[0], -0.5f);
    cr_assert_eq(a->behavior_logprobs[1], -1e-6f);
    cr_assert_eq(a->behavior_logprobs[2], -12.25f);
    cr_assert_eq(a->token_versions[0], 40);
    cr_assert_eq(a->token_versions[2], 41);
    cr_assert_eq(a->finish_reason, QRL__FINISH_REASON__FINISH_REASON_EOS);
    cr_assert_eq(a->reward, 1.0f);
    cr_assert(a->correct);
    cr_assert_str_eq(a->text, "The answer is 5.");
    cr_assert_eq(a->timings->decode_us, 90000);
    cr_assert_eq(a->timings->finished_unix_ms, 1732900000092ull);
    cr_assert_eq(c->finish_reason, QRL__FINISH_REASON__FINISH_REASON_LENGTH);
    cr_assert_eq(c->reward, -0.5f);
    cr_assert(c->sampling_truncated);
    cr_assert_eq(c->truncated_tokens, 1);
    cr_assert_eq(c->restarts, 2);
    cr_assert_null(c->timings);
    cr_assert_eq(d->chunk_count, 1);
    cr_assert_eq(d->chunk_index, 0);
    qrl_error e;
    cr_assert_eq(qrl_wire_group_result_validate(d, 2, 100, &e), QRL_OK, "%s", e.msg);
    qrl_wire_free(&d->base);
    free(b);
}

/* ---- decode errors ------------------------------------------------------------------ */

static qrl_status decode_err(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n,
                             size_t max, qrl_error *e) {
    ProtobufCMessage *m = (ProtobufCMessage *)1;
    qrl_status st = qrl_wire_decode(d, b, n, max, &m, e);
    cr_assert_neq(st, QRL_OK, "%s decoded unexpectedly", d->short_name);
    cr_assert_null(m);
    cr_assert_eq(e->status, st);
    return st;
}

Test(proto, malformed_inputs_named) {
    qrl_error e;
    const ProtobufCMessageDescriptor *gr = &qrl__group_result__descriptor;
    cr_assert_eq(decode_err(gr, (const uint8_t *)"", 0, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: empty input");
    /* group_id (varint field 2) sent length-delimited */
    const uint8_t wt[] = {0x08, 0x01, 0x12, 0x01, 0x00};
    cr_assert_eq(decode_err(gr, wt, sizeof wt, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 2 (group_id): wire type 2, field type needs 0");
    /* varint of 11 bytes */
    const uint8_t lv[] = {0x08, 0x01, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    cr_assert_eq(decode_err(gr, lv, sizeof lv, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 2 (top level): group_id (field 2): varint longer than 10 bytes");
    /* groups (wire type 3) are not used */
    const uint8_t grp[] = {0x08, 0x01, 0x1b};
    cr_assert_eq(decode_err(gr, grp, sizeof grp, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 2 (top level): run_id (field 3): unsupported wire type 3");
    /* field number 0 */
    const uint8_t f0[] = {0x08, 0x01, 0x00, 0x00};
    cr_assert_eq(decode_err(gr, f0, sizeof f0, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 2 (top level): field number 0 out of range");
    /* packed floats of 7 bytes inside responses[0] */
    const uint8_t pf[] = {0x08, 0x01, 0x3a, 0x0b, 0x08, 0x01, 0x1a, 0x07, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(decode_err(gr, pf, sizeof pf, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 8 (responses[0].behavior_logprobs): packed length 7 is not a multiple of 4");
    /* a packed varint array ending mid-varint, and one with an 11-byte varint */
    const uint8_t pv[] = {0x08, 0x01, 0x3a, 0x05, 0x08, 0x01, 0x12, 0x01, 0x80};
    cr_assert_eq(decode_err(gr, pv, sizeof pv, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 8 (responses[0].token_ids): packed field ends inside a varint");
    const uint8_t pl[] = {0x08, 0x01, 0x32, 0x0c, 0x05, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    cr_assert_eq(decode_err(gr, pl, sizeof pl, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 5 (prompt_token_ids): varint longer than 10 bytes in packed field");
    /* a length running past the end, nested */
    const uint8_t le[] = {0x08, 0x01, 0x3a, 0x04, 0x08, 0x01, 0x12, 0x09};
    cr_assert_eq(decode_err(gr, le, sizeof le, 0, &e), QRL_STATUS_PARSE);
    cr_assert_str_eq(e.msg, "GroupResult: byte 6 (responses[0]): token_ids (field 2): length 9 runs past the end (0 bytes left)");
    /* over the caller's limit */
    cr_assert_eq(decode_err(gr, le, sizeof le, 4, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(e.msg, "GroupResult: 8 bytes exceed the limit of 4");
}

Test(proto, unknown_fields_are_accepted) {
    /* a newer writer's field 99 (varint) and field 100 (bytes) after known fields */
    const uint8_t b[] = {0x08, 0x01, 0x10, 0x2a, 0x98, 0x06, 0x05, 0xa2, 0x06, 0x02, 'h', 'i'};
    ProtobufCMessage *m = decode_ok(&qrl__group_result__descriptor, b, sizeof b);
    cr_assert_eq(((Qrl__GroupResult *)m)->group_id, 42);
    cr_assert_eq(m->n_unknown_fields, 2);
    qrl_wire_free(m);
}

Test(proto, schema_version_mismatch_refused) {
    qrl_error e;
    Qrl__PromptGroup pg = QRL__PROMPT_GROUP__INIT;
    pg.group_id = 5;
    uint8_t buf[64];
    size_t n;
    cr_assert_eq(qrl_wire_encode(&pg.base, buf, sizeof buf, &n, &e), QRL_OK);
    cr_assert_eq(pg.schema_version, QRL_WIRE_SCHEMA_VERSION);
    /* pack without stamping: a future writer's version 2, then a missing version */
    pg.schema_version = 2;
    n = protobuf_c_message_pack(&pg.base, buf);
    cr_assert_eq(decode_err(&qrl__prompt_group__descriptor, buf, n, 0, &e), QRL_STATUS_UNSUPPORTED);
    cr_assert_str_eq(e.msg, "PromptGroup: schema_version got 2, expected 1");
    pg.schema_version = 0;
    n = protobuf_c_message_pack(&pg.base, buf);
    cr_assert_eq(decode_err(&qrl__prompt_group__descriptor, buf, n, 0, &e), QRL_STATUS_UNSUPPORTED);
    cr_assert_str_eq(e.msg, "PromptGroup: schema_version got 0 (missing), expected 1");
    /* nested: the second response of a result */
    Qrl__Response r0 = QRL__RESPONSE__INIT, r1 = QRL__RESPONSE__INIT;
    Qrl__Response *rs[] = {&r0, &r1};
    Qrl__GroupResult g = QRL__GROUP_RESULT__INIT;
    g.group_id = 6; g.n_responses = 2; g.responses = rs;
    qrl_wire_stamp(&g.base);
    r1.schema_version = 3;
    uint8_t big[128];
    n = protobuf_c_message_pack(&g.base, big);
    cr_assert_eq(decode_err(&qrl__group_result__descriptor, big, n, 0, &e), QRL_STATUS_UNSUPPORTED);
    cr_assert_str_eq(e.msg, "GroupResult.responses[1]: schema_version got 3, expected 1");
}

Test(proto, encode_buffer_limits) {
    qrl_error e;
    Qrl__SetRequest s = QRL__SET_REQUEST__INIT;
    s.key = "rollout.max_staleness"; s.value = "2";
    size_t need = qrl_wire_encoded_size(&s.base);
    cr_assert_eq(need, 2 + 2 + 21 + 2 + 1);
    uint8_t buf[64];
    size_t n = 99;
    cr_assert_eq(qrl_wire_encode(&s.base, buf, need - 1, &n, &e), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(n, 0);
    cr_assert_str_eq(e.msg, "SetRequest: encoding needs 28 bytes, buffer holds 27");
    cr_assert_eq(qrl_wire_encode(&s.base, buf, need, &n, &e), QRL_OK);
    cr_assert_eq(n, need);
}

/* Every prefix of every message: refused with PARSE naming a byte, or (a cut exactly at a
 * field boundary, which protobuf cannot tell from a shorter message) decodes to a message
 * whose encoding is exactly that prefix. */
Test(proto, truncated_encodings_refused) {
    for (size_t i = 0; i < qrl_wire_message_count(); i++) {
        const ProtobufCMessageDescriptor *d = qrl_wire_message_at(i);
        ProtobufCMessage *a = fill_new(d, 3);
        size_t n;
        uint8_t *b = encode(a, &n);
        size_t refused = 0;
        for (size_t cut = 1; cut < n; cut++) {
            ProtobufCMessage *m;
            qrl_error e;
            qrl_status st = qrl_wire_decode(d, b, cut, 0, &m, &e);
            if (st != QRL_OK) {
                cr_assert_eq(st, QRL_STATUS_PARSE, "%s cut %zu: %s", d->short_name, cut, e.msg);
                cr_assert(strstr(e.msg, "byte ") && !strncmp(e.msg, d->short_name, strlen(d->short_name)),
                          "%s", e.msg);
                refused++;
                continue;
            }
            size_t n2;
            uint8_t *b2 = encode(m, &n2);
            cr_assert(n2 == cut && !memcmp(b, b2, cut), "%s cut %zu decoded to something else",
                      d->short_name, cut);
            free(b2);
            qrl_wire_free(m);
        }
        /* at most one boundary per top-level field can decode */
        cr_assert_geq((long)refused, (long)n - 1 - 3 * (long)d->n_fields, "%s", d->short_name);
        free(b);
        protobuf_c_message_free_unpacked(a, NULL);
    }
}

/* A hostile record of empty submessages must not make decode allocate ~100x its size. */
Test(proto, unpacked_size_bounded) {
    size_t n = 1u << 20;
    uint8_t *b = malloc(n);
    b[0] = 0x08; b[1] = 0x01;
    for (size_t i = 2; i + 1 < n; i += 2) { b[i] = 0x3a; b[i + 1] = 0x00; } /* responses {} */
    qrl_error e;
    cr_assert_eq(decode_err(&qrl__group_result__descriptor, b, n, n, &e), QRL_STATUS_PARSE);
    cr_assert(strstr(e.msg, "would unpack to more than 17825792 bytes"), "%s", e.msg);
    free(b);
}

/* ---- random and mutated bytes ------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64*, fixed seed: reproducible */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Decode, and on success validate and re-encode; returns 1 if it decoded. */
static int poke(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n) {
    ProtobufCMessage *m;
    qrl_error e;
    qrl_status st = qrl_wire_decode(d, b, n, 1u << 16, &m, &e);
    if (st != QRL_OK) {
        cr_assert(st == QRL_STATUS_PARSE || st == QRL_STATUS_UNSUPPORTED ||
                  st == QRL_STATUS_OUT_OF_RANGE, "%s", qrl_status_name(st));
        cr_assert(e.msg[0]);
        return 0;
    }
    if (d == &qrl__group_result__descriptor) qrl_wire_group_result_validate((void *)m, 0, 100, &e);
    if (d == &qrl__prompt_group__descriptor) qrl_wire_prompt_group_validate((void *)m, 100, &e);
    if (d == &qrl__trace_chunk__descriptor) qrl_wire_trace_chunk_validate((void *)m, &e);
    if (d == &qrl__weight_manifest__descriptor) qrl_wire_weight_manifest_validate((void *)m, &e);
    size_t n2;
    uint8_t *b2 = encode(m, &n2);
    free(b2);
    qrl_wire_free(m);
    return 1;
}

Test(proto, random_bytes_never_crash) {
    uint8_t buf[512];
    size_t ok = 0, total = 20000;
    for (size_t it = 0; it < total; it++) {
        size_t n = rnd() % sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
        if (n) buf[0] = 0x08, buf[1 % n] = 0x01; /* a valid version first, half the time */
        if (it & 1) buf[0] = (uint8_t)rnd();
        ok += poke(qrl_wire_message_at(rnd() % qrl_wire_message_count()), buf, n);
    }
    cr_assert_lt(ok, total); /* most random bytes are refused... */
}

Test(proto, mutated_encodings_never_crash) {
    size_t ok = 0, total = 0;
    for (size_t i = 0; i < qrl_wire_message_count(); i++) {
        const ProtobufCMessageDescriptor *d = qrl_wire_message_at(i);
        ProtobufCMessage *a = fill_new(d, 1);
        size_t n;
        uint8_t *b = encode(a, &n);
        uint8_t *c = malloc(n);
        for (int it = 0; it < 600; it++, total++) {
            memcpy(c, b, n);
            int flips = 1 + (int)(rnd() % 4);
            for (int k = 0; k < flips; k++) c[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            ok += poke(d, c, n);
        }
        free(c);
        free(b);
        protobuf_c_message_free_unpacked(a, NULL);
    }
    cr_assert_gt(ok, 0); /* ...while some mutated encodings still decode */
    cr_assert_lt(ok, total);
}
