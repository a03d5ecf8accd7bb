/* Learner checkpoints: folder layout, manifest, resolve, validate (checkpoint.h). */
#include "learner/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

#define MANIFEST "manifest.json"
#define PARAMS "params.safetensors"
#define OPTIMIZER "optimizer.bin"

void qrl_ckpt_state_free(qrl_ckpt_state *s) {
    if (!s) return;
    free(s->model), free(s->tokenizer), free(s->dataset), free(s->results_topic), free(s->tag), free(s->settings);
    free(s->pending), free(s->offsets);
    memset(s, 0, sizeof *s);
}

/* a/b into out[QRL_CKPT_PATH_MAX]; paths that long are cut (and then not found). */
static void join(char *out, const char *a, const char *b) {
    if (snprintf(out, QRL_CKPT_PATH_MAX, "%s/%s", a, b) >= QRL_CKPT_PATH_MAX) out[QRL_CKPT_PATH_MAX - 1] = 0;
}

/* Size and CRC-32 of a whole file. */
static qrl_status file_crc(const char *path, uint64_t *size, uint32_t *crc, qrl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                                 "%s: cannot open: %s", path, strerror(errno));
    static _Thread_local unsigned char buf[1 << 16];
    uint32_t c = 0;
    uint64_t n = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) c = qrl_crc32(c, buf, k), n += k;
    bool bad = ferror(f);
    fclose(f);
    if (bad) return qrl_error_set(err, QRL_STATUS_IO, "%s: read error", path);
    *size = n;
    *crc = c;
    return QRL_OK;
}

static qrl_status write_text(const char *path, const char *text, qrl_error *err) {
    qrl_atomic_file af;
    QRL_TRY(qrl_atomic_file_open(path, &af, err));
    qrl_status st = qrl_atomic_file_write(&af, text, strlen(text), err);
    if (st != QRL_OK) {
        qrl_atomic_file_abort(&af);
        return st;
    }
    return qrl_atomic_file_commit(&af, err);
}

static qrl_status write_params(const char *path, const qrl_model *m, const qrl_ckpt_state *s, qrl_error *err) {
    qrl_safetensors_entry *e = calloc((size_t)m->n_tensors, sizeof *e);
    qrl_tensor *t = calloc((size_t)m->n_tensors, sizeof *t);
    if (!e || !t) {
        free(e), free(t);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: tensor table", path);
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *mt = &m->tensors[i];
        qrl_tensor_init(&t[i], QRL_DTYPE_F32, mt->ndim, mt->shape, mt->data);
        e[i] = (qrl_safetensors_entry){mt->name, &t[i]};
    }
    char step[32], ver[32], uaq[32];
    snprintf(step, sizeof step, "%" PRIu64, s->step);
    snprintf(ver, sizeof ver, "%" PRIu64, s->version);
    snprintf(uaq, sizeof uaq, "%.9g", (double)s->uaq_scale);
    const char *meta[] = {"format", QRL_CKPT_FORMAT, "step", step, "version", ver, "uaq_scale", uaq};
    qrl_status st = qrl_safetensors_write(path, e, (size_t)m->n_tensors, meta, 4, err);
    free(e), free(t);
    return st;
}

static json_t *ju(uint64_t v) { return json_integer((json_int_t)v); }

static qrl_status add_file(json_t *files, const char *dir, const char *name, size_t *bytes, qrl_error *err) {
    char p[QRL_CKPT_PATH_MAX];
    join(p, dir, name);
    uint64_t size;
    uint32_t crc;
    QRL_TRY(file_crc(p, &size, &crc, err));
    json_object_set_new(files, name, json_pack("{s:I,s:I}", "bytes", (json_int_t)size, "crc32", (json_int_t)crc));
    *bytes += size;
    return QRL_OK;
}

