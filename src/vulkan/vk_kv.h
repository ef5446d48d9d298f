/* Internal helpers of the Vulkan KV cache (vk_kv.c) beyond the backend table,
 * for tests: the cache's layout and a read-back of its rows. */
#ifndef KVQ_VK_KV_H
#define KVQ_VK_KV_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Bytes of one stored row of head_dim values of type t: the reference row
 * (kvq_kv_row_bytes) padded to whole 32-bit words. */
size_t kvq_vk_kv_row_bytes(kvq_cache_type t, int head_dim);
/* kvq_backend.kv_read: waits for all issued work, then copies layer's K (v == 0) or V rows
 * of positions [pos0, pos0+n) into dst without the padding: n_head_kv * n rows of
 * kvq_kv_row_bytes each, the reference's [kv head][position] layout. Reports the first
 * pending error. kvq_backend.kv_write: the other way, recorded in order with the ops. */
kvq_status kvq_vk_kv_read(kvq_bctx *b, const kvq_kvbuf *kv, int layer, int v, int pos0, int n, void *dst);
kvq_status kvq_vk_kv_write(kvq_bctx *b, kvq_kvbuf *kv, int layer, int v, int pos0, int n, const void *src);

/* How attention is laid out, as pure functions of what the device offers, so tests can
 * plan for GPUs they do not have. */
typedef struct {
    int software;          /* a CPU device (lavapipe) */
    int target_groups;     /* workgroups to fill the device (b->target_groups; 0: by kind) */
    int subgroup, int_dot; /* b->caps.subgroup_arith, int_dot */
    int storage16;         /* b->caps.storage16 */
    int dec;               /* b->caps.attn_dec */
    unsigned shared_bytes; /* maxComputeSharedMemorySize */
} kvq_vk_attn_dev;

typedef struct {
    const char *name;  /* shader */
    uint32_t spec[5];  /* its spec constants */
    int n_spec;
    int dec;           /* attn_dec (one query, staged blocks), else attn_fused */
    int int8;          /* q rounded to int8 per 32 values for integer dot products */
    int bp;            /* positions per block */
} kvq_vk_attn_pipe;

typedef struct {
    kvq_vk_attn_pipe pipe;
    int gx, gy, gz; /* workgroups: tiles (attn_dec: of a GQA group's heads, attn_fused: of query rows)
                       x KV heads x splits of the positions */
    int ng;         /* attn_dec: heads per tile */
    int bps;        /* blocks per split */
} kvq_vk_attn_grid;

kvq_vk_attn_dev kvq_vk_attn_dev_of(const kvq_bctx *b);
/* Most queries a call computes as that many one-token decodes (VK_EXACT_ROWS): each row
 * through kvq_vk_attn_pick(.., 1) at its own position, bit for bit a decode step's. */
int kvq_vk_attn_exact_rows(void);
/* The pipeline for calls of n queries with n_rep query heads per KV head: the one choice
 * that kv_new's preparation and the dispatch share. */
kvq_vk_attn_pipe kvq_vk_attn_pick(const kvq_vk_attn_dev *dev, const kvq_kv_desc *d, int n_rep, int n);
/* The pipeline and workgroups of an attention call of n queries at pos0..pos0+n-1; the split
 * partials take at most budget bytes. */
kvq_vk_attn_grid kvq_vk_attn_plan(const kvq_vk_attn_dev *dev, const kvq_kv_desc *d, const kvq_attn_desc *a,
                                  int pos0, int n, size_t budget);

#endif
