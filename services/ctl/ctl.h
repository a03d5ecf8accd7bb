/* qrlctl internals: printing protobuf-c messages as JSON, aligned "key value" lines and
 * tables, walking the message descriptors (so whatever a response carries is shown). */
#ifndef QRL_CTL_CTL_H
#define QRL_CTL_CTL_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "rpc/rpc.h"
#include "wire/wire.h"

/* Every field of `m` (schema_version left out) as a JSON object: enums by their short
 * name ("RUNNING"), uint64 above 2^63-1 as strings, bytes as hex, invalid UTF-8 as U+FFFD,
 * absent sub-messages as null.  New reference (json_decref); NULL on out-of-memory. */
json_t *ctl_message_json(const ProtobufCMessage *m);

/* Numeric and bool fields only, flattened with dotted names ("position.epoch"), as a JSON
 * object (metrics).  New reference. */
json_t *ctl_numeric_json(const ProtobufCMessage *m);

/* Print every field of `m` as "<indent><name>  <value>" lines, names aligned, nested
 * messages flattened with dots; numeric_only keeps numbers and bools. */
void ctl_print_fields(FILE *out, const ProtobufCMessage *m, const char *indent, bool numeric_only);

/* Short name of an enum value: the value's name without the prefix its UNSPECIFIED value
 * shares ("SERVICE_STATE_RUNNING" -> "RUNNING"); the number as text if unknown (buf). */
const char *ctl_enum_short(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t cap);

/* A text table: add rows of `ncol` cells (copied), then print with columns aligned. */
typedef struct ctl_table ctl_table;
ctl_table *ctl_table_new(int ncol);
void ctl_table_row(ctl_table *t, const char *const *cells);
void ctl_table_print(const ctl_table *t, FILE *out);
void ctl_table_free(ctl_table *t);

enum {
    EXIT_OK = 0,
    EXIT_USAGE = 1,       /* unknown command or option, missing argument */
    EXIT_REFUSED = 2,     /* the server refused: invalid, unknown, not changeable, permission */
    EXIT_UNREACHABLE = 3, /* no answer: connection refused, timeout, server busy (retriable) */
    EXIT_SERVER = 4,      /* the server failed or answered something unreadable */
    EXIT_LOCAL = 5,       /* token file or certificate unreadable here */
};

/* One invocation: the global options and the learner's client. */
typedef struct ctl {
    const char *learner;
    char token[QRL_RPC_TOKEN_MAX + 1];
    bool have_token;
    const char *tls_ca, *tls_cert, *tls_key, *tls_name;
    bool json;
    int timeout_ms;
    const char *reason;
    uint32_t drain_timeout_ms;
    bool checkpoint_first;
    qrl_rpc_client_t *lc; /* the learner's client */
} ctl;

/* session.c: the exit code of a failed call's status (see qrlctl --help). */
int ctl_exit_code(qrl_status st);
/* Report a failure on stderr (and as {"error": ...} on stdout with --json); returns `code`. */
int ctl_fail(const ctl *x, int code, qrl_status st, const char *msg);
/* ctl_fail with the exit code of err->status. */
int ctl_fail_err(const ctl *x, const qrl_error *err);
/* Print `o` indented on stdout and release it (steals the reference). */
void ctl_print_json(json_t *o);
/* A client of `target` (HOST:PORT) with x's token and TLS files; free with qrl_rpc_client_destroy. */
qrl_status ctl_client_for(const ctl *x, const char *target, qrl_rpc_client_t **out, qrl_error *err);
/* One unary call with x's deadline; *resp is freed with qrl_wire_free. */
qrl_status ctl_call(const ctl *x, qrl_rpc_client_t *c, qrl_rpc_id id, ProtobufCMessage *req,
                    ProtobufCMessage **resp, qrl_error *err);

/* replicas.c: Learner.ListReplicas (*out freed with qrl_wire_free). */
qrl_status ctl_list_replicas(const ctl *x, Qrl__ListReplicasResponse **out, qrl_error *err);
/* Client of replica `id`'s control service, its address looked up in the learner's list.
 * NOT_FOUND (listing the registered ids) when unknown, lost/stopped or without an address. */
qrl_status ctl_replica_client(const ctl *x, const char *id, qrl_rpc_client_t **out, qrl_error *err);
/* The replicas as an aligned table (ID HOST DEVICE PRECISION KV STATE VERSION SLOTS TOK/S HEARTBEAT). */
void ctl_print_replica_table(const ctl *x, const Qrl__ListReplicasResponse *l);
/* `qrlctl replicas`: the table, or the list as JSON; returns the exit code. */
int ctl_cmd_replicas(ctl *x);

#endif
