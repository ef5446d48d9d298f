/* AVX-512 (F/BW/VL/DQ) attention kernels, with VNNI (and VBMI) where the CPU
 * has them.
 *
 * q·k with q4 K uses integer dot products with positions in lanes: each
 * query row is quantized to int8 per 32-value block (q_prep); the nibbles of
 * one K block for 16 positions are transposed (128-bit loads, one in-lane
 * 4×4 dword transpose) so int32 lane p holds position p, and vpdpbusd (or
 * vpmaddubsw without VNNI) against the broadcast query bytes gives each
 * row's scores in place: no horizontal sums. K scales come by one gather
 * per block. With VNNI, q8 K goes through int8 too, folding 4 rows per
 * position (values flipped to unsigned k+128, corrected by 128·Σq).
 *
 * q·k with f32/f16 (and q8 without VNNI) dequantizes 16 values at a time to
 * f32 and FMAs them into NP positions × NH rows of accumulators, reduced by
 * one transpose-add tree (45 shuffles/adds for 16 sums).
 *
 * V is dequantized 16 values at a time (q4 via a 16-entry permute table)
 * into f32 and FMAed into register-resident output tiles; for q8/q4 the
 * block scale is folded into the softmax weight first (w·d per row, block,
 * position), so dequantization is just "integer to float". With VNNI and
 * VBMI, q4 V instead takes int16 weights and vpdpwssd over pairs of
 * positions (av_blk, below).
 *
 * The common shapes (head dim 64/128, GQA 4/8, full 64-position blocks) get
 * their own copies of the kernels through BY_HD / BY_NR. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/attn/attn_kernels.h"
#include "ref/ref.h"

#define AI static inline __attribute__((always_inline))
#define BP KVQ_ATTN_BP
#define NB_MAX (KVQ_ATTN_HD_MAX / KVQ_QK)

/* Shuffles within 128-bit lanes on integer vectors. */
#define SHUF_I(a, b, imm) \
    _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), imm))

static size_t block_bytes(kvq_cache_type t) {
    return t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4);
}

/* D[b*BP + j] = scale of block b of row j (j < np), via one gather per 16 rows. */
static void gather_scales(const uint8_t *row0, size_t rb, int np, int nb, size_t bsz, float *D) {
    const __m512i off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    for (int j0 = 0; j0 < np; j0 += 16) {
        const __mmask16 m = np - j0 >= 16 ? 0xFFFF : (__mmask16)((1u << (np - j0)) - 1);
        const uint8_t *base = row0 + (size_t)j0 * rb;
        for (int b = 0; b < nb; b++) {
            __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, off, base + (size_t)b * bsz, 1);
            _mm512_storeu_ps(D + b * BP + j0, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
        }
    }
}

/* Values 16c .. 16c+15 of a row as f32, without the block scale for q8/q4. */
AI __m512 ld16(const uint8_t *row, int c, const int t, __m512 lut) {
    if (t == KVQ_CACHE_F32) return _mm512_loadu_ps(row + 64 * c);
    if (t == KVQ_CACHE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * c)));
    if (t == KVQ_CACHE_Q8) {
        const uint8_t *b = row + (size_t)(c >> 1) * sizeof(kvq_block_q8) + 2 + 16 * (c & 1);
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b)));
    }
    /* q4: vpermps only looks at the low 4 index bits, so the low nibble needs no mask. */
    const uint8_t *b = row + (size_t)(c >> 1) * sizeof(kvq_block_q4) + 2;
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
    if (c & 1) v = _mm512_srli_epi32(v, 4);
    return _mm512_permutexvar_ps(v, lut);
}

/* Byte offset of chunk c (even) of 16 values within a row. */
AI size_t chunk_offset(int c, const int t) {
    if (t == KVQ_CACHE_F32) return (size_t)c * 64;
    if (t == KVQ_CACHE_F16) return (size_t)c * 32;
    return (size_t)(c >> 1) * (t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4));
}

