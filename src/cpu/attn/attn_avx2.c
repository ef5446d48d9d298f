/* AVX2 + FMA + F16C attention kernels.
 *
 * Only three vector ALU ports on the Intel cores (four on Zen 3) and no
 * accumulating integer dot product, so the quantized paths are built to
 * keep the number of vector instructions per position and GQA group low:
 *
 * q·k with q4 K: query rows quantized to int8 per 32-value block (q_prep).
 * 16 K rows of a block are transposed (positions in lanes), so vpmaddubsw
 * against a broadcast pair of q values gives 2 products per position; sums
 * stay in int16 over the block and no horizontal reduction is needed. The
 * +8 storage offset is removed with a precomputed 8·Σq per block.
 * q·k with q8 K: |k| times q with k's sign (vpsignb), one hadd tree per
 * block folds the 4 rows of the group.
 * q·k with f32/f16 K converts 8 values at a time and FMAs them into NP
 * positions × NH rows of accumulators, reduced by one transpose-add tree.
 *
 * V: convert 8 values to f32 and FMA them with the softmax weight (q8/q4:
 * times the block scale, folded in per block so the conversion is "integer
 * to float"; q4 uses the raw nibbles and takes 8·Σ weight·scale back off).
 * q8 and q4 V instead go through av_blk: weights rounded to int16 per block,
 * vpmaddwd over pairs of positions.
 *
 * GCC (12) likes to evaluate all products of an unrolled accumulation before
 * the adds and spills them; an empty asm statement keeps the order in the
 * q4 q·k loop. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/attn/attn_kernels.h"
#include "ref/ref.h"

#define AI static inline __attribute__((always_inline))
#define BP KVQ_ATTN_BP
#define NB_MAX (KVQ_ATTN_HD_MAX / KVQ_QK)

/* D[b*BP + j] = scale of block b of row j (j < np), via gathers of 8 rows. */
static void gather_scales(const uint8_t *row0, size_t rb, int np, int nb, size_t bsz, float *D) {
    const __m256i off = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), lo16 = _mm256_set1_epi32(0xFFFF);
    for (int j0 = 0; j0 < np; j0 += 8) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(np - j0), lanes);
        const uint8_t *base = row0 + (size_t)j0 * rb;
        for (int b = 0; b < nb; b++) {
            __m256i v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(base + (size_t)b * bsz),
                                                    off, m, 1);
            v = _mm256_packus_epi32(_mm256_and_si256(v, lo16), _mm256_setzero_si256()); /* halves: 0-3 | 4-7 */
            v = _mm256_permute4x64_epi64(v, _MM_SHUFFLE(3, 1, 2, 0));
            _mm256_storeu_ps(D + b * BP + j0, _mm256_cvtph_ps(_mm256_castsi256_si128(v)));
        }
    }
}

static size_t block_bytes(kvq_cache_type t) {
    return t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4);
}

/* Values 8c .. 8c+7 of a row as f32, without the block scale for q8/q4;
 * q4: the raw nibbles 0..15, without the -8 (the caller corrects sums). */
AI __m256 ld8(const uint8_t *row, int c, const int t) {
    if (t == KVQ_CACHE_F32) return _mm256_loadu_ps((const float *)row + 8 * c);
    if (t == KVQ_CACHE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16 * c)));
    if (t == KVQ_CACHE_Q8) {
        const uint8_t *b = row + (size_t)(c >> 2) * sizeof(kvq_block_q8) + 2 + 8 * (c & 3);
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)b)));
    }
    /* q4 chunk c: bytes 8·(c&1).. of block c/4, low nibbles for (c&3) < 2, high ones after */
    const uint8_t *b = row + (size_t)(c >> 2) * sizeof(kvq_block_q4) + 2 + 8 * (c & 1);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
    return _mm256_cvtepi32_ps((c & 2) ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
}

/* Byte offset of the 32-value group (q8/q4: block) holding chunk c (8 values each). */
AI size_t chunk_offset(int c, const int t) {
    return (size_t)(c >> 2) * (t == KVQ_CACHE_F32 ? 128 : t == KVQ_CACHE_F16 ? 64 : block_bytes(t));
}

