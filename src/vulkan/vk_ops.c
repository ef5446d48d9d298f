/* Dispatch helpers of the elementwise ops and norms, shared by the backend table
 * (vk_backend.c) and the fused entries (vk_fuse.c). */
#include <math.h>
#include <stdlib.h>

#include "vulkan/vk_internal.h"
#include "vulkan/vk_weights.h"

/* Enough groups of 256 for count items, capped: the shaders loop with a grid stride. */
uint32_t vk_groups_for(const kvq_bctx *b, size_t count) {
    size_t g = (count + 255) / 256;
    size_t cap = b->max_groups[0] < 65535 ? b->max_groups[0] : 65535;
    return (uint32_t)(g < 1 ? 1 : g > cap ? cap : g);
}

int vk_count_ok(kvq_bctx *b, size_t count, const char *op) {
    if (count < UINT32_MAX) return 1;
    vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: %s over %zu values (over 2^32)", op, count);
    return 0;
}

/* The rms norm's shader by device (subgroupAdd: fewer barriers); ops_prepare builds the same. */
const char *vk_rms_norm_shader(const kvq_bctx *b) { return b->caps.subgroup_arith ? "rms_norm_sg" : "rms_norm"; }

/* cos/sin of (pos0+t)·inv_freq[i] in double on the host, as the CPU does, staged once per
 * submit for all layers: single-precision angles on the device are off by ~1e-2 at 100k. */
vk_bind vk_rope_table(kvq_bctx *b, int n, int half, int pos0, const float *inv_freq) {
    if (b->rope.inv_freq == inv_freq && b->rope.pos0 == pos0 && b->rope.n == n && b->rope.half == half) return b->rope.tab;
    float *cs = malloc(sizeof(float) * 2 * (size_t)n * half);
    if (!cs) {
        vk_error(b, KVQ_ERR_NOMEM, "vulkan: out of memory for the RoPE table");
        return vk_whole(b->dummy);
    }
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double ang = (double)(pos0 + t) * inv_freq[i];
            cs[2 * ((size_t)t * half + i)] = (float)cos(ang);
            cs[2 * ((size_t)t * half + i) + 1] = (float)sin(ang);
        }
    vk_bind tab = vk_stage(b, cs, sizeof(float) * 2 * (size_t)n * half);
    free(cs);
    b->rope.inv_freq = inv_freq, b->rope.pos0 = pos0, b->rope.n = n, b->rope.half = half, b->rope.tab = tab;
    return tab;
}

void vk_elementwise(kvq_bctx *b, const char *shader, kvq_buf *a, const kvq_buf *x, size_t count) {
    if (!vk_count_ok(b, count, shader)) return;
    uint32_t pc = (uint32_t)count;
    vk_bind bind[2] = {vk_whole(a), vk_whole(x)};
    vk_dispatch(b, vk_pipe_get(b, shader, NULL, 0), bind, 2, &pc, sizeof pc, vk_groups_for(b, count), 1, 1);
}

void vk_op_rms_norm(kvq_bctx *b, const kvq_buf *x, const kvq_wt *g, kvq_buf *y, int n, int dim, float eps) {
    struct { uint32_t dim; float eps; } pc = {(uint32_t)dim, eps};
    vk_bind bind[3] = {vk_whole(x), kvq_vk_weight_vec(g), vk_whole(y)};
    vk_dispatch(b, vk_pipe_get(b, vk_rms_norm_shader(b), NULL, 0), bind, 3, &pc, sizeof pc, (uint32_t)n, 1, 1);
}