AI __m512 q4_lut(void) {
    return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

/* out[i] = horizontal sum of v[i] for 16 vectors. */
AI void reduce16(const __m512 *v, float *out) {
    __m512 u[8], w[4], x[2];
    for (int i = 0; i < 8; i++) {
        __m512 a = v[2 * i], b = v[2 * i + 1];
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int i = 0; i < 4; i++) {
        __m512 a = u[2 * i], b = u[2 * i + 1];
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    /* w[i]: 128-bit lane k holds 4 partial sums of v[4i+k] */
    for (int i = 0; i < 2; i++) {
        __m512 a = w[2 * i], b = w[2 * i + 1];
        x[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* r[4k + j] = sum of v[4j + k]: one permute puts it in order. */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, r));
}

/* ---- q·k, f32/f16/q8 K: dequantize and FMA ---- */

/* Scores of NP positions (from j0) × NH query rows; positions past np repeat the last row. */
AI void qkf_tile(const uint8_t *k, size_t rb, int np, int j0, const float *q, int hd, const float *D, float *s,
                 int pf, const int NP, const int NH, const int t) {
    const __m512 lut = q4_lut();
    __m512 acc[16];
    const uint8_t *row[16];
    int jj[16];
    for (int i = 0; i < NP; i++) {
        jj[i] = j0 + i < np ? j0 + i : np - 1;
        row[i] = k + (size_t)jj[i] * rb;
        if (pf) kvq_attn_prefetch_row(row[i], rb);
        for (int h = 0; h < NH; h++) acc[i * NH + h] = _mm512_setzero_ps();
    }
    for (int c = 0; c < hd / 16; c++) {
        __m512 qv[8];
        for (int h = 0; h < NH; h++) qv[h] = _mm512_loadu_ps(q + (size_t)h * hd + 16 * c);
        for (int i = 0; i < NP; i++) {
            __m512 x = ld16(row[i], c, t, lut);
            if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) x = _mm512_mul_ps(x, _mm512_set1_ps(D[(c >> 1) * BP + jj[i]]));
            for (int h = 0; h < NH; h++) acc[i * NH + h] = _mm512_fmadd_ps(x, qv[h], acc[i * NH + h]);
        }
    }
    float sum[16];
    if (NP * NH == 16)
        reduce16(acc, sum);
    else
        for (int i = 0; i < NP * NH; i++) sum[i] = _mm512_reduce_add_ps(acc[i]);
    for (int i = 0; i < NP && j0 + i < np; i++)
        for (int h = 0; h < NH; h++) s[h * BP + j0 + i] = sum[i * NH + h];
}

AI void qkf_rows(const uint8_t *k, size_t rb, int np, const float *q, int hd, const float *D, float *s, int pf,
                 const int NH, const int t) {
    const int NP = 16 / NH; /* NP × NH = 16 accumulators fill half the register file */
    for (int j0 = 0; j0 < np; j0 += NP) qkf_tile(k, rb, np, j0, q, hd, D, s, pf, NP, NH, t);
}

AI void qkf_t(const uint8_t *k, size_t rb, int np, const float *q, int nr, int hd, float *s, const int t) {
    float D[NB_MAX * BP];
    if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) gather_scales(k, rb, np, hd / KVQ_QK, block_bytes(t), D);
    int r = 0;
    for (; nr - r >= 8; r += 8) qkf_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 8, t);
    if (nr - r >= 4) {
        qkf_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 4, t);
        r += 4;
    }
    if (nr - r >= 2) {
        qkf_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 2, t);
        r += 2;
    }
    if (nr - r >= 1) qkf_rows(k, rb, np, q + (size_t)r * hd, hd, D, s + r * BP, r == 0, 1, t);
}

/* ---- q·k, q4 K: int8 queries, integer dot products, positions in lanes ---- */

#define VNNI __attribute__((target("avx512vnni")))
#define VNNI_AI VNNI static inline __attribute__((always_inline))

/* Quantizes 32 query values to int8 (scale absmax/127, round to nearest
 * even, clamped against rounding past ±127); returns the scale. */
AI float quant32(const float *x, __m512i *v0, __m512i *v1) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    *v0 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), lim), nlim);
    *v1 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)), lim), nlim);
    return amax / 127.0f;
}

/* Per query row and K block: the int8 query block in natural order, the
 * correction for the +8 offset of stored nibbles, and the q scale. */
typedef struct {
    int8_t q[KVQ_QK];
    int32_t c; /* -8·Σq */
    float d;
} q4blk;

static void q4_prep(const float *q, int nr, int hd, void *prep) {
    const int nbk = hd / KVQ_QK;
    q4blk *P = prep;
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nbk; b++) {
            q4blk *pb = P + (size_t)r * nbk + b;
            __m512i v0, v1;
            pb->d = quant32(q + (size_t)r * hd + KVQ_QK * b, &v0, &v1);
            _mm_storeu_si128((__m128i *)pb->q, _mm512_cvtepi32_epi8(v0));
            _mm_storeu_si128((__m128i *)(pb->q + 16), _mm512_cvtepi32_epi8(v1));
            pb->c = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
        }
}

/* The 16 nibble bytes of block b for 16 positions, transposed: lane p of
 * R[i] = bytes 4i..4i+3 of position p's block (values 4i.. in the low
 * nibbles, 16+4i.. in the high). Z[kk] 128-bit lane m = position 4m+kk, so
 * one in-lane 4×4 dword transpose leaves the positions in order. */
AI void q4_transpose(const uint8_t *const *rp, int b, __m512i *R) {
    __m512i Z[4];
    for (int kk = 0; kk < 4; kk++) {
        const size_t o = sizeof(kvq_block_q4) * (size_t)b + 2;
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[kk] + o)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(rp[4 + kk] + o)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(rp[8 + kk] + o)), 2);
        Z[kk] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(rp[12 + kk] + o)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(Z[0], Z[1]), t1 = _mm512_unpackhi_epi32(Z[0], Z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(Z[2], Z[3]), t3 = _mm512_unpackhi_epi32(Z[2], Z[3]);
    R[0] = _mm512_unpacklo_epi64(t0, t2);
    R[1] = _mm512_unpackhi_epi64(t0, t2);
    R[2] = _mm512_unpacklo_epi64(t1, t3);
    R[3] = _mm512_unpackhi_epi64(t1, t3);
}

#define BCAST32(p) _mm512_set1_epi32(*(const int32_t *)(p))

/* One row's dot with one block of 16 positions, int32 lanes, +8 offset removed.
 * Two chains: eight dependent vpdpbusd would be latency-bound. */
