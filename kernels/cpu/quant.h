/* CPU reference of qrl's low-precision number formats (SPEC §3).
 *
 * This is the oracle the CUDA kernels are tested against: every encoder is defined by
 * an exact sequence of IEEE-754 float operations (round-to-nearest-even, no fused
 * multiply-add unless a comment says fmaf), so a CUDA port compiled without
 * --use_fast_math reproduces the codes bit for bit.  docs/formats.md states each rule,
 * the spec it follows and the measured error.
 *
 * Conventions for the whole header:
 *  - Matrices are row-major F32 [rows, cols].  Linear weights are [out, in] (as
 *    nn.Linear); a GEMM computes Y[t, n] = sum_k X[t, k] * W[n, k].
 *  - Block formats split each row into blocks of B consecutive columns; the last block
 *    of a row may be short (it behaves as if zero-padded).  Scales are [rows, ceil(cols/B)].
 *  - 4-bit codes are packed two per byte, row by row (each row starts on a byte):
 *    element 2i in the LOW nibble, element 2i+1 in the HIGH nibble (CUDA's fp4x2 order).
 *  - All buffers are caller-owned; no function here allocates or keeps a pointer.
 *  - Non-finite inputs have one defined behaviour per format (see each encoder); amax
 *    (the absolute maximum that sets a scale) is always taken over finite elements. */
#ifndef QRL_CPU_QUANT_H
#define QRL_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
 * Scalar codecs
 * ==================================================================================== */

#define QRL_E4M3_MAX 448.0f
#define QRL_E4M3_NAN 0x7F /* canonical NaN written by the encoder (0xFF is NaN too) */
#define QRL_E2M1_MAX 6.0f
#define QRL_E8M0_NAN 0xFF

/* Round a float to an integral float, ties to even (IEEE roundTiesToEven), independent
 * of the floating-point environment.  NaN and +-Inf are returned unchanged. */
float qrl_quant_round_half_even(float x);

/* FP4 E2M1 (OCP MX v1.0 §5.3.3): code = s.ee.m, bias 1, magnitudes
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}; no Inf/NaN codes.  Encode: RNE on the code grid (a tie
 * picks the code with mantissa bit 0), |x| > 6 and +-Inf saturate to +-6, NaN -> +6
 * (code 0x7, as CUDA's cvt.rn.satfinite.e2m1), the sign of a value rounding to zero
 * is kept (-0.1 -> 0x8).  Decode takes the low 4 bits of `code`. */
uint8_t qrl_e2m1_encode(float x);
float qrl_e2m1_decode(uint8_t code);

/* FP8 E4M3, OCP "FN" variant (OCP 8-bit FP spec v1.0): bias 7, max 448, min normal
 * 2^-6, min subnormal 2^-9, no infinities, NaN = S.1111.111 (0x7F, 0xFF).  Encode: RNE,
 * saturating (|x| > 448 and +-Inf -> +-448), NaN -> 0x7F, sign of an underflow kept:
 * identical to CUDA __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3). */
uint8_t qrl_e4m3_encode(float x);
float qrl_e4m3_decode(uint8_t code);

/* E8M0 (OCP MX v1.0 §5.4.1): unsigned power-of-two scale 2^(code-127), code 0 = 2^-127,
 * 254 = 2^127, 0xFF = NaN. */
float qrl_e8m0_decode(uint8_t code);
/* Code of 2^exponent; exponent is clamped to [-127, 127]. */
uint8_t qrl_e8m0_from_exponent(int exponent);

/* BF16: the high 16 bits of an F32.  Encode: RNE; NaN stays a quiet NaN with its sign
 * (same as qrl_cpu_bf16_store; CUDA's cvt returns canonical 0x7FFF: compare NaN-ness). */
uint16_t qrl_bf16_encode(float x);
float qrl_bf16_decode(uint16_t h);

/* INT8 symmetric with a given decode scale: q = clamp(RNE(x / scale), -127, 127) (IEEE
 * division; -128 is never produced).  NaN -> 0, +-Inf -> +-127, scale == 0 -> 0. */
