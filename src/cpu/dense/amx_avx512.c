/* Batched matmul on AMX tiles (Intel Sapphire Rapids and later) for prompts.
 *
 * bf16 tiles with f32 accumulation, made accurate by splitting both operands
 * into a high and a low bf16 part (v = hi + lo, |v - hi - lo| <= 2^-17 |v|) and
 * summing hi·hi + hi·lo + lo·hi: each product is then good to about 2^-16,
 * against 2^-8 for plain bf16 (test_matmul holds the path to KVQ_AMX_REL_L2).
 * Three tile products per pair of tiles still run far above AVX-512 FMA.
 *
 * Layouts: activations X [n_pad][kp] bf16 row-major (kp = cols rounded up to
 * 32, n_pad to 16, zero padding), packed once per matmul; weights are
 * dequantized 64 rows at a time and packed per 16-row group and 32-value K
 * chunk as the B operand wants it: 16 rows of 16 bf16 pairs, [k pair][row]. */
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu/dense/dense_kernels.h"

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int kvq_amx_probe(void) {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 24) & 1) || !((d >> 22) & 1)) return 0; /* AMX-TILE, AMX-BF16 */
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    if (!((a >> 5) & 1)) return 0; /* AVX512_BF16 for the conversions */
    /* Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

/* 16 f32 -> bf16 high parts (round to nearest even) and the bf16 of what is left. */
__attribute__((target("avx512bf16,avx512bw,avx512f"))) static inline void split16(__m512 v, __m256i *hi, __m256i *lo) {
    __m256bh h = _mm512_cvtneps_pbh(v);
    __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
    *hi = (__m256i)h;
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
}

__attribute__((target("avx512bf16,avx512bw,avx512f"))) void kvq_amx_pack_x(const float *x, int n, int cols, int t0,
                                                                             int t1, int kp, uint16_t *xh, uint16_t *xl) {
    for (int t = t0; t < t1; t++) {
        uint16_t *h = xh + (size_t)t * kp, *l = xl + (size_t)t * kp;
        for (int k = 0; k < kp; k += 16) {
            int left = t < n ? cols - k : 0;
            __mmask16 m = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
            __m256i vh, vl;
            split16(_mm512_maskz_loadu_ps(m, x + (size_t)t * cols + k), &vh, &vl);
            _mm256_storeu_si256((__m256i *)(h + k), vh);
            _mm256_storeu_si256((__m256i *)(l + k), vl);
        }
    }
}

/* 16x16 transpose of 32-bit elements: r[i] element j <-> r[j] element i. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* per 128-bit lane L, r[4i + j] then holds column 4L + j of rows 4i .. 4i + 3 */
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) { /* gather lane L of r[j], r[4+j], r[8+j], r[12+j] into column 4L + j */
        __m512i s1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), s2 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xee);
        __m512i s3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44), s4 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xee);
        t[j] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(s2, s4, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(s2, s4, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Rows [0, nr) (nr <= 64) of W (f32, ldw) -> B tiles, hi and lo: tile (g, kc) at
 * b + (g * nkc + kc) * 256 dwords, row i = bf16 pairs (k0 + 2i, k0 + 2i + 1) of the
 * group's 16 rows. Missing rows and K padding are zero. */
__attribute__((target("avx512bf16,avx512bw,avx512f"))) void kvq_amx_pack_w(const float *W, size_t ldw, int nr, int cols,
                                                                             int kp, uint32_t *bh, uint32_t *bl) {
    int nkc = kp / 32;
    for (int g = 0; g < 4; g++)
        for (int kc = 0; kc < nkc; kc++) {
            __m512i rh[16], rl[16];
            for (int j = 0; j < 16; j++) {
                int row = g * 16 + j, k = kc * 32, left = row < nr ? cols - k : 0;
                __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
                __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1u) : 0;
                const float *src = W + (size_t)(row < nr ? row : 0) * ldw + k;
                __m256i h0, l0, h1, l1;
                split16(_mm512_maskz_loadu_ps(m0, src), &h0, &l0);
                split16(_mm512_maskz_loadu_ps(m1, src + 16), &h1, &l1);
                rh[j] = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1); /* 16 pairs of this row */
                rl[j] = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
            }
            transpose16(rh);
            transpose16(rl);
            uint32_t *dh = bh + ((size_t)g * nkc + kc) * 256, *dl = bl + ((size_t)g * nkc + kc) * 256;
            for (int i = 0; i < 16; i++) {
                _mm512_storeu_si512(dh + 16 * i, rh[i]);
                _mm512_storeu_si512(dl + 16 * i, rl[i]);
            }
        }
}

/* y[t*ldy + r] for t < n, r < nr (<= 64) of this row block, from packed X (n_pad x kp) and W. */
__attribute__((target("amx-tile,amx-bf16"))) void kvq_amx_block(const uint16_t *xh, const uint16_t *xl, int n, int kp,
                                                                  const uint32_t *bh, const uint32_t *bl, int nr, float *y,
                                                                  size_t ldy) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    _tile_loadconfig(&cfg);
    int nkc = kp / 32, groups = (nr + 15) / 16;
    size_t xs = (size_t)kp * 2, gs = (size_t)nkc * 256;
    float out[16][64];
    for (int t0 = 0; t0 < n; t0 += 16) {
        /* tiles: 0-3 sums of the four 16-row groups, 4/5 X hi/lo, 6/7 W hi/lo */
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kc = 0; kc < nkc; kc++) {
            _tile_loadd(4, xh + (size_t)t0 * kp + kc * 32, xs);
            _tile_loadd(5, xl + (size_t)t0 * kp + kc * 32, xs);
#define KVQ_AMX_GROUP(g)                                    \
    if (g < groups) {                                       \
        _tile_loadd(6, bh + (g) * gs + (size_t)kc * 256, 64); \
        _tile_loadd(7, bl + (g) * gs + (size_t)kc * 256, 64); \
        _tile_dpbf16ps(g, 4, 6);                            \
        _tile_dpbf16ps(g, 4, 7);                            \
        _tile_dpbf16ps(g, 5, 6);                            \
    }
            KVQ_AMX_GROUP(0)
            KVQ_AMX_GROUP(1)
            KVQ_AMX_GROUP(2)
            KVQ_AMX_GROUP(3)
#undef KVQ_AMX_GROUP
        }
        _tile_stored(0, &out[0][0], 256);
        _tile_stored(1, &out[0][16], 256);
        _tile_stored(2, &out[0][32], 256);
        _tile_stored(3, &out[0][48], 256);
        int nt = n - t0 < 16 ? n - t0 : 16;
        for (int t = 0; t < nt; t++) memcpy(y + (size_t)(t0 + t) * ldy, out[t], sizeof(float) * (size_t)nr);
    }
    _tile_release();
}