VNNI_AI __m512i q4_dot_vnni(const __m512i *lo, const __m512i *hi, const q4blk *pb) {
    __m512i a = _mm512_set1_epi32(pb->c), b = _mm512_setzero_si512();
    for (int i = 0; i < 4; i++) a = _mm512_dpbusd_epi32(a, lo[i], BCAST32(pb->q + 4 * i));
    for (int i = 0; i < 4; i++) b = _mm512_dpbusd_epi32(b, hi[i], BCAST32(pb->q + 16 + 4 * i));
    return _mm512_add_epi32(a, b);
}

/* Same with vpmaddubsw: the eight int16 pair sums stay within int16 (≤ 8·2·15·127). */
AI __m512i q4_dot_bw(const __m512i *lo, const __m512i *hi, const q4blk *pb) {
    __m512i a = _mm512_maddubs_epi16(lo[0], BCAST32(pb->q));
    for (int i = 1; i < 4; i++) a = _mm512_add_epi16(a, _mm512_maddubs_epi16(lo[i], BCAST32(pb->q + 4 * i)));
    for (int i = 0; i < 4; i++) a = _mm512_add_epi16(a, _mm512_maddubs_epi16(hi[i], BCAST32(pb->q + 16 + 4 * i)));
    return _mm512_add_epi32(_mm512_madd_epi16(a, _mm512_set1_epi16(1)), _mm512_set1_epi32(pb->c));
}

/* 16 positions at a time, one int32 lane each, so scores come out in place
 * with no horizontal sums; K scales arrive by one gather per block. Rows go
 * in groups of up to 8 (scores stay in registers); a further group re-reads
 * the 16 positions' nibbles from L1. */
#define QK_Q4_BODY(DOT)                                                                           \
    const int nbk = hd / KVQ_QK;                                                                \
    const __m512i m4 = _mm512_set1_epi8(0x0F);                                                  \
    const __m512i ix = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                                          _mm512_set1_epi32((int)rb));                          \
    for (int j0 = 0; j0 < np; j0 += 16) {                                                       \
        const uint8_t *rp[16];                                                                  \
        for (int i = 0; i < 16; i++) {                                                          \
            rp[i] = k + (size_t)(j0 + i < np ? j0 + i : np - 1) * rb;                           \
            kvq_attn_prefetch_row_l1(rp[i], rb);                                                \
        }                                                                                       \
        const __m512i idx = np - j0 >= 16 ? ix : _mm512_min_epi32(ix, _mm512_set1_epi32((np - 1 - j0) * (int)rb)); \
        const __mmask16 sm = np - j0 >= 16 ? 0xFFFF : (__mmask16)((1u << (np - j0)) - 1);       \
        for (int r0 = 0; r0 < nr; r0 += 8) {                                                    \
            const int ng = nr - r0 < 8 ? nr - r0 : 8;                                           \
            __m512 sc[8];                                                                       \
            for (int r = 0; r < ng; r++) sc[r] = _mm512_setzero_ps();                           \
            for (int b = 0; b < nbk; b++) {                                                     \
                __m512i R[4], lo[4], hi[4];                                                     \
                q4_transpose(rp, b, R);                                                         \
                for (int i = 0; i < 4; i++) {                                                   \
                    lo[i] = _mm512_and_si512(R[i], m4);                                         \
                    hi[i] = _mm512_and_si512(_mm512_srli_epi16(R[i], 4), m4);                   \
                }                                                                               \
                const __m512 dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(                        \
                    _mm512_i32gather_epi32(idx, rp[0] + sizeof(kvq_block_q4) * (size_t)b, 1))); \
                for (int r = 0; r < ng; r++) {                                                  \
                    const q4blk *pb = P + (size_t)(r0 + r) * nbk + b;                           \
                    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(DOT(lo, hi, pb)), dk);     \
                    sc[r] = _mm512_fmadd_ps(f, _mm512_set1_ps(pb->d), sc[r]);                   \
                }                                                                               \
            }                                                                                   \
            for (int r = 0; r < ng; r++) _mm512_mask_storeu_ps(s + (r0 + r) * BP + j0, sm, sc[r]); \
        }                                                                                       \
    }

AI void qk_q4_hd(const uint8_t *k, size_t rb, int np, const q4blk *P, int nr, int hd, float *s) {
    QK_Q4_BODY(q4_dot_bw)
}

VNNI_AI void qk_q4_vnni_hd(const uint8_t *k, size_t rb, int np, const q4blk *P, int nr, int hd, float *s) {
    QK_Q4_BODY(q4_dot_vnni)
}

static void qk_q4(const uint8_t *k, size_t rb, int np, const q4blk *P, int nr, int hd, float *s) {
    BY_HD(hd, BY_NR(nr, qk_q4_hd(k, rb, np, P, NR, HD, s)))
}

VNNI static void qk_q4_vnni(const uint8_t *k, size_t rb, int np, const q4blk *P, int nr, int hd, float *s) {
    BY_HD(hd, BY_NR(nr, qk_q4_vnni_hd(k, rb, np, P, NR, HD, s)))
}

/* ---- q·k, q8 K with VNNI: 4 rows folded per position ---- */

/* Folds 4 rows' int32 lane sums so that 128-bit lane L, element e = row e's
 * sum over lane L, and accumulates them scaled: za += Σ · dk · dq. */
