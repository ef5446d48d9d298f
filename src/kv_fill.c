/* kvq_kv_fill_random: random cache rows through the backend's own kv_store. */
#include "kv_fill.h"

#include <stdlib.h>

#include "context.h"
#include "util.h"

/* One batch of random K and V activations (kv floats each) on device d. */
static void write_random(const kvq_dev *D, kvq_acts *A, float *tmp, size_t kv, uint64_t *s) {
    for (int which = 0; which < 2; which++) {
        for (size_t i = 0; i < kv; i++) {
            *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
            tmp[i] = (float)(*s >> 40) * (2.0f / 16777216.0f) - 1.0f;
        }
        D->be->buf_write(D->b, which ? A->v : A->k, 0, tmp, kv * sizeof(float));
    }
}

kvq_status kvq_kv_fill_random(kvq_context *c, int n_past, uint64_t seed) {
    if (n_past < c->n_past || n_past > c->p.n_ctx)
        return kvq_fail(KVQ_ERR_ARG, "kvq_kv_fill_random: %d is outside %d..%d", n_past, c->n_past, c->p.n_ctx);
    const kvq_model *m = c->m;
    const kvq_hparams *hp = &m->hp;
    const int nb = c->p.n_batch;
    const size_t kv = (size_t)nb * hp->n_head_kv * hp->head_dim;
    float *tmp = malloc(kv * sizeof(float));
    if (!tmp) return kvq_fail(KVQ_ERR_NOMEM, "kvq_kv_fill_random: out of memory");
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!s) s = 1;
    kvq_status st = KVQ_OK;
    for (int d = 0; d < m->n_dev && !st; d++) {
        const kvq_dev *D = &m->dev[d];
        kvq_acts *A = &c->act[d];
        if (!A->kv) continue; /* a device that holds only the embedding */
        for (int l = 0; l < A->kd.n_layer; l++) {
            /* fresh values per layer; within a layer the batch repeats every n_batch positions */
            write_random(D, A, tmp, kv, &s);
            for (int p = c->n_past; p < n_past; p += nb) {
                int n = n_past - p < nb ? n_past - p : nb;
                D->be->kv_store(D->b, A->kv, l, A->k, A->v, p, n);
            }
        }
        if (D->be->flush) st = D->be->flush(D->b);
    }
    free(tmp);
    if (!st) c->n_past = n_past;
    return st;
}
