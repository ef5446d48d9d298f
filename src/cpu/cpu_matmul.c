/* CPU weights and matmul dispatch: upload of dense weights, the choice of kernel family per (weight kind, batch size, ISA) and
 * the OpenMP threading around them. Kernels (aqlm/, dense/, i8tile/) only see
 * row ranges and never call back up here.
 *
 * Paths:
 *  - dense, n < KVQ_GEMV_MAX_N: GEMV straight from the stored F32/F16/BF16
 *    (halves stay 2 bytes/value and are widened in registers, so decode reads
 *    half the bytes), up to KVQ_GEMV_MAX_T tokens per pass over the weight;
 *  - AQLM nbits == 8, n <= 16: per-token lookup tables (aqlm/), every token
 *    of a step run through one chunk of codes before the next;
 *  - AQLM nbits > 8, n <= 16: codeword gather + FMA, each row's codewords
 *    fetched once per step for all tokens.
 *  All three give a token of a 2-16 token step the bits it gets alone (on
 *  the same -t), every call (greedy speculative decoding and the
 *  server's determinism rely on it; tests/test_matmul_batch.c). Cost per
 *  extra token (1 thread, 11008x4096, CPU time, Zen 4/5 VM): 2x8 ~0.45 ms
 *  against ~0.55 ms for one token (lookups, not memory, set the pace), 1x16
 *  ~1.5 ms against ~4 ms (f32 FMAs); docs/performance.md "Small batches";
 *  - AQLM with int8 codewords (desc i8, the default for 1x16), n <= 16: integer dot products
 *    (aqlm/aqlm_i8*.c), in place of the codeword gather;
 *  - everything else (batched): rows are widened/dequantized a tile at a time
 *    into a per-thread f32 buffer, and the tile is multiplied with all n tokens. */
#include <limits.h>
#include <stdio.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_matmul.h"
#include "util.h"

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
    /* Codeword gather for nbits > 8, as dense_gemv but for n <= KVQ_GATHER_MAX_T:
     * each codeword fetched once serves all n tokens. */
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

#if defined(KVQ_HAVE_BLAS)
#include <cblas.h>
#endif

/* From this many tokens on, weights are widened/dequantized per tile and
 * multiplied with all tokens at once. Measured crossovers (2 cores, AVX-512):
 * per-token LUTs stay ahead of dequantize + GEMM up to ~16 tokens, a weight
 * pass per 4 tokens (dense, codeword gather) up to ~8. */
#define KVQ_LUT_MAX_N 17
/* Dense weights stay on the GEMV up to 16 tokens too (a weight pass per 4
 * tokens), though tiles overtake it from ~8: so that a step of up to 16
 * rows (a server step, a speculative verification) gives each row the bits
 * it gets alone, as the AQLM paths do (the dense LM head of an AQLM model
 * changed a greedy reply when 8 streams shared a step). */
#define KVQ_GEMV_MAX_N 17
/* Codeword gathers take a step of up to this many tokens in one pass (each
 * row's codewords fetched once for all of them, KVQ_GATHER_MAX_T). */
#define KVQ_GATHER_MAX_N (KVQ_GATHER_MAX_T + 1)
/* With int16 tables (VBMI) a batch of tokens shares one pass over the codes;
 * per core (CPU time, 4096x4096 and 11008x4096 2x8) that runs at 70-80 GFLOP/s
 * equivalent from n = 4 on, against 38 for our tile GEMM at n = 16 and 74 / 110
 * for dequantize + OpenBLAS sgemm at n = 64 / 256. AMX tiles (below) pay a
 * fixed ~0.75 ns per weight for dequantizing and packing, then run at
 * 100 / 240 / 290 GFLOP/s at n = 64 / 256 / 512; they overtake the tables
 * between 32 and 64 tokens (4096x4096: 15.9 vs 14.2 ms at 32, 19.8 vs 31 at 64).
 * Without AMX the tables take every batch: on a Zen 5 VM (no AMX) 7B 2x8
 * prompts of 64 / 256 / 512 tokens ran at 16.1 / 14.2 / 14.4 tok/s with them,
 * 5.6 / 9.3 / 11.1 with dequantize + OpenBLAS. */
#define KVQ_LUTQ_MAX_N 40
/* Below this many tokens the per-token tables (matmul_lutq, all tokens in one parallel region)
 * beat the batched ones: synthetic Llama-2-7B 2x8, 2 threads, Zen 5 VM, kvq-bench model -p N:
 * batched 8.1 / 9.8 / 8.3 tok/s at 2 / 4 / 8 tokens, per-token 14.2 / 17.1 / 16.9 (12 tokens 18.0;
 * the batched kernel from 16 on, 12.0). A server's few decode rows per step take this path. */
#define KVQ_LUTQ_MIN_N KVQ_LUT_MAX_N
/* From this many tokens on, AMX tiles (where the CPU has them) take every weight
 * kind that the tables above do not. */
#define KVQ_AMX_MIN_N 16
/* Rows per tile in the batched path without BLAS (a tile of f32 rows stays in
 * L2); LUT-layout AQLM uses 64-row tiles so each 64-byte line of codes is
 * dequantized in one go. */
#define KVQ_TILE_ROWS 16
#define KVQ_TILE_ROWS_LUT 64
/* From this many tokens on (with BLAS), chunks of rows are widened and handed
 * to cblas_sgemm (about 2x our own tile kernel at 256 tokens); about this many
 * f32 weights per sgemm call. */
#define KVQ_BLAS_MIN_N 64
#define KVQ_BLAS_CHUNK ((size_t)2 << 20)
/* Dense tensors of this many bytes and more are copied out of the checkpoint
 * mapping into our own (huge-page) memory, and the mapping's pages released:
 * the same GEMV read 4 KB page-cache pages 1.2-1.4x slower on the Zen 5 VM
 * (7B LM head, 262 MB fp16: 6.4-6.8 ms mean per token in place, 4.8-5.5 ms
 * copied; best calls 4.3 ms either way). Peak RSS does not grow. */
#define KVQ_DENSE_COPY_MIN ((size_t)2 << 20)
/* Below this many multiply-adds per thread, extra threads cost more than they give. */
#define KVQ_MIN_WORK_PER_THREAD (1 << 16)

/* ---- kernel tables ---- */

static const kvq_mm_kernels k_scalar = {
    kvq_dense_gemv_scalar,      kvq_dense_rows_scalar,       kvq_gemm_scalar,      kvq_aqlm_lut_build_scalar,
    kvq_aqlm_lut_gemv_scalar,   kvq_aqlm_gather_gemv_scalar, kvq_aqlm_rows_scalar, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};
