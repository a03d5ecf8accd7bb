/* safetensors reader and writer; format and validation rules in io/safetensors.h.
 *
 * Messages have the shape  "<file>: tensor '<name>' field <field>: <what>"  (or
 * "<file>: field <field>: <what>" for file-level problems) and are one line: tensor
 * names are quoted with control characters replaced, since they come from the file. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/json_util.h"

/* The reference implementation's cap on the JSON header (safetensors N_MAX). */
#define ST_MAX_HEADER 100000000ull

typedef struct st_entry {
    char *name;
    qrl_dtype dtype;
    int ndim;
    int64_t shape[QRL_TENSOR_MAX_DIMS];
    uint64_t begin, end; /* relative to the data region of its file */
    const uint8_t *data; /* first byte of the tensor */
    const char *file;    /* label of the file holding it (owned by the handle's image list) */
} st_entry;

/* One parsed file: a mapping we own (addr != NULL, owned) or borrowed memory. */
typedef struct st_image {
    char *label;
    void *addr;
    size_t size;
    int owned;
} st_image;

struct qrl_safetensors {
    char *label; /* the path or name it was opened with */
    st_entry *entries;
    size_t n, cap;
    char **meta; /* key, value pairs: meta[2i], meta[2i+1] */
    size_t n_meta, cap_meta;
    st_image *images;
    size_t n_images, cap_images;
};

/* ---- messages ------------------------------------------------------------------------- */

