/* Validators of decoded topic and weight-sync messages (wire.h).  Decoding only proves
 * the bytes are well-formed protobuf; these check the rules a consumer relies on before
 * indexing arrays with the contents (equal lengths, token ids inside the vocabulary,
 * finite log-probs), and name what is wrong so the dead letter explains itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

#define BAD(...) qrl_error_set(err, QRL_STATUS_CORRUPT, __VA_ARGS__)

static int enum_known(const ProtobufCEnumDescriptor *d, int v) {
    return v != 0 && protobuf_c_enum_descriptor_get_value(d, v) != NULL;
}

/* ids[0..n) < vocab (vocab 0 = unchecked); names the first offender. */
static qrl_status check_ids(const uint32_t *ids, size_t n, uint32_t vocab, const char *where,
                            const char *field, qrl_error *err) {
    if (!vocab) return QRL_OK;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= vocab)
            return BAD("%s: %s[%zu] = %u is outside the vocabulary (%u tokens)", where, field, i,
                       ids[i], vocab);
    return QRL_OK;
}

/* ---- PromptGroup -------------------------------------------------------------------- */

static qrl_status sampling_validate(const Qrl__SamplingParams *s, uint32_t vocab,
                                    const char *where, qrl_error *err) {
    if (!s) return BAD("%s: sampling is missing", where);
    if (!isfinite(s->temperature) || s->temperature < 0)
        return BAD("%s: sampling.temperature %g is not a finite value >= 0", where,
                   (double)s->temperature);
    if (!isfinite(s->top_p) || s->top_p < 0 || s->top_p > 1)
        return BAD("%s: sampling.top_p %g is outside [0, 1]", where, (double)s->top_p);
    if (s->max_new_tokens < 1 || s->max_new_tokens > QRL_WIRE_MAX_TOKENS)
        return BAD("%s: sampling.max_new_tokens %u is outside [1, %u]", where, s->max_new_tokens,
                   QRL_WIRE_MAX_TOKENS);
    QRL_TRY(check_ids(s->stop_token_ids, s->n_stop_token_ids, vocab, where,
                      "sampling.stop_token_ids", err));
    for (size_t i = 0; i < s->n_stop_strings; i++)
        if (!s->stop_strings[i] || !s->stop_strings[i][0])
            return BAD("%s: sampling.stop_strings[%zu] is empty", where, i);
    return QRL_OK;
}

qrl_status qrl_wire_prompt_group_validate(const Qrl__PromptGroup *pg, uint32_t vocab_size,
                                          qrl_error *err) {
    char where[64];
    snprintf(where, sizeof where, "PromptGroup group %llu", (unsigned long long)pg->group_id);
    if (pg->group_id == 0) return BAD("%s: group_id is 0 (unset)", where);
    if (pg->group_size < 1 || pg->group_size > QRL_WIRE_MAX_GROUP_SIZE)
        return BAD("%s: group_size %u is outside [1, %u]", where, pg->group_size,
                   QRL_WIRE_MAX_GROUP_SIZE);
    if (pg->n_prompt_token_ids == 0) return BAD("%s: prompt_token_ids is empty", where);
    if (pg->n_prompt_token_ids > QRL_WIRE_MAX_TOKENS)
        return BAD("%s: prompt_token_ids has %zu tokens (limit %u)", where,
                   pg->n_prompt_token_ids, QRL_WIRE_MAX_TOKENS);
    QRL_TRY(check_ids(pg->prompt_token_ids, pg->n_prompt_token_ids, vocab_size, where,
                      "prompt_token_ids", err));
    QRL_TRY(sampling_validate(pg->sampling, vocab_size, where, err));
    return QRL_OK;
}

/* ---- GroupResult -------------------------------------------------------------------- */