#if defined(__aarch64__)
/* Tables are built in f32 and looked up as int16 (tbl/tbx); no batched lookup
 * kernel yet, so prompts take the tile path with the NEON GEMM. */
static const kvq_mm_kernels k_neon = {
    kvq_dense_gemv_neon,      kvq_dense_rows_scalar,      kvq_gemm_neon,           kvq_aqlm_lut_build_scalar,
    kvq_aqlm_lut_gemv_scalar, kvq_aqlm_gather_gemv_neon,  kvq_aqlm_rows_scalar,    kvq_aqlm_lutq_build_neon,
    kvq_aqlm_lutq_pack_neon,  kvq_aqlm_lutq_gemv_neon,    NULL,                    NULL,
    NULL,                     NULL,
};
#endif
#if defined(__x86_64__)
static const kvq_mm_kernels k_avx2 = {
    kvq_dense_gemv_avx2,    kvq_dense_rows_avx2,       kvq_gemm_avx2,       kvq_aqlm_lut_build_avx2,
    kvq_aqlm_lut_gemv_avx2, kvq_aqlm_gather_gemv_avx2, kvq_aqlm_rows_avx2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};
/* ... with plain loads for the lookups (AMD). */
static const kvq_mm_kernels k_avx2_loads = {
    kvq_dense_gemv_avx2,    kvq_dense_rows_avx2,       kvq_gemm_avx2,       kvq_aqlm_lut_build_avx2,
    kvq_aqlm_lut_gemv_rows, kvq_aqlm_gather_gemv_avx2, kvq_aqlm_rows_avx2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};
/* Widening/dequantizing tiles is not the bottleneck, so AVX-512 reuses the AVX2 ones. */
static const kvq_mm_kernels k_avx512 = {
    kvq_dense_gemv_avx512,    kvq_dense_rows_avx2,         kvq_gemm_avx512,    kvq_aqlm_lut_build_avx512,
    kvq_aqlm_lut_gemv_avx512, kvq_aqlm_gather_gemv_avx512, kvq_aqlm_rows_avx2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};

/* AVX-512 with byte permutes: only the LUT pair differs. */
static const kvq_mm_kernels k_avx512_vbmi = {
    kvq_dense_gemv_avx512,  kvq_dense_rows_avx2,         kvq_gemm_avx512,    kvq_aqlm_lut_build_vbmi,
    kvq_aqlm_lut_gemv_vbmi, kvq_aqlm_gather_gemv_avx512, kvq_aqlm_rows_avx2, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};
/* ... and with int16 tables (prompts batched when a row has up to 65536 steps, else token by token). */
static const kvq_mm_kernels k_avx512_vbmi16 = {
    kvq_dense_gemv_avx512,      kvq_dense_rows_avx2,         kvq_gemm_avx512,         kvq_aqlm_lut_build_vbmi,
    kvq_aqlm_lut_gemv_vbmi,     kvq_aqlm_gather_gemv_avx512, kvq_aqlm_rows_avx2,      kvq_aqlm_lutq_build_avx512,
    kvq_aqlm_lutq_pack_vbmi,    kvq_aqlm_lutq_gemv_vbmi,     kvq_aqlm_lutq_gemm_vbmi,     kvq_aqlm_lut8_pack_vbmi,
    kvq_aqlm_lut8_gemv_vbmi,    kvq_aqlm_lut8_gemm_vbmi,
};
#endif

static int g_vbmi_on = 2, g_has_vbmi = -1, g_amx_on = 1, g_has_amx = -1;

int kvq_cpu_has_amx(void) {
    int v = __atomic_load_n(&g_has_amx, __ATOMIC_ACQUIRE);
    if (v < 0) {
#if defined(__x86_64__)
        v = kvq_cpu_isa_available(KVQ_ISA_AVX512) && kvq_amx_probe();
#else
        v = 0;
#endif
        __atomic_store_n(&g_has_amx, v, __ATOMIC_RELEASE);
    }
    return v;
}

int kvq_cpu_set_amx(int on) { return __atomic_exchange_n(&g_amx_on, on != 0, __ATOMIC_ACQ_REL); }

#if defined(__x86_64__)
static int amx_on(void) {
    return kvq_cpu_isa() == KVQ_ISA_AVX512 && __atomic_load_n(&g_amx_on, __ATOMIC_ACQUIRE) && kvq_cpu_has_amx();
}
#endif
/* Will batches of KVQ_AMX_MIN_N tokens or more go to AMX tiles? */
static int amx_ready(void) {
#if defined(__x86_64__)
    return amx_on();
#else
    return 0;
#endif
}

int kvq_cpu_has_vbmi(void) {
    int v = __atomic_load_n(&g_has_vbmi, __ATOMIC_ACQUIRE);
    if (v < 0) {
#if defined(__x86_64__)
        __builtin_cpu_init();
        /* the int16-table lookups also need VNNI (every VBMI CPU but Cannon Lake has it) */
        v = kvq_cpu_isa_available(KVQ_ISA_AVX512) && __builtin_cpu_supports("avx512vbmi") &&
            __builtin_cpu_supports("avx512vnni");
#else
        v = 0;
#endif
        __atomic_store_n(&g_has_vbmi, v, __ATOMIC_RELEASE);
    }
    return v;
}

int kvq_cpu_set_vbmi(int level) {
    return __atomic_exchange_n(&g_vbmi_on, level < 0 ? 0 : level > 2 ? 2 : level, __ATOMIC_ACQ_REL);
}

static int g_avx2_lut = 0, g_loads_faster = -1;

#if defined(__x86_64__)
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Which AVX2 lookup kernel is faster on this core: the two give the same bits
 * (kvq_aqlm_lut_gemv_rows), so a short timing picks one and no output depends
 * on the noise. Gathers won on an Intel VM (12.6 against 7.7 G lookups/s),
 * plain loads on a Zen 5 VM (0.81 against 1.21 ms); AMD's older gathers are
 * microcoded and Intel's Gather Data Sampling fix slows them: no vendor
 * rule fits. 16 steps of 4096 rows (64 KB of
 * codes, 16 KB of tables, as one decode chunk), each kernel 9 times in turn,
 * best of each: about 2 ms, once per process. Without memory: gathers. */
