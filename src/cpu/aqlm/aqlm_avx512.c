/* AVX-512 AQLM kernels (layouts and the math: aqlm/aqlm.c). LUT path: 16
 * rows' codes of one step are one 16-byte load feeding one 16-lane gather, or
 * with VBMI 64 rows per byte shuffle (below). Codeword path: 8-value fp16
 * codewords are widened in pairs into one zmm. */
#include <immintrin.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

/* Entries c .. c+15 of one codebook's table: sum_j ct[j][c] * x_j, as two
 * chains (even j, odd j) added at the end; every table builder uses this, so
 * f32, byte-plane and int16 tables hold the same values. */
static inline __attribute__((always_inline)) __m512 table16(const float *ct, const __m512 *xb, int ig, int c) {
    __m512 a0 = _mm512_mul_ps(_mm512_load_ps(ct + c), xb[0]);
    __m512 a1 = _mm512_mul_ps(_mm512_load_ps(ct + 256 + c), xb[1]);
    for (int j = 2; j < ig; j += 2) {
        a0 = _mm512_fmadd_ps(_mm512_load_ps(ct + (size_t)j * 256 + c), xb[j], a0);
        a1 = _mm512_fmadd_ps(_mm512_load_ps(ct + (size_t)(j + 1) * 256 + c), xb[j + 1], a1);
    }
    return _mm512_add_ps(a0, a1);
}

/* f32 tables of groups [g0, g1); returns their max |entry| (0 when want_max is 0).
 * IG is a constant for the common 8 so the chains unroll. */
static inline __attribute__((always_inline)) float build_f32(const kvq_cpu_weight *w, const float *x, float *lut, int g0,
                                                             int g1, int gbase, const int IG, const int want_max) {
    int M = w->M;
    __m512 mx = _mm512_setzero_ps();
    for (int g = g0; g < g1; g++) {
        __m512 xb[16];
        for (int j = 0; j < IG; j++) xb[j] = _mm512_set1_ps(x[(size_t)g * IG + j]);
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * IG * 256; /* [ig][256] */
            float *l = lut + ((size_t)(g - gbase) * M + m) * 256;
            for (int c = 0; c < 256; c += 16) {
                __m512 v = table16(ct, xb, IG, c);
                _mm512_store_ps(l + c, v);
                if (want_max) mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
            }
        }
    }
    return want_max ? _mm512_reduce_max_ps(mx) : 0.0f;
}

void kvq_aqlm_lut_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    if (w->ig == 8)
        build_f32(w, x, lut, g0, g1, g0, 8, 0);
    else
        build_f32(w, x, lut, g0, g1, g0, w->ig, 0);
}

void kvq_aqlm_lut_gemv_avx512(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1) {
    size_t S = (size_t)s1, n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad, s = (size_t)s0;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    size_t total = (size_t)w->G * w->M; /* the prefetch runs on into the caller's next chunk */
    /* Two steps per pass over acc: two 1 KB tables stay in L1, acc traffic
     * halves (four steps, as in AVX2, measured no better here). */
    for (; s + 2 <= S; s += 2) {
        const float *l0 = lut + (s - (size_t)s0) * 256, *l1 = l0 + 256;
        const uint8_t *c0 = codes + s * pad, *c1 = c0 + pad;
        int pf = s + 2 + KVQ_LUT_PREFETCH < total;
        for (size_t i0 = 0; i0 < n; i0 += 64) {
            if (pf) {
                _mm_prefetch((const char *)(c0 + (2 + KVQ_LUT_PREFETCH) * pad + i0), _MM_HINT_T0);
                _mm_prefetch((const char *)(c1 + (2 + KVQ_LUT_PREFETCH) * pad + i0), _MM_HINT_T0);
            }
            for (size_t i = i0; i < i0 + 64; i += 16) {
                __m512 v0 = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c0 + i))), l0, 4);
                __m512 v1 = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c1 + i))), l1, 4);
                _mm512_store_ps(acc + i, _mm512_add_ps(_mm512_load_ps(acc + i), _mm512_add_ps(v0, v1)));
            }
        }
    }
    if (s < S) {
        const float *l0 = lut + (s - (size_t)s0) * 256;
        const uint8_t *c0 = codes + s * pad;
        for (size_t i = 0; i < n; i += 16) {
            __m512 v0 = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(c0 + i))), l0, 4);
            _mm512_store_ps(acc + i, _mm512_add_ps(_mm512_load_ps(acc + i), v0));
        }
    }
}

/* ---- VBMI: lookups as byte shuffles ----
 * A step's table is 256 f32 = 1 KB = 16 zmm. Stored as 4 byte planes (plane p
 * = byte p of every entry, 256 bytes = 4 zmm), one vpermt2b looks up 64 codes
 * in half a plane; the code's top bit picks the half. Four planes are then
 * interleaved back into 64 f32: exact, and ~3.5x the lookups of vpgatherdd. */

