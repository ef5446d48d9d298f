/* Int8 tiles (i8tile/i8tile.c) on AVX2 (no VNNI): the activations' blocks, and the ymm panel
 * (i8tile_ymm.h) with vpmaddubsw, whose int16 pair sums vpmaddwd widens to int32. Signed
 * activations, no offset. */
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

#define KVQ_I8T_YMM_CONSTS const __m256i ones = _mm256_set1_epi16(1);
#define KVQ_I8T_YMM_DOT(acc, u, s) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), ones))
#define KVQ_I8T_YMM_PANEL kvq_i8t_panel_avx2
#include "cpu/i8tile/i8tile_ymm.h"
