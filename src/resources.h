/* Memory a context needs (KV cache, activations, logits), computed with
 * overflow checks and compared with the memory this process can still get. */
#ifndef KVQ_RESOURCES_H
#define KVQ_RESOURCES_H

#include "model/hparams.h"

typedef struct {
    size_t kv;     /* K and V cache, all layers */
    size_t act;    /* activation buffers for n_batch tokens */
    size_t logits; /* logits rows */
    size_t total;
} kvq_mem_need;

/* Bytes a context of n_ctx positions / n_batch tokens per pass needs. Returns
 * KVQ_ERR_ARG (message set) when a size does not fit in size_t. */
kvq_status kvq_mem_estimate(const kvq_hparams *hp, int n_ctx, int n_batch, int logits_all, kvq_cache_type tk,
                            kvq_cache_type tv, kvq_mem_need *out);

/* Bytes this process can still allocate: MemAvailable, capped by the cgroup
 * limit and RLIMIT_AS/RLIMIT_DATA; SIZE_MAX when unknown. KVQ_MEM_LIMIT (bytes,
 * with an optional K/M/G suffix) overrides it, e.g. for tests. */
size_t kvq_mem_available(void);

/* Fails with KVQ_ERR_NOMEM and a message naming the n_ctx (-c) that would fit
 * when the context does not fit in the available memory. */
kvq_status kvq_mem_check(const kvq_hparams *hp, int n_ctx, int n_batch, int logits_all, kvq_cache_type tk,
                         kvq_cache_type tv);

#endif
