/* name-twice: the programmatic verifier of the story-name task (docs/verifiers.md,
 * docs/tasks.md).  Reward 1 when
 *   - the character's name appears at least twice in the response as a whole word
 *     (case-sensitive; "Lily's" counts, "Lilyanne" does not), and
 *   - the response is at most max_chars bytes (trailing whitespace ignored), and
 *   - it ends a sentence: its last non-space character is '.', '!' or '?', optionally
 *     followed by a closing quote.
 * The last two stand for "the story ended (EOS) within the budget": a verifier sees
 * only text, and a response cut by max_new_tokens almost always stops mid-sentence or
 * runs past max_chars (pick sampling.max_new_tokens so that its text is longer).
 * Reference: {"name": "Lily", "max_chars": 400} (max_chars optional, default 400), or a
 * bare name. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "verify/verify_internal.h"

#define NAME_TWICE_DEFAULT_MAX_CHARS 400

static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (unsigned char)c >= 0x80;
}

static int count_word(const char *text, const char *name) {
    size_t n = strlen(name);
    int k = 0;
    for (const char *p = strstr(text, name); p; p = strstr(p + n, name))
        if ((p == text || !word_char(p[-1])) && !word_char(p[n])) k++;
    return k;
}

qrl_status qrl_verify_name_twice(const char *response, const char *reference, qrl_verify_result *res,
                                 qrl_error *err) {
    qrl_verify_result_clear(res);
    if (!reference || !*reference)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "name-twice verifier: empty reference");
    if (!response) response = "";
    char name[64];
    long long max_chars = NAME_TWICE_DEFAULT_MAX_CHARS;
    if (reference[0] == '{') {
        json_error_t je;
        json_t *o = json_loads(reference, 0, &je);
        if (!o) return qrl_error_set(err, QRL_STATUS_PARSE, "name-twice reference: column %d: %s", je.column, je.text);
        json_t *nm = json_object_get(o, "name"), *mc = json_object_get(o, "max_chars");
        bool ok = json_is_string(nm) && json_string_length(nm) > 0 && json_string_length(nm) < sizeof name &&
                  (!mc || (json_is_integer(mc) && json_integer_value(mc) > 0));
        if (ok) {
            snprintf(name, sizeof name, "%s", json_string_value(nm));
            if (mc) max_chars = json_integer_value(mc);
        }
        json_decref(o);
        if (!ok)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                                 "name-twice reference: need {\"name\": non-empty string (< 64 bytes), "
                                 "\"max_chars\": positive integer (optional)}");
    } else {
        if (strlen(reference) >= sizeof name)
            return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "name-twice reference: name longer than 63 bytes");
        snprintf(name, sizeof name, "%s", reference);
    }
    size_t len = strlen(response);
    while (len > 0 && strchr(" \t\r\n", response[len - 1])) len--;
    size_t end = len;
    if (end > 0 && (response[end - 1] == '"' || response[end - 1] == '\'')) end--;
    bool ended = end > 0 && strchr(".!?", response[end - 1]) != NULL;
    int k = count_word(response, name);
    res->found = k > 0;
    snprintf(res->extracted, sizeof res->extracted, "%s x%d, %zu chars%s", name, k, len,
             ended ? "" : ", unfinished");
    res->correct = k >= 2 && (long long)len <= max_chars && ended;
    res->reward = res->correct ? 1.0 : 0.0;
    return QRL_OK;
}
