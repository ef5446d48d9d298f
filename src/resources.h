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

/* Floats per token of each activation buffer a context keeps (0: not needed by this family). */
typedef struct {
    size_t x, xb, xo;   /* residual, normed input, block output: n_embd */
    size_t q, att;      /* n_head * head_dim */
    size_t k, v;        /* n_head_kv * head_dim */
    size_t hb, hb2;     /* FFN hidden, n_ff (times the experts a token uses) */
    size_t fused;       /* a fused projection's output before the split (Phi-3) */
    size_t moe_out;     /* each used expert's output, n_embd per expert */
    size_t router;      /* router logits, n_expert */
} kvq_act_widths;

void kvq_act_widths_of(const kvq_hparams *hp, kvq_act_widths *w);

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
