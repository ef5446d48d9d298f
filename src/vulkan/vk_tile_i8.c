/* Int8 tiles for batched AQLM matmuls (see vk_tile_i8.h and shaders/mm_tile_i8.comp
 * for the scheme and its error bound). The activations are quantized once per
 * matmul into scratch slot 1 (int8 words, then the block scales), and every row
 * piece's tiles read them. */
#include "vulkan/vk_tile_i8.h"

#define I8T_KB 256 /* values per scale block, as the CPU's KVQ_I8T_KB */

static uint32_t cdiv(size_t a, size_t b) { return (uint32_t)((a + b - 1) / b); }

int kvq_vk_i8t_wanted(const kvq_bctx *b, const kvq_wt *w, int n) {
    /* the int8 activations are bound as one range: a batch too large for it takes the f32 tiles */
    size_t qbytes = (size_t)n * cdiv((size_t)w->cols, I8T_KB) * I8T_KB;
    return w->fmt == KVQ_W_AQLM && n >= VK_I8T_MIN_N && b->caps.int_dot && !b->exact && qbytes <= b->max_buffer;
}

void kvq_vk_i8t_spec(const kvq_wt *w, uint32_t spec[4]) {
    spec[0] = (uint32_t)w->M, spec[1] = (uint32_t)w->ig, spec[2] = (uint32_t)w->nbits, spec[3] = (uint32_t)w->cs;
}

void kvq_vk_i8t_prepare(kvq_bctx *b) { vk_pipe_get(b, "mm_quant_i8", NULL, 0); }

void kvq_vk_matmul_i8t(kvq_bctx *b, const kvq_wt *w, const vk_pipe *tile, vk_bind x, vk_bind y, int n) {
    uint32_t nb = cdiv((size_t)w->cols, I8T_KB);
    size_t qbytes = (size_t)n * nb * I8T_KB, align = (size_t)b->min_align;
    size_t soff = (qbytes + align - 1) / align * align, sbytes = (size_t)n * nb * sizeof(float);
    kvq_buf *s = vk_scratch(b, 1, soff + sbytes);
    if (!s) return;
    vk_bind xq = {s->buf, 0, qbytes, qbytes}, sa = {s->buf, soff, sbytes, sbytes};
    struct {
        uint32_t cols, n, nb;
    } qc = {(uint32_t)w->cols, (uint32_t)n, nb};
    vk_bind qbind[3] = {x, xq, sa};
    vk_dispatch(b, vk_pipe_get(b, "mm_quant_i8", NULL, 0), qbind, 3, &qc, sizeof qc, nb, (uint32_t)n, 1);
    for (int i = 0; i < w->n_pieces; i++) {
        const vk_piece *pp = &w->pieces[i];
        struct {
            uint32_t rows_p, row0, rows_total, cols, n, flags, nb;
        } pc = {(uint32_t)pp->rows, (uint32_t)pp->row0, (uint32_t)w->rows, (uint32_t)w->cols, (uint32_t)n,
                w->bias ? 1u : 0u, nb};
        vk_bind bind[7] = {vk_whole(pp->buf), vk_whole(w->codebooks), xq, y, vk_whole(w->scales),
                           vk_whole(w->bias ? w->bias : b->dummy), sa};
        vk_dispatch(b, tile, bind, 7, &pc, sizeof pc, cdiv((size_t)pp->rows, 64), cdiv((size_t)n, 64), 1);
    }
}
