/* qrlctl: the replicas registered with the learner (Learner.ListReplicas): the table
 * `qrlctl replicas` and `qrlctl status` print, and the client of one replica's Rollout
 * control service, found by its id (ctl.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

qrl_status ctl_list_replicas(const ctl *x, Qrl__ListReplicasResponse **out, qrl_error *err) {
    Qrl__ListReplicasRequest rq = QRL__LIST_REPLICAS_REQUEST__INIT;
    return ctl_call(x, x->lc, QRL_RPC_LEARNER_LIST_REPLICAS, &rq.base, (ProtobufCMessage **)out, err);
}

/* Client of replica `id`'s control service, found through the learner. */
qrl_status ctl_replica_client(const ctl *x, const char *id, qrl_rpc_client_t **out,
                                 qrl_error *err) {
    Qrl__ListReplicasResponse *l;
    QRL_TRY(ctl_list_replicas(x, &l, err));
    char known[256] = "";
    const char *addr = NULL;
    bool lost = false;
    for (size_t i = 0; i < l->n_replicas; i++) {
        const Qrl__ReplicaInfo *info = l->replicas[i]->info;
        if (!info || !info->id) continue;
        if (strcmp(info->id, id) == 0) {
            addr = info->control_addr;
            const Qrl__RolloutStatus *st = l->replicas[i]->status;
            lost = st && (st->state == QRL__SERVICE_STATE__SERVICE_STATE_LOST ||
                          st->state == QRL__SERVICE_STATE__SERVICE_STATE_STOPPED);
        }
        size_t n = strlen(known);
        snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", info->id);
    }
    qrl_status st;
    if (!addr)
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                           "replica '%s' is not registered with the learner at %s (registered: %s)",
                           id, x->learner, *known ? known : "none");
    else if (lost) /* refused here: its address answers nothing (or someone else) */
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                           "replica '%s' is lost or stopped (no heartbeat within the learner's timeout)", id);
    else if (!*addr)
        st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "replica '%s' has no control address", id);
    else
        st = ctl_client_for(x, addr, out, err);
    qrl_wire_free(&l->base);
    return st;
}

static void heartbeat_age(uint64_t unix_ms, char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    if (!unix_ms) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.1fs ago", unix_ms > now ? 0.0 : (double)(now - unix_ms) / 1000);
}

void ctl_print_replica_table(const ctl *x, const Qrl__ListReplicasResponse *l) {
    if (l->n_replicas == 0) {
        printf("no replicas registered with %s\n", x->learner);
    } else {
        ctl_table *t = ctl_table_new(10);
        const char *head[10] = {"ID", "HOST", "DEVICE", "PRECISION", "KV", "STATE", "VERSION",
                                "SLOTS", "TOK/S", "HEARTBEAT"};
        ctl_table_row(t, head);
        for (size_t i = 0; i < l->n_replicas; i++) {
            const Qrl__ReplicaEntry *e = l->replicas[i];
            const Qrl__ReplicaInfo *in = e->info;
            const Qrl__RolloutStatus *s = e->status;
            char num[16], version[24] = "-", slots[32] = "-", tps[32] = "-", hb[32];
            const char *state = "-";
            if (s) {
                state = ctl_enum_short(&qrl__service_state__descriptor, (int)s->state, num,
                                       sizeof num);
                snprintf(version, sizeof version, "%llu", (unsigned long long)s->version);
                /* a drained replica that exited (STOPPED) uses no slots and makes no tokens:
                 * its last status's would mislead */
                if (s->state != QRL__SERVICE_STATE__SERVICE_STATE_STOPPED) {
                    snprintf(slots, sizeof slots, "%u/%u", s->slots_in_use, s->slots_total);
                    snprintf(tps, sizeof tps, "%.1f", s->tokens_per_s);
                }
            }
            heartbeat_age(e->last_heartbeat_unix_ms, hb, sizeof hb);
            const char *row[10] = {in ? in->id : "?", in ? in->host : "", in ? in->device : "",
                                   in ? in->precision : "", in ? in->kv_format : "", state,
                                   version, slots, tps, hb};
            ctl_table_row(t, row);
        }
        ctl_table_print(t, stdout);
        ctl_table_free(t);
    }
}

int ctl_cmd_replicas(ctl *x) {
    Qrl__ListReplicasResponse *l;
    qrl_error err;
    if (ctl_list_replicas(x, &l, &err) != QRL_OK) return ctl_fail_err(x, &err);
    if (x->json) ctl_print_json(ctl_message_json(&l->base));
    else ctl_print_replica_table(x, l);
    qrl_wire_free(&l->base);
    return EXIT_OK;
}
