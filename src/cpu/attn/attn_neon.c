/* NEON (AArch64 baseline, no dot-product extension) attention kernels.
 * Cache rows are dequantized 16 values at a time into four f32x4 registers
 * and FMAed into tiles of positions × query rows (q·k) or query rows ×
 * columns (V); block scales are applied per position for K and folded into
 * the softmax weights for V, as in the x86 kernels. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "cpu/attn/attn_kernels.h"

#define AI static inline __attribute__((always_inline))
#define BP KVQ_ATTN_BP
#define NB_MAX (KVQ_ATTN_HD_MAX / KVQ_QK)

static float f16s(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

static size_t block_bytes(kvq_cache_type t) {
    return t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4);
}

/* D[b*BP + j] = scale of block b of row j, j < np. */
static void load_scales(const uint8_t *row0, size_t rb, int np, int nb, size_t bsz, float *D) {
    for (int j = 0; j < np; j++)
        for (int b = 0; b < nb; b++) D[b * BP + j] = f16s(row0 + (size_t)j * rb + (size_t)b * bsz);
}

AI void widen_s8(int8x16_t v, float32x4_t *x) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
    x[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    x[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
    x[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    x[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
}

/* Values 16c .. 16c+15 of a row as f32 (x[0..3]), without the block scale for q8/q4. */
AI void ld16(const uint8_t *row, int c, const int t, float32x4_t *x) {
    if (t == KVQ_CACHE_F32) {
        const float *p = (const float *)(const void *)(row + 64 * c);
        for (int i = 0; i < 4; i++) x[i] = vld1q_f32(p + 4 * i);
    } else if (t == KVQ_CACHE_F16) {
        const uint16_t *p = (const uint16_t *)(const void *)(row + 32 * c);
        for (int i = 0; i < 4; i++) x[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
    } else if (t == KVQ_CACHE_Q8) {
        widen_s8(vld1q_s8((const int8_t *)(row + (size_t)(c >> 1) * sizeof(kvq_block_q8) + 2 + 16 * (c & 1))), x);
    } else {
        const uint8x16_t qs = vld1q_u8(row + (size_t)(c >> 1) * sizeof(kvq_block_q4) + 2);
        const uint8x16_t nib = (c & 1) ? vshrq_n_u8(qs, 4) : vandq_u8(qs, vdupq_n_u8(0x0F));
        widen_s8(vsubq_s8(vreinterpretq_s8_u8(nib), vdupq_n_s8(8)), x);
    }
}

/* ---- q·k ---- */

AI void qk_tile(const uint8_t *k, size_t rb, int np, int j0, const float *q, int hd, const float *D, float *s,
                int pf, const int NP, const int NH, const int t) {
    float32x4_t acc[16];
    const uint8_t *row[16];
    int jj[16];
    for (int i = 0; i < NP; i++) {
        jj[i] = j0 + i < np ? j0 + i : np - 1;
        row[i] = k + (size_t)jj[i] * rb;
        if (pf) kvq_attn_prefetch_row(row[i], rb);
        for (int h = 0; h < NH; h++) acc[i * NH + h] = vdupq_n_f32(0.0f);
    }
    for (int c = 0; c < hd / 16; c++) {
        for (int i = 0; i < NP; i++) {
            float32x4_t x[4];
            ld16(row[i], c, t, x);
            if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) {
                const float d = D[(c >> 1) * BP + jj[i]];
                for (int u = 0; u < 4; u++) x[u] = vmulq_n_f32(x[u], d);
            }
            for (int h = 0; h < NH; h++) {
                const float *qh = q + (size_t)h * hd + 16 * c;
                float32x4_t a = acc[i * NH + h];
                for (int u = 0; u < 4; u++) a = vfmaq_f32(a, x[u], vld1q_f32(qh + 4 * u));
                acc[i * NH + h] = a;
            }
        }
    }
    float sum[16];
    for (int i = 0; i < NP * NH; i += 4) {
        /* four horizontal sums in three pairwise adds */
        const int n = NP * NH - i < 4 ? NP * NH - i : 4;
        float32x4_t a = acc[i], b = n > 1 ? acc[i + 1] : a, c = n > 2 ? acc[i + 2] : a, d = n > 3 ? acc[i + 3] : a;
        vst1q_f32(sum + i, vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d)));
    }
    for (int i = 0; i < NP && j0 + i < np; i++)
        for (int h = 0; h < NH; h++) s[h * BP + j0 + i] = sum[i * NH + h];
}

AI void qk_rows(const uint8_t *k, size_t rb, int np, const float *q, int hd, const float *D, float *s, int pf,
                const int NH, const int t) {
    const int NP = NH >= 4 ? 4 : 16 / NH > 8 ? 8 : 16 / NH; /* ≤ 16 accumulators of the 32 registers */
    for (int j0 = 0; j0 < np; j0 += NP) qk_tile(k, rb, np, j0, q, hd, D, s, pf, NP, NH, t);
}

AI void qk_t(const uint8_t *k, size_t rb, int np, const float *q, int nr, int hd, float *s, const int t) {
    float D[NB_MAX * BP];
    if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) load_scales(k, rb, np, hd / KVQ_QK, block_bytes(t), D);
    int r = 0;
    for (; nr - r >= 4; r += 4) qk_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 4, t);
    if (nr - r >= 2) {
        qk_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 2, t);
        r += 2;
    }
    if (nr - r >= 1) qk_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 1, t);
}

