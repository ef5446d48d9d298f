/* 1x16 AQLM with int8 codewords on AArch64 (scheme and error bound:
 * aqlm/aqlm_i8.c). Per group of 8 values a codeword by a plain load, widened
 * to int16 and shifted by its class's exponent once for all tokens; each
 * token then adds smlal/smlal2 with its int16 activations into two int32x4
 * sums (one product per lane and group: 32 per lane over a block of 256
 * values, within the scheme's bound), converted and scaled once per block. */
#include <arm_neon.h>

#include "cpu/aqlm/aqlm_kernels.h"

static inline __attribute__((always_inline)) void rows_neon(const kvq_cpu_weight *w, const kvq_i8_act *a, float *y,
                                                            size_t ldy, int r0, int r1, const int IG, const int T) {
    const int G = w->G, P = a->cols_pad, nb = P / 32, oct = G * IG / 8;
    const int8_t *cb = w->cbq;
    const int sh = w->cbq_shift;
    int16_t ex[KVQ_I8_CLASSES];
    float base;
    kvq_i8_exponents(w, ex, &base);
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        float32x4_t acc[KVQ_GEMV_MAX_T];
        for (int t = 0; t < T; t++) acc[t] = vdupq_n_f32(0.0f);
        for (int j0 = 0; j0 < oct; j0 += KVQ_I8_ABLK / 8) { /* j: 8 values, 32 per block */
            const int j1 = j0 + KVQ_I8_ABLK / 8 < oct ? j0 + KVQ_I8_ABLK / 8 : oct;
            int32x4_t s0[KVQ_GEMV_MAX_T], s1[KVQ_GEMV_MAX_T];
            for (int t = 0; t < T; t++) s0[t] = s1[t] = vdupq_n_s32(0);
            for (int j = j0; j < j1; j++) {
                unsigned k = c[j * 8 / IG];
                int8x8_t b = vld1_s8(cb + (size_t)k * IG + (size_t)(j * 8 % IG));
                int16x8_t w16 = vshlq_s16(vmovl_s8(b), vdupq_n_s16(ex[k >> sh]));
                for (int t = 0; t < T; t++) {
                    int16x8_t xq = vld1q_s16(a->q16 + (size_t)t * P + 8 * (size_t)j);
                    s0[t] = vmlal_s16(s0[t], vget_low_s16(w16), vget_low_s16(xq));
                    s1[t] = vmlal_high_s16(s1[t], w16, xq);
                }
            }
            for (int t = 0; t < T; t++) {
                float d = a->d[(size_t)t * nb + (size_t)j0 / 4];
                acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(s0[t]), d);
                acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(s1[t]), d);
            }
        }
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + o] = w->scales[o] * (base * vaddvq_f32(acc[t]));
    }
}

void kvq_aqlm_i8_gemv_neon(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1) {
#define I8_CASES(IG)                                                                                                   \
    switch (n) {                                                                                                       \
    case 1: rows_neon(w, a, y, ldy, r0, r1, IG, 1); break;                                                            \
    case 2: rows_neon(w, a, y, ldy, r0, r1, IG, 2); break;                                                            \
    case 3: rows_neon(w, a, y, ldy, r0, r1, IG, 3); break;                                                            \
    default: rows_neon(w, a, y, ldy, r0, r1, IG, 4); break;                                                           \
    }
    if (w->ig == 8)
        I8_CASES(8)
    else
        I8_CASES(16)
#undef I8_CASES
}