static json_t *manifest_json(const qrl_ckpt_state *s, json_t *files) {
    json_t *pend = json_array(), *ranges = json_array(), *offs = json_array();
    for (size_t i = 0; i < s->n_pending; i++) {
        const qrl_ckpt_group *g = &s->pending[i];
        json_array_append_new(pend, json_pack("{s:I,s:I,s:I,s:I,s:b}", "id", (json_int_t)g->id, "epoch",
                                              (json_int_t)g->epoch, "index", (json_int_t)g->index,
                                              "dispatch_version", (json_int_t)g->dispatch_version,
                                              "delivered", g->delivered));
    }
    uint64_t lo = 1; /* trained = [1, next_group_id) minus the pending ids */
    for (size_t i = 0; i <= s->n_pending; i++) {
        uint64_t hi = i < s->n_pending ? s->pending[i].id : s->next_group_id;
        if (hi > lo) json_array_append_new(ranges, json_pack("[I,I]", (json_int_t)lo, (json_int_t)(hi - 1)));
        lo = hi + 1;
    }
    for (size_t i = 0; i < s->n_offsets; i++)
        json_array_append_new(offs, json_pack("{s:i,s:I}", "partition", (int)s->offsets[i].partition,
                                              "next_offset", (json_int_t)s->offsets[i].next_offset));
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string(QRL_CKPT_FORMAT));
    json_object_set_new(j, "format_version", json_integer(QRL_CKPT_FORMAT_VERSION));
    json_object_set_new(j, "step", ju(s->step));
    json_object_set_new(j, "version", ju(s->version));
    json_object_set_new(j, "run_id", ju(s->run_id));
    json_object_set_new(j, "seed", ju(s->seed));
    json_object_set_new(j, "learner_updates", ju(s->learner_updates));
    json_object_set_new(j, "uaq_scale", json_real(s->uaq_scale));
    json_object_set_new(j, "model", json_string(s->model ? s->model : ""));
    json_object_set_new(j, "tokenizer", json_string(s->tokenizer ? s->tokenizer : ""));
    json_object_set_new(j, "dataset", json_pack("{s:s,s:I,s:I,s:I}", "path", s->dataset ? s->dataset : "",
                                                "prompts", (json_int_t)s->dataset_prompts, "epoch",
                                                (json_int_t)s->epoch, "index", (json_int_t)s->index));
    json_object_set_new(j, "next_group_id", ju(s->next_group_id));
    json_object_set_new(j, "pending", pend);
    json_object_set_new(j, "trained_ranges", ranges);
    json_object_set_new(j, "results", json_pack("{s:s,s:o}", "topic", s->results_topic ? s->results_topic : "",
                                                "offsets", offs));
    json_object_set_new(j, "tag", json_string(s->tag ? s->tag : ""));
    json_object_set_new(j, "unix_ms", ju(s->unix_ms));
    json_t *settings = s->settings ? json_loads(s->settings, 0, NULL) : NULL;
    if (json_is_object(settings)) json_object_set_new(j, "settings", settings);
    else json_decref(settings);
    json_object_set_new(j, "files", files);
    return j;
}

/* "step-00000012[-tag]" -> step, or -1 when the name is not a checkpoint folder. */
static int64_t parse_step(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    int64_t v = 0;
    int n = 0;
    while (*p >= '0' && *p <= '9' && n < 18) v = v * 10 + (*p++ - '0'), n++;
    if (n < 8 || (*p && *p != '-') || strstr(name, ".tmp")) return -1;
    return v;
}

typedef struct entry {
    char name[256];
    int64_t step;
    bool complete;
} entry;

/* step-* folders of root, newest first (step, then name). */
static int cmp_entry(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->step != y->step) return x->step > y->step ? -1 : 1;
    return -strcmp(x->name, y->name);
}

