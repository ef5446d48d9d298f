/* Internals of the CPU matmul: the uploaded weight layout and the per-ISA
 * kernel tables. cpu_matmul.c owns dispatch and threading; kernels only ever
 * work on a row range, single-threaded. */
#ifndef KVQ_CPU_MATMUL_IMPL_H
#define KVQ_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_kernels.h"
#include "util.h"

/* LUT-path rows are padded to a multiple of this and split among threads in
 * units of it: one 64-byte line of codes per (group, codebook) step. */
#define KVQ_AQLM_RB 64
/* LUT kernels prefetch the codes this many steps ahead. Measured when threads
 * split the rows (a short run of each step per page, too short for the
 * hardware prefetcher: ~1.5x slower from DRAM without it); decode now splits
 * the steps, so its codes are one sequential run, and the prefetch (into L2)
 * was kept there without re-measuring it off. The batched kernel still
 * splits rows. */
#define KVQ_LUT_PREFETCH 2
/* The AVX2 f32-table kernel prefetches the codes of the four
 * steps this far ahead, across the caller's table chunks. Measured with the
 * step split (AVX2, 1 thread, 4096x14336 from L3): 2.84 ms without, 2.71 with;
 * 4, 8 and 16 steps ahead all the same. */
#define KVQ_LUT_AHEAD 4
/* Dense GEMV kernels prefetch (into L2) this far ahead in the weights: one
 * thread's stream of rows alone kept too few misses in flight (lm_head
 * 32000x4096 f16, 2 threads: 21 -> 27 GB/s of 28 measured). */
#define KVQ_DENSE_PREFETCH_BYTES 8192
/* Most tokens one GEMV kernel call handles (one weight pass feeds them all). */
#define KVQ_GEMV_MAX_T 4

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
    /* GATHER with kvq_weight_desc.i8 and M == 1 (cpu_aqlm_i8.c): int8
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

/* A kernel set for one ISA. All ranges are half-open; y/out are indexed from
 * the range start unless noted. */
