/* AVX-512 dense kernels: GEMV from F32/F16/BF16 rows and the f32 tile x
 * tokens product. Row tails use masked loads, so there is no scalar epilogue. */
#include <immintrin.h>

#include "cpu/dense/dense_kernels.h"

/* Up to 16 values of a dense row at element i (lanes past `mask` read as 0). */
static inline __m512 load16(kvq_wformat f, const void *p, size_t i, __mmask16 mask) {
    if (f == KVQ_W_F32) return _mm512_maskz_loadu_ps(mask, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + i);
    if (f == KVQ_W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: high half of f32 */
}


static inline __mmask16 tail_mask(int left) { return (__mmask16)((1u << left) - 1u); }

/* One row against T tokens (see dense/dense_avx2.c): two accumulator sets,
 * masked tail, format and T fixed at compile time. */
static inline __attribute__((always_inline)) void row_dots(kvq_wformat f, const void *data, size_t base,
                                                           const float *x, int cols, float *out, const int T) {
    const __mmask16 all = 0xffff;
    __m512 a[2][KVQ_GEMV_MAX_T];
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm512_setzero_ps();
    int k = 0;
    size_t esz = f == KVQ_W_F32 ? 4 : 2;
    const char *pf = (const char *)data + base * esz + KVQ_DENSE_PREFETCH_BYTES; /* a hint: never faults */
    for (; k + 32 <= cols; k += 32) {
        _mm_prefetch(pf + (size_t)k * esz, _MM_HINT_T1);
        if (esz == 4) _mm_prefetch(pf + (size_t)k * esz + 64, _MM_HINT_T1);
        __m512 w0 = load16(f, data, base + k, all), w1 = load16(f, data, base + k + 16, all);
        for (int t = 0; t < T; t++) {
            a[0][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)t * cols + k), a[0][t]);
            a[1][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)t * cols + k + 16), a[1][t]);
        }
    }
    for (; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? all : tail_mask(cols - k);
        __m512 w0 = load16(f, data, base + k, m);
        for (int t = 0; t < T; t++) a[0][t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + (size_t)t * cols + k), a[0][t]);
    }
    for (int t = 0; t < T; t++) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a[0][t], a[1][t]));
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

void kvq_dense_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    switch (w->fmt) {
    case KVQ_W_F32: gemv_fmt(w, KVQ_W_F32, x, n, y, r0, r1); break;
    case KVQ_W_F16: gemv_fmt(w, KVQ_W_F16, x, n, y, r0, r1); break;
    default: gemv_fmt(w, KVQ_W_BF16, x, n, y, r0, r1); break;
    }
}

/* RB rows x TB tokens register block (up to 4 x 4 = 16 accumulators). */
static inline __attribute__((always_inline)) void block(const float *W, size_t ldw, const float *x, int cols,
                                                        float *y, size_t ldy, const int RB, const int TB) {
    __m512 acc[4][4];
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < TB; t++) acc[r][t] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? (__mmask16)0xffff : tail_mask(cols - k);
        __m512 xv[4];
        for (int t = 0; t < TB; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + (size_t)t * cols + k);
        for (int r = 0; r < RB; r++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, W + (size_t)r * ldw + k);
            for (int t = 0; t < TB; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int t = 0; t < TB; t++) y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

void kvq_gemm_avx512(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy) {
    int i = 0;
    for (; i + 4 <= nr; i += 4) {
        const float *Wi = W + (size_t)i * ldw;
        int t = 0;
        for (; t + 4 <= n; t += 4) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 4, 4);
        for (; t < n; t++) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 4, 1);
    }
    for (; i < nr; i++) {
        const float *Wi = W + (size_t)i * ldw;
        int t = 0;
        for (; t + 4 <= n; t += 4) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 1, 4);
        for (; t < n; t++) block(Wi, ldw, x + (size_t)t * cols, cols, y + (size_t)t * ldy + i, ldy, 1, 1);
    }
}
