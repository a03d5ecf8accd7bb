/* Row and block formats: per-row INT8/FP8, NVFP4, MXFP4 (quant.h, docs/formats.md). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu/quant.h"

/* ---- per-row INT8 / FP8 ------------------------------------------------------------- */

void qrl_int8_quantize_rows(const float *x, int64_t rows, int64_t cols, int8_t *q,
                            float *scales) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float scale = qrl_quant_absmax(xr, cols, NULL) / 127.0f;
        scales[r] = scale;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = qrl_int8_encode(xr[c], scale);
    }
}

void qrl_int8_dequantize_rows(const int8_t *q, const float *scales, int64_t rows,
                              int64_t cols, float *x) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] = qrl_int8_decode(q[r * cols + c], scales[r]);
}

/* E4M3 of x / scale; scale 0 (the row's finite elements are all zero) keeps the sign. */
static uint8_t fp8_scaled(float x, float scale) {
    if (scale == 0.0f && !isnan(x)) return signbit(x) ? 0x80 : 0x00;
    return qrl_e4m3_encode(x / scale);
}

void qrl_fp8_quantize_rows(const float *x, int64_t rows, int64_t cols, uint8_t *q,
                           float *scales) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float scale = qrl_quant_absmax(xr, cols, NULL) / QRL_E4M3_MAX;
        scales[r] = scale;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = fp8_scaled(xr[c], scale);
    }
}

void qrl_fp8_dequantize_rows(const uint8_t *q, const float *scales, int64_t rows,
                             int64_t cols, float *x) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] = qrl_e4m3_decode(q[r * cols + c]) * scales[r];
}

/* ---- NVFP4 -------------------------------------------------------------------------- */

float qrl_nvfp4_global_enc(float amax) {
    float s = (QRL_E4M3_MAX * QRL_E2M1_MAX) / amax;
    s = fminf(s, FLT_MAX);
    if (amax == 0.0f || s == 0.0f) return 1.0f;
    return s;
}

uint8_t qrl_nvfp4_block_scale(float block_amax, float global_enc) {
    const float inv6 = 1.0f / QRL_E2M1_MAX;
    return qrl_e4m3_encode(block_amax * (global_enc * inv6));
}

float qrl_nvfp4_block_rcp(uint8_t scale_code, float global_enc) {
    float s = qrl_e4m3_decode(scale_code);
    if (!(s > 0.0f)) return 0.0f; /* zero or NaN scale: codes are 0 */
    float s_dec = 1.0f / global_enc;
    return fminf(1.0f / (s * s_dec), FLT_MAX);
}

float qrl_nvfp4_block_dequant_scale(uint8_t scale_code, float global_enc) {
    return qrl_e4m3_decode(scale_code) * (1.0f / global_enc);
}

/* One row: blocks of 16 under the given S_enc.  Codes are built unpacked then packed. */
static void nvfp4_row(const float *x, int64_t n, float global_enc, uint8_t *codes,
                      uint8_t *scales) {
    for (int64_t b = 0; b * QRL_NVFP4_BLOCK < n; b++) {
        int64_t j0 = b * QRL_NVFP4_BLOCK, len = n - j0;
        if (len > QRL_NVFP4_BLOCK) len = QRL_NVFP4_BLOCK;
        bool bad;
        float amax = qrl_quant_absmax(x + j0, len, &bad);
        uint8_t s = bad ? QRL_E4M3_NAN : qrl_nvfp4_block_scale(amax, global_enc);
        scales[b] = s;
        float r = bad ? 0.0f : qrl_nvfp4_block_rcp(s, global_enc);
        uint8_t c[QRL_NVFP4_BLOCK];
        for (int64_t j = 0; j < len; j++) c[j] = r == 0.0f ? 0 : qrl_e2m1_encode(x[j0 + j] * r);
        /* j0 is even, so the block's codes start on a byte */
        qrl_nibble_pack(c, len, codes + j0 / 2);
    }
}

static void nvfp4_row_dequant(const uint8_t *codes, const uint8_t *scales, float global_enc,
                              int64_t n, float *x) {
    for (int64_t j = 0; j < n; j++) {
        float ds = qrl_nvfp4_block_dequant_scale(scales[j / QRL_NVFP4_BLOCK], global_enc);
        x[j] = qrl_e2m1_decode(qrl_nibble_get(codes, j)) * ds;
    }
}

void qrl_nvfp4_quantize_row(const float *x, int64_t n, uint8_t *codes, uint8_t *scales,
                            float *global_enc) {
    *global_enc = qrl_nvfp4_global_enc(qrl_quant_absmax(x, n, NULL));
    nvfp4_row(x, n, *global_enc, codes, scales);
}