AI float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* out[i] = horizontal sum of v[i] for 8 vectors (21 shuffles/adds). */
AI void reduce8(const __m256 *v, float *out) {
    __m256 u[4], w[2];
    for (int i = 0; i < 4; i++) {
        __m256 a = v[2 * i], b = v[2 * i + 1];
        u[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    /* u[i]: 128-bit lane 0 holds 4 partials of v[2i], lane 1 of v[2i+1] */
    for (int i = 0; i < 2; i++) {
        __m256 a = u[2 * i], b = u[2 * i + 1];
        w[i] = _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* r[4l + j] = sum of v[2j + l] */
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(r, idx));
}

/* ---- q·k, f32/f16 K: convert and FMA ---- */

AI void qkf_tile(const uint8_t *k, size_t rb, int np, int j0, const float *q, int hd, float *s,
                 int pf, const int NP, const int NH, const int t) {
    __m256 acc[8];
    const uint8_t *row[8];
    int jj[8];
    for (int i = 0; i < NP; i++) {
        jj[i] = j0 + i < np ? j0 + i : np - 1;
        row[i] = k + (size_t)jj[i] * rb;
        if (pf) kvq_attn_prefetch_row(row[i], rb);
        for (int h = 0; h < NH; h++) acc[i * NH + h] = _mm256_setzero_ps();
    }
    for (int c = 0; c < hd / 8; c++) {
        for (int i = 0; i < NP; i++) {
            const __m256 x = ld8(row[i], c, t);
            for (int h = 0; h < NH; h++)
                acc[i * NH + h] = _mm256_fmadd_ps(x, _mm256_loadu_ps(q + (size_t)h * hd + 8 * c), acc[i * NH + h]);
        }
    }
    float sum[8];
    if (NP * NH == 8) {
        reduce8(acc, sum);
    } else {
        for (int i = 0; i < NP * NH; i++) {
            __m128 x = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
            x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            sum[i] = _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
        }
    }
    for (int i = 0; i < NP && j0 + i < np; i++)
        for (int h = 0; h < NH; h++) s[h * BP + j0 + i] = sum[i * NH + h];
}

AI void qkf_rows(const uint8_t *k, size_t rb, int np, const float *q, int hd, float *s, int pf,
                 const int NH, const int t) {
    const int NP = 8 / NH; /* 8 accumulators + q/k operands fit the 16 registers */
    for (int j0 = 0; j0 < np; j0 += NP) qkf_tile(k, rb, np, j0, q, hd, s, pf, NP, NH, t);
}

AI void qkf_t(const uint8_t *k, size_t rb, int np, const float *q, int nr, int hd, float *s, const int t) {
    int r = 0;
    for (; nr - r >= 8; r += 8) qkf_rows(k, rb, np, q + (size_t)r * hd, hd, s + r * BP, r == 0, 8, t);
    if (nr - r >= 4) {
        qkf_rows(k, rb, np, q + (size_t)r * hd, hd, s + r * BP, r == 0, 4, t);
        r += 4;
    }
    if (nr - r >= 2) {
        qkf_rows(k, rb, np, q + (size_t)r * hd, hd, s + r * BP, r == 0, 2, t);
        r += 2;
    }
    if (nr - r >= 1) qkf_rows(k, rb, np, q + (size_t)r * hd, hd, s + r * BP, r == 0, 1, t);
}

/* ---- q·k, q4/q8 K: int8 queries, integer dot products ---- */

/* q8 K: one group of 4 query rows × one K block, q[e] in natural order, dq
 * the row scales in lanes e and 4+e (the hadd tree leaves two halves that are
 * added at the end). */
typedef struct {
    int8_t q[4][32];
    float dq[8];
} q8prep;

/* Quantizes 32 query values to int8 (scale absmax/127, round to nearest
 * even, clamped against rounding past ±127); returns the scale, *sum = Σ. */
static float quant32(const float *x, int8_t *v, int *sum) {
    __m256 am = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; i++) am = _mm256_max_ps(am, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    int s = 0;
    for (int i = 0; i < 4; i++) {
        int32_t t[8];
        _mm256_storeu_si256((__m256i *)t, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id)));
        for (int j = 0; j < 8; j++) {
            const int c = t[j] > 127 ? 127 : t[j] < -127 ? -127 : t[j];
            v[8 * i + j] = (int8_t)c;
            s += c;
        }
    }
    *sum = s;
    return amax / 127.0f;
}

static size_t q_prep_bytes(kvq_cache_type tk, int nr, int hd);
typedef struct q4grp q4grp;
static void q4_prep(const float *q, int nr, int hd, q4grp *P);

static void q_prep(kvq_cache_type tk, const float *q, int nr, int hd, void *prep) {
    if (tk == KVQ_CACHE_Q4) q4_prep(q, nr, hd, prep);
    if (tk != KVQ_CACHE_Q8) return;
    const int nbk = hd / KVQ_QK;
    q8prep *P = prep;
    memset(P, 0, q_prep_bytes(tk, nr, hd)); /* pad rows contribute 0 */
    for (int r = 0; r < nr; r++) {
        const int e = r % 4;
        for (int b = 0; b < nbk; b++) {
            q8prep *pp = P + (r / 4) * nbk + b;
            int sum;
            const float dq = quant32(q + (size_t)r * hd + KVQ_QK * b, pp->q[e], &sum);
            pp->dq[e] = pp->dq[e + 4] = dq;
        }
    }
}

/* q8 scores of the 4 rows of a group for one K row, in lanes 0-3: |k| with
 * q's sign flipped where k < 0 (products ≤ 2·127² fit int16). */
AI __m128 q8_dot4(const uint8_t *row, const q8prep *G, int nbk) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 za = _mm256_setzero_ps();
    for (int b = 0; b < nbk; b++, G++) {
        const uint8_t *blk = row + (size_t)b * sizeof(kvq_block_q8);
        const __m256i ks = _mm256_loadu_si256((const __m256i *)(blk + 2)), kv = _mm256_abs_epi8(ks);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256i d[4];
        for (int e = 0; e < 4; e++)
            d[e] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(kv, _mm256_sign_epi8(_mm256_load_si256((const __m256i *)G->q[e]), ks)), ones);
        const __m256i z = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
        za = _mm256_fmadd_ps(_mm256_cvtepi32_ps(z), _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), _mm256_load_ps(G->dq)),
                             za);
    }
    return _mm_add_ps(_mm256_castps256_ps128(za), _mm256_extractf128_ps(za, 1));
}

