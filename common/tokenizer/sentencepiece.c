/* llama2.c tokenizer.bin: loading and run.c's encode.
 *
 * File: int32 max_token_length, then vocab_size x (float32 score, int32 len, len bytes),
 * little-endian; the vocab size is not stored (run.c takes it from the model).
 * Ids 0/1/2 are <unk>/<s>/</s>, 3..258 the bytes <0x00>..<0xFF>. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "tokenizer/tok_internal.h"

static qrl_status read_file(const char *path, char **data, size_t *size, qrl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return qrl_error_set(err, errno == ENOENT ? QRL_STATUS_NOT_FOUND : QRL_STATUS_IO,
                             "%s: %s", path, strerror(errno));
    qrl_status st = QRL_OK;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto io;
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto io;
    buf = malloc((size_t)n + 1);
    if (!buf) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path); goto done; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) goto io;
    buf[n] = '\0';
    *data = buf;
    *size = (size_t)n;
    buf = NULL;
    goto done;
io:
    st = qrl_error_set(err, QRL_STATUS_IO, "%s: read failed: %s", path, strerror(errno));
done:
    free(buf);
    fclose(f);
    return st;
}

static int32_t rd_i32(const char *p) {
    uint32_t v = (uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8 |
                 (uint32_t)(uint8_t)p[2] << 16 | (uint32_t)(uint8_t)p[3] << 24;
    return (int32_t)v;
}

qrl_status tok_load_llama2c(qrl_tokenizer *tok, const char *path, int vocab_size,
                            qrl_error *err) {
    if (vocab_size <= 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: a llama2.c tokenizer.bin needs vocab_size_hint (the model's "
                             "vocab size), got %d",
                             path, vocab_size);
    char *data = NULL;
    size_t size = 0;
    QRL_TRY(read_file(path, &data, &size, err));
    qrl_status st = QRL_OK;
    tok->kind = TOK_KIND_LLAMA2C;
    if (size < 4) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                           "%s: truncated: %zu bytes, no max_token_length header", path, size);
        goto done;
    }
    int32_t max_len = rd_i32(data);
    if (max_len <= 0) {
        st = qrl_error_set(err, QRL_STATUS_CORRUPT, "%s: max_token_length = %d at byte 0", path,
                           max_len);
        goto done;
    }
    QRL_TRY_GOTO(tok_reserve_ids(tok, vocab_size, path, err), done);
    tok->scores = malloc(sizeof *tok->scores * (size_t)vocab_size);
    if (!tok->scores) { st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path); goto done; }
    size_t off = 4;
    for (int32_t i = 0; i < vocab_size; i++) {
        if (size - off < 8) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                               "%s: truncated at token %d of %d (byte offset %zu): no score/len",
                               path, i, vocab_size, off);
            goto done;
        }
        float score;
        memcpy(&score, data + off, 4);
        int32_t len = rd_i32(data + off + 4);
        if (len < 0 || (size_t)len > size - off - 8) {
            st = qrl_error_set(err, QRL_STATUS_CORRUPT,
                               "%s: token %d (byte offset %zu): len = %d runs past the end of "
                               "the file (%zu bytes)",
                               path, i, off + 4, len, size);
            goto done;
        }
        tok->scores[i] = score;
        QRL_TRY_GOTO(tok_set_piece(tok, i, data + off + 8, (size_t)len, true, path, "token", err),
                     done);
        off += 8 + (size_t)len;
    }
    if (off != size)
        QRL_LOG_WARN("tokenizer", "trailing bytes after the vocabulary file=%s vocab_size=%d "
                     "extra=%zu (is vocab_size_hint right?)", path, vocab_size, size - off);
    /* run.c merges a pair when the concatenation is a token whose score beats -1e10; index
     * every such split once so the encoder looks pairs up by id */
    for (int32_t t = 0; t < vocab_size; t++) {
        const char *p = tok->arena + tok->piece_off[t];
        size_t l = strlen(p);
        float sc = tok->scores[t];
        if (l < 2 || !(sc > -1e10f)) continue;
        for (size_t k = 1; k < l; k++) {
            int32_t a = tok_vocab_find(tok, p, k), b = tok_vocab_find(tok, p + k, l - k);
            if (a >= 0 && b >= 0 && tok_pairmap_put(&tok->merges, a, b, -sc, t) != QRL_OK) {
                st = qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", path);
                goto done;
            }
        }
    }
    if (vocab_size > 2) {
        tok->unk = 0;
        tok->bos = 1;
        tok->eos = 2;
        for (int i = 0; i < 3; i++) tok->flags[i] |= TOK_FLAG_SPECIAL;
    }
    st = tok_finish(tok, path, err);
done:
    free(data);
    return st;
}

qrl_status tok_llama2c_encode(const qrl_tokenizer *tok, tok_scratch *s, const char *text,
                              size_t len, tok_ids *out, qrl_error *err) {
    if (len == 0) return QRL_OK;
    if (!tok_scratch_symbols(s, len + 1))
        return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
    int k = 0;
    /* run.c's dummy prefix: sentencepiece's add_dummy_prefix */
    int32_t space = tok_vocab_find(tok, " ", 1);
    if (space >= 0) s->sym[k++] = space;
    /* one UTF-8 code point (at most 4 bytes) at a time, bytes + 3 when not a token */
    char cp[4];
    size_t cl = 0;
    for (size_t i = 0; i < len; i++) {
        if (((uint8_t)text[i] & 0xC0) != 0x80) cl = 0;
        cp[cl++] = text[i];
        if (i + 1 < len && ((uint8_t)text[i + 1] & 0xC0) == 0x80 && cl < 4) continue;
        int32_t id = tok_vocab_find(tok, cp, cl);
        if (id >= 0) {
            s->sym[k++] = id;
        } else {
            for (size_t b = 0; b < cl; b++) {
                int32_t bid = tok->byte_ids[(uint8_t)cp[b]];
                if (bid < 0)
                    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                         "encode: byte 0x%02X at offset %zu has no token",
                                         (uint8_t)cp[b], i + 1 - cl + b);
                s->sym[k++] = bid;
            }
        }
        cl = 0;
    }
    if (!tok_merge_word(tok, s, k, out))
        return qrl_error_set(err, QRL_STATUS_NOMEM, "encode: out of memory");
    return QRL_OK;
}
