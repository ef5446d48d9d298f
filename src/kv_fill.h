/* Internal (not in kvq.h): filling a context's KV cache with random rows, so that
 * speed at a long context can be measured without evaluating the prompt that would
 * have produced it (kvq-bench model --depth; attention's cost does not depend on
 * what the rows hold). Tools and tests reach it through the static library. */
#ifndef KVQ_KV_FILL_H
#define KVQ_KV_FILL_H

#include <stdint.h>

#include "kvq.h"

/* Stores random K and V rows (values in [-1, 1), quantized and rotated as the cache
 * type says, exactly as kvq_eval would store them) at positions kvq_n_past(c) ..
 * n_past-1 of every layer, then sets the context's length to n_past. The logits
 * are left as they were. KVQ_ERR_ARG when n_past is below kvq_n_past(c) or above
 * kvq_n_ctx(c). */
kvq_status kvq_kv_fill_random(kvq_context *c, int n_past, uint64_t seed);

#endif
