/* 1x16 AQLM with int8 codewords on AVX-512 VNNI (scheme and error bound:
 * cpu_aqlm_i8.c). One step is 64 values of a row: the codewords of 8 groups
 * of 8 (or 4 of 16) come in with one vpgatherqq from the 512 KiB int8
 * codebook (it stays in L2, where the fp16 one did not), their scales with
 * one vgatherqps, and one vpdpbusd dots them with 64 activation bytes.
 * vpdpbusd multiplies unsigned by signed bytes: the codewords go in as
 * q ^ 0x80 = q + 128 and the sums start from -128 * (the activations' sums),
 * which the quantizer left in corr, so each int32 lane is exact. */
#include <immintrin.h>

#include "cpu/cpu_matmul_impl.h"

#define VNNI __attribute__((target("avx512vnni"), always_inline)) inline

/* qword code vector of step u: lane j = the code of the group holding values
 * 64u + 8j .. +7 (codes past the row's end are 0: their activations are 0). */
static VNNI __m512i step_codes(const uint16_t *c, int u, int G, const int IG) {
    const int per = 64 / IG; /* codes per step */
    int left = G - u * per;
    if (IG == 8) {
        __m128i v = left >= 8 ? _mm_loadu_si128((const __m128i *)(c + 8 * u))
                              : _mm_maskz_loadu_epi16((__mmask8)((1u << left) - 1u), c + 8 * u);
        return _mm512_cvtepu16_epi64(v);
    }
    __m128i v = _mm_maskz_loadu_epi16((__mmask8)(left >= 4 ? 0xf : (1u << left) - 1u), c + 4 * u);
    return _mm512_permutexvar_epi64(_mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0), _mm512_cvtepu16_epi64(v));
}

static VNNI void rows_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y, size_t ldy, int r0, int r1,
                           const int IG, const int T) {
    const int G = w->G, steps = (G * IG + 63) / 64, P = a->cols_pad;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i sub = IG == 8 ? _mm512_setzero_si512() : _mm512_set_epi64(1, 0, 1, 0, 1, 0, 1, 0);
    const __m512i dup2 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const long long *cb = (const long long *)(const void *)w->cbq;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        kvq_cb_prefetch_slice(w, o - r0);
        __m512 acc[KVQ_GEMV_MAX_T][2];
        for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
        for (int u = 0; u < steps; u++) {
            __m512i cq = step_codes(c, u, G, IG);
            __m512i gi = IG == 8 ? cq : _mm512_add_epi64(_mm512_slli_epi64(cq, 1), sub);
            __m512i cw = _mm512_xor_si512(_mm512_i64gather_epi64(gi, cb, 8), flip);
            __m512 sc = _mm512_permutexvar_ps(dup2, _mm512_castps256_ps512(_mm512_i64gather_ps(cq, w->cbq_scale, 4)));
            for (int t = 0; t < T; t++) {
                const size_t tp = (size_t)t * P;
                __m512i xq = _mm512_load_si512(a->q + tp + 64 * (size_t)u);
                __m512i dot = _mm512_dpbusd_epi32(_mm512_load_si512(a->corr + tp / 4 + 16 * (size_t)u), cw, xq);
                __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(a->d + tp / 32 + 2 * (size_t)u)));
                __m512 dd = _mm512_permutexvar_ps(half, _mm512_castps128_ps512(d2));
                acc[t][u & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc, dd), acc[t][u & 1]);
            }
        }
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + o] = w->scales[o] * _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
    }
}

__attribute__((target("avx512vnni"))) void kvq_aqlm_i8_gemv_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, int n,
                                                                   float *y, size_t ldy, int r0, int r1) {
#define I8_CASES(IG)                                                                                                   \
    switch (n) {                                                                                                       \
    case 1: rows_vnni(w, a, y, ldy, r0, r1, IG, 1); break;                                                            \
    case 2: rows_vnni(w, a, y, ldy, r0, r1, IG, 2); break;                                                            \
    case 3: rows_vnni(w, a, y, ldy, r0, r1, IG, 3); break;                                                            \
    default: rows_vnni(w, a, y, ldy, r0, r1, IG, 4); break;                                                           \
    }
    if (w->ig == 8)
        I8_CASES(8)
    else
        I8_CASES(16)
#undef I8_CASES
}