static int probe_loads_faster(void) {
    enum { ROWS = 4096, STEPS = 16, REPS = 9 };
    uint8_t *codes = kvq_alloc_aligned((size_t)ROWS * STEPS);
    float *lut = kvq_alloc_aligned(sizeof(float) * 256 * STEPS), *acc = kvq_alloc_aligned(sizeof(float) * ROWS);
    int loads = 0;
    if (codes && lut && acc) {
        kvq_cpu_weight w = {.kind = KVQ_CW_AQLM_LUT, .rows = ROWS, .rows_pad = ROWS, .M = 2, .G = STEPS / 2,
                            .nbits = 8, .codes = codes};
        uint32_t r = 0x2545f491u;
        for (size_t i = 0; i < (size_t)ROWS * STEPS; i++) codes[i] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
        for (int i = 0; i < 256 * STEPS; i++) lut[i] = (float)(i % 97) * 0.01f;
        memset(acc, 0, sizeof(float) * ROWS);
        double best[2] = {1e9, 1e9};
        for (int rep = 0; rep < REPS; rep++)
            for (int k = 0; k < 2; k++) {
                double t0 = now_s();
                (k ? kvq_aqlm_lut_gemv_rows : kvq_aqlm_lut_gemv_avx2)(&w, lut, 0, STEPS, acc, 0, ROWS);
                double dt = now_s() - t0;
                if (dt < best[k]) best[k] = dt;
            }
        loads = best[1] < best[0];
    }
    kvq_free_aligned(codes), kvq_free_aligned(lut), kvq_free_aligned(acc);
    return loads;
}
#endif

int kvq_cpu_set_avx2_lut(int mode) {
    return __atomic_exchange_n(&g_avx2_lut, mode < 0 || mode > 2 ? 0 : mode, __ATOMIC_ACQ_REL);
}

int kvq_cpu_avx2_lut_loads(void) {
    int mode = __atomic_load_n(&g_avx2_lut, __ATOMIC_ACQUIRE);
    if (mode) return mode == 2;
    int v = __atomic_load_n(&g_loads_faster, __ATOMIC_ACQUIRE);
    if (v < 0) {
#if defined(__x86_64__)
        v = kvq_cpu_isa_available(KVQ_ISA_AVX2) ? probe_loads_faster() : 0;
#else
        v = 0;
#endif
        __atomic_store_n(&g_loads_faster, v, __ATOMIC_RELEASE);
    }
    return v;
}

static const kvq_mm_kernels *kernels(void) {
    switch (kvq_cpu_isa()) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512: {
        int level = kvq_cpu_has_vbmi() ? __atomic_load_n(&g_vbmi_on, __ATOMIC_ACQUIRE) : 0;
        return level == 2 ? &k_avx512_vbmi16 : level == 1 ? &k_avx512_vbmi : &k_avx512;
    }
    case KVQ_ISA_AVX2: return kvq_cpu_avx2_lut_loads() ? &k_avx2_loads : &k_avx2;
#endif
#if defined(__aarch64__)
    case KVQ_ISA_NEON: return &k_neon;
#endif
    default: return &k_scalar;
    }
}

/* Does 1x16 decode run faster on int8 codewords than on the fp16 codebook's gathers with the
 * kernels in use? Decided by ISA features, from kvq-bench isa (docs/performance.md, "CPU
 * classes"): with AVX-512 VNNI the int8 dot products win (one 512-bit gather feeds 8 tokens);
 * the ymm kernels widen each codeword to int16 and scale it by its class, more work per value
 * than the fp16 gathers' convert + FMA, and lose with or without AVX-VNNI (a 7B decode at 0.48x
 * on a Zen 3; GEMVs at 0.4-0.9x here). NEON and the scalar spec keep the int8 codewords (NEON
 * not measured on hardware). */
int kvq_cpu_i8_wins(void) {
    switch (kvq_cpu_isa()) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512: return kvq_cpu_has_vnni();
    case KVQ_ISA_AVX2: return 0;
#endif
    default: return 1;
    }
}

void kvq_cpu_kernel_names(char *out, size_t n, int i8) {
    const char *tables = "f32 tables";
#if defined(__x86_64__)
    int level = kvq_cpu_isa() == KVQ_ISA_AVX512 && kvq_cpu_has_vbmi() ? __atomic_load_n(&g_vbmi_on, __ATOMIC_ACQUIRE) : 0;
    if (kvq_cpu_isa() == KVQ_ISA_AVX512)
        tables = level == 2 ? "int16 tables (vpermb)" : level == 1 ? "f32 tables (vpermb)" : "f32 tables (gathers)";
    else if (kvq_cpu_isa() == KVQ_ISA_AVX2)
        tables = kvq_cpu_avx2_lut_loads() ? "f32 tables (plain loads, faster here than gathers)"
                                          : "f32 tables (gathers, faster here than plain loads)";
#elif defined(__aarch64__)
    tables = "int16 tables (tbl)";
#endif
    const char *why = i8 == 2 ? "asked for" : i8 ? "AVX-512 VNNI" : "faster than int8 codewords without AVX-512 VNNI";
    snprintf(out, n, "8-bit codes: %s; 1x16: %s (%s)", tables, i8 ? "int8 codewords" : "fp16 codeword gathers",
             kvq_cpu_isa() == KVQ_ISA_SCALAR || kvq_cpu_isa() == KVQ_ISA_NEON ? (i8 == 2 ? "asked for" : i8 ? "default" : "off") : why);
}

/* ---- upload ---- */

static size_t elem_size(kvq_wformat f) { return f == KVQ_W_F32 ? 4 : 2; }

static int is_dense(kvq_wformat f) { return f == KVQ_W_F32 || f == KVQ_W_F16 || f == KVQ_W_BF16; }

void kvq_cpu_weight_free(kvq_cpu_weight *w) {
    if (!w) return;
    if (w->owned & KVQ_OWN_DATA) kvq_free_aligned(w->data);
    if (w->owned & KVQ_OWN_CODES) kvq_free_aligned(w->codes);
    if (w->owned & KVQ_OWN_BLOCK) kvq_free_aligned(w->block);
    kvq_free_aligned(w->bias);
    kvq_free_aligned(w->cb);
    kvq_free_aligned(w->cb_t);
    kvq_free_aligned(w->scales);
    free(w->cbq_perm);
    free(w);
}

/* memcpy in 2 MB pieces on all threads (the page faults of a fresh copy are
 * the dear part, and they go in parallel); with release, each piece of a
 * file mapping leaves memory once copied, so the tensor is never held twice. */
