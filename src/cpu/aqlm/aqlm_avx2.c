/* AVX2/FMA AQLM kernels (layouts and the math: aqlm/aqlm.c). The LUT path
 * gathers 8 rows' table entries per vpgatherdd (or, on AMD, looks them up
 * with plain loads); the codeword path widens one
 * 8-value fp16 codeword per group and FMAs it with x. */
#include <immintrin.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void kvq_aqlm_lut_build_avx2(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    for (int g = g0; g < g1; g++) {
        __m256 xb[16];
        for (int j = 0; j < ig; j++) xb[j] = _mm256_broadcast_ss(x + (size_t)g * ig + j);
        for (int m = 0; m < M; m++) {
            const float *ct = w->cb_t + (size_t)m * ig * 256; /* [ig][256]: entry c of coordinate j */
            float *l = lut + ((size_t)(g - g0) * M + m) * 256;
            for (int c = 0; c < 256; c += 8) {
                __m256 a0 = _mm256_mul_ps(_mm256_load_ps(ct + c), xb[0]);
                __m256 a1 = _mm256_mul_ps(_mm256_load_ps(ct + 256 + c), xb[1]);
                for (int j = 2; j < ig; j += 2) {
                    a0 = _mm256_fmadd_ps(_mm256_load_ps(ct + (size_t)j * 256 + c), xb[j], a0);
                    a1 = _mm256_fmadd_ps(_mm256_load_ps(ct + (size_t)(j + 1) * 256 + c), xb[j + 1], a1);
                }
                _mm256_store_ps(l + c, _mm256_add_ps(a0, a1));
            }
        }
    }
}

/* 8 rows' entries of one step's table. */
static inline __m256 look8(const float *l, const uint8_t *c) {
    return _mm256_i32gather_ps(l, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c)), 4);
}

/* lut_gemv with plain loads instead of gathers, for CPUs whose gathers are
 * slow (AMD's are microcoded; Intel's since the Gather Data Sampling
 * microcode fix). Bit for bit kvq_aqlm_lut_gemv_avx2: a row's steps are
 * added four at a time from s0 (((T0 + T1) + T2) + T3, then into acc), the
 * last s1 - s0 mod 4 one by one, so the dispatcher may time the two and keep
 * the faster (cpu_matmul.c). 8 rows' sums stay in registers across 8 steps;
 * each step's 8 codes are one 64-bit load and the table entries scalar loads
 * folded into the adds, so the load ports do about one lookup per load.
 * Steps go 8 at a time because a step's codes are rows_pad bytes apart, 4 KB
 * for 4096 rows: 16 of them share one L1 set and evicted each other. The
 * prefetch runs 4 row blocks ahead in each step of the chunk, and for the
 * last blocks into the caller's next chunk. */
#define KVQ_LUT_ROWS_AHEAD 4
#define KVQ_LUT_ROWS_STEPS 8
/* One step's 8 lookups: e[k] = l[byte k of v]. */
#define LOOK8(e, l, v)                                                                                                  \
    do {                                                                                                               \
        uint64_t v_ = (v);                                                                                             \
        e[0] = (l)[v_ & 255], e[1] = (l)[(v_ >> 8) & 255], e[2] = (l)[(v_ >> 16) & 255], e[3] = (l)[(v_ >> 24) & 255]; \
        e[4] = (l)[(v_ >> 32) & 255], e[5] = (l)[(v_ >> 40) & 255], e[6] = (l)[(v_ >> 48) & 255], e[7] = (l)[v_ >> 56]; \
    } while (0)
