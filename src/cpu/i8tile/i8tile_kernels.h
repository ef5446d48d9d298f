/* int8 tiles for batched AQLM matmuls: a panel of weight rows decoded once,
 * requantized to int8 and multiplied with int8 activations by integer dot
 * products, one file per ISA in this room (i8tile.c holds the scalar spec,
 * the packers and the threaded driver the dispatcher calls). */
#ifndef KVQ_CPU_I8TILE_KERNELS_H
#define KVQ_CPU_I8TILE_KERNELS_H

#include "cpu/cpu_weight.h"

/* A panel is KVQ_I8T_PR rows of int8 weights over the padded columns
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
/* Accuracy of the int8 tiles against the f32 reference (rel L2 over a
 * matmul's outputs, random weights and activations) that tests hold them to,
 * beside the per-output bound (i8tile.c). */
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
void kvq_i8t_panel_vnni(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
float kvq_i8t_qblock_avx512(const float *v, int n, int8_t *q, int32_t *sum);
float kvq_i8t_qblock_avx2(const float *v, int n, int8_t *q, int32_t *sum);
void kvq_i8t_panel_avx2(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
#if defined(KVQ_HAVE_AVXVNNI)
void kvq_i8t_panel_avxvnni(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
#endif
#endif
#if defined(__aarch64__)
void kvq_i8t_panel_neon(const int8_t *wp, const float *sw, const int32_t *wsum, int b0, int b1, const int8_t *xq,
                        size_t kp, const float *sa, size_t nb, int nt, float *yt);
#endif
/* The SIMD panel kernel of this CPU (ISA as kvq_cpu_isa), NULL if none. */
const kvq_i8t_kernel *kvq_i8t_kernel_for_cpu(void);
/* Rows [r0, r1) of w as f32, scale applied (the dispatcher's aqlm_rows kernel). */
typedef void (*kvq_rows_fn)(const kvq_cpu_weight *w, int r0, int r1, float *out);
/* Scratch bytes kvq_cpu_matmul_i8t needs for n tokens on nt threads. */
size_t kvq_i8t_scratch_bytes(int cols, int n, int nt);
/* kvq_cpu_matmul of an AQLM weight through int8 tiles, on nt threads. */
void kvq_cpu_matmul_i8t(const kvq_cpu_weight *w, const kvq_i8t_kernel *ik, kvq_rows_fn rows_fn, const float *x,
                        float *y, int n, int nt, void *buf);

#endif