AI void qk_q8_hd(const uint8_t *k, size_t rb, int np, const q8prep *P, int nr, int hd, float *s) {
    const int nbk = hd / KVQ_QK;
    for (int g = 0; g * 4 < nr; g++) {
        const q8prep *G = P + (size_t)g * nbk;
        const int ne = nr - 4 * g < 4 ? nr - 4 * g : 4;
        float *sg = s + 4 * g * BP;
        for (int j0 = 0; j0 < np; j0 += 4) {
            const uint8_t *r0 = k + (size_t)j0 * rb, *r1 = k + (size_t)(j0 + 1 < np ? j0 + 1 : np - 1) * rb;
            const uint8_t *r2 = k + (size_t)(j0 + 2 < np ? j0 + 2 : np - 1) * rb;
            const uint8_t *r3 = k + (size_t)(j0 + 3 < np ? j0 + 3 : np - 1) * rb;
            if (g == 0) {
                kvq_attn_prefetch_row(r0, rb);
                kvq_attn_prefetch_row(r1, rb);
                kvq_attn_prefetch_row(r2, rb);
                kvq_attn_prefetch_row(r3, rb);
            }
            __m128 z0 = q8_dot4(r0, G, nbk), z1 = q8_dot4(r1, G, nbk), z2 = q8_dot4(r2, G, nbk),
                   z3 = q8_dot4(r3, G, nbk);
            _MM_TRANSPOSE4_PS(z0, z1, z2, z3); /* now z_e = row e at positions j0..j0+3 */
            if (np - j0 >= 4) {
                _mm_storeu_ps(sg + j0, z0);
                if (ne > 1) _mm_storeu_ps(sg + BP + j0, z1);
                if (ne > 2) _mm_storeu_ps(sg + 2 * BP + j0, z2);
                if (ne > 3) _mm_storeu_ps(sg + 3 * BP + j0, z3);
            } else {
                float t[4][4];
                _mm_storeu_ps(t[0], z0);
                _mm_storeu_ps(t[1], z1);
                _mm_storeu_ps(t[2], z2);
                _mm_storeu_ps(t[3], z3);
                for (int e = 0; e < ne; e++)
                    for (int i = 0; i < np - j0; i++) sg[e * BP + j0 + i] = t[e][i];
            }
        }
    }
}

static void qk_q8(const uint8_t *k, size_t rb, int np, const q8prep *P, int nr, int hd, float *s) {
    BY_HD(hd, BY_NR(nr, qk_q8_hd(k, rb, np, P, NR, HD, s)))
}

/* q4 K with positions in lanes: 16 K rows of one block are transposed so
 * that int16 lane p of vector i holds bytes 2i, 2i+1 of row p (values 2i,
 * 2i+1 in the low nibbles, 16+2i, 17+2i in the high ones). vpmaddubsw with
 * a vector of row h's q pair for those values then yields 2 products per
 * position, and summing the 8 low-nibble (and 8 high-nibble) vectors stays
 * within int16 (8·2·15·127 < 2^15): no horizontal sums, and the block
 * scales of 16 positions apply as one vector. q4grp.ql[b][i][h] holds row
 * h's (q[2i], q[2i+1]) repeated over the vector, qh the same for 16+2i. */
struct q4grp {
    int8_t ql[8][4][32];
    int8_t qh[8][4][32];
    int32_t c[4]; /* 8·Σq of the block, row h */
    float dq[4];
};

static size_t q_prep_bytes(kvq_cache_type tk, int nr, int hd) {
    const size_t groups = (size_t)((nr + 3) / 4), nbk = (size_t)(hd / KVQ_QK);
    if (tk == KVQ_CACHE_Q4) return groups * nbk * sizeof(q4grp);
    if (tk == KVQ_CACHE_Q8) return groups * nbk * sizeof(q8prep);
    return 0;
}

static void q4_prep(const float *q, int nr, int hd, q4grp *P) {
    const int nbk = hd / KVQ_QK;
    memset(P, 0, (size_t)((nr + 3) / 4) * nbk * sizeof *P); /* pad rows contribute 0 */
    for (int r = 0; r < nr; r++) {
        const int h = r % 4;
        for (int b = 0; b < nbk; b++) {
            q4grp *pp = P + (r / 4) * nbk + b;
            int8_t v[32];
            int sum = 0;
            const float dq = quant32(q + (size_t)r * hd + KVQ_QK * b, v, &sum);
            for (int i = 0; i < 8; i++)
                for (int l = 0; l < 16; l++) {
                    pp->ql[i][h][2 * l] = v[2 * i];
                    pp->ql[i][h][2 * l + 1] = v[2 * i + 1];
                    pp->qh[i][h][2 * l] = v[16 + 2 * i];
                    pp->qh[i][h][2 * l + 1] = v[17 + 2 * i];
                }
            pp->c[h] = 8 * sum;
            pp->dq[h] = dq;
        }
    }
}