AI __m512 fold4(const __m512i *d, const float *dq, __m512 dk, __m512 za) {
    const __m512i x = _mm512_add_epi32(SHUF_I(d[0], d[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                       SHUF_I(d[0], d[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i y = _mm512_add_epi32(SHUF_I(d[2], d[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                       SHUF_I(d[2], d[3], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i z = _mm512_add_epi32(SHUF_I(x, y, _MM_SHUFFLE(2, 0, 2, 0)), SHUF_I(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(z), _mm512_mul_ps(dk, _mm512_load_ps(dq)), za);
}

/* VNNI: acc + Σ of four u8·s8 products per int32 lane. */
#define DPBUSD(acc, u, s) _mm512_dpbusd_epi32(acc, u, _mm512_load_si512(s))

/* Sums over 128-bit lanes for four positions at once (lane k of the result =
 * position j0+k, element e = row e) and stores the scores of ne rows. */
AI void store4(const __m512 *z, int np, int j0, int ne, float *sg) {
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
    w = _mm512_permutexvar_ps(tr, w); /* w[4k + e] -> [4e + k] */
    const __mmask8 sm = np - j0 >= 4 ? 0xF : (__mmask8)((1u << (np - j0)) - 1);
    _mm_mask_storeu_ps(sg + j0, sm, _mm512_castps512_ps128(w));
    if (ne > 1) _mm_mask_storeu_ps(sg + BP + j0, sm, _mm512_extractf32x4_ps(w, 1));
    if (ne > 2) _mm_mask_storeu_ps(sg + 2 * BP + j0, sm, _mm512_extractf32x4_ps(w, 2));
    if (ne > 3) _mm_mask_storeu_ps(sg + 3 * BP + j0, sm, _mm512_extractf32x4_ps(w, 3));
}

/* Groups of 4 rows, 4 positions per step; a last group of one row (GQA 1 decode)
 * goes 16 positions per step instead of padding to 4 rows. */
#define QK_INT_BODY(PREP, DOT4, DOT1, NCH)                                                        \
    const int nbk = hd / KVQ_QK, nch = NCH;                                                     \
    for (int g = 0; g * 4 < nr; g++) {                                                          \
        const PREP *G = P + (size_t)g * nch;                                                    \
        const int ne = nr - 4 * g < 4 ? nr - 4 * g : 4;                                         \
        float *sg = s + 4 * g * BP;                                                             \
        if (ne == 1) {                                                                          \
            for (int j0 = 0; j0 < np; j0 += 16) {                                               \
                __m512 z[16];                                                                   \
                for (int i = 0; i < 16; i++) {                                                  \
                    const uint8_t *row = k + (size_t)(j0 + i < np ? j0 + i : np - 1) * rb;      \
                    if (g == 0) kvq_attn_prefetch_row_l1(row, rb);                              \
                    z[i] = DOT1(row, G, nbk);                                                   \
                }                                                                               \
                float t[16];                                                                    \
                reduce16(z, t);                                                                 \
                for (int i = 0; i < 16 && j0 + i < np; i++) sg[j0 + i] = t[i];                  \
            }                                                                                   \
            continue;                                                                           \
        }                                                                                       \
        for (int j0 = 0; j0 < np; j0 += 4) {                                                    \
            __m512 z[4];                                                                        \
            for (int i = 0; i < 4; i++) {                                                       \
                const uint8_t *row = k + (size_t)(j0 + i < np ? j0 + i : np - 1) * rb;          \
                if (g == 0) kvq_attn_prefetch_row_l1(row, rb);                                  \
                z[i] = DOT4(row, G, nbk);                                                       \
            }                                                                                   \
            store4(z, np, j0, ne, sg);                                                       \
        }                                                                                       \
    }

static int g_vnni = -1;

int kvq_attn_avx512_set_vnni(int on) {
    __builtin_cpu_init();
    const int prev = g_vnni < 0 ? __builtin_cpu_supports("avx512vnni") != 0 : g_vnni;
    __atomic_store_n(&g_vnni, on && __builtin_cpu_supports("avx512vnni"), __ATOMIC_RELAXED);
    return prev;
}

static int use_vnni(void) {
    int v = __atomic_load_n(&g_vnni, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vnni") != 0;
        __atomic_store_n(&g_vnni, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* ---- q·k, q8 K with VNNI: int8 queries, vpdpbusd ---- */

/* One group of 4 query rows × one chunk of 2 K blocks (64 values, natural
 * order; int32 lane l covers block l/8). K bytes are flipped to unsigned
 * (k+128) for vpdpbusd; nc[e][l] = -128·Σq of lane l's four values removes
 * that again. dq[4L+e] = scale of row e's block L/2 (the fold's layout),
 * dql[e][l] = scale of block l/8 (one row alone). */
typedef struct {
    int8_t q[4][64];
    int32_t nc[4][16];
    float dq[16];
    float dql[4][16];
} q8prep;

static void q8_prep(const float *q, int nr, int hd, void *prep) {
    const int nbk = hd / KVQ_QK, nch = (nbk + 1) / 2;
    q8prep *P = prep;
    memset(P, 0, (size_t)((nr + 3) / 4) * nch * sizeof *P);
    for (int r = 0; r < nr; r++) {
        const int e = r % 4;
        for (int b = 0; b < nbk; b++) {
            q8prep *pp = P + (r / 4) * nch + b / 2;
            const int bb = b % 2;
            __m512i v0, v1;
            const float dq = quant32(q + (size_t)r * hd + KVQ_QK * b, &v0, &v1);
            _mm_storeu_si128((__m128i *)(pp->q[e] + 32 * bb), _mm512_cvtepi32_epi8(v0));
            _mm_storeu_si128((__m128i *)(pp->q[e] + 32 * bb + 16), _mm512_cvtepi32_epi8(v1));
            int32_t lanes[32];
            _mm512_storeu_si512(lanes, v0);
            _mm512_storeu_si512(lanes + 16, v1);
            for (int l = 0; l < 8; l++) {
                pp->nc[e][8 * bb + l] = -128 * (lanes[4 * l] + lanes[4 * l + 1] + lanes[4 * l + 2] + lanes[4 * l + 3]);
                pp->dql[e][8 * bb + l] = dq;
            }
            pp->dq[4 * (2 * bb) + e] = pp->dq[4 * (2 * bb + 1) + e] = dq;
        }
    }
}

/* Values of one 68-byte chunk (2 blocks) as unsigned k+128, and the K scales with lane l -> block l/8. */
AI void q8_load(const uint8_t *cp, int nb, __m512i *ku, __m512 *dk) {
    /* Words: block b = 17 words (scale, then 16 of values). A = bytes 0..63,
     * B = bytes 4..67 (word w of the chunk is word w-2 of B). */
    static const uint16_t val_words[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                           18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 62, 63};
    static const uint16_t d_words[32] = {0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17, 17, 17, 17, 17, 17};
    __m512i A, B;
    if (nb == 2) {
        A = _mm512_loadu_si512(cp);
        B = _mm512_loadu_si512(cp + 4);
    } else { /* a lone last block: the absent one reads as 0 (its q is 0 too) */
        A = _mm512_maskz_loadu_epi8((__mmask64)((1ull << 34) - 1), cp);
        B = _mm512_setzero_si512();
    }
    const __m512i k = _mm512_permutex2var_epi16(A, _mm512_loadu_si512(val_words), B);
    *ku = _mm512_xor_si512(k, _mm512_set1_epi8((char)0x80));
    *dk = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_loadu_si512(d_words), A)));
}

VNNI_AI __m512 q8_dot4_vnni(const uint8_t *row, const q8prep *G, int nbk) {
    __m512 za = _mm512_setzero_ps();
    for (int c = 0; c * 2 < nbk; c++, G++) {
        __m512i ku, d[4];
        __m512 dk;
        q8_load(row + (size_t)c * 2 * sizeof(kvq_block_q8), nbk - 2 * c >= 2 ? 2 : 1, &ku, &dk);
        for (int e = 0; e < 4; e++) d[e] = DPBUSD(_mm512_load_si512(G->nc[e]), ku, G->q[e]);
        za = fold4(d, G->dq, dk, za);
    }
    return za;
}

VNNI_AI __m512 q8_dot1_vnni(const uint8_t *row, const q8prep *G, int nbk) {
    __m512 za = _mm512_setzero_ps();
    for (int c = 0; c * 2 < nbk; c++, G++) {
        __m512i ku;
        __m512 dk;
        q8_load(row + (size_t)c * 2 * sizeof(kvq_block_q8), nbk - 2 * c >= 2 ? 2 : 1, &ku, &dk);
        const __m512i d = DPBUSD(_mm512_load_si512(G->nc[0]), ku, G->q[0]);
        za = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dk, _mm512_load_ps(G->dql[0])), za);
    }
    return za;
}

VNNI_AI void qk_q8_vnni_hd(const uint8_t *k, size_t rb, int np, const q8prep *P, int nr, int hd, float *s) {
    QK_INT_BODY(q8prep, q8_dot4_vnni, q8_dot1_vnni, (hd / KVQ_QK + 1) / 2)
}

VNNI static void qk_q8_vnni(const uint8_t *k, size_t rb, int np, const q8prep *P, int nr, int hd, float *s) {
    BY_HD(hd, qk_q8_vnni_hd(k, rb, np, P, nr, HD, s))
}

static size_t q_prep_bytes(kvq_cache_type tk, int nr, int hd) {
    const size_t groups = (size_t)((nr + 3) / 4), nbk = (size_t)(hd / KVQ_QK);
    if (tk == KVQ_CACHE_Q4) return (size_t)nr * nbk * sizeof(q4blk);
    if (tk == KVQ_CACHE_Q8 && use_vnni()) return groups * ((nbk + 1) / 2) * sizeof(q8prep);
    return 0;
}

static void q_prep(kvq_cache_type tk, const float *q, int nr, int hd, void *prep) {
    if (tk == KVQ_CACHE_Q4) q4_prep(q, nr, hd, prep);
    if (tk == KVQ_CACHE_Q8 && use_vnni()) q8_prep(q, nr, hd, prep);
}

static unsigned int8_q(void) { return 1u << KVQ_CACHE_Q4 | (unsigned)use_vnni() << KVQ_CACHE_Q8; }

static void qk(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep, int nr,
               int hd, float *s) {
    switch (tk) {
    case KVQ_CACHE_F32: BY_HD(hd, qkf_t(k, rb, np, q, nr, HD, s, KVQ_CACHE_F32)); break;
    case KVQ_CACHE_F16: BY_HD(hd, qkf_t(k, rb, np, q, nr, HD, s, KVQ_CACHE_F16)); break;
    case KVQ_CACHE_Q8:
        if (use_vnni())
            qk_q8_vnni(k, rb, np, prep, nr, hd, s);
        else
            BY_HD(hd, qkf_t(k, rb, np, q, nr, HD, s, KVQ_CACHE_Q8));
        break;
    case KVQ_CACHE_Q4:
        if (use_vnni())
            qk_q4_vnni(k, rb, np, prep, nr, hd, s);
        else
            qk_q4(k, rb, np, prep, nr, hd, s);
        break;
    }
}

/* ---- V accumulation ---- */

/* acc rows += Σ_j weight · v_j for NH rows and G×16 columns from chunk c0.
 * The weight of row h, chunk c0+g, position j is W[((g/2)*NH + h)*BP + j]
 * for q8/q4 (block scale folded in, see av_group) and W[h*BP + j] otherwise:
 * constant offsets from one moving pointer. */
AI void av_tile(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int c0, int pf,
                const int NH, const int G, const int t) {
    const __m512 lut = q4_lut();
    const int q = t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4;
    __m512 a[16];
    for (int h = 0; h < NH; h++)
        for (int g = 0; g < G; g++) a[h * G + g] = _mm512_loadu_ps(acc + (size_t)h * hd + 16 * (c0 + g));
    /* c0 is even, so chunk c0+g of a row is chunk g counted from here: constant offsets */
    const uint8_t *row = v + chunk_offset(c0, t);
    for (int j = 0; j < np; j++, row += rb, W++) {
        if (pf && q) kvq_attn_prefetch_row_l1(row, rb);
        if (pf && !q) kvq_attn_prefetch_row(row, rb);
        __m512 x[8];
        for (int g = 0; g < G; g++) x[g] = ld16(row, g, t, lut);
        for (int h = 0; h < NH; h++)
            for (int g = 0; g < G; g++)
                a[h * G + g] = _mm512_fmadd_ps(x[g], _mm512_set1_ps(W[(q ? (g >> 1) * NH + h : h) * BP]), a[h * G + g]);
    }
    for (int h = 0; h < NH; h++)
        for (int g = 0; g < G; g++) _mm512_storeu_ps(acc + (size_t)h * hd + 16 * (c0 + g), a[h * G + g]);
}

AI void av_rows(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int pf, const int NH,
                const int t) {
    const int nch = hd / 16; /* even: hd is a multiple of 32 */
    const int q = t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4;
    int c0 = 0;
#define AV_TILE(G) av_tile(v, rb, np, q ? W + (c0 >> 1) * NH * BP : W, acc, hd, c0, pf && c0 == 0, NH, G, t)
    if (NH <= 2)
        for (; nch - c0 >= 8; c0 += 8) AV_TILE(8);
    if (NH <= 4)
        for (; nch - c0 >= 4; c0 += 4) AV_TILE(4);
    for (; c0 < nch; c0 += 2) AV_TILE(2);
#undef AV_TILE
}

/* NH rows from w: for q8/q4, WD[(b*NH + h)*BP + j] = w[h][j] · scale of block b of row j. */
AI void av_group(const uint8_t *v, size_t rb, int np, const float *w, int hd, float *acc, const float *D, float *WD,
                 int pf, const int NH, const int t) {
    if (t == KVQ_CACHE_F32 || t == KVQ_CACHE_F16) {
        av_rows(v, rb, np, w, acc, hd, pf, NH, t);
        return;
    }
    for (int b = 0; b < hd / KVQ_QK; b++)
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < np; j += 16) {
                const __mmask16 m = np - j >= 16 ? 0xFFFF : (__mmask16)((1u << (np - j)) - 1);
                const __m512 x = _mm512_maskz_loadu_ps(m, w + h * BP + j), d = _mm512_maskz_loadu_ps(m, D + b * BP + j);
                _mm512_storeu_ps(WD + (b * NH + h) * BP + j, _mm512_mul_ps(x, d));
            }
    av_rows(v, rb, np, WD, acc, hd, pf, NH, t);
}

#include "cpu/attn/attn_av_shell.inc"

/* ---- V from int16 weights (q4 V; VNNI + VBMI) ---- */

/* Why: the f32 path spends a GQA-4 group 32 FMAs per position at head dim
 * 128 plus the dequantization, where vpdpwssd takes two positions per
 * instruction and q4 nibbles only need spreading into 16-bit lanes (one
 * vpermt2b). The weights (softmax weight × V block scale) are rounded to
 * 15 bits relative to the largest one of their (row, V block): an error of
 * ≤ 2^-16 of that weight each, far below the q4 rounding of V itself. The
 * driver's weights are relative to fixed 64-position spans (av_blk), so
 * decode and prompt evaluation round alike; the integer sums are exact. */

#define VBMI_VNNI __attribute__((target("avx512vnni,avx512vbmi")))
#define VBMI_VNNI_AI VBMI_VNNI static inline __attribute__((always_inline))

/* Weights of NH rows for every V block as int16 at Wq + (b·NH + h)·BP
 * (pairs of positions per dword, 0 at and past np; block-major, so a tile
 * reads all its rows at constant offsets from one pointer), so[k] = f·M/32767 the scale of (row, block) k's
 * integer sums (M = max |w·d|: q4 scales are signed; 0: nothing to add) and
 * cs[k] = 8·ΣWq (the +8 storage offset, removed in integers). In phases, so
 * the 16 reductions and divisions overlap. Returns whether any row adds. */
AI int wq_rows(const float *w, const float *f, const float *D, int np, int16_t *Wq, float *so, int32_t *cs,
               const int NB, const int NH) {
    float M[4 * NB_MAX], inv[4 * NB_MAX];
    __m512 wr[4][BP / 16];
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < BP / 16; i++) {
            const __mmask16 m = np - 16 * i >= 16 ? 0xFFFF : np > 16 * i ? (__mmask16)((1u << (np - 16 * i)) - 1) : 0;
            /* a row that sees nothing here (f = 0) may hold anything */
            wr[h][i] = f[h] > 0.0f ? _mm512_maskz_loadu_ps(m, w + (size_t)h * BP + 16 * i) : _mm512_setzero_ps();
        }
    for (int h = 0; h < NH; h++)
        for (int b = 0; b < NB; b++) {
            __m512 mx = _mm512_setzero_ps();
            for (int i = 0; i < BP / 16; i++)
                mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_mul_ps(wr[h][i], _mm512_loadu_ps(D + b * BP + 16 * i))));
            M[b * NH + h] = _mm512_reduce_max_ps(mx);
        }
    int live = 0;
    for (int k = 0; k < NH * NB; k++) {
        const int on = M[k] > 0.0f;
        inv[k] = on ? 32767.0f / M[k] : 0.0f;
        so[k] = f[k % NH] * M[k] * (1.0f / 32767.0f);
        live |= on;
    }
    if (!live) return 0;
    for (int h = 0; h < NH; h++)
        for (int b = 0; b < NB; b++) {
            const __m512 sc = _mm512_set1_ps(inv[b * NH + h]);
            __m512i sum = _mm512_setzero_si512();
            for (int i = 0; i < BP / 16; i++) {
                /* |w·d|·32767/M rounds to ≤ 32767; the saturating pack guards the last ulp */
                const __m512i q =
                    _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(wr[h][i], _mm512_loadu_ps(D + b * BP + 16 * i)), sc));
                sum = _mm512_add_epi32(sum, q);
                _mm256_storeu_si256((__m256i *)(Wq + (b * NH + h) * BP + 16 * i), _mm512_cvtsepi32_epi16(q));
            }
            cs[b * NH + h] = 8 * _mm512_reduce_add_epi32(sum);
        }
    return 1;
}

/* NH rows × V blocks b, b+1, positions in pairs. The whole nibble bytes
 * (lo + 16·hi ≤ 255) are multiplied and 16·hi taken off at the end, which
 * saves masking out the low nibbles: 64·255·32767 < 2^31. */
VBMI_VNNI_AI void av_q4i_tile(const uint8_t *v, size_t rb, int np, const int16_t *Wq, const float *so,
                              const int32_t *cs, float *acc, int hd, int b, int pf, const int NB, const int NH) {
    /* word 2c = byte c of position j, word 2c+1 = byte c of position j+1, high bytes 0 */
    const __m512i spread = _mm512_setr_epi32(0x00400000, 0x00410001, 0x00420002, 0x00430003, 0x00440004, 0x00450005,
                                             0x00460006, 0x00470007, 0x00480008, 0x00490009, 0x004A000A, 0x004B000B,
                                             0x004C000C, 0x004D000D, 0x004E000E, 0x004F000F);
    __m512i I[4][2][2];
    for (int h = 0; h < NH; h++)
        for (int bb = 0; bb < 2; bb++) I[h][bb][0] = I[h][bb][1] = _mm512_setzero_si512();
    for (int j = 0; j < np; j += 2) {
        const uint8_t *ra = v + (size_t)j * rb, *rc = j + 1 < np ? ra + rb : ra; /* odd np: weight 0 */
        if (pf) {
            kvq_attn_prefetch_row_l1(ra, rb);
            kvq_attn_prefetch_row_l1(rc, rb);
        }
        for (int bb = 0; bb < 2; bb++) {
            const size_t o = sizeof(kvq_block_q4) * (size_t)(b + bb) + 2;
            const __m512i z0 = _mm512_maskz_permutex2var_epi8(
                0x5555555555555555ull, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(ra + o))), spread,
                _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rc + o))));
            const __m512i z1 = _mm512_srli_epi16(z0, 4);
            for (int h = 0; h < NH; h++) {
                const __m512i wv = _mm512_set1_epi32(*(const int32_t *)(Wq + ((b + bb) * NH + h) * BP + j));
                /* in asm: GCC (12) accumulates into a copy and moves it back, 2 extra moves per product */
                __asm__("vpdpwssd %2, %1, %0" : "+v"(I[h][bb][0]) : "v"(z0), "v"(wv));
                __asm__("vpdpwssd %2, %1, %0" : "+v"(I[h][bb][1]) : "v"(z1), "v"(wv));
            }
        }
    }
    for (int h = 0; h < NH; h++)
        for (int bb = 0; bb < 2; bb++) {
            const int k = (b + bb) * NH + h;
            const __m512i c = _mm512_set1_epi32(cs[k]);
            const __m512 s = _mm512_set1_ps(so[k]);
            const __m512i lo = _mm512_sub_epi32(_mm512_sub_epi32(I[h][bb][0], _mm512_slli_epi32(I[h][bb][1], 4)), c);
            const __m512i hi = _mm512_sub_epi32(I[h][bb][1], c);
            float *a = acc + (size_t)h * hd + KVQ_QK * (b + bb);
            _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s, _mm512_loadu_ps(a)));
            _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s, _mm512_loadu_ps(a + 16)));
        }
}

