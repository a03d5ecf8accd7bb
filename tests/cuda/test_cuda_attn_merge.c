/* The decode attention's split merge fused into the tensor-core split kernels (the last
 * block of each (row, kv head) merges, kernels/cuda/attention.cu and attention_q_tc.cu)
 * against the separate merge kernel (QRL_ATTN_MERGE_KERNEL=1), on random K/V and q:
 *   - outputs bit-identical (memcmp), BF16 KV and every quantized format (int4-protected
 *     with its extra protected split too), ragged rows of 1..3000 positions, G = 1, 3, 4, 8;
 *   - the fused path run twice on the same work buffer (as graph replays do), then the
 *     separate path, then a smaller batch (fewer rows, shorter contexts) and the full one
 *     again: equal every time, and the counter tail of work is zero after every call (a
 *     counter left behind would corrupt the next launch);
 *   - every output element written, no guard element touched (guarded buffers).
 * The accuracy of both paths against the CPU reference is test_cuda_ops.c's and
 * test_cuda_kv.c's. */
#include "cuda_test_util.h"

#include "cuda/attention.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/pointwise.cuh"

#define BS 16

/* Ragged lengths in [1, 3000]: the extremes, chunk edges, then random. */
static void ragged(int *lens, int n, uint64_t *seed) {
    static const int fixed[] = {1, 3000, 2, 64, 65, 512, 513, 2999};
    for (int i = 0; i < n; i++)
        lens[i] = i < 8 ? fixed[i] : 1 + (int)(rng_next(seed) % 3000);
}

/* One shape: the rows' block tables (sequence r owns consecutive blocks), row_seq, row_pos. */
typedef struct shape {
    int n, H, KVH, hd, mb, n_blocks, max_len;
    int32_t *tables, *rseq, *rpos; /* device */
    float *q;                      /* device [n, H * hd] */
} shape;

static shape shape_new(int n, int H, int KVH, int hd, const int *lens, uint64_t *seed) {
    shape s = {.n = n, .H = H, .KVH = KVH, .hd = hd};
    for (int r = 0; r < n; r++) if (lens[r] > s.max_len) s.max_len = lens[r];
    s.mb = (s.max_len + BS - 1) / BS;
    int32_t *t = calloc((size_t)n * s.mb, 4), *rs = malloc(n * 4), *rp = malloc(n * 4);
    for (int r = 0; r < n; r++) {
        for (int b = 0; b < (lens[r] + BS - 1) / BS; b++) t[(size_t)r * s.mb + b] = s.n_blocks++;
        rs[r] = r, rp[r] = lens[r] - 1;
    }
    float *q = malloc((size_t)n * H * hd * 4);
    rand_f32(q, (size_t)n * H * hd, 1.5f, seed);
    s.tables = dev_from(t, (size_t)n * s.mb * 4);
    s.rseq = dev_from(rs, n * 4);
    s.rpos = dev_from(rp, n * 4);
    s.q = dev_from(q, (size_t)n * H * hd * 4);
    free(t); free(rs); free(rp); free(q);
    return s;
}

static void shape_free(shape *s) {
    qrl_cuda_free(s->tables); qrl_cuda_free(s->rseq); qrl_cuda_free(s->rpos); qrl_cuda_free(s->q);
}

/* The counters of the fused merge (the last n * H floats of work) are all zero. */
static void tail_zero(const float *work, size_t wf, int n, int H, const char *what) {
    size_t nt = (size_t)n * H;
    uint32_t *h = malloc(nt * 4);
    cr_assert_eq(qrl_cuda_copy_to_host(h, work + wf - nt, nt * 4, NULL), QRL_OK);
    for (size_t i = 0; i < nt; i++) cr_assert_eq(h[i], 0u, "%s: counter %zu left at %u", what, nt - 1 - i, h[i]);
    free(h);
}

/* One attention call of the first n rows (max_len their bound) into a fresh guarded buffer;
 * merge_kernel selects the path; returns the BF16 output (caller frees). */
typedef struct call_ctx {
    const shape *s;
    const qrl_cuda_kvq_layer *c; /* NULL: BF16 KV */
    const uint16_t *kc, *vc;
    float *work;
    size_t wf;
} call_ctx;

static uint16_t *run_once(const call_ctx *x, int n, int max_len, int merge_kernel, const char *what) {
    const shape *s = x->s;
    size_t Q = (size_t)s->H * s->hd;
    setenv("QRL_ATTN_MERGE_KERNEL", merge_kernel ? "1" : "0", 1);
    guarded go = guarded_new((size_t)n * Q, 2);
    qrl_error err;
    if (x->c) {
        cr_assert_eq(qrl_cuda_attention_q(x->c, guarded_ptr(go), s->q, s->rseq, s->rpos, n, s->H,
                                          1.0f / sqrtf((float)s->hd), max_len, x->work, x->wf, NULL, &err),
                     QRL_OK, "%s: %s", what, err.msg);
    } else {
        qrl_cuda_attention_args a = {
            .out = guarded_ptr(go), .q = s->q, .k_cache = x->kc, .v_cache = x->vc, .block_tables = s->tables,
            .max_blocks_per_seq = s->mb, .block_size = BS, .row_seq = s->rseq, .row_pos = s->rpos, .n = n,
            .n_heads = s->H, .n_kv_heads = s->KVH, .head_dim = s->hd, .scale = 1.0f / sqrtf((float)s->hd),
            .max_len = max_len, .work = x->work, .work_floats = x->wf};
        cr_assert_eq(qrl_cuda_attention(&a, NULL, &err), QRL_OK, "%s: %s", what, err.msg);
    }
    uint16_t *o = malloc((size_t)n * Q * 2);
    guarded_fetch(go, o, what);
    unsetenv("QRL_ATTN_MERGE_KERNEL");
    tail_zero(x->work, x->wf, s->n, s->H, what);
    return o;
}

