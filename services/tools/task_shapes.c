/* Random-weight models of real shapes (task_shapes.h): qrl-task init-model --shape. */
#include "task_shapes.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/tensor.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct shape {
    const char *name;
    int hidden, layers, heads, kv_heads, head_dim, intermediate, ctx;
    bool tied;
} shape;

/* transformers' config.json of each model (Qwen/Qwen3-*; 0.6B-4B tie the LM head, 8B not) */
static const shape SHAPES[] = {
    {"qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 40960, true},
    {"qwen3-1.7b", 2048, 28, 16, 8, 128, 6144, 40960, true},
    {"qwen3-4b", 2560, 36, 32, 8, 128, 9728, 40960, true},
    {"qwen3-8b", 4096, 36, 32, 8, 128, 12288, 40960, false},
    {"qwen3-tiny", 64, 2, 2, 1, 32, 128, 4096, true}, /* CPU tests of the plumbing */
};

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("qrl-task: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static char *config_text(const shape *sh) {
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "bos_token_id", json_integer(151643));
    json_object_set_new(o, "eos_token_id", json_integer(151645));
    json_object_set_new(o, "head_dim", json_integer(sh->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "hidden_size", json_integer(sh->hidden));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "intermediate_size", json_integer(sh->intermediate));
    json_object_set_new(o, "max_position_embeddings", json_integer(sh->ctx));
    json_object_set_new(o, "max_window_layers", json_integer(sh->layers));
    json_object_set_new(o, "model_type", json_string("qwen3"));
    json_object_set_new(o, "num_attention_heads", json_integer(sh->heads));
    json_object_set_new(o, "num_hidden_layers", json_integer(sh->layers));
    json_object_set_new(o, "num_key_value_heads", json_integer(sh->kv_heads));
    json_object_set_new(o, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(o, "rope_scaling", json_null());
    json_object_set_new(o, "rope_theta", json_integer(1000000));
    json_object_set_new(o, "sliding_window", json_null());
    json_object_set_new(o, "tie_word_embeddings", json_boolean(sh->tied));
    json_object_set_new(o, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(o, "transformers_version", json_string("4.51.0"));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "use_sliding_window", json_false());
    json_object_set_new(o, "vocab_size", json_integer(151936));
    char *t = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return t;
}

static int write_file(const char *path, const void *data, size_t n) {
    qrl_atomic_file af;
    qrl_error err;
    qrl_status st = qrl_atomic_file_open(path, &af, &err);
    if (st == QRL_OK) st = qrl_atomic_file_write(&af, data, n, &err);
    if (st == QRL_OK) st = qrl_atomic_file_commit(&af, &err);
    else qrl_atomic_file_abort(&af);
    return st == QRL_OK ? 0 : fail(1, "%s", err.msg);
}

/* Copy src to dst; 1 when src is missing (nothing written), -1 on an error (printed). */
static int copy_file(const char *src, const char *dst) {
    FILE *f = fopen(src, "rb");
    if (!f) return errno == ENOENT ? 1 : (fail(1, "%s: %s", src, strerror(errno)), -1);
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    do {
        if (n + 65536 > cap) {
            cap = cap ? 2 * cap : 1 << 20;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf), fclose(f);
                return fail(1, "%s: out of memory", src), -1;
            }
            buf = nb;
        }
        r = fread(buf + n, 1, cap - n, f);
        n += r;
    } while (r > 0);
    int bad = ferror(f);
    fclose(f);
    int rc = bad ? (fail(1, "%s: read error", src), 1) : write_file(dst, buf, n);
    free(buf);
    return rc ? -1 : 0;
}