/* Quote-safe, single-line, bounded copy of a name taken from the file. */
static const char *clean(const char *s, char *buf, size_t cap) {
    size_t i = 0, limit = cap - 4;
    for (; s[i] && i < limit; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (s[i]) memcpy(buf + i, "...", 3), i += 3;
    buf[i] = '\0';
    return buf;
}

/* Formats "<file>: tensor '<tensor>' field <field>: <what>" and makes it one line: names
 * and jansson's error text (which quotes the offending input) may hold control bytes. */
__attribute__((format(printf, 6, 7))) static qrl_status
tensor_error(qrl_error *err, qrl_status code, const char *file, const char *tensor,
             const char *fieldname, const char *fmt, ...) {
    char what[320], nb[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (tensor)
        qrl_error_set(err, code, "%s: tensor '%s' field %s: %s", file,
                      clean(tensor, nb, sizeof nb), fieldname, what);
    else
        qrl_error_set(err, code, "%s: field %s: %s", file, fieldname, what);
    for (char *p = err ? err->msg : NULL; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    return code;
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* ---- handle bookkeeping ----------------------------------------------------------------- */

static qrl_status grow(void **arr, size_t *cap, size_t need, size_t elem, qrl_error *err) {
    if (need <= *cap) return QRL_OK;
    size_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need) ncap *= 2;
    void *p = realloc(*arr, ncap * elem);
    if (!p) return qrl_error_set(err, QRL_STATUS_NOMEM, "safetensors: out of memory");
    *arr = p;
    *cap = ncap;
    return QRL_OK;
}

static qrl_status handle_new(const char *label, qrl_safetensors **out, qrl_error *err) {
    qrl_safetensors *st = calloc(1, sizeof *st);
    if (st) st->label = strdup(label);
    if (!st || !st->label) {
        free(st);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", label);
    }
    *out = st;
    return QRL_OK;
}

void qrl_safetensors_close(qrl_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free(st->entries[i].name);
    for (size_t i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    for (size_t i = 0; i < st->n_images; i++) {
        if (st->images[i].owned && st->images[i].addr)
            munmap(st->images[i].addr, st->images[i].size);
        free(st->images[i].label);
    }
    free(st->entries);
    free(st->meta);
    free(st->images);
    free(st->label);
    free(st);
}

static const char *find_meta(const qrl_safetensors *st, const char *key) {
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* ---- header parsing --------------------------------------------------------------------- */

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static qrl_status parse_metadata(qrl_safetensors *st, const char *file, const json_t *meta,
                                 qrl_error *err) {
    if (!json_is_object(meta))
        return tensor_error(err, QRL_STATUS_PARSE, file, NULL, "__metadata__",
                            "must be an object, got %s", json_type_name(meta));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)meta, key, v) {
        char nb[96];
        if (!json_is_string(v))
            return tensor_error(err, QRL_STATUS_PARSE, file, NULL, "__metadata__",
                                "value of '%s' must be a string, got %s",
                                clean(key, nb, sizeof nb), json_type_name(v));
        if (find_meta(st, key)) continue; /* shards repeat keys: the first one wins */
        QRL_TRY(grow((void **)&st->meta, &st->cap_meta, 2 * (st->n_meta + 1), sizeof(char *), err));
        char *k = strdup(key), *s = strdup(json_string_value(v));
        if (!k || !s) {
            free(k);
            free(s);
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", file);
        }
        st->meta[2 * st->n_meta] = k;
        st->meta[2 * st->n_meta + 1] = s;
        st->n_meta++;
    }
    return QRL_OK;
}

/* Parses one tensor entry of the header into *e (name not yet set). */
static qrl_status parse_tensor(const char *file, const char *name, const json_t *v,
                               uint64_t data_size, st_entry *e, qrl_error *err) {
    if (!json_is_object(v))
        return tensor_error(err, QRL_STATUS_PARSE, file, name, "entry",
                            "must be an object, got %s", json_type_name(v));

    const json_t *dt = json_object_get(v, "dtype");
    if (!dt) return tensor_error(err, QRL_STATUS_PARSE, file, name, "dtype", "is missing");
    if (!json_is_string(dt))
        return tensor_error(err, QRL_STATUS_PARSE, file, name, "dtype",
                            "must be a string, got %s", json_type_name(dt));
    if (qrl_dtype_parse(json_string_value(dt), &e->dtype) != QRL_OK) {
        char nb[96];
        return tensor_error(err, QRL_STATUS_UNSUPPORTED, file, name, "dtype",
                            "unknown dtype '%s'", clean(json_string_value(dt), nb, sizeof nb));
    }

    const json_t *shape = json_object_get(v, "shape");
    if (!shape) return tensor_error(err, QRL_STATUS_PARSE, file, name, "shape", "is missing");
    if (!json_is_array(shape))
        return tensor_error(err, QRL_STATUS_PARSE, file, name, "shape",
                            "must be a list of non-negative integers, got %s",
                            json_type_name(shape));
    size_t ndim = json_array_size(shape);
    if (ndim > QRL_TENSOR_MAX_DIMS)
        return tensor_error(err, QRL_STATUS_UNSUPPORTED, file, name, "shape",
                            "has %zu dimensions, at most %d are supported", ndim,
                            QRL_TENSOR_MAX_DIMS);
    e->ndim = (int)ndim;
    /* The product of the non-zero extents must fit even when another extent is zero, so
     * that strides (and any later arithmetic on the shape) cannot overflow. */
    uint64_t prod = 1, nbytes;
    int overflow = 0, has_zero = 0;
    for (size_t i = 0; i < ndim; i++) {
        const json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d))
            return tensor_error(err, QRL_STATUS_PARSE, file, name, "shape",
                                "element %zu must be a non-negative integer, got %s", i,
                                json_type_name(d));
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return tensor_error(err, QRL_STATUS_PARSE, file, name, "shape",
                                "element %zu is %lld, must be non-negative", i, (long long)x);
        e->shape[i] = (int64_t)x;
        if (x == 0) has_zero = 1;
        else overflow |= __builtin_mul_overflow(prod, (uint64_t)x, &prod);
    }
    overflow |= __builtin_mul_overflow(prod, (uint64_t)qrl_dtype_size(e->dtype), &nbytes);
    if (overflow || nbytes > INT64_MAX)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, name, "shape",
                            "element count overflows 64 bits");
    if (has_zero) nbytes = 0;

    const json_t *off = json_object_get(v, "data_offsets");
    if (!off)
        return tensor_error(err, QRL_STATUS_PARSE, file, name, "data_offsets", "is missing");
    if (!json_is_array(off) || json_array_size(off) != 2)
        return tensor_error(err, QRL_STATUS_PARSE, file, name, "data_offsets",
                            "must be a list [begin, end] of two non-negative integers");
    uint64_t be[2];
    for (size_t i = 0; i < 2; i++) {
        const json_t *x = json_array_get(off, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return tensor_error(err, QRL_STATUS_PARSE, file, name, "data_offsets",
                                "must be a list [begin, end] of two non-negative integers");
        be[i] = (uint64_t)json_integer_value(x);
    }
    e->begin = be[0];
    e->end = be[1];
    if (e->begin > e->end)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, name, "data_offsets",
                            "begin %llu > end %llu", (unsigned long long)e->begin,
                            (unsigned long long)e->end);
    if (e->end > data_size)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, name, "data_offsets",
                            "[%llu, %llu) exceeds the data region (%llu bytes)",
                            (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)data_size);
    if (e->end - e->begin != nbytes)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, name, "data_offsets",
                            "[%llu, %llu) holds %llu bytes but its shape and dtype %s need %llu",
                            (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)(e->end - e->begin), qrl_dtype_name(e->dtype),
                            (unsigned long long)nbytes);
    return QRL_OK;
}

