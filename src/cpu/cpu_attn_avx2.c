/* AVX2 + FMA + F16C attention kernels (the AVX-512 file's structure at 8 lanes).
 *
 * q·k with q4 K: query rows quantized to int8 per 32-value block (q_prep);
 * one K block (16 bytes of nibbles) expands to a ymm of 32 unsigned values
 * in natural order, vpmaddubsw + vpmaddwd give 8 partial sums per query row,
 * three hadds fold the 4 rows of a GQA group into one vector and the block
 * scales apply to all four at once. The +8 storage offset is removed with a
 * precomputed 8·Σq per block. q8 K goes the same way with vpsignb making
 * the K operand unsigned (|k|, sign moved onto q).
 *
 * q·k with f32/f16 K dequantizes 8 values at a time and FMAs them into
 * NP positions × NH rows of accumulators, reduced by one transpose-add tree.
 *
 * V: dequantize 8 values, FMA with the softmax weight (times the block scale
 * for q8/q4, folded in per block so dequantization is "integer to float"). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_attn_impl.h"

#define AI static inline __attribute__((always_inline))
#define BP KVQ_ATTN_BP
#define NB_MAX (KVQ_ATTN_HD_MAX / KVQ_QK)

static size_t block_bytes(kvq_cache_type t) {
    return t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4);
}

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

/* Values 8c .. 8c+7 of a row as f32, without the block scale for q8/q4;
 * raw4: q4 nibbles without the -8 (the caller corrects sums instead). */
AI __m256 ld8(const uint8_t *row, int c, const int t, const int raw4) {
    if (t == KVQ_CACHE_F32) return _mm256_loadu_ps((const float *)row + 8 * c);
    if (t == KVQ_CACHE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16 * c)));
    if (t == KVQ_CACHE_Q8) {
        const uint8_t *b = row + (size_t)(c >> 2) * sizeof(kvq_block_q8) + 2 + 8 * (c & 3);
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)b)));
    }
    /* q4 chunk c: bytes 8·(c&1).. of block c/4, low nibbles for (c&3) < 2, high ones after. */
    const uint8_t *b = row + (size_t)(c >> 2) * sizeof(kvq_block_q4) + 2 + 8 * (c & 1);
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
    v = (c & 2) ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
    if (!raw4) v = _mm256_sub_epi32(v, _mm256_set1_epi32(8));
    return _mm256_cvtepi32_ps(v);
}

/* Byte offset of the block-aligned chunk group holding chunk c (8 values each): whole
 * blocks for q8/q4 (ld8 then takes the chunk index within the block). */
