/* Paged KV cache: block accounting (no leaks), forks, formats; batched decode of
 * sequences of different lengths equals per-sequence prefill bit for bit; forward-pass
 * error paths. */
#include <criterion/criterion.h>
#include <string.h>

#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/model.h"

static qrl_kv_cache *make_cache(int n_blocks, int block_size, int max_seqs, int max_len,
                                qrl_kv_format fmt) {
    qrl_kv_cache_desc d = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = block_size,
                           .n_blocks = n_blocks, .max_seqs = max_seqs, .max_seq_len = max_len,
                           .format = fmt};
    qrl_kv_cache *kv;
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    return kv;
}

Test(kv_cache, block_accounting_without_leaks) {
    qrl_kv_cache *kv = make_cache(10, 4, 3, 40, QRL_KV_FORMAT_F32);
    qrl_error err;
    int a, b, c, d;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &a, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv, a, 9, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_capacity(kv, a), 12);
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 7);
    cr_assert_eq(qrl_kv_cache_reserve(kv, a, 5, &err), QRL_OK); /* already enough */
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 7);
    cr_assert_eq(qrl_kv_cache_reserve(kv, a, 41, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &b, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv, b, 28, &err), QRL_OK); /* 7 blocks: pool empty */
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 0);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &c, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_reserve(kv, c, 1, &err), QRL_STATUS_NOMEM);
    cr_assert(qrl_status_retriable(QRL_STATUS_NOMEM));
    cr_assert(strstr(err.msg, "pool exhausted"), "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &d, &err), QRL_STATUS_BUSY); /* 3 slots taken */
    /* block tables are disjoint */
    int na, nb;
    const int32_t *ta = qrl_kv_cache_block_table(kv, a, &na), *tb = qrl_kv_cache_block_table(kv, b, &nb);
    cr_assert_eq(na, 3);
    cr_assert_eq(nb, 7);
    int seen[10] = {0};
    for (int i = 0; i < na; i++) seen[ta[i]]++;
    for (int i = 0; i < nb; i++) seen[tb[i]]++;
    for (int i = 0; i < 10; i++) cr_assert_eq(seen[i], 1, "block %d", i);
    /* shrinking returns whole blocks past the new length */
    qrl_kv_cache_set_len(kv, b, 28);
    qrl_kv_cache_set_len(kv, b, 9);
    cr_assert_eq(qrl_kv_cache_seq_len(kv, b), 9);
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 4);
    cr_assert_eq(qrl_kv_cache_reserve(kv, c, 16, &err), QRL_OK);
    qrl_kv_cache_seq_free(kv, a);
    qrl_kv_cache_seq_free(kv, b);
    qrl_kv_cache_seq_free(kv, c);
    qrl_kv_cache_seq_free(kv, c); /* freeing a free slot is a no-op */
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 10);
    cr_assert_eq(qrl_kv_cache_free_seqs(kv), 3);
    qrl_kv_cache_free(kv);
}

Test(kv_cache, write_view_and_fork_copy) {
    for (int fmt = 0; fmt < 2; fmt++) {
        qrl_kv_cache *kv = make_cache(8, 3, 3, 20, (qrl_kv_format)fmt);
        qrl_error err;
        int a, b;
        cr_assert_eq(qrl_kv_cache_seq_new(kv, &a, &err), QRL_OK);
        cr_assert_eq(qrl_kv_cache_reserve(kv, a, 7, &err), QRL_OK);
        for (int l = 0; l < 2; l++)
            for (int p = 0; p < 7; p++) {
                float k[8], v[8];
                for (int i = 0; i < 8; i++) k[i] = (float)(100 * l + 10 * p + i), v[i] = -k[i];
                qrl_kv_cache_write(kv, a, l, p, k, v);
            }
        qrl_kv_cache_set_len(kv, a, 7);
        cr_assert_eq(qrl_kv_cache_seq_fork(kv, a, &b, &err), QRL_OK);
        cr_assert_eq(qrl_kv_cache_seq_len(kv, b), 7);
        cr_assert_eq(qrl_kv_cache_free_blocks(kv), 2);
        qrl_kv_cache_seq_free(kv, a); /* the fork owns its own copy */
        for (int l = 0; l < 2; l++) {
            qrl_kv_view vw;
            qrl_kv_cache_view(kv, b, l, &vw);
            for (int p = 0; p < 7; p++)
                for (int i = 0; i < 8; i++) {
                    size_t at = (size_t)vw.block_table[p / 3] * 3 * 8 + (size_t)(p % 3) * 8 + i;
                    float kk = fmt == 0 ? ((const float *)vw.k)[at]
                                        : qrl_cpu_bf16_load(((const uint16_t *)vw.k)[at]);
                    float vv = fmt == 0 ? ((const float *)vw.v)[at]
                                        : qrl_cpu_bf16_load(((const uint16_t *)vw.v)[at]);
                    cr_assert_eq(kk, (float)(100 * l + 10 * p + i)); /* exact in BF16 too */
                    cr_assert_eq(vv, -kk);
                }
        }
        qrl_kv_cache_seq_free(kv, b);
        cr_assert_eq(qrl_kv_cache_free_blocks(kv), 8);
        qrl_kv_cache_free(kv);
    }
}

