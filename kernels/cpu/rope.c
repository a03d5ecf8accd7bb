/* Rotary position embedding: frequencies (default, linear, llama3 scaling) and the two
 * rotation layouts (HF rotate_half vs interleaved pairs). */
#include <math.h>

#include "cpu/ops.h"

void qrl_cpu_rope_inv_freq(float *inv_freq, int head_dim, const qrl_rope_params *p) {
    int half = head_dim / 2;
    for (int j = 0; j < half; j++) {
        /* F32 like the sources: HF builds base ** (arange(0, dim, 2).float() / dim) as a
         * float32 tensor; llama2.c calls powf. */
        float expo = (float)(2 * j) / (float)head_dim;
        float f = 1.0f / powf((float)p->theta, expo);
        if (p->scaling == QRL_ROPE_SCALING_LINEAR) {
            f = (float)(f / p->factor);
        } else if (p->scaling == QRL_ROPE_SCALING_LLAMA3) {
            /* transformers _compute_llama3_parameters: keep high frequencies, divide low
             * ones by `factor`, interpolate in between by the wavelength. */
            double old_ctx = p->original_max_position;
            double low_wavelen = old_ctx / p->low_freq_factor;
            double high_wavelen = old_ctx / p->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            double fd = f;
            if (wavelen > low_wavelen) {
                fd = fd / p->factor;
            } else if (!(wavelen < high_wavelen)) {
                double smooth = (old_ctx / wavelen - p->low_freq_factor) /
                                (p->high_freq_factor - p->low_freq_factor);
                fd = (1.0 - smooth) * fd / p->factor + smooth * fd;
            }
            f = (float)fd;
        }
        inv_freq[j] = f;
    }
}

void qrl_cpu_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int half,
                          int pos) {
    for (int j = 0; j < half; j++) {
        float angle = (float)pos * inv_freq[j];
        cos_out[j] = (float)cos((double)angle);
        sin_out[j] = (float)sin((double)angle);
    }
}

void qrl_cpu_rope_apply(float *x, int n_heads, int head_dim, const float *cos_v,
                        const float *sin_v, qrl_rope_layout layout) {
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *xh = x + (size_t)h * head_dim;
        if (layout == QRL_ROPE_LAYOUT_HALF) {
            for (int j = 0; j < half; j++) {
                float x0 = xh[j], x1 = xh[j + half];
                xh[j] = x0 * cos_v[j] - x1 * sin_v[j];
                xh[j + half] = x1 * cos_v[j] + x0 * sin_v[j];
            }
        } else {
            for (int j = 0; j < half; j++) {
                float x0 = xh[2 * j], x1 = xh[2 * j + 1];
                xh[2 * j] = x0 * cos_v[j] - x1 * sin_v[j];
                xh[2 * j + 1] = x0 * sin_v[j] + x1 * cos_v[j];
            }
        }
    }
}
