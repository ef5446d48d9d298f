/* AVX2/FMA/F16C dense kernels: GEMV straight from F32/F16/BF16 rows, row
 * widening to f32, and the f32 tile x tokens product used by every batched path. */
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu_matmul_impl.h"
#include "util.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 values of a dense row at element i, widened to f32. */
static inline __m256 load8(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (f == KVQ_W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16: high half of f32 */
}

static inline float load1(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return f == KVQ_W_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
}

/* Row dot product with the format fixed at compile time (always inlined per format). */
static inline __attribute__((always_inline)) float row_dot(kvq_wformat f, const void *data, size_t base,
                                                           const float *x, int cols) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 32 <= cols; k += 32) {
        a0 = _mm256_fmadd_ps(load8(f, data, base + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(load8(f, data, base + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(load8(f, data, base + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(load8(f, data, base + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= cols; k += 8) a0 = _mm256_fmadd_ps(load8(f, data, base + k), _mm256_loadu_ps(x + k), a0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < cols; k++) s += load1(f, data, base + k) * x[k];
    return s;
}

void kvq_dense_gemv_avx2(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1) {
    size_t cols = (size_t)w->cols;
    for (int o = r0; o < r1; o++) {
        size_t base = (size_t)o * cols;
        switch (w->fmt) {
        case KVQ_W_F32: y[o] = row_dot(KVQ_W_F32, w->data, base, x, w->cols); break;
        case KVQ_W_F16: y[o] = row_dot(KVQ_W_F16, w->data, base, x, w->cols); break;
        default: y[o] = row_dot(KVQ_W_BF16, w->data, base, x, w->cols); break;
        }
    }
}

void kvq_dense_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    size_t base = (size_t)r0 * w->cols, n = (size_t)(r1 - r0) * w->cols, i = 0;
    if (w->fmt == KVQ_W_F32) {
        memcpy(out, (const float *)w->data + base, n * sizeof(float));
        return;
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8(w->fmt, w->data, base + i));
    for (; i < n; i++) out[i] = load1(w->fmt, w->data, base + i);
}

/* RB rows x TB tokens register block: each loaded W vector feeds TB FMAs and
 * each x vector RB, so the loop is FMA-bound rather than load-bound. */
static inline __attribute__((always_inline)) void block(const float *W, size_t ldw, const float *x, int cols,
                                                        float *y, size_t ldy, const int RB, const int TB) {
    __m256 acc[4][3];
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < TB; t++) acc[r][t] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= cols; k += 8) {
        __m256 xv[3];
        for (int t = 0; t < TB; t++) xv[t] = _mm256_loadu_ps(x + (size_t)t * cols + k);
        for (int r = 0; r < RB; r++) {
            __m256 wv = _mm256_loadu_ps(W + (size_t)r * ldw + k);
            for (int t = 0; t < TB; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < TB; t++) {
            float s = hsum8(acc[r][t]);
            for (int kk = k; kk < cols; kk++) s += W[(size_t)r * ldw + kk] * x[(size_t)t * cols + kk];
            y[(size_t)t * ldy + r] = s;
        }
}

void kvq_gemm_avx2(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy) {
    int i = 0;
    for (; i + 4 <= nr; i += 4) {
        const float *Wi = W + (size_t)i * ldw;
        int t = 0;
        for (; t + 3 <= n; t += 3) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 4, 3);
        for (; t < n; t++) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 4, 1);
    }
    for (; i < nr; i++) {
        const float *Wi = W + (size_t)i * ldw;
        int t = 0;
        for (; t + 3 <= n; t += 3) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 1, 3);
        for (; t < n; t++) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 1, 1);
    }
}
