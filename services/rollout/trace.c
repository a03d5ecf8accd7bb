/* qrl-rollout: producing a group's TRACE chunks (rollout.h; docs/rollout-daemon.md "TRACE
 * records"), with rollout.trace_fault's test-only faults. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "metrics.h"
#include "rollout.h"
#include "service/service.h"

uint64_t rd_trace_msg_bytes(const rd_group *g) {
    uint64_t b = 0;
    for (size_t i = 0; i < g->trace.count; i++) b += g->trace.len[i];
    return b;
}

void rd_trace_count(rd_metrics_trace *t, const rd_group *g) {
    if (g->trace_failed) return; /* given up (deliver.c): counted in t->failed */
    t->chunks += g->trace.count;
    t->bytes += rd_trace_msg_bytes(g);
    t->record_bytes += g->trace_record_bytes;
    t->tokens += g->trace_tokens;
}

void rd_trace_jsonl(FILE *f, const rd_group *g, rd_metrics_trace *t, rd_engine *e, uint64_t now_us) {
    rd_engine_stats st;
    rd_engine_get_stats(e, &st);
    double secs = now_us > t->start_us ? (double)(now_us - t->start_us) / 1e6 : 0;
    t->capture_share = st.sched.forward_us ? (double)st.sched.trace_capture_us / (double)st.sched.forward_us : 0;
    fprintf(f, ",\"trace_chunks\":%zu,\"trace_bytes\":%" PRIu64 ",\"trace_bytes_per_token\":%.6g"
               ",\"trace_bytes_per_s\":%.6g,\"trace_capture_share\":%.6g,\"trace_failed\":%zu",
            g->trace_failed ? 0 : g->trace.count, g->trace_failed ? 0 : rd_trace_msg_bytes(g), qrl_trace_metric_bytes_per_token(g->trace_record_bytes, g->trace_tokens),
            secs > 0 ? (double)t->bytes / secs : 0, t->capture_share,
            g->trace_failed && g->result ? g->result->n_responses : 0);
    fputs("}\n", f);
}

void rd_trace_produce(struct qrl_service *svc, const char *topic, int fault, rd_group *g, const char *key,
                      size_t klen) {
    size_t n = g->trace.count;
    if (!n) return;
    bool drop = fault == RD_TRACE_FAULT_DROP || fault == RD_TRACE_FAULT_MIX;
    bool dup = fault == RD_TRACE_FAULT_DUPLICATE || fault == RD_TRACE_FAULT_MIX;
    bool rev = fault == RD_TRACE_FAULT_REORDER || fault == RD_TRACE_FAULT_MIX;
    uint8_t **pl = malloc(2 * n * sizeof *pl);
    size_t *ln = malloc(2 * n * sizeof *ln), m = 0;
    QRL_CHECK(pl && ln);
    for (size_t k = 0; k < n; k++) {
        size_t i = rev ? n - 1 - k : k;
        if (drop && i == 0) continue;
        for (int c = 0; c < (dup ? 2 : 1); c++) pl[m] = g->trace.data[i], ln[m++] = g->trace.len[i];
    }
    if (m) {
        g->sets_unacked++;
        qrl_service_produce(svc, topic, key, klen, pl, ln, m, false, g);
    }
    free(pl);
    free(ln);
}