VBMI_VNNI_AI void av_q4i_rows(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int hd,
                              float *acc, const float *D, int pf, const int NB, const int NH) {
    int16_t Wq[4 * NB_MAX * BP];
    float so[4 * NB_MAX];
    int32_t cs[4 * NB_MAX];
    if (!wq_rows(w, f, D, np, Wq, so, cs, NB, NH)) return; /* prompt tiles: a query may see none of a block */
    for (int b = 0; b < NB; b += 2) av_q4i_tile(v, rb, np, Wq, so, cs, acc, hd, b, pf && b == 0, NB, NH);
}

VBMI_VNNI_AI void av_q4i(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr, int hd,
                         float *acc) {
    const int nb = hd / KVQ_QK;
    float D[NB_MAX * BP];
    gather_scales(v, rb, np, nb, sizeof(kvq_block_q4), D);
    for (int j = np; j < BP; j++)
        for (int b = 0; b < nb; b++) D[b * BP + j] = 0.0f; /* w is 0 there too, but D may not be written */
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const float *wr = w + (size_t)r0 * BP, *fr = f + r0;
        float *ar = acc + (size_t)r0 * hd;
        switch (nr - r0 < 4 ? nr - r0 : 4) {
        case 4: av_q4i_rows(v, rb, np, wr, fr, hd, ar, D, r0 == 0, nb, 4); break;
        case 3: av_q4i_rows(v, rb, np, wr, fr, hd, ar, D, r0 == 0, nb, 3); break;
        case 2: av_q4i_rows(v, rb, np, wr, fr, hd, ar, D, r0 == 0, nb, 2); break;
        default: av_q4i_rows(v, rb, np, wr, fr, hd, ar, D, r0 == 0, nb, 1); break;
        }
    }
}