/* Low and high nibbles of 16 rows' block (byte offset off), transposed: kt[i], kt[8+i]. */
AI void q4_transpose16(const uint8_t *const *rows, size_t off, __m256i *kt) {
    __m256i R[8], A[8], B[8];
    for (int p = 0; p < 8; p++)
        R[p] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[p] + off))),
                                       _mm_loadu_si128((const __m128i *)(rows[p + 8] + off)), 1);
    for (int p = 0; p < 4; p++) {
        A[2 * p] = _mm256_unpacklo_epi16(R[2 * p], R[2 * p + 1]);
        A[2 * p + 1] = _mm256_unpackhi_epi16(R[2 * p], R[2 * p + 1]);
    }
    B[0] = _mm256_unpacklo_epi32(A[0], A[2]);
    B[1] = _mm256_unpackhi_epi32(A[0], A[2]);
    B[2] = _mm256_unpacklo_epi32(A[1], A[3]);
    B[3] = _mm256_unpackhi_epi32(A[1], A[3]);
    B[4] = _mm256_unpacklo_epi32(A[4], A[6]);
    B[5] = _mm256_unpackhi_epi32(A[4], A[6]);
    B[6] = _mm256_unpacklo_epi32(A[5], A[7]);
    B[7] = _mm256_unpackhi_epi32(A[5], A[7]);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 4; i++) {
        const __m256i x0 = _mm256_unpacklo_epi64(B[i], B[i + 4]), x1 = _mm256_unpackhi_epi64(B[i], B[i + 4]);
        kt[2 * i] = _mm256_and_si256(x0, m4);
        kt[2 * i + 1] = _mm256_and_si256(x1, m4);
        kt[8 + 2 * i] = _mm256_and_si256(_mm256_srli_epi16(x0, 4), m4);
        kt[8 + 2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(x1, 4), m4);
    }
}

AI void qk_q4_hd(const uint8_t *k, size_t rb, int np, const q4grp *P, int nr, int hd, float *s) {
    const int nbk = hd / KVQ_QK;
    float D[NB_MAX * BP];
    gather_scales(k, rb, np, nbk, sizeof(kvq_block_q4), D);
    for (int b = 0; b < nbk; b++)
        for (int j = (np + 7) & ~7; j < BP; j++) D[b * BP + j] = 0.0f;
    for (int j0 = 0; j0 < np; j0 += 16) {
        const uint8_t *rows[16];
        for (int p = 0; p < 16; p++) {
            rows[p] = k + (size_t)(j0 + p < np ? j0 + p : np - 1) * rb;
            kvq_attn_prefetch_row(rows[p], rb);
        }
        for (int g = 0; g * 4 < nr; g++) {
            const int ne = nr - 4 * g < 4 ? nr - 4 * g : 4;
            __m256 za[4][2], zb[4][2]; /* from values 0-15 of each block (offset removed), 16-31 */
            for (int h = 0; h < 4; h++) za[h][0] = za[h][1] = zb[h][0] = zb[h][1] = _mm256_setzero_ps();
            for (int b = 0; b < nbk; b++) {
                const q4grp *G = P + (size_t)g * nbk + b;
                __m256i kt[16];
                q4_transpose16(rows, (size_t)b * sizeof(kvq_block_q4) + 2, kt);
                __m256i al[4], ah[4];
                for (int h = 0; h < 4; h++) al[h] = ah[h] = _mm256_setzero_si256();
                for (int i = 0; i < 8; i++)
                    for (int h = 0; h < 4; h++) {
                        al[h] = _mm256_add_epi16(al[h], _mm256_maddubs_epi16(kt[i], _mm256_load_si256((const __m256i *)G->ql[i][h])));
                        ah[h] = _mm256_add_epi16(ah[h], _mm256_maddubs_epi16(kt[8 + i], _mm256_load_si256((const __m256i *)G->qh[i][h])));
                        /* in order: GCC otherwise forms all 64 products first and spills them */
                        __asm__ volatile("" : "+x"(al[h]), "+x"(ah[h]));
                    }
                /* positions in lane order [0-3, 8-11] and [4-7, 12-15] after the widening unpacks */
                const __m256 d0 = _mm256_loadu_ps(D + b * BP + j0), d1 = _mm256_loadu_ps(D + b * BP + j0 + 8);
                const __m256 dk0 = _mm256_permute2f128_ps(d0, d1, 0x20), dk1 = _mm256_permute2f128_ps(d0, d1, 0x31);
                /* Values 0-15 and 16-31 scale and accumulate apart, added at the end (as
                 * the q8 kernel's hadd tree does), so q4 scores round as a q8-style q4
                 * kernel's would. One merged sum measured 4.4e-5 instead of 7.9e-6 token-by-token
                 * vs batched logits error (test_kv_model, q4/q4). */
                for (int h = 0; h < 4; h++) {
                    const __m256i c = _mm256_set1_epi32(G->c[h]);
                    const __m256 dq = _mm256_set1_ps(G->dq[h]), dd0 = _mm256_mul_ps(dk0, dq), dd1 = _mm256_mul_ps(dk1, dq);
                    /* sign-extending widen: int16 lane p to the high half of int32 lane p, then >> 16 */
                    const __m256i l0 = _mm256_srai_epi32(_mm256_unpacklo_epi16(al[h], al[h]), 16);
                    const __m256i l1 = _mm256_srai_epi32(_mm256_unpackhi_epi16(al[h], al[h]), 16);
                    const __m256i h0 = _mm256_srai_epi32(_mm256_unpacklo_epi16(ah[h], ah[h]), 16);
                    const __m256i h1 = _mm256_srai_epi32(_mm256_unpackhi_epi16(ah[h], ah[h]), 16);
                    za[h][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(l0, c)), dd0, za[h][0]);
                    za[h][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(l1, c)), dd1, za[h][1]);
                    zb[h][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h0), dd0, zb[h][0]);
                    zb[h][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h1), dd1, zb[h][1]);
                }
            }
            float t[16];
            for (int h = 0; h < ne; h++) {
                float *sg = s + (size_t)(4 * g + h) * BP + j0;
                const __m256 z0 = _mm256_add_ps(za[h][0], zb[h][0]), z1 = _mm256_add_ps(za[h][1], zb[h][1]);
                const __m256 lo = _mm256_permute2f128_ps(z0, z1, 0x20), hi = _mm256_permute2f128_ps(z0, z1, 0x31);
                if (np - j0 >= 16) {
                    _mm256_storeu_ps(sg, lo);
                    _mm256_storeu_ps(sg + 8, hi);
                } else {
                    _mm256_storeu_ps(t, lo);
                    _mm256_storeu_ps(t + 8, hi);
                    for (int i = 0; i < np - j0; i++) sg[i] = t[i];
                }
            }
        }
    }
}

