/* GPU memory budget of the rollout scheduler's CUDA engine (common/rollout/gpu_memory.h):
 * the kv_blocks formula (budget, cap at D full contexts, too small a budget refused), the
 * engine-size estimate (KV bytes per position per format, the int4-protected side cache
 * per slot, quantized weights smaller than BF16), and the refusal without a GPU.  No CUDA
 * call reaches a device: runs on CPU-only machines. */
#include <criterion/criterion.h>
#include <string.h>

#include "rollout/gpu_memory.h"

#define GiB ((size_t)1 << 30)
#define MiB ((size_t)1 << 20)

static qrl_gpu_budget budget(void) {
    return (qrl_gpu_budget){.device_bytes = 80 * GiB, .utilization = 0.5, .fixed_bytes = 10 * GiB,
                            .slot_bytes = 1 * MiB, .kv_bytes_per_pos = 144 * 1024,
                            .block_size = 16, .ctx_len = 40960, .max_slots = 16};
}

Test(gpu_memory, kv_blocks_formula) {
    qrl_gpu_budget b = budget();
    int blocks = -1;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_OK, "%s", err.msg);
    /* (0.5 x 80 GiB - 10 GiB - 16 x 1 MiB) / (16 x 144 KiB) */
    size_t want = (40 * GiB - 10 * GiB - 16 * MiB) / (16 * 144 * 1024);
    cr_assert_eq((size_t)blocks, want, "blocks %d, want %zu", blocks, want);
    cr_assert_lt((size_t)blocks, (size_t)16 * 2560, "below the cap of D full contexts");
    /* the pool fits the budget, one block more would not */
    size_t used = b.fixed_bytes + 16 * b.slot_bytes + (size_t)blocks * 16 * b.kv_bytes_per_pos;
    cr_assert_leq(used, 40 * GiB);
    cr_assert_gt(used + 16 * b.kv_bytes_per_pos, 40 * GiB);
}

Test(gpu_memory, kv_blocks_capped_at_full_contexts) {
    qrl_gpu_budget b = budget();
    b.utilization = 1.0, b.kv_bytes_per_pos = 512; /* a tiny model: the budget never binds */
    int blocks;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(blocks, 16 * 2560, "D x ceil(ctx / block) = what kv_blocks 0 gives");
    b.ctx_len = 40961; /* ceil */
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(blocks, 16 * 2561);
}

Test(gpu_memory, kv_blocks_exactly_one_context) {
    qrl_gpu_budget b = budget();
    b.utilization = 1.0;
    size_t one = 2560 * 16 * b.kv_bytes_per_pos;
    b.fixed_bytes = b.device_bytes - 16 * b.slot_bytes - one; /* room for exactly one context */
    int blocks;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(blocks, 2560);
    b.fixed_bytes += 1;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_STATUS_OUT_OF_RANGE);
}

Test(gpu_memory, too_small_budget_refused) {
    qrl_gpu_budget b = budget();
    b.utilization = 0.1; /* 8 GiB < the 10 GiB fixed part */
    int blocks = 7;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(blocks, 0);
    cr_assert(strstr(err.msg, "one full context") && strstr(err.msg, "raise the utilization"), "%s",
              err.msg);
}

Test(gpu_memory, bad_fields_refused) {
    double bad_u[] = {0, -0.1, 1.01};
    for (int i = 0; i < 3; i++) {
        qrl_gpu_budget b = budget();
        b.utilization = bad_u[i];
        int blocks;
        qrl_error err;
        cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_STATUS_OUT_OF_RANGE, "u=%g", bad_u[i]);
        cr_assert(strstr(err.msg, "outside (0, 1]"), "%s", err.msg);
    }
    qrl_gpu_budget b = budget();
    b.kv_bytes_per_pos = 0;
    int blocks;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b, &blocks, &err), QRL_STATUS_OUT_OF_RANGE);
}