VBMI_VNNI static void av_blk_q4(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr, int hd,
                                float *acc) {
    if (np == BP && rb == kvq_kv_row_bytes(KVQ_CACHE_Q4, hd))
        BY_HD(hd, BY_NR(nr, av_q4i(v, kvq_kv_row_bytes(KVQ_CACHE_Q4, HD), BP, w, f, NR, HD, acc)))
    else
        av_q4i(v, rb, np, w, f, nr, hd, acc);
}

static int use_blk(void) {
    static int v = -1;
    int x = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (x < 0) {
        __builtin_cpu_init();
        x = __builtin_cpu_supports("avx512vbmi") != 0;
        __atomic_store_n(&v, x, __ATOMIC_RELAXED);
    }
    return x && use_vnni();
}

/* Pairs of V blocks per tile: head dims that are not a multiple of 64 go
 * back to the driver's f32 path. */
static int av_blk(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr,
                  int hd, float *acc) {
    if (tv != KVQ_CACHE_Q4 || hd % 64 != 0 || !use_blk()) return 0;
    av_blk_q4(v, rb, np, w, f, nr, hd, acc);
    return 1;
}

static unsigned av_blk_types(void) { return use_blk() ? 1u << KVQ_CACHE_Q4 : 0u; }

/* ---- rotation ---- */

