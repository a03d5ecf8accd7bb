/* TRACE recording on the rollout side and its decoded form on the learner side (SPEC §6;
 * the record format and guided rounding are kernels/cpu/trace.h's).
 *
 * Captured sites.  When the rollout precision is w4a4-nvfp4 every linear layer's input
 * row is NVFP4-quantized per token (model/linear.h), and with the fp4 KV cache every K and
 * V head vector is (model/kv_cache.h).  A site is one such per-token vector:
 *   kind      vector                                   elements     per layer
 *   attn_in   input_layernorm output (Q, K, V read it) dim          1
 *   k         K of one KV head after RoPE (the write)  head_dim     n_kv_heads
 *   v         V of one KV head (the write)             head_dim     n_kv_heads
 *   attn_out  attention output (O reads it)            n_heads*hd   1
 *   mlp_in    post_attention_layernorm output          dim          1
 *   mlp_down  silu(gate) * up (down reads it)          hidden_dim   1
 * Site id (TraceChunk.site_ids): layer << 16 | kind << 12 | head (head 0 except k, v);
 * ids increase in execution order, so a record's sites are sorted by id.  Sites whose
 * vectors are not FP4 in the running configuration are dropped (no k/v without the fp4
 * KV cache).
 *
 * Site spec (config text, qrl_trace_sites_parse): clauses separated by ';', each a
 * comma list of `layers=RANGE` and `sites=KIND[,KIND...]` (the kind list runs until the
 * next key):  RANGE = A | A-B (inclusive, 0-based) | all | deep (the deeper half,
 * layers [n_layers/2, n_layers)); a missing key means all layers / all kinds.  The union
 * of the clauses is captured.  White space around clauses, items, keys and values is
 * ignored ("layers=deep, sites=mlp_in; layers=0").  "default" (or an empty spec) is the
 * issue's default:
 *   layers=all,sites=attn_in,attn_out,mlp_in,mlp_down;layers=deep,sites=k,v
 *
 * Which records a response has (alignment).  Record k of a response belongs to the
 * forward row that produced the distribution response token k was sampled from: the
 * last prompt position's prefill row for k = 0, the decode row that fed token k - 1
 * for k >= 1 (so record k sits beside behavior log-prob k).  After a weight swap the
 * scheduler re-prefills prompt + kept tokens: the kept tokens keep the records of the
 * forward that sampled them (their behavior log-probs came from it); only the
 * re-prefill's last row is recorded, as record n_kept (the next token's).  A staleness
 * restart drops the records with the tokens.  So records always number the kept tokens.
 *
 * Costs: nothing when no recorder is attached (one NULL test per site and pass, no
 * allocation); with one, per token 4 + ceil(n/16) + ceil(n/8) bytes per site of n
 * elements (trace.h), buffers allocated when a response is submitted. */
#ifndef QRL_MODEL_TRACE_REC_H
#define QRL_MODEL_TRACE_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "cpu/trace.h"
#include "model/config.h"

typedef enum qrl_trace_site_kind {
    QRL_TRACE_SITE_ATTN_IN = 0,
    QRL_TRACE_SITE_K,
    QRL_TRACE_SITE_V,
    QRL_TRACE_SITE_ATTN_OUT,
    QRL_TRACE_SITE_MLP_IN,
    QRL_TRACE_SITE_MLP_DOWN,
    QRL_TRACE_SITE_KIND_COUNT_
} qrl_trace_site_kind;

#define QRL_TRACE_KINDS_ALL ((1u << QRL_TRACE_SITE_KIND_COUNT_) - 1)
#define QRL_TRACE_KINDS_LINEAR                                                              \
    (1u << QRL_TRACE_SITE_ATTN_IN | 1u << QRL_TRACE_SITE_ATTN_OUT |                         \
     1u << QRL_TRACE_SITE_MLP_IN | 1u << QRL_TRACE_SITE_MLP_DOWN)
#define QRL_TRACE_KINDS_KV (1u << QRL_TRACE_SITE_K | 1u << QRL_TRACE_SITE_V)

/* "attn_in", "k", "v", "attn_out", "mlp_in", "mlp_down"; "?" otherwise.  Static. */
const char *qrl_trace_site_kind_name(qrl_trace_site_kind k);

