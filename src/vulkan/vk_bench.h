/* Device measurements for kvq-bench (no Vulkan types: tools include this). */
#ifndef KVQ_VK_BENCH_H
#define KVQ_VK_BENCH_H

#include <stddef.h>

struct kvq_bctx;
/* Memory bandwidth in GB/s (bytes read + written per second of device time) of a streaming
 * copy of `bytes` bytes, best of reps; < 0 on failure (message in kvq_last_error). */
double kvq_vk_bandwidth_gbs(struct kvq_bctx *b, size_t bytes, int reps);
/* Device time in ms of the last submitted work (timestamps), < 0 when unknown. */
double kvq_vk_last_ms(struct kvq_bctx *b);

#endif
