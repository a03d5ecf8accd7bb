/* qrlctl: operator CLI of a qrl cluster over gRPC (SPEC §1, §8; docs/qrlctl.md).
 *
 *   qrlctl [--learner HOST:PORT] [--token-file F] [--tls-ca F] [--json] [--timeout S]
 *          COMMAND [ARGS]
 *
 * Talks to the learner's control service; commands that name a replica look its control
 * address up in Learner.ListReplicas and call that replica's Rollout service.  Output is
 * aligned text, or one JSON object with --json.  Exit codes: see usage(). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "rpc/rpc.h"
#include "wire/wire.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: qrlctl [OPTIONS] COMMAND [ARGS]\n"
            "\n"
            "Operator CLI of a qrl cluster: calls the learner's gRPC control service (and, for\n"
            "commands naming a replica, that replica's control service).\n"
            "\n"
            "commands:\n"
            "  status                   learner state, version, step, throughput, and the replicas\n"
            "  replicas                 registered rollout replicas, one per line\n"
            "  pause [REPLICA]          stop the learner dispatching prompts, or pause one replica\n"
            "  resume [REPLICA]         resume the learner, or one replica\n"
            "  drain REPLICA            let a replica finish its work and take no more\n"
            "  checkpoint [TAG]         write a checkpoint now; prints its path\n"
            "  set KEY=VALUE [REPLICA]  change a run-time config key of the learner (or a replica)\n"
            "  metrics                  numeric metrics of the learner and of every replica\n"
            "  shutdown                 stop the learner (--checkpoint: write a checkpoint first)\n"
            "\n"
            "options:\n"
            "  --learner HOST:PORT      learner control address (default $QRL_LEARNER, else %s)\n"
            "  --token-file F           bearer token for mutating commands (default $%s,\n"
            "                           else the token in $%s)\n"
            "  --tls-ca F               PEM CA of the servers' certificates: use TLS\n"
            "  --tls-cert F, --tls-key F  client certificate and key (mutual TLS)\n"
            "  --tls-server-name NAME   name to check certificates against\n"
            "  --json                   print one JSON object (errors too: {\"error\": {...}})\n"
            "  --timeout S              deadline of each call in seconds (default 10)\n"
            "  --reason TEXT            reason logged by pause, resume and shutdown\n"
            "  --drain-timeout S        drain: abort what is left after S seconds (default none)\n"
            "  --checkpoint             shutdown: write a checkpoint before stopping\n"
            "  -h, --help               this text\n"
            "\n"
            "exit status:\n"
            "  0  done\n"
            "  1  usage error (unknown command or option, missing or malformed argument)\n"
            "  2  the server refused: invalid argument, unknown key or replica, key not\n"
            "     changeable at run time, missing or wrong token\n"
            "  3  unreachable or timed out (connection refused, deadline, server busy): retry\n"
            "  4  the server failed (internal error, unreadable response)\n"
            "  5  local error: token file or certificate unreadable\n",
            QRL_RPC_LEARNER_ADDR_DEFAULT, QRL_RPC_TOKEN_FILE_ENV, QRL_RPC_TOKEN_ENV);
}

/* A usage error: one line "qrlctl: error: ..." and exit 1, as every qrl program. */
static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "qrlctl: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see qrlctl --help)\n");
    return EXIT_USAGE;
}

/* ---- commands ----------------------------------------------------------------------- */

static int cmd_status(ctl *x) {
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp;
    qrl_error err;
    if (ctl_call(x, x->lc, QRL_RPC_LEARNER_STATUS, &rq.base, &resp, &err) != QRL_OK)
        return ctl_fail_err(x, &err);
    /* each replica's state and numbers too; a learner without ListReplicas shows none */
    Qrl__ListReplicasResponse *l = NULL;
    if (ctl_list_replicas(x, &l, &err) != QRL_OK) {
        if (err.status != QRL_STATUS_UNSUPPORTED) {
            qrl_wire_free(resp);
            return ctl_fail_err(x, &err);
        }
        l = NULL;
    }
    if (x->json) {
        json_t *o = ctl_message_json(resp);
        /* "replicas" is LearnerStatus's count, so the entries go under another name */
        if (l) {
            json_t *lj = ctl_message_json(&l->base), *arr = json_object_get(lj, "replicas");
            json_object_set_new(o, "replica_list", arr ? json_incref(arr) : json_array());
            json_decref(lj);
        }
        ctl_print_json(o);
    } else {
        printf("learner %s\n", x->learner);
        ctl_print_fields(stdout, resp, "  ", false);
        if (l) {
            printf("\n");
            ctl_print_replica_table(x, l);
        }
    }
    if (l) qrl_wire_free(&l->base);
    qrl_wire_free(resp);
    return EXIT_OK;
}

