/* Int8 tiles (i8tile/i8tile.c) on AArch64 with the dot-product extension: one
 * 16-row vector (four 4-row sdot operands) times 4 tokens in 16 int32x4
 * accumulators; per 4 columns, 4 weight loads, 4 broadcasts of a token's
 * 4 bytes and 16 sdot. Signed by signed: no offset. */
#include <arm_neon.h>
#include <string.h>

#include "cpu/i8tile/i8tile_kernels.h"

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define TOK 4

static inline DOTPROD __attribute__((always_inline)) void tile(const int8_t *wp, const float *sw, int b0, int b1,
                                                                int v, const int8_t *xq, size_t kp, const float *sa,
                                                                size_t nb, float *yt, const int T) {
    for (int b = b0; b < b1; b++) {
        int32x4_t acc[4][TOK];
        for (int q = 0; q < 4; q++)
            for (int t = 0; t < T; t++) acc[q][t] = vdupq_n_s32(0);
        const int8_t *wb = wp + ((size_t)b * KVQ_I8T_NV + (size_t)v) * KVQ_I8T_VBYTES;
        const int8_t *xb = xq + (size_t)b * KVQ_I8T_KB;
        for (int k4 = 0; k4 < KVQ_I8T_KB / 4; k4++) {
            int8x16_t w[4];
            for (int q = 0; q < 4; q++) w[q] = vld1q_s8(wb + k4 * 64 + q * 16);
            for (int t = 0; t < T; t++) {
                int32_t a4;
                memcpy(&a4, xb + (size_t)t * kp + k4 * 4, 4);
                int8x16_t a = vreinterpretq_s8_s32(vdupq_n_s32(a4));
                for (int q = 0; q < 4; q++) acc[q][t] = vdotq_s32(acc[q][t], w[q], a);
            }
        }
        for (int q = 0; q < 4; q++) {
            float32x4_t s = vld1q_f32(sw + b * KVQ_I8T_PR + v * 16 + q * 4);
            for (int t = 0; t < T; t++) {
                float *y = yt + (size_t)t * KVQ_I8T_PR + v * 16 + q * 4;
                float32x4_t st = vmulq_n_f32(s, sa[(size_t)t * nb + (size_t)b]);
                vst1q_f32(y, vfmaq_f32(vld1q_f32(y), vcvtq_f32_s32(acc[q][t]), st));
            }
        }
    }
}

DOTPROD void kvq_i8t_panel_neon(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1,
                                const int8_t *xq, size_t kp, const float *sa, size_t nb, int nt, float *yt) {
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