static void qk_q4(const uint8_t *k, size_t rb, int np, const q4grp *P, int nr, int hd, float *s) {
    BY_HD(hd, BY_NR(nr, qk_q4_hd(k, rb, np, P, NR, HD, s)))
}

static void qk(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep, int nr,
               int hd, float *s) {
    switch (tk) {
    case KVQ_CACHE_F32: BY_HD(hd, qkf_t(k, rb, np, q, nr, HD, s, KVQ_CACHE_F32)); break;
    case KVQ_CACHE_F16: BY_HD(hd, qkf_t(k, rb, np, q, nr, HD, s, KVQ_CACHE_F16)); break;
    case KVQ_CACHE_Q8: qk_q8(k, rb, np, prep, nr, hd, s); break;
    case KVQ_CACHE_Q4: qk_q4(k, rb, np, prep, nr, hd, s); break;
    }
}

/* ---- V accumulation: convert and FMA ---- */

/* acc rows += Σ_j W[h*BP + j] · v_j for NH rows and G×8 columns from chunk c0
 * (q8/q4: W holds the weights times the scales of the block holding c0, and
 * q4 values are the raw nibbles, see av_group). */
AI void av_tile(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int c0, int pf,
                const int NH, const int G, const int t) {
    __m256 a[8];
    for (int h = 0; h < NH; h++)
        for (int g = 0; g < G; g++) a[h * G + g] = _mm256_loadu_ps(acc + (size_t)h * hd + 8 * (c0 + g));
    /* c0 is a multiple of G (which divides 4): chunk c0+g is chunk g from here, constant offsets */
    const uint8_t *row = v + chunk_offset(c0, t);
    for (int j = 0; j < np; j++, row += rb, W++) {
        if (pf) kvq_attn_prefetch_row(row - chunk_offset(c0, t), rb);
        __m256 x[4];
        for (int g = 0; g < G; g++) x[g] = ld8(row, g + (c0 & 3), t);
        for (int h = 0; h < NH; h++)
            for (int g = 0; g < G; g++)
                a[h * G + g] = _mm256_fmadd_ps(x[g], _mm256_broadcast_ss(&W[h * BP]), a[h * G + g]);
    }
    for (int h = 0; h < NH; h++)
        for (int g = 0; g < G; g++) _mm256_storeu_ps(acc + (size_t)h * hd + 8 * (c0 + g), a[h * G + g]);
}

AI void av_rows(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int pf, const int NH,
                const int t) {
    const int nch = hd / 8; /* a multiple of 4 */
    const int q = t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4;
    /* ≤ 8 accumulators; G divides 4 so a tile never straddles a block */
    const int G = NH >= 8 ? 1 : NH >= 4 ? 2 : 4;
    for (int c0 = 0; c0 < nch; c0 += G)
        av_tile(v, rb, np, q ? W + (c0 >> 2) * NH * BP : W, acc, hd, c0, pf && c0 == 0, NH, G, t);
}