static int cmp_by_begin(const void *a, const void *b) {
    const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* No two non-empty byte ranges among entries [first, n) may share a byte. */
static qrl_status check_overlap(qrl_safetensors *st, size_t first, const char *file,
                                qrl_error *err) {
    size_t m = st->n - first;
    if (m < 2) return QRL_OK;
    st_entry **order = malloc(m * sizeof *order);
    if (!order) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < m; i++) order[i] = &st->entries[first + i];
    qsort(order, m, sizeof *order, cmp_by_begin);
    qrl_status rc = QRL_OK;
    const st_entry *last = NULL; /* the non-empty range reaching furthest so far */
    for (size_t i = 0; i < m; i++) {
        const st_entry *e = order[i];
        if (e->begin == e->end) continue;
        if (last && e->begin < last->end) {
            char nb[96];
            rc = tensor_error(err, QRL_STATUS_CORRUPT, file, e->name, "data_offsets",
                              "[%llu, %llu) overlaps tensor '%s' at [%llu, %llu)",
                              (unsigned long long)e->begin, (unsigned long long)e->end,
                              clean(last->name, nb, sizeof nb), (unsigned long long)last->begin,
                              (unsigned long long)last->end);
            break;
        }
        if (!last || e->end > last->end) last = e;
    }
    free(order);
    return rc;
}

/* Validates the image `data[0..size)` and appends its tensors and metadata to `st`.
 * The caller has already recorded the image in st->images (label used for messages). */
