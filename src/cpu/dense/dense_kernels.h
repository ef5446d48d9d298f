/* Dense kernels (F32/F16/BF16 weights kept as stored) and the f32 tile GEMM
 * the batched paths share, one file per ISA in this room; the dispatcher
 * (cpu_matmul.c) picks and threads them. */
#ifndef KVQ_CPU_DENSE_KERNELS_H
#define KVQ_CPU_DENSE_KERNELS_H

#include "cpu/cpu_weight.h"

/* Dense GEMV kernels prefetch (into L2) this far ahead in the weights: one
 * thread's stream of rows alone kept too few misses in flight (lm_head
 * 32000x4096 f16, 2 threads: 21 -> 27 GB/s of 28 measured). */
#define KVQ_DENSE_PREFETCH_BYTES 8192

/* Value i of a dense tensor stored as f (F32, F16 or BF16). */
static inline float kvq_dense_at(kvq_wformat f, const void *p, size_t i) {
    if (f == KVQ_W_F32) return kvq_rd_f32(p, i);
    uint16_t h = kvq_rd_u16(p, i);
    return f == KVQ_W_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
}

/* dense_scalar.c: the spec the ISA versions follow. */
void kvq_dense_gemv_scalar(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_dense_rows_scalar(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_scalar(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);

#if defined(__aarch64__)
/* dense_neon.c */
void kvq_dense_gemv_neon(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_gemm_neon(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
#endif

#if defined(__x86_64__)
/* dense_avx2.c */
void kvq_dense_gemv_avx2(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_dense_rows_avx2(const kvq_cpu_weight *w, int r0, int r1, float *out);
void kvq_gemm_avx2(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
/* dense_avx512.c */
void kvq_dense_gemv_avx512(const kvq_cpu_weight *w, const float *x, int n, float *y, int r0, int r1);
void kvq_gemm_avx512(const float *W, size_t ldw, int nr, int cols, const float *x, int n, float *y, size_t ldy);
/* amx_avx512.c: bf16 tiles with hi/lo splits (see there). */
int kvq_amx_probe(void);
void kvq_amx_pack_x(const float *x, int n, int cols, int t0, int t1, int kp, uint16_t *xh, uint16_t *xl);
void kvq_amx_pack_w(const float *W, size_t ldw, int nr, int cols, int kp, uint32_t *bh, uint32_t *bl);
void kvq_amx_block(const uint16_t *xh, const uint16_t *xl, int n, int kp, const uint32_t *bh, const uint32_t *bl, int nr,
                   float *y, size_t ldy);
#endif
/* Accuracy of the AMX path against the f32 reference (rel L2) that
 * tests/test_matmul.c holds it to. */
#define KVQ_AMX_REL_L2 3e-5

#endif
