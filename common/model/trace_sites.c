/* TRACE site spec parsing and site layouts (trace_rec.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "model/trace_rec_internal.h"

static const char *const kind_names[QRL_TRACE_SITE_KIND_COUNT_] = {
    "attn_in", "k", "v", "attn_out", "mlp_in", "mlp_down",
};

const char *qrl_trace_site_kind_name(qrl_trace_site_kind k) {
    return (unsigned)k < QRL_TRACE_SITE_KIND_COUNT_ ? kind_names[k] : "?";
}

void qrl_trace_sites_default(qrl_trace_sites *out) {
    memset(out, 0, sizeof *out);
    out->n_clauses = 2;
    out->clause[0].first = QRL_TRACE_LAYERS_ALL;
    out->clause[0].kinds = QRL_TRACE_KINDS_LINEAR;
    out->clause[1].first = QRL_TRACE_LAYERS_DEEP;
    out->clause[1].kinds = QRL_TRACE_KINDS_KV;
}

/* ---- parsing ------------------------------------------------------------------------- */

/* Shrink [*s, *s + *n) past leading and trailing white space: "layers=deep, sites=k; layers=0"
 * reads as written, so spaces around clauses, items, keys and values are not part of them. */
static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

/* A non-negative decimal integer filling [s, s + n) exactly. */
static bool parse_uint(const char *s, size_t n, int *out) {
    if (n == 0 || n > 6) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

static qrl_status parse_layers(const char *v, size_t n, int ci, int *first, int *last,
                               qrl_error *err) {
    if (n == 3 && !strncmp(v, "all", 3)) { *first = QRL_TRACE_LAYERS_ALL; *last = 0; return QRL_OK; }
    if (n == 4 && !strncmp(v, "deep", 4)) { *first = QRL_TRACE_LAYERS_DEEP; *last = 0; return QRL_OK; }
    const char *dash = memchr(v, '-', n);
    bool ok = dash ? parse_uint(v, (size_t)(dash - v), first) &&
                         parse_uint(dash + 1, n - (size_t)(dash - v) - 1, last)
                   : parse_uint(v, n, first);
    if (ok && !dash) *last = *first;
    if (!ok)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "trace sites clause %d: layers='%.*s': expected A, A-B, all or deep",
                             ci + 1, (int)n, v);
    if (*last < *first)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "trace sites clause %d: layers='%.*s': end below start", ci + 1,
                             (int)n, v);
    return QRL_OK;
}

static qrl_status parse_kind(const char *v, size_t n, int ci, unsigned *mask, qrl_error *err) {
    for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++)
        if (strlen(kind_names[k]) == n && !strncmp(v, kind_names[k], n)) {
            *mask |= 1u << k;
            return QRL_OK;
        }
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                         "trace sites clause %d: sites: unknown site '%.*s' (attn_in, k, v, "
                         "attn_out, mlp_in, mlp_down)", ci + 1, (int)n, v);
}

/* One clause [s, s + n): comma items, `key=value` or a further kind of `sites`. */
static qrl_status parse_clause(const char *s, size_t n, int ci, qrl_trace_sites *out,
                               qrl_error *err) {
    int first = QRL_TRACE_LAYERS_ALL, last = 0;
    unsigned kinds = 0;
    bool have_layers = false, have_sites = false, in_sites = false;
    const char *end = s + n;
    while (s < end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        size_t step = comma ? (size_t)(comma - s) : (size_t)(end - s), len = step;
        const char *it = s;
        trim(&it, &len);
        const char *eq = memchr(it, '=', len);
        if (len == 0)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace sites clause %d: empty item", ci + 1);
        if (eq) {
            const char *key = it, *val = eq + 1;
            size_t kl = (size_t)(eq - it), vl = len - kl - 1;
            trim(&key, &kl);
            trim(&val, &vl);
            in_sites = false;
            if (kl == 6 && !strncmp(key, "layers", 6)) {
                if (have_layers)
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "trace sites clause %d: layers given twice", ci + 1);
                have_layers = true;
                QRL_TRY(parse_layers(val, vl, ci, &first, &last, err));
            } else if (kl == 5 && !strncmp(key, "sites", 5)) {
                if (have_sites)
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "trace sites clause %d: sites given twice", ci + 1);
                if (vl == 0)
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "trace sites clause %d: sites: empty list", ci + 1);
                have_sites = in_sites = true;
                QRL_TRY(parse_kind(val, vl, ci, &kinds, err));
            } else {
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "trace sites clause %d: unknown key '%.*s' (layers, sites)",
                                     ci + 1, (int)kl, key);
            }
        } else if (in_sites) {
            QRL_TRY(parse_kind(it, len, ci, &kinds, err));
        } else {
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace sites clause %d: '%.*s' is not key=value (layers=..., "
                                 "sites=...)", ci + 1, (int)len, it);
        }
        s += step + (comma ? 1 : 0);
        if (comma && s == end)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace sites clause %d: trailing comma", ci + 1);
    }
    out->clause[ci].first = first;
    out->clause[ci].last = last;
    out->clause[ci].kinds = have_sites ? kinds : QRL_TRACE_KINDS_ALL;
    return QRL_OK;
}