/* Print a ControlResponse from `who`. */
static void print_control(const ctl *x, const char *who, ProtobufCMessage *resp) {
    Qrl__ControlResponse *r = (Qrl__ControlResponse *)resp;
    if (x->json) {
        json_t *o = ctl_message_json(resp);
        json_object_set_new(o, "target", json_string(who));
        ctl_print_json(o);
        return;
    }
    char buf[32];
    printf("%s: %s%s%s\n", who, ctl_enum_short(&qrl__service_state__descriptor, (int)r->state, buf, sizeof buf),
           r->message && *r->message ? " - " : "", r->message ? r->message : "");
}

/* pause / resume, of the learner or of one replica */
static int cmd_pause_resume(ctl *x, bool pause, const char *replica) {
    Qrl__PauseRequest p = QRL__PAUSE_REQUEST__INIT;
    Qrl__ResumeRequest r = QRL__RESUME_REQUEST__INIT;
    p.reason = r.reason = (char *)x->reason;
    ProtobufCMessage *req = pause ? &p.base : &r.base, *resp;
    qrl_rpc_client_t *c = x->lc;
    qrl_error err;
    qrl_rpc_id id = pause ? QRL_RPC_LEARNER_PAUSE : QRL_RPC_LEARNER_RESUME;
    if (replica) {
        if (ctl_replica_client(x, replica, &c, &err) != QRL_OK) return ctl_fail_err(x, &err);
        id = pause ? QRL_RPC_ROLLOUT_PAUSE : QRL_RPC_ROLLOUT_RESUME;
    }
    qrl_status st = ctl_call(x, c, id, req, &resp, &err);
    if (c != x->lc) qrl_rpc_client_destroy(c);
    if (st != QRL_OK) return ctl_fail_err(x, &err);
    print_control(x, replica ? replica : "learner", resp);
    qrl_wire_free(resp);
    return EXIT_OK;
}

static int cmd_drain(ctl *x, const char *replica) {
    /* the RPC reads "" as every replica: never from a stray empty argument */
    if (!*replica) return usage_error("%s", "drain wants a replica id, got ''");
    Qrl__DrainRequest rq = QRL__DRAIN_REQUEST__INIT;
    rq.replica_id = (char *)replica;
    rq.timeout_ms = x->drain_timeout_ms;
    ProtobufCMessage *resp;
    qrl_error err;
    if (ctl_call(x, x->lc, QRL_RPC_LEARNER_DRAIN, &rq.base, &resp, &err) != QRL_OK)
        return ctl_fail_err(x, &err);
    print_control(x, replica, resp);
    qrl_wire_free(resp);
    return EXIT_OK;
}

static int cmd_checkpoint(ctl *x, const char *tag) {
    Qrl__CheckpointRequest rq = QRL__CHECKPOINT_REQUEST__INIT;
    rq.tag = (char *)(tag ? tag : "");
    ProtobufCMessage *resp;
    qrl_error err;
    if (ctl_call(x, x->lc, QRL_RPC_LEARNER_CHECKPOINT, &rq.base, &resp, &err) != QRL_OK)
        return ctl_fail_err(x, &err);
    Qrl__CheckpointResponse *r = (Qrl__CheckpointResponse *)resp;
    if (x->json) ctl_print_json(ctl_message_json(resp));
    else printf("checkpoint %s step %llu version %llu\n", r->path, (unsigned long long)r->step,
                (unsigned long long)r->version);
    qrl_wire_free(resp);
    return EXIT_OK;
}

