/* Int8 tiles (i8tile/i8tile.c) on AVX-512 VNNI: 4 vectors of 16 rows times 6
 * tokens in 24 int32 accumulators; per 4 columns, 4 weight loads, 6 broadcasts
 * of a token's 4 bytes and 24 vpdpbusd (64 multiply-adds each). vpdpbusd
 * multiplies unsigned by signed bytes: activations come as q ^ 0x80 = q + 128,
 * and each block's sums lose 128 * wsum (exact in int32). */
#include <immintrin.h>
#include <string.h>

#include "cpu/i8tile/i8tile_kernels.h"

/* One block of n <= 256 values as int8 (kvq_i8t_qblock_scalar, bit for
 * bit: the same f32 products, rounded to nearest even by vcvtps2dq). */
float kvq_i8t_qblock_avx512(const float *v, int n, int8_t *q, int32_t *sum) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = n - k >= 16 ? 0xffff : (__mmask16)((1u << (n - k)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(m, v + k);
        bad |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(x));
    }
    float m = _mm512_reduce_max_ps(mx);
    if (bad || !(m <= 3.0e38f)) {
        memset(q, 0, KVQ_I8T_KB);
        if (sum) *sum = 0;
        return __builtin_nanf("");
    }
    __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < KVQ_I8T_KB; k += 16) {
        __mmask16 mk = k >= n ? 0 : n - k >= 16 ? 0xffff : (__mmask16)((1u << (n - k)) - 1u);
        __m512 r = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, v + k), inv), lo), hi);
        __m512i qi = _mm512_cvtps_epi32(r);
        s = _mm512_add_epi32(s, qi);
        _mm_storeu_si128((__m128i *)(q + k), _mm512_cvtsepi32_epi8(qi));
    }
    if (sum) *sum = _mm512_reduce_add_epi32(s);
    return m / 127.0f;
}

#define TOK 6

/* acc += a (unsigned) . w (signed), in place: with the intrinsic GCC 12 copied
 * every accumulator between registers around each vpdpbusd (half the time). */
#define DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))

static inline __attribute__((always_inline, target("avx512vnni"))) void
tile(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq, size_t kp,
     const float *sa, size_t nb, float *yt, const int T) {
    for (int b = b0; b < b1; b++) {
        __m512i acc[KVQ_I8T_NV][TOK];
#pragma GCC unroll 4
        for (int v = 0; v < KVQ_I8T_NV; v++)
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) acc[v][t] = _mm512_setzero_si512();
        const int8_t *wb = wp + (size_t)b * KVQ_I8T_NV * KVQ_I8T_VBYTES;
        const int8_t *xb = xq + (size_t)b * KVQ_I8T_KB;
        for (int k4 = 0; k4 < KVQ_I8T_KB / 4; k4++) {
            __m512i wv[KVQ_I8T_NV];
#pragma GCC unroll 4
            for (int v = 0; v < KVQ_I8T_NV; v++) wv[v] = _mm512_load_si512(wb + (size_t)v * KVQ_I8T_VBYTES + k4 * 64);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                int32_t a4;
                memcpy(&a4, xb + (size_t)t * kp + k4 * 4, 4);
                __m512i a = _mm512_set1_epi32(a4);
#pragma GCC unroll 4
                for (int v = 0; v < KVQ_I8T_NV; v++) DPBUSD(acc[v][t], a, wv[v]);
            }
        }
#pragma GCC unroll 4
        for (int v = 0; v < KVQ_I8T_NV; v++) {
            __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(wsum + b * KVQ_I8T_PR + v * 16), 7);
            __m512 s = _mm512_loadu_ps(sw + b * KVQ_I8T_PR + v * 16);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                float *y = yt + (size_t)t * KVQ_I8T_PR + v * 16;
                __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[v][t], corr));
                __m512 st = _mm512_mul_ps(s, _mm512_set1_ps(sa[(size_t)t * nb + (size_t)b]));
                _mm512_storeu_ps(y, _mm512_fmadd_ps(dot, st, _mm512_loadu_ps(y)));
            }
        }
    }
}

__attribute__((target("avx512vnni"))) void kvq_i8t_panel_vnni(const int8_t *wp, const float *sw, const int32_t *wsum,
                                                              int b0, int b1, const int8_t *xq, size_t kp,
                                                              const float *sa, size_t nb, int nt, float *yt) {
    int t0 = 0;
    for (; t0 + TOK <= nt; t0 += TOK)
        tile(wp, sw, wsum, b0, b1, xq + (size_t)t0 * kp, kp, sa + (size_t)t0 * nb, nb, yt + (size_t)t0 * KVQ_I8T_PR, TOK);
    const int8_t *x = xq + (size_t)t0 * kp;
    const float *s = sa + (size_t)t0 * nb;
    float *y = yt + (size_t)t0 * KVQ_I8T_PR;
    switch (nt - t0) {
    case 5: tile(wp, sw, wsum, b0, b1, x, kp, s, nb, y, 5); break;
    case 4: tile(wp, sw, wsum, b0, b1, x, kp, s, nb, y, 4); break;
    case 3: tile(wp, sw, wsum, b0, b1, x, kp, s, nb, y, 3); break;
    case 2: tile(wp, sw, wsum, b0, b1, x, kp, s, nb, y, 2); break;
    case 1: tile(wp, sw, wsum, b0, b1, x, kp, s, nb, y, 1); break;
    default: break;
    }
}