/* 4x4 transpose of 128-bit lanes: out[j].lane i = in[i].lane j. */
static inline __attribute__((always_inline)) void lanes4x4(__m512i in[4], __m512i out[4]) {
    __m512i a = _mm512_shuffle_i64x2(in[0], in[1], 0x44), b = _mm512_shuffle_i64x2(in[0], in[1], 0xee);
    __m512i c = _mm512_shuffle_i64x2(in[2], in[3], 0x44), d = _mm512_shuffle_i64x2(in[2], in[3], 0xee);
    out[0] = _mm512_shuffle_i64x2(a, c, 0x88);
    out[1] = _mm512_shuffle_i64x2(a, c, 0xdd);
    out[2] = _mm512_shuffle_i64x2(b, d, 0x88);
    out[3] = _mm512_shuffle_i64x2(b, d, 0xdd);
}

/* The f32 VBMI lookups add rows in a lane-transposed order per 64 rows: 4x4
 * lane transpose of each 64 f32, its own inverse, so one function maps both ways. */
static inline void row_order(float *acc, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m512i in[4], out[4];
        for (int k = 0; k < 4; k++) in[k] = _mm512_castps_si512(_mm512_load_ps(acc + i + 16 * k));
        lanes4x4(in, out);
        for (int k = 0; k < 4; k++) _mm512_store_ps(acc + i + 16 * k, _mm512_castsi512_ps(out[k]));
    }
}

/* Byte permute grouping 16 f32 by byte: out byte 16p + k = in byte 4k + p. */
static const uint8_t k_planes_idx[64] = {
    0, 4, 8,  12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 1, 5, 9,  13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61,
    2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63,
};

__attribute__((target("avx512vbmi"))) void kvq_aqlm_lut_build_vbmi(const kvq_cpu_weight *w, const float *x,
                                                                     float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    __m512i pidx = _mm512_loadu_si512(k_planes_idx);
    for (int g = g0; g < g1; g++) {
        __m512 xb[16];
        for (int j = 0; j < ig; j++) xb[j] = _mm512_set1_ps(x[(size_t)g * ig + j]);
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * ig * 256; /* [ig][256] */
            uint8_t *out = (uint8_t *)(lut + ((size_t)(g - g0) * M + m) * 256);
            for (int q = 0; q < 4; q++) { /* entries 64q .. 64q+63 */
                __m512i by[4], pl[4];
                for (int i = 0; i < 4; i++) {
                    __m512 v = table16(ct, xb, ig, 64 * q + 16 * i);
                    by[i] = _mm512_permutexvar_epi8(pidx, _mm512_castps_si512(v));
                }
                lanes4x4(by, pl); /* pl[p] = plane p of these 64 entries */
                for (int p = 0; p < 4; p++) _mm512_store_si512(out + p * 256 + q * 64, pl[p]);
            }
        }
    }
}

__attribute__((target("avx512vbmi"))) void kvq_aqlm_lut_gemv_vbmi(const kvq_cpu_weight *w, const float *lut, int s0,
                                                                    int s1, float *acc, int r0, int r1) {
    size_t S = (size_t)s1, n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    size_t total = (size_t)w->G * w->M; /* the prefetch runs on into the caller's next chunk */
    row_order(acc, n); /* acc in the lookups' row order (below) */
    for (size_t s = (size_t)s0; s < S; s++) {
        const __m512i *tb = (const __m512i *)(lut + (s - (size_t)s0) * 256);
        __m512i t[16];
        for (int i = 0; i < 16; i++) t[i] = _mm512_load_si512(tb + i); /* t[4p + q]: plane p, entries 64q.. */
        const uint8_t *c = codes + s * pad;
        for (size_t i = 0; i < n; i += 64) {
            __m512i idx = _mm512_load_si512(c + i);
            if (s + KVQ_LUT_PREFETCH < total) _mm_prefetch((const char *)(c + KVQ_LUT_PREFETCH * pad + i), _MM_HINT_T0);
            __mmask64 top = _mm512_movepi8_mask(idx);
            __m512i b[4];
            for (int p = 0; p < 4; p++)
                b[p] = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(t[4 * p], idx, t[4 * p + 1]),
                                              _mm512_permutex2var_epi8(t[4 * p + 2], idx, t[4 * p + 3]));
            /* Interleave planes into f32. Per 128-bit lane L, vector k gets rows
             * 16L + 4k .. 16L + 4k + 3 of this 64-row block; the lane transpose at the end undoes it. */
            __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
            __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
            __m512 v[4] = {_mm512_castsi512_ps(_mm512_unpacklo_epi16(lo01, lo23)),
                           _mm512_castsi512_ps(_mm512_unpackhi_epi16(lo01, lo23)),
                           _mm512_castsi512_ps(_mm512_unpacklo_epi16(hi01, hi23)),
                           _mm512_castsi512_ps(_mm512_unpackhi_epi16(hi01, hi23))};
            float *a = acc + i;
            for (int k = 0; k < 4; k++) _mm512_store_ps(a + 16 * k, _mm512_add_ps(_mm512_load_ps(a + 16 * k), v[k]));
        }
    }
    row_order(acc, n); /* back to row order */
}