qrl_status qrl_trace_sites_parse(const char *spec, qrl_trace_sites *out, qrl_error *err) {
    if (!spec || !spec[0] || !strcmp(spec, "default")) {
        qrl_trace_sites_default(out);
        return QRL_OK;
    }
    qrl_trace_sites s = {0};
    const char *p = spec;
    for (;;) {
        const char *semi = strchr(p, ';');
        size_t len = semi ? (size_t)(semi - p) : strlen(p);
        const char *c = p;
        trim(&c, &len);
        if (s.n_clauses == QRL_TRACE_SITES_MAX_CLAUSES)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace sites: more than %d clauses", QRL_TRACE_SITES_MAX_CLAUSES);
        if (len == 0)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "trace sites clause %d: empty", s.n_clauses + 1);
        QRL_TRY(parse_clause(c, len, s.n_clauses, &s, err));
        s.n_clauses++;
        if (!semi) break;
        p = semi + 1;
    }
    *out = s;
    return QRL_OK;
}

/* ---- layouts ------------------------------------------------------------------------- */

struct qrl_trace_layout {
    uint32_t n_sites;
    uint32_t *ids, *lens;
    uint32_t *offset;     /* byte offset of site s in a buffer's token slab */
    size_t slab_bytes;    /* one token in a buffer: per site 4 + scales + bits */
    size_t record_per_token;
    int n_layers, n_kv_heads;
    int32_t *first;       /* [n_layers][KIND_COUNT]: index of head 0, -1 = not captured */
};

static uint32_t kind_len(const qrl_model_config *c, qrl_trace_site_kind k) {
    switch (k) {
    case QRL_TRACE_SITE_ATTN_IN:
    case QRL_TRACE_SITE_MLP_IN: return (uint32_t)c->dim;
    case QRL_TRACE_SITE_K:
    case QRL_TRACE_SITE_V: return (uint32_t)c->head_dim;
    case QRL_TRACE_SITE_ATTN_OUT: return (uint32_t)(c->n_heads * c->head_dim);
    case QRL_TRACE_SITE_MLP_DOWN: return (uint32_t)c->hidden_dim;
    default: return 0;
    }
}

static int kind_heads(const qrl_model_config *c, int k) {
    return k == QRL_TRACE_SITE_K || k == QRL_TRACE_SITE_V ? c->n_kv_heads : 1;
}

void qrl_trace_layout_free(qrl_trace_layout *l) {
    if (!l) return;
    free(l->ids);
    free(l->lens);
    free(l->offset);
    free(l->first);
    free(l);
}