static void copy_parallel(void *dst, const void *src, size_t n, int release) {
    const size_t piece = (size_t)2 << 20;
    long pieces = (long)((n + piece - 1) / piece);
#pragma omp parallel for schedule(dynamic, 1) if (pieces > 1)
    for (long i = 0; i < pieces; i++) {
        size_t o = (size_t)i * piece, len = n - o < piece ? n - o : piece;
        memcpy((char *)dst + o, (const char *)src + o, len);
        if (release) kvq_mmap_release((const char *)src + o, len);
    }
}

kvq_cpu_weight *kvq_cpu_weight_new(const kvq_weight_desc *d) {
    if (!d) {
        kvq_fail(KVQ_ERR_ARG, "kvq_cpu_weight_new: no weight description");
        return NULL;
    }
    const char *nm = d->name ? d->name : "(unnamed weight)";
    size_t n_el;
    if (d->rows < 1 || d->cols < 1 || !kvq_mul_ok((size_t)d->rows, (size_t)d->cols, &n_el) ||
        n_el > ((size_t)1 << 40)) {
        kvq_fail(KVQ_ERR_FORMAT, "%s: bad weight shape %d x %d", nm, d->rows, d->cols);
        return NULL;
    }
    if (!is_dense(d->fmt) && d->fmt != KVQ_W_AQLM) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: unknown weight format %d", nm, (int)d->fmt);
        return NULL;
    }
    if (d->bias && !is_dense(d->bias_fmt)) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: bias format %d is not F32/F16/BF16", nm, (int)d->bias_fmt);
        return NULL;
    }
    kvq_cpu_weight *w = calloc(1, sizeof *w);
    if (!w) {
        kvq_fail(KVQ_ERR_NOMEM, "%s: out of memory", nm);
        return NULL;
    }
    w->fmt = d->fmt;
    w->rows = d->rows;
    w->cols = d->cols;
    w->bytes = sizeof *w;

    if (d->fmt == KVQ_W_AQLM) {
        if (kvq_cpu_aqlm_init(w, d) != KVQ_OK) goto fail;
    } else {
        if (!d->data) {
            kvq_fail(KVQ_ERR_FORMAT, "%s: dense weight without data", nm);
            goto fail;
        }
        size_t bytes = n_el * elem_size(d->fmt);
        if ((uintptr_t)d->data % elem_size(d->fmt) == 0 && !(d->in_mapping && !d->rows_only && bytes >= KVQ_DENSE_COPY_MIN)) {
            /* Used in place: the kernels read every layout as stored. */
            w->data = (void *)(uintptr_t)d->data;
        } else { /* big tensors of the mapping, or misaligned ones (hand-made file): a copy */
            if (!(w->data = kvq_alloc_aligned(bytes))) {
                kvq_fail(KVQ_ERR_NOMEM, "%s: cannot allocate %zu bytes", nm, bytes);
                goto fail;
            }
            w->owned |= KVQ_OWN_DATA;
            copy_parallel(w->data, d->data, bytes, d->in_mapping);
        }
        w->bytes += bytes;
        w->kind = KVQ_CW_DENSE;
    }
    if (d->bias) {
        if (!(w->bias = kvq_alloc_aligned((size_t)d->rows * sizeof(float)))) {
            kvq_fail(KVQ_ERR_NOMEM, "%s: cannot allocate bias", nm);
            goto fail;
        }
        for (int o = 0; o < d->rows; o++) w->bias[o] = kvq_dense_at(d->bias_fmt, d->bias, (size_t)o);
        w->bytes += (size_t)d->rows * sizeof(float);
    }
    return w;
fail:
    kvq_cpu_weight_free(w);
    return NULL;
}

size_t kvq_cpu_weight_bytes(const kvq_cpu_weight *w) { return w ? w->bytes : 0; }
int kvq_cpu_weight_rows(const kvq_cpu_weight *w) { return w->rows; }
int kvq_cpu_weight_cols(const kvq_cpu_weight *w) { return w->cols; }

void kvq_cpu_weight_row(const kvq_cpu_weight *w, int row, float *out) {
    if (row < 0 || row >= w->rows) return;
    if (w->kind == KVQ_CW_DENSE)
        kvq_dense_rows_scalar(w, row, row + 1, out);
    else
        kvq_aqlm_rows_scalar(w, row, row + 1, out);
}

/* ---- per-thread scratch (LUTs, dequantized tiles) ---- */

/* Kept per calling thread and reused across calls: a fresh multi-MB malloc per
 * matmul would page-fault its way through the memory on every token. */
typedef struct {
    float *p;
    size_t n;
} scratch_buf;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *v) {
    scratch_buf *s = v;
    kvq_free_aligned(s->p);
    free(s);
}
static void scratch_init(void) { pthread_key_create(&g_scratch_key, scratch_destroy); }

/* At least n floats, or NULL when memory is short. */
static float *scratch(size_t n) {
    pthread_once(&g_scratch_once, scratch_init);
    scratch_buf *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        pthread_setspecific(g_scratch_key, s);
    }
    if (s->n < n) {
        kvq_free_aligned(s->p);
        s->p = kvq_alloc_aligned(n * sizeof(float));
        s->n = s->p ? n : 0;
    }
    return s->p;
}

/* ---- dispatch ---- */

/* W[o][c] without any buffer (last-resort path). */
static float weight_at(const kvq_cpu_weight *w, int o, int c) {
    if (w->kind == KVQ_CW_DENSE) return kvq_dense_at(w->fmt, w->data, (size_t)o * w->cols + c);
    size_t g = (size_t)(c / w->ig), j = (size_t)(c % w->ig);
    float v = 0.0f;
    for (int m = 0; m < w->M; m++) v += kvq_cw_val(w, (size_t)m, kvq_cw_code(w, (size_t)o, g, (size_t)m), j);
    return w->scales[o] * v;
}

static void add_bias(const kvq_cpu_weight *w, float *y, int r0, int r1) {
    if (w->bias)
        for (int o = r0; o < r1; o++) y[o] += w->bias[o];
}

static int threads_for(int n_threads, size_t work) {
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    size_t most = work / KVQ_MIN_WORK_PER_THREAD;
    if (most < 1) most = 1;
    return (size_t)n_threads < most ? n_threads : (int)most;
}

/* LUT paths, one token at a time: threads split the steps, not the rows.
 * Tables are built and used a chunk of groups at a time in the thread's own
 * scratch, so they are still in L1/L2 when looked up (all of a 14336-column
 * matrix's f32 tables are 1.8 MB per thread: they fell out of L2, and the
 * lookups waited on them). A thread sums its chunks for all rows into its
 * partial outputs (a chunk's codes are one sequential run, which the
 * prefetchers stream at ~1.2x the rate of a row slice of every step); after
 * one barrier each thread adds the partials of a slice of rows. With an odd
 * M, groups go in twos so every chunk's first step is even (step pairs share
 * a table block). */