static qrl_status parse_image(qrl_safetensors *st, const uint8_t *data, size_t size,
                              const char *file, qrl_error *err) {
    if (size < 8)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, NULL, "header_length",
                            "file is %zu bytes, shorter than the 8-byte header length", size);
    uint64_t hlen = load_le64(data);
    if (hlen > size - 8)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, NULL, "header_length",
                            "header of %llu bytes exceeds the %zu bytes after the length "
                            "(truncated file or not safetensors)",
                            (unsigned long long)hlen, size - 8);
    if (hlen > ST_MAX_HEADER)
        return tensor_error(err, QRL_STATUS_CORRUPT, file, NULL, "header_length",
                            "header of %llu bytes exceeds the %llu-byte limit",
                            (unsigned long long)hlen, ST_MAX_HEADER);
    const uint8_t *region = data + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tensor_error(err, QRL_STATUS_PARSE, file, NULL, "header",
                            "invalid JSON at byte %d (line %d, column %d): %s",
                            8 + jerr.position, jerr.line, jerr.column, jerr.text);
    qrl_status rc = QRL_OK;
    size_t first = st->n;
    if (!json_is_object(root)) {
        rc = tensor_error(err, QRL_STATUS_PARSE, file, NULL, "header",
                          "must be a JSON object, got %s", json_type_name(root));
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(st, file, v, err);
            if (rc != QRL_OK) goto done;
            continue;
        }
        rc = grow((void **)&st->entries, &st->cap, st->n + 1, sizeof(st_entry), err);
        if (rc != QRL_OK) goto done;
        st_entry *e = &st->entries[st->n];
        memset(e, 0, sizeof *e);
        rc = parse_tensor(file, key, v, data_size, e, err);
        if (rc != QRL_OK) goto done;
        e->data = region + e->begin;
        e->file = file;
        if (!(e->name = strdup(key))) {
            rc = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", file);
            goto done;
        }
        st->n++;
    }
    rc = check_overlap(st, first, file, err);
done:
    json_decref(root);
    return rc;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

/* Sorts by name; a name held twice (only possible across shards) is an error. */
static qrl_status sort_entries(qrl_safetensors *st, qrl_error *err) {
    if (st->n > 1) qsort(st->entries, st->n, sizeof *st->entries, cmp_by_name);
    for (size_t i = 1; i < st->n; i++) {
        const st_entry *a = &st->entries[i - 1], *b = &st->entries[i];
        if (strcmp(a->name, b->name) == 0)
            return tensor_error(err, QRL_STATUS_CORRUPT, st->label, b->name, "name",
                                "present in both '%s' and '%s'", a->file, b->file);
    }
    return QRL_OK;
}

static st_image *add_image(qrl_safetensors *st, const char *label, qrl_error *err) {
    if (grow((void **)&st->images, &st->cap_images, st->n_images + 1, sizeof(st_image), err))
        return NULL;
    st_image *im = &st->images[st->n_images];
    memset(im, 0, sizeof *im);
    if (!(im->label = strdup(label))) {
        qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", label);
        return NULL;
    }
    st->n_images++;
    return im;
}

/* ---- opening ------------------------------------------------------------------------------ */

qrl_status qrl_safetensors_open_memory(const void *data, size_t size, const char *name,
                                       qrl_safetensors **out, qrl_error *err) {
    qrl_safetensors *st;
    QRL_TRY(handle_new(name, &st, err));
    qrl_status rc = QRL_STATUS_NOMEM;
    st_image *im = add_image(st, name, err);
    if (im) rc = parse_image(st, data, size, im->label, err);
    if (rc == QRL_OK) rc = sort_entries(st, err);
    if (rc != QRL_OK) {
        qrl_safetensors_close(st);
        return rc;
    }
    *out = st;
    return QRL_OK;
}

/* Maps `path` read-only into a new image of `st` and parses it.  When the file was named
 * by an index, open errors name the index and the first tensor mapped to it instead. */
