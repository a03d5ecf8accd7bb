/* Learner checkpoints (common/learner/checkpoint.h) on a tiny random model:
 *  - round trip: every parameter bit-identical, the AdamW state file re-saved from the
 *    loaded optimizer byte-identical to the written one, the next AdamW step identical;
 *    every manifest field back as written (the run's settings too, also alone through
 *    qrl_ckpt_read_settings); trained ranges derived from the pending ids;
 *  - latest pointer, keep = 2 pruning, a partial folder (no manifest) ignored by find
 *    and refused when named;
 *  - refused with the file (and field) named: truncated / garbled params.safetensors,
 *    truncated optimizer.bin, a manifest that is not JSON, one missing a field, one whose
 *    ranges do not tile the dispatched ids, settings that are not strings, a model of
 *    another shape; a bad tag;
 *  - a learner restored from a checkpoint (parameters, AdamW, update count; UAQ 1.5)
 *    continues bit-identically to an uninterrupted one (without the update count: not). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "learner/checkpoint.h"
#include "learner/update.h"
#include "model/model.h"
#include "support/test_files.h"

#define TINY_JSON(D)                                                                           \
    "{\"model_type\": \"llama\", \"hidden_size\": " #D ", \"intermediate_size\": 64,"          \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"       \
    " \"vocab_size\": 16, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"            \
    " \"tie_word_embeddings\": false}"

static qrl_model *tiny(const char *json, uint64_t seed) {
    qrl_model_config cfg;
    qrl_error err;
    cr_assert_eq(qrl_model_config_parse_hf(json, strlen(json), "cfg", &cfg, &err), QRL_OK, "%s", err.msg);
    qrl_model *m;
    cr_assert_eq(qrl_model_new(&cfg, &m, &err), QRL_OK, "%s", err.msg);
    if (seed) qrl_model_init_random(m, seed);
    return m;
}

static size_t n_params(const qrl_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        n += (size_t)(m->tensors[i].shape[0] * (m->tensors[i].ndim > 1 ? m->tensors[i].shape[1] : 1));
    return n;
}

/* An optimizer that took two steps with pseudo-random gradients (m, v non-zero). */
static qrl_adamw_t *stepped_opt(qrl_model *m, float *grads) {
    size_t n = m->arena_floats;
    qrl_adamw_config c = qrl_adamw_config_default();
    qrl_adamw_t *o;
    qrl_error err;
    cr_assert_eq(qrl_adamw_new(n, &c, &o, &err), QRL_OK, "%s", err.msg);
    uint64_t s = 7;
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            grads[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 23) * 0.1f;
        }
        cr_assert_eq(qrl_adamw_step(o, m->arena, grads, 1e-3, NULL, &err), QRL_OK, "%s", err.msg);
    }
    return o;
}

static qrl_ckpt_state state(uint64_t step) {
    static qrl_ckpt_group pend[] = {{3, 0, 2, 1, true}, {7, 1, 0, 2, false}, {9, 1, 2, 2, true}};
    static qrl_ckpt_offset offs[] = {{0, 41}, {2, 7}};
    return (qrl_ckpt_state){.step = step, .version = step + 100, .run_id = 0xabcdef12345ull, .seed = 42,
                            .learner_updates = step, .uaq_scale = 1.5f, .model = "/m/stories.bin",
                            .tokenizer = "/m/tok512.bin", .dataset = "/d/p.jsonl", .dataset_prompts = 6,
                            .epoch = 1, .index = 3, .next_group_id = 10, .pending = pend, .n_pending = 3,
                            .results_topic = "qrl.results", .offsets = offs, .n_offsets = 2, .tag = "",
                            .unix_ms = 1234567,
                            .settings = "{\"learner.quota\":\"32\",\"learner.model\":\"/m/stories.bin\","
                                        "\"sampling.stop_token_ids\":\"1,2\"}"};
}

