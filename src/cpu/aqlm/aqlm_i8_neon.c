/* 1x16 AQLM with int8 codewords on AArch64 with the dot-product extension
 * (sdot; scheme and error bound: aqlm/aqlm_i8.c). Two codewords of 8 (or one
 * of 16) by plain loads make 16 bytes, one sdot against 16 activation bytes
 * gives 4 int32 lanes, two per group of 8. Signed by signed: no offset. */
#include <arm_neon.h>

#include "cpu/aqlm/aqlm_kernels.h"

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

static inline DOTPROD __attribute__((always_inline)) void rows_neon(const kvq_cpu_weight *w, const kvq_i8_act *a,
                                                                     float *y, size_t ldy, int r0, int r1,
                                                                     const int IG, const int T) {
    const int G = w->G, P = a->cols_pad;
    const int8_t *cb = w->cbq;
    const float *cls = w->cbq_cls;
    const int sh = w->cbq_shift;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G;
        if (a->cb_prefetch) kvq_cb_prefetch_slice(w, o - r0);
        float32x4_t acc[KVQ_GEMV_MAX_T];
        for (int t = 0; t < T; t++) acc[t] = vdupq_n_f32(0.0f);
        for (int g = 0; g < G; g += 16 / IG) {
            int8x16_t cw;
            float32x4_t sc;
            if (IG == 8) {
                unsigned c0 = c[g], c1 = g + 1 < G ? c[g + 1] : 0; /* past the row: x is 0 there */
                cw = vcombine_s8(vld1_s8(cb + 8 * (size_t)c0), vld1_s8(cb + 8 * (size_t)c1));
                sc = vcombine_f32(vdup_n_f32(cls[c0 >> sh]), vdup_n_f32(cls[c1 >> sh]));
            } else {
                cw = vld1q_s8(cb + 16 * (size_t)c[g]);
                sc = vdupq_n_f32(cls[c[g] >> sh]);
            }
            for (int t = 0; t < T; t++) {
                const size_t tp = (size_t)t * P;
                int32x4_t dot = vdotq_s32(vdupq_n_s32(0), cw, vld1q_s8(a->q + tp + (size_t)g * IG));
                float32x4_t s = vmulq_n_f32(sc, a->d[tp / 32 + (size_t)g * IG / 32]);
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(dot), s);
            }
        }
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + o] = w->scales[o] * vaddvq_f32(acc[t]);
    }
}

DOTPROD void kvq_aqlm_i8_gemv_neon(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0,
                                   int r1) {
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