#define KVQ_MAX_LUT_THREADS 1024
#define KVQ_LUT_CHUNK_STEPS 16  /* f32 tables: 16 KB per chunk */
#define KVQ_LUTQ_CHUNK_STEPS 128 /* int16 tables: 128 KB of f32, then 64 KB packed */

/* Groups per chunk of about `steps` steps (a multiple of the unit). */
static int chunk_groups(const kvq_cpu_weight *w, int steps) {
    int unit = w->M % 2 ? 2 : 1, c = steps / w->M / unit * unit;
    return c < unit ? unit : c;
}
static int lut_chunk(const kvq_cpu_weight *w) { return chunk_groups(w, KVQ_LUT_CHUNK_STEPS); }
static int lutq_decode_chunk(const kvq_cpu_weight *w) { return chunk_groups(w, KVQ_LUTQ_CHUNK_STEPS); }

/* Rows [o0, o1) of token tok of n, scaled, when each of K slots keeps n
 * partial outputs (matmul_lutq's slots; matmul_lut's threads with n = 1):
 * the partials summed in slot order, 64 rows at a time so the adds run
 * across rows (vectors) while each row's order stays the slots'. */
static void lut_reduce_tok(const kvq_cpu_weight *w, const float *parts, int K, int n, int tok, float *yt, int o0, int o1) {
    size_t pad = (size_t)w->rows_pad;
    for (int o = o0; o < o1; o += 64) {
        int m = o1 - o < 64 ? o1 - o : 64;
        float sum[64] = {0};
        for (int i = 0; i < K; i++) {
            const float *p = parts + ((size_t)i * n + tok) * pad + (size_t)o;
            for (int j = 0; j < m; j++) sum[j] += p[j];
        }
        for (int j = 0; j < m; j++) yt[o + j] = w->scales[o + j] * sum[j];
    }
    add_bias(w, yt, o0, o1);
}

/* f32 tables (lut_gemv): each thread takes one run of groups, in chunks of
 * lut_chunk(w) groups at lut + t*lut_chunk(w)*M*256. */
static void matmul_lut(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt,
                       float *lut, float *parts) {
    int unit = w->M % 2 ? 2 : 1, units = (w->G + unit - 1) / unit, rows16 = (w->rows + 15) / 16, chunk = lut_chunk(w);
    size_t pad = (size_t)w->rows_pad;
    if (nt > KVQ_MAX_LUT_THREADS) nt = KVQ_MAX_LUT_THREADS;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), u0, u1, o0, o1;
        kvq_split(units, T, t, &u0, &u1);
        kvq_split(rows16, T, t, &o0, &o1);
        int g0 = u0 * unit, g1 = u1 * unit < w->G ? u1 * unit : w->G;
        o0 *= 16, o1 = o1 * 16 < w->rows ? o1 * 16 : w->rows;
        float *mine = parts + (size_t)t * pad, *own = lut + (size_t)t * chunk * w->M * 256;
        for (int tok = 0; tok < n; tok++) {
            const float *xt = x + (size_t)tok * w->cols;
            memset(mine, 0, pad * sizeof *mine);
            for (int gc = g0; gc < g1; gc += chunk) {
                int ge = gc + chunk < g1 ? gc + chunk : g1;
                k->lut_build(w, xt, own, gc, ge);
                k->lut_gemv(w, own, gc * w->M, ge * w->M, mine, 0, w->rows_pad);
            }
#pragma omp barrier
            lut_reduce_tok(w, parts, T, 1, 0, y + (size_t)tok * w->rows, o0, o1);
            if (tok + 1 < n) {
#pragma omp barrier
            }
        }
    }
}

/* The chunks of groups the int16-table decode hands out, in order: full
 * chunks while much is left, then ever smaller ones (down to a quarter
 * chunk), so the threads finish together (on the Zen 5 VM the faster
 * thread's wait at the barrier halved: 7B 2x8 decode, ~4 ms of 60 per
 * token). Fixed by the weight, the chunk and T alone; writes the K + 1
 * chunk starts (the last is w->G) when starts is given, returns K. */
static int lutq_schedule(const kvq_cpu_weight *w, int chunk, int T, int *starts) {
    int unit = w->M % 2 ? 2 : 1, least = chunk / 4 / unit * unit, k = 0;
    for (int g = 0; g < w->G; k++) {
        int want = (w->G - g) / (2 * T) / unit * unit;
        want = want > chunk ? chunk : want < least ? least : want;
        if (want < unit) want = unit;
        if (starts) starts[k] = g;
        g = g + want < w->G ? g + want : w->G;
    }
    if (starts) starts[k] = w->G;
    return k;
}

/* Quantized tables a weight's lookups use: int8 (lut8, on kernels that have
 * it; the three lut8_* come together) or int16. The kernel pairs share their
 * signatures; only the range of q and the bytes per step pair differ. */
typedef struct {
    void (*pack)(const kvq_cpu_weight *, const float *, float, void *, size_t, int, int);
    void (*gemv)(const kvq_cpu_weight *, const void *, int, int, float, int32_t *, float *, int, int);
    void (*gemm)(const kvq_cpu_weight *, const void *, size_t, const float *, int, float *, size_t, int, int);
    float qmax;        /* q = round(T * qmax / max|T|) */
    size_t pair_bytes; /* one token's tables of a step pair */
} qtables;

static qtables qtables_for(const kvq_mm_kernels *k, const kvq_cpu_weight *w) {
    if (w->lut8 && k->lut8_pack) return (qtables){k->lut8_pack, k->lut8_gemv, k->lut8_gemm, 127.0f, 512};
    return (qtables){k->lutq_pack, k->lutq_gemv, k->lutq_gemm, 32767.0f, 1024};
}

/* Scratch floats per thread of matmul_lutq: f32 tables, int16 tables, int32 sums. */
static size_t lutq_thread_floats(const kvq_cpu_weight *w) {
    return (size_t)lutq_decode_chunk(w) * w->M * (256 + 128) + (size_t)w->rows_pad;
}

