/* AQLM weights on the CPU: upload (validation, repacking) and the scalar
 * kernels every SIMD path is checked against.
 *
 * Two layouts, picked by code width:
 *  - nbits == 8 ("LUT"): per token we build one 256-entry table per step
 *    s = (group g, codebook m): table_s[c] = codebook[m][c]·x_g. Each output is
 *    then a sum of G*M table lookups. Codes are stored uint8 [s][rows]: a step's
 *    codes for consecutive rows are contiguous, so kernels run s in the outer
 *    loop with one 1 KB table hot (in L1, or in registers with VBMI) and
 *    stream 16/64 rows' codes per lookup instruction.
 *  - nbits > 8 ("GATHER"): a table would be 2^nbits entries per step, so we
 *    load the codewords themselves (fp16 codebooks, widened in registers) and
 *    FMA them with x. Codes are uint16 [row][g][m].
 *
 * Repacked once at load, the mapping's pages of the originals then dropped
 * (resident memory holds the codes once): LUT codes are transposed (the
 * lookups need one step's codes of many rows side by side); GATHER codebook
 * and codes are copied into one huge-page block (gather_block: read from the
 * page-cache mapping they ran at half speed). With the opt-in int8 codebook
 * (desc cb8) a one-codebook GATHER weight holds an int8 codebook instead of
 * the fp16 one, and with desc i8 int8 codewords with scales by class
 * (aqlm/aqlm_i8.c). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/aqlm/aqlm_kernels.h"
#include "util.h"

static const char *wname(const kvq_weight_desc *d) { return d->name ? d->name : "(unnamed weight)"; }

static int check(const kvq_weight_desc *d) {
    const char *nm = wname(d);
    if (d->n_codebooks < 1 || d->n_codebooks > 8)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM with %d codebooks (supported: 1..8)", nm, d->n_codebooks);
    if (d->nbits < 8 || d->nbits > 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM with %d-bit codes (supported: 8..16)", nm, d->nbits);
    if (d->in_group != 8 && d->in_group != 16)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: AQLM in_group %d (supported: 8, 16)", nm, d->in_group);
    if (d->cols % d->in_group != 0)
        return kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: cols %d not a multiple of AQLM in_group %d", nm, d->cols,
                        d->in_group);
    if ((d->code_bytes != 1 && d->code_bytes != 2) || d->code_bytes * 8 < d->nbits)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: %d-byte AQLM codes cannot hold %d bits", nm, d->code_bytes, d->nbits);
    if (!d->codes || !d->codebooks || !d->scales)
        return kvq_fail(KVQ_ERR_FORMAT, "%s: AQLM weight without codes, codebooks or scales", nm);
    return KVQ_OK;
}

/* Aligned array owned by w (counted in w->bytes); NULL + kvq_fail on failure. */
static void *alloc_for(size_t n, size_t size, kvq_cpu_weight *w, const kvq_weight_desc *d) {
    size_t bytes;
    void *p = kvq_mul_ok(n, size, &bytes) ? kvq_alloc_aligned(bytes ? bytes : 1) : NULL;
    if (!p) {
        kvq_fail(KVQ_ERR_NOMEM, "%s: cannot allocate %zu x %zu bytes for AQLM weight", wname(d), n, size);
        return NULL;
    }
    w->bytes += bytes;
    return p;
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* 16x16 byte transpose in four unpack stages (SSE2, every x86-64): row x[i]
 * ends up holding column bitrev4(i). A 7B 2x8 load spent half the CPU time
 * it did not spend zeroing fresh pages in the 8x8 swaps below; on a 2-core
 * EPYC VM an 11008x4096 tensor transposed at 2.5 GB/s with these against 0.9
 * (source in memory; from the page-cache mapping 1.2 against 0.8). */
static inline void transpose16x16(__m128i x[16]) {
    __m128i y[16];
    for (int i = 0; i < 8; i++) y[i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]), y[i + 8] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
    for (int i = 0; i < 8; i++) x[i] = _mm_unpacklo_epi16(y[2 * i], y[2 * i + 1]), x[i + 8] = _mm_unpackhi_epi16(y[2 * i], y[2 * i + 1]);
    for (int i = 0; i < 8; i++) y[i] = _mm_unpacklo_epi32(x[2 * i], x[2 * i + 1]), y[i + 8] = _mm_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    for (int i = 0; i < 8; i++) x[i] = _mm_unpacklo_epi64(y[2 * i], y[2 * i + 1]), x[i + 8] = _mm_unpackhi_epi64(y[2 * i], y[2 * i + 1]);
}
#endif