/* The int8-codebook form (cb8, one codebook) of codeword16, unscaled. */
static inline __attribute__((always_inline)) __m512 codeword16_i8(const int8_t *cb, const uint16_t *c, int g, const int IG) {
    __m128i b;
    if (IG == 16) {
        b = _mm_loadu_si128((const __m128i *)(cb + (size_t)c[g] * 16));
    } else {
        b = _mm_loadl_epi64((const __m128i *)(cb + (size_t)c[g] * 8));
        b = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(b), (const double *)(cb + (size_t)c[g + 1] * 8)));
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

/* Codeword of group g as 16 f32 (sum over the M codebooks): with IG 16 one
 * codeword, with IG 8 groups g and g+1 side by side (the caller steps g by
 * 16/IG). IG and "M is 1" are compile-time, so the common 1x16 case has no
 * codebook loop at all. */
static inline __attribute__((always_inline)) __m512 codeword16(const uint16_t *cb, const uint16_t *c, int g,
                                                               size_t KI, size_t M, const int IG, const int M1) {
    if (IG == 16) {
        const uint16_t *cg = c + (size_t)g * M;
        __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cb + (size_t)cg[0] * 16)));
        if (!M1)
            for (size_t m = 1; m < M; m++)
                v = _mm512_add_ps(v, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cb + m * KI + (size_t)cg[m] * 16))));
        return v;
    }
    const uint16_t *c0 = c + (size_t)g * M, *c1 = c0 + M;
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(cb + (size_t)c0[0] * 8))),
                                        _mm_loadu_si128((const __m128i *)(cb + (size_t)c1[0] * 8)), 1);
    __m512 v = _mm512_cvtph_ps(h);
    if (!M1)
        for (size_t m = 1; m < M; m++) {
            h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(cb + m * KI + (size_t)c0[m] * 8))),
                                        _mm_loadu_si128((const __m128i *)(cb + m * KI + (size_t)c1[m] * 8)), 1);
            v = _mm512_add_ps(v, _mm512_cvtph_ps(h));
        }
    return v;
}

/* One row against T tokens: each codeword fetched once feeds T FMAs; four
 * accumulator sets (16-value chunk u of each 4 uses set u) keep four FMA
 * chains per token in flight. */
static inline __attribute__((always_inline)) void row_gather(const kvq_cpu_weight *w, const uint16_t *c,
                                                             const float *x, float *out, const int T, const int IG,
                                                             const int M1, const int CB8) {
    enum { NS = 4 };
    const uint16_t *cb = w->cb16;
    size_t KI = ((size_t)1 << w->nbits) * IG, cols = (size_t)w->cols, M = M1 ? 1 : (size_t)w->M;
    int G = w->G, step = 16 / IG, g = 0; /* step: groups per 16 values */
    __m512 a[NS][KVQ_GEMV_MAX_T];
    for (int u = 0; u < NS; u++)
        for (int t = 0; t < T; t++) a[u][t] = _mm512_setzero_ps();
    for (; g + NS * step <= G; g += NS * step)
        for (int u = 0; u < NS; u++) {
            int gu = g + u * step;
            __m512 v = CB8 ? codeword16_i8(w->cb8, c, gu, IG) : codeword16(cb, c, gu, KI, M, IG, M1);
            for (int t = 0; t < T; t++)
                a[u][t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + t * cols + (size_t)gu * IG), a[u][t]);
        }
    for (; g + step <= G; g += step) {
        __m512 v = CB8 ? codeword16_i8(w->cb8, c, g, IG) : codeword16(cb, c, g, KI, M, IG, M1);
        for (int t = 0; t < T; t++) a[0][t] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + t * cols + (size_t)g * IG), a[0][t]);
    }
    if (g < G) { /* odd group count with ig 8: one 8-value codeword left */
        __m256 v = CB8 ? _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w->cb8 + (size_t)c[g] * 8))))
                       : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + (size_t)c[g * M] * 8)));
        for (size_t m = 1; m < M; m++)
            v = _mm256_add_ps(v, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + m * KI + (size_t)c[g * M + m] * 8))));
        __m512 v16 = _mm512_insertf32x8(_mm512_setzero_ps(), v, 0);
        for (int t = 0; t < T; t++)
            a[1][t] = _mm512_fmadd_ps(v16, _mm512_maskz_loadu_ps(0xff, x + t * cols + (size_t)g * 8), a[1][t]);
    }
    for (int t = 0; t < T; t++)
        out[t] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0][t], a[1][t]), _mm512_add_ps(a[2][t], a[3][t])));
}