static qrl_status list_root(const char *root, entry **out, size_t *n, qrl_error *err) {
    *out = NULL;
    *n = 0;
    DIR *dh = opendir(root);
    if (!dh) return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                                  "%s: cannot open the folder: %s", root, strerror(errno));
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(dh))) {
        int64_t step = parse_step(de->d_name);
        if (step < 0 || strlen(de->d_name) >= sizeof((entry *)0)->name) continue;
        char p[QRL_CKPT_PATH_MAX];
        struct stat sb;
        join(p, root, de->d_name);
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            entry *ne = realloc(*out, cap * sizeof *ne);
            if (!ne) {
                closedir(dh);
                return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: listing", root);
            }
            *out = ne;
        }
        entry *e = &(*out)[(*n)++];
        snprintf(e->name, sizeof e->name, "%s", de->d_name);
        e->step = step;
        char mp[QRL_CKPT_PATH_MAX + 32];
        snprintf(mp, sizeof mp, "%s/%s", p, MANIFEST);
        e->complete = access(mp, F_OK) == 0;
    }
    closedir(dh);
    if (*n) qsort(*out, *n, sizeof **out, cmp_entry);
    return QRL_OK;
}

static void remove_folder(const char *root, const char *name) {
    char dir[QRL_CKPT_PATH_MAX], p[QRL_CKPT_PATH_MAX];
    join(dir, root, name);
    /* the manifest first: a half-removed folder is then partial, never read */
    join(p, dir, MANIFEST);
    unlink(p);
    DIR *dh = opendir(dir);
    if (dh) {
        struct dirent *de;
        while ((de = readdir(dh)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                join(p, dir, de->d_name);
                unlink(p);
            }
        closedir(dh);
    }
    if (rmdir(dir) != 0) QRL_LOG_WARN("checkpoint", "cannot remove %s: %s", dir, strerror(errno));
    else QRL_LOG_INFO("checkpoint", "removed old checkpoint %s", dir);
}

static void prune(const char *root, const char *current, int keep) {
    entry *es;
    size_t n;
    qrl_error err;
    if (list_root(root, &es, &n, &err) != QRL_OK) {
        QRL_LOG_WARN("checkpoint", "prune: %s", err.msg);
        return;
    }
    int kept = 0;
    int64_t newest = -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(es[i].name, current) == 0 || (es[i].complete && kept < keep)) {
            if (es[i].complete) {
                kept++;
                if (newest < 0) newest = es[i].step;
            }
            continue;
        }
        if (es[i].complete || (newest >= 0 && es[i].step < newest)) remove_folder(root, es[i].name);
    }
    free(es);
}

static bool tag_ok(const char *t) {
    for (; *t; t++)
        if (!((*t >= 'a' && *t <= 'z') || (*t >= 'A' && *t <= 'Z') || (*t >= '0' && *t <= '9') || *t == '_' ||
              *t == '.' || *t == '-'))
            return false;
    return true;
}

qrl_status qrl_ckpt_write(const char *root, const qrl_model *m, const qrl_adamw_t *opt,
                          const qrl_ckpt_state *s, int keep, char *out_dir, size_t *bytes_out,
                          qrl_error *err) {
    const char *tag = s->tag ? s->tag : "";
    if (keep < 1) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "checkpoint keep: %d, expected >= 1", keep);
    if (!tag_ok(tag) || strlen(tag) > 64)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "checkpoint tag '%s': use at most 64 of "
                             "[A-Za-z0-9_.-]", tag);
    char name[128], dir[QRL_CKPT_PATH_MAX], p[QRL_CKPT_PATH_MAX];
    snprintf(name, sizeof name, "step-%08" PRIu64 "%s%s", s->step, *tag ? "-" : "", tag);
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot create the checkpoint folder: %s", root, strerror(errno));
    join(dir, root, name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot create: %s", dir, strerror(errno));
    join(p, dir, MANIFEST);
    if (unlink(p) != 0 && errno != ENOENT) /* rewriting a folder: partial until the end */
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot remove: %s", p, strerror(errno));
    join(p, dir, PARAMS);
    QRL_TRY(write_params(p, m, s, err));
    join(p, dir, OPTIMIZER);
    QRL_TRY(qrl_adamw_save(opt, p, err));
    json_t *files = json_object();
    size_t bytes = 0;
    qrl_status st = add_file(files, dir, PARAMS, &bytes, err);
    if (st == QRL_OK) st = add_file(files, dir, OPTIMIZER, &bytes, err);
    if (st != QRL_OK) {
        json_decref(files);
        return st;
    }
    json_t *j = manifest_json(s, files);
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: manifest", dir);
    bytes += strlen(text);
    join(p, dir, MANIFEST);
    st = write_text(p, text, err);
    free(text);
    QRL_TRY(st);
    char line[160];
    snprintf(line, sizeof line, "%s\n", name);
    join(p, root, "latest");
    QRL_TRY(write_text(p, line, err));
    prune(root, name, keep);
    if (out_dir) snprintf(out_dir, QRL_CKPT_PATH_MAX, "%s", dir);
    if (bytes_out) *bytes_out = bytes;
    return QRL_OK;
}