/* x[i] byte j <-> x[j] byte i (8x8 byte transpose, three swap stages). */
static inline void transpose8x8(uint64_t x[8]) {
    for (int i = 0; i < 4; i++) {
        uint64_t t = ((x[i] >> 32) ^ x[i + 4]) & 0x00000000ffffffffull;
        x[i + 4] ^= t, x[i] ^= t << 32;
    }
    for (int i = 0; i < 8; i += (i & 1) ? 3 : 1) { /* 0,1,4,5 */
        uint64_t t = ((x[i] >> 16) ^ x[i + 2]) & 0x0000ffff0000ffffull;
        x[i + 2] ^= t, x[i] ^= t << 16;
    }
    for (int i = 0; i < 8; i += 2) {
        uint64_t t = ((x[i] >> 8) ^ x[i + 1]) & 0x00ff00ff00ff00ffull;
        x[i + 1] ^= t, x[i] ^= t << 8;
    }
}

/* Steps [s0, s1) of 64 full rows of int8 codes from [row][S] into [S][pad]
 * (16x16 byte tiles with SSE2, else 8x8; the last few steps bytewise). */
static void transpose_tile(uint8_t *dst, const uint8_t *src, size_t S, size_t pad, size_t s0, size_t s1) {
    size_t s = s0;
#if defined(__SSE2__)
    static const uint8_t rev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    for (; s + 16 <= s1; s += 16)
        for (size_t r = 0; r < 64; r += 16) {
            __m128i x[16];
            for (size_t i = 0; i < 16; i++) x[i] = _mm_loadu_si128((const __m128i *)(const void *)(src + (r + i) * S + s));
            transpose16x16(x);
            for (size_t j = 0; j < 16; j++) _mm_storeu_si128((__m128i *)(void *)(dst + (s + rev[j]) * pad + r), x[j]);
        }
#endif
    for (; s + 8 <= s1; s += 8)
        for (size_t r = 0; r < 64; r += 8) {
            uint64_t x[8];
            for (int i = 0; i < 8; i++) memcpy(&x[i], src + (r + (size_t)i) * S + s, 8);
            transpose8x8(x);
            for (int j = 0; j < 8; j++) memcpy(dst + (s + (size_t)j) * pad + r, &x[j], 8);
        }
    for (; s < s1; s++)
        for (size_t r = 0; r < 64; r++) dst[s * pad + r] = src[r * S + s];
}

