/* CPU backend of the precision-tagged linear layer (see linear.h). */
#include "model/linear.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"

static const char *const precision_names[QRL_PRECISION_COUNT_] = {
    "f32", "bf16", "w8a8-int8", "w8a8-fp8", "w4a16-nvfp4", "w4a16-mxfp4", "w4a4-nvfp4",
};

const char *qrl_precision_name(qrl_precision p) {
    return (unsigned)p < QRL_PRECISION_COUNT_ ? precision_names[p] : "?";
}

qrl_status qrl_precision_parse(const char *name, qrl_precision *out, qrl_error *err) {
    for (int i = 0; i < QRL_PRECISION_COUNT_; i++)
        if (name && strcmp(name, precision_names[i]) == 0) {
            *out = (qrl_precision)i;
            return QRL_OK;
        }
    return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                         "unknown precision '%s' (f32, bf16, w8a8-int8, w8a8-fp8, w4a16-nvfp4, "
                         "w4a16-mxfp4, w4a4-nvfp4)",
                         name ? name : "(null)");
}

bool qrl_precision_is_quantized(qrl_precision p) {
    return p >= QRL_PRECISION_W8A8_INT8 && p < QRL_PRECISION_COUNT_;
}

/* ---- storage ------------------------------------------------------------------------ */

static bool is_nvfp4(qrl_precision p) {
    return p == QRL_PRECISION_W4A16_NVFP4 || p == QRL_PRECISION_W4A4_NVFP4;
}

/* Layout inside one block: F32 arrays first (scales or S_enc), then the byte arrays
 * (block scales, then codes), so every F32 is 4-byte aligned. */
typedef struct layout {
    size_t scales, global, block_scales, codes, total; /* byte offsets, total size */
} layout;

static layout plan(qrl_precision p, int64_t N, int64_t K) {
    layout o = {0};
    size_t off = 0;
    if (p == QRL_PRECISION_W8A8_INT8 || p == QRL_PRECISION_W8A8_FP8) {
        o.scales = off;
        off += (size_t)N * sizeof(float);
        o.codes = off;
        off += (size_t)(N * K);
    } else if (is_nvfp4(p)) {
        o.global = off;
        off += sizeof(float);
        o.block_scales = off;
        off += (size_t)(N * qrl_nvfp4_blocks(K));
        o.codes = off;
        off += (size_t)(N * qrl_nibble_row_bytes(K));
    } else if (p == QRL_PRECISION_W4A16_MXFP4) {
        o.block_scales = off;
        off += (size_t)(N * qrl_mxfp4_blocks(K));
        o.codes = off;
        off += (size_t)(N * qrl_nibble_row_bytes(K));
    }
    o.total = off;
    return o;
}

size_t qrl_linear_storage_bytes(qrl_precision fmt, int n_out, int n_in) {
    if (n_out <= 0 || n_in <= 0) return 0;
    return plan(fmt, n_out, n_in).total;
}

