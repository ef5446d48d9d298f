/* The body of the ymm int8-codeword kernels (aqlm_i8_avx2.c, aqlm_i8_avxvnni.c): 16 values at a
 * time, two codewords of 8 (one of 16) by plain loads, widened to int16 and multiplied by 2^e of
 * their class once for all tokens; each token then adds its int16 activations' products into 8
 * int32 lanes, 32 products per lane over a block of 256 values (within the scheme's bound in
 * aqlm_i8.c), converted and scaled once per block. The includer defines KVQ_I8_YMM_DOT(acc, w,
 * x) (acc + the pair sums of w*x: vpmaddwd + vpaddd, or AVX-VNNI's vpdpwssd, the same exact
 * int32), KVQ_I8_YMM_ROWS and KVQ_I8_YMM_GEMV (the names). */
#include <immintrin.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

static inline long long ld64(const int8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    return v;
}

/* Values 16j..16j+15 of row codes c as int16, each codeword times 2^e of its class. */
static inline __attribute__((always_inline)) __m256i i8_w16(const uint16_t *c, const int8_t *cb, const int16_t *ex,
                                                            int sh, int G, int j, const int IG) {
    if (IG == 8) {
        unsigned k0 = c[2 * j], k1 = 2 * j + 1 < G ? c[2 * j + 1] : 0; /* past the row: x is 0 there */
        __m128i b = _mm_set_epi64x(ld64(cb + 8 * (size_t)k1), ld64(cb + 8 * (size_t)k0));
        __m256i m = _mm256_set_m128i(_mm_set1_epi16((short)(1 << ex[k1 >> sh])), _mm_set1_epi16((short)(1 << ex[k0 >> sh])));
        return _mm256_mullo_epi16(_mm256_cvtepi8_epi16(b), m);
    }
    unsigned k = c[j];
    __m128i b = _mm_loadu_si128((const __m128i *)(cb + 16 * (size_t)k));
    return _mm256_mullo_epi16(_mm256_cvtepi8_epi16(b), _mm256_set1_epi16((short)(1 << ex[k >> sh])));
}

static inline __attribute__((always_inline)) void KVQ_I8_YMM_ROWS(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y,
                                                            size_t ldy, int r0, int r1, const int IG, const int T) {
    const int G = w->G, chunks = (G * IG + 15) / 16, P = a->cols_pad, nb = P / 32;
    const int8_t *cb = w->cbq;
    const int sh = w->cbq_shift;
    int16_t ex[KVQ_I8_CLASSES];
    float base;
    kvq_i8_exponents(w, ex, &base);
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        __m256 acc[KVQ_GEMV_MAX_T];
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        for (int j0 = 0; j0 < chunks; j0 += KVQ_I8_ABLK / 16) {
            const int j1 = j0 + KVQ_I8_ABLK / 16 < chunks ? j0 + KVQ_I8_ABLK / 16 : chunks;
            /* two sums per token, even and odd j: AVX-VNNI's vpdpwssd is a 5-cycle chain on its
             * accumulator (vpaddd's is 1). Exact int32 sums, so any split gives the same bits. */
            __m256i s[KVQ_GEMV_MAX_T], s2[KVQ_GEMV_MAX_T];
            for (int t = 0; t < T; t++) s[t] = s2[t] = _mm256_setzero_si256();
            int j = j0;
            for (; j + 1 < j1; j += 2) {
                __m256i wa = i8_w16(c, cb, ex, sh, G, j, IG), wb = i8_w16(c, cb, ex, sh, G, j + 1, IG);
                for (int t = 0; t < T; t++) {
                    const int16_t *xt = a->q16 + (size_t)t * P + 16 * (size_t)j;
                    s[t] = KVQ_I8_YMM_DOT(s[t], wa, _mm256_load_si256((const __m256i *)xt));
                    s2[t] = KVQ_I8_YMM_DOT(s2[t], wb, _mm256_load_si256((const __m256i *)(xt + 16)));
                }
            }
            if (j < j1) {
                __m256i wa = i8_w16(c, cb, ex, sh, G, j, IG);
                for (int t = 0; t < T; t++)
                    s[t] = KVQ_I8_YMM_DOT(s[t], wa, _mm256_load_si256((const __m256i *)(a->q16 + (size_t)t * P + 16 * (size_t)j)));
            }
            for (int t = 0; t < T; t++) s[t] = _mm256_add_epi32(s[t], s2[t]);
            for (int t = 0; t < T; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_set1_ps(a->d[(size_t)t * nb + (size_t)j0 / 2]),
                                         acc[t]);
        }
        for (int t = 0; t < T; t++) {
            __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
            v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            v = _mm_add_ss(v, _mm_movehdup_ps(v));
            y[(size_t)t * ldy + o] = w->scales[o] * (base * _mm_cvtss_f32(v));
        }
    }
}

void KVQ_I8_YMM_GEMV(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1) {
#define I8_CASES(IG)                                                                                                   \
    switch (n) {                                                                                                       \
    case 1: KVQ_I8_YMM_ROWS(w, a, y, ldy, r0, r1, IG, 1); break;                                                            \
    case 2: KVQ_I8_YMM_ROWS(w, a, y, ldy, r0, r1, IG, 2); break;                                                            \
    case 3: KVQ_I8_YMM_ROWS(w, a, y, ldy, r0, r1, IG, 3); break;                                                            \
    default: KVQ_I8_YMM_ROWS(w, a, y, ldy, r0, r1, IG, 4); break;                                                           \
    }
    if (w->ig == 8)
        I8_CASES(8)
    else
        I8_CASES(16)
#undef I8_CASES
}
