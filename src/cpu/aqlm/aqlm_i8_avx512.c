/* 1x16 AQLM with int8 codewords on AVX-512 VNNI (scheme and error bound:
 * aqlm/aqlm_i8.c). One step is 64 values of a row: the codewords of 8 groups
 * of 8 (or 4 of 16) come in with one vpgatherqq from the 512 KiB int8
 * codebook (it stays in L2, where the fp16 one did not), their scales from
 * the code's class by register permutes, and one vpdpbusd dots them with 64
 * activation bytes.
 * vpdpbusd multiplies unsigned by signed bytes: the activations go in as
 * q + 128 (the quantizer's qu) and each token's sums start from -128 * (the
 * sum of each 4 codeword bytes), formed once per step for all tokens (one
 * more vpdpbusd), so each int32 lane is exact. Up to KVQ_I8_VNNI_MAX_T
 * tokens share one gather; a token's arithmetic is the same whatever their
 * number, so its outputs are the same bits in any batch. */
#include <immintrin.h>

#include "cpu/aqlm/aqlm_kernels.h"

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

/* Scales of the codewords cq (one per qword) in both int32 lanes of each:
 * the class, code >> shift, picks one of 64 entries held in t0..t3. */
static VNNI __m512 class_scales(__m512i cq, __m128i shift, __m512 t0, __m512 t1, __m512 t2, __m512 t3) {
    __m512i ci = _mm512_srl_epi32(_mm512_or_si512(cq, _mm512_slli_epi64(cq, 32)), shift);
    __m512 lo = _mm512_permutex2var_ps(t0, ci, t1), hi = _mm512_permutex2var_ps(t2, ci, t3);
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(ci, _mm512_set1_epi32(32)), lo, hi);
}

static VNNI void rows_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y, size_t ldy, int r0, int r1,
                           const int IG, const int T) {
    const int G = w->G, steps = (G * IG + 63) / 64, P = a->cols_pad;
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    const __m512i sub = IG == 8 ? _mm512_setzero_si512() : _mm512_set_epi64(1, 0, 1, 0, 1, 0, 1, 0);
    const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const long long *cb = (const long long *)(const void *)w->cbq;
    const __m128i shift = _mm_cvtsi32_si128(w->cbq_shift);
    const __m512 t0 = _mm512_loadu_ps(w->cbq_cls), t1 = _mm512_loadu_ps(w->cbq_cls + 16);
    const __m512 t2 = _mm512_loadu_ps(w->cbq_cls + 32), t3 = _mm512_loadu_ps(w->cbq_cls + 48);
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        /* two accumulator sets, even and odd steps, indexed by constants only
         * (acc[t][u & 1] went through the stack: a store-forward chain) */
        __m512 ae[KVQ_I8_VNNI_MAX_T], ao[KVQ_I8_VNNI_MAX_T];
        for (int t = 0; t < T; t++) ae[t] = ao[t] = _mm512_setzero_ps();
#define I8_STEP(U, ACC)                                                                                               \
    do {                                                                                                               \
        __m512i cq = step_codes(c, (U), G, IG);                                                                        \
        __m512i gi = IG == 8 ? cq : _mm512_add_epi64(_mm512_slli_epi64(cq, 1), sub);                                   \
        __m512i cw = _mm512_i64gather_epi64(gi, cb, 8);                                                               \
        __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(),                                                        \
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, cw));                        \
        __m512 sc = class_scales(cq, shift, t0, t1, t2, t3);                                                          \
        for (int t = 0; t < T; t++) {                                                                                  \
            const size_t tp = (size_t)t * P, uu = (size_t)(U);                                                         \
            __m512i xu = _mm512_load_si512(a->qu + tp + 64 * uu);                                                      \
            __m512i dot = _mm512_dpbusd_epi32(neg, xu, cw);                                                            \
            __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(a->d + tp / 32 + 2 * uu)));                 \
            __m512 dd = _mm512_permutexvar_ps(half, _mm512_castps128_ps512(d2));                                       \
            ACC[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc, dd), ACC[t]);                          \
        }                                                                                                              \
    } while (0)
        int u = 0;
        for (; u + 2 <= steps; u += 2) {
            I8_STEP(u, ae);
            I8_STEP(u + 1, ao);
        }
        if (u < steps) I8_STEP(u, ae);
#undef I8_STEP
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + o] = w->scales[o] * _mm512_reduce_add_ps(_mm512_add_ps(ae[t], ao[t]));
    }
}

__attribute__((target("avx512vnni"))) void kvq_aqlm_i8_gemv_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, int n,
                                                                   float *y, size_t ldy, int r0, int r1) {
#define I8_CASES(IG)                                                                                                   \
    switch (n) {                                                                                                       \
    case 1: rows_vnni(w, a, y, ldy, r0, r1, IG, 1); break;                                                            \
    case 2: rows_vnni(w, a, y, ldy, r0, r1, IG, 2); break;                                                            \
    case 3: rows_vnni(w, a, y, ldy, r0, r1, IG, 3); break;                                                            \
    case 4: rows_vnni(w, a, y, ldy, r0, r1, IG, 4); break;                                                            \
    case 5: rows_vnni(w, a, y, ldy, r0, r1, IG, 5); break;                                                            \
    case 6: rows_vnni(w, a, y, ldy, r0, r1, IG, 6); break;                                                            \
    case 7: rows_vnni(w, a, y, ldy, r0, r1, IG, 7); break;                                                            \
    default: rows_vnni(w, a, y, ldy, r0, r1, IG, 8); break;                                                           \
    }
    if (w->ig == 8)
        I8_CASES(8)
    else
        I8_CASES(16)
#undef I8_CASES
}