static qrl_status open_file(qrl_safetensors *st, const char *path, const char *index,
                            const char *tensor, qrl_error *err) {
    st_image *im = add_image(st, path, err);
    if (!im) return QRL_STATUS_NOMEM;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the S_ISREG check refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (index)
            return tensor_error(err, QRL_STATUS_IO, index, tensor, "weight_map",
                                "cannot open shard '%s': %s", path, strerror(errno));
        return qrl_error_set(err, QRL_STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    qrl_status rc = QRL_OK;
    if (fstat(fd, &sb) != 0) {
        rc = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        rc = qrl_error_set(err, QRL_STATUS_IO, "%s: not a regular file", path);
    } else if (sb.st_size > 0) {
        void *addr = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (addr == MAP_FAILED)
            rc = qrl_error_set(err, QRL_STATUS_IO, "%s: cannot map: %s", path, strerror(errno));
        else
            im->addr = addr, im->size = (size_t)sb.st_size, im->owned = 1;
    }
    close(fd);
    if (rc != QRL_OK) return rc;
    return parse_image(st, im->addr, im->size, im->label, err);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static qrl_status open_index(qrl_safetensors *st, const char *index_path, qrl_error *err) {
    json_t *root = NULL, *wmap;
    char *path = NULL;
    const char **shards = NULL, **first_tensor = NULL;
    size_t n_shards = 0;
    qrl_status rc;
    QRL_TRY(qrl_json_load_file(index_path, &root, err));
    rc = qrl_json_get_object(root, index_path, "weight_map", &wmap, err);
    if (rc != QRL_OK) goto done;

    /* shard names are relative to the index's folder */
    const char *slash = strrchr(index_path, '/');
    size_t dir_len = slash ? (size_t)(slash - index_path + 1) : 0;
    size_t cap = dir_len + 4096;
    shards = calloc(json_object_size(wmap) + 1, sizeof *shards);
    first_tensor = calloc(json_object_size(wmap) + 1, sizeof *first_tensor);
    path = malloc(cap);
    if (!shards || !first_tensor || !path) {
        rc = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wmap, name, v) {
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= 4096) {
            rc = tensor_error(err, QRL_STATUS_PARSE, index_path, name, "weight_map",
                              "shard must be a file name, got %s", json_type_name(v));
            goto done;
        }
        size_t k = 0;
        while (k < n_shards && strcmp(shards[k], json_string_value(v)) != 0) k++;
        if (k == n_shards) {
            first_tensor[n_shards] = name;
            shards[n_shards++] = json_string_value(v);
        }
    }
    for (size_t k = 0; k < n_shards; k++) {
        snprintf(path, cap, "%.*s%s", (int)dir_len, index_path, shards[k]);
        rc = open_file(st, path, index_path, first_tensor[k], err);
        if (rc != QRL_OK) goto done;
    }
    rc = sort_entries(st, err);
    if (rc != QRL_OK) goto done;
    json_object_foreach(wmap, name, v) {
        st_entry key = {.name = (char *)name};
        const st_entry *e = bsearch(&key, st->entries, st->n, sizeof key, cmp_by_name);
        snprintf(path, cap, "%.*s%s", (int)dir_len, index_path, json_string_value(v));
        if (!e || strcmp(e->file, path) != 0) {
            rc = tensor_error(err, QRL_STATUS_CORRUPT, index_path, name, "weight_map",
                              "not found in shard '%s'%s%s", json_string_value(v),
                              e ? ", it is in " : "", e ? e->file : "");
            goto done;
        }
    }
done:
    free(first_tensor);
    free(shards);
    free(path);
    json_decref(root);
    return rc;
}

qrl_status qrl_safetensors_open(const char *path, qrl_safetensors **out, qrl_error *err) {
    qrl_safetensors *st;
    QRL_TRY(handle_new(path, &st, err));
    qrl_status rc;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* a checkpoint folder: the single file if present, else the index (as HF does) */
        char *p = malloc(strlen(path) + 40);
        if (!p) {
            qrl_safetensors_close(st);
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        }
        sprintf(p, "%s/model.safetensors", path);
        if (access(p, F_OK) == 0) {
            rc = open_file(st, p, NULL, NULL, err);
            if (rc == QRL_OK) rc = sort_entries(st, err);
        } else {
            sprintf(p, "%s/model.safetensors.index.json", path);
            if (access(p, F_OK) == 0)
                rc = open_index(st, p, err);
            else
                rc = qrl_error_set(err, QRL_STATUS_NOT_FOUND,
                                   "%s: holds neither model.safetensors nor "
                                   "model.safetensors.index.json",
                                   path);
        }
        free(p);
    } else if (ends_with(path, ".json")) {
        rc = open_index(st, path, err);
    } else {
        rc = open_file(st, path, NULL, NULL, err);
        if (rc == QRL_OK) rc = sort_entries(st, err);
    }
    if (rc != QRL_OK) {
        qrl_safetensors_close(st);
        return rc;
    }
    *out = st;
    return QRL_OK;
}