/* The reference's butterflies in the same order, so the result is bitwise
 * the same: strides ≥ 16 pair whole vectors, strides 8..1 pair lanes of one
 * vector through a permute, with x·(±1) + partner as the sum or difference
 * (exact: one rounding, as a + b or a − b). ~10× faster than the scalar
 * loop, which showed at ~10% of q4 attention time at 1k context. */
static void hadamard(float *x, int n) {
    if (n < 16 || (n & (n - 1))) {
        kvq_ref_hadamard(x, n);
        return;
    }
    static const int32_t perm[4][16] = {
        {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
        {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
        {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
        {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
    };
    static const __mmask16 hi[4] = {0xAAAA, 0xCCCC, 0xF0F0, 0xFF00}; /* lanes that take partner − own */
    for (int i = 0; i < n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        for (int s = 0; s < 4; s++) {
            const __m512 p = _mm512_permutexvar_ps(_mm512_loadu_si512(perm[s]), v);
            const __m512 sg = _mm512_mask_blend_ps(hi[s], _mm512_set1_ps(1.0f), _mm512_set1_ps(-1.0f));
            v = _mm512_fmadd_ps(v, sg, p);
        }
        _mm512_storeu_ps(x + i, v);
    }
    for (int len = 16; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j += 16) {
                const __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
                _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
                _mm512_storeu_ps(x + j + len, _mm512_sub_ps(a, b));
            }
    const __m512 sc = _mm512_set1_ps(1.0f / sqrtf((float)n));
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sc));
}

/* ---- softmax helpers ---- */

/* exp(x) for x <= 0: 2^n · p(r), |r| <= ln2/2, degree-6 Taylor (rel. error ~2e-7); x < -87 gives 0. */
AI __m512 exp16(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

static float exp_sum(float *x, int n, float m) {
    __m512 sum = _mm512_setzero_ps(), mv = _mm512_set1_ps(m);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
        _mm512_mask_storeu_ps(x + i, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

static float vmax(const float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
    }
    return _mm512_reduce_max_ps(m);
}

const kvq_attn_kernels kvq_attn_avx512 = {
    .q_prep_bytes = q_prep_bytes,
    .q_prep = q_prep,
    .qk = qk,
    .av = av,
    .av_blk = av_blk,
    .av_blk_types = av_blk_types,
    .exp_sum = exp_sum,
    .max = vmax,
    .hadamard = hadamard,
    .int8_q = int8_q,
};
