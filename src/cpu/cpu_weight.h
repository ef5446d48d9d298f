/* The CPU's uploaded weight: its layout, read by the dispatcher (cpu_matmul.c)
 * and by every kernel room below it (aqlm/, dense/, i8tile/). Kernels only
 * ever work on a row range, single-threaded; the dispatcher owns threading. */
#ifndef KVQ_CPU_WEIGHT_H
#define KVQ_CPU_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_kernels.h"
#include "util.h"

/* LUT-path rows are padded to a multiple of this and split among threads in
 * units of it: one 64-byte line of codes per (group, codebook) step. */
#define KVQ_AQLM_RB 64
/* Most tokens one GEMV kernel call handles (one weight pass feeds them all). */
#define KVQ_GEMV_MAX_T 4
/* Most tokens one codeword-gather call handles: within each row the tokens go
 * KVQ_GEMV_MAX_T at a time, so a row's codewords come from memory once (the
 * later passes find them in L1) and every token's sums are added in the same
 * order as when it is alone (a small batch changes no output). */
#define KVQ_GATHER_MAX_T 16

typedef enum {
    KVQ_CW_DENSE = 0, /* F32/F16/BF16 kept as stored (2 bytes/value for halves) */
    KVQ_CW_AQLM_LUT,  /* nbits == 8: per-token lookup table of codeword·x dot products */
    KVQ_CW_AQLM_GATHER, /* nbits > 8: gather codewords (f32) and FMA with x */
} kvq_cw_kind;

/* Which of data / codes / block this weight allocated; the others point into the
 * caller's memory (the checkpoint mapping, which outlives the weight). */
enum { KVQ_OWN_DATA = 1, KVQ_OWN_CODES = 2, KVQ_OWN_BLOCK = 4 };

struct kvq_cpu_weight {
    kvq_cw_kind kind;
    unsigned owned; /* KVQ_OWN_* bits */
    kvq_wformat fmt; /* dense storage format (kind == DENSE) */
    int rows, cols;
    size_t bytes; /* everything the kernels read: owned copies and tensors used in place */

    void *data;  /* dense values, rows*cols, 64-byte aligned */
    float *bias; /* f32 [rows] or NULL */

    /* AQLM */
    int M, nbits, ig, G; /* codebooks, bits per code, values per group, groups per row */
    int rows_pad;        /* rows rounded up to KVQ_AQLM_RB */
    /* Codes, already reduced mod 2^nbits.
     * LUT: uint8 [G*M][rows_pad] -- step s = g*M + m holds the codes of all rows;
     * GATHER: uint16 [rows][G][M]. */
    void *codes;
    void *block;    /* GATHER: one allocation holding the codebook (cb16 or cb8), then the codes */
    float *cb;      /* LUT: f32 codebooks [M][256][ig] */
    float *cb_t;    /* LUT: transposed f32 codebooks [M][ig][256] (vector LUT build) */
    uint16_t *cb16; /* GATHER: fp16 codebooks [M][2^nbits][ig]; half the bytes of f32 fits L2 better */
    /* GATHER with kvq_weight_desc.cb8 and M == 1: the codebook as int8 [2^nbits][ig],
     * value = cb8 * cb8_scale (cb16 is then NULL): half the bytes again, and
     * the gathers are bound by the codebook's size in cache. */
    int8_t *cb8;
    float cb8_scale;
    int lut8;       /* LUT with kvq_weight_desc.lut8: int8 tables where the kernels have them (lut8_*) */
    int exact;      /* kvq_weight_desc.exact: batches keep to the exact paths (no int8 tiles or tables) */
    /* GATHER with kvq_weight_desc.i8 and M == 1 (aqlm/aqlm_i8.c): int8
     * codewords [2^nbits][ig] (cb16 and cb8 are then NULL), renumbered at
     * load so that their scales come in KVQ_I8_CLASSES classes of equal
     * size: codeword c's scale is cbq_cls[c >> cbq_shift]. Every matmul of
     * the weight takes the integer-dot-product kernels on int8 activations. */
    int8_t *cbq;
    int cbq_shift;
    float cbq_cls[64];
    uint16_t *cbq_perm; /* during the upload only: old code -> new code */
    float *scales;  /* f32 [rows_pad], zero past rows */
};

/* Part i of [0, n) split into `parts` nearly equal ranges (how every matmul
 * path shares rows, groups or tokens among its threads). */
static inline void kvq_split(int n, int parts, int i, int *a, int *b) {
    *a = (int)((long long)n * i / parts);
    *b = (int)((long long)n * (i + 1) / parts);
}

/* round-to-nearest-even of |v| < 2^22 without a libm call, so quantizing loops vectorize */
static inline float kvq_round_ne(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (v + magic) - magic;
}

/* Code of (row o, group g, codebook m) in the uploaded layout. */
static inline uint32_t kvq_cw_code(const kvq_cpu_weight *w, size_t o, size_t g, size_t m) {
    if (w->kind == KVQ_CW_AQLM_LUT) return ((const uint8_t *)w->codes)[(g * (size_t)w->M + m) * (size_t)w->rows_pad + o];
    return ((const uint16_t *)w->codes)[(o * (size_t)w->G + g) * (size_t)w->M + m];
}

/* Value j of codeword c of codebook m, whichever form the weight keeps. */
static inline float kvq_cw_val(const kvq_cpu_weight *w, size_t m, uint32_t c, size_t j) {
    size_t i = (m * ((size_t)1 << w->nbits) + c) * (size_t)w->ig + j;
    if (w->cbq) return (float)w->cbq[i] * w->cbq_cls[c >> w->cbq_shift];
    if (w->cb8) return (float)w->cb8[i] * w->cb8_scale;
    return w->cb ? w->cb[i] : kvq_f16_to_f32(w->cb16[i]);
}

/* Codeword gathers from a cold codebook (1 MB for 1x16, a different one per
 * matrix) wait on DRAM line by line, so the gather kernels call this for
 * each of their first KVQ_CB_PREFETCH_ROWS rows (i = row - r0): each call
 * asks for the next slice of the codebook to come into L2 (7B 1x16 decode
 * +9%). A hint: never faults. */
#define KVQ_CB_PREFETCH_ROWS 16
static inline void kvq_cb_prefetch_slice(const kvq_cpu_weight *w, int i) {
    if (i >= KVQ_CB_PREFETCH_ROWS) return;
    const char *p = w->cbq ? (const char *)w->cbq : w->cb8 ? (const char *)w->cb8 : (const char *)w->cb16;
    size_t bytes = ((size_t)w->M << w->nbits) * (size_t)w->ig * (w->cb8 || w->cbq ? 1 : 2);
    size_t slice = bytes / KVQ_CB_PREFETCH_ROWS + 64;
    for (size_t b = (size_t)i * slice; b < (size_t)(i + 1) * slice && b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

#endif
