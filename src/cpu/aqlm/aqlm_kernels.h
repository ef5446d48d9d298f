/* AQLM kernels, one file per ISA in this room: 8-bit codes through lookup
 * tables (f32, int16 or int8), wider codes through codeword gathers, and 1x16
 * with int8 codewords on int8 activations (aqlm_i8*.c). The upload (aqlm.c)
 * fills the AQLM fields of the CPU weight; the dispatcher (cpu_matmul.c)
 * picks the kernels and threads them. */
#ifndef KVQ_CPU_AQLM_KERNELS_H
#define KVQ_CPU_AQLM_KERNELS_H

#include <math.h>

#include "cpu/cpu_weight.h"

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
/* Most tokens one lutq_gemm call takes (its int32 sums live on the stack). */
#define KVQ_LUTQ_MAX_T 8

/* Accuracy of the int16-table path against the f32 reference (rel L2 over a
 * matmul's outputs) that tests/test_matmul.c holds it to; see aqlm_avx512.c. */
#define KVQ_LUT_I16_REL_L2 2e-4
/* ... and of int8 codebooks (kvq_weight_desc.cb8; random codebooks: ~5e-3). */
#define KVQ_CB8_REL_L2 2e-2
/* ... and of int8 tables (kvq_weight_desc.lut8); see aqlm_avx512.c. */
#define KVQ_LUT_I8_REL_L2 2e-2

/* aqlm.c: the upload (fills the AQLM fields of w, adds to w->bytes) and the
 * scalar kernels, the spec the ISA versions follow. */
int kvq_cpu_aqlm_init(kvq_cpu_weight *w, const kvq_weight_desc *d);
void kvq_aqlm_lut_build_scalar(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_scalar(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_aqlm_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);

#if defined(__aarch64__)
/* aqlm_neon.c */
float kvq_aqlm_lutq_build_neon(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lutq_pack_neon(const kvq_cpu_weight *w, const float *lut, float inv_scale, void *qlut, size_t pair_stride,
                             int g0, int g1);
void kvq_aqlm_lutq_gemv_neon(const kvq_cpu_weight *w, const void *qlut, int s0, int s1, float scale, int32_t *acc,
                             float *out, int r0, int r1);
void kvq_aqlm_gather_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
#endif

#if defined(__x86_64__)
/* aqlm_avx2.c */
void kvq_aqlm_lut_build_avx2(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_rows(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_lut_gemv_avx2(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_aqlm_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
/* aqlm_avx512.c */
void kvq_aqlm_lut_build_avx512(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_avx512(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_lut_build_vbmi(const kvq_cpu_weight *w, const float *x, float *lut, int g0, int g1);
void kvq_aqlm_lut_gemv_vbmi(const kvq_cpu_weight *w, const float *lut, int s0, int s1, float *acc, int r0, int r1);
void kvq_aqlm_gather_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
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

/* ---- int8 codewords and activations (kvq_weight_desc.i8; aqlm_i8.c) ----
 * Activations are quantized per token in blocks of KVQ_I8_ABLK values:
 * d = max|x| / KVQ_I8_AMAX, q16 = round(x / d) as int16 (12 bits: the int32
 * lanes' bound in aqlm_i8.c), d repeated per 32 values. One token's values are padded with
 * zeros to cols_pad (a multiple of 64: one AVX-512 step of 8 codewords of 8;
 * one more 64 where that is a multiple of 1 KiB, against L1 set conflicts).
 * For token t: q16 + t*cols_pad, d + t*(cols_pad/32). */
#define KVQ_I8_ABLK 256
#define KVQ_I8_AMAX 2047.0f
typedef struct {
    int cols_pad;
    const float *d;
    const int16_t *q16;
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
    return (kvq_i8_act){a->cols_pad, a->d + p / 32, a->q16 + p, a->cb_prefetch};
}
/* kvq_cpu_matmul of a weight with int8 codewords (w->cbq) on nt threads, buf
 * holding kvq_i8_act_bytes(w->cols, n) bytes of scratch. */
void kvq_cpu_matmul_i8(const kvq_cpu_weight *w, const float *x, float *y, int n, int nt, void *buf);
/* y[t*ldy + o] = W[o] . x_t for o in [r0, r1), t < n <= the kernel's most
 * tokens (KVQ_GEMV_MAX_T; the VNNI kernel KVQ_I8_VNNI_MAX_T), from the
 * activations of tokens a (already offset to the first token). Each token's
 * sums are formed the same way whatever n is, so a token's outputs do not
 * depend on the batch (speculative verification relies on it). */
#define KVQ_I8_VNNI_MAX_T 8
typedef void (*kvq_i8_gemv_fn)(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0,
                               int r1);
void kvq_aqlm_i8_gemv_scalar(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#if defined(__x86_64__)
void kvq_aqlm_i8_gemv_avx2(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
void kvq_aqlm_i8_gemv_vnni(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#if defined(KVQ_HAVE_AVXVNNI)
void kvq_aqlm_i8_gemv_avxvnni(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#endif
#endif
#if defined(__aarch64__)
void kvq_aqlm_i8_gemv_neon(const kvq_cpu_weight *w, const kvq_i8_act *a, int n, float *y, size_t ldy, int r0, int r1);
#endif
/* The int8 codebook of a GATHER weight with desc i8 (aqlm.c's upload,
 * finite codebooks only): the bytes it needs, and filling it at dst (64-byte
 * aligned), which sets w->cbq, cbq_shift, cbq_cls and cbq_perm (the codes'
 * renumbering, which the upload applies and frees); KVQ_ERR_NOMEM when the
 * sort's scratch is not there. */
#define KVQ_I8_CLASSES 64
size_t kvq_i8_codebook_bytes(const kvq_cpu_weight *w);
int kvq_i8_codebook(kvq_cpu_weight *w, const kvq_weight_desc *d, void *dst);
/* The class scales as powers of two of one base: cbq_cls[k] = base * 2^e[k],
 * e[k] in [0, 8] (aqlm_i8.c). Here, not there: the kernels need it and
 * aqlm_i8.c calls the kernels. */
static inline void kvq_i8_exponents(const kvq_cpu_weight *w, int16_t e[KVQ_I8_CLASSES], float *base) {
    float top = w->cbq_cls[KVQ_I8_CLASSES - 1];
    *base = ldexpf(top, -8);
    for (int k = 0; k < KVQ_I8_CLASSES; k++) {
        int v = top > 0.0f && w->cbq_cls[k] > 0.0f ? ilogbf(w->cbq_cls[k]) - ilogbf(top) + 8 : 0;
        e[k] = (int16_t)(v < 0 ? 0 : v > 8 ? 8 : v);
    }
}
/* Accuracy of the int8 path against the fp16 weights in f32 (rel L2 over a
 * matmul's outputs, random weights and activations: ~6e-3) that
 * tests/test_matmul.c holds it to, next to the per-output bound stated there. */
#define KVQ_I8_REL_L2 2e-2

#endif