static int cmd_set(ctl *x, const char *assignment, const char *replica) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) return usage_error("set wants KEY=VALUE, got '%s'", assignment);
    char *key = strndup(assignment, (size_t)(eq - assignment));
    QRL_CHECK(key);
    Qrl__SetRequest rq = QRL__SET_REQUEST__INIT;
    rq.key = key;
    rq.value = (char *)eq + 1;
    qrl_rpc_client_t *c = x->lc;
    qrl_error err;
    ProtobufCMessage *resp = NULL;
    qrl_status st = replica ? ctl_replica_client(x, replica, &c, &err) : QRL_OK;
    if (st == QRL_OK)
        st = ctl_call(x, c, replica ? QRL_RPC_ROLLOUT_SET : QRL_RPC_LEARNER_SET, &rq.base, &resp, &err);
    if (c != x->lc) qrl_rpc_client_destroy(c);
    free(key);
    if (st != QRL_OK) return ctl_fail_err(x, &err);
    Qrl__SetResponse *r = (Qrl__SetResponse *)resp;
    if (x->json) {
        json_t *o = ctl_message_json(resp);
        json_object_set_new(o, "target", json_string(replica ? replica : "learner"));
        ctl_print_json(o);
    } else {
        printf("%s: %s = %s (was %s)\n", replica ? replica : "learner", r->key, r->new_value,
               r->old_value);
    }
    qrl_wire_free(resp);
    return EXIT_OK;
}

static int cmd_metrics(ctl *x) {
    Qrl__StatusRequest rq = QRL__STATUS_REQUEST__INIT;
    ProtobufCMessage *status;
    Qrl__ListReplicasResponse *l;
    qrl_error err;
    if (ctl_call(x, x->lc, QRL_RPC_LEARNER_STATUS, &rq.base, &status, &err) != QRL_OK)
        return ctl_fail_err(x, &err);
    if (ctl_list_replicas(x, &l, &err) != QRL_OK) {
        qrl_wire_free(status);
        return ctl_fail_err(x, &err);
    }
    if (x->json) {
        json_t *reps = json_object();
        for (size_t i = 0; i < l->n_replicas; i++) {
            const Qrl__ReplicaEntry *e = l->replicas[i];
            if (e->info && e->info->id && e->status)
                json_object_set_new(reps, e->info->id, ctl_numeric_json(&e->status->base));
        }
        ctl_print_json(json_pack("{s:o,s:o}", "learner", ctl_numeric_json(status), "replicas", reps));
    } else {
        printf("learner %s\n", x->learner);
        ctl_print_fields(stdout, status, "  ", true);
        for (size_t i = 0; i < l->n_replicas; i++) {
            const Qrl__ReplicaEntry *e = l->replicas[i];
            if (!e->info || !e->status) continue;
            printf("replica %s\n", e->info->id);
            ctl_print_fields(stdout, &e->status->base, "  ", true);
        }
    }
    qrl_wire_free(status);
    qrl_wire_free(&l->base);
    return EXIT_OK;
}

static int cmd_shutdown(ctl *x) {
    Qrl__ShutdownRequest rq = QRL__SHUTDOWN_REQUEST__INIT;
    rq.checkpoint_first = x->checkpoint_first;
    rq.reason = (char *)x->reason;
    ProtobufCMessage *resp;
    qrl_error err;
    if (ctl_call(x, x->lc, QRL_RPC_LEARNER_SHUTDOWN, &rq.base, &resp, &err) != QRL_OK)
        return ctl_fail_err(x, &err);
    print_control(x, "learner", resp);
    qrl_wire_free(resp);
    return EXIT_OK;
}

/* ---- main --------------------------------------------------------------------------- */

static bool parse_seconds(const char *s, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > max) return false;
    *out = v;
    return true;
}

