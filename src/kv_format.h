/* KV cache storage formats. One cache row = one head vector (head_dim values)
 * of one position of one KV head; K is stored after RoPE. Quantized rows are
 * head_dim/32 blocks of 32 consecutive values with a symmetric absmax scale.
 * With rotation on, the row is first multiplied by the orthonormal
 * Walsh–Hadamard matrix H (H = H^T = H^-1 after 1/sqrt(n) normalisation) of
 * the whole head vector, which spreads outlier channels across all blocks. */
#ifndef KVQ_KV_FORMAT_H
#define KVQ_KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include "kvq.h"

#define KVQ_QK 32 /* values per quantization block */

typedef struct {
    uint16_t d;         /* fp16 scale: x ≈ d * q */
    int8_t qs[KVQ_QK];  /* q in −127..127 */
} kvq_block_q8;         /* 34 bytes / 32 values */

typedef struct {
    uint16_t d;              /* fp16 scale: x ≈ d * q */
    uint8_t qs[KVQ_QK / 2];  /* value j in low nibble of qs[j], value j+16 in the high nibble; stored q+8 */
} kvq_block_q4;              /* 18 bytes / 32 values */

_Static_assert(sizeof(kvq_block_q8) == 34, "q8 block must be packed");
_Static_assert(sizeof(kvq_block_q4) == 18, "q4 block must be packed");

/* Bytes of one cache row of head_dim values (head_dim a multiple of 32). */
static inline size_t kvq_kv_row_bytes(kvq_cache_type t, int head_dim) {
    switch (t) {
    case KVQ_CACHE_F32: return (size_t)head_dim * 4;
    case KVQ_CACHE_F16: return (size_t)head_dim * 2;
    case KVQ_CACHE_Q8: return (size_t)head_dim / KVQ_QK * sizeof(kvq_block_q8);
    case KVQ_CACHE_Q4: return (size_t)head_dim / KVQ_QK * sizeof(kvq_block_q4);
    }
    return 0;
}

#endif