qrl_status qrl_linear_init(qrl_linear *l, qrl_precision fmt, const float *w, const float *bias,
                           int n_out, int n_in, void *storage, qrl_error *err) {
    if ((unsigned)fmt >= QRL_PRECISION_COUNT_)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "linear: bad precision %d",
                             (int)fmt);
    if (n_out <= 0 || n_in <= 0 || !w)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "linear %s: shape [%d, %d] must be positive with weights given",
                             qrl_precision_name(fmt), n_out, n_in);
    if (fmt == QRL_PRECISION_W8A8_INT8 && n_in > QRL_INT8_GEMM_MAX_K)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "linear w8a8-int8: K=%d exceeds %d (INT32 accumulator could overflow)",
                             n_in, QRL_INT8_GEMM_MAX_K);
    layout o = plan(fmt, n_out, n_in);
    if (o.total > 0 && !storage)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT,
                             "linear %s [%d, %d]: no storage for %zu bytes", qrl_precision_name(fmt),
                             n_out, n_in, o.total);
    *l = (qrl_linear){.fmt = fmt, .n_out = n_out, .n_in = n_in, .w = w, .bias = bias};
    if (o.total == 0) return QRL_OK;
    unsigned char *b = storage;
    l->codes = b + o.codes;
    switch (fmt) {
    case QRL_PRECISION_W8A8_INT8:
        l->scales = (float *)(b + o.scales);
        qrl_int8_quantize_rows(w, n_out, n_in, l->codes, l->scales);
        break;
    case QRL_PRECISION_W8A8_FP8:
        l->scales = (float *)(b + o.scales);
        qrl_fp8_quantize_rows(w, n_out, n_in, l->codes, l->scales);
        break;
    case QRL_PRECISION_W4A16_NVFP4:
    case QRL_PRECISION_W4A4_NVFP4: {
        l->global_enc = (float *)(b + o.global);
        l->block_scales = b + o.block_scales;
        qrl_nvfp4 q = {.rows = n_out, .cols = n_in, .codes = l->codes,
                       .scales = l->block_scales, .global_enc = l->global_enc, .per_row = false};
        QRL_TRY(qrl_nvfp4_quantize(w, &q, err));
        break;
    }
    case QRL_PRECISION_W4A16_MXFP4:
        l->block_scales = b + o.block_scales;
        qrl_mxfp4_quantize(w, n_out, n_in, l->codes, l->block_scales);
        break;
    default:
        break;
    }
    return QRL_OK;
}

/* Decoded values of every E4M3 code and every E2M1 code (the reference decoders'
 * outputs, so table lookups give the same floats). */
typedef struct luts {
    float e4m3[256], e2m1[16];
} luts;

static void luts_init(luts *t) {
    for (int i = 0; i < 256; i++) t->e4m3[i] = qrl_e4m3_decode((uint8_t)i);
    for (int i = 0; i < 16; i++) t->e2m1[i] = qrl_e2m1_decode((uint8_t)i);
}

/* ---- scratch ------------------------------------------------------------------------ */

struct qrl_linear_scratch {
    int max_rows, max_in, n_threads;
    uint8_t *xq;  /* [max_rows * max_in] INT8 or E4M3 activation codes */
    float *sx;    /* [max_rows] per-token scales */
    float *xf;    /* [max_rows * max_in] rounded / decoded / fake-quantized activations */
    float *wrow;  /* [n_threads * max_in] one dequantized weight row per thread */
    luts *lut;
};

qrl_status qrl_linear_scratch_new(int max_rows, int max_in, qrl_linear_scratch **out,
                                  qrl_error *err) {
    *out = NULL;
    if (max_rows <= 0 || max_in <= 0)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "linear scratch: max_rows = %d and max_in = %d must be > 0", max_rows,
                             max_in);
    qrl_linear_scratch *s = calloc(1, sizeof *s);
    if (!s) return qrl_error_set(err, QRL_STATUS_NOMEM, "linear scratch: out of memory");
    s->max_rows = max_rows;
    s->max_in = max_in;
    s->n_threads = omp_get_max_threads();
    size_t rk = (size_t)max_rows * max_in;
    s->xq = malloc(rk);
    s->sx = malloc((size_t)max_rows * sizeof(float));
    s->xf = malloc(rk * sizeof(float));
    s->wrow = malloc((size_t)s->n_threads * max_in * sizeof(float));
    s->lut = malloc(sizeof *s->lut);
    if (!s->xq || !s->sx || !s->xf || !s->wrow || !s->lut) {
        qrl_linear_scratch_free(s);
        return qrl_error_set(err, QRL_STATUS_NOMEM, "linear scratch: cannot allocate %zu MiB",
                             rk * 5 >> 20);
    }
    luts_init(s->lut);
    *out = s;
    return QRL_OK;
}

void qrl_linear_scratch_free(qrl_linear_scratch *s) {
    if (!s) return;
    free(s->xq);
    free(s->sx);
    free(s->xf);
    free(s->wrow);
    free(s->lut);
    free(s);
}

/* ---- GEMM cores --------------------------------------------------------------------- */

