/* Shared by the rpc server and client (not a public header). */
#ifndef QRL_RPC_INTERNAL_H
#define QRL_RPC_INTERNAL_H

#include <grpc/grpc.h>
#include <stddef.h>

#include "core/status.h"

/* grpc_init() once per user (server or client), with gRPC's own log routed into
 * QRL_LOG (tag "grpc").  Pair with grpc_shutdown(). */
void qrl_rpc_grpc_init_(void);

/* Whole file as a NUL-terminated malloc'd string (PEM files), at most 1 MiB.
 * `what` names the option in messages ("tls_cert_file").  Errors: NOT_FOUND, IO,
 * OUT_OF_RANGE. */
qrl_status qrl_rpc_read_pem_(const char *path, const char *what, char **out, qrl_error *err);

/* Check the characters of a token (printable ASCII, no space), 1..QRL_RPC_TOKEN_MAX long;
 * `origin` names where it came from.  INVALID_ARGUMENT otherwise. */
qrl_status qrl_rpc_token_check_(const char *tok, const char *origin, qrl_error *err);

/* Monotonic deadline `ms` from now. */
gpr_timespec qrl_rpc_deadline_(int ms);

#endif
