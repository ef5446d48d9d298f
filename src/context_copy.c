/* kvq_context_copy: one context's cached positions into another, row by row through the
 * backends' kv_read/kv_write (the stored format, so nothing is quantized twice), for the n
 * choices of one request that share its prompt. */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "kv_format.h"
#include "util.h"

/* The device holding layer l of c, its cache and the layer's index there. */
static const kvq_dev *layer_at(const kvq_context *c, int l, kvq_kvbuf **kv, int *local) {
    int d = c->m->n_dev > 1 && l >= c->act[1].layer0 ? 1 : 0;
    *kv = c->act[d].kv;
    *local = l - c->act[d].layer0;
    return &c->m->dev[d];
}

kvq_status kvq_context_copy(kvq_context *dst, const kvq_context *src) {
    if (!dst || !src) return kvq_fail(KVQ_ERR_ARG, "kvq_context_copy: no context");
    if (dst == src) return KVQ_OK;
    const kvq_kv_desc *a = &src->act[0].kd, *b = &dst->act[0].kd;
    if (dst->m != src->m || a->type_k != b->type_k || a->type_v != b->type_v || a->rotate_k != b->rotate_k ||
        a->rotate_v != b->rotate_v)
        return kvq_fail(KVQ_ERR_ARG, "kvq_context_copy: the contexts differ in model, cache types or rotation");
    int n = src->n_past;
    if (n > dst->p.n_ctx) return kvq_fail(KVQ_ERR_ARG, "kvq_context_copy: %d positions, the target holds %d", n, dst->p.n_ctx);
    const kvq_hparams *hp = &src->m->hp;
    size_t most = 0;
    for (int v = 0; v < 2; v++) {
        size_t k = kvq_kv_row_bytes(v ? a->type_v : a->type_k, hp->head_dim) * (size_t)hp->n_head_kv * (size_t)n;
        if (k > most) most = k;
    }
    uint8_t *rows = malloc(most ? most : 1);
    if (!rows) return kvq_fail(KVQ_ERR_NOMEM, "kvq_context_copy: out of memory for %zu bytes", most);
    kvq_status s = KVQ_OK;
    for (int l = 0; n && !s && l < hp->n_layer; l++)
        for (int v = 0; !s && v < 2; v++) {
            kvq_kvbuf *skv, *dkv;
            int sl, dl;
            const kvq_dev *S = layer_at(src, l, &skv, &sl), *D = layer_at(dst, l, &dkv, &dl);
            if (!S->be->kv_read || !D->be->kv_write) s = kvq_fail(KVQ_ERR_UNSUPPORTED, "kvq_context_copy: the backend cannot copy caches");
            else if (!(s = S->be->kv_read(S->b, skv, sl, v, 0, n, rows))) s = D->be->kv_write(D->b, dkv, dl, v, 0, n, rows);
        }
    for (int d = 0; !s && d < dst->m->n_dev; d++)
        if (dst->m->dev[d].be->flush) s = dst->m->dev[d].be->flush(dst->m->dev[d].b);
    free(rows);
    dst->n_past = s ? 0 : n; /* a failed copy leaves no usable positions */
    if (!s) {
        dst->rope_freqs = src->rope_freqs;
        int h = src->n_hist < n ? src->n_hist : n;
        if (dst->hist && src->hist) memcpy(dst->hist, src->hist, sizeof *dst->hist * (size_t)h);
        dst->n_hist = dst->hist && src->hist ? h : 0;
    }
    return s;
}