/* int16 tables (lutq_*): the groups in chunks of up to lutq_decode_chunk(w)
 * (lutq_schedule), each with its own scale: q = round(T * 32767 / max|T| of
 * the chunk), exact int32 sums per chunk. Per chunk, not per token, so the
 * tables never leave the thread's cache and the error is no larger than with
 * one scale per token. The first K/(T+1) chunks per thread are fixed (thread
 * t's run of them summed into its own slot, which stays in L1); the rest go
 * to whichever thread asks first (the two vCPUs of a VM ran the same share
 * 10-30% apart), each into a slot of its own. The slots are summed in order,
 * so which thread took which chunk changes no bit: the same call gives the
 * same floats every time (with one partial per thread, greedy decode on 2+
 * threads differed from run to run; a slot per chunk throughout cost 4-5% of
 * 7B 2x8 decode). A step of several tokens (server rows, speculative
 * drafts) runs every token through a chunk before the next chunk is taken:
 * the chunk's codes come from memory once for all of them, and each token
 * gets the chunks, scales and int32 sums it would get alone. parts holds n
 * partial outputs per slot (slot k's token i at parts + (k*n + i)*rows_pad),
 * then the schedule's starts as ints. */
static void matmul_lutq(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt,
                        float *scratch_all, float *parts, int max_slots) {
    int rows16 = (w->rows + 15) / 16, chunk = lutq_decode_chunk(w), next = 0, K = 0, fixed = 0;
    qtables qt = qtables_for(k, w);
    size_t pad = (size_t)w->rows_pad, per = lutq_thread_floats(w);
    int *starts = (int *)(parts + (size_t)max_slots * pad * n);
    if (nt > KVQ_MAX_LUT_THREADS) nt = KVQ_MAX_LUT_THREADS;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), o0, o1;
#pragma omp single
        {
            K = lutq_schedule(w, chunk, T, starts); /* T <= nt: K + T <= max_slots */
            fixed = K / (T + 1);
            next = T * fixed;
        }
        kvq_split(rows16, T, t, &o0, &o1);
        o0 *= 16, o1 = o1 * 16 < w->rows ? o1 * 16 : w->rows;
        float *own = scratch_all + (size_t)t * per;
        void *q = own + (size_t)chunk * w->M * 256;
        int32_t *acc = (int32_t *)(own + (size_t)chunk * w->M * 384);
        memset(parts + (size_t)t * n * pad, 0, pad * n * sizeof *parts);
        /* chunk c into slot s: thread t's fixed chunks into slot t, a taken one into T + its rank */
        for (int i = 0, c = t * fixed;; i++, c++) {
            int s = t;
            if (i >= fixed) {
                if ((c = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) >= K) break;
                s = T + c - T * fixed;
                memset(parts + (size_t)s * n * pad, 0, pad * n * sizeof *parts);
            }
            int ga = starts[c], gb = starts[c + 1];
            for (int tok = 0; tok < n; tok++) {
                float mx = k->lutq_build(w, x + (size_t)tok * w->cols, own, ga, gb);
                /* mx = 0: all tables zero, any scale works; non-finite mx makes the outputs non-finite too */
                qt.pack(w, own, mx > 0.0f ? qt.qmax / mx : 0.0f, q, qt.pair_bytes, ga, gb);
                qt.gemv(w, q, ga * w->M, gb * w->M, mx / qt.qmax, acc, parts + ((size_t)s * n + tok) * pad, 0,
                        w->rows_pad);
            }
        }
#pragma omp barrier
        for (int tok = 0; tok < n; tok++)
            lut_reduce_tok(w, parts, T + K - T * fixed, n, tok, y + (size_t)tok * w->rows, o0, o1);
    }
}

/* The int16-table path for several tokens (prompts): chunks of up to
 * KVQ_LUTQ_MAX_T tokens share one pass over the codes (lutq_gemm), so the
 * lookups, not memory, set the pace. Per chunk: every thread builds its
 * groups' f32 tables for all tokens of the chunk, a barrier to agree on each
 * token's scale, packing, a barrier, the lookups, and a barrier before the
 * tables are reused. */
#define KVQ_LUTQ_THREADS 64
#define KVQ_LUTQ_SCRATCH ((size_t)32 << 20) /* bytes of tables per chunk, about */

static int lutq_chunk(const kvq_cpu_weight *w) {
    size_t per_token = (size_t)w->G * w->M * (1024 + 512), c = KVQ_LUTQ_SCRATCH / per_token;
    return c < 1 ? 1 : c > KVQ_LUTQ_MAX_T ? KVQ_LUTQ_MAX_T : (int)c;
}

static void matmul_lutq_batch(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt,
                              float *lut, void *qluts) {
    size_t lut_n = (size_t)w->G * w->M * 256;
    int units = w->rows_pad / KVQ_AQLM_RB, tm = lutq_chunk(w);
    float maxes[KVQ_LUTQ_THREADS][KVQ_LUTQ_MAX_T];
    qtables qt = qtables_for(k, w);
    size_t pb = qt.pair_bytes;
    if (nt > KVQ_LUTQ_THREADS) nt = KVQ_LUTQ_THREADS;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), g0, g1, u0, u1, unit = w->M % 2 ? 2 : 1;
        kvq_split((w->G + unit - 1) / unit, T, t, &g0, &g1); /* in units: every thread's first step is even */
        g0 *= unit, g1 = g1 * unit < w->G ? g1 * unit : w->G;
        kvq_split(units, T, t, &u0, &u1);
        size_t s0 = (size_t)g0 * w->M; /* this thread's tables start at step s0 */
        int r0 = u0 * KVQ_AQLM_RB, r1 = u1 * KVQ_AQLM_RB, y1 = r1 < w->rows ? r1 : w->rows;
        float scales[KVQ_LUTQ_MAX_T];
        for (int c0 = 0; c0 < n; c0 += tm) {
            int cn = n - c0 < tm ? n - c0 : tm;
            for (int i = 0; i < cn; i++) {
                const float *xi = x + (size_t)(c0 + i) * w->cols;
                maxes[t][i] = g1 > g0 ? k->lutq_build(w, xi, lut + (size_t)i * lut_n + s0 * 256, g0, g1) : 0.0f;
            }
#pragma omp barrier
            for (int i = 0; i < cn; i++) {
                float mx = 0.0f;
                for (int j = 0; j < T; j++) mx = maxes[j][i] > mx || maxes[j][i] != maxes[j][i] ? maxes[j][i] : mx;
                scales[i] = mx / qt.qmax;
                const float *li = lut + (size_t)i * lut_n + s0 * 256;
                char *qi = (char *)qluts + s0 / 2 * cn * pb + (size_t)i * pb;
                if (g1 > g0) qt.pack(w, li, mx > 0.0f ? qt.qmax / mx : 0.0f, qi, (size_t)cn * pb, g0, g1);
            }
#pragma omp barrier
            float *yc = y + (size_t)c0 * w->rows;
            if (r1 > r0) qt.gemm(w, qluts, (size_t)cn * pb, scales, cn, yc, (size_t)w->rows, r0, r1);
            for (int i = 0; i < cn; i++) add_bias(w, yc + (size_t)i * w->rows, r0, y1);
#pragma omp barrier
        }
    }
}