/* Multiply-adds below which a GEMM runs on one thread: a fork/join costs more than the
 * work (and much more on a loaded machine, where a descheduled thread stalls the team). */
#define PAR_MIN_WORK (1L << 17)

/* acc[t] = sum_k (double)x[t, k] * w[k] for four rows at once: four independent chains,
 * each in the left-to-right order of qrl_gemm_f32 (so each sum is bit-identical to it). */
static void dot4_f64(const float *x, int K, const float *w, double acc[4]) {
    const float *x0 = x, *x1 = x + K, *x2 = x + 2 * (size_t)K, *x3 = x + 3 * (size_t)K;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (int k = 0; k < K; k++) {
        a0 += (double)x0[k] * w[k];
        a1 += (double)x1[k] * w[k];
        a2 += (double)x2[k] * w[k];
        a3 += (double)x3[k] * w[k];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}

static double dot_f64(const float *x, int K, const float *w) {
    double a = 0.0;
    for (int k = 0; k < K; k++) a += (double)x[k] * w[k];
    return a;
}

/* Dequantize weight row n of l into out[K] with the reference dequantizers' operations
 * (FP8: the bare E4M3 values, the per-channel scale goes to the epilogue; NVFP4:
 * decode(code) * qrl_nvfp4_block_dequant_scale, as qrl_nvfp4_dequantize_row; MXFP4:
 * decode(code) * qrl_e8m0_decode(scale), as qrl_mxfp4_dequantize), block factors hoisted. */
static void weight_row(const qrl_linear *l, int n, const luts *t, float *out) {
    int64_t K = l->n_in, cb = qrl_nibble_row_bytes(K);
    const uint8_t *codes = l->codes, *row = codes + (size_t)n * cb;
    switch (l->fmt) {
    case QRL_PRECISION_W8A8_FP8:
        for (int64_t k = 0; k < K; k++) out[k] = t->e4m3[codes[(size_t)n * K + k]];
        break;
    case QRL_PRECISION_W4A16_NVFP4:
    case QRL_PRECISION_W4A4_NVFP4: {
        const uint8_t *bs = l->block_scales + (size_t)n * qrl_nvfp4_blocks(K);
        for (int64_t k0 = 0; k0 < K; k0 += QRL_NVFP4_BLOCK) {
            float ds = qrl_nvfp4_block_dequant_scale(bs[k0 / QRL_NVFP4_BLOCK], l->global_enc[0]);
            int64_t k1 = k0 + QRL_NVFP4_BLOCK < K ? k0 + QRL_NVFP4_BLOCK : K;
            for (int64_t k = k0; k < k1; k++) out[k] = t->e2m1[qrl_nibble_get(row, k)] * ds;
        }
        break;
    }
    case QRL_PRECISION_W4A16_MXFP4: {
        const uint8_t *bs = l->block_scales + (size_t)n * qrl_mxfp4_blocks(K);
        for (int64_t k0 = 0; k0 < K; k0 += QRL_MXFP4_BLOCK) {
            float s = qrl_e8m0_decode(bs[k0 / QRL_MXFP4_BLOCK]);
            int64_t k1 = k0 + QRL_MXFP4_BLOCK < K ? k0 + QRL_MXFP4_BLOCK : K;
            for (int64_t k = k0; k < k1; k++) out[k] = t->e2m1[qrl_nibble_get(row, k)] * s;
        }
        break;
    }
    default:
        QRL_CHECK(!"weight_row: not a dequantized format");
    }
}

/* y[t, n] over all n for the formats that run a double-accumulated dot of F32 operands
 * (FP8 decoded codes, FP4 dequantized weights).  scaled: FP8 epilogue
 * (float)acc * sx[t] * sw[n], else (float)acc. */
static void gemm_f64(const qrl_linear *l, const float *x, int T, float *y, qrl_linear_scratch *s,
                     const luts *lut, bool scaled) {
    int N = l->n_out, K = l->n_in;
    const float *sx = s->sx, *sw = l->scales, *b = l->bias;
#pragma omp parallel for schedule(static) num_threads(s->n_threads) if ((long)N * K * T > PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *w = s->wrow + (size_t)omp_get_thread_num() * s->max_in;
        weight_row(l, n, lut, w);
        int t = 0;
        double acc[4];
        for (; t + 4 <= T; t += 4) {
            dot4_f64(x + (size_t)t * K, K, w, acc);
            for (int i = 0; i < 4; i++) {
                float v = scaled ? (float)acc[i] * sx[t + i] * sw[n] : (float)acc[i];
                y[(size_t)(t + i) * N + n] = b ? v + b[n] : v;
            }
        }
        for (; t < T; t++) {
            double a = dot_f64(x + (size_t)t * K, K, w);
            float v = scaled ? (float)a * sx[t] * sw[n] : (float)a;
            y[(size_t)t * N + n] = b ? v + b[n] : v;
        }
    }
}