typedef struct {
    /* Dense, n <= KVQ_GEMV_MAX_T tokens: y[t*rows + r] = W[r]·x[t*cols ..] for r in [r0, r1). */
    void (*dense_gemv)(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
    /* Dense rows [r0, r1) as f32 into out[(r-r0)*cols]. */
    void (*dense_rows)(const kvq_cpu_weight *w, int r0, int r1, float *out);
    /* y[t*ldy + i] = W[i*ldw ..]·x[t*cols ..] for i < nr, t < n (f32 tile times tokens). */
    void (*gemm)(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
    /* LUT build for groups [g0, g1): table s = g*M + m (1 KB each, at lut +
     * (s - g0*M)*256: lut holds these groups only) is cb[m][c]·x[g*ig ..] for
     * c < 256, as f32 [256] (or byte planes, VBMI). */
    void (*lut_build)(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
    /* acc[o - r0] += sum_{s in [s0, s1)} table_s[code(o, s)] for o in [r0, r1),
     * without the row scales; table s at lut + (s - s0)*256, as lut_build left
     * it for groups from s0/M (s0 even; r0, r1 multiples of KVQ_AQLM_RB or
     * r1 == rows_pad; acc 64-byte aligned). */
    void (*lut_gemv)(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
    /* Codeword gather for nbits > 8, same contract as dense_gemv: each codeword
     * fetched once serves all n tokens. */
    void (*gather_gemv)(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
    /* AQLM rows [r0, r1) dequantized (scale applied) into out[(r-r0)*cols]. */
    void (*aqlm_rows)(const kvq_cpu_weight *w, int r0, int r1, float *out);
    /* Optional int16-table LUT path (NULL: f32 tables). Tables are indexed
     * from the first step given (s0 = g0*M, always even). lutq_build: f32
     * tables of groups [g0, g1) as lut_build (plain f32 [256] layout), returns
     * their max |value|; lutq_pack: those tables as q = round(T * inv_scale)
     * int16 tables (512 bytes per step; steps s0+2i, s0+2i+1 adjacent at
     * qlut + i * pair_stride, 1024 for one token); lutq_gemv: lut_gemv on one
     * token's int16 tables of steps [s0, s1) (pair_stride 1024):
     * out[o - r0] += scale * sum_s q_s[code(o, s)], the sums exact in acc
     * (r1 - r0 int32 of scratch). */
    float (*lutq_build)(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
    void (*lutq_pack)(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride, int g0,
                      int g1);
    void (*lutq_gemv)(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc, float *out,
                      int r0, int r1);
    /* lutq_gemv for nt <= KVQ_LUTQ_MAX_T tokens in one pass over the codes: token t's
     * tables packed at qluts + t*1024 with pair_stride nt*1024, scale scales[t],
     * its outputs at y + t*ldy. */
    void (*lutq_gemm)(const kvq_cpu_weight *w, const void *qluts, size_t pair_stride, const float *scales, int nt,
                      float *y, size_t ldy, int r0, int r1);
    /* Optional int8 tables for weights with lut8 (NULL: int16). lut8_pack: the
     * f32 tables of groups [g0, g1) (from lutq_build) as q + 128 bytes, q =
     * round(T * inv_scale), 256 bytes per step, steps s0+2i, s0+2i+1 adjacent
     * at qlut + i * pair_stride (512 for one token); lut8_gemv / lut8_gemm:
     * lutq_gemv / lutq_gemm on them (lut8_gemv: at most 256 steps, its sums
     * in the first 2*(r1 - r0) bytes of acc). Same signatures as the int16
     * ones, so a caller picks one pair and runs it. */
    void (*lut8_pack)(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                      int g0, int g1);
    void (*lut8_gemv)(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc, float *out,
                      int r0, int r1);
    void (*lut8_gemm)(const kvq_cpu_weight *w, const void *qluts, size_t pair_stride, const float *scales, int nt,
                      float *y, size_t ldy, int r0, int r1);
} kvq_mm_kernels;

/* Most tokens one lutq_gemm call takes (its int32 sums live on the stack). */
#define KVQ_LUTQ_MAX_T 8

/* Accuracy of the int16-table path against the f32 reference (rel L2 over a
 * matmul's outputs) that tests/test_matmul.c holds it to; see cpu_aqlm_avx512.c. */
#define KVQ_LUT_I16_REL_L2 2e-4
/* ... and of int8 codebooks (kvq_weight_desc.cb8; random codebooks: ~5e-3). */
#define KVQ_CB8_REL_L2 2e-2
/* ... and of int8 tables (kvq_weight_desc.lut8); see cpu_aqlm_avx512.c. */
#define KVQ_LUT_I8_REL_L2 2e-2

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

/* AVX-512 VBMI (byte permutes) turns the LUT lookups into register shuffles:
 * used with the AVX-512 ISA when the CPU has it. kvq_cpu_set_vbmi(level):
 * 0 off, 1 f32 tables, 2 int16 tables (the default); tests cover all three.
 * Returns the previous setting. */
int kvq_cpu_has_vbmi(void);
int kvq_cpu_set_vbmi(int on);
/* AVX2 LUT lookups: vpgatherdd, or plain loads (kvq_aqlm_lut_gemv_rows) on
 * CPUs whose gathers are slow, AMD's (microcoded there). kvq_cpu_set_avx2_lut:
 * 0 by vendor (the default), 1 gathers, 2 loads; returns the previous setting.
 * kvq_cpu_avx2_lut_loads: what is in use now. */
int kvq_cpu_set_avx2_lut(int mode);
int kvq_cpu_avx2_lut_loads(void);
/* AMX tiles for batches of KVQ_AMX_MIN_N tokens or more, on CPUs (and kernels)
 * that have them; kvq_cpu_set_amx(0) turns them off. Accuracy against the f32
 * reference (rel L2) that tests/test_matmul.c holds the path to: */
int kvq_cpu_has_amx(void);
int kvq_cpu_set_amx(int on);
#define KVQ_AMX_REL_L2 3e-5

/* cpu_aqlm.c: AQLM upload (fills the AQLM fields of w, adds to w->bytes). */
int kvq_cpu_aqlm_init(kvq_cpu_weight *w, const kvq_weight_desc *d);

/* Scalar kernels (cpu_matmul.c dense + gemm, cpu_aqlm.c AQLM). */
void kvq_dense_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_dense_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_scalar(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_scalar(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_scalar(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_aqlm_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);

#if defined(__aarch64__)
/* cpu_matmul_neon.c */
void kvq_dense_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_gemm_neon(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
float kvq_aqlm_lutq_build_neon(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lutq_pack_neon(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                             int g0, int g1);
void kvq_aqlm_lutq_gemv_neon(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc,
                             float *out, int r0, int r1);
void kvq_aqlm_gather_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
#endif

#if defined(__x86_64__)
/* cpu_dense_avx2.c / cpu_aqlm_avx2.c */
void kvq_dense_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_dense_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_avx2(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_avx2(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_rows(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_lut_gemv_avx2(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_aqlm_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
/* cpu_dense_avx512.c / cpu_aqlm_avx512.c */
void kvq_dense_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_gemm_avx512(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
void kvq_aqlm_lut_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_avx512(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_lut_build_vbmi(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_vbmi(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
/* cpu_amx_avx512.c: bf16 tiles with hi/lo splits (see there). */
int kvq_amx_probe(void);
void kvq_amx_pack_x(const float *x, int n, int cols, int t0, int t1, int kp, uint16_t *xh, uint16_t *xl);
void kvq_amx_pack_w(const float *W, size_t ldw, int nr, int cols, int kp, uint32_t *bh, uint32_t *bl);
void kvq_amx_block(const uint16_t *xh, const uint16_t *xl, int n, int kp, const uint32_t *bh, const uint32_t *bl, int nr,
                   float *y, size_t ldy);
float kvq_aqlm_lutq_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lutq_pack_vbmi(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                             int g0, int g1);
void kvq_aqlm_lut8_pack_vbmi(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                             int g0, int g1);
void kvq_aqlm_lut8_gemv_vbmi(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc,
                             float *out, int r0, int r1);
void kvq_aqlm_lut8_gemm_vbmi(const kvq_cpu_weight *w, const void *qluts, size_t pair_stride, const float *scales, int nt,
                             float *y, size_t ldy, int r0, int r1);
void kvq_aqlm_lutq_gemv_vbmi(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc,
                             float *out, int r0, int r1);
void kvq_aqlm_lutq_gemm_vbmi(const kvq_cpu_weight *w, const void *qluts, size_t pair_stride, const float *scales, int nt,
                             float *y, size_t ldy, int r0, int r1);
#endif

/* ---- int8 codewords and activations (kvq_weight_desc.i8; cpu_aqlm_i8.c) ----
 * Activations are quantized per token in blocks of 32 values: d = max|x| / 127,
 * q = round(x / d). One token's values are padded with zeros to cols_pad (a
 * multiple of 64: one AVX-512 step of 8 codewords of 8). For token t:
 * q + t*cols_pad, its block scales d + t*(cols_pad/32), and for the VNNI
 * kernel (unsigned x signed: codewords go in as q ^ 0x80 = q + 128) the
 * offset's correction corr + t*(cols_pad/4): -128 * the sum of each 4 q. */
typedef struct {
    int cols_pad;
    const int8_t *q;
    const float *d;
    const int32_t *corr;
    int cb_prefetch; /* 1: the kernel pulls the codebook into L2 over its first rows (a thread's first call) */
} kvq_i8_act;

/* Bytes of scratch the activations of n tokens of cols values take, and
 * their layout in such a buffer (64-byte aligned). */
size_t kvq_i8_act_bytes(int cols, int n);
kvq_i8_act kvq_i8_act_at(void *buf, int cols, int n);
/* Quantizes tokens [t0, t1) of x (token t at x + t*cols) into a. */
void kvq_i8_quantize(const kvq_i8_act *a, const float *x, int cols, int t0, int t1);
/* a advanced by t tokens. */
static inline kvq_i8_act kvq_i8_act_token(const kvq_i8_act *a, int t) {
    size_t p = (size_t)a->cols_pad * (size_t)t;
    return (kvq_i8_act){a->cols_pad, a->q + p, a->d + p / 32, a->corr + p / 4, a->cb_prefetch};
}
/* kvq_cpu_matmul of a weight with int8 codewords (w->cbq) on nt threads, buf
 * holding kvq_i8_act_bytes(w->cols, n) bytes of scratch. */
void kvq_cpu_matmul_i8(const kvq_cpu_weight *w, const float *x, float *y, int n, int nt, void *buf);
/* y[t*ldy + o] = W[o] . x_t for o in [r0, r1), t < n <= KVQ_GEMV_MAX_T, from
 * the activations of tokens a (already offset to the first token). */
typedef void (*kvq_i8_gemv_fn)(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0,
                               int r1);
void kvq_aqlm_i8_gemv_scalar(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#if defined(__x86_64__)
void kvq_aqlm_i8_gemv_avx2(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
void kvq_aqlm_i8_gemv_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#endif
#if defined(__aarch64__)
int kvq_cpu_has_dotprod(void);
void kvq_aqlm_i8_gemv_neon(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#endif
/* The int8 codebook of a GATHER weight with desc i8 (cpu_aqlm.c's upload,
 * finite codebooks only): the bytes it needs, and filling it at dst (64-byte
 * aligned), which sets w->cbq, cbq_shift, cbq_cls and cbq_perm (the codes'
 * renumbering, which the upload applies and frees); KVQ_ERR_NOMEM when the
 * sort's scratch is not there. */
#define KVQ_I8_CLASSES 64
size_t kvq_i8_codebook_bytes(const kvq_cpu_weight *w);
int kvq_i8_codebook(kvq_cpu_weight *w, const kvq_weight_desc *d, void *dst);
/* Accuracy of the int8 path against the fp16 weights in f32 (rel L2 over a
 * matmul's outputs, random weights and activations: ~6e-3) that
 * tests/test_matmul.c holds it to, next to the per-output bound stated there. */
#define KVQ_I8_REL_L2 2e-2

/* ---- int8 tiles for batched AQLM matmuls (cpu_i8tile*.c) ----
 * A panel is KVQ_I8T_PR rows of int8 weights over the padded columns
 * (kvq_i8t_cols_pad: a multiple of KVQ_I8T_KB), stored per block b and
 * 16-row vector v as KVQ_I8T_VBYTES bytes at wp + (b*KVQ_I8T_NV + v) *
 * KVQ_I8T_VBYTES: for each 4 columns k4, the 16 rows' 4 bytes (row-major
 * 4-byte groups: one vpdpbusd operand, 4 sdot operands). sw / wsum: per block
 * and row (b*PR + r) the scale and the sum of the row's int8 values.
 * Activations: token t's int8 values at xq + t*kp (q ^ 0x80 where the
 * kernel's flip is 1), its block scales at sa + t*nb. */
#define KVQ_I8T_KB 256 /* values per scale block */
#define KVQ_I8T_PR 64  /* rows per panel */
#define KVQ_I8T_NV (KVQ_I8T_PR / 16)
#define KVQ_I8T_VBYTES (16 * KVQ_I8T_KB)
#define KVQ_I8T_KC 4 /* blocks per chunk that all tokens pass over while it sits in L2 */
/* From how many tokens on an AQLM weight (unless exact) goes through the tiles,
 * where the CPU has a kernel (kvq_cpu_matmul): the panel decode has to be
 * spread over enough tokens to beat the per-token paths. Measured, synthetic
 * Llama-2-7B, 2 threads, AVX-512 VNNI+VBMI VM (prompt tok/s, tiles vs the
 * other path): 1x16 vs the codeword-gather GEMV 6.3 / 5.9 at 16 tokens, 9.1 /
 * 7.4 at 24; 2x8 vs batched int16 tables 10.0 / 12.7 at 32, 13.6 / 13.5 at
 * 48, 18.9 / 18.3 at 64, 27.6 / 18.7 at 96. Without batched tables (AVX2,
 * NEON, AVX-512 without VBMI) 2x8 batches would take dequantize + f32 GEMM,
 * which the tiles beat from fewer tokens still. */
#define KVQ_I8T_MIN_N_GATHER 16
#define KVQ_I8T_MIN_N_TABLES 48
#define KVQ_I8T_MIN_N 32
/* The first batch size that takes the tiles for w on the current kernels
 * (INT_MAX: never, exact or no kernel). */
int kvq_i8t_min_n(const kvq_cpu_weight *w);
/* Accuracy of the int8 tiles against the f32 reference (rel L2 over a
 * matmul's outputs, random weights and activations) that tests hold them to,
 * beside the per-output bound (cpu_i8tile.c). */
#define KVQ_I8T_REL_L2 4e-2
int kvq_i8t_cols_pad(int cols);
/* One block of n <= KVQ_I8T_KB values as KVQ_I8T_KB int8 (zeros past n): returns the
 * scale max|v| / 127 (NaN, q all zero, when a value is not finite), *sum (if
 * given) = the sum of q. Every ISA's version gives the same bytes. */
typedef float (*kvq_i8t_qblock_fn)(const float *v, int n, int8_t *q, int32_t *sum);
float kvq_i8t_qblock_scalar(const float *v, int n, int8_t *q, int32_t *sum);
/* Token x (cols values) as int8 blocks with their scales (flip: store q ^ 0x80). */
void kvq_i8t_quant_x(kvq_i8t_qblock_fn qb, const float *x, int cols, int8_t *q, float *sa, int flip);
/* nr <= KVQ_I8T_PR f32 rows (row r at rows + r*cols) as one panel; rows past nr are zero. */
void kvq_i8t_pack(kvq_i8t_qblock_fn qb, const float *rows, int nr, int cols, int8_t *wp, float *sw, int32_t *wsum);
/* yt[t*KVQ_I8T_PR + r] += sum over blocks [b0, b1) of (q_w . q_x) * sw * sa, one
 * fmaf per block in block order, for tokens t < nt (kp: bytes per token of
 * xq, nb: scales per token of sa). */
typedef void (*kvq_i8t_panel_fn)(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1,
                                 const int8_t *xq, size_t kp, const float *sa, size_t nb, int nt, float *yt);
typedef struct {
    kvq_i8t_panel_fn panel;
    kvq_i8t_qblock_fn qblock; /* the block quantizer pack and quant_x use */
    int flip; /* 1: activations as q ^ 0x80 (vpdpbusd's unsigned operand; the kernel subtracts 128 * wsum) */
} kvq_i8t_kernel;
void kvq_i8t_panel_scalar(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                          size_t kp, const float *sa, size_t nb, int nt, float *yt);
#if defined(__x86_64__)
int kvq_cpu_has_vnni(void);
void kvq_i8t_panel_vnni(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
float kvq_i8t_qblock_avx512(const float *v, int n, int8_t *q, int32_t *sum);
float kvq_i8t_qblock_avx2(const float *v, int n, int8_t *q, int32_t *sum);
void kvq_i8t_panel_avx2(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
#endif
#if defined(__aarch64__)
void kvq_i8t_panel_neon(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
#endif
/* The SIMD panel kernel of this CPU (ISA as kvq_cpu_isa), NULL if none. */
const kvq_i8t_kernel *kvq_i8t_kernel_for_cpu(void);
/* Rows [r0, r1) of w as f32, scale applied (kvq_mm_kernels.aqlm_rows). */
typedef void (*kvq_rows_fn)(const kvq_cpu_weight *w, int r0, int r1, float *out);
/* Scratch bytes kvq_cpu_matmul_i8t needs for n tokens on nt threads. */
size_t kvq_i8t_scratch_bytes(int cols, int n, int nt);
/* kvq_cpu_matmul of an AQLM weight through int8 tiles, on nt threads. */
void kvq_cpu_matmul_i8t(const kvq_cpu_weight *w, const kvq_i8t_kernel *ik, kvq_rows_fn rows_fn, const float *x,
                        float *y, int n, int nt, void *buf);

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
