/* The CPU matmul dispatcher (cpu_matmul.c): picks a path per weight and
 * batch size, threads it, and owns the switches tests and benchmarks flip.
 * Kernels never include this header: they sit below it in aqlm/, dense/,
 * i8tile/ (each with its own header, included here for the dispatcher's
 * users). */
#ifndef KVQ_CPU_MATMUL_H
#define KVQ_CPU_MATMUL_H

#include "cpu/aqlm/aqlm_kernels.h"
#include "cpu/dense/dense_kernels.h"
#include "cpu/i8tile/i8tile_kernels.h"

/* AVX-512 VBMI (byte permutes) turns the LUT lookups into register shuffles:
 * used with the AVX-512 ISA when the CPU has it. kvq_cpu_set_vbmi(level):
 * 0 off, 1 f32 tables, 2 int16 tables (the default); tests cover all three.
 * Returns the previous setting. */
int kvq_cpu_has_vbmi(void);
int kvq_cpu_set_vbmi(int on);
/* AVX2 LUT lookups: vpgatherdd, or plain loads (kvq_aqlm_lut_gemv_rows, the
 * same bits), whichever a short timing at first use finds faster on this
 * core. kvq_cpu_set_avx2_lut: 0 timed (the default), 1 gathers, 2 loads;
 * returns the previous setting. kvq_cpu_avx2_lut_loads: what is in use now. */
int kvq_cpu_set_avx2_lut(int mode);
int kvq_cpu_avx2_lut_loads(void);
/* AMX tiles for batches of KVQ_AMX_MIN_N tokens or more, on CPUs (and kernels)
 * that have them; kvq_cpu_set_amx(0) turns them off (accuracy: KVQ_AMX_REL_L2). */
int kvq_cpu_has_amx(void);
int kvq_cpu_set_amx(int on);

/* From how many tokens on an AQLM weight (unless exact) goes through the tiles,
 * where the CPU has a kernel (kvq_cpu_matmul): the panel decode has to be
 * spread over enough tokens to beat the per-token paths. Measured, synthetic
 * Llama-2-7B, 2 threads, AVX-512 VNNI+VBMI VM (prompt tok/s, tiles vs the
 * other path): 1x16 vs the codeword-gather GEMV 6.3 / 5.9 at 16 tokens, 9.1 /
 * 7.4 at 24; 2x8 vs batched int16 tables 10.0 / 12.7 at 32, 13.6 / 13.5 at
 * 48, 18.9 / 18.3 at 64, 27.6 / 18.7 at 96. Without batched tables (AVX2,
 * NEON, AVX-512 without VBMI) 2x8 batches would take dequantize + f32 GEMM,
 * which the tiles beat from fewer tokens still. */
#define KVQ_I8T_MIN_N_GATHER 17 /* up to 16 tokens, the codeword gathers share each fetch (KVQ_GATHER_MAX_T) */
#define KVQ_I8T_MIN_N_TABLES 48
#define KVQ_I8T_MIN_N 32
/* The first batch size that takes the tiles for w on the current kernels
 * (INT_MAX: never, exact or no kernel). */
int kvq_i8t_min_n(const kvq_cpu_weight *w);

/* The rows the backend promises exact (KVQ_CPU_EXACT_ROWS) stay on the per-token paths. */
_Static_assert(KVQ_CPU_EXACT_ROWS <= KVQ_GATHER_MAX_T && KVQ_CPU_EXACT_ROWS < KVQ_I8T_MIN_N_GATHER &&
                   KVQ_CPU_EXACT_ROWS < KVQ_I8T_MIN_N && KVQ_CPU_EXACT_ROWS < KVQ_I8T_MIN_N_TABLES,
               "a step of KVQ_CPU_EXACT_ROWS rows would leave the per-token matmul paths");

#endif
