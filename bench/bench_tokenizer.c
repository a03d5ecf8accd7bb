/* Tokenizer encode/decode throughput on GSM8K train (questions + answers).
 *   build/bench/bench_tokenizer [tokenizer path] [jsonl] [vocab_size_hint]
 * Defaults: ../shared/data/qwen_tokenizer and ../shared/data/gsm8k/train.jsonl. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *d = getenv("QRL_DATA_DIR");
    char tp[1024], dp[1024];
    snprintf(tp, sizeof tp, "%s/qwen_tokenizer", d ? d : "../shared/data");
    snprintf(dp, sizeof dp, "%s/gsm8k/train.jsonl", d ? d : "../shared/data");
    const char *tok_path = argc > 1 ? argv[1] : tp, *data = argc > 2 ? argv[2] : dp;
    int hint = argc > 3 ? atoi(argv[3]) : 0;
    qrl_error err;
    qrl_tokenizer *tok;
    double t0 = now();
    if (qrl_tokenizer_load(tok_path, hint, &tok, &err) != QRL_OK) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    double t_load = now() - t0;
    FILE *f = fopen(data, "r");
    if (!f) { perror(data); return 1; }
    /* texts: each line's question and answer */
    size_t n_texts = 0, cap = 0, bytes = 0;
    char **texts = NULL;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        const char *keys[] = {"question", "answer"};
        for (int k = 0; k < 2 && o; k++) {
            const char *s = json_string_value(json_object_get(o, keys[k]));
            if (!s) continue;
            if (n_texts == cap) texts = realloc(texts, sizeof *texts * (cap = cap ? 2 * cap : 1024));
            texts[n_texts++] = strdup(s);
            bytes += strlen(s);
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    size_t n_tokens = 0;
    int32_t **ids = calloc(n_texts, sizeof *ids);
    size_t *n_ids = calloc(n_texts, sizeof *n_ids);
    t0 = now();
    for (size_t i = 0; i < n_texts; i++) {
        if (qrl_tokenizer_encode(tok, texts[i], strlen(texts[i]), false, false, &ids[i], &n_ids[i], &err)) {
            fprintf(stderr, "encode: %s\n", err.msg);
            return 1;
        }
        n_tokens += n_ids[i];
    }
    double t_enc = now() - t0;
    t0 = now();
    size_t out_bytes = 0;
    for (size_t i = 0; i < n_texts; i++) {
        char *s;
        if (qrl_tokenizer_decode(tok, ids[i], n_ids[i], false, &s, &err)) return 1;
        out_bytes += strlen(s);
        free(s);
    }
    double t_dec = now() - t0;
    printf("tokenizer=%s load_s=%.3f texts=%zu bytes=%zu tokens=%zu bytes_per_token=%.2f\n", tok_path,
           t_load, n_texts, bytes, n_tokens, (double)bytes / (double)n_tokens);
    printf("encode: %.3f s  %.2f MB/s  %.0f tokens/s\n", t_enc, (double)bytes / t_enc / 1e6,
           (double)n_tokens / t_enc);
    printf("decode: %.3f s  %.2f MB/s  (%zu bytes out)\n", t_dec, (double)out_bytes / t_dec / 1e6, out_bytes);
    for (size_t i = 0; i < n_texts; i++) { free(texts[i]); free(ids[i]); }
    free(texts);
    free(ids);
    free(n_ids);
    qrl_tokenizer_free(tok);
    return 0;
}
