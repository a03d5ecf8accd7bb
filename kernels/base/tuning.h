/* Kernel tuning knobs: the one table of the switches the CUDA kernels and the CUDA forward
 * read for A/B timing and kernel choice (docs/tuning.md).  Each knob has a name, a type, a
 * default, a range and an environment variable; a knob's value is, in order: what
 * qrl_tuning_set gave it (a program's config, e.g. rollout.cuda_tuning), else its
 * environment variable when that holds a valid value, else the default.
 *
 * The environment is read at each use (as the kernels always did), so a benchmark or test
 * that calls setenv between two measurements in one process times both; every reader says
 * below when it reads.  Thread-safe: the values set by qrl_tuning_set are atomics, and
 * reads only call getenv (a program must not setenv while other threads run kernels).
 * Plain C, no CUDA: in every build, so a program applies its config the same way in both. */
#ifndef QRL_BASE_TUNING_H
#define QRL_BASE_TUNING_H

#include <stdbool.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(ID, name, type, default, min, max, doc).  type: BOOL (0/1, also true/false, on/off,
 * yes/no), INT, REAL.  Names are the environment variables without QRL_, lower case. */
#define QRL_TUNING_TABLE(X)                                                                   \
    X(KV_STORE_UNFUSED, "kv_store_unfused", BOOL, 0, 0, 1,                                    \
      "quantized KV cache: store K/V codes with a separate launch after RoPE instead of "     \
      "inside the RoPE kernel (A/B); read by qrl_cuda_forward_new")                           \
    X(W8A8_UNFUSED, "w8a8_unfused", BOOL, 0, 0, 1,                                            \
      "w8a8 forward: quantize activations in a separate launch before each projection "       \
      "instead of inside the norms and SwiGLU (A/B); read by qrl_cuda_forward_new")           \
    X(W8A8_EPILOGUE_PASS, "w8a8_epilogue_pass", BOOL, 0, 0, 1,                                \
      "w8a8 forward: the unit-scale cuBLAS GEMMs of o and down finish with a separate "       \
      "epilogue pass instead of in the norm that reads their output (A/B); read by "          \
      "qrl_cuda_forward_new")                                                                 \
    X(TRAIN_ATTN_SIMPLE, "train_attn_simple", BOOL, 0, 0, 1,                                  \
      "training attention: the CUDA-core kernels for every head_dim instead of the "          \
      "tensor-core ones at 64 and 128 (A/B); read per call")                                  \
    X(FP4_NO_SPLITK, "fp4_no_splitk", BOOL, 0, 0, 1,                                          \
      "fp4 GEMM: AUTO keeps the skinny kernel where it would take split-K (the 'before' of "  \
      "bench/fp4.c); read per call")                                                          \
    X(GEMM_BF16_CUBLAS, "gemm_bf16_cublas", BOOL, 0, 0, 1,                                    \
      "bf16 GEMM: a new handle runs cuBLAS where AUTO would take the skinny kernel; read by "  \
      "qrl_cuda_gemm_new")                                                                    \
    X(GEMM_BF16_SKINNY_MAX_N, "gemm_bf16_skinny_max_n", INT, 8, 0, 1 << 20,                   \
      "bf16 GEMM AUTO: the skinny kernel for at most this many rows; read by "                \
      "qrl_cuda_gemm_new")                                                                    \
    X(GEMM_BF16_SKINNY_MAX_MB, "gemm_bf16_skinny_max_mb", REAL, 24.0, 0, 1e9,                 \
      "bf16 GEMM AUTO: the skinny kernel for weights of at most this many MB (1e6 bytes); "   \
      "read by qrl_cuda_gemm_new")                                                            \
    X(ATTN_LEGACY, "attn_legacy", BOOL, 0, 0, 1,                                              \
      "decode attention (bf16 and quantized KV): the CUDA-core kernel for every head_dim "    \
      "instead of the tensor-core one at 64 and 128 (A/B); read per call")                    \
    X(ATTN_STAGES, "attn_stages", INT, 2, 2, 3,                                               \
      "bf16 decode attention, tensor-core path: cp.async pipeline depth; read per call")      \
    X(ATTN_VARIANT, "attn_variant", INT, 1, 0, 2,                                             \
      "bf16 decode attention, tensor-core path: kernel variant (bench/attn.c); read per "     \
      "call")                                                                                 \
    X(ATTN_CHUNK_MIN, "attn_chunk_min", INT, 512, 1, 1 << 30,                                 \
      "decode attention splits: once the rows fill the GPU, chunks of at least this many "    \
      "positions; read per call")                                                             \
    X(ATTN_WAVEFIT, "attn_wavefit", BOOL, 0, 0, 1,                                            \
      "decode attention splits: up to twice the splits when that fills the last wave of "     \
      "blocks markedly better; read per call")                                                \
    X(ATTNQ_STAGES, "attnq_stages", INT, 3, 2, 4,                                             \
      "quantized-KV decode attention, tensor-core path: cp.async pipeline depth; read per "   \
      "call")                                                                                 \
    X(ATTNQ_DEQ, "attnq_deq", INT, 2, 0, 2,                                                   \
      "quantized-KV decode attention, tensor-core path: the decoders (0 previous, 1 masked "  \
      "nibbles, 2 also two MMA chains); read per call")

typedef enum qrl_tuning_knob {
#define QRL_X_(id, name, type, dflt, lo, hi, doc) QRL_TUNING_##id,
    QRL_TUNING_TABLE(QRL_X_)
#undef QRL_X_
    QRL_TUNING_COUNT_
} qrl_tuning_knob;

typedef enum qrl_tuning_type { QRL_TUNING_BOOL, QRL_TUNING_INT, QRL_TUNING_REAL } qrl_tuning_type;

/* A knob's row of the table; static storage.  env: "QRL_" + the upper-case name. */
typedef struct qrl_tuning_info {
    const char *name, *env, *doc;
    qrl_tuning_type type;
    double dflt, min, max;
} qrl_tuning_info;

/* The row of knob k (k < QRL_TUNING_COUNT_). */
const qrl_tuning_info *qrl_tuning_info_of(qrl_tuning_knob k);

/* The knob's value now (the order in the header comment).  An environment value that does
 * not parse or is out of range is ignored (the default holds) and reported once on
 * stderr.  qrl_tuning_int on a REAL knob truncates. */
bool qrl_tuning_bool(qrl_tuning_knob k);
int qrl_tuning_int(qrl_tuning_knob k);
double qrl_tuning_real(qrl_tuning_knob k);

/* Set knob `name` (the table's name, or its environment variable) to `value` (text, as
 * in the environment): it then wins over the environment.  value NULL or "" drops what an
 * earlier call set.  Errors: NOT_FOUND (no such knob), INVALID_ARGUMENT (value does not
 * parse as the knob's type or is outside its range); both name the knob, and the knob
 * keeps its value. */
qrl_status qrl_tuning_set(const char *name, const char *value, qrl_error *err);

/* Apply "name=value,name=value" (spaces around items allowed; "" sets nothing), as a
 * config key holds it.  Checks every item before setting any: on an error nothing is set.
 * Errors: as qrl_tuning_set, PARSE for an item without '='. */
qrl_status qrl_tuning_apply(const char *list, qrl_error *err);

/* Drop every value qrl_tuning_set gave (the environment and defaults hold again). */
void qrl_tuning_reset(void);

#ifdef __cplusplus
}
#endif
#endif