/* Dense and codeword-gather weights for a few tokens: one pass over the
 * weight per KVQ_GEMV_MAX_T (dense) or KVQ_GATHER_MAX_T tokens, rows split among threads. */
static void matmul_gemv(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt) {
    const int per = w->kind == KVQ_CW_DENSE ? KVQ_GEMV_MAX_T : KVQ_GATHER_MAX_T;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), r0, r1;
        kvq_split(w->rows, T, t, &r0, &r1);
        for (int t0 = 0; t0 < n; t0 += per) {
            int nn = n - t0 < per ? n - t0 : per;
            const float *xt = x + (size_t)t0 * w->cols;
            float *yt = y + (size_t)t0 * w->rows;
            if (w->kind == KVQ_CW_DENSE)
                k->dense_gemv(w, xt, nn, yt, r0, r1);
            else
                k->gather_gemv(w, xt, nn, yt, r0, r1);
            for (int i = 0; i < nn; i++) add_bias(w, yt + (size_t)i * w->rows, r0, r1);
        }
    }
}

/* Tile of rows as f32: dense F32 is used in place, the rest lands in buf. */
static const float *tile_f32(const kvq_mm_kernels *k, const kvq_cpu_weight *w, int r0, int r1, float *buf) {
    if (w->kind == KVQ_CW_DENSE && w->fmt == KVQ_W_F32) return (const float *)w->data + (size_t)r0 * w->cols;
    if (w->kind == KVQ_CW_DENSE)
        k->dense_rows(w, r0, r1, buf);
    else
        k->aqlm_rows(w, r0, r1, buf);
    return buf;
}

static int tile_rows(const kvq_cpu_weight *w) { return w->kind == KVQ_CW_AQLM_LUT ? KVQ_TILE_ROWS_LUT : KVQ_TILE_ROWS; }

static void matmul_tiled(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt,
                         float *bufs) {
    int tr = tile_rows(w), n_tiles = (w->rows + tr - 1) / tr;
#pragma omp parallel num_threads(nt)
    {
        float *buf = bufs + (size_t)omp_get_thread_num() * tr * w->cols;
#pragma omp for schedule(static)
        for (int tile = 0; tile < n_tiles; tile++) {
            int r0 = tile * tr, r1 = r0 + tr < w->rows ? r0 + tr : w->rows;
            const float *W = tile_f32(k, w, r0, r1, buf);
            k->gemm(W, (size_t)w->cols, r1 - r0, w->cols, x, n, y + r0, (size_t)w->rows);
            if (w->bias)
                for (int t = 0; t < n; t++) add_bias(w, y + (size_t)t * w->rows, r0, r1);
        }
    }
}

#if defined(__x86_64__)
/* Batches on AMX tiles: activations split into bf16 hi/lo once, then every
 * thread takes 64-row blocks: widen/dequantize to f32, pack as tiles, and run
 * all tokens through them (dense/amx_avx512.c). */
#define KVQ_AMX_ROWS 64
static size_t amx_scratch_floats(const kvq_cpu_weight *w, int n, int nt) {
    size_t kp = ((size_t)w->cols + 31) / 32 * 32, n_pad = ((size_t)n + 15) / 16 * 16;
    return n_pad * kp + (size_t)nt * (KVQ_AMX_ROWS * (size_t)w->cols + KVQ_AMX_ROWS * kp);
}

static void matmul_amx(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n, int nt,
                       float *buf) {
    int cols = w->cols, kp = (cols + 31) / 32 * 32, n_pad = (n + 15) / 16 * 16;
    int blocks = (w->rows + KVQ_AMX_ROWS - 1) / KVQ_AMX_ROWS;
    uint16_t *xh = (uint16_t *)buf, *xl = xh + (size_t)n_pad * kp;
    float *per_thread = buf + (size_t)n_pad * kp;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads(), a, b;
        kvq_split(n_pad, T, t, &a, &b);
        kvq_amx_pack_x(x, n, cols, a, b, kp, xh, xl);
        float *wbuf = per_thread + (size_t)t * (KVQ_AMX_ROWS * (size_t)cols + KVQ_AMX_ROWS * (size_t)kp);
        uint32_t *bh = (uint32_t *)(wbuf + KVQ_AMX_ROWS * (size_t)cols), *bl = bh + KVQ_AMX_ROWS * (size_t)kp / 2;
#pragma omp barrier
#pragma omp for schedule(static)
        for (int blk = 0; blk < blocks; blk++) {
            int r0 = blk * KVQ_AMX_ROWS, r1 = r0 + KVQ_AMX_ROWS < w->rows ? r0 + KVQ_AMX_ROWS : w->rows;
            const float *W = tile_f32(k, w, r0, r1, wbuf);
            kvq_amx_pack_w(W, (size_t)cols, r1 - r0, cols, kp, bh, bl);
            kvq_amx_block(xh, xl, n, kp, bh, bl, r1 - r0, y + r0, (size_t)w->rows);
            if (w->bias)
                for (int i = 0; i < n; i++) add_bias(w, y + (size_t)i * w->rows, r0, r1);
        }
    }
}
#endif

#if defined(KVQ_HAVE_BLAS)
/* Rows per sgemm call: about KVQ_BLAS_CHUNK weights, in 64-row units. */
static int blas_chunk_rows(const kvq_cpu_weight *w) {
    size_t r = KVQ_BLAS_CHUNK / (size_t)w->cols / 64 * 64;
    if (r < 64) r = 64;
    return r < (size_t)w->rows ? (int)r : w->rows;
}

/* Widen/dequantize a chunk of rows, then one sgemm on it. OpenBLAS runs its
 * own pool (sized to n_threads here), and everything else here stays
 * on the calling thread: OpenMP workers spin-wait after a parallel region
 * without yielding, and interleaving our parallel widening with sgemm calls
 * starved OpenBLAS's threads (measured 4x slower than this). */
