/* Int8 tiles for batched AQLM matmuls on Vulkan (prompts): the CPU's recipe
 * (src/cpu/i8tile) with integer dot products. vk_matmul.c's matmul_key decides
 * when (kvq_vk_i8t_wanted), this file records the two passes. */
#ifndef KVQ_VK_TILE_I8_H
#define KVQ_VK_TILE_I8_H

#include "vulkan/vk_weights.h"

/* Tokens from which an AQLM matmul takes the int8 tiles: the CPU's KVQ_I8T_MIN_N, so a
 * batch takes the same kind of path on either backend (short batches, such as
 * speculative verification, stay on the f32 tiles). */
#define VK_I8T_MIN_N 32

/* 1 when a matmul of w over n tokens runs on the int8 tiles: AQLM, n >= VK_I8T_MIN_N,
 * the device has integer dot products, the backend was not opened exact and the batch's
 * int8 activations fit one buffer binding (b->max_buffer). */
int kvq_vk_i8t_wanted(const kvq_bctx *b, const kvq_wt *w, int n);
/* Spec constants of mm_tile_i8 for w (M, IG, NB, CS). */
void kvq_vk_i8t_spec(const kvq_wt *w, uint32_t spec[4]);
/* y = x . W^T (+ bias) for n tokens: mm_quant_i8 once, then mm_tile_i8 (pipeline tile)
 * per row piece. */
void kvq_vk_matmul_i8t(kvq_bctx *b, const kvq_wt *w, const vk_pipe *tile, vk_bind x, vk_bind y, int n);
/* Builds mm_quant_i8 (at upload, beside the tile pipeline matmul_key names). */
void kvq_vk_i8t_prepare(kvq_bctx *b);

#endif
