/* Reference weight dequantization and matmul: the spec for the CPU kernels
 * (src/cpu/cpu_matmul.c, aqlm/aqlm*.c) and the GPU shaders. Plain scalar C,
 * double accumulation, reading the checkpoint description directly. */
#include <stdlib.h>

#include "ref/ref.h"
#include "util.h"

/* Element i of a dense array in format f, as f32. */
static float dense_at(kvq_wformat f, const void *p, size_t i) {
    switch (f) {
    case KVQ_W_F32: return kvq_rd_f32(p, i);
    case KVQ_W_F16: return kvq_f16_to_f32(kvq_rd_u16(p, i));
    case KVQ_W_BF16: return kvq_bf16_to_f32(kvq_rd_u16(p, i));
    default: return 0.0f;
    }
}

void kvq_ref_weight_row(const kvq_weight_desc *w, int row, float *out) {
    size_t cols = (size_t)w->cols, o = (size_t)row;
    if (w->fmt != KVQ_W_AQLM) {
        for (size_t k = 0; k < cols; k++) out[k] = dense_at(w->fmt, w->data, o * cols + k);
        return;
    }
    /* W[o, g*ig + j] = scale[o] * sum_m codebook[m, code(o,g,m), j] */
    size_t ig = (size_t)w->in_group, n_groups = cols / ig, K = (size_t)1 << w->nbits;
    double scale = kvq_f16_to_f32(kvq_rd_u16(w->scales, o));
    for (size_t g = 0; g < n_groups; g++) {
        for (size_t j = 0; j < ig; j++) {
            double s = 0.0;
            for (int m = 0; m < w->n_codebooks; m++) {
                size_t c = kvq_aqlm_code(w, o, g, m);
                s += kvq_f16_to_f32(kvq_rd_u16(w->codebooks, ((size_t)m * K + c) * ig + j));
            }
            out[g * ig + j] = (float)(scale * s);
        }
    }
}

void kvq_ref_weight_dequant(const kvq_weight_desc *w, float *W) {
    for (int o = 0; o < w->rows; o++) kvq_ref_weight_row(w, o, W + (size_t)o * (size_t)w->cols);
}

void kvq_ref_matmul(const kvq_weight_desc *w, const float *x, float *y, int n) {
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    float *row = malloc(cols * sizeof *row);
    if (!row) abort(); /* the reference is for tests and tools; no error path */
    for (size_t o = 0; o < rows; o++) {
        kvq_ref_weight_row(w, (int)o, row);
        double b = w->bias ? dense_at(w->bias_fmt, w->bias, o) : 0.0;
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * cols;
            double s = 0.0;
            for (size_t k = 0; k < cols; k++) s += (double)row[k] * xt[k];
            y[(size_t)t * rows + o] = (float)(s + b);
        }
    }
    free(row);
}
