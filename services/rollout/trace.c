/* qrl-rollout: producing a group's TRACE chunks (rollout.h; docs/rollout-daemon.md "TRACE
 * records"), with rollout.trace_fault's test-only faults. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/log.h"
#include "metrics.h"
#include "rollout.h"
#include "service/service.h"
#include "wire/wire.h"

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

static void st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* rollout.trace_fault nan_scale: response 1's chunk 0 gets E4M3 NaN (0x7F, what the
 * quantizer writes for a non-finite input) as its first block scale, with the record's CRC
 * and the response's response_crc32 (in each of its chunks) recomputed: chunks that pass
 * every CRC and join but cannot guide (trace.h).  g->trace's buffers are re-encoded. */
static void poison_nan_scale(rd_group *g) {
    size_t n = g->trace.count;
    Qrl__TraceChunk **c = calloc(n, sizeof *c);
    QRL_CHECK(c != NULL);
    for (size_t i = 0; i < n; i++) {
        ProtobufCMessage *m = NULL;
        QRL_CHECK(qrl_wire_decode(&qrl__trace_chunk__descriptor, g->trace.data[i], g->trace.len[i], 0, &m, NULL) ==
                  QRL_OK);
        c[i] = (Qrl__TraceChunk *)m;
    }
    uint32_t crc = 0, count = 0;
    for (uint32_t k = 0; k < n; k++) /* the response's records in chunk order */
        for (size_t i = 0; i < n; i++) {
            Qrl__TraceChunk *t = c[i];
            if (t->response_index != 1 || t->chunk_index != k) continue;
            uint8_t *r = t->record.data;
            if (k == 0 && t->record.len > 16) {
                uint32_t nt = t->token_count, ns = (uint32_t)t->n_site_ids;
                r[16 + 4 * (size_t)ns + 4 * (size_t)nt * ns] = 0x7F;
                st32(r + t->record.len - 4, qrl_crc32(0, r, t->record.len - 4));
            }
            crc = qrl_crc32(crc, r, t->record.len);
            count++;
        }
    for (size_t i = 0; i < n; i++) {
        if (count && c[i]->response_index == 1) {
            c[i]->response_crc32 = crc;
            free(g->trace.data[i]);
            QRL_CHECK(qrl_wire_encode_alloc(&c[i]->base, &g->trace.data[i], &g->trace.len[i], NULL) == QRL_OK);
        }
        qrl_wire_free(&c[i]->base);
    }
    free(c);
}

void rd_trace_produce(struct qrl_service *svc, const char *topic, int fault, rd_group *g, const char *key,
                      size_t klen) {
    size_t n = g->trace.count;
    if (!n) return;
    bool drop = fault == RD_TRACE_FAULT_DROP || fault == RD_TRACE_FAULT_MIX;
    bool dup = fault == RD_TRACE_FAULT_DUPLICATE || fault == RD_TRACE_FAULT_MIX;
    bool rev = fault == RD_TRACE_FAULT_REORDER || fault == RD_TRACE_FAULT_MIX;
    if (fault == RD_TRACE_FAULT_NAN_SCALE || fault == RD_TRACE_FAULT_MIX) poison_nan_scale(g);
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
