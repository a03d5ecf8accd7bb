/* qrl-learner control (control.c; docs/learner-daemon.md "Control", "Membership"): the
 * Learner gRPC handlers of its own (Register, Heartbeat, WatchVersions, ListReplicas,
 * Drain; the shell serves Status, Pause, Resume and Set through the two calls below), the
 * membership table (learner/members.h) and the VersionEvents sent down the replicas'
 * WatchVersions streams. */
#ifndef QRL_LD_CONTROL_H
#define QRL_LD_CONTROL_H

#include "daemon.h"

/* Replicas on this node (qrl_wipc_node_id) take versions by CUDA IPC: call once at setup
 * when the learner publishes on the device. */
void ld_control_set_node(const char *node_id);
/* Route the handlers above through the shell (before qrl_service_start; user = the core). */
void ld_control_handle(ld_core *c, qrl_service_t *svc);
/* The service state the shell, the handlers and metrics report. */
Qrl__ServiceState ld_service_state(const ld_core *c);
/* Learner.Status (the shell's status callback): reply on `call`. */
void ld_control_status(ld_core *c, qrl_rpc_call_t *call);
/* Learner.Pause / Resume (the shell's pause callback): dispatch stops or goes on (groups in
 * flight are still trained); returns the ControlResponse message. */
const char *ld_control_pause(ld_core *c, bool pause);
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
/* Free the membership table's copies. */
void ld_control_free(void);

#endif