int8_t qrl_int8_encode(float x, float scale);
static inline float qrl_int8_decode(int8_t q, float scale) { return (float)q * scale; }

/* 4-bit packing, two per byte, element 2i in the low nibble.  `n` elements; when n is
 * odd the last byte's high nibble is written as 0.  Signed variants store two's
 * complement nibbles for values in [-8, 7] (values outside are a caller bug: checked). */
void qrl_nibble_pack(const uint8_t *codes, int64_t n, uint8_t *packed);
void qrl_nibble_unpack(const uint8_t *packed, int64_t n, uint8_t *codes);
void qrl_int4_pack(const int8_t *vals, int64_t n, uint8_t *packed);
void qrl_int4_unpack(const uint8_t *packed, int64_t n, int8_t *vals);
static inline uint8_t qrl_nibble_get(const uint8_t *packed, int64_t i) {
    return (uint8_t)((packed[i >> 1] >> ((i & 1) * 4)) & 0xF);
}
static inline int64_t qrl_nibble_row_bytes(int64_t cols) { return (cols + 1) / 2; }

/* Absolute maximum over the finite elements of x[0..n) (0 for none); *nonfinite (if
 * non-NULL) is set when any element is NaN or +-Inf. */
float qrl_quant_absmax(const float *x, int64_t n, bool *nonfinite);

/* ======================================================================================
 * Per-row INT8 and FP8 (w8a8: weights per output channel, activations per token)
 * ==================================================================================== */

/* INT8 symmetric per row: scale[r] = absmax(row) / 127 (F32 division), codes by
 * qrl_int8_encode.  x [rows, cols] -> q [rows, cols], scales [rows]. */
void qrl_int8_quantize_rows(const float *x, int64_t rows, int64_t cols, int8_t *q,
                            float *scales);
void qrl_int8_dequantize_rows(const int8_t *q, const float *scales, int64_t rows,
                              int64_t cols, float *x);

/* FP8 E4M3 per row: scale[r] = absmax(row) / 448, q = E4M3(x / scale); a row with
 * scale 0 encodes finite elements as +-0; NaN -> 0x7F, +-Inf -> +-448 (saturated). */
void qrl_fp8_quantize_rows(const float *x, int64_t rows, int64_t cols, uint8_t *q,
                           float *scales);
void qrl_fp8_dequantize_rows(const uint8_t *q, const float *scales, int64_t rows,
                             int64_t cols, float *x);

/* ======================================================================================
 * NVFP4: E2M1 in 16-blocks, E4M3 block scale, one FP32 global scale (NVIDIA's recipe as
 * in TransformerEngine's core_nvfp4.cuh; docs/formats.md gives the exact sequence):
 *   S_enc = 2688 / amax  (2688 = 448*6; FLT_MAX if that overflows; 1 if amax is 0)
 *   s_b   = E4M3(block_amax * (S_enc * (1.0f/6.0f)))          block scale code
 *   r_b   = min(1 / (decode(s_b) * (1 / S_enc)), FLT_MAX)     element multiplier
 *   code  = E2M1(x * r_b);      x_hat = decode(code) * (decode(s_b) * (1 / S_enc))
 * A block with s_b == 0 stores codes 0; a block with a NaN/Inf stores s_b = 0x7F (NaN)
 * and codes 0, so it decodes to NaN.  The global scale is per tensor (weights) or per
 * row (activations and KV vectors: a token's codes must not depend on its batch).
 * ==================================================================================== */

#define QRL_NVFP4_BLOCK 16
#define QRL_MXFP4_BLOCK 32

typedef struct qrl_nvfp4 {
    int64_t rows, cols;
    uint8_t *codes;    /* rows * qrl_nibble_row_bytes(cols) bytes */
    uint8_t *scales;   /* rows * qrl_nvfp4_blocks(cols) E4M3 codes */
    float *global_enc; /* S_enc: 1 value (per tensor) or `rows` values (per_row) */
    bool per_row;
} qrl_nvfp4;