/* Rows [r0, r1) for n tokens with IG / M1 / CB8 (int8 codebook, M1 only) fixed. */
static inline __attribute__((always_inline)) void gather_rows(const kvq_cpu_weight *w, const float *x, int n,
                                                              float *y, int r0, int r1, const int IG, const int M1,
                                                              const int CB8) {
    size_t per_row = (size_t)w->G * w->M, rows = (size_t)w->rows;
    float cs = CB8 ? w->cb8_scale : 1.0f;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * per_row;
        kvq_cb_prefetch_slice(w, o - r0);
        float out[KVQ_GATHER_MAX_T];
        for (int t0 = 0; t0 < n; t0 += KVQ_GEMV_MAX_T) { /* later passes find the row's codewords in L1 */
            const float *xt = x + (size_t)t0 * w->cols;
            switch (n - t0) {
            case 1: row_gather(w, c, xt, out + t0, 1, IG, M1, CB8); break;
            case 2: row_gather(w, c, xt, out + t0, 2, IG, M1, CB8); break;
            case 3: row_gather(w, c, xt, out + t0, 3, IG, M1, CB8); break;
            default: row_gather(w, c, xt, out + t0, 4, IG, M1, CB8); break;
            }
        }
        for (int t = 0; t < n; t++) y[t * rows + (size_t)o] = w->scales[o] * cs * out[t];
    }
}

void kvq_aqlm_gather_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    if (w->cb8)
        w->ig == 8 ? gather_rows(w, x, n, y, r0, r1, 8, 1, 1) : gather_rows(w, x, n, y, r0, r1, 16, 1, 1);
    else if (w->ig == 8)
        w->M == 1 ? gather_rows(w, x, n, y, r0, r1, 8, 1, 0) : gather_rows(w, x, n, y, r0, r1, 8, 0, 0);
    else
        w->M == 1 ? gather_rows(w, x, n, y, r0, r1, 16, 1, 0) : gather_rows(w, x, n, y, r0, r1, 16, 0, 0);
}

/* ---- VBMI with int16 tables (the default LUT path on VBMI CPUs) ----
 * One scale per chunk of steps (decode) or per token (prompts): q =
 * round(T * 32767 / max|T|) over the tables it covers, so a chunk's lookups
 * add up exactly in int32 and only the table rounding is lost:
 * |error of an output| <= scale_o * S * max|T| / 65534 for S steps
 * (typically rel L2 ~4e-5; tests/test_matmul.c holds it to KVQ_LUT_I16_REL_L2).
 * A step's table is two byte planes (low and high bytes of the 256 int16),
 * 512 bytes. Two steps are looked up together (lookup_pair): half the
 * shuffles of the f32 tables above, and with VNNI doing the widening the
 * shuffle port is left to the lookups (1.24x the lookup rate of byte
 * unpacks + vpmaddwd, measured in L2 on Sapphire Rapids). */

float kvq_aqlm_lutq_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    return w->ig == 8 ? build_f32(w, x, lut, g0, g1, g0, 8, 1) : build_f32(w, x, lut, g0, g1, g0, w->ig, 1);
}

/* After packs_epi32 of entries (0..15, 16..31) and (32..47, 48..63), byte
 * offset in that 128-byte pair of the low byte of entry e (128-bit lanes
 * interleave 4 entries of each source). */
static const uint8_t k_pack_lo_idx[64] = {
    0,  2,  4,  6,  16, 18, 20, 22, 32, 34, 36, 38, 48, 50,  52,  54,  8,  10, 12, 14, 24, 26,
    28, 30, 40, 42, 44, 46, 56, 58, 60, 62, 64, 66, 68, 70, 80, 82, 84, 86, 96, 98, 100, 102,
    112, 114, 116, 118, 72, 74, 76, 78, 88, 90, 92, 94, 104, 106, 108, 110, 120, 122, 124, 126,
};

__attribute__((target("avx512vbmi"))) void kvq_aqlm_lutq_pack_vbmi(const kvq_cpu_weight *w, const float *lut,
                                                                     float inv_scale, void *qlut, size_t pair_stride,
                                                                     int g0, int g1) {
    __m512i lo = _mm512_loadu_si512(k_pack_lo_idx), hi = _mm512_add_epi8(lo, _mm512_set1_epi8(1));
    __m512 inv = _mm512_set1_ps(inv_scale);
    for (size_t s = 0; s < (size_t)(g1 - g0) * w->M; s++) {
        const float *src = lut + s * 256;
        uint8_t *dst = (uint8_t *)qlut + s / 2 * pair_stride + (s & 1) * 512;
        for (int q = 0; q < 4; q++) {
            __m512i v[4];
            for (int i = 0; i < 4; i++) v[i] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(src + 64 * q + 16 * i), inv));
            /* |v| <= 32767 by the choice of inv_scale; packs saturates anything else (NaN) */
            __m512i a = _mm512_packs_epi32(v[0], v[1]), b = _mm512_packs_epi32(v[2], v[3]);
            _mm512_store_si512(dst + 64 * q, _mm512_permutex2var_epi8(a, lo, b));       /* low bytes */
            _mm512_store_si512(dst + 256 + 64 * q, _mm512_permutex2var_epi8(a, hi, b)); /* high bytes */
        }
    }
}

/* 64 bytes looked up in a 256-entry byte plane (4 zmm): codes below 128 in
 * the first pair, then the others, each permute merging into the lanes the
 * other left (vpermi2b keeps the index byte where its mask is clear). */