qrl_status qrl_ckpt_find(const char *path, char *out_dir, qrl_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "checkpoint %s: not a folder", path);
    char p[QRL_CKPT_PATH_MAX];
    join(p, path, MANIFEST);
    if (access(p, F_OK) == 0) {
        snprintf(out_dir, QRL_CKPT_PATH_MAX, "%s", path);
        return QRL_OK;
    }
    if (parse_step(strrchr(path, '/') ? strrchr(path, '/') + 1 : path) >= 0)
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "checkpoint %s: no %s (a partial checkpoint)", path, MANIFEST);
    entry *es;
    size_t n;
    QRL_TRY(list_root(path, &es, &n, err));
    size_t i = 0;
    for (; i < n && !es[i].complete; i++)
        QRL_LOG_WARN("checkpoint", "%s/%s has no %s (partial, ignored)", path, es[i].name, MANIFEST);
    qrl_status st = QRL_OK;
    if (i == n) st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "checkpoint %s: no complete step-* folder", path);
    else join(out_dir, path, es[i].name);
    free(es);
    return st;
}

/* ---- reading ---------------------------------------------------------------------------- */

static qrl_status bad(qrl_error *err, const char *file, const char *field, const char *what) {
    return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: field \"%s\": %s", file, field, what);
}

static qrl_status get_u64(json_t *o, const char *key, const char *file, const char *field, uint64_t *out,
                          qrl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return bad(err, file, field ? field : key, "missing or not a non-negative integer");
    *out = (uint64_t)json_integer_value(v);
    return QRL_OK;
}

static qrl_status get_str(json_t *o, const char *key, const char *file, char **out, qrl_error *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return bad(err, file, key, "missing or not a string");
    if (!(*out = strdup(json_string_value(v)))) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s", file);
    return QRL_OK;
}

static qrl_status check_file(json_t *files, const char *dir, const char *name, const char *mf, qrl_error *err) {
    json_t *f = json_object_get(files, name);
    char field[96];
    snprintf(field, sizeof field, "files.%s", name);
    uint64_t want_size, want_crc, size;
    uint32_t crc;
    if (!json_is_object(f)) return bad(err, mf, field, "missing");
    QRL_TRY(get_u64(f, "bytes", mf, field, &want_size, err));
    QRL_TRY(get_u64(f, "crc32", mf, field, &want_crc, err));
    char p[QRL_CKPT_PATH_MAX];
    join(p, dir, name);
    QRL_TRY(file_crc(p, &size, &crc, err));
    if (size != want_size)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64
                             " (truncated or replaced)", p, size, want_size);
    if (crc != want_crc)
        return qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: CRC-32 %08x, the manifest says %08x (garbled)", p,
                             crc, (unsigned)want_crc);
    return QRL_OK;
}

