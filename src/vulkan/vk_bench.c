/* Device bandwidth for kvq-bench: a streaming copy shader timed with timestamps,
 * so GPU kernels are reported against what this device can move, measured in the same run. */
#include <stdint.h>

#include "util.h"
#include "vulkan/vk_bench.h"
#include "vulkan/vk_internal.h"

double kvq_vk_last_ms(kvq_bctx *b) { return b->last_ms; }

double kvq_vk_bandwidth_gbs(kvq_bctx *b, size_t bytes, int reps) {
    if (bytes > b->max_buffer) bytes = b->max_buffer;
    bytes &= ~(size_t)15;
    kvq_buf *src = vk_buf_new(b, bytes, 0), *dst = src ? vk_buf_new(b, bytes, 0) : NULL;
    if (!src || !dst) {
        vk_buf_free(b, src);
        return -1;
    }
    uint32_t count = (uint32_t)(bytes / 16);
    uint32_t groups = count / 256 / 8; /* each invocation copies ~8 words: long streams, few groups */
    if (groups < 1) groups = 1;
    if (groups > 65535) groups = 65535;
    double best = -1;
    const vk_pipe *p = vk_pipe_get(b, "bw_copy", NULL, 0);
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
        vk_bind bind[2] = {vk_whole(src), vk_whole(dst)};
        vk_dispatch(b, p, bind, 2, &count, sizeof count, groups, 1, 1);
        if (vk_submit(b)) break;
        if (r > 0 && b->last_ms > 0) {
            double gbs = 2.0 * (double)bytes / (b->last_ms * 1e-3) / 1e9;
            if (gbs > best) best = gbs;
        }
    }
    vk_buf_free(b, src);
    vk_buf_free(b, dst);
    if (best < 0 && !*kvq_last_error()) kvq_fail(KVQ_ERR_BACKEND, "vulkan: no timestamps on this device");
    return best;
}
