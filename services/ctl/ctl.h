/* qrlctl internals: printing protobuf-c messages as JSON, aligned "key value" lines and
 * tables, walking the message descriptors (so whatever a response carries is shown). */
#ifndef QRL_CTL_CTL_H
#define QRL_CTL_CTL_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdio.h>

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

#endif
