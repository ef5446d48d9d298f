/* 1x16 AQLM with int8 codewords on AVX-512 VNNI (scheme and error bound:
 * aqlm/aqlm_i8.c). One step is 64 values of a row: the codewords of 8 groups
 * of 8 (or 4 of 16) come in with one vpgatherqq from the 512 KiB int8
 * codebook (it stays in L2, where the fp16 one did not), and are widened
 * once to int16 in units of the codebook's base scale (shifted left by their
 * class's exponent, found from the code's top bits by word permutes). Every
 * token then costs two vpdpwssd per 64 values on its int16 activations, into
 * int32 sums that are exact over a block of 256 values, and one convert + FMA
 * by the block's activation scale per 256 (the kernel this replaced, with a
 * float scale per codeword class, took about 7 ops per 64 values and token).
 * Up to KVQ_I8_VNNI_MAX_T tokens share one gather; a token's int32 block
 * sums and float steps are the same whatever their number, so its outputs
 * are the same bits in any batch. */
#include <immintrin.h>

#include "cpu/aqlm/aqlm_kernels.h"

#define VNNI __attribute__((target("avx512vnni,avx512bw"), always_inline)) inline

/* The step's codes as 8 words (IG 8: 8 codes; IG 16: 4, zero above), codes
 * past the row's end 0 (their activations are 0). */
static VNNI __m128i step_codes(const uint16_t *c, int u, int G, const int IG) {
    const int per = 64 / IG;
    int left = G - u * per;
    unsigned m = left >= per ? (1u << per) - 1u : (1u << left) - 1u;
    return _mm_maskz_loadu_epi16((__mmask8)m, c + per * u);
}

/* Word i of a step's half h (values 32h + i) belongs to group (32h + i) / IG. */
static VNNI __m512i group_of_word(int h, const int IG) {
    short v[32];
    for (int i = 0; i < 32; i++) v[i] = (short)((32 * h + i) / IG);
    return _mm512_loadu_si512(v);
}

/* vpgatherqq of 8 qwords into a register zeroed just before. A gather
 * merges into its destination, and with the intrinsic GCC gave it the
 * register of the previous step's codewords: each gather then waited for the
 * one before (n=1 ran 1.6x slower than it does with this). */
static VNNI __m512i gather_fresh(__m512i idx, const long long *base) {
    __m512i r;
    __mmask8 k = 0xff;
    __asm__("vpxord %0, %0, %0\n\tvpgatherqq (%2,%3,8), %0%{%1%}" : "=&v"(r), "+Yk"(k) : "r"(base), "v"(idx));
    return r;
}

/* One step of 64 values: the gather, the codewords widened to int16 in
 * units of base, and every token's two vpdpwssd (into s0, or s0 and s1). */
static VNNI void i8_step(const uint16_t *c, int u, int G, const int IG, const int T, const int SPLIT,
                         const long long *cb, __m128i shift, __m512i sub, __m512i spread, __m512i gw0, __m512i gw1,
                         __m512i e0, __m512i e1, const int16_t *q16, int P, __m512i *s0, __m512i *s1, const int full) {
    __m128i cv = full ? (IG == 8 ? _mm_loadu_si128((const __m128i *)(c + 8 * u)) : _mm_loadl_epi64((const __m128i *)(c + 4 * u)))
                      : step_codes(c, u, G, IG);
    __m512i cq = _mm512_cvtepu16_epi64(cv);
    __m512i gi = IG == 8 ? cq : _mm512_add_epi64(_mm512_slli_epi64(_mm512_permutexvar_epi64(spread, cq), 1), sub);
    __m512i cw = gather_fresh(gi, cb);
    __m512i cls = _mm512_srl_epi16(_mm512_castsi128_si512(cv), shift);
    __m512i ec = _mm512_permutex2var_epi16(e0, cls, e1); /* word j: code j's exponent */
    __m512i x0 = _mm512_permutexvar_epi16(gw0, ec), x1 = _mm512_permutexvar_epi16(gw1, ec);
    __m512i w0 = _mm512_sllv_epi16(_mm512_cvtepi8_epi16(_mm512_castsi512_si256(cw)), x0);
    __m512i w1 = _mm512_sllv_epi16(_mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(cw, 1)), x1);
    for (int t = 0; t < T; t++) {
        const int16_t *xq = q16 + (size_t)t * P + 64 * (size_t)u;
        s0[t] = _mm512_dpwssd_epi32(s0[t], w0, _mm512_load_si512(xq));
        if (SPLIT)
            s1[t] = _mm512_dpwssd_epi32(s1[t], w1, _mm512_load_si512(xq + 32));
        else
            s0[t] = _mm512_dpwssd_epi32(s0[t], w1, _mm512_load_si512(xq + 32));
    }
}

static VNNI void rows_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y, size_t ldy, int r0, int r1,
                           const int IG, const int T) {
    const int G = w->G, steps = (G * IG + 63) / 64, P = a->cols_pad, nb = P / 32;
    const int SPLIT = T <= 4; /* few tokens: two int32 chains each, against vpdpwssd's latency */
    const long long *cb = (const long long *)(const void *)w->cbq;
    const __m128i shift = _mm_cvtsi32_si128(w->cbq_shift);
    const __m512i sub = _mm512_set_epi64(1, 0, 1, 0, 1, 0, 1, 0);
    const __m512i spread = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i gw0 = group_of_word(0, IG), gw1 = group_of_word(1, IG);
    int16_t ex[KVQ_I8_CLASSES];
    float base;
    kvq_i8_exponents(w, ex, &base);
    const __m512i e0 = _mm512_loadu_si512(ex), e1 = _mm512_loadu_si512(ex + 32);
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        __m512 acc[KVQ_I8_VNNI_MAX_T];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        for (int u0 = 0; u0 < steps; u0 += KVQ_I8_ABLK / 64) {
            __m512i s0[KVQ_I8_VNNI_MAX_T], s1[KVQ_I8_VNNI_MAX_T];
            for (int t = 0; t < T; t++) s0[t] = s1[t] = _mm512_setzero_si512();
            const int u1 = u0 + KVQ_I8_ABLK / 64 < steps ? u0 + KVQ_I8_ABLK / 64 : steps;
            if (u1 - u0 == KVQ_I8_ABLK / 64 && (u0 + 4) * (64 / IG) <= G) { /* a whole block: unrolled */
                for (int u = u0; u < u0 + KVQ_I8_ABLK / 64; u++)
                    i8_step(c, u, G, IG, T, SPLIT, cb, shift, sub, spread, gw0, gw1, e0, e1, a->q16, P, s0, s1, 1);
            } else {
                for (int u = u0; u < u1; u++)
                    i8_step(c, u, G, IG, T, SPLIT, cb, shift, sub, spread, gw0, gw1, e0, e1, a->q16, P, s0, s1, 0);
            }
            for (int t = 0; t < T; t++) {
                __m512i s = SPLIT ? _mm512_add_epi32(s0[t], s1[t]) : s0[t];
                __m512 d = _mm512_set1_ps(a->d[(size_t)t * nb + (size_t)u0 * 2]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[t]);
            }
        }
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + o] = w->scales[o] * (base * _mm512_reduce_add_ps(acc[t]));
    }
}

__attribute__((target("avx512vnni,avx512bw"))) void kvq_aqlm_i8_gemv_vnni(const kvq_cpu_weight *w,
                                                                           const kvq_i8_act *a, int n, float *y,
                                                                           size_t ldy, int r0, int r1) {
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
