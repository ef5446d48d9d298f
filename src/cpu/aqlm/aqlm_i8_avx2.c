/* 1x16 AQLM with int8 codewords on AVX2 (scheme and error bound:
 * aqlm/aqlm_i8.c). One step is one 32-value activation block: the codewords
 * of 4 groups of 8 (2 of 16) by plain loads (AMD's gathers are microcoded,
 * and this also serves AVX-512 CPUs without VNNI), then vpmaddubsw on
 * |x| and the codeword with x's sign: each int16 pair sum is at most
 * 2 * 127 * 127, so nothing saturates, and vpmaddwd makes int32 lanes of 4. */
#include <immintrin.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

static inline long long ld64(const int8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    return v;
}

static inline __attribute__((always_inline)) void rows_avx2(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y,
                                                            size_t ldy, int r0, int r1, const int IG, const int T) {
    const int G = w->G, per = 32 / IG, blocks = (G * IG + 31) / 32, P = a->cols_pad;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *cb = w->cbq;
    const float *cls = w->cbq_cls;
    const int sh = w->cbq_shift;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        __m256 acc[KVQ_GEMV_MAX_T];
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        for (int b = 0; b < blocks; b++) {
            unsigned k[4];
            if ((b + 1) * per <= G) {
                for (int i = 0; i < per; i++) k[i] = c[b * per + i];
            } else {
                for (int i = 0; i < per; i++) k[i] = b * per + i < G ? c[b * per + i] : 0; /* past the row: x is 0 there */
            }
            __m256i cw;
            __m256 sc;
            if (IG == 8) {
                cw = _mm256_set_epi64x(ld64(cb + 8 * k[3]), ld64(cb + 8 * k[2]), ld64(cb + 8 * k[1]), ld64(cb + 8 * k[0]));
                float s0 = cls[k[0] >> sh], s1 = cls[k[1] >> sh], s2 = cls[k[2] >> sh], s3 = cls[k[3] >> sh];
                sc = _mm256_set_ps(s3, s3, s2, s2, s1, s1, s0, s0);
            } else {
                cw = _mm256_loadu2_m128i((const __m128i *)(cb + 16 * (size_t)k[1]), (const __m128i *)(cb + 16 * (size_t)k[0]));
                sc = _mm256_set_m128(_mm_set1_ps(cls[k[1] >> sh]), _mm_set1_ps(cls[k[0] >> sh]));
            }
            for (int t = 0; t < T; t++) {
                const size_t tp = (size_t)t * P;
                __m256i xq = _mm256_load_si256((const __m256i *)(a->q + tp + 32 * (size_t)b));
                __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(xq), _mm256_sign_epi8(cw, xq));
                __m256i dot = _mm256_madd_epi16(p, ones);
                __m256 s = _mm256_mul_ps(sc, _mm256_set1_ps(a->d[tp / 32 + (size_t)b]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[t]);
            }
        }
        for (int t = 0; t < T; t++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y[(size_t)t * ldy + o] = w->scales[o] * _mm_cvtss_f32(s);
        }
    }
}

void kvq_aqlm_i8_gemv_avx2(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1) {
#define I8_CASES(IG)                                                                                                   \
    switch (n) {                                                                                                       \
    case 1: rows_avx2(w, a, y, ldy, r0, r1, IG, 1); break;                                                            \
    case 2: rows_avx2(w, a, y, ldy, r0, r1, IG, 2); break;                                                            \
    case 3: rows_avx2(w, a, y, ldy, r0, r1, IG, 3); break;                                                            \
    default: rows_avx2(w, a, y, ldy, r0, r1, IG, 4); break;                                                           \
    }
    if (w->ig == 8)
        I8_CASES(8)
    else
        I8_CASES(16)
#undef I8_CASES
}