static inline int64_t qrl_nvfp4_blocks(int64_t cols) {
    return (cols + QRL_NVFP4_BLOCK - 1) / QRL_NVFP4_BLOCK;
}

/* S_enc for a given amax, as above. */
float qrl_nvfp4_global_enc(float amax);
/* Block scale code for a block absmax under S_enc. */
uint8_t qrl_nvfp4_block_scale(float block_amax, float global_enc);
/* Element multiplier r_b for a block scale code; 0 for scale code 0 or NaN. */
float qrl_nvfp4_block_rcp(uint8_t scale_code, float global_enc);
/* Dequantization factor decode(s_b) * (1 / S_enc). */
float qrl_nvfp4_block_dequant_scale(uint8_t scale_code, float global_enc);

/* Quantize x [q->rows, q->cols] into q (buffers sized as in qrl_nvfp4; q->per_row
 * chosen by the caller).  Errors: INVALID_ARGUMENT for negative shapes or NULL buffers. */
qrl_status qrl_nvfp4_quantize(const float *x, qrl_nvfp4 *q, qrl_error *err);
void qrl_nvfp4_dequantize(const qrl_nvfp4 *q, float *x);
/* One row of n elements with its own global scale (activations, KV vectors, TRACE):
 * codes [ceil(n/2)], scales [ceil(n/16)], *global_enc. */
void qrl_nvfp4_quantize_row(const float *x, int64_t n, uint8_t *codes, uint8_t *scales,
                            float *global_enc);
void qrl_nvfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales, float global_enc,
                              int64_t n, float *x);
/* y = dequantize(quantize_row(x)) without packing (QAT fake quantization); bit-identical
 * to the two calls above.  y may alias x. */
void qrl_nvfp4_fake_quantize_row(const float *x, int64_t n, float *y);

/* ======================================================================================
 * MXFP4 (OCP MX v1.0 §6.3): E2M1 in 32-blocks with a shared E8M0 scale X = 2^e,
 *   e = clamp(floor(log2(block_amax)) - 2, -127, 127)   (2 = emax of E2M1)
 *   code = E2M1(x / X) (exact power-of-two scaling; RNE; values in (6, 8)*X saturate)
 * An all-zero block gets e = -127 (code 0); a block with NaN/Inf gets scale 0xFF (NaN).
 * codes [rows * ceil(cols/2)], scales [rows * ceil(cols/32)].
 * ==================================================================================== */

static inline int64_t qrl_mxfp4_blocks(int64_t cols) {
    return (cols + QRL_MXFP4_BLOCK - 1) / QRL_MXFP4_BLOCK;
}
void qrl_mxfp4_quantize(const float *x, int64_t rows, int64_t cols, uint8_t *codes,
                        uint8_t *scales);
void qrl_mxfp4_dequantize(const uint8_t *codes, const uint8_t *scales, int64_t rows,
                          int64_t cols, float *x);

/* ======================================================================================
 * Reference GEMMs.  Y [T, N] = X [T, K] * W[N, K]^T.  Sums of products are accumulated
 * in double and rounded to F32 once (INT8: exact INT32 accumulation), so the only
 * difference from qrl_gemm_f32 is the quantization.  Errors: INVALID_ARGUMENT for bad
 * shapes; the INT8 GEMM needs K <= QRL_INT8_GEMM_MAX_K so INT32 cannot overflow.
 * ==================================================================================== */

#define QRL_INT8_GEMM_MAX_K 133143 /* floor((2^31 - 1) / 127^2) */

void qrl_gemm_f32(const float *x, const float *w, int64_t T, int64_t N, int64_t K, float *y);

/* INT8 x INT8 -> INT32, epilogue y = (float)acc * sx[t] * sw[n] (left to right). */
qrl_status qrl_gemm_int8(const int8_t *xq, const float *sx, const int8_t *wq, const float *sw,
                         int64_t T, int64_t N, int64_t K, float *y, qrl_error *err);