/* A model struct with only what the estimate reads (cfg, precision). */
static qrl_model shape(int dim, int hidden, int layers, int heads, int kv_heads, int head_dim,
                       int vocab, int ctx, qrl_precision p) {
    qrl_model m;
    memset(&m, 0, sizeof m);
    m.cfg.dim = dim, m.cfg.hidden_dim = hidden, m.cfg.n_layers = layers, m.cfg.n_heads = heads;
    m.cfg.n_kv_heads = kv_heads, m.cfg.head_dim = head_dim, m.cfg.vocab_size = vocab;
    m.cfg.max_seq_len = ctx, m.cfg.tie_embeddings = true;
    m.precision = p;
    return m;
}

Test(gpu_memory, estimate_kv_bytes_per_format) {
    qrl_model m = shape(64, 172, 4, 4, 4, 16, 36, 128, QRL_PRECISION_F32);
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    struct { qrl_kv_format f; size_t rec; } cases[] = {
        {QRL_KV_FORMAT_F32, 32},  /* runs as bf16 on the GPU */
        {QRL_KV_FORMAT_BF16, 32}, {QRL_KV_FORMAT_FP8, 16}, {QRL_KV_FORMAT_INT8, 20},
        {QRL_KV_FORMAT_INT4, 16}, /* 8 codes + 2 F32 of one 32-group */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sc.kv_format = cases[i].f;
        qrl_gpu_budget b;
        qrl_gpu_budget_estimate(&m, &sc, &b);
        cr_assert_eq(b.kv_bytes_per_pos, (size_t)4 * 2 * 4 * cases[i].rec, "format %s: %zu",
                     qrl_kv_format_name(cases[i].f), b.kv_bytes_per_pos);
        cr_assert_eq(b.ctx_len, 128);
        cr_assert_eq(b.block_size, 16);
        cr_assert_eq(b.max_slots, 16);
        cr_assert_geq(b.fixed_bytes, QRL_GPU_BUDGET_RESERVE_BYTES);
    }
    sc.max_ctx = 100; /* a shorter context bounds the sequences */
    qrl_gpu_budget b;
    qrl_gpu_budget_estimate(&m, &sc, &b);
    cr_assert_eq(b.ctx_len, 100);
}

Test(gpu_memory, estimate_int4_protected_side_cache_per_slot) {
    qrl_model m = shape(2560, 9728, 36, 32, 8, 128, 151936, 40960, QRL_PRECISION_BF16); /* Qwen3-4B */
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.kv_format = QRL_KV_FORMAT_INT4;
    qrl_gpu_budget plain;
    qrl_gpu_budget_estimate(&m, &sc, &plain);
    sc.kv_format = QRL_KV_FORMAT_INT4_PROTECTED;
    qrl_gpu_budget prot;
    qrl_gpu_budget_estimate(&m, &sc, &prot);
    cr_assert_eq(prot.kv_bytes_per_pos, plain.kv_bytes_per_pos);
    /* (sink 16 + recent 128 + 64 ring slack) x (128 + 4) bytes, K and V, 8 heads, 36 layers */
    size_t side = (size_t)36 * 2 * 8 * (16 + 128 + 64) * (128 + 4);
    cr_assert_eq(prot.slot_bytes - plain.slot_bytes, side, "%zu", prot.slot_bytes - plain.slot_bytes);
}

Test(gpu_memory, estimate_trace_recorder) {
    /* Qwen3-1.7B shapes, w4a4-nvfp4, the default sites (every linear input of 28 layers;
     * with fp4 KV also K / V of layers 14-27) */
    qrl_model m = shape(2048, 6144, 28, 16, 8, 128, 151936, 40960, QRL_PRECISION_W4A4_NVFP4);
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.kv_format = QRL_KV_FORMAT_INT8;
    qrl_gpu_budget off, on;
    qrl_gpu_budget_estimate(&m, &sc, &off);
    sc.trace_record = true;
    qrl_gpu_budget_estimate(&m, &sc, &on);
    /* per layer: attn_in 2048, attn_out 2048, mlp_in 2048, mlp_down 6144 -> 4 + n/16 + n/8 */
    size_t site = 0;
    int lens[] = {2048, 2048, 2048, 6144};
    for (int i = 0; i < 4; i++) site += 4 + lens[i] / 16 + lens[i] / 8;
    cr_assert_eq(on.slot_bytes - off.slot_bytes, QRL_GPU_TRACE_WINDOW * 28 * site, "%zu",
                 on.slot_bytes - off.slot_bytes);
    cr_assert_gt(on.fixed_bytes, off.fixed_bytes + on.slot_bytes - off.slot_bytes);
    /* fp4 KV: K / V heads of the deeper 14 layers too, and the pass's KV record copies */
    sc.kv_format = QRL_KV_FORMAT_FP4;
    qrl_gpu_budget kv_off, kv_on;
    sc.trace_record = false;
    qrl_gpu_budget_estimate(&m, &sc, &kv_off);
    sc.trace_record = true;
    qrl_gpu_budget_estimate(&m, &sc, &kv_on);
    size_t kv = (size_t)14 * 2 * 8 * (4 + 128 / 16 + 128 / 8);
    cr_assert_eq(kv_on.slot_bytes - kv_off.slot_bytes, QRL_GPU_TRACE_WINDOW * (28 * site + kv));
    cr_assert_gt(kv_on.fixed_bytes - kv_off.fixed_bytes, on.fixed_bytes - off.fixed_bytes);
}

