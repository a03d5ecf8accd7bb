/* qrl-learner control (control.c; docs/learner-daemon.md "Control", "Membership"): the
 * Learner gRPC handlers (Register, Heartbeat, WatchVersions, Status, Pause, Resume, Set,
 * ListReplicas, Drain), the membership table (learner/members.h) and the VersionEvents
 * sent down the replicas' WatchVersions streams. */
#ifndef QRL_LD_CONTROL_H
#define QRL_LD_CONTROL_H

#include "daemon.h"

/* Replicas on this node (qrl_wipc_node_id) take versions by CUDA IPC: call once at setup
 * when the learner publishes on the device. */
void ld_control_set_node(const char *node_id);
/* Register the handlers above on `rpc` (user = the core). */
void ld_control_handle(ld_core *c, qrl_rpc_server_t *rpc);
/* The service state the handlers and metrics report. */
Qrl__ServiceState ld_service_state(const ld_core *c);
/* Answer a control call with the service state and `msg`. */
void ld_control_reply(const ld_core *c, qrl_rpc_call_t *call, const char *msg);
/* Send a `kind` event (c->version) to every replica watching. */
void ld_control_announce(ld_core *c, Qrl__VersionEventKind kind);
/* A new version is on the weight server: plan its transport (NCCL group of the watching
 * replicas), announce it, start the NCCL broadcast.  ipc_handle: the device slot the
 * version was published in (CUDA IPC for replicas on this node), or NULL. */
void ld_control_publish_version(ld_core *c, const uint8_t ipc_handle[64]);
/* Each tick: a failed NCCL broadcast of the current version is announced again (over TCP). */
void ld_control_nccl_fallback(ld_core *c);
/* Each tick, last: silent replicas are marked lost, the metrics endpoint gets the loop's
 * gauges. */
void ld_control_tick(ld_core *c);
/* The close chain began: the RPC server cancels the streams (forget them). */
void ld_control_closing(void);
void ld_control_free(void);

#endif
