/* 1x16 AQLM with int8 codewords on AVX2 (scheme and error bound: aqlm/aqlm_i8.c): the ymm body
 * with vpmaddwd. Plain loads for the codewords (AMD's gathers are microcoded), so this also
 * serves AVX-512 CPUs without VNNI. */
#define KVQ_I8_YMM_DOT(acc, w, x) _mm256_add_epi32((acc), _mm256_madd_epi16((w), (x)))
#define KVQ_I8_YMM_ROWS rows_avx2
#define KVQ_I8_YMM_GEMV kvq_aqlm_i8_gemv_avx2
#include "cpu/aqlm/aqlm_i8_ymm.h"