static inline uint64_t ld8(const uint8_t *c) {
    uint64_t v;
    memcpy(&v, c, 8);
    return v;
}
void kvq_aqlm_lut_gemv_rows(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1) {
    size_t n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad, ns = (size_t)(s1 - s0), total = (size_t)w->G * w->M;
    size_t n4 = ns / 4 * 4; /* steps below n4 go in fours, the rest one by one */
    const uint8_t *codes = (const uint8_t *)w->codes + r0 + (size_t)s0 * pad;
    for (size_t i0 = 0; i0 < n; i0 += 64) {
        size_t ia = i0 + KVQ_LUT_ROWS_AHEAD * 64;
        if (ia < n)
            for (size_t s = 0; s < ns; s++) _mm_prefetch((const char *)(codes + s * pad + ia), _MM_HINT_T0);
        else if ((size_t)s1 + ns <= total) /* the same rows of the next chunk's steps */
            for (size_t s = 0; s < ns; s++) _mm_prefetch((const char *)(codes + (ns + s) * pad + ia - n), _MM_HINT_T0);
        for (size_t sb = 0; sb < ns; sb += KVQ_LUT_ROWS_STEPS) {
            size_t se = sb + KVQ_LUT_ROWS_STEPS < ns ? sb + KVQ_LUT_ROWS_STEPS : ns;
            for (size_t i = i0; i < i0 + 64; i += 8) {
                float a[8], t[8], e[8];
                for (int k = 0; k < 8; k++) a[k] = acc[i + (size_t)k];
                const uint8_t *c = codes + i + sb * pad;
                const float *l = lut + sb * 256;
                size_t s = sb;
                for (; s + 4 <= se && s + 4 <= n4; s += 4, c += 4 * pad, l += 1024) {
                    LOOK8(t, l, ld8(c));
                    LOOK8(e, l + 256, ld8(c + pad));
                    for (int k = 0; k < 8; k++) t[k] += e[k];
                    LOOK8(e, l + 512, ld8(c + 2 * pad));
                    for (int k = 0; k < 8; k++) t[k] += e[k];
                    LOOK8(e, l + 768, ld8(c + 3 * pad));
                    for (int k = 0; k < 8; k++) a[k] += t[k] + e[k];
                    /* keeps the compiler from packing the sums into vectors (an insert
                     * per load: the shuffle port became the limit) */
                    __asm__("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]), "+x"(a[6]),
                            "+x"(a[7]));
                }
                for (; s < se; s++, c += pad, l += 256) {
                    LOOK8(e, l, ld8(c));
                    for (int k = 0; k < 8; k++) a[k] += e[k];
                    __asm__("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]), "+x"(a[6]),
                            "+x"(a[7]));
                }
                for (int k = 0; k < 8; k++) acc[i + (size_t)k] = a[k];
            }
        }
    }
}

void kvq_aqlm_lut_gemv_avx2(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1) {
    size_t S = (size_t)s1, n = (size_t)(r1 - r0), pad = (size_t)w->rows_pad, s = (size_t)s0;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    /* Four steps per pass over acc: four 1 KB tables stay in L1, and the
     * gathers (load-port bound) share each acc load four ways. The prefetch
     * runs past s1 (the caller's next chunk), up to the matrix's last step. */
    size_t total = (size_t)w->G * w->M;
    for (; s + 4 <= S; s += 4) {
        const float *l = lut + (s - (size_t)s0) * 256;
        const uint8_t *c = codes + s * pad;
        int pf = s + 4 + KVQ_LUT_AHEAD <= total;
        for (size_t i0 = 0; i0 < n; i0 += 64) {
            if (pf)
                for (size_t k = 0; k < 4; k++)
                    _mm_prefetch((const char *)(c + (KVQ_LUT_AHEAD + k) * pad + i0), _MM_HINT_T0);
            for (size_t i = i0; i < i0 + 64; i += 32) {
                /* one 32-byte load per step; the gathers' indices are widened
                 * from registers (saves a load per gather; loads are the limit) */
                __m256 v[4];
                for (int k = 0; k < 4; k++) {
                    __m256i cc = _mm256_load_si256((const __m256i *)(c + (size_t)k * pad + i));
                    __m128i lo = _mm256_castsi256_si128(cc), hi = _mm256_extracti128_si256(cc, 1);
                    const float *lk = l + 256 * k;
                    __m256 a0 = _mm256_i32gather_ps(lk, _mm256_cvtepu8_epi32(lo), 4);
                    __m256 a1 = _mm256_i32gather_ps(lk, _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo)), 4);
                    __m256 a2 = _mm256_i32gather_ps(lk, _mm256_cvtepu8_epi32(hi), 4);
                    __m256 a3 = _mm256_i32gather_ps(lk, _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi)), 4);
                    if (k == 0) {
                        v[0] = a0, v[1] = a1, v[2] = a2, v[3] = a3;
                    } else {
                        v[0] = _mm256_add_ps(v[0], a0), v[1] = _mm256_add_ps(v[1], a1);
                        v[2] = _mm256_add_ps(v[2], a2), v[3] = _mm256_add_ps(v[3], a3);
                    }
                }
                for (int q = 0; q < 4; q++)
                    _mm256_store_ps(acc + i + 8 * q, _mm256_add_ps(_mm256_load_ps(acc + i + 8 * q), v[q]));
            }
        }
    }
    for (; s < S; s++) {
        const float *l = lut + (s - (size_t)s0) * 256;
        const uint8_t *c = codes + s * pad;
        for (size_t i = 0; i < n; i += 8) _mm256_store_ps(acc + i, _mm256_add_ps(_mm256_load_ps(acc + i), look8(l, c + i)));
    }
}