static void write_ok(const char *root, qrl_model *m, qrl_adamw_t *o, uint64_t step, int keep, char *dir) {
    qrl_ckpt_state s = state(step);
    qrl_error err;
    size_t bytes = 0;
    cr_assert_eq(qrl_ckpt_write(root, m, o, &s, keep, dir, &bytes, &err), QRL_OK, "%s", err.msg);
    cr_assert_gt(bytes, n_params(m) * 4 * 3, "params + m + v at least");
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

Test(learner_checkpoint, round_trip_bit_identical) {
    char base[64], root[128], dir[QRL_CKPT_PATH_MAX], found[QRL_CKPT_PATH_MAX], p[QRL_CKPT_PATH_MAX + 32];
    qrl_test_mkdtemp(base);
    snprintf(root, sizeof root, "%s/ck", base); /* created by the writer */
    qrl_model *m = tiny(TINY_JSON(32), 3);
    float *g = malloc(m->arena_floats * sizeof *g);
    qrl_adamw_t *o = stepped_opt(m, g);
    write_ok(root, m, o, 12, 2, dir);
    cr_assert(strstr(dir, "/ck/step-00000012"), "%s", dir);
    qrl_error err;
    cr_assert_eq(qrl_ckpt_find(root, found, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(found, dir);
    qrl_ckpt_state s;
    cr_assert_eq(qrl_ckpt_read(found, &s, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(s.step, 12);
    cr_assert_eq(s.version, 112);
    cr_assert_eq(s.run_id, 0xabcdef12345ull);
    cr_assert_eq(s.seed, 42);
    cr_assert_eq(s.learner_updates, 12);
    cr_assert_eq(s.uaq_scale, 1.5f);
    cr_assert_str_eq(s.model, "/m/stories.bin");
    cr_assert_str_eq(s.tokenizer, "/m/tok512.bin");
    cr_assert_str_eq(s.dataset, "/d/p.jsonl");
    cr_assert_str_eq(s.results_topic, "qrl.results");
    cr_assert_eq(s.dataset_prompts, 6);
    cr_assert_eq(s.epoch, 1);
    cr_assert_eq(s.index, 3);
    cr_assert_eq(s.next_group_id, 10);
    cr_assert_eq(s.n_pending, 3);
    cr_assert_eq(s.pending[1].id, 7);
    cr_assert_eq(s.pending[1].epoch, 1);
    cr_assert_eq(s.pending[1].index, 0);
    cr_assert_eq(s.pending[1].dispatch_version, 2);
    cr_assert(!s.pending[1].delivered);
    cr_assert(s.pending[2].delivered);
    cr_assert_eq(s.n_offsets, 2);
    cr_assert_eq(s.offsets[0].next_offset, 41);
    cr_assert_eq(s.offsets[1].partition, 2);
    cr_assert_eq(s.unix_ms, 1234567);
    /* the run's settings (issue 20: a resumed learner came back with T = 128, not its 32) */
    cr_assert_str_eq(s.settings, "{\"learner.quota\":\"32\",\"learner.model\":\"/m/stories.bin\","
                                 "\"sampling.stop_token_ids\":\"1,2\"}");
    char *only = NULL;
    cr_assert_eq(qrl_ckpt_read_settings(found, &only, &err), QRL_OK, "%s", err.msg);
    cr_assert_str_eq(only, s.settings);
    free(only);
    /* trained = 1..9 minus {3, 7, 9}: [1,2], [4,6], [8,8] */
    size_t n;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *man = slurp(p, &n);
    cr_assert(strstr(man, "\"trained_ranges\": [\n  [\n   1,\n   2\n  ],\n  [\n   4,\n   6\n  ],\n  [\n   8,\n   8\n  ]\n ]"),
              "%s", man);
    free(man);
    qrl_ckpt_state_free(&s);
    /* parameters: bit-identical in a zeroed model of the same shape */
    qrl_model *m2 = tiny(TINY_JSON(32), 0);
    cr_assert_eq(qrl_ckpt_load_params(found, m2, &err), QRL_OK, "%s", err.msg);
    for (int i = 0; i < m->n_tensors; i++) {
        size_t k = (size_t)(m->tensors[i].shape[0] * (m->tensors[i].ndim > 1 ? m->tensors[i].shape[1] : 1));
        cr_assert_eq(memcmp(m->tensors[i].data, m2->tensors[i].data, k * 4), 0, "%s", m->tensors[i].name);
    }
    /* optimizer: the loaded state saves to the same bytes, and steps the same way */
    qrl_adamw_config c = qrl_adamw_config_default();
    qrl_adamw_t *o2;
    cr_assert_eq(qrl_adamw_new(m->arena_floats, &c, &o2, &err), QRL_OK);
    cr_assert_eq(qrl_ckpt_load_optimizer(found, o2, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_adamw_steps(o2), 2);
    char p2[QRL_CKPT_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/optimizer.bin", dir);
    snprintf(p2, sizeof p2, "%s/../resaved.bin", dir);
    cr_assert_eq(qrl_adamw_save(o2, p2, &err), QRL_OK, "%s", err.msg);
    size_t n1, n2;
    char *b1 = slurp(p, &n1), *b2 = slurp(p2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0, "optimizer state differs after load");
    free(b1), free(b2);
    memcpy(m2->arena, m->arena, m->arena_floats * sizeof(float)); /* incl. rope tables */
    cr_assert_eq(qrl_adamw_step(o, m->arena, g, 1e-3, NULL, &err), QRL_OK);
    cr_assert_eq(qrl_adamw_step(o2, m2->arena, g, 1e-3, NULL, &err), QRL_OK);
    cr_assert_eq(memcmp(m->arena, m2->arena, m->arena_floats * sizeof(float)), 0);
    qrl_adamw_destroy(o), qrl_adamw_destroy(o2);
    qrl_model_free(m), qrl_model_free(m2);
    free(g);
    qrl_test_rmtree(base);
}

Test(learner_checkpoint, latest_keep_and_partial) {
    char root[64], dir[QRL_CKPT_PATH_MAX], found[QRL_CKPT_PATH_MAX], p[QRL_CKPT_PATH_MAX + 32];
    qrl_test_mkdtemp(root);
    qrl_model *m = tiny(TINY_JSON(32), 3);
    float *g = malloc(m->arena_floats * sizeof *g);
    qrl_adamw_t *o = stepped_opt(m, g);
    for (uint64_t st = 1; st <= 3; st++) write_ok(root, m, o, st, 2, dir);
    struct stat sb;
    snprintf(p, sizeof p, "%s/step-00000001", root);
    cr_assert_neq(stat(p, &sb), 0, "keep=2: step 1 removed");
    snprintf(p, sizeof p, "%s/step-00000002/manifest.json", root);
    cr_assert_eq(stat(p, &sb), 0, "step 2 kept");
    size_t n;
    snprintf(p, sizeof p, "%s/latest", root);
    char *latest = slurp(p, &n);
    cr_assert_str_eq(latest, "step-00000003\n");
    free(latest);
    /* a newer folder without a manifest (a crash mid-write) is ignored ... */
    snprintf(p, sizeof p, "%s/step-00000009", root);
    cr_assert_eq(mkdir(p, 0755), 0);
    char junk[QRL_CKPT_PATH_MAX + 64];
    snprintf(junk, sizeof junk, "%s/params.safetensors", p);
    spit(junk, "xx", 2);
    qrl_error err;
    cr_assert_eq(qrl_ckpt_find(root, found, &err), QRL_OK, "%s", err.msg);
    cr_assert(strstr(found, "step-00000003"), "%s", found);
    /* ... and refused when named */
    cr_assert_eq(qrl_ckpt_find(p, found, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "partial"), "%s", err.msg);
    /* an empty root has no checkpoint */
    char empty[QRL_CKPT_PATH_MAX + 32];
    snprintf(empty, sizeof empty, "%s/empty", root);
    cr_assert_eq(mkdir(empty, 0755), 0);
    cr_assert_eq(qrl_ckpt_find(empty, found, &err), QRL_STATUS_NOT_FOUND);
    cr_assert(strstr(err.msg, "no complete"), "%s", err.msg);
    /* a bad tag is refused before anything is written */
    qrl_ckpt_state s = state(4);
    s.tag = "../x";
    cr_assert_eq(qrl_ckpt_write(root, m, o, &s, 2, dir, NULL, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "tag"), "%s", err.msg);
    s.tag = "before-eval";
    cr_assert_eq(qrl_ckpt_write(root, m, o, &s, 2, dir, NULL, &err), QRL_OK, "%s", err.msg);
    cr_assert(strstr(dir, "step-00000004-before-eval"), "%s", dir);
    /* the partial step-9 is newer than every complete one: kept (it may be in progress) */
    cr_assert_eq(stat(p, &sb), 0);
    qrl_adamw_destroy(o);
    qrl_model_free(m);
    free(g);
    qrl_test_rmtree(root);
}

/* Write one checkpoint, damage it with `damage`, expect qrl_ckpt_read to fail with `st`
 * and a message containing both needles. */
static void refused(void (*damage)(const char *dir), qrl_status st, const char *n1, const char *n2) {
    char root[64], dir[QRL_CKPT_PATH_MAX];
    qrl_test_mkdtemp(root);
    qrl_model *m = tiny(TINY_JSON(32), 3);
    float *g = malloc(m->arena_floats * sizeof *g);
    qrl_adamw_t *o = stepped_opt(m, g);
    write_ok(root, m, o, 5, 2, dir);
    damage(dir);
    qrl_ckpt_state s;
    qrl_error err;
    cr_assert_eq(qrl_ckpt_read(dir, &s, &err), st, "%s", err.msg);
    cr_assert(strstr(err.msg, n1), "'%s' not in: %s", n1, err.msg);
    cr_assert(strstr(err.msg, n2), "'%s' not in: %s", n2, err.msg);
    qrl_adamw_destroy(o);
    qrl_model_free(m);
    free(g);
    qrl_test_rmtree(root);
}

static void truncate_file(const char *dir, const char *name) {
    char p[QRL_CKPT_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t n;
    char *b = slurp(p, &n);
    spit(p, b, n - 100);
    free(b);
}
static void trunc_params(const char *dir) { truncate_file(dir, "params.safetensors"); }
static void trunc_opt(const char *dir) { truncate_file(dir, "optimizer.bin"); }
static void garble_params(const char *dir) {
    char p[QRL_CKPT_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/params.safetensors", dir);
    size_t n;
    char *b = slurp(p, &n);
    b[n - 7] ^= 0x10; /* one bit of one weight: still a valid safetensors file */
    spit(p, b, n);
    free(b);
}
static void edit_manifest(const char *dir, const char *from, const char *to) {
    char p[QRL_CKPT_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    size_t n;
    char *b = slurp(p, &n);
    char *at = strstr(b, from);
    cr_assert_not_null(at, "%s not in the manifest", from);
    size_t out_n = n - strlen(from) + strlen(to);
    char *o = malloc(out_n + 1);
    memcpy(o, b, (size_t)(at - b));
    memcpy(o + (at - b), to, strlen(to));
    strcpy(o + (at - b) + strlen(to), at + strlen(from));
    spit(p, o, out_n);
    free(b), free(o);
}
static void not_json(const char *dir) { edit_manifest(dir, "\"step\"", "step"); }
static void no_field(const char *dir) { edit_manifest(dir, "\"next_group_id\"", "\"next_group\""); }
static void bad_ranges(const char *dir) { edit_manifest(dir, "\"next_group_id\": 10", "\"next_group_id\": 11"); }
static void bad_format(const char *dir) { edit_manifest(dir, "\"format_version\": 1", "\"format_version\": 9"); }
static void bad_settings(const char *dir) { edit_manifest(dir, "\"learner.quota\": \"32\"", "\"learner.quota\": 32"); }

Test(learner_checkpoint, damaged_files_refused_with_the_file_named) {
    refused(trunc_params, QRL_STATUS_CORRUPT, "params.safetensors", "truncated");
    refused(garble_params, QRL_STATUS_CORRUPT, "params.safetensors", "CRC");
    refused(trunc_opt, QRL_STATUS_CORRUPT, "optimizer.bin", "truncated");
    refused(not_json, QRL_STATUS_PARSE, "manifest.json", "line");
    refused(no_field, QRL_STATUS_CORRUPT, "manifest.json", "next_group_id");
    refused(bad_ranges, QRL_STATUS_CORRUPT, "manifest.json", "group 10");
    refused(bad_format, QRL_STATUS_UNSUPPORTED, "manifest.json", "format_version");
    refused(bad_settings, QRL_STATUS_CORRUPT, "manifest.json", "settings");
}

Test(learner_checkpoint, other_model_shape_refused) {
    char root[64], dir[QRL_CKPT_PATH_MAX];
    qrl_test_mkdtemp(root);
    qrl_model *m = tiny(TINY_JSON(32), 3);
    float *g = malloc(m->arena_floats * sizeof *g);
    qrl_adamw_t *o = stepped_opt(m, g);
    write_ok(root, m, o, 1, 2, dir);
    qrl_model *other = tiny(TINY_JSON(48), 0);
    qrl_error err;
    cr_assert_eq(qrl_ckpt_load_params(dir, other, &err), QRL_STATUS_CORRUPT);
    cr_assert(strstr(err.msg, "params.safetensors") && strstr(err.msg, "model.embed_tokens.weight"), "%s",
              err.msg);
    qrl_adamw_t *o2;
    qrl_adamw_config c = qrl_adamw_config_default();
    cr_assert_eq(qrl_adamw_new(other->arena_floats, &c, &o2, &err), QRL_OK);
    cr_assert_eq(qrl_ckpt_load_optimizer(dir, o2, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "optimizer.bin"), "%s", err.msg);
    qrl_adamw_destroy(o), qrl_adamw_destroy(o2);
    qrl_model_free(m), qrl_model_free(other);
    free(g);
    qrl_test_rmtree(root);
}

/* ---- resume through a checkpoint == an uninterrupted learner ---------------------------- */

/* Two groups of 4 responses over vocab 16; content fixed by `u` (the update index). */
typedef struct upd_groups {
    int32_t prompt[3], tok[2][4][5];
    float lp[2][4][5];
    qrl_learner_response r[2][4];
    qrl_learner_group g[2];
} upd_groups;

static void make_groups(upd_groups *x, int u) {
    for (int i = 0; i < 3; i++) x->prompt[i] = 1 + i;
    for (int g = 0; g < 2; g++) {
        for (int k = 0; k < 4; k++) {
            for (int t = 0; t < 5; t++) {
                x->tok[g][k][t] = (u * 5 + g * 3 + k * 7 + t) % 16;
                x->lp[g][k][t] = -2.0f - 0.1f * (float)t;
            }
            x->r[g][k] = (qrl_learner_response){.tokens = x->tok[g][k], .logprobs = x->lp[g][k],
                                                .n_tokens = 3 + (k + u) % 3, .reward = (float)((k + g + u) % 2)};
        }
        x->g[g] = (qrl_learner_group){.group_id = (uint64_t)(u * 2 + g + 1), .prompt = x->prompt, .n_prompt = 3,
                                      .responses = x->r[g], .n_responses = 4};
    }
}

static qrl_learner_t *new_learner(qrl_model *m) {
    qrl_learner_config c;
    qrl_learner_config_default(&c);
    c.lr.lr = 1e-2;
    c.minibatch_seqs = 3; /* several shuffled minibatches: the shuffle RNG must continue */
    c.ppo_epochs = 2;
    c.uaq_scale = 1.5f;
    c.seed = 9;
    qrl_learner_t *l;
    qrl_error err;
    cr_assert_eq(qrl_learner_new(m, &c, &l, &err), QRL_OK, "%s", err.msg);
    return l;
}

static void update(qrl_learner_t *l, int u) {
    upd_groups x;
    make_groups(&x, u);
    qrl_learner_stats s;
    qrl_error err;
    cr_assert_eq(qrl_learner_update(l, x.g, 2, &s, &err), QRL_OK, "%s", err.msg);
    cr_assert_gt(s.steps_taken, 0);
}

Test(learner_checkpoint, resumed_learner_equals_uninterrupted) {
    char root[64], dir[QRL_CKPT_PATH_MAX];
    qrl_test_mkdtemp(root);
    /* A: 3 updates in one go */
    qrl_model *ma = tiny(TINY_JSON(32), 5);
    qrl_learner_t *la = new_learner(ma);
    for (int u = 0; u < 3; u++) update(la, u);
    /* B: 1 update, checkpoint, a new process's model + learner (UAQ applied to the base
     * again, as the daemon does: the reference policy), restore, 2 more updates */
    qrl_model *mb = tiny(TINY_JSON(32), 5);
    qrl_learner_t *lb = new_learner(mb);
    update(lb, 0);
    qrl_ckpt_state s = state(1);
    s.learner_updates = qrl_learner_updates(lb);
    s.uaq_scale = mb->uaq_scale;
    qrl_error err;
    cr_assert_eq(qrl_ckpt_write(root, mb, qrl_learner_optimizer(lb), &s, 2, dir, NULL, &err), QRL_OK, "%s", err.msg);
    qrl_learner_destroy(lb);
    qrl_model_free(mb);
    qrl_model *mc = tiny(TINY_JSON(32), 5);
    qrl_learner_t *lc = new_learner(mc);
    qrl_ckpt_state r;
    cr_assert_eq(qrl_ckpt_read(dir, &r, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(r.uaq_scale, 1.5f);
    cr_assert_eq(qrl_ckpt_load_params(dir, mc, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_ckpt_load_optimizer(dir, qrl_learner_optimizer(lc), &err), QRL_OK, "%s", err.msg);
    qrl_learner_set_updates(lc, r.learner_updates);
    qrl_ckpt_state_free(&r);
    for (int u = 1; u < 3; u++) update(lc, u);
    cr_assert_eq(memcmp(ma->arena, mc->arena, ma->arena_floats * sizeof(float)), 0,
                 "resumed parameters differ from the uninterrupted run's");
    /* and the update count matters: a learner restored without it shuffles differently */
    qrl_model *md = tiny(TINY_JSON(32), 5);
    qrl_learner_t *ld = new_learner(md);
    cr_assert_eq(qrl_ckpt_load_params(dir, md, &err), QRL_OK);
    cr_assert_eq(qrl_ckpt_load_optimizer(dir, qrl_learner_optimizer(ld), &err), QRL_OK);
    for (int u = 1; u < 3; u++) update(ld, u);
    cr_assert_neq(memcmp(ma->arena, md->arena, ma->arena_floats * sizeof(float)), 0);
    qrl_learner_destroy(la), qrl_learner_destroy(lc), qrl_learner_destroy(ld);
    qrl_model_free(ma), qrl_model_free(mc), qrl_model_free(md);
    qrl_test_rmtree(root);
}
