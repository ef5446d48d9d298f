/* The optional fused entries of the backend table (issue 33 §3): a decode layer in fewer
 * dispatches and barriers. The o and down projections add their output to the residual
 * stream in the matvec's last write and the last workgroup of the dispatch forms the next
 * norm (shaders/mm_fuse.glsl); the down projection stages act(gate)·up as its input; rope
 * of q and k rides in kv_store (kvq_vk_kv_store_rope in vk_kv.c). Where a matvec cannot take the
 * extra work (dense or prompt-sized matmuls, a weight in row pieces, KVQ_VK_DISABLE=
 * fusedreduce) the same results come from the separate ops, the product going through
 * scratch slot 8. */
#include "vulkan/vk_internal.h"
#include "vulkan/vk_weights.h"

/* The separate ops: y (+)= product, then h = norm(y) when g is given. */
static void unfused(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n, const kvq_wt *g, kvq_buf *h,
                    float eps) {
    size_t count = (size_t)n * w->rows;
    kvq_buf *tmp = vk_scratch(b, 8, count * sizeof(float));
    if (!tmp) return;
    kvq_vk_matmul(b, w, x, tmp, n);
    vk_elementwise(b, "add", y, tmp, count);
    if (g) vk_op_rms_norm(b, y, g, h, n, w->rows, eps);
}

static vk_mm_fuse fuse_of(uint32_t flags, const kvq_wt *g, kvq_buf *h, float eps) {
    vk_mm_fuse f = {.flags = flags | VK_MM_ADD, .eps = eps};
    if (g) f.flags |= VK_MM_NORM, f.gain = kvq_vk_weight_vec(g), f.h = vk_whole(h);
    return f;
}

void kvq_vk_matmul_add(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n, const kvq_wt *g, kvq_buf *h,
                       float eps) {
    if (n <= 0) return;
    if (!kvq_vk_matmul_fusable(b, w, n)) {
        unfused(b, w, x, y, n, g, h, eps);
        return;
    }
    vk_mm_fuse f = fuse_of(0, g, h, eps);
    kvq_vk_matmul_fused(b, w, vk_whole(x), vk_whole(y), n, &f);
}

void kvq_vk_matmul_glu_add(kvq_bctx *b, const kvq_wt *w, kvq_buf *x, const kvq_buf *up, int gelu, kvq_buf *y, int n,
                           const kvq_wt *g, kvq_buf *h, float eps) {
    if (n <= 0) return;
    if (!kvq_vk_matmul_fusable(b, w, n)) {
        if (!vk_count_ok(b, (size_t)n * w->cols, "matmul_glu_add")) return;
        vk_elementwise(b, gelu ? "geglu" : "swiglu", x, up, (size_t)n * w->cols);
        unfused(b, w, x, y, n, g, h, eps);
        return;
    }
    vk_mm_fuse f = fuse_of(VK_MM_GLU | (gelu ? VK_MM_GELU : 0u), g, h, eps);
    f.up = vk_whole(up);
    kvq_vk_matmul_fused(b, w, vk_whole(x), vk_whole(y), n, &f);
}