/* ---- queries ------------------------------------------------------------------------------ */

size_t qrl_safetensors_count(const qrl_safetensors *st) { return st->n; }

const char *qrl_safetensors_name(const qrl_safetensors *st, size_t i) {
    QRL_CHECK(i < st->n);
    return st->entries[i].name;
}

qrl_status qrl_safetensors_get(const qrl_safetensors *st, const char *name, qrl_tensor *out,
                               qrl_error *err) {
    st_entry key = {.name = (char *)name};
    const st_entry *e = st->n ? bsearch(&key, st->entries, st->n, sizeof key, cmp_by_name) : NULL;
    if (!e) {
        char nb[96];
        return qrl_error_set(err, QRL_STATUS_NOT_FOUND, "%s: tensor '%s' not found", st->label,
                             clean(name, nb, sizeof nb));
    }
    qrl_tensor_init(out, e->dtype, e->ndim, e->shape, (void *)e->data);
    return QRL_OK;
}

const char *qrl_safetensors_metadata(const qrl_safetensors *st, const char *key) {
    return find_meta(st, key);
}

/* ---- writer ------------------------------------------------------------------------------- */

/* Write order: larger elements first keeps every tensor aligned to its element size (as
 * HF's writer does), then by name. */
typedef struct write_slot {
    size_t elem;
    const char *name;
    size_t idx;
} write_slot;

static int cmp_write_order(const void *a, const void *b) {
    const write_slot *x = a, *y = b;
    if (x->elem != y->elem) return x->elem > y->elem ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the writer's input and builds the header object (tensors in write order). */
static qrl_status build_header(const char *path, const qrl_safetensors_entry *entries, size_t n,
                               const size_t *order, const char *const *meta_kv, size_t n_meta,
                               json_t *root, qrl_error *err) {
    if (n_meta > 0) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0)
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        for (size_t i = 0; i < n_meta; i++) {
            const char *k = meta_kv[2 * i], *v = meta_kv[2 * i + 1];
            if (!k || !v || json_object_set_new(meta, k, json_string(v)) != 0)
                return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                     "%s: field __metadata__: pair %zu must be two UTF-8 strings",
                                     path, i);
        }
    }
    uint64_t offset = 0;
    for (size_t j = 0; j < n; j++) {
        const qrl_safetensors_entry *en = &entries[order[j]];
        const qrl_tensor *t = en->tensor;
        size_t nbytes = qrl_tensor_nbytes(t);
        json_t *obj = json_object(), *shape = json_array();
        if (!obj || !shape) {
            json_decref(obj);
            json_decref(shape);
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        }
        int bad = 0;
        for (int d = 0; d < t->ndim; d++)
            bad |= json_array_append_new(shape, json_integer(t->shape[d]));
        bad |= json_object_set_new(obj, "dtype", json_string(qrl_dtype_name(t->dtype)));
        bad |= json_object_set_new(obj, "shape", shape);
        bad |= json_object_set_new(obj, "data_offsets",
                                   json_pack("[II]", (json_int_t)offset,
                                             (json_int_t)(offset + nbytes)));
        if (bad) {
            json_decref(obj);
            return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        }
        if (json_object_set_new(root, en->name, obj) != 0)
            return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, en->name, "name",
                                "must be valid UTF-8");
        offset += nbytes;
    }
    return QRL_OK;
}

