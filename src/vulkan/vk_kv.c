/* PLACEHOLDER until the KV/attention branch lands (helper "vkattn" replaces this file). */
#include "util.h"
#include "vulkan/vk_internal.h"

kvq_kvbuf *kvq_vk_kv_new(kvq_bctx *b, const kvq_kv_desc *d) {
    kvq_fail(KVQ_ERR_UNSUPPORTED, "vulkan: KV cache not implemented yet");
    return NULL;
}
void kvq_vk_kv_free(kvq_bctx *b, kvq_kvbuf *kv) {}
size_t kvq_vk_kv_bytes(kvq_bctx *b, const kvq_kv_desc *d, int positions) { return 0; }
void kvq_vk_kv_store(kvq_bctx *b, kvq_kvbuf *kv, int layer, const kvq_buf *k, const kvq_buf *v, int pos0, int n) {
    vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: kv_store not implemented yet");
}
void kvq_vk_attention(kvq_bctx *b, const kvq_kvbuf *kv, int layer, const kvq_attn_desc *a, const kvq_buf *q,
                      kvq_buf *out, int pos0, int n) {
    vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: attention not implemented yet");
}