static inline uint32_t qrl_trace_site_id(int layer, qrl_trace_site_kind kind, int head) {
    return (uint32_t)layer << 16 | (uint32_t)kind << 12 | (uint32_t)head;
}

/* ---- site spec ----------------------------------------------------------------------- */

#define QRL_TRACE_SITES_MAX_CLAUSES 8
#define QRL_TRACE_LAYERS_ALL (-1)  /* clause.first: every layer */
#define QRL_TRACE_LAYERS_DEEP (-2) /* clause.first: [n_layers / 2, n_layers) */

/* A parsed spec (plain value: copy freely).  first/last are inclusive layer indices, or
 * first = QRL_TRACE_LAYERS_ALL / _DEEP (last unused); kinds is a mask of 1u << kind. */
typedef struct qrl_trace_sites {
    int n_clauses;
    struct {
        int first, last;
        unsigned kinds;
    } clause[QRL_TRACE_SITES_MAX_CLAUSES];
} qrl_trace_sites;

/* The default spec (see the file comment). */
void qrl_trace_sites_default(qrl_trace_sites *out);
/* Parse `spec` (NULL, "" or "default" = the default).  Errors: INVALID_ARGUMENT naming the
 * clause and the field ("trace sites clause 2: layers='9-x': expected A, A-B, all or
 * deep"; "... sites: unknown site 'q' (attn_in, k, v, attn_out, mlp_in, mlp_down)";
 * unknown keys, empty lists, B < A, too many clauses).  Layer bounds against a model are
 * checked by qrl_trace_layout_new. */
qrl_status qrl_trace_sites_parse(const char *spec, qrl_trace_sites *out, qrl_error *err);

/* ---- layout: the captured sites of one model ------------------------------------------ */

typedef struct qrl_trace_layout qrl_trace_layout;

/* Resolve `sites` against a model: every (layer, kind, head) the spec selects among the
 * FP4 vectors (act_fp4: linear inputs are FP4, i.e. precision w4a4-nvfp4; kv_fp4: the KV
 * cache is fp4).  *out owned by the caller (qrl_trace_layout_free).  Errors: OUT_OF_RANGE
 * (a clause's layer past the model: names the clause), INVALID_ARGUMENT (no FP4 site
 * selected: says which precision is missing), NOMEM. */
qrl_status qrl_trace_layout_new(const qrl_trace_sites *sites, const qrl_model_config *cfg,
                                bool act_fp4, bool kv_fp4, qrl_trace_layout **out,
                                qrl_error *err);
/* What qrl_trace_layout_new drops from `sites` because it is not FP4 here (act_fp4,
 * kv_fp4 as there): the number of (layer, kind) pairs, and in out (may be NULL; truncated
 * to cap) those pairs with the reason, e.g. "k layers 0, v layers 0 (k/v are FP4 only with
 * the fp4 KV cache)".  0 and "" when nothing is dropped or the spec does not fit the model
 * (qrl_trace_layout_new says so). */
size_t qrl_trace_sites_dropped(const qrl_trace_sites *sites, const qrl_model_config *cfg, bool act_fp4,
                               bool kv_fp4, char *out, size_t cap);
/* The learner's side: the layout named by a record's site ids (strictly increasing) for
 * model cfg.  Errors: CORRUPT (an id whose layer, kind or head the model does not have,
 * ids not increasing: names the index), NOMEM. */
qrl_status qrl_trace_layout_from_ids(const qrl_model_config *cfg, const uint32_t *ids,
                                     size_t n, qrl_trace_layout **out, qrl_error *err);
void qrl_trace_layout_free(qrl_trace_layout *l);
uint32_t qrl_trace_layout_n_sites(const qrl_trace_layout *l);
const uint32_t *qrl_trace_layout_site_ids(const qrl_trace_layout *l);  /* [n_sites] */
const uint32_t *qrl_trace_layout_site_lens(const qrl_trace_layout *l); /* [n_sites] */
/* Index of site (layer, kind, head), -1 when it is not captured. */
int qrl_trace_layout_find(const qrl_trace_layout *l, int layer, qrl_trace_site_kind kind,
                          int head);