/* E4M3 x E4M3 (exact products), epilogue y = (float)acc * sx[t] * sw[n]. */
void qrl_gemm_fp8(const uint8_t *xq, const float *sx, const uint8_t *wq, const float *sw,
                  int64_t T, int64_t N, int64_t K, float *y);

/* w8a8 linear layers: quantize x per token into the caller's scratch (xq [T*K], sx [T])
 * then run the GEMM above against per-channel quantized weights. */
qrl_status qrl_linear_w8a8_int8(const float *x, int64_t T, int64_t K, const int8_t *wq,
                                const float *sw, int64_t N, int8_t *xq, float *sx, float *y,
                                qrl_error *err);
void qrl_linear_w8a8_fp8(const float *x, int64_t T, int64_t K, const uint8_t *wq,
                         const float *sw, int64_t N, uint8_t *xq, float *sx, float *y);

/* w4a16: weights dequantized (NVFP4 [N, K] or MXFP4 [N, K]) into wf [N*K] (caller
 * scratch), then F32 math.  w4a4-nvfp4: activations additionally fake-quantized to NVFP4
 * per token (per-row global scale) into xf [T*K].  Errors: shape mismatch. */
qrl_status qrl_linear_w4a16_nvfp4(const float *x, int64_t T, const qrl_nvfp4 *w, float *wf,
                                  float *y, qrl_error *err);
void qrl_linear_w4a16_mxfp4(const float *x, int64_t T, const uint8_t *w_codes,
                            const uint8_t *w_scales, int64_t N, int64_t K, float *wf,
                            float *y);
qrl_status qrl_linear_w4a4_nvfp4(const float *x, int64_t T, const qrl_nvfp4 *w, float *wf,
                                 float *xf, float *y, qrl_error *err);

/* ======================================================================================
 * KV-cache formats, one token-head vector of head_dim elements at a time (SPEC §3)
 * ==================================================================================== */

#define QRL_KV_MAX_HEAD_DIM 1024

/* fp8: E4M3 with one F32 scale per KV head, fixed when the cache is created (from the
 * prompt's prefill vectors): scale = headroom * absmax(calibration vectors) / 448 (1 if
 * absmax is 0).  Values that later exceed 448*scale saturate.  x [n_vec, head_dim].
 * Headroom 4 costs no measurable error (E4M3 is scale-free above 2^-6) and absorbs 4x
 * growth past the prefill's absmax. */
#define QRL_KV_FP8_DEFAULT_HEADROOM 4.0f
float qrl_kv_fp8_head_scale(const float *x, int64_t n_vec, int head_dim, float headroom);
void qrl_kv_fp8_quantize(const float *x, int head_dim, float scale, uint8_t *codes);
void qrl_kv_fp8_dequantize(const uint8_t *codes, int head_dim, float scale, float *x);

/* int8: per token-head scale = qrl_int8_quantize_rows with one row. */

/* int4, group-wise along head_dim (groups of `group` elements, last may be short).
 *  SYMMETRIC : scale = absmax/7, q = clamp(RNE(x/scale), -7, 7), two's complement nibble;
 *              x_hat = q * scale.
 *  ASYMMETRIC: scale = (max - min)/15 (computed in double, rounded once), zero = min,
 *              q = clamp(RNE((x - min)/scale), 0, 15) with (x - min)/scale in double,
 *              x_hat = fmaf(q, scale, min).  scale 0 (constant group) -> q = 0.
 * NaN -> q 0 (sym) / 0 (asym: min); +-Inf saturate.  codes [ceil(head_dim/2)],
 * scales [n_groups], zeros [n_groups] (ASYMMETRIC only; NULL allowed for SYMMETRIC). */
typedef enum qrl_int4_mode { QRL_INT4_SYMMETRIC = 0, QRL_INT4_ASYMMETRIC = 1 } qrl_int4_mode;
/* Default: asymmetric, group 32 (measured in docs/formats.md: 0.078 vs 0.097 rel. error
 * on Gaussian, 0.109 vs 0.195 on outlier-heavy K-like vectors, for 1 bit/element more). */
