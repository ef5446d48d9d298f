/* AVX2/FMA/F16C dense kernels: GEMV straight from F32/F16/BF16 rows, row
 * widening to f32, and the f32 tile x tokens product used by every batched path. */
#include <immintrin.h>
#include <string.h>

#include "cpu/dense/dense_kernels.h"
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

/* One row against T tokens, format fixed at compile time (always inlined per
 * format and T): every widened W vector feeds T FMAs; two accumulator sets
 * keep two FMA chains per token in flight. */
static inline __attribute__((always_inline)) void row_dots(kvq_wformat f, const void *data, size_t base,
                                                           const float *x, int cols, float *out, const int T) {
    __m256 a[2][KVQ_GEMV_MAX_T];
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm256_setzero_ps();
    int k = 0;
    size_t esz = f == KVQ_W_F32 ? 4 : 2;
    const char *pf = (const char *)data + base * esz + KVQ_DENSE_PREFETCH_BYTES; /* a hint: never faults */
    for (; k + 16 <= cols; k += 16) {
        _mm_prefetch(pf + (size_t)k * esz, _MM_HINT_T1);
        __m256 w0 = load8(f, data, base + k), w1 = load8(f, data, base + k + 8);
        for (int t = 0; t < T; t++) {
            a[0][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)t * cols + k), a[0][t]);
            a[1][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (size_t)t * cols + k + 8), a[1][t]);
        }
    }
    if (k + 8 <= cols) {
        __m256 w0 = load8(f, data, base + k);
        for (int t = 0; t < T; t++) a[0][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)t * cols + k), a[0][t]);
        k += 8;
    }
    for (int t = 0; t < T; t++) {
        float s = hsum8(_mm256_add_ps(a[0][t], a[1][t]));
        for (int kk = k; kk < cols; kk++) s += load1(f, data, base + kk) * x[(size_t)t * cols + kk];
        out[t] = s;
    }
}

static inline __attribute__((always_inline)) void gemv_fmt(const kvq_cpu_weight *w, kvq_wformat f, const float *x,
                                                           int n, float *y, int r0, int r1) {
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int o = r0; o < r1; o++) {
        float out[KVQ_GEMV_MAX_T];
        switch (n) {
        case 1: row_dots(f, w->data, (size_t)o * cols, x, w->cols, out, 1); break;
        case 2: row_dots(f, w->data, (size_t)o * cols, x, w->cols, out, 2); break;
        case 3: row_dots(f, w->data, (size_t)o * cols, x, w->cols, out, 3); break;
        default: row_dots(f, w->data, (size_t)o * cols, x, w->cols, out, 4); break;
        }
        for (int t = 0; t < n; t++) y[t * rows + (size_t)o] = out[t];
    }
}

void kvq_dense_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    switch (w->fmt) {
    case KVQ_W_F32: gemv_fmt(w, KVQ_W_F32, x, n, y, r0, r1); break;
    case KVQ_W_F16: gemv_fmt(w, KVQ_W_F16, x, n, y, r0, r1); break;
    default: gemv_fmt(w, KVQ_W_BF16, x, n, y, r0, r1); break;
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