/* Pending groups and trained ranges must tile [1, next_group_id) exactly. */
static qrl_status read_ids(json_t *j, const char *mf, qrl_ckpt_state *s, qrl_error *err) {
    json_t *pend = json_object_get(j, "pending"), *ranges = json_object_get(j, "trained_ranges");
    if (!json_is_array(pend)) return bad(err, mf, "pending", "missing or not an array");
    if (!json_is_array(ranges)) return bad(err, mf, "trained_ranges", "missing or not an array");
    if (s->next_group_id < 1) return bad(err, mf, "next_group_id", "must be >= 1");
    s->n_pending = json_array_size(pend);
    s->pending = calloc(s->n_pending ? s->n_pending : 1, sizeof *s->pending);
    uint8_t *seen = calloc(s->next_group_id, 1);
    qrl_status st = QRL_OK;
    if (!s->pending || !seen) {
        free(seen);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: %" PRIu64 " group ids", mf, s->next_group_id);
    }
    char field[64];
    for (size_t i = 0; i < s->n_pending && st == QRL_OK; i++) {
        json_t *g = json_array_get(pend, i);
        qrl_ckpt_group *o = &s->pending[i];
        uint64_t ep;
        snprintf(field, sizeof field, "pending[%zu]", i);
        if (!json_is_object(g)) st = bad(err, mf, field, "not an object");
        else if ((st = get_u64(g, "id", mf, field, &o->id, err)) == QRL_OK &&
                 (st = get_u64(g, "epoch", mf, field, &ep, err)) == QRL_OK &&
                 (st = get_u64(g, "index", mf, field, &o->index, err)) == QRL_OK &&
                 (st = get_u64(g, "dispatch_version", mf, field, &o->dispatch_version, err)) == QRL_OK) {
            o->epoch = (uint32_t)ep;
            o->delivered = json_is_true(json_object_get(g, "delivered"));
            if (o->id < 1 || o->id >= s->next_group_id || seen[o->id] || (i && o->id <= s->pending[i - 1].id))
                st = bad(err, mf, field, "id out of order, repeated or not below next_group_id");
            else if (ep > UINT32_MAX || o->index >= s->dataset_prompts)
                st = bad(err, mf, field, "dataset position outside the dataset");
            else seen[o->id] = 1;
        }
    }
    for (size_t i = 0; i < json_array_size(ranges) && st == QRL_OK; i++) {
        json_t *r = json_array_get(ranges, i);
        snprintf(field, sizeof field, "trained_ranges[%zu]", i);
        json_t *a = json_array_get(r, 0), *b = json_array_get(r, 1);
        if (!json_is_array(r) || json_array_size(r) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 1 || json_integer_value(b) < json_integer_value(a) ||
            (uint64_t)json_integer_value(b) >= s->next_group_id) {
            st = bad(err, mf, field, "not [first, last] with 1 <= first <= last < next_group_id");
            break;
        }
        for (uint64_t id = (uint64_t)json_integer_value(a); id <= (uint64_t)json_integer_value(b); id++) {
            if (seen[id]) {
                st = bad(err, mf, field, "overlaps a pending group or another range");
                break;
            }
            seen[id] = 1;
        }
    }
    for (uint64_t id = 1; id < s->next_group_id && st == QRL_OK; id++)
        if (!seen[id]) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: field \"trained_ranges\": group %" PRIu64
                               " (below next_group_id) is neither pending nor trained", mf, id);
        }
    free(seen);
    return st;
}

static qrl_status read_offsets(json_t *j, const char *mf, qrl_ckpt_state *s, qrl_error *err) {
    json_t *res = json_object_get(j, "results");
    if (!json_is_object(res)) return bad(err, mf, "results", "missing or not an object");
    QRL_TRY(get_str(res, "topic", mf, &s->results_topic, err));
    json_t *offs = json_object_get(res, "offsets");
    if (!json_is_array(offs)) return bad(err, mf, "results.offsets", "missing or not an array");
    s->n_offsets = json_array_size(offs);
    s->offsets = calloc(s->n_offsets ? s->n_offsets : 1, sizeof *s->offsets);
    if (!s->offsets) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s", mf);
    for (size_t i = 0; i < s->n_offsets; i++) {
        char field[64];
        snprintf(field, sizeof field, "results.offsets[%zu]", i);
        json_t *o = json_array_get(offs, i);
        uint64_t p, off;
        if (!json_is_object(o)) return bad(err, mf, field, "not an object");
        QRL_TRY(get_u64(o, "partition", mf, field, &p, err));
        QRL_TRY(get_u64(o, "next_offset", mf, field, &off, err));
        if (p > INT32_MAX || (i && (int32_t)p <= s->offsets[i - 1].partition))
            return bad(err, mf, field, "partition out of order or too large");
        s->offsets[i] = (qrl_ckpt_offset){(int32_t)p, (int64_t)off};
    }
    return QRL_OK;
}