/* The call sequence of the header on one work buffer; every output memcmp-equal to the
 * separate merge's of the same rows. */
static void fused_vs_separate(const call_ctx *x, const int *lens, const char *name) {
    const shape *s = x->s;
    size_t Q = (size_t)s->H * s->hd, bytes = (size_t)s->n * Q * 2;
    char what[160];
    snprintf(what, sizeof what, "%s H=%d KVH=%d hd=%d n=%d", name, s->H, s->KVH, s->hd, s->n);
    uint16_t *sep = run_once(x, s->n, s->max_len, 1, what);
    for (int rep = 0; rep < 2; rep++) {
        uint16_t *fu = run_once(x, s->n, s->max_len, 0, what);
        size_t i = 0;
        while (i < bytes / 2 && fu[i] == sep[i]) i++;
        cr_assert(i == bytes / 2, "%s: fused call %d differs from the merge kernel at row %zu head %zu dim %zu: "
                  "%04x vs %04x", what, rep + 1, i / Q, i % Q / s->hd, i % s->hd, fu[i], sep[i]);
        free(fu);
    }
    uint16_t *sep2 = run_once(x, s->n, s->max_len, 1, what);
    cr_assert(memcmp(sep2, sep, bytes) == 0, "%s: merge kernel after the fused calls differs", what);
    /* fewer rows and a shorter bound (other splits, other counters), then the full batch */
    int n2 = s->n / 2, ml2 = 0;
    for (int r = 0; r < n2; r++) if (lens[r] > ml2) ml2 = lens[r];
    uint16_t *a = run_once(x, n2, ml2, 1, what), *b = run_once(x, n2, ml2, 0, what);
    cr_assert(memcmp(a, b, (size_t)n2 * Q * 2) == 0, "%s: %d rows: fused differs from the merge kernel", what, n2);
    uint16_t *fu = run_once(x, s->n, s->max_len, 0, what);
    cr_assert(memcmp(fu, sep, bytes) == 0, "%s: fused after the smaller batch differs", what);
    fprintf(stderr, "attn merge %s: fused == merge kernel (memcmp), %d and %d rows, counters zero\n", what, s->n, n2);
    free(sep); free(sep2); free(a); free(b); free(fu);
}

static void bf16_case(int n, int H, int KVH, int hd, uint64_t seed) {
    int *lens = malloc(n * sizeof *lens);
    ragged(lens, n, &seed);
    shape s = shape_new(n, H, KVH, hd, lens, &seed);
    size_t cache_n = (size_t)s.n_blocks * BS * KVH * hd;
    uint16_t *kv;
    qrl_error err;
    cr_assert_eq(qrl_cuda_malloc((void **)&kv, 2 * cache_n * 2, NULL), QRL_OK);
    cr_assert_eq(qrl_cuda_fill_random_bf16(kv, 2 * cache_n, seed, 0.0f, 1.0f, NULL, &err), QRL_OK, "%s", err.msg);
    size_t wf = qrl_cuda_attention_work_floats(n, H, hd, s.max_len);
    call_ctx x = {.s = &s, .kc = kv, .vc = kv + cache_n, .work = dev_zeroed(wf * 4), .wf = wf};
    fused_vs_separate(&x, lens, "bf16");
    qrl_cuda_free(x.work); qrl_cuda_free(kv);
    shape_free(&s);
    free(lens);
}