/* Whether any head of (layer, kind) is captured (the forward's test per site). */
bool qrl_trace_layout_wants(const qrl_trace_layout *l, int layer, qrl_trace_site_kind kind);
/* Encoded record bytes per token (4 * n_sites + scales + bits; trace.h). */
size_t qrl_trace_layout_record_bytes_per_token(const qrl_trace_layout *l);
/* The learner's check of records against its QAT forward, which fake-quantizes the kinds
 * in want_kinds (mask of 1u << kind) at every layer of cfg: of those (layer, kind) pairs
 * (*wanted) how many the site ids ids[n] cover (*covered; any head counts).  missing
 * (may be NULL) gets the uncovered pairs, recorded (may be NULL) every recorded pair, as
 * "attn_in all layers, k layers 0-1+3" (truncated to its length). */
void qrl_trace_sites_coverage(const qrl_model_config *cfg, const uint32_t *ids, size_t n, unsigned want_kinds,
                              size_t *covered, size_t *wanted, char *missing, size_t missing_len,
                              char *recorded, size_t recorded_len);

/* ---- per-sequence record buffer -------------------------------------------------------- */

typedef struct qrl_trace_buf qrl_trace_buf;

/* Buffer for up to max_tokens records of layout l (borrowed: must outlive the buffer),
 * allocated now.  Errors: OUT_OF_RANGE (max_tokens 0 or above QRL_TRACE_MAX_TOKENS),
 * NOMEM. */
qrl_status qrl_trace_buf_new(const qrl_trace_layout *l, uint32_t max_tokens,
                             qrl_trace_buf **out, qrl_error *err);
void qrl_trace_buf_free(qrl_trace_buf *b);
/* Records held: tokens [0, n) (each written whole by one forward pass). */
uint32_t qrl_trace_buf_n_tokens(const qrl_trace_buf *b);
const qrl_trace_layout *qrl_trace_buf_layout(const qrl_trace_buf *b);
/* Keep records [0, n) (n <= held; staleness restarts pass 0). */
void qrl_trace_buf_truncate(qrl_trace_buf *b, uint32_t n);
/* Bytes held by the buffer's storage (capacity, for memory accounting). */
size_t qrl_trace_buf_bytes(const qrl_trace_buf *b);
/* Entry (token, site); pointers into the buffer, valid until it is written or freed.
 * Errors: OUT_OF_RANGE (token >= held or site >= n_sites). */
qrl_status qrl_trace_buf_entry(const qrl_trace_buf *b, uint32_t token, uint32_t site,
                               qrl_trace_entry *out, qrl_error *err);

/* ---- recorder: the forward's side ---------------------------------------------------- */

typedef struct qrl_trace_recorder qrl_trace_recorder;

/* Called for every captured vector with the exact F32 input that was quantized (tests
 * and metrics; NULL = none).  x [n] is borrowed for the call. */
typedef void (*qrl_trace_tap_fn)(void *ctx, const qrl_trace_buf *buf, uint32_t token,
                                 uint32_t site, const float *x, uint32_t n);

/* A recorder for layout l (borrowed) taking up to max_targets rows per pass.  *out owned by
 * the caller (qrl_trace_recorder_free).  Errors: OUT_OF_RANGE (max_targets < 1), NOMEM. */
qrl_status qrl_trace_recorder_new(const qrl_trace_layout *l, int max_targets,
                                  qrl_trace_recorder **out, qrl_error *err);
void qrl_trace_recorder_free(qrl_trace_recorder *r);
const qrl_trace_layout *qrl_trace_recorder_layout(const qrl_trace_recorder *r);
void qrl_trace_recorder_set_tap(qrl_trace_recorder *r, qrl_trace_tap_fn fn, void *ctx);
/* Targets of the next forward call (prefill or decode): row `row` of the call (prefill:
 * token index within the call; decode: batch row) is written as record `token` of buf
 * (token <= buf's held count: append or rewrite; buf's layout must be the recorder's).
 * clear drops every target; at most max_targets (checked: a caller bug aborts). */
void qrl_trace_recorder_clear(qrl_trace_recorder *r);
void qrl_trace_recorder_target(qrl_trace_recorder *r, int row, qrl_trace_buf *buf,
                               uint32_t token);
/* Forward side: the rows [row0, row0 + n) of the call are about to run (one pass);
 * returns whether any of them is a target. */
bool qrl_trace_recorder_begin_pass(qrl_trace_recorder *r, int row0, int n);
/* Forward side: x is pass row `r`'s vector of (layer, kind): dim / hidden / n_heads*hd
 * elements, or n_kv_heads * head_dim for k and v (split per head).  Captures it with
 * qrl_trace_capture (the quantizer the forward's linear and KV write use, bit-identical)
 * when the row is a target and the site is in the layout; no-op otherwise. */