static void matmul_blas(const kvq_mm_kernels *k, const kvq_cpu_weight *w, const float *x, float *y, int n,
                        float *buf, int n_threads) {
    int rows = w->rows, cols = w->cols;
    openblas_set_num_threads(n_threads); /* -t bounds OpenBLAS's pool too */
    if (w->kind == KVQ_CW_DENSE && w->fmt == KVQ_W_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, cols, 1.0f, x, cols, (const float *)w->data,
                    cols, 0.0f, y, rows);
    } else {
        int chunk = blas_chunk_rows(w);
        for (int c0 = 0; c0 < rows; c0 += chunk) {
            int c1 = c0 + chunk < rows ? c0 + chunk : rows;
            tile_f32(k, w, c0, c1, buf);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, c1 - c0, cols, 1.0f, x, cols, buf, cols, 0.0f,
                        y + c0, rows);
        }
    }
    if (w->bias)
        for (int t = 0; t < n; t++) add_bias(w, y + (size_t)t * rows, 0, rows);
}
#endif

/* No memory for scratch: one value at a time, slow but correct. */
static void matmul_slow(const kvq_cpu_weight *w, const float *x, float *y, int n) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < w->rows; o++) {
            float acc = 0.0f;
            for (int c = 0; c < w->cols; c++) acc += weight_at(w, o, c) * x[(size_t)t * w->cols + c];
            y[(size_t)t * w->rows + o] = acc + (w->bias ? w->bias[o] : 0.0f);
        }
}

int kvq_i8t_min_n(const kvq_cpu_weight *w) {
    if (w->kind == KVQ_CW_DENSE || w->exact || !kvq_i8t_kernel_for_cpu()) return INT_MAX;
    if (w->kind == KVQ_CW_AQLM_GATHER) return KVQ_I8T_MIN_N_GATHER;
    return kernels()->lutq_gemm && (size_t)w->G * w->M <= 65536 ? KVQ_I8T_MIN_N_TABLES : KVQ_I8T_MIN_N;
}

void kvq_cpu_matmul(const kvq_cpu_weight *w, const float *x, float *y, int n, int n_threads) {
    if (n <= 0) return;
    const kvq_mm_kernels *k = kernels();
    size_t work = (size_t)w->rows * (size_t)w->cols * (size_t)n;
    int nt = threads_for(n_threads, work);

    /* int8 codewords: steps of up to 16 tokens on the integer dot products
     * (each row the bits it gets alone); prompts past them on the int8 tiles
     * below, rows dequantized from the same codewords (aqlm_rows) */
    if (w->cbq && n < KVQ_I8T_MIN_N_GATHER) {
        float *buf = scratch((kvq_i8_act_bytes(w->cols, n) + 3) / 4);
        if (buf)
            kvq_cpu_matmul_i8(w, x, y, n, nt, buf);
        else
            matmul_slow(w, x, y, n);
        return;
    }
    const kvq_i8t_kernel *ik = n >= kvq_i8t_min_n(w) ? kvq_i8t_kernel_for_cpu() : NULL;
    if (ik) {
        void *buf = scratch((kvq_i8t_scratch_bytes(w->cols, n, nt) + 3) / 4);
        if (buf) {
            kvq_cpu_matmul_i8t(w, ik, k->aqlm_rows, x, y, n, nt, buf);
            return;
        }
    }
    int batch_lutq = n >= KVQ_LUTQ_MIN_N && (n < KVQ_LUTQ_MAX_N || !amx_ready()) && k->lutq_gemm && (size_t)w->G * w->M <= 65536;
    if (w->kind == KVQ_CW_AQLM_LUT && batch_lutq) {
        int tm = lutq_chunk(w);
        size_t lut_n = (size_t)w->G * w->M * 256, pairs = ((size_t)w->G * w->M + 1) / 2;
        float *luts = scratch((size_t)tm * (lut_n + pairs * 256)); /* f32 tables, then int16 pairs */
        if (luts) {
            matmul_lutq_batch(k, w, x, y, n, nt, luts, luts + (size_t)tm * lut_n);
            return;
        }
    }
    if (w->kind == KVQ_CW_AQLM_LUT && n < KVQ_LUT_MAX_N) {
        /* threads as for one token: the thread count fixes how the groups are
         * chunked, so a step of n tokens gives each the bits it gets alone */
        nt = threads_for(n_threads, (size_t)w->rows * (size_t)w->cols);
        size_t tn = nt > KVQ_MAX_LUT_THREADS ? KVQ_MAX_LUT_THREADS : (size_t)nt;
        /* Per thread a chunk's tables (and with int16 ones, its int32 sums), then a partial output per thread. */
        size_t tables_n = tn * (k->lutq_gemv ? lutq_thread_floats(w) : (size_t)lut_chunk(w) * w->M * 256);
        /* int16 tables: a partial per thread and per taken chunk (lutq_schedule's count grows
         * with T), then the chunk starts */
        int n_chunks = k->lutq_gemv ? lutq_schedule(w, lutq_decode_chunk(w), (int)tn, NULL) : 0;
        int max_slots = n_chunks + (int)tn;
        size_t parts_n = k->lutq_gemv ? (size_t)max_slots * w->rows_pad * (size_t)n + (size_t)n_chunks + 1
                                      : tn * w->rows_pad;
        float *luts = scratch(tables_n + parts_n);
        if (luts) {
            if (k->lutq_gemv)
                matmul_lutq(k, w, x, y, n, nt, luts, luts + tables_n, max_slots);
            else
                matmul_lut(k, w, x, y, n, nt, luts, luts + tables_n);
            return;
        }
    } else if (w->kind == KVQ_CW_DENSE ? n < KVQ_GEMV_MAX_N : w->kind == KVQ_CW_AQLM_GATHER && n < KVQ_GATHER_MAX_N) {
        matmul_gemv(k, w, x, y, n, nt);
        return;
    }
#if defined(__x86_64__)
    if (n >= KVQ_AMX_MIN_N && amx_on()) {
        float *buf = scratch(amx_scratch_floats(w, n, nt));
        if (buf) {
            matmul_amx(k, w, x, y, n, nt, buf);
            return;
        }
    }
#endif
#if defined(KVQ_HAVE_BLAS)
    if (n >= KVQ_BLAS_MIN_N) {
        float *buf = scratch((size_t)blas_chunk_rows(w) * w->cols);
        if (buf) {
            matmul_blas(k, w, x, y, n, buf, n_threads);
            return;
        }
    }
#endif
    float *bufs = scratch((size_t)nt * tile_rows(w) * w->cols);
    if (!bufs) {
        matmul_slow(w, x, y, n);
        return;
    }
    matmul_tiled(k, w, x, y, n, nt, bufs);
}
