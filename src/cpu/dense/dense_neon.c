/* NEON (AArch64) dense kernels: GEMV straight from F32/F16/BF16 as stored,
 * and the f32 tile GEMM of the batched path. Checked against src/ref under
 * qemu by tests/neon/. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "cpu/dense/dense_kernels.h"

/* Four values of a dense row from element i, widened to f32. In-place tensors
 * are aligned to their element size (cpu_matmul.c copies them otherwise). */
static inline float32x4_t dense4(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return vld1q_f32((const float *)p + i);
    uint16x4_t h = vld1_u16((const uint16_t *)p + i);
    if (f == KVQ_W_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); /* bf16: the top half of an f32 */
}

static inline float dense1(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return f == KVQ_W_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
}

void kvq_dense_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int o = r0; o < r1; o++) {
        size_t base = (size_t)o * cols, k = 0;
        float32x4_t a0[KVQ_GEMV_MAX_T], a1[KVQ_GEMV_MAX_T];
        for (int t = 0; t < n; t++) a0[t] = a1[t] = vdupq_n_f32(0.0f);
        for (; k + 8 <= cols; k += 8) { /* each weight vector feeds all n tokens */
            float32x4_t w0 = dense4(w->fmt, w->data, base + k), w1 = dense4(w->fmt, w->data, base + k + 4);
            for (int t = 0; t < n; t++) {
                a0[t] = vfmaq_f32(a0[t], w0, vld1q_f32(x + t * cols + k));
                a1[t] = vfmaq_f32(a1[t], w1, vld1q_f32(x + t * cols + k + 4));
            }
        }
        for (int t = 0; t < n; t++) {
            float s = vaddvq_f32(vaddq_f32(a0[t], a1[t]));
            for (size_t kk = k; kk < cols; kk++) s += dense1(w->fmt, w->data, base + kk) * x[t * cols + kk];
            y[t * rows + (size_t)o] = s;
        }
    }
}

void kvq_gemm_neon(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy) {
    for (int i = 0; i < nr; i++) {
        const float *wr = W + (size_t)i * ldw;
        int t = 0;
        for (; t + 2 <= n; t += 2) { /* two tokens per pass over the row */
            const float *x0 = x + (size_t)t * cols, *x1 = x0 + cols;
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, b0 = a0, b1 = a0;
            int k = 0;
            for (; k + 8 <= cols; k += 8) {
                float32x4_t w0 = vld1q_f32(wr + k), w1 = vld1q_f32(wr + k + 4);
                a0 = vfmaq_f32(a0, w0, vld1q_f32(x0 + k));
                a1 = vfmaq_f32(a1, w1, vld1q_f32(x0 + k + 4));
                b0 = vfmaq_f32(b0, w0, vld1q_f32(x1 + k));
                b1 = vfmaq_f32(b1, w1, vld1q_f32(x1 + k + 4));
            }
            float s0 = vaddvq_f32(vaddq_f32(a0, a1)), s1 = vaddvq_f32(vaddq_f32(b0, b1));
            for (; k < cols; k++) s0 += wr[k] * x0[k], s1 += wr[k] * x1[k];
            y[(size_t)t * ldy + i] = s0;
            y[(size_t)(t + 1) * ldy + i] = s1;
        }
        for (; t < n; t++) {
            const float *x0 = x + (size_t)t * cols;
            float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
            int k = 0;
            for (; k + 8 <= cols; k += 8) {
                a0 = vfmaq_f32(a0, vld1q_f32(wr + k), vld1q_f32(x0 + k));
                a1 = vfmaq_f32(a1, vld1q_f32(wr + k + 4), vld1q_f32(x0 + k + 4));
            }
            float s0 = vaddvq_f32(vaddq_f32(a0, a1));
            for (; k < cols; k++) s0 += wr[k] * x0[k];
            y[(size_t)t * ldy + i] = s0;
        }
    }
}
