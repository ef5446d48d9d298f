/* The body of the ymm int8 tile panels (i8tile_avx2.c, i8tile_avxvnni.c): one 16-row vector (two
 * ymm) times 4 tokens at a time. The weights go in as |w| and each token's bytes take w's sign
 * (vpsignb), so every product is unsigned times signed as both instructions want, each pair sum
 * at most 2 * 127 * 127 (maddubs does not saturate) and the int32 sums exact either way. The
 * includer defines KVQ_I8T_YMM_DOT(acc, u, s) (acc + the sums of 4 products of u8 u and s8 s:
 * vpmaddubsw + vpmaddwd + vpaddd, or AVX-VNNI's vpdpbusd), KVQ_I8T_YMM_CONSTS (what the DOT
 * needs, declared once per call) and KVQ_I8T_YMM_PANEL (the name). */
#include <immintrin.h>
#include <string.h>

#include "cpu/i8tile/i8tile_kernels.h"

#define TOK 4

static inline __attribute__((always_inline)) void tile(const int8_t *wp, const float *sw, int b0, int b1, int v,
                                                       const int8_t *xq, size_t kp, const float *sa, size_t nb,
                                                       float *yt, const int T) {
    KVQ_I8T_YMM_CONSTS
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
                lo[t] = KVQ_I8T_YMM_DOT(lo[t], u0, _mm256_sign_epi8(a, w0));
                hi[t] = KVQ_I8T_YMM_DOT(hi[t], u1, _mm256_sign_epi8(a, w1));
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

void KVQ_I8T_YMM_PANEL(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
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