/* 8 fp16 codebook values at element i, widened. */
static inline __m256 cw8(const uint16_t *cb, size_t i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + i))); }
/* 8 int8 codebook values (cb8, unscaled) at element i, widened. */
static inline __m256 cw8_i8(const int8_t *cb, size_t i) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(cb + i))));
}

/* Codeword of group g (sum over the M codebooks), 8 values from element h.
 * M1 (compile-time "M is 1") drops the codebook loop for the common 1x16. */
static inline __attribute__((always_inline)) __m256 codeword8(const uint16_t *cb, const uint16_t *c, int g, size_t KI,
                                                              size_t M, size_t ig, size_t h, const int M1) {
    const uint16_t *cg = c + (size_t)g * M;
    __m256 v = cw8(cb, (size_t)cg[0] * ig + h);
    if (!M1)
        for (size_t m = 1; m < M; m++) v = _mm256_add_ps(v, cw8(cb, m * KI + (size_t)cg[m] * ig + h));
    return v;
}

/* One row against T <= 2 tokens: each codeword fetched once feeds T FMAs.
 * NS accumulator sets (groups g+u use set u) keep NS FMA chains per token in
 * flight. Always 4, so a token's sums are added in the same order whatever
 * the batch (2 tokens x 4 sets fit the 16 registers; callers pass a row's
 * tokens 2 at a time). IG and M1 are compile-time. */
static inline __attribute__((always_inline)) void row_gather(const kvq_cpu_weight *w, const uint16_t *c,
                                                             const float *x, float *out, const int T, const int IG,
                                                             const int M1, const int CB8) {
    enum { NSMAX = 4, NS = 4 };
    const uint16_t *cb = w->cb16;
    size_t KI = ((size_t)1 << w->nbits) * IG, cols = (size_t)w->cols, M = M1 ? 1 : (size_t)w->M;
    int G = w->G, g = 0;
    __m256 a[NSMAX][2];
    for (int u = 0; u < NS; u++)
        for (int t = 0; t < T; t++) a[u][t] = _mm256_setzero_ps();
    for (; g + NS <= G; g += NS)
        for (int u = 0; u < NS; u++)
            for (int h = 0; h < IG; h += 8) {
                __m256 v = CB8 ? cw8_i8(w->cb8, (size_t)c[g + u] * IG + (size_t)h) : codeword8(cb, c, g + u, KI, M, IG, (size_t)h, M1);
                for (int t = 0; t < T; t++)
                    a[u][t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + t * cols + (size_t)(g + u) * IG + h), a[u][t]);
            }
    for (; g < G; g++)
        for (int h = 0; h < IG; h += 8) {
            __m256 v = CB8 ? cw8_i8(w->cb8, (size_t)c[g] * IG + (size_t)h) : codeword8(cb, c, g, KI, M, IG, (size_t)h, M1);
            for (int t = 0; t < T; t++)
                a[0][t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + t * cols + (size_t)g * IG + h), a[0][t]);
        }
    for (int t = 0; t < T; t++) {
        __m256 s = a[0][t];
        for (int u = 1; u < NS; u++) s = _mm256_add_ps(s, a[u][t]);
        out[t] = hsum8(s);
    }
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
        for (int t0 = 0; t0 < n; t0 += 2) { /* later passes find the row's codewords in L1 */
            const float *xt = x + (size_t)t0 * w->cols;
            if (n - t0 == 1)
                row_gather(w, c, xt, out + t0, 1, IG, M1, CB8);
            else
                row_gather(w, c, xt, out + t0, 2, IG, M1, CB8);
        }
        for (int t = 0; t < n; t++) y[t * rows + (size_t)o] = w->scales[o] * cs * out[t];
    }
}