/* Build from a per-(layer, kind) mask `sel` [n_layers] (every head of a selected kind). */
static qrl_status build(const qrl_model_config *c, const unsigned *sel, qrl_trace_layout **out,
                        qrl_error *err) {
    qrl_trace_layout *l = calloc(1, sizeof *l);
    size_t n = 0;
    for (int ly = 0; ly < c->n_layers; ly++)
        for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++)
            if (sel[ly] >> k & 1) n += (size_t)kind_heads(c, k);
    if (l) {
        l->ids = malloc((n + 1) * sizeof *l->ids);
        l->lens = malloc((n + 1) * sizeof *l->lens);
        l->offset = malloc((n + 1) * sizeof *l->offset);
        l->first = malloc((size_t)c->n_layers * QRL_TRACE_SITE_KIND_COUNT_ * sizeof *l->first);
    }
    if (!l || !l->ids || !l->lens || !l->offset || !l->first) {
        qrl_trace_layout_free(l);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "trace layout: out of memory (%zu sites)", n);
    }
    l->n_layers = c->n_layers;
    l->n_kv_heads = c->n_kv_heads;
    uint32_t i = 0;
    size_t off = 0, rec = 0;
    for (int ly = 0; ly < c->n_layers; ly++)
        for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++) {
            l->first[ly * QRL_TRACE_SITE_KIND_COUNT_ + k] = sel[ly] >> k & 1 ? (int32_t)i : -1;
            if (!(sel[ly] >> k & 1)) continue;
            for (int h = 0; h < kind_heads(c, k); h++, i++) {
                uint32_t len = kind_len(c, k);
                size_t sc = (size_t)qrl_nvfp4_blocks(len), bt = (len + 7) / 8;
                l->ids[i] = qrl_trace_site_id(ly, k, h);
                l->lens[i] = len;
                l->offset[i] = (uint32_t)off;
                off += 4 + sc + bt;
                rec += 4 + sc + bt;
            }
        }
    l->n_sites = i;
    l->slab_bytes = (off + 3) & ~(size_t)3; /* keep each token's F32 fields aligned */
    l->record_per_token = rec;
    *out = l;
    return QRL_OK;
}

/* The kinds the clauses select per layer, sel[n_layers] (calloc'ed, the caller frees), those
 * of `mask` only.  Errors: OUT_OF_RANGE (a clause's layer past the model), NOMEM. */
static qrl_status select_kinds(const qrl_trace_sites *sites, int L, unsigned mask, unsigned **out,
                               qrl_error *err) {
    unsigned *sel = calloc((size_t)(L > 0 ? L : 1), sizeof *sel);
    if (!sel) return qrl_error_set(err, QRL_STATUS_NOMEM, "trace layout: out of memory");
    for (int ci = 0; ci < sites->n_clauses; ci++) {
        int a = sites->clause[ci].first, b = sites->clause[ci].last;
        if (a == QRL_TRACE_LAYERS_ALL) a = 0, b = L - 1;
        else if (a == QRL_TRACE_LAYERS_DEEP) a = L / 2, b = L - 1;
        else if (b >= L) {
            free(sel);
            return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                                 "trace sites clause %d: layers=%d-%d: the model has %d layers "
                                 "(0-%d)", ci + 1, sites->clause[ci].first, b, L, L - 1);
        }
        for (int ly = a; ly <= b; ly++) sel[ly] |= sites->clause[ci].kinds & mask;
    }
    *out = sel;
    return QRL_OK;
}

qrl_status qrl_trace_layout_new(const qrl_trace_sites *sites, const qrl_model_config *cfg,
                                bool act_fp4, bool kv_fp4, qrl_trace_layout **out,
                                qrl_error *err) {
    *out = NULL;
    int L = cfg->n_layers;
    unsigned fp4 = (act_fp4 ? QRL_TRACE_KINDS_LINEAR : 0) | (kv_fp4 ? QRL_TRACE_KINDS_KV : 0);
    unsigned *sel;
    QRL_TRY(select_kinds(sites, L, fp4, &sel, err));
    bool any = false;
    for (int ly = 0; ly < L; ly++) any |= sel[ly] != 0;
    if (!any) {
        free(sel);
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "trace sites: none of the requested sites is FP4 here (linear "
                             "inputs need precision w4a4-nvfp4%s, k/v need the fp4 kv cache%s)",
                             act_fp4 ? ": on" : ": off", kv_fp4 ? ": on" : ": off");
    }
    qrl_status st = build(cfg, sel, out, err);
    free(sel);
    return st;
}

