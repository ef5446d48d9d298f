/* Int8 tile panels on AVX2 + AVX-VNNI: the ymm panel (i8tile_ymm.h) with vpdpbusd in place of
 * vpmaddubsw + vpmaddwd + vpaddd; the same exact int32 sums, so the AVX2 panel's outputs. The
 * activations' blocks are AVX2's (kvq_i8t_qblock_avx2). */
#define KVQ_I8T_YMM_CONSTS
#define KVQ_I8T_YMM_DOT(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define KVQ_I8T_YMM_PANEL kvq_i8t_panel_avxvnni
#include "cpu/i8tile/i8tile_ymm.h"
