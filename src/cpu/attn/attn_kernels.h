/* Internal contract between the fused-attention driver (cpu_kv.c: threads,
 * position blocks, online softmax, split-K merge, rotation) and the per-ISA
 * inner kernels (attn_scalar.c, _avx2.c, _avx512.c, _neon.c in this room).
 *
 * The driver hands the kernels "rows": query vectors that all read the same
 * KV head (the GQA group, times a few queries when evaluating a prompt), so
 * every K/V cache row is read from memory once per group. Query rows are f32,
 * already scaled by the softmax scale and rotated when K is. */
#ifndef KVQ_CPU_ATTN_KERNELS_H
#define KVQ_CPU_ATTN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kv_format.h"

/* Positions per online-softmax block: scores for a block stay in L1 and the
 * block's K (and V) rows stay cached while all rows of the group use them. */
#define KVQ_ATTN_BP 64
#ifndef KVQ_ATTN_PFD
#define KVQ_ATTN_PFD 1 /* prefetch distance in blocks */
#endif
/* SIMD kernels keep per-block scratch on the stack; larger heads use the scalar path. */
#define KVQ_ATTN_HD_MAX 512

/* Hints the row one block ahead into L2. Kernels call it per row on their
 * first pass over a block: prefetches spread through the computation let
 * the loads overlap it, where one burst per block stalled them (and the
 * hardware prefetcher alone does not run far enough ahead). Prefetches never
 * fault, so running past the end of the cache is harmless. */
static inline void kvq_attn_prefetch_row(const uint8_t *row, size_t rb) {
    const uint8_t *p = row + (size_t)KVQ_ATTN_PFD * KVQ_ATTN_BP * rb;
    for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 1);
    __builtin_prefetch(p + rb - 1, 0, 1); /* rows need not start on a line */
}

/* Same into L1, for kernels whose blocks of K and V rows are small (q4/q8,
 * ~10-20 KB): on the AVX-512 q4 path it measured ~10% faster at 8k context
 * than stopping in L2. Wider rows evicted live data and the AVX2 kernels
 * measured slower with it, so they keep the L2 hint. */
#ifndef KVQ_ATTN_PF1
#define KVQ_ATTN_PF1 KVQ_ATTN_BP
#endif
static inline void kvq_attn_prefetch_row_l1(const uint8_t *row, size_t rb) {
    const uint8_t *p = row + (size_t)KVQ_ATTN_PF1 * rb;
    for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + rb - 1, 0, 3);
}

/* Calls EXPR with HD bound to the head dim (BY_NR: NR to the row count): common
 * sizes get their own copy of an always-inline kernel, with the block loops
 * unrolled and row offsets constant (~15% faster on AVX-512 at GQA 4, head dim 128). */
#define BY_HD(hd, EXPR)                                                                           \
    switch (hd) {                                                                               \
    case 64: { const int HD = 64; EXPR; } break;                                                \
    case 128: { const int HD = 128; EXPR; } break;                                              \
    default: { const int HD = hd; EXPR; } break;                                                \
    }
#define BY_NR(nr, EXPR)                                                                           \
    switch (nr) {                                                                               \
    case 4: { const int NR = 4; EXPR; } break;                                                  \
    case 8: { const int NR = 8; EXPR; } break;                                                  \
    default: { const int NR = nr; EXPR; } break;                                                \
    }

typedef struct {
    /* Bytes of workspace q_prep needs for nr rows (0: qk reads the f32 rows). */
    size_t (*q_prep_bytes)(kvq_cache_type tk, int nr, int hd);
    /* Converts the f32 query rows into whatever qk wants (e.g. int8 blocks). */
    void (*q_prep)(kvq_cache_type tk, const float *q, int nr, int hd, void *prep);
    /* s[r*KVQ_ATTN_BP + j] = q_r · k_j for r < nr, j < np <= KVQ_ATTN_BP; k is
     * position 0's row, rows rb bytes apart. */
    void (*qk)(kvq_cache_type tk, const uint8_t *k, size_t rb, int np, const float *q, const void *prep,
               int nr, int hd, float *s);
    /* acc[r*hd + i] += Σ_j w[r*KVQ_ATTN_BP + j] * v_j[i] for r < nr, j < np. */
    void (*av)(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, int nr, int hd,
               float *acc);
    /* Optional (NULL if absent), for the V types whose bit av_blk_types sets:
     * acc[r*hd + i] += f[r] * Σ_j w[r*KVQ_ATTN_BP + j] * v_j[i], where v starts
     * inside one fixed 64-position span of the cache and w[r] is relative to
     * the row's largest weight in that span (≤ 1), so a kernel may round w per
     * block and still give decode and prompt evaluation the same result.
     * Returns 0, touching nothing, for a shape it does not take (the driver
     * then folds f into w and calls av). */
    int (*av_blk)(kvq_cache_type tv, const uint8_t *v, size_t rb, int np, const float *w, const float *f, int nr,
                  int hd, float *acc);
    unsigned (*av_blk_types)(void);
    /* x[i] = exp(x[i] - m) for i < n (x[i] = -inf gives 0); returns Σ x[i]. */
    float (*exp_sum)(float *x, int n, float m);
    /* Optional (NULL: kvq_ref_hadamard): the same orthonormal Walsh–Hadamard
     * transform in place, bitwise equal to the reference (n a power of 2). */
    void (*hadamard)(float *x, int n);
    /* max of x[0..n) (n >= 1). */
    float (*max)(const float *x, int n);
    /* Bit t set: K of cache type t is dotted with int8-quantized queries
     * (integer dot products) right now, which adds ~1e-3 relative error. */
    unsigned (*int8_q)(void);
} kvq_attn_kernels;

extern const kvq_attn_kernels kvq_attn_scalar;
#if defined(__x86_64__)
extern const kvq_attn_kernels kvq_attn_avx2;
extern const kvq_attn_kernels kvq_attn_avx512;
/* The AVX-512 q4 and q8 q·k use VNNI (vpdpbusd) where the CPU has it; tests
 * turn it off to cover the plain AVX-512BW paths too. Returns the previous setting. */
int kvq_attn_avx512_set_vnni(int on);
#endif
#if defined(__aarch64__)
extern const kvq_attn_kernels kvq_attn_neon;
#endif

/* The kernel set for an ISA (the scalar one when that ISA is not built). */
const kvq_attn_kernels *kvq_attn_kernels_for(int isa);

#endif