static void kvq_case(int fmt, int n, int H, int KVH, int hd, uint64_t seed) {
    int *lens = malloc(n * sizeof *lens);
    ragged(lens, n, &seed);
    shape s = shape_new(n, H, KVH, hd, lens, &seed);
    bool prot = fmt == QRL_CUDA_KVQ_INT4_PROTECTED;
    qrl_cuda_kvq_layer c = {.format = fmt, .block_tables = s.tables, .max_blocks_per_seq = s.mb,
                            .block_size = BS, .n_kv_heads = KVH, .head_dim = hd};
    if (prot) c.sink = 16, c.recent = 128, c.ring = 128 + QRL_CUDA_KV_RING_SLACK;
    size_t recs = (size_t)s.n_blocks * BS * KVH, side = prot ? (size_t)n * (c.sink + c.ring) * KVH : 0;
    int cb = qrl_cuda_kvq_code_bytes(fmt, hd), sf = qrl_cuda_kvq_scale_floats(fmt, hd);
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(qrl_cuda_malloc((void **)&c.codes[w], recs * cb, NULL), QRL_OK);
        if (sf) cr_assert_eq(qrl_cuda_malloc((void **)&c.scales[w], recs * sf * 4, NULL), QRL_OK);
        if (side) {
            cr_assert_eq(qrl_cuda_malloc((void **)&c.side_codes[w], side * hd, NULL), QRL_OK);
            cr_assert_eq(qrl_cuda_malloc((void **)&c.side_scales[w], side * 4, NULL), QRL_OK);
        }
    }
    cr_assert_eq(qrl_cuda_malloc((void **)&c.fp8_scale, (size_t)n * KVH * 2 * 4, NULL), QRL_OK);
    qrl_error err;
    cr_assert_eq(qrl_cuda_kvq_fill_random(&c, recs, side, n, seed, NULL, &err), QRL_OK, "%s", err.msg);
    size_t wf = qrl_cuda_attention_q_work_floats(n, H, hd, s.max_len);
    call_ctx x = {.s = &s, .c = &c, .work = dev_zeroed(wf * 4), .wf = wf};
    static const char *names[] = {"", "", "fp8", "int8", "int4", "fp4", "int4-protected"};
    fused_vs_separate(&x, lens, names[fmt]);
    for (int w = 0; w < 2; w++) {
        qrl_cuda_free(c.codes[w]); qrl_cuda_free(c.scales[w]);
        qrl_cuda_free(c.side_codes[w]); qrl_cuda_free(c.side_scales[w]);
    }
    qrl_cuda_free(c.fp8_scale); qrl_cuda_free(x.work);
    shape_free(&s);
    free(lens);
}

/* Qwen3-4B heads (G = 4): 40 rows fill the chip (chunks >= 512); G = 8 and G = 3 with few
 * kv heads (many short chunks); G = 1 at head_dim 64. */
Test(cuda_attn_merge, bf16_fused_equals_merge_kernel) {
    require_gpu();
    bf16_case(40, 32, 8, 128, 1);
    bf16_case(12, 16, 2, 128, 2);
    bf16_case(12, 12, 4, 64, 3);
    bf16_case(9, 8, 8, 64, 4);
}

Test(cuda_attn_merge, quantized_fused_equals_merge_kernel) {
    require_gpu();
    static const int fmts[] = {QRL_CUDA_KVQ_INT8, QRL_CUDA_KVQ_FP8, QRL_CUDA_KVQ_INT4, QRL_CUDA_KVQ_FP4,
                               QRL_CUDA_KVQ_INT4_PROTECTED};
    for (int f = 0; f < 5; f++) {
        kvq_case(fmts[f], 40, 32, 8, 128, 10 + f);
        kvq_case(fmts[f], 12, 16, 2, 128, 20 + f);
        kvq_case(fmts[f], 12, 12, 4, 64, 30 + f);
        kvq_case(fmts[f], 9, 8, 8, 64, 40 + f);
    }
}

/* A scratch one float short of the size function's (which ends in the counter tail) is
 * refused before any launch, naming the scratch. */
Test(cuda_attn_merge, scratch_must_hold_the_counters) {
    require_gpu();
    uint64_t seed = 5;
    int lens[4] = {100, 7, 300, 1};
    shape s = shape_new(4, 8, 2, 128, lens, &seed);
    size_t wf = qrl_cuda_attention_work_floats(4, 8, 128, 300);
    float *work = dev_zeroed(wf * 4);
    qrl_error err;
    qrl_cuda_attention_args a = {.out = NULL, .q = s.q, .block_tables = s.tables, .max_blocks_per_seq = s.mb,
                                 .block_size = BS, .row_seq = s.rseq, .row_pos = s.rpos, .n = 4, .n_heads = 8,
                                 .n_kv_heads = 2, .head_dim = 128, .scale = 0.1f, .max_len = 300, .work = work,
                                 .work_floats = wf - 1};
    cr_assert_eq(qrl_cuda_attention(&a, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "scratch"), "%s", err.msg);
    /* int4-protected: the protected split makes the size function's splits + 1 exact; the
     * chip-filling rule gives every 64-position chunk its split here (4 x 2 blocks rows) */
    qrl_cuda_kvq_layer c = {.format = QRL_CUDA_KVQ_INT4_PROTECTED, .block_tables = s.tables,
                            .max_blocks_per_seq = s.mb, .block_size = BS, .n_kv_heads = 2, .head_dim = 128,
                            .sink = 4, .recent = 8, .ring = 8 + QRL_CUDA_KV_RING_SLACK};
    size_t wq = qrl_cuda_attention_q_work_floats(4, 8, 128, 300);
    cr_assert_eq(qrl_cuda_attention_q(&c, NULL, s.q, s.rseq, s.rpos, 4, 8, 0.1f, 300, work, wq - 1, NULL, &err),
                 QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "scratch"), "%s", err.msg);
    qrl_cuda_free(work);
    shape_free(&s);
}
