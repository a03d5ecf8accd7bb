/* gRPC method table of qrl's control plane (SPEC §8, proto/qrl.proto services).
 *
 * protoc-c generates no gRPC code, so the daemons use gRPC C core directly: the server
 * matches the call's method path against this table, decodes the request with
 * qrl_wire_decode(request descriptor) and answers with the response type; the client
 * builds calls from the same paths.  One table, so paths, types and the token rule cannot
 * drift apart (tests/unit/test_proto.c checks it against the generated service
 * descriptors). */
#ifndef QRL_WIRE_RPC_PATHS_H
#define QRL_WIRE_RPC_PATHS_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

/* X(ID, service, method, request type, response type, server_stream, needs_token)
 * Types are the snake-case message names (descriptor qrl__<type>__descriptor).
 * server_stream: the response is a stream of messages (WatchVersions).
 * needs_token: the call changes state or membership and requires the bearer token;
 * read-only calls (Status, ListReplicas) do not. */
#define QRL_RPC_TABLE(X)                                                                         \
    X(LEARNER_REGISTER,       Learner, Register,      register_request,       register_response,      false, true)  \
    X(LEARNER_HEARTBEAT,      Learner, Heartbeat,     heartbeat_request,      heartbeat_response,     false, true)  \
    X(LEARNER_WATCH_VERSIONS, Learner, WatchVersions, watch_versions_request, version_event,          true,  true)  \
    X(LEARNER_STATUS,         Learner, Status,        status_request,         learner_status,         false, false) \
    X(LEARNER_PAUSE,          Learner, Pause,         pause_request,          control_response,       false, true)  \
    X(LEARNER_RESUME,         Learner, Resume,        resume_request,         control_response,       false, true)  \
    X(LEARNER_CHECKPOINT,     Learner, Checkpoint,    checkpoint_request,     checkpoint_response,    false, true)  \
    X(LEARNER_SET,            Learner, Set,           set_request,            set_response,           false, true)  \
    X(LEARNER_LIST_REPLICAS,  Learner, ListReplicas,  list_replicas_request,  list_replicas_response, false, false) \
    X(LEARNER_DRAIN,          Learner, Drain,         drain_request,          control_response,       false, true)  \
    X(LEARNER_SHUTDOWN,       Learner, Shutdown,      shutdown_request,       control_response,       false, true)  \
    X(ROLLOUT_STATUS,         Rollout, Status,        status_request,         rollout_status,         false, false) \
    X(ROLLOUT_PAUSE,          Rollout, Pause,         pause_request,          control_response,       false, true)  \
    X(ROLLOUT_RESUME,         Rollout, Resume,        resume_request,         control_response,       false, true)  \
    X(ROLLOUT_DRAIN,          Rollout, Drain,         drain_request,          control_response,       false, true)  \
    X(ROLLOUT_SET,            Rollout, Set,           set_request,            set_response,           false, true)

typedef enum qrl_rpc_id {
#define QRL_X_(id, svc, method, req, resp, stream, token) QRL_RPC_##id,
    QRL_RPC_TABLE(QRL_X_)
#undef QRL_X_
    QRL_RPC_COUNT_
} qrl_rpc_id;

typedef struct qrl_rpc_method {
    qrl_rpc_id id;
    const char *path;    /* "/qrl.Learner/Register": the gRPC :path */
    const char *service; /* "qrl.Learner" */
    const char *method;  /* "Register" */
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *response;
    bool server_stream;
    bool needs_token;
} qrl_rpc_method;

/* Entry of `id` (id < QRL_RPC_COUNT_); static storage. */
const qrl_rpc_method *qrl_rpc_method_get(qrl_rpc_id id);
/* Entry whose path equals path[0..len) (gRPC hands the path as a slice), or NULL. */
const qrl_rpc_method *qrl_rpc_method_find(const char *path, size_t len);

#endif