AI size_t chunk_offset(int c, const int t) {
    if (t == KVQ_CACHE_F32) return (size_t)(c >> 2) * 128;
    if (t == KVQ_CACHE_F16) return (size_t)(c >> 2) * 64;
    return (size_t)(c >> 2) * (t == KVQ_CACHE_Q8 ? sizeof(kvq_block_q8) : sizeof(kvq_block_q4));
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

/* ---- q·k, f32/f16/q8 K: dequantize and FMA ---- */

AI void qkf_tile(const uint8_t *k, size_t rb, int np, int j0, const float *q, int hd, const float *D, float *s,
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
            __m256 x = ld8(row[i], c, t, 0);
            if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) x = _mm256_mul_ps(x, _mm256_set1_ps(D[(c >> 2) * BP + jj[i]]));
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

AI void qkf_rows(const uint8_t *k, size_t rb, int np, const float *q, int hd, const float *D, float *s, int pf,
                 const int NH, const int t) {
    const int NP = 8 / NH; /* 8 accumulators + q/k operands fit the 16 registers */
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

/* ---- q·k, q4/q8 K: int8 queries, integer dot products ---- */

/* One group of 4 query rows × one K block: q[e] in natural order; c holds
 * 8·Σq of row e in lane e (lanes 4-7 zero: the hadd tree leaves two halves
 * that are added at the end), dq the row scales repeated in both halves. */
typedef struct {
    int8_t q[4][32];
    int32_t c[8];
    float dq[8];
} q4prep;

static size_t q_prep_bytes(kvq_cache_type tk, int nr, int hd) {
    if (tk != KVQ_CACHE_Q4 && tk != KVQ_CACHE_Q8) return 0;
    return (size_t)((nr + 3) / 4) * (size_t)(hd / KVQ_QK) * sizeof(q4prep);
}

static void q_prep(kvq_cache_type tk, const float *q, int nr, int hd, void *prep) {
    if (tk != KVQ_CACHE_Q4 && tk != KVQ_CACHE_Q8) return;
    const int nbk = hd / KVQ_QK;
    q4prep *P = prep;
    memset(P, 0, q_prep_bytes(tk, nr, hd)); /* pad rows contribute 0 */
    for (int r = 0; r < nr; r++) {
        const int e = r % 4;
        for (int b = 0; b < nbk; b++) {
            q4prep *pp = P + (r / 4) * nbk + b;
            const float *x = q + (size_t)r * hd + KVQ_QK * b;
            __m256 am = _mm256_setzero_ps();
            const __m256 sign = _mm256_set1_ps(-0.0f);
            for (int i = 0; i < 4; i++) am = _mm256_max_ps(am, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            int sum = 0;
            for (int i = 0; i < 4; i++) {
                int32_t v[8];
                _mm256_storeu_si256((__m256i *)v, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id)));
                for (int j = 0; j < 8; j++) {
                    const int c = v[j] > 127 ? 127 : v[j] < -127 ? -127 : v[j];
                    pp->q[e][8 * i + j] = (int8_t)c;
                    sum += c;
                }
            }
            pp->c[e] = tk == KVQ_CACHE_Q4 ? 8 * sum : 0; /* q8 needs no offset correction */
            pp->dq[e] = pp->dq[e + 4] = amax / 127.0f;
        }
    }
}

/* Scores of the 4 rows of a group for one K row, in lanes 0-3. q4: the
 * unsigned nibbles go straight into vpmaddubsw; q8: |k| with q's sign
 * flipped where k < 0 (products ≤ 2·127² fit int16). */
AI __m128 int_dot4(const uint8_t *row, const q4prep *G, int nbk, const int t) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const size_t bsz = t == KVQ_CACHE_Q4 ? sizeof(kvq_block_q4) : sizeof(kvq_block_q8);
    __m256 za = _mm256_setzero_ps();
    for (int b = 0; b < nbk; b++, G++) {
        const uint8_t *blk = row + (size_t)b * bsz;
        __m256i kv, ks = _mm256_setzero_si256();
        if (t == KVQ_CACHE_Q4) {
            const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 2));
            /* low nibbles = values 0..15, high = 16..31: natural order in one ymm */
            kv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
        } else {
            ks = _mm256_loadu_si256((const __m256i *)(blk + 2));
            kv = _mm256_abs_epi8(ks);
        }
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256i d[4];
        for (int e = 0; e < 4; e++) {
            __m256i qe = _mm256_load_si256((const __m256i *)G->q[e]);
            if (t == KVQ_CACHE_Q8) qe = _mm256_sign_epi8(qe, ks);
            d[e] = _mm256_madd_epi16(_mm256_maddubs_epi16(kv, qe), ones);
        }
        __m256i z = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
        if (t == KVQ_CACHE_Q4) z = _mm256_sub_epi32(z, _mm256_load_si256((const __m256i *)G->c));
        za = _mm256_fmadd_ps(_mm256_cvtepi32_ps(z), _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), _mm256_load_ps(G->dq)),
                             za);
    }
    return _mm_add_ps(_mm256_castps256_ps128(za), _mm256_extractf128_ps(za, 1));
}

