/* NVFP4 per-row quantization on the GPU (host launchers only, STYLE 7; the device
 * functions are in nvfp4_dev.cuh).  Reference: qrl_nvfp4_quantize_row (kernels/cpu/quant.h),
 * whose S_enc, E4M3 block scales and packed E2M1 codes every path here reproduces bit for
 * bit on the same F32 values; docs/formats.md.
 *
 * Users: the w4a4-nvfp4 CUDA forward (activations quantized per token before every
 * projection; the GEMM consumes xq and s_dec), the fp4 KV cache (kv_quant.cu) and the
 * TRACE recorder (codes, scales and S_enc of the sites it records). */
#ifndef QRL_CUDA_NVFP4_QUANT_CUH
#define QRL_CUDA_NVFP4_QUANT_CUH

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Outputs of a per-row NVFP4 quantization of rows of n values (device pointers; each may be
 * NULL when not wanted, at least one given):
 *   codes  [rows, ceil(n/2)]  packed E2M1 (element 2i in the low nibble; each row starts on a
 *                             byte; an odd n leaves the last high nibble 0)
 *   scales [rows, ceil(n/16)] E4M3 block scales (0x7F: a block with NaN/Inf)
 *   s_enc  [rows]             the row's global scale S_enc = 2688 / absmax (quant.h)
 *   xq     [rows, n]          BF16 e2m1(code) * decode(scale): exact, so that
 *                             xq * s_dec is the CPU's dequantized row up to one F32 rounding
 *   s_dec  [rows]             1 / S_enc (IEEE division)
 *   x_out  [rows, n]          the F32 values that were quantized (a fused producer's outputs
 *                             before any BF16 rounding; tests and the recorder check codes
 *                             against qrl_nvfp4_quantize_row on exactly these)
 * codes, scales, s_enc are what qrl_nvfp4_quantize_row gives for each row of x_out. */
struct qrl_cuda_trace_ctl; /* cuda/trace_capture.cuh */

typedef struct qrl_cuda_nvfp4_act {
    uint8_t *codes, *scales;
    float *s_enc;
    uint16_t *xq;
    float *s_dec;
    float *x_out;
    /* TRACE sink (SPEC §6; NULL trace_ctl: none, one uniform test per row): row r with
     * trace_dst[r] >= 0 also writes its record, (S_enc, E4M3 block scales, code LSBs) in
     * trace_capture.cuh's slab layout, at byte trace_off of store entry trace_dst[r], and its
     * F32 values at float trace_tap_off of tap entry trace_dst[r] when the control block has
     * a tap store.  Both device pointers are read at run time (a graph replay records what
     * the host wrote there for that pass).  The record is that of the codes the row was
     * quantized to: qrl_trace_capture of the row's F32 values, bit for bit. */
    const struct qrl_cuda_trace_ctl *trace_ctl;
    const int64_t *trace_dst;
    int64_t trace_off, trace_tap_off;
} qrl_cuda_nvfp4_act;

static inline int qrl_cuda_nvfp4_code_bytes(int n) { return (n + 1) / 2; }
static inline int qrl_cuda_nvfp4_blocks(int n) { return (n + 15) / 16; }

/* Quantize rows x [rows, n] (contiguous; F32, or BF16 when x_bf16: its exact F32 values)
 * into *out, one row per thread block, on `stream`.  Errors: INVALID_ARGUMENT (rows or
 * n <= 0, x NULL, no output, trace_ctl without trace_dst), CUDA (launch). */
qrl_status qrl_cuda_nvfp4_quantize_rows(const qrl_cuda_nvfp4_act *out, const void *x, bool x_bf16,
                                        int rows, int n, void *stream, qrl_error *err);

#ifdef __cplusplus
}
#endif
#endif