int qrl_task_init_shape(const char *name, const char *tok_dir, const char *out, uint64_t seed) {
    const shape *sh = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strcmp(SHAPES[i].name, name) == 0) sh = &SHAPES[i];
    if (!sh)
        return fail(2, "--shape: '%s' is not qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or qwen3-tiny", name);
    if (!tok_dir) return fail(2, "--shape needs --tokenizer DIR (vocab.json + merges.txt or tokenizer.json)");
    double t0 = now_s();
    char *cj = config_text(sh);
    if (!cj) return fail(1, "config.json: out of memory");
    qrl_model_config cfg;
    qrl_model *m = NULL;
    qrl_error err;
    if (qrl_model_config_parse_hf(cj, strlen(cj), "init-model", &cfg, &err) != QRL_OK ||
        qrl_model_new(&cfg, &m, &err) != QRL_OK) {
        free(cj);
        return fail(1, "%s", err.msg);
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        free(cj);
        qrl_model_free(m);
        return fail(1, "%s: cannot create: %s", out, strerror(errno));
    }

    /* BF16 weights straight from the generator: work items of 1M elements, each seeded
     * by (seed, tensor, chunk), so any thread count gives the same file */
    enum { CHUNK = 1 << 20 };
    size_t nt = (size_t)m->n_tensors, total = 0, n_items = 0;
    size_t *first = calloc(nt + 1, sizeof *first), *toff = calloc(nt + 1, sizeof *toff);
    for (size_t i = 0; first && toff && i < nt; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        first[i] = n_items, toff[i] = total;
        n_items += (cnt + CHUNK - 1) / CHUNK;
        total += cnt;
    }
    uint16_t *w = first && toff ? malloc(total * sizeof *w) : NULL;
    qrl_safetensors_entry *ent = calloc(nt ? nt : 1, sizeof *ent);
    qrl_tensor *tens = calloc(nt ? nt : 1, sizeof *tens);
    int rc = 0;
    if (!w || !ent || !tens) {
        rc = fail(1, "init-model: cannot allocate %zu MiB", total * 2 >> 20);
        goto done;
    }
    first[nt] = n_items, toff[nt] = total;
    const double stdv = 0.02 * sqrt(768.0 / cfg.dim);
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t it = 0; it < n_items; it++) {
        size_t ti = 0; /* the tensor of item `it`: the last with first[ti] <= it */
        size_t lo = 0, hi = nt;
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (first[mid] <= it) lo = mid;
            else hi = mid;
        }
        ti = lo;
        const qrl_model_tensor *t = &m->tensors[ti];
        size_t cnt = toff[ti + 1] - toff[ti], b = (it - first[ti]) * CHUNK;
        size_t e = b + CHUNK < cnt ? b + CHUNK : cnt;
        bool matrix = t->ndim == 2, bias = strstr(t->name, ".bias") != NULL;
        double sd = matrix ? stdv : bias ? 0.02 : 0.1, mean = matrix || bias ? 0.0 : 1.0;
        uint64_t s = seed ^ 0x5eed5eed5eedull;
        s ^= splitmix64(&s) ^ ((uint64_t)ti << 40) ^ (uint64_t)(it - first[ti]);
        uint16_t *dst = w + toff[ti];
        for (size_t j = b; j < e; j += 2) { /* Box-Muller: both values of a pair */
            double u1 = ((splitmix64(&s) >> 11) + 1.0) * 0x1.0p-53;
            double u2 = (splitmix64(&s) >> 11) * 0x1.0p-53;
            double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
            dst[j] = qrl_f32_to_bf16((float)(mean + sd * r * cos(a)));
            if (j + 1 < e) dst[j + 1] = qrl_f32_to_bf16((float)(mean + sd * r * sin(a)));
        }
    }
    double t_gen = now_s() - t0;
    for (size_t i = 0; i < nt; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        qrl_tensor_init(&tens[i], QRL_DTYPE_BF16, t->ndim, t->shape, w + toff[i]);
        ent[i] = (qrl_safetensors_entry){.name = t->name, .tensor = &tens[i]};
    }
    char path[4096], src[4096];
    const char *meta[] = {"format", "pt"};
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (qrl_safetensors_write(path, ent, nt, meta, 1, &err) != QRL_OK) {
        rc = fail(1, "%s", err.msg);
        goto done;
    }
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out);
    size_t cl = strlen(cj);
    char *cjn = malloc(cl + 2);
    if (!cjn) {
        rc = fail(1, "config.json: out of memory");
        goto done;
    }
    memcpy(cjn, cj, cl), cjn[cl] = '\n';
    rc = write_file(cfg_path, cjn, cl + 1);
    free(cjn);
    if (rc) goto done;

    /* the tokenizer files, then load it back as the daemons do */
    static const char *const TOK_FILES[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json",
                                            "merges.txt", "special_tokens_map.json", "added_tokens.json"};
    bool have[6] = {0};
    for (int i = 0; i < 6; i++) {
        snprintf(src, sizeof src, "%s/%s", tok_dir, TOK_FILES[i]);
        snprintf(path, sizeof path, "%s/%s", out, TOK_FILES[i]);
        int c = copy_file(src, path);
        if (c < 0) {
            rc = 1;
            goto done;
        }
        have[i] = c == 0;
    }
    if (!have[0] && !(have[2] && have[3])) {
        rc = fail(1, "--tokenizer %s: no tokenizer.json, and not both vocab.json and merges.txt", tok_dir);
        goto done;
    }
    qrl_tokenizer *tok;
    if (qrl_tokenizer_load(out, cfg.vocab_size, &tok, &err) != QRL_OK) {
        rc = fail(1, "%s", err.msg);
        goto done;
    }
    int tv = qrl_tokenizer_vocab_size(tok);
    const char *tmpl = qrl_tokenizer_chat_template_name(tok);
    qrl_tokenizer_free(tok);
    if (tv > cfg.vocab_size) {
        rc = fail(1, "--tokenizer %s: %d ids, more than the model's vocabulary %d", tok_dir, tv, cfg.vocab_size);
        goto done;
    }
    qrl_model_config back; /* the written config.json reads back as the shape */
    if (qrl_model_config_load_hf(cfg_path, &back, &err) != QRL_OK) {
        rc = fail(1, "%s", err.msg);
        goto done;
    }
    if (back.dim != cfg.dim || back.n_layers != cfg.n_layers || back.head_dim != cfg.head_dim ||
        back.n_kv_heads != cfg.n_kv_heads || back.hidden_dim != cfg.hidden_dim || !back.qk_norm ||
        back.tie_embeddings != sh->tied) {
        rc = fail(1, "%s: reads back as another shape", cfg_path);
        goto done;
    }
    printf("{\"out\": \"%s\", \"shape\": \"%s\", \"params\": %zu, \"bytes\": %zu, \"tokenizer_ids\": %d, "
           "\"chat_template\": \"%s\", \"generate_s\": %.2f, \"seconds\": %.2f}\n",
           out, sh->name, total, total * 2, tv, tmpl, t_gen, now_s() - t0);
done:
    free(cj);
    free(w);
    free(ent);
    free(tens);
    free(first);
    free(toff);
    qrl_model_free(m);
    return rc;
}