/* INT8 x INT8 -> exact INT32 sums, epilogue (float)acc * sx[t] * sw[n] (qrl_gemm_int8). */
static void gemm_int8(const qrl_linear *l, int T, float *y, qrl_linear_scratch *s) {
    int N = l->n_out, K = l->n_in;
    const int8_t *xq = (const int8_t *)s->xq, *wq = l->codes;
    const float *sx = s->sx, *sw = l->scales, *b = l->bias;
#pragma omp parallel for schedule(static) num_threads(s->n_threads) if ((long)N * K * T > PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const int8_t *w = wq + (size_t)n * K;
        for (int t = 0; t < T; t++) {
            const int8_t *xr = xq + (size_t)t * K;
            int32_t acc = 0;
            for (int k = 0; k < K; k++) acc += (int32_t)xr[k] * (int32_t)w[k];
            float v = (float)acc * sx[t] * sw[n];
            y[(size_t)t * N + n] = b ? v + b[n] : v;
        }
    }
}

void qrl_linear_forward(const qrl_linear *l, const float *x, int T, float *y,
                        qrl_linear_scratch *s) {
    int K = l->n_in;
    QRL_CHECK(T >= 0 && T <= s->max_rows && K <= s->max_in);
    size_t TK = (size_t)T * K;
    switch (l->fmt) {
    case QRL_PRECISION_F32:
        qrl_cpu_matmul(y, x, l->w, l->bias, T, K, l->n_out);
        return;
    case QRL_PRECISION_BF16:
        /* BF16 GEMM operands, F32 accumulation (a tensor-core BF16 GEMM's numerics) */
        for (size_t i = 0; i < TK; i++) s->xf[i] = qrl_cpu_bf16_load(qrl_cpu_bf16_store(x[i]));
        qrl_cpu_matmul(y, s->xf, l->w, l->bias, T, K, l->n_out);
        return;
    case QRL_PRECISION_W8A8_INT8:
        qrl_int8_quantize_rows(x, T, K, (int8_t *)s->xq, s->sx);
        gemm_int8(l, T, y, s);
        return;
    case QRL_PRECISION_W8A8_FP8:
        qrl_fp8_quantize_rows(x, T, K, s->xq, s->sx);
        for (size_t i = 0; i < TK; i++) s->xf[i] = s->lut->e4m3[s->xq[i]];
        gemm_f64(l, s->xf, T, y, s, s->lut, true);
        return;
    case QRL_PRECISION_W4A16_NVFP4:
    case QRL_PRECISION_W4A16_MXFP4:
        gemm_f64(l, x, T, y, s, s->lut, false);
        return;
    case QRL_PRECISION_W4A4_NVFP4:
        /* each token row on its own (per-row global scale): batch-invariant codes */
        for (int t = 0; t < T; t++)
            qrl_nvfp4_fake_quantize_row(x + (size_t)t * K, K, s->xf + (size_t)t * K);
        gemm_f64(l, s->xf, T, y, s, s->lut, false);
        return;
    default:
        QRL_CHECK(!"qrl_linear_forward: bad precision");
    }
}