#define KVQ_PLANE_LOOKUP(t, idx, top) \
    _mm512_mask2_permutex2var_epi8((t)[2], _mm512_mask2_permutex2var_epi8((t)[0], idx, ~(top), (t)[1]), top, (t)[3])

/* Tables of steps s, s+1 (512 bytes each; t[8..15] zero past the last step) into registers. */
static inline __attribute__((always_inline)) void load_pair(__m512i t[16], const uint8_t *q, int has_b) {
    const __m512i *ta = (const __m512i *)q;
    for (int i = 0; i < 8; i++) t[i] = _mm512_load_si512(ta + i);
    for (int i = 0; i < 8; i++) t[8 + i] = has_b ? _mm512_load_si512(ta + 8 + i) : _mm512_setzero_si512();
}

/* acc[64 rows] += table_A[ca] + table_B[cb] for one 64-row block. The byte
 * planes become int16 words without byte unpacks (port-5 bound): even rows
 * are lo | hi << 8, odd rows lo >> 8 | hi & 0xff00; vpdpwssd against 1 in the
 * low or high word then sign-extends and adds one word per int32 lane. So
 * acc vector j, lane k holds row 4k + (0, 2, 1, 3)[j]; acc_to_f32 undoes it. */
static inline __attribute__((always_inline, target("avx512vbmi,avx512vnni"))) void
lookup_pair(const __m512i t[16], const uint8_t *ca, const uint8_t *cb, int32_t *a) {
    const __m512i m = _mm512_set1_epi16(0x00ff), w_lo = _mm512_set1_epi32(1), w_hi = _mm512_set1_epi32(0x10000);
    __m512i ia = _mm512_load_si512(ca), ib = _mm512_load_si512(cb);
    __mmask64 ma = _mm512_movepi8_mask(ia), mb = _mm512_movepi8_mask(ib);
    __m512i alo = KVQ_PLANE_LOOKUP(t, ia, ma), ahi = KVQ_PLANE_LOOKUP(t + 4, ia, ma);
    __m512i blo = KVQ_PLANE_LOOKUP(t + 8, ib, mb), bhi = KVQ_PLANE_LOOKUP(t + 12, ib, mb);
    /* ternlog 0xea: (m & x) | y; 0xce: x | (~m & y) */
    __m512i ae = _mm512_ternarylogic_epi32(m, alo, _mm512_slli_epi16(ahi, 8), 0xea);
    __m512i ao = _mm512_ternarylogic_epi32(m, _mm512_srli_epi16(alo, 8), ahi, 0xce);
    __m512i be = _mm512_ternarylogic_epi32(m, blo, _mm512_slli_epi16(bhi, 8), 0xea);
    __m512i bo = _mm512_ternarylogic_epi32(m, _mm512_srli_epi16(blo, 8), bhi, 0xce);
    __m512i *v = (__m512i *)a;
    v[0] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(v[0], ae, w_lo), be, w_lo);
    v[1] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(v[1], ae, w_hi), be, w_hi);
    v[2] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(v[2], ao, w_lo), bo, w_lo);
    v[3] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(v[3], ao, w_hi), bo, w_hi);
}

/* Row order from lookup_pair's: pairs (rows 4k, 4k+1) and (4k+2, 4k+3), then
 * four rows at a time from each. */
static const int32_t k_rows_pair[2][16] = {
    {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23},
    {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31},
};
static const int32_t k_rows_quad[2][16] = {
    {0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23},
    {8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31},
};

/* n rows of int32 sums (lookup_pair order, n a multiple of 64) -> row order,
 * times scale, into out (ADD: added to it). */
static inline __attribute__((always_inline)) void acc_to_f32(const int32_t *acc, float scale, float *out, size_t n,
                                                             const int ADD) {
    __m512 sc = _mm512_set1_ps(scale);
    __m512i p0 = _mm512_loadu_si512(k_rows_pair[0]), p1 = _mm512_loadu_si512(k_rows_pair[1]);
    __m512i q0 = _mm512_loadu_si512(k_rows_quad[0]), q1 = _mm512_loadu_si512(k_rows_quad[1]);
    for (size_t i = 0; i < n; i += 64) {
        const __m512i *a = (const __m512i *)(acc + i);
        __m512i r01a = _mm512_permutex2var_epi32(a[0], p0, a[2]), r01b = _mm512_permutex2var_epi32(a[0], p1, a[2]);
        __m512i r23a = _mm512_permutex2var_epi32(a[1], p0, a[3]), r23b = _mm512_permutex2var_epi32(a[1], p1, a[3]);
        __m512i o[4] = {_mm512_permutex2var_epi32(r01a, q0, r23a), _mm512_permutex2var_epi32(r01a, q1, r23a),
                        _mm512_permutex2var_epi32(r01b, q0, r23b), _mm512_permutex2var_epi32(r01b, q1, r23b)};
        for (int k = 0; k < 4; k++) {
            __m512 v = _mm512_cvtepi32_ps(o[k]), *dst = (__m512 *)(out + i + 16 * k);
            *dst = ADD ? _mm512_fmadd_ps(sc, v, *dst) : _mm512_mul_ps(sc, v);
        }
    }
}