void qrl_nvfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales, float global_enc,
                              int64_t n, float *x) {
    nvfp4_row_dequant(codes, scales, global_enc, n, x);
}

void qrl_nvfp4_fake_quantize_row(const float *x, int64_t n, float *y) {
    float g = qrl_nvfp4_global_enc(qrl_quant_absmax(x, n, NULL));
    for (int64_t j0 = 0; j0 < n; j0 += QRL_NVFP4_BLOCK) {
        int64_t len = n - j0 < QRL_NVFP4_BLOCK ? n - j0 : QRL_NVFP4_BLOCK;
        uint8_t codes[QRL_NVFP4_BLOCK / 2], s;
        nvfp4_row(x + j0, len, g, codes, &s);
        nvfp4_row_dequant(codes, &s, g, len, y + j0);
    }
}

qrl_status qrl_nvfp4_quantize(const float *x, qrl_nvfp4 *q, qrl_error *err) {
    if (!q || q->rows < 0 || q->cols < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nvfp4: negative shape");
    if (q->rows * q->cols > 0 && (!x || !q->codes || !q->scales || !q->global_enc))
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "nvfp4: NULL buffer");
    int64_t cb = qrl_nibble_row_bytes(q->cols), sb = qrl_nvfp4_blocks(q->cols);
    if (!q->per_row) q->global_enc[0] = qrl_nvfp4_global_enc(qrl_quant_absmax(x, q->rows * q->cols, NULL));
    for (int64_t r = 0; r < q->rows; r++) {
        const float *xr = x + r * q->cols;
        if (q->per_row) q->global_enc[r] = qrl_nvfp4_global_enc(qrl_quant_absmax(xr, q->cols, NULL));
        float g = q->global_enc[q->per_row ? r : 0];
        nvfp4_row(xr, q->cols, g, q->codes + r * cb, q->scales + r * sb);
    }
    return QRL_OK;
}

void qrl_nvfp4_dequantize(const qrl_nvfp4 *q, float *x) {
    int64_t cb = qrl_nibble_row_bytes(q->cols), sb = qrl_nvfp4_blocks(q->cols);
    for (int64_t r = 0; r < q->rows; r++)
        nvfp4_row_dequant(q->codes + r * cb, q->scales + r * sb,
                          q->global_enc[q->per_row ? r : 0], q->cols, x + r * q->cols);
}

/* ---- MXFP4 -------------------------------------------------------------------------- */

/* Shared exponent per OCP MX v1.0 §6.3: floor(log2(amax)) - emax_elem, clamped to the
 * E8M0 range.  An all-zero block takes the minimum (as microxcaling: log2 of 0 is
 * replaced by log2 of FLT_MIN, giving -128, clamped to -127). */
static int mx_shared_exp(float amax) {
    int e = amax > 0.0f ? ilogbf(amax) - 2 : -127;
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

void qrl_mxfp4_quantize(const float *x, int64_t rows, int64_t cols, uint8_t *codes,
                        uint8_t *scales) {
    int64_t cb = qrl_nibble_row_bytes(cols), nb = qrl_mxfp4_blocks(cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * cols + b * QRL_MXFP4_BLOCK;
            int64_t len = cols - b * QRL_MXFP4_BLOCK;
            if (len > QRL_MXFP4_BLOCK) len = QRL_MXFP4_BLOCK;
            bool bad;
            float amax = qrl_quant_absmax(xb, len, &bad);
            uint8_t c[QRL_MXFP4_BLOCK];
            if (bad) {
                scales[r * nb + b] = QRL_E8M0_NAN;
                memset(c, 0, sizeof c);
            } else {
                int e = mx_shared_exp(amax);
                scales[r * nb + b] = qrl_e8m0_from_exponent(e);
                for (int64_t j = 0; j < len; j++) c[j] = qrl_e2m1_encode(ldexpf(xb[j], -e));
            }
            qrl_nibble_pack(c, len, codes + r * cb + b * QRL_MXFP4_BLOCK / 2);
        }
    }
}

void qrl_mxfp4_dequantize(const uint8_t *codes, const uint8_t *scales, int64_t rows,
                          int64_t cols, float *x) {
    int64_t cb = qrl_nibble_row_bytes(cols), nb = qrl_mxfp4_blocks(cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            float s = qrl_e8m0_decode(scales[r * nb + j / QRL_MXFP4_BLOCK]);
            x[r * cols + j] = qrl_e2m1_decode(qrl_nibble_get(codes + r * cb, j)) * s;
        }
}