/* Commands and how many positional arguments each takes. */
static const struct {
    const char *name;
    int min_args, max_args;
} commands[] = {
    {"status", 0, 0},   {"replicas", 0, 0}, {"pause", 0, 1},      {"resume", 0, 1},
    {"drain", 1, 1},    {"checkpoint", 0, 1}, {"set", 1, 2},      {"metrics", 0, 0},
    {"shutdown", 0, 0},
};

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"learner", required_argument, NULL, 'l'},  {"token-file", required_argument, NULL, 't'},
        {"tls-ca", required_argument, NULL, 'c'},   {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},  {"tls-server-name", required_argument, NULL, 'N'},
        {"json", no_argument, NULL, 'j'},           {"timeout", required_argument, NULL, 'T'},
        {"reason", required_argument, NULL, 'r'},   {"drain-timeout", required_argument, NULL, 'D'},
        {"checkpoint", no_argument, NULL, 'k'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    ctl x = {.timeout_ms = 10000, .reason = "qrlctl"};
    const char *env_learner = getenv("QRL_LEARNER");
    x.learner = env_learner && *env_learner ? env_learner : QRL_RPC_LEARNER_ADDR_DEFAULT;
    const char *token_file = NULL;
    double secs;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'l': x.learner = optarg; break;
        case 't': token_file = optarg; break;
        case 'c': x.tls_ca = optarg; break;
        case 'C': x.tls_cert = optarg; break;
        case 'K': x.tls_key = optarg; break;
        case 'N': x.tls_name = optarg; break;
        case 'j': x.json = true; break;
        case 'r': x.reason = optarg; break;
        case 'k': x.checkpoint_first = true; break;
        case 'T':
            if (!parse_seconds(optarg, 3600, &secs))
                return usage_error("--timeout wants seconds in (0, 3600], got '%s'", optarg);
            x.timeout_ms = (int)ceil(secs * 1000);
            break;
        case 'D':
            if (!parse_seconds(optarg, 86400, &secs))
                return usage_error("--drain-timeout wants seconds in (0, 86400], got '%s'", optarg);
            x.drain_timeout_ms = (uint32_t)ceil(secs * 1000);
            break;
        case 'h': usage(stdout); return EXIT_OK;
        case ':': return usage_error("option '%s' needs a value", argv[optind - 1]);
        default: return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) return usage_error("%s", "no command given");
    const char *cmd = argv[optind];
    int nargs = argc - optind - 1;
    char **args = argv + optind + 1;
    size_t ci = 0, ncmd = sizeof commands / sizeof *commands;
    while (ci < ncmd && strcmp(commands[ci].name, cmd) != 0) ci++;
    if (ci == ncmd) return usage_error("unknown command '%s'", cmd);
    if (nargs < commands[ci].min_args || nargs > commands[ci].max_args)
        return usage_error("wrong number of arguments for '%s'", cmd);

    qrl_error err;
    if (qrl_rpc_token_resolve(token_file, x.token, &x.have_token, &err) != QRL_OK)
        return ctl_fail(&x, EXIT_LOCAL, err.status, err.msg);
    if (ctl_client_for(&x, x.learner, &x.lc, &err) != QRL_OK)
        return ctl_fail(&x, err.status == QRL_STATUS_INVALID_ARGUMENT ? EXIT_USAGE : EXIT_LOCAL,
                    err.status, err.msg);

    int rc;
    const char *a0 = nargs > 0 ? args[0] : NULL, *a1 = nargs > 1 ? args[1] : NULL;
    if (strcmp(cmd, "status") == 0) rc = cmd_status(&x);
    else if (strcmp(cmd, "replicas") == 0) rc = ctl_cmd_replicas(&x);
    else if (strcmp(cmd, "pause") == 0) rc = cmd_pause_resume(&x, true, a0);
    else if (strcmp(cmd, "resume") == 0) rc = cmd_pause_resume(&x, false, a0);
    else if (strcmp(cmd, "drain") == 0) rc = cmd_drain(&x, a0);
    else if (strcmp(cmd, "checkpoint") == 0) rc = cmd_checkpoint(&x, a0);
    else if (strcmp(cmd, "set") == 0) rc = cmd_set(&x, a0, a1);
    else if (strcmp(cmd, "metrics") == 0) rc = cmd_metrics(&x);
    else rc = cmd_shutdown(&x);
    qrl_rpc_client_destroy(x.lc);
    return rc;
}