/* "settings": optional (older checkpoints have none), an object of strings. */
static qrl_status get_settings(json_t *j, const char *mf, char **out, qrl_error *err) {
    *out = NULL;
    json_t *st = json_object_get(j, "settings");
    if (!st) return QRL_OK;
    if (!json_is_object(st)) return bad(err, mf, "settings", "not an object");
    const char *k;
    json_t *v;
    json_object_foreach(st, k, v) {
        if (!json_is_string(v)) return bad(err, mf, "settings", "a value is not a string");
    }
    if (!(*out = json_dumps(st, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: settings", mf);
    return QRL_OK;
}

static qrl_status read_manifest(json_t *j, const char *dir, const char *mf, qrl_ckpt_state *s, qrl_error *err) {
    if (!json_is_object(j)) return bad(err, mf, "(root)", "not a JSON object");
    json_t *fmt = json_object_get(j, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), QRL_CKPT_FORMAT) != 0)
        return bad(err, mf, "format", "missing or not \"" QRL_CKPT_FORMAT "\"");
    uint64_t fv;
    QRL_TRY(get_u64(j, "format_version", mf, NULL, &fv, err));
    if (fv != QRL_CKPT_FORMAT_VERSION)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED, "%s: field \"format_version\": %" PRIu64
                             ", this build reads %d", mf, fv, QRL_CKPT_FORMAT_VERSION);
    QRL_TRY(get_u64(j, "step", mf, NULL, &s->step, err));
    QRL_TRY(get_u64(j, "version", mf, NULL, &s->version, err));
    QRL_TRY(get_u64(j, "run_id", mf, NULL, &s->run_id, err));
    QRL_TRY(get_u64(j, "seed", mf, NULL, &s->seed, err));
    QRL_TRY(get_u64(j, "learner_updates", mf, NULL, &s->learner_updates, err));
    QRL_TRY(get_u64(j, "unix_ms", mf, NULL, &s->unix_ms, err));
    json_t *u = json_object_get(j, "uaq_scale");
    if (!json_is_number(u) || !(json_number_value(u) > 0) || json_number_value(u) > 1e6)
        return bad(err, mf, "uaq_scale", "missing or not a number in (0, 1e6]");
    s->uaq_scale = (float)json_number_value(u);
    QRL_TRY(get_str(j, "model", mf, &s->model, err));
    QRL_TRY(get_str(j, "tokenizer", mf, &s->tokenizer, err));
    QRL_TRY(get_str(j, "tag", mf, &s->tag, err));
    json_t *ds = json_object_get(j, "dataset");
    if (!json_is_object(ds)) return bad(err, mf, "dataset", "missing or not an object");
    uint64_t ep;
    QRL_TRY(get_str(ds, "path", mf, &s->dataset, err));
    QRL_TRY(get_u64(ds, "prompts", mf, "dataset.prompts", &s->dataset_prompts, err));
    QRL_TRY(get_u64(ds, "epoch", mf, "dataset.epoch", &ep, err));
    QRL_TRY(get_u64(ds, "index", mf, "dataset.index", &s->index, err));
    if (ep > UINT32_MAX || s->index > s->dataset_prompts)
        return bad(err, mf, "dataset.index", "outside the dataset");
    s->epoch = (uint32_t)ep;
    QRL_TRY(get_u64(j, "next_group_id", mf, NULL, &s->next_group_id, err));
    QRL_TRY(read_ids(j, mf, s, err));
    QRL_TRY(read_offsets(j, mf, s, err));
    QRL_TRY(get_settings(j, mf, &s->settings, err));
    json_t *files = json_object_get(j, "files");
    if (!json_is_object(files)) return bad(err, mf, "files", "missing or not an object");
    QRL_TRY(check_file(files, dir, PARAMS, mf, err));
    QRL_TRY(check_file(files, dir, OPTIMIZER, mf, err));
    return QRL_OK;
}