/* Steps [s0, s1) (a chunk of the steps in decode: its codes are one
 * sequential run) for rows [r0, r1). */
__attribute__((target("avx512vbmi,avx512vnni"))) void kvq_aqlm_lutq_gemv_vbmi(const kvq_cpu_weight *w, const void *qlut,
                                                                                 int s0, int s1, float scale,
                                                                                 int32_t *acc, float *out, int r0,
                                                                                 int r1) {
    size_t n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    for (size_t i = 0; i < n; i += 16) _mm512_store_si512(acc + i, _mm512_setzero_si512());
    for (int s = s0; s < s1; s += 2) {
        int has_b = s + 1 < s1; /* odd end: the last step pairs with an all-zero table */
        __m512i t[16];
        load_pair(t, (const uint8_t *)qlut + (size_t)(s - s0) * 512, has_b);
        const uint8_t *ca = codes + (size_t)s * pad, *cb = has_b ? ca + pad : ca;
        int pf = s + 3 + KVQ_LUT_PREFETCH < s1;
        for (size_t i = 0; i < n; i += 64) {
            if (pf) { /* into L2: L1 misses are better left to the line fill buffers */
                _mm_prefetch((const char *)(ca + (2 + KVQ_LUT_PREFETCH) * pad + i), _MM_HINT_T1);
                _mm_prefetch((const char *)(cb + (2 + KVQ_LUT_PREFETCH) * pad + i), _MM_HINT_T1);
            }
            lookup_pair(t, ca + i, cb + i, acc + i);
        }
    }
    acc_to_f32(acc, scale, out, n, 1);
}

/* The prompt kernels' prefetch: codes of the step pair after next, nb rows from ca, into L1. */
static inline __attribute__((always_inline)) void prefetch_pair_ahead(const uint8_t *ca, size_t pad, size_t nb) {
    for (size_t i = 0; i < nb; i += 64) {
        _mm_prefetch((const char *)(ca + 4 * pad + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(ca + 5 * pad + i), _MM_HINT_T0);
    }
}

/* yt[o] = scales[o] * v[o - b0] for rows [b0, end): a prompt kernel's block of outputs. */
static inline __attribute__((always_inline)) void store_block(const kvq_cpu_weight *w, const float *v, float *yt, int b0,
                                                              int end) {
    for (int o = b0; o < end; o += 16) {
        __mmask16 m = end - o >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - o)) - 1u);
        _mm512_mask_storeu_ps(yt + o, m, _mm512_mul_ps(_mm512_load_ps(w->scales + o), _mm512_load_ps(v + (o - b0))));
    }
}

/* Many tokens per pass over the codes (prompts): rows in blocks of
 * KVQ_LUTQ_BLOCK, within a block every step pair is looked up for all nt
 * tokens while its codes sit in L1, so the codes are read once per call and
 * the kernel runs at the lookup rate instead of the memory rate. The tables
 * of one step pair for all tokens are adjacent (pair_stride = nt KB), so a
 * block streams them in order; the int32 sums (nt x block) stay in L1. */
#define KVQ_LUTQ_BLOCK 4096
__attribute__((target("avx512vbmi,avx512vnni"))) void kvq_aqlm_lutq_gemm_vbmi(const kvq_cpu_weight *w, const void *qluts,
                                                                     size_t pair_stride, const float *scales, int nt,
                                                                     float *y, size_t ldy, int r0, int r1) {
    size_t S = (size_t)w->G * w->M, pad = (size_t)w->rows_pad;
    _Alignas(64) int32_t acc[KVQ_LUTQ_MAX_T * KVQ_LUTQ_BLOCK];
    _Alignas(64) float out[KVQ_LUTQ_BLOCK];
    for (int b0 = r0; b0 < r1; b0 += KVQ_LUTQ_BLOCK) {
        size_t nb = (size_t)(r1 - b0 < KVQ_LUTQ_BLOCK ? r1 - b0 : KVQ_LUTQ_BLOCK);
        const uint8_t *codes = (const uint8_t *)w->codes + b0;
        memset(acc, 0, sizeof(int32_t) * KVQ_LUTQ_BLOCK * (size_t)nt);
        for (size_t s = 0; s < S; s += 2) {
            int has_b = s + 1 < S;
            const uint8_t *ca = codes + s * pad, *cb = has_b ? ca + pad : ca;
            if (s + 6 < S) prefetch_pair_ahead(ca, pad, nb);
            for (int t = 0; t < nt; t++) {
                __m512i tb[16];
                load_pair(tb, (const uint8_t *)qluts + s / 2 * pair_stride + (size_t)t * 1024, has_b);
                int32_t *a = acc + (size_t)t * KVQ_LUTQ_BLOCK;
                for (size_t i = 0; i < nb; i += 64) lookup_pair(tb, ca + i, cb + i, a + i);
            }
        }
        int end = b0 + (int)nb < w->rows ? b0 + (int)nb : w->rows;
        for (int t = 0; t < nt; t++) {
            acc_to_f32(acc + (size_t)t * KVQ_LUTQ_BLOCK, scales[t], out, nb, 0);
            store_block(w, out, y + (size_t)t * ldy, b0, end);
        }
    }
}