void kvq_aqlm_gather_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    if (w->cb8)
        w->ig == 8 ? gather_rows(w, x, n, y, r0, r1, 8, 1, 1) : gather_rows(w, x, n, y, r0, r1, 16, 1, 1);
    else if (w->ig == 8)
        w->M == 1 ? gather_rows(w, x, n, y, r0, r1, 8, 1, 0) : gather_rows(w, x, n, y, r0, r1, 8, 0, 0);
    else
        w->M == 1 ? gather_rows(w, x, n, y, r0, r1, 16, 1, 0) : gather_rows(w, x, n, y, r0, r1, 16, 0, 0);
}

/* LUT layout: a step's codes are contiguous across rows, so codes of one row
 * are rows_pad bytes apart (often a multiple of 4 KB: one L1 set). Per block
 * of 64 rows and chunk of groups, first copy the codes row-major into a small
 * local array (each code line read once, fully), then write rows sequentially. */
static void rows_lut(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    enum { RB = 64, GC = 32 };
    uint8_t loc[RB][GC * 8]; /* [row][g*M + m] for this chunk; M <= 8 */
    size_t ig = (size_t)w->ig, pad = (size_t)w->rows_pad, M = (size_t)w->M, G = (size_t)w->G;
    const uint8_t *codes = w->codes;
    for (int b0 = r0; b0 < r1; b0 += RB) {
        int nb = r1 - b0 < RB ? r1 - b0 : RB;
        for (size_t g0 = 0; g0 < G; g0 += GC) {
            size_t gc = G - g0 < GC ? G - g0 : GC;
            /* Code lines are 4 KB-strided: no hardware prefetch. Ask for the
             * next chunk's lines now; they arrive while this chunk is written. */
            if (g0 + GC < G)
                for (size_t s = 0; s < (G - g0 - GC < GC ? G - g0 - GC : GC) * M; s++)
                    _mm_prefetch((const char *)(codes + ((g0 + GC) * M + s) * pad + (size_t)b0), _MM_HINT_T0);
            for (size_t s = 0; s < gc * M; s++) {
                const uint8_t *line = codes + (g0 * M + s) * pad + (size_t)b0;
                for (int i = 0; i < nb; i++) loc[i][s] = line[i];
            }
            for (int i = 0; i < nb; i++) {
                int o = b0 + i;
                float *dst = out + (size_t)(o - r0) * w->cols + g0 * ig;
                __m256 sc = _mm256_set1_ps(w->scales[o]);
                for (size_t g = 0; g < gc; g++)
                    for (size_t h = 0; h < ig; h += 8) {
                        __m256 v = _mm256_load_ps(w->cb + (size_t)loc[i][g * M] * ig + h);
                        for (size_t m = 1; m < M; m++)
                            v = _mm256_add_ps(v, _mm256_load_ps(w->cb + (m * 256 + loc[i][g * M + m]) * ig + h));
                        _mm256_storeu_ps(dst + g * ig + h, _mm256_mul_ps(sc, v));
                    }
            }
        }
    }
}

void kvq_aqlm_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    if (w->kind == KVQ_CW_AQLM_LUT) {
        rows_lut(w, r0, r1, out);
        return;
    }
    size_t KI = ((size_t)1 << w->nbits) * w->ig, ig = (size_t)w->ig, per_row = (size_t)w->G * w->M;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * per_row;
        float *dst = out + (size_t)(o - r0) * w->cols;
        __m256 s = _mm256_set1_ps(w->scales[o]), s8 = _mm256_set1_ps(w->cb8_scale);
        for (int g = 0; g < w->G; g++)
            for (size_t h = 0; h < ig; h += 8) {
                /* int8: (q * its scale) * scale, as the reference (kvq_cw_val) rounds it;
                 * cbq's scale is its class's (aqlm/aqlm_i8.c) */
                __m256 v = w->cbq  ? _mm256_mul_ps(cw8_i8(w->cbq, (size_t)c[g] * ig + h),
                                                   _mm256_set1_ps(w->cbq_cls[c[g] >> w->cbq_shift]))
                           : w->cb8 ? _mm256_mul_ps(cw8_i8(w->cb8, (size_t)c[g] * ig + h), s8)
                                    : codeword8(w->cb16, c, g, KI, (size_t)w->M, ig, h, 0);
                _mm256_storeu_ps(dst + g * ig + h, _mm256_mul_ps(s, v));
            }
    }
}