qrl_status qrl_ckpt_read(const char *dir, qrl_ckpt_state *out, qrl_error *err) {
    memset(out, 0, sizeof *out);
    char mf[QRL_CKPT_PATH_MAX];
    join(mf, dir, MANIFEST);
    json_error_t je;
    json_t *j = json_load_file(mf, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        if (access(mf, F_OK) != 0)
            return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: cannot open: %s", mf, strerror(errno));
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: line %d column %d: %s", mf, je.line, je.column, je.text);
    }
    qrl_status st = read_manifest(j, dir, mf, out, err);
    json_decref(j);
    if (st != QRL_OK) qrl_ckpt_state_free(out);
    return st;
}

qrl_status qrl_ckpt_read_settings(const char *dir, char **out, qrl_error *err) {
    *out = NULL;
    char mf[QRL_CKPT_PATH_MAX];
    join(mf, dir, MANIFEST);
    json_error_t je;
    json_t *j = json_load_file(mf, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        if (access(mf, F_OK) != 0)
            return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: cannot open: %s", mf, strerror(errno));
        return qrl_error_set(err, QRL_STATUS_PARSE, "%s: line %d column %d: %s", mf, je.line, je.column, je.text);
    }
    qrl_status st = json_is_object(j) ? get_settings(j, mf, out, err) : bad(err, mf, "(root)", "not a JSON object");
    json_decref(j);
    return st;
}

qrl_status qrl_ckpt_load_params(const char *dir, qrl_model *m, qrl_error *err) {
    char p[QRL_CKPT_PATH_MAX];
    join(p, dir, PARAMS);
    qrl_safetensors *sf;
    QRL_TRY(qrl_safetensors_open(p, &sf, err));
    qrl_status st = QRL_OK;
    if (qrl_safetensors_count(sf) != (size_t)m->n_tensors)
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: %zu tensors, the model has %d", p,
                           qrl_safetensors_count(sf), m->n_tensors);
    for (int i = 0; i < m->n_tensors && st == QRL_OK; i++) {
        qrl_model_tensor *mt = &m->tensors[i];
        qrl_tensor t;
        qrl_error e2;
        if (qrl_safetensors_get(sf, mt->name, &t, &e2) != QRL_OK) {
            st = qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: tensor %s missing", p, mt->name);
            break;
        }
        bool same = t.dtype == QRL_DTYPE_F32 && t.ndim == mt->ndim;
        for (int k = 0; same && k < mt->ndim; k++) same = t.shape[k] == mt->shape[k];
        if (!same) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: tensor %s: %s with %d dims, expected F32 [%" PRId64
                               "%s%" PRId64 "]", p, mt->name, qrl_dtype_name(t.dtype), t.ndim, mt->shape[0],
                               mt->ndim > 1 ? ", " : "", mt->ndim > 1 ? mt->shape[1] : (int64_t)0);
            break;
        }
        memcpy(mt->data, t.data, qrl_tensor_nbytes(&t));
    }
    qrl_safetensors_close(sf);
    return st;
}

qrl_status qrl_ckpt_load_optimizer(const char *dir, qrl_adamw_t *opt, qrl_error *err) {
    char p[QRL_CKPT_PATH_MAX];
    join(p, dir, OPTIMIZER);
    return qrl_adamw_load(opt, p, err);
}
