/* Scalar dense kernels: the spec the ISA versions in this room follow, and
 * what runs where none applies. */
#include <string.h>

#include "cpu/dense/dense_kernels.h"

void kvq_dense_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int o = r0; o < r1; o++) {
        size_t base = (size_t)o * cols;
        float acc[KVQ_GEMV_MAX_T] = {0};
        for (size_t k = 0; k < cols; k++) {
            float v = kvq_dense_at(w->fmt, w->data, base + k);
            for (int t = 0; t < n; t++) acc[t] += v * x[t * cols + k];
        }
        for (int t = 0; t < n; t++) y[t * rows + (size_t)o] = acc[t];
    }
}

void kvq_dense_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    size_t cols = (size_t)w->cols, n = (size_t)(r1 - r0) * cols, base = (size_t)r0 * cols;
    if (w->fmt == KVQ_W_F32) {
        memcpy(out, (const float *)w->data + base, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = kvq_dense_at(w->fmt, w->data, base + i);
}

void kvq_gemm_scalar(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * cols;
        for (int i = 0; i < nr; i++) {
            const float *wr = W + (size_t)i * ldw;
            float acc = 0.0f;
            for (int k = 0; k < cols; k++) acc += wr[k] * xt[k];
            y[(size_t)t * ldy + i] = acc;
        }
    }
}