static qrl_status response_validate(const Qrl__Response *r, size_t i, uint32_t vocab,
                                    const char *group, qrl_error *err) {
    char where[96];
    snprintf(where, sizeof where, "%s response %zu", group, i);
    if (!r) return BAD("%s: missing", where);
    size_t n = r->n_token_ids;
    if (n > QRL_WIRE_MAX_TOKENS)
        return BAD("%s: token_ids has %zu tokens (limit %u)", where, n, QRL_WIRE_MAX_TOKENS);
    if (r->n_behavior_logprobs != n)
        return BAD("%s: behavior_logprobs has %zu entries but token_ids has %zu", where,
                   r->n_behavior_logprobs, n);
    if (r->n_token_versions != n)
        return BAD("%s: token_versions has %zu entries but token_ids has %zu", where,
                   r->n_token_versions, n);
    if (!enum_known(&qrl__finish_reason__descriptor, (int)r->finish_reason))
        return BAD("%s: finish_reason %d is not a known reason", where, (int)r->finish_reason);
    if (r->finish_reason == QRL__FINISH_REASON__FINISH_REASON_PROMPT_TOO_LONG && n != 0)
        return BAD("%s: finish_reason PROMPT_TOO_LONG with %zu tokens (expected none)", where, n);
    if (n == 0 && r->finish_reason != QRL__FINISH_REASON__FINISH_REASON_PROMPT_TOO_LONG &&
        r->finish_reason != QRL__FINISH_REASON__FINISH_REASON_ABORTED)
        return BAD("%s: token_ids is empty (finish_reason %d needs at least one token)", where,
                   (int)r->finish_reason);
    QRL_TRY(check_ids(r->token_ids, n, vocab, where, "token_ids", err));
    for (size_t t = 0; t < n; t++) {
        float lp = r->behavior_logprobs[t];
        if (!isfinite(lp))
            return BAD("%s: behavior_logprobs[%zu] is %s", where, t,
                       isnan(lp) ? "nan" : lp > 0 ? "inf" : "-inf");
        if (lp > QRL_WIRE_LOGPROB_MAX)
            return BAD("%s: behavior_logprobs[%zu] = %g is positive (log-probs are <= 0)", where,
                       t, (double)lp);
        if (t > 0 && r->token_versions[t] < r->token_versions[t - 1])
            return BAD("%s: token_versions[%zu] = %llu is below token_versions[%zu] = %llu "
                       "(versions never decrease)",
                       where, t, (unsigned long long)r->token_versions[t], t - 1,
                       (unsigned long long)r->token_versions[t - 1]);
    }
    if (!isfinite(r->reward)) return BAD("%s: reward %g is not finite", where, (double)r->reward);
    if (r->truncated_tokens > n)
        return BAD("%s: truncated_tokens %u exceeds the %zu tokens", where, r->truncated_tokens, n);
    if (r->truncated_tokens > 0 && !r->sampling_truncated)
        return BAD("%s: truncated_tokens %u but sampling_truncated is false", where,
                   r->truncated_tokens);
    return QRL_OK;
}

static qrl_status chunk_validate(const Qrl__GroupResult *r, const char *where, qrl_error *err) {
    if (r->chunk_index >= r->chunk_count)
        return BAD("%s: chunk_index %u is not below chunk_count %u", where, r->chunk_index,
                   r->chunk_count);
    if (r->chunk_data.len == 0) return BAD("%s chunk %u: chunk_data is empty", where, r->chunk_index);
    if (r->whole_bytes < r->chunk_data.len || r->whole_bytes > QRL_WIRE_MAX_MESSAGE_BYTES)
        return BAD("%s chunk %u: whole_bytes %llu is below the chunk's %zu bytes or over the cap",
                   where, r->chunk_index, (unsigned long long)r->whole_bytes, r->chunk_data.len);
    if (r->n_responses || r->n_prompt_token_ids || r->group_size)
        return BAD("%s chunk %u: a chunk message carries content fields (responses, "
                   "prompt_token_ids or group_size)",
                   where, r->chunk_index);
    return QRL_OK;
}

