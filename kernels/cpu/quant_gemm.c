/* Reference GEMMs for the quantized rollout precisions (SPEC §3 table). */
#include <math.h>

#include "cpu/quant.h"

void qrl_gemm_f32(const float *x, const float *w, int64_t T, int64_t N, int64_t K, float *y) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)x[t * K + k] * w[n * K + k];
            y[t * N + n] = (float)acc;
        }
}

static qrl_status check_shape(const char *what, int64_t T, int64_t N, int64_t K,
                              qrl_error *err) {
    if (T < 0 || N < 0 || K < 0)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "%s: negative shape T=%lld N=%lld K=%lld", what, (long long)T,
                             (long long)N, (long long)K);
    return QRL_OK;
}

qrl_status qrl_gemm_int8(const int8_t *xq, const float *sx, const int8_t *wq, const float *sw,
                         int64_t T, int64_t N, int64_t K, float *y, qrl_error *err) {
    QRL_TRY(check_shape("gemm_int8", T, N, K, err));
    if (K > QRL_INT8_GEMM_MAX_K)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "gemm_int8: K=%lld exceeds %d (INT32 accumulator could overflow)",
                             (long long)K, QRL_INT8_GEMM_MAX_K);
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (int32_t)xq[t * K + k] * (int32_t)wq[n * K + k];
            y[t * N + n] = (float)acc * sx[t] * sw[n];
        }
    return QRL_OK;
}

void qrl_gemm_fp8(const uint8_t *xq, const float *sx, const uint8_t *wq, const float *sw,
                  int64_t T, int64_t N, int64_t K, float *y) {
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = qrl_e4m3_decode((uint8_t)i);
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)lut[xq[t * K + k]] * lut[wq[n * K + k]];
            y[t * N + n] = (float)acc * sx[t] * sw[n];
        }
}

qrl_status qrl_linear_w8a8_int8(const float *x, int64_t T, int64_t K, const int8_t *wq,
                                const float *sw, int64_t N, int8_t *xq, float *sx, float *y,
                                qrl_error *err) {
    QRL_TRY(check_shape("linear_w8a8_int8", T, N, K, err));
    qrl_int8_quantize_rows(x, T, K, xq, sx);
    QRL_TRY(qrl_gemm_int8(xq, sx, wq, sw, T, N, K, y, err));
    return QRL_OK;
}

void qrl_linear_w8a8_fp8(const float *x, int64_t T, int64_t K, const uint8_t *wq,
                         const float *sw, int64_t N, uint8_t *xq, float *sx, float *y) {
    qrl_fp8_quantize_rows(x, T, K, xq, sx);
    qrl_gemm_fp8(xq, sx, wq, sw, T, N, K, y);
}

qrl_status qrl_linear_w4a16_nvfp4(const float *x, int64_t T, const qrl_nvfp4 *w, float *wf,
                                  float *y, qrl_error *err) {
    QRL_TRY(check_shape("linear_w4a16_nvfp4", T, w->rows, w->cols, err));
    qrl_nvfp4_dequantize(w, wf);
    qrl_gemm_f32(x, wf, T, w->rows, w->cols, y);
    return QRL_OK;
}

void qrl_linear_w4a16_mxfp4(const float *x, int64_t T, const uint8_t *w_codes,
                            const uint8_t *w_scales, int64_t N, int64_t K, float *wf,
                            float *y) {
    qrl_mxfp4_dequantize(w_codes, w_scales, N, K, wf);
    qrl_gemm_f32(x, wf, T, N, K, y);
}

qrl_status qrl_linear_w4a4_nvfp4(const float *x, int64_t T, const qrl_nvfp4 *w, float *wf,
                                 float *xf, float *y, qrl_error *err) {
    QRL_TRY(check_shape("linear_w4a4_nvfp4", T, w->rows, w->cols, err));
    int64_t K = w->cols;
    /* each token row on its own (per-row global scale): batch-invariant codes */
    for (int64_t t = 0; t < T; t++) qrl_nvfp4_fake_quantize_row(x + t * K, K, xf + t * K);
    qrl_nvfp4_dequantize(w, wf);
    qrl_gemm_f32(xf, wf, T, w->rows, K, y);
    return QRL_OK;
}