/* ---- VBMI with int8 tables (opt-in, kvq_weight_desc.lut8) ----
 * One byte per entry, q = round(T * 127 / max|T|) (per chunk of steps in
 * decode, per token in prompts), stored biased as q + 128 so that rows add up
 * as unsigned words: half the byte permutes of the int16 tables and no
 * widening multiplies (a mask or a shift splits 64 rows into even and odd).
 * 1.46x the lookup rate of int16 tables with the codes in cache (Zen 5, one
 * thread, 4096x4096); decode streaming from DRAM gains nothing there, prompts
 * (lookup-bound) do. Lossy: |error of an output| <= scale_o * S * max|T| / 254
 * for S steps (rel L2 ~5e-3 on random data; tests/test_matmul.c holds it to
 * KVQ_LUT_I8_REL_L2). Unsigned words hold 256 lookups: sums are carried into
 * int32 (or f32) every KVQ_LUT8_STEPS steps. */
#define KVQ_LUT8_STEPS 128

__attribute__((target("avx512vbmi"))) void kvq_aqlm_lut8_pack_vbmi(const kvq_cpu_weight *w, const float *lut,
                                                                     float inv_scale, void *qlut, size_t pair_stride,
                                                                     int g0, int g1) {
    __m512 inv = _mm512_set1_ps(inv_scale);
    const __m128i bias = _mm_set1_epi8((char)0x80);
    for (size_t s = 0; s < (size_t)(g1 - g0) * w->M; s++) {
        const float *src = lut + s * 256;
        uint8_t *dst = (uint8_t *)qlut + s / 2 * pair_stride + (s & 1) * 256;
        for (int c = 0; c < 256; c += 16) {
            /* |q| <= 127 by the choice of inv_scale; vpmovsdb saturates anything else (NaN) */
            __m128i q = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(src + c), inv)));
            _mm_store_si128((__m128i *)(dst + c), _mm_xor_si128(q, bias));
        }
    }
}

/* Tables of steps s, s+1 (256 bytes each; a table of biased zeros past the last step). */
static inline __attribute__((always_inline)) void load_pair8(__m512i t[8], const uint8_t *q, int has_b) {
    const __m512i *ta = (const __m512i *)q;
    for (int i = 0; i < 4; i++) t[i] = _mm512_load_si512(ta + i);
    for (int i = 0; i < 4; i++) t[4 + i] = has_b ? _mm512_load_si512(ta + 4 + i) : _mm512_set1_epi8((char)0x80);
}

/* 64 rows of word sums at a (32 even rows, then 32 odd rows) += table_A[ca] + table_B[cb]. */
static inline __attribute__((always_inline, target("avx512vbmi"))) void lookup_pair8(const __m512i t[8],
                                                                                      const uint8_t *ca,
                                                                                      const uint8_t *cb, uint16_t *a) {
    const __m512i m = _mm512_set1_epi16(0x00ff);
    __m512i ia = _mm512_load_si512(ca), ib = _mm512_load_si512(cb);
    __mmask64 ma = _mm512_movepi8_mask(ia), mb = _mm512_movepi8_mask(ib);
    __m512i A = KVQ_PLANE_LOOKUP(t, ia, ma), B = KVQ_PLANE_LOOKUP(t + 4, ib, mb);
    __m512i *v = (__m512i *)a;
    v[0] = _mm512_add_epi16(v[0], _mm512_add_epi16(_mm512_and_si512(A, m), _mm512_and_si512(B, m)));
    v[1] = _mm512_add_epi16(v[1], _mm512_add_epi16(_mm512_srli_epi16(A, 8), _mm512_srli_epi16(B, 8)));
}

/* 64 rows of word sums (even rows, then odd rows) less the bias of `steps`
 * lookups, as int32 in row order. */
static inline __attribute__((always_inline)) void sums8_rows(const uint16_t *a, int steps, __m512i r[4]) {
    const __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    __m512i e = _mm512_load_si512(a), o = _mm512_load_si512(a + 32), bias = _mm512_set1_epi32(128 * steps);
    /* per 128-bit lane l: lo holds rows 16l..16l+7, hi rows 16l+8..16l+15 */
    __m512i lo = _mm512_unpacklo_epi16(e, o), hi = _mm512_unpackhi_epi16(e, o);
    __m512i h[2] = {_mm512_permutex2var_epi64(lo, i0, hi), _mm512_permutex2var_epi64(lo, i1, hi)};
    for (int k = 0; k < 4; k++) {
        __m256i x = k & 1 ? _mm512_extracti64x4_epi64(h[k / 2], 1) : _mm512_castsi512_si256(h[k / 2]);
        r[k] = _mm512_sub_epi32(_mm512_cvtepu16_epi32(x), bias);
    }
}