qrl_status qrl_wire_group_result_validate(const Qrl__GroupResult *r, uint32_t expected_g,
                                          uint32_t vocab_size, qrl_error *err) {
    char where[64];
    snprintf(where, sizeof where, "GroupResult group %llu", (unsigned long long)r->group_id);
    if (r->group_id == 0) return BAD("%s: group_id is 0 (unset)", where);
    if (r->chunk_count == 0)
        return BAD("%s: chunk_count is 0 (a whole result carries 1)", where);
    if (r->chunk_count > 1) return chunk_validate(r, where, err);
    if (r->chunk_index != 0)
        return BAD("%s: chunk_index %u in a whole result (chunk_count 1)", where, r->chunk_index);
    if (r->chunk_data.len || r->whole_bytes || r->whole_crc32c)
        return BAD("%s: a whole result carries chunk_data/whole_bytes/whole_crc32c", where);
    if (r->group_size < 1 || r->group_size > QRL_WIRE_MAX_GROUP_SIZE)
        return BAD("%s: group_size %u is outside [1, %u]", where, r->group_size,
                   QRL_WIRE_MAX_GROUP_SIZE);
    if (expected_g && r->group_size != expected_g)
        return BAD("%s: group_size %u does not match the dispatched G %u", where, r->group_size,
                   expected_g);
    if (r->n_responses != r->group_size)
        return BAD("%s: has %zu responses, group_size is %u", where, r->n_responses,
                   r->group_size);
    if (r->n_prompt_token_ids == 0) return BAD("%s: prompt_token_ids is empty", where);
    if (r->n_prompt_token_ids > QRL_WIRE_MAX_TOKENS)
        return BAD("%s: prompt_token_ids has %zu tokens (limit %u)", where, r->n_prompt_token_ids,
                   QRL_WIRE_MAX_TOKENS);
    QRL_TRY(check_ids(r->prompt_token_ids, r->n_prompt_token_ids, vocab_size, where,
                      "prompt_token_ids", err));
    for (size_t i = 0; i < r->n_responses; i++)
        QRL_TRY(response_validate(r->responses[i], i, vocab_size, where, err));
    return QRL_OK;
}

/* ---- TraceChunk --------------------------------------------------------------------- */

qrl_status qrl_wire_trace_chunk_validate(const Qrl__TraceChunk *t, qrl_error *err) {
    char where[96];
    snprintf(where, sizeof where, "TraceChunk group %llu response %u chunk %u",
             (unsigned long long)t->group_id, t->response_index, t->chunk_index);
    if (t->group_id == 0) return BAD("%s: group_id is 0 (unset)", where);
    if (t->chunk_count == 0 || t->chunk_index >= t->chunk_count)
        return BAD("%s: chunk_index %u is not below chunk_count %u", where, t->chunk_index,
                   t->chunk_count);
    if (t->format_version != 1 && t->format_version != QRL_WIRE_TRACE_FORMAT_RECORD)
        return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                             "%s: format_version got %u, expected 1 or 2", where,
                             t->format_version);
    if (t->block_size == 0 || t->block_size % 8)
        return BAD("%s: block_size %u is not a positive multiple of 8", where, t->block_size);
    if (t->token_count == 0) return BAD("%s: token_count is 0", where);
    if (t->n_site_ids == 0) return BAD("%s: site_ids is empty", where);
    for (size_t i = 1; i < t->n_site_ids; i++)
        if (t->site_ids[i] <= t->site_ids[i - 1])
            return BAD("%s: site_ids[%zu] = %u is not above site_ids[%zu] = %u", where, i,
                       t->site_ids[i], i - 1, t->site_ids[i - 1]);
    if (t->format_version == QRL_WIRE_TRACE_FORMAT_RECORD) {
        if (t->record.len == 0) return BAD("%s: record is empty", where);
        if (t->scales.len || t->bits.len)
            return BAD("%s: format_version 2 carries scales and bits in the record only", where);
        if ((uint64_t)t->token_begin + t->token_count > t->response_tokens)
            return BAD("%s: tokens [%u, +%u) run past response_tokens %u", where,
                       t->token_begin, t->token_count, t->response_tokens);
        return QRL_OK;
    }
    if (t->scales.len == 0 || t->scales.len % t->token_count)
        return BAD("%s: scales has %zu bytes, not a positive multiple of token_count %u", where,
                   t->scales.len, t->token_count);
    /* scales.len * block_size / 8 cannot overflow: len <= the 64 MiB cap */
    if (t->bits.len != t->scales.len * (t->block_size / 8))
        return BAD("%s: bits has %zu bytes, expected %zu (%zu scales x %u bits)", where,
                   t->bits.len, t->scales.len * (t->block_size / 8), t->scales.len,
                   t->block_size);
    return QRL_OK;
}

