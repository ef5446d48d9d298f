/* Int8 tiles (i8tile/i8tile.c) on AVX2 (no VNNI): one 16-row vector (two ymm)
 * times 4 tokens at a time. maddubs multiplies unsigned by signed bytes and
 * saturates its pair sums at int16: the weights go in as |w| and each token's
 * bytes take w's sign (vpsignb), so every pair sum is at most 2 * 127 * 127
 * and exact; vpmaddwd widens to int32. Signed activations, no offset. */
#include <immintrin.h>
#include <string.h>

#include "cpu/i8tile/i8tile_kernels.h"

/* One block of n <= 256 values as int8 (kvq_i8t_qblock_scalar, bit for
 * bit: the same f32 products, rounded to nearest even by vcvtps2dq). */
float kvq_i8t_qblock_avx2(const float *v, int n, int8_t *q, int32_t *sum) {
    float buf[KVQ_I8T_KB];
    if (n < KVQ_I8T_KB) { /* a short last block: zeros past n */
        memcpy(buf, v, sizeof(float) * (size_t)n);
        memset(buf + n, 0, sizeof(float) * (size_t)(KVQ_I8T_KB - n));
        v = buf;
    }
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (int k = 0; k < KVQ_I8T_KB; k += 8) {
        __m256 x = _mm256_loadu_ps(v + k);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, _mm256_and_ps(x, absmask));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float m = _mm_cvtss_f32(m4);
    if (bad || !(m <= 3.0e38f)) {
        memset(q, 0, KVQ_I8T_KB);
        if (sum) *sum = 0;
        return __builtin_nanf("");
    }
    __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < KVQ_I8T_KB; k += 32) {
        __m256i qi[4];
        for (int j = 0; j < 4; j++) {
            __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(v + k + 8 * j), inv), lo), hi);
            qi[j] = _mm256_cvtps_epi32(r);
            s = _mm256_add_epi32(s, qi[j]);
        }
        /* packs work per 128-bit lane: a qword permute puts the values back in order */
        __m256i a = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xD8);
        __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(_mm256_packs_epi16(a, b), 0xD8));
    }
    if (sum) {
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        *sum = _mm_cvtsi128_si32(t);
    }
    return m / 127.0f;
}

#define TOK 4

static inline __attribute__((always_inline)) void tile(const int8_t *wp, const float *sw, int b0, int b1, int v,
                                                       const int8_t *xq, size_t kp, const float *sa, size_t nb,
                                                       float *yt, const int T) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = b0; b < b1; b++) {
        __m256i lo[TOK], hi[TOK];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_si256();
        const int8_t *wb = wp + ((size_t)b * KVQ_I8T_NV + (size_t)v) * KVQ_I8T_VBYTES;
        const int8_t *xb = xq + (size_t)b * KVQ_I8T_KB;
        for (int k4 = 0; k4 < KVQ_I8T_KB / 4; k4++) {
            __m256i w0 = _mm256_load_si256((const __m256i *)(wb + k4 * 64));
            __m256i w1 = _mm256_load_si256((const __m256i *)(wb + k4 * 64 + 32));
            __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                int32_t a4;
                memcpy(&a4, xb + (size_t)t * kp + k4 * 4, 4);
                __m256i a = _mm256_set1_epi32(a4);
                __m256i p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(a, w0));
                __m256i p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(a, w1));
                lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(p0, ones));
                hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(p1, ones));
            }
        }
        __m256 s0 = _mm256_loadu_ps(sw + b * KVQ_I8T_PR + v * 16), s1 = _mm256_loadu_ps(sw + b * KVQ_I8T_PR + v * 16 + 8);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float *y = yt + (size_t)t * KVQ_I8T_PR + v * 16;
            __m256 st = _mm256_set1_ps(sa[(size_t)t * nb + (size_t)b]);
            _mm256_storeu_ps(y, _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[t]), _mm256_mul_ps(s0, st), _mm256_loadu_ps(y)));
            _mm256_storeu_ps(y + 8,
                             _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[t]), _mm256_mul_ps(s1, st), _mm256_loadu_ps(y + 8)));
        }
    }
}

void kvq_i8t_panel_avx2(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt) {
    for (int t0 = 0; t0 < nt; t0 += TOK) {
        const int8_t *x = xq + (size_t)t0 * kp;
        const float *s = sa + (size_t)t0 * nb;
        float *y = yt + (size_t)t0 * KVQ_I8T_PR;
        for (int v = 0; v < KVQ_I8T_NV; v++) switch (nt - t0 < TOK ? nt - t0 : TOK) {
            case 4: tile(wp, sw, b0, b1, v, x, kp, s, nb, y, 4); break;
            case 3: tile(wp, sw, b0, b1, v, x, kp, s, nb, y, 3); break;
            case 2: tile(wp, sw, b0, b1, v, x, kp, s, nb, y, 2); break;
            default: tile(wp, sw, b0, b1, v, x, kp, s, nb, y, 1); break;
            }
    }
}