/* Steps [s0, s1) for rows [r0, r1), as kvq_aqlm_lutq_gemv_vbmi with int8 tables. */
__attribute__((target("avx512vbmi"))) void kvq_aqlm_lut8_gemv_vbmi(const kvq_cpu_weight *w, const void *qlut, int s0,
                                                                     int s1, float scale, int32_t *acc, float *out, int r0,
                                                                     int r1) {
    size_t n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    uint16_t *a16 = (uint16_t *)acc;
    for (size_t i = 0; i < n; i += 32) _mm512_store_si512(a16 + i, _mm512_setzero_si512());
    for (int s = s0; s < s1; s += 2) {
        int has_b = s + 1 < s1;
        __m512i t[8];
        load_pair8(t, (const uint8_t *)qlut + (size_t)(s - s0) * 256, has_b);
        const uint8_t *ca = codes + (size_t)s * pad, *cb = has_b ? ca + pad : ca;
        int pf = s + 3 + KVQ_LUT_PREFETCH < s1;
        for (size_t i = 0; i < n; i += 64) {
            if (pf) {
                _mm_prefetch((const char *)(ca + (2 + KVQ_LUT_PREFETCH) * pad + i), _MM_HINT_T1);
                _mm_prefetch((const char *)(cb + (2 + KVQ_LUT_PREFETCH) * pad + i), _MM_HINT_T1);
            }
            lookup_pair8(t, ca + i, cb + i, a16 + i);
        }
    }
    __m512 sc = _mm512_set1_ps(scale);
    for (size_t i = 0; i < n; i += 64) {
        __m512i r[4];
        sums8_rows(a16 + i, (s1 - s0 + 1) & ~1, r);
        for (int k = 0; k < 4; k++) {
            __m512 *dst = (__m512 *)(out + i + 16 * k);
            *dst = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(r[k]), *dst);
        }
    }
}

/* lutq_gemm with int8 tables: the same blocking, plus word sums per
 * KVQ_LUT8_STEPS steps carried into the int32 ones. */
#define KVQ_LUT8_BLOCK 2048
__attribute__((target("avx512vbmi"))) void kvq_aqlm_lut8_gemm_vbmi(const kvq_cpu_weight *w, const void *qluts,
                                                                     size_t pair_stride, const float *scales, int nt,
                                                                     float *y, size_t ldy, int r0, int r1) {
    size_t S = (size_t)w->G * w->M, pad = (size_t)w->rows_pad;
    _Alignas(64) int32_t acc[KVQ_LUTQ_MAX_T * KVQ_LUT8_BLOCK];
    _Alignas(64) uint16_t a16[KVQ_LUTQ_MAX_T * KVQ_LUT8_BLOCK];
    _Alignas(64) float out[KVQ_LUT8_BLOCK];
    for (int b0 = r0; b0 < r1; b0 += KVQ_LUT8_BLOCK) {
        size_t nb = (size_t)(r1 - b0 < KVQ_LUT8_BLOCK ? r1 - b0 : KVQ_LUT8_BLOCK);
        const uint8_t *codes = (const uint8_t *)w->codes + b0;
        memset(acc, 0, sizeof(int32_t) * KVQ_LUT8_BLOCK * (size_t)nt);
        for (size_t sc = 0; sc < S; sc += KVQ_LUT8_STEPS) {
            size_t se = sc + KVQ_LUT8_STEPS < S ? sc + KVQ_LUT8_STEPS : S;
            memset(a16, 0, sizeof(uint16_t) * KVQ_LUT8_BLOCK * (size_t)nt);
            for (size_t s = sc; s < se; s += 2) {
                int has_b = s + 1 < se;
                const uint8_t *ca = codes + s * pad, *cb = has_b ? ca + pad : ca;
                if (s + 6 < S) prefetch_pair_ahead(ca, pad, nb);
                for (int t = 0; t < nt; t++) {
                    __m512i tb[8];
                    load_pair8(tb, (const uint8_t *)qluts + s / 2 * pair_stride + (size_t)t * 512, has_b);
                    uint16_t *a = a16 + (size_t)t * KVQ_LUT8_BLOCK;
                    for (size_t i = 0; i < nb; i += 64) lookup_pair8(tb, ca + i, cb + i, a + i);
                }
            }
            for (int t = 0; t < nt; t++)
                for (size_t i = 0; i < nb; i += 64) {
                    __m512i r[4], *dst = (__m512i *)(acc + (size_t)t * KVQ_LUT8_BLOCK + i);
                    sums8_rows(a16 + (size_t)t * KVQ_LUT8_BLOCK + i, (int)((se - sc + 1) & ~(size_t)1), r);
                    for (int k = 0; k < 4; k++) dst[k] = _mm512_add_epi32(dst[k], r[k]);
                }
        }
        int end = b0 + (int)nb < w->rows ? b0 + (int)nb : w->rows;
        for (int t = 0; t < nt; t++) {
            __m512 sc = _mm512_set1_ps(scales[t]);
            const int32_t *at = acc + (size_t)t * KVQ_LUT8_BLOCK;
            for (size_t i = 0; i < nb; i += 16)
                _mm512_store_ps(out + i, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_load_si512(at + i))));
            store_block(w, out, y + (size_t)t * ldy, b0, end);
        }
    }
}
