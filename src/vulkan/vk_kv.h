/* Internal helpers of the Vulkan KV cache (vk_kv.c) beyond the backend table,
 * for tests: the cache's layout and a read-back of its rows. */
#ifndef KVQ_VK_KV_H
#define KVQ_VK_KV_H

#include <stddef.h>

#include "backend.h"

/* Bytes of one stored row of head_dim values of type t: the reference row
 * (kvq_kv_row_bytes) padded to whole 32-bit words. */
size_t kvq_vk_kv_row_bytes(kvq_cache_type t, int head_dim);
/* Waits for all issued work, then copies layer's K (v == 0) or V rows into dst
 * without the padding: n_head_kv * n_ctx rows of kvq_kv_row_bytes each, the
 * reference's [kv head][position] layout. Reports the first pending error. */
kvq_status kvq_vk_kv_read(kvq_bctx *b, const kvq_kvbuf *kv, int layer, int v, void *dst);

#endif
