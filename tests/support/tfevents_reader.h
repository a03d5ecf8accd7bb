/* A TensorBoard event-file reader for the tests, written from the TFRecord and protobuf
 * wire-format specs (a bitwise CRC-32C, not the library's table/SSE4.2 one), so that the
 * writer (common/metrics/tfevents.h) is checked by code that shares nothing with it.
 * Header-only (static inline). */
#ifndef QRL_TESTS_SUPPORT_TFEVENTS_READER_H
#define QRL_TESTS_SUPPORT_TFEVENTS_READER_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- independent reference ----------------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected 0x82F63B78), one bit at a time. */
static inline uint32_t tfr_crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}
static inline uint32_t tfr_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

/* ---- reader -------------------------------------------------------------------------- */

typedef struct tfr_value {
    char tag[64];
    float value;
} tfr_value;

typedef struct tfr_event {
    double wall_time;
    int64_t step;
    char file_version[32];
    tfr_value v[32];
    int n;
} tfr_event;

static inline uint64_t tfr_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Read a varint at *p (< end); fails the test on truncation. */
static inline uint64_t tfr_varint(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        cr_assert(*p < end, "truncated varint");
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    cr_assert_fail("varint over 10 bytes");
    return 0;
}

static inline void tfr_decode_value(const uint8_t *p, const uint8_t *end, tfr_value *v) {
    memset(v, 0, sizeof *v);
    while (p < end) {
        uint64_t key = tfr_varint(&p, end);
        if (key == (1 << 3 | 2)) {
            uint64_t n = tfr_varint(&p, end);
            cr_assert(n < sizeof v->tag && p + n <= end);
            memcpy(v->tag, p, n);
            p += n;
        } else if (key == (2 << 3 | 5)) {
            cr_assert(p + 4 <= end);
            uint32_t b = (uint32_t)tfr_le(p, 4);
            memcpy(&v->value, &b, 4);
            p += 4;
        } else {
            cr_assert_fail("Summary.Value: unexpected key %llu", (unsigned long long)key);
        }
    }
}

static inline void tfr_decode_event(const uint8_t *p, const uint8_t *end, tfr_event *e) {
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = tfr_varint(&p, end);
        switch (key) {
        case 1 << 3 | 1: { /* wall_time */
            cr_assert(p + 8 <= end);
            uint64_t b = tfr_le(p, 8);
            memcpy(&e->wall_time, &b, 8);
            p += 8;
            break;
        }
        case 2 << 3 | 0: e->step = (int64_t)tfr_varint(&p, end); break;
        case 3 << 3 | 2: {
            uint64_t n = tfr_varint(&p, end);
            cr_assert(n < sizeof e->file_version && p + n <= end);
            memcpy(e->file_version, p, n);
            p += n;
            break;
        }
        case 5 << 3 | 2: { /* Summary */
            uint64_t n = tfr_varint(&p, end);
            cr_assert(p + n <= end);
            const uint8_t *s = p, *se = p + n;
            while (s < se) {
                cr_assert_eq(tfr_varint(&s, se), 1 << 3 | 2, "Summary: expected field 1 (value)");
                uint64_t vn = tfr_varint(&s, se);
                cr_assert(s + vn <= se && e->n < 32);
                tfr_decode_value(s, s + vn, &e->v[e->n++]);
                s += vn;
            }
            p = se;
            break;
        }
        default: cr_assert_fail("Event: unexpected key %llu", (unsigned long long)key);
        }
    }
}

/* Parse every TFRecord of `path`; returns false (and says why in `why`) on a bad CRC. */
static inline bool tfr_read_events(const char *path, tfr_event *ev, int max, int *n, char *why) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)size + 1);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    bool ok = true;
    *n = 0;
    for (long off = 0; off < size;) {
        cr_assert(off + 12 <= size, "truncated header at %ld", off);
        uint64_t len = tfr_le(buf + off, 8);
        if ((uint32_t)tfr_le(buf + off + 8, 4) != tfr_mask(tfr_crc32c_bitwise(buf + off, 8))) {
            sprintf(why, "length crc at %ld", off);
            ok = false;
            break;
        }
        cr_assert(off + 12 + (long)len + 4 <= size, "truncated record at %ld", off);
        const uint8_t *data = buf + off + 12;
        if ((uint32_t)tfr_le(data + len, 4) != tfr_mask(tfr_crc32c_bitwise(data, len))) {
            sprintf(why, "data crc at %ld", off);
            ok = false;
            break;
        }
        cr_assert(*n < max);
        tfr_decode_event(data, data + len, &ev[(*n)++]);
        off += 12 + (long)len + 4;
    }
    free(buf);
    return ok;
}

#endif
