/* The Vulkan backend's uploaded weight (vk_weights.c builds it, vk_matmul.c runs it).
 *
 * A weight is cut by rows into pieces that each fit one buffer (b->max_buffer):
 * piece i holds rows row0..row0+rows-1, and shaders get the row offset as a push
 * constant. Dense rows keep their format (f32/f16/bf16) with the row stride padded
 * to a multiple of 8 values (zeros), so 8-value runs are 16-byte aligned.
 * AQLM codes are reduced mod 2^nbits and repacked to 1 byte (nbits 8) or 2 bytes
 * (9..16) per code; a row's code sequence (g*M + m order) is cut into 16-byte
 * chunks, and chunk c of piece row r is stored at block c*rows + r, so consecutive
 * rows' chunks are adjacent (coalesced reads by consecutive invocations). */
#ifndef KVQ_VK_WEIGHTS_H
#define KVQ_VK_WEIGHTS_H

#include "vulkan/vk_internal.h"

typedef struct {
    kvq_buf *buf;
    int row0, rows;
} vk_piece;

struct kvq_wt {
    kvq_wformat fmt;
    int rows, cols;
    int stride;          /* dense: values per stored row (cols rounded up to 8) */
    int M, nbits, ig, cs; /* AQLM: codebooks, bits, in_group, stored bytes per code */
    int n_chunks;        /* AQLM: 16-byte code chunks per row */
    int lut16;           /* AQLM 8-bit: lookup tables in fp16 (mm_lut_h) */
    float cb_l1;         /* AQLM: largest sum |c_j| of a codeword (mm_lut_h's table scale) */
    int n_pieces;
    vk_piece *pieces;
    kvq_buf *codebooks;  /* AQLM: fp16 [M][2^nbits][ig] as in the checkpoint */
    kvq_buf *scales;     /* AQLM: f32 [rows] */
    kvq_buf *bias;       /* f32 [rows] or NULL */
    kvq_buf *vec;        /* norm gains (small dense weights): f32 [rows][cols] for rms_norm/layer_norm, else NULL */
    size_t bytes;        /* device bytes of all of the above */
};

/* Shader format code (mm_common.glsl FMT_*). */
static inline uint32_t kvq_vk_fmt_code(kvq_wformat f) {
    return f == KVQ_W_F32 ? 0u : f == KVQ_W_F16 ? 1u : f == KVQ_W_BF16 ? 2u : 3u;
}

/* Builds every pipeline a matmul (n = 1, 2.., the tiles) or get_rows of w runs (get_rows
 * alone when rows_only), with the choice the dispatch makes (vk_matmul.c), so none is
 * compiled at the first token. The pipeline's error (kvq_fail) when one cannot be built. */
kvq_status kvq_vk_matmul_prepare(kvq_bctx *b, const kvq_wt *w, int rows_only);

#endif