Test(gpu_memory, estimate_weights) {
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.kv_format = QRL_KV_FORMAT_BF16;
    qrl_model bf = shape(2560, 9728, 36, 32, 8, 128, 151936, 40960, QRL_PRECISION_BF16);
    qrl_model i8 = bf;
    i8.precision = QRL_PRECISION_W8A8_INT8;
    qrl_gpu_budget b16, b8;
    qrl_gpu_budget_estimate(&bf, &sc, &b16);
    qrl_gpu_budget_estimate(&i8, &sc, &b8);
    /* BF16: at least 2 bytes per parameter (about 4.0e9 with the tied embedding) */
    size_t D = 2560, F = 9728, Q = 32 * 128, KV = 8 * 128, V = 151936;
    size_t params = V * D + 36 * ((Q + 2 * KV) * D + D * Q + 3 * F * D);
    cr_assert_geq(b16.fixed_bytes, 2 * params + QRL_GPU_BUDGET_RESERVE_BYTES);
    cr_assert_lt(b16.fixed_bytes, 2 * params + 8 * GiB, "%.2f GiB", (double)b16.fixed_bytes / GiB);
    /* w8a8 projections: one byte per weight instead of two */
    cr_assert_lt(b8.fixed_bytes + 2 * GiB, b16.fixed_bytes, "w8a8 %.2f GiB bf16 %.2f GiB",
                 (double)b8.fixed_bytes / GiB, (double)b16.fixed_bytes / GiB);
    /* and with 0.4 of an H200 (141 GiB) and 16 slots, not 16 full 40960-position contexts */
    b16.device_bytes = 141 * GiB, b16.utilization = 0.4;
    int blocks;
    qrl_error err;
    cr_assert_eq(qrl_gpu_budget_kv_blocks(&b16, &blocks, &err), QRL_OK, "%s", err.msg);
    cr_assert_lt(blocks, 16 * 2560);
    cr_assert_geq(blocks, 2560, "at least one full context");
}

Test(gpu_memory, fit_without_a_gpu_is_refused) {
    /* this test machine has no usable GPU (a GPU machine skips it) */
    if (qrl_rollout_gpu_check(0, NULL, 0, NULL, NULL) == QRL_OK) cr_skip_test("a GPU is visible");
    qrl_model m = shape(64, 172, 4, 4, 4, 16, 36, 128, QRL_PRECISION_F32);
    qrl_scheduler_config sc;
    qrl_scheduler_config_default(&sc);
    sc.device = 0;
    qrl_error err;
    qrl_status st = qrl_scheduler_config_fit_gpu(&sc, &m, 0.5, &err);
    cr_assert(st == QRL_STATUS_UNSUPPORTED || st == QRL_STATUS_CUDA, "%d", st);
    cr_assert(strncmp(err.msg, "gpu_memory_utilization 0.5: ", 28) == 0, "%s", err.msg);
    cr_assert(strstr(err.msg, "does not exist") || strstr(err.msg, "no CUDA"), "%s", err.msg);
    cr_assert_eq(sc.kv_blocks, 0, "config untouched");
}