AI void qk_int(const uint8_t *k, size_t rb, int np, const q4prep *P, int nr, int hd, float *s, const int t) {
    const int nbk = hd / KVQ_QK;
    for (int g = 0; g * 4 < nr; g++) {
        const q4prep *G = P + (size_t)g * nbk;
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
            __m128 z0 = int_dot4(r0, G, nbk, t), z1 = int_dot4(r1, G, nbk, t), z2 = int_dot4(r2, G, nbk, t),
                   z3 = int_dot4(r3, G, nbk, t);
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

static void qk(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep, int nr,
               int hd, float *s) {
    switch (tk) {
    case KVQ_CACHE_F32: qkf_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_F32); break;
    case KVQ_CACHE_F16: qkf_t(k, rb, np, q, nr, hd, s, KVQ_CACHE_F16); break;
    case KVQ_CACHE_Q8: qk_int(k, rb, np, prep, nr, hd, s, KVQ_CACHE_Q8); break;
    case KVQ_CACHE_Q4: qk_int(k, rb, np, prep, nr, hd, s, KVQ_CACHE_Q4); break;
    }
}

/* ---- V accumulation ---- */

/* acc rows += Σ_j weight · v_j for NH rows and G×8 columns from chunk c0.
 * Weight of row h, chunk c0+g, position j: W[((g/4)*NH + h)*BP + j] for
 * q8/q4 (block scale folded in, see av_group), W[h*BP + j] otherwise. */
AI void av_tile(const uint8_t *v, size_t rb, int np, const float *W, float *acc, int hd, int c0, int pf,
                const int NH, const int G, const int t) {
    const int q = t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4;
    __m256 a[8];
    for (int h = 0; h < NH; h++)
        for (int g = 0; g < G; g++) a[h * G + g] = _mm256_loadu_ps(acc + (size_t)h * hd + 8 * (c0 + g));
    /* c0 is a multiple of G (which divides 4): chunk c0+g is chunk g from here, constant offsets */
    const uint8_t *row = v + chunk_offset(c0, t);
    for (int j = 0; j < np; j++, row += rb, W++) {
        if (pf) kvq_attn_prefetch_row(row - chunk_offset(c0, t), rb);
        __m256 x[4];
        for (int g = 0; g < G; g++) x[g] = ld8(row, g + (c0 & 3), t, 1);
        for (int h = 0; h < NH; h++)
            for (int g = 0; g < G; g++)
                a[h * G + g] =
                    _mm256_fmadd_ps(x[g], _mm256_broadcast_ss(&W[(q ? (g >> 2) * NH + h : h) * BP]), a[h * G + g]);
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

/* NH rows from w: for q8/q4, WD[(b*NH + h)*BP + j] = w[h][j] · scale of block b of row j. */
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
                const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(np - j), lanes));
                sum = _mm256_add_ps(sum, _mm256_and_ps(live, x));
            }
            corr[b * NH + h] = 8.0f * hsum8(sum);
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

AI void av_t(const uint8_t *v, size_t rb, int np, const float *w, int nr, int hd, float *acc, const int t) {
    float D[NB_MAX * BP], WD[8 * NB_MAX * BP];
    if (t == KVQ_CACHE_Q8 || t == KVQ_CACHE_Q4) gather_scales(v, rb, np, hd / KVQ_QK, block_bytes(t), D);
    int r = 0;
    for (; nr - r >= 8; r += 8) av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, r == 0, 8, t);
    if (nr - r >= 4) {
        av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, r == 0, 4, t);
        r += 4;
    }
    if (nr - r >= 2) {
        av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, r == 0, 2, t);
        r += 2;
    }
    if (nr - r >= 1) av_group(v, rb, np, w + r * BP, hd, acc + (size_t)r * hd, D, WD, r == 0, 1, t);
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
    float s = hsum8(sum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
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
    .exp_sum = exp_sum,
    .max = vmax,
    .int8_q = int8_q,
};