/* NH rows from w; q8/q4: WD[(b*NH + h)*BP + j] = w[h][j] · scale of block b of row j. */
AI void av_group(const uint8_t *v, size_t rb, int np, const float *w, int hd, float *acc, const float *D, float *WD,
                 int pf, const int NH, const int t) {
    if (t == KVQ_CACHE_F32 || t == KVQ_CACHE_F16) {
        av_rows(v, rb, np, w, acc, hd, pf, NH, t);
        return;
    }
    const int np8 = (np + 7) & ~7; /* w and D rows are BP long, so rounding up stays in bounds */
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float corr[8 * NB_MAX];
    for (int b = 0; b < hd / KVQ_QK; b++)
        for (int h = 0; h < NH; h++) {
            __m256 sum = _mm256_setzero_ps();
            for (int j = 0; j < np8; j += 8) {
                const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + h * BP + j), _mm256_loadu_ps(D + b * BP + j));
                _mm256_storeu_ps(WD + (b * NH + h) * BP + j, x);
                if (t == KVQ_CACHE_Q4) { /* lanes past np: w is stale there; masking also drops NaN */
                    const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(np - j), lanes));
                    sum = _mm256_add_ps(sum, _mm256_and_ps(live, x));
                }
            }
            if (t == KVQ_CACHE_Q4) corr[b * NH + h] = 8.0f * hsum8(sum);
        }
    av_rows(v, rb, np, WD, acc, hd, pf, NH, t);
    /* q4 was accumulated as nibble·w·d: take the 8·Σ w·d of each block back off */
    if (t == KVQ_CACHE_Q4)
        for (int b = 0; b < hd / KVQ_QK; b++)
            for (int h = 0; h < NH; h++) {
                float *a = acc + (size_t)h * hd + KVQ_QK * b;
                const __m256 cv = _mm256_set1_ps(corr[b * NH + h]);
                for (int i = 0; i < KVQ_QK; i += 8) _mm256_storeu_ps(a + i, _mm256_sub_ps(_mm256_loadu_ps(a + i), cv));
            }
}

#include "cpu/attn/attn_av_shell.inc"

/* ---- V from int16 weights (av_blk): q4/q8 V ---- */

/* Why: the f32 path above spends a GQA-4 group 64 FMAs per position at head
 * dim 128 plus the conversions, which leaves q4 attention compute-bound.
 * vpmaddwd takes 8 columns × 2 positions (int16 values × int16 weights) per
 * instruction and the values only need widening, not converting. The weights
 * (softmax weight × V block scale) are rounded to 15 bits relative to the
 * largest one of their (row, V block): an error ≤ 2^-16 of that weight each,
 * far below the q4/q8 rounding of V itself. The driver's weights are relative
 * to fixed 64-position spans, so decode and prompt evaluation round alike, and
 * the integer sums are exact in any order. */

/* Row h < NH's weights for V block b as int16 pairs (Wq_j, Wq_j+1) per int32
 * at W2 + (h·NB + b)·BP/2 (0 at and past np); so = f·M/32767, the scale of
 * the integer sums (0: nothing to add), cs = 8·ΣWq (q4's +8 storage offset,
 * removed in integers). D: the V block scales (0 past np), Da = |D|. Returns
 * whether any row adds anything. In phases, so that the (row, block) pairs'
 * reductions and divisions overlap instead of forming one long chain. */
AI int wq_group(const float *w, const float *f, const float *D, const float *Da, int np, int32_t *W2, float *so,
                int32_t *cs, const int NB, const int NH, const int t) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float M[4 * NB_MAX];
    int live = 0;
    for (int h = 0; h < NH; h++) {
        if (!(f[h] > 0.0f)) { /* the row sees nothing here; its w may be anything */
            for (int b = 0; b < NB; b++) M[h * NB + b] = 0.0f;
            continue;
        }
        __m256 wr[BP / 8];
        for (int i = 0; i < BP / 8; i++) {
            wr[i] = _mm256_loadu_ps(w + (size_t)h * BP + 8 * i);
            if (np < BP) /* stale past np (NaN too) */
                wr[i] = _mm256_and_ps(wr[i], _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(np - 8 * i), lanes)));
        }
        for (int b = 0; b < NB; b++) { /* M = max |w·d| (w >= 0; q4 scales can be negative) */
            __m256 m0 = _mm256_mul_ps(wr[0], _mm256_loadu_ps(Da + b * BP)), m1 = _mm256_mul_ps(wr[1], _mm256_loadu_ps(Da + b * BP + 8));
            for (int i = 2; i < BP / 8; i += 2) {
                m0 = _mm256_max_ps(m0, _mm256_mul_ps(wr[i], _mm256_loadu_ps(Da + b * BP + 8 * i)));
                m1 = _mm256_max_ps(m1, _mm256_mul_ps(wr[i + 1], _mm256_loadu_ps(Da + b * BP + 8 * i + 8)));
            }
            m0 = _mm256_max_ps(m0, m1);
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            M[h * NB + b] = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        }
    }
    float inv[4 * NB_MAX];
    for (int h = 0; h < NH; h++)
        for (int b = 0; b < NB; b++) {
            const float m = M[h * NB + b];
            inv[h * NB + b] = m > 0.0f ? 32767.0f / m : 0.0f;
            so[h * NB + b] = m > 0.0f ? f[h] * m / 32767.0f : 0.0f;
            live |= m > 0.0f;
        }
    if (!live) return 0;
    for (int h = 0; h < NH; h++) {
        __m256 wr[BP / 8];
        for (int i = 0; i < BP / 8; i++) {
            wr[i] = _mm256_loadu_ps(w + (size_t)h * BP + 8 * i);
            if (np < BP)
                wr[i] = _mm256_and_ps(wr[i], _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(np - 8 * i), lanes)));
        }
        for (int b = 0; b < NB; b++) {
            /* |w·d|·32767/M rounds to ≤ 32767 (packs saturates the last ulp); inv = 0 leaves all 0 */
            const __m256 sc = _mm256_set1_ps(inv[h * NB + b]);
            int32_t *dst = W2 + (h * NB + b) * (BP / 2);
            __m256i sum = _mm256_setzero_si256();
            for (int i = 0; i < BP / 8; i += 2) {
                const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(wr[i], _mm256_loadu_ps(D + b * BP + 8 * i)), sc));
                const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(wr[i + 1], _mm256_loadu_ps(D + b * BP + 8 * i + 8)), sc));
                if (t == KVQ_CACHE_Q4) sum = _mm256_add_epi32(sum, _mm256_add_epi32(q0, q1));
                _mm256_storeu_si256((__m256i *)(dst + 4 * i),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), _MM_SHUFFLE(3, 1, 2, 0)));
            }
            if (t == KVQ_CACHE_Q4) {
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
                cs[h * NB + b] = 8 * _mm_cvtsi128_si32(s4);
            }
        }
    }
    return 1;
}