static void qk(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep, int nr,
               int hd, float *s) {
    (void)prep;
    switch (tk) {
    case KVQ_CACHE_F32: qk_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_F32); break;
    case KVQ_CACHE_F16: qk_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_F16); break;
    case KVQ_CACHE_Q8: qk_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_Q8); break;
    case KVQ_CACHE_Q4: qk_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_Q4); break;
    }
}

/* ---- V accumulation ---- */

/* NH rows × 16 columns of chunk c: weight of row h at position j is W[h*BP + j]
 * (for q8/q4 the caller passes weights already multiplied by chunk c's block scale). */
AI void av_tile(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int c, const int NH,
                const int t) {
    float32x4_t a[16];
    for (int h = 0; h < NH; h++)
        for (int u = 0; u < 4; u++) a[h * 4 + u] = vld1q_f32(acc + (size_t)h * hd + 16 * c + 4 * u);
    const uint8_t *row = v;
    for (int j = 0; j < np; j++, row += rb) {
        if (c == 0) kvq_attn_prefetch_row(row, rb);
        float32x4_t x[4];
        ld16(row, c, t, x);
        for (int h = 0; h < NH; h++) {
            const float w = W[h * BP + j];
            for (int u = 0; u < 4; u++) a[h * 4 + u] = vfmaq_n_f32(a[h * 4 + u], x[u], w);
        }
    }
    for (int h = 0; h < NH; h++)
        for (int u = 0; u < 4; u++) vst1q_f32(acc + (size_t)h * hd + 16 * c + 4 * u, a[h * 4 + u]);
}

/* Up to 4 rows (16 accumulators); for q8/q4 weights are scaled per block into WD first. */
AI void av_group(const uint8_t *v, size_t rb, int np, const float *w, int hd, float *acc, const float *D, float *WD,
                 const int NH, const int t) {
    const int q = t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4;
    for (int c = 0; c < hd / 16; c++) {
        const float *W = w;
        if (q) {
            if ((c & 1) == 0) /* a new block: weights × this block's scale */
                for (int h = 0; h < NH; h++)
                    for (int j = 0; j < np; j++) WD[h * BP + j] = w[h * BP + j] * D[(c >> 1) * BP + j];
            W = WD;
        }
        av_tile(v, rb, np, W, acc, hd, c, NH, t);
    }
}

AI void av_t(const uint8_t *v, size_t rb, int np, const float *w, int nr, int hd, float *acc, const int t) {
    float D[NB_MAX * BP], WD[4 * BP];
    if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) load_scales(v, rb, np, hd / KVQ_QK, block_bytes(t), D);
    int r = 0;
    for (; nr - r >= 4; r += 4) av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, 4, t);
    if (nr - r >= 2) {
        av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, 2, t);
        r += 2;
    }
    if (nr - r >= 1) av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, 1, t);
}

static void av(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, int nr, int hd, float *acc) {
    switch (tv) {
    case KVQ_CACHE_F32: av_t(v, rb, np, w, nr, hd, acc, KVQ_CACHE_F32); break;
    case KVQ_CACHE_F16: av_t(v, rb, np, w, nr, hd, acc, KVQ_CACHE_F16); break;
    case KVQ_CACHE_Q8: av_t(v, rb, np, w, nr, hd, acc, KVQ_CACHE_Q8); break;
    case KVQ_CACHE_Q4: av_t(v, rb, np, w, nr, hd, acc, KVQ_CACHE_Q4); break;
    }
}

/* ---- softmax helpers ---- */

/* exp(x) for x <= 0: 2^n · p(r), |r| <= ln2/2, degree-6 Taylor (rel. error ~2e-7); x < -87 gives 0. */
AI float32x4_t exp4(float32x4_t x) {
    const uint32x4_t live = vcgeq_f32(x, vdupq_n_f32(-87.0f));
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    const int32x4_t ni = vcvtnq_s32_f32(vmulq_n_f32(x, 1.44269504f));
    const float32x4_t n = vcvtq_f32_s32(ni);
    float32x4_t r = vfmsq_n_f32(x, n, 0.693145751953125f);
    r = vfmsq_n_f32(r, n, 1.428606765330187e-06f);
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(ni, vdupq_n_s32(127)), 23);
    p = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(live, vreinterpretq_u32_f32(p)));
}

static float exp_sum(float *x, int n, float m) {
    float32x4_t sum = vdupq_n_f32(0.0f);
    const float32x4_t mv = vdupq_n_f32(m);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), mv));
        vst1q_f32(x + i, e);
        sum = vaddq_f32(sum, e);
    }
    float s = vaddvq_f32(sum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

static float vmax(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vld1q_f32(x + i));
    float r = vmaxvq_f32(m);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

const kvq_attn_kernels kvq_attn_neon = {
    .qk = qk,
    .av = av,
    .exp_sum = exp_sum,
    .max = vmax,
};