void qrl_trace_recorder_capture(qrl_trace_recorder *r, int row, int layer,
                                qrl_trace_site_kind kind, const float *x);
/* Nanoseconds spent capturing target rows since creation (monotonic clock, taps
 * included): the recorder's share of the decode step is this over the forward's time. */
uint64_t qrl_trace_recorder_capture_ns(const qrl_trace_recorder *r);

/* ---- packing a finished response ------------------------------------------------------ */

/* Encoded records of one response, each covering a token range; owned by the struct
 * (qrl_trace_pack_free).  crc32 = CRC-32 (IEEE, core/crc32.h) of the records concatenated
 * in chunk order: the per-response completeness check a consumer repeats. */
typedef struct qrl_trace_pack {
    size_t count;
    uint8_t **record;       /* [count] "QTRC" records (trace.h) */
    size_t *len;            /* [count] */
    uint32_t *token_begin;  /* [count] first response token of each */
    uint32_t *token_count;  /* [count] */
    uint32_t n_tokens;      /* response tokens covered, sum of token_count */
    uint32_t crc32;
} qrl_trace_pack;

/* Split records [0, n_tokens) of b into records of at most max_record_bytes each (as many
 * tokens per record as fit).  n_tokens 0 gives count 0.  *out overwritten; empty on error.
 * Errors: OUT_OF_RANGE (b holds fewer than n_tokens records; one token's record is larger
 * than max_record_bytes: says both sizes), INVALID_ARGUMENT (an entry the record format
 * refuses, naming response tokens, site and field: a NaN block scale, which the quantizer
 * writes for a non-finite input, so a response whose activations went non-finite has no
 * records), NOMEM. */
qrl_status qrl_trace_buf_pack(const qrl_trace_buf *b, uint32_t n_tokens,
                              size_t max_record_bytes, qrl_trace_pack *out, qrl_error *err);
void qrl_trace_pack_free(qrl_trace_pack *p);

/* ---- decoded records of one response (the learner's side) ------------------------------ */

typedef struct qrl_trace_response qrl_trace_response;

/* Decode the chunks of one response (records[i] of lens[i] bytes covering response tokens
 * [token_begin[i], +n), in chunk order, each copied) for model cfg, with the site ids of
 * the chunks.  Checks every record (qrl_trace_record_decode: every field, so no decoded
 * entry has a NaN block scale or an S_enc out of range and guided values stay finite), that
 * all have the sites of `site_ids` with the model's lengths, and that the ranges are
 * contiguous from 0 to n_tokens.  Messages name the chunk, the response token and the site
 * id.  *out owned by the caller (qrl_trace_response_free).  Errors: CORRUPT (naming
 * the chunk and what differs), NOMEM. */
qrl_status qrl_trace_response_decode(const qrl_model_config *cfg, const uint32_t *site_ids,
                                     size_t n_sites, const uint8_t *const *records,
                                     const size_t *lens, const uint32_t *token_begin,
                                     size_t n_chunks, uint32_t n_tokens,
                                     qrl_trace_response **out, qrl_error *err);
void qrl_trace_response_free(qrl_trace_response *r);
uint32_t qrl_trace_response_n_tokens(const qrl_trace_response *r);
const qrl_trace_layout *qrl_trace_response_layout(const qrl_trace_response *r);
/* Record of (token, layer, kind, head): true and *e filled (pointers into r) when it
 * exists, false otherwise. */
bool qrl_trace_response_entry(const qrl_trace_response *r, uint32_t token, int layer,
                              qrl_trace_site_kind kind, int head, qrl_trace_entry *e);

/* ---- metrics (SPEC §6 / issue 19 item 5): pure functions ------------------------------ */

/* Share of captured elements whose recorded bit disagreed with nearest rounding (guided
 * code != round-to-nearest code under the recorded scales; trace.h's n_guided summed):
 * disagree / elements, 0 when elements is 0. */
double qrl_trace_metric_disagree_share(uint64_t disagree, uint64_t elements);
/* Record bytes per response token: bytes / tokens, 0 when tokens is 0. */
double qrl_trace_metric_bytes_per_token(uint64_t bytes, uint64_t tokens);

#endif
