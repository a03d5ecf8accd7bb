/* Internal to the kernels/cuda sources (C++ only): how the flash-decoding attentions
 * (attention.cu BF16, attention_q.cu quantized) split each row's positions into chunks,
 * one thread block per chunk, and the tuning knobs they read for A/B timing (base/tuning.h).
 * Chunks are whole multiples of TILE_MIN positions. */
#ifndef QRL_CUDA_SPLITS_CUH
#define QRL_CUDA_SPLITS_CUH

#include <cuda_runtime.h>

#include "base/tuning.h"

#ifndef TILE_MIN
#define TILE_MIN 64 /* chunk granularity in positions */
#endif

static inline int sm_count(void) {
    static int n = 0;
    if (n == 0) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) n = 132;
    }
    return n;
}

static inline int round_tile(long c) { return (int)((c + TILE_MIN - 1) / TILE_MIN * TILE_MIN); }

/* Splits of the tensor-core path: ~16 blocks per multiprocessor (several waves of the 3
 * resident 128-thread blocks that 155 registers allow), chunks of whole tiles; once the
 * rows alone fill the chip, chunks of >= QRL_ATTN_CHUNK_MIN (512) positions so each warp
 * pipelines >= 8 tiles, without a tiny last chunk; then (QRL_ATTN_WAVEFIT) up to twice
 * the splits when that makes the last wave of blocks markedly fuller. */
static inline int tc_splits(int max_len, long rows, int *chunk_out) {
    long res = 3L * sm_count();
    long want = (16L * sm_count() + rows - 1) / rows;
    long max_splits = (max_len + TILE_MIN - 1) / TILE_MIN;
    int ns = (int)(want < 1 ? 1 : want > max_splits ? max_splits : want);
    int chunk = round_tile((max_len + ns - 1) / ns);
    int cmin = qrl_tuning_int(QRL_TUNING_ATTN_CHUNK_MIN);
    if (rows >= sm_count() && chunk < cmin) {
        ns = max_len / cmin > 1 ? max_len / cmin : 1;
        chunk = round_tile((max_len + ns - 1) / ns);
    }
    ns = (max_len + chunk - 1) / chunk;
    if (qrl_tuning_bool(QRL_TUNING_ATTN_WAVEFIT) && rows * ns >= res) {
        double best = 0.0;
        for (int k = ns; k <= 2 * ns && k <= max_splits; k++) {
            int c = round_tile((max_len + k - 1) / k);
            if (c < 256) break;
            long blocks = rows * ((max_len + c - 1) / c);
            double eff = (double)blocks / ((double)((blocks + res - 1) / res) * res);
            if (k == ns || eff > best + 0.02) best = eff, chunk = c;
        }
        ns = (max_len + chunk - 1) / chunk;
    }
    *chunk_out = chunk;
    return ns;
}

#endif
