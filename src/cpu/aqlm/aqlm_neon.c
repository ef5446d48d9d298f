/* NEON (AArch64) AQLM kernels: 8-bit codes through int16 lookup tables
 * (tbl/tbx), wider codes through codeword loads. Layouts and math: aqlm.c;
 * checked against src/ref under qemu by tests/neon/. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

/* ---- AQLM 8-bit codes: int16 tables, same scheme and bound as the AVX-512
 * VBMI kernels (aqlm/aqlm_avx512.c): one scale per chunk or token, exact int32 sums.
 * A step's table is a low-byte plane and a high-byte plane of 256 bytes; one
 * tbl + three tbx (each covers 64 entries) look 16 codes up in a plane. */

float kvq_aqlm_lutq_build_neon(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    float32x4_t mx = vdupq_n_f32(0.0f);
    for (int g = g0; g < g1; g++) {
        const float *xg = x + (size_t)g * ig;
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * ig * 256; /* [ig][256] */
            float *l = lut + ((size_t)(g - g0) * M + m) * 256;
            for (int c = 0; c < 256; c += 4) {
                float32x4_t a = vmulq_n_f32(vld1q_f32(ct + c), xg[0]);
                for (int j = 1; j < ig; j++) a = vfmaq_n_f32(a, vld1q_f32(ct + (size_t)j * 256 + c), xg[j]);
                vst1q_f32(l + c, a);
                mx = vmaxq_f32(mx, vabsq_f32(a)); /* fmax keeps a NaN: the scale, and so the outputs, become NaN */
            }
        }
    }
    return vmaxvq_f32(mx);
}

void kvq_aqlm_lutq_pack_neon(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                             int g0, int g1) {
    float32x4_t inv = vdupq_n_f32(inv_scale);
    for (size_t s = 0; s < (size_t)(g1 - g0) * w->M; s++) {
        const float *src = lut + s * 256;
        uint8_t *dst = (uint8_t *)qlut + s / 2 * pair_stride + (s & 1) * 512;
        for (int c = 0; c < 256; c += 8) {
            /* round to nearest, saturate to int16, split into the two byte planes */
            int16x8_t q = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src + c), inv))),
                                       vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(src + c + 4), inv))));
            uint8x16_t b = vreinterpretq_u8_s16(q);
            uint8x8x2_t lh = vuzp_u8(vget_low_u8(b), vget_high_u8(b)); /* val[0]: low bytes, val[1]: high bytes */
            vst1_u8(dst + c, lh.val[0]);
            vst1_u8(dst + 256 + c, lh.val[1]);
        }
    }
}

static inline uint8x16_t plane_lookup(const uint8_t *plane, uint8x16_t i0, uint8x16_t i1, uint8x16_t i2, uint8x16_t i3) {
    uint8x16_t r = vqtbl4q_u8(vld1q_u8_x4(plane), i0);
    r = vqtbx4q_u8(r, vld1q_u8_x4(plane + 64), i1);
    r = vqtbx4q_u8(r, vld1q_u8_x4(plane + 128), i2);
    return vqtbx4q_u8(r, vld1q_u8_x4(plane + 192), i3);
}

void kvq_aqlm_lutq_gemv_neon(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc,
                             float *out, int r0, int r1) {
    size_t n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    memset(acc, 0, n * sizeof(int32_t));
    const uint8x16_t k64 = vdupq_n_u8(64), k128 = vdupq_n_u8(128), k192 = vdupq_n_u8(192);
    for (size_t s = (size_t)s0; s < (size_t)s1; s++) {
        const uint8_t *tq = (const uint8_t *)qlut + (s - (size_t)s0) * 512; /* s0 even: pairs are adjacent */
        const uint8_t *c = codes + s * pad;
        if (s + KVQ_LUT_PREFETCH < (size_t)s1)
            for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + KVQ_LUT_PREFETCH * pad + i);
        for (size_t i = 0; i < n; i += 16) {
            /* indices wrapped so each tbx sees its 64 entries at 0..63 and the rest out of range */
            uint8x16_t i0 = vld1q_u8(c + i), i1 = vsubq_u8(i0, k64), i2 = vsubq_u8(i0, k128), i3 = vsubq_u8(i0, k192);
            uint8x16_t lo = plane_lookup(tq, i0, i1, i2, i3), hi = plane_lookup(tq + 256, i0, i1, i2, i3);
            int16x8_t v0 = vreinterpretq_s16_u8(vzip1q_u8(lo, hi)), v1 = vreinterpretq_s16_u8(vzip2q_u8(lo, hi));
            int32_t *a = acc + i;
            vst1q_s32(a, vaddw_s16(vld1q_s32(a), vget_low_s16(v0)));
            vst1q_s32(a + 4, vaddw_high_s16(vld1q_s32(a + 4), v0));
            vst1q_s32(a + 8, vaddw_s16(vld1q_s32(a + 8), vget_low_s16(v1)));
            vst1q_s32(a + 12, vaddw_high_s16(vld1q_s32(a + 12), v1));
        }
    }
    for (size_t i = 0; i < n; i++) out[i] += scale * (float)acc[i];
}

/* ---- AQLM wider codes: codewords (fp16, widened) times x ---- */

/* Group g of one row as ig/4 f32 vectors: the sum of its M codewords (fp16, or the int8 codebook). */
static inline void codeword(const kvq_cpu_weight *w, const uint16_t *c, size_t KI, float32x4_t v[4]) {
    int ig = w->ig, q4 = ig / 4;
    if (w->cb8) { /* one codebook, int8: q * cb8_scale as the reference has it */
        const int8_t *cw = w->cb8 + (size_t)c[0] * ig;
        for (int h = 0; h < ig; h += 8) {
            int16x8_t q = vmovl_s8(vld1_s8(cw + h));
            v[h / 4] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), w->cb8_scale);
            v[h / 4 + 1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), w->cb8_scale);
        }
        return;
    }
    for (int q = 0; q < q4; q++) v[q] = vdupq_n_f32(0.0f);
    for (int m = 0; m < w->M; m++) {
        const uint16_t *cw = w->cb16 + (size_t)m * KI + (size_t)c[m] * ig;
        for (int q = 0; q < q4; q++) v[q] = vaddq_f32(v[q], vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(cw + 4 * q))));
    }
}

void kvq_aqlm_gather_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    size_t ig = (size_t)w->ig, M = (size_t)w->M, G = (size_t)w->G, cols = (size_t)w->cols, rows = (size_t)w->rows;
    size_t KI = ((size_t)1 << w->nbits) * ig;
    int q4 = (int)ig / 4;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * G * M;
        kvq_cb_prefetch_slice(w, o - r0);
        float32x4_t a[KVQ_GATHER_MAX_T][4];
        for (int t = 0; t < n; t++)
            for (int q = 0; q < 4; q++) a[t][q] = vdupq_n_f32(0.0f);
        for (size_t g = 0; g < G; g++) {
            float32x4_t v[4];
            codeword(w, c + g * M, KI, v);
            for (int t = 0; t < n; t++)
                for (int q = 0; q < q4; q++) a[t][q] = vfmaq_f32(a[t][q], v[q], vld1q_f32(x + t * cols + g * ig + 4 * (size_t)q));
        }
        for (int t = 0; t < n; t++) {
            float32x4_t s = vaddq_f32(vaddq_f32(a[t][0], a[t][1]), vaddq_f32(a[t][2], a[t][3]));
            y[t * rows + (size_t)o] = w->scales[o] * vaddvq_f32(s);
        }
    }
}