/* Codes for all rows, reduced mod 2^nbits, into the layout of w->kind. */
static void repack_codes(kvq_cpu_weight *w, const kvq_weight_desc *d) {
    size_t S = (size_t)w->G * w->M, rows = (size_t)w->rows, pad = (size_t)w->rows_pad;
    uint32_t mask = (1u << d->nbits) - 1u;
    if (w->kind == KVQ_CW_AQLM_LUT) {
        uint8_t *dst = w->codes;
        const uint8_t *src8 = d->codes;
        long n_chunk = (long)((S + 63) / 64), n_blk = (long)(pad / 64);
        /* Tiles of 64 steps x 64 rows, a chunk of 64 steps (all rows) per
         * task: a thread writes 64 destination pages line after line (few TLB
         * misses, each page first touched by its writer) while the source
         * streams past once. Rows row-major by step was 2-3x slower. */
#pragma omp parallel for schedule(dynamic, 1)
        for (long c = 0; c < n_chunk; c++) {
            size_t s0 = (size_t)c * 64, s1 = s0 + 64 < S ? s0 + 64 : S;
            for (long b = 0; b < n_blk; b++) {
                size_t o0 = (size_t)b * 64, o1 = o0 + 64 < rows ? o0 + 64 : rows;
                if (d->code_bytes == 1 && o1 - o0 == 64) { /* mask is 0xff */
                    transpose_tile(dst + o0, src8 + o0 * S, S, pad, s0, s1);
                    continue;
                }
                for (size_t s = s0; s < s1; s++)
                    for (size_t o = o0; o < o0 + 64; o++) { /* padding rows: code 0 (their scale is 0) */
                        uint32_t v = o >= o1 ? 0 : d->code_bytes == 1 ? src8[o * S + s] : kvq_rd_u16(d->codes, o * S + s);
                        dst[s * pad + o] = (uint8_t)(v & mask);
                    }
            }
        }
    } else {
        uint16_t *dst = w->codes;
        const uint16_t *perm = w->cbq_perm; /* int8 codewords: renumbered (aqlm/aqlm_i8.c) */
        long n_rows = (long)rows;
        if (!perm && d->code_bytes == 2) { /* the usual int16 codes: a copy, masked in place (both vectorize) */
            const uint16_t m16 = (uint16_t)mask;
#pragma omp parallel for schedule(static)
            for (long o = 0; o < n_rows; o++) {
                uint16_t *row = dst + (size_t)o * S;
                memcpy(row, (const uint8_t *)d->codes + (size_t)o * S * 2, S * 2);
                if (m16 != 0xffff)
                    for (size_t i = 0; i < S; i++) row[i] &= m16;
            }
        } else {
#pragma omp parallel for schedule(static)
            for (long o = 0; o < n_rows; o++)
                for (size_t i = (size_t)o * S; i < (size_t)(o + 1) * S; i++) {
                    uint32_t c = (d->code_bytes == 1 ? ((const uint8_t *)d->codes)[i] : kvq_rd_u16(d->codes, i)) & mask;
                    dst[i] = perm ? perm[c] : (uint16_t)c;
                }
        }
        free(w->cbq_perm);
        w->cbq_perm = NULL;
    }
}

/* The opt-in int8 codebook (desc cb8, one codebook): q = round(v / s) with
 * s = max|v| / 127, so |v - q*s| <= s/2 for every value. It replaces the
 * fp16 one (a weight is one or the other, so every kernel computes the same
 * weights). cb8_max: max |v| of the n fp16 values, or a non-finite value
 * when one is (those keep fp16). */
static float cb8_max(const kvq_weight_desc *d, size_t n) {
    float mx = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float v = fabsf(kvq_f16_to_f32(kvq_rd_u16(d->codebooks, i)));
        mx = v > mx || v != v ? v : mx;
    }
    return mx;
}

static void codebook_int8(kvq_cpu_weight *w, const kvq_weight_desc *d, size_t n, float mx, int8_t *dst) {
    w->cb8 = dst;
    w->cb8_scale = mx > 0.0f ? mx / 127.0f : 1.0f;
    float inv = 1.0f / w->cb8_scale;
    for (size_t i = 0; i < n; i++) dst[i] = (int8_t)lrintf(kvq_f16_to_f32(kvq_rd_u16(d->codebooks, i)) * inv);
}

