/* Kernels the CPU backend (cpu_backend.c) is built from. Each family has a
 * scalar path plus SIMD paths picked at run time (cpu_features.c); all are
 * tested against src/ref/. Threads come from OpenMP, n_threads per call. */
#ifndef KVQ_CPU_KERNELS_H
#define KVQ_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kv_format.h"
#include "model/weights.h"

/* ---- cpu_features.c ---- */
typedef enum { KVQ_ISA_SCALAR = 0, KVQ_ISA_AVX2, KVQ_ISA_AVX512, KVQ_ISA_NEON } kvq_isa;
/* Best ISA this CPU supports, capped by env KVQ_ISA=scalar|avx2|avxvnni|avx512|neon (for tests
 * and benchmarks: avx2 is the class without AVX-VNNI, avxvnni AVX2's kernels with it). */
kvq_isa kvq_cpu_isa(void);
const char *kvq_isa_name(kvq_isa isa);
/* Forces an ISA (tests compare every path to the reference); returns the previous one. */
kvq_isa kvq_cpu_set_isa(kvq_isa isa);
int kvq_cpu_isa_available(kvq_isa isa);
/* AVX-VNNI (VEX vpdpbusd / vpdpwssd on ymm) for the AVX2 int8 kernels: the CPU has it, the
 * ISA in use is an x86 one and KVQ_ISA is not avx2. Its kernels give the AVX2 ones' bits. */
int kvq_cpu_has_avxvnni(void);
/* Turns it off (0) or back on where the CPU has it (tests); returns the previous state. */
int kvq_cpu_set_avxvnni(int on);
/* The class the kernels run as, for load lines and benchmarks: "avx2", "avx2+avxvnni",
 * "avx512", "avx512+vnni", "neon+dotprod", "scalar", ... */
const char *kvq_cpu_class_name(void);
#if defined(__x86_64__)
/* AVX-512 VNNI (vpdpbusd), for the int8 kernels. */
int kvq_cpu_has_vnni(void);
#endif
#if defined(__aarch64__)
/* The dot-product extension (sdot), for the int8 kernels. */
int kvq_cpu_has_dotprod(void);
#endif

/* ---- cpu_bandwidth.c ---- */
/* Read bandwidth of `bytes` (more than the last-level cache) with n_threads, best of reps, in GB/s; < 0 without memory. */
double kvq_cpu_read_bw_gbs(size_t bytes, int n_threads, int reps);

/* ---- cpu_matmul.c / aqlm/aqlm*.c: weights in CPU layout ---- */
typedef struct kvq_cpu_weight kvq_cpu_weight;
/* Copies/repacks a checkpoint weight (dense F32/F16/BF16 or AQLM). NULL + kvq_fail on error. */
kvq_cpu_weight *kvq_cpu_weight_new(const kvq_weight_desc *d);
void kvq_cpu_weight_free(kvq_cpu_weight *w);
size_t kvq_cpu_weight_bytes(const kvq_cpu_weight *w);
int kvq_cpu_weight_rows(const kvq_cpu_weight *w);
int kvq_cpu_weight_cols(const kvq_cpu_weight *w);
/* y[n][rows] = x[n][cols] · Wᵀ (+ bias). */
void kvq_cpu_matmul(const kvq_cpu_weight *w, const float *x, float *y, int n, int n_threads);
/* 1 where 1x16 decode is faster on int8 codewords than on fp16 gathers on this CPU class
 * (by ISA features: VNNI); what kvq_model_params.aqlm_i8 = 1 (auto, the default) follows. */
int kvq_cpu_i8_wins(void);
/* The matmul kernels a load gets, for its load line: the 8-bit-code table kind and how it is
 * looked up, and 1x16's path with why (i8: 0 fp16 gathers, 1 int8 codewords by auto, 2 asked for). */
void kvq_cpu_kernel_names(char *out, size_t n, int i8);
/* A forward of up to this many token rows gives each row the bits it gets alone (same threads):
 * the matmuls' per-token paths (cpu_matmul.c: LUT and dense GEMV below 17 rows, codeword gathers
 * KVQ_GATHER_MAX_T at once; tiles from KVQ_I8T_MIN_N_GATHER; asserted in cpu_matmul.h), and
 * attention (cpu_kv.c: such a call splits positions at fixed places, as a decode does). The
 * table's exact_rows. */
#define KVQ_CPU_EXACT_ROWS 16
/* One row of W as f32 (embedding lookup, norm vectors). */
void kvq_cpu_weight_row(const kvq_cpu_weight *w, int row, float *out);

/* ---- cpu_kv.c / cpu_attn*.c: quantized KV cache ---- */
/* Stores one head vector as a cache row (same bytes as kvq_ref_kv_store_row). */
void kvq_cpu_kv_store_row(kvq_cache_type t, int rotate, const float *x, void *row, int head_dim);

typedef struct {
    kvq_attn_desc a;
    kvq_cache_type type_k, type_v;
    int rotate_k, rotate_v;
    const uint8_t *k, *v; /* this layer: row (h, p) at k + ((size_t)h*n_ctx + p) * kvq_kv_row_bytes(type_k, head_dim) */
    int n_ctx;
} kvq_cpu_attn_args;

/* Fused attention straight from the stored cache (see kvq_ref_attention for the spec).
 * Rows are whole 32-value blocks (head_dim a multiple of 32: cpu_backend.c pads others).
 * Returns 0, -1 when scratch memory could not be allocated (output then incomplete),
 * or -2 for a head_dim that is not a multiple of 32. */
int kvq_cpu_attention(const kvq_cpu_attn_args *args, const float *q, float *out, int pos0, int n, int n_threads);

#endif