qrl_status qrl_trace_layout_from_ids(const qrl_model_config *cfg, const uint32_t *ids,
                                     size_t n, qrl_trace_layout **out, qrl_error *err) {
    *out = NULL;
    if (n == 0) return qrl_error_set(err, QRL_STATUS_CORRUPT, "trace sites: no site ids");
    int L = cfg->n_layers;
    unsigned *sel = calloc((size_t)(L > 0 ? L : 1), sizeof *sel);
    if (!sel) return qrl_error_set(err, QRL_STATUS_NOMEM, "trace layout: out of memory");
    qrl_status st = QRL_OK;
    for (size_t i = 0; i < n && st == QRL_OK; i++) {
        int ly = (int)(ids[i] >> 16), k = (int)(ids[i] >> 12 & 0xF), h = (int)(ids[i] & 0xFFF);
        if (i > 0 && ids[i] <= ids[i - 1])
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace sites: site_ids[%zu] = 0x%x is "
                               "not above the previous", i, ids[i]);
        else if (ly >= L || k >= QRL_TRACE_SITE_KIND_COUNT_ || h >= kind_heads(cfg, k))
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "trace sites: site_ids[%zu] = 0x%x "
                               "(layer %d, kind %d, head %d) is not a site of this model "
                               "(%d layers, %d kv heads)", i, ids[i], ly, k, h, L,
                               cfg->n_kv_heads);
        else
            sel[ly] |= 1u << k;
    }
    if (st == QRL_OK) st = build(cfg, sel, out, err);
    free(sel);
    if (st != QRL_OK) return st;
    /* every head of a kind is captured together: the ids must be exactly the build's */
    if ((*out)->n_sites != n || memcmp((*out)->ids, ids, n * sizeof *ids) != 0) {
        qrl_trace_layout_free(*out);
        *out = NULL;
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "trace sites: %zu site ids do not cover "
                             "whole (layer, kind) groups (every KV head of a k/v site)", n);
    }
    return QRL_OK;
}

uint32_t qrl_trace_layout_n_sites(const qrl_trace_layout *l) { return l->n_sites; }
const uint32_t *qrl_trace_layout_site_ids(const qrl_trace_layout *l) { return l->ids; }
const uint32_t *qrl_trace_layout_site_lens(const qrl_trace_layout *l) { return l->lens; }
size_t qrl_trace_layout_record_bytes_per_token(const qrl_trace_layout *l) {
    return l->record_per_token;
}

bool qrl_trace_layout_wants(const qrl_trace_layout *l, int layer, qrl_trace_site_kind kind) {
    if (layer < 0 || layer >= l->n_layers || (unsigned)kind >= QRL_TRACE_SITE_KIND_COUNT_)
        return false;
    return l->first[layer * QRL_TRACE_SITE_KIND_COUNT_ + kind] >= 0;
}

int qrl_trace_layout_find(const qrl_trace_layout *l, int layer, qrl_trace_site_kind kind,
                          int head) {
    if (!qrl_trace_layout_wants(l, layer, kind)) return -1;
    int heads = kind == QRL_TRACE_SITE_K || kind == QRL_TRACE_SITE_V ? l->n_kv_heads : 1;
    if (head < 0 || head >= heads) return -1;
    return l->first[layer * QRL_TRACE_SITE_KIND_COUNT_ + kind] + head;
}

size_t qrl_trace_layout_slab_bytes_(const qrl_trace_layout *l) { return l->slab_bytes; }
uint32_t qrl_trace_layout_offset_(const qrl_trace_layout *l, uint32_t site) {
    return l->offset[site];
}

/* ---- coverage: what a QAT forward quantizes against what records carry ----------------- */

/* Append "kind layers R" for each kind of `kinds` set anywhere in on[kind][layer] (R the
 * layer ranges, "all layers" when every one), comma separated. */