/* NH rows × 16 columns of V block b, positions in pairs: 8 int32 accumulators.
 * q4, bytes o..o+7 of the block: columns o.. (low nibbles) and 16+o.. (high).
 * The whole bytes (lo + 16·hi ≤ 255) are multiplied instead of masking out
 * the low nibbles, and 16·hi taken off at the end: 64·255·32767 < 2^31.
 * q8, bytes o..o+15: columns o.. and o+8.. (|values| ≤ 127). */
AI void avi_tile(const uint8_t *v, size_t rb, int np, const int32_t *W2, const float *so, const int32_t *cs,
                 float *acc, int hd, int b, int o, const int PF, const int NB, const int NH, const int t) {
    __m256i A[4][2];
    for (int h = 0; h < NH; h++) A[h][0] = A[h][1] = _mm256_setzero_si256();
    const uint8_t *pa = v + (size_t)b * block_bytes(t) + 2 + o;
    const int32_t *wb = W2 + b * (BP / 2); /* row h at wb + h·NB·BP/2 */
    for (int i = 0; 2 * i < np; i++, pa += 2 * rb, wb++) {
        const uint8_t *pb = 2 * i + 1 < np ? pa + rb : pa; /* odd np: the last row twice, weight 0 */
        if (PF) {
            kvq_attn_prefetch_row(pa - 2 - o, rb);
            kvq_attn_prefetch_row(pb - 2 - o, rb);
        }
        __m256i z0, z1;
        if (t == KVQ_CACHE_Q4) {
            z0 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)pa),
                                                         _mm_loadl_epi64((const __m128i *)pb)));
            z1 = _mm256_srli_epi16(z0, 4);
        } else {
            const __m128i xa = _mm_loadu_si128((const __m128i *)pa), xb = _mm_loadu_si128((const __m128i *)pb);
            z0 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(xa, xb));
            z1 = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(xa, xb));
        }
        for (int h = 0; h < NH; h++) {
            const __m256i wv = _mm256_set1_epi32(wb[h * NB * (BP / 2)]);
            /* the adds in asm: GCC (12) otherwise adds into the product's register
             * and copies that back to the accumulator, 8 extra moves per pair */
            const __m256i p0 = _mm256_madd_epi16(z0, wv), p1 = _mm256_madd_epi16(z1, wv);
            __asm__("vpaddd %1, %0, %0" : "+x"(A[h][0]) : "x"(p0));
            __asm__("vpaddd %1, %0, %0" : "+x"(A[h][1]) : "x"(p1));
        }
    }
    for (int h = 0; h < NH; h++) {
        const __m256 s = _mm256_set1_ps(so[h * NB + b]);
        float *a = acc + (size_t)h * hd + KVQ_QK * b + o;
        __m256i i0 = A[h][0], i1 = A[h][1];
        if (t == KVQ_CACHE_Q4) {
            const __m256i c = _mm256_set1_epi32(cs[h * NB + b]);
            i0 = _mm256_sub_epi32(_mm256_sub_epi32(i0, _mm256_slli_epi32(i1, 4)), c);
            i1 = _mm256_sub_epi32(i1, c);
        }
        float *a1 = a + (t == KVQ_CACHE_Q4 ? 16 : 8);
        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), s, _mm256_loadu_ps(a)));
        _mm256_storeu_ps(a1, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), s, _mm256_loadu_ps(a1)));
    }
}

AI void avi_group(const uint8_t *v, size_t rb, int np, const int32_t *W2, const float *so, const int32_t *cs,
                  float *acc, int hd, int pf, const int NB, const int NH, const int t) {
    const int step = t == KVQ_CACHE_Q4 ? 8 : 16, end = t == KVQ_CACHE_Q4 ? 16 : 32; /* bytes of a block */
    for (int b = 0; b < NB; b++)
        for (int o = 0; o < end; o += step) {
            if (pf && b == 0 && o == 0) /* first pass over the rows: hint the next block's */
                avi_tile(v, rb, np, W2, so, cs, acc, hd, b, o, 1, NB, NH, t);
            else
                avi_tile(v, rb, np, W2, so, cs, acc, hd, b, o, 0, NB, NH, t);
        }
}