Test(kv_cache, formats) {
    qrl_kv_format f;
    qrl_error err;
    cr_assert_eq(qrl_kv_format_parse("int4-protected", &f, &err), QRL_OK);
    cr_assert_eq(f, QRL_KV_FORMAT_INT4_PROTECTED);
    cr_assert_str_eq(qrl_kv_format_name(QRL_KV_FORMAT_BF16), "bf16");
    cr_assert_eq(qrl_kv_format_parse("int3", &f, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "'int3'"), "%s", err.msg);
    qrl_kv_cache_desc d = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .block_size = 1,
                           .n_blocks = 1, .max_seqs = 1, .max_seq_len = 1,
                           .format = QRL_KV_FORMAT_INT4};
    qrl_kv_cache *kv;
    for (int i = 0; i < QRL_KV_FORMAT_COUNT_; i++) {
        d.format = (qrl_kv_format)i;
        cr_assert(qrl_kv_format_implemented(d.format));
        cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s: %s",
                     qrl_kv_format_name(d.format), err.msg);
        qrl_kv_cache_free(kv);
    }
    cr_assert_not(qrl_kv_format_implemented(QRL_KV_FORMAT_COUNT_));
    d.format = QRL_KV_FORMAT_COUNT_;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_STATUS_INVALID_ARGUMENT);
    d.format = QRL_KV_FORMAT_INT4;
    d.head_dim = QRL_KV_MAX_HEAD_DIM + 1;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(err.msg, "kv cache 'int4': head_dim 1025 exceeds 1024");
    d.format = QRL_KV_FORMAT_BF16; /* f32/bf16 have no head_dim limit */
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    qrl_kv_cache_free(kv);
    d.head_dim = 2;
    d.format = QRL_KV_FORMAT_INT4_PROTECTED;
    d.protected_sink = -1;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "sink=-1"), "%s", err.msg);
    d.protected_sink = 0;
    d.protected_recent = 2; /* wider than max_seq_len 1 */
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_STATUS_OUT_OF_RANGE);
    d.protected_recent = 0;
    d.format = QRL_KV_FORMAT_F32;
    d.block_size = 0;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_STATUS_OUT_OF_RANGE);
}

/* ---- batched decode vs prefill ------------------------------------------------------ */

static qrl_model *tiny_model(void) {
    qrl_model_config c = {.arch = QRL_MODEL_ARCH_QWEN3, .dim = 40, .hidden_dim = 56, .n_layers = 2,
                          .n_heads = 4, .n_kv_heads = 2, .head_dim = 12, .vocab_size = 61,
                          .max_seq_len = 64, .norm_eps = 1e-6f, .qk_norm = true, .qkv_bias = true,
                          .rope = {.theta = 10000.0, .layout = QRL_ROPE_LAYOUT_HALF}};
    qrl_model *m;
    qrl_error err;
    cr_assert_eq(qrl_model_new(&c, &m, &err), QRL_OK, "%s", err.msg);
    qrl_model_init_random(m, 3);
    return m;
}

static qrl_kv_cache *model_cache(const qrl_model *m, int n_blocks, int block_size, int max_seqs,
                                 int max_len) {
    qrl_kv_cache_desc d = {.n_layers = m->cfg.n_layers, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .block_size = block_size,
                           .n_blocks = n_blocks, .max_seqs = max_seqs, .max_seq_len = max_len,
                           .format = QRL_KV_FORMAT_F32};
    qrl_kv_cache *kv;
    qrl_error err;
    cr_assert_eq(qrl_kv_cache_new(&d, &kv, &err), QRL_OK, "%s", err.msg);
    return kv;
}

