/* PLACEHOLDER until the weights/matmul branch lands (helper "vkmm" replaces this file):
 * f32 one-row weights only, enough for the core's elementwise tests. */
#include <stdlib.h>

#include "util.h"
#include "vulkan/vk_internal.h"

struct kvq_wt {
    kvq_buf *vec;
};

int kvq_vk_weight_supported(kvq_bctx *b, const kvq_weight_desc *d) { return d->fmt == KVQ_W_F32 && d->rows == 1; }

kvq_wt *kvq_vk_weight_upload(kvq_bctx *b, const kvq_weight_desc *d) {
    if (!kvq_vk_weight_supported(b, d)) {
        kvq_fail(KVQ_ERR_UNSUPPORTED, "%s: vulkan backend cannot run this weight yet", d->name);
        return NULL;
    }
    kvq_wt *w = calloc(1, sizeof *w);
    if (w) w->vec = vk_buf_new(b, (size_t)d->cols * 4, 0);
    if (!w || !w->vec || vk_upload_now(b, w->vec, 0, d->data, (size_t)d->cols * 4)) {
        kvq_vk_weight_free(b, w);
        return NULL;
    }
    return w;
}

void kvq_vk_weight_free(kvq_bctx *b, kvq_wt *w) {
    if (!w) return;
    vk_buf_free(b, w->vec);
    free(w);
}

size_t kvq_vk_weight_bytes(kvq_bctx *b, const kvq_wt *w) { return w->vec->bytes; }
vk_bind kvq_vk_weight_vec(const kvq_wt *w) { return vk_whole(w->vec); }

void kvq_vk_get_rows(kvq_bctx *b, const kvq_wt *w, const int32_t *ids, int n, kvq_buf *out) {
    vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: get_rows not implemented yet");
}

void kvq_vk_matmul(kvq_bctx *b, const kvq_wt *w, const kvq_buf *x, kvq_buf *y, int n) {
    vk_error(b, KVQ_ERR_UNSUPPORTED, "vulkan: matmul not implemented yet");
}