/* GATHER weights: codebook and codes copied into one block of our own, the
 * codebook first. The block is in transparent huge pages (kvq_alloc_aligned),
 * and the codebook shares the first 2 MB page with the start of the codes:
 * the gathers' random codeword loads then miss no TLB, and the codes stream
 * from huge pages too. Read in place from the checkpoint's page-cache
 * mapping (4 KB pages) instead, 7B 1x16 decode ran at half the speed on a
 * Zen 5 VM with the same kernels (alternating runs: 1.24-1.30 tok/s against
 * 2.37-2.47 copied); the model's 4096x4096 GEMVs took 0.6-5.9 ms (mean 1.45)
 * instead of 0.56-0.7 ms (mean 0.65), as in kvq-bench aqlm.
 * The mapping's pages are released afterwards, so memory holds each once;
 * the copy costs load time (2.4 GB for a 7B 1x16). */
static int gather_block(kvq_cpu_weight *w, const kvq_weight_desc *d, size_t n_cb, size_t n_codes) {
    float mx = (d->cb8 || d->i8) && w->M == 1 ? cb8_max(d, n_cb) : 0.0f;
    int i8 = d->i8 && w->M == 1 && mx <= FLT_MAX; /* int8 codewords, integer dot products (aqlm/aqlm_i8.c) */
    int int8 = !i8 && d->cb8 && w->M == 1 && mx <= FLT_MAX;
    size_t cb_used = i8 ? kvq_i8_codebook_bytes(w) : n_cb * (int8 ? 1 : 2), cb_bytes = (cb_used + 63) / 64 * 64;
    uint8_t *block = alloc_for(cb_bytes + n_codes * 2, 1, w, d);
    if (!block) return KVQ_ERR_NOMEM;
    w->owned |= KVQ_OWN_BLOCK;
    w->block = block;
    w->bytes -= cb_bytes - cb_used; /* count what the kernels read */
    if (i8) {
        int st = kvq_i8_codebook(w, d, block);
        if (st != KVQ_OK) return st;
    } else if (int8) {
        codebook_int8(w, d, n_cb, mx, (int8_t *)block);
    } else {
        w->cb16 = (uint16_t *)block;
        memcpy(w->cb16, d->codebooks, n_cb * 2);
    }
    if (d->in_mapping) kvq_mmap_release(d->codebooks, n_cb * 2);
    w->codes = block + cb_bytes;
    return KVQ_OK;
}

int kvq_cpu_aqlm_init(kvq_cpu_weight *w, const kvq_weight_desc *d) {
    int st = check(d);
    if (st != KVQ_OK) return st;
    w->M = d->n_codebooks;
    w->nbits = d->nbits;
    w->ig = d->in_group;
    w->G = d->cols / d->in_group;
    w->kind = d->nbits == 8 ? KVQ_CW_AQLM_LUT : KVQ_CW_AQLM_GATHER;
    w->lut8 = d->lut8 && d->nbits == 8;
    w->exact = d->exact;
    w->rows_pad = (w->rows + KVQ_AQLM_RB - 1) / KVQ_AQLM_RB * KVQ_AQLM_RB;

    size_t K = (size_t)1 << d->nbits, M = (size_t)w->M, ig = (size_t)w->ig, n_cb = M * K * ig;
    int lut = w->kind == KVQ_CW_AQLM_LUT;
    size_t n_codes = (size_t)(lut ? w->rows_pad : w->rows) * (size_t)w->G * M; /* rows*cols was checked */
    /* The caller frees whatever was allocated when we fail half way. */
    if (lut) {
        if (!(w->codes = alloc_for(n_codes, 1, w, d))) return KVQ_ERR_NOMEM;
        w->owned |= KVQ_OWN_CODES;
    } else if ((st = gather_block(w, d, n_cb, n_codes)) != KVQ_OK) {
        return st;
    }
    if (!(w->scales = alloc_for((size_t)w->rows_pad, sizeof(float), w, d))) return KVQ_ERR_NOMEM;
    if (lut) {
        if (!(w->cb = alloc_for(n_cb, sizeof(float), w, d))) return KVQ_ERR_NOMEM;
        if (!(w->cb_t = alloc_for(n_cb, sizeof(float), w, d))) return KVQ_ERR_NOMEM;
        for (size_t i = 0; i < n_cb; i++) w->cb[i] = kvq_f16_to_f32(kvq_rd_u16(d->codebooks, i));
        for (size_t m = 0; m < M; m++)
            for (size_t c = 0; c < 256; c++)
                for (size_t j = 0; j < ig; j++) w->cb_t[(m * ig + j) * 256 + c] = w->cb[(m * 256 + c) * ig + j];
    }
    if (d->in_mapping) kvq_mmap_populate(d->codes, (size_t)w->rows * w->G * M * (size_t)d->code_bytes);
    repack_codes(w, d);
    if (d->in_mapping) kvq_mmap_release(d->codes, (size_t)w->rows * w->G * M * (size_t)d->code_bytes);
    for (int o = 0; o < w->rows_pad; o++)
        w->scales[o] = o < w->rows ? kvq_f16_to_f32(kvq_rd_u16(d->scales, (size_t)o)) : 0.0f;
    return KVQ_OK;
}

