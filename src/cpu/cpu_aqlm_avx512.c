/* AVX-512 AQLM kernels (layouts and the math: cpu_aqlm.c). A 16-row block's
 * codes for one (group, codebook) are one 16-byte load and one 16-lane gather
 * from that group's table; 8-value codewords are paired into one zmm. */
#include <immintrin.h>

#include "cpu/cpu_matmul_impl.h"

void kvq_aqlm_lut_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    for (int g = g0; g < g1; g++) {
        __m512 xb[16];
        for (int j = 0; j < ig; j++) xb[j] = _mm512_set1_ps(x[(size_t)g * ig + j]);
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * ig * 256; /* [ig][256] */
            float *l = lut + ((size_t)g * M + m) * 256;
            for (int c = 0; c < 256; c += 16) {
                __m512 a0 = _mm512_mul_ps(_mm512_load_ps(ct + c), xb[0]);
                __m512 a1 = _mm512_mul_ps(_mm512_load_ps(ct + 256 + c), xb[1]);
                for (int j = 2; j < ig; j += 2) {
                    a0 = _mm512_fmadd_ps(_mm512_load_ps(ct + (size_t)j * 256 + c), xb[j], a0);
                    a1 = _mm512_fmadd_ps(_mm512_load_ps(ct + (size_t)(j + 1) * 256 + c), xb[j + 1], a1);
                }
                _mm512_store_ps(l + c, _mm512_add_ps(a0, a1));
            }
        }
    }
}

void kvq_aqlm_lut_gemv_avx512(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1) {
    size_t steps = (size_t)w->G * w->M;
    for (int b = b0; b < b1; b++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)b * steps * KVQ_AQLM_RB;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *l = lut; /* step s = g*M + m reads table lut + s*256 */
        size_t s = 0;
        for (; s + 4 <= steps; s += 4, c += 4 * KVQ_AQLM_RB, l += 4 * 256) {
            a0 = _mm512_add_ps(a0, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)c)), l, 4));
            a1 = _mm512_add_ps(a1, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c + 16))), l + 256, 4));
            a2 = _mm512_add_ps(a2, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c + 32))), l + 512, 4));
            a3 = _mm512_add_ps(a3, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c + 48))), l + 768, 4));
        }
        for (; s < steps; s++, c += KVQ_AQLM_RB, l += 256)
            a0 = _mm512_add_ps(a0, _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)c)), l, 4));
        int o = b * KVQ_AQLM_RB, left = w->rows - o;
        __m512 v = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), _mm512_load_ps(w->scales + o));
        _mm512_mask_storeu_ps(y + o, left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u), v);
    }
}

/* Two 8-float codewords side by side in one zmm. */
static inline __m512 pair(const float *a, const float *b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(a)), _mm256_load_ps(b), 1);
}

/* One row, 8-value groups, groups paired per zmm. */
static inline float row_ig8(const kvq_cpu_weight *w, const uint16_t *c, const float *x) {
    const float *cb = w->cb;
    size_t K8 = ((size_t)1 << w->nbits) * 8;
    int G = w->G, M = w->M, g = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (M == 1) {
        for (; g + 8 <= G; g += 8) {
            a0 = _mm512_fmadd_ps(pair(cb + (size_t)c[g] * 8, cb + (size_t)c[g + 1] * 8), _mm512_loadu_ps(x + g * 8), a0);
            a1 = _mm512_fmadd_ps(pair(cb + (size_t)c[g + 2] * 8, cb + (size_t)c[g + 3] * 8), _mm512_loadu_ps(x + g * 8 + 16), a1);
            a2 = _mm512_fmadd_ps(pair(cb + (size_t)c[g + 4] * 8, cb + (size_t)c[g + 5] * 8), _mm512_loadu_ps(x + g * 8 + 32), a2);
            a3 = _mm512_fmadd_ps(pair(cb + (size_t)c[g + 6] * 8, cb + (size_t)c[g + 7] * 8), _mm512_loadu_ps(x + g * 8 + 48), a3);
        }
    } else {
        for (; g + 2 <= G; g += 2) {
            const uint16_t *c0 = c + (size_t)g * M, *c1 = c0 + M;
            __m512 v = pair(cb + (size_t)c0[0] * 8, cb + (size_t)c1[0] * 8);
            for (int m = 1; m < M; m++) v = _mm512_add_ps(v, pair(cb + m * K8 + (size_t)c0[m] * 8, cb + m * K8 + (size_t)c1[m] * 8));
            a0 = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + g * 8), a0);
        }
    }
    __m256 t = _mm256_setzero_ps();
    for (; g < G; g++) { /* odd tail groups, one 8-float codeword at a time */
        __m256 v = _mm256_setzero_ps();
        for (int m = 0; m < M; m++) v = _mm256_add_ps(v, _mm256_load_ps(cb + m * K8 + (size_t)c[(size_t)g * M + m] * 8));
        t = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + g * 8), t);
    }
    a0 = _mm512_add_ps(a0, _mm512_insertf32x8(_mm512_setzero_ps(), t, 0));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* One row, 16-value groups: a codeword is exactly one zmm. */
static inline float row_ig16(const kvq_cpu_weight *w, const uint16_t *c, const float *x) {
    const float *cb = w->cb;
    size_t K16 = ((size_t)1 << w->nbits) * 16;
    int G = w->G, M = w->M, g = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    if (M == 1)
        for (; g + 2 <= G; g += 2) {
            a0 = _mm512_fmadd_ps(_mm512_load_ps(cb + (size_t)c[g] * 16), _mm512_loadu_ps(x + g * 16), a0);
            a1 = _mm512_fmadd_ps(_mm512_load_ps(cb + (size_t)c[g + 1] * 16), _mm512_loadu_ps(x + g * 16 + 16), a1);
        }
    for (; g < G; g++) {
        __m512 v = _mm512_load_ps(cb + (size_t)c[(size_t)g * M] * 16);
        for (int m = 1; m < M; m++) v = _mm512_add_ps(v, _mm512_load_ps(cb + m * K16 + (size_t)c[(size_t)g * M + m] * 16));
        a0 = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + g * 16), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

void kvq_aqlm_gather_gemv_avx512(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1) {
    size_t per_row = (size_t)w->G * w->M;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * per_row;
        y[o] = w->scales[o] * (w->ig == 8 ? row_ig8(w, c, x) : row_ig16(w, c, x));
    }
}