static qrl_status check_entry(const char *path, const qrl_safetensors_entry *en, qrl_error *err) {
    const qrl_tensor *t = en->tensor;
    const char *nm = en->name ? en->name : "";
    if (!en->name || !en->name[0] || strcmp(en->name, "__metadata__") == 0)
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "name",
                            "must be non-empty and not __metadata__");
    if (!t || t->device != QRL_DEVICE_CPU)
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "tensor",
                            "must be a CPU tensor");
    if ((unsigned)t->dtype >= QRL_DTYPE_COUNT_ || qrl_dtype_size(t->dtype) == 0)
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "dtype", "unknown dtype");
    if (t->ndim < 0 || t->ndim > QRL_TENSOR_MAX_DIMS)
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "shape",
                            "ndim %d outside [0, %d]", t->ndim, QRL_TENSOR_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "shape",
                                "dimension %d is negative", d);
    if (!qrl_tensor_is_contiguous(t))
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "strides",
                            "tensor is not contiguous");
    if (!t->data && qrl_tensor_nbytes(t) > 0)
        return tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, nm, "data", "is NULL");
    return QRL_OK;
}

qrl_status qrl_safetensors_write(const char *path, const qrl_safetensors_entry *entries, size_t n,
                                 const char *const *meta_kv, size_t n_meta, qrl_error *err) {
    for (size_t i = 0; i < n; i++) QRL_TRY(check_entry(path, &entries[i], err));
    if (n_meta > 0 && !meta_kv)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: field __metadata__: %zu pairs but no array", path, n_meta);
    qrl_status rc = QRL_OK;
    size_t *order = malloc((n + 1) * sizeof *order);
    write_slot *slots = malloc((n + 1) * sizeof *slots);
    const char **names = malloc((n + 1) * sizeof *names);
    json_t *root = json_object();
    char *text = NULL;
    qrl_atomic_file af = QRL_ATOMIC_FILE_INIT;
    if (!order || !slots || !names || !root) {
        rc = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        goto done;
    }
    /* duplicates: sort the names alone and compare neighbours */
    for (size_t i = 0; i < n; i++) names[i] = entries[i].name;
    qsort(names, n, sizeof *names, cmp_str_ptr);
    for (size_t j = 1; j < n; j++) {
        if (strcmp(names[j - 1], names[j]) == 0) {
            rc = tensor_error(err, QRL_STATUS_INVALID_ARGUMENT, path, names[j], "name",
                              "given twice");
            goto done;
        }
    }
    for (size_t i = 0; i < n; i++)
        slots[i] = (write_slot){qrl_dtype_size(entries[i].tensor->dtype), entries[i].name, i};
    qsort(slots, n, sizeof *slots, cmp_write_order);
    for (size_t i = 0; i < n; i++) order[i] = slots[i].idx;
    rc = build_header(path, entries, n, order, meta_kv, n_meta, root, err);
    if (rc != QRL_OK) goto done;
    if (!(text = json_dumps(root, JSON_COMPACT))) {
        rc = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
        goto done;
    }
    /* pad with spaces so the data region starts 8-byte aligned, like HF's writer */
    size_t tlen = strlen(text), hlen = (tlen + 7) & ~(size_t)7;
    uint8_t prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    static const char spaces[8] = "        ";

    rc = qrl_atomic_file_open(path, &af, err);
    if (rc == QRL_OK) rc = qrl_atomic_file_write(&af, prefix, 8, err);
    if (rc == QRL_OK) rc = qrl_atomic_file_write(&af, text, tlen, err);
    if (rc == QRL_OK) rc = qrl_atomic_file_write(&af, spaces, hlen - tlen, err);
    for (size_t j = 0; j < n && rc == QRL_OK; j++) {
        const qrl_tensor *t = entries[order[j]].tensor;
        rc = qrl_atomic_file_write(&af, t->data, qrl_tensor_nbytes(t), err);
    }
    if (rc == QRL_OK) rc = qrl_atomic_file_commit(&af, err);
done:
    qrl_atomic_file_abort(&af); /* no-op after commit or a failed open */
    free(text);
    json_decref(root);
    free(names);
    free(slots);
    free(order);
    return rc;
}