/* ---- WeightManifest ----------------------------------------------------------------- */

static int dtype_bytes(const char *name) {
    if (!strcmp(name, "BF16") || !strcmp(name, "F16")) return 2;
    if (!strcmp(name, "F32")) return 4;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp((*(Qrl__TensorMeta *const *)a)->name, (*(Qrl__TensorMeta *const *)b)->name);
}

qrl_status qrl_wire_weight_manifest_validate(const Qrl__WeightManifest *m, qrl_error *err) {
    char where[64];
    snprintf(where, sizeof where, "WeightManifest version %llu", (unsigned long long)m->version);
    if (!enum_known(&qrl__checksum_algorithm__descriptor, (int)m->checksum_algorithm))
        return BAD("%s: checksum_algorithm %d is not known", where, (int)m->checksum_algorithm);
    if (m->bucket_bytes == 0) return BAD("%s: bucket_bytes is 0", where);
    uint64_t buckets = m->total_bytes / m->bucket_bytes + (m->total_bytes % m->bucket_bytes != 0);
    if (m->bucket_count != buckets)
        return BAD("%s: bucket_count %u, expected %llu for %llu bytes in %llu-byte buckets", where,
                   m->bucket_count, (unsigned long long)buckets,
                   (unsigned long long)m->total_bytes, (unsigned long long)m->bucket_bytes);
    uint64_t end_prev = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const Qrl__TensorMeta *t = m->tensors[i];
        if (!t || !t->name || !t->name[0]) return BAD("%s: tensors[%zu] has no name", where, i);
        int eb = dtype_bytes(t->dtype ? t->dtype : "");
        if (!eb)
            return qrl_error_set(err, QRL_STATUS_UNSUPPORTED,
                                 "%s: tensor '%s' dtype '%s' (expected BF16, F16 or F32)", where,
                                 t->name, t->dtype ? t->dtype : "");
        uint64_t numel = 1;
        for (size_t d = 0; d < t->n_shape; d++) {
            if (t->shape[d] && numel > UINT64_MAX / 8 / t->shape[d])
                return BAD("%s: tensor '%s' shape overflows", where, t->name);
            numel *= t->shape[d];
        }
        if (t->byte_size != numel * (uint64_t)eb)
            return BAD("%s: tensor '%s' byte_size %llu, expected %llu (numel %llu x %d)", where,
                       t->name, (unsigned long long)t->byte_size,
                       (unsigned long long)(numel * (uint64_t)eb), (unsigned long long)numel, eb);
        if (t->byte_offset < end_prev)
            return BAD("%s: tensor '%s' byte_offset %llu overlaps or precedes the previous tensor "
                       "(ends at %llu)",
                       where, t->name, (unsigned long long)t->byte_offset,
                       (unsigned long long)end_prev);
        if (t->byte_offset > m->total_bytes || t->byte_size > m->total_bytes - t->byte_offset)
            return BAD("%s: tensor '%s' [%llu, +%llu) runs past total_bytes %llu", where, t->name,
                       (unsigned long long)t->byte_offset, (unsigned long long)t->byte_size,
                       (unsigned long long)m->total_bytes);
        end_prev = t->byte_offset + t->byte_size;
    }
    if (m->n_tensors > 1) {
        Qrl__TensorMeta **sorted = malloc(m->n_tensors * sizeof *sorted);
        if (!sorted) return qrl_error_set(err, QRL_STATUS_NOMEM, "%s: out of memory", where);
        memcpy(sorted, m->tensors, m->n_tensors * sizeof *sorted);
        qsort(sorted, m->n_tensors, sizeof *sorted, cmp_names);
        for (size_t i = 1; i < m->n_tensors; i++)
            if (!strcmp(sorted[i]->name, sorted[i - 1]->name)) {
                qrl_status st = BAD("%s: tensor '%s' is listed twice", where, sorted[i]->name);
                free(sorted);
                return st;
            }
        free(sorted);
    }
    return QRL_OK;
}
