/* 1x16 AQLM with int8 codewords on AVX2 + AVX-VNNI (Alder Lake and later, Zen 5 laptops): the
 * ymm body with vpdpwssd, one instruction for vpmaddwd + vpaddd. Neither saturates at these
 * widths, so the sums, and every output, are the AVX2 kernel's. */
#define KVQ_I8_YMM_DOT(acc, w, x) _mm256_dpwssd_avx_epi32((acc), (w), (x))
#define KVQ_I8_YMM_ROWS rows_avxvnni
#define KVQ_I8_YMM_GEMV kvq_aqlm_i8_gemv_avxvnni
#include "cpu/aqlm/aqlm_i8_ymm.h"