Test(kv_cache, batched_decode_equals_per_sequence_prefill) {
    qrl_model *m = tiny_model();
    int V = m->cfg.vocab_size;
    enum { NS = 4, STEPS = 6 };
    const int plen[NS] = {3, 10, 17, 1};
    int32_t toks[NS][40];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < 40; i++) toks[s][i] = (int32_t)((s * 31 + i * 17 + 5) % V);
    qrl_error err;
    qrl_kv_cache *kv = model_cache(m, 64, 4, NS + 1, 64);
    qrl_forward *f;
    cr_assert_eq(qrl_forward_new(m, NS, 64, &f, &err), QRL_OK); /* prefill in chunks of 4 */
    int seqs[NS];
    float *logits = malloc(sizeof(float) * NS * V), *ref = malloc(sizeof(float) * 40 * V);
    /* First token of every sequence round-robin, then the rest: the sequences' blocks
     * interleave in the pool. */
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(qrl_kv_cache_seq_new(kv, &seqs[s], &err), QRL_OK);
        cr_assert_eq(qrl_forward_prefill(f, kv, seqs[s], toks[s], 1, NULL, false, &err), QRL_OK);
    }
    for (int s = 0; s < NS; s++)
        if (plen[s] > 1)
            cr_assert_eq(qrl_forward_prefill(f, kv, seqs[s], toks[s] + 1, plen[s] - 1, NULL, false, &err),
                         QRL_OK, "%s", err.msg);
    for (int step = 0; step < STEPS; step++) {
        int32_t batch_tok[NS];
        for (int s = 0; s < NS; s++) batch_tok[s] = toks[s][plen[s] + step];
        cr_assert_eq(qrl_forward_decode(f, kv, seqs, batch_tok, NS, logits, &err), QRL_OK, "%s",
                     err.msg);
        for (int s = 0; s < NS; s++) {
            /* reference: a fresh sequence prefilled with the whole prefix */
            int n = plen[s] + step + 1, r;
            cr_assert_eq(qrl_kv_cache_seq_new(kv, &r, &err), QRL_OK);
            cr_assert_eq(qrl_forward_prefill(f, kv, r, toks[s], n, ref, true, &err), QRL_OK);
            cr_assert_eq(memcmp(logits + (size_t)s * V, ref + (size_t)(n - 1) * V, sizeof(float) * V), 0,
                         "sequence %d step %d differs", s, step);
            qrl_kv_cache_seq_free(kv, r);
        }
    }
    /* Free one sequence mid-way, start another in its blocks: others are unaffected. */
    qrl_kv_cache_seq_free(kv, seqs[1]);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &seqs[1], &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, seqs[1], toks[3], 20, NULL, false, &err), QRL_OK);
    int32_t next[2] = {toks[0][plen[0] + STEPS], toks[3][20]};
    int pair[2] = {seqs[0], seqs[1]};
    cr_assert_eq(qrl_forward_decode(f, kv, pair, next, 2, logits, &err), QRL_OK);
    int r;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &r, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, kv, r, toks[3], 21, ref, true, &err), QRL_OK);
    cr_assert_eq(memcmp(logits + V, ref + (size_t)20 * V, sizeof(float) * V), 0);
    qrl_kv_cache_seq_free(kv, r);
    for (int s = 0; s < NS; s++) qrl_kv_cache_seq_free(kv, seqs[s]);
    cr_assert_eq(qrl_kv_cache_free_blocks(kv), 64);
    free(logits);
    free(ref);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    qrl_model_free(m);
}

Test(kv_cache, forward_errors_leave_state_unchanged) {
    qrl_model *m = tiny_model();
    qrl_error err;
    qrl_kv_cache *kv = model_cache(m, 3, 4, 2, 64);
    qrl_forward *f;
    cr_assert_eq(qrl_forward_new(m, 8, 64, &f, &err), QRL_OK);
    int a, b;
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &a, &err), QRL_OK);
    cr_assert_eq(qrl_kv_cache_seq_new(kv, &b, &err), QRL_OK);
    int32_t toks[70] = {0};
    toks[2] = 61; /* == vocab */
    cr_assert_eq(qrl_forward_prefill(f, kv, a, toks, 5, NULL, false, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "index 2"), "%s", err.msg);
    toks[2] = 0;
    cr_assert_eq(qrl_forward_prefill(f, kv, a, toks, 65, NULL, false, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert(strstr(err.msg, "context of 64"), "%s", err.msg);
    cr_assert_eq(qrl_forward_prefill(f, kv, a, toks, 13, NULL, false, &err), QRL_STATUS_NOMEM);
    cr_assert_eq(qrl_kv_cache_seq_len(kv, a), 0);
    cr_assert_eq(qrl_forward_prefill(f, kv, a, toks, 8, NULL, false, &err), QRL_OK);
    int dup[2] = {a, a};
    float *logits = malloc(sizeof(float) * 2 * 61);
    cr_assert_eq(qrl_forward_decode(f, kv, dup, toks, 2, logits, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "twice"), "%s", err.msg);
    cr_assert_eq(qrl_kv_cache_seq_len(kv, a), 8);
    /* wrong cache shape */
    qrl_kv_cache *other = make_cache(4, 4, 1, 8, QRL_KV_FORMAT_F32);
    int c;
    cr_assert_eq(qrl_kv_cache_seq_new(other, &c, &err), QRL_OK);
    cr_assert_eq(qrl_forward_prefill(f, other, c, toks, 1, NULL, false, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    qrl_kv_cache_free(other);
    free(logits);
    qrl_forward_free(f);
    qrl_kv_cache_free(kv);
    qrl_model_free(m);
}
