/* libFuzzer target for the TRACE record decoder (kernels/cpu/trace.c).
 *
 * Each input is decoded twice: as given (mostly stopped by the CRC) and with its last
 * four bytes replaced by the correct CRC, so mutations reach the field checks.  A record
 * that decodes must (1) give in-bounds entries for every (token, site), (2) drive guided
 * quantization without faults, and (3) re-encode to exactly the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "cpu/trace.h"

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

static void check_record(const uint8_t *buf, size_t len) {
    qrl_trace_record_t *rec = NULL;
    qrl_error err;
    if (qrl_trace_record_decode(buf, len, &rec, &err) != QRL_OK) {
        if (rec) abort(); /* no handle on failure */
        if (!err.msg[0]) abort(); /* failures always say why */
        return;
    }
    uint32_t nt = qrl_trace_record_n_tokens(rec), ns = qrl_trace_record_n_sites(rec);
    qrl_trace_entry *e = malloc(sizeof *e * ((size_t)nt * ns + 1));
    uint32_t *site_len = malloc(sizeof *site_len * ns);
    if (!e || !site_len) abort();
    for (uint32_t s = 0; s < ns; s++) site_len[s] = qrl_trace_record_site_len(rec, s);
    if (qrl_trace_record_site_len(rec, ns) != 0) abort();
    for (uint32_t t = 0; t < nt; t++)
        for (uint32_t s = 0; s < ns; s++) {
            qrl_trace_entry *x = &e[(size_t)t * ns + s];
            if (qrl_trace_record_entry(rec, t, s, x, NULL) != QRL_OK) abort();
            if (x->len != site_len[s]) abort();
            /* guided quantization of a ramp reads every scale and bit of the entry */
            float *v = malloc(sizeof(float) * x->len);
            if (!v) abort();
            for (uint32_t j = 0; j < x->len; j++) v[j] = (float)j - 0.5f * (float)x->len;
            uint64_t n_guided;
            qrl_trace_guided_quantize(v, x, NULL, v, &n_guided);
            if (n_guided > x->len) abort();
            free(v);
        }
    if (ns && qrl_trace_record_entry(rec, nt, 0, &e[0], NULL) == QRL_OK) abort();
    uint8_t *again = malloc(len);
    size_t written = 0;
    if (!again) abort();
    if (qrl_trace_record_encode(nt, ns, site_len, e, again, len, &written, NULL) != QRL_OK) abort();
    if (written != len || memcmp(again, buf, len) != 0) abort(); /* canonical encoding */
    free(again);
    free(site_len);
    free(e);
    qrl_trace_record_free(rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_record(data, size);
    if (size >= 20) {
        uint8_t *b = malloc(size);
        if (!b) abort();
        memcpy(b, data, size);
        uint32_t c = crc32_ieee(b, size - 4);
        for (int i = 0; i < 4; i++) b[size - 4 + i] = (uint8_t)(c >> (8 * i));
        check_record(b, size);
        free(b);
    }
    return 0;
}