#define QRL_KV_INT4_DEFAULT_GROUP 32
#define QRL_KV_INT4_DEFAULT_MODE QRL_INT4_ASYMMETRIC

static inline int qrl_kv_int4_groups(int head_dim, int group) {
    return (head_dim + group - 1) / group;
}
void qrl_kv_int4_quantize(const float *x, int head_dim, int group, qrl_int4_mode mode,
                          uint8_t *codes, float *scales, float *zeros);
void qrl_kv_int4_dequantize(const uint8_t *codes, const float *scales, const float *zeros,
                            int head_dim, int group, qrl_int4_mode mode, float *x);

/* Position-indexed INT4 store of one KV head (K or V): row p holds the codes, scales
 * and zeros of position p. */
typedef struct qrl_kv_int4_store {
    int head_dim, group;
    qrl_int4_mode mode;
    const uint8_t *codes; /* [n_pos][ceil(head_dim/2)] */
    const float *scales;  /* [n_pos][n_groups] */
    const float *zeros;   /* [n_pos][n_groups] or NULL (SYMMETRIC) */
} qrl_kv_int4_store;

/* INT8 side cache of one KV head: sink + recent slots (see qrl_kv_protected_slot). */
typedef struct qrl_kv_int8_store {
    int head_dim;
    const int8_t *codes; /* [slots][head_dim] */
    const float *scales; /* [slots] */
} qrl_kv_int8_store;

/* Slot of position `pos` in the INT8 side cache when the sequence has n_pos positions:
 * pos < sink -> pos; pos >= n_pos - recent -> sink + (pos - sink) % recent (a ring, so a
 * new token overwrites the one that just left the window); otherwise -1 (INT4 only). */
int64_t qrl_kv_protected_slot(int64_t pos, int64_t n_pos, int sink, int recent);

/* Partial softmax-attention over a subset of positions (flash-decoding split-K state):
 * max = max score, sum = sum exp(score - max), acc[d] = sum exp(score - max) * v[d].
 * An empty partial has sum == 0 (max = -INFINITY). */
typedef struct qrl_attention_partial {
    float max;
    float sum;
    float *acc; /* [head_dim], caller-owned */
} qrl_attention_partial;

/* Partial over F32 rows k, v [n, head_dim]: scores = (q.k) * scale (dot in double,
 * rounded to F32), weights expf(score - max), sum and acc accumulated in double. */
void qrl_attention_partial_f32(const float *q, const float *k, const float *v, int64_t n,
                               int head_dim, float scale, qrl_attention_partial *out);
/* Merge partials (in index order, empty ones skipped) into the normalized output:
 * m = max_i max_i; out = sum_i acc_i*expf(max_i - m) / sum_i sum_i*expf(max_i - m).
 * All partials empty -> out = 0. */
void qrl_attention_merge(const qrl_attention_partial *parts, int n_parts, int head_dim,
                         float *out);

/* Attention of one query q [head_dim] over n_pos positions of an INT4 cache:
 * one partial over all positions in order, then qrl_attention_merge.  Errors:
 * INVALID_ARGUMENT (head_dim mismatch or > QRL_KV_MAX_HEAD_DIM, n_pos < 0). */
qrl_status qrl_attention_int4(const float *q, int64_t n_pos, const qrl_kv_int4_store *k,
                              const qrl_kv_int4_store *v, float scale, float *out,
                              qrl_error *err);
/* KV4-RL: positions with a side-cache slot (first `sink`, last `recent`) are read from
 * the INT8 stores, the rest from the INT4 stores; partial[0] = INT4 region (increasing
 * positions), partial[1] = protected region (increasing positions), merged by
 * qrl_attention_merge.  sink = recent = 0 gives exactly qrl_attention_int4's result. */
qrl_status qrl_attention_int4_protected(const float *q, int64_t n_pos,
                                        const qrl_kv_int4_store *k4,
                                        const qrl_kv_int4_store *v4,
                                        const qrl_kv_int8_store *k8,
                                        const qrl_kv_int8_store *v8, int sink, int recent,
                                        float scale, float *out, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