static size_t describe(char *out, size_t cap, size_t len, const bool *on, int n_layers, unsigned kinds) {
    for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++) {
        if (!(kinds >> k & 1u)) continue;
        const bool *row = on + (size_t)k * (size_t)n_layers;
        int count = 0;
        for (int l = 0; l < n_layers; l++) count += row[l];
        if (!count || len + 1 >= cap) continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s ", len ? ", " : "", kind_names[k]);
        if (count == n_layers) {
            if (len + 1 < cap) len += (size_t)snprintf(out + len, cap - len, "all layers");
            continue;
        }
        if (len + 1 < cap) len += (size_t)snprintf(out + len, cap - len, "layers ");
        for (int l = 0, first = 1; l < n_layers && len + 1 < cap; l++) {
            if (!row[l] || (l > 0 && row[l - 1])) continue;
            int e = l;
            while (e + 1 < n_layers && row[e + 1]) e++;
            len += (size_t)(e > l ? snprintf(out + len, cap - len, "%s%d-%d", first ? "" : "+", l, e)
                                  : snprintf(out + len, cap - len, "%s%d", first ? "" : "+", l));
            first = 0;
        }
    }
    return len < cap ? len : cap - 1;
}

void qrl_trace_sites_coverage(const qrl_model_config *cfg, const uint32_t *ids, size_t n, unsigned want_kinds,
                              size_t *covered, size_t *wanted, char *missing, size_t missing_len,
                              char *recorded, size_t recorded_len) {
    int L = cfg->n_layers > 0 ? cfg->n_layers : 0;
    size_t cells = (size_t)QRL_TRACE_SITE_KIND_COUNT_ * (size_t)(L ? L : 1);
    bool *have = calloc(cells, sizeof *have), *miss = calloc(cells, sizeof *miss);
    QRL_CHECK(have && miss);
    for (size_t i = 0; i < n; i++) {
        int layer = (int)(ids[i] >> 16), kind = (int)(ids[i] >> 12 & 0xf);
        if (layer < L && kind < QRL_TRACE_SITE_KIND_COUNT_) have[(size_t)kind * (size_t)L + (size_t)layer] = true;
    }
    size_t cov = 0, want = 0;
    for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++)
        for (int l = 0; want_kinds >> k & 1u && l < L; l++) {
            size_t c = (size_t)k * (size_t)L + (size_t)l;
            want++, cov += have[c], miss[c] = !have[c];
        }
    *covered = cov, *wanted = want;
    if (missing && missing_len) missing[0] = 0, describe(missing, missing_len, 0, miss, L, QRL_TRACE_KINDS_ALL);
    if (recorded && recorded_len) {
        recorded[0] = 0;
        if (!describe(recorded, recorded_len, 0, have, L, QRL_TRACE_KINDS_ALL))
            snprintf(recorded, recorded_len, "no site of this model");
    }
    free(have), free(miss);
}

size_t qrl_trace_sites_dropped(const qrl_trace_sites *sites, const qrl_model_config *cfg, bool act_fp4,
                               bool kv_fp4, char *out, size_t cap) {
    if (out && cap) out[0] = 0;
    int L = cfg->n_layers > 0 ? cfg->n_layers : 0;
    unsigned drop = (act_fp4 ? 0 : QRL_TRACE_KINDS_LINEAR) | (kv_fp4 ? 0 : QRL_TRACE_KINDS_KV);
    unsigned *sel;
    qrl_error e;
    if (!drop || !L || select_kinds(sites, L, drop, &sel, &e) != QRL_OK) return 0;
    bool *on = calloc((size_t)QRL_TRACE_SITE_KIND_COUNT_ * (size_t)L, sizeof *on);
    QRL_CHECK(on);
    size_t n = 0;
    for (int k = 0; k < QRL_TRACE_SITE_KIND_COUNT_; k++)
        for (int ly = 0; ly < L; ly++)
            if (sel[ly] >> k & 1u) on[(size_t)k * (size_t)L + (size_t)ly] = true, n++;
    size_t len = 0;
    static const struct { unsigned kinds; const char *why; } groups[] = {
        {QRL_TRACE_KINDS_LINEAR, "linear inputs are FP4 only with precision w4a4-nvfp4"},
        {QRL_TRACE_KINDS_KV, "k/v are FP4 only with the fp4 KV cache"},
    };
    for (size_t g = 0; out && cap && g < sizeof groups / sizeof groups[0]; g++) {
        char part[512];
        part[0] = 0;
        if (!describe(part, sizeof part, 0, on, L, groups[g].kinds) || len + 1 >= cap) continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s (%s)", len ? "; " : "", part, groups[g].why);
        if (len >= cap) len = cap - 1;
    }
    free(on);
    free(sel);
    return n;
}
