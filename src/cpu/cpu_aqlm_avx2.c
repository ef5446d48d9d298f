/* AVX2/FMA AQLM kernels (layouts and the math: cpu_aqlm.c). The LUT path
 * gathers 8 rows' table entries per vpgatherdd; the codeword path loads one
 * 8-float codeword per group and FMAs it with x. */
#include <immintrin.h>

#include "cpu/cpu_matmul_impl.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void kvq_aqlm_lut_build_avx2(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    for (int g = g0; g < g1; g++) {
        __m256 xb[16];
        for (int j = 0; j < ig; j++) xb[j] = _mm256_broadcast_ss(x + (size_t)g * ig + j);
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * ig * 256; /* [ig][256]: entry c of coordinate j */
            float *l = lut + ((size_t)g * M + m) * 256;
            for (int c = 0; c < 256; c += 8) {
                __m256 a0 = _mm256_mul_ps(_mm256_load_ps(ct + c), xb[0]);
                __m256 a1 = _mm256_mul_ps(_mm256_load_ps(ct + 256 + c), xb[1]);
                for (int j = 2; j < ig; j += 2) {
                    a0 = _mm256_fmadd_ps(_mm256_load_ps(ct + (size_t)j * 256 + c), xb[j], a0);
                    a1 = _mm256_fmadd_ps(_mm256_load_ps(ct + (size_t)(j + 1) * 256 + c), xb[j + 1], a1);
                }
                _mm256_store_ps(l + c, _mm256_add_ps(a0, a1));
            }
        }
    }
}

/* Scaled block results into y, minding the rows past the end of the last block. */
static inline void store_block(const kvq_cpu_weight *w, int b, __m256 lo, __m256 hi, float *y) {
    int o = b * KVQ_AQLM_RB;
    lo = _mm256_mul_ps(lo, _mm256_load_ps(w->scales + o));
    hi = _mm256_mul_ps(hi, _mm256_load_ps(w->scales + o + 8));
    if (o + KVQ_AQLM_RB <= w->rows) {
        _mm256_storeu_ps(y + o, lo);
        _mm256_storeu_ps(y + o + 8, hi);
        return;
    }
    float tmp[KVQ_AQLM_RB];
    _mm256_storeu_ps(tmp, lo);
    _mm256_storeu_ps(tmp + 8, hi);
    for (int r = 0; o + r < w->rows; r++) y[o + r] = tmp[r];
}

void kvq_aqlm_lut_gemv_avx2(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1) {
    size_t steps = (size_t)w->G * w->M;
    for (int b = b0; b < b1; b++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)b * steps * KVQ_AQLM_RB;
        __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
        const float *l = lut;
        size_t s = 0;
        /* Table (g, m) is lut + (g*M + m)*256, i.e. step s uses lut + s*256. */
        for (; s + 2 <= steps; s += 2, c += 2 * KVQ_AQLM_RB, l += 512) {
            __m128i c01 = _mm_load_si128((const __m128i *)c), c23 = _mm_load_si128((const __m128i *)(c + 16));
            lo0 = _mm256_add_ps(lo0, _mm256_i32gather_ps(l, _mm256_cvtepu8_epi32(c01), 4));
            hi0 = _mm256_add_ps(hi0, _mm256_i32gather_ps(l, _mm256_cvtepu8_epi32(_mm_srli_si128(c01, 8)), 4));
            lo1 = _mm256_add_ps(lo1, _mm256_i32gather_ps(l + 256, _mm256_cvtepu8_epi32(c23), 4));
            hi1 = _mm256_add_ps(hi1, _mm256_i32gather_ps(l + 256, _mm256_cvtepu8_epi32(_mm_srli_si128(c23, 8)), 4));
        }
        if (s < steps) {
            __m128i c01 = _mm_load_si128((const __m128i *)c);
            lo0 = _mm256_add_ps(lo0, _mm256_i32gather_ps(l, _mm256_cvtepu8_epi32(c01), 4));
            hi0 = _mm256_add_ps(hi0, _mm256_i32gather_ps(l, _mm256_cvtepu8_epi32(_mm_srli_si128(c01, 8)), 4));
        }
        store_block(w, b, _mm256_add_ps(lo0, lo1), _mm256_add_ps(hi0, hi1), y);
    }
}

/* One row, 8-value groups: codeword (sum over the M codebooks) times x. */
static inline float row_ig8(const kvq_cpu_weight *w, const uint16_t *c, const float *x) {
    const float *cb = w->cb;
    size_t K8 = ((size_t)1 << w->nbits) * 8;
    int G = w->G, M = w->M, g = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (M == 1) {
        for (; g + 4 <= G; g += 4) {
            a0 = _mm256_fmadd_ps(_mm256_load_ps(cb + (size_t)c[g] * 8), _mm256_loadu_ps(x + g * 8), a0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(cb + (size_t)c[g + 1] * 8), _mm256_loadu_ps(x + g * 8 + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_load_ps(cb + (size_t)c[g + 2] * 8), _mm256_loadu_ps(x + g * 8 + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_load_ps(cb + (size_t)c[g + 3] * 8), _mm256_loadu_ps(x + g * 8 + 24), a3);
        }
    }
    for (; g < G; g++) {
        __m256 v = _mm256_load_ps(cb + (size_t)c[(size_t)g * M] * 8);
        for (int m = 1; m < M; m++) v = _mm256_add_ps(v, _mm256_load_ps(cb + m * K8 + (size_t)c[(size_t)g * M + m] * 8));
        a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + g * 8), a0);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* One row, 16-value groups: two 8-float halves per codeword. */
static inline float row_ig16(const kvq_cpu_weight *w, const uint16_t *c, const float *x) {
    const float *cb = w->cb;
    size_t K16 = ((size_t)1 << w->nbits) * 16;
    int G = w->G, M = w->M;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int g = 0; g < G; g++) {
        const float *p = cb + (size_t)c[(size_t)g * M] * 16;
        __m256 v0 = _mm256_load_ps(p), v1 = _mm256_load_ps(p + 8);
        for (int m = 1; m < M; m++) {
            p = cb + m * K16 + (size_t)c[(size_t)g * M + m] * 16;
            v0 = _mm256_add_ps(v0, _mm256_load_ps(p));
            v1 = _mm256_add_ps(v1, _mm256_load_ps(p + 8));
        }
        a0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(x + g * 16), a0);
        a1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x + g * 16 + 8), a1);
    }
    return hsum8(_mm256_add_ps(a0, a1));
}

void kvq_aqlm_gather_gemv_avx2(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1) {
    size_t per_row = (size_t)w->G * w->M;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * per_row;
        y[o] = w->scales[o] * (w->ig == 8 ? row_ig8(w, c, x) : row_ig16(w, c, x));
    }
}

void kvq_aqlm_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    size_t K = (size_t)1 << w->nbits, ig = (size_t)w->ig;
    for (int o = r0; o < r1; o++) {
        float *dst = out + (size_t)(o - r0) * w->cols;
        __m256 s = _mm256_set1_ps(w->scales[o]);
        for (size_t g = 0; g < (size_t)w->G; g++) {
            for (size_t h = 0; h < ig; h += 8) {
                __m256 v = _mm256_setzero_ps();
                for (int m = 0; m < w->M; m++)
                    v = _mm256_add_ps(v, _mm256_load_ps(w->cb + ((size_t)m * K + kvq_cw_code(w, (size_t)o, g, (size_t)m)) * ig + h));
                _mm256_storeu_ps(dst + g * ig + h, _mm256_mul_ps(s, v));
            }
        }
    }
}
