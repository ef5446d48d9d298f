/* Internals of the CPU matmul: the uploaded weight layout and the per-ISA
 * kernel tables. cpu_matmul.c owns dispatch and threading; kernels only ever
 * work on a row range, single-threaded. */
#ifndef KVQ_CPU_MATMUL_IMPL_H
#define KVQ_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_kernels.h"

/* AQLM rows are grouped in blocks of this many for the LUT path: codes of a
 * block for one (group, codebook) are 16 contiguous bytes = one gather. */
#define KVQ_AQLM_RB 16

typedef enum {
    KVQ_CW_DENSE = 0, /* F32/F16/BF16 kept as stored (2 bytes/value for halves) */
    KVQ_CW_AQLM_LUT,  /* nbits == 8: per-token lookup table of codeword·x dot products */
    KVQ_CW_AQLM_GATHER, /* nbits > 8: gather codewords (f32) and FMA with x */
} kvq_cw_kind;

struct kvq_cpu_weight {
    kvq_cw_kind kind;
    kvq_wformat fmt; /* dense storage format (kind == DENSE) */
    int rows, cols;
    size_t bytes; /* everything this weight owns */

    void *data;  /* dense values, rows*cols, 64-byte aligned */
    float *bias; /* f32 [rows] or NULL */

    /* AQLM */
    int M, nbits, ig, G; /* codebooks, bits per code, values per group, groups per row */
    int rows_pad;        /* rows rounded up to KVQ_AQLM_RB (LUT layout) */
    /* LUT: uint8 [rows_pad/RB][G][M][RB]; GATHER: uint16 [rows][G][M] (already mod 2^nbits) */
    void *codes;
    float *cb;     /* f32 codebooks [M][2^nbits][ig] */
    float *cb_t;   /* LUT only: transposed f32 codebooks [M][ig][256] (vector LUT build) */
    float *scales; /* f32 [rows_pad], zero past rows */
};

/* A kernel set for one ISA. All ranges are half-open; y/out are indexed from
 * the range start unless noted. */
typedef struct {
    /* Dense n=1: y[r] = W[r]·x for r in [r0, r1); y indexed by absolute row. */
    void (*dense_gemv)(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
    /* Dense rows [r0, r1) as f32 into out[(r-r0)*cols]. */
    void (*dense_rows)(const kvq_cpu_weight *w, int r0, int r1, float *out);
    /* y[t*ldy + i] = W[i*ldw ..]·x[t*cols ..] for i < nr, t < n (f32 tile times tokens). */
    void (*gemm)(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
    /* LUT build for groups [g0, g1): lut[(g*M + m)*256 + c] = cb[m][c]·x[g*ig ..]. */
    void (*lut_build)(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
    /* LUT gather for row blocks [b0, b1): y[o] = scale[o] * sum lut[...]; y absolute, rows < w->rows only. */
    void (*lut_gemv)(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1);
    /* Codeword gather for nbits > 8, rows [r0, r1); y absolute. */
    void (*gather_gemv)(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
    /* AQLM rows [r0, r1) dequantized (scale applied) into out[(r-r0)*cols]. */
    void (*aqlm_rows)(const kvq_cpu_weight *w, int r0, int r1, float *out);
} kvq_mm_kernels;

/* Code of (row o, group g, codebook m) in the uploaded layout. */
static inline uint32_t kvq_cw_code(const kvq_cpu_weight *w, size_t o, size_t g, size_t m) {
    if (w->kind == KVQ_CW_AQLM_LUT) {
        size_t b = o / KVQ_AQLM_RB, r = o % KVQ_AQLM_RB;
        return ((const uint8_t *)w->codes)[((b * (size_t)w->G + g) * (size_t)w->M + m) * KVQ_AQLM_RB + r];
    }
    return ((const uint16_t *)w->codes)[(o * (size_t)w->G + g) * (size_t)w->M + m];
}

/* cpu_aqlm.c: AQLM upload (fills the AQLM fields of w, adds to w->bytes). */
int kvq_cpu_aqlm_init(kvq_cpu_weight *w, const kvq_weight_desc *d);

/* Scalar kernels (cpu_matmul.c dense + gemm, cpu_aqlm.c AQLM). */
void kvq_dense_gemv_scalar(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
void kvq_dense_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_scalar(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_scalar(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_scalar(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1);
void kvq_aqlm_gather_gemv_scalar(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
void kvq_aqlm_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);

#if defined(__x86_64__)
/* cpu_dense_avx2.c / cpu_aqlm_avx2.c */
void kvq_dense_gemv_avx2(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
void kvq_dense_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_avx2(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_avx2(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_avx2(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1);
void kvq_aqlm_gather_gemv_avx2(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
void kvq_aqlm_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
/* cpu_dense_avx512.c / cpu_aqlm_avx512.c */
void kvq_dense_gemv_avx512(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
void kvq_gemm_avx512(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_avx512(const kvq_cpu_weight *w, const float *lut, float *y, int b0, int b1);
void kvq_aqlm_gather_gemv_avx512(const kvq_cpu_weight *w, const float *x, float *y, int r0, int r1);
#endif

#endif