/* ---- scalar kernels ---- */

void kvq_aqlm_lut_build_scalar(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1) {
    int M = w->M, ig = w->ig;
    for (int g = g0; g < g1; g++) {
        const float *xg = x + (size_t)g * ig;
        for (int m = 0; m < M; m++) {
            float *l = lut + ((size_t)(g - g0) * M + m) * 256;
            const float *cb = w->cb + (size_t)m * 256 * ig;
            for (int c = 0; c < 256; c++) {
                float s = 0.0f;
                for (int j = 0; j < ig; j++) s += cb[c * ig + j] * xg[j];
                l[c] = s;
            }
        }
    }
}

void kvq_aqlm_lut_gemv_scalar(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1) {
    size_t S = (size_t)s1, n = (size_t)(r1 - r0), total = (size_t)w->G * w->M;
    const uint8_t *codes = (const uint8_t *)w->codes + r0;
    for (size_t s = (size_t)s0; s < S; s++) {
        const float *l = lut + (s - (size_t)s0) * 256;
        const uint8_t *c = codes + s * (size_t)w->rows_pad;
        if (s + KVQ_LUT_PREFETCH < total) /* a builtin, not an intrinsic: no-op where unsupported; runs on into the next chunk */
            for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + KVQ_LUT_PREFETCH * (size_t)w->rows_pad + i);
        for (size_t i = 0; i < n; i++) acc[i] += l[c[i]];
    }
}

void kvq_aqlm_gather_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1) {
    size_t ig = (size_t)w->ig, M = (size_t)w->M, cols = (size_t)w->cols, rows = (size_t)w->rows;
    for (int o = r0; o < r1; o++) {
        const uint16_t *c = (const uint16_t *)w->codes + (size_t)o * w->G * M;
        float acc[KVQ_GATHER_MAX_T] = {0};
        for (size_t g = 0; g < (size_t)w->G; g++, c += M) {
            for (size_t j = 0; j < ig; j++) {
                float v = 0.0f;
                for (size_t m = 0; m < M; m++) v += kvq_cw_val(w, m, c[m], j);
                for (int t = 0; t < n; t++) acc[t] += v * x[t * cols + g * ig + j];
            }
        }
        for (int t = 0; t < n; t++) y[t * rows + (size_t)o] = w->scales[o] * acc[t];
    }
}

void kvq_aqlm_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out) {
    size_t ig = (size_t)w->ig;
    for (int o = r0; o < r1; o++) {
        float *dst = out + (size_t)(o - r0) * w->cols, s = w->scales[o];
        for (size_t g = 0; g < (size_t)w->G; g++) {
            for (size_t j = 0; j < ig; j++) {
                float v = 0.0f;
                for (int m = 0; m < w->M; m++) v += kvq_cw_val(w, (size_t)m, kvq_cw_code(w, (size_t)o, g, (size_t)m), j);
                dst[g * ig + j] = s * v;
            }
        }
    }
}