AI void avi_rows(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int hd, float *acc,
                 const float *D, const float *Da, int pf, const int NB, const int NH, const int t) {
    float so[4 * NB_MAX];
    int32_t W2[4 * NB_MAX * BP / 2], cs[4 * NB_MAX];
    /* prompt tiles: whole groups (one query's heads) often see nothing of a block */
    if (wq_group(w, f, D, Da, np, W2, so, cs, NB, NH, t)) avi_group(v, rb, np, W2, so, cs, acc, hd, pf, NB, NH, t);
}

AI void avi_t(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr, int hd, float *acc,
              const int t) {
    const int nb = hd / KVQ_QK;
    float D[NB_MAX * BP], Da[NB_MAX * BP];
    gather_scales(v, rb, np, nb, block_bytes(t), D);
    for (int b = 0; b < nb; b++) {
        for (int j = (np + 7) & ~7; j < BP; j++) D[b * BP + j] = 0.0f; /* gather_scales zeroes up to here */
        for (int j = 0; j < BP; j += 8)
            _mm256_storeu_ps(Da + b * BP + j, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(D + b * BP + j)));
    }
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const float *wr = w + (size_t)r0 * BP, *fr = f + r0;
        float *ar = acc + (size_t)r0 * hd;
        switch (nr - r0 < 4 ? nr - r0 : 4) {
        case 4: avi_rows(v, rb, np, wr, fr, hd, ar, D, Da, r0 == 0, nb, 4, t); break;
        case 3: avi_rows(v, rb, np, wr, fr, hd, ar, D, Da, r0 == 0, nb, 3, t); break;
        case 2: avi_rows(v, rb, np, wr, fr, hd, ar, D, Da, r0 == 0, nb, 2, t); break;
        default: avi_rows(v, rb, np, wr, fr, hd, ar, D, Da, r0 == 0, nb, 1, t); break;
        }
    }
}

/* Full blocks of the common shapes with every size constant, as av_spec. */
AI void avi_spec(const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr, int hd, float *acc,
                 const int t) {
    if (np == BP && rb == kvq_kv_row_bytes(t, hd))
        BY_HD(hd, BY_NR(nr, avi_t(v, kvq_kv_row_bytes(t, HD), BP, w, f, NR, HD, acc, t)))
    else
        avi_t(v, rb, np, w, f, nr, hd, acc, t);
}

static int av_blk(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr,
                  int hd, float *acc) {
    if (tv == KVQ_CACHE_Q4)
        avi_spec(v, rb, np, w, f, nr, hd, acc, KVQ_CACHE_Q4);
    else if (tv == KVQ_CACHE_Q8)
        avi_spec(v, rb, np, w, f, nr, hd, acc, KVQ_CACHE_Q8);
    else
        return 0;
    return 1;
}

/* Measured at llama3-8b, 8k context (kvq-bench attn): q4 end to end ~12%
 * faster (q4_ms 34 -> 30), q8 ~3% (V accumulation ~18%). */
static unsigned av_blk_types(void) { return 1u << KVQ_CACHE_Q4 | 1u << KVQ_CACHE_Q8; }

/* ---- rotation ---- */

/* The reference's butterflies in the same order (bitwise the same result):
 * strides ≥ 8 pair whole vectors, strides 4..1 pair lanes of one vector
 * through a permute, x·(±1) + partner giving the sum or difference with one
 * rounding, as a + b or a − b does. */
static void hadamard(float *x, int n) {
    if (n < 8 || (n & (n - 1))) {
        kvq_ref_hadamard(x, n);
        return;
    }
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
        v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
        v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps(v, v, 1));
        _mm256_storeu_ps(x + i, v);
    }
    for (int len = 8; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
            }
    const __m256 sc = _mm256_set1_ps(1.0f / sqrtf((float)n));
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sc));
}

/* ---- softmax helpers ---- */

/* exp(x) for x <= 0: 2^n · p(r), |r| <= ln2/2, degree-6 Taylor (rel. error ~2e-7); x < -87 gives 0. */
AI __m256 exp8(__m256 x) {
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}


static float exp_sum(float *x, int n, float m) {
    __m256 sum = _mm256_setzero_ps();
    const __m256 mv = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) {
        /* the tail through exp8 as well: a position then gets the same weight
         * whether it ends a block (decode) or not (prompt), which av_blk's
         * rounded weights need, or the small difference becomes a rounding flip */
        float t[8];
        for (int k = 0; k < 8; k++) t[k] = i + k < n ? x[i + k] : -INFINITY;
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
        _mm256_storeu_ps(t, e);
        sum = _mm256_add_ps(sum, e);
        for (int k = 0; i + k < n; k++) x[i + k] = t[k];
    }
    return hsum8(sum);
}

static float vmax(const float *x, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float r = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static unsigned int8_q(void) { return 1u << KVQ_CACHE_Q4 | 1u << KVQ_CACHE_Q8; }

const kvq_attn_kernels kvq_attn_avx2 = {
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
